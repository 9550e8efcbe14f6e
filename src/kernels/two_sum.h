// softdot: Knuth's TwoSum in scalar code, written once for the kernels and
// the checked entry points (the vector form is TwoSumErr in eft-inl.h).
// Plain C++, no SIMD types.
#ifndef SOFTDOT_SRC_KERNELS_TWO_SUM_H_
#define SOFTDOT_SRC_KERNELS_TWO_SUM_H_

namespace softdot::detail {

// An unevaluated sum hi + lo.
template <class T>
struct TwoSumResult {
  T hi;
  T lo;
};

// a + b = hi + lo exactly, hi = fl(a + b) (Knuth's TwoSum: 6 operations, no
// branch, no condition on |a| and |b|). T is float, double or long double.
template <class T>
inline TwoSumResult<T> two_sum(T a, T b) {
  const T s = a + b;
  const T bb = s - a;
  return {s, (a - (s - bb)) + (b - bb)};
}

// A compensated running sum: hi += x rounded, its exact error added to lo.
template <class T>
inline void add_compensated(T& hi, T& lo, T x) {
  const TwoSumResult<T> t = two_sum(hi, x);
  lo += t.lo;
  hi = t.hi;
}

}  // namespace softdot::detail

#endif  // SOFTDOT_SRC_KERNELS_TWO_SUM_H_
