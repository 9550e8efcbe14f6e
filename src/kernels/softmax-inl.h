// softdot kernels: one softmax-family row, all special values included.
//
// Lane types: float, double. Passes over the row (x, mask, scale):
//   A  max and "any NaN" of the scores p_i = x_i * scale (masked -> -inf);
//      the fast softmax leaves the NaN test to pass B's sum;
//   B  e_i = exp(p_i - m) with the exact error of p_i - m (TwoSum, plus the
//      exact low part of x_i * scale when scaled) folded in, summed per lane
//      with compensation (Fast2Sum from a lane sum that starts at 1 for the
//      softmax, which stores e_i; TwoSum for the state and log_softmax);
//   C  softmax: y_i = e_i * (1/S) with a double-length reciprocal, one
//      rounding (fma(e, hi, e * lo)); log_softmax: y_i = (p_i - m) - log S
//      with both subtractions carried in double length; apply: recompute e_i
//      against the given state.
// Error (float, measured against MPFR, see docs/accuracy.md): exp ~0.6 ulp,
// sum ~2^-45 relative, normalisation 0.5 ulp. The faithful precision (below)
// replaces B and C with double-lane passes. Every lane sum is reduced in a
// fixed order, so results do not depend on the SIMD width (FMA targets).
// No allocation: the partial last block uses a 64-byte stack buffer.

#if defined(SOFTDOT_KERNELS_SOFTMAX_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SOFTDOT_KERNELS_SOFTMAX_INL_H_
#undef SOFTDOT_KERNELS_SOFTMAX_INL_H_
#else
#define SOFTDOT_KERNELS_SOFTMAX_INL_H_
#endif

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "hwy/highway.h"
#include "kernels/block-inl.h"
#include "kernels/eft-inl.h"
#include "kernels/exp-inl.h"
#include "kernels/exp_wide-inl.h"
#include "kernels/row_op.h"

HWY_BEFORE_NAMESPACE();
namespace softdot {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The scores of a row: p = x * scale (and its exact low part), -inf where the
// mask says so.
template <class T, bool kMasked, bool kScaled>
struct Scores {
  using B = Block<T>;
  using D = typename B::D;
  using V = typename B::V;

  T scale;

  HWY_INLINE void Load(const T* HWY_RESTRICT x, const std::uint8_t* mask,
                       std::size_t v, V& p, V& lo) const {
    const D d;
    const V xv = hn::LoadU(d, x + v * B::kVecLanes);
    if constexpr (kScaled) {
      const V s = hn::Set(d, scale);
      p = hn::Mul(xv, s);
      lo = ProductLow(xv, s, p);
    } else {
      p = xv;
      lo = hn::Zero(d);
    }
    if constexpr (kMasked) {
      const auto keep = LoadKeep(d, mask + v * B::kVecLanes);
      p = hn::IfThenElse(keep, p,
                         hn::Set(d, -std::numeric_limits<T>::infinity()));
      lo = hn::IfThenElseZero(keep, lo);
    }
  }

