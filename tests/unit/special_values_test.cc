// Every row of the special-value table (README, "Special values";
// include/softdot/softmax.h) for softmax, log_softmax, logsumexp, softmax_rows
// and log_softmax_rows, float and double, on every SIMD target. (Over 600 lines
// on purpose: it is one table, row by row; split, the rows of one table would
// sit in several files.)
#include <algorithm>
#include <random>
#include <stdexcept>
#include <vector>

#include "test_util.h"

namespace softdot_test {
namespace {

using softdot::MatrixView;
using softdot::SoftmaxOptions;

class SpecialValues : public PerTarget {};

const std::size_t kSizes[] = {1,  2,  3,  5,  7,  8,  9,   15,  16,  17,
                              31, 32, 33, 63, 64, 65, 100, 128, 129, 257};

template <class T>
struct Results {
  std::vector<T> sm, lsm;
  T lse = 0;
};

// Runs softmax, log_softmax and logsumexp on x, and checks that the one-row
// softmax_rows / log_softmax_rows give the same bits.
template <class T>
Results<T> run_all(std::span<const T> x, const SoftmaxOptions& o = {}) {
  const std::size_t n = x.size();
  Guarded<T> y(n, 3), ly(n, 5), yr(n, 7), lyr(n, 9);
  softdot::softmax(x, y.span(), o);
  softdot::log_softmax(x, ly.span(), o);
  Results<T> r{y.vec(), ly.vec(), softdot::logsumexp(x, o)};
  softdot::softmax_rows(MatrixView<const T>(x.data(), 1, n),
                        MatrixView<T>(yr.span().data(), 1, n), o);
  softdot::log_softmax_rows(MatrixView<const T>(x.data(), 1, n),
                            MatrixView<T>(lyr.span().data(), 1, n), o);
  EXPECT_TRUE(y.guards_intact() && ly.guards_intact() && yr.guards_intact() &&
              lyr.guards_intact());
  EXPECT_TRUE(SameBits(r.sm, yr.vec())) << "softmax_rows, n=" << n;
  EXPECT_TRUE(SameBits(r.lsm, lyr.vec())) << "log_softmax_rows, n=" << n;
  return r;
}

// Compares whole rows with the reference: special outputs (0, +-inf, NaN)
// bitwise (so a -0.0 weight fails), finite ones within the ulp bounds.
template <class T>
void expect_matches_reference(std::span<const T> x, const Results<T>& r,
                              const SoftmaxOptions& o) {
  const auto ref = softdot_ref::softmax_reference(x, {o.temperature, o.mask});
  for (std::size_t i = 0; i < x.size(); ++i) {
    const auto& w = ref.softmax[i];
    if (w.ulp == 0) {
      EXPECT_TRUE(same_value(r.sm[i], w.rounded))
          << type_name<T>() << " softmax i=" << i << " got " << fmt(r.sm[i])
          << " want " << fmt(w.rounded) << " (n=" << x.size() << ")";
    } else {
      EXPECT_LE(softdot_ref::ulp_error(r.sm[i], w), kSoftmaxMaxUlp<T>)
          << type_name<T>() << " softmax i=" << i;
    }
    const auto& lw = ref.log_softmax[i];
    if (lw.ulp == 0) {
      EXPECT_TRUE(same_value(r.lsm[i], lw.rounded))
          << type_name<T>() << " log_softmax i=" << i << " got "
          << fmt(r.lsm[i]) << " want " << fmt(lw.rounded);
    } else {
      EXPECT_LE(log_softmax_score(r.lsm[i], lw), 1.0)
          << type_name<T>() << " log_softmax i=" << i << " got "
          << fmt(r.lsm[i]) << " want " << fmt(lw.hi);
    }
  }
  if (ref.logsumexp.ulp == 0) {
    EXPECT_TRUE(same_value(r.lse, ref.logsumexp.rounded))
        << type_name<T>() << " logsumexp got " << fmt(r.lse) << " want "
        << fmt(ref.logsumexp.rounded);
  } else {
    // Here only the table is checked: 2 ulp, or the log_softmax absolute
    // allowance when lse is near 0 (the strict 2-ulp check is in
    // softmax_accuracy_test).
    EXPECT_TRUE(softdot_ref::ulp_error(r.lse, ref.logsumexp) <= kLseMaxUlp ||
                softdot_ref::abs_error(r.lse, ref.logsumexp) <=
                    kLogSoftmaxAbs<T>)
        << type_name<T>() << " logsumexp got " << fmt(r.lse) << " want "
        << fmt(ref.logsumexp.hi) << " row "
        << ::testing::PrintToString(std::vector<double>(x.begin(), x.end()))
        << " mask "
        << ::testing::PrintToString(
               std::vector<bool>(o.mask.begin(), o.mask.end()));
  }
}

// ---- some entries -inf or masked ------------------------------------------

template <class T>
void CheckMasked(std::size_t n, std::uint64_t seed, bool via_mask) {
  std::mt19937_64 rng(seed);
  std::vector<T> x = make_logits<T>(n, Dist::kNormal5, seed);
  Mask mask(via_mask ? n : 0);
  std::vector<bool> masked(n, false);
  std::bernoulli_distribution pick(0.3);
  for (std::size_t i = 0; i < n; ++i) masked[i] = pick(rng);
  masked[rng() % n] = false;  // keep at least one
  const T junk[] = {kNaN<T>, kInf<T>, -kInf<T>, T(1e4), T(-3)};
  std::vector<T> kept;
  for (std::size_t i = 0; i < n; ++i) {
    if (!masked[i]) {
      kept.push_back(x[i]);
    } else if (via_mask) {
      mask[i] = false;
      x[i] = junk[rng() % 5];  // whatever is there: the mask wins
    } else {
      x[i] = -kInf<T>;
    }
  }
  const SoftmaxOptions o{1.0, mask.span()};
  const Results<T> r = run_all<T>(x, o);
  const Results<T> rk = run_all<T>(kept);
  std::size_t j = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (masked[i]) {
      EXPECT_EQ(bits(r.sm[i]), bits(T(0)))
          << "masked weight must be +0, i=" << i;
      EXPECT_EQ(r.lsm[i], -kInf<T>) << "i=" << i;
    } else {
      EXPECT_EQ(bits(r.sm[i]), bits(rk.sm[j]))
          << type_name<T>() << " n=" << n << " i=" << i << ": " << fmt(r.sm[i])
          << " vs without the masked entries " << fmt(rk.sm[j]);
      EXPECT_EQ(bits(r.lsm[i]), bits(rk.lsm[j]))
          << type_name<T>() << " n=" << n << " i=" << i;
      ++j;
    }
  }
  EXPECT_EQ(bits(r.lse), bits(rk.lse)) << type_name<T>() << " n=" << n;
  expect_matches_reference<T>(x, r, o);
}

TEST_P(SpecialValues, MaskedEntriesAreZeroAndTheRestAsIfAbsent) {
  std::uint64_t seed = 100;
  for (std::size_t n : kSizes) {
    for (int rep = 0; rep < 3; ++rep) {
      for (bool via_mask : {false, true}) {
        CheckMasked<float>(n, seed++, via_mask);
        CheckMasked<double>(n, seed++, via_mask);
      }
    }
  }
}

// ---- every entry -inf or masked -------------------------------------------

template <class T>
void ExpectFullyMasked(const Results<T>& r, const char* how, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    EXPECT_EQ(r.sm[i], T(0)) << how << " n=" << n << " i=" << i;
    EXPECT_FALSE(std::signbit(r.sm[i])) << how << ": -0.0 weight, i=" << i;
    EXPECT_EQ(r.lsm[i], -kInf<T>) << how << " n=" << n << " i=" << i;
  }
  EXPECT_EQ(r.lse, -kInf<T>) << how << " n=" << n;
}

