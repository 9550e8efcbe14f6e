// Attention tests: fp8 K/V (Float8KV, e4m3fn and e5m2) and their
// conversions: every pattern widened exactly (the public conversion, the
// kernels' scalar form), rounding at every midpoint with saturation; every
// attention function on fp8 equal, bit for bit, to the same function on
// float K/V holding the dequantised values, on every target, with per-token
// and per-tensor scales; write_kv's quantisation bound; the errors.
#include <limits>

#include "attention_checks.h"
#include "attention_sweeps.h"
#include "attention_test_util.h"
#include "kernels/dequantize.h"
#include "softdot/kv_cache.h"

namespace softdot_test {
namespace {

using softdot::Float8E4M3;
using softdot::Float8E5M2;
using softdot::Float8KV;
using softdot::Float8Pages;

float value(Float8E4M3 x) { return softdot::to_float(x); }
float value(Float8E5M2 x) { return softdot::to_float(x); }
template <class T>
T round8(double x) {
  if constexpr (std::is_same_v<T, Float8E4M3>) {
    return softdot::to_float8_e4m3(x);
  } else {
    return softdot::to_float8_e5m2(x);
  }
}
template <class T>
constexpr double kMax = std::is_same_v<T, Float8E4M3> ? 448.0 : 57344.0;
template <class T>
constexpr int kMant = std::is_same_v<T, Float8E4M3> ? 3 : 2;
template <class T>
constexpr int kMinExp = std::is_same_v<T, Float8E4M3> ? -6 : -14;
template <class T>
const char* name8() {
  return std::is_same_v<T, Float8E4M3> ? "e4m3fn" : "e5m2";
}

// The value of every pattern from its fields, here (independent of both
// library forms), and both library forms against it.
template <class T>
void check_patterns() {
  for (int b = 0; b < 256; ++b) {
    const T x{static_cast<std::uint8_t>(b)};
    const int sign = (b & 0x80) ? -1 : 1;
    const int mag = b & 0x7f;
    const int e = mag >> kMant<T>, m = mag & ((1 << kMant<T>)-1);
    double want;
    if (std::is_same_v<T, Float8E4M3> && mag == 0x7f) {
      want = std::nan("");
    } else if (!std::is_same_v<T, Float8E4M3> && e == 31) {
      want = m == 0 ? INFINITY : std::nan("");
    } else if (e == 0) {
      want = std::ldexp(double(m), kMinExp<T> - kMant<T>);
    } else {
      const int bias = std::is_same_v<T, Float8E4M3> ? 7 : 15;
      want = std::ldexp(double((1 << kMant<T>)+m), e - bias - kMant<T>);
    }
    want *= sign;
    const float pub = value(x), ker = softdot::detail::fp8_to_float(x);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(pub) && std::isnan(ker)) << name8<T>() << " " << b;
      EXPECT_TRUE(std::isnan(value(round8<T>(pub))));
      continue;
    }
    EXPECT_EQ(double(pub), want) << name8<T>() << " " << b;
    EXPECT_EQ(bits(ker), bits(pub)) << name8<T>() << " " << b;
    // The round trip keeps the pattern (-0 included).
    EXPECT_EQ(round8<T>(double(pub)).bits, x.bits) << name8<T>() << " " << b;
  }
}

TEST(Float8, EveryPatternWidensExactly) {
  check_patterns<Float8E4M3>();
  check_patterns<Float8E5M2>();
  EXPECT_EQ(double(value(Float8E4M3{0x7e})), kMax<Float8E4M3>);
  EXPECT_EQ(double(value(Float8E5M2{0x7b})), kMax<Float8E5M2>);
}

