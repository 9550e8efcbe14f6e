// softdot: fused scaled dot-product attention, its partial results and their
// merge, and the explicit score and weight matrices.
#ifndef SOFTDOT_ATTENTION_H_
#define SOFTDOT_ATTENTION_H_

#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <type_traits>
#include <vector>

#include "softdot/float16.h"
#include "softdot/matrix.h"

namespace softdot {

// A strided 4-D view [batch, heads, rows, cols], row-major within a row;
// element (b, h, r, c) is data[b * batch_stride + h * head_stride +
// r * row_stride + c]. Strides are in elements. Q, K, V and O need
// row_stride >= cols (when rows > 1). For a mask or a bias, a stride of 0
// broadcasts that dimension (batch, heads or rows), and batch or heads of 1
// broadcast too. Never owns or allocates.
template <class T>
struct TensorView {
  T* data = nullptr;
  std::size_t batch = 1;
  std::size_t heads = 1;
  std::size_t rows = 0;
  std::size_t cols = 0;
  std::size_t batch_stride = 0;
  std::size_t head_stride = 0;
  std::size_t row_stride = 0;

  constexpr TensorView() = default;
  // Dense [batch, heads, rows, cols].
  constexpr TensorView(T* data_, std::size_t batch_, std::size_t heads_,
                       std::size_t rows_, std::size_t cols_)
      : data(data_),
        batch(batch_),
        heads(heads_),
        rows(rows_),
        cols(cols_),
        batch_stride(heads_ * rows_ * cols_),
        head_stride(rows_ * cols_),
        row_stride(cols_) {}
  // Fully strided.
  constexpr TensorView(T* data_, std::size_t batch_, std::size_t heads_,
                       std::size_t rows_, std::size_t cols_,
                       std::size_t batch_stride_, std::size_t head_stride_,
                       std::size_t row_stride_)
      : data(data_),
        batch(batch_),
        heads(heads_),
        rows(rows_),
        cols(cols_),
        batch_stride(batch_stride_),
        head_stride(head_stride_),
        row_stride(row_stride_) {}
  // One head of one batch.
  constexpr TensorView(MatrixView<T> m)  // NOLINT: implicit
      : data(m.data), rows(m.rows), cols(m.cols), row_stride(m.stride) {}
  // A view of mutable data converts to a view of const data.
  template <class U, class = std::enable_if_t<std::is_same_v<const U, T> &&
                                              !std::is_same_v<U, T>>>
  constexpr TensorView(const TensorView<U>& o)  // NOLINT: implicit
      : data(o.data),
        batch(o.batch),
        heads(o.heads),
        rows(o.rows),
        cols(o.cols),
        batch_stride(o.batch_stride),
        head_stride(o.head_stride),
        row_stride(o.row_stride) {}

  constexpr bool empty() const { return data == nullptr; }
  constexpr T* row(std::size_t b, std::size_t h, std::size_t r) const {
    return data + b * batch_stride + h * head_stride + r * row_stride;
  }
};

// Options of attention(), attention_weights() and attention_scores().
struct AttentionOptions {
  // Scores are (q . k) * scale, with scale rounded to float. Not set (the
  // default): 1 / sqrt(d). A set scale must be finite and > 0, and stay
  // > 0 and finite when rounded to float (std::invalid_argument; a NaN is
  // an error, never the default).
  std::optional<double> scale;

  // Positions. Query i of n_q is aligned with key position
  // p(i) = i + n_kv - n_q, so that the last query sees the last key (the
  // KV-cache decode convention: n_q new tokens appended to n_kv - n_q cached
  // ones). With n_q > n_kv the first n_q - n_kv queries see no key under
  // causal masking and get zero rows.
  //
  // causal: key j is visible only if j <= p(i).
  bool causal = false;
  // Sliding window: key j is visible only if p(i) - window_left <= j and
  // j <= p(i) + window_right. -1 means unbounded on that side (the default);
  // other negative values are an error. causal is window_right = 0.
  std::ptrdiff_t window_left = -1;
  std::ptrdiff_t window_right = -1;

  // Logit soft-capping: when > 0, each scaled score s becomes
  // softcap * tanh(s / softcap) (before the bias and the mask). 0 = off.
  // Must be finite and >= 0.
  float softcap = 0.0f;

  // Boolean mask [batch, heads, n_q, n_kv], true = attend (PyTorch's
  // convention); batch and heads may be 1 or have stride 0 (broadcast), and
  // so may rows (row_stride 0: one mask row for every query). Empty: none.
  // heads counts query heads.
  TensorView<const bool> mask;
  // Additive float bias with the same shape and broadcasting rules, added
  // to the (scaled, soft-capped) score. A bias of -inf masks the key.
  TensorView<const float> bias;

