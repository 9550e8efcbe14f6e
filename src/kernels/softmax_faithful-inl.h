// softdot kernels: the faithful precision of a softmax row (each weight
// rounded once): float in double lanes, double as exp pairs, and the chunked
// one-pass max and sum for float rows too large for the caches.

#if defined(SOFTDOT_KERNELS_SOFTMAX_FAITHFUL_INL_H_) == \
    defined(HWY_TARGET_TOGGLE)
#ifdef SOFTDOT_KERNELS_SOFTMAX_FAITHFUL_INL_H_
#undef SOFTDOT_KERNELS_SOFTMAX_FAITHFUL_INL_H_
#else
#define SOFTDOT_KERNELS_SOFTMAX_FAITHFUL_INL_H_
#endif

#include "kernels/softmax_passes-inl.h"

HWY_BEFORE_NAMESPACE();
namespace softdot {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// ---------------------------------------------------------------------------
// Precision::kFaithful: the weights are rounded once.
//
// float: every step after the max runs in double lanes. A score is the
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
  const DoubleLaneScores<kMasked, kScaled> ws{
      static_cast<double>(scores.scale)};
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
    DoubleLaneSumPass<false>(ws, xc, mc, len, m, c_hi, c_lo);
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
    DoubleLaneApplyPass(ws, x, mask, n, big_m, 1.0 / (s_hi + s_lo), y);
  }
  return true;
}

}  // namespace HWY_NAMESPACE
}  // namespace softdot
HWY_AFTER_NAMESPACE();

#endif  // SOFTDOT_KERNELS_SOFTMAX_FAITHFUL_INL_H_
