// softdot::linear_cross_entropy: loss and both gradients against a long
// double reference (logits, softmax and products in long double), the
// reductions, ignore_index and label smoothing, bfloat16 inputs (bitwise
// the float path on the widened values), the same bits for 1 and 2
// threads and for a row alone or inside a larger call, and the errors.
#include "softdot/linear_cross_entropy.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "softdot/simd.h"
#include "test_util.h"

namespace {

using softdot::BFloat16;
using softdot::CrossEntropyOptions;
using softdot::MatrixView;
using softdot::Reduction;
using softdot_test::bits;
using L = long double;

constexpr double kU = 0x1p-24;  // float's unit roundoff

struct Case {
  std::size_t n, d, v;
  std::vector<float> h, w;
  std::vector<std::int64_t> t;
};

Case make_case(std::size_t n, std::size_t d, std::size_t v, unsigned seed,
               std::size_t ignored_every = 5) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> gauss(0.0f, 1.0f);
  Case c{n, d, v, std::vector<float>(n * d), std::vector<float>(v * d), {}};
  for (auto& x : c.h) x = gauss(rng);
  // Scaled so the logits spread over a few units (peaked softmax rows).
  const float ws = 2.0f / std::sqrt(static_cast<float>(d));
  for (auto& x : c.w) x = ws * gauss(rng);
  std::uniform_int_distribution<std::int64_t> cls(0, static_cast<int>(v) - 1);
  for (std::size_t i = 0; i < n; ++i) {
    c.t.push_back(ignored_every != 0 && i % ignored_every == 3 ? -100
                                                               : cls(rng));
  }
  return c;
}

struct Result {
  double value = 0;
  std::vector<float> loss, dh, dw;
};

Result run(const Case& c, const CrossEntropyOptions& o, bool grads = true) {
  Result r;
  r.loss.assign(c.n, -1.0f);
  r.dh.assign(c.n * c.d, -1.0f);
  r.dw.assign(c.v * c.d, -1.0f);
  r.value = softdot::linear_cross_entropy(
      MatrixView<const float>(c.h.data(), c.n, c.d),
      MatrixView<const float>(c.w.data(), c.v, c.d), c.t, r.loss,
      grads ? MatrixView<float>(r.dh.data(), c.n, c.d) : MatrixView<float>{},
      grads ? MatrixView<float>(r.dw.data(), c.v, c.d) : MatrixView<float>{},
      o);
  return r;
}

// The long double reference, and per element the sums of magnitudes that
// scale the float path's error: |h||w| over k for a logit, |g||w| over v
// for grad_hidden, |g||h| over rows for grad_weight.
struct Ref {
  L value = 0;
  std::vector<L> loss, dh, dw;
  std::vector<L> dh_mag, dw_mag;
  L max_logit_mag = 0;
};

Ref reference(const Case& c, const CrossEntropyOptions& o) {
  Ref r;
  const std::size_t n = c.n, d = c.d, v = c.v;
  const L eps = o.label_smoothing;
  std::size_t counted = 0;
  for (auto t : c.t) counted += t != o.ignore_index;
  const L scale = o.reduction == Reduction::kMean ? 1.0L / counted : 1.0L;
  r.loss.assign(n, 0);
  r.dh.assign(n * d, 0);
  r.dw.assign(v * d, 0);
  r.dh_mag.assign(n * d, 0);
  r.dw_mag.assign(v * d, 0);
  std::vector<L> x(v), g(v);
  L total = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (c.t[i] == o.ignore_index) continue;
    L m = -std::numeric_limits<L>::infinity(), sx = 0;
    for (std::size_t j = 0; j < v; ++j) {
      L s = 0, mag = 0;
      for (std::size_t k = 0; k < d; ++k) {
        s += static_cast<L>(c.h[i * d + k]) * c.w[j * d + k];
        mag += std::fabs(static_cast<L>(c.h[i * d + k]) * c.w[j * d + k]);
      }
      x[j] = s;
      r.max_logit_mag = std::max(r.max_logit_mag, mag);
      m = std::max(m, s);
      sx += s;
    }
    L s = 0;
    for (std::size_t j = 0; j < v; ++j) s += std::exp(x[j] - m);
    const L lse = m + std::log(s);
    const L t = static_cast<L>(c.t[i]);
    r.loss[i] = (1 - eps) * (lse - x[c.t[i]]) + eps * (lse - sx / v);
    (void)t;
    total += r.loss[i];
    for (std::size_t j = 0; j < v; ++j) {
      g[j] = scale *
             (std::exp(x[j] - m) / s -
              (static_cast<std::int64_t>(j) == c.t[i] ? 1 - eps : 0) - eps / v);
    }
    for (std::size_t j = 0; j < v; ++j) {
      for (std::size_t k = 0; k < d; ++k) {
        r.dh[i * d + k] += g[j] * c.w[j * d + k];
        r.dh_mag[i * d + k] += std::fabs(g[j] * c.w[j * d + k]);
        r.dw[j * d + k] += g[j] * c.h[i * d + k];
        r.dw_mag[j * d + k] += std::fabs(g[j] * c.h[i * d + k]);
      }
    }
  }
  r.value = o.reduction == Reduction::kMean ? total / counted : total;
  return r;
}

