// softdot kernels: exp of non-positive arguments, with a correction term.
//
// ExpNonPositive(d, t, c) returns exp(t + c) for t <= 0 (including -inf) and
// a small correction c (|c| <= ulp(t)), the form softmax needs: t = x - max
// rounded, c = the exact rounding error of that subtraction, so the weight
// does not inherit the ~|t| ulp error of the rounded shift.
//
// Lane types: float, double. Valid range: t in [-inf, 0]; NaN in, NaN or any
// value out (callers handle NaN rows before). Results below the smallest
// subnormal are +0; subnormal results are rounded once (gradual underflow).
// Method: k = round(t / ln2); r = t - k ln2 (ln2 in two parts; the high part
// has 9 (float) / 21 (double) trailing zero bits, so k * ln2_hi is exact and
// the first reduction step is exact by Sterbenz); r += c; exp(r) by its
// Taylor polynomial (degree 7 for float: truncation 5e-9 relative, 0.04 ulp;
// degree 13 for double: 4e-18, 0.04 ulp) in Horner form; then 2^k applied as
// 2^(k/2) * 2^(k - k/2) so that both factors are normal and only the last
// product rounds. Error: about 0.6 ulp (float) measured against MPFR.
// Cost (float, one vector): 1 compare, 3 selects, 1 mul + 1 round,
// 3 FMA/add for the reduction, 7 FMA, 1 convert, 6 integer ops, 2 mul:
// 1 + 3 + 2 + 3 + 7 + 1 + 6 + 2 = 25 operations per vector, about 12.5
// cycles on 2 ports per 16 lanes. On
// AVX-512, vscalefps applies 2^k (with the same single rounding) and lets
// dead lanes underflow to +0 by themselves: 1 compare, 2 selects, 2 for k,
// 3 reduction, 7 FMA, 1 scalef = 16 operations, 8 cycles per 16 lanes.

#if defined(SOFTDOT_KERNELS_EXP_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SOFTDOT_KERNELS_EXP_INL_H_
#undef SOFTDOT_KERNELS_EXP_INL_H_
#else
#define SOFTDOT_KERNELS_EXP_INL_H_
#endif

#include <cstdint>
#include <type_traits>

#include "hwy/highway.h"
#include "kernels/target-inl.h"