template <class T>
void CheckFullyMasked(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const std::vector<T> all_minus_inf(n, -kInf<T>);
  ExpectFullyMasked(run_all<T>(all_minus_inf), "all -inf", n);

  std::vector<T> x = make_logits<T>(n, Dist::kNormal1, seed);
  const T junk[] = {kNaN<T>, kInf<T>, -kInf<T>, T(7)};
  for (auto& v : x) {
    if (rng() % 2) v = junk[rng() % 4];
  }
  Mask none(n, false);
  const SoftmaxOptions o{1.0, none.span()};
  const Results<T> r = run_all<T>(x, o);
  ExpectFullyMasked(r, "all masked", n);
  expect_matches_reference<T>(x, r, o);

  // Mixed: half -inf, the other half masked.
  std::vector<T> y = make_logits<T>(n, Dist::kNormal1, seed + 1);
  Mask half(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (i % 2) {
      y[i] = -kInf<T>;
    } else {
      half[i] = false;
    }
  }
  ExpectFullyMasked(run_all<T>(y, {1.0, half.span()}), "-inf and masked", n);
  // A large negative temperature product that overflows counts as -inf.
  std::vector<T> big(n, -std::numeric_limits<T>::max());
  ExpectFullyMasked(run_all<T>(big, {0.25, {}}), "scaled to -inf", n);
}

