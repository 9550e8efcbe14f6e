// softdot: the 16-bit softmax steps and the float16/bfloat16 conversions,
// compiled once per SIMD target (Highway's foreach_target / HWY_EXPORT
// pattern).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/dispatch_softmax16.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/convert16-inl.h"
#include "kernels/softmax16-inl.h"

#if HWY_ONCE
#include "kernels/dispatch.h"
#include "kernels/dispatch_call.h"

namespace softdot::detail {

HWY_EXPORT(Widen16);
HWY_EXPORT(Round16Quotient);
HWY_EXPORT(Softmax16Apply);
HWY_EXPORT(Round16Floats);
HWY_EXPORT(Softmax16Fast);
HWY_EXPORT(Softmax16State);

void widen16(const std::uint16_t* src, std::size_t n, float* dst,
             bool bf16) noexcept {
  SOFTDOT_DISPATCH(Widen16)(src, n, dst, bf16);
}
void round16_quotient(const double* o, double l, std::size_t n,
                      std::uint16_t* dst, bool bf16) noexcept {
  SOFTDOT_DISPATCH(Round16Quotient)(o, l, n, dst, bf16);
}

void softmax16_apply(const float* x, const std::uint8_t* mask, float scale,
                     std::size_t n, double c, double inv, std::uint16_t* y,
                     bool bf16) noexcept {
  SOFTDOT_DISPATCH(Softmax16Apply)(x, mask, scale, n, c, inv, y, bf16);
}

void round16_floats(const float* w, std::size_t n, std::uint16_t* y,
                    bool bf16) noexcept {
  SOFTDOT_DISPATCH(Round16Floats)(w, n, y, bf16);
}

bool softmax16_fast(const std::uint16_t* x, const std::uint8_t* mask,
                    float scale, std::size_t n, float* e, std::uint16_t* y,
                    bool bf16) noexcept {
  return SOFTDOT_DISPATCH(Softmax16Fast)(x, mask, scale, n, e, y, bf16);
}

bool softmax16_state(const float* x, const std::uint8_t* mask, float scale,
                     std::size_t n, double* c, double* s) noexcept {
  return SOFTDOT_DISPATCH(Softmax16State)(x, mask, scale, n, c, s);
}

}  // namespace softdot::detail
#endif  // HWY_ONCE
