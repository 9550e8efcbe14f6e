// softdot kernels: the last pass of a 16-bit softmax row. The row has been
// widened to float (exactly) and its state (max c and sum S) taken by the
// faithful float state pass; this pass computes each weight
// exp(p_i - c) / S in double lanes (ExpForFloat, relative error below
// 2^-31) and rounds it once to bfloat16 or float16 (round to odd to float,
// then to 16 bits: round16.h, RoundFinite16), so no weight is rounded
// twice.

#if defined(SOFTDOT_KERNELS_SOFTMAX16_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SOFTDOT_KERNELS_SOFTMAX16_INL_H_
#undef SOFTDOT_KERNELS_SOFTMAX16_INL_H_
#else
#define SOFTDOT_KERNELS_SOFTMAX16_INL_H_
#endif

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "kernels/convert16-inl.h"
#include "kernels/softmax_common-inl.h"
#include "kernels/softmax_faithful-inl.h"
#include "round16.h"

HWY_BEFORE_NAMESPACE();
namespace softdot {
namespace HWY_NAMESPACE {

// One block of kLanes widened scores (xb, mb padded) -> kLanes 16-bit
// weights at yb.
template <class WS>
HWY_INLINE void Apply16Block(const WS& ws, const float* xb,
                             const std::uint8_t* mb, typename WS::V cv,
                             typename WS::V iv, std::uint16_t* yb, bool bf16) {
  const typename WS::DW d;
  for (std::size_t v = 0; v < WS::kVecs; ++v) {
    const auto e = hn::Mul(ExpForFloat(d, hn::Sub(ws.Load(xb, mb, v), cv)), iv);
#if HWY_TARGET <= HWY_AVX2
    hn::StoreU(RoundFinite16(d, e, bf16),
               hn::Rebind<std::uint16_t, typename WS::DW>(),
               yb + v * WS::kVecLanes);
#else
    alignas(64) double buf[WS::kVecLanes];
    hn::StoreU(e, d, buf);
    for (std::size_t j = 0; j < WS::kVecLanes; ++j) {
      yb[v * WS::kVecLanes + j] =
          bf16 ? detail::bfloat16_bits(buf[j]) : to_float16(buf[j]).bits;
    }
#endif
  }
}

template <bool kMasked, bool kScaled>
HWY_INLINE void Apply16Row(const float* x, const std::uint8_t* mask,
                           float scale, std::size_t n, double c, double inv,
                           std::uint16_t* y, bool bf16) {
  using WS = DoubleLaneScores<kMasked, kScaled>;
  const WS ws{static_cast<double>(scale)};
  const typename WS::DW d;
  const auto cv = hn::Set(d, c), iv = hn::Set(d, inv);
  ForEachBlock<float, std::uint16_t>(
      x, kMasked ? mask : nullptr, y, n,
      -std::numeric_limits<float>::infinity(),
      [&](const float* xp, const std::uint8_t* mp, std::uint16_t* yp)
          HWY_ATTR { Apply16Block(ws, xp, mp, cv, iv, yp, bf16); });
}

#if HWY_TARGET <= HWY_AVX2
// The 16-bit bits (in 32-bit lanes) of the finite, non-negative float lanes
// w rounded to nearest even: bfloat16 on the upper half, float16 by F16C.
template <class D>
HWY_INLINE hn::Vec<hn::RebindToUnsigned<D>> Round16F(D /*d*/, hn::Vec<D> w,
                                                     bool bf16) {
  const hn::RebindToUnsigned<D> du;
  if (bf16) {
    const auto u = hn::BitCast(du, w);
    const auto lsb = hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u));
    return hn::ShiftRight<16>(hn::Add(hn::Add(u, hn::Set(du, 0x7fffu)), lsb));
  }
  const hn::Rebind<hwy::float16_t, D> df16;
  const hn::Rebind<std::uint16_t, D> du16;
  return hn::PromoteTo(du, hn::BitCast(du16, hn::DemoteTo(df16, w)));
}

