// softdot kernels: the faithful precision of a softmax row (each weight
// rounded once): float softmax rows in float lanes with exp as a float pair
// (AVX2, AVX-512), float states, float rows on the other targets and scaled
// rows with |max| >= 2^12 in double lanes, double as exp pairs, and the
// chunked one-pass max and sum for float rows too large for the caches.

#if defined(SOFTDOT_KERNELS_SOFTMAX_FAITHFUL_INL_H_) == \
    defined(HWY_TARGET_TOGGLE)
#ifdef SOFTDOT_KERNELS_SOFTMAX_FAITHFUL_INL_H_
#undef SOFTDOT_KERNELS_SOFTMAX_FAITHFUL_INL_H_
#else
#define SOFTDOT_KERNELS_SOFTMAX_FAITHFUL_INL_H_
#endif

#include "kernels/softmax_passes-inl.h"
#include "kernels/two_sum.h"

HWY_BEFORE_NAMESPACE();
namespace softdot {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// ---------------------------------------------------------------------------
// Precision::kFaithful: the weights are rounded once.
//
// float, softmax rows on AVX2 and AVX-512 (SOFTDOT_FLOAT_PAIR_EXP): float
// lanes, exp as the pair of ExpPairF32; see FloatPairSumPass below for the
// error bound (0.72 ulp, 0.86 of the spacing for subnormal weights; measured
// 0.59 and 0.75) and the operation counts.
// float otherwise (softmax_state / softmax_apply and logsumexp, which need
// the compensated sum; targets without FMA; scaled rows whose max reaches
// 2^12): every step after the max runs in double lanes. A score is the
// exact product x * scale (24 x 24 bits fit in 53), d = score - c is exact
// or within 2^-53 relative, exp(d) has a relative error below 2^-31
// (ExpForFloat: a degree-8 polynomial, truncation 2^-32, exp_faithful-inl.h),
// the sum is plain double (relative error below n 2^-53 / 16 per lane), and
// y = fl_float(exp(d) * (1/S)) is rounded twice, to double and then float:
// within 0.5 ulp + about 2^-7 ulp (2^-31 relative is 2^-7 of a float ulp;
// measured 0.503 ulp, docs/accuracy.md).
// double: exp(t + c) as a pair 2^k (hi + lo) (ExpPair: below about 2^-58,
// measured 2^-59, exp_faithful-inl.h), summed with
// TwoSum compensation, then y = 2^k ((hi + lo)(h + l)) with 1/S = h + l
// in double length and one rounding of a value in [0.35, 1.42] (a second
// one, exact unless the weight is subnormal, applies 2^k): within 0.5 ulp +
// about 0.1 ulp.
// Both recompute exp in the last pass rather than storing a rounded one.
// ---------------------------------------------------------------------------

// float scores in double lanes; a float block (16 elements) is kVecs
// double vectors.
template <bool kMasked, bool kScaled>
struct DoubleLaneScores {
  using DW = Block<double>::D;
  using V = hn::Vec<DW>;
  static constexpr std::size_t kVecLanes = Block<double>::kVecLanes;
  static constexpr std::size_t kVecs = Block<float>::kLanes / kVecLanes;

  double scale;

