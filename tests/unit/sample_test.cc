// softdot::sample, sample_probs and speculative_accept: the kept set and
// probabilities against a sort-based long double reference (ties included),
// chi-square of millions of draws against sample_probs, seed determinism
// across batch position, threads and SIMD targets, the bitmask, greedy,
// logprobs, special values, errors, and the Philox known answers.
#include "softdot/sample.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/dispatch.h"
#include "kernels/sample_scalar.h"
#include "softdot/simd.h"

namespace {

using softdot::SampleOptions;
constexpr float kInf = std::numeric_limits<float>::infinity();

// The reference: sort-based, long double, the documented order and tie
// rules (keep every token equal to a boundary value).
std::vector<long double> reference(const std::vector<float>& x,
                                   const SampleOptions& o,
                                   const std::vector<bool>& allowed = {}) {
  const std::size_t n = x.size();
  std::vector<std::size_t> ids;
  for (std::size_t i = 0; i < n; ++i)
    if ((allowed.empty() || allowed[i]) && x[i] > -kInf) ids.push_back(i);
  std::vector<long double> p(n, 0.0L);
  std::stable_sort(ids.begin(), ids.end(),
                   [&](std::size_t a, std::size_t b) { return x[a] > x[b]; });
  const float m = x[ids[0]];
  if (o.temperature == 0) {
    std::size_t best = ids[0];
    for (std::size_t i : ids)
      if (x[i] == m) best = std::min(best, i);
    p[best] = 1;
    return p;
  }
  if (m == kInf) {
    const auto k = std::count_if(ids.begin(), ids.end(),
                                 [&](std::size_t i) { return x[i] == kInf; });
    for (std::size_t i : ids)
      if (x[i] == kInf) p[i] = 1.0L / k;
    return p;
  }
  if (o.top_k > 0 && static_cast<std::size_t>(o.top_k) < ids.size()) {
    const float kth = x[ids[o.top_k - 1]];
    ids.erase(std::remove_if(ids.begin(), ids.end(),
                             [&](std::size_t i) { return x[i] < kth; }),
              ids.end());
  }
  std::vector<long double> e(n, 0.0L);
  long double total = 0;
  for (std::size_t i : ids) {
    e[i] = std::exp((static_cast<long double>(x[i]) - m) /
                    static_cast<long double>(o.temperature));
    total += e[i];
  }
  long double keep = 0;  // keep e >= keep
  if (o.top_p < 1) {
    long double cum = 0;
    for (std::size_t i : ids) {  // descending
      cum += e[i] / total;
      if (cum >= o.top_p) {
        keep = e[i];
        break;
      }
    }
  }
  keep = std::max(keep, static_cast<long double>(o.min_p));
  long double kept = 0;
  for (std::size_t i : ids)
    if (e[i] >= keep) kept += e[i];
  for (std::size_t i : ids)
    if (e[i] >= keep) p[i] = e[i] / kept;
  return p;
}

std::vector<float> gaussian(std::size_t n, unsigned seed, float sigma) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> x(n);
  for (auto& v : x) v = d(g);
  return x;
}

std::vector<double> probs_of(const std::vector<float>& x,
                             const SampleOptions& o,
                             std::span<const std::int32_t> mask = {}) {
  std::vector<double> p(x.size());
  softdot::sample_probs(x, p, o, mask);
  return p;
}

std::vector<SampleOptions> option_grid() {
  std::vector<SampleOptions> g;
  for (double t : {1.0, 0.7, 1.5})
    for (std::int64_t k : {0, 1, 5, 17})
      for (double p : {1.0, 0.9, 0.5, 0.2})
        for (double mp : {0.0, 0.05, 0.3}) g.push_back({t, k, p, mp});
  g.push_back({0.0, 0, 1.0, 0.0});
  g.push_back({0.0, 3, 0.5, 0.1});
  return g;
}