  HWY_INLINE T ScalarScore(const T* x, const std::uint8_t* mask,
                           std::size_t i) const {
    if (kMasked && mask[i] == 0) return -std::numeric_limits<T>::infinity();
    return kScaled ? x[i] * scale : x[i];
  }
};

// Pass A: max of the scores, and whether any (unmasked) score is NaN.
// Four independent chains of Max: one chain waits 4 cycles (Max latency) per
// block and would run at 1/8 of the two loads per cycle that L1 can feed.
// Max is exact, so the split changes no result.
// Without kTrackNaN the NaN test (3 of the 4 operations per vector) is left
// to the caller, who then reads NaN from the sum of the exponentials (the
// fast exp propagates NaN) or scans the row; the max is then unspecified
// when a NaN is present.
template <class T, bool kTrackNaN = true, class S>
HWY_INLINE T MaxPass(const S& scores, const T* x, const std::uint8_t* mask,
                     std::size_t n, bool& any_nan) {
  using B = Block<T>;
  using V = typename B::V;
  const typename B::D d;
  constexpr std::size_t kChains = 4;
  const T kNegInf = -std::numeric_limits<T>::infinity();
  V mx[kChains][B::kVecs];
  for (auto& chain : mx) {
    for (auto& v : chain) v = hn::Set(d, kNegInf);
  }
  V bad = hn::Zero(d);
  const auto block = [&](const T* xb, const std::uint8_t* mb,
                         V* chain) HWY_ATTR {
    for (std::size_t v = 0; v < B::kVecs; ++v) {
      V p, lo;
      scores.Load(xb, mb, v, p, lo);
      chain[v] = hn::Max(chain[v], p);
      if constexpr (kTrackNaN) {
        bad = hn::Or(bad, hn::VecFromMask(d, hn::IsNaN(p)));
      }
    }
  };
  std::size_t i = 0;
  for (; i + kChains * B::kLanes <= n; i += kChains * B::kLanes) {
    for (std::size_t c = 0; c < kChains; ++c) {
      const std::size_t at = i + c * B::kLanes;
      block(x + at, mask ? mask + at : nullptr, mx[c]);
    }
  }
  ForEachBlock<T>(x + i, mask ? mask + i : nullptr, nullptr, n - i, kNegInf,
                  [&](const T* xb, const std::uint8_t* mb, T*)
                      HWY_ATTR { block(xb, mb, mx[0]); });
  for (std::size_t c = 1; c < kChains; ++c) {
    for (std::size_t v = 0; v < B::kVecs; ++v) {
      mx[0][v] = hn::Max(mx[0][v], mx[c][v]);
    }
  }
  for (std::size_t v = 1; v < B::kVecs; ++v)
    mx[0][0] = hn::Max(mx[0][0], mx[0][v]);
  any_nan = !hn::AllFalse(d, hn::MaskFromVec(bad));
  return hn::GetLane(hn::MaxOfLanes(d, mx[0][0]));
}

// exp(p - m) with the exact error of the subtraction (and lo) folded in.
template <class V>
HWY_INLINE V ShiftedExp(V p, V lo, V m) {
  const typename hn::DFromV<V> d;
  const V t = hn::Sub(p, m);
  const V c = hn::Add(TwoSumErr(p, hn::Neg(m), t), lo);
  return ExpNonPositive(d, t, c);
}

// Adds the kLanes lanes of s + c (per-lane sums and their compensations) in
// a pairwise tree of double-double additions: the pairs of one level are
// independent, so this costs 4 TwoSum latencies, where a running TwoSum over
// the lanes cost 32 and dominated small rows (a 3-element softmax took
// 124 ns).
HWY_INLINE void SumTree(double* hi, double* lo, std::size_t lanes,
                        double& sum_hi, double& sum_lo) {
  for (std::size_t half = lanes / 2; half >= 1; half /= 2) {
    for (std::size_t j = 0; j < half; ++j) {
      const double t = hi[j] + hi[j + half];
      const double bb = t - hi[j];
      const double err = (hi[j] - (t - bb)) + (hi[j + half] - bb);
      hi[j] = t;
      lo[j] = lo[j] + lo[j + half] + err;
    }
  }
  sum_hi = hi[0] + lo[0];
  sum_lo = lo[0] - (sum_hi - hi[0]);
}

// The plain form of SumTree, for a softmax's sum, which needs about 2^-40
// relative (its hi + lo are rounded to one double for 1/S anyway): the same
// pairs, plain double additions, 4 add latencies for 16 lanes instead of 4
// TwoSum chains. The state, logsumexp and log_softmax keep SumTree: they
// read the low part of S - 1.
HWY_INLINE double PlainTree(double* v, std::size_t lanes) {
  for (std::size_t half = lanes / 2; half >= 1; half /= 2) {
    for (std::size_t j = 0; j < half; ++j) v[j] += v[j + half];
  }
  return v[0];
}

template <class T, bool kExact, class V>
HWY_INLINE void SumLanes(const V* s, const V* c, double& sum_hi, double& sum_lo,
                         double bias = 0.0) {
  using B = Block<T>;
  const typename B::D d;
  alignas(64) T ls[B::kLanes];
  alignas(64) T lc[B::kLanes];
  for (std::size_t v = 0; v < B::kVecs; ++v) {
    hn::Store(s[v], d, ls + v * B::kVecLanes);
    hn::Store(c[v], d, lc + v * B::kVecLanes);
  }
  double hi[B::kLanes], lo[B::kLanes];
  if constexpr (!kExact) {
    for (std::size_t j = 0; j < B::kLanes; ++j) {
      hi[j] = (static_cast<double>(ls[j]) - bias) + static_cast<double>(lc[j]);
    }
    sum_hi = PlainTree(hi, B::kLanes);
    sum_lo = 0.0;
    return;
  }
  for (std::size_t j = 0; j < B::kLanes; ++j) {
    hi[j] = ls[j];
    lo[j] = lc[j];
  }
  SumTree(hi, lo, B::kLanes, sum_hi, sum_lo);
}

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
  // A float softmax (kStore) only needs S to about 2^-40; the others read
  // S - 1, and a double weight needs S to about 2^-60.
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

template <class T>
HWY_INLINE void Fill(T* y, std::size_t n, T value) {
  for (std::size_t i = 0; i < n; ++i) y[i] = value;
}

// Weights of a row whose max is +inf: each +inf score gets 1/k.
template <class T, class S>
HWY_INLINE std::size_t CountPosInf(const S& scores, const T* x,
                                   const std::uint8_t* mask, std::size_t n) {
  std::size_t k = 0;
  for (std::size_t i = 0; i < n; ++i) {
    k += scores.ScalarScore(x, mask, i) == std::numeric_limits<T>::infinity();
  }
  return k;
}

template <class T, class S>
HWY_INLINE bool AnyNaN(const S& scores, const T* x, const std::uint8_t* mask,
                       std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    if (std::isnan(scores.ScalarScore(x, mask, i))) return true;
  }
  return false;
}

