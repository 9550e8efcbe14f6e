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

#if SOFTDOT_MASKED_TAIL
// The kL floats of a narrow vector (kL <= 8 lanes) as kL / L double vectors
// of L lanes each, in lane order (leaf i in lane i % L of vector i / L).
template <std::size_t kL, class DF, class DW>
HWY_INLINE void PromoteNarrow(DF df, DW dw, hn::Vec<DF> v, hn::Vec<DW>* out) {
  constexpr std::size_t kWV = kL / hn::MaxLanes(DW());
  if constexpr (kWV == 1) {
    (void)df;
    out[0] = hn::PromoteTo(dw, v);
  } else {
    static_assert(kWV == 2, "a narrow float vector is one or two doubles");
    const hn::Half<DF> dh;
    out[0] = hn::PromoteTo(dw, hn::LowerHalf(dh, v));
    out[1] = hn::PromoteTo(dw, hn::UpperHalf(dh, v));
  }
}

// 1 / s (double) in a vector register. Measured against Reciprocal's scalar
// division and conversions (Xeon VM, peers benchmark): the fast 1 x 8 on
// AVX2 45 -> 26 ns. No counters on that VM said why; a false dependency of
// the scalar instructions on their destination (a previous call's value) is
// a guess.
HWY_INLINE hn::Vec<hn::CappedTag<double, 1>> VectorReciprocal(double s) {
  const hn::CappedTag<double, 1> d1;
  return hn::Div(hn::Set(d1, 1.0), hn::Set(d1, s));
}

// SingleBlockSoftmaxF32 of the fast precision for n <= kL (4 or 8) on one
// vector of kL floats (masked-tail targets only; their faithful rows are
// float pairs, FloatPairSingleBlock): the same per-lane operations, on fewer
// lanes, and narrower reductions. The block's lanes [kL, 16) hold -inf scores,
// whose weights and lane sums are +0, and no lane sum is -0 (the lane sums
// are >= +0 and an addition gives -0 only from two -0s), so the tree's
// levels above kL leaves add +0 to each leaf (x + 0 = x) and the tree over
// 16 lanes has the same bits as the tree over the first kL; the max is
// exact in any order. What it saves is latency, which is all a 3-element
// row costs: no block buffer (stored and reloaded), a max over kL lanes,
// the lane sums in one or two double vectors instead of two or four, and
// one vector of exp on AVX2 instead of two.
template <std::size_t kL, bool kMasked, bool kScaled>
HWY_INLINE bool NarrowSoftmaxF32(const Scores<float, kMasked, kScaled>& scores,
                                 const float* x, const std::uint8_t* mask,
                                 std::size_t n, float* y) {
  using D = hn::CappedTag<float, kL>;
  using V = hn::Vec<D>;
  const D d;
  const float kInf = std::numeric_limits<float>::infinity();
  const V neg_inf = hn::Set(d, -kInf);
  alignas(16) std::uint8_t mb[16];
  if (kMasked) LoadPartialMask(mask, n, 16, mb);
  const V xv =
      hn::IfThenElse(hn::FirstN(d, n), MaskedLoadNarrow(d, x, n), neg_inf);
  // Scores<>::Load, lane by lane.
  V p = xv, lo = hn::Zero(d);
  if constexpr (kScaled) {
    const V sv = hn::Set(d, scores.scale);
    p = hn::Mul(xv, sv);
    lo = ProductLow(xv, sv, p);
  }
  if constexpr (kMasked) {
    const auto keep = LoadKeep(d, mb);
    p = hn::IfThenElse(keep, p, neg_inf);
    lo = hn::IfThenElseZero(keep, lo);
  }
  const V mv = hn::MaxOfLanes(d, p);  // every lane
  const float m = hn::GetLane(mv);
  if (!hn::AllFalse(d, hn::IsNaN(p)) || m == -kInf || m == kInf) return false;
  const V one = hn::Set(d, 1.0f);
  // Dead lanes take exp(0), then +0 (no underflow: see above).
  const auto live = hn::Gt(p, neg_inf);
  const V e =
      hn::IfThenElseZero(live, ShiftedExp(hn::IfThenElse(live, p, mv),
                                          hn::IfThenElseZero(live, lo), mv));
  // SumExpPass's lane and SumLanes (bias 1), on kL lanes, in vectors of at
  // most 4 doubles (the same tree).
  using DS = hn::CappedTag<double, (kL < 4 ? kL : 4)>;
  const DS ds;
  constexpr std::size_t kSV = kL / hn::MaxLanes(DS());
  const V s = hn::Add(one, e);
  const V c = hn::Sub(e, hn::Sub(s, one));
  hn::Vec<DS> sw[kSV], cw[kSV];
  PromoteNarrow<kL>(d, ds, s, sw);
  PromoteNarrow<kL>(d, ds, c, cw);
  const auto bias = hn::Set(ds, 1.0);
  for (std::size_t w = 0; w < kSV; ++w) {
    sw[w] = hn::Add(hn::Sub(sw[w], bias), cw[w]);
  }
  // Reciprocal<float>(sum, 0), in vector registers (sum + 0 = sum >= 1).
  const hn::CappedTag<double, 1> d1;
  const hn::Rebind<float, decltype(d1)> df1;
  const auto inv = VectorReciprocal(PairwiseSumOfVecs<kSV>(ds, sw));
  const auto h = hn::DemoteTo(df1, inv);
  const auto l = hn::DemoteTo(df1, hn::Sub(inv, hn::PromoteTo(d1, h)));
  BlendedStoreNarrow(d,
                     TimesReciprocal(e, hn::Set(d, hn::GetLane(h)),
                                     hn::Set(d, hn::GetLane(l))),
                     y, n);
  return true;
}
#endif  // SOFTDOT_MASKED_TAIL

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
#if SOFTDOT_MASKED_TAIL
  // The narrow rows take the fast precision only: where the tails are
  // masked, the faithful rows are float pairs (FloatPairSingleBlock below).
  // (A narrow faithful form in double lanes, measured before the float pairs,
  // no longer had the passes' bits.)
  if (!faithful) {
    if (n <= 4) return NarrowSoftmaxF32<4>(scores, x, mask, n, y);
    if (n <= 8) return NarrowSoftmaxF32<8>(scores, x, mask, n, y);
  }
#endif
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