// Kept set and probabilities equal the reference: the kept set exactly,
// each probability within 2^-22 relative (float weights) of the exact one.
void expect_matches(const std::vector<float>& x, const SampleOptions& o,
                    const std::string& what) {
  const auto ref = reference(x, o);
  const auto got = probs_of(x, o);
  for (std::size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(ref[i] > 0, got[i] > 0)
        << what << " token " << i << " T=" << o.temperature << " k=" << o.top_k
        << " p=" << o.top_p << " min_p=" << o.min_p;
    const long double err =
        std::fabs(static_cast<long double>(got[i]) - ref[i]);
    ASSERT_LE(err, ref[i] * 0x1p-22L + 0x1p-60L)
        << what << " token " << i << " ref " << static_cast<double>(ref[i])
        << " got " << got[i];
  }
}

TEST(Sample, KeptSetAndProbabilitiesMatchTheSortReference) {
  for (std::size_t n : {1u, 2u, 7u, 33u, 50u}) {
    for (unsigned seed = 0; seed < 3; ++seed) {
      const auto x = gaussian(n, 100 + seed, 2.0f);
      for (const auto& o : option_grid())
        expect_matches(x, o, "n=" + std::to_string(n));
    }
  }
}

TEST(Sample, TiesAtTheBoundariesAreAllKept) {
  // top-k = 2 on [3, 1, 3, 3, 0]: the 2nd largest is 3, so all three 3s
  // stay; top-p 0.5 on four equal logits keeps all four (ties at the
  // boundary), min_p keeps exactly the tokens at or above the ratio.
  const std::vector<float> x = {3, 1, 3, 3, 0};
  auto p = probs_of(x, {1.0, 2, 1.0, 0.0});
  EXPECT_EQ(p, (std::vector<double>{1.0 / 3, 0, 1.0 / 3, 1.0 / 3, 0}));
  const std::vector<float> flat = {2, 2, 2, 2};
  p = probs_of(flat, {1.0, 0, 0.5, 0.0});
  EXPECT_EQ(p, (std::vector<double>{0.25, 0.25, 0.25, 0.25}));
  const std::vector<float> two = {0, std::log(0.5f), 0, -5};
  for (const auto& o : option_grid()) expect_matches(two, o, "ties");
  expect_matches(x, {1.0, 2, 0.3, 0.0}, "ties top-k then top-p");
  // A large row (dense path with the radix select): equal logits in
  // groups, every group boundary tested by top-p values at the groups'
  // cumulative masses.
  std::vector<float> big(5000);
  for (std::size_t i = 0; i < big.size(); ++i)
    big[i] = static_cast<float>(i % 7) * 0.5f;
  for (double top_p : {0.05, 0.3, 0.6, 0.99})
    for (std::int64_t k : {0, 700, 1500, 4000})
      expect_matches(big, {1.0, k, top_p, 0.0}, "groups");
}

TEST(Sample, LargeRowsMatchTheReference) {
  // The radix selects over rows of 70k (dense top-p, top-k over 3 levels).
  const auto x = gaussian(70000, 7, 3.0f);
  for (const SampleOptions& o :
       {SampleOptions{1.0, 0, 0.9, 0.0}, SampleOptions{0.8, 50, 1.0, 0.0},
        SampleOptions{1.0, 1000, 0.95, 0.01}, SampleOptions{1.2, 0, 0.5, 0.2},
        SampleOptions{1.0, 0, 1.0, 0.001}})
    expect_matches(x, o, "70k");
}

// Chi-square statistic of counts against probabilities (cells with
// probability 0 must have count 0) and its upper tail by Wilson-Hilferty.
double chi_square_p(const std::vector<std::int64_t>& counts,
                    const std::vector<double>& p, std::int64_t draws) {
  double chi = 0;
  int cells = 0;
  for (std::size_t i = 0; i < p.size(); ++i) {
    if (p[i] == 0) {
      EXPECT_EQ(counts[i], 0) << "token " << i << " has probability 0";
      continue;
    }
    const double e = p[i] * static_cast<double>(draws);
    const double d = static_cast<double>(counts[i]) - e;
    chi += d * d / e;
    ++cells;
  }
  const double k = cells - 1;
  if (k <= 0) return 1.0;
  const double z =
      (std::cbrt(chi / k) - (1 - 2 / (9 * k))) / std::sqrt(2 / (9 * k));
  return 0.5 * std::erfc(z / std::sqrt(2.0));
}

