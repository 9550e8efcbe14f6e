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
// Error of the fast precision (float): exp ~0.6 ulp (exp-inl.h), the sum
// compensated per lane and added in double, the normalisation one rounding
// of e * (1/S) with a double-length 1/S; measured 1.55 ulp in all
// (docs/accuracy.md). The faithful precision (softmax_faithful-inl.h)
// replaces B and C with passes that carry exp as a float pair (float rows
// on AVX2/AVX-512) or evaluate it in double lanes (float otherwise) or as a
// double-length pair (double). Every lane sum is reduced in
// the pairwise tree of reduce.h, whose order is fixed by the lane index, so
// results do not depend on the SIMD width (FMA targets). No
// allocation: the partial last block uses a 64-byte stack buffer.
//
// The parts: softmax_common-inl.h (scores, pass A, lane sums, special
// rows), softmax_passes-inl.h (passes B and C in the element type),
// softmax_faithful-inl.h (the faithful precision), softmax_small-inl.h (one
// block in registers); this file chooses among them per row (RowImpl) and
// holds the entry points the dispatch table exports.

#if defined(SOFTDOT_KERNELS_SOFTMAX_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SOFTDOT_KERNELS_SOFTMAX_INL_H_
#undef SOFTDOT_KERNELS_SOFTMAX_INL_H_
#else
#define SOFTDOT_KERNELS_SOFTMAX_INL_H_
#endif

#include "kernels/softmax_common-inl.h"
#include "kernels/softmax_faithful-inl.h"
#include "kernels/softmax_passes-inl.h"
#include "kernels/softmax_small-inl.h"

HWY_BEFORE_NAMESPACE();
namespace softdot {
namespace HWY_NAMESPACE {

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