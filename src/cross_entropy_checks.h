// softdot: argument checks and the reduction of the cross-entropy, shared by
// the one-process function and the vocabulary-parallel one over MPI (which
// checks each rank's shard with these, then agrees on the result).
#ifndef SOFTDOT_SRC_CROSS_ENTROPY_CHECKS_H_
#define SOFTDOT_SRC_CROSS_ENTROPY_CHECKS_H_

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "check.h"
#include "softdot/cross_entropy.h"
#include "softdot/matrix.h"

namespace softdot::detail {

// True when the byte ranges [a, a + na) and [b, b + nb) share memory.
inline bool bytes_overlap(const void* a, std::size_t na, const void* b,
                          std::size_t nb) {
  if (na == 0 || nb == 0) return false;
  const auto pa = reinterpret_cast<std::uintptr_t>(a);
  const auto pb = reinterpret_cast<std::uintptr_t>(b);
  return pa < pb + nb && pb < pa + na;
}

// Bytes spanned by a matrix view (0 when empty).
template <class T>
std::size_t matrix_bytes(const MatrixView<T>& m) {
  if (m.rows == 0 || m.cols == 0) return 0;
  return ((m.rows - 1) * m.stride + m.cols) * sizeof(T);
}

// label_smoothing in [0, 1] and a known reduction, else
// std::invalid_argument naming `function`.
inline void check_loss_options(const char* function,
                               const CrossEntropyOptions& options) {
  const double eps = options.label_smoothing;
  if (!(eps >= 0.0 && eps <= 1.0)) {
    fail(function, "label_smoothing must be in [0, 1], got " + number(eps));
  }
  if (options.reduction != Reduction::kNone &&
      options.reduction != Reduction::kSum &&
      options.reduction != Reduction::kMean) {
    fail(function, "reduction is not kNone, kSum or kMean");
  }
}

// Every target a class in [0, vocab) or ignore_index, else
// std::invalid_argument naming `function` and the first bad index.
inline void check_target_classes(const char* function,
                                 std::span<const std::int64_t> targets,
                                 std::size_t vocab, std::int64_t ignore_index) {
  for (std::size_t i = 0; i < targets.size(); ++i) {
    const std::int64_t t = targets[i];
    if (t != ignore_index && static_cast<std::uint64_t>(t) >= vocab) {
      fail(function, "targets[" + count(i) + "] = " + std::to_string(t) +
                         " is not a class in [0, " + count(vocab) +
                         ") nor ignore_index " + std::to_string(ignore_index));
    }
  }
}

// Checks the arguments of a cross-entropy over `logits`, which hold some
// (on one process: all) columns of rows over a vocabulary of `vocab`
// classes. Throws std::invalid_argument naming `function`.
template <class T>
void check_cross_entropy(const char* function, MatrixView<const T> logits,
                         std::size_t vocab,
                         std::span<const std::int64_t> targets,
                         std::span<T> loss, MatrixView<T> grad,
                         const CrossEntropyOptions& options,
                         bool check_target_values = true) {
  check_matrix(function, "logits", logits);
  if (logits.rows == 0 || vocab == 0) {
    fail(function, "logits are " + count(logits.rows) + " x " + count(vocab) +
                       " (rows and the vocabulary must be >= 1)");
  }
  if (targets.size() != logits.rows) {
    fail(function, "logits have " + count(logits.rows) + " rows but targets " +
                       count(targets.size()) + " elements");
  }
  check_loss_options(function, options);
  if (!loss.empty() && loss.size() != logits.rows) {
    fail(function, "loss has " + count(loss.size()) +
                       " elements; expected 0 or rows = " + count(logits.rows));
  }
  if (grad.data != nullptr) {
    check_matrix(function, "grad", grad);
    if (grad.rows != logits.rows || grad.cols != logits.cols) {
      fail(function, "logits are " + count(logits.rows) + " x " +
                         count(logits.cols) + " but grad is " +
                         count(grad.rows) + " x " + count(grad.cols));
    }
  }
  if (check_target_values) {
    check_target_classes(function, targets, vocab, options.ignore_index);
  }
  const std::size_t logits_bytes = matrix_bytes(logits);
  const std::size_t grad_bytes =
      grad.data == nullptr ? 0 : matrix_bytes(MatrixView<const T>(grad));
  const std::size_t loss_bytes = loss.size() * sizeof(T);
  const std::size_t targets_bytes = targets.size() * sizeof(std::int64_t);
  if (bytes_overlap(grad.data, grad_bytes, logits.data, logits_bytes) ||
      bytes_overlap(grad.data, grad_bytes, loss.data(), loss_bytes) ||
      bytes_overlap(grad.data, grad_bytes, targets.data(), targets_bytes)) {
    fail(function, "grad overlaps logits, loss or targets (no aliasing)");
  }
  if (bytes_overlap(loss.data(), loss_bytes, logits.data, logits_bytes) ||
      bytes_overlap(loss.data(), loss_bytes, targets.data(), targets_bytes)) {
    fail(function, "loss overlaps logits or targets (no aliasing)");
  }
}

// The rows whose target is not ignore_index (the mean's divisor).
inline std::size_t counted_targets(std::span<const std::int64_t> targets,
                                   std::int64_t ignore_index) {
  std::size_t counted = 0;
  for (const std::int64_t t : targets) counted += t != ignore_index;
  return counted;
}

// The factor c of the gradient: 1, or 1 / count for the mean.
inline double gradient_scale(Reduction reduction, std::size_t counted) {
  return reduction == Reduction::kMean ? 1.0 / static_cast<double>(counted)
                                       : 1.0;
}

// The returned value: the sum of the unrounded row losses (in long double,
// row order, rounded once to double), or sum / count for the mean (NaN when
// count is 0, as torch).
inline double reduce_row_losses(const long double* row_loss, std::size_t rows,
                                Reduction reduction, std::size_t counted) {
  long double sum = 0;
  for (std::size_t i = 0; i < rows; ++i) sum += row_loss[i];
  if (reduction != Reduction::kMean) return static_cast<double>(sum);
  if (counted == 0) return std::numeric_limits<double>::quiet_NaN();
  return static_cast<double>(sum / static_cast<long double>(counted));
}

// The end of every cross-entropy: each unrounded row loss rounded once into
// `loss` (when the caller asked for it, loss not empty), and the reduction
// returned (reduce_row_losses).
template <class L>
double finish_losses(const std::vector<long double>& row_loss,
                     std::span<L> loss, Reduction reduction,
                     std::size_t counted) {
  if (!loss.empty()) {
    for (std::size_t i = 0; i < row_loss.size(); ++i) {
      loss[i] = static_cast<L>(row_loss[i]);
    }
  }
  return reduce_row_losses(row_loss.data(), row_loss.size(), reduction,
                           counted);
}

}  // namespace softdot::detail

#endif  // SOFTDOT_SRC_CROSS_ENTROPY_CHECKS_H_
