// softdot kernels: the elementwise step of the softmax gradient, dx_i =
// y_i (dy_i - g) with g = <dy, y> (computed by the dot kernels), as plain
// C++: a loop the compiler vectorises, the same bits on every target (no
// FMA contraction: -ffp-contract=off; the double form's one fma is explicit
// and std::fma rounds once on every target). Rows whose g is not finite
// (an infinite or NaN y or dy) go to softmax_backward_special_row, scalar
// code with the special-value rules of include/softdot/softmax.h.
#ifndef SOFTDOT_KERNELS_BACKWARD_ROW_H_
#define SOFTDOT_KERNELS_BACKWARD_ROW_H_

#include <cmath>
#include <cstddef>
#include <limits>

#include "kernels/two_sum.h"

namespace softdot::detail {

// float: each dx_i in double (the product and the difference round at
// 2^-53) and rounded once to float. For a finite g every y_i and dy_i is
// finite (an infinite or NaN one makes g infinite or NaN), and dy_i - g
// cannot overflow in double.
inline void softmax_backward_row(const float* y, const float* dy, double g,
                                 std::size_t n, float* dx) {
  for (std::size_t i = 0; i < n; ++i) {
    const double yi = y[i], dyi = dy[i];
    dx[i] = static_cast<float>(yi * (dyi - g));
  }
}

// double: dy_i - g exactly as d + e (TwoSum), then y_i (d + e) with one FMA.
// If dy_i - g overflows (|dy_i| near the largest double), TwoSum's error
// term is NaN: then dx_i = y_i d (+-inf, or 0 where y_i = 0, the rule for a
// zero weight times an infinity).
inline void softmax_backward_row(const double* y, const double* dy, double g,
                                 std::size_t n, double* dx) {
  for (std::size_t i = 0; i < n; ++i) {
    const TwoSumResult<double> t = two_sum(dy[i], -g);  // t.hi = dy_i - g
    const bool inf = std::isinf(t.hi);
    const double hi = inf && y[i] == 0.0 ? 0.0 : t.hi;
    const double lo = inf ? 0.0 : t.lo;
    dx[i] = std::fma(y[i], hi, y[i] * lo);
  }
}

// A row with an infinite or NaN y_i or dy_i (or a product that overflows),
// scalar:
//   - any NaN in y or dy: the whole dx row NaN (never hidden);
//   - a zero weight times an infinity counts as 0, in <dy, y> and in
//     y_i (dy_i - g): an entry of weight 0 (masked, or a -inf logit) gets
//     dx_i = 0 and its dy_i does not enter <dy, y>, whatever it is (not NaN);
//   - infinite dy at entries of weight > 0, all of one sign s: g = s inf and
//     dx_i = -s inf at the other entries of weight > 0; at the infinite ones
//     the infinities count as equal (as the forward takes +inf scores):
//     dy_i - g = s inf (1 - W) - g_f, with W their total weight and g_f the
//     inner product over the finite entries: s inf where W < 1, -g_f where
//     they hold all the weight. Of both signs: NaN (an inf - inf that no
//     limit settles) at every entry of weight > 0, 0 at those of weight 0;
//   - an infinite y_i (not a softmax output) follows IEEE arithmetic.
// <dy, y> over the finite entries in double-double (TwoProduct and TwoSum),
// as accurate as the dot kernels; the finite dx_i as softmax_backward_row.
template <class T>
void softmax_backward_special_row(const T* y, const T* dy, std::size_t n,
                                  T* dx) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  const auto all_nan = [&] {
    for (std::size_t i = 0; i < n; ++i) {
      dx[i] = std::numeric_limits<T>::quiet_NaN();
    }
  };
  double hi = 0.0, lo = 0.0, w_pos = 0.0, w_neg = 0.0;
  bool pos = false, neg = false;
  for (std::size_t j = 0; j < n; ++j) {
    const double a = y[j], b = dy[j];
    if (std::isnan(a) || std::isnan(b)) return all_nan();
    if (a == 0.0) continue;  // 0 * (anything not NaN) counts as 0
    const double p = a * b;
    if (std::isnan(p)) return all_nan();  // an infinite y times dy = 0
    if (std::isinf(p)) {
      if (p > 0) {
        pos = true;
        w_pos += std::isinf(b) ? a : 0.0;
      } else {
        neg = true;
        w_neg += std::isinf(b) ? a : 0.0;
      }
      continue;
    }
    add_compensated(hi, lo, p);
    lo += std::fma(a, b, -p);  // the exact error of the product
  }
  const double g_f = hi + lo;
  const double g = pos && neg ? std::numeric_limits<double>::quiet_NaN()
                   : pos      ? kInf
                   : neg      ? -kInf
                              : g_f;
  for (std::size_t i = 0; i < n; ++i) {
    const double a = y[i], b = dy[i];
    double d;
    if (std::isinf(b) && b == g) {  // an infinite entry of the infinite sign
      d = (b > 0 ? w_pos : w_neg) < 1.0 ? b : -g_f;
    } else {
      d = b - g;  // NaN where g is NaN (infinities of both signs)
    }
    if (a == 0.0 && !std::isfinite(d)) {
      dx[i] = static_cast<T>(a * 0.0);
    } else if (sizeof(T) == 8 && std::isfinite(b) && std::isfinite(g) &&
               std::isfinite(d)) {
      // The double row's form: the error of dy_i - g carried into one FMA.
      const TwoSumResult<double> t = two_sum(b, -g);
      dx[i] = static_cast<T>(std::fma(a, t.hi, a * t.lo));
    } else {
      dx[i] = static_cast<T>(a * d);
    }
  }
}

}  // namespace softdot::detail

#endif  // SOFTDOT_KERNELS_BACKWARD_ROW_H_