  HWY_INLINE V Load(const float* HWY_RESTRICT x, const std::uint8_t* mask,
                    std::size_t v) const {
    const DW d;
    const hn::Rebind<float, DW> df;
    V p = hn::PromoteTo(d, hn::LoadU(df, x + v * kVecLanes));
    if constexpr (kScaled) p = hn::Mul(p, hn::Set(d, scale));  // exact
    if constexpr (kMasked) {
      p = hn::IfThenElse(LoadKeep(d, mask + v * kVecLanes), p,
                         hn::Set(d, -std::numeric_limits<double>::infinity()));
    }
    return p;
  }
};

// sum_i exp(p_i - c) over float scores, in double. kCompensated adds TwoSum
// compensation, which a state needs and a softmax does not: logsumexp of a
// state reads the tail of 1 + tiny (log(1 + 2.6e-32) is 2.6e-32, not 0),
// while a weight only needs the sum to 2^-30 (the plain double sum of n
// terms is within n 2^-53 / 16 per lane). It costs 6 of about 30 operations
// per vector.
template <bool kCompensated, class WS>
HWY_INLINE void DoubleLaneSumPass(const WS& ws, const float* x,
                                  const std::uint8_t* mask, std::size_t n,
                                  double c, double& sum_hi, double& sum_lo) {
  using V = typename WS::V;
  const typename WS::DW d;
  const V cv = hn::Set(d, c);
  V acc[WS::kVecs], comp[WS::kVecs];
  for (std::size_t v = 0; v < WS::kVecs; ++v) acc[v] = comp[v] = hn::Zero(d);
  ForEachBlock<float>(
      x, mask, nullptr, n, -std::numeric_limits<float>::infinity(),
      [&](const float* xb, const std::uint8_t* mb, float*) HWY_ATTR {
        for (std::size_t v = 0; v < WS::kVecs; ++v) {
          const V e = ExpForFloat(d, hn::Sub(ws.Load(xb, mb, v), cv));
          const V t = hn::Add(acc[v], e);
          if constexpr (kCompensated) {
            comp[v] = hn::Add(comp[v], TwoSumErr(acc[v], e, t));
          }
          acc[v] = t;
        }
      });
  if constexpr (!kCompensated) {
    sum_hi = PairwiseSumOfVecs<WS::kVecs>(d, acc);
    sum_lo = 0.0;
    return;
  }
  PairwiseTwoSumOfVecs<WS::kVecs>(d, acc, comp, sum_hi, sum_lo);
}

// y_i = fl_float(exp(p_i - c) * inv).
template <class WS>
HWY_INLINE void DoubleLaneApplyPass(const WS& ws, const float* x,
                                    const std::uint8_t* mask, std::size_t n,
                                    double c, double inv, float* y) {
  using V = typename WS::V;
  const typename WS::DW d;
  const hn::Rebind<float, typename WS::DW> df;
  const V cv = hn::Set(d, c), iv = hn::Set(d, inv);
  ForEachBlock<float>(
      x, mask, y, n, -std::numeric_limits<float>::infinity(),
      [&](const float* xb, const std::uint8_t* mb, float* yb) HWY_ATTR {
        for (std::size_t v = 0; v < WS::kVecs; ++v) {
          const V e = ExpForFloat(d, hn::Sub(ws.Load(xb, mb, v), cv));
          hn::StoreU(hn::DemoteTo(df, hn::Mul(e, iv)), df,
                     yb + v * WS::kVecLanes);
        }
      });
}

#if SOFTDOT_FLOAT_PAIR_EXP
// float rows in float lanes (targets with SOFTDOT_FLOAT_PAIR_EXP): exp(p - c)
// as the pair 2^k (hi + lo) of ExpPairF32 (relative error below 0.087 u, u =
// 2^-24, exp_faithful-inl.h). c is the float max, so t = p - c is carried
// with its exact TwoSum error (and the exact low part of a scaled score);
// scaled rows need |c| < 2^12 (FloatPairUsable) so that this correction
// stays below 2^-11.
//
// Sum pass: S' = sum 2^(k + 64) hi + sum 2^(k + 64) lo, each term exact in
// float (2^(k + 64) is normal for k >= -151; lo may round once where
// 2^(k + 64) lo is subnormal, 2^-150 absolute against S' >= 2^64), promoted
// and added in double per logical lane, the lanes in the tree of reduce.h:
// relative error below (n / 16 + 4) 2^-53 plus that of the pairs, 0.087 u.
// Weight pass: R = 2^-64 / S as the float pair R_hi + R_lo (from a double
// division: 2^-48), z = hi R_hi + (lo R_hi + hi R_lo) rounded once (FMA;
// the tail is below 0.045 of z and rounds with at most 0.045 ulp of z),
// then y = z 2^(k + 64), exact unless y is subnormal.
// Bound: 0.5 ulp (z) + 2 * 0.087 (numerator and S, whose pair errors may
// have opposite signs) + 0.045 (tail) + 2^-20 < 0.72 ulp: faithful. A
// subnormal y rounds a second time: at most 0.5 of the subnormal spacing G
// plus half an ulp of z 2^(k+64) (<= G/4) plus 0.22 u y < 0.11 G: 0.86 G.
// Dead lanes (t < -104, masked, -inf, padding) compute garbage and are
// zeroed by a select: exp(-104) < 2^-150 is 0 once divided by S >= 1.
// Operations per 16 lanes (AVX-512, unmasked, unscaled; AVX2 per 8 lanes:
// the scale by 2^(k+64) costs 3 instead of 1, the promotion 3 per vector):
//   max pass (pass A, softmax_common-inl.h): load, max, NaN test: 4;
//   sum pass: load 1, t 1, TwoSum 5, dead 1, ExpPairF32 16, scale argument
//     1, 2 scalef, 2 selects, promotion 6 (2 extracts, 4 converts), 4 double
//     adds: 39;
//   weight pass: load 1, t 1, TwoSum 5, dead 1, ExpPairF32 16, mul + 2 FMA
//     for z, scale argument 1, scalef 1, select 1, store 1: 31.
// 74 in all: 37 cycles per 16 floats at 2 vector operations per cycle (the
// two 512-bit pipes), 2.3 per element, against about 100 (3.1 per element)
// for the double-lane passes (19 operations per 8 double lanes, twice per
// pass, plus conversions). AVX2, per 8 floats: 35 + 32 + 2 = 69, 2.9
// cycles per element on 3 pipes. Measured (Xeon model 167 VM with AVX-512,
// 2.6 GHz nominal, 3.9 GHz by an imul chain, shared with other jobs; the
// fastest of 6 runs of BM_softmax/4096): 0.717 ns per element, about 2.8
// cycles (old path 0.910 ns, 3.5 cycles); AVX2 0.951 ns, 3.7 cycles (old
// 1.490). The fast path (about 28 operations) measured 0.41 ns.
template <bool kScaled>
HWY_INLINE bool FloatPairUsable(float c) {
  return !kScaled || std::fabs(c) < 0x1p12f;
}

template <class S, class V = typename Block<float>::V>
HWY_INLINE void ShiftedExpPairF32(const S& scores, const float* xb,
                                  const std::uint8_t* mb, std::size_t v, V cv,
                                  V neg_c, V& hi, V& lo, V& f,
                                  hn::Mask<typename Block<float>::D>& dead) {
  const typename Block<float>::D d;
  V p, plo;
  scores.Load(xb, mb, v, p, plo);
  const V t = hn::Sub(p, cv);
  V c = TwoSumErr(p, neg_c, t);
  if constexpr (S::kHasLow) c = hn::Add(c, plo);
  dead = hn::Lt(t, hn::Set(d, ExpConstants<float>::kMin));
  V n, kf;
  ExpPairF32(d, t, c, hi, lo, n, kf);
  f = Pow2K64Arg(d, n, kf);
}

// The exponentials of one block: 2^(k + 64) hi and 2^(k + 64) lo, +0 in
// dead lanes (for the sum), and what the weights need (pair, scale, dead).
struct FloatPairBlock {
  using B = Block<float>;
  using V = typename B::V;
  V hi[B::kVecs], lo[B::kVecs], f[B::kVecs];
  hn::Mask<typename B::D> dead[B::kVecs];
  // With the target's attributes, as PlainDot::State's (dot-inl.h).
  HWY_ATTR FloatPairBlock() {}