// The float path: a logit is within (64 + 2) u of its magnitude sum (one
// float chain of <= 64 products, double sums, one rounding), so a loss
// within about twice the largest such error; a gradient element within
// 66 u of its own magnitude sum plus what the logits' and G's errors
// (relative 2 dx + 2 u of each g) carry, bounded by (2 dx + 2 u) times
// the magnitude sum.
void expect_close(const Case& c, const Result& got, const Ref& ref,
                  bool grads = true) {
  const L dx = 66 * kU * ref.max_logit_mag;
  const L loss_tol = 2 * dx + 4 * kU;
  for (std::size_t i = 0; i < c.n; ++i) {
    ASSERT_LE(std::fabs(got.loss[i] - ref.loss[i]),
              loss_tol + kU * std::fabs(ref.loss[i]))
        << "row " << i;
  }
  L sum_tol = 0;
  for (std::size_t i = 0; i < c.n; ++i) sum_tol += loss_tol;
  EXPECT_LE(std::fabs(got.value - ref.value), sum_tol);
  if (!grads) return;
  const L rel = 66 * kU + 4 * dx + 4 * kU;
  for (std::size_t e = 0; e < c.n * c.d; ++e) {
    ASSERT_LE(std::fabs(got.dh[e] - ref.dh[e]), rel * ref.dh_mag[e] + 1e-30L)
        << "grad_hidden " << e;
  }
  for (std::size_t e = 0; e < c.v * c.d; ++e) {
    ASSERT_LE(std::fabs(got.dw[e] - ref.dw[e]), rel * ref.dw_mag[e] + 1e-30L)
        << "grad_weight " << e;
  }
}

TEST(LinearCrossEntropy, MatchesLongDoubleReference) {
  // D = 100: two product chains (64 + 36); V = 1000: a partial panel.
  const Case c = make_case(37, 100, 1000, 1);
  const std::pair<Reduction, double> cases[] = {{Reduction::kMean, 0.0},
                                                {Reduction::kNone, 0.3}};
  for (const auto& [red, eps] : cases) {
    CrossEntropyOptions o;
    o.reduction = red;
    o.label_smoothing = eps;
    SCOPED_TRACE(testing::Message()
                 << "reduction " << static_cast<int>(red) << " eps " << eps);
    expect_close(c, run(c, o), reference(c, o));
  }
}

TEST(LinearCrossEntropy, BlocksAndLongSums) {
  // 300 rows: two blocks of rows (block_rows(1000) = 256); V = 4500 > 4096:
  // grad_hidden's sum over V in two chunks added in double.
  {
    const Case c = make_case(300, 16, 1000, 2);
    expect_close(c, run(c, {}), reference(c, {}));
  }
  {
    const Case c = make_case(20, 32, 4500, 3);
    CrossEntropyOptions o;
    o.label_smoothing = 0.2;
    o.reduction = Reduction::kSum;
    expect_close(c, run(c, o), reference(c, o));
  }
}

TEST(LinearCrossEntropy, LossOnlyEqualsWithGradients) {
  const Case c = make_case(37, 100, 1000, 4);
  const Result a = run(c, {}, false), b = run(c, {});
  EXPECT_EQ(bits(a.value), bits(b.value));
  for (std::size_t i = 0; i < c.n; ++i) {
    ASSERT_EQ(bits(a.loss[i]), bits(b.loss[i])) << i;
  }
}

