// softdot kernels: the scaled K/V storage formats: int8, symmetric, one
// float scale per row, and fp8 (e4m3fn, e5m2) with a float scale per row or
// per tensor. The scalar dequantisations (the vector kernels' WidenInt8,
// WidenFp8 and LoadRow compute the same bits) and the quantisations of
// quantize_kv and write_kv.
#ifndef SOFTDOT_KERNELS_DEQUANTIZE_H_
#define SOFTDOT_KERNELS_DEQUANTIZE_H_

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "softdot/float8.h"

namespace softdot::detail {

// scale * q, rounded once to float (the int8 value is exact in float).
inline float dequantize_int8(std::int8_t q, float scale) {
  return static_cast<float>(q) * scale;
}

// The exact float value of an fp8 element, bit by bit (softdot::to_float in
// float8.cc is the reference, with the same values on all 256 patterns).
inline float fp8_to_float(Float8E4M3 x) {
  const std::uint32_t mag = x.bits & 0x7fu;
  const std::uint32_t sign = static_cast<std::uint32_t>(x.bits & 0x80u) << 24;
  std::uint32_t bits;
  if (mag == 0x7fu) {
    bits = sign | 0x7fc00000u;  // NaN
  } else if (mag < 8u) {
    // Subnormal: mag * 2^-9, exact.
    float f = static_cast<float>(mag) * 0x1p-9f;
    std::memcpy(&bits, &f, 4);
    bits |= sign;
  } else {
    bits = sign | (((mag >> 3) + 120u) << 23) | ((mag & 7u) << 20);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline float fp8_to_float(Float8E5M2 x) {
  const std::uint32_t mag = x.bits & 0x7fu;
  const std::uint32_t sign = static_cast<std::uint32_t>(x.bits & 0x80u) << 24;
  const std::uint32_t exp = mag >> 2;
  std::uint32_t bits;
  if (exp == 31u) {
    bits = sign | 0x7f800000u | ((mag & 3u) << 21);  // inf or NaN
  } else if (exp == 0u) {
    float f = static_cast<float>(mag) * 0x1p-16f;  // subnormal, exact
    std::memcpy(&bits, &f, 4);
    bits |= sign;
  } else {
    bits = sign | ((exp + 112u) << 23) | ((mag & 3u) << 21);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// fl(value * scale): one rounding (the fp8 value is exact in float).
template <class T>
inline float dequantize_fp8(T q, float scale) {
  return fp8_to_float(q) * scale;
}

// Whether T is a scaled format (int8 or fp8: each element times its row's
// scale).
template <class T>
inline constexpr bool kScaledKv =
    std::is_same_v<T, std::int8_t> || std::is_same_v<T, Float8E4M3> ||
    std::is_same_v<T, Float8E5M2>;

// The largest finite value of an fp8 format, and its rounding.
inline float fp8_max(Float8E4M3) { return kFloat8E4M3Max; }
inline float fp8_max(Float8E5M2) { return kFloat8E5M2Max; }
inline Float8E4M3 fp8_round(double x, Float8E4M3) { return to_float8_e4m3(x); }
inline Float8E5M2 fp8_round(double x, Float8E5M2) { return to_float8_e5m2(x); }

// One row of n finite floats -> fp8 values and the row's scale, as
// quantize_int8_row with the format's largest finite value F for 127:
// scale = max_c |x_c| / F (rounded to float; rounded up to the next float
// when below 2^-126), q_c = x_c / scale rounded to the format (the quotient
// in double, then to nearest even: |x_c / scale| <= F, so nothing
// saturates). Returns false (writing nothing) when the row holds inf or NaN.
template <class T>
inline bool quantize_fp8_row(const float* x, std::size_t n, T* q,
                             float* scale) {
  float amax = 0.0f;
  for (std::size_t c = 0; c < n; ++c) {
    if (!std::isfinite(x[c])) return false;
    amax = std::max(amax, std::fabs(x[c]));
  }
  if (amax == 0.0f) {
    std::fill(q, q + n, T{});
    *scale = 0.0f;
    return true;
  }
  const float fmax = fp8_max(T{});
  float s = amax / fmax;
  if (s < std::numeric_limits<float>::min() &&
      static_cast<double>(s) * fmax < static_cast<double>(amax)) {
    s = std::nextafter(s, std::numeric_limits<float>::infinity());
  }
  for (std::size_t c = 0; c < n; ++c) {
    q[c] = fp8_round(static_cast<double>(x[c]) / s, T{});
  }
  *scale = s;
  return true;
}

// x / scale rounded to the format (the quotient in double), saturating at
// the largest finite value: the per-tensor write. scale > 0 and x finite.
template <class T>
inline T quantize_fp8(float x, float scale) {
  return fp8_round(static_cast<double>(x) / scale, T{});
}

// One row of n finite floats -> int8 values and the row's scale:
// scale = max_c |x_c| / 127 (rounded to float; rounded up to the next
// float when that is below 2^-126), q_c = round(x_c / scale)
// (to nearest, ties away from zero, |q_c| <= 127); a row of zeros gets
// scale 0 and q = 0. Error of each element, with u = 2^-24: x_c / scale is
// t (1 + d), |d| <= u, |t| <= 127 (1 + u) (scale was rounded; a subnormal
// scale was rounded up, so |t| <= 127 and the quotient is normal), so rounding
// and the clamp give |q_c - x_c / scale| <= 0.5 + 254 u; the product
// scale q_c rounds by another 127 u scale. In all |scale q_c - x_c| <=
// (0.5 + 381 u) scale < (0.5 + 2^-15) scale (tested). Returns false
// (writing nothing) when the row holds inf or NaN.
inline bool quantize_int8_row(const float* x, std::size_t n, std::int8_t* q,
                              float* scale) {
  float amax = 0.0f;
  for (std::size_t c = 0; c < n; ++c) {
    if (!std::isfinite(x[c])) return false;
    amax = std::max(amax, std::fabs(x[c]));
  }
  if (amax == 0.0f) {
    std::fill(q, q + n, std::int8_t{0});
    *scale = 0.0f;
    return true;
  }
  float s = amax / 127.0f;
  // Below 2^-126 the quotient is subnormal (or 0), with fewer than 24 bits:
  // rounded to nearest it could be smaller than amax / 127 by a large part
  // of itself, and amax / s then above 127.5 (clamped: an error of 0.58 s
  // was measured). There s is the smallest float with 127 s >= amax (127 s
  // is exact in double), so that |x_c / s| <= 127 and the bound below
  // holds. 1 / s can overflow, so divide element by element.
  if (s < std::numeric_limits<float>::min() &&
      static_cast<double>(s) * 127.0 < static_cast<double>(amax)) {
    s = std::nextafter(s, std::numeric_limits<float>::infinity());
  }
  for (std::size_t c = 0; c < n; ++c) {
    const float r = std::round(x[c] / s);
    q[c] = static_cast<std::int8_t>(std::clamp(r, -127.0f, 127.0f));
  }
  *scale = s;
  return true;
}

}  // namespace softdot::detail

#endif  // SOFTDOT_KERNELS_DEQUANTIZE_H_