// Between two neighbouring finite values: the midpoint goes to the even
// pattern, and a hair either side to the nearer; beyond the largest value
// finite numbers saturate, infinities do not.
template <class T>
void check_rounding() {
  std::vector<std::pair<double, std::uint8_t>> pos;
  for (int b = 0; b < 128; ++b) {
    const float v = value(T{static_cast<std::uint8_t>(b)});
    if (std::isfinite(v)) pos.emplace_back(double(v), std::uint8_t(b));
  }
  std::sort(pos.begin(), pos.end());
  for (std::size_t i = 0; i + 1 < pos.size(); ++i) {
    const auto [a, ab] = pos[i];
    const auto [c, cb] = pos[i + 1];
    const double mid = (a + c) / 2, eps = (c - a) * 1e-6;
    const std::uint8_t even = (ab & 1) == 0 ? ab : cb;
    EXPECT_EQ(round8<T>(mid).bits, even) << name8<T>() << " mid " << mid;
    EXPECT_EQ(round8<T>(mid - eps).bits, ab) << name8<T>() << " " << mid;
    EXPECT_EQ(round8<T>(mid + eps).bits, cb) << name8<T>() << " " << mid;
    EXPECT_EQ(round8<T>(-(mid + eps)).bits, cb | 0x80) << name8<T>();
  }
  const std::uint8_t top = pos.back().second;
  for (double x : {kMax<T> * 1.01, kMax<T> * 1.5, 1e30, 3e38}) {
    EXPECT_EQ(round8<T>(x).bits, top) << name8<T>() << " saturates " << x;
    EXPECT_EQ(round8<T>(-x).bits, top | 0x80) << name8<T>() << " " << -x;
  }
  EXPECT_TRUE(std::isnan(value(round8<T>(std::nan("")))));
  const float inf = value(round8<T>(INFINITY));
  if (std::is_same_v<T, Float8E4M3>) {
    EXPECT_TRUE(std::isnan(inf)) << "e4m3fn has no infinity: NaN";
  } else {
    EXPECT_EQ(inf, std::numeric_limits<float>::infinity());
    EXPECT_EQ(value(round8<T>(-INFINITY)),
              -std::numeric_limits<float>::infinity());
  }
  // Below half the smallest subnormal: zero, with the sign.
  const double tiny = std::ldexp(1.0, kMinExp<T> - kMant<T>);
  EXPECT_EQ(round8<T>(tiny * 0.5).bits, 0);
  EXPECT_EQ(round8<T>(-tiny * 0.5).bits, 0x80);
  EXPECT_EQ(round8<T>(tiny * 0.51).bits, 1);
}

TEST(Float8, RoundsToNearestEvenAndSaturates) {
  check_rounding<Float8E4M3>();
  check_rounding<Float8E5M2>();
}

// fp8 values, their scales (per token [B, H, n, 1], or one per tensor), and
// the float tensor of the dequantised values (scale * value rounded once to
// float), computed here with the public conversion.
template <class T>
struct Quantized {
  Tensor<T> q;
  Tensor<float> scales;  // per token
  float scale = 1.0f;
  bool per_tensor = false;
  Tensor<float> deq;
  Float8KV<T> view() const {
    if (per_tensor) return {q.cview(), {}, scale};
    return {q.cview(), scales.cview()};
  }
};

// Quantises x with scales drawn at random (per token) or one scale (per
// tensor), so values cover the format's range, subnormals included.
template <class T>
Quantized<T> quantize(const Tensor<float>& x, std::size_t pad, bool per_tensor,
                      std::uint64_t seed) {
  Quantized<T> r{Tensor<T>(x.B, x.H, x.R, x.C, pad, T{0x55}),
                 Tensor<float>(x.B, x.H, x.R, 1, pad, kNaNF), 1.0f, per_tensor,
                 Tensor<float>(x.B, x.H, x.R, x.C, pad, kNaNF)};
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.5, 2.0);
  float amax = 0;
  for (float v : x.dense()) amax = std::max(amax, std::fabs(v));
  r.scale = float(amax / kMax<T> * 4.0);  // some values are subnormal
  r.scales.for_each([&](float& s) { s = float(r.scale * u(rng)); });
  for (std::size_t b = 0; b < x.B; ++b)
    for (std::size_t h = 0; h < x.H; ++h)
      for (std::size_t j = 0; j < x.R; ++j) {
        const float s = per_tensor ? r.scale : r.scales.at(b, h, j, 0);
        for (std::size_t c = 0; c < x.C; ++c) {
          r.q.at(b, h, j, c) = round8<T>(double(x.at(b, h, j, c)) / s);
          r.deq.at(b, h, j, c) = value(r.q.at(b, h, j, c)) * s;
        }
      }
  return r;
}

