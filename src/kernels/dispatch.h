// softdot: the dispatch table (src/kernels/dispatch.cc): the raw kernels,
// dispatched to the best SIMD target at run time. Preconditions are not checked
// here (the public functions do that); no function throws or allocates.
// dot_kernel and softmax_row_kernel are not declared noexcept: a noexcept
// function must keep a frame around the dispatched call (to call
// std::terminate), so its call could not be a jump; that frame cost the short
// calls (a 64-element dot, a 3-element softmax) a push, a pop and a return
// each.
#ifndef SOFTDOT_SRC_KERNELS_DISPATCH_H_
#define SOFTDOT_SRC_KERNELS_DISPATCH_H_

#include <cstddef>
#include <cstdint>

#include "kernels/attention_args.h"
#include "kernels/gemm_args.h"
#include "kernels/row_op.h"

namespace softdot::detail {

// sum x[i] * y[i] over n >= 0 elements, in the fixed order of dot-inl.h.
float dot_kernel(const float* x, const float* y, std::size_t n);
double dot_kernel(const double* x, const double* y, std::size_t n);

// scores[r] = dot_kernel(query, keys + r * stride, n) for r < rows.
void dots_kernel(const float* query, const float* keys, std::size_t stride,
                 std::size_t n, std::size_t rows, float* out) noexcept;
void dots_kernel(const double* query, const double* keys, std::size_t stride,
                 std::size_t n, std::size_t rows, double* out) noexcept;

// The same, as if computed in twice the working precision and rounded once
// (float: double accumulation of exact products; double: Dot2).
float dot_accurate_kernel(const float* x, const float* y,
                          std::size_t n) noexcept;
double dot_accurate_kernel(const double* x, const double* y,
                           std::size_t n) noexcept;
// The float dot product before its final rounding to float.
double dot_in_double_kernel(const float* x, const float* y,
                            std::size_t n) noexcept;

// One softmax-family row of n elements (n may be 0 only for RowOp::kState).
// mask: null, or n bytes (0 = masked). scale: multiplies x (1 = unscaled).
// y: n outputs (may equal x; unused for kState). state: output of kState,
// input of kApply. faithful: Precision::kFaithful for kSoftmax, kState and
// kApply (kLogSoftmax has one precision).
void softmax_row_kernel(const float* x, const std::uint8_t* mask, float scale,
                        std::size_t n, RowOp op, bool faithful, float* y,
                        RowState* state);
void softmax_row_kernel(const double* x, const std::uint8_t* mask, double scale,
                        std::size_t n, RowOp op, bool faithful, double* y,
                        RowState* state);

// One attention kernel call (kernels/attention_args.h); rows <=
// attention_max_rows().
void attention_kernel(const AttnArgs& args) noexcept;
// n <= kDecodeHeadGroup decode calls on the bfloat16 units over one key
// range (KV heads of one chunk), run block by block; each call's bits are
// its own (dispatch_attention_units.cc).
void attention_decode_units_heads(const AttnArgs* args, std::size_t n) noexcept;
// One backward kernel call (AttnBackArgs, attention_args.h); rows <=
// attention_max_rows().
void attention_backward_kernel(const AttnBackArgs& args) noexcept;
// Rows one attention kernel call takes on the current target (4 vectors).
std::size_t attention_max_rows() noexcept;
// The units (kUnits* bits, attention_args.h) the current target's kernel
// can run the bfloat16 products on; the hardware bit is compiled in, the
// CPU may still lack the instruction (simd.cc checks CPUID).
unsigned attention_units_compiled() noexcept;
// acc[i] = VDPBF16PS's lane i on (acc[i], a[i], b[i]), i < n, by the
// current target's model of it (hw false) or the instruction (hw true and
// attention_units_compiled() has kUnitsAvx512Bf16; the CPU must have it).
// False, with acc untouched, where the target has neither (no FMA). Tests.
bool attention_units_dot(float* acc, const std::uint32_t* a,
                         const std::uint32_t* b, std::size_t n,
                         bool hw) noexcept;
// The unit a bfloat16 attention call runs its prefill products on now
// (kUnits* or 0): matrix_unit()'s choice (simd.cc).
unsigned attention_units();
// The unscaled score q . k exactly as the attention kernels form it: the
// prefill form (decode = false) or the decode form, which needs `scratch`
// of attention_score_scratch(d) floats (a padded, 64-byte aligned copy of q).
float attention_score(const float* q, const float* k, std::size_t d,
                      bool decode, float* scratch) noexcept;
constexpr std::size_t attention_score_scratch(std::size_t d) noexcept {
  return (d + 15) / 16 * 16 + 16;
}
// s[i] = cap * tanh(s[i] / cap), exactly as the attention kernel does it.
void attention_softcap(float* s, std::size_t n, float cap) noexcept;

// dst[c] = the float value of src[c], c < n: bfloat16 bits (bf16) or
// float16 bits; float16.cc's bits on every target (convert16-inl.h).
void widen16(const std::uint16_t* src, std::size_t n, float* dst,
             bool bf16) noexcept;
// dst[c] = the bits of o[c] / l rounded once to bfloat16 (bf16) or float16,
// c < n: to_bfloat16(double) / to_float16(double)'s bits on every target.
void round16_quotient(const double* o, double l, std::size_t n,
                      std::uint16_t* dst, bool bf16) noexcept;

// The last pass of a 16-bit softmax row widened to float (x): y[i] =
// exp(x[i] * scale - c) * inv rounded once to bfloat16 (bf16) or float16
// bits, +0 where mask[i] == 0 (mask may be null). The kept scores are
// finite and c is their float max (softmax16-inl.h).
void softmax16_apply(const float* x, const std::uint8_t* mask, float scale,
                     std::size_t n, double c, double inv, std::uint16_t* y,
                     bool bf16) noexcept;

// The state of such a row for softmax16_apply: c = the float max of the
// scaled kept scores, s = sum exp(p_i - c) in double lanes (2^-31 per
// term). False (c, s unset) for a NaN, a max of +-inf, or a scaled max >=
// 2^12: those rows take the double path.
bool softmax16_state(const float* x, const std::uint8_t* mask, float scale,
                     std::size_t n, double* c, double* s) noexcept;

// Sampling (sample-inl.h; the bits of sample_scalar.h on every target).
// The largest of x[0..n), n >= 1, and whether any is NaN.
float sample_max_kernel(const float* x, std::size_t n, bool* nan) noexcept;
// w[i] = sample_weight(x[i], m, s), i < n; sums[b] = the fixed-order sum of
// block b's weights >= tau (ceil(n / kSampleBlock) blocks).
void sample_exp_kernel(const float* x, std::size_t n, float m, double s,
                       float tau, float* w, double* sums) noexcept;
// The indices (ascending) of v[i] >= lo into idx and, unless null, their
// values into vals (room for n + 64 each); the count.
std::size_t sample_select_ge_kernel(const float* v, std::size_t n, float lo,
                                    std::uint32_t* idx, float* vals) noexcept;
// sums[b] = the fixed-order sum of block b's weights w >= tau.
void sample_kept_sums_kernel(const float* w, std::size_t n, float tau,
                             double* sums) noexcept;
// One packed matrix-product panel (kernels/gemm_args.h), and the tile
// shape {MR, NR} of the current target that the packing must follow.
void gemm_panel_kernel(const GemmArgs& args) noexcept;
void gemm_shape(std::size_t* mr, std::size_t* nr) noexcept;
// y[i] = the bits of the float w[i] rounded to nearest even to bfloat16
// (bf16) or float16, i < n; every w[i] finite and >= +0 (softmax16-inl.h).
void round16_floats(const float* w, std::size_t n, std::uint16_t* y,
                    bool bf16) noexcept;

// Precision::kFast on the 16-bit row x (bits), e a scratch of n floats:
// y[i] = the float weight (within about 1.7 float ulps) rounded once to 16
// bits. False (y untouched) for a kept NaN, a max of +-inf, a scaled max
// >= 2^12, and on targets below AVX2 (softmax16-inl.h).
bool softmax16_fast(const std::uint16_t* x, const std::uint8_t* mask,
                    float scale, std::size_t n, float* e, std::uint16_t* y,
                    bool bf16) noexcept;

// Target selection (see simd.h).
std::int64_t compiled_targets() noexcept;

}  // namespace softdot::detail

#endif  // SOFTDOT_SRC_KERNELS_DISPATCH_H_