template <class T>
void expect_same_bits(const std::vector<T>& a, const std::vector<T>& b,
                      const char* what) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(bits(a[i]), bits(b[i])) << what << " " << i;
  }
}

TEST(LinearCrossEntropy, SameBitsForAnyThreadCount) {
  const Case c = make_case(300, 40, 1000, 5);
  CrossEntropyOptions o;
  o.label_smoothing = 0.05;
  const int before = omp_get_max_threads();
  omp_set_num_threads(1);
  const Result one = run(c, o);
  omp_set_num_threads(2);
  const Result two = run(c, o);
  omp_set_num_threads(before);
  EXPECT_EQ(bits(one.value), bits(two.value));
  expect_same_bits(one.loss, two.loss, "loss");
  expect_same_bits(one.dh, two.dh, "grad_hidden");
  expect_same_bits(one.dw, two.dw, "grad_weight");
}

TEST(LinearCrossEntropy, RowsDoNotDependOnTheirBlock) {
  // Rows 256..299 are the second block of the 300-row call; alone, the
  // first block of a 44-row call: the same losses and grad_hidden bits.
  const Case c = make_case(300, 40, 1000, 6);
  CrossEntropyOptions o;
  o.reduction = Reduction::kSum;
  const Result all = run(c, o);
  Case tail = c;
  tail.n = 44;
  tail.h.assign(c.h.begin() + 256 * c.d, c.h.end());
  tail.t.assign(c.t.begin() + 256, c.t.end());
  const Result part = run(tail, o);
  for (std::size_t i = 0; i < 44; ++i) {
    ASSERT_EQ(bits(all.loss[256 + i]), bits(part.loss[i])) << i;
  }
  for (std::size_t e = 0; e < 44 * c.d; ++e) {
    ASSERT_EQ(bits(all.dh[256 * c.d + e]), bits(part.dh[e])) << e;
  }
}

TEST(LinearCrossEntropy, SameBitsOnEveryFmaTarget) {
  // Tile shapes differ (AVX-512 12 x 32, AVX2 6 x 16); the chains do not.
  const Case c = make_case(40, 100, 300, 11);
  softdot::force_simd_target("");
  const std::string best = softdot::simd_target();
  const Result ref = run(c, {});
  for (const std::string& t : softdot::simd_targets()) {
    SCOPED_TRACE(t);
    softdot::force_simd_target(t);
    const Result r = run(c, {});
    const bool fma = softdot_test::is_fma_target(t);
    if (fma && softdot_test::is_fma_target(best)) {
      EXPECT_EQ(bits(r.value), bits(ref.value));
      expect_same_bits(ref.loss, r.loss, "loss");
      expect_same_bits(ref.dh, r.dh, "grad_hidden");
      expect_same_bits(ref.dw, r.dw, "grad_weight");
    } else {
      // Without FMA the products round separately: close, not equal.
      expect_close(c, r, reference(c, {}));
    }
  }
  softdot::force_simd_target("");
}

TEST(LinearCrossEntropy, BFloat16IsTheFloatPathOnWidenedValues) {
  Case c = make_case(37, 70, 300, 7);
  std::vector<BFloat16> hb, wb;
  for (float& x : c.h) {
    hb.push_back(softdot::to_bfloat16(x));
    x = softdot::to_float(hb.back());
  }
  for (float& x : c.w) {
    wb.push_back(softdot::to_bfloat16(x));
    x = softdot::to_float(wb.back());
  }
  CrossEntropyOptions o;
  o.label_smoothing = 0.1;
  const Result f = run(c, o);
  Result b;
  b.loss.assign(c.n, 0);
  b.dh.assign(c.n * c.d, 0);
  b.dw.assign(c.v * c.d, 0);
  b.value = softdot::linear_cross_entropy(
      MatrixView<const BFloat16>(hb.data(), c.n, c.d),
      MatrixView<const BFloat16>(wb.data(), c.v, c.d), c.t, b.loss,
      MatrixView<float>(b.dh.data(), c.n, c.d),
      MatrixView<float>(b.dw.data(), c.v, c.d), o);
  EXPECT_EQ(bits(f.value), bits(b.value));
  expect_same_bits(f.loss, b.loss, "loss");
  expect_same_bits(f.dh, b.dh, "grad_hidden");
  expect_same_bits(f.dw, b.dw, "grad_weight");
  expect_close(c, b, reference(c, o));
}