template <class T>
struct Fp8Problem {
  Problem<float> f;  // q, and k / v replaced by the dequantised values
  Quantized<T> k, v;
};

template <class T>
Fp8Problem<T> make_fp8(const Shape& s, bool per_tensor) {
  Fp8Problem<T> p;
  p.f = make_problem<float>(s);
  p.k = quantize<T>(p.f.k, s.pad, per_tensor, s.seed + 1);
  p.v = quantize<T>(p.f.v, s.pad, per_tensor, s.seed + 2);
  p.f.k = p.k.deq;
  p.f.v = p.v.deq;
  p.f.rewiden();
  return p;
}

template <class T>
void expect_fp8_equals_float(const std::string& label, const Fp8Problem<T>& p,
                             const AttentionOptions& o) {
  const Shape& s = p.f.s;
  const std::string what = label + " " + name8<T>() +
                           (p.k.per_tensor ? " per tensor " : " per token ") +
                           s.str();
  const Result want = run(p.f, o);
  Result got{Tensor<float>(s.B, s.H, s.nq, s.dv, s.pad + 1, kOutSentinel), {}};
  got.lse.assign(s.B * s.H * s.nq + kLseGuard, kLseSentinel);
  softdot::attention(p.f.q.cview(), p.k.view(), p.v.view(), got.o.view(), o,
                     got.lse.data());
  EXPECT_TRUE(got.guards_ok()) << what;
  EXPECT_TRUE(SameBits(got.all(), want.all())) << what << ": attention";
  softdot::AttentionPartial pa, pf;
  softdot::attention_partial(p.f.q.cview(), p.k.view(), p.v.view(), pa, o);
  softdot::attention_partial(p.f.q.cview(), p.f.k.cview(), p.f.v.cview(), pf,
                             o);
  EXPECT_TRUE(SameBits(pa.out, pf.out) && SameBits(pa.sum, pf.sum) &&
              SameBits(pa.max, pf.max))
      << what << ": attention_partial";
  if (s.nq * s.nkv <= 100000) {
    Tensor<float> wa(s.B, s.H, s.nq, s.nkv, 0, 0.0f), wf = wa;
    softdot::attention_weights(p.f.q.cview(), p.k.view(), wa.view(), o);
    softdot::attention_weights(p.f.q.cview(), p.f.k.cview(), wf.view(), o);
    EXPECT_TRUE(SameBits(wa.dense(), wf.dense()))
        << what << ": attention_weights";
    softdot::attention_scores(p.f.q.cview(), p.k.view(), wa.view(), o);
    softdot::attention_scores(p.f.q.cview(), p.f.k.cview(), wf.view(), o);
    EXPECT_TRUE(SameBits(wa.dense(), wf.dense()))
        << what << ": attention_scores";
  }
}

class Fp8Targets : public PerTarget {};

// Every form, strided views, every option case, both formats and both kinds
// of scale; on every target (the widening is vector code on AVX2 and
// AVX-512, with a scalar tail, and scalar elsewhere).
TEST_P(Fp8Targets, EqualsFloatOnTheDequantisedValues) {
  for (const FormShape& f : form_shapes()) {
    const SweepArrays x(f.shape);
    for (bool per_tensor : {false, true}) {
      const auto p4 = make_fp8<Float8E4M3>(f.shape, per_tensor);
      const auto p5 = make_fp8<Float8E5M2>(f.shape, per_tensor);
      for (const OptionCase& c : option_sweep()) {
        // Per tensor: the option sweep once is enough (the same reader).
        if (per_tensor && &c != &option_sweep().front()) break;
        expect_fp8_equals_float(std::string(f.name) + ", " + c.name, p4,
                                c.make(x));
        expect_fp8_equals_float(std::string(f.name) + ", " + c.name, p5,
                                c.make(x));
      }
    }
  }
}

SOFTDOT_INSTANTIATE_PER_TARGET(Fp8Targets);

