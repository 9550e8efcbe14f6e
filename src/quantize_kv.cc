// softdot: quantize_kv(), float rows -> int8 values and one scale per row
// (the arithmetic is kernels/dequantize.h's).
#include <cmath>
#include <cstdint>
#include <string>

#include "attention_checks.h"
#include "kernels/dequantize.h"
#include "softdot/attention.h"

namespace softdot {

using namespace detail::attn;

void quantize_kv(TensorView<const float> x, TensorView<std::int8_t> values,
                 TensorView<float> scales) {
  const char* fn = "quantize_kv";
  check_tensor(fn, "x", x);
  check_tensor(fn, "values", values);
  check_tensor(fn, "scales", scales);
  if (values.batch != x.batch || values.heads != x.heads ||
      values.rows != x.rows || values.cols != x.cols) {
    fail(fn,
         shape("values", values) + " must have the shape of " + shape("x", x));
  }
  if (scales.batch != x.batch || scales.heads != x.heads ||
      scales.rows != x.rows || scales.cols != 1) {
    fail(fn, shape("scales", scales) + " must be " +
                 shape("scales", x.batch, x.heads, x.rows, 1) + " for " +
                 shape("x", x));
  }
  // Every row is checked before anything is written.
  for (std::size_t b = 0; b < x.batch; ++b) {
    for (std::size_t h = 0; h < x.heads; ++h) {
      for (std::size_t j = 0; j < x.rows; ++j) {
        const float* r = x.row(b, h, j);
        for (std::size_t c = 0; c < x.cols; ++c) {
          if (!std::isfinite(r[c])) {
            fail(fn, shape("x", x) + " holds " + number(r[c]) + " at [" +
                         count(b) + ", " + count(h) + ", " + count(j) + ", " +
                         count(c) + "]: only finite values can be quantised");
          }
        }
      }
    }
  }
  for (std::size_t b = 0; b < x.batch; ++b) {
    for (std::size_t h = 0; h < x.heads; ++h) {
      for (std::size_t j = 0; j < x.rows; ++j) {
        detail::quantize_int8_row(x.row(b, h, j), x.cols, values.row(b, h, j),
                                  scales.row(b, h, j));
      }
    }
  }
}

}  // namespace softdot