std::vector<std::int64_t> draw_counts(const std::vector<float>& x,
                                      const SampleOptions& o,
                                      std::int64_t draws, std::uint64_t seed0) {
  const std::size_t batch = 1 << 14;
  std::vector<std::uint64_t> seeds(batch);
  std::vector<std::int64_t> tokens(batch);
  std::vector<std::int64_t> counts(x.size(), 0);
  for (std::int64_t done = 0; done < draws; done += batch) {
    std::iota(seeds.begin(), seeds.end(), seed0 + done);
    softdot::MatrixView<const float> rows(x.data(), batch, x.size(), 0);
    softdot::sample(rows, seeds, tokens, {}, o);
    for (auto t : tokens) ++counts[t];
  }
  return counts;
}

TEST(Sample, ChiSquareOfDrawsAgainstTheDistribution) {
  const std::int64_t draws = std::int64_t{1} << 20;
  struct Case {
    std::size_t n;
    SampleOptions o;
  };
  const Case cases[] = {{10, {1.0, 0, 1.0, 0.0}},
                        {50, {0.8, 20, 0.9, 0.0}},
                        {40, {1.3, 0, 0.8, 0.02}},
                        {25, {1.0, 0, 1.0, 0.0}}};
  std::uint64_t seed0 = 1;
  for (const auto& c : cases) {
    const auto x = gaussian(c.n, static_cast<unsigned>(c.n), 1.0f);
    const auto p = probs_of(x, c.o);
    const auto counts = draw_counts(x, c.o, draws, seed0);
    seed0 += draws;
    const double pv = chi_square_p(counts, p, draws);
    EXPECT_GT(pv, 1e-6) << "n=" << c.n;
    // The test can fail: the same draws against a distribution with 0.01
    // of mass moved from the likeliest token to another kept one.
    auto wrong = p;
    const auto top =
        std::max_element(wrong.begin(), wrong.end()) - wrong.begin();
    for (std::size_t i = 0; i < wrong.size(); ++i)
      if (static_cast<std::ptrdiff_t>(i) != top && wrong[i] > 0) {
        wrong[i] += 0.01;
        wrong[top] -= 0.01;
        break;
      }
    const double pw = chi_square_p(counts, wrong, draws);
    EXPECT_LT(pw, 1e-6) << "n=" << c.n;
    std::printf(
        "chi-square, V=%zu T=%g k=%lld p=%g min_p=%g, 2^20 draws: p-value %.3g "
        "(0.01 of mass moved: %.3g)\n",
        c.n, c.o.temperature, static_cast<long long>(c.o.top_k), c.o.top_p,
        c.o.min_p, pv, pw);
  }
}

TEST(Sample, ChiSquareOnTheLargeRowPaths) {
  // V = 2500 (the radix and candidate paths, not the small-row ones): 40
  // tokens carry the mass, the rest sit far below; top-p, min-p and top-k.
  std::vector<float> x = gaussian(2500, 77, 1.0f);
  for (std::size_t i = 0; i < x.size(); ++i)
    x[i] = (i % 61 == 0) ? x[i] + 6.0f : x[i] - 6.0f;
  const std::int64_t draws = std::int64_t{1} << 14;  // 12 us a draw here
  std::uint64_t seed0 = 1u << 30;
  for (const SampleOptions& o :
       {SampleOptions{1.0, 0, 0.9, 0.0}, SampleOptions{0.9, 0, 1.0, 0.02},
        SampleOptions{1.0, 30, 0.95, 0.0}}) {
    const auto p = probs_of(x, o);
    expect_matches(x, o, "2500");
    const auto counts = draw_counts(x, o, draws, seed0);
    seed0 += draws;
    EXPECT_GT(chi_square_p(counts, p, draws), 1e-6)
        << o.top_k << " " << o.top_p << " " << o.min_p;
  }
}