// A NaN key in the cache (e4m3fn's S.1111.111, e5m2's) gives NaN rows, and
// an e5m2 infinity its limit, on the decode and prefill forms.
TEST(AttentionFp8, SpecialValuesAreNotHidden) {
  for (std::size_t nq : {1u, 40u}) {
    Shape s{.B = 1, .H = 2, .Hkv = 1, .nq = nq, .nkv = 70, .d = 32, .dv = 32};
    auto p = make_fp8<Float8E4M3>(s, false);
    p.k.q.at(0, 0, 33, 5) = Float8E4M3{0x7f};
    Tensor<float> out(1, 2, nq, 32, 0, 0.0f);
    softdot::attention(p.f.q.cview(), p.k.view(), p.v.view(), out.view());
    for (float v : out.dense()) ASSERT_TRUE(std::isnan(v)) << nq;
    auto p5 = make_fp8<Float8E5M2>(s, false);
    p5.v.q.at(0, 0, 12, 3) = Float8E5M2{0x7e};  // NaN value
    softdot::attention(p5.f.q.cview(), p5.k.view(), p5.v.view(), out.view());
    for (std::size_t h = 0; h < 2; ++h)
      for (std::size_t i = 0; i < nq; ++i)
        ASSERT_TRUE(std::isnan(out.at(0, h, i, 3))) << nq;
  }
}

// A per-tensor scale too large to fold 2^8 into (the vector widening's
// other branch), and one that is subnormal: the bits of the float call on
// the dequantised values, decode and prefill, on every target.
TEST(AttentionFp8, ExtremeScales) {
  for (float sc : {0x1p121f, 0x1p-140f}) {
    for (std::size_t nq : {1u, 24u}) {
      Shape s{.B = 1, .H = 4, .Hkv = 2, .nq = nq, .nkv = 90, .d = 32, .dv = 48};
      auto p = make_fp8<Float8E4M3>(s, true);
      std::mt19937_64 rng(nq);
      std::uniform_int_distribution<int> u(0, 0x37);  // values below 0.5
      for (auto* t : {&p.k, &p.v}) {
        t->scale = sc;
        for (std::size_t h = 0; h < 2; ++h)
          for (std::size_t j = 0; j < 90; ++j)
            for (std::size_t c = 0; c < t->q.C; ++c) {
              auto& x = t->q.at(0, h, j, c);
              x.bits = std::uint8_t(u(rng) | ((rng() & 1) ? 0x80 : 0));
              t->deq.at(0, h, j, c) = value(x) * sc;
            }
      }
      p.f.k = p.k.deq;
      p.f.v = p.v.deq;
      p.f.rewiden();
      for (const char* target : {"", "SCALAR"}) {
        softdot::force_simd_target(target);
        expect_fp8_equals_float(
            std::string("scale ") + std::to_string(sc) + " target " + target, p,
            {});
      }
      softdot::force_simd_target("");
    }
  }
}