TEST(LinearCrossEntropy, AllRowsIgnored) {
  Case c = make_case(9, 16, 50, 8);
  for (auto& t : c.t) t = 7;
  CrossEntropyOptions o;
  o.ignore_index = 7;
  const Result mean = run(c, o);
  EXPECT_TRUE(std::isnan(mean.value));  // as torch: 0 / 0
  for (float x : mean.loss) EXPECT_EQ(bits(x), bits(0.0f));
  for (float x : mean.dh) ASSERT_EQ(bits(x), bits(0.0f));
  for (float x : mean.dw) ASSERT_EQ(bits(x), bits(0.0f));
  o.reduction = Reduction::kSum;
  EXPECT_EQ(run(c, o).value, 0.0);
}

TEST(LinearCrossEntropy, NaNStaysInItsRow) {
  Case c = make_case(6, 16, 50, 9, 0);
  c.h[2 * 16 + 5] = std::numeric_limits<float>::quiet_NaN();
  CrossEntropyOptions o;
  o.reduction = Reduction::kSum;
  const Result r = run(c, o);
  EXPECT_TRUE(std::isnan(r.value));
  for (std::size_t i = 0; i < c.n; ++i) {
    EXPECT_EQ(std::isnan(r.loss[i]), i == 2) << i;
    for (std::size_t k = 0; k < c.d; ++k) {
      ASSERT_EQ(std::isnan(r.dh[i * c.d + k]), i == 2) << i << " " << k;
    }
  }
  // The other rows as a call without row 2.
  Case rest = c;
  rest.t[2] = -100;
  rest.h[2 * 16 + 5] = 0.0f;
  const Result q = run(rest, o);
  for (std::size_t i = 0; i < c.n; ++i) {
    if (i != 2) {
      EXPECT_EQ(bits(r.loss[i]), bits(q.loss[i])) << i;
    }
  }
}

TEST(LinearCrossEntropy, Errors) {
  const Case c = make_case(4, 8, 10, 10, 0);
  std::vector<float> loss(4), dh(32), dw(80);
  const MatrixView<const float> h(c.h.data(), 4, 8), w(c.w.data(), 10, 8);
  const auto message = [&](auto&& call) -> std::string {
    try {
      call();
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "no exception";
  };
  EXPECT_NE(message([&] {
              softdot::linear_cross_entropy(
                  h, MatrixView<const float>(c.w.data(), 10, 7), c.t, loss);
            }).find("weight must be V x D"),
            std::string::npos);
  std::vector<std::int64_t> bad = c.t;
  bad[3] = 10;
  const std::string m = message([&] {
    softdot::linear_cross_entropy(h, w, bad, loss,
                                  MatrixView<float>(dh.data(), 4, 8));
  });
  EXPECT_NE(m.find("targets[3] = 10"), std::string::npos) << m;
  EXPECT_EQ(dh[0], 0.0f);  // nothing written
  EXPECT_NE(message([&] {
              softdot::linear_cross_entropy(h, w, c.t, loss,
                                            MatrixView<float>(dh.data(), 4, 7));
            }).find("grad_hidden"),
            std::string::npos);
  EXPECT_NE(message([&] {
              softdot::linear_cross_entropy(
                  h, w, c.t, loss, {}, MatrixView<float>(dw.data(), 10, 7));
            }).find("grad_weight"),
            std::string::npos);
  EXPECT_NE(message([&] {
              softdot::linear_cross_entropy(h, w, c.t,
                                            std::span<float>(dh.data(), 4),
                                            MatrixView<float>(dh.data(), 4, 8));
            }).find("overlaps"),
            std::string::npos);
  EXPECT_NE(message([&] {
              softdot::linear_cross_entropy(
                  h, w, c.t, loss,
                  MatrixView<float>(const_cast<float*>(c.h.data()), 4, 8));
            }).find("grad_hidden overlaps hidden"),
            std::string::npos);
  CrossEntropyOptions o;
  o.label_smoothing = 1.5;
  EXPECT_NE(message([&] {
              softdot::linear_cross_entropy(h, w, c.t, loss, {}, {}, o);
            }).find("label_smoothing"),
            std::string::npos);
  EXPECT_NE(message([&] {
              softdot::linear_cross_entropy(
                  h, w, std::span<const std::int64_t>(c.t.data(), 3), loss);
            }).find("targets"),
            std::string::npos);
}

}  // namespace