  // Attention sinks: one logit per query head (sinks.size() == heads of Q),
  // in the units of the scaled score. A sink adds exp(sink) to each row's
  // denominator and nothing to its output, so a row's weights sum to less
  // than 1. Empty: none. With partial results, pass the sinks to one of the
  // parts only.
  std::span<const float> sinks;

  // ALiBi: one slope per query head (alibi_slopes.size() == heads of Q),
  // computed in the kernel rather than passed as a bias tensor: the score
  // of query i and key j gains slope_h (pos_j - pos_i), the positions those
  // causal compares (bottom-right by default, q_position / kv_position, a
  // paged cache's positions), computed in double and rounded once to float
  // (exact distance below 2^53), then added as a bias is: bit for bit the
  // call with that bias. Slopes finite; not with a bias. Empty: none.
  std::span<const float> alibi_slopes;

  // Partial attention: only keys kv_begin <= j < kv_end of K and V are used
  // (kv_end is clamped to n_kv; kv_begin past the clamped kv_end is an
  // error, kv_begin == kv_end an empty range). Positions (causal, window) and
  // the mask and bias columns still refer to the full K and V, so attention
  // over [a, b) and [b, c) merged by attention_merge equals attention over [a,
  // c).
  std::size_t kv_begin = 0;
  std::size_t kv_end = std::numeric_limits<std::size_t>::max();

  // Global positions, for a call that holds part of a longer sequence
  // (ring attention: softdot::mpi::ring_attention, <softdot/mpi.h>). Key j
  // of K and V sits at position kv_position + j; query i at q_position + i,
  // where kAutoPosition (the default) means kv_position + n_kv - n_q (the
  // convention above). causal and the window compare these positions. With
  // both left at their defaults everything is as described above, bit for
  // bit. With either set, the mask and bias columns are key positions:
  // key j reads column kv_position + j, so they need at least
  // kv_position + n_kv columns (a caller passes the mask rows of its own
  // queries over every position of the sequence). attention(),
  // attention_partial(), attention_weights() and attention_scores() only;
  // paged_attention() rejects them.
  static constexpr std::size_t kAutoPosition =
      std::numeric_limits<std::size_t>::max();
  std::size_t q_position = kAutoPosition;
  std::size_t kv_position = 0;

  // Always the prefill form (below), whatever the number of rows, as
  // precise does: a row's bits then do not depend on how many query rows
  // the call has (softdot::mpi's deterministic ring uses it). Decode shapes
  // run several times slower. attention_weights() and attention_scores()
  // round the scores of that form too.
  bool prefill_form = false;

  // Batch-invariant bits at the decode form's speed: every row is computed
  // in the decode form's arithmetic (scores as 16-lane FMA chains reduced
  // in a fixed tree, attention.h "two forms"), its keys cut into chunks of
  // 512 at fixed key indices (keys 512 c .. 512 c + 511 of the sequence)
  // whose states are merged in chunk order, and the sink (if any) merged
  // last. A row's bits then depend only on its query row, the keys and
  // values it sees and the options: not on the other rows of the call, the
  // other sequences of a batch (ragged or not), where a chunked prefill cut
  // its prompt, whether it is a prefill, decode or verification row, or
  // the thread count. Decode shapes run at the default's decode speed
  // (bfloat16 rows that would take the units' decode run the decode form);
  // prefill shapes run the decode form in groups of 16 rows, each group
  // reading its keys once (docs/performance.md has the cost). Not the
  // default's bits (its prefill rows round their scores differently, its
  // chunks start at kv_begin and its sink enters the first chunk); within
  // the same bounds. Not with precise or prefill_form (each already gives
  // a row bits of its own, in the prefill form).
  bool batch_invariant = false;

  // How the weights P enter the P V product when the products run on
  // bfloat16 units (bfloat16 queries, keys and values; matrix_unit() in
  // simd.h names the unit; "16-bit attention" below has the bounds):
  // kRounded rounds each P once to bfloat16 (as other libraries do: the
  // default); kSplit writes P as its nearest bfloat16 plus the bfloat16
  // nearest to the rest, two products, for an error close to the float32
  // path's. Without units (matrix_unit() "none") P stays float either way.
  enum class UnitWeights { kRounded, kSplit };
  UnitWeights unit_weights = UnitWeights::kRounded;

