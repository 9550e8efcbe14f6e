// softdot: sampling the next token from rows of logits (temperature, top-k,
// top-p, min-p, a token bitmask, a counter-based seed per row) without
// sorting the vocabulary, and speculative rejection sampling.
#ifndef SOFTDOT_SAMPLE_H_
#define SOFTDOT_SAMPLE_H_

#include <cstdint>
#include <span>

#include "softdot/float16.h"
#include "softdot/matrix.h"

namespace softdot {

// The filters, applied in this order (Hugging Face's warper order; vLLM's
// torch path does temperature, top-k, top-p the same way):
//   1. temperature: t_i = (x_i - m) / temperature, m the largest allowed
//      logit; 0 means greedy (the allowed argmax, ties to the lowest index).
//   2. top_k: keep the tokens whose logit is >= the k-th largest allowed
//      logit (ties at the boundary are all kept, so more than k tokens can
//      remain when logits are equal); 0 (or >= the vocabulary) keeps all.
//   3. top_p: over the top-k set renormalised, keep the smallest set of the
//      largest probabilities whose mass is >= top_p, again with every token
//      equal to the boundary probability (ties all kept); 1 keeps all.
//   4. min_p: keep the tokens with probability >= min_p times the largest
//      probability (a ratio, so independent of the renormalisation).
// Then one token is drawn from the kept set renormalised.
struct SampleOptions {
  double temperature = 1.0;  // finite, >= 0
  std::int64_t top_k = 0;    // >= 0
  double top_p = 1.0;        // in (0, 1]
  double min_p = 0.0;        // in [0, 1]
};

// ---------------------------------------------------------------------------
// The distribution drawn from (docs/accuracy.md "Sampling"): the weight of
// a kept token is w_i = exp(t_i) rounded once to float (computed in double,
// within 0.51 ulp of exp(t_i); weights below 2^-149 are 0 and never drawn),
// and token i is drawn with probability w_i / S, S the sum of the kept
// weights in double, up to V 2^-52 (absolute; 6e-11 at V = 256k) for the
// 53-bit uniform and the rounding of the double sums. The uniform comes from
// Philox4x32-10 keyed by the row's seed (counter 0), so a row's token depends
// only on its seed, its logits, its bitmask row and the options: never on the
// batch, the thread count or the SIMD target (the weights and sums are formed
// in one fixed order with no fused multiply-add on every target).
//
// Bitmask: the packed int32 format of structured-output engines (xgrammar,
// llguidance, vLLM): bit (j % 32) of word j / 32 set = token j allowed;
// ceil(V / 32) words per row, either one row for all rows or one per row.
// A disallowed token behaves as logit -inf (a disallowed NaN is ignored).
//
// Special values: any allowed NaN logit in a row -> std::invalid_argument
// naming the row (NaN is never hidden); a row with no allowed finite or +inf
// logit (all -inf or masked) -> std::invalid_argument naming the row; k
// entries +inf -> uniform over those entries (the limit), logprob -log(k).
// On error nothing is written.
//
// logprobs (optional): the natural log of the drawn token's probability
// under the final distribution (after every filter, renormalised):
// t_i - log(S_kept), within 2^-22 of the exact value. Greedy rows get 0 (the
// distribution is a point mass).
//
// Threads: rows run in parallel (OpenMP) when rows * V is large. Allocates
// per-thread scratch (V floats) once and keeps it.
// ---------------------------------------------------------------------------
// logits: rows x V (stride >= V, or 0 to draw every row from one row).
void sample(MatrixView<const float> logits,
            std::span<const std::uint64_t> seeds,
            std::span<std::int64_t> tokens, std::span<float> logprobs = {},
            const SampleOptions& options = {},
            std::span<const std::int32_t> bitmask = {});
// 16-bit logits: each row widened exactly to float first.
void sample(MatrixView<const BFloat16> logits,
            std::span<const std::uint64_t> seeds,
            std::span<std::int64_t> tokens, std::span<float> logprobs = {},
            const SampleOptions& options = {},
            std::span<const std::int32_t> bitmask = {});
void sample(MatrixView<const Float16> logits,
            std::span<const std::uint64_t> seeds,
            std::span<std::int64_t> tokens, std::span<float> logprobs = {},
            const SampleOptions& options = {},
            std::span<const std::int32_t> bitmask = {});

// The distribution `sample` draws from for one row: probs[i] = w_i / S for
// the kept tokens (w_i the float weights above, S their sum in double), 0
// elsewhere; a point mass at the argmax for temperature 0; 1/k on each of k
// +inf entries. probs must have logits.size() entries. Errors as `sample`.
void sample_probs(std::span<const float> logits, std::span<double> probs,
                  const SampleOptions& options = {},
                  std::span<const std::int32_t> bitmask = {});

// Speculative decoding's rejection sampling (Leviathan et al. 2023; Chen et
// al. 2023), for B rows of K draft tokens each:
//   draft_tokens: B x K token ids; draft_probs: (B * K) x V, the draft
//   model's probability of every token at each draft position (row b * K +
//   j), or an empty view for deterministic drafts (probability 1 on the
//   draft token); target_logits: (B * (K + 1)) x V, the target model's
//   logits at the K draft positions and one more (row b * (K + 1) + j).
// The target distribution q at each position is the one `sample` draws from
// with `options` (temperature, top-k, top-p, min-p; greedy when 0). Draft
// token x at position j is accepted with probability min(1, q(x) / p(x));
// at the first rejection a token is drawn from norm(max(0, q - p)) (from q
// when that is all zero, which happens only through rounding) and the row
// stops; if all K are accepted a bonus token is drawn from q at position K.
// The output tokens are then distributed exactly as q at every position.
// accepted[b] = number of accepted draft tokens (0..K); tokens: B x (K + 1),
// row b holds accepted[b] draft tokens, then the drawn token, then -1.
// Uniforms: Philox4x32-10 keyed by seeds[b], counter j for position j.
// Errors: std::invalid_argument for shapes, draft tokens outside [0, V),
// draft probabilities negative or NaN, and target rows as for `sample`.
void speculative_accept(MatrixView<const std::int64_t> draft_tokens,
                        MatrixView<const float> draft_probs,
                        MatrixView<const float> target_logits,
                        std::span<const std::uint64_t> seeds,
                        std::span<std::int64_t> accepted,
                        MatrixView<std::int64_t> tokens,
                        const SampleOptions& options = {});

// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2,
// 3", SC 2011) on counter c and key k; the uniform in [0, 1) that sample()
// takes from words 0 and 1 (53 bits). Exposed for tests.
void philox4x32_10(const std::uint32_t counter[4], const std::uint32_t key[2],
                   std::uint32_t out[4]) noexcept;

}  // namespace softdot

#endif  // SOFTDOT_SAMPLE_H_
