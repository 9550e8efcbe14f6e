// softdot::mpi: softdot across processes over MPI (the C API of any MPI;
// tested with Open MPI). Built as the library softdot::mpi (CMake target
// softdot_mpi) when CMake finds MPI; the core library never needs it.
//
// Every function here is collective over the communicator it is given: each
// rank of it calls the function with its own shard. The library duplicates
// the communicator for the length of the call (MPI_Comm_dup), so its
// messages never match the caller's; MPI_THREAD_FUNNELED is enough (calls
// from the thread that initialised MPI). Arguments are checked on every rank
// and the verdicts combined before any data moves: when one rank's arguments
// are bad, every rank throws std::invalid_argument naming the function, the
// argument and the first failing rank, and no rank is left waiting. An
// error of an MPI call becomes std::runtime_error naming the call.
#ifndef SOFTDOT_MPI_H_
#define SOFTDOT_MPI_H_

#include <mpi.h>

#include <cstddef>
#include <vector>

#include "softdot/attention.h"
#include "softdot/mpi_vocab.h"
#include "softdot/ring_layout.h"

namespace softdot::mpi {

// The ring's layout is the core library's (softdot/ring_layout.h: the
// torch.distributed ring of the Python package reads it too), under its
// MPI names.
using softdot::kRingBlock;
using softdot::Layout;
using softdot::ring_layout;
using softdot::RingLayout;

// Options of ring_attention().
struct RingOptions {
  // The options of attention(), over global positions: scale, causal, the
  // window, softcap, sinks, precise keep their meaning; the mask and bias
  // have one row per local query row (rows() of the layout, padding rows
  // included; rows broadcast with row_stride 0 as in attention()) and one
  // column per global position (seq_len columns). kv_begin, kv_end,
  // q_position, kv_position, prefill_form and batch_invariant must keep
  // their defaults.
  AttentionOptions attention;
  // The whole sequence's length and its layout over the communicator's
  // ranks (ring_layout(seq_len, P, layout, deterministic)): every rank's q,
  // k and v have its rows() rows.
  std::size_t seq_len = 0;
  Layout layout = Layout::zigzag;
  // false: each rank merges the partial result of each key shard as it
  // arrives (the order of arrival is fixed for a given P, so the bits are
  // the same run to run for a given P; different P give results that differ
  // by roundings, within attention()'s bound).
  // true: every chunk is a multiple of kRingBlock positions; the partial of
  // each fixed block of kRingBlock global key positions is computed alone
  // (in the prefill form) and the blocks are merged by a binary tree over
  // the block indices (its shape a function of seq_len only; merging is
  // commutative bit for bit, with the empty partial the identity), so the
  // bits are the same for every P, whatever order the blocks arrive in.
  bool deterministic = false;
};

// Ring attention (sequence / context parallelism). Collective over comm:
// every rank passes the queries, keys and values of its own positions
// (RingLayout::positions) and receives the output rows of its queries:
//   q [B, H, rows, d], k [B, H_kv, rows, d], v [B, H_kv, rows, d_v],
//   out [B, H, rows, d_v], lse null or B * H * rows floats,
// rows = ring_layout(seq_len, P, layout, deterministic).rows(), every shape
// but the data the same on every rank. Each row of out and lse is what
// attention() gives for that query against the whole sequence (the same
// options, positions global), within attention()'s bound; padding rows are
// +0 with lse -inf.
//
// How: the K and V shards (with the int8 scales) travel around the ring,
// rank r sending to r + 1 and receiving from r - 1 with MPI_Isend and
// MPI_Irecv posted before the compute on the shard in hand (two buffers),
// P - 1 steps. Each rank keeps AttentionPartial results (unrounded: max,
// double sum and output) and merges them with attention_merge, finalising
// once at the end, so there is no rounding to float between the merges.
// Sinks enter once: with the rank's own first key chunk (not
// deterministic) or as a partial of their own (deterministic). With
// `deterministic` (RingOptions) the result is bitwise the same for every P;
// without, it is bitwise the same run to run for a given P. With P = 1, the
// contiguous layout and not deterministic, it is attention()'s bit for bit.
//
// Special values as attention(): a row with no visible key anywhere gives
// zeros and lse -inf; a shard a row cannot see is the identity; a NaN in a
// query, or in a key or value a row sees on any rank, gives NaN in that row.
//
// Errors: every argument (shapes against the layout, every option, the int8
// scales) is checked on every rank and the ranks agree before any data
// moves, and the shapes and options must match across ranks: any failure
// makes every rank throw std::invalid_argument naming the function, the
// argument and the first failing rank. An exception in a rank's compute is
// carried to every rank at the end of that step (std::runtime_error). Memory
// beyond the inputs: two K/V shard buffers, the partial results (8 (d_v +
// 2) bytes per local row and query chunk; deterministic: that for each
// subtree of the block tree not yet complete, at most about
// P log2(seq_len / kRingBlock) of them per query chunk).
void ring_attention(MPI_Comm comm, TensorView<const float> q,
                    TensorView<const float> k, TensorView<const float> v,
                    TensorView<float> out, const RingOptions& options,
                    float* lse = nullptr);
void ring_attention(MPI_Comm comm, TensorView<const float> q,
                    TensorView<const Float16> k, TensorView<const Float16> v,
                    TensorView<float> out, const RingOptions& options,
                    float* lse = nullptr);
void ring_attention(MPI_Comm comm, TensorView<const float> q,
                    TensorView<const BFloat16> k, TensorView<const BFloat16> v,
                    TensorView<float> out, const RingOptions& options,
                    float* lse = nullptr);
void ring_attention(MPI_Comm comm, TensorView<const float> q, const Int8KV& k,
                    const Int8KV& v, TensorView<float> out,
                    const RingOptions& options, float* lse = nullptr);

// The backward of ring_attention() (float32 K/V; attention_backward() has
// no 16-bit or int8 K/V form, so neither has the ring). Collective over
// comm: every rank passes the rows of its own positions, as to
// ring_attention() with the same options and layout,
//   q [B, H, rows, d], k [B, H_kv, rows, d], v [B, H_kv, rows, d_v],
//   out [B, H, rows, d_v] and lse (B * H * rows floats): the forward's
//   results for these rows (ring_attention()'s, or any with the same
//   meaning), dout [B, H, rows, d_v]: the gradient of the loss w.r.t. out,
//   dlse: null or B * H * rows floats, the gradient w.r.t. lse,
// and receives the gradients of its own rows in grads (attention.h,
// AttentionGradients): dq [B, H, rows, d], dk [B, H_kv, rows, d], dv
// [B, H_kv, rows, d_v], on request dbias [B, H, rows, seq_len] (dense:
// columns are global key positions) and dsinks [H] (needs the sinks; the
// whole sequence's gradient, the same on every rank). Each element is what
// attention_backward() gives for the whole sequence (the same options,
// positions global) within its bound (docs/accuracy.md, "Attention
// backward"): the same terms, summed in another order. Padding rows get +0.
//
// How: the K/V shards travel the ring as in the forward (P - 1 hops,
// nonblocking, posted before the compute on the shard in hand); each rank
// keeps the double dQ sums of its queries (AttentionGradientPartial) and,
// at each step, adds its queries' contribution against the visiting shard
// (attention_backward_partial, positions global so that causal, the window,
// the mask and bias columns are the whole sequence's) into them and into
// the visiting shard's double dK / dV sums, which then travel on to
// rank + 1: after P hops they are home, and every gradient is rounded once
// (attention_backward_finalize with the forward's float scale). The sinks'
// gradient is summed in double from every rank's rows (the formula of
// attention_backward(), an MPI_Allgather of the partial sums).
//
// Bits. Not deterministic: the same run to run for a given P (a fixed order
// of the sums); another P sums in another order (different roundings,
// within the bound). Deterministic (RingOptions::deterministic): bitwise
// the same for every P. As the forward, on fixed blocks of kRingBlock
// global positions: the contribution of each (query block, key block) pair
// is computed alone, into a zero partial (its rows and keys the same for
// every P, so the same bits), and the pairs are summed by binary trees over
// the block indices, their shape a function of seq_len only: dQ of a query
// block by a tree over the key blocks, dK and dV of a key block by a tree
// over the query blocks (of every rank; its pending subtrees travel with
// the shard), the sinks' gradient by a tree over the query blocks (each
// block's rows summed in batch, row order). Double addition is commutative
// bit for bit, and pairs the causal mask or the window hides are left out
// (the same ones for every P), so every root has the same bits whatever
// order its leaves arrive in. Within a pair, GQA sums the query heads of a
// KV head in head order (attention_backward()). Neither mode's bits are
// attention_backward()'s (it sums whole rows of blocks in one chain).
//
// Special values as attention_backward(), except one: a row whose lse is
// +inf (a score of +inf) shares its weight 1/k over the k keys with +inf
// scores of each shard, not of the whole sequence (keep scores finite).
//
// Errors as ring_attention(): every argument (shapes against the layout,
// every option, the gradients' shapes, overlaps of a gradient with an input
// or another gradient) is checked on every rank and the ranks agree before
// any data moves, and shapes and options must match across ranks; any
// failure makes every rank throw std::invalid_argument naming the function,
// the argument and the first failing rank, with no output written. An
// exception in a rank's compute reaches every rank at the end of that step
// (std::runtime_error). A rank that dies (killed) is the launcher's to
// report: under Open MPI's mpirun the job ends, every rank with it, and
// mpirun names the lost rank and exits non-zero (tested with SIGKILL,
// tests/mpi/kill_test.sh). Memory beyond the inputs and gradients: two K/V
// shard buffers, the double sums of the local queries' dQ and of one shard's
// dK / dV (twice: the one in hand and the one arriving); deterministic: per
// tree the complete subtrees whose sibling is not in yet (at most about
// P log2(seq_len / kRingBlock) blocks' sums each).
void ring_attention_backward(
    MPI_Comm comm, TensorView<const float> q, TensorView<const float> k,
    TensorView<const float> v, TensorView<const float> out, const float* lse,
    TensorView<const float> dout, const AttentionGradients& grads,
    const RingOptions& options, const float* dlse = nullptr);

}  // namespace softdot::mpi

#endif  // SOFTDOT_MPI_H_