TEST(Sample, TokenDependsOnlyOnSeedAndLogits) {
  const std::size_t n = 3000, rows = 96;
  std::vector<float> x(rows * n);
  for (std::size_t r = 0; r < rows; ++r) {
    const auto g = gaussian(n, static_cast<unsigned>(r), 4.0f);
    std::copy(g.begin(), g.end(), x.begin() + r * n);
  }
  std::vector<std::uint64_t> seeds(rows);
  for (std::size_t r = 0; r < rows; ++r) seeds[r] = 0x9E3779B97F4A7C15ull * r;
  const SampleOptions o{0.9, 0, 0.95, 0.0};
  std::vector<std::int64_t> one(1);
  std::vector<float> lp1(1);
  // Each row alone, on one thread and the automatic target.
  std::vector<std::int64_t> alone(rows);
  std::vector<float> alone_lp(rows);
  for (std::size_t r = 0; r < rows; ++r) {
    softdot::sample({x.data() + r * n, 1, n}, {&seeds[r], 1}, one, lp1, o);
    alone[r] = one[0];
    alone_lp[r] = lp1[0];
  }
  const int saved = omp_get_max_threads();
  for (const std::string& target : softdot::simd_targets()) {
    softdot::force_simd_target(target);
    for (int threads : {1, 2, 3}) {
      omp_set_num_threads(threads);
      std::vector<std::int64_t> tok(rows);
      std::vector<float> lp(rows);
      softdot::sample({x.data(), rows, n}, seeds, tok, lp, o);
      EXPECT_EQ(tok, alone) << target << " threads " << threads;
      EXPECT_EQ(lp, alone_lp) << target;
      // Reversed batch order: the same tokens, reversed.
      std::vector<float> rx(rows * n);
      std::vector<std::uint64_t> rs(rows);
      for (std::size_t r = 0; r < rows; ++r) {
        std::copy(x.begin() + r * n, x.begin() + (r + 1) * n,
                  rx.begin() + (rows - 1 - r) * n);
        rs[rows - 1 - r] = seeds[r];
      }
      softdot::sample({rx.data(), rows, n}, rs, tok, {}, o);
      std::reverse(tok.begin(), tok.end());
      EXPECT_EQ(tok, alone) << target;
    }
  }
  omp_set_num_threads(saved);
  softdot::force_simd_target("");
}

TEST(Sample, KernelsGiveTheScalarModelsBitsOnEveryTarget) {
  auto x = gaussian(3001, 5, 30.0f);
  x[7] = -kInf;
  x[100] = -200.0f;  // below the clamp
  bool nan = false;
  const float m = *std::max_element(x.begin(), x.end());
  for (const std::string& target : softdot::simd_targets()) {
    softdot::force_simd_target(target);
    EXPECT_EQ(softdot::detail::sample_max_kernel(x.data(), x.size(), &nan), m);
    EXPECT_FALSE(nan);
    std::vector<float> w(x.size());
    std::vector<double> sums(3);
    const double s = 1 / 0.7;
    softdot::detail::sample_exp_kernel(x.data(), x.size(), m, s, 0.0f, w.data(),
                                       sums.data());
    for (std::size_t b = 0; b < 3; ++b) {
      double acc[8] = {};
      for (std::size_t i = b * 1024; i < std::min(x.size(), b * 1024 + 1024);
           ++i) {
        const float e = softdot::detail::sample_weight(x[i], m, s);
        ASSERT_EQ(w[i], e) << target << " " << i;
        // within 0.51 ulp of the exact exp
        const long double exact =
            std::exp((static_cast<long double>(x[i]) - m) * s);
        if (e > 0x1p-126f) {
          ASSERT_LE(std::fabs(e - exact),
                    0.51L * std::ldexp(1.0L, std::ilogb(e) - 23))
              << i;
        }
        acc[(i - b * 1024) % 8] += e;
      }
      EXPECT_EQ(sums[b], softdot::detail::sample_combine8(acc)) << target;
    }
    EXPECT_EQ(w[7], 0.0f);
    EXPECT_EQ(w[100], 0.0f);
    x[2000] = std::numeric_limits<float>::quiet_NaN();
    softdot::detail::sample_max_kernel(x.data(), x.size(), &nan);
    EXPECT_TRUE(nan) << target;
    x[2000] = 0;
  }
  softdot::force_simd_target("");
}

