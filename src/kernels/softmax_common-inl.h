// softdot kernels: what every softmax path shares (src/kernels/softmax-inl.h
// has the overview): the scores of a row (scaled, masked, with the exact low
// part of the product), pass A (max and NaN), the shifted exp, the lane sums
// of a block (in the tree of reduce-inl.h), and the rows with +inf or NaN
// scores.

#if defined(SOFTDOT_KERNELS_SOFTMAX_COMMON_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SOFTDOT_KERNELS_SOFTMAX_COMMON_INL_H_
#undef SOFTDOT_KERNELS_SOFTMAX_COMMON_INL_H_
#else
#define SOFTDOT_KERNELS_SOFTMAX_COMMON_INL_H_
#endif

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "hwy/highway.h"
#include "kernels/block-inl.h"
#include "kernels/eft-inl.h"
#include "kernels/exp-inl.h"
#include "kernels/exp_faithful-inl.h"
#include "kernels/reduce-inl.h"
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
  static constexpr bool kHasLow = kScaled;  // Load's lo may be nonzero

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

// The kLanes lane sums s (and their compensations c) of a block, in
// double, as one double, or as hi + lo with kExact: the tree of reduce.h
// over the lanes. Plain additions serve a softmax's sum: a float weight
// computed in double with a relative error of 2^-40 (2^-16 of a float ulp)
// and then rounded to float is within 0.5 + 2^-16 ulp, faithful, and the
// plain tree's 4 double additions over 16 lanes err by at most 4 2^-53 <
// 2^-50 relative (positive terms); its hi + lo are rounded to one double for
// 1/S anyway. 4 add latencies for 16 lanes instead of 4 TwoSum chains. The
// state, logsumexp and log_softmax take the double-double tree (kExact):
// they read the low part of S - 1. bias is taken off each lane sum first
// (without kExact only).
template <class T, bool kExact, class V>
HWY_INLINE void SumLanes(const V* s, const V* c, double& sum_hi, double& sum_lo,
                         double bias = 0.0) {
  using BD = Block<double>;
  const typename BD::D dd;
  typename BD::V hi[kDoubleVecs<T>], lo[kDoubleVecs<T>];
  PromoteBlock<T>(s, hi);
  PromoteBlock<T>(c, lo);
  if constexpr (!kExact) {
    const typename BD::V b = hn::Set(dd, bias);
    for (std::size_t w = 0; w < kDoubleVecs<T>; ++w) {
      hi[w] = hn::Add(hn::Sub(hi[w], b), lo[w]);
    }
    sum_hi = PairwiseSumOfVecs<kDoubleVecs<T>>(dd, hi);
    sum_lo = 0.0;
    return;
  }
  PairwiseTwoSumOfVecs<kDoubleVecs<T>>(dd, hi, lo, sum_hi, sum_lo);
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

}  // namespace HWY_NAMESPACE
}  // namespace softdot
HWY_AFTER_NAMESPACE();

#endif  // SOFTDOT_KERNELS_SOFTMAX_COMMON_INL_H_
