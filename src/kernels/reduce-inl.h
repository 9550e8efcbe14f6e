// softdot kernels: the pairwise tree of reduce.h (the order, why it does not
// depend on the target, its error) on SIMD registers. Lane types: float,
// double. Leaves held in vectors v[0..kVecs) are leaf i in lane i % L of
// vector i / L (L lanes per vector), as a block's lanes are.
//   PairwiseTree<n>(step)              the order, for any step(to, from)
//   PairwiseAddVecs<kVecs>(v)          the levels that add whole vectors
//   TreeSumOfLanes(d, v)               the levels inside one vector
//   PairwiseSumOfVecs<kVecs>(d, v)     both: the sum of the leaves
//   ReduceBlockTree<T>(acc)            the sum of one Block<T>'s lanes
//   PairwiseTwoSumOfVecs<kVecs>(d, hi, lo, sum_hi, sum_lo)
//                                      the same tree over double-double
//                                      leaves (a lane sum and its
//                                      compensation), with TwoSum
//   PromoteBlock<T>(v, out)            a block's lanes as double vectors, in
//                                      leaf order (kDoubleVecs<T> of them)

#if defined(SOFTDOT_KERNELS_REDUCE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SOFTDOT_KERNELS_REDUCE_INL_H_
#undef SOFTDOT_KERNELS_REDUCE_INL_H_
#else
#define SOFTDOT_KERNELS_REDUCE_INL_H_
#endif

#include <array>
#include <cstddef>
#include <utility>

#include "hwy/highway.h"
#include "kernels/block-inl.h"
#include "kernels/eft-inl.h"
#include "kernels/reduce.h"

