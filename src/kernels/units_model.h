// softdot kernels: the scalar model of the bfloat16 dot-product step the
// attention units run (VDPBF16PS, one 32-bit lane; attention_units-inl.h),
// in plain C++: the reference the vector model and the instruction are
// tested against bit for bit (tests/unit/attention_units_test.cc).
#ifndef SOFTDOT_SRC_KERNELS_UNITS_MODEL_H_
#define SOFTDOT_SRC_KERNELS_UNITS_MODEL_H_

#include <cmath>
#include <cstdint>
#include <cstring>

namespace softdot::detail {

// x with a zero exponent field replaced by the zero of its sign (DAZ on an
// input, FTZ on a result).
inline float flush_denormal(float x) noexcept {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7F800000u) == 0) u &= 0x80000000u;
  std::memcpy(&x, &u, sizeof u);
  return x;
}

// The float of a bfloat16 in the low (half 0) or high (half 1) 16 bits.
inline float bf16_half(std::uint32_t pair, int half) noexcept {
  const std::uint32_t u = half == 0 ? pair << 16 : pair & 0xFFFF0000u;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// One lane: acc + a.high * b.high, rounded (one FMA), then + a.low * b.low,
// rounded; denormal inputs read as zero, denormal results written as zero,
// round to nearest even.
inline float dpbf16_model(float acc, std::uint32_t a,
                          std::uint32_t b) noexcept {
  const float a1 = flush_denormal(bf16_half(a, 1));
  const float b1 = flush_denormal(bf16_half(b, 1));
  const float a0 = flush_denormal(bf16_half(a, 0));
  const float b0 = flush_denormal(bf16_half(b, 0));
  acc = flush_denormal(std::fma(a1, b1, flush_denormal(acc)));
  return flush_denormal(std::fma(a0, b0, acc));
}

}  // namespace softdot::detail

#endif  // SOFTDOT_SRC_KERNELS_UNITS_MODEL_H_
