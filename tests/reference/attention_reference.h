// softdot_reference: a scalar long-double reference for softdot::attention
// (include/softdot/attention.h), with the error bound the header states.
//
// Test-only; never shipped; independent of the library (it takes float
// tensors: the tests widen Float16 / BFloat16 keys and values to float first,
// which is exact).
//
// Arithmetic: on x86-64 long double has a 64-bit significand, so a product
// of two floats (24 + 24 bits) is exact; dot products and weighted sums are
// compensated (TwoSum) long-double sums in index order, and expl, logl,
// tanhl are good to a few ulps of long double. The reference error is then
// below 2^-60 relative to the quantities the bound is made of, far below the
// float u = 2^-24 that the bound counts in.
//
// Semantics (attention.h), for batch b, query head h, query row i:
//   scale  = (float)(options.scale), or (float)(1 / sqrt(d)) when NaN;
//   kv head = h / (H / H_kv);
//   p(i)   = i + n_kv - n_q (signed);
//   key j is visible when kv_begin <= j < min(kv_end, n_kv), mask(b,h,i,j)
//     is true (when a mask is given), !(causal && j > p(i)),
//     window_left < 0 || j >= p(i) - window_left,
//     window_right < 0 || j <= p(i) + window_right, and the final score is
//     not -inf (a bias of -inf masks);
//   s'_ij  = (Q_i . K_j) * scale           (exact)
//   c_ij   = softcap > 0 ? softcap * tanh(s'_ij / softcap) : s'_ij
//   s_ij   = c_ij + bias(b,h,i,j)           (exact)
//   sink   = sinks[h] (when given) adds exp(sink) to the denominator only.
// Special values:
//   no visible key             -> O row +0, lse = sink (the log of the
//                                 denominator exp(sink)) or -inf without a
//                                 (finite) sink, weights +0;
//   a NaN score among visible  -> O row NaN, lse NaN, weights NaN;
//   k > 0 visible scores +inf  -> O = mean of those V rows, weights 1/k there
//                                 and 0 elsewhere, lse +inf;
//   otherwise m = max(max_j s_ij, sink), e_j = exp(s_ij - m),
//     S = sum_j e_j + exp(sink - m), w_ij = e_j / S, O_ic = sum_j w_ij V_jc,
//     lse = m + log(S).
//   A NaN in a visible V element gives NaN in that output element (the sum
//   simply carries it); masked K and V rows are never read.
//
// Bound (attention.h), per output element, u = 2^-24:
//   W_ic = sum_j w_ij |V_jc|   (exact weights),
//   D_i  = max_j [scale * gamma_{n_d} * sum_k |Q_ik K_jk| + 2u (|s'_ij| +
//          |s_ij|)] + 4u * softcap (when soft-capping),
//   n_d  = min(d, 16) + ceil(d / 16) - 1 (attention_dot_roundings),
//   |O_ic - exact| <= (2 D_i + 70 u) W_ic + u |exact|.
// With precise (scores in double, carried as hi + lo into exp):
//   D_i  = max_j scale * gamma_{d+1}(2^-53) * sum_k |Q_ik K_jk|
//          + 12 u^2 max(|s'_ij|, |s_ij|, |sink|)
// (the double chain and scale multiply; lo rounded to float, the TwoSum of
// the bias and of s - m adding at most u^2 times |s'|, |s| and |m| each);
// with soft-capping the capped score is rounded to float, so the default's
// 2u (|s'| + |s|) + 4u cap is added.
// For rows with +inf scores D_i is taken as 0 (the output is a float mean of
// at most a few values).
#ifndef SOFTDOT_TESTS_REFERENCE_ATTENTION_REFERENCE_H_
#define SOFTDOT_TESTS_REFERENCE_ATTENTION_REFERENCE_H_

#include <cstddef>
#include <limits>
#include <optional>
#include <vector>

