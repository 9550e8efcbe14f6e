// softmax_backward(): dx = y * (dy - <dy, y>) against MPFR, in place, sizes,
// and the special values (weight-0 entries, fully masked and +inf rows, NaN,
// infinite dy): never a NaN made by 0 * inf or inf - inf.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "test_util.h"

namespace softdot_test {
namespace {

class BackwardTest : public PerTarget {};

// Worst error over many rows, in ulps of dx beyond an allowance for the
// conditioning of dy_i - <dy, y>: the inner product g is known only to about
// u |g| (double; float forms it in double, where that term is negligible).
template <class T>
void CheckBackward(double max_ulp) {
  const double u = softdot_ref::unit_roundoff<T>();
  softdot_ref::UlpStats stats;
  std::string worst;
  std::uint64_t seed = 40;
  for (std::size_t n : {1, 2, 3, 7, 16, 17, 63, 64, 65, 300, 1000, 4097}) {
    for (int rep = 0; rep < 3; ++rep) {
      const auto x = make_uniform<T>(n, -5.0, 5.0, seed++);
      std::vector<T> y(n);
      softdot::softmax(std::span<const T>(x), std::span<T>(y));
      const auto dy = make_uniform<T>(n, -1.0, 1.0, seed++);
      Guarded<T> dx(n, n % 7);
      softdot::softmax_backward(std::span<const T>(y), std::span<const T>(dy),
                                dx.span());
      const auto ref = softdot_ref::softmax_backward_reference(
          std::span<const T>(y), std::span<const T>(dy));
      const auto g = softdot_ref::dot_reference(std::span<const T>(dy),
                                                std::span<const T>(y));
      for (std::size_t i = 0; i < n; ++i) {
        const double err = softdot_ref::abs_error(dx[i], ref[i]);
        const double allowance =
            sizeof(T) == 8 ? 2 * u * std::fabs(double(y[i]) * g.value.hi) : 0;
        const double e = std::max(0.0, err - allowance) / ref[i].ulp;
        if (ref[i].ulp == 0) {
          EXPECT_EQ(err, 0.0) << "n=" << n << " i=" << i;
          continue;
        }
        if (e > stats.max || stats.count == 0) {
          worst = "n=" + std::to_string(n) + " i=" + std::to_string(i) +
                  " got " + fmt(dx[i]) + " want " + fmt(ref[i].hi);
        }
        stats.add(e, i);
      }
      EXPECT_TRUE(dx.guards_intact());
    }
  }
  std::printf("[ ulp      ] %s %s softmax_backward %s\n", type_name<T>(),
              softdot::simd_target().c_str(), stats.str().c_str());
  EXPECT_LE(stats.max, max_ulp) << type_name<T>() << " worst " << worst;
}

TEST_P(BackwardTest, FloatAgainstMpfr) { CheckBackward<float>(0.51); }
TEST_P(BackwardTest, DoubleAgainstMpfr) { CheckBackward<double>(1.0); }

TEST_P(BackwardTest, InPlaceGivesTheSameBits) {
  const auto x = make_uniform<float>(257, -3.0, 3.0, 1);
  std::vector<float> y(257), dx(257);
  softdot::softmax(std::span<const float>(x), std::span<float>(y));
  const auto dy = make_uniform<float>(257, -1.0, 1.0, 2);
  softdot::softmax_backward(std::span<const float>(y),
                            std::span<const float>(dy), std::span<float>(dx));
  auto in_dy = dy;
  softdot::softmax_backward(std::span<const float>(y),
                            std::span<const float>(in_dy),
                            std::span<float>(in_dy));
  auto in_y = y;
  softdot::softmax_backward(std::span<const float>(in_y),
                            std::span<const float>(dy), std::span<float>(in_y));
  for (std::size_t i = 0; i < dx.size(); ++i) {
    EXPECT_TRUE(same_value(dx[i], in_dy[i])) << i;
    EXPECT_TRUE(same_value(dx[i], in_y[i])) << i;
  }
}

TEST_P(BackwardTest, UniformGradientGivesZero) {
  // dy = c everywhere: <dy, y> = c (y sums to 1 up to rounding), so dx ~ 0.
  std::vector<double> y = {0.25, 0.25, 0.5}, dy = {3, 3, 3}, dx(3);
  softdot::softmax_backward(std::span<const double>(y),
                            std::span<const double>(dy), std::span<double>(dx));
  for (double v : dx) EXPECT_EQ(v, 0.0);
}

// ---- special values ---------------------------------------------------------

template <class T>
std::vector<T> Backward(const std::vector<T>& y, const std::vector<T>& dy) {
  std::vector<T> dx(y.size());
  softdot::softmax_backward(std::span<const T>(y), std::span<const T>(dy),
                            std::span<T>(dx));
  return dx;
}

template <class T>
std::vector<T> SoftmaxOf(const std::vector<T>& x) {
  std::vector<T> y(x.size());
  softdot::softmax(std::span<const T>(x), std::span<T>(y));
  return y;
}

// y_i (dy_i - sum_j y_j dy_j) in long double over the entries of weight > 0,
// 0 elsewhere, and a bound of a few roundings of the working type.
template <class T>
void ExpectNearVisibleReference(const std::vector<T>& y,
                                const std::vector<T>& dy,
                                const std::vector<T>& dx) {
  long double g = 0, g_abs = 0;
  for (std::size_t j = 0; j < y.size(); ++j) {
    if (y[j] == 0) continue;
    g += static_cast<long double>(y[j]) * dy[j];
    g_abs += std::fabs(static_cast<long double>(y[j]) * dy[j]);
  }
  const long double u = std::numeric_limits<T>::epsilon();
  for (std::size_t i = 0; i < y.size(); ++i) {
    if (y[i] == 0) {
      EXPECT_EQ(dx[i], T{0}) << "i=" << i << " (weight 0)";
      continue;
    }
    const long double ref = static_cast<long double>(y[i]) * (dy[i] - g);
    const long double tol =
        2 * u * (std::fabs(ref) + y[i] * (std::fabs(dy[i]) + g_abs));
    EXPECT_TRUE(std::isfinite(dx[i])) << "i=" << i;
    EXPECT_LE(std::fabs(dx[i] - ref), tol)
        << "i=" << i << " got " << fmt(dx[i]) << " want "
        << static_cast<double>(ref);
  }
}

// Some -inf logits (weight exactly 0): their gradient is exactly 0 whatever
// dy holds there (finite or +-inf: 0 * inf counts as 0), and the rest equal
// the gradient of the row without them.
template <class T>
void CheckMaskedEntries() {
  const T inf = kInf<T>;
  for (std::size_t n : {5, 16, 67, 300}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    auto x = make_uniform<T>(n, -3.0, 3.0, 100 + n);
    for (std::size_t i = 1; i < n; i += 3) x[i] = -inf;
    const auto y = SoftmaxOf(x);
    auto dy = make_uniform<T>(n, -2.0, 2.0, 200 + n);
    ExpectNearVisibleReference(y, dy, Backward(y, dy));
    for (std::size_t i = 1; i < n; i += 3) dy[i] = (i % 2) ? inf : -inf;
    const auto dx = Backward(y, dy);
    ExpectNearVisibleReference(y, dy, dx);
    // Infinities at two masked entries only: the same values as dy = 0 there.
    auto dy0 = dy;
    for (std::size_t i = 1; i < n; i += 3) dy0[i] = 0;
    const auto dx0 = Backward(y, dy0);
    for (std::size_t i = 0; i < n; ++i) {
      EXPECT_NEAR(dx[i], dx0[i], 2 * std::numeric_limits<T>::epsilon())
          << "i=" << i;
    }
  }
}

TEST_P(BackwardTest, MaskedEntriesGetExactlyZeroFloat) {
  CheckMaskedEntries<float>();
}
TEST_P(BackwardTest, MaskedEntriesGetExactlyZeroDouble) {
  CheckMaskedEntries<double>();
}

// A fully masked row: softmax gives +0 everywhere, and its gradient is all
// zeros (not NaN), for finite and for infinite dy.
template <class T>
void CheckFullyMasked() {
  const T inf = kInf<T>;
  for (std::size_t n : {1, 3, 16, 100}) {
    const std::vector<T> x(n, -inf);
    const auto y = SoftmaxOf(x);
    for (T v : y) ASSERT_EQ(bits(v), bits(T{0}));
    auto dy = make_uniform<T>(n, -2.0, 2.0, n);
    for (T v : Backward(y, dy)) EXPECT_EQ(v, T{0}) << "n=" << n;
    dy[0] = inf;
    dy[n / 2] = -inf;
    for (T v : Backward(y, dy)) EXPECT_EQ(v, T{0}) << "n=" << n;
  }
}

TEST_P(BackwardTest, FullyMaskedRowGivesZerosFloat) {
  CheckFullyMasked<float>();
}
TEST_P(BackwardTest, FullyMaskedRowGivesZerosDouble) {
  CheckFullyMasked<double>();
}

// k entries +inf: weights 1/k there, 0 elsewhere; the gradient is the
// limit's, finite: y_i (dy_i - mean of dy over the +inf entries) there, 0
// elsewhere; and close to the gradient at large finite scores.
template <class T>
void CheckPlusInf() {
  const T inf = kInf<T>;
  const std::vector<T> x = {inf, 1, inf, -inf, 3, inf, 0, 2};
  const auto y = SoftmaxOf(x);
  const std::vector<T> dy = {T(1.5), -2, T(0.25), 7, 1, -1, 4, T(0.5)};
  const auto dx = Backward(y, dy);
  const T third = y[0];
  EXPECT_EQ(third, T(1) / T(3));
  // g = (1.5 + 0.25 - 1) / 3 = 0.25 (within rounding of 1/3).
  const long double g = (1.5L + 0.25L - 1.0L) * third;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (x[i] != inf) {
      EXPECT_EQ(dx[i], T{0}) << i;
      continue;
    }
    const long double ref = third * (dy[i] - g);
    EXPECT_NEAR(dx[i], ref, 2 * std::numeric_limits<T>::epsilon()) << i;
  }
  // The limit: scores L for the +inf entries, L large.
  auto xl = x;
  for (T& v : xl) v = v == inf ? T(200) : v;
  const auto dxl = Backward(SoftmaxOf(xl), dy);
  for (std::size_t i = 0; i < x.size(); ++i) {
    EXPECT_NEAR(dx[i], dxl[i], 1e-6) << i;
  }
}

TEST_P(BackwardTest, PlusInfRowsGiveTheLimitFloat) { CheckPlusInf<float>(); }
TEST_P(BackwardTest, PlusInfRowsGiveTheLimitDouble) { CheckPlusInf<double>(); }

// A NaN in y (a NaN row's softmax) or in dy (anywhere, a weight-0 entry
// too) makes the whole gradient row NaN: NaN is never hidden.
template <class T>
void CheckNaN() {
  const T nan = kNaN<T>, inf = kInf<T>;
  const auto y = SoftmaxOf(std::vector<T>{1, nan, 2, 0});
  for (T v : Backward(y, std::vector<T>{1, 2, 3, 4}))
    EXPECT_TRUE(std::isnan(v));
  const auto ym = SoftmaxOf(std::vector<T>{1, -inf, 2, 0});
  for (T v : Backward(ym, std::vector<T>{1, nan, 3, 4})) {
    EXPECT_TRUE(std::isnan(v));
  }
  for (T v : Backward(ym, std::vector<T>{nan, 2, 3, 4})) {
    EXPECT_TRUE(std::isnan(v));
  }
  for (T v : Backward(ym, std::vector<T>{inf, 2, 3, nan})) {
    EXPECT_TRUE(std::isnan(v));
  }
}

TEST_P(BackwardTest, NaNMakesTheRowNaNFloat) { CheckNaN<float>(); }
TEST_P(BackwardTest, NaNMakesTheRowNaNDouble) { CheckNaN<double>(); }

// Infinite dy at entries of weight > 0: g is infinite and the others get
// -+inf; the infinite entries themselves the limit of equal infinities
// (never inf - inf = NaN), weight-0 entries 0; both signs: NaN where the
// weight is > 0, 0 where it is 0.
template <class T>
void CheckInfiniteDy() {
  const T inf = kInf<T>;
  const std::vector<T> y = {T(0.25), T(0.25), T(0.5), 0};
  auto dx = Backward(y, std::vector<T>{inf, 1, 2, -inf});
  EXPECT_EQ(dx[0], inf);
  EXPECT_EQ(dx[1], -inf);
  EXPECT_EQ(dx[2], -inf);
  EXPECT_EQ(dx[3], T{0});
  dx = Backward(y, std::vector<T>{-inf, -inf, 2, inf});
  EXPECT_EQ(dx[0], -inf);
  EXPECT_EQ(dx[1], -inf);
  EXPECT_EQ(dx[2], inf);
  EXPECT_EQ(dx[3], T{0});
  // All the weight on the infinite entries: dy_i - g = -(the finite part).
  dx = Backward(std::vector<T>{T(0.5), 0, T(0.5)}, std::vector<T>{inf, 3, inf});
  EXPECT_EQ(dx[0], T{0});
  EXPECT_EQ(dx[1], T{0});
  EXPECT_EQ(dx[2], T{0});
  dx = Backward(y, std::vector<T>{inf, -inf, 2, 5});
  EXPECT_TRUE(std::isnan(dx[0]) && std::isnan(dx[1]) && std::isnan(dx[2]));
  EXPECT_EQ(dx[3], T{0});
}

TEST_P(BackwardTest, InfiniteDyFloat) { CheckInfiniteDy<float>(); }
TEST_P(BackwardTest, InfiniteDyDouble) { CheckInfiniteDy<double>(); }

// double: dy_i - g may overflow although both are finite; a weight-0 entry
// still gets 0 (TwoSum's error term is NaN there: it used to give NaN).
TEST_P(BackwardTest, OverflowingDifferenceAtAWeightZeroEntry) {
  const double big = std::numeric_limits<double>::max();
  const std::vector<double> y = {0.25, 0.75, 0.0};
  const auto dx = Backward(y, std::vector<double>{big, -big, big});
  EXPECT_EQ(dx[0], kInf<double>);  // 0.25 (big + 0.5 big): overflows
  EXPECT_FALSE(std::isnan(dx[1]));
  EXPECT_EQ(dx[2], 0.0);
}

SOFTDOT_INSTANTIATE_PER_TARGET(BackwardTest);

TEST(BackwardErrors, SizesAndOverlap) {
  std::vector<float> a(4, 0.25f), b(4, 1.0f), c(3), big(8);
  EXPECT_THROW(
      softdot::softmax_backward(std::span<const float>(a),
                                std::span<const float>(b), std::span<float>(c)),
      std::invalid_argument);
  EXPECT_THROW(
      softdot::softmax_backward(std::span<const float>(),
                                std::span<const float>(), std::span<float>()),
      std::invalid_argument);
  EXPECT_THROW(softdot::softmax_backward(std::span<const float>(big.data(), 4),
                                         std::span<const float>(b),
                                         std::span<float>(big.data() + 1, 4)),
               std::invalid_argument);
}

}  // namespace
}  // namespace softdot_test