TEST_P(SpecialValues, FullyMaskedRowGivesPositiveZeros) {
  std::uint64_t seed = 200;
  for (std::size_t n : kSizes) {
    CheckFullyMasked<float>(n, seed++);
    CheckFullyMasked<double>(n, seed++);
  }
}

// ---- k entries +inf --------------------------------------------------------

template <class T>
void CheckPlusInf(std::size_t n, std::size_t k, std::uint64_t seed,
                  bool via_temperature) {
  std::mt19937_64 rng(seed);
  std::vector<T> x = make_logits<T>(n, Dist::kUniform10, seed);
  for (std::size_t i = 0; i < n; ++i) {  // a few -inf among the others
    if (rng() % 5 == 0) x[i] = -kInf<T>;
  }
  std::vector<std::size_t> pos(n);
  for (std::size_t i = 0; i < n; ++i) pos[i] = i;
  std::shuffle(pos.begin(), pos.end(), rng);
  pos.resize(k);
  std::vector<bool> top(n, false);
  // Via temperature: the max finite value times 4 overflows to +inf.
  const T big = via_temperature ? std::numeric_limits<T>::max() : kInf<T>;
  for (std::size_t p : pos) {
    x[p] = big;
    top[p] = true;
  }
  const SoftmaxOptions o{via_temperature ? 0.25 : 1.0, {}};
  const Results<T> r = run_all<T>(x, o);
  const T w = T(1) / T(k);  // correctly rounded 1/k
  const auto lw = softdot_ref::neg_log_reference<T>(k);
  for (std::size_t i = 0; i < n; ++i) {
    if (top[i]) {
      EXPECT_EQ(bits(r.sm[i]), bits(w))
          << type_name<T>() << " n=" << n << " k=" << k << " i=" << i << " got "
          << fmt(r.sm[i]);
      if (k == 1) {
        // log(1/1) = 0; the table writes 0 - log(k) (+0), the header -log(k)
        // (-0): either sign is accepted.
        EXPECT_EQ(r.lsm[i], T(0)) << "log weight must be 0";
      } else {
        EXPECT_LE(softdot_ref::ulp_error(r.lsm[i], lw), 1.0)
            << type_name<T>() << " k=" << k << " got " << fmt(r.lsm[i])
            << " want " << fmt(lw.hi);
      }
    } else {
      EXPECT_EQ(bits(r.sm[i]), bits(T(0)))
          << type_name<T>() << " n=" << n << " k=" << k << " i=" << i << " got "
          << fmt(r.sm[i]);
      EXPECT_EQ(r.lsm[i], -kInf<T>) << "i=" << i;
    }
  }
  EXPECT_EQ(r.lse, kInf<T>);
  expect_matches_reference<T>(x, r, o);
}