namespace softdot_ref {

// A strided 4-D view [batch, heads, rows, cols] (as softdot::TensorView).
// For masks and biases, batch == 1 or heads == 1 broadcast that dimension,
// and a stride of 0 broadcasts (batch, heads or rows).
template <class T>
struct AttnTensor {
  const T* data = nullptr;
  std::size_t batch = 1, heads = 1, rows = 0, cols = 0;
  std::size_t batch_stride = 0, head_stride = 0, row_stride = 0;
  const T& at(std::size_t b, std::size_t h, std::size_t r,
              std::size_t c) const {
    return data[b * batch_stride + h * head_stride + r * row_stride + c];
  }
  // With batch / heads broadcasting (masks and biases).
  const T& at_bcast(std::size_t b, std::size_t h, std::size_t r,
                    std::size_t c) const {
    return at(batch == 1 ? 0 : b, heads == 1 ? 0 : h, r, c);
  }
};

struct AttnRefOptions {
  double scale = std::numeric_limits<double>::quiet_NaN();
  bool causal = false;
  std::ptrdiff_t window_left = -1;
  std::ptrdiff_t window_right = -1;
  float softcap = 0.0f;
  AttnTensor<bool> mask;     // data == nullptr: none
  AttnTensor<float> bias;    // data == nullptr: none
  std::vector<float> sinks;  // empty: none; else one per query head
  std::size_t kv_begin = 0;
  std::size_t kv_end = std::numeric_limits<std::size_t>::max();
  // AttentionOptions::precise: D_i is the precise scores' (below).
  bool precise = false;
};

// Results, dense: out and bound [B, H, n_q, d_v], lse and D [B, H, n_q],
// weights [B, H, n_q, n_kv] (when asked for).
struct AttnRef {
  std::size_t batch = 0, heads = 0, n_q = 0, n_kv = 0, d_v = 0;
  float scale = 0;  // the float scale used
  std::vector<long double> out;
  std::vector<long double> lse;
  std::vector<long double> weights;
  std::vector<double> W;                // sum_j w_j |V_jc|
  std::vector<double> bound;            // (2 D + 70 u) W + u |O|
                                        // + 2^-149 (n_kv + 1 + sum_j |V_jc|)
  std::vector<double> D;                // D_i
  std::vector<std::size_t> visible;     // number of visible keys per row
  std::vector<std::size_t> inf_scores;  // number of +inf scores per row
  std::size_t oi(std::size_t b, std::size_t h, std::size_t i,
                 std::size_t c) const {
    return ((b * heads + h) * n_q + i) * d_v + c;
  }
  std::size_t li(std::size_t b, std::size_t h, std::size_t i) const {
    return (b * heads + h) * n_q + i;
  }
  std::size_t wi(std::size_t b, std::size_t h, std::size_t i,
                 std::size_t j) const {
    return ((b * heads + h) * n_q + i) * n_kv + j;
  }
};

// The reference for q [B, H, n_q, d], k [B, H_kv, n_kv, d],
// v [B, H_kv, n_kv, d_v] (shapes must be valid; not checked beyond asserts).
AttnRef attention_reference(const AttnTensor<float>& q,
                            const AttnTensor<float>& k,
                            const AttnTensor<float>& v,
                            const AttnRefOptions& options,
                            bool want_weights = false);

// The float scale attention() uses for head dimension d.
float attention_scale(double scale, std::size_t d);
// The same for softdot's AttentionOptions::scale (not set: NaN above).
inline float attention_scale(std::optional<double> scale, std::size_t d) {
  return attention_scale(
      scale.value_or(std::numeric_limits<double>::quiet_NaN()), d);
}

// The most roundings a product Q_ik K_jk passes through in the float score
// of either form: min(d, 16) + ceil(d / 16) - 1 (prefill: a chain over each
// block of 16 features, then the blocks added in order; decode: 16 chains of
// ceil(d / 16) and a tree of depth 4, never more). gamma of it bounds the
// score's dot product.
std::size_t attention_dot_roundings(std::size_t d);

// Whether key j is visible to query row i by position and range alone
// (causal, window, kv range; not the mask or bias).
bool attention_position_visible(const AttnRefOptions& options, std::size_t n_q,
                                std::size_t n_kv, std::size_t i, std::size_t j);

}  // namespace softdot_ref

#endif  // SOFTDOT_TESTS_REFERENCE_ATTENTION_REFERENCE_H_
