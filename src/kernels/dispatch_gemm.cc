// softdot: the gemm panel kernel, compiled once per SIMD target (Highway's
// foreach_target / HWY_EXPORT pattern).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/dispatch_gemm.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/gemm-inl.h"

#if HWY_ONCE
#include "kernels/dispatch.h"
#include "kernels/dispatch_call.h"

namespace softdot::detail {

HWY_EXPORT(GemmPanel);
HWY_EXPORT(GemmShape);

void gemm_panel_kernel(const GemmArgs& args) noexcept {
  HWY_DYNAMIC_DISPATCH(GemmPanel)(args);
}
void gemm_shape(std::size_t* mr, std::size_t* nr) noexcept {
  HWY_DYNAMIC_DISPATCH(GemmShape)(mr, nr);
}

}  // namespace softdot::detail
#endif  // HWY_ONCE