HWY_BEFORE_NAMESPACE();
namespace softdot {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <class T>
struct ExpConstants;

template <>
struct ExpConstants<float> {
  static constexpr float kMin = -104.0f;  // exp(-104) < 2^-150: rounds to 0
  static constexpr float kLog2e = 1.44269504088896341f;
  static constexpr float kLn2Hi = 0.693145751953125f;  // 0x3F317200
  static constexpr float kLn2Lo = 1.42860682030941723212e-6f;
  static constexpr int kMantissaBits = 23;
  static constexpr int kBias = 127;
  static constexpr int kDegree = 7;
};

template <>
struct ExpConstants<double> {
  static constexpr double kMin = -746.0;  // exp(-746) < 2^-1075: rounds to 0
  static constexpr double kLog2e = 1.44269504088896340736;
  static constexpr double kLn2Hi = 6.93147180369123816490e-01;  // 21 zero bits
  static constexpr double kLn2Lo = 1.90821492927058770002e-10;
  static constexpr int kMantissaBits = 52;
  static constexpr int kBias = 1023;
  static constexpr int kDegree = 13;
};

// 1/k! for k = 0..13, exact to double precision.
inline constexpr double kInvFactorial[14] = {1.0,
                                             1.0,
                                             0.5,
                                             1.66666666666666666667e-01,
                                             4.16666666666666666667e-02,
                                             8.33333333333333333333e-03,
                                             1.38888888888888888889e-03,
                                             1.98412698412698412698e-04,
                                             2.48015873015873015873e-05,
                                             2.75573192239858906526e-06,
                                             2.75573192239858906526e-07,
                                             2.50521083854417187751e-08,
                                             2.08767569878680989792e-09,
                                             1.60590438368216145994e-10};

// 2^k for integer lanes k whose biased exponent is in the normal range.
template <class D, class VI>
HWY_INLINE hn::Vec<D> Pow2(D d, VI k) {
  using T = hn::TFromD<D>;
  using C = ExpConstants<T>;
  const hn::RebindToSigned<D> di;
  using TI = hn::TFromD<decltype(di)>;
  return hn::BitCast(d, hn::ShiftLeft<C::kMantissaBits>(
                            hn::Add(k, hn::Set(di, TI{C::kBias}))));
}

// Scalef(x, k) = x * 2^k for integral-valued k lanes, rounded once (so
// gradual underflow is exact), +0 for k = -inf: vscalefps/pd, one
// instruction where ScaleByPow2 below needs seven. Only full AVX-512
// vectors have it; HasScalef says which vector types.
template <class V>
struct HasScalef : std::false_type {};
#if SOFTDOT_AVX512
template <>
struct HasScalef<hn::Vec512<float>> : std::true_type {};
template <>
struct HasScalef<hn::Vec512<double>> : std::true_type {};
HWY_INLINE hn::Vec512<float> Scalef(hn::Vec512<float> x, hn::Vec512<float> k) {
  return hn::Vec512<float>{_mm512_scalef_ps(x.raw, k.raw)};
}
HWY_INLINE hn::Vec512<double> Scalef(hn::Vec512<double> x,
                                     hn::Vec512<double> k) {
  return hn::Vec512<double>{_mm512_scalef_pd(x.raw, k.raw)};
}
#endif

// exp(t + c) for lanes with kMin <= t <= 0 (ExpNonPositive's arithmetic).
template <class D, class V>
HWY_INLINE V ExpCore(D d, V t, V c) {
  using T = hn::TFromD<D>;
  using C = ExpConstants<T>;
  const V kf = hn::Round(hn::Mul(t, hn::Set(d, C::kLog2e)));
  V r = hn::MulAdd(kf, hn::Set(d, static_cast<T>(-C::kLn2Hi)), t);  // exact
  r = hn::MulAdd(kf, hn::Set(d, static_cast<T>(-C::kLn2Lo)), r);
  r = hn::Add(r, c);

  V p = hn::Set(d, static_cast<T>(kInvFactorial[C::kDegree]));
  for (int i = C::kDegree - 1; i >= 0; --i) {
    p = hn::MulAdd(p, r, hn::Set(d, static_cast<T>(kInvFactorial[i])));
  }

#if SOFTDOT_AVX512
  if constexpr (HasScalef<V>::value) return Scalef(p, kf);
#endif
  const hn::RebindToSigned<D> di;
#if HWY_TARGET == HWY_SCALAR
  // HWY_SCALAR's ConvertTo is a C++ cast, undefined for a NaN (a NaN score;
  // the SIMD conversions give INT_MIN there). Such a lane's p is NaN, and so
  // is its result whatever k is: convert 0 instead.
  const auto k = hn::ConvertTo(di, hn::IfThenZeroElse(hn::IsNaN(kf), kf));
#else
  const auto k = hn::ConvertTo(di, kf);
#endif
  const auto k1 = hn::ShiftRight<1>(k);
  const auto k2 = hn::Sub(k, k1);
  return hn::Mul(hn::Mul(p, Pow2(d, k1)), Pow2(d, k2));
}

template <class D, class V = hn::Vec<D>>
HWY_INLINE V ExpNonPositive(D d, V t, V c) {
  using T = hn::TFromD<D>;
  using C = ExpConstants<T>;
  // Below kMin the result is +0 whatever c is (c may be NaN for t = -inf).
  // Those lanes compute exp(0) and are zeroed at the end: letting them
  // underflow would cost an x86 microcode assist per instruction (measured:
  // a 3-element softmax, whose 13 padding lanes are -inf, took 143 ns; with
  // Scalef, a dead lane sent to exp(-120) and rounded to +0 by Scalef
  // underflowed there too). A vector without dead lanes (most of them)
  // skips the three selects: the same bits either way.
  const auto dead = hn::Lt(t, hn::Set(d, C::kMin));
  if (HWY_LIKELY(hn::AllFalse(d, dead))) return ExpCore(d, t, c);
  t = hn::IfThenZeroElse(dead, t);
  c = hn::IfThenZeroElse(dead, c);
  return hn::IfThenZeroElse(dead, ExpCore(d, t, c));
}

}  // namespace HWY_NAMESPACE
}  // namespace softdot
HWY_AFTER_NAMESPACE();

#endif  // SOFTDOT_KERNELS_EXP_INL_H_