TEST_P(SpecialValues, PlusInfEntriesShareTheWeight) {
  std::uint64_t seed = 300;
  for (std::size_t n : kSizes) {
    for (std::size_t k = 1; k <= std::min<std::size_t>(n, 7); ++k) {
      CheckPlusInf<float>(n, k, seed++, false);
      CheckPlusInf<double>(n, k, seed++, false);
    }
    const std::size_t k = 1 + n / 3;
    CheckPlusInf<float>(n, k, seed++, false);
    CheckPlusInf<double>(n, k, seed++, false);
    CheckPlusInf<float>(n, k, seed++, true);
    CheckPlusInf<double>(n, k, seed++, true);
  }
}

TEST_P(SpecialValues, AllPlusInf) {
  for (std::size_t n : kSizes) {
    const std::vector<float> xf(n, kInf<float>);
    const auto rf = run_all<float>(xf);
    for (float v : rf.sm) ASSERT_EQ(bits(v), bits(1.0f / float(n))) << n;
    const std::vector<double> xd(n, kInf<double>);
    const auto rd = run_all<double>(xd);
    for (double v : rd.sm) ASSERT_EQ(bits(v), bits(1.0 / double(n))) << n;
    EXPECT_EQ(rf.lse, kInf<float>);
    EXPECT_EQ(rd.lse, kInf<double>);
  }
}

// ---- NaN -------------------------------------------------------------------

template <class T>
void ExpectAllNaN(const Results<T>& r, const std::string& what) {
  for (std::size_t i = 0; i < r.sm.size(); ++i) {
    EXPECT_TRUE(std::isnan(r.sm[i]))
        << what << " softmax i=" << i << " got " << fmt(r.sm[i]);
    EXPECT_TRUE(std::isnan(r.lsm[i]))
        << what << " log_softmax i=" << i << " got " << fmt(r.lsm[i]);
  }
  EXPECT_TRUE(std::isnan(r.lse)) << what << " logsumexp got " << fmt(r.lse);
}

template <class T>
void CheckNaN(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const std::string what = std::string(type_name<T>()) +
                           " n=" + std::to_string(n) +
                           " seed=" + std::to_string(seed);
  // One NaN anywhere in a finite row.
  for (std::size_t p : {std::size_t(0), n / 2, n - 1, std::size_t(rng() % n)}) {
    std::vector<T> x = make_logits<T>(n, Dist::kNormal5, seed);
    x[p] = kNaN<T>;
    ExpectAllNaN(run_all<T>(x), what + " nan@" + std::to_string(p));
    // Negative NaN too.
    x[p] = -kNaN<T>;
    ExpectAllNaN(run_all<T>(x), what + " -nan@" + std::to_string(p));
  }
  // NaN together with +inf, -inf and masked entries: NaN still wins.
  std::vector<T> x = make_logits<T>(n, Dist::kNormal1, seed);
  const std::size_t p = rng() % n;
  Mask mask(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (i == p) continue;
    switch (rng() % 4) {
      case 0:
        x[i] = kInf<T>;
        break;
      case 1:
        x[i] = -kInf<T>;
        break;
      case 2:
        mask[i] = false;
        break;
      default:
        break;
    }
  }
  x[p] = kNaN<T>;
  const SoftmaxOptions o{1.0, mask.span()};
  const Results<T> r = run_all<T>(x, o);
  ExpectAllNaN(r, what + " mixed");
  expect_matches_reference<T>(x, r, o);
  // NaN with every other entry masked or -inf.
  Mask others(n, false);
  others[p] = true;
  ExpectAllNaN(run_all<T>(x, {1.0, others.span()}), what + " others masked");
  std::vector<T> lone(n, -kInf<T>);
  lone[p] = kNaN<T>;
  ExpectAllNaN(run_all<T>(lone), what + " others -inf");
  // With a temperature.
  ExpectAllNaN(run_all<T>(lone, {3.0, {}}), what + " temperature 3");
}