// write_kv into fp8 pages: the bound of kv_cache.h per element, with
// per-token scales (scale = max |x| / F, rounded); with a per-tensor scale
// x / scale rounded, saturating; and what paged_attention reads back is the
// dequantised value.
template <class T>
void check_write_bound() {
  const std::size_t H = 3, n = 50, d = 64, P = 20, ps = 4;
  std::mt19937_64 rng(91);
  for (double range : {1.0, 1e-3, 1e5, 1e-30}) {
    std::uniform_real_distribution<double> u(-range, range);
    Tensor<float> key(1, H, n, d, 0, 0.0f);
    key.for_each([&](float& v) { v = float(u(rng)); });
    for (std::size_t c = 0; c < d; ++c) key.at(0, 1, 7, c) = 0.0f;  // zeros
    key.at(0, 2, 9, 4) = float(range);
    std::vector<std::int64_t> slots(n);
    for (std::size_t t = 0; t < n; ++t) slots[t] = std::int64_t(P * ps - 1 - t);
    Tensor<T> kp(P, H, ps, d, 0, T{0x55}), vp = kp;
    Tensor<float> ks(P, H, ps, 1, 0, kNaNF), vs = ks;
    softdot::write_kv(key.cview(), key.cview(),
                      Float8Pages<T>{kp.view(), ks.view()},
                      Float8Pages<T>{vp.view(), vs.view()}, slots);
    const double u8 = std::ldexp(1.0, -(kMant<T> + 1));
    const double sub = std::ldexp(1.0, kMinExp<T> - kMant<T> - 1);
    double worst = 0;
    for (std::size_t t = 0; t < n; ++t) {
      const auto sl = std::size_t(slots[t]);
      for (std::size_t h = 0; h < H; ++h) {
        const float s = ks.at(sl / ps, h, sl % ps, 0);
        float amax = 0;
        for (std::size_t c = 0; c < d; ++c)
          amax = std::max(amax, std::fabs(key.at(0, h, t, c)));
        if (amax == 0) {
          ASSERT_EQ(s, 0.0f);
          continue;
        }
        if (amax / float(kMax<T>) >= std::numeric_limits<float>::min()) {
          ASSERT_EQ(s, amax / float(kMax<T>));
        }
        for (std::size_t c = 0; c < d; ++c) {
          const double x = key.at(0, h, t, c);
          const double deq = double(value(kp.at(sl / ps, h, sl % ps, c)) * s);
          const double err = std::fabs(deq - x);
          const double bound = u8 * std::fabs(x) * (1 + 0x1p-20) + sub * s;
          ASSERT_LE(err, bound) << name8<T>() << " x " << x << " scale " << s;
          worst = std::max(worst, err / (u8 * std::fabs(x) + sub * s));
        }
      }
    }
    std::printf("[ %s ] range %g: max error / bound = %.4f\n", name8<T>(),
                range, worst);
  }
  // Per tensor: x / scale rounded, saturating at the largest value.
  Tensor<float> key(1, 1, 2, 16, 0, 0.0f);
  for (std::size_t c = 0; c < 16; ++c) {
    key.at(0, 0, 0, c) = float(c) - 8.0f;
    key.at(0, 0, 1, c) = float(kMax<T>) * 4.0f * (c % 2 ? 1.0f : -1.0f);
  }
  Tensor<T> kp(1, 1, 4, 16, 0, T{0x55}), vp = kp;
  const std::vector<std::int64_t> slots = {2, 0};
  softdot::write_kv(key.cview(), key.cview(),
                    Float8Pages<T>{kp.view(), {}, 0.5f},
                    Float8Pages<T>{vp.view(), {}, 0.5f}, slots);
  for (std::size_t c = 0; c < 16; ++c) {
    EXPECT_EQ(kp.at(0, 0, 2, c).bits,
              round8<T>(double(key.at(0, 0, 0, c)) / 0.5).bits);
    EXPECT_EQ(double(value(kp.at(0, 0, 0, c))), (c % 2 ? 1.0 : -1.0) * kMax<T>)
        << "saturates";
  }
  EXPECT_EQ(kp.at(0, 0, 1, 0).bits, 0x55) << "unwritten slot untouched";
}

TEST(AttentionFp8, WriteKvBound) {
  check_write_bound<Float8E4M3>();
  check_write_bound<Float8E5M2>();
}