HWY_BEFORE_NAMESPACE();
namespace softdot {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <std::size_t kLeaves, class Step, std::size_t... kAt>
HWY_INLINE void PairwiseTreeSteps(const Step& step,
                                  std::index_sequence<kAt...>) {
  constexpr std::array<detail::TreeStep, kLeaves - 1> kOrder =
      detail::PairwiseOrder<kLeaves>();
  (step(kOrder[kAt].to, kOrder[kAt].from), ...);
}

// Runs the tree over kLeaves leaves: step(to, from) adds leaf `from` into
// leaf `to`, for each step of detail::PairwiseOrder in turn, as a fold with
// constant indices (see detail::PairwiseSum: a loop can leave the leaves in
// memory). Compiled for this target, so that a step that is target code
// (AddStep, TwoSumStep) is always inlined: GCC does not inline target code
// into a function compiled without the target.
template <std::size_t kLeaves, class Step>
HWY_INLINE void PairwiseTree(const Step& step) {
  PairwiseTreeSteps<kLeaves>(step, std::make_index_sequence<kLeaves - 1>());
}

// A step of the plain tree over the vectors v: lane by lane, v[from] is
// added into v[to].
template <class V>
struct AddStep {
  V* v;
  HWY_INLINE void operator()(std::size_t to, std::size_t from) const {
    v[to] = hn::Add(v[to], v[from]);
  }
};

// One addition of double-double leaves, hi + lo (a lane sum and its
// compensation) += h + l: the low parts added plainly, the high parts with
// TwoSum, whose exact error goes into the low part. The order of these
// operations is part of the result's bits (tests/unit/golden_test.cc).
template <class V>
HWY_INLINE void AddTwoSum(V& hi, V& lo, V h, V l) {
  lo = hn::Add(lo, l);
  const V t = hn::Add(hi, h);
  lo = hn::Add(lo, TwoSumErr(hi, h, t));
  hi = t;
}

// A step of the double-double tree over the vectors hi[j] + lo[j].
template <class V>
struct TwoSumStep {
  V* hi;
  V* lo;
  HWY_INLINE void operator()(std::size_t to, std::size_t from) const {
    AddTwoSum(hi[to], lo[to], hi[from], lo[from]);
  }
};

// The levels half < L of the tree, on the L lanes of one vector: lanes
// [L/2, L) onto [0, L/2), then the same on the lower half, down to one lane.
// Half vectors (UpperHalf/LowerHalf) do each level in one add, where storing
// the lanes and adding them as scalars stalled on the store (~20 ns per dot).
template <class D>
HWY_INLINE hn::TFromD<D> TreeSumOfLanes(D d, hn::Vec<D> v) {
#if HWY_TARGET == HWY_SCALAR
  (void)d;
  return hn::GetLane(v);
#else
  if constexpr (hn::MaxLanes(D()) == 1) {
    (void)d;
    return hn::GetLane(v);
  } else {
    const hn::Half<D> dh;
    return TreeSumOfLanes(dh,
                          hn::Add(hn::LowerHalf(dh, v), hn::UpperHalf(dh, v)));
  }
#endif
}

// TreeSumOfLanes for double-double leaves (the same pairs, each added by
// AddTwoSum): lane 0 of hi and lo at the end.
template <class D>
HWY_INLINE void TwoSumOfLanes(D d, hn::Vec<D> hi, hn::Vec<D> lo,
                              hn::TFromD<D>& hi0, hn::TFromD<D>& lo0) {
#if HWY_TARGET == HWY_SCALAR
  (void)d;
  hi0 = hn::GetLane(hi);
  lo0 = hn::GetLane(lo);
#else
  if constexpr (hn::MaxLanes(D()) == 1) {
    (void)d;
    hi0 = hn::GetLane(hi);
    lo0 = hn::GetLane(lo);
  } else {
    const hn::Half<D> dh;
    hn::Vec<decltype(dh)> h = hn::LowerHalf(dh, hi), l = hn::LowerHalf(dh, lo);
    AddTwoSum(h, l, hn::UpperHalf(dh, hi), hn::UpperHalf(dh, lo));
    TwoSumOfLanes(dh, h, l, hi0, lo0);
  }
#endif
}

// The levels of the tree that add whole vectors: the kVecs vectors v, each
// a set of leaves, summed lane by lane by the tree into the vector returned
// (v[0]). Overwrites v.
template <std::size_t kVecs, class V>
HWY_INLINE V PairwiseAddVecs(V* v) {
  PairwiseTree<kVecs>(AddStep<V>{v});
  return v[0];
}

// The sum of the kVecs * L leaves held in v[0..kVecs) (leaf i in lane i % L
// of vector i / L, L = MaxLanes(d)) by the tree: the levels half >= L add
// whole vectors, the rest is TreeSumOfLanes on vector 0 (reduce.h derives
// why that is the same tree for every L). Overwrites v.
template <std::size_t kVecs, class D>
HWY_INLINE hn::TFromD<D> PairwiseSumOfVecs(D d, hn::Vec<D>* v) {
  return TreeSumOfLanes(d, PairwiseAddVecs<kVecs>(v));
}

// The kLanes logical lanes of one block (its kVecs vectors), by the tree:
// the same bits on every vector width.
template <class T>
HWY_INLINE T ReduceBlockTree(const typename Block<T>::V* acc) {
  using B = Block<T>;
  typename B::V v[B::kVecs];
  for (std::size_t i = 0; i < B::kVecs; ++i) v[i] = acc[i];
  return PairwiseSumOfVecs<B::kVecs>(typename B::D(), v);
}

// The double-double leaves hi + lo held in kVecs vectors each (laid out as
// in PairwiseSumOfVecs) added by the tree, with AddTwoSum for every
// addition, and the total renormalised (Fast2Sum) into sum_hi + sum_lo.
// The additions of one level are independent, so the 16 lanes of a float
// block cost 4 TwoSum latencies, where a running TwoSum over the lanes cost
// 32 and dominated small rows (a 3-element softmax took 124 ns). Overwrites
// hi and lo.
template <std::size_t kVecs, class D>
HWY_INLINE void PairwiseTwoSumOfVecs(D d, hn::Vec<D>* hi, hn::Vec<D>* lo,
                                     double& sum_hi, double& sum_lo) {
  PairwiseTree<kVecs>(TwoSumStep<hn::Vec<D>>{hi, lo});
  double hi0, lo0;
  TwoSumOfLanes(d, hi[0], lo[0], hi0, lo0);
  sum_hi = hi0 + lo0;
  sum_lo = lo0 - (sum_hi - hi0);
}

// The kLanes lanes of a block of T (its kVecs vectors) as kDoubleVecs<T>
// vectors of Block<double>, in lane order (leaf i in lane i % L of vector
// i / L, as the trees above take them): a float vector's lower half becomes
// one double vector, its upper half the next; double vectors are copied.
template <class T>
inline constexpr std::size_t kDoubleVecs =
    Block<T>::kLanes / Block<double>::kVecLanes;

template <class T>
HWY_INLINE void PromoteBlock(const typename Block<T>::V* v,
                             typename Block<double>::V* out) {
  using B = Block<T>;
  const typename Block<double>::D dd;
  for (std::size_t w = 0; w < B::kVecs; ++w) {
    if constexpr (sizeof(T) == 8) {
      (void)dd;
      out[w] = v[w];
    } else {
#if HWY_TARGET == HWY_SCALAR
      out[w] = hn::PromoteTo(dd, v[w]);
#else
      const hn::Half<typename B::D> dh;
      static_assert(hn::MaxLanes(dh) == Block<double>::kVecLanes,
                    "half a float vector promotes to one double vector");
      out[2 * w] = hn::PromoteTo(dd, hn::LowerHalf(dh, v[w]));
      out[2 * w + 1] = hn::PromoteTo(dd, hn::UpperHalf(dh, v[w]));
#endif
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace softdot
HWY_AFTER_NAMESPACE();

#endif  // SOFTDOT_KERNELS_REDUCE_INL_H_