TEST_P(SpecialValues, AnyNaNMakesTheWholeRowNaN) {
  std::uint64_t seed = 400;
  for (std::size_t n : kSizes) {
    CheckNaN<float>(n, seed++);
    CheckNaN<double>(n, seed++);
  }
}

// A NaN at a masked position is ignored: the mask wins.
template <class T>
void CheckMaskedNaN(std::size_t n, std::uint64_t seed) {
  std::vector<T> x = make_logits<T>(n, Dist::kUniform10, seed);
  const std::size_t p = seed % n;
  std::vector<T> minus_inf = x;
  minus_inf[p] = -kInf<T>;
  x[p] = kNaN<T>;
  Mask mask(n);
  mask[p] = false;
  const Results<T> r = run_all<T>(x, {1.0, mask.span()});
  const Results<T> want = run_all<T>(minus_inf);
  EXPECT_TRUE(SameBits(r.sm, want.sm)) << type_name<T>() << " n=" << n;
  EXPECT_TRUE(SameBits(r.lsm, want.lsm)) << type_name<T>() << " n=" << n;
  EXPECT_TRUE(same_value(r.lse, want.lse)) << type_name<T>() << " n=" << n;
  if (n > 1) {
    EXPECT_FALSE(std::isnan(r.lse));
  }
}

TEST_P(SpecialValues, NaNAtAMaskedPositionIsIgnored) {
  std::uint64_t seed = 500;
  for (std::size_t n : kSizes) {
    CheckMaskedNaN<float>(n, seed++);
    CheckMaskedNaN<double>(n, seed++);
  }
}

// ---- empty row -------------------------------------------------------------

template <class T>
void CheckEmpty() {
  std::span<const T> x;
  std::span<T> y;
  EXPECT_THROW(softdot::softmax(x, y), std::invalid_argument);
  EXPECT_THROW(softdot::log_softmax(x, y), std::invalid_argument);
  EXPECT_THROW(softdot::logsumexp(x), std::invalid_argument);
  T buf[4] = {};
  EXPECT_THROW(softdot::softmax_rows(MatrixView<const T>(buf, 1, 0),
                                     MatrixView<T>(buf, 1, 0)),
               std::invalid_argument);
  EXPECT_THROW(softdot::log_softmax_rows(MatrixView<const T>(buf, 3, 0),
                                         MatrixView<T>(buf, 3, 0)),
               std::invalid_argument);
  EXPECT_THROW(softdot::softmax_rows(MatrixView<const T>(buf, 2, 0, 2),
                                     MatrixView<T>(buf, 2, 0, 2)),
               std::invalid_argument);
}

TEST_P(SpecialValues, EmptyRowIsRejected) {
  CheckEmpty<float>();
  CheckEmpty<double>();
}

// ---- the same table through softmax_rows, several rows at once -------------