// Written pages read back by paged_attention: the bits of attention() on
// the dequantised values, per token and per tensor, both page layouts.
template <class T>
void check_write_then_attend(bool per_tensor) {
  const std::size_t H = 4, Hkv = 2, n = 37, d = 64, P = 12, ps = 16;
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> u(-3.0, 3.0);
  Tensor<float> key(1, Hkv, n, d, 0, 0.0f), val = key, q(1, H, 1, d, 0, 0.0f);
  key.for_each([&](float& v) { v = float(u(rng)); });
  val.for_each([&](float& v) { v = float(u(rng)); });
  q.for_each([&](float& v) { v = float(u(rng)); });
  std::vector<std::int64_t> slots(n);
  // Pages 5, 2, 9 in that order.
  const std::int32_t pages[3] = {5, 2, 9};
  for (std::size_t t = 0; t < n; ++t) {
    slots[t] =
        std::int64_t(pages[t / ps]) * std::int64_t(ps) + std::int64_t(t % ps);
  }
  Tensor<T> kp(P, Hkv, ps, d, 0, T{0x7f}), vp = kp;
  Tensor<float> ks(P, Hkv, ps, 1, 0, kNaNF), vs = ks;
  const float st = 0.02f;
  Float8Pages<T> kw{kp.view(), per_tensor ? TensorView<float>{} : ks.view(),
                    per_tensor ? st : 1.0f};
  Float8Pages<T> vw{vp.view(), per_tensor ? TensorView<float>{} : vs.view(),
                    per_tensor ? st : 1.0f};
  softdot::write_kv(key.cview(), val.cview(), kw, vw, slots);
  // The dequantised values, contiguous.
  Tensor<float> kd(1, Hkv, n, d, 0, 0.0f), vd = kd;
  for (std::size_t t = 0; t < n; ++t) {
    const auto sl = std::size_t(slots[t]);
    for (std::size_t h = 0; h < Hkv; ++h) {
      const float sk = per_tensor ? st : ks.at(sl / ps, h, sl % ps, 0);
      const float sv = per_tensor ? st : vs.at(sl / ps, h, sl % ps, 0);
      for (std::size_t c = 0; c < d; ++c) {
        kd.at(0, h, t, c) = value(kp.at(sl / ps, h, sl % ps, c)) * sk;
        vd.at(0, h, t, c) = value(vp.at(sl / ps, h, sl % ps, c)) * sv;
      }
    }
  }
  const std::vector<std::int32_t> table = {5, 2, 9, -1};
  const std::vector<std::int32_t> lens = {std::int32_t(n)};
  const softdot::PagedKVTable t{table, 4, lens};
  Tensor<float> got(1, H, 1, d, 0, 0.0f), want = got;
  std::vector<float> lg(H), lw(H);
  const Float8KV<T> kr{kp.cview(),
                       per_tensor ? TensorView<const float>{} : ks.cview(),
                       per_tensor ? st : 1.0f};
  const Float8KV<T> vr{vp.cview(),
                       per_tensor ? TensorView<const float>{} : vs.cview(),
                       per_tensor ? st : 1.0f};
  softdot::paged_attention(q.cview(), kr, vr, t, got.view(), {}, lg.data());
  softdot::attention(q.cview(), kd.cview(), vd.cview(), want.view(), {},
                     lw.data());
  EXPECT_TRUE(SameBits(got.dense(), want.dense()))
      << name8<T>() << (per_tensor ? " per tensor" : " per token");
  EXPECT_TRUE(SameBits(lg, lw));
  // write_kv_and_attend: the same bits; a different per-tensor scale in
  // the request is refused before anything is written.
  if (per_tensor) {
    softdot::AttentionRequest r;
    r.q = q.cview();
    r.kv = softdot::KVSource::pages(kr, vr, t);
    r.target = softdot::AttentionTarget::output(got.view());
    softdot::write_kv_and_attend(key.cview(), val.cview(), kw, vw, slots, r);
    EXPECT_TRUE(SameBits(got.dense(), want.dense()));
    Float8KV<T> kbad = kr;
    kbad.scale = 0.03f;
    r.kv = softdot::KVSource::pages(kbad, vr, t);
    expect_invalid("scale differs",
                   [&] {
                     softdot::write_kv_and_attend(key.cview(), val.cview(), kw,
                                                  vw, slots, r);
                   },
                   {"write_kv_and_attend", "per-tensor scales"});
  }
}

TEST(AttentionFp8, WriteThenAttend) {
  for (bool per_tensor : {false, true}) {
    check_write_then_attend<Float8E4M3>(per_tensor);
    check_write_then_attend<Float8E5M2>(per_tensor);
  }
}