// Float lanes with a check (Ziv's strategy): w = exp(p - c) (ExpNonPositive
// with the exact error of the shift, about 0.6 ulp) times 1/S as a float
// pair is within 2 ulp of float of exp(p - c) / S (S exact to 2^-31), far
// inside delta = 2^-20 w + 2^-146. Where w - delta and w + delta round to
// the same 16-bit number, so does the exact weight: that number is stored.
// Elsewhere (about 2^-11 of the lanes for bfloat16, 2^-8 for float16) the
// weight is recomputed in double (std::exp, and 1/S in double) and rounded
// once, as the double-lane pass would: the same bound as Apply16Row.
template <bool kMasked, bool kScaled>
HWY_INLINE void Weights16Block(const Scores<float, kMasked, kScaled>& scores,
                               const float* xb, const std::uint8_t* mb, float c,
                               double cd, double inv, float ih, float il,
                               std::uint16_t* yb, bool bf16) {
  using B = Block<float>;
  using V = typename B::V;
  const typename B::D d;
  const hn::RebindToUnsigned<decltype(d)> du;
  const hn::Rebind<std::int32_t, decltype(d)> di;
  const hn::Rebind<std::uint16_t, decltype(d)> du16;
  const V cv = hn::Set(d, c);
  for (std::size_t v = 0; v < B::kVecs; ++v) {
    V p, plo;
    scores.Load(xb, mb, v, p, plo);
    const V e = ShiftedExp(p, plo, cv);
    const V w = hn::MulAdd(e, hn::Set(d, ih), hn::Mul(e, hn::Set(d, il)));
    const auto r = Round16F(d, w, bf16);
    std::uint16_t* out = yb + v * B::kVecLanes;
    hn::StoreU(hn::DemoteTo(du16, hn::BitCast(di, r)), du16, out);
    hn::Mask<decltype(du)> hard;
    if (bf16) {
      // bfloat16 rounds at bit 16 of the float at every magnitude (the
      // subnormals included): w is near a midpoint when its low half is
      // within 24 float ulps (delta's 16 ulps of a normal w, 8 of a
      // subnormal one) of 0x8000.
      const auto low = hn::And(hn::BitCast(di, w), hn::Set(di, 0xffff));
      hard = hn::RebindMask(
          du,
          hn::Lt(hn::Abs(hn::Sub(low, hn::Set(di, 0x8000))), hn::Set(di, 25)));
    } else {
      const V delta =
          hn::MulAdd(w, hn::Set(d, 0x1p-20f), hn::Set(d, 0x1p-146f));
      const auto rl = Round16F(d, hn::ZeroIfNegative(hn::Sub(w, delta)), bf16);
      const auto rh = Round16F(d, hn::Add(w, delta), bf16);
      hard = hn::Ne(rl, rh);
    }
    if (HWY_LIKELY(hn::AllFalse(du, hard))) continue;
    alignas(64) std::uint32_t flags[B::kVecLanes];
    hn::Store(hn::VecFromMask(du, hard), du, flags);
    for (std::size_t j = 0; j < B::kVecLanes; ++j) {
      if (flags[j] == 0) continue;
      const std::size_t i = v * B::kVecLanes + j;
      if (kMasked && mb[i] == 0) continue;  // stored +0 (never hard)
      const double pd =
          static_cast<double>(xb[i]) * static_cast<double>(scores.scale);
      const double wd = std::exp(pd - cd) * inv;
      out[j] = bf16 ? detail::bfloat16_bits(wd) : to_float16(wd).bits;
    }
  }
}

template <bool kMasked, bool kScaled>
HWY_INLINE void Weights16Row(const float* x, const std::uint8_t* mask,
                             float scale, std::size_t n, double c, double inv,
                             std::uint16_t* y, bool bf16) {
  const Scores<float, kMasked, kScaled> scores{scale};
  const float cf = static_cast<float>(c);  // exact: the float max
  const float ih = static_cast<float>(inv);
  const float il = static_cast<float>(inv - static_cast<double>(ih));
  ForEachBlock<float, std::uint16_t>(
      x, kMasked ? mask : nullptr, y, n,
      -std::numeric_limits<float>::infinity(),
      [&](const float* xp, const std::uint8_t* mp, std::uint16_t* yp) HWY_ATTR {
        Weights16Block(scores, xp, mp, cf, c, inv, ih, il, yp, bf16);
      });
}
#define SOFTDOT_ROW16 Weights16Row
#else
#define SOFTDOT_ROW16 Apply16Row
#endif

