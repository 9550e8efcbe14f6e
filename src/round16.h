// softdot: a double rounded once to bfloat16 or float16 (to nearest, ties
// to even), inline for the loops that write 16-bit outputs
// (finalize_row_state) and for float16.cc's public to_bfloat16(double) /
// to_float16(double): the same function for both.
#ifndef SOFTDOT_SRC_ROUND16_H_
#define SOFTDOT_SRC_ROUND16_H_

#include <cmath>
#include <cstdint>
#include <cstring>

#include "softdot/float16.h"

namespace softdot::detail {

// x rounded to float toward zero, with the last bit set when inexact
// ("round to odd"): rounding that float to 8 or 11 significant bits, to
// nearest even, gives x rounded once (the float keeps 24 bits, two more
// than either format needs, subnormals included). inf and NaN pass through;
// a finite x beyond the float range gives the largest float (odd), which
// both formats round to inf.
inline float round_to_odd(double x) noexcept {
  const float f = static_cast<float>(x);
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  const double back = static_cast<double>(f);
  if (back != x && std::isfinite(x)) {
    // Rounded away from zero: one step back toward zero (sign-magnitude);
    // f is not zero here, and inf steps back to the largest float.
    if (std::fabs(back) > std::fabs(x)) u -= 1;
    u |= 1u;
  }
  float r;
  std::memcpy(&r, &u, sizeof r);
  return r;
}

// The bfloat16 nearest to a float (ties to even; NaN stays a quiet NaN,
// overflow gives inf): to_bfloat16(float) and the double form below.
inline std::uint16_t bfloat16_bits(float x) noexcept {
  std::uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  if ((b & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<std::uint16_t>((b >> 16) | 0x40u);  // quiet NaN
  }
  const std::uint32_t lsb = (b >> 16) & 1u;
  return static_cast<std::uint16_t>((b + 0x7fffu + lsb) >> 16);
}

// The bfloat16 bits of x, rounded once.
inline std::uint16_t bfloat16_bits(double x) noexcept {
  return bfloat16_bits(round_to_odd(x));
}

}  // namespace softdot::detail

#endif  // SOFTDOT_SRC_ROUND16_H_
