// softdot::mpi, vocabulary-parallel part: the exchange that turns each
// rank's shard of every row into the whole row's softmax state (and, for the
// cross-entropy, the target's logit and the sum of the logits), the same on
// every rank. Used by src/mpi/vocab.cc; the modes are described in
// include/softdot/mpi_vocab.h.
#ifndef SOFTDOT_SRC_MPI_VOCAB_TOTALS_H_
#define SOFTDOT_SRC_MPI_VOCAB_TOTALS_H_

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "mpi/comm.h"
#include "softdot/matrix.h"
#include "softdot/softmax.h"

namespace softdot::mpi::detail {

// A row's softmax state in double, whatever the element type: the public
// states of a float row convert both ways exactly (the max is one of the
// row's floats, +-inf or NaN).
inline SoftmaxStateD widen_state(const SoftmaxState& s) {
  return {static_cast<double>(s.max), s.sum, s.sum_lo};
}
inline SoftmaxStateD widen_state(const SoftmaxStateD& s) { return s; }
template <class T>
BasicSoftmaxState<T> state_as(const SoftmaxStateD& s) {
  return {static_cast<T>(s.max), s.sum, s.sum_lo};
}

// What one rank announces about its shard and arguments (named apart from
// mpi::Layout, the public ring layout kind).
struct ShardInfo {
  std::uint64_t rows, cols, begin, fingerprint;
};

struct Global {
  std::size_t vocab = 0;
  std::vector<int> order;  // ranks in vocabulary order
};

// FNV-1a over bytes, for comparing the ranks' targets and options.
inline std::uint64_t fnv(std::uint64_t h, const void* p, std::size_t n) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i) {
    h ^= b[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

// Runs the local checks in `check` on this rank, then agrees on the verdict
// (every rank throws the lowest failing rank's message).
template <class F>
void agree_local(MPI_Comm comm, F&& check) {
  bool ok = true;
  std::string what;
  try {
    check();
  } catch (const std::invalid_argument& e) {
    ok = false;
    what = e.what();
  }
  detail::agree_or_throw(comm, ok, what);
}

// The ranks' ShardInfo (one Allgather), checked the same way on every rank
// (every rank sees the same data, so every rank throws the same
// std::invalid_argument naming `function` and the first bad rank): the same
// rows and fingerprint everywhere, column ranges tiling [0, V), V >= 1 (and
// V < 2^26 in deterministic mode). The messages call the rows' holder
// `rows_of` and what the fingerprint covers `same`.
Global agree_shards(MPI_Comm comm, int size, const char* function,
                    const ShardInfo& mine, bool deterministic,
                    const char* rows_of = "x",
                    const char* same = "targets or options");

// The per-row results every rank ends with.
struct RowTotal {
  SoftmaxStateD state;
  long double x_t = 0;    // the target's logit (cross_entropy)
  long double sum_x = 0;  // the sum of the row's logits (label smoothing)
};

// What the vocabulary-parallel reduction needs to know about a call.
struct Job {
  bool deterministic;
  bool need_sum_x;                        // label smoothing
  const std::int64_t* targets = nullptr;  // cross_entropy
  std::int64_t ignore_index = 0;
};

// True when this rank holds the target of row i (not ignored).
inline bool owns_target(const Job& job, std::size_t i, std::size_t cols,
                        std::size_t begin) {
  if (job.targets == nullptr || job.targets[i] == job.ignore_index) {
    return false;
  }
  const std::uint64_t tu = static_cast<std::uint64_t>(job.targets[i]);
  return tu >= begin && tu < begin + cols;
}

// The whole row's totals for each row of this rank's shard x (its columns
// start at `begin`), the same on every rank: default mode one Allgather and
// a left-to-right merge in vocabulary order; deterministic mode two
// Allgathers and exact sums. Collective.
template <class T>
std::vector<RowTotal> row_totals(MPI_Comm comm, int size, const Global& g,
                                 const Job& job, MatrixView<const T> x,
                                 std::size_t begin);

// Each row's loss into row_loss[i] (0 where the target is ignored), from
// the totals of row_totals and the whole vocabulary's size; and where
// grad.data is not null, this rank's columns of the row's gradient,
// c (softmax - (1 - eps) one_hot - eps / V) (zeros where ignored). grad is
// x's shape; it may be x itself (written in place).
template <class T>
void shard_rows(const Global& g, const Job& job,
                const std::vector<RowTotal>& tot, MatrixView<const T> x,
                std::size_t begin, double c, double eps, MatrixView<T> grad,
                long double* row_loss);

}  // namespace softdot::mpi::detail

#endif  // SOFTDOT_SRC_MPI_VOCAB_TOTALS_H_