  template <class S>
  HWY_INLINE void Compute(const S& scores, const float* xb,
                          const std::uint8_t* mb, V cv, V neg_c) {
    for (std::size_t v = 0; v < B::kVecs; ++v) {
      ShiftedExpPairF32(scores, xb, mb, v, cv, neg_c, hi[v], lo[v], f[v],
                        dead[v]);
    }
  }

  // Adds the block to the per-lane double sums of the scaled pair.
  HWY_INLINE void AddTo(typename Block<double>::V* acc_hi,
                        typename Block<double>::V* acc_lo) const {
    constexpr std::size_t kW = kDoubleVecs<float>;
    V sh[B::kVecs], sl[B::kVecs];
    for (std::size_t v = 0; v < B::kVecs; ++v) {
      sh[v] = hn::IfThenZeroElse(dead[v], ApplyPow2K64(hi[v], f[v]));
      sl[v] = hn::IfThenZeroElse(dead[v], ApplyPow2K64(lo[v], f[v]));
    }
    typename Block<double>::V hd[kW], ld[kW];
    PromoteBlock<float>(sh, hd);
    PromoteBlock<float>(sl, ld);
    for (std::size_t w = 0; w < kW; ++w) {
      acc_hi[w] = hn::Add(acc_hi[w], hd[w]);
      acc_lo[w] = hn::Add(acc_lo[w], ld[w]);
    }
  }

