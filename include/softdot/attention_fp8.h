// softdot: attention over fp8 K/V caches (e4m3fn, e5m2; float8.h): the
// Float8KV view and the float-query entry points that take it. Their rules
// are attention.h's for the same functions (int8's overloads there).
#ifndef SOFTDOT_ATTENTION_FP8_H_
#define SOFTDOT_ATTENTION_FP8_H_

#include "softdot/attention.h"
#include "softdot/float8.h"

namespace softdot {

// fp8 keys or values (float8.h: e4m3fn or e5m2), as vLLM and SGLang keep
// their caches: element (b, h, j, c) stands for the float
// s * to_float(values(b, h, j, c)), the product rounded once to float (the
// "dequantised" value), where s is scales(b, h, j, 0) when scales has data
// (one scale per token and KV head, SGLang's and write_kv's) and the
// per-tensor `scale` otherwise (vLLM's k_scale / v_scale). As for Int8KV,
// every function that takes them computes exactly what it computes for
// float K and V holding the dequantised values, bit for bit, so every bound
// below holds for them; the quantisation error is write_kv's (kv_cache.h).
// Scales must be finite and >= 0, and `scale` must stay 1 when scales are
// given (std::invalid_argument naming the first bad one otherwise). Taken
// by attention(), attention_partial(), paged_attention(),
// paged_attention_partial(), attention_weights(), attention_scores() and
// the request (attention_request.h); the rings and the gradients take no
// fp8 K/V.
template <class T>
struct Float8KV {
  TensorView<const T> values;      // [B, H_kv, n_kv, d or d_v]
  TensorView<const float> scales;  // [B, H_kv, n_kv, 1], or no data
  float scale = 1.0f;              // per tensor, when scales has no data
};
using Float8E4M3KV = Float8KV<Float8E4M3>;
using Float8E5M2KV = Float8KV<Float8E5M2>;

void attention(TensorView<const float> q, const Float8E4M3KV& k,
               const Float8E4M3KV& v, TensorView<float> out,
               const AttentionOptions& options = {}, float* lse = nullptr);
void attention(TensorView<const float> q, const Float8E5M2KV& k,
               const Float8E5M2KV& v, TensorView<float> out,
               const AttentionOptions& options = {}, float* lse = nullptr);
void attention_partial(TensorView<const float> q, const Float8E4M3KV& k,
                       const Float8E4M3KV& v, AttentionPartial& partial,
                       const AttentionOptions& options = {});
void attention_partial(TensorView<const float> q, const Float8E5M2KV& k,
                       const Float8E5M2KV& v, AttentionPartial& partial,
                       const AttentionOptions& options = {});
void paged_attention(TensorView<const float> q, const Float8E4M3KV& k_pages,
                     const Float8E4M3KV& v_pages, const PagedKVTable& table,
                     TensorView<float> out,
                     const AttentionOptions& options = {},
                     float* lse = nullptr);
void paged_attention(TensorView<const float> q, const Float8E5M2KV& k_pages,
                     const Float8E5M2KV& v_pages, const PagedKVTable& table,
                     TensorView<float> out,
                     const AttentionOptions& options = {},
                     float* lse = nullptr);
void paged_attention_partial(TensorView<const float> q,
                             const Float8E4M3KV& k_pages,
                             const Float8E4M3KV& v_pages,
                             const PagedKVTable& table,
                             AttentionPartial& partial,
                             const AttentionOptions& options = {});
void paged_attention_partial(TensorView<const float> q,
                             const Float8E5M2KV& k_pages,
                             const Float8E5M2KV& v_pages,
                             const PagedKVTable& table,
                             AttentionPartial& partial,
                             const AttentionOptions& options = {});
void attention_weights(TensorView<const float> q, const Float8E4M3KV& k,
                       TensorView<float> weights,
                       const AttentionOptions& options = {});
void attention_weights(TensorView<const float> q, const Float8E5M2KV& k,
                       TensorView<float> weights,
                       const AttentionOptions& options = {});
void attention_scores(TensorView<const float> q, const Float8E4M3KV& k,
                      TensorView<float> scores,
                      const AttentionOptions& options = {});
void attention_scores(TensorView<const float> q, const Float8E5M2KV& k,
                      TensorView<float> scores,
                      const AttentionOptions& options = {});

}  // namespace softdot

#endif  // SOFTDOT_ATTENTION_FP8_H_
