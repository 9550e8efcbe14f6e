// softdot command: step-by-step explanations of a dot product, of a softmax
// and of an attention call, in the manner of the seed text's worked
// examples.
#ifndef SOFTDOT_CLI_EXPLAIN_H_
#define SOFTDOT_CLI_EXPLAIN_H_

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "attention_inputs.h"
#include "softdot/attention.h"
#include "softdot/attention_request.h"

namespace softdot::cli {

// "x · y = 1·2 + 2·1 + 0·3\n      = 2 + 2 + 0\n      = 4\n": the products,
// the terms, and softdot::dot's result (shortest round-trip form). `x_name`
// and `y_name` label the vectors. x.size() == y.size() >= 1.
std::string explain_dot(std::span<const double> x, std::span<const double> y,
                        std::string_view x_name, std::string_view y_name);

// A table with, per score: the score, (score / T), exp(score) as the naive
// formula computes it, score - max, exp(score - max), the weight from
// softdot::softmax (and the log-weight with `log`), and a bar of up to 40
// '#' for the weight; then the sums and why the max is subtracted. Values
// are written with `digits` decimals. `mask` is empty or one flag per score.
std::string explain_softmax(std::span<const double> scores,
                            std::span<const bool> mask, double temperature,
                            bool log, int digits);

// The bar for a weight: round(weight * 40) '#' characters (none for NaN).
std::string weight_bar(double weight);

// One attention head for explain_attention: row-major matrices, as the
// library returned them.
struct AttentionHeadExplain {
  std::string title;  // e.g. "batch 0, head 1 (k/v head 0)"; "" for none
  std::size_t n_q = 0, n_kv = 0, d_v = 0;
  std::vector<float> scores;   // n_q x n_kv, softdot::attention_scores: the
                               // final s_ij, -inf where the key takes no part
  std::vector<float> weights;  // n_q x n_kv
  std::vector<float> output;   // n_q x d_v
};

// `preamble` (what was computed and how), then per head: a table of the
// scores ("masked" where a score is -inf), a table of the weights with each
// row's sum, a heat map of the weights (attention_heat_cell), and the output
// rows. Values are written with `digits` decimals.
std::string explain_attention(std::string_view preamble,
                              std::span<const AttentionHeadExplain> heads,
                              int digits);

// The --explain text of `softdot attention`: what was computed (shapes, the
// scale, positions, causal, window, mask, bias, soft-cap, the formulas),
// then explain_attention over the library's results, each dense in
// (batch, head, row) order: `scores` [B, H, n_q, n_kv] from
// softdot::attention_scores, `weights` [B, H, n_q, n_kv] from
// softdot::attention_weights and `out` [B, H, n_q, d_v] from
// softdot::attention, all with `options`. `scale` is the float scale the
// library uses (--scale, given when `scale_given`, or 1/sqrt(d)).
std::string explain_attention_call(const AttentionInputs& in,
                                   const AttentionPlan& plan, bool scale_given,
                                   std::span<const float> scores,
                                   std::span<const float> weights,
                                   std::span<const float> out, int digits);

// One cell of the heat map, two characters wide: "··" for a weight of 0,
// "░░" up to 0.25, "▒▒" up to 0.5, "▓▓" up to 0.75, "██" above, "??" for NaN.
std::string attention_heat_cell(double weight);

}  // namespace softdot::cli

#endif  // SOFTDOT_CLI_EXPLAIN_H_
