// softdot kernels: the exponentials of the faithful softmax (Precision::
// kFaithful), accurate enough that a weight is rounded only once.
//
// ExpPairF32(d, t, c, ...) (AVX2 and AVX-512 only, at the end of this file):
// float lanes, exp(t + c) = 2^k (hi + lo) with a relative error below 0.087
// u (u = 2^-24): the faithful float softmax rows. 16 operations per vector
// of 16 (AVX-512) or 8 (AVX2) lanes, where ExpForFloat below takes 19 per 8
// double lanes. ExpForFloat stays for the float state (softmax_state,
// logsumexp) and for the targets without FMA.
//
// ExpForFloat(d, t): double lanes, exp(t) for t in [-inf, 700] (t = x - max
// of float scores formed exactly in double). Arguments below -200 give
// exactly 0: exp(-200) < 2^-288 is 0 once divided by the sum (>= 1) and
// rounded to float, and a masked entry (-inf) must add nothing to the sum.
// Method as in exp-inl.h with a degree-8 Taylor polynomial (truncation
// 2e-10 relative, 2^-32); the whole error is below 2^-31, 2^-7 ulp of the
// float result (degree 10 measured no different against MPFR and cost two
// more FMA per vector in each of two passes). 2^k is a single product: k is
// in [-289, 1010]. Cost per vector: 1 compare, 2 min/max, 2 for the
// rounding, 2 FMA reduction, 8 FMA, 2 integer ops, 1 mul, 1 select: 19
// operations per 8 (AVX-512) double lanes.
//
// ExpPair(d, t, c, hi, lo, k): double lanes, exp(t + c) = 2^k (hi + lo)
// with |lo| < 0.008 |hi| (the rounded part of the sum is only r^3/6 + ...)
// and a relative error below about 2^-58 (measured 2^-59); for t <= 0 and |c|
// <= ulp(t) as from TwoSum (c is capped at 1, which only matters for scores
// beyond 2^53). Lanes with t < -746 give hi = lo = 0, k = 0. Method: k =
// round(t / ln2); r_hi = t - k ln2_hi (exact), r_lo = c - k ln2_lo, r + r_err =
// r_hi + r_lo exactly (TwoSum); exp = 1 + r + r^2/2 + (r_err + r r_err + r^3/6
// + ... + r^14/14!) (truncation 2^-63): 1 + r and the exact square (FMA, or
// Dekker's product) are added with error-free transformations, and only
// terms below 0.007 are rounded plainly. The first version kept r^2/2 + ... (up
// to 0.07) in lo and measured 0.90 ulp for double softmax at n = 2^20; the
// worst-case analysis of that form reached 1 ulp. Cost: about 42 operations per
// vector.

#if defined(SOFTDOT_KERNELS_EXP_FAITHFUL_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SOFTDOT_KERNELS_EXP_FAITHFUL_INL_H_
#undef SOFTDOT_KERNELS_EXP_FAITHFUL_INL_H_
#else
#define SOFTDOT_KERNELS_EXP_FAITHFUL_INL_H_
#endif

#include <cstdint>

#include "hwy/highway.h"
#include "kernels/eft-inl.h"
#include "kernels/exp-inl.h"

