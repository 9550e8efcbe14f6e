// softdot: the attention kernel's float prefill form, compiled once per SIMD
// target (Highway's foreach_target / HWY_EXPORT pattern), and
// attention_kernel, which picks the form (the decode and the units forms are
// in dispatch_attention_decode.cc and dispatch_attention_units.cc).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/dispatch_attention.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/attention-inl.h"

#if HWY_ONCE
#include "kernels/dispatch.h"
#include "kernels/dispatch_call.h"

namespace softdot::detail {

HWY_EXPORT(AttentionPrefillRows);
HWY_EXPORT(AttentionMaxRows);
HWY_EXPORT(AttentionSoftcap);

void attention_kernel(const AttnArgs& args) noexcept {
  if (args.decode && args.units != 0) {
    attention_decode_units_kernel(args);
  } else if (args.decode) {
    attention_decode_kernel(args);
  } else if (args.units != 0) {
    attention_units_kernel(args);
  } else {
    HWY_DYNAMIC_DISPATCH(AttentionPrefillRows)(args);
  }
}
std::size_t attention_max_rows() noexcept {
  return HWY_DYNAMIC_DISPATCH(AttentionMaxRows)();
}
void attention_softcap(float* s, std::size_t n, float cap) noexcept {
  HWY_DYNAMIC_DISPATCH(AttentionSoftcap)(s, n, cap);
}

}  // namespace softdot::detail
#endif  // HWY_ONCE
