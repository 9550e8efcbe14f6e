// softdot: the float and double softmax-family rows, compiled once per SIMD
// target (Highway's foreach_target / HWY_EXPORT pattern).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/dispatch_softmax.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/softmax-inl.h"

#if HWY_ONCE
#include "kernels/dispatch.h"
#include "kernels/dispatch_call.h"

namespace softdot::detail {

HWY_EXPORT(SoftmaxRowF32);
HWY_EXPORT(SoftmaxRowF64);

void softmax_row_kernel(const float* x, const std::uint8_t* mask, float scale,
                        std::size_t n, RowOp op, bool faithful, float* y,
                        RowState* state) {
  SOFTDOT_DISPATCH(SoftmaxRowF32)
  (x, mask, scale, n, op, faithful, y, state);
}
void softmax_row_kernel(const double* x, const std::uint8_t* mask, double scale,
                        std::size_t n, RowOp op, bool faithful, double* y,
                        RowState* state) {
  SOFTDOT_DISPATCH(SoftmaxRowF64)
  (x, mask, scale, n, op, faithful, y, state);
}

}  // namespace softdot::detail
#endif  // HWY_ONCE
