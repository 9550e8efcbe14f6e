// softdot kernels: the pairwise tree, the one order in which softdot adds a
// fixed set of partial sums (the logical lanes of a block, the 8 dot
// accumulators, the per-lane sums of a softmax row, the 16 chains of a
// decode score). Plain C++ (no SIMD, no Highway), so the scalar pieces that
// must match a kernel bit for bit (small_dot.h) use the same order;
// reduce-inl.h has its SIMD forms.
//
// The tree over n leaves (n a power of 2): at level half = n/2, n/4, ..., 1,
// leaf j + half is added into leaf j for every j < half; leaf 0 then holds
// the sum. Target independence: the order is a function of the leaf index
// and n alone, so it does not depend on how the leaves sit in registers.
// Stored as vectors of L lanes (L a power of 2 dividing n, leaf i in lane
// i % L of vector i / L), a level with half >= L adds vector v + half / L
// into vector v, lane by lane, and a level with half < L (only vector 0 is
// left) adds its lanes [half, 2 half) onto its lanes [0, half): the same
// pairs of leaves for every L, hence the same bits wherever each addition
// rounds alike (one IEEE addition, or one fixed sequence of them).
// Error: every leaf passes through log2 n additions (the tree's depth), so
// for a plain sum the computed total is sum_i x_i (1 + t_i) with
// |t_i| <= gamma_{log2 n} = k u / (1 - k u), k = log2 n (Higham, Accuracy
// and Stability of Numerical Algorithms, 2nd ed., section 4.2, where k is
// ceil(log2 n) for any n): |error| <= gamma_{log2 n} sum_i |x_i|. For a
// block of 16 float lanes k = 4; for the 8 x 16 = 128 lane sums of a float
// dot k = 7.
#ifndef SOFTDOT_KERNELS_REDUCE_H_
#define SOFTDOT_KERNELS_REDUCE_H_

#include <array>
#include <cstddef>
#include <utility>

namespace softdot::detail {

// One addition of the tree: leaf `from` is added into leaf `to`.
struct TreeStep {
  std::size_t to;
  std::size_t from;
};

// The tree's kLeaves - 1 additions, level by level (half = kLeaves/2, ...,
// 1), leaf j + half into leaf j. The additions of one level touch disjoint
// leaves, so their order within the level changes no bit: j runs up from 0,
// or down from half - 1 with kDescending.
template <std::size_t kLeaves, bool kDescending = false>
constexpr std::array<TreeStep, kLeaves - 1> PairwiseOrder() {
  static_assert(kLeaves != 0 && (kLeaves & (kLeaves - 1)) == 0,
                "the pairwise tree takes a power of 2 of leaves");
  std::array<TreeStep, kLeaves - 1> steps{};
  std::size_t at = 0;
  for (std::size_t half = kLeaves / 2; half >= 1; half /= 2) {
    for (std::size_t k = 0; k < half; ++k) {
      const std::size_t j = kDescending ? half - 1 - k : k;
      steps[at++] = {j, j + half};
    }
  }
  return steps;
}

template <std::size_t kLeaves, class T, std::size_t... kAt>
[[gnu::always_inline]] inline T PairwiseSumSteps(T* v,
                                                 std::index_sequence<kAt...>) {
  constexpr std::array<TreeStep, kLeaves - 1> kOrder = PairwiseOrder<kLeaves>();
  ((v[kOrder[kAt].to] = v[kOrder[kAt].to] + v[kOrder[kAt].from]), ...);
  return v[0];
}

// The sum of the scalars v[0..kLeaves) by the tree, with plain additions.
// Overwrites v; returns the sum (leaf 0). The steps are a fold with
// constant indices, not a loop: a loop left small_dot's 8 leaves in memory
// (stored as scalars, reloaded as a vector: BM_dot/3 went from 4.3 to 17 ns
// in softdot_bench), leaves GCC keeps in registers when every index is a
// constant. reduce-inl.h runs the same order on vectors (PairwiseReduce).
template <std::size_t kLeaves, class T>
[[gnu::always_inline]] inline T PairwiseSum(T* v) {
  return PairwiseSumSteps<kLeaves>(v, std::make_index_sequence<kLeaves - 1>());
}

}  // namespace softdot::detail

#endif  // SOFTDOT_KERNELS_REDUCE_H_
