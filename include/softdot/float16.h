// softdot: the 16-bit storage formats of keys and values (float16, bfloat16)
// and their exact conversions, for callers and kernels alike.
#ifndef SOFTDOT_FLOAT16_H_
#define SOFTDOT_FLOAT16_H_

#include <cstdint>

namespace softdot {

// 16-bit storage formats for keys and values (the usual KV-cache formats).
// They only hold bits; softdot widens them to float exactly and accumulates
// in float.
struct Float16 {  // IEEE 754 binary16
  std::uint16_t bits = 0;
};
struct BFloat16 {  // bfloat16: the upper half of a float
  std::uint16_t bits = 0;
};

// Exact widening, and rounding to nearest, ties to even (NaN stays NaN,
// overflow gives inf, float16 keeps subnormals). Tested on all 65536 16-bit
// patterns: exact widening, the round trip, and rounding at every midpoint
// and its two neighbours (tests/unit/attention_convert_test.cc,
// AttentionConvert).
// Computed bit by bit in src/float16.cc: the same on every target.
float to_float(Float16 h) noexcept;
float to_float(BFloat16 b) noexcept;
Float16 to_float16(float x) noexcept;
BFloat16 to_bfloat16(float x) noexcept;
// From double, rounded once (to nearest, ties to even): not through the
// float nearest to x, which would round twice. 16-bit attention outputs are
// written with these.
Float16 to_float16(double x) noexcept;
BFloat16 to_bfloat16(double x) noexcept;

}  // namespace softdot

#endif  // SOFTDOT_FLOAT16_H_
