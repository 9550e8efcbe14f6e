// The softmax family on bfloat16 and float16 rows against the MPFR
// reference of the widened row: every result rounded once to the 16-bit
// grid, so it must equal the correctly rounded exact value, except where the
// exact value lies within the stated bound of a midpoint (softmax weights
// 2^-29 relative, the double paths 2^-50). Exhaustive over every 16-bit
// value a of the rows [a, b] for both formats; the float tests'
// distributions for longer rows; special values; rows, backward and
// cross-entropy. Prints "[ 16-bit   ]" lines (max error in 16-bit ulps,
// count not correctly rounded) for docs/accuracy.md.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "softdot/cross_entropy.h"
#include "softdot/float16.h"
#include "test_util.h"

namespace softdot_test {
namespace {

using softdot::BFloat16;
using softdot::Float16;
using softdot::MatrixView;

template <class H>
constexpr bool kBf = std::is_same_v<H, BFloat16>;

template <class H>
const char* fmt_name() {
  return kBf<H> ? "bfloat16" : "float16";
}

template <class H>
double wide(H h) {
  return static_cast<double>(softdot::to_float(h));
}

template <class H>
H narrow(double v) {
  if constexpr (kBf<H>) {
    return softdot::to_bfloat16(v);
  } else {
    return softdot::to_float16(v);
  }
}

template <class H>
H from_bits(std::uint16_t b) {
  H h;
  h.bits = b;
  return h;
}

// The 16-bit value nearest to the exact hi + lo (|lo| <= ulp(hi) / 2).
template <class H>
H round_exact(double hi, double lo) {
  if (!std::isfinite(hi) || lo == 0.0) return narrow<H>(hi);
  const H up = narrow<H>(std::nextafter(hi, 1e300));
  const H down = narrow<H>(std::nextafter(hi, -1e300));
  if (up.bits == down.bits) return narrow<H>(hi);  // hi is not a midpoint
  return lo > 0 ? up : down;
}

// Spacing of the 16-bit grid at |v| (the subnormal spacing below).
template <class H>
double spacing(double v) {
  constexpr int kMant = kBf<H> ? 7 : 10;
  constexpr int kMinExp = kBf<H> ? -126 : -14;
  const int e = v == 0.0 ? kMinExp : std::max(std::ilogb(v), kMinExp);
  return std::ldexp(1.0, e - kMant);
}

struct Tally {
  std::size_t n = 0, missed = 0;
  double max_ulp = 0.0;    // |got - exact| in 16-bit ulps
  double worst_rel = 0.0;  // of a miss: |exact - midpoint| / |exact|
};

// Checks one result against the reference: equal to the correctly rounded
// value, or a neighbour of it with the exact value within `bound` relative
// of the midpoint between them.
template <class H>
void check_one(H got, const softdot_ref::Ref<double>& ref, double bound,
               Tally& t, const std::string& where) {
  ++t.n;
  const H want = round_exact<H>(ref.hi, ref.lo);
  const double g = wide(got), w = wide(want);
  if (std::isnan(w)) {
    EXPECT_TRUE(std::isnan(g)) << where;
    return;
  }
  if (!std::isfinite(w) || !std::isfinite(ref.hi)) {
    EXPECT_EQ(got.bits, want.bits) << where;
    return;
  }
  if (std::isfinite(g) && ref.hi != 0.0) {
    t.max_ulp = std::max(t.max_ulp,
                         std::fabs((g - ref.hi) - ref.lo) / spacing<H>(ref.hi));
  }
  if (got.bits == want.bits) return;
  // +-0 against -+0: a log-weight whose exact value is below the double
  // range is 0 - 0 = +0 (as the float functions; the value, not the sign,
  // is the contract).
  if (g == 0.0 && w == 0.0) return;
  ++t.missed;
  // Adjacent 16-bit values (their bits differ by one, same sign).
  const int diff = static_cast<int>(got.bits) - static_cast<int>(want.bits);
  ASSERT_TRUE((diff == 1 || diff == -1) && std::signbit(g) == std::signbit(w))
      << where << ": got " << g << " want " << w << " (exact " << ref.hi << ")";
  const double mid = (g + w) / 2;
  const double rel = std::fabs((ref.hi - mid) + ref.lo) / std::fabs(ref.hi);
  t.worst_rel = std::max(t.worst_rel, rel);
  EXPECT_LT(rel, bound) << where << ": got " << g << " want " << w << " exact "
                        << ref.hi << " is " << rel
                        << " relative from the midpoint";
}

void print(const char* fmt, const char* fn, const char* what, const Tally& t) {
  std::printf(
      "[ 16-bit   ] %s %s %s: %zu results, max %.3f ulp, %zu not correctly "
      "rounded (worst %.2g relative from a midpoint)\n",
      fmt, fn, what, t.n, t.max_ulp, t.missed, t.worst_rel);
}

constexpr double kSoftmaxBound = 0x1p-29;
constexpr double kDoubleBound = 0x1p-50;

// The rows of the float tests' distributions, rounded to the format.
template <class H>
std::vector<std::vector<H>> sweep_rows() {
  std::vector<std::vector<H>> rows;
  std::uint64_t seed = 7;
  for (Dist d : kAllDists) {
    for (std::size_t n :
         {1, 2, 3, 5, 8, 15, 16, 17, 31, 33, 64, 100, 129, 300, 1000, 4100}) {
      const std::vector<double> x = make_logits<double>(n, d, seed++);
      std::vector<H> h(n);
      for (std::size_t i = 0; i < n; ++i) h[i] = narrow<H>(x[i]);
      rows.push_back(std::move(h));
    }
  }
  return rows;
}

template <class H>
std::vector<double> widened(const std::vector<H>& h) {
  std::vector<double> w(h.size());
  for (std::size_t i = 0; i < h.size(); ++i) w[i] = wide(h[i]);
  return w;
}

class Softmax16 : public PerTarget {};

template <class H>
void sweep(const std::string& target, double temperature, bool masked) {
  Tally ts, tl, te;
  const float s = static_cast<float>(1.0 / temperature);
  for (const auto& row : sweep_rows<H>()) {
    const std::size_t n = row.size();
    std::vector<double> w = widened(row);
    for (double& v : w) v *= static_cast<double>(s);  // exact
    Mask mask(masked ? n : 0);
    if (masked) {
      for (std::size_t i = 0; i < n; ++i) mask[i] = (i * 7 + 3) % 5 != 0;
    }
    const auto ref = softdot_ref::softmax_reference(std::span<const double>(w),
                                                    {1.0, mask.span()});
    softdot::SoftmaxOptions o;
    o.temperature = temperature;
    o.mask = mask.span();
    std::vector<H> y(n), l(n);
    softdot::softmax(std::span<const H>(row), std::span<H>(y), o);
    softdot::log_softmax(std::span<const H>(row), std::span<H>(l), o);
    const H lse = softdot::logsumexp(std::span<const H>(row), o);
    const std::string where =
        target + " " + fmt_name<H>() + " n=" + std::to_string(n);
    for (std::size_t i = 0; i < n; ++i) {
      check_one(y[i], ref.softmax[i], kSoftmaxBound, ts,
                where + " softmax i=" + std::to_string(i));
      check_one(l[i], ref.log_softmax[i], kDoubleBound, tl,
                where + " log_softmax i=" + std::to_string(i));
    }
    check_one(lse, ref.logsumexp, kDoubleBound, te, where + " logsumexp");
  }
  const std::string what = std::string(masked ? "masked " : "") +
                           (temperature == 1.0 ? "T=1" : "T=0.7") + " " +
                           target;
  print(fmt_name<H>(), "softmax", what.c_str(), ts);
  print(fmt_name<H>(), "log_softmax", what.c_str(), tl);
  print(fmt_name<H>(), "logsumexp", what.c_str(), te);
}

TEST_P(Softmax16, DistributionsBFloat16) {
  sweep<BFloat16>(target(), 1.0, false);
  sweep<BFloat16>(target(), 0.7, true);
}
TEST_P(Softmax16, DistributionsFloat16) {
  sweep<Float16>(target(), 1.0, false);
  sweep<Float16>(target(), 0.7, true);
}

// Precision::kFast: the float kFast weight (within 2 ulp of float with FMA,
// 2.5 without) rounded once, so correctly rounded unless the exact weight
// lies within 2.5 float ulps (below 2^-21 relative) of a 16-bit midpoint,
// and within 1 16-bit ulp.
constexpr double kFastBound = 0x1p-21;

template <class H>
void fast_sweep(const std::string& target, double temperature, bool masked) {
  Tally t;
  const float s = static_cast<float>(1.0 / temperature);
  for (const auto& row : sweep_rows<H>()) {
    const std::size_t n = row.size();
    std::vector<double> w = widened(row);
    for (double& v : w) v *= static_cast<double>(s);  // exact
    Mask mask(masked ? n : 0);
    if (masked) {
      for (std::size_t i = 0; i < n; ++i) mask[i] = (i * 7 + 3) % 5 != 0;
    }
    const auto ref = softdot_ref::softmax_reference(std::span<const double>(w),
                                                    {1.0, mask.span()});
    softdot::SoftmaxOptions o;
    o.temperature = temperature;
    o.mask = mask.span();
    o.precision = softdot::Precision::kFast;
    std::vector<H> y(n);
    softdot::softmax(std::span<const H>(row), std::span<H>(y), o);
    const std::string where =
        target + " " + fmt_name<H>() + " fast n=" + std::to_string(n);
    for (std::size_t i = 0; i < n; ++i) {
      // Float subnormal weights (below 2^-126: bfloat16 only) carry an
      // absolute error of 2.5 * 2^-149, not a relative one.
      if (std::fabs(ref.softmax[i].hi) < 0x1p-120) {
        const double g = wide(y[i]);
        EXPECT_LE(std::fabs(g - ref.softmax[i].hi),
                  spacing<H>(ref.softmax[i].hi) / 2 + 0x1p-147)
            << where << " i=" << i;
        continue;
      }
      check_one(y[i], ref.softmax[i], kFastBound, t,
                where + " i=" + std::to_string(i));
    }
  }
  EXPECT_LT(t.max_ulp, 1.0) << target;
  const std::string what = std::string(masked ? "masked " : "") +
                           (temperature == 1.0 ? "T=1" : "T=0.7") + " " +
                           target;
  print(fmt_name<H>(), "softmax kFast", what.c_str(), t);
}

// kFast's special rows are the faithful path's, bit for bit.
template <class H>
void fast_specials() {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<std::vector<double>> rows = {
      {1.0, -inf, 2.0}, {-inf, -inf},    {inf, 1.0, inf, inf}, {1.0, nan, 2.0},
      {0.0, -200.0},    {3.0, 3.0, 3.0}, {1.0, 2.0, nan},      {60000.0, -1.0}};
  const bool m[3] = {true, true, false};
  for (const auto& r : rows) {
    std::vector<H> x;
    for (double d : r) x.push_back(narrow<H>(d));
    for (int variant = 0; variant < 3; ++variant) {
      softdot::SoftmaxOptions o;
      if (variant == 1 && x.size() == 3) o.mask = std::span<const bool>(m, 3);
      if (variant == 2) o.temperature = 1e-30;  // scaled max past 2^32
      std::vector<H> a(x.size()), b(x.size());
      softdot::softmax(std::span<const H>(x), std::span<H>(a), o);
      o.precision = softdot::Precision::kFast;
      softdot::softmax(std::span<const H>(x), std::span<H>(b), o);
      for (std::size_t i = 0; i < x.size(); ++i) {
        EXPECT_EQ(a[i].bits, b[i].bits) << fmt_name<H>() << " row " << r[0]
                                        << " variant " << variant << " i=" << i;
      }
    }
  }
}

TEST_P(Softmax16, FastBound) {
  fast_sweep<BFloat16>(target(), 1.0, false);
  fast_sweep<BFloat16>(target(), 0.7, true);
  fast_sweep<Float16>(target(), 1.0, false);
  fast_sweep<Float16>(target(), 0.7, true);
  fast_specials<BFloat16>();
  fast_specials<Float16>();
}

// Every 16-bit a in the rows [a, b]: the reference once (it does not depend
// on the target), every target against it.
template <class H>
struct PairRefs {
  std::vector<softdot_ref::SoftmaxRef<double>> refs;
};

template <class H>
const PairRefs<H>& pair_refs(double b) {
  static PairRefs<H> r[2];
  PairRefs<H>& p = r[b == 0.0 ? 0 : 1];
  if (p.refs.empty()) {
    p.refs.resize(65536);
    for (std::uint32_t a = 0; a < 65536; ++a) {
      const double x[2] = {wide(from_bits<H>(static_cast<std::uint16_t>(a))),
                           b};
      p.refs[a] = softdot_ref::softmax_reference(std::span<const double>(x));
    }
  }
  return p;
}

template <class H>
void exhaustive(const std::string& target, double b) {
  const PairRefs<H>& p = pair_refs<H>(b);
  Tally ts, tl, te;
  const H hb = narrow<H>(b);
  for (std::uint32_t a = 0; a < 65536; ++a) {
    const H x[2] = {from_bits<H>(static_cast<std::uint16_t>(a)), hb};
    H y[2], l[2];
    softdot::softmax(std::span<const H>(x, 2), std::span<H>(y, 2));
    softdot::log_softmax(std::span<const H>(x, 2), std::span<H>(l, 2));
    const H lse = softdot::logsumexp(std::span<const H>(x, 2));
    const auto& ref = p.refs[a];
    const std::string where =
        target + " " + fmt_name<H>() + " a=" + std::to_string(a);
    for (int i = 0; i < 2; ++i) {
      check_one(y[i], ref.softmax[i], kSoftmaxBound, ts, where + " softmax");
      check_one(l[i], ref.log_softmax[i], kDoubleBound, tl,
                where + " log_softmax");
    }
    check_one(lse, ref.logsumexp, kDoubleBound, te, where + " logsumexp");
    if (::testing::Test::HasFatalFailure()) return;
  }
  const std::string what = "[a, " + fmt(b) + "] all a " + target;
  print(fmt_name<H>(), "softmax", what.c_str(), ts);
  print(fmt_name<H>(), "log_softmax", what.c_str(), tl);
  print(fmt_name<H>(), "logsumexp", what.c_str(), te);
}

// One test per format over every target (the reference computed once in
// the process; ctest runs each test in its own).
template <class H>
void exhaustive_all_targets() {
  for (const std::string& t : softdot::simd_targets()) {
    softdot::force_simd_target(t);
    ASSERT_EQ(softdot::simd_target(), t);
    exhaustive<H>(t, 0.0);
    exhaustive<H>(t, 1.5);
  }
  softdot::force_simd_target("");
}

TEST(Softmax16Exhaustive, EveryBFloat16Pair) {
  exhaustive_all_targets<BFloat16>();
}
TEST(Softmax16Exhaustive, EveryFloat16Pair) {
  exhaustive_all_targets<Float16>();
}

// Special values: the float table, with 1/k rounded once.
template <class H>
void specials() {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  auto row = [](std::initializer_list<double> v) {
    std::vector<H> h;
    for (double d : v) h.push_back(narrow<H>(d));
    return h;
  };
  auto soft = [](const std::vector<H>& x, const softdot::SoftmaxOptions& o) {
    std::vector<H> y(x.size());
    softdot::softmax(std::span<const H>(x), std::span<H>(y), o);
    return y;
  };
  auto logs = [](const std::vector<H>& x, const softdot::SoftmaxOptions& o) {
    std::vector<H> y(x.size());
    softdot::log_softmax(std::span<const H>(x), std::span<H>(y), o);
    return y;
  };
  const softdot::SoftmaxOptions none;
  // -inf entries: weight +0, the rest as if absent.
  auto y = soft(row({1.0, -inf, 2.0}), none);
  auto y2 = soft(row({1.0, 2.0}), none);
  EXPECT_EQ(y[1].bits, 0u);
  EXPECT_EQ(y[0].bits, y2[0].bits);
  EXPECT_EQ(y[2].bits, y2[1].bits);
  // All -inf: zeros, log -inf, lse -inf.
  y = soft(row({-inf, -inf}), none);
  EXPECT_EQ(y[0].bits, 0u);
  EXPECT_EQ(y[1].bits, 0u);
  auto l = logs(row({-inf, -inf}), none);
  EXPECT_EQ(wide(l[0]), -inf);
  auto lse_all = softdot::logsumexp(std::span<const H>(row({-inf, -inf})));
  EXPECT_EQ(wide(lse_all), -inf);
  // Fully masked.
  const bool m0[3] = {false, false, false};
  softdot::SoftmaxOptions masked;
  masked.mask = std::span<const bool>(m0, 3);
  y = soft(row({1.0, 2.0, nan}), masked);  // a masked NaN is ignored
  for (const H& v : y) EXPECT_EQ(v.bits, 0u);
  // k = 3 entries +inf: 1/3 rounded once, others 0; log -log(3).
  y = soft(row({inf, 1.0, inf, inf}), none);
  EXPECT_EQ(y[0].bits, narrow<H>(1.0 / 3.0).bits);
  EXPECT_EQ(y[1].bits, 0u);
  l = logs(row({inf, 1.0, inf, inf}), none);
  EXPECT_EQ(l[0].bits, narrow<H>(-std::log(3.0)).bits);
  EXPECT_EQ(wide(l[1]), -inf);
  EXPECT_EQ(wide(softdot::logsumexp(std::span<const H>(row({inf, 1.0})))), inf);
  // NaN: the whole row NaN.
  y = soft(row({1.0, nan, 2.0}), none);
  for (const H& v : y) EXPECT_TRUE(std::isnan(wide(v)));
  l = logs(row({1.0, nan, 2.0}), none);
  for (const H& v : l) EXPECT_TRUE(std::isnan(wide(v)));
  EXPECT_TRUE(std::isnan(
      wide(softdot::logsumexp(std::span<const H>(row({1.0, nan}))))));
  // Subnormal weights are kept (gradual underflow): bfloat16 at 2^-130,
  // float16 at 2^-20.
  const double gap = kBf<H> ? 130.0 * std::log(2.0) : 20.0 * std::log(2.0);
  y = soft(row({0.0, -gap}), none);
  EXPECT_GT(wide(y[1]), 0.0);
}

TEST_P(Softmax16, SpecialValues) {
  specials<BFloat16>();
  specials<Float16>();
}

// softmax_rows / log_softmax_rows: each row bitwise the single-row result,
// strided, in place, and parallel (>= 2^18 elements).
template <class H>
void rows() {
  const std::size_t r = 70, n = 4000, stride = 4003;
  std::vector<H> x(r * stride), y(r * stride), one(n);
  const std::vector<double> v =
      make_logits<double>(r * stride, Dist::kNormal5, 3);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = narrow<H>(v[i]);
  for (bool log : {false, true}) {
    if (log) {
      softdot::log_softmax_rows(MatrixView<const H>(x.data(), r, n, stride),
                                MatrixView<H>(y.data(), r, n, stride));
    } else {
      softdot::softmax_rows(MatrixView<const H>(x.data(), r, n, stride),
                            MatrixView<H>(y.data(), r, n, stride));
    }
    for (std::size_t i = 0; i < r; ++i) {
      const std::span<const H> xi(x.data() + i * stride, n);
      if (log) {
        softdot::log_softmax(xi, std::span<H>(one));
      } else {
        softdot::softmax(xi, std::span<H>(one));
      }
      for (std::size_t j = 0; j < n; ++j) {
        ASSERT_EQ(one[j].bits, y[i * stride + j].bits) << i << " " << j;
      }
    }
  }
  // In place.
  std::vector<H> z(x.begin(), x.begin() + n);
  softdot::softmax(std::span<const H>(z), std::span<H>(z));
  softdot::softmax(std::span<const H>(x.data(), n), std::span<H>(one));
  for (std::size_t j = 0; j < n; ++j) ASSERT_EQ(z[j].bits, one[j].bits);
}

TEST_P(Softmax16, RowsMatchRows) {
  rows<BFloat16>();
  rows<Float16>();
}

// softmax_backward: against the MPFR reference of the widened y and dy.
template <class H>
void backward(const std::string& target) {
  Tally t;
  std::uint64_t seed = 11;
  for (std::size_t n : {1, 3, 16, 37, 300, 1000}) {
    std::vector<double> s = make_logits<double>(n, Dist::kNormal1, seed++);
    std::vector<double> yd(n);
    softdot::softmax(std::span<const double>(s), std::span<double>(yd));
    const std::vector<double> g =
        make_logits<double>(n, Dist::kNormal1, seed++);
    std::vector<H> y(n), dy(n), dx(n);
    for (std::size_t i = 0; i < n; ++i) {
      y[i] = narrow<H>(yd[i]);
      dy[i] = narrow<H>(g[i]);
    }
    const auto ref = softdot_ref::softmax_backward_reference(
        std::span<const double>(widened(y)),
        std::span<const double>(widened(dy)));
    softdot::softmax_backward(std::span<const H>(y), std::span<const H>(dy),
                              std::span<H>(dx));
    for (std::size_t i = 0; i < n; ++i) {
      check_one(dx[i], ref[i], kDoubleBound, t,
                target + " backward n=" + std::to_string(n));
    }
  }
  print(fmt_name<H>(), "softmax_backward", target.c_str(), t);
  // Special values: weight 0 with an infinite dy gives 0.
  const double inf = std::numeric_limits<double>::infinity();
  const H y2[2] = {narrow<H>(0.0), narrow<H>(1.0)};
  const H d2[2] = {narrow<H>(inf), narrow<H>(2.0)};
  H out[2];
  softdot::softmax_backward(std::span<const H>(y2, 2),
                            std::span<const H>(d2, 2), std::span<H>(out, 2));
  EXPECT_EQ(wide(out[0]), 0.0);
  EXPECT_EQ(wide(out[1]), 0.0);
}

TEST_P(Softmax16, Backward) {
  backward<BFloat16>(target());
  backward<Float16>(target());
}

// cross_entropy: the double function on the widened logits, each loss and
// gradient rounded once (bitwise), the same return value.
template <class H>
void cross_entropy16() {
  const std::size_t rows = 9, v = 77;
  const std::vector<double> x =
      make_logits<double>(rows * v, Dist::kNormal5, 5);
  std::vector<H> h(rows * v);
  for (std::size_t i = 0; i < h.size(); ++i) h[i] = narrow<H>(x[i]);
  const std::vector<double> w = widened(h);
  std::vector<std::int64_t> t(rows);
  for (std::size_t i = 0; i < rows; ++i)
    t[i] = static_cast<std::int64_t>(i * 13 % v);
  t[4] = -100;
  for (double eps : {0.0, 0.1}) {
    softdot::CrossEntropyOptions o;
    o.label_smoothing = eps;
    std::vector<double> ld(rows), gd(rows * v);
    std::vector<H> lh(rows), gh(rows * v);
    const double rd = softdot::cross_entropy(
        MatrixView<const double>(w.data(), rows, v), t, std::span<double>(ld),
        MatrixView<double>(gd.data(), rows, v), o);
    const double rh = softdot::cross_entropy(
        MatrixView<const H>(h.data(), rows, v), t, std::span<H>(lh),
        MatrixView<H>(gh.data(), rows, v), o);
    EXPECT_EQ(rd, rh);
    for (std::size_t i = 0; i < rows; ++i) {
      EXPECT_EQ(lh[i].bits, narrow<H>(ld[i]).bits);
    }
    for (std::size_t i = 0; i < rows * v; ++i) {
      ASSERT_EQ(gh[i].bits, narrow<H>(gd[i]).bits) << i;
    }
  }
  // Checks: a bad target names the row.
  t[2] = static_cast<std::int64_t>(v);
  std::vector<H> lh(rows);
  EXPECT_THROW(softdot::cross_entropy(MatrixView<const H>(h.data(), rows, v), t,
                                      std::span<H>(lh)),
               std::invalid_argument);
}

TEST_P(Softmax16, CrossEntropy) {
  cross_entropy16<BFloat16>();
  cross_entropy16<Float16>();
}

template <class H>
void errors() {
  std::vector<H> x(4), y(3);
  EXPECT_THROW(softdot::softmax(std::span<const H>(x), std::span<H>(y)),
               std::invalid_argument);
  EXPECT_THROW(softdot::softmax(std::span<const H>(x.data(), 0),
                                std::span<H>(y.data(), 0)),
               std::invalid_argument);
  EXPECT_THROW(softdot::logsumexp(std::span<const H>(x.data(), 0)),
               std::invalid_argument);
  // Partial overlap.
  EXPECT_THROW(softdot::log_softmax(std::span<const H>(x.data(), 3),
                                    std::span<H>(x.data() + 1, 3)),
               std::invalid_argument);
  softdot::SoftmaxOptions o;
  o.temperature = 0.0;
  EXPECT_THROW(softdot::softmax(std::span<const H>(x), std::span<H>(x), o),
               std::invalid_argument);
  std::vector<H> dx(4);
  EXPECT_THROW(
      softdot::softmax_backward(std::span<const H>(x), std::span<const H>(y),
                                std::span<H>(dx)),
      std::invalid_argument);
}

TEST_P(Softmax16, Errors) {
  errors<BFloat16>();
  errors<Float16>();
}

TEST_P(Softmax16, ScaledRowsWithLargeScores) {
  // Found by fuzz_rows16: with a temperature, x_i * s is a float plus a low
  // part up to half an ulp of the scaled max, which the float-lane passes
  // fed to their exponential as a small correction; at |x * s| near 2^29
  // it reached +2.4, and a one-element row's weight was 0.089. Such rows
  // (scaled max >= 2^12) take the double path: a single weight is exactly
  // 1, and a row's weights are within 1 ulp of the long double softmax.
  const float x0 = -524288000.0f;  // -1.953125 x 2^28, exact in bfloat16
  for (const double t : {0.75, 0.7, 1.0 / 3.0}) {
    for (const auto precision :
         {softdot::Precision::kFaithful, softdot::Precision::kFast}) {
      softdot::SoftmaxOptions o;
      o.temperature = t;
      o.precision = precision;
      const std::vector<BFloat16> one{softdot::to_bfloat16(x0)};
      std::vector<BFloat16> y(1);
      softdot::softmax(std::span<const BFloat16>(one), std::span<BFloat16>(y),
                       o);
      EXPECT_EQ(softdot::to_float(y[0]), 1.0f) << "T " << t;
      // Three equal maxima (1/3 each), one bfloat16 step below (2^21: weight
      // 0) and a small score: the weights against long double.
      std::vector<BFloat16> x;
      for (const float v : {-x0, -x0, -x0, -x0 - 2097152.0f, -5000.0f}) {
        x.push_back(softdot::to_bfloat16(v));
      }
      std::vector<BFloat16> w(x.size());
      softdot::softmax(std::span<const BFloat16>(x), std::span<BFloat16>(w), o);
      const float s = static_cast<float>(1.0 / t);
      long double m = -INFINITY, total = 0.0L;
      for (BFloat16 v : x) {
        m = std::fmax(m, static_cast<long double>(softdot::to_float(v)) * s);
      }
      for (BFloat16 v : x) {
        total +=
            std::exp(static_cast<long double>(softdot::to_float(v)) * s - m);
      }
      for (std::size_t i = 0; i < x.size(); ++i) {
        const long double exact =
            std::exp(static_cast<long double>(softdot::to_float(x[i])) * s -
                     m) /
            total;
        int e = 0;
        std::frexp(static_cast<double>(exact), &e);
        const long double ulp = std::fmax(std::ldexp(1.0L, e - 8), 0x1p-133L);
        EXPECT_LE(std::fabs(static_cast<long double>(softdot::to_float(w[i])) -
                            exact),
                  ulp)
            << "T " << t << " i " << i;
      }
    }
  }
}

SOFTDOT_INSTANTIATE_PER_TARGET(Softmax16);

}  // namespace
}  // namespace softdot_test
