// softdot: the gradient of the softmax, dx = y * (dy - <dy, y>).
#include <cmath>
#include <cstddef>
#include <span>
#include <type_traits>

#include "check.h"
#include "kernels/backward_row.h"
#include "kernels/dispatch.h"
#include "softdot/softmax.h"

namespace softdot {
namespace {

template <class T>
void check_backward(std::span<const T> y, std::span<const T> dy,
                    std::span<T> dx) {
  const char* function = "softmax_backward";
  if (y.empty()) detail::fail(function, "y is empty (n must be >= 1)");
  if (dy.size() != y.size() || dx.size() != y.size()) {
    detail::fail(function, "y has " + detail::count(y.size()) +
                               " elements, dy " + detail::count(dy.size()) +
                               " and dx " + detail::count(dx.size()) +
                               " (all must be equal)");
  }
  if (detail::partial_overlap(y.data(), y.size(), dx.data(), dx.size()) ||
      detail::partial_overlap(dy.data(), dy.size(), dx.data(), dx.size())) {
    detail::fail(function, "dx partially overlaps y or dy");
  }
}

}  // namespace

namespace {

// <dy, y>: for float, exact float products summed in double; for double,
// dot_accurate (twice the working precision). A result that is not finite
// means an infinite or NaN y_i or dy_i: the rules of
// include/softdot/softmax.h, in scalar code.
template <class T>
void backward_checked(std::span<const T> y, std::span<const T> dy,
                      std::span<T> dx) {
  check_backward(y, dy, dx);
  double g;
  if constexpr (std::is_same_v<T, float>) {
    g = detail::dot_in_double_kernel(dy.data(), y.data(), y.size());
  } else {
    g = detail::dot_accurate_kernel(dy.data(), y.data(), y.size());
  }
  if (std::isfinite(g)) [[likely]] {
    detail::softmax_backward_row(y.data(), dy.data(), g, y.size(), dx.data());
  } else {
    detail::softmax_backward_special_row(y.data(), dy.data(), y.size(),
                                         dx.data());
  }
}

}  // namespace

void softmax_backward(std::span<const float> y, std::span<const float> dy,
                      std::span<float> dx) {
  backward_checked(y, dy, dx);
}
void softmax_backward(std::span<const double> y, std::span<const double> dy,
                      std::span<double> dx) {
  backward_checked(y, dy, dx);
}

}  // namespace softdot