template <class T, class S>
HWY_INLINE void PosInfRow(const S& scores, const T* x, const std::uint8_t* mask,
                          std::size_t n, detail::RowOp op, double count, T* y) {
  const T kInf = std::numeric_limits<T>::infinity();
  const T share = static_cast<T>(1) / static_cast<T>(count);
  const T log_share = T{0} - static_cast<T>(std::log(count));  // +0 for k=1
  for (std::size_t i = 0; i < n; ++i) {
    const bool top = scores.ScalarScore(x, mask, i) == kInf;
    if (op == detail::RowOp::kLogSoftmax) {
      y[i] = top ? log_share : -kInf;
    } else {
      y[i] = top ? share : T{0};
    }
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

// ---------------------------------------------------------------------------
// Precision::kFaithful: the weights are rounded once.
//
// float: every step after the max runs in double lanes. A score is the
// exact product x * scale (24 x 24 bits fit in 53), d = score - c is exact
// or within 2^-53 relative, exp(d) has a relative error below 2^-40
// (ExpForFloat), the sum is plain double (relative error below n 2^-53 /16
// per lane), and y = fl_float(exp(d) * (1/S)) is rounded twice, to double
// and then float: within 0.5 ulp + about 2^-13 ulp.
// double: exp(t + c) as a pair 2^k (hi + lo) (ExpPair, 2^-56), summed with
// TwoSum compensation, then y = 2^k ((hi + lo)(h + l)) with 1/S = h + l
// in double length and one rounding of a value in [0.35, 1.42] (a second
// one, exact unless the weight is subnormal, applies 2^k): within 0.5 ulp +
// about 0.1 ulp.
// Both recompute exp in the last pass rather than storing a rounded one.
// ---------------------------------------------------------------------------

// float scores in double lanes; a float block (16 elements) is kVecs
// double vectors.
template <bool kMasked, bool kScaled>
struct WideScores {
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
HWY_INLINE void WideSumPass(const WS& ws, const float* x,
                            const std::uint8_t* mask, std::size_t n, double c,
                            double& sum_hi, double& sum_lo) {
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
  constexpr std::size_t kLanes = Block<float>::kLanes;
  alignas(64) double hi[kLanes];
  alignas(64) double lo[kLanes];
  for (std::size_t v = 0; v < WS::kVecs; ++v) {
    hn::Store(acc[v], d, hi + v * WS::kVecLanes);
    hn::Store(comp[v], d, lo + v * WS::kVecLanes);
  }
  if constexpr (!kCompensated) {
    sum_hi = PlainTree(hi, kLanes);
    sum_lo = 0.0;
    return;
  }
  SumTree(hi, lo, kLanes, sum_hi, sum_lo);
}

// y_i = fl_float(exp(p_i - c) * inv).
template <class WS>
HWY_INLINE void WideApplyPass(const WS& ws, const float* x,
                              const std::uint8_t* mask, std::size_t n, double c,
                              double inv, float* y) {
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
  alignas(64) double hs[B::kLanes], hc[B::kLanes], ls[B::kLanes], lc[B::kLanes];
  for (std::size_t v = 0; v < B::kVecs; ++v) {
    hn::Store(s[v], d, hs + v * B::kVecLanes);
    hn::Store(c[v], d, hc + v * B::kVecLanes);
    hn::Store(sl[v], d, ls + v * B::kVecLanes);
    hn::Store(cl[v], d, lc + v * B::kVecLanes);
  }
  double hi[B::kLanes], lo[B::kLanes];
  for (std::size_t j = 0; j < B::kLanes; ++j) {
    hi[j] = hs[j];
    lo[j] = 0.0;
    TwoSumScalar(hi[j], lo[j], ls[j]);
    lo[j] += hc[j] + lc[j];
  }
  SumTree(hi, lo, B::kLanes, sum_hi, sum_lo);
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
    const WideScores<kMasked, kScaled> ws{static_cast<double>(scores.scale)};
    double c = m, inv;
    if (op == RowOp::kApply) {
      inv = 1.0 / (state->sum + state->sum_lo);
    } else {
      if (kScaled && op == RowOp::kSoftmax && std::fabs(m) >= 0x1p32f) {
        c = ExactScaledMax<kMasked>(x, mask, scores.scale, n);
      }
      double sum_hi, sum_lo;
      if (op == RowOp::kState) {
        WideSumPass<true>(ws, x, mask, n, c, sum_hi, sum_lo);
        *state = {c, sum_hi, sum_lo};
        return;
      }
      WideSumPass<false>(ws, x, mask, n, c, sum_hi, sum_lo);
      inv = 1.0 / (sum_hi + sum_lo);
    }
    WideApplyPass(ws, x, mask, n, c, inv, y);
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
  const WideScores<kMasked, kScaled> ws{static_cast<double>(scores.scale)};
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
    double c_hi, c_lo;
    WideSumPass<false>(ws, xc, mc, len, m, c_hi, c_lo);
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
    TwoSumScalar(s_hi, s_lo, c_hi);
    s_lo += c_lo;
  }
  if (big_m == -std::numeric_limits<double>::infinity()) {
    Fill(y, n, 0.0f);
  } else {
    WideApplyPass(ws, x, mask, n, big_m, 1.0 / (s_hi + s_lo), y);
  }
  return true;
}

// softmax of a float row of at most one block (16 elements), in registers:
// the partial block is loaded once and the exponentials are kept, where
// passes A, B and C each reload the block (and the faithful C recomputes
// exp). Every value is computed as in those passes (one element per lane,
// so each lane sum is its one exponential, added by the same PlainTree), so
// the weights have the same bits. Returns false, having written nothing,
// for rows whose max is NaN-tainted or +-inf (RowImpl handles them) and for
// scaled scores beyond 2^32.
template <bool kMasked, bool kScaled>
HWY_INLINE bool SingleBlockSoftmaxF32(
    const Scores<float, kMasked, kScaled>& scores, const float* x,
    const std::uint8_t* mask, std::size_t n, bool faithful, float* y) {
  using B = Block<float>;
  using V = typename B::V;
  const typename B::D d;
  constexpr std::size_t kLanes = B::kLanes;
  alignas(64) float xb[kLanes];
  alignas(64) float yb[kLanes];
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
  if (faithful) {
    if (kScaled && std::fabs(m) >= 0x1p32f) return false;
    using WS = WideScores<kMasked, kScaled>;
    using DW = typename WS::DW;
    const DW dw;
    const hn::Rebind<float, DW> df;
    const WS ws{static_cast<double>(scores.scale)};
    const auto cv = hn::Set(dw, static_cast<double>(m));
    hn::Vec<DW> e[WS::kVecs];
    alignas(64) double lanes[kLanes];
    for (std::size_t v = 0; v < WS::kVecs; ++v) {
      e[v] =
          ExpForFloat(dw, hn::Sub(ws.Load(xb, kMasked ? mb : nullptr, v), cv));
      hn::Store(e[v], dw, lanes + v * WS::kVecLanes);
    }
    const auto iv = hn::Set(dw, 1.0 / PlainTree(lanes, kLanes));
    for (std::size_t v = 0; v < WS::kVecs; ++v) {
      hn::StoreU(hn::DemoteTo(df, hn::Mul(e[v], iv)), df,
                 yb + v * WS::kVecLanes);
    }
  } else {
    const V mv = hn::Set(d, m), one = hn::Set(d, 1.0f);
    V e[B::kVecs], s[B::kVecs], c[B::kVecs];
    for (std::size_t v = 0; v < B::kVecs; ++v) {
      e[v] = ShiftedExp(p[v], lo[v], mv);
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
      hn::Store(TimesReciprocal(e[v], hv, lv), d, yb + v * B::kVecLanes);
    }
  }
  StorePartialBlock(yb, n, y);
  return true;
}

template <class T, bool kMasked, bool kScaled>
HWY_INLINE void RowImpl(const T* x, const std::uint8_t* mask, T scale,
                        std::size_t n, detail::RowOp op, bool faithful, T* y,
                        detail::RowState* state) {
  using detail::RowOp;
  const Scores<T, kMasked, kScaled> scores{scale};
  const T kInf = std::numeric_limits<T>::infinity();
  const T kNaN = std::numeric_limits<T>::quiet_NaN();
  if constexpr (sizeof(T) == 4) {
    if (op == RowOp::kSoftmax && n <= Block<float>::kLanes &&
        SingleBlockSoftmaxF32(scores, x, mask, n, faithful, y)) {
      return;
    }
    if (op == RowOp::kSoftmax && n >= kChunkedMinFloat && faithful &&
        ChunkedSoftmaxF32(scores, x, mask, n, y)) {
      return;
    }
  }

  // The fast softmax reads NaN from its sum (NaN in, NaN out through the
  // fast exp and the sum) and, for the rows that never reach the sum (max
  // +-inf), from a scan; everything else tests it in pass A.
  const bool nan_from_sum = op == RowOp::kSoftmax && !faithful;
  bool any_nan = false;
  const T m = nan_from_sum ? MaxPass<T, false>(scores, x, mask, n, any_nan)
                           : MaxPass<T>(scores, x, mask, n, any_nan);
  if (nan_from_sum && (m == -kInf || m == kInf)) {
    any_nan = AnyNaN<T>(scores, x, mask, n);
  }

  if (op == RowOp::kApply) {
    const T total_max = static_cast<T>(state->max);
    const double total_sum = state->sum;
    if (any_nan || std::isnan(total_max) || std::isnan(total_sum)) {
      Fill(y, n, kNaN);
    } else if (total_max == -kInf) {
      Fill(y, n, T{0});
    } else if (total_max == kInf) {
      PosInfRow<T>(scores, x, mask, n, op, total_sum, y);
    } else if (faithful) {
      FaithfulRow<T>(scores, x, mask, n, op, total_max, y, state);
    } else {
      T hi, lo;
      Reciprocal<T>(total_sum, state->sum_lo, hi, lo);
      ApplyPass<T>(scores, x, mask, n, total_max, hi, lo, y);
    }
    return;
  }

  if (any_nan) {
    if (op == RowOp::kState) {
      *state = {kNaN, std::numeric_limits<double>::quiet_NaN(), 0.0};
    } else {
      Fill(y, n, kNaN);
    }
    return;
  }
  if (m == -kInf) {  // empty, fully masked or all -inf
    if (op == RowOp::kState) {
      *state = {-kInf, 0.0, 0.0};
    } else {
      Fill(y, n, op == RowOp::kSoftmax ? T{0} : -kInf);
    }
    return;
  }
  if (m == kInf) {
    const double k = static_cast<double>(CountPosInf<T>(scores, x, mask, n));
    if (op == RowOp::kState) {
      *state = {kInf, k, 0.0};
    } else {
      PosInfRow<T>(scores, x, mask, n, op, k, y);
    }
    return;
  }

  if (faithful && op != RowOp::kLogSoftmax) {
    FaithfulRow<T>(scores, x, mask, n, op, m, y, state);
    return;
  }
  double s_hi, s_lo;
  if (op == RowOp::kSoftmax) {
    SumExpPass<true, T>(scores, x, mask, n, m, y, s_hi, s_lo);
    if (std::isnan(s_hi)) {  // a NaN score (nan_from_sum)
      Fill(y, n, kNaN);
      return;
    }
    T hi, lo;
    Reciprocal<T>(s_hi, s_lo, hi, lo);
    NormalizePass<T>(n, hi, lo, y);
  } else {
    SumExpPass<false, T>(scores, x, mask, n, m, nullptr, s_hi, s_lo);
    if (op == RowOp::kState) {
      *state = {static_cast<double>(m), s_hi, s_lo};
    } else {
      T hi, lo;
      Log<T>(s_hi, s_lo, hi, lo);
      LogPass<T>(scores, x, mask, n, m, hi, lo, y);
    }
  }
}

template <class T>
HWY_INLINE void Row(const T* x, const std::uint8_t* mask, T scale,
                    std::size_t n, detail::RowOp o, bool faithful, T* y,
                    detail::RowState* state) {
  const bool scaled = scale != T{1};
  if (mask) {
    scaled ? RowImpl<T, true, true>(x, mask, scale, n, o, faithful, y, state)
           : RowImpl<T, true, false>(x, mask, scale, n, o, faithful, y, state);
  } else {
    scaled ? RowImpl<T, false, true>(x, mask, scale, n, o, faithful, y, state)
           : RowImpl<T, false, false>(x, mask, scale, n, o, faithful, y, state);
  }
}

HWY_NOINLINE void SoftmaxRowF32(const float* x, const std::uint8_t* mask,
                                float scale, std::size_t n, detail::RowOp op,
                                bool faithful, float* y,
                                detail::RowState* state) {
  Row<float>(x, mask, scale, n, op, faithful, y, state);
}
HWY_NOINLINE void SoftmaxRowF64(const double* x, const std::uint8_t* mask,
                                double scale, std::size_t n, detail::RowOp op,
                                bool faithful, double* y,
                                detail::RowState* state) {
  Row<double>(x, mask, scale, n, op, faithful, y, state);
}

}  // namespace HWY_NAMESPACE
}  // namespace softdot
HWY_AFTER_NAMESPACE();

#endif  // SOFTDOT_KERNELS_SOFTMAX_INL_H_
