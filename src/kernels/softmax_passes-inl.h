// softdot kernels: the passes of a softmax row in the element type (the fast
// precision, log_softmax, the state and apply): pass B (the compensated sum
// of the exponentials), the double-length reciprocal and log of the sum, and
// pass C (normalise, apply, log).

#if defined(SOFTDOT_KERNELS_SOFTMAX_PASSES_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SOFTDOT_KERNELS_SOFTMAX_PASSES_INL_H_
#undef SOFTDOT_KERNELS_SOFTMAX_PASSES_INL_H_
#else
#define SOFTDOT_KERNELS_SOFTMAX_PASSES_INL_H_
#endif

#include "kernels/softmax_common-inl.h"

HWY_BEFORE_NAMESPACE();
namespace softdot {
namespace HWY_NAMESPACE {

// Pass B: sum of exp(p_i - m) as hi + lo; stores the exponentials to y when
// kStore.
template <bool kStore, class T, class S>
HWY_INLINE void SumExpPass(const S& scores, const T* x,
                           const std::uint8_t* mask, std::size_t n, T m, T* y,
                           double& sum_hi, double& sum_lo) {
  using B = Block<T>;
  using V = typename B::V;
  const typename B::D d;
  const V mv = hn::Set(d, m);
  // A softmax (kStore) starts every lane sum at 1: then s >= 1 >= e, so
  // Fast2Sum (2 operations) gives the exact error where TwoSum took 5, and
  // the 1 per lane is taken off in double, exactly, at the end.
  constexpr T kBias = kStore ? T(1) : T(0);
  V s[B::kVecs], c[B::kVecs];
  for (std::size_t v = 0; v < B::kVecs; ++v) {
    s[v] = hn::Set(d, kBias);
    c[v] = hn::Zero(d);
  }
  ForEachBlock<T>(x, mask, kStore ? y : nullptr, n,
                  -std::numeric_limits<T>::infinity(),
                  [&](const T* xb, const std::uint8_t* mb, T* yb) HWY_ATTR {
                    for (std::size_t v = 0; v < B::kVecs; ++v) {
                      V p, lo;
                      scores.Load(xb, mb, v, p, lo);
                      const V e = ShiftedExp(p, lo, mv);
                      const V t = hn::Add(s[v], e);
                      if constexpr (kStore) {
                        hn::StoreU(e, d, yb + v * B::kVecLanes);
                        c[v] = hn::Add(c[v], hn::Sub(e, hn::Sub(t, s[v])));
                      } else {
                        c[v] = hn::Add(c[v], TwoSumErr(s[v], e, t));
                      }
                      s[v] = t;
                    }
                  });
  if constexpr (kStore && sizeof(T) == 8) {
    for (std::size_t v = 0; v < B::kVecs; ++v) {
      s[v] = hn::Sub(s[v], hn::Set(d, kBias));  // exact: s in [1, 2^53]
    }
  }
  // A float softmax (kStore) only needs S to 2^-40 (SumLanes in
  // softmax_common-inl.h says why); the others read S - 1, and a double
  // weight (ulp 2^-53) needs S to about 2^-60.
  // (A float lane's bias comes off in double there: s may pass 2^24.)
  SumLanes<T, !kStore || sizeof(T) == 8>(s, c, sum_hi, sum_lo,
                                         sizeof(T) == 4 ? double{kBias} : 0.0);
}

// 1/S as an unevaluated pair of T, accurate to about 2^-2p.
template <class T>
HWY_INLINE void Reciprocal(double s_hi, double s_lo, T& hi, T& lo) {
  if constexpr (sizeof(T) == 4) {
    const double inv = 1.0 / (s_hi + s_lo);
    hi = static_cast<float>(inv);
    lo = static_cast<float>(inv - static_cast<double>(hi));
  } else {
    hi = 1.0 / s_hi;
    const double r = std::fma(-s_hi, hi, 1.0) - s_lo * hi;
    lo = r * hi;
  }
}

// log S as an unevaluated pair of T. S >= 1 (the max contributes exp(0) = 1
// exactly), so log S = log1p(S - 1) with S - 1 formed exactly: when one score
// dominates, S - 1 is tiny and log(S) directly would lose all of its digits
// (measured before this: 70 ulp for double log_softmax at n = 10, sigma = 10).
template <class T>
HWY_INLINE void Log(double s_hi, double s_lo, T& hi, T& lo) {
  if constexpr (sizeof(T) == 4) {
    const double l = std::log1p((s_hi - 1.0) + s_lo);
    hi = static_cast<float>(l);
    lo = static_cast<float>(l - static_cast<double>(hi));
  } else {
    const long double l =
        std::log1p(static_cast<long double>(s_hi - 1.0) + s_lo);
    hi = static_cast<double>(l);
    lo = static_cast<double>(l - static_cast<long double>(hi));
  }
}

// e * (1/S) with 1/S = h + l (double length): one rounding, not the two of
// e * fl(1/S).
template <class V>
HWY_INLINE V TimesReciprocal(V e, V h, V l) {
  return hn::MulAdd(e, h, hn::Mul(e, l));
}

// y_i = exp(p_i - m) * (1/S) (recomputed) for kApply.
template <class T, class S>
HWY_INLINE void ApplyPass(const S& scores, const T* x, const std::uint8_t* mask,
                          std::size_t n, T m, T inv_hi, T inv_lo, T* y) {
  using B = Block<T>;
  using V = typename B::V;
  const typename B::D d;
  const V mv = hn::Set(d, m), h = hn::Set(d, inv_hi), l = hn::Set(d, inv_lo);
  ForEachBlock<T>(x, mask, y, n, -std::numeric_limits<T>::infinity(),
                  [&](const T* xb, const std::uint8_t* mb, T* yb) HWY_ATTR {
                    for (std::size_t v = 0; v < B::kVecs; ++v) {
                      V p, lo;
                      scores.Load(xb, mb, v, p, lo);
                      const V e = ShiftedExp(p, lo, mv);
                      hn::StoreU(TimesReciprocal(e, h, l), d,
                                 yb + v * B::kVecLanes);
                    }
                  });
}

// y_i = e_i * (1/S), in place over the stored exponentials.
template <class T>
HWY_INLINE void NormalizePass(std::size_t n, T inv_hi, T inv_lo, T* y) {
  using B = Block<T>;
  using V = typename B::V;
  const typename B::D d;
  const V h = hn::Set(d, inv_hi), l = hn::Set(d, inv_lo);
  ForEachBlock<T>(y, nullptr, y, n, T{0},
                  [&](const T* eb, const std::uint8_t*, T* yb) HWY_ATTR {
                    for (std::size_t v = 0; v < B::kVecs; ++v) {
                      const V e = hn::LoadU(d, eb + v * B::kVecLanes);
                      hn::StoreU(TimesReciprocal(e, h, l), d,
                                 yb + v * B::kVecLanes);
                    }
                  });
}

// y_i = (p_i - m) - L, with the error of p_i - m and the low part of L kept.
template <class T, class S>
HWY_INLINE void LogPass(const S& scores, const T* x, const std::uint8_t* mask,
                        std::size_t n, T m, T l_hi, T l_lo, T* y) {
  using B = Block<T>;
  using V = typename B::V;
  const typename B::D d;
  const V mv = hn::Set(d, m), lh = hn::Set(d, l_hi), ll = hn::Set(d, l_lo);
  const V neg_inf = hn::Set(d, -std::numeric_limits<T>::infinity());
  ForEachBlock<T>(
      x, mask, y, n, -std::numeric_limits<T>::infinity(),
      [&](const T* xb, const std::uint8_t* mb, T* yb) HWY_ATTR {
        for (std::size_t v = 0; v < B::kVecs; ++v) {
          V p, lo;
          scores.Load(xb, mb, v, p, lo);
          const V t = hn::Sub(p, mv);
          const V c = hn::Add(TwoSumErr(p, hn::Neg(mv), t), lo);
          const V u = hn::Sub(t, lh);
          const V ue = TwoSumErr(t, hn::Neg(lh), u);
          const V out = hn::Add(u, hn::Sub(hn::Add(ue, c), ll));
          // A log-weight is <= 0. The low part of a scaled score
          // (in c) can exceed what the rounded sum kept of it, so
          // the top score of a row could come out a few 2^-60
          // above 0 (a single-entry row at temperature 1.1 gave
          // +1.8e-17); NaN is kept (NaN > 0 is false).
          const V capped =
              hn::IfThenElse(hn::Gt(out, hn::Zero(d)), hn::Zero(d), out);
          hn::StoreU(hn::IfThenElse(hn::Eq(t, neg_inf), neg_inf, capped), d,
                     yb + v * B::kVecLanes);
        }
      });
}

}  // namespace HWY_NAMESPACE
}  // namespace softdot
HWY_AFTER_NAMESPACE();

#endif  // SOFTDOT_KERNELS_SOFTMAX_PASSES_INL_H_