TEST(Sample, GreedyTakesTheLowestIndexOfTheMax) {
  const std::vector<float> x = {1, 5, 2, 5, 5, -kInf};
  std::vector<std::uint64_t> seed = {3};
  std::vector<std::int64_t> t(1);
  std::vector<float> lp(1, 7.0f);
  softdot::sample({x.data(), 1, x.size()}, seed, t, lp, {0.0, 0, 1.0, 0.0});
  EXPECT_EQ(t[0], 1);
  EXPECT_EQ(lp[0], 0.0f);
  // With the bitmask disallowing token 1: token 3.
  const std::vector<std::int32_t> mask = {~0 ^ 2};
  softdot::sample({x.data(), 1, x.size()}, seed, t, lp, {0.0, 0, 1.0, 0.0},
                  mask);
  EXPECT_EQ(t[0], 3);
}

TEST(Sample, BitmaskFollowsXgrammarsLayout) {
  // bit (j % 32) of word j / 32 = token j allowed; V = 70 needs 3 words.
  const std::size_t n = 70;
  const auto x = gaussian(n, 11, 1.0f);
  std::vector<std::int32_t> mask(3, 0);
  const std::size_t allowed_ids[] = {0, 31, 32, 45, 69};
  std::vector<bool> allowed(n, false);
  for (std::size_t j : allowed_ids) {
    mask[j / 32] |= static_cast<std::int32_t>(1u << (j % 32));
    allowed[j] = true;
  }
  for (const auto& o : option_grid()) {
    const auto ref = reference(x, o, allowed);
    const auto got = probs_of(x, o, mask);
    for (std::size_t i = 0; i < n; ++i) {
      ASSERT_EQ(ref[i] > 0, got[i] > 0) << i;
      ASSERT_NEAR(got[i], static_cast<double>(ref[i]), 1e-6);
    }
  }
  // Per-row masks in a batch, and a disallowed NaN is ignored.
  std::vector<float> two(2 * n);
  std::copy(x.begin(), x.end(), two.begin());
  std::copy(x.begin(), x.end(), two.begin() + n);
  two[n + 1] = std::numeric_limits<float>::quiet_NaN();
  std::vector<std::int32_t> masks(6, 0);
  masks[0] = 1 << 5;      // row 0: token 5 only
  masks[3 + 2] = 1 << 4;  // row 1: token 68 only
  std::vector<std::uint64_t> seeds = {1, 2};
  std::vector<std::int64_t> t(2);
  std::vector<float> lp(2);
  softdot::sample({two.data(), 2, n}, seeds, t, lp, {}, masks);
  EXPECT_EQ(t, (std::vector<std::int64_t>{5, 68}));
  EXPECT_EQ(lp, (std::vector<float>{0.0f, 0.0f}));
}

TEST(Sample, LogprobsMatchTheReference) {
  const auto x = gaussian(40, 3, 2.0f);
  for (const auto& o : option_grid()) {
    const auto ref = reference(x, o);
    std::vector<std::uint64_t> seeds(64);
    std::iota(seeds.begin(), seeds.end(), 1000);
    std::vector<std::int64_t> t(64);
    std::vector<float> lp(64);
    softdot::sample({x.data(), 64, x.size(), 0}, seeds, t, lp, o);
    for (std::size_t r = 0; r < 64; ++r) {
      ASSERT_GT(ref[t[r]], 0);
      const double exact = static_cast<double>(std::log(ref[t[r]]));
      ASSERT_NEAR(lp[r], exact, 2.4e-7 + std::fabs(exact) * 0x1p-23);
    }
  }
}

