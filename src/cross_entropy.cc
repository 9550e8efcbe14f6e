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
#include "softmax_common.h"

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
  const std::size_t counted =
      detail::counted_targets(targets, options.ignore_index);
  const double c = detail::gradient_scale(options.reduction, counted);

  std::vector<long double> row_loss(rows);
  const bool parallel = rows > 1 && rows * vocab >= detail::kParallelElements;
  detail::for_each_index(rows, parallel, [&](std::size_t i) {
    row_loss[i] = detail::cross_entropy_whole_row(
        logits.data + i * logits.stride, vocab, targets[i],
        options.ignore_index, c, options.label_smoothing,
        grad.data == nullptr ? nullptr : grad.data + i * grad.stride);
  });
  return detail::finish_losses(row_loss, loss, options.reduction, counted);
}

}  // namespace

SOFTDOT_CROSS_ENTROPY_OVERLOAD(float)
SOFTDOT_CROSS_ENTROPY_OVERLOAD(double)

}  // namespace softdot
