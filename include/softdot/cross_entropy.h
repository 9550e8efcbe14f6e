// softdot: fused cross-entropy of rows of logits against class targets, with
// ignore_index, label smoothing and the gradient, in one call.
#ifndef SOFTDOT_CROSS_ENTROPY_H_
#define SOFTDOT_CROSS_ENTROPY_H_

#include <cstdint>
#include <span>

#include "softdot/float16.h"
#include "softdot/matrix.h"

namespace softdot {

// How the per-row losses are reduced (as torch.nn.functional.cross_entropy's
// `reduction`). It sets the returned value and the scale of the gradient.
enum class Reduction {
  kNone,  // returns the sum; gradient of the sum of the row losses
  kSum,   // returns the sum; gradient of the sum
  kMean,  // returns sum / count of rows not ignored; gradient of that mean
};

struct CrossEntropyOptions {
  // Rows whose target equals this value get loss 0 and gradient 0 and are
  // not counted by Reduction::kMean. Any value (torch's default -100).
  std::int64_t ignore_index = -100;
  // eps in [0, 1] (else std::invalid_argument): the target distribution is
  // (1 - eps) one_hot(t) + eps / V over the whole vocabulary V.
  double label_smoothing = 0.0;
  Reduction reduction = Reduction::kMean;
};

// For each row i of logits (rows x V, any stride >= V) with target t_i:
//   lse_i  = log sum_j exp(x_ij)                (softdot's logsumexp)
//   loss_i = (1 - eps) (lse_i - x_it) + eps (lse_i - (1/V) sum_j x_ij)
// and, when grad is given (grad.data != nullptr; rows x V, any stride),
//   grad_ij = c (softmax(x_i)_j - (1 - eps) [j == t_i] - eps / V),
// with c = 1 for kNone and kSum and 1 / count for kMean: the gradient of the
// returned value (kNone: of the sum of the row losses), the same meaning as
// torch's autograd through cross_entropy(..., reduction) (for kNone, with a
// grad_output of ones). Rows with t_i == ignore_index: loss 0, grad row 0,
// not counted.
//
// Returns the sum of the row losses (kNone, kSum) or sum / count (kMean; NaN
// when every row is ignored, as torch). The sum is taken in long double
// over the unrounded row losses, in row order, and rounded once to double.
// `loss`: empty, or rows elements, which receive loss_i rounded once to T.
//
// Accuracy (tested in tests/unit/cross_entropy_test.cc against a long
// double reference): loss_i is formed in long double as (max - x_t) +
// log S from the exact max, the softmax state's sum S (whose error is below
// d (S - 1) with d = 2^-32 for float, 2^-50 for double: the max's term is
// exactly 1) and a long double sum of the logits, then rounded once:
//   |loss_i - exact| <= 1 ulp(loss_i) + d loss_i + V 2^-63 max_j |x_ij|
// (the last term only with eps > 0): within 1 ulp for float, and for double
// within 1 ulp plus 2^-50 relative (a few ulp on losses below about 1e-3). Each
// grad_ij is the faithful softmax weight p (within 1 ulp of p) combined in
// double (long double for double) and rounded once: |grad_ij - exact| <= c
// ulp(p) + 1 ulp(grad_ij).
//
// Special values (softdot's softmax conventions, docs/accuracy.md):
//   a logit -inf              -> weight 0; if it is the target, loss +inf;
//                                with eps > 0, loss +inf (the mean is -inf),
//                                grad finite (p - eps / V) as torch;
//   every logit -inf          -> loss +inf (the target has probability 0),
//                                grad -c ((1 - eps) one_hot + eps / V)
//                                (torch gives NaN here);
//   k logits +inf             -> those weights 1 / k; loss log(k) if the
//                                target is one of them, else +inf;
//   NaN anywhere in the row   -> loss NaN and the whole grad row NaN
//                                (that row only; an ignored row's grad
//                                stays 0, its loss 0).
// The gradient is never NaN from 0 * inf or inf - inf: a -inf logit's
// weight is exactly 0, so its grad is exactly c (0 - eps / V) (0 without
// smoothing); every -inf or +inf row's grad is finite.
// Errors (std::invalid_argument, nothing written): V == 0 or rows == 0,
// targets.size() != rows, a target not in [0, V) and != ignore_index (the
// message names the row and the value), loss.size() not 0 or rows, grad not
// rows x V, eps outside [0, 1], a stride < V, overlapping memory.
//
// Aliasing: logits are never modified; grad and loss must not overlap
// logits, targets or each other. Allocates rows long doubles (the unrounded
// row losses). Threads: rows are split across OpenMP threads when the matrix
// holds at least 2^18 elements; the result does not depend on the thread
// count.
double cross_entropy(MatrixView<const float> logits,
                     std::span<const std::int64_t> targets,
                     std::span<float> loss, MatrixView<float> grad = {},
                     const CrossEntropyOptions& options = {});
double cross_entropy(MatrixView<const double> logits,
                     std::span<const std::int64_t> targets,
                     std::span<double> loss, MatrixView<double> grad = {},
                     const CrossEntropyOptions& options = {});

// bfloat16 / float16 logits: widened exactly to double, computed by the
// double function above, each loss_i and grad_ij rounded once to the 16-bit
// format (within about 2^-50 relative of the exact value before that
// rounding); the return value is the double function's. Same checks,
// special values and threads. Allocates rows x V doubles for the widened
// logits (and as many for the gradient when asked).
double cross_entropy(MatrixView<const BFloat16> logits,
                     std::span<const std::int64_t> targets,
                     std::span<BFloat16> loss, MatrixView<BFloat16> grad = {},
                     const CrossEntropyOptions& options = {});
double cross_entropy(MatrixView<const Float16> logits,
                     std::span<const std::int64_t> targets,
                     std::span<Float16> loss, MatrixView<Float16> grad = {},
                     const CrossEntropyOptions& options = {});

}  // namespace softdot

#endif  // SOFTDOT_CROSS_ENTROPY_H_
