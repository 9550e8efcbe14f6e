// softdot: checked softmax family, softmax_rows and the online state.
#include "softdot/softmax.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>

#include "check.h"
#include "kernels.h"

namespace softdot {
namespace {

using detail::count;
using detail::fail;
using detail::RowOp;
using detail::RowState;

static_assert(sizeof(bool) == 1, "masks are read as bytes");

const char* type_name(float) { return "float"; }
const char* type_name(double) { return "double"; }

// The factor the scores are multiplied by: 1 / temperature in T.
template <class T>
T scale_of(const char* function, const SoftmaxOptions& options) {
  const double t = options.temperature;
  if (!(std::isfinite(t) && t > 0.0)) {
    fail(function,
         "temperature must be finite and > 0, got " + detail::number(t));
  }
  const T s = static_cast<T>(1.0 / t);
  if (!(std::isfinite(s) && s > T{0})) {
    fail(function, "temperature " + detail::number(t) +
                       " has no finite, non-zero reciprocal in " +
                       type_name(T{}));
  }
  return s;
}

const std::uint8_t* mask_bytes(const SoftmaxOptions& options) {
  return options.mask.empty()
             ? nullptr
             : reinterpret_cast<const std::uint8_t*>(options.mask.data());
}

void check_mask(const char* function, const SoftmaxOptions& options,
                std::size_t n) {
  if (!options.mask.empty() && options.mask.size() != n) {
    fail(function, "mask has " + count(options.mask.size()) +
                       " flags but x has " + count(n) + " elements");
  }
}

template <class T>
void check_row(const char* function, std::span<const T> x, std::span<T> y) {
  if (x.empty()) fail(function, "x is empty (a softmax needs n >= 1)");
  if (y.size() != x.size()) {
    fail(function,
         "x has " + count(x.size()) + " elements but y has " + count(y.size()));
  }
  if (detail::partial_overlap(x.data(), x.size(), y.data(), y.size())) {
    fail(function, "y partially overlaps x (only y == x is allowed)");
  }
}

template <class T>
void row_checked(const char* function, RowOp op, std::span<const T> x,
                 std::span<T> y, const SoftmaxOptions& options) {
  check_row(function, x, y);
  check_mask(function, options, x.size());
  const T scale = scale_of<T>(function, options);
  detail::softmax_row_kernel(x.data(), mask_bytes(options), scale, x.size(), op,
                             y.data(), nullptr);
}

template <class T>
RowState state_of(const char* function, std::span<const T> x,
                  const SoftmaxOptions& options) {
  check_mask(function, options, x.size());
  const T scale = scale_of<T>(function, options);
  RowState state{};
  detail::softmax_row_kernel(x.data(), mask_bytes(options), scale, x.size(),
                             RowOp::kState, nullptr, &state);
  return state;
}

// max + log(sum + sum_lo), rounded once to T.
template <class T>
T lse_of(const RowState& s) {
  if (std::isnan(s.max) || std::isnan(s.sum)) {
    return std::numeric_limits<T>::quiet_NaN();
  }
  if (std::isinf(s.max)) return static_cast<T>(s.max);
  // sum >= 1 for a row state (see Log in softmax-inl.h); a merged or
  // hand-made state may hold less, where plain log is as good.
  const long double log_sum =
      s.sum >= 1.0
          ? std::log1p(static_cast<long double>(s.sum - 1.0) + s.sum_lo)
          : std::log(static_cast<long double>(s.sum) + s.sum_lo);
  return static_cast<T>(static_cast<long double>(s.max) + log_sum);
}

template <class T>
void rows_checked(const char* function, RowOp op, MatrixView<const T> x,
                  MatrixView<T> y, const SoftmaxOptions& options) {
  detail::check_matrix(function, "x", x);
  detail::check_matrix(function, "y", y);
  if (x.rows != y.rows || x.cols != y.cols) {
    fail(function, "x is " + count(x.rows) + " x " + count(x.cols) +
                       " but y is " + count(y.rows) + " x " + count(y.cols));
  }
  if (x.rows == 0) return;
  if (x.cols == 0) fail(function, "rows are empty (cols = 0)");
  const std::size_t per_row = x.cols;
  if (!options.mask.empty() && options.mask.size() != per_row &&
      options.mask.size() != x.rows * x.cols) {
    fail(function, "mask has " + count(options.mask.size()) +
                       " flags; expected cols = " + count(per_row) +
                       " or rows * cols = " + count(x.rows * x.cols));
  }
  const std::size_t x_extent = (x.rows - 1) * x.stride + x.cols;
  const std::size_t y_extent = (y.rows - 1) * y.stride + y.cols;
  const bool in_place = x.data == y.data && x.stride == y.stride;
  if (!in_place &&
      (x.data == y.data ||
       detail::partial_overlap(x.data, x_extent, y.data, y_extent))) {
    fail(function, "y overlaps x (only the same matrix, in place, is allowed)");
  }
  const T scale = scale_of<T>(function, options);
  const std::uint8_t* mask = mask_bytes(options);
  const bool mask_per_row = mask != nullptr && options.mask.size() != per_row;

  const std::ptrdiff_t rows = static_cast<std::ptrdiff_t>(x.rows);
  const bool parallel =
      x.rows > 1 && x.rows * x.cols >= detail::kParallelElements;
#pragma omp parallel for schedule(static) if (parallel)
  for (std::ptrdiff_t r = 0; r < rows; ++r) {
    const std::size_t i = static_cast<std::size_t>(r);
    detail::softmax_row_kernel(x.data + i * x.stride,
                               mask_per_row ? mask + i * per_row : mask, scale,
                               per_row, op, y.data + i * y.stride, nullptr);
  }
}

template <class T>
BasicSoftmaxState<T> merge_impl(const BasicSoftmaxState<T>& a,
                                const BasicSoftmaxState<T>& b) noexcept {
  if (std::isnan(a.max) || std::isnan(b.max) || std::isnan(a.sum) ||
      std::isnan(b.sum)) {
    return {std::numeric_limits<T>::quiet_NaN(),
            std::numeric_limits<double>::quiet_NaN()};
  }
  const T m = std::max(a.max, b.max);
  // A term whose max is the new max keeps its sum as it is: no exp(inf - inf)
  // and no rounding for the larger side.
  const auto term = [m](const BasicSoftmaxState<T>& s) -> double {
    if (s.max == m) return s.sum;
    if (s.max == -std::numeric_limits<T>::infinity()) return 0.0;
    const long double shift =
        static_cast<long double>(s.max) - static_cast<long double>(m);
    return static_cast<double>(static_cast<long double>(s.sum) *
                               std::exp(shift));
  };
  return {m, term(a) + term(b)};
}

template <class T>
void apply_checked(std::span<const T> chunk, const BasicSoftmaxState<T>& total,
                   std::span<T> y, const SoftmaxOptions& options) {
  const char* function = "softmax_apply";
  if (y.size() != chunk.size()) {
    fail(function, "chunk has " + count(chunk.size()) + " elements but y has " +
                       count(y.size()));
  }
  if (detail::partial_overlap(chunk.data(), chunk.size(), y.data(), y.size())) {
    fail(function, "y partially overlaps the chunk");
  }
  check_mask(function, options, chunk.size());
  const T scale = scale_of<T>(function, options);
  if (chunk.empty()) return;
  RowState state{static_cast<double>(total.max), total.sum, 0.0};
  detail::softmax_row_kernel(chunk.data(), mask_bytes(options), scale,
                             chunk.size(), RowOp::kApply, y.data(), &state);
}

}  // namespace

void softmax(std::span<const float> x, std::span<float> y,
             const SoftmaxOptions& options) {
  row_checked<float>("softmax", RowOp::kSoftmax, x, y, options);
}
void softmax(std::span<const double> x, std::span<double> y,
             const SoftmaxOptions& options) {
  row_checked<double>("softmax", RowOp::kSoftmax, x, y, options);
}
void log_softmax(std::span<const float> x, std::span<float> y,
                 const SoftmaxOptions& options) {
  row_checked<float>("log_softmax", RowOp::kLogSoftmax, x, y, options);
}
void log_softmax(std::span<const double> x, std::span<double> y,
                 const SoftmaxOptions& options) {
  row_checked<double>("log_softmax", RowOp::kLogSoftmax, x, y, options);
}

float logsumexp(std::span<const float> x, const SoftmaxOptions& options) {
  if (x.empty()) fail("logsumexp", "x is empty (logsumexp needs n >= 1)");
  return lse_of<float>(state_of<float>("logsumexp", x, options));
}
double logsumexp(std::span<const double> x, const SoftmaxOptions& options) {
  if (x.empty()) fail("logsumexp", "x is empty (logsumexp needs n >= 1)");
  return lse_of<double>(state_of<double>("logsumexp", x, options));
}

void softmax_rows(MatrixView<const float> x, MatrixView<float> y,
                  const SoftmaxOptions& options) {
  rows_checked<float>("softmax_rows", RowOp::kSoftmax, x, y, options);
}
void softmax_rows(MatrixView<const double> x, MatrixView<double> y,
                  const SoftmaxOptions& options) {
  rows_checked<double>("softmax_rows", RowOp::kSoftmax, x, y, options);
}
void log_softmax_rows(MatrixView<const float> x, MatrixView<float> y,
                      const SoftmaxOptions& options) {
  rows_checked<float>("log_softmax_rows", RowOp::kLogSoftmax, x, y, options);
}
void log_softmax_rows(MatrixView<const double> x, MatrixView<double> y,
                      const SoftmaxOptions& options) {
  rows_checked<double>("log_softmax_rows", RowOp::kLogSoftmax, x, y, options);
}

SoftmaxState softmax_state(std::span<const float> chunk,
                           const SoftmaxOptions& options) {
  const RowState s = state_of<float>("softmax_state", chunk, options);
  return {static_cast<float>(s.max), s.sum};
}
SoftmaxStateD softmax_state(std::span<const double> chunk,
                            const SoftmaxOptions& options) {
  const RowState s = state_of<double>("softmax_state", chunk, options);
  return {s.max, s.sum};
}

SoftmaxState merge(const SoftmaxState& a, const SoftmaxState& b) noexcept {
  return merge_impl(a, b);
}
SoftmaxStateD merge(const SoftmaxStateD& a, const SoftmaxStateD& b) noexcept {
  return merge_impl(a, b);
}

void softmax_apply(std::span<const float> chunk, const SoftmaxState& total,
                   std::span<float> y, const SoftmaxOptions& options) {
  apply_checked<float>(chunk, total, y, options);
}
void softmax_apply(std::span<const double> chunk, const SoftmaxStateD& total,
                   std::span<double> y, const SoftmaxOptions& options) {
  apply_checked<double>(chunk, total, y, options);
}

float logsumexp(const SoftmaxState& state) noexcept {
  return lse_of<float>({static_cast<double>(state.max), state.sum, 0.0});
}
double logsumexp(const SoftmaxStateD& state) noexcept {
  return lse_of<double>({state.max, state.sum, 0.0});
}

}  // namespace softdot
