// softdot::mpi::linear_cross_entropy (include/softdot/mpi_vocab.h): the
// fused linear + cross-entropy with the weight's rows (the vocabulary)
// split across the ranks. The one-process call's block products
// (src/linear_cross_entropy_blocks.h) on this rank's rows, the
// vocabulary-parallel cross-entropy's exchange (src/mpi/vocab_totals.h) per
// block of rows, and an Allgather of the blocks' partial grad_hidden.
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "check.h"
#include "cross_entropy_checks.h"
#include "linear_cross_entropy_blocks.h"
#include "mpi/comm.h"
#include "mpi/vocab_totals.h"
#include "softdot/mpi.h"

namespace softdot::mpi {
namespace {

using detail::fnv;
using softdot::detail::count;
using softdot::detail::fail;

// FNV-1a over what must be the same on every rank: the hidden rows' bytes
// (D and N are in them), the targets, the options and whether grad_hidden
// is asked for (its exchange is collective).
template <class T>
std::uint64_t fingerprint(MatrixView<const T> hidden,
                          std::span<const std::int64_t> targets,
                          const CrossEntropyOptions& options,
                          bool deterministic, bool want_grad_hidden) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  const std::uint64_t dim = hidden.cols;
  h = fnv(h, &dim, sizeof(dim));
  for (std::size_t i = 0; i < hidden.rows; ++i) {
    h = fnv(h, hidden.data + i * hidden.stride, hidden.cols * sizeof(T));
  }
  h = fnv(h, targets.data(), targets.size() * sizeof(std::int64_t));
  h = fnv(h, &options.ignore_index, sizeof(options.ignore_index));
  h = fnv(h, &options.label_smoothing, sizeof(options.label_smoothing));
  const int red = static_cast<int>(options.reduction);
  h = fnv(h, &red, sizeof(red));
  h = fnv(h, &deterministic, 1);
  return fnv(h, &want_grad_hidden, 1);
}

template <class T>
double linear_cross_entropy_op(MPI_Comm comm, MatrixView<const T> hidden,
                               MatrixView<const T> weight, std::size_t begin,
                               std::span<const std::int64_t> targets,
                               std::span<float> loss,
                               MatrixView<float> grad_hidden,
                               MatrixView<float> grad_weight,
                               const CrossEntropyOptions& options,
                               const VocabOptions& vopt) {
  const char* function = "mpi::linear_cross_entropy";
  detail::DupComm dc(comm, function);
  detail::agree_local(dc.get(), [&] {
    softdot::detail::lce::check_operands<T>(function, hidden, weight, targets,
                                            loss, grad_hidden, grad_weight,
                                            options, true);
    if (grad_hidden.data != nullptr &&
        hidden.cols > static_cast<std::size_t>(INT_MAX) / 256) {
      fail(function, "D = " + count(hidden.cols) +
                         " is too large for the exchange of grad_hidden");
    }
  });
  const bool want_gh = grad_hidden.data != nullptr;
  const detail::ShardInfo mine{
      hidden.rows, weight.rows, begin,
      fingerprint(hidden, targets, options, vopt.deterministic, want_gh)};
  const detail::Global g = detail::agree_shards(
      dc.get(), dc.size(), function, mine, vopt.deterministic, "hidden",
      "hidden, targets, options or the presence of grad_hidden");
  softdot::detail::check_target_classes(function, targets, g.vocab,
                                        options.ignore_index);

  const std::size_t rows = hidden.rows, dim = hidden.cols, cols = weight.rows;
  const double eps = options.label_smoothing;
  const std::size_t counted =
      softdot::detail::counted_targets(targets, options.ignore_index);
  const double c = softdot::detail::gradient_scale(options.reduction, counted);
  const bool want_grad = want_gh || grad_weight.data != nullptr;

  const std::size_t block =
      std::min(rows, softdot::detail::lce::block_rows(g.vocab));
  const std::size_t ranks = static_cast<std::size_t>(dc.size());
  std::vector<float> logits(block * cols);
  std::vector<long double> row_loss(rows);
  std::vector<float> part(want_gh ? block * dim : 0);
  std::vector<float> parts(want_gh ? ranks * block * dim : 0);
  for (std::size_t i0 = 0; i0 < rows; i0 += block) {
    const std::size_t m = std::min(block, rows - i0);
    if (cols > 0) {
      softdot::detail::lce::logits(hidden, i0, m, weight, logits.data());
    }
    const MatrixView<float> x(logits.data(), m, cols, cols);
    const detail::Job job{vopt.deterministic, eps > 0.0, targets.data() + i0,
                          options.ignore_index};
    const std::vector<detail::RowTotal> tot = detail::row_totals<float>(
        dc.get(), dc.size(), g, job, MatrixView<const float>(x), begin);
    // G in place of the logits.
    detail::shard_rows<float>(g, job, tot, MatrixView<const float>(x), begin, c,
                              eps, want_grad ? x : MatrixView<float>{},
                              row_loss.data() + i0);
    if (want_gh) {
      if (cols > 0) {
        softdot::detail::lce::grad_hidden(logits.data(), m, weight, part.data(),
                                          dim);
      } else {
        std::fill(part.begin(), part.end(), 0.0f);
      }
      const int n = static_cast<int>(m * dim);
      detail::check_mpi(MPI_Allgather(part.data(), n, MPI_FLOAT, parts.data(),
                                      n, MPI_FLOAT, dc.get()),
                        "MPI_Allgather");
      // Added in vocabulary order in double, from the first shard's value
      // (so that one rank gives its own product's bits, -0 included).
      const std::size_t stride = m * dim;
      for (std::size_t r = 0; r < m; ++r) {
        float* out = grad_hidden.data + (i0 + r) * grad_hidden.stride;
        for (std::size_t k = 0; k < dim; ++k) {
          const std::size_t e = r * dim + k;
          double s = parts[static_cast<std::size_t>(g.order[0]) * stride + e];
          for (std::size_t q = 1; q < ranks; ++q) {
            s += parts[static_cast<std::size_t>(g.order[q]) * stride + e];
          }
          out[k] = static_cast<float>(s);
        }
      }
    }
    if (grad_weight.data != nullptr && cols > 0) {
      softdot::detail::lce::grad_weight(logits.data(), hidden, i0, m,
                                        grad_weight, i0 != 0);
    }
  }
  return softdot::detail::finish_losses(row_loss, loss, options.reduction,
                                        counted);
}

}  // namespace

// The public overloads, one per operand format.
#define SOFTDOT_MPI_LCE_OVERLOAD(T)                                            \
  double linear_cross_entropy(                                                 \
      MPI_Comm comm, MatrixView<const T> hidden, MatrixView<const T> weight,   \
      std::size_t vocab_begin, std::span<const std::int64_t> targets,          \
      std::span<float> loss, MatrixView<float> grad_hidden,                    \
      MatrixView<float> grad_weight, const CrossEntropyOptions& options,       \
      const VocabOptions& vocab_options) {                                     \
    return linear_cross_entropy_op<T>(comm, hidden, weight, vocab_begin,       \
                                      targets, loss, grad_hidden, grad_weight, \
                                      options, vocab_options);                 \
  }
SOFTDOT_MPI_LCE_OVERLOAD(float)
SOFTDOT_MPI_LCE_OVERLOAD(BFloat16)
#undef SOFTDOT_MPI_LCE_OVERLOAD

}  // namespace softdot::mpi
