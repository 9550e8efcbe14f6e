// softdot: compiles every kernel once per SIMD target and exports the
// dispatch tables (Highway's foreach_target / HWY_EXPORT pattern).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/dispatch.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/attention-inl.h"
#include "kernels/attention_backward-inl.h"
#include "kernels/convert16-inl.h"
#include "kernels/dot-inl.h"
#include "kernels/gemm-inl.h"
#include "kernels/sample-inl.h"
#include "kernels/softmax-inl.h"
#include "kernels/softmax16-inl.h"

#if HWY_ONCE
#include "kernels/dispatch.h"

namespace softdot::detail {
namespace {

// HWY_DYNAMIC_DISPATCH for the calls short enough that the dispatch shows:
// the same table and index, but the chosen-target object is looked up once
// (HWY_DYNAMIC_DISPATCH calls hwy::GetChosenTarget(), in libhwy, through
// the PLT on every call). Its mask is still read on every call, so
// force_simd_target() keeps working.
#if HWY_IDE || ((HWY_TARGETS & (HWY_TARGETS - 1)) == 0)
#define SOFTDOT_DISPATCH(FUNC_NAME) HWY_DYNAMIC_DISPATCH(FUNC_NAME)
#else
hwy::ChosenTarget& chosen_target() {
  static hwy::ChosenTarget& chosen = hwy::GetChosenTarget();
  return chosen;
}
#define SOFTDOT_DISPATCH(FUNC_NAME) \
  (*(HWY_DISPATCH_TABLE(FUNC_NAME)[chosen_target().GetIndex()]))
#endif

}  // namespace

HWY_EXPORT(DotF32);
HWY_EXPORT(DotF64);
HWY_EXPORT(DotsF32);
HWY_EXPORT(DotsF64);
HWY_EXPORT(DotInDoubleF32);
HWY_EXPORT(DotAccurateF64);
HWY_EXPORT(SoftmaxRowF32);
HWY_EXPORT(SoftmaxRowF64);
HWY_EXPORT(AttentionRows);
HWY_EXPORT(AttentionBackwardRows);
HWY_EXPORT(AttentionMaxRows);
HWY_EXPORT(AttentionUnitsCompiled);
HWY_EXPORT(AttentionUnitsDot);
HWY_EXPORT(AttentionSoftcap);
HWY_EXPORT(AttentionScore);
HWY_EXPORT(Widen16);
HWY_EXPORT(Round16Quotient);
HWY_EXPORT(Softmax16Apply);
HWY_EXPORT(Round16Floats);
HWY_EXPORT(Softmax16Fast);
HWY_EXPORT(Softmax16State);
HWY_EXPORT(SampleMaxF32);
HWY_EXPORT(SampleExpF32);
HWY_EXPORT(SampleKeptSumsF32);
HWY_EXPORT(SampleSelectGeF32);
HWY_EXPORT(GemmPanel);
HWY_EXPORT(GemmShape);

void gemm_panel_kernel(const GemmArgs& args) noexcept {
  HWY_DYNAMIC_DISPATCH(GemmPanel)(args);
}
void gemm_shape(std::size_t* mr, std::size_t* nr) noexcept {
  HWY_DYNAMIC_DISPATCH(GemmShape)(mr, nr);
}

float attention_score(const float* q, const float* k, std::size_t d,
                      bool decode, float* scratch) noexcept {
  return HWY_DYNAMIC_DISPATCH(AttentionScore)(q, k, d, decode, scratch);
}

void attention_kernel(const AttnArgs& args) noexcept {
  HWY_DYNAMIC_DISPATCH(AttentionRows)(args);
}
void attention_backward_kernel(const AttnBackArgs& args) noexcept {
  HWY_DYNAMIC_DISPATCH(AttentionBackwardRows)(args);
}
std::size_t attention_max_rows() noexcept {
  return HWY_DYNAMIC_DISPATCH(AttentionMaxRows)();
}
bool attention_units_dot(float* acc, const std::uint32_t* a,
                         const std::uint32_t* b, std::size_t n,
                         bool hw) noexcept {
  return HWY_DYNAMIC_DISPATCH(AttentionUnitsDot)(acc, a, b, n, hw);
}
unsigned attention_units_compiled() noexcept {
  return HWY_DYNAMIC_DISPATCH(AttentionUnitsCompiled)();
}
void attention_softcap(float* s, std::size_t n, float cap) noexcept {
  HWY_DYNAMIC_DISPATCH(AttentionSoftcap)(s, n, cap);
}

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

#undef SOFTDOT_DISPATCH

}  // namespace softdot::detail
#endif  // HWY_ONCE
