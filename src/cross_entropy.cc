// softdot: the checked, fused cross-entropy (include/softdot/cross_entropy.h).
#include "softdot/cross_entropy.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "check.h"
#include "cross_entropy_checks.h"
#include "cross_entropy_row.h"
#include "kernels/dispatch.h"
#include "parallel.h"

namespace softdot {
namespace {

template <class T>
double cross_entropy_checked(MatrixView<const T> logits,
                             std::span<const std::int64_t> targets,
                             std::span<T> loss, MatrixView<T> grad,
                             const CrossEntropyOptions& options) {
  const char* function = "cross_entropy";
  detail::check_cross_entropy<T>(function, logits, logits.cols, targets, loss,
                                 grad, options);
  const std::size_t rows = logits.rows, vocab = logits.cols;
  const double eps = options.label_smoothing;
  std::size_t counted = 0;
  for (const std::int64_t t : targets) counted += t != options.ignore_index;
  const double c = detail::gradient_scale(options.reduction, counted);

  std::vector<long double> row_loss(rows);
  const bool parallel = rows > 1 && rows * vocab >= detail::kParallelElements;
  detail::for_each_index(rows, parallel, [&](std::size_t i) {
    const T* x = logits.data + i * logits.stride;
    const std::int64_t t = targets[i];
    T* g = grad.data == nullptr ? nullptr : grad.data + i * grad.stride;
    if (t == options.ignore_index) {
      row_loss[i] = 0.0L;
      if (g != nullptr) std::fill(g, g + vocab, T{0});
      return;
    }
    detail::RowState state{};
    detail::softmax_row_kernel(x, nullptr, T{1}, vocab, detail::RowOp::kState,
                               true, nullptr, &state);
    const long double sum_x =
        eps > 0.0 ? detail::sum_in_long_double(x, vocab) : 0.0L;
    const SoftmaxStateD total{state.max, state.sum, state.sum_lo};
    row_loss[i] = detail::cross_entropy_row_loss(
        total, static_cast<long double>(x[t]), sum_x, vocab, eps);
    if (g != nullptr) {
      detail::cross_entropy_row_grad(x, vocab, static_cast<std::ptrdiff_t>(t),
                                     total, c, eps, vocab, g);
    }
  });
  if (!loss.empty()) {
    for (std::size_t i = 0; i < rows; ++i) {
      loss[i] = static_cast<T>(row_loss[i]);
    }
  }
  return detail::reduce_row_losses(row_loss.data(), rows, options.reduction,
                                   counted);
}

}  // namespace

double cross_entropy(MatrixView<const float> logits,
                     std::span<const std::int64_t> targets,
                     std::span<float> loss, MatrixView<float> grad,
                     const CrossEntropyOptions& options) {
  return cross_entropy_checked<float>(logits, targets, loss, grad, options);
}
double cross_entropy(MatrixView<const double> logits,
                     std::span<const std::int64_t> targets,
                     std::span<double> loss, MatrixView<double> grad,
                     const CrossEntropyOptions& options) {
  return cross_entropy_checked<double>(logits, targets, loss, grad, options);
}

}  // namespace softdot
