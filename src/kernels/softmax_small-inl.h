// softdot kernels: the softmax of a float row of at most one block (16
// elements) in registers, with the same bits as the passes.

#if defined(SOFTDOT_KERNELS_SOFTMAX_SMALL_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SOFTDOT_KERNELS_SOFTMAX_SMALL_INL_H_
#undef SOFTDOT_KERNELS_SOFTMAX_SMALL_INL_H_
#else
#define SOFTDOT_KERNELS_SOFTMAX_SMALL_INL_H_
#endif

#include "kernels/softmax_passes-inl.h"

HWY_BEFORE_NAMESPACE();
namespace softdot {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// softmax of a float row of at most one block (16 elements), in registers:
// the partial block is loaded once and the exponentials are kept, where
// passes A, B and C each reload the block (and the faithful C recomputes
// exp). Every value is computed as in those passes (one element per lane,
// so each lane sum is its one exponential, added by the same tree), so
// the weights have the same bits (the faithful float pairs of AVX2 and
// AVX-512: FloatPairSingleBlock). Returns false, having written nothing,
// for rows whose max is NaN-tainted or +-inf (RowImpl handles them) and for
// scaled scores beyond 2^32.
//
// Lanes whose score is -inf (the padding past n, masked lanes, -inf inputs)
// have the weight +0 in the passes; here their exponential is computed from
// a shift of 0 and then replaced by +0: the same bits, without the
// underflow (on AVX-512 only, where both exps let such lanes underflow in
// vscalefps / vscalefpd; elsewhere they are clamped and zeroed). On Intel
// cores every underflowing vector takes a microcode assist: a 3-element
// row took 168 ns (faithful) and 101 ns (fast) on a Xeon (AVX3), 29 and 33
// ns with the underflows flushed (MXCSR FTZ/DAZ), and 16 full lanes 28 ns.
template <bool kMasked, bool kScaled>
HWY_INLINE bool SingleBlockSoftmaxF32(
    const Scores<float, kMasked, kScaled>& scores, const float* x,
    const std::uint8_t* mask, std::size_t n, bool faithful, float* y) {
  using B = Block<float>;
  using V = typename B::V;
  const typename B::D d;
  constexpr std::size_t kLanes = B::kLanes;
  alignas(64) float xb[kLanes];
  [[maybe_unused]] alignas(64) float yb[kLanes];
  alignas(64) std::uint8_t mb[kLanes];
  LoadPartialBlock(x, n, -std::numeric_limits<float>::infinity(), xb);
  if (kMasked) LoadPartialMask(mask, n, kLanes, mb);
  V p[B::kVecs], lo[B::kVecs];
  V mx = hn::Set(d, -std::numeric_limits<float>::infinity());
  V bad = hn::Zero(d);
  for (std::size_t v = 0; v < B::kVecs; ++v) {
    scores.Load(xb, kMasked ? mb : nullptr, v, p[v], lo[v]);
    mx = hn::Max(mx, p[v]);
    bad = hn::Or(bad, hn::VecFromMask(d, hn::IsNaN(p[v])));
  }
  const float m = hn::GetLane(hn::MaxOfLanes(d, mx));
  if (!hn::AllFalse(d, hn::MaskFromVec(bad)) ||
      m == -std::numeric_limits<float>::infinity() ||
      m == std::numeric_limits<float>::infinity()) {
    return false;
  }
  // The weights of lanes [at, at + lanes of dv): with masked stores,
  // straight to y; else into yb, copied out at the end. Stored to yb in
  // halves (the faithful weights are demoted from two double vectors) and
  // reloaded whole, they waited for a failed store forwarding.
  const auto put = [&](auto dv, auto value, std::size_t at) HWY_ATTR {
#if SOFTDOT_MASKED_TAIL
    const std::size_t lanes = hn::Lanes(dv);
    if (at < n)
      BlendedStoreNarrow(dv, value, y + at, n - at < lanes ? n - at : lanes);
#else
    hn::StoreU(value, dv, yb + at);
#endif
  };
#if SOFTDOT_FLOAT_PAIR_EXP
  if (faithful && FloatPairUsable<kScaled>(m)) {
    FloatPairSingleBlock(scores, xb, kMasked ? mb : nullptr, m, yb);
    StorePartialBlock(yb, n, y);
    return true;
  }
#endif
  if (faithful) {
    if (kScaled && std::fabs(m) >= 0x1p32f) return false;
    using WS = DoubleLaneScores<kMasked, kScaled>;
    using DW = typename WS::DW;
    const DW dw;
    const hn::Rebind<float, DW> df;
    const WS ws{static_cast<double>(scores.scale)};
    const auto cv = hn::Set(dw, static_cast<double>(m));
    const auto neg_inf = hn::Set(dw, -std::numeric_limits<double>::infinity());
    hn::Vec<DW> e[WS::kVecs];
    for (std::size_t v = 0; v < WS::kVecs; ++v) {
      const auto p = ws.Load(xb, kMasked ? mb : nullptr, v);
      if constexpr (HasScalef<hn::Vec<DW>>::value) {
        const auto live = hn::Gt(p, neg_inf);
        e[v] = hn::IfThenElseZero(
            live, ExpForFloat(dw, hn::IfThenElseZero(live, hn::Sub(p, cv))));
      } else {  // no underflow there: dead lanes are clamped, then zeroed
        (void)neg_inf;
        e[v] = ExpForFloat(dw, hn::Sub(p, cv));
      }
    }
    const auto iv = hn::Set(dw, 1.0 / PairwiseSumOfVecs<WS::kVecs>(dw, e));
    for (std::size_t v = 0; v < WS::kVecs; ++v) {
      put(df, hn::DemoteTo(df, hn::Mul(e[v], iv)), v * WS::kVecLanes);
    }
  } else {
    const V mv = hn::Set(d, m), one = hn::Set(d, 1.0f);
    V e[B::kVecs], s[B::kVecs], c[B::kVecs];
    const V neg_inf = hn::Set(d, -std::numeric_limits<float>::infinity());
    for (std::size_t v = 0; v < B::kVecs; ++v) {
      if constexpr (HasScalef<V>::value) {
        const auto live = hn::Gt(p[v], neg_inf);
        e[v] = hn::IfThenElseZero(
            live, ShiftedExp(hn::IfThenElse(live, p[v], mv),
                             hn::IfThenElseZero(live, lo[v]), mv));
      } else {  // no underflow there: dead lanes compute exp(0), then +0
        (void)neg_inf;
        e[v] = ShiftedExp(p[v], lo[v], mv);
      }
      // SumExpPass's lane: s = 1 + e with its Fast2Sum error.
      s[v] = hn::Add(one, e[v]);
      c[v] = hn::Sub(e[v], hn::Sub(s[v], one));
    }
    double sum_hi, sum_lo;
    SumLanes<float, false>(s, c, sum_hi, sum_lo, 1.0);
    float h, l;
    Reciprocal<float>(sum_hi, sum_lo, h, l);
    const V hv = hn::Set(d, h), lv = hn::Set(d, l);
    for (std::size_t v = 0; v < B::kVecs; ++v) {
      put(d, TimesReciprocal(e[v], hv, lv), v * B::kVecLanes);
    }
  }
#if !SOFTDOT_MASKED_TAIL
  StorePartialBlock(yb, n, y);
#endif
  return true;
}

}  // namespace HWY_NAMESPACE
}  // namespace softdot
HWY_AFTER_NAMESPACE();

#endif  // SOFTDOT_KERNELS_SOFTMAX_SMALL_INL_H_
