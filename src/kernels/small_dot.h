// softdot kernels: the dot of at most 8 elements as plain C++ (no SIMD, no
// dispatch), the same bits as the vector kernel's ShortDot<1> on every
// target.
// Tested: DotTest.DotsEqualsDotPerRow compares dot() for n = 1..8, which
// takes this path, bit for bit with dots(), which takes the kernel's, on
// every target.
#ifndef SOFTDOT_KERNELS_SMALL_DOT_H_
#define SOFTDOT_KERNELS_SMALL_DOT_H_

#include <cstddef>

#include "kernels/reduce.h"

namespace softdot::detail {

// A dot of at most 8 elements without the dispatch (dot() calls it for
// n <= 8): the scalar form of ShortDot<1> in dot-inl.h. The kernel's lanes
// would hold fma(x_j, y_j, +0) = x_j * y_j + 0 (the + 0 turns a -0 product
// into +0) for j < n
// and +0 after, added in the pairwise tree of reduce.h over the block's 16
// float or 8 double lanes. For float its first level adds lane j + 8, which
// is +0, to lane j, which is not -0: that changes nothing, so the rest is
// the tree over lanes 0..7, ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 +
// l7)), with the lanes past n +0: the same bits as the kernel on every
// target (a product rounds the same with or without FMA). Skipping the
// dispatch took a 3-element dot from 8.0 to 4.9 ns (peers benchmark,
// docs/performance.md).
template <class T>
T small_dot(const T* x, const T* y, std::size_t n) {
  T l[8];
  for (std::size_t j = 0; j < 8; ++j) l[j] = j < n ? x[j] * y[j] + T(0) : T(0);
  return PairwiseSum<8>(l);
}

}  // namespace softdot::detail

#endif  // SOFTDOT_KERNELS_SMALL_DOT_H_
