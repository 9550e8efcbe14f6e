// softdot kernels: int8 K/V storage, symmetric, one float scale per row:
// the scalar dequantisation (the vector kernels' WidenInt8 computes the same
// bits) and the quantisation of quantize_kv.
#ifndef SOFTDOT_KERNELS_DEQUANTIZE_H_
#define SOFTDOT_KERNELS_DEQUANTIZE_H_

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

namespace softdot::detail {

// scale * q, rounded once to float (the int8 value is exact in float).
inline float dequantize_int8(std::int8_t q, float scale) {
  return static_cast<float>(q) * scale;
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