template <class T>
void CheckRowsTable(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const std::size_t rows = 6, stride = n + 3;
  std::vector<T> x(rows * stride, T(-777));
  Mask mask(rows * n);  // rows * cols flags
  for (std::size_t r = 0; r < rows; ++r) {
    auto v = make_logits<T>(n, Dist::kNormal5, seed + r);
    std::copy(v.begin(), v.end(), x.begin() + r * stride);
  }
  T* row1 = &x[1 * stride];
  T* row2 = &x[2 * stride];
  T* row3 = &x[3 * stride];
  T* row4 = &x[4 * stride];
  for (std::size_t i = 0; i < n; i += 2) row1[i] = -kInf<T>;  // some -inf
  for (std::size_t i = 0; i < n; ++i) row2[i] = -kInf<T>;     // fully masked
  row3[rng() % n] = kInf<T>;                                  // +inf
  row3[rng() % n] = kInf<T>;
  row4[rng() % n] = kNaN<T>;             // NaN
  for (std::size_t i = 0; i < n; ++i) {  // row 5: mask
    mask[5 * n + i] = (i % 3 != 1) || n == 1;
  }
  const SoftmaxOptions o{1.0, mask.span()};
  const std::size_t ystride = n + 5;
  std::vector<T> y(rows * ystride, T(-555)), ly(rows * ystride, T(-555));
  softdot::softmax_rows(MatrixView<const T>(x.data(), rows, n, stride),
                        MatrixView<T>(y.data(), rows, n, ystride), o);
  softdot::log_softmax_rows(MatrixView<const T>(x.data(), rows, n, stride),
                            MatrixView<T>(ly.data(), rows, n, ystride), o);
  for (std::size_t r = 0; r < rows; ++r) {
    std::span<const T> xr(&x[r * stride], n);
    const SoftmaxOptions ro{1.0, mask.span().subspan(r * n, n)};
    const Results<T> want = run_all<T>(xr, ro);
    EXPECT_TRUE(SameBits(std::span<const T>(&y[r * ystride], n),
                         std::span<const T>(want.sm)))
        << type_name<T>() << " softmax_rows row " << r << " n=" << n;
    EXPECT_TRUE(SameBits(std::span<const T>(&ly[r * ystride], n),
                         std::span<const T>(want.lsm)))
        << type_name<T>() << " log_softmax_rows row " << r << " n=" << n;
    expect_matches_reference<T>(xr, want, ro);
    for (std::size_t g = n; g < ystride && r + 1 < rows; ++g) {
      EXPECT_EQ(y[r * ystride + g], T(-555)) << "gap written, row " << r;
      EXPECT_EQ(ly[r * ystride + g], T(-555)) << "gap written, row " << r;
    }
  }
}

TEST_P(SpecialValues, RowsFollowTheTable) {
  std::uint64_t seed = 600;
  for (std::size_t n : kSizes) {
    CheckRowsTable<float>(n, seed++);
    CheckRowsTable<double>(n, seed++);
  }
}

// ---- the fast precision, and faithful float rows of 2^15 or more ----------
// The tests above run the default precision on rows of at most 257 elements.
// Two paths lie outside that: the fast softmax takes NaN from its sum (pass A
// does not test for it), and a faithful float row of 2^15 elements or more
// takes its max and sum chunk by chunk (4096 per chunk, in one pass). The
// same table, through those paths: n = 40000 spans 10 chunks, the last one
// partial.

template <class T>
std::vector<T> softmax_in(const std::vector<T>& x, SoftmaxOptions o,
                          softdot::Precision precision) {
  o.precision = precision;
  Guarded<T> y(x.size(), 11);
  softdot::softmax(std::span<const T>(x), y.span(), o);
  EXPECT_TRUE(y.guards_intact());
  return y.vec();
}

template <class T>
void ExpectAllNaN(const std::vector<T>& y, const std::string& what) {
  for (std::size_t i = 0; i < y.size(); ++i) {
    ASSERT_TRUE(std::isnan(y[i])) << what << " i=" << i << " got " << fmt(y[i]);
  }
}

