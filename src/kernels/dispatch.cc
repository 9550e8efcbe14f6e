// softdot: the dot products and the sampling steps, compiled once per SIMD
// target (Highway's foreach_target / HWY_EXPORT pattern), and
// compiled_targets(). The other kernel families have a file each, so that
// they compile in parallel: dispatch_attention.cc (with
// dispatch_attention_decode.cc and dispatch_attention_units.cc),
// dispatch_attention_backward.cc, dispatch_gemm.cc, dispatch_softmax.cc and
// dispatch_softmax16.cc; dispatch_call.h is what they share.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/dispatch.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/dot-inl.h"
#include "kernels/sample-inl.h"

#if HWY_ONCE
#include "kernels/dispatch.h"
#include "kernels/dispatch_call.h"

namespace softdot::detail {

HWY_EXPORT(DotF32);
HWY_EXPORT(DotF64);
HWY_EXPORT(DotsF32);
HWY_EXPORT(DotsF64);
HWY_EXPORT(DotInDoubleF32);
HWY_EXPORT(DotAccurateF64);
HWY_EXPORT(SampleMaxF32);
HWY_EXPORT(SampleExpF32);
HWY_EXPORT(SampleKeptSumsF32);
HWY_EXPORT(SampleSelectGeF32);

float dot_kernel(const float* x, const float* y, std::size_t n) {
  return SOFTDOT_DISPATCH(DotF32)(x, y, n);
}
double dot_kernel(const double* x, const double* y, std::size_t n) {
  return SOFTDOT_DISPATCH(DotF64)(x, y, n);
}

void dots_kernel(const float* query, const float* keys, std::size_t stride,
                 std::size_t n, std::size_t rows, float* out) noexcept {
  HWY_DYNAMIC_DISPATCH(DotsF32)(query, keys, stride, n, rows, out);
}
void dots_kernel(const double* query, const double* keys, std::size_t stride,
                 std::size_t n, std::size_t rows, double* out) noexcept {
  HWY_DYNAMIC_DISPATCH(DotsF64)(query, keys, stride, n, rows, out);
}

float dot_accurate_kernel(const float* x, const float* y,
                          std::size_t n) noexcept {
  return static_cast<float>(HWY_DYNAMIC_DISPATCH(DotInDoubleF32)(x, y, n));
}
double dot_in_double_kernel(const float* x, const float* y,
                            std::size_t n) noexcept {
  return HWY_DYNAMIC_DISPATCH(DotInDoubleF32)(x, y, n);
}
double dot_accurate_kernel(const double* x, const double* y,
                           std::size_t n) noexcept {
  return HWY_DYNAMIC_DISPATCH(DotAccurateF64)(x, y, n);
}

float sample_max_kernel(const float* x, std::size_t n, bool* nan) noexcept {
  return HWY_DYNAMIC_DISPATCH(SampleMaxF32)(x, n, nan);
}
void sample_exp_kernel(const float* x, std::size_t n, float m, double s,
                       float tau, float* w, double* sums) noexcept {
  HWY_DYNAMIC_DISPATCH(SampleExpF32)(x, n, m, s, tau, w, sums);
}
std::size_t sample_select_ge_kernel(const float* v, std::size_t n, float lo,
                                    std::uint32_t* idx, float* vals) noexcept {
  return HWY_DYNAMIC_DISPATCH(SampleSelectGeF32)(v, n, lo, idx, vals);
}
void sample_kept_sums_kernel(const float* w, std::size_t n, float tau,
                             double* sums) noexcept {
  HWY_DYNAMIC_DISPATCH(SampleKeptSumsF32)(w, n, tau, sums);
}

std::int64_t compiled_targets() noexcept { return HWY_TARGETS; }

}  // namespace softdot::detail
#endif  // HWY_ONCE