TEST(Sample, SpecialValues) {
  std::vector<std::uint64_t> seeds(4000);
  std::iota(seeds.begin(), seeds.end(), 0);
  std::vector<std::int64_t> t(seeds.size());
  std::vector<float> lp(seeds.size());
  // +inf entries: uniform over them, logprob -log(k), whatever the filters.
  const std::vector<float> inf = {0, kInf, 3, kInf, kInf, -kInf};
  std::vector<int> c(inf.size(), 0);
  softdot::sample({inf.data(), seeds.size(), inf.size(), 0}, seeds, t, lp,
                  {1.0, 1, 0.1, 0.5});
  for (std::size_t r = 0; r < t.size(); ++r) {
    ++c[t[r]];
    EXPECT_FLOAT_EQ(lp[r], -std::log(3.0f));
  }
  EXPECT_EQ(c[0] + c[2] + c[5], 0);
  for (int i : {1, 3, 4}) EXPECT_NEAR(c[i], 4000 / 3.0, 150);  // > 5 sigma
  std::vector<double> p(inf.size());
  softdot::sample_probs(inf, p);
  EXPECT_EQ(p, (std::vector<double>{0, 1.0 / 3, 0, 1.0 / 3, 1.0 / 3, 0}));
  // A NaN row, an all -inf row, an all-masked row: errors naming the row,
  // nothing written.
  std::vector<float> rows = {0, 1, 2, 0, std::nanf(""), 2, -kInf, -kInf, -kInf};
  std::vector<std::int64_t> t3 = {-7, -7, -7};
  std::vector<std::uint64_t> s3 = {1, 2, 3};
  try {
    softdot::sample({rows.data(), 3, 3}, s3, t3);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("row 1 has a NaN"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(t3, (std::vector<std::int64_t>{-7, -7, -7}));
  rows[4] = 0;
  try {
    softdot::sample({rows.data(), 3, 3}, s3, t3);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("row 2 has no allowed token"),
              std::string::npos)
        << e.what();
  }
  const std::vector<std::int32_t> none = {0};
  EXPECT_THROW(softdot::sample({rows.data(), 1, 3}, {s3.data(), 1},
                               {t3.data(), 1}, {}, {}, none),
               std::invalid_argument);
  // Weights that underflow are never drawn: [0, -200] always gives 0.
  const std::vector<float> far = {0, -200};
  softdot::sample({far.data(), seeds.size(), 2, 0}, seeds, t);
  EXPECT_EQ(std::count(t.begin(), t.end(), 1), 0);
}

TEST(Sample, SixteenBitInputsAreWidenedExactly) {
  const auto x = gaussian(300, 9, 2.0f);
  std::vector<softdot::BFloat16> b(x.size());
  std::vector<softdot::Float16> h(x.size());
  std::vector<float> xb(x.size()), xh(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    b[i] = softdot::to_bfloat16(x[i]);
    h[i] = softdot::to_float16(x[i]);
    xb[i] = softdot::to_float(b[i]);
    xh[i] = softdot::to_float(h[i]);
  }
  std::vector<std::uint64_t> seeds(50);
  std::iota(seeds.begin(), seeds.end(), 77);
  std::vector<std::int64_t> t16(50), t32(50);
  std::vector<float> l16(50), l32(50);
  const SampleOptions o{0.8, 40, 0.9, 0.0};
  softdot::sample({b.data(), 50, x.size(), 0}, seeds, t16, l16, o);
  softdot::sample({xb.data(), 50, x.size(), 0}, seeds, t32, l32, o);
  EXPECT_EQ(t16, t32);
  EXPECT_EQ(l16, l32);
  softdot::sample({h.data(), 50, x.size(), 0}, seeds, t16, l16, o);
  softdot::sample({xh.data(), 50, x.size(), 0}, seeds, t32, l32, o);
  EXPECT_EQ(t16, t32);
}

TEST(Sample, BadInputIsRejected) {
  const std::vector<float> x = {0, 1, 2};
  std::vector<std::uint64_t> s = {1};
  std::vector<std::int64_t> t(1);
  const softdot::MatrixView<const float> v(x.data(), 1, 3);
  for (const SampleOptions& o :
       {SampleOptions{-1.0, 0, 1.0, 0.0}, SampleOptions{NAN, 0, 1.0, 0.0},
        SampleOptions{1e-320, 0, 1.0, 0.0}, SampleOptions{1.0, -1, 1.0, 0.0},
        SampleOptions{1.0, 0, 0.0, 0.0}, SampleOptions{1.0, 0, 1.5, 0.0},
        SampleOptions{1.0, 0, NAN, 0.0}, SampleOptions{1.0, 0, 1.0, -0.1},
        SampleOptions{1.0, 0, 1.0, 1.5}})
    EXPECT_THROW(softdot::sample(v, s, t, {}, o), std::invalid_argument);
  std::vector<std::uint64_t> s2 = {1, 2};
  EXPECT_THROW(softdot::sample(v, s2, t), std::invalid_argument);
  std::vector<std::int64_t> t2(2);
  EXPECT_THROW(softdot::sample(v, s, t2), std::invalid_argument);
  std::vector<float> lp(2);
  EXPECT_THROW(softdot::sample(v, s, t, lp), std::invalid_argument);
  const std::vector<std::int32_t> mask(2, -1);
  EXPECT_THROW(softdot::sample(v, s, t, {}, {}, mask), std::invalid_argument);
  EXPECT_THROW(softdot::sample({x.data(), 1, 0}, s, t), std::invalid_argument);
}

TEST(Sample, PhiloxKnownAnswers) {
  // Random123's kat_vectors for philox4x32_10.
  struct Kat {
    std::uint32_t c[4], k[2], out[4];
  } kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}}};
  for (const auto& kat : kats) {
    std::uint32_t o[4];
    softdot::philox4x32_10(kat.c, kat.k, o);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(o[i], kat.out[i]) << i;
  }
}

