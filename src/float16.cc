// softdot: float16 and bfloat16 to and from float, bit by bit (no SIMD, no
// dependence on the CPU's F16C), so the same bits on every target.
#include "softdot/float16.h"

#include <cmath>
#include <cstdint>
#include <cstring>

#include "round16.h"

namespace softdot {

float to_float(Float16 h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h.bits & 0x8000u) << 16;
  const std::uint32_t exp = (h.bits >> 10) & 0x1fu;
  std::uint32_t mant = h.bits & 0x3ffu;
  std::uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {
    // Subnormal: normalise.
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400u) == 0);
    bits = sign | (static_cast<std::uint32_t>(112 - e) << 23) |
           ((mant & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

float to_float(BFloat16 b) noexcept {
  const std::uint32_t bits = static_cast<std::uint32_t>(b.bits) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

Float16 to_float16(float x) noexcept {
  std::uint32_t bits;
  std::memcpy(&bits, &x, 4);
  const auto sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  const std::uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) {  // NaN: keep it quiet and non-zero
    return Float16{
        static_cast<std::uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu))};
  }
  if (abs >= 0x477ff000u) {  // rounds to >= 65520: inf
    return Float16{static_cast<std::uint16_t>(sign | 0x7c00u)};
  }
  if (abs < 0x38800000u) {  // below 2^-14: subnormal or zero
    // value = abs_float; scaled to units of 2^-24 and rounded to nearest even.
    float a;
    std::memcpy(&a, &abs, 4);
    const float scaled = a * 16777216.0f;  // exact (power of two)
    const auto q = static_cast<std::uint32_t>(std::nearbyint(scaled));
    return Float16{static_cast<std::uint16_t>(sign | q)};
  }
  // Normal: rebias the exponent, round the 13 dropped bits to nearest even.
  const std::uint32_t rebased = abs - (112u << 23);
  const std::uint32_t lsb = (rebased >> 13) & 1u;
  const std::uint32_t rounded = (rebased + 0xfffu + lsb) >> 13;
  return Float16{static_cast<std::uint16_t>(sign | rounded)};
}

BFloat16 to_bfloat16(float x) noexcept {
  return BFloat16{detail::bfloat16_bits(x)};
}

Float16 to_float16(double x) noexcept {
  return to_float16(detail::round_to_odd(x));
}
BFloat16 to_bfloat16(double x) noexcept {
  return BFloat16{detail::bfloat16_bits(x)};
}

}  // namespace softdot
