// softdot: the attention kernel's prefill form on the bfloat16 units
// (attention_units-inl.h), compiled once per SIMD target (Highway's
// foreach_target / HWY_EXPORT pattern; attention_kernel, in
// dispatch_attention.cc, calls attention_units_kernel).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/dispatch_attention_units.cc"
#include <cstddef>
#include <cstdint>

#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/attention_common-inl.h"
#include "kernels/attention_decode_units-inl.h"
#include "kernels/attention_units-inl.h"

HWY_BEFORE_NAMESPACE();
namespace softdot {
namespace HWY_NAMESPACE {

// The prefill form on the units a.units names (a.units != 0) over the
// vectors of rows a.rows needs.
void AttentionUnitsRows(const AttnArgs& a) {
  attn::ByRowVectors(a.rows, [&](auto nv) HWY_ATTR {
    attn::RunPrefillUnits<decltype(nv)::value>(a);
  });
}

// The decode form on the units a[0].units names for n calls of one chunk.
void AttentionDecodeUnitsRows(const AttnArgs* a, std::size_t n) {
  attn::RunDecodeUnits(a, n);
}

unsigned AttentionUnitsCompiled() { return attn::UnitsCompiled(); }

// The bfloat16 dot-product step on n lanes (tests: the kernels' model and,
// where compiled in, the instruction); false where this target has neither.
bool AttentionUnitsDot(float* acc, const std::uint32_t* a,
                       const std::uint32_t* b, std::size_t n, bool hw) {
#if SOFTDOT_UNITS_MODEL
  attn::UnitsDotLanes(acc, a, b, n, hw);
  return true;
#else
  (void)acc, (void)a, (void)b, (void)n, (void)hw;
  return false;
#endif
}

}  // namespace HWY_NAMESPACE
}  // namespace softdot
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "kernels/dispatch.h"
#include "kernels/dispatch_call.h"

namespace softdot::detail {

HWY_EXPORT(AttentionUnitsRows);
HWY_EXPORT(AttentionUnitsCompiled);
HWY_EXPORT(AttentionDecodeUnitsRows);
HWY_EXPORT(AttentionUnitsDot);

void attention_units_kernel(const AttnArgs& args) noexcept {
  HWY_DYNAMIC_DISPATCH(AttentionUnitsRows)(args);
}
void attention_decode_units_kernel(const AttnArgs& args) noexcept {
  HWY_DYNAMIC_DISPATCH(AttentionDecodeUnitsRows)(&args, 1);
}
void attention_decode_units_heads(const AttnArgs* args,
                                  std::size_t n) noexcept {
  HWY_DYNAMIC_DISPATCH(AttentionDecodeUnitsRows)(args, n);
}
bool attention_units_dot(float* acc, const std::uint32_t* a,
                         const std::uint32_t* b, std::size_t n,
                         bool hw) noexcept {
  return HWY_DYNAMIC_DISPATCH(AttentionUnitsDot)(acc, a, b, n, hw);
}
unsigned attention_units_compiled() noexcept {
  return HWY_DYNAMIC_DISPATCH(AttentionUnitsCompiled)();
}

}  // namespace softdot::detail
#endif  // HWY_ONCE