// Speculative: the emitted token at each position is distributed as the
// target's distribution there, whatever the draft.
TEST(Speculative, OutputFollowsTheTarget) {
  const std::size_t n = 12, k = 2, rows = 1 << 13;
  const auto draft_logits = gaussian(n, 21, 1.5f);
  std::vector<double> pd = probs_of(draft_logits, {});
  std::vector<float> draft_p(n);
  for (std::size_t i = 0; i < n; ++i) draft_p[i] = static_cast<float>(pd[i]);
  std::vector<float> target(3 * n);
  for (std::size_t j = 0; j < 3; ++j) {
    const auto g = gaussian(n, 30 + static_cast<unsigned>(j), 1.5f);
    std::copy(g.begin(), g.end(), target.begin() + j * n);
  }
  const SampleOptions o{1.0, 0, 0.95, 0.0};
  std::vector<std::vector<double>> q(3);
  for (std::size_t j = 0; j < 3; ++j)
    q[j] = probs_of({target.begin() + j * n, target.begin() + (j + 1) * n}, o);
  // Draft tokens drawn from the draft distribution (by softdot::sample).
  for (bool with_probs : {true, false}) {
    std::vector<std::int64_t> c0(n, 0), c1(n, 0);
    std::int64_t second = 0, total = 0, all_accepted = 0;
    std::vector<std::int64_t> drafts(rows * k), acc(rows), out(rows * (k + 1));
    std::vector<std::uint64_t> seeds(rows);
    // Target rows repeat every K+1 rows: a stride-0 view is not enough, so
    // build the (rows * (K + 1)) x n matrix once.
    std::vector<float> tl(rows * (k + 1) * n);
    for (std::size_t r = 0; r < rows * (k + 1); ++r)
      std::copy(target.begin() + (r % 3) * n, target.begin() + (r % 3 + 1) * n,
                tl.begin() + r * n);
    std::vector<float> dp(rows * k * n);
    for (std::size_t r = 0; r < rows * k; ++r)
      std::copy(draft_p.begin(), draft_p.end(), dp.begin() + r * n);
    for (int rep = 0; rep < 16; ++rep) {
      std::vector<std::uint64_t> ds(rows * k);
      std::iota(ds.begin(), ds.end(),
                1000000ull * (rep + 1) + (with_probs ? 0 : 7));
      softdot::sample({draft_logits.data(), rows * k, n, 0}, ds, drafts);
      std::iota(seeds.begin(), seeds.end(), 50000000ull * (rep + 1));
      softdot::speculative_accept(
          {drafts.data(), rows, k},
          with_probs ? softdot::MatrixView<const float>(dp.data(), rows * k, n)
                     : softdot::MatrixView<const float>(),
          {tl.data(), rows * (k + 1), n}, seeds, acc, {out.data(), rows, k + 1},
          o);
      for (std::size_t r = 0; r < rows; ++r) {
        ASSERT_GE(acc[r], 0);
        ASSERT_LE(acc[r], static_cast<std::int64_t>(k));
        for (std::int64_t j = 0; j < acc[r]; ++j)
          ASSERT_EQ(out[r * (k + 1) + j], drafts[r * k + j]);
        for (std::size_t j = acc[r] + 1; j <= k; ++j)
          ASSERT_EQ(out[r * (k + 1) + j], -1);
        ++c0[out[r * (k + 1)]];
        ++total;
        if (acc[r] >= 1) {
          ++c1[out[r * (k + 1) + 1]];
          ++second;
        }
        all_accepted += acc[r] == static_cast<std::int64_t>(k);
      }
    }
    EXPECT_GT(chi_square_p(c0, q[0], total), 1e-6) << with_probs;
    EXPECT_GT(chi_square_p(c1, q[1], second), 1e-6) << with_probs;
    EXPECT_GT(all_accepted, 0);
    // The test can fail: position 0 against the draft's distribution.
    EXPECT_LT(chi_square_p(c0, pd, total), 1e-6);
  }
}

