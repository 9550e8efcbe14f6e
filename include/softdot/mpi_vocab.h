// softdot::mpi, vocabulary-parallel part: softmax, log_softmax, logsumexp and
// cross_entropy of rows whose columns (the vocabulary) are split across the
// ranks of a communicator. Included by <softdot/mpi.h>; the common rules of
// that header hold (collective calls, a duplicated communicator, arguments
// checked on every rank before any exchange, every rank throwing when one
// rank's arguments are bad).
//
// Layout: every rank holds the same rows; rank r holds the columns
// [vocab_begin_r, vocab_begin_r + cols_r) of each, as a MatrixView (any
// stride). The ranges must tile [0, V) with V >= 1, in any rank order; a
// rank may hold no column (cols_r = 0). Every rank receives the results of
// its own columns (and the per-row values: lse, loss) for every row.
//
// How: each rank reduces its shard of each row to a softmax state (max,
// sum exp(x - max)); the states are exchanged (MPI_Allgather, 6 doubles
// per row and rank; 5 in each deterministic round) and merged, and each
// rank writes its columns
// from the merged state. Collectives per call: MPI_Comm_dup (and free), an
// Allreduce of the local checks' verdicts, an Allgather of the layouts,
// then per round (one, two in deterministic mode) an Allreduce of the local
// compute's verdict and the Allgather of the partials.
//
// Reproducibility, stated bit for bit:
//   default       the same P and the same column split give the same bits
//                 run to run, on every rank. The merged state is
//                 merge(...merge(s_0, s_1)..., s_last) over the shards in
//                 vocabulary order, s_r = softdot::softmax_state(shard row);
//                 softmax writes softdot::softmax_apply(shard, merged) (so on
//                 one rank: exactly softmax_apply(row, softmax_state(row))).
//   deterministic (VocabOptions::deterministic) the bits do not depend on P
//                 nor on where the columns are split: the global max M is
//                 exact, and S = sum_j exp(x_j - M) is summed exactly in
//                 128-bit fixed point (each term rounded to double, then
//                 truncated to a multiple of 2^-100; S >= 1, so the
//                 truncation costs at most V 2^-100). The sum of the logits
//                 (label smoothing) likewise, in fixed point relative to the
//                 largest |x_j|. One more exchange and a conversion pass.
//                 Bitwise claims hold for ranks on the same SIMD target
//                 (softdot::simd_target()); tested for P = 1 to 8 with uneven
//                 splits, an empty shard and ranks not in vocabulary order.
// Neither mode is bitwise equal to the one-process softmax_rows (whose sum
// is ordered differently); both are within its error bound of it: softmax
// within 1 ulp of the exact weight (faithful), logsumexp and log_softmax as
// softdot::logsumexp(SoftmaxState), cross_entropy as
// softdot::cross_entropy (include/softdot/cross_entropy.h), all tested
// against the one-process functions (tests/mpi/vocab_test.cc).
//
// Special values are those of one process over the whole row: a row -inf
// on every rank gives softmax 0, log_softmax and lse -inf; a shard that is
// -inf throughout is the identity; a NaN on any rank makes the whole row
// NaN on every rank; +inf entries share the weight 1/k over all ranks.
// No mask or temperature: a masked logit is -inf.
#ifndef SOFTDOT_MPI_VOCAB_H_
#define SOFTDOT_MPI_VOCAB_H_

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <span>

#include "softdot/cross_entropy.h"
#include "softdot/float16.h"
#include "softdot/matrix.h"