// The largest scaled max (|c|) the float-lane passes take. x_i * scale is
// a float p_i plus its exact low part, which shifts the exponent's argument
// of ExpNonPositive (a correction term, meant to be tiny); at the max the
// low part is up to half an ulp of c and positive, so |c| must keep it
// below 2^-13 (the float softmax's FloatPairUsable bound). Found by
// fuzz_rows16: with |c| near 2^29 the low part reached +2.4 and a
// one-element row's weight came out 0.089 instead of 1. Larger scaled rows
// take the double path.
constexpr float kMaxScaled16 = 0x1p12f;

// The state of a widened 16-bit row for its weights: the float max c of
// the scaled scores (NaN when a kept score is NaN) and S = sum exp(p_i - c)
// in double lanes (ExpForFloat, below 2^-31 relative per term) summed
// without compensation: the plain double lane sums err by below n 2^-53 /
// 16, 2^-39 for n = 2^18, far below the terms' 2^-31 (the compensated sum
// of RowOp::kState serves logsumexp, which reads the low part of S - 1).
// Returns false (state unset) for the rows the caller takes elsewhere: a
// NaN, a max of +-inf (fully masked or -inf rows, +inf scores), or a
// scaled max of kMaxScaled16 (2^12) or more.
template <bool kMasked, bool kScaled>
HWY_INLINE bool State16Row(const float* x, const std::uint8_t* mask,
                           float scale, std::size_t n, double& c, double& s) {
  const Scores<float, kMasked, kScaled> scores{scale};
  bool any_nan = false;
  const float m = MaxPass<float>(scores, x, mask, n, any_nan);
  if (any_nan || !std::isfinite(m) ||
      (kScaled && std::fabs(m) >= kMaxScaled16)) {
    return false;
  }
  const DoubleLaneScores<kMasked, kScaled> ws{static_cast<double>(scale)};
  double lo;
  c = m;
  DoubleLaneSumPass<false>(ws, x, mask, n, c, s, lo);
  s += lo;
  return true;
}

HWY_NOINLINE bool Softmax16State(const float* x, const std::uint8_t* mask,
                                 float scale, std::size_t n, double* c,
                                 double* s) {
  const bool scaled = scale != 1.0f;
  if (mask) {
    return scaled ? State16Row<true, true>(x, mask, scale, n, *c, *s)
                  : State16Row<true, false>(x, mask, scale, n, *c, *s);
  }
  return scaled ? State16Row<false, true>(x, mask, scale, n, *c, *s)
                : State16Row<false, false>(x, mask, scale, n, *c, *s);
}

// y[i] = exp(x[i] * scale - c) * inv rounded once to 16 bits, i < n; masked
// entries (mask[i] == 0) give +0. The row is finite where kept, and
// x[i] * scale - c <= about 2^-20 (c the float max of the scaled scores).
HWY_NOINLINE void Softmax16Apply(const float* x, const std::uint8_t* mask,
                                 float scale, std::size_t n, double c,
                                 double inv, std::uint16_t* y, bool bf16) {
  const bool scaled = scale != 1.0f;
  if (mask) {
    scaled ? SOFTDOT_ROW16<true, true>(x, mask, scale, n, c, inv, y, bf16)
           : SOFTDOT_ROW16<true, false>(x, mask, scale, n, c, inv, y, bf16);
  } else {
    scaled ? SOFTDOT_ROW16<false, true>(x, mask, scale, n, c, inv, y, bf16)
           : SOFTDOT_ROW16<false, false>(x, mask, scale, n, c, inv, y, bf16);
  }
}
#undef SOFTDOT_ROW16

// y[i] = the float w[i] rounded to nearest even to bfloat16 (bf16) or
// float16 bits, i < n; every w[i] finite and >= +0 (the weights of
// Precision::kFast, rounded once from float).
HWY_NOINLINE void Round16Floats(const float* w, std::size_t n, std::uint16_t* y,
                                bool bf16) {
  std::size_t i = 0;
#if HWY_TARGET <= HWY_AVX2
  const hn::ScalableTag<float> d;
  const hn::Rebind<std::int32_t, decltype(d)> di;
  const hn::Rebind<std::uint16_t, decltype(d)> du16;
  const std::size_t N = hn::Lanes(d);
  for (; i + N <= n; i += N) {
    const auto r = Round16F(d, hn::LoadU(d, w + i), bf16);
    hn::StoreU(hn::DemoteTo(du16, hn::BitCast(di, r)), du16, y + i);
  }
#endif
  for (; i < n; ++i) {
    y[i] = bf16 ? detail::bfloat16_bits(static_cast<double>(w[i]))
                : to_float16(static_cast<double>(w[i])).bits;
  }
}

