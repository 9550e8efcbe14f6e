// softmax_backward(): dx = y * (dy - <dy, y>) against MPFR, in place, sizes.
#include <cmath>
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
