// softdot: what a softmax row kernel is asked to do (shared by the per-target
// kernels and the checked wrappers; no SIMD types here).
#ifndef SOFTDOT_KERNELS_ROW_OP_H_
#define SOFTDOT_KERNELS_ROW_OP_H_

namespace softdot::detail {

enum class RowOp : int {
  kSoftmax = 0,     // y = softmax(x)
  kLogSoftmax = 1,  // y = log_softmax(x)
  kState = 2,       // state = (max, sum exp(x - max)); y unused
  kApply = 3,       // y = exp(x - state.max) / state.sum, state given
};

// The state of a row in the widest form the kernels produce: the max (exact
// in double), and the sum of exp(x - max) as an unevaluated pair hi + lo.
struct RowState {
  double max;
  double sum;
  double sum_lo;
};

}  // namespace softdot::detail

#endif  // SOFTDOT_KERNELS_ROW_OP_H_