#if HWY_TARGET <= HWY_AVX2
// Precision::kFast on 16-bit rows in three passes that read the 16-bit row
// itself (widened in registers): the max of the scaled scores; e_i =
// exp(p_i - c) (ExpNonPositive with the exact error of the shift and of
// x_i * scale, about 0.6 ulp of float) stored to `e`, summed in double
// lanes (the sum then within 0.6 float ulps relative, plus 2^-40); and
// w_i = e_i * (1/S) (1/S as a float pair, one rounding) rounded once to
// 16 bits. w_i is within about 1.7 float ulps (below 2^-22 relative, or
// 2^-148 absolute for float subnormals) of the exact weight.
struct Fast16 {
  using D = hn::ScalableTag<float>;
  using V = hn::Vec<D>;
  static constexpr std::size_t kN = hn::MaxLanes(D());

  // N scores p (masked -> -inf) and the low parts of x * scale.
  template <bool kMasked, bool kScaled>
  static HWY_INLINE void Load(const std::uint16_t* x, const std::uint8_t* mask,
                              float scale, bool bf16, V& p, V& lo) {
    const D d;
    const hn::Rebind<std::uint16_t, D> d16;
    const hn::RebindToUnsigned<D> du;
    const auto bits = hn::LoadU(d16, x);
    V xv;
    if (bf16) {
      xv = hn::BitCast(d, hn::ShiftLeft<16>(hn::PromoteTo(du, bits)));
    } else {
      const hn::Rebind<hwy::float16_t, D> df16;
      xv = hn::PromoteTo(d, hn::BitCast(df16, bits));
    }
    if constexpr (kScaled) {
      const V sv = hn::Set(d, scale);
      p = hn::Mul(xv, sv);
      lo = ProductLow(xv, sv, p);
    } else {
      p = xv;
      lo = hn::Zero(d);
    }
    if constexpr (kMasked) {
      const auto keep = LoadKeep(d, mask);
      p = hn::IfThenElse(keep, p, hn::Set(d, -HUGE_VALF));
      lo = hn::IfThenElseZero(keep, lo);
    }
  }
};

