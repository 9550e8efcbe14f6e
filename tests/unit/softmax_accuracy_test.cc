// Accuracy sweeps of softmax, log_softmax and logsumexp against the MPFR
// reference, on every SIMD target: sizes 1..300 and large, misaligned starts,
// logits of spread up to ~20 (and +1000 offsets), temperatures, and rows whose
// weights underflow into the subnormal range. Prints max and mean ulp per
// function and distribution ("[ ulp      ]" lines).
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "test_util.h"

namespace softdot_test {
namespace {

using softdot_ref::UlpStats;

class SoftmaxAccuracy : public PerTarget {};

template <class T>
struct Case {
  std::vector<T> x;
  std::size_t offset = 0;  // misalignment of the input (elements)
  std::string label;       // groups the printed figures
  double temperature = 1.0;
  softdot_ref::SoftmaxRef<T> ref;
};

template <class T>
Case<T> make_case(std::vector<T> x, std::size_t offset,
                  const std::string& label, double temperature = 1.0) {
  Case<T> c;
  c.x = std::move(x);
  c.offset = offset;
  c.label = label;
  c.temperature = temperature;
  c.ref = softdot_ref::softmax_reference(std::span<const T>(c.x),
                                         {temperature, {}});
  return c;
}

// Sizes 1..300 for each distribution; offsets 1..15 in turn.
template <class T>
std::vector<Case<T>> sweep_cases() {
  std::vector<Case<T>> cases;
  std::uint64_t seed = 1;
  for (Dist d : kAllDists) {
    for (std::size_t n = 1; n <= 300; ++n) {
      const std::size_t offset = 1 + (n + seed) % 15;
      cases.push_back(
          make_case<T>(make_logits<T>(n, d, seed++), offset, dist_name(d)));
    }
  }
  return cases;
}

template <class T>
std::vector<Case<T>> large_cases() {
  std::vector<Case<T>> cases;
  std::uint64_t seed = 1000;
  for (Dist d : kAllDists) {
    cases.push_back(make_case<T>(make_logits<T>(1000, d, seed++), 3,
                                 std::string("n=1000 ") + dist_name(d)));
  }
  cases.push_back(make_case<T>(make_logits<T>(4097, Dist::kNormal5, seed++), 1,
                               "n=4097 N(0,5)"));
  cases.push_back(
      make_case<T>(make_logits<T>(4097, Dist::kUniform10Plus1000, seed++), 14,
                   "n=4097 1000+U[-10,10]"));
  cases.push_back(make_case<T>(make_logits<T>(65536, Dist::kNormal1, seed++), 7,
                               "n=65536 N(0,1)"));
  cases.push_back(make_case<T>(make_logits<T>(100000, Dist::kUniform10, seed++),
                               5, "n=100000 U[-10,10]"));
  return cases;
}

template <class T>
std::vector<Case<T>> temperature_cases() {
  std::vector<Case<T>> cases;
  std::uint64_t seed = 2000;
  for (double t : {0.5, 2.0, 0.7, 3.0, 0.1}) {
    for (std::size_t n : {1, 2, 3, 5, 8, 13, 16, 17, 31, 64, 100, 257, 1000}) {
      cases.push_back(make_case<T>(make_logits<T>(n, Dist::kNormal1, seed++),
                                   n % 16, "temperature " + fmt(t), t));
    }
  }
  return cases;
}

// Logits spread far enough that weights are subnormal or below the smallest
// subnormal (exact value < 2^-149 float, 2^-1074 double).
template <class T>
std::vector<Case<T>> wide_cases() {
  std::vector<Case<T>> cases;
  const double spread = sizeof(T) == 4 ? 115.0 : 760.0;
  std::uint64_t seed = 3000;
  for (std::size_t n : {2, 7, 16, 33, 100, 300, 1000}) {
    auto x = make_uniform<T>(n, -spread, 0.0, seed++);
    x[n / 2] = T(0);
    cases.push_back(make_case<T>(std::move(x), n % 13, "wide (subnormal)"));
  }
  return cases;
}

struct Worst {
  double score = -1;
  std::string where;
  void note(double s, const std::string& w) {
    if (s > score) {
      score = s;
      where = w;
    }
  }
};

struct Figures {
  UlpStats softmax, softmax_fast, log_softmax, log_softmax_allowance, lse;
};

template <class T>
std::string describe(const Case<T>& c, std::size_t i) {
  return c.label + " n=" + std::to_string(c.x.size()) +
         " i=" + std::to_string(i) +
         " x_i=" + fmt(i < c.x.size() ? c.x[i] : 0) +
         " offset=" + std::to_string(c.offset);
}

// Runs every case; prints the figures per label and asserts the bounds:
// softmax within 1 ulp (Precision::kFaithful) and kFastSoftmaxMaxUlp
// (kFast), log_softmax within its allowance, logsumexp within 1 ulp.
template <class T>
void check_cases(const std::vector<Case<T>>& cases, const std::string& target,
                 const char* suite) {
  std::map<std::string, Figures> figures;
  Worst worst_sm, worst_fast, worst_lsm, worst_lse;
  for (const Case<T>& c : cases) {
    const std::size_t n = c.x.size();
    const softdot::SoftmaxOptions o{c.temperature, {}};
    Guarded<T> x(std::span<const T>(c.x), c.offset);
    Guarded<T> y(n, (c.offset + 7) % 16), ly(n, (c.offset + 3) % 16);
    softdot::softmax(x.cspan(), y.span(), o);
    softdot::SoftmaxOptions fast = o;
    fast.precision = softdot::Precision::kFast;
    Guarded<T> fy(n, (c.offset + 5) % 16);
    softdot::softmax(x.cspan(), fy.span(), fast);
    softdot::log_softmax(x.cspan(), ly.span(), o);
    const T lse = softdot::logsumexp(x.cspan(), o);
    ASSERT_TRUE(y.guards_intact() && ly.guards_intact()) << describe(c, 0);
    ASSERT_TRUE(SameBits(x.vec(), c.x)) << "input modified";

    // In place (y aliases x) gives identical bits.
    Guarded<T> z(std::span<const T>(c.x), c.offset);
    softdot::softmax(z.cspan(), z.span(), o);
    ASSERT_TRUE(SameBits(z.vec(), y.vec())) << "in place, " << describe(c, 0);
    Guarded<T> lz(std::span<const T>(c.x), c.offset);
    softdot::log_softmax(lz.cspan(), lz.span(), o);
    ASSERT_TRUE(SameBits(lz.vec(), ly.vec()))
        << "log in place, " << describe(c, 0);

    Figures& f = figures[c.label];
    for (std::size_t i = 0; i < n; ++i) {
      const auto& w = c.ref.softmax[i];
      const double e = softdot_ref::ulp_error(y[i], w);
      f.softmax.add(e, i, w.below_subnormal);
      worst_sm.note(
          e, describe(c, i) + " got " + fmt(y[i]) + " want " + fmt(w.hi));
      const double fe = softdot_ref::ulp_error(fy[i], w);
      f.softmax_fast.add(fe, i, w.below_subnormal);
      worst_fast.note(
          fe, describe(c, i) + " got " + fmt(fy[i]) + " want " + fmt(w.hi));
      const auto& lw = c.ref.log_softmax[i];
      if (std::fabs(lw.hi) >= 1.0) {  // the 1-ulp range
        f.log_softmax.add(softdot_ref::ulp_error(ly[i], lw), i);
      }
      const double s = log_softmax_score(ly[i], lw);
      f.log_softmax_allowance.add(s, i);
      worst_lsm.note(
          s, describe(c, i) + " got " + fmt(ly[i]) + " want " + fmt(lw.hi));
    }
    const double le = softdot_ref::ulp_error(lse, c.ref.logsumexp);
    f.lse.add(le);
    worst_lse.note(le, describe(c, 0) + " got " + fmt(lse) + " want " +
                           fmt(c.ref.logsumexp.hi));
  }
  const std::string head =
      std::string(type_name<T>()) + " " + target + " " + suite + " ";
  UlpStats all_sm, all_fast, all_lsm, all_lse;
  for (const auto& [label, f] : figures) {
    report(head + "softmax     " + label, f.softmax);
    report(head + "softmax/fast " + label, f.softmax_fast);
    report(head + "log_softmax |y|>=1 " + label, f.log_softmax);
    report(head + "log_softmax/allowance " + label, f.log_softmax_allowance);
    report(head + "logsumexp   " + label, f.lse);
    all_sm.merge(f.softmax);
    all_fast.merge(f.softmax_fast);
    all_lsm.merge(f.log_softmax_allowance);
    all_lse.merge(f.lse);
  }
  EXPECT_LE(all_sm.max, 1.0) << "softmax worst: " << worst_sm.where;
  EXPECT_LE(all_fast.max, kFastSoftmaxMaxUlp)
      << "softmax (kFast) worst: " << worst_fast.where;
  EXPECT_LE(all_lsm.max, 1.0)
      << "log_softmax worst (error / max("
      << kLogSoftmaxAbs<T> << ", 2 ulp)): " << worst_lsm.where;
  EXPECT_LE(all_lse.max, kLseMaxUlp) << "logsumexp worst: " << worst_lse.where;
}

TEST_P(SoftmaxAccuracy, FloatSizes1To300) {
  check_cases<float>(sweep_cases<float>(), target(), "sweep");
}
TEST_P(SoftmaxAccuracy, DoubleSizes1To300) {
  check_cases<double>(sweep_cases<double>(), target(), "sweep");
}
TEST_P(SoftmaxAccuracy, FloatLargeSizes) {
  check_cases<float>(large_cases<float>(), target(), "large");
}
TEST_P(SoftmaxAccuracy, DoubleLargeSizes) {
  check_cases<double>(large_cases<double>(), target(), "large");
}
TEST_P(SoftmaxAccuracy, FloatTemperature) {
  check_cases<float>(temperature_cases<float>(), target(), "temp");
}
TEST_P(SoftmaxAccuracy, DoubleTemperature) {
  check_cases<double>(temperature_cases<double>(), target(), "temp");
}
// Gradual underflow: subnormal weights are measured in subnormal ulps.
TEST_P(SoftmaxAccuracy, FloatSubnormalWeights) {
  check_cases<float>(wide_cases<float>(), target(), "wide");
}
TEST_P(SoftmaxAccuracy, DoubleSubnormalWeights) {
  check_cases<double>(wide_cases<double>(), target(), "wide");
}

// logsumexp near 0 (max + log S cancels): within 1 ulp. Found by
// special_values_test: float [-0.0796914, -2.38354] gave 4.5 ulp on AVX2/AVX3.
template <class T>
void CheckLseNearZero() {
  UlpStats stats;
  std::string worst;
  for (int k = 0; k < 2000; ++k) {
    const auto v = make_uniform<T>(2 + k % 3, -3.0, 0.0, 9000 + k);
    const auto ref = softdot_ref::softmax_reference(std::span<const T>(v));
    if (std::fabs(ref.logsumexp.hi) > 0.25) continue;
    const T got = softdot::logsumexp(std::span<const T>(v));
    const double e = softdot_ref::ulp_error(got, ref.logsumexp);
    if (e > stats.max || stats.count == 0) {
      worst =
          ::testing::PrintToString(std::vector<double>(v.begin(), v.end())) +
          " got " + fmt(got) + " want " + fmt(ref.logsumexp.hi);
    }
    stats.add(e);
  }
  report(std::string(type_name<T>()) + " logsumexp with |lse| < 0.25", stats);
  EXPECT_GT(stats.count, 100u);
  EXPECT_LE(stats.max, kLseMaxUlp) << type_name<T>() << " worst " << worst;
}

TEST_P(SoftmaxAccuracy, LogsumexpNearZeroWithinOneUlp) {
  CheckLseNearZero<float>();
  CheckLseNearZero<double>();
}

SOFTDOT_INSTANTIATE_PER_TARGET(SoftmaxAccuracy);

}  // namespace
}  // namespace softdot_test