  // y = fl(fl(hi rh + (lo rh + hi rl)) 2^(k + 64)), +0 in dead lanes.
  HWY_INLINE void Weights(V rh, V rl, float* yb) const {
    const typename B::D d;
    for (std::size_t v = 0; v < B::kVecs; ++v) {
      const V z =
          hn::MulAdd(hi[v], rh, hn::MulAdd(lo[v], rh, hn::Mul(hi[v], rl)));
      hn::StoreU(hn::IfThenZeroElse(dead[v], ApplyPow2K64(z, f[v])), d,
                 yb + v * B::kVecLanes);
    }
  }
};

// The lane sums as one double: each lane's hi + lo, then the tree.
HWY_INLINE double FloatPairTotal(const typename Block<double>::V* acc_hi,
                                 const typename Block<double>::V* acc_lo) {
  constexpr std::size_t kW = kDoubleVecs<float>;
  const typename Block<double>::D dd;
  typename Block<double>::V total[kW];
  for (std::size_t w = 0; w < kW; ++w) total[w] = hn::Add(acc_hi[w], acc_lo[w]);
  return PairwiseSumOfVecs<kW>(dd, total);
}

// 2^-64 / S as a float pair, from sum2 = 2^64 S.
HWY_INLINE void FloatPairInverse(double sum2, float& inv_hi, float& inv_lo) {
  const double inv = 1.0 / sum2;
  inv_hi = static_cast<float>(inv);
  inv_lo = static_cast<float>(inv - static_cast<double>(inv_hi));
}

// 2^64 sum_i exp(p_i - c), in double.
template <class S>
HWY_INLINE double FloatPairSumPass(const S& scores, const float* x,
                                   const std::uint8_t* mask, std::size_t n,
                                   float c) {
  using B = Block<float>;
  using V = typename B::V;
  constexpr std::size_t kW = kDoubleVecs<float>;
  const typename B::D d;
  const typename Block<double>::D dd;
  const V cv = hn::Set(d, c), neg_c = hn::Set(d, -c);
  typename Block<double>::V acc_hi[kW], acc_lo[kW];
  for (std::size_t w = 0; w < kW; ++w) acc_hi[w] = acc_lo[w] = hn::Zero(dd);
  ForEachBlock<float>(
      x, mask, nullptr, n, -std::numeric_limits<float>::infinity(),
      [&](const float* xb, const std::uint8_t* mb, float*) HWY_ATTR {
        FloatPairBlock e;
        e.Compute(scores, xb, mb, cv, neg_c);
        e.AddTo(acc_hi, acc_lo);
      });
  return FloatPairTotal(acc_hi, acc_lo);
}

// y_i = fl(exp(p_i - c) / S) from sum2 = 2^64 S (FloatPairSumPass).
template <class S>
HWY_INLINE void FloatPairApplyPass(const S& scores, const float* x,
                                   const std::uint8_t* mask, std::size_t n,
                                   float c, double sum2, float* y) {
  using B = Block<float>;
  using V = typename B::V;
  const typename B::D d;
  float inv_hi, inv_lo;
  FloatPairInverse(sum2, inv_hi, inv_lo);
  const V cv = hn::Set(d, c), neg_c = hn::Set(d, -c);
  const V rh = hn::Set(d, inv_hi), rl = hn::Set(d, inv_lo);
  ForEachBlock<float>(x, mask, y, n, -std::numeric_limits<float>::infinity(),
                      [&](const float* xb, const std::uint8_t* mb, float* yb)
                          HWY_ATTR {
                            FloatPairBlock e;
                            e.Compute(scores, xb, mb, cv, neg_c);
                            e.Weights(rh, rl, yb);
                          });
}

// The softmax of one padded block (xb, mb: kLanes entries, the padding -inf
// and masked) with the bits of the two passes: the pairs computed once.
template <class S>
HWY_INLINE void FloatPairSingleBlock(const S& scores, const float* xb,
                                     const std::uint8_t* mb, float c,
                                     float* yb) {
  using B = Block<float>;
  constexpr std::size_t kW = kDoubleVecs<float>;
  const typename B::D d;
  const typename Block<double>::D dd;
  FloatPairBlock e;
  e.Compute(scores, xb, mb, hn::Set(d, c), hn::Set(d, -c));
  typename Block<double>::V acc_hi[kW], acc_lo[kW];
  for (std::size_t w = 0; w < kW; ++w) acc_hi[w] = acc_lo[w] = hn::Zero(dd);
  e.AddTo(acc_hi, acc_lo);
  float inv_hi, inv_lo;
  FloatPairInverse(FloatPairTotal(acc_hi, acc_lo), inv_hi, inv_lo);
  e.Weights(hn::Set(d, inv_hi), hn::Set(d, inv_lo), yb);
}
#else
template <bool kScaled>
HWY_INLINE bool FloatPairUsable(float) {
  return false;
}
#endif  // SOFTDOT_FLOAT_PAIR_EXP

// The faithful float softmax's sum sum_i exp(p_i - c) (scaled by 2^64 when
// FloatPairUsable) and its weights: the float pair passes where the target
// and c allow, else the double-lane passes.
template <bool kMasked, bool kScaled>
HWY_INLINE double FaithfulSumF32(const Scores<float, kMasked, kScaled>& scores,
                                 const float* x, const std::uint8_t* mask,
                                 std::size_t n, float c) {
#if SOFTDOT_FLOAT_PAIR_EXP
  if (FloatPairUsable<kScaled>(c)) {
    return FloatPairSumPass(scores, x, mask, n, c);
  }
#endif
  const DoubleLaneScores<kMasked, kScaled> ws{
      static_cast<double>(scores.scale)};
  double sum_hi, sum_lo;
  DoubleLaneSumPass<false>(ws, x, mask, n, c, sum_hi, sum_lo);
  return sum_hi + sum_lo;
}

// Scale of FaithfulSumF32's result: 2^64 on the pair path.
template <bool kScaled>
HWY_INLINE double FaithfulSumScaleF32(float c) {
  return FloatPairUsable<kScaled>(c) ? 0x1p64 : 1.0;
}

// Weights for the shift c (a float) and the plain sum s (not scaled).
template <bool kMasked, bool kScaled>
HWY_INLINE void FaithfulApplyF32(const Scores<float, kMasked, kScaled>& scores,
                                 const float* x, const std::uint8_t* mask,
                                 std::size_t n, float c, double s, float* y) {
#if SOFTDOT_FLOAT_PAIR_EXP
  if (FloatPairUsable<kScaled>(c)) {
    FloatPairApplyPass(scores, x, mask, n, c, s * 0x1p64, y);
    return;
  }
#endif
  const DoubleLaneScores<kMasked, kScaled> ws{
      static_cast<double>(scores.scale)};
  DoubleLaneApplyPass(ws, x, mask, n, c, 1.0 / s, y);
}

// The exact max of the scaled scores, in double. Only needed when the
// float max m is so large (>= 2^32) that a score can exceed it by more than
// exp's range (half an ulp of m); scalar, since such rows are rare.
template <bool kMasked>
double ExactScaledMax(const float* x, const std::uint8_t* mask, float scale,
                      std::size_t n) {
  double c = -std::numeric_limits<double>::infinity();
  for (std::size_t i = 0; i < n; ++i) {
    if (kMasked && mask[i] == 0) continue;
    c = std::max(c, static_cast<double>(x[i]) * static_cast<double>(scale));
  }
  return c;
}

// ShiftedExp's pair form: exp(p - m) = 2^k (hi + lo), the exact error of
// the subtraction (and lo) folded in.
template <class V>
HWY_INLINE void ShiftedExpPair(V p, V lo, V m, V& hi_e, V& lo_e, V& kf) {
  const hn::DFromV<V> d;
  const V t = hn::Sub(p, m);
  ExpPair(d, t, hn::Add(TwoSumErr(p, hn::Neg(m), t), lo), hi_e, lo_e, kf);
}

// Double: sum_i exp(p_i - m) from ExpPair, as hi + lo. The high and low
// parts of the exponentials go into two separate TwoSum-compensated sums, so
// the total is accurate to about 2^-100 and its bits do not depend on the
// order of the terms (masked entries leave the other weights exactly as if
// they were absent; folding the low parts into the compensation instead left
// 2^-57 of order-dependent noise, and last-bit differences in the weights).
template <class S>
HWY_INLINE void PairSumPass(const S& scores, const double* x,
                            const std::uint8_t* mask, std::size_t n, double m,
                            double& sum_hi, double& sum_lo) {
  using B = Block<double>;
  using V = typename B::V;
  const typename B::D d;
  const V mv = hn::Set(d, m);
  V s[B::kVecs], c[B::kVecs], sl[B::kVecs], cl[B::kVecs];
  for (std::size_t v = 0; v < B::kVecs; ++v) {
    s[v] = c[v] = sl[v] = cl[v] = hn::Zero(d);
  }
  ForEachBlock<double>(
      x, mask, nullptr, n, -std::numeric_limits<double>::infinity(),
      [&](const double* xb, const std::uint8_t* mb, double*) HWY_ATTR {
        for (std::size_t v = 0; v < B::kVecs; ++v) {
          V p, lo, hi_e, lo_e, kf;
          scores.Load(xb, mb, v, p, lo);
          ShiftedExpPair(p, lo, mv, hi_e, lo_e, kf);
          const V e = ScaleByPow2(d, hi_e, kf);
          const V el = ScaleByPow2(d, lo_e, kf);
          const V sum = hn::Add(s[v], e);
          c[v] = hn::Add(c[v], TwoSumErr(s[v], e, sum));
          s[v] = sum;
          const V sum_l = hn::Add(sl[v], el);
          cl[v] = hn::Add(cl[v], TwoSumErr(sl[v], el, sum_l));
          sl[v] = sum_l;
        }
      });
  // Per lane, the high and low sums as one double-double, (s + sl) + (c +
  // cl): s + sl by TwoSum (its error added to +0, as the scalar form of
  // this step did), then c + cl added to the error.
  V hi[B::kVecs], lo[B::kVecs];
  for (std::size_t v = 0; v < B::kVecs; ++v) {
    hi[v] = hn::Add(s[v], sl[v]);
    lo[v] = hn::Add(hn::Zero(d), TwoSumErr(s[v], sl[v], hi[v]));
    lo[v] = hn::Add(lo[v], hn::Add(c[v], cl[v]));
  }
  PairwiseTwoSumOfVecs<B::kVecs>(d, hi, lo, sum_hi, sum_lo);
}

// Double: y_i = 2^k ((hi + lo) * (h + l)), the product rounded once.
template <class S>
HWY_INLINE void PairApplyPass(const S& scores, const double* x,
                              const std::uint8_t* mask, std::size_t n, double m,
                              double inv_hi, double inv_lo, double* y) {
  using B = Block<double>;
  using V = typename B::V;
  const typename B::D d;
  const V mv = hn::Set(d, m), h = hn::Set(d, inv_hi), l = hn::Set(d, inv_lo);
  ForEachBlock<double>(
      x, mask, y, n, -std::numeric_limits<double>::infinity(),
      [&](const double* xb, const std::uint8_t* mb, double* yb) HWY_ATTR {
        for (std::size_t v = 0; v < B::kVecs; ++v) {
          V p, lo, hi_e, lo_e, kf;
          scores.Load(xb, mb, v, p, lo);
          ShiftedExpPair(p, lo, mv, hi_e, lo_e, kf);
          const V prod = hn::Mul(hi_e, h);
          const V tail = hn::MulAdd(hi_e, l, hn::Mul(lo_e, h));
          const V z = hn::Add(prod, hn::Add(ProductLow(hi_e, h, prod), tail));
          hn::StoreU(ScaleByPow2(d, z, kf), d, yb + v * B::kVecLanes);
        }
      });
}

// kSoftmax, kState and kApply of a finite row in the faithful precision:
// m is the row's max, or for kApply the state's (the caller reads it).
template <class T, bool kMasked, bool kScaled>
HWY_INLINE void FaithfulRow(const Scores<T, kMasked, kScaled>& scores,
                            const T* x, const std::uint8_t* mask, std::size_t n,
                            detail::RowOp op, T m, T* y,
                            detail::RowState* state) {
  using detail::RowOp;
  if constexpr (sizeof(T) == 4) {
    const DoubleLaneScores<kMasked, kScaled> ws{
        static_cast<double>(scores.scale)};
    double c = m, inv;
    if (op == RowOp::kApply) {
      inv = 1.0 / (state->sum + state->sum_lo);
    } else {
      if (op == RowOp::kSoftmax && FloatPairUsable<kScaled>(m)) {
        const double s = FaithfulSumF32(scores, x, mask, n, m);
        FaithfulApplyF32(scores, x, mask, n, m, s * 0x1p-64, y);
        return;
      }
      if (kScaled && op == RowOp::kSoftmax && std::fabs(m) >= 0x1p32f) {
        c = ExactScaledMax<kMasked>(x, mask, scores.scale, n);
      }
      double sum_hi, sum_lo;
      if (op == RowOp::kState) {
        DoubleLaneSumPass<true>(ws, x, mask, n, c, sum_hi, sum_lo);
        *state = {c, sum_hi, sum_lo};
        return;
      }
      DoubleLaneSumPass<false>(ws, x, mask, n, c, sum_hi, sum_lo);
      inv = 1.0 / (sum_hi + sum_lo);
    }
    DoubleLaneApplyPass(ws, x, mask, n, c, inv, y);
  } else {
    double s_hi, s_lo;
    if (op == RowOp::kApply) {
      s_hi = state->sum;
      s_lo = state->sum_lo;
    } else {
      PairSumPass(scores, x, mask, n, m, s_hi, s_lo);
      if (op == RowOp::kState) {
        *state = {m, s_hi, s_lo};
        return;
      }
    }
    double h, l;
    Reciprocal<double>(s_hi, s_lo, h, l);
    PairApplyPass(scores, x, mask, n, m, h, l, y);
  }
}

// Faithful float rows too large for the caches: the max and the sum are
// taken in one pass over memory, chunk by chunk. Each chunk (kChunk floats, 16
// KiB: it stays in L1 between its two sweeps) gets its own max m_c and sum S_c
// = sum exp(p - m_c), exactly as a whole row does in passes A and B; the
// chunks' (m_c, S_c) are merged in double, S = sum S_c exp(m_c - M) with M
// the largest m_c (a merge costs one scalar exp per 4096 elements). Pass C
// then recomputes exp(p - M) and writes y, so the row is read from memory
// twice and written once, where passes A, B, C read it three times (and the
// fast path's stored exponentials add a write and a read). Chunk boundaries
// depend only on the index, so the bits do not depend on the SIMD target.
// A NaN score makes the whole row NaN at once. Returns false, having
// written nothing, for the rows this path leaves to RowImpl: +inf scores,
// and scaled scores whose max reaches 2^32 (which the faithful path takes
// exactly in double).
// Used for the faithful precision only, which recomputes exp in pass C
// anyway: there it saves one read of the row (measured ~1% at 2^20 and 2^24
// floats on the development machine, where the double exps, not memory,
// set the pace). The fast precision stores its exponentials in pass B and
// only multiplies in pass C; recomputing them instead made it slower at
// every size measured (65536: 35 vs 22 us, 2^24: 10.9 vs 9.8 ms).
inline constexpr std::size_t kChunk = 4096;
inline constexpr std::size_t kChunkedMinFloat = 1u << 15;  // 128 KiB

template <bool kMasked, bool kScaled>
HWY_INLINE bool ChunkedSoftmaxF32(const Scores<float, kMasked, kScaled>& scores,
                                  const float* x, const std::uint8_t* mask,
                                  std::size_t n, float* y) {
  double big_m = -std::numeric_limits<double>::infinity();
  double s_hi = 0.0, s_lo = 0.0;
  for (std::size_t i = 0; i < n; i += kChunk) {
    const std::size_t len = n - i < kChunk ? n - i : kChunk;
    const float* xc = x + i;
    const std::uint8_t* mc = mask ? mask + i : nullptr;
    bool nan_here = false;
    const float m = MaxPass<float>(scores, xc, mc, len, nan_here);
    if (nan_here) {  // the row is NaN, whatever the other chunks hold
      Fill(y, n, std::numeric_limits<float>::quiet_NaN());
      return true;
    }
    if (m == -std::numeric_limits<float>::infinity()) continue;
    if (m == std::numeric_limits<float>::infinity()) return false;
    if (kScaled && std::fabs(m) >= 0x1p32f) return false;
    double c_hi = FaithfulSumF32(scores, xc, mc, len, m) /
                  FaithfulSumScaleF32<kScaled>(m);
    double c_lo = 0.0;
    const double md = m;
    if (md > big_m) {
      const double f = std::exp(big_m - md);  // 0 for the first chunk
      s_hi = s_hi * f;
      s_lo = s_lo * f;
      big_m = md;
    } else {
      const double f = std::exp(md - big_m);
      c_hi *= f;
      c_lo *= f;
    }
    detail::add_compensated(s_hi, s_lo, c_hi);
    s_lo += c_lo;
  }
  if (big_m == -std::numeric_limits<double>::infinity()) {
    Fill(y, n, 0.0f);
  } else {
    // big_m is one of the chunks' float maxima.
    FaithfulApplyF32(scores, x, mask, n, static_cast<float>(big_m), s_hi + s_lo,
                     y);
  }
  return true;
}

}  // namespace HWY_NAMESPACE
}  // namespace softdot
HWY_AFTER_NAMESPACE();

#endif  // SOFTDOT_KERNELS_SOFTMAX_FAITHFUL_INL_H_