  // Precise scores (attention() and attention_partial() only): each score
  // is one double FMA chain over d (the float products are exact in
  // double), scaled in double and kept as two floats hi + lo (within
  // 2^-48 |s|); the bias is added to hi with its exact error (TwoSum) going
  // into lo, and exp takes (hi - m) with the exact error of that
  // subtraction plus lo as its correction term. So the weights no longer
  // inherit the float score's u |s| rounding: the error stays a few u W for
  // scores far from 0 (|s| ~ 100), where the default's D term grows with
  // |s|. Everything after the scores is the default's arithmetic. Always
  // runs the prefill form, even for decode shapes (at most 16 rows per KV
  // head: no key-range split, each row's lanes mostly empty, so decode is
  // several times slower). With soft-capping the capped score is rounded to
  // float (lo dropped), as in the default. attention_weights() and
  // attention_scores() ignore it. Costs 1.7x (d = 64) to 2x (d = 128) the
  // default's prefill time (docs/performance.md), and each thread's scratch
  // grows by 4 (128 d + 4128) bytes (Q in double, the low parts).
  bool precise = false;
};

// Every option of AttentionOptions as (name, value) pairs, by value: what
// a caller that splits one attention over processes compares across them
// (softdot::mpi's rings and softdot.distributed's gloo ring do, and refuse
// a difference). A view (mask, bias) counts by presence, since each process
// holds its own rows of it; a span (sinks, alibi_slopes) by its length and
// a 64-bit hash of its bits. Every option appears: a new one is added here
// (the build checks AttentionOptions' size against this list).
struct OptionField {
  const char* name;
  std::int64_t value;
};
std::vector<OptionField> option_fingerprint(const AttentionOptions& options);

// int8 keys or values, quantised symmetrically with one float scale per
// (batch, KV head, token), as quantize_kv produces them: element
// (b, h, j, c) stands for the float scale * values(b, h, j, c) (the product
// rounded once to float: the "dequantised" value). Every function that
// takes Int8KV computes exactly what it computes for float K and V holding
// the dequantised values, bit for bit, so every bound below holds for them;
// the quantisation error itself is quantize_kv's (at most (0.5 + 2^-15)
// scale per element). Scales must be finite and >= 0 (std::invalid_argument
// naming the first bad one otherwise).
struct Int8KV {
  TensorView<const std::int8_t> values;  // [B, H_kv, n_kv, d or d_v]
  TensorView<const float> scales;        // [B, H_kv, n_kv, 1]
};

// Quantises float rows for Int8KV: for each row (b, h, j),
//   scale = max_c |x_c| / 127 (rounded to float; when that is below
//           2^-126, the smallest float with 127 scale >= max_c |x_c|),
//   values_c = round(x_c / scale) (to nearest, ties away from zero),
// so |values_c| <= 127 and |scale values_c - x_c| <= (0.5 + 2^-15) scale; a
// row of zeros gets scale 0 and values 0. values has x's shape, scales
// [batch, heads, rows, 1] (strided views allowed); std::invalid_argument
// naming the shapes otherwise, or naming the first row that holds inf or
// NaN (nothing is written then). Single-threaded; does not allocate.
void quantize_kv(TensorView<const float> x, TensorView<std::int8_t> values,
                 TensorView<float> scales);

// Scaled dot-product attention, fused:
//   O[b, h, i, :] = sum_j w_ij V[b, h / g, j, :],
//   w_ij = softmax_j(s_ij) with s_ij = mask(bias + cap(scale * Q_i . K_j))
// for every batch b and query head h, where g = heads(Q) / heads(K)
// (grouped-query attention; heads(K) = 1 is multi-query attention).
//
// Shapes (std::invalid_argument naming both shapes otherwise):
//   q [B, H, n_q, d], k [B, H_kv, n_kv, d], v [B, H_kv, n_kv, d_v],
//   out [B, H, n_q, d_v], H a multiple of H_kv, n_q, d, d_v >= 1
//   (n_kv may be 0: every row is then fully masked).
// lse: null, or B * H * n_q floats, dense in (b, h, i) order, receiving the
// natural log of each row's denominator, m + log(sum_j exp(s_ij - m)) (with
// the sink's term), -inf for a fully masked row without a sink (with a
// sink, the sink's logit).
//
// Computation: online softmax over blocks of 64 keys (the state and merge
// rule of docs/accuracy.md), so memory beyond the inputs is a few hundred
// KiB per thread whatever n_q and n_kv are; blocks the causal mask or the
// window removes entirely are skipped. Two forms, chosen by shape alone:
//   prefill (more than 16 query rows per KV head): query rows in vector
//     lanes; each score is blocked chains: a float FMA chain over each block
//     of 16 features in index order, the blocks' chains added in order;
//   decode (at most 16 rows per KV head, e.g. n_q = 1 with GQA): features
//     in lanes; each score is 16 float FMA chains (feature k in chain
//     k mod 16) added in a fixed pairwise tree; the key range is cut into
//     chunks of 512 keys whose states are merged in order.
// In both, exp takes s - max in float, the block sums are taken in double,
// and the output sums are float FMA chains over at most 64 keys (prefill:
// a chain over each 16 keys, added in order), added into double running
// sums. AttentionOptions::precise changes the scores (see there; its D_i is
// in docs/accuracy.md, "Precise mode").
// Accuracy (docs/accuracy.md, "Attention", has the derivation and the
// measured errors): with W = sum_j w_j |V_jc| over the visible keys (the
// exact weights w of the exact scores of these float inputs), u = 2^-24,
//   |O_ic - exact| <= (2 D_i + 70 u) W + u |exact|
//                     + 2^-149 (n_kv + 1 + sum_j |V_jc|),
//   D_i = max_j [scale * gamma_{n_d} * sum_k |Q_ik K_jk|
//                + 2u (|s'_ij| + |s_ij|)]   (+ 4u * softcap when soft-capping),
//   n_d = min(d, 16) + ceil(d / 16) - 1   (23 at d = 128, 19 at d = 64),
// where s' is the scaled score and s the final one (gamma_n = n u/(1 - n u);
// n_d is the most roundings a product passes through in either form's dot):
// the error of the float scores, moved into the weights by exp, plus at most
// a 64-term float sum per block; the last term is float underflow (weights
// and partial sums below 2^-126 are subnormal, spaced 2^-149 apart).
// W / |O| is the condition of the weighted
// sum, so the relative error is at most (2 D + 70 u) times it; measured
// errors are a few u times it.
//
// Special values: a fully masked row (every key masked, by mask, bias,
// causal, window, or an empty key range) gives an output row of +0 and
// lse -inf (with a sink: lse = the sink, the sink's share being the whole
// denominator). A NaN in a query row, or in a visible key or value, gives NaN
// in the rows that see it; masked keys and values never reach the output, even
// when they hold NaN or inf. k scores of +inf give the mean of their values.
//
// Threads: OpenMP over batch x KV heads x blocks of query rows (prefill),
// or over batch x KV heads x 512-key chunks (decode). Results are bitwise the
// same for any number of threads and for every SIMD target with FMA.
// Allocation: each thread keeps a scratch buffer of about
// 4 (128 d + 192 d_v + 10048) bytes (204 KB at d = d_v = 128) between calls,
// and the calling thread the chunk states (8 (d_v + 2) bytes per row and
// chunk in the decode form); these buffers only grow.
// out and lse must not share a byte with any input (q, k, v, the mask, the
// bias, the sinks, the slopes) nor with each other: std::invalid_argument
// naming both ("out overlaps q").
void attention(TensorView<const float> q, TensorView<const float> k,
               TensorView<const float> v, TensorView<float> out,
               const AttentionOptions& options = {}, float* lse = nullptr);
void attention(TensorView<const float> q, TensorView<const Float16> k,
               TensorView<const Float16> v, TensorView<float> out,
               const AttentionOptions& options = {}, float* lse = nullptr);
void attention(TensorView<const float> q, TensorView<const BFloat16> k,
               TensorView<const BFloat16> v, TensorView<float> out,
               const AttentionOptions& options = {}, float* lse = nullptr);
void attention(TensorView<const float> q, const Int8KV& k, const Int8KV& v,
               TensorView<float> out, const AttentionOptions& options = {},
               float* lse = nullptr);

// 16-bit attention: queries, keys, values and the output in bfloat16 (or
// float16); lse stays float. Any other mix (a 16-bit query with float32,
// int8 or the other 16-bit format for K/V, a float32 output for a 16-bit
// query) is an AttentionRequest (attention_request.h). The query is widened
// exactly; the output is the double result rounded once to its format.
// Where queries, keys and values are all bfloat16, the prefill form (not
// precise) runs Q K^T and P V on the CPU's bfloat16 dot-product units
// (matrix_unit(), simd.h: VDPBF16PS on AVX512-BF16) with the softmax between
// them as above; so does the decode form with 12 to 16 rows per KV head
// (speculative verification, n_q = 4 with 4 query heads per KV head): each
// chunk of 512 keys runs the units' prefill form, and the chunks' states
// merge as the decode form's do. With fewer rows (decode: one query row per
// head) and d, d_v multiples of 32, the decode form itself runs on the
// units (features in lanes, as the float decode form), except with
// batch_invariant. Elsewhere (float16, d or d_v not a multiple of 32,
// batch_invariant's decode rows, no units) the products are the float32
// path's, exact widenings of the 16-bit inputs.
// Accuracy on the units (docs/accuracy.md, "16-bit attention"): the bound
// above, with these changes. The scores: each pair step of VDPBF16PS is two
// FMAs, and the units chain 32 features (not 16) before adding the chain to
// the running score, so n_d = min(d, 32) + ceil(d / 32) - 1 (35 at d = 128);
// the decode form on the units chains each of 8 lanes over d / 16 pair
// steps and adds the lanes in a tree, n_d = d / 8 + 3 (19 at d = 128, 35 at
// d = 256);
// a subnormal bfloat16 input reads as zero and a sum below 2^-126 is written
// as zero, which adds scale (sum of |Q_ik K_jk| over the products with a
// subnormal factor + 2 d 2^-126) to D_i. P V: one chain over each 64-key
// tile (64 roundings per term, 128 with kSplit's two products, not 16 + 3:
// 70 u becomes 120 u, 190 u with kSplit). The weights:
// P enters P V rounded to the nearest bfloat16 (u_bf16 = 2^-8), which adds
// 2^-8 W (UnitWeights::kRounded, the default), or as a bfloat16 high part
// plus the bfloat16 nearest to the rest, which adds 2^-16 W (kSplit); the
// underflow term becomes 2^-126 (n_kv + 1 + sum_j |V_jc|). A 16-bit output
// adds its rounding, 2^-8 |exact| for bfloat16 and 2^-11 |exact| for float16
// (so a bfloat16 output's error is at least its rounding, whatever P's
// mode: ask for a float32 output to see kSplit's accuracy). The units' bits
// are the same on every CPU with them and for any thread count; they differ
// from the float32 path's (matrix_unit() "none") by at most the two bounds
// together.
void attention(TensorView<const BFloat16> q, TensorView<const BFloat16> k,
               TensorView<const BFloat16> v, TensorView<BFloat16> out,
               const AttentionOptions& options = {}, float* lse = nullptr);
void attention(TensorView<const Float16> q, TensorView<const Float16> k,
               TensorView<const Float16> v, TensorView<Float16> out,
               const AttentionOptions& options = {}, float* lse = nullptr);

// Merges two partial results over disjoint key ranges (split-KV decoding,
// ring attention): with m = max(lse_a, lse_b), w_a = exp(lse_a - m),
// w_b = exp(lse_b - m),
//   out = (w_a o_a + w_b o_b) / (w_a + w_b),  lse = m + log(w_a + w_b),
// in double. A part with lse -inf (fully masked) is the identity; both -inf
// gives zeros and -inf; a NaN lse or output gives NaN. Shapes of o_a, o_b,
// out equal (else std::invalid_argument); each lse array holds
// batch * heads * rows floats. out may be o_a or o_b (in place), and lse may
// be lse_a or lse_b.
void attention_merge(TensorView<const float> o_a, const float* lse_a,
                     TensorView<const float> o_b, const float* lse_b,
                     TensorView<float> out, float* lse);

// The unrounded partial result of attention() over part of the keys, for
// merging many parts (split-KV decoding over P ranges, ring attention across
// processes) without rounding to float at every merge. For each query row,
// numbered r = (b * heads + h) * rows + i:
//   max[r]           the largest visible score (or the sink, if larger); -inf
//                    when no key is visible,
//   sum[r]           sum_j exp(s_rj - max[r]) over the visible keys, plus the
//                    sink's exp(sink - max[r]) (double),
//   out[r * dv + c]  sum_j exp(s_rj - max[r]) V_jc (double, not divided by
//                    sum[r]).
// A NaN anywhere in a row's visible inputs makes sum[r] NaN. The arrays are
// plain vectors so that they can be sent as they are (MPI, files).
struct AttentionPartial {
  std::size_t batch = 0;
  std::size_t heads = 0;  // query heads
  std::size_t rows = 0;   // query rows n_q
  std::size_t dv = 0;
  std::vector<float> max;
  std::vector<double> sum;
  std::vector<double> out;

