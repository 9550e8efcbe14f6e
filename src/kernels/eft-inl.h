// softdot kernels: error-free transformations (Knuth's TwoSum, the exact low
// part of a product), in vectors. Lane types: float, double. The scalar
// TwoSum is two_sum.h.

#if defined(SOFTDOT_KERNELS_EFT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SOFTDOT_KERNELS_EFT_INL_H_
#undef SOFTDOT_KERNELS_EFT_INL_H_
#else
#define SOFTDOT_KERNELS_EFT_INL_H_
#endif

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace softdot {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// a + b = s + err exactly (Knuth's TwoSum, 6 operations, no branch).
template <class V>
HWY_INLINE V TwoSumErr(V a, V b, V s) {
  const V bb = hn::Sub(s, a);
  return hn::Add(hn::Sub(a, hn::Sub(s, bb)), hn::Sub(b, bb));
}

// The low part of a product: a * b - p exactly, for p = fl(a * b). With FMA
// one instruction; without (SSE4, SSSE3, scalar) Dekker's product with
// Veltkamp's split. A non-finite low part (p = +-inf, or a split that
// overflows for |a| near the largest finite value) is replaced by 0.
template <class V>
HWY_INLINE V ProductLow(V a, V b, V p) {
  [[maybe_unused]] const hn::DFromV<V> d;  // unused where HWY_NATIVE_FMA
#if HWY_NATIVE_FMA
  const V lo = hn::MulAdd(a, b, hn::Neg(p));
#else
  using T = hn::TFromD<decltype(d)>;
  const V split = hn::Set(d, sizeof(T) == 4 ? T(4097.0) : T(134217729.0));
  const V ac = hn::Mul(a, split), bc = hn::Mul(b, split);
  const V ah = hn::Sub(ac, hn::Sub(ac, a)), al = hn::Sub(a, ah);
  const V bh = hn::Sub(bc, hn::Sub(bc, b)), bl = hn::Sub(b, bh);
  const V lo =
      hn::Add(hn::Add(hn::Add(hn::Sub(hn::Mul(ah, bh), p), hn::Mul(ah, bl)),
                      hn::Mul(al, bh)),
              hn::Mul(al, bl));
#endif
  return hn::IfThenElseZero(hn::IsFinite(lo), lo);
}

}  // namespace HWY_NAMESPACE
}  // namespace softdot
HWY_AFTER_NAMESPACE();

#endif  // SOFTDOT_KERNELS_EFT_INL_H_