template <class T>
void CheckPathTable(std::size_t n, softdot::Precision precision,
                    std::uint64_t seed) {
  const bool fast = precision == softdot::Precision::kFast;
  const std::string what = std::string(type_name<T>()) +
                           " n=" + std::to_string(n) +
                           (fast ? " fast" : " faithful");
  const double bound = fast ? kFastSoftmaxMaxUlp : kSoftmaxMaxUlp<T>;
  const std::vector<T> finite = make_logits<T>(n, Dist::kNormal5, seed);

  // The first eighth -inf (whole chunks of it at n = 40000) and every 7th
  // entry masked: +0 there, the rest within the bound, with and without a
  // temperature.
  std::vector<T> x = finite;
  Mask mask(n);
  for (std::size_t i = 0; i < n / 8; ++i) x[i] = -kInf<T>;
  for (std::size_t i = 3; i < n; i += 7) mask[i] = false;
  for (double temperature : {1.0, 0.5}) {
    const std::vector<T> y =
        softmax_in(x, {temperature, mask.span()}, precision);
    const auto ref = softdot_ref::softmax_reference(std::span<const T>(x),
                                                    {temperature, mask.span()});
    for (std::size_t i = 0; i < n; ++i) {
      const auto& w = ref.softmax[i];
      if (w.ulp == 0) {
        ASSERT_TRUE(same_value(y[i], w.rounded))
            << what << " T=" << temperature << " i=" << i << " got "
            << fmt(y[i]) << " want " << fmt(w.rounded);
      } else {
        ASSERT_LE(softdot_ref::ulp_error(y[i], w), bound)
            << what << " T=" << temperature << " i=" << i;
      }
    }
  }

  // One NaN anywhere: all NaN; also beside a +inf, and among -inf only.
  for (std::size_t p : {std::size_t(0), n / 2, n - 1}) {
    std::vector<T> z = finite;
    z[p] = kNaN<T>;
    ExpectAllNaN(softmax_in(z, {}, precision),
                 what + " nan@" + std::to_string(p));
    z[(p + 1) % n] = kInf<T>;
    ExpectAllNaN(softmax_in(z, {}, precision),
                 what + " nan and +inf @" + std::to_string(p));
    std::vector<T> lone(n, -kInf<T>);
    lone[p] = kNaN<T>;
    ExpectAllNaN(softmax_in(lone, {}, precision),
                 what + " nan among -inf @" + std::to_string(p));
  }

  // A NaN at a masked position: the same bits as -inf there.
  {
    const std::size_t p = n / 3;
    std::vector<T> z = finite, minus_inf = finite;
    z[p] = kNaN<T>;
    minus_inf[p] = -kInf<T>;
    Mask only(n);
    only[p] = false;
    EXPECT_TRUE(SameBits(softmax_in(z, {1.0, only.span()}, precision),
                         softmax_in(minus_inf, {}, precision)))
        << what << " masked NaN";
  }

  // Two +inf: 1/2 each, +0 elsewhere.
  {
    std::vector<T> z = finite;
    z[1] = kInf<T>;
    z[n - 2] = kInf<T>;
    const std::vector<T> y = softmax_in(z, {}, precision);
    for (std::size_t i = 0; i < n; ++i) {
      const T want = (i == 1 || i == n - 2) ? T(0.5) : T(0);
      ASSERT_EQ(bits(y[i]), bits(want)) << what << " +inf, i=" << i;
    }
  }

  // Every entry -inf: +0 everywhere.
  for (T v : softmax_in(std::vector<T>(n, -kInf<T>), {}, precision)) {
    ASSERT_EQ(bits(v), bits(T(0))) << what << " all -inf";
  }
}

TEST_P(SpecialValues, FastPrecisionAndChunkedRowsFollowTheTable) {
  std::uint64_t seed = 700;
  for (std::size_t n : {std::size_t(5), std::size_t(37), std::size_t(40000)}) {
    for (auto precision :
         {softdot::Precision::kFaithful, softdot::Precision::kFast}) {
      CheckPathTable<float>(n, precision, seed++);
      if (n < 40000) CheckPathTable<double>(n, precision, seed++);
    }
  }
}