  // The identity of attention_merge: every row empty (max -inf, sum 0,
  // out 0), the partial result of an empty key range.
  // std::invalid_argument when batch x heads x rows x dv doubles would not
  // fit in memory (the product wraps or exceeds PTRDIFF_MAX bytes).
  static AttentionPartial empty(std::size_t batch, std::size_t heads,
                                std::size_t rows, std::size_t dv);
  std::size_t row_count() const noexcept { return batch * heads * rows; }
};

// attention() over options.kv_begin <= j < options.kv_end, stopped before
// the division by the sum: attention_finalize(partial) equals attention()
// with the same arguments bit for bit (out and lse), on every target and
// for any number of threads. Arguments, checks and threads as attention();
// partial is resized to q's batch, heads, rows and v's d_v (its vectors only
// grow, so a reused partial does not allocate). Sinks: pass them to one part
// only. Nothing is written when an argument is invalid.
void attention_partial(TensorView<const float> q, TensorView<const float> k,
                       TensorView<const float> v, AttentionPartial& partial,
                       const AttentionOptions& options = {});
void attention_partial(TensorView<const float> q, TensorView<const Float16> k,
                       TensorView<const Float16> v, AttentionPartial& partial,
                       const AttentionOptions& options = {});
void attention_partial(TensorView<const float> q, TensorView<const BFloat16> k,
                       TensorView<const BFloat16> v, AttentionPartial& partial,
                       const AttentionOptions& options = {});
void attention_partial(TensorView<const float> q, const Int8KV& k,
                       const Int8KV& v, AttentionPartial& partial,
                       const AttentionOptions& options = {});

// a = merge(a, b) for partial results over disjoint key ranges, row by row,
// in double: m = max(m_a, m_b), w_x = exp(m_x - m) (exactly 1 for the side
// holding m), sum = w_a sum_a + w_b sum_b, out = w_a out_a + w_b out_b. An
// empty row (sum 0) is the identity, bit for bit; a NaN row gives NaN.
// Commutative bit for bit. Each merge adds at most 2 roundings of 2^-53
// relative to sum and out (and the weights' 2^-53), so a chain of P merges
// is within about 3P 2^-53 of the exact merge of its parts: far below the
// float rounding of the result (tested with P = 64). Same batch, heads,
// rows and dv, else std::invalid_argument naming both. Does not allocate;
// single-threaded. b may be a.
void attention_merge(AttentionPartial& a, const AttentionPartial& b);

// The output and lse of a partial result: out[b, h, i, :] = out_r / sum_r
// (each element rounded once to float), lse = max_r + log(sum_r) (in
// double, rounded once); an empty row gives +0 and lse -inf, a NaN row NaN,
// as attention() does. out [batch, heads, rows, dv] as the partial's, else
// std::invalid_argument; lse null or batch * heads * rows floats.
void attention_finalize(const AttentionPartial& partial, TensorView<float> out,
                        float* lse = nullptr);

// The page table of a paged K/V cache, as LLM serving engines keep it:
// each sequence's keys and values lie in fixed-size pages of page_size
// tokens (any pages, in any order, shared or not), and
//   key position t of sequence b lies in page
//   block_table[b * blocks_per_seq + t / page_size], row t % page_size,
// for 0 <= t < seq_lens[b]. Entries past a sequence's last used page
// (t / page_size for t >= seq_lens[b]) are never read and may hold anything
// (-1 padding, say).
//
// A ragged batch (what serving engines pass: vLLM's query_start_loc,
// flash-attn's cu_seqlens_q): with query_start_loc given (B + 1 entries,
// query_start_loc[0] = 0, non-decreasing, query_start_loc[B] = T), q holds
// every sequence's rows one after another, [1, H, T, d] (vLLM's [T, H, d] is
// the view with head_stride d and row_stride H d), and sequence b's query
// rows are rows query_start_loc[b] .. query_start_loc[b + 1] - 1: its own
// n_q, any mix of prefill chunks, decode rows and verification rows, a
// sequence with no rows allowed. out is [1, H, T, d_v] the same way, lse
// [H, T] (h T + t), a partial result batch 1 with T rows. Each sequence
// computes exactly what the call on that sequence alone computes (its own
// n_q and seq_lens[b]; the form, the split and the bits depend on its own
// shape only, not on its companions). A sequence's rows are its newest
// tokens, so it may not have more rows than keys (n_q <= seq_lens[b]; an
// error naming the sequence otherwise, unless query_positions place the
// rows). The mask and the bias, and the weights and scores targets, are not
// supported in this form.
//
// Positions (a cache sharded by position, as decode context parallelism
// lays it out: key c of rank r of P at global position c P + r): with
// query_positions given ([batch]), sequence b's query row i sits at position
// query_positions[b] + i and its key j at j * kv_position_stride +
// kv_position_offsets[b] (offsets [batch]; empty: 0); causal and the window
// compare these positions (key j visible to row i when pos(i) - window_left
// <= pos(j) <= pos(i) + window_right). stride in [1, 2^62), query positions
// in (-2^62, 2^62) (negative: rows before the first key, as the default
// gives when n_q > seq_lens[b]), offsets in [0, 2^62). Each rank's partial
// result (paged_attention_partial) then
// merges with the others' (attention_merge) into the attention over the
// whole cache. Default (empty): key j at j, row i at i + seq_lens[b] - n_q.
//
// A draft tree (speculative verification, as tree decoding lays it out):
// with draft_parents given (one entry per query row: T entries with
// query_start_loc, row query_start_loc[b] + i; else B n_q, row b n_q + i),
// sequence b's n_q rows are draft tokens whose keys are its last n_q keys
// (row i's at key seq_lens[b] - n_q + i), and draft_parents of row i is
// the row of its parent within the sequence (0 <= p < i), or -1 for a token
// that follows the cached prefix directly. Row i then sees the prefix
// (keys 0 .. seq_lens[b] - n_q - 1) and the keys of its ancestors and
// itself, nothing else of the draft: each draft token sees what it would
// see alone on its branch (causal and the window still apply, by key
// index). A chain (parent i - 1, -1 for row 0) is plain causal attention.
// Needs n_q <= seq_lens[b]; not with a mask, a bias or query_positions.
struct PagedKVTable {
  std::span<const std::int32_t> block_table;  // [batch * blocks_per_seq]
  std::size_t blocks_per_seq = 0;
  std::span<const std::int32_t> seq_lens;  // [batch]: n_kv of each sequence
  // Empty, or [batch + 1]: a ragged batch (above).
  std::span<const std::int32_t> query_start_loc{};
  // Empty, or [batch]: positions (above).
  std::span<const std::int64_t> query_positions{};
  std::span<const std::int64_t> kv_position_offsets{};
  std::size_t kv_position_stride = 1;
  // Empty, or one per query row: a draft tree (above).
  std::span<const std::int32_t> draft_parents{};
};

// attention() over a paged K/V cache: for each sequence b, exactly what
// attention() computes for q's batch b against contiguous K and V holding
// that sequence's seq_lens[b] keys and values in position order, bit for
// bit (out and lse), for every format, option, thread count and SIMD target.
// The pages are read in place; float32 tiles of 64 keys that cross a page
// boundary are copied into the thread's scratch first, so bits do not depend
// on the page size or the page order either.
//
// Shapes (std::invalid_argument naming the function, the argument and both
// shapes otherwise):
//   q [B, H, n_q, d], k_pages [P, H_kv, page_size, d],
//   v_pages [P, H_kv, page_size, d_v], out [B, H, n_q, d_v],
// with P pages of page_size >= 1 tokens, H a multiple of H_kv; strides make
// vLLM's [P, page_size, H_kv, d] layout a view too (row_stride H_kv d,
// head_stride d). table: seq_lens.size() == B, block_table.size() ==
// B * blocks_per_seq, 0 <= seq_lens[b] <= blocks_per_seq * page_size (and
// below 2^30), and every entry a key reads a page index in [0, P); int8
// scales [P, H_kv, page_size, 1], and every scale a key reads finite and
// >= 0. Each error names the function and the argument (with the shapes),
// and a table or scale error also the sequence and the entry (or position);
// everything is checked before any work, so nothing is written and no page
// is read on an error.
//
// Options as attention(), per sequence with n_kv = seq_lens[b]: query i sits
// at position i + seq_lens[b] - n_q (chunked prefill: n_q new tokens at the
// end of the cached ones; decode: n_q = 1), and causal, the window and the
// positions follow from it. Mask and bias columns are key positions: they
// need at least max_b seq_lens[b] columns (the rest are not read), rows n_q,
// batch 1 or B, heads 1 or H. kv_begin <= kv_end is required, and both are
// clamped to each seq_lens[b] (a range past a sequence's end is empty for
// it: zero rows, lse -inf or the sink; attention() would reject a kv_begin
// past n_kv, which a batch of different lengths cannot avoid).
//
// lse, accuracy, special values, threads and allocation as attention(); a
// sequence of length 0 gives zero rows and lse -inf (or the sink). The work
// split depends on q's shape and seq_lens only. out and lse must not overlap
// any input (the pages and the table included; std::invalid_argument).
void paged_attention(TensorView<const float> q, TensorView<const float> k_pages,
                     TensorView<const float> v_pages, const PagedKVTable& table,
                     TensorView<float> out,
                     const AttentionOptions& options = {},
                     float* lse = nullptr);
void paged_attention(TensorView<const float> q,
                     TensorView<const Float16> k_pages,
                     TensorView<const Float16> v_pages,
                     const PagedKVTable& table, TensorView<float> out,
                     const AttentionOptions& options = {},
                     float* lse = nullptr);
void paged_attention(TensorView<const float> q,
                     TensorView<const BFloat16> k_pages,
                     TensorView<const BFloat16> v_pages,
                     const PagedKVTable& table, TensorView<float> out,
                     const AttentionOptions& options = {},
                     float* lse = nullptr);
// int8 and fp8 pages: values [P, H_kv, page_size, d or d_v] and scales
// [P, H_kv, page_size, 1] (fp8: or a per-tensor scale), paged alike through
// the same table.
void paged_attention(TensorView<const float> q, const Int8KV& k_pages,
                     const Int8KV& v_pages, const PagedKVTable& table,
                     TensorView<float> out,
                     const AttentionOptions& options = {},
                     float* lse = nullptr);

// paged_attention() stopped before the division by the sum, as
// attention_partial() is: attention_finalize(partial) equals
// paged_attention() with the same arguments bit for bit. partial is resized
// to q's batch, heads, rows and v_pages' d_v.
void paged_attention_partial(TensorView<const float> q,
                             TensorView<const float> k_pages,
                             TensorView<const float> v_pages,
                             const PagedKVTable& table,
                             AttentionPartial& partial,
                             const AttentionOptions& options = {});
void paged_attention_partial(TensorView<const float> q,
                             TensorView<const Float16> k_pages,
                             TensorView<const Float16> v_pages,
                             const PagedKVTable& table,
                             AttentionPartial& partial,
                             const AttentionOptions& options = {});
void paged_attention_partial(TensorView<const float> q,
                             TensorView<const BFloat16> k_pages,
                             TensorView<const BFloat16> v_pages,
                             const PagedKVTable& table,
                             AttentionPartial& partial,
                             const AttentionOptions& options = {});
void paged_attention_partial(TensorView<const float> q, const Int8KV& k_pages,
                             const Int8KV& v_pages, const PagedKVTable& table,
                             AttentionPartial& partial,
                             const AttentionOptions& options = {});

// The explicit weights w_ij of attention() with the same q, k and options,
// into weights [B, H, n_q, n_kv] (for small inputs: debugging, teaching).
// The scores are those of attention_scores() below (rounded as in the form
// attention() takes for these shapes); one routine computes them for both.
// Each row is then a softmax in double over its visible scores and the sink,
// each weight rounded once to float, so attention() equals weights . V
// within the bound above.
// Keys outside [kv_begin, kv_end) and masked keys get weight +0.
void attention_weights(TensorView<const float> q, TensorView<const float> k,
                       TensorView<float> weights,
                       const AttentionOptions& options = {});
void attention_weights(TensorView<const float> q, TensorView<const Float16> k,
                       TensorView<float> weights,
                       const AttentionOptions& options = {});
void attention_weights(TensorView<const float> q, TensorView<const BFloat16> k,
                       TensorView<float> weights,
                       const AttentionOptions& options = {});
void attention_weights(TensorView<const float> q, const Int8KV& k,
                       TensorView<float> weights,
                       const AttentionOptions& options = {});

// The final scores s_ij of attention() and attention_weights() with the same
// q, k and options, into scores [B, H, n_q, n_kv] (for small inputs:
// debugging, teaching; the softdot command's --explain):
//   s_ij = cap(scale * Q_i . K_j) + bias_ij  for a key j visible to row i,
//   s_ij = -inf                              for every other key,
// where key j is visible to query row i when it lies in [kv_begin, kv_end)
// and inside the causal and window limits, the mask (if any) is true there,
// and the bias (if any) is not -inf there. Q_i . K_j is rounded as in the
// form attention() takes for these shapes (prefill: blocked chains over 16
// features, added in order; decode: 16 chains added in the fixed tree),
// multiplied by the float scale, soft-capped with the kernel's tanh, then the
// bias is added in float. attention_weights() takes its scores from the same
// internal routine, so its weights are, bit for bit, the softmax of each row of
// these scores with the sink (sink = -inf when there is none):
//   m = max(sink, max_j s_ij),
//   w_ij = exp(s_ij - m) / (exp(sink - m) + sum_k exp(s_ik - m))
// in double, each weight rounded once to float; a -inf score adds 0 and
// gets weight +0. Accuracy: |s_ij - exact| <= D_i of attention()'s bound.
//
// Special values: -inf marks a key that takes no part in the softmax. A
// visible key's score can also be -inf (Q_i . K_j overflowing to -inf with a
// finite bias, say); its weight is +0 as well, so the softmax of the row
// does not depend on which of the two a -inf is. A row with no visible key
// is all -inf. A NaN in a query row gives NaN at that row's visible keys, a
// NaN in a visible key's K row or bias gives NaN at that key; a hidden key's
// score is -inf even when its K row or bias holds NaN or inf. The sink is
// not a column of the scores.
//
// Shapes and errors as attention() (std::invalid_argument naming the
// argument and both shapes): q [B, H, n_q, d], k [B, H_kv, n_kv, d],
// scores [B, H, n_q, n_kv], and the same checks of every option (sinks
// included, though they do not change the scores). scores must not overlap
// any input (std::invalid_argument). Threads: none (the calling thread).
// Allocation: temporaries of about 4 n_kv (d + 2) bytes per call.
void attention_scores(TensorView<const float> q, TensorView<const float> k,
                      TensorView<float> scores,
                      const AttentionOptions& options = {});
void attention_scores(TensorView<const float> q, TensorView<const Float16> k,
                      TensorView<float> scores,
                      const AttentionOptions& options = {});
void attention_scores(TensorView<const float> q, TensorView<const BFloat16> k,
                      TensorView<float> scores,
                      const AttentionOptions& options = {});
void attention_scores(TensorView<const float> q, const Int8KV& k,
                      TensorView<float> scores,
                      const AttentionOptions& options = {});

}  // namespace softdot

// The gradients (attention_backward() and its partial form): a header of
// their own, part of this one.
#include "softdot/attention_backward.h"  // IWYU pragma: export
#include "softdot/attention_fp8.h"       // IWYU pragma: export

#endif  // SOFTDOT_ATTENTION_H_
