// Accuracy sweeps of softmax, log_softmax and logsumexp against the MPFR
// reference, on every SIMD target: sizes 1..300 and large, misaligned starts,
// logits of spread up to ~20 (and +1000 offsets), temperatures, and rows whose
// weights underflow into the subnormal range. Prints max and mean ulp per
// function and distribution ("[ ulp      ]" lines).
#include <algorithm>
#include <cmath>
#include <cstdio>
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
// Scaled rows whose max is near 2^12, where the faithful float softmax of
// AVX2/AVX-512 switches between its float pair path (|max| < 2^12) and the
// double-lane path, per row and, for rows of 2^15 floats or more, per chunk
// of 4096 (the chunks' sums may come from both paths).
TEST_P(SoftmaxAccuracy, FloatScaledNearTwoTo12) {
  std::vector<Case<float>> cases;
  std::uint64_t seed = 4000;
  for (const std::size_t n : {std::size_t{1000}, std::size_t{40000}}) {
    for (const double lo : {2030.0, 2040.0, 2050.0}) {
      auto x = make_uniform<float>(n, lo, lo + 10.0, seed++);
      if (n > 4096) {  // chunk maxima on both sides of 2^12 / 2
        for (std::size_t i = 0; i < n; i += 8192) x[i] = 2047.0f;
        for (std::size_t i = 4096; i < n; i += 8192) x[i] = 2049.0f;
      }
      cases.push_back(
          make_case<float>(std::move(x), n % 11, "scaled, max near 2^12", 0.5));
    }
  }
  check_cases<float>(cases, target(), "scaled 2^12");
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

// The faithful float weights across the whole range of exp(t), t = p - max:
// a dense sweep of t in [-104, 0] (subnormal weights below t = -87.3),
// the values next to every boundary of the reduction of exp_faithful-inl.h
// (t = (kf + 1/2) ln2 / 8, kf = -1201..0, and 3 floats either side), and t
// near 0. Rows of 64: [0, t_1, ..., t_63] (63 different t; S in [1, 64]) and
// [0, t, ..., t] (S = 1 + 63 exp(t), whose error has one sign per row); plain
// and with temperature 0.7. Reference in long double (64-bit significand):
// y = exp(p_i) / sum exp(p_j) with p = x * fl(1 / T) exact. Error in ulps of
// the float spacing at the exact weight (2^-149 below 2^-126).
double ulp_of_weight(long double w) {
  int e = 0;
  (void)std::frexp(w, &e);  // w = f 2^e, f in [0.5, 1)
  return std::ldexp(1.0, std::max(e - 24, -149));
}

std::vector<float> exp_sweep_points() {
  std::vector<float> t;
  constexpr int kDense = 1 << 21;
  for (int i = 0; i <= kDense; ++i) {
    t.push_back(static_cast<float>(-104.0 * i / kDense));
  }
  const double c = std::log(2.0) / 8;
  for (int kf = -1201; kf <= 0; ++kf) {
    const float mid = static_cast<float>((kf + 0.5) * c);
    float lo = mid, hi = mid;
    t.push_back(mid);
    for (int j = 0; j < 3; ++j) {
      lo = std::nextafter(lo, -200.0f);
      hi = std::nextafter(hi, 0.0f);
      t.push_back(lo);
      t.push_back(hi);
    }
  }
  for (int e = 1; e <= 40; ++e) t.push_back(-std::ldexp(1.0f, -e));
  std::vector<float> live;
  for (float v : t) {
    if (v >= -104.0f && v <= 0.0f) live.push_back(v);
  }
  return live;
}

TEST_P(SoftmaxAccuracy, FloatFaithfulExpSweepWithinOneUlp) {
  const std::vector<float> pts = exp_sweep_points();
  constexpr std::size_t kCols = 64;
  for (const double temperature : {1.0, 0.7}) {
    const float s = static_cast<float>(1.0 / temperature);
    for (const bool same : {false, true}) {
      const std::size_t rows =
          same ? pts.size() / 16 : (pts.size() + kCols - 2) / (kCols - 1);
      std::vector<float> x(rows * kCols, 0.0f), y(rows * kCols);
      for (std::size_t r = 0; r < rows; ++r) {
        for (std::size_t j = 1; j < kCols; ++j) {
          // Unscaled, x = t; scaled, x = t / s (so p = x s is near t).
          const float t = same ? pts[(r * 16) % pts.size()]
                               : pts[(r * (kCols - 1) + j - 1) % pts.size()];
          x[r * kCols + j] = temperature == 1.0 ? t : t / s;
        }
      }
      softdot::SoftmaxOptions o;
      o.temperature = temperature;
      softdot::softmax_rows(
          softdot::MatrixView<const float>(x.data(), rows, kCols),
          softdot::MatrixView<float>(y.data(), rows, kCols), o);
      double worst = 0.0, worst_normal = 0.0;
      std::string where;
      for (std::size_t r = 0; r < rows; ++r) {
        long double p[kCols], sum = 0.0L;
        for (std::size_t j = 0; j < kCols; ++j) {
          p[j] = static_cast<long double>(x[r * kCols + j]) *
                 static_cast<long double>(s);
        }
        const long double m = *std::max_element(p, p + kCols);
        for (std::size_t j = 0; j < kCols; ++j) sum += std::exp(p[j] - m);
        for (std::size_t j = 0; j < kCols; ++j) {
          const long double w = std::exp(p[j] - m) / sum;
          const double e =
              static_cast<double>(
                  std::fabs(static_cast<long double>(y[r * kCols + j]) - w)) /
              ulp_of_weight(w);
          if (w >= 0x1p-126L) worst_normal = std::max(worst_normal, e);
          if (e > worst) {
            worst = e;
            where = "row " + std::to_string(r) +
                    " p=" + fmt(static_cast<double>(p[j] - m)) + " got " +
                    fmt(y[r * kCols + j]) + " want " +
                    fmt(static_cast<double>(w));
          }
        }
      }
      std::printf(
          "[ ulp      ] float %s exp sweep T=%s %s: max %.3f, normal weights "
          "%.3f (%zu rows; worst %s)\n",
          target().c_str(), fmt(temperature).c_str(),
          same ? "[0, t, ..., t]" : "[0, t_1, ..., t_63]", worst, worst_normal,
          rows, where.c_str());
      EXPECT_LT(worst, 1.0) << where;
    }
  }
}

SOFTDOT_INSTANTIATE_PER_TARGET(SoftmaxAccuracy);

}  // namespace
}  // namespace softdot_test