HWY_BEFORE_NAMESPACE();
namespace softdot {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// 1/k! for k = 14 (kInvFactorial in exp-inl.h stops at 13).
inline constexpr double kInvFactorial14 = 1.14707455977297247139e-11;

// Round(t * log2e) for |t| < 2^51, and 2^k built from it without a
// double -> int64 conversion (which AVX2 lacks): adding 1.5 * 2^52 puts k in
// the low bits of the mantissa.
template <class D, class V = hn::Vec<D>>
HWY_INLINE V RoundedK(D d, V t) {
  const V shifter = hn::Set(d, 6755399441055744.0);  // 1.5 * 2^52
  return hn::Sub(
      hn::MulAdd(t, hn::Set(d, ExpConstants<double>::kLog2e), shifter),
      shifter);
}

// 2^k for integral double lanes k with k + 1023 in [1, 2046].
template <class D, class V = hn::Vec<D>>
HWY_INLINE V Pow2Of(D d, V kf) {
  const hn::RebindToSigned<D> di;
  const V biased = hn::Add(kf, hn::Set(d, 6755399441055744.0 + 1023.0));
  return hn::BitCast(d, hn::ShiftLeft<52>(hn::BitCast(di, biased)));
}

template <class D, class V = hn::Vec<D>>
HWY_INLINE V ExpForFloat(D d, V t) {
  using C = ExpConstants<double>;
  const auto dead = hn::Lt(t, hn::Set(d, -200.0));
  // With Scalef a dead lane computes exp(-1100), which Scalef rounds to
  // exactly +0: no final select and no 2^k to build (15 operations).
  t = HasScalef<V>::value
          ? hn::IfThenElse(dead, hn::Set(d, -1100.0),
                           hn::Min(t, hn::Set(d, 700.0)))
          : hn::Min(hn::Max(t, hn::Set(d, -200.0)), hn::Set(d, 700.0));
  const V kf = RoundedK(d, t);
  V r = hn::MulAdd(kf, hn::Set(d, -C::kLn2Hi), t);
  r = hn::MulAdd(kf, hn::Set(d, -C::kLn2Lo), r);
  constexpr int kDegree = 8;
  V p = hn::Set(d, kInvFactorial[kDegree]);
  for (int i = kDegree - 1; i >= 0; --i) {
    p = hn::MulAdd(p, r, hn::Set(d, kInvFactorial[i]));
  }
#if SOFTDOT_AVX512
  if constexpr (HasScalef<V>::value) return Scalef(p, kf);
#endif
  return hn::IfThenZeroElse(dead, hn::Mul(p, Pow2Of(d, kf)));
}

template <class D, class V = hn::Vec<D>>
HWY_INLINE void ExpPair(D d, V t, V c, V& hi, V& lo, V& kf) {
  using C = ExpConstants<double>;
  const auto dead = hn::Lt(t, hn::Set(d, C::kMin));
  t = hn::IfThenZeroElse(dead, t);
  c = hn::IfThenZeroElse(dead, hn::Min(c, hn::Set(d, 1.0)));
  kf = RoundedK(d, t);
  const V r_hi = hn::MulAdd(kf, hn::Set(d, -C::kLn2Hi), t);  // exact
  const V r_lo = hn::MulAdd(kf, hn::Set(d, -C::kLn2Lo), c);
  // r = r_hi + r_lo as r + r_err exactly (r_lo reaches 2e-7 for k = -1000,
  // and r_lo^2 / 2 would be 2^-46 of the result; r_err^2 is below 2^-108).
  const V r = hn::Add(r_hi, r_lo);
  const V r_err = TwoSumErr(r_hi, r_lo, r);
  // r^3 (1/6 + r/24 + ... + r^11/14!): below 0.007, so its rounding errors
  // are below 2^-59 of the result.
  V p = hn::Set(d, kInvFactorial14);
  for (int i = 13; i >= 3; --i) {
    p = hn::MulAdd(p, r, hn::Set(d, kInvFactorial[i]));
  }
  const V cube = hn::Mul(hn::Mul(hn::Mul(r, r), r), p);
  // r^2 / 2 exactly as sq + sq_err; 0.5 * r is exact.
  const V half_r = hn::Mul(r, hn::Set(d, 0.5));
  const V sq = hn::Mul(r, half_r);
  const V sq_err = ProductLow(r, half_r, sq);
  // The small terms: r_err, the rest of (r + r_err)^2 / 2, r^3 / 6 + ...
  const V small = hn::Add(hn::Add(r_err, hn::MulAdd(r, r_err, sq_err)), cube);
  // 1 + r + sq, renormalised: hi carries it rounded, lo what is left.
  const V one = hn::Set(d, 1.0);
  const V s1 = hn::Add(one, r);
  const V e1 = hn::Sub(r, hn::Sub(s1, one));  // Fast2Sum: |1| >= |r|
  const V s2 = hn::Add(s1, sq);
  const V e2 = TwoSumErr(s1, sq, s2);
  hi = hn::IfThenZeroElse(dead, s2);
  lo = hn::IfThenZeroElse(dead, hn::Add(hn::Add(e1, e2), small));
}

// 2^k applied as 2^(k/2) * 2^(k - k/2), so that for k down to -1076 both
// factors are normal and only the last product rounds (gradual underflow).
template <class D, class V = hn::Vec<D>>
HWY_INLINE V ScaleByPow2(D d, V x, V kf) {
#if SOFTDOT_AVX512
  if constexpr (HasScalef<V>::value) return Scalef(x, kf);
#endif
  const V k1 = hn::Floor(hn::Mul(kf, hn::Set(d, 0.5)));
  const V k2 = hn::Sub(kf, k1);
  return hn::Mul(hn::Mul(x, Pow2Of(d, k1)), Pow2Of(d, k2));
}

#if SOFTDOT_FLOAT_PAIR_EXP
// ExpPairF32: float lanes, exp(t + c) = 2^k (hi + lo) for the faithful float
// softmax (t = p - max rounded, c its TwoSum error plus the low part of a
// scaled score; the caller zeroes lanes with t < -104, where c may be NaN).
// kf = round(8 t / ln2) = 8 k + j with j in [0, 7]; r_hi = t - kf C_hi is
// exact (C_hi = fl(ln2 / 8) is a multiple of 2^-27, t of 2^-28 once kf != 0,
// and |r_hi| < 2^-4), r_lo = c - kf C_lo (C_lo = ln2 / 8 - C_hi, 2^-32);
// exp(t + c) = 2^(j/8) 2^k e^r with r = r_hi + r_lo, |r| <= ln2/16 + |c| +
// 2^-18 < 0.0436. 2^(j/8) = T_hi + T_lo (T_lo < 2^-24 T_hi) comes from an
// 8-entry table by one permute; e^r = 1 + r_hi + s with s = r_lo + r^2 Q(r),
// Q(r) = 1/2 + q1 r + q2 r^2 a minimax fit of (e^r - 1 - r) / r^2 on |r| <=
// 0.044 (r^2 Q within 2^-32.3 of e^r - 1 - r; Taylor's 1/6, 1/24 give
// 2^-29.4, one more Taylor term 2^-36.5); then hi = T_hi and
// lo = T_hi (r_hi + s) + T_lo (1 + r_hi + s), |lo| <= 0.083.
// Error of hi + lo relative to exp(t + c), in units of u = 2^-24: the
// rounding of r_hi + s (<= 2^-29 for |r_hi + s| < 2^-4, times T_hi / exp <=
// 1.05: 0.033), the rounding of lo (half an ulp of 0.083, 2^-28, against
// exp >= 1.33 when lo >= 2^-4, else 2^-29 against 0.96: 0.047), r rounded
// inside r^2 Q(r) (2^-29 * 0.045: 0.002), the fit (2^-32.3: 0.004), C_lo,
// T_lo and r_lo (below 0.001 together): |eps| <= 0.087 u.
// Cost: 2 for k, 2 for r_hi and r_lo, 1 and for the index, 2 permutes, 1 add,
// 1 mul, 2 FMA for Q, 1 FMA, 1 add, 2 FMA: 16 operations per vector (16
// lanes on AVX-512, 8 on AVX2). (t, c and the dead test cost 7 more, the
// scale by 2^k 1 (vscalefps) or 3; softmax_faithful-inl.h counts the passes.)
inline constexpr float kPairQ1 = 0x1.555cbp-3f;            // q1 ~ 1/6
inline constexpr float kPairQ2 = 0x1.555deap-5f;           // q2 ~ 1/24
inline constexpr float kPairLog2e8 = 11.541560173034668f;  // fl(8 / ln2)
// 1.5 * 2^23 + 8 * 191: adding it rounds 8 t / ln2 to the integer kf, left
// in the low mantissa bits as kf + 8 (127 + 64): bits 3.. hold k + 191, the
// biased exponent of 2^(k + 64), bits 0..2 hold j.
inline constexpr float kPairShifter = 12584440.0f;
inline constexpr float kPairC8Hi = 0x1.62e43p-4f;    // fl(ln2 / 8)
inline constexpr float kPairC8Lo = -0x1.05c61p-32f;  // ln2 / 8 - kPairC8Hi
// 2^(j/8) = kExp2j8Hi[j] + kExp2j8Lo[j] for j in [0, 8), stored twice
// (16 lanes index j + 8 too).
struct Exp2j8Table {
  alignas(64) float v[16];
};
inline constexpr Exp2j8Table Exp2j8Twice(const float (&t)[8]) {
  Exp2j8Table r{};
  for (int j = 0; j < 16; ++j) r.v[j] = t[j % 8];
  return r;
}
inline constexpr float kExp2j8HiOnce[8] = {
    1.0f,           0x1.172b84p+0f, 0x1.306fep+0f,  0x1.4bfdaep+0f,
    0x1.6a09e6p+0f, 0x1.8ace54p+0f, 0x1.ae89fap+0f, 0x1.d5818ep+0f};
inline constexpr float kExp2j8LoOnce[8] = {0.0f,
                                           -0x1.c15742p-27f,
                                           0x1.4636e2p-25f,
                                           -0x1.593abcp-25f,
                                           0x1.9fcef4p-26f,
                                           0x1.15506ep-27f,
                                           -0x1.a94b14p-26f,
                                           -0x1.822dbcp-27f};
inline constexpr Exp2j8Table kExp2j8Hi = Exp2j8Twice(kExp2j8HiOnce);
inline constexpr Exp2j8Table kExp2j8Lo = Exp2j8Twice(kExp2j8LoOnce);

// table[j] for j in [0, 7] in every lane: one permute of the 8 entries
// where a vector holds 8 floats or more; with 4 lanes (NEON) entries 0-3
// and 4-7 are looked up apart and bit 2 of j picks one. The same values
// either way, so the same bits.
template <class D, class VI>
HWY_INLINE hn::Vec<D> LookupExp2j8(D d, VI j, const float* table) {
  if constexpr (hn::MaxLanes(D()) >= 8) {
    return hn::TableLookupLanes(hn::Load(d, table), hn::IndicesFromVec(d, j));
  } else {
    const hn::RebindToSigned<D> di;
    const auto low = hn::IndicesFromVec(d, hn::And(j, hn::Set(di, 3)));
    const auto upper =
        hn::RebindMask(d, hn::Ne(hn::And(j, hn::Set(di, 4)), hn::Zero(di)));
    return hn::IfThenElse(upper,
                          hn::TableLookupLanes(hn::LoadU(d, table + 4), low),
                          hn::TableLookupLanes(hn::Load(d, table), low));
  }
}

// hi, lo as above; n is the shifted sum (k and j in its low bits), kf =
// 8 k + j. Valid for t in [-104, 0] and |c| <= 2^-11.
template <class D, class V = hn::Vec<D>>
HWY_INLINE void ExpPairF32(D d, V t, V c, V& hi, V& lo, V& n, V& kf) {
  const hn::RebindToSigned<D> di;
  const V shifter = hn::Set(d, kPairShifter);
  n = hn::MulAdd(t, hn::Set(d, kPairLog2e8), shifter);
  kf = hn::Sub(n, shifter);
  const V r_hi = hn::NegMulAdd(kf, hn::Set(d, kPairC8Hi), t);  // exact
  const V r_lo = hn::NegMulAdd(kf, hn::Set(d, kPairC8Lo), c);
  const auto j = hn::And(hn::BitCast(di, n), hn::Set(di, std::int32_t{7}));
  const V t_hi = LookupExp2j8(d, j, kExp2j8Hi.v);
  const V t_lo = LookupExp2j8(d, j, kExp2j8Lo.v);
  const V r = hn::Add(r_hi, r_lo);
  V q = hn::MulAdd(hn::Set(d, kPairQ2), r, hn::Set(d, kPairQ1));
  q = hn::MulAdd(q, r, hn::Set(d, 0.5f));
  const V s = hn::Add(r_hi, hn::MulAdd(hn::Mul(r, r), q, r_lo));
  hi = t_hi;
  lo = hn::MulAdd(t_hi, s, hn::MulAdd(t_lo, s, t_lo));
}

// The factor 2^(k + 64) of ExpPairF32's n and kf, in the form
// ApplyPow2K64 takes: the exponent k + 64 for vscalefps (which uses
// floor(kf / 8 + 64)), else the float 2^(k + 64) from n's bits (k + 191 in
// [40, 191], a normal float). Both give x 2^(k + 64) rounded once, so the
// bits agree (gradual underflow included).
template <class D, class V = hn::Vec<D>>
HWY_INLINE V Pow2K64Arg(D d, V n, V kf) {
#if SOFTDOT_AVX512
  if constexpr (HasScalef<V>::value) {
    (void)n;
    return hn::MulAdd(kf, hn::Set(d, 0.125f), hn::Set(d, 64.0f));
  }
#endif
  (void)kf;
  const hn::RebindToSigned<D> di;
  return hn::BitCast(
      d, hn::ShiftLeft<20>(
             hn::And(hn::BitCast(di, n), hn::Set(di, std::int32_t{~7}))));
}

template <class V>
HWY_INLINE V ApplyPow2K64(V x, V arg) {
#if SOFTDOT_AVX512
  if constexpr (HasScalef<V>::value) return Scalef(x, arg);
#endif
  return hn::Mul(x, arg);
}
#endif  // SOFTDOT_FLOAT_PAIR_EXP

}  // namespace HWY_NAMESPACE
}  // namespace softdot
HWY_AFTER_NAMESPACE();

#endif  // SOFTDOT_KERNELS_EXP_FAITHFUL_INL_H_
