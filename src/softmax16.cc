// softdot: the softmax family on bfloat16 and float16 rows. Every result is
// computed in float or double from the exactly widened row and rounded once
// to the 16-bit format (round to odd to float, then to 16 bits: round16.h).
//
// softmax: the row is widened to float, its state (max c, sum S) taken by
// the faithful float state pass (compensated double lane sums), and the
// weights exp(p_i - c) / S formed in double lanes and rounded once
// (softmax16-inl.h). The double value is within about 2^-29 relative of
// the exact weight (exp below 2^-31 in the numerator and in every term of
// S, the sum and the quotient below 2^-50), so a weight is the correctly
// rounded one unless the exact weight lies within 2^-29 relative of a
// midpoint between two 16-bit numbers (docs/accuracy.md, tested).
// Rows with a NaN, an infinity or a fully masked row, and scaled rows whose
// max reaches 2^12, take the double path below.
// log_softmax, logsumexp, softmax_backward, cross_entropy and those rows:
// the row is widened to double, the double function computes it (within
// about 1 ulp of double), and each result is rounded once: correctly
// rounded unless the exact value lies within about 2^-51 relative of a
// midpoint.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "check.h"
#include "cross_entropy_checks.h"
#include "kernels/dispatch.h"
#include "parallel.h"
#include "round16.h"
#include "softdot/cross_entropy.h"
#include "softdot/float16.h"
#include "softdot/softmax.h"
#include "softmax_common.h"

