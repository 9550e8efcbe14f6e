// softdot::mpi: softmax, log_softmax, logsumexp and cross_entropy of rows
// whose vocabulary is split across ranks (include/softdot/mpi_vocab.h).
//
// Every call goes: local checks -> agree_or_throw (collective) -> one
// Allgather of each rank's ShardInfo (rows, cols, vocab_begin, a fingerprint
// of the targets and options) checked identically on every rank -> the
// local reduction of each shard row -> Allgather of the per-row partials
// (two rounds in deterministic mode) -> the merged state of each row ->
// this rank's outputs. No rank reaches an exchange that another skips: the
// verdicts are collective, and a local failure inside the compute is agreed
// on before the next exchange.
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "check.h"
#include "cross_entropy_checks.h"
#include "cross_entropy_row.h"
#include "mpi/comm.h"
#include "mpi/vocab_totals.h"
#include "softdot/mpi.h"
#include "softdot/softmax.h"

namespace softdot::mpi {
namespace {

using detail::agree_local;
using detail::agree_shards;
using detail::fnv;
using detail::Global;
using detail::Job;
using detail::RowTotal;
using detail::ShardInfo;
using softdot::detail::count;
using softdot::detail::fail;
using L = long double;

constexpr double kInfD = std::numeric_limits<double>::infinity();

enum class Op { kSoftmax, kLogSoftmax, kLse, kCrossEntropy };

// log_softmax of one shard row from the row's state, in long double.
template <class T>
void log_softmax_row(const T* x, std::size_t n, const SoftmaxStateD& s, T* y) {
  constexpr T kNaN = std::numeric_limits<T>::quiet_NaN();
  constexpr T kInf = std::numeric_limits<T>::infinity();
  if (std::isnan(s.max) || std::isnan(s.sum)) {
    std::fill(y, y + n, kNaN);
  } else if (s.max == -kInfD) {
    std::fill(y, y + n, -kInf);
  } else if (s.max == kInfD) {
    const T minus_log_k = static_cast<T>(-std::log(static_cast<L>(s.sum)));
    for (std::size_t j = 0; j < n; ++j) {
      y[j] = x[j] == kInf ? minus_log_k : -kInf;
    }
  } else {
    const L log_s = softdot::detail::log_state_sum(s);
    const L m = static_cast<L>(s.max);
    for (std::size_t j = 0; j < n; ++j) {
      y[j] = x[j] == -kInf ? -kInf
                           : static_cast<T>((static_cast<L>(x[j]) - m) - log_s);
    }
  }
}

template <class T>
void check_xy(const char* function, MatrixView<const T> x, MatrixView<T> y) {
  softdot::detail::check_matrix(function, "x", x);
  softdot::detail::check_matrix(function, "y", y);
  if (x.rows == 0) fail(function, "x has 0 rows (rows must be >= 1)");
  if (x.rows != y.rows || x.cols != y.cols) {
    fail(function, "x is " + count(x.rows) + " x " + count(x.cols) +
                       " but y is " + count(y.rows) + " x " + count(y.cols));
  }
  const bool in_place = x.data == y.data && x.stride == y.stride;
  if (!in_place && softdot::detail::bytes_overlap(
                       x.data, softdot::detail::matrix_bytes(x), y.data,
                       softdot::detail::matrix_bytes(MatrixView<const T>(y)))) {
    fail(function, "y overlaps x (only the same matrix, in place, is allowed)");
  }
}

template <class T>
void rows_op(const char* function, Op op, MPI_Comm comm, MatrixView<const T> x,
             std::size_t begin, MatrixView<T> y, std::span<T> lse,
             const VocabOptions& options) {
  detail::DupComm dc(comm, function);
  agree_local(dc.get(), [&] {
    if (op == Op::kLse) {
      softdot::detail::check_matrix(function, "x", x);
      if (x.rows == 0) fail(function, "x has 0 rows (rows must be >= 1)");
      if (lse.size() != x.rows) {
        fail(function, "x has " + count(x.rows) + " rows but lse has " +
                           count(lse.size()) + " elements");
      }
    } else {
      check_xy<T>(function, x, y);
    }
  });
  const ShardInfo mine{x.rows, x.cols, begin,
                       fnv(0xcbf29ce484222325ull, &options.deterministic, 1)};
  const Global g =
      agree_shards(dc.get(), dc.size(), function, mine, options.deterministic);
  Job job{options.deterministic, false};
  const std::vector<RowTotal> tot =
      detail::row_totals<T>(dc.get(), dc.size(), g, job, x, begin);
  for (std::size_t i = 0; i < x.rows; ++i) {
    const SoftmaxStateD& s = tot[i].state;
    if (op == Op::kLse) {
      lse[i] = softdot::logsumexp(detail::state_as<T>(s));
      continue;
    }
    if (x.cols == 0) continue;
    const T* xr = x.data + i * x.stride;
    T* yr = y.data + i * y.stride;
    if (op == Op::kSoftmax) {
      softdot::softmax_apply(std::span<const T>(xr, x.cols),
                             detail::state_as<T>(s), std::span<T>(yr, x.cols));
    } else {
      log_softmax_row<T>(xr, x.cols, s, yr);
    }
  }
}

template <class T>
double cross_entropy_op(MPI_Comm comm, MatrixView<const T> logits,
                        std::size_t begin,
                        std::span<const std::int64_t> targets,
                        std::span<T> loss, MatrixView<T> grad,
                        const CrossEntropyOptions& options,
                        const VocabOptions& vopt) {
  const char* function = "mpi::cross_entropy";
  detail::DupComm dc(comm, function);
  agree_local(dc.get(), [&] {
    // The target range is checked against V once V is known.
    softdot::detail::check_cross_entropy<T>(function, logits, 1, targets, loss,
                                            grad, options, false);
  });
  std::uint64_t h = 0xcbf29ce484222325ull;
  h = fnv(h, targets.data(), targets.size() * sizeof(std::int64_t));
  h = fnv(h, &options.ignore_index, sizeof(options.ignore_index));
  h = fnv(h, &options.label_smoothing, sizeof(options.label_smoothing));
  const int red = static_cast<int>(options.reduction);
  h = fnv(h, &red, sizeof(red));
  h = fnv(h, &vopt.deterministic, 1);
  const ShardInfo mine{logits.rows, logits.cols, begin, h};
  const Global g =
      agree_shards(dc.get(), dc.size(), function, mine, vopt.deterministic);
  // The targets are the same on every rank (agree_shards checked their
  // fingerprint), so every rank reaches the same verdict without an exchange.
  softdot::detail::check_target_classes(function, targets, g.vocab,
                                        options.ignore_index);
  const double eps = options.label_smoothing;
  const std::size_t counted =
      softdot::detail::counted_targets(targets, options.ignore_index);
  const double c = softdot::detail::gradient_scale(options.reduction, counted);
  Job job{vopt.deterministic, eps > 0.0, targets.data(), options.ignore_index};
  const std::vector<RowTotal> tot =
      detail::row_totals<T>(dc.get(), dc.size(), g, job, logits, begin);
  std::vector<L> row_loss(logits.rows, 0.0L);
  detail::shard_rows<T>(g, job, tot, logits, begin, c, eps, grad,
                        row_loss.data());
  return softdot::detail::finish_losses(row_loss, loss, options.reduction,
                                        counted);
}

}  // namespace

// The public overloads, one set per element type.
#define SOFTDOT_VOCAB_OVERLOADS(T)                                             \
  void softmax(MPI_Comm comm, MatrixView<const T> x, std::size_t vocab_begin,  \
               MatrixView<T> y, const VocabOptions& options) {                 \
    rows_op<T>("mpi::softmax", Op::kSoftmax, comm, x, vocab_begin, y, {},      \
               options);                                                       \
  }                                                                            \
  void log_softmax(MPI_Comm comm, MatrixView<const T> x,                       \
                   std::size_t vocab_begin, MatrixView<T> y,                   \
                   const VocabOptions& options) {                              \
    rows_op<T>("mpi::log_softmax", Op::kLogSoftmax, comm, x, vocab_begin, y,   \
               {}, options);                                                   \
  }                                                                            \
  void logsumexp(MPI_Comm comm, MatrixView<const T> x,                         \
                 std::size_t vocab_begin, std::span<T> lse,                    \
                 const VocabOptions& options) {                                \
    rows_op<T>("mpi::logsumexp", Op::kLse, comm, x, vocab_begin, {}, lse,      \
               options);                                                       \
  }                                                                            \
  double cross_entropy(                                                        \
      MPI_Comm comm, MatrixView<const T> logits, std::size_t vocab_begin,      \
      std::span<const std::int64_t> targets, std::span<T> loss,                \
      MatrixView<T> grad, const CrossEntropyOptions& options,                  \
      const VocabOptions& vocab_options) {                                     \
    return cross_entropy_op<T>(comm, logits, vocab_begin, targets, loss, grad, \
                               options, vocab_options);                        \
  }
SOFTDOT_VOCAB_OVERLOADS(float)
SOFTDOT_VOCAB_OVERLOADS(double)
#undef SOFTDOT_VOCAB_OVERLOADS

}  // namespace softdot::mpi