template <bool kMasked, bool kScaled>
HWY_INLINE bool Fast16Row(const std::uint16_t* x, const std::uint8_t* mask,
                          float scale, std::size_t n, float* e,
                          std::uint16_t* y, bool bf16) {
  using F = Fast16;
  using V = F::V;
  const F::D d;
  const hn::Half<F::D> dh;
  const hn::Rebind<double, decltype(dh)> dd;
  constexpr std::size_t kN = F::kN;
  const std::size_t full = n / kN * kN, rest = n - full;
  // The tail through padded copies: -inf scores, masked lanes.
  alignas(64) std::uint16_t xt[kN];
  alignas(64) std::uint8_t mt[kN < 16 ? 16 : kN];
  alignas(64) float et[kN];
  const std::uint16_t pad = bf16 ? 0xff80u : 0xfc00u;
  for (std::size_t j = 0; j < kN; ++j) {
    xt[j] = j < rest ? x[full + j] : pad;
    mt[j] = j < rest && kMasked ? mask[full + j] : 0;
  }
  if (kMasked) {
    for (std::size_t j = rest; j < sizeof(mt); ++j) mt[j] = 0;
  }
  const auto at = [&](std::size_t i, const std::uint16_t*& xp,
                      const std::uint8_t*& mp) {
    xp = i < full ? x + i : xt;
    mp = kMasked ? (i < full ? mask + i : mt) : nullptr;
  };
  const std::size_t end = full + (rest ? kN : 0);

  // Pass 1: max, and any NaN among the kept scores.
  V mx0 = hn::Set(d, -HUGE_VALF), mx1 = mx0;
  auto bad = hn::Zero(d);
  std::size_t i = 0;
  for (; i < end; i += kN) {
    const std::uint16_t* xp;
    const std::uint8_t* mp;
    at(i, xp, mp);
    V p, lo;
    F::Load<kMasked, kScaled>(xp, mp, scale, bf16, p, lo);
    bad = hn::Or(bad, hn::VecFromMask(d, hn::IsNaN(p)));
    if ((i / kN) & 1) {
      mx1 = hn::Max(mx1, p);
    } else {
      mx0 = hn::Max(mx0, p);
    }
  }
  const float m = hn::GetLane(hn::MaxOfLanes(d, hn::Max(mx0, mx1)));
  if (!hn::AllFalse(d, hn::MaskFromVec(bad)) || !std::isfinite(m) ||
      (kScaled && std::fabs(m) >= kMaxScaled16)) {
    return false;
  }

  // Pass 2: e_i stored, summed in double lanes.
  const V mv = hn::Set(d, m);
  auto s0 = hn::Zero(dd), s1 = hn::Zero(dd);
  for (i = 0; i < end; i += kN) {
    const std::uint16_t* xp;
    const std::uint8_t* mp;
    at(i, xp, mp);
    V p, lo;
    F::Load<kMasked, kScaled>(xp, mp, scale, bf16, p, lo);
    const V ev = ShiftedExp(p, lo, mv);
    hn::StoreU(ev, d, i < full ? e + i : et);
    s0 = hn::Add(s0, hn::PromoteTo(dd, hn::LowerHalf(dh, ev)));
    s1 = hn::Add(s1, hn::PromoteTo(dd, hn::UpperHalf(dh, ev)));
  }
  if (rest) {
    for (std::size_t j = 0; j < rest; ++j) e[full + j] = et[j];
  }
  const double sum = hn::GetLane(hn::SumOfLanes(dd, hn::Add(s0, s1)));
  const double inv = 1.0 / sum;
  const float ih = static_cast<float>(inv);
  const float il = static_cast<float>(inv - static_cast<double>(ih));

  // Pass 3: w_i = e_i * (1/S), rounded once to 16 bits.
  const hn::Rebind<std::int32_t, F::D> di;
  const hn::Rebind<std::uint16_t, F::D> du16;
  const V hv = hn::Set(d, ih), lv = hn::Set(d, il);
  for (i = 0; i < full; i += kN) {
    const V ev = hn::LoadU(d, e + i);
    const V w = hn::MulAdd(ev, hv, hn::Mul(ev, lv));
    hn::StoreU(hn::DemoteTo(du16, hn::BitCast(di, Round16F(d, w, bf16))), du16,
               y + i);
  }
  if (rest) {
    alignas(64) std::uint16_t yt[kN];
    const V ev = hn::Load(d, et);
    const V w = hn::MulAdd(ev, hv, hn::Mul(ev, lv));
    hn::Store(hn::DemoteTo(du16, hn::BitCast(di, Round16F(d, w, bf16))), du16,
              yt);
    for (std::size_t j = 0; j < rest; ++j) y[full + j] = yt[j];
  }
  return true;
}
#endif

// Precision::kFast on a 16-bit row (bits x) with e a scratch of n floats:
// false (y untouched) for the rows the caller takes elsewhere (a kept NaN,
// a max of +-inf, a scaled max of 2^12 or more) and on the targets without
// FMA and F16C (below AVX2), which the caller serves by widening.
HWY_NOINLINE bool Softmax16Fast(const std::uint16_t* x,
                                const std::uint8_t* mask, float scale,
                                std::size_t n, float* e, std::uint16_t* y,
                                bool bf16) {
#if HWY_TARGET <= HWY_AVX2
  const bool scaled = scale != 1.0f;
  if (mask) {
    return scaled ? Fast16Row<true, true>(x, mask, scale, n, e, y, bf16)
                  : Fast16Row<true, false>(x, mask, scale, n, e, y, bf16);
  }
  return scaled ? Fast16Row<false, true>(x, mask, scale, n, e, y, bf16)
                : Fast16Row<false, false>(x, mask, scale, n, e, y, bf16);
#else
  (void)x, (void)mask, (void)scale, (void)n, (void)e, (void)y, (void)bf16;
  return false;
#endif
}

}  // namespace HWY_NAMESPACE
}  // namespace softdot
HWY_AFTER_NAMESPACE();

#endif  // SOFTDOT_KERNELS_SOFTMAX16_INL_H_