namespace softdot {
namespace {

using detail::count;
using detail::fail;
using detail::RowOp;

template <class H>
constexpr bool kBf16 = std::is_same_v<H, BFloat16>;

template <class H>
double wide(H h) {
  return static_cast<double>(to_float(h));
}

template <class H>
H narrow(double v) {
  if constexpr (kBf16<H>) {
    return BFloat16{detail::bfloat16_bits(v)};
  } else {
    return to_float16(v);
  }
}

// Per-thread scratch, grown when a longer row comes (never per row).
template <class T>
T* scratch(std::size_t n, int slot) {
  thread_local std::vector<T> buf[3];
  if (buf[slot].size() < n) buf[slot].resize(n);
  return buf[slot].data();
}

template <class H>
void widen_to_double(const H* x, std::size_t n, double* w) {
  const float* f = scratch<float>(n, 0);
  detail::widen16(reinterpret_cast<const std::uint16_t*>(x), n,
                  const_cast<float*>(f), kBf16<H>);
  for (std::size_t i = 0; i < n; ++i) w[i] = static_cast<double>(f[i]);
}

template <class H>
void narrow_row(const double* w, std::size_t n, H* y) {
  for (std::size_t i = 0; i < n; ++i) y[i] = narrow<H>(w[i]);
}

const std::uint8_t* mask_bytes(const bool* mask) {
  return reinterpret_cast<const std::uint8_t*>(mask);
}

// The double path: widen to double, the double kernel, round once.
template <class H>
void row_by_double(const H* x, const std::uint8_t* mask, float scale,
                   std::size_t n, RowOp op, H* y) {
  double* w = scratch<double>(n, 1);
  widen_to_double(x, n, w);
  detail::softmax_row_kernel(w, mask, static_cast<double>(scale), n, op, true,
                             w, nullptr);
  narrow_row(w, n, y);
}

// The largest |x_i| of a 16-bit row as its magnitude bits (masked entries
// included): >= the exponent mask when the row holds an infinity or NaN.
template <class H>
std::uint16_t max_magnitude_bits(const H* x, std::size_t n) {
  const auto* b = reinterpret_cast<const std::uint16_t*>(x);
  std::uint16_t m = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint16_t a = b[i] & 0x7fffu;
    m = a > m ? a : m;
  }
  return m;
}

// Precision::kFast: the row widened to float, the float kFast softmax
// (weights within 2 ulp of float, 2.5 without FMA) in place, each float
// weight rounded once to 16 bits. Rows with an infinity or a NaN anywhere
// (masked entries included) and scaled rows whose largest |x_i * scale|
// may reach 2^12 take the faithful path's special-row fallback (the double
// path), so their special values are the faithful path's bits.
template <class H>
void row16_fast(const H* x, const std::uint8_t* mask, float scale,
                std::size_t n, H* y) {
  float* f = scratch<float>(n, 0);
  if (detail::softmax16_fast(reinterpret_cast<const std::uint16_t*>(x), mask,
                             scale, n, f, reinterpret_cast<std::uint16_t*>(y),
                             kBf16<H>)) {
    return;
  }
  constexpr std::uint16_t kExpMask = kBf16<H> ? 0x7f80u : 0x7c00u;
  const std::uint16_t m = max_magnitude_bits(x, n);
  const bool special =
      m >= kExpMask || (scale != 1.0f && static_cast<double>(to_float(H{m})) *
                                                 static_cast<double>(scale) >=
                                             0x1p12);
  if (special) {
    row_by_double(x, mask, scale, n, RowOp::kSoftmax, y);
    return;
  }
  detail::widen16(reinterpret_cast<const std::uint16_t*>(x), n, f, kBf16<H>);
  detail::softmax_row_kernel(f, mask, scale, n, RowOp::kSoftmax, false, f,
                             nullptr);
  detail::round16_floats(f, n, reinterpret_cast<std::uint16_t*>(y), kBf16<H>);
}

// One row of softmax (op kSoftmax) or log_softmax, checked by the caller.
template <class H>
void row16(const H* x, const std::uint8_t* mask, float scale, std::size_t n,
           RowOp op, H* y, bool fast = false) {
  if (op != RowOp::kSoftmax) {
    row_by_double(x, mask, scale, n, op, y);
    return;
  }
  if (fast) {
    row16_fast(x, mask, scale, n, y);
    return;
  }
  float* f = scratch<float>(n, 0);
  detail::widen16(reinterpret_cast<const std::uint16_t*>(x), n, f, kBf16<H>);
  double c = 0.0, sum = 0.0;
  if (!detail::softmax16_state(f, mask, scale, n, &c, &sum)) {
    // NaN, +-inf, fully masked, huge scaled max: the double path.
    row_by_double(x, mask, scale, n, op, y);
    return;
  }
  detail::softmax16_apply(f, mask, scale, n, c, 1.0 / sum,
                          reinterpret_cast<std::uint16_t*>(y), kBf16<H>);
}

template <class H>
void row_checked(const char* function, RowOp op, std::span<const H> x,
                 std::span<H> y, const SoftmaxOptions& options) {
  detail::check_softmax_row(function, x, y);
  if (!options.mask.empty() && options.mask.size() != x.size()) {
    fail(function, "mask has " + count(options.mask.size()) +
                       " flags but x has " + count(x.size()) + " elements");
  }
  const float scale = detail::softmax_scale<float>(function, options);
  row16(x.data(),
        options.mask.empty() ? nullptr : mask_bytes(options.mask.data()), scale,
        x.size(), op, y.data(), options.precision == Precision::kFast);
}

template <class H>
void rows_checked(const char* function, RowOp op, MatrixView<const H> x,
                  MatrixView<H> y, const SoftmaxOptions& options) {
  detail::check_softmax_rows(function, x, y, options);
  const std::size_t n = x.cols;
  const float scale = detail::softmax_scale<float>(function, options);
  const std::uint8_t* mask =
      options.mask.empty() ? nullptr : mask_bytes(options.mask.data());
  const bool per_row = mask != nullptr && options.mask.size() != n;
  // Grow this thread's scratch before any parallel region, so that the
  // loop body does not allocate on the calling thread.
  scratch<float>(n, 0);
  scratch<double>(n, 1);
  const bool fast = options.precision == Precision::kFast;
  const bool parallel = x.rows > 1 && x.rows * n >= detail::kParallelElements;
  detail::for_each_index(x.rows, parallel, [&](std::size_t i) {
    row16(x.data + i * x.stride, per_row ? mask + i * n : mask, scale, n, op,
          y.data + i * y.stride, fast);
  });
}

template <class H>
H lse_checked(std::span<const H> x, const SoftmaxOptions& options) {
  const char* function = "logsumexp";
  if (x.empty()) fail(function, "x is empty (logsumexp needs n >= 1)");
  if (!options.mask.empty() && options.mask.size() != x.size()) {
    fail(function, "mask has " + count(options.mask.size()) +
                       " flags but x has " + count(x.size()) + " elements");
  }
  const float scale = detail::softmax_scale<float>(function, options);
  std::vector<double> w(x.size());
  widen_to_double(x.data(), x.size(), w.data());
  // The double logsumexp takes s = 1 / T rounded to double; the 16-bit
  // functions use 1 / T rounded to float, so the scale is applied here
  // (x * s is exact in double) and the double function called unscaled.
  if (scale != 1.0f) {
    for (double& v : w) v *= static_cast<double>(scale);
  }
  SoftmaxOptions o = options;
  o.temperature = 1.0;
  return narrow<H>(logsumexp(std::span<const double>(w), o));
}

template <class H>
void backward_checked(std::span<const H> y, std::span<const H> dy,
                      std::span<H> dx) {
  const char* function = "softmax_backward";
  if (y.empty()) fail(function, "y is empty (n must be >= 1)");
  if (dy.size() != y.size() || dx.size() != y.size()) {
    fail(function, "y has " + count(y.size()) + " elements, dy " +
                       count(dy.size()) + " and dx " + count(dx.size()) +
                       " (all must be equal)");
  }
  if (detail::partial_overlap(y.data(), y.size(), dx.data(), dx.size()) ||
      detail::partial_overlap(dy.data(), dy.size(), dx.data(), dx.size())) {
    fail(function, "dx partially overlaps y or dy");
  }
  const std::size_t n = y.size();
  double* wy = scratch<double>(n, 1);
  double* wd = scratch<double>(n, 2);
  widen_to_double(y.data(), n, wy);
  widen_to_double(dy.data(), n, wd);
  softmax_backward(std::span<const double>(wy, n),
                   std::span<const double>(wd, n), std::span<double>(wd, n));
  narrow_row(wd, n, dx.data());
}

template <class H>
double cross_entropy_checked(MatrixView<const H> logits,
                             std::span<const std::int64_t> targets,
                             std::span<H> loss, MatrixView<H> grad,
                             const CrossEntropyOptions& options) {
  detail::check_cross_entropy<H>("cross_entropy", logits, logits.cols, targets,
                                 loss, grad, options);
  const std::size_t rows = logits.rows, v = logits.cols;
  std::vector<double> w(rows * v);
  for (std::size_t i = 0; i < rows; ++i) {
    widen_to_double(logits.data + i * logits.stride, v, w.data() + i * v);
  }
  std::vector<double> loss_d(loss.empty() ? 0 : rows);
  std::vector<double> grad_d(grad.data == nullptr ? 0 : rows * v);
  const double result = cross_entropy(
      MatrixView<const double>(w.data(), rows, v), targets,
      std::span<double>(loss_d),
      grad.data == nullptr ? MatrixView<double>{}
                           : MatrixView<double>(grad_d.data(), rows, v),
      options);
  for (std::size_t i = 0; i < loss_d.size(); ++i)
    loss[i] = narrow<H>(loss_d[i]);
  if (grad.data != nullptr) {
    for (std::size_t i = 0; i < rows; ++i) {
      narrow_row(grad_d.data() + i * v, v, grad.data + i * grad.stride);
    }
  }
  return result;
}

}  // namespace

SOFTDOT_SOFTMAX_OVERLOADS(BFloat16)
SOFTDOT_SOFTMAX_OVERLOADS(Float16)
void softmax_backward(std::span<const BFloat16> y, std::span<const BFloat16> dy,
                      std::span<BFloat16> dx) {
  backward_checked<BFloat16>(y, dy, dx);
}
void softmax_backward(std::span<const Float16> y, std::span<const Float16> dy,
                      std::span<Float16> dx) {
  backward_checked<Float16>(y, dy, dx);
}
SOFTDOT_CROSS_ENTROPY_OVERLOAD(BFloat16)
SOFTDOT_CROSS_ENTROPY_OVERLOAD(Float16)

}  // namespace softdot
