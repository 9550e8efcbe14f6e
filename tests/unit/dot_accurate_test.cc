// dot_accurate(): the Dot2 bound on ill-conditioned dot products whose exact
// value is known (MPFR), plain dot() within its own gamma_n bound on the same
// data, and the same bits on every FMA target.
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "test_util.h"

namespace softdot_test {
namespace {

class DotAccurateTest : public PerTarget {};

// Ogita, Rump and Oishi's GenDot: x, y of length n (even) whose dot product
// has condition number sum |x_i y_i| / |x.y| of about `cond`. The first half
// has random exponents in [0, b/2] (b = log2 cond), the second half is built
// so that each new term cancels most of the exact dot of what precedes it.
template <class T>
void gen_dot(std::size_t n, double cond, std::uint64_t seed, std::vector<T>& x,
             std::vector<T>& y) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> unit(-1.0, 1.0);
  const double b = std::log2(cond);
  const std::size_t half = n / 2;
  x.assign(n, T(0));
  y.assign(n, T(0));
  std::uniform_int_distribution<int> exps(0, static_cast<int>(b / 2));
  for (std::size_t i = 0; i < half; ++i) {
    int e = exps(rng);
    if (i == 0) e = static_cast<int>(std::lround(b / 2)) + 1;
    if (i + 1 == half) e = 0;
    x[i] = static_cast<T>(std::ldexp(unit(rng), e));
    y[i] = static_cast<T>(std::ldexp(unit(rng), e));
  }
  for (std::size_t i = half; i < n; ++i) {
    const double frac = double(n - 1 - i) / double(n - 1 - half + 1);
    const int e = static_cast<int>(std::lround(b / 2 * frac));
    x[i] = static_cast<T>(std::ldexp(unit(rng), e));
    const auto prefix = softdot_ref::dot_reference(
        std::span<const T>(x.data(), i), std::span<const T>(y.data(), i));
    const double target = std::ldexp(unit(rng), e) - prefix.value.hi;
    y[i] = static_cast<T>(target / static_cast<double>(x[i]));
  }
}

template <class T>
void CheckIllConditioned(const std::vector<double>& conds) {
  const double u = softdot_ref::unit_roundoff<T>();
  double worst_acc = 0, worst_plain = 0, worst_ratio = 0;
  int cases = 0;
  for (std::size_t n : {6, 20, 64, 100, 129, 300}) {
    for (double cond : conds) {
      for (std::uint64_t seed = 0; seed < 3; ++seed) {
        std::vector<T> x, y;
        gen_dot<T>(n, cond, 1000 * n + seed, x, y);
        const auto ref = softdot_ref::dot_reference(std::span<const T>(x),
                                                    std::span<const T>(y));
        const double exact = ref.value.hi + ref.value.lo;
        const double g = softdot_ref::gamma<T>(n);
        const T acc =
            softdot::dot_accurate(std::span<const T>(x), std::span<const T>(y));
        const double acc_err = softdot_ref::abs_error(acc, ref.value);
        const double acc_bound = u * std::fabs(exact) + g * g * ref.abs_sum;
        ASSERT_LE(acc_err, acc_bound)
            << type_name<T>() << " n=" << n << " cond=" << cond << " got "
            << fmt(acc) << " want " << fmt(ref.value.hi);
        const T plain =
            softdot::dot(std::span<const T>(x), std::span<const T>(y));
        const double plain_err = softdot_ref::abs_error(plain, ref.value);
        ASSERT_LE(plain_err, g * ref.abs_sum)
            << type_name<T>() << " plain n=" << n << " cond=" << cond;
        worst_ratio = std::max(worst_ratio, acc_err / acc_bound);
        // Relative error in units of u, for the report.
        if (exact != 0) {
          worst_acc = std::max(worst_acc, acc_err / std::fabs(exact) / u);
          worst_plain = std::max(worst_plain, plain_err / std::fabs(exact) / u);
        }
        ++cases;
      }
    }
  }
  std::printf(
      "[ dot2     ] %s %s: %d cases, worst error / Dot2 bound %.3g; "
      "worst relative error %.3g u (dot_accurate) vs %.3g u (dot)\n",
      type_name<T>(), softdot::simd_target().c_str(), cases, worst_ratio,
      worst_acc, worst_plain);
  EXPECT_GT(worst_plain, worst_acc) << "the data should be ill-conditioned";
}

TEST_P(DotAccurateTest, FloatWithinDot2Bound) {
  // Products up to 2^(b+2) must stay finite in float: cond <= 1e36.
  CheckIllConditioned<float>({1e2, 1e6, 1e10, 1e16, 1e24, 1e30, 1e36});
}

TEST_P(DotAccurateTest, DoubleWithinDot2Bound) {
  CheckIllConditioned<double>({1e2, 1e8, 1e16, 1e24, 1e32, 1e40});
}

TEST_P(DotAccurateTest, WellConditionedIsCorrectlyRoundedMostly) {
  // With all products positive (cond = 1) the result is the exact sum
  // rounded once, within u |x.y| plus a second-order term.
  for (std::size_t n : {1, 3, 17, 64, 1000, 4097}) {
    const auto x = make_uniform<float>(n, 0.0, 1.0, n);
    const auto y = make_uniform<float>(n, 0.0, 1.0, n + 1);
    const float got = softdot::dot_accurate(std::span<const float>(x),
                                            std::span<const float>(y));
    const auto ref = softdot_ref::dot_reference(std::span<const float>(x),
                                                std::span<const float>(y));
    EXPECT_LE(softdot_ref::ulp_error(got, ref.value), 0.5001) << "n=" << n;
  }
}

TEST_P(DotAccurateTest, SizesAndSpecialCases) {
  std::vector<double> a(5, 1.0), b(4, 1.0);
  EXPECT_THROW(softdot::dot_accurate(std::span<const double>(a),
                                     std::span<const double>(b)),
               std::invalid_argument);
  EXPECT_EQ(softdot::dot_accurate(std::span<const double>(),
                                  std::span<const double>()),
            0.0);
  const float q[3] = {1, 2, 0}, k[3] = {2, 1, 3};
  EXPECT_EQ(softdot::dot_accurate(std::span<const float>(q),
                                  std::span<const float>(k)),
            4.0f);
  a[2] = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> c(5, 1.0);
  EXPECT_TRUE(std::isnan(softdot::dot_accurate(std::span<const double>(a),
                                               std::span<const double>(c))));
}

SOFTDOT_INSTANTIATE_PER_TARGET(DotAccurateTest);

// The same bits at every alignment and on every FMA target.
TEST(DotAccurateReproducible, AlignmentAndTargets) {
  const auto xv = make_uniform<double>(1003, -1.0, 1.0, 5);
  const auto yv = make_uniform<double>(1003, -1.0, 1.0, 6);
  const auto xf = make_uniform<float>(1003, -1.0, 1.0, 7);
  const auto yf = make_uniform<float>(1003, -1.0, 1.0, 8);
  std::vector<double> want_d;
  std::vector<float> want_f;
  for (const auto& target : softdot::simd_targets()) {
    if (!is_fma_target(target)) continue;
    softdot::force_simd_target(target);
    for (std::size_t off = 0; off < 8; ++off) {
      Guarded<double> x(std::span<const double>(xv), off);
      Guarded<double> y(std::span<const double>(yv), (off * 3) % 8);
      Guarded<float> a(std::span<const float>(xf), off);
      Guarded<float> b(std::span<const float>(yf), (off * 5) % 16);
      const double d = softdot::dot_accurate(x.cspan(), y.cspan());
      const float f = softdot::dot_accurate(a.cspan(), b.cspan());
      if (want_d.empty()) {
        want_d.push_back(d);
        want_f.push_back(f);
      }
      EXPECT_TRUE(same_value(d, want_d[0])) << target << " offset " << off;
      EXPECT_TRUE(same_value(f, want_f[0])) << target << " offset " << off;
    }
  }
  softdot::force_simd_target("");
}

}  // namespace
}  // namespace softdot_test
