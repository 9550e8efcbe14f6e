// softdot: the 8-bit floating-point storage formats of K/V caches (fp8
// e4m3fn and e5m2, as vLLM, SGLang and torch keep them) and their exact
// conversions, for callers and kernels alike.
#ifndef SOFTDOT_FLOAT8_H_
#define SOFTDOT_FLOAT8_H_

#include <cstdint>

namespace softdot {

// fp8 e4m3fn (torch.float8_e4m3fn, ml_dtypes.float8_e4m3fn): 1 sign, 4
// exponent (bias 7) and 3 mantissa bits, subnormals, no infinity, NaN only
// at S.1111.111; the largest finite value is 448.
struct Float8E4M3 {
  std::uint8_t bits = 0;
};
// fp8 e5m2 (torch.float8_e5m2, ml_dtypes.float8_e5m2): 1 sign, 5 exponent
// (bias 15) and 2 mantissa bits, the top byte of a float16 (infinities and
// NaN as float16's); the largest finite value is 57344.
struct Float8E5M2 {
  std::uint8_t bits = 0;
};

// The largest finite values.
inline constexpr float kFloat8E4M3Max = 448.0f;
inline constexpr float kFloat8E5M2Max = 57344.0f;

// Exact widening (every fp8 value is a float).
float to_float(Float8E4M3 x) noexcept;
float to_float(Float8E5M2 x) noexcept;

// Rounding to nearest, ties to even, saturating as the serving engines'
// caches do: a finite x that rounds beyond the largest finite value gives
// that value (with x's sign). NaN gives NaN; +-inf gives +-inf in e5m2 and
// NaN in e4m3fn, which has no infinity (an infinity is never turned into a
// finite number). From double, rounded once. Tested against every midpoint
// and its neighbours (tests/unit/float8_test.cc).
Float8E4M3 to_float8_e4m3(double x) noexcept;
Float8E5M2 to_float8_e5m2(double x) noexcept;

}  // namespace softdot

#endif  // SOFTDOT_FLOAT8_H_
