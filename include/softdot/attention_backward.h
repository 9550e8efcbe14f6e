// softdot: the gradients of attention() (attention_backward(), by
// recomputation), their unrounded partial sums for a ring's shards, and the
// 16-bit and float64 forms. Included by softdot/attention.h, which declares
// the views and options these take.
#ifndef SOFTDOT_ATTENTION_BACKWARD_H_
#define SOFTDOT_ATTENTION_BACKWARD_H_

#include <cstddef>
#include <span>
#include <vector>

#include "softdot/attention.h"
#include "softdot/float16.h"

namespace softdot {

// The gradients attention_backward() writes (float32). dbias and dsinks
// are optional (empty: not computed).
struct AttentionGradients {
  TensorView<float> dq;  // [B, H, n_q, d]
  TensorView<float> dk;  // [B, H_kv, n_kv, d]
  TensorView<float> dv;  // [B, H_kv, n_kv, d_v]
  // [B, H, n_q, n_kv] (with positions set, the mask's columns), dense in
  // meaning (no broadcasting): the gradient of
  // the loss with respect to each score's additive bias, dS_ij (0 where
  // key j is hidden). A bias that was broadcast takes the sum over the
  // broadcast dimensions (the caller's reduction).
  TensorView<float> dbias;
  std::span<float> dsinks;  // [H]: needs options.sinks
};

// The gradients of attention() with respect to q, k, v (and, on request,
// the bias and the sinks), given the forward's out and lse and the
// gradient dout of the loss with respect to out, by recomputation
// (FlashAttention-2): memory beyond the arguments is O(n) (dQ in double,
// per-row Delta, each thread's scratch), never an n_q x n_kv buffer.
// With s_ij the forward's score of row i and key j (attention_scores()),
// P_ij = exp(s_ij - lse_i) (exactly 0 where j is hidden),
//   dV_j  = sum_i P_ij dO_i,            dP_ij = dO_i . V_j,
//   Delta_i = sum_c dO_ic O_ic,          dS_ij = P_ij (dP_ij - Delta_i),
//   dQ_i  = scale sum_j cap'_ij dS_ij K_j,  dK_j = scale sum_i cap'_ij dS_ij
//   Q_i, dsink_h = -sum_{b,i} exp(sink_h - lse_i) Delta_i,
// cap'_ij = 1 - tanh^2(t_ij / softcap) with soft-capping (t the scaled
// score), else 1; GQA sums dK and dV over the query heads of a KV head in
// head order. Every option of attention() is honoured (causal, window,
// mask, bias, ALiBi, softcap, sinks, kv_range, positions, scale); the
// scores are recomputed in the prefill form (its blocked chains, rounded
// as attention_scores() rounds them for prefill shapes: for those shapes
// the forward's own scores, bit for bit) with the forward's exp, whatever
// form or mode (precise, batch_invariant) the forward took.
//
// Arithmetic: P, dP, dS and the products' terms in float; every sum over
// keys (dQ) or over query rows (dK, dV) is a float FMA chain over at most
// 16 terms (in index order) added into a double accumulator in order,
// Delta in double;
// each gradient is rounded once to float (dQ and dK after the multiply by
// the scale, in double). Results are bitwise the same for any number of
// threads and on every SIMD target with FMA. Error bounds: docs/accuracy.md,
// "Attention backward".
//
// Special values: a row that sees no key (fully masked) gives dQ = 0 and
// adds nothing to dK and dV, whatever dout holds; a hidden (masked) pair
// never reaches a gradient, even when its Q, K, V or dO rows hold inf or
// NaN; a row whose lse is +inf (k scores of +inf) uses the forward's limit,
// P = 1/k at those keys; a NaN in a row's visible inputs (or lse or dout)
// gives NaN in that row's dQ and in the dK, dV of the keys it sees.
//
// Arguments as attention() (std::invalid_argument naming the argument and
// the shapes): q [B, H, n_q, d], k [B, H_kv, n_kv, d], v [B, H_kv, n_kv,
// d_v], out and dout [B, H, n_q, d_v], lse B H n_q floats (attention()'s);
// the gradients the shapes above; no gradient may overlap an input or
// another gradient. out must be the float32 output of float32 weights: from
// bfloat16 inputs on the units, a forward with UnitWeights::kSplit (Delta =
// rowsum(dO O) meets the weights recomputed here, and dP - Delta cancels
// when the values' mean is far from 0: kRounded's output made dQ off by
// 3.3e-2 of its magnitude on uniform [0, 1) inputs; softdot's Python
// autograd runs kSplit for this). Threads: OpenMP over batch x KV heads x
// 64-key blocks. dlse: null, or the gradient of the loss with respect to lse (B
// H n_q floats): d lse_i / d s_ij = P_ij, so it enters as Delta_i - dlse_i (and
// the sink's P_sink dlse_i).
void attention_backward(TensorView<const float> q, TensorView<const float> k,
                        TensorView<const float> v, TensorView<const float> out,
                        const float* lse, TensorView<const float> dout,
                        const AttentionGradients& grads,
                        const AttentionOptions& options = {},
                        const float* dlse = nullptr);

// 16-bit gradients (bfloat16 or float16 q, k, v and dout): the float32
// backward on the exactly widened inputs, its double sums rounded once to
// the 16-bit format (dq, dk, dv; dbias and dsinks stay float32). out is the
// forward's output in float32: the 16-bit call's own output widened works,
// but Delta = rowsum(dO O) then carries O's 16-bit rounding, which is larger
// than dP - Delta where the values are far from 0 (ask the forward for a
// float32 output: an AttentionRequest with a 16-bit query and a float32
// output, as softdot's Python autograd does). The scores are the float32
// path's (not the units'). Memory: float32 copies of the inputs and the
// double sums (O(n)).
template <class T>
struct AttentionGradients16 {
  TensorView<T> dq, dk, dv;
  TensorView<float> dbias;
  std::span<float> dsinks;
};
void attention_backward(TensorView<const BFloat16> q,
                        TensorView<const BFloat16> k,
                        TensorView<const BFloat16> v,
                        TensorView<const float> out, const float* lse,
                        TensorView<const BFloat16> dout,
                        const AttentionGradients16<BFloat16>& grads,
                        const AttentionOptions& options = {},
                        const float* dlse = nullptr);
void attention_backward(
    TensorView<const Float16> q, TensorView<const Float16> k,
    TensorView<const Float16> v, TensorView<const float> out, const float* lse,
    TensorView<const Float16> dout, const AttentionGradients16<Float16>& grads,
    const AttentionOptions& options = {}, const float* dlse = nullptr);

// float64: attention() and attention_backward() in double arithmetic, for
// gradient checks (torch.autograd.gradcheck) and float64 pipelines. Plain
// loops over the rows (threads over rows, and over batch x KV heads in the
// backward; the bits do not depend on the thread count), not tuned for
// speed. The arguments and options are checked as attention()'s (the same
// messages); the options' arrays stay float (mask, bias, sinks, ALiBi
// slopes: their values widen exactly), and the scale is options.scale or
// 1/sqrt(d) in double (not rounded to float). Every score, weight and sum
// is computed in double: errors are a few units of 2^-53 times the
// condition (the sums of the terms' magnitudes), tested against long
// double. lse is double; special values as the float32 functions'.
void attention(TensorView<const double> q, TensorView<const double> k,
               TensorView<const double> v, TensorView<double> out,
               const AttentionOptions& options = {}, double* lse = nullptr);

struct AttentionGradients64 {
  TensorView<double> dq, dk, dv;
  TensorView<double> dbias;  // empty, or as AttentionGradients::dbias
  std::span<double> dsinks;  // empty, or [H]
};

void attention_backward(TensorView<const double> q, TensorView<const double> k,
                        TensorView<const double> v,
                        TensorView<const double> out, const double* lse,
                        TensorView<const double> dout,
                        const AttentionGradients64& grads,
                        const AttentionOptions& options = {},
                        const double* dlse = nullptr);

// The unrounded sums of attention_backward() over part of the keys, for
// ring attention's backward (softdot::mpi): the keys of k and v are a shard
// (options' kv_begin / kv_end and kv_position / q_position place them as
// in attention_partial()), while out, lse (and dout, dlse) are the whole
// sequence's results for the queries q. Dense, in (b, h, row, c) order:
//   dq     [B, H, rows, d]:     sum_j cap'_ij dS_ij K_j      (unscaled)
//   dk     [B, H_kv, keys, d]:  sum_i cap'_ij dS_ij Q_i      (unscaled)
//   dv_sum [B, H_kv, keys, d_v]: sum_i P_ij dO_i
// attention_backward_partial() adds its sums into these (each block's sum
// in the order attention_backward() takes), so the shards of a ring add up
// in place; attention_backward_finalize() multiplies dq and dk by the scale
// in double and rounds once.
struct AttentionGradientPartial {
  std::size_t batch = 0, heads = 0, kv_heads = 0, rows = 0, keys = 0, d = 0,
              dv = 0;
  std::vector<double> dq, dk, dv_sum;
  static AttentionGradientPartial zeros(std::size_t batch, std::size_t heads,
                                        std::size_t kv_heads, std::size_t rows,
                                        std::size_t keys, std::size_t d,
                                        std::size_t dv);
};

// attention_backward() over the call's keys, adding into `partial` (which
// must match the shapes: AttentionGradientPartial::zeros). extras: its dq,
// dk and dv must be empty; dbias (when given) is written at the call's key
// columns only (dbias has the mask's columns: kv_position + n_kv with
// positions set), dsinks (when given) is written whole: pass it to one
// shard's call only, as the sinks are passed to one part of the forward.
void attention_backward_partial(
    TensorView<const float> q, TensorView<const float> k,
    TensorView<const float> v, TensorView<const float> out, const float* lse,
    TensorView<const float> dout, AttentionGradientPartial& partial,
    const AttentionOptions& options = {}, const AttentionGradients& extras = {},
    const float* dlse = nullptr);

// Rounds a partial's sums into float gradients: dq and dk times scale (the
// forward's float scale, AttentionPlan::scale()) in double, each element
// rounded once; dv_sum rounded once. Empty views are skipped; the others
// must have the partial's shapes (std::invalid_argument).
void attention_backward_finalize(const AttentionGradientPartial& partial,
                                 float scale, TensorView<float> dq,
                                 TensorView<float> dk, TensorView<float> dv);

}  // namespace softdot

#endif  // SOFTDOT_ATTENTION_BACKWARD_H_
