// softdot kernels: the elementwise step of the softmax gradient, dx_i =
// y_i (dy_i - g) with g = <dy, y> (computed by the dot kernels), as plain
// C++: a loop the compiler vectorises, the same bits on every target (no
// FMA contraction: -ffp-contract=off; the double form's one fma is explicit
// and std::fma rounds once on every target).
#ifndef SOFTDOT_KERNELS_BACKWARD_ROW_H_
#define SOFTDOT_KERNELS_BACKWARD_ROW_H_

#include <cmath>
#include <cstddef>

#include "kernels/two_sum.h"

namespace softdot::detail {

// float: each dx_i in double (the product and the difference round at
// 2^-53) and rounded once to float.
inline void softmax_backward_row(const float* y, const float* dy, double g,
                                 std::size_t n, float* dx) {
  for (std::size_t i = 0; i < n; ++i) {
    const double yi = y[i], dyi = dy[i];
    dx[i] = static_cast<float>(yi * (dyi - g));
  }
}

// double: dy_i - g exactly as d + e (TwoSum), then y_i (d + e) with one FMA.
inline void softmax_backward_row(const double* y, const double* dy, double g,
                                 std::size_t n, double* dx) {
  for (std::size_t i = 0; i < n; ++i) {
    const TwoSumResult<double> t = two_sum(dy[i], -g);  // t.hi = dy_i - g
    dx[i] = std::fma(y[i], t.hi, y[i] * t.lo);
  }
}

}  // namespace softdot::detail

#endif  // SOFTDOT_KERNELS_BACKWARD_ROW_H_
