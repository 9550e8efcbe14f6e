// softdot: the attention backward kernel, compiled once per SIMD target
// (Highway's foreach_target / HWY_EXPORT pattern).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/dispatch_attention_backward.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/attention_backward-inl.h"

#if HWY_ONCE
#include "kernels/dispatch.h"
#include "kernels/dispatch_call.h"

namespace softdot::detail {

HWY_EXPORT(AttentionBackwardRows);

void attention_backward_kernel(const AttnBackArgs& args) noexcept {
  HWY_DYNAMIC_DISPATCH(AttentionBackwardRows)(args);
}

}  // namespace softdot::detail
#endif  // HWY_ONCE
