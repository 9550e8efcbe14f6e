// softdot: what softmax.cc (float, double) and softmax16.cc (BFloat16,
// Float16) share: the checks of a row matrix, and the public
// softmax-family overloads of one element type, defined in one place. Each
// of the two files keeps its own checked templates in an unnamed namespace,
// row_checked, rows_checked and lse_checked (same names, same signatures,
// element type T); SOFTDOT_SOFTMAX_OVERLOADS(T) writes the five public
// functions of softdot/softmax.h for T over them, so that the wall of
// one-line overloads exists once instead of once per type. The same for
// cross_entropy (cross_entropy_checked; cross_entropy.cc, softmax16.cc).
#ifndef SOFTDOT_SRC_SOFTMAX_COMMON_H_
#define SOFTDOT_SRC_SOFTMAX_COMMON_H_

#include <cmath>
#include <cstddef>
#include <span>

#include "check.h"
#include "softdot/matrix.h"
#include "softdot/softmax.h"

namespace softdot::detail {

// The factor the scores are multiplied by: 1 / temperature rounded to T
// (float for the 16-bit functions). Throws unless the temperature is finite
// and > 0 and its reciprocal finite and non-zero in T.
template <class T>
T softmax_scale(const char* function, const SoftmaxOptions& options) {
  const double t = options.temperature;
  if (!(std::isfinite(t) && t > 0.0)) {
    fail(function, "temperature must be finite and > 0, got " + number(t));
  }
  const T s = static_cast<T>(1.0 / t);
  if (!(std::isfinite(s) && s > T{0})) {
    fail(function, "temperature " + number(t) +
                       " has no finite, non-zero reciprocal in " +
                       (sizeof(T) == 4 ? "float" : "double"));
  }
  return s;
}

// The arguments of a one-row function: x not empty, y of x's size, and y
// either x itself or apart from it.
template <class T>
void check_softmax_row(const char* function, std::span<const T> x,
                       std::span<T> y) {
  if (x.empty()) fail(function, "x is empty (a softmax needs n >= 1)");
  if (y.size() != x.size()) {
    fail(function,
         "x has " + count(x.size()) + " elements but y has " + count(y.size()));
  }
  if (partial_overlap(x.data(), x.size(), y.data(), y.size())) {
    fail(function, "y partially overlaps x (only y == x is allowed)");
  }
}

// The arguments of softmax_rows / log_softmax_rows: x and y of the same
// rows x cols (>= 1 each), a mask of cols or rows * cols flags, and y either
// x itself (in place) or apart from it. Throws std::invalid_argument naming
// `function`.
template <class T>
void check_softmax_rows(const char* function, MatrixView<const T> x,
                        MatrixView<T> y, const SoftmaxOptions& options) {
  check_matrix(function, "x", x);
  check_matrix(function, "y", y);
  if (x.rows != y.rows || x.cols != y.cols) {
    fail(function, "x is " + count(x.rows) + " x " + count(x.cols) +
                       " but y is " + count(y.rows) + " x " + count(y.cols));
  }
  if (x.rows == 0 || x.cols == 0) {
    fail(function, "x is " + count(x.rows) + " x " + count(x.cols) +
                       " (rows and cols must be >= 1)");
  }
  const std::size_t n = x.cols;
  if (!options.mask.empty() && options.mask.size() != n &&
      options.mask.size() != x.rows * n) {
    fail(function, "mask has " + count(options.mask.size()) +
                       " flags; expected cols = " + count(n) +
                       " or rows * cols = " + count(x.rows * n));
  }
  const std::size_t x_extent = (x.rows - 1) * x.stride + x.cols;
  const std::size_t y_extent = (y.rows - 1) * y.stride + y.cols;
  const bool in_place = x.data == y.data && x.stride == y.stride;
  if (!in_place && (x.data == y.data ||
                    partial_overlap(x.data, x_extent, y.data, y_extent))) {
    fail(function, "y overlaps x (only the same matrix, in place, is allowed)");
  }
}

}  // namespace softdot::detail

// NOLINTBEGIN(bugprone-macro-parentheses): T is a type name.
#define SOFTDOT_SOFTMAX_OVERLOADS(T)                                        \
  void softmax(std::span<const T> x, std::span<T> y,                        \
               const SoftmaxOptions& options) {                             \
    row_checked<T>("softmax", RowOp::kSoftmax, x, y, options);              \
  }                                                                         \
  void log_softmax(std::span<const T> x, std::span<T> y,                    \
                   const SoftmaxOptions& options) {                         \
    row_checked<T>("log_softmax", RowOp::kLogSoftmax, x, y, options);       \
  }                                                                         \
  T logsumexp(std::span<const T> x, const SoftmaxOptions& options) {        \
    return lse_checked<T>(x, options);                                      \
  }                                                                         \
  void softmax_rows(MatrixView<const T> x, MatrixView<T> y,                 \
                    const SoftmaxOptions& options) {                        \
    rows_checked<T>("softmax_rows", RowOp::kSoftmax, x, y, options);        \
  }                                                                         \
  void log_softmax_rows(MatrixView<const T> x, MatrixView<T> y,             \
                        const SoftmaxOptions& options) {                    \
    rows_checked<T>("log_softmax_rows", RowOp::kLogSoftmax, x, y, options); \
  }

// softdot/cross_entropy.h's cross_entropy for T over the file's
// cross_entropy_checked<T> (cross_entropy.cc: float, double; softmax16.cc:
// BFloat16, Float16).
#define SOFTDOT_CROSS_ENTROPY_OVERLOAD(T)                                  \
  double cross_entropy(MatrixView<const T> logits,                         \
                       std::span<const std::int64_t> targets,              \
                       std::span<T> loss, MatrixView<T> grad,              \
                       const CrossEntropyOptions& options) {               \
    return cross_entropy_checked<T>(logits, targets, loss, grad, options); \
  }
// NOLINTEND(bugprone-macro-parentheses)

#endif  // SOFTDOT_SRC_SOFTMAX_COMMON_H_