TEST(AttentionFp8, BadScalesAreErrors) {
  Shape s{.B = 1, .H = 2, .Hkv = 1, .nq = 3, .nkv = 10, .d = 8, .dv = 8};
  auto p = make_fp8<Float8E4M3>(s, false);
  Tensor<float> out(1, 2, 3, 8, 0, kOutSentinel);
  auto expect = [&](const std::string& what, const softdot::Float8E4M3KV& k,
                    const softdot::Float8E4M3KV& v,
                    const std::vector<std::string>& needles) {
    expect_invalid(
        what, [&] { softdot::attention(p.f.q.cview(), k, v, out.view()); },
        needles);
    for (float x : out.dense()) EXPECT_EQ(bits(x), bits(kOutSentinel)) << what;
  };
  auto k2 = p.k;
  k2.scales.at(0, 0, 4, 0) = -1.0f;
  expect("negative scale", k2.view(), p.v.view(),
         {"attention", "k scales[0, 0, 4]", "-1"});
  expect("negative tensor scale", {p.k.q.cview(), {}, -2.0f}, p.v.view(),
         {"attention", "k scale = -2", "finite"});
  expect("NaN tensor scale", p.k.view(), {p.v.q.cview(), {}, kNaNF},
         {"v scale = nan"});
  expect("both scales", {p.k.q.cview(), p.k.scales.cview(), 2.0f}, p.v.view(),
         {"k has scales and scale = 2"});
  Tensor<float> short_scales(1, 1, 9, 1, 0, 1.0f);
  expect("scales shape", {p.k.q.cview(), short_scales.cview()}, p.v.view(),
         {"k scales [1, 1, 9, 1]", "[1, 1, 10, 1]"});
  // Formats must agree.
  const softdot::Float8E5M2KV k5{
      TensorView<const Float8E5M2>(
          reinterpret_cast<const Float8E5M2*>(p.k.q.data()), p.k.q.B, p.k.q.H,
          p.k.q.R, p.k.q.C, p.k.q.bs, p.k.q.hs, p.k.q.rs),
      p.k.scales.cview()};
  softdot::AttentionRequest r;
  r.q = p.f.q.cview();
  r.kv = softdot::KVSource::contiguous(k5, p.v.view());
  r.target = softdot::AttentionTarget::output(out.view());
  expect_invalid("formats", [&] { softdot::run_attention(r); },
                 {"float8_e5m2", "float8_e4m3fn"});
}

TEST(AttentionFp8, WriteKvErrorsWriteNothing) {
  Tensor<float> key(1, 2, 3, 8, 0, 0.5f);
  Tensor<Float8E4M3> kp(4, 2, 2, 8, 0, Float8E4M3{0x11}), vp = kp;
  Tensor<float> ks(4, 2, 2, 1, 0, 9.0f), vs = ks;
  const std::vector<std::int64_t> slots = {0, 3, 5};
  auto expect_untouched = [&](const std::string& what) {
    for (auto x : kp.dense()) ASSERT_EQ(x.bits, 0x11) << what;
    for (auto x : vp.dense()) ASSERT_EQ(x.bits, 0x11) << what;
    for (auto x : ks.dense()) ASSERT_EQ(x, 9.0f) << what;
  };
  key.at(0, 1, 2, 5) = std::numeric_limits<float>::infinity();
  expect_invalid("inf row",
                 [&] {
                   softdot::write_kv(
                       key.cview(), key.cview(),
                       softdot::Float8E4M3Pages{kp.view(), ks.view()},
                       softdot::Float8E4M3Pages{vp.view(), vs.view()}, slots);
                 },
                 {"write_kv", "key holds inf at [0, 1, 2, 5]", "slot 5"});
  expect_untouched("inf row");
  key.at(0, 1, 2, 5) = 0.5f;
  expect_invalid("zero scale",
                 [&] {
                   softdot::write_kv(
                       key.cview(), key.cview(),
                       softdot::Float8E4M3Pages{kp.view(), {}, 0.0f},
                       softdot::Float8E4M3Pages{vp.view(), {}, 1.0f}, slots);
                 },
                 {"write_kv", "k_pages scale = 0", "> 0"});
  expect_untouched("zero scale");
  expect_invalid("both",
                 [&] {
                   softdot::write_kv(
                       key.cview(), key.cview(),
                       softdot::Float8E4M3Pages{kp.view(), ks.view(), 3.0f},
                       softdot::Float8E4M3Pages{vp.view(), vs.view()}, slots);
                 },
                 {"write_kv", "k_pages has scales and scale = 3"});
  expect_untouched("both");
  // fp8 rows are not written (write_kv quantises float rows).
  const softdot::Float8E4M3KV rows{kp.cview(), ks.cview()};
  expect_invalid("fp8 rows",
                 [&] {
                   softdot::write_kv(
                       rows, rows,
                       softdot::Float8E4M3Pages{kp.view(), ks.view()},
                       softdot::Float8E4M3Pages{vp.view(), vs.view()}, slots);
                 },
                 {"write_kv", "key is float8_e4m3fn"});
  expect_untouched("fp8 rows");
}

}  // namespace
}  // namespace softdot_test
