// softdot kernels: the pairwise tree of reduce.h (the order, why it does not
// depend on the target, its error) on SIMD registers. Lane types: float,
// double. Leaves held in vectors v[0..kVecs) are leaf i in lane i % L of
// vector i / L (L lanes per vector), as a block's lanes are.
//   PairwiseReduce<n>(leaf, add)       the order, over any leaves and add
//   TreeSumOfLanes(d, v)               the levels inside one vector
//   PairwiseSumOfVecs<kVecs>(d, v)     the sum of the leaves in v
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
#include <type_traits>
#include <utility>

#include "hwy/highway.h"
#include "kernels/block-inl.h"
#include "kernels/eft-inl.h"
#include "kernels/reduce.h"

HWY_BEFORE_NAMESPACE();
namespace softdot {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <std::size_t kJ>
using LeafIndex = std::integral_constant<std::size_t, kJ>;

template <std::size_t kLeaves, class Leaf, class Add, std::size_t... kJ,
          std::size_t... kAt>
HWY_INLINE auto PairwiseReduceSteps(const Leaf& leaf, const Add& add,
                                    std::index_sequence<kJ...>,
                                    std::index_sequence<kAt...>) {
  constexpr std::size_t kHalf = kLeaves / 2;
  using T = decltype(leaf(LeafIndex<0>()));
  T part[] = {add(leaf(LeafIndex<kJ>()), leaf(LeafIndex<kJ + kHalf>()))...};
  [[maybe_unused]] constexpr std::array<detail::TreeStep, kHalf - 1> kOrder =
      detail::PairwiseOrder<kHalf, /*kDescending=*/true>();
  ((part[kOrder[kAt].to] = add(part[kOrder[kAt].to], part[kOrder[kAt].from])),
   ...);
  return part[0];
}

// The sum of the kLeaves leaves leaf(j) (j a LeafIndex) by the tree, each
// addition add(a, b): the first level reads the leaves as it adds them
// (leaf j + kLeaves/2 into leaf j, j up from 0), the later levels add the
// partial sums, j down from half - 1 within a level. That is the order
// GCC 12 gave the spelled-out reduction of the dot's 8 accumulators this
// replaces (a04, a15, a26, a37, then (a04 + a26) + (a15 + a37), the right
// operand first), and the order decides its register allocation: with the
// later levels going up, DotsF32 on AVX2 kept one more accumulator on the
// stack (BM_dots/4: 41.7 -> 43.1 ns); with every level going down, the AVX3
// code changed too. Folds over constant indices, not loops: a loop can
// leave the leaves in memory (see detail::PairwiseSum). Compiled for this
// target, so that an add that is target code is inlined (GCC does not
// inline target code into a function compiled without the target, as
// reduce.h's are).
template <std::size_t kLeaves, class Leaf, class Add>
HWY_INLINE auto PairwiseReduce(const Leaf& leaf, const Add& add) {
  static_assert(kLeaves != 0 && (kLeaves & (kLeaves - 1)) == 0,
                "the pairwise tree takes a power of 2 of leaves");
  if constexpr (kLeaves == 1) {
    (void)add;
    return leaf(LeafIndex<0>());
  } else {
    return PairwiseReduceSteps<kLeaves>(
        leaf, add, std::make_index_sequence<kLeaves / 2>(),
        std::make_index_sequence<kLeaves / 2 - 1>());
  }
}

// The plain addition of two vectors of leaves, lane by lane.
struct AddVecs {
  template <class V>
  HWY_INLINE V operator()(V a, V b) const {
    return hn::Add(a, b);
  }
};

// Double-double leaves: a lane sum and its compensation.
template <class V>
struct TwoSumLeaf {
  V hi;
  V lo;
};

// The addition of double-double leaves a + b: the low parts added plainly,
// the high parts with TwoSum, whose exact error goes into the low part.
// The order of these operations is part of the result's bits
// (tests/unit/golden_test.cc).
struct AddTwoSum {
  template <class V>
  HWY_INLINE TwoSumLeaf<V> operator()(TwoSumLeaf<V> a, TwoSumLeaf<V> b) const {
    const V lo = hn::Add(a.lo, b.lo);
    const V hi = hn::Add(a.hi, b.hi);
    return {hi, hn::Add(lo, TwoSumErr(a.hi, b.hi, hi))};
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
  } else if constexpr (hn::MaxLanes(D()) == 2 && sizeof(hn::TFromD<D>) == 4) {
    // The last level of a float vector: lane 0 of v + DupOdd(v) is v0 + v1,
    // the same addition, where UpperHalf of a 64-bit vector took a masked
    // move and an integer shift (each with an FP/integer bypass) on the
    // critical path of every short dot.
    (void)d;
    return hn::GetLane(hn::Add(v, hn::DupOdd(v)));
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
HWY_INLINE void TwoSumOfLanes(D d, TwoSumLeaf<hn::Vec<D>> v, hn::TFromD<D>& hi0,
                              hn::TFromD<D>& lo0) {
#if HWY_TARGET == HWY_SCALAR
  (void)d;
  hi0 = hn::GetLane(v.hi);
  lo0 = hn::GetLane(v.lo);
#else
  if constexpr (hn::MaxLanes(D()) == 1) {
    (void)d;
    hi0 = hn::GetLane(v.hi);
    lo0 = hn::GetLane(v.lo);
  } else {
    const hn::Half<D> dh;
    using VH = hn::Vec<decltype(dh)>;
    const TwoSumLeaf<VH> lower{hn::LowerHalf(dh, v.hi),
                               hn::LowerHalf(dh, v.lo)};
    const TwoSumLeaf<VH> upper{hn::UpperHalf(dh, v.hi),
                               hn::UpperHalf(dh, v.lo)};
    TwoSumOfLanes(dh, AddTwoSum()(lower, upper), hi0, lo0);
  }
#endif
}

// The sum of the kVecs * L leaves held in v[0..kVecs) (leaf i in lane i % L
// of vector i / L, L = MaxLanes(d)) by the tree: the levels half >= L add
// whole vectors, the rest is TreeSumOfLanes on the vector they leave
// (reduce.h derives why that is the same tree for every L).
template <std::size_t kVecs, class D>
HWY_INLINE hn::TFromD<D> PairwiseSumOfVecs(D d, const hn::Vec<D>* v) {
  return TreeSumOfLanes(
      d,
      PairwiseReduce<kVecs>([v](auto j) HWY_ATTR { return v[j]; }, AddVecs()));
}

// The kLanes logical lanes of one block (its kVecs vectors), by the tree:
// the same bits on every vector width.
template <class T>
HWY_INLINE T ReduceBlockTree(const typename Block<T>::V* acc) {
  using B = Block<T>;
  return PairwiseSumOfVecs<B::kVecs>(typename B::D(), acc);
}

// The double-double leaves hi + lo held in kVecs vectors each (laid out as
// in PairwiseSumOfVecs) added by the tree, with AddTwoSum for every
// addition, and the total renormalised (Fast2Sum) into sum_hi + sum_lo.
// The additions of one level are independent, so the 16 lanes of a float
// block cost 4 TwoSum latencies, where a running TwoSum over the lanes cost
// 32 and dominated small rows (a 3-element softmax took 124 ns).
template <std::size_t kVecs, class D>
HWY_INLINE void PairwiseTwoSumOfVecs(D d, const hn::Vec<D>* hi,
                                     const hn::Vec<D>* lo, double& sum_hi,
                                     double& sum_lo) {
  using V = hn::Vec<D>;
  const TwoSumLeaf<V> total = PairwiseReduce<kVecs>(
      [hi, lo](auto j) HWY_ATTR {
        return TwoSumLeaf<V>{hi[j], lo[j]};
      },
      AddTwoSum());
  double hi0, lo0;
  TwoSumOfLanes(d, total, hi0, lo0);
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