namespace softdot::mpi {

struct VocabOptions {
  // Bitwise the same results for every P and column split (see above).
  bool deterministic = false;
};

// y = softmax over the whole row, for this rank's columns. y: the shape of
// x, any stride; y may be x (in place), no other overlap. Allocates
// O(P rows) doubles for the exchange (and, in deterministic mode, one row of
// this rank's columns in double).
void softmax(MPI_Comm comm, MatrixView<const float> x, std::size_t vocab_begin,
             MatrixView<float> y, const VocabOptions& options = {});
void softmax(MPI_Comm comm, MatrixView<const double> x, std::size_t vocab_begin,
             MatrixView<double> y, const VocabOptions& options = {});

// y = log_softmax over the whole row: (x - M) - log S in long double,
// rounded once (within 1 ulp of the exact value plus the error of log S,
// about 2^-33 for float and 2^-50 for double relative to S - 1).
void log_softmax(MPI_Comm comm, MatrixView<const float> x,
                 std::size_t vocab_begin, MatrixView<float> y,
                 const VocabOptions& options = {});
void log_softmax(MPI_Comm comm, MatrixView<const double> x,
                 std::size_t vocab_begin, MatrixView<double> y,
                 const VocabOptions& options = {});

// lse[i] = log sum_j exp(x_ij) over the whole row i, on every rank (rows
// elements).
void logsumexp(MPI_Comm comm, MatrixView<const float> x,
               std::size_t vocab_begin, std::span<float> lse,
               const VocabOptions& options = {});
void logsumexp(MPI_Comm comm, MatrixView<const double> x,
               std::size_t vocab_begin, std::span<double> lse,
               const VocabOptions& options = {});

// softdot::cross_entropy over the whole vocabulary V (the sum of the
// ranks' cols), every rank holding its columns of the logits. targets (the
// same on every rank, checked) are global class indices; the target's
// logit comes from the rank that holds it; label smoothing spreads eps / V
// over the global vocabulary. loss (empty or rows) and the returned value
// are the same on every rank; grad (null data, or the shape of the shard)
// receives this rank's columns of the gradient, computed locally from the
// merged state. The caller's logits are never modified; grad and loss must
// not overlap the logits, the targets or each other.
double cross_entropy(MPI_Comm comm, MatrixView<const float> logits,
                     std::size_t vocab_begin,
                     std::span<const std::int64_t> targets,
                     std::span<float> loss, MatrixView<float> grad = {},
                     const CrossEntropyOptions& options = {},
                     const VocabOptions& vocab_options = {});
double cross_entropy(MPI_Comm comm, MatrixView<const double> logits,
                     std::size_t vocab_begin,
                     std::span<const std::int64_t> targets,
                     std::span<double> loss, MatrixView<double> grad = {},
                     const CrossEntropyOptions& options = {},
                     const VocabOptions& vocab_options = {});

// softdot::linear_cross_entropy (include/softdot/linear_cross_entropy.h)
// with the vocabulary split across the ranks, as Megatron's
// vocabulary-parallel output layer: every rank holds the same hidden
// (N x D) and targets (global class indices), and its rows
// [vocab_begin, vocab_begin + V_r) of the weight (V_r x D; V_r may be 0).
// No rank forms the whole vocabulary's logits, nor any N x V_r block of
// them: the rows go in blocks of B (linear_cross_entropy's B, from the
// whole V), each block's logits are formed on every rank over its own
// rows of the weight, their softmax states (and target logits, and sums for
// label smoothing) exchanged and merged as in cross_entropy above (one
// Allgather per block, two in deterministic mode), and the block's gradient
// G (c (softmax - (1 - eps) one_hot - eps / V)) formed in place.
//
// Results:
//   loss (empty or N), the returned value: the same on every rank.
//   grad_hidden (null data, or N x D; the same on every rank):
//     sum over ranks of G_r W_r: each rank's product (rounded to float)
//     gathered (an Allgather of B x D floats per block) and added in double
//     in vocabulary order, rounded once to float. Given on every rank or
//     on none (checked).
//   grad_weight (null data, or V_r x D): this rank's rows, G_r^T hidden,
//     computed locally (no exchange).
// Bitwise: the same P and split give the same bits run to run, for any
// thread count; on one rank the bits are those of
// softdot::linear_cross_entropy. deterministic: loss and grad_weight do not
// depend on P nor on the split (the logits are bitwise the same wherever
// the split falls, the merged state is exact, and B comes from the whole
// V); grad_hidden is a sum over the ranks' partial products and so
// depends on the split, as any sum of products does.
// Errors as linear_cross_entropy's and cross_entropy's above (every rank
// throws the same message): different hidden (its bytes are hashed, with
// the targets and options), targets, options or grad_hidden presence on
// some rank; column ranges that do not tile [0, V).
// Memory per rank: the B x V_r block of logits, and with grad_hidden
// P B D floats for the gathered partial products.
double linear_cross_entropy(MPI_Comm comm, MatrixView<const float> hidden,
                            MatrixView<const float> weight,
                            std::size_t vocab_begin,
                            std::span<const std::int64_t> targets,
                            std::span<float> loss,
                            MatrixView<float> grad_hidden = {},
                            MatrixView<float> grad_weight = {},
                            const CrossEntropyOptions& options = {},
                            const VocabOptions& vocab_options = {});
double linear_cross_entropy(MPI_Comm comm, MatrixView<const BFloat16> hidden,
                            MatrixView<const BFloat16> weight,
                            std::size_t vocab_begin,
                            std::span<const std::int64_t> targets,
                            std::span<float> loss,
                            MatrixView<float> grad_hidden = {},
                            MatrixView<float> grad_weight = {},
                            const CrossEntropyOptions& options = {},
                            const VocabOptions& vocab_options = {});

}  // namespace softdot::mpi

#endif  // SOFTDOT_MPI_VOCAB_H_