TEST(Speculative, GreedyTargetAndErrors) {
  const std::vector<float> target = {0, 3, 1, 5, 2, 0};  // rows of 3
  const std::vector<std::int64_t> drafts = {1};
  std::vector<std::int64_t> acc(1), out(2);
  std::vector<std::uint64_t> s = {4};
  softdot::speculative_accept({drafts.data(), 1, 1}, {}, {target.data(), 2, 3},
                              s, acc, {out.data(), 1, 2}, {0.0, 0, 1.0, 0.0});
  EXPECT_EQ(acc[0], 1);
  EXPECT_EQ(out, (std::vector<std::int64_t>{1, 0}));
  const std::vector<std::int64_t> wrong = {2};
  softdot::speculative_accept({wrong.data(), 1, 1}, {}, {target.data(), 2, 3},
                              s, acc, {out.data(), 1, 2}, {0.0, 0, 1.0, 0.0});
  EXPECT_EQ(acc[0], 0);
  EXPECT_EQ(out, (std::vector<std::int64_t>{1, -1}));
  const std::vector<std::int64_t> outside = {3};
  EXPECT_THROW(softdot::speculative_accept({outside.data(), 1, 1}, {},
                                           {target.data(), 2, 3}, s, acc,
                                           {out.data(), 1, 2}),
               std::invalid_argument);
  EXPECT_THROW(softdot::speculative_accept({drafts.data(), 1, 1}, {},
                                           {target.data(), 1, 3}, s, acc,
                                           {out.data(), 1, 2}),
               std::invalid_argument);
  const std::vector<float> neg = {0.5f, -0.1f, 0.6f};
  EXPECT_THROW(softdot::speculative_accept(
                   {drafts.data(), 1, 1}, {neg.data(), 1, 3},
                   {target.data(), 2, 3}, s, acc, {out.data(), 1, 2}),
               std::invalid_argument);
}

}  // namespace