// A log-weight is never above 0. The top score of a single-entry row has
// log-weight 0 up to the stated absolute error (2^-24 float, 2^-53 double:
// the scaled score's exact low part against the rounded log of the sum).
// Before the cap in LogPass it could also come out above 0 (+1.8e-17 for
// double x = 21.4 at temperature 1.1, found by tests/python).
template <class T>
void CheckLogWeightsNotPositive() {
  const T bound = sizeof(T) == 4 ? T(0x1p-24) : T(0x1p-53);
  for (double t : {0.3, 0.7, 1.1, 3.3}) {
    SoftmaxOptions o;
    o.temperature = t;
    for (T x0 : {T(21.4), T(-3.7), T(1e-3), T(12345.678)}) {
      const T x[1] = {x0};
      T y[1] = {T(7)};
      softdot::log_softmax(std::span<const T>(x, 1), std::span<T>(y, 1), o);
      EXPECT_TRUE(y[0] <= T(0) && y[0] >= -bound)
          << type_name<T>() << " x=" << fmt(x0) << " t=" << t << " got "
          << fmt(y[0]);
    }
    std::mt19937_64 rng(41);
    std::normal_distribution<double> g(0.0, 5.0);
    for (std::size_t n : {2, 3, 17, 100}) {
      std::vector<T> x(n), y(n);
      for (auto& v : x) v = static_cast<T>(g(rng));
      softdot::log_softmax(std::span<const T>(x), std::span<T>(y), o);
      for (std::size_t i = 0; i < n; ++i)
        EXPECT_LE(y[i], T(0))
            << type_name<T>() << " n=" << n << " i=" << i << " t=" << t;
    }
  }
}

TEST_P(SpecialValues, LogWeightsAreNeverPositive) {
  CheckLogWeightsNotPositive<float>();
  CheckLogWeightsNotPositive<double>();
}

// A float row of at most 16 elements takes the one-block path
// (softmax_small-inl.h); the same row followed by -inf entries up to 17
// takes the passes, where the -inf entries weigh +0 and change no other
// bit. So the first n weights of the two agree bitwise: the one-block path
// has the bits of the passes, with -inf lanes (padding, -inf inputs, masked
// entries) anywhere in it, in both precisions, scaled or not.
void CheckShortRowAsPasses(std::size_t n, std::uint64_t seed,
                           softdot::Precision precision, double temperature,
                           bool with_mask) {
  std::mt19937_64 rng(seed);
  std::vector<float> x = make_logits<float>(n, Dist::kNormal5, seed);
  Mask mask(with_mask ? n : 0);
  for (std::size_t i = 0; i < n; ++i) {
    if (rng() % 4 == 0) x[i] = -kInf<float>;
    if (with_mask && rng() % 4 == 0) mask[i] = false;
  }
  x[rng() % n] = 1.5f;  // at least one finite score that is not masked
  if (with_mask) mask[std::find(x.begin(), x.end(), 1.5f) - x.begin()] = true;
  std::vector<float> padded = x;
  padded.resize(17, -kInf<float>);
  Mask padded_mask(with_mask ? 17 : 0);
  for (std::size_t i = 0; i < n && with_mask; ++i) padded_mask[i] = mask[i];
  SoftmaxOptions o{temperature, mask.span()};
  o.precision = precision;
  SoftmaxOptions op{temperature, padded_mask.span()};
  op.precision = precision;
  std::vector<float> y(n), yp(17);
  softdot::softmax(std::span<const float>(x), std::span<float>(y), o);
  softdot::softmax(std::span<const float>(padded), std::span<float>(yp), op);
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_EQ(bits(y[i]), bits(yp[i]))
        << "n=" << n << " i=" << i << " temperature " << temperature
        << (with_mask ? " masked" : "") << ": " << fmt(y[i]) << " vs "
        << fmt(yp[i]) << " through the passes";
  }
}

TEST_P(SpecialValues, ShortRowsHaveTheBitsOfThePasses) {
  std::uint64_t seed = 500;
  for (std::size_t n = 1; n <= 16; ++n) {
    for (auto precision :
         {softdot::Precision::kFaithful, softdot::Precision::kFast}) {
      for (double temperature : {1.0, 0.7}) {
        for (bool with_mask : {false, true}) {
          for (int rep = 0; rep < 4; ++rep) {
            CheckShortRowAsPasses(n, seed++, precision, temperature, with_mask);
          }
        }
      }
    }
  }
}

SOFTDOT_INSTANTIATE_PER_TARGET(SpecialValues);

}  // namespace
}  // namespace softdot_test
