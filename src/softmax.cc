// softdot: checked softmax family, softmax_rows and the online state.
#include "softdot/softmax.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

#include "check.h"
#include "kernels/dispatch.h"
#include "kernels/state_merge.h"
#include "kernels/two_sum.h"
#include "parallel.h"
#include "softmax_common.h"

namespace softdot {
namespace {

using detail::count;
using detail::fail;
using detail::RowOp;
using detail::RowState;

static_assert(sizeof(bool) == 1, "masks are read as bytes");

bool faithful(const SoftmaxOptions& options) {
  return options.precision == Precision::kFaithful;
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
void row_checked(const char* function, RowOp op, std::span<const T> x,
                 std::span<T> y, const SoftmaxOptions& options) {
  detail::check_softmax_row(function, x, y);
  check_mask(function, options, x.size());
  const T scale = detail::softmax_scale<T>(function, options);
  detail::softmax_row_kernel(x.data(), mask_bytes(options), scale, x.size(), op,
                             faithful(options), y.data(), nullptr);
}

template <class T>
RowState state_of(const char* function, std::span<const T> x,
                  const SoftmaxOptions& options) {
  check_mask(function, options, x.size());
  const T scale = detail::softmax_scale<T>(function, options);
  RowState state{};
  detail::softmax_row_kernel(x.data(), mask_bytes(options), scale, x.size(),
                             RowOp::kState, faithful(options), nullptr, &state);
  return state;
}

// The next wider type, for the cancelling case of logsumexp.
template <class T>
using Wider = std::conditional_t<sizeof(T) == 4, double, long double>;

// m + log(sum exp(p_i - m)) with every step in Wider<T>: scalar, used only
// when the fast result cancels. The sum is compensated (TwoSum).
template <class T>
T lse_wide(std::span<const T> x, const std::uint8_t* mask, T scale, T m) {
  using W = Wider<T>;
  W hi = 0, lo = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (mask != nullptr && mask[i] == 0) continue;
    const W p = static_cast<W>(x[i]) * static_cast<W>(scale);
    if (p == -std::numeric_limits<W>::infinity()) continue;
    detail::add_compensated(hi, lo, std::exp(p - static_cast<W>(m)));
  }
  // The max entry contributes exactly 1, so the sum is >= 1.
  return static_cast<T>(static_cast<W>(m) + std::log1p((hi - 1) + lo));
}

template <class T>
T lse_checked(std::span<const T> x, const SoftmaxOptions& options) {
  if (x.empty()) fail("logsumexp", "x is empty (logsumexp needs n >= 1)");
  const RowState state = state_of<T>("logsumexp", x, options);
  const T lse = detail::logsumexp_of_state<T>(state);
  // Cancellation: log(sum) ~ -m, so its rounding error (~u |m|) is large
  // against the result. Redo the sum in the wider type.
  if (std::isfinite(lse) && state.max < 0 && std::fabs(lse) < -state.max) {
    return lse_wide<T>(x, mask_bytes(options),
                       detail::softmax_scale<T>("logsumexp", options),
                       static_cast<T>(state.max));
  }
  return lse;
}

template <class T>
void rows_checked(const char* function, RowOp op, MatrixView<const T> x,
                  MatrixView<T> y, const SoftmaxOptions& options) {
  detail::check_softmax_rows(function, x, y, options);
  const std::size_t per_row = x.cols;
  const T scale = detail::softmax_scale<T>(function, options);
  const std::uint8_t* mask = mask_bytes(options);
  const bool mask_per_row = mask != nullptr && options.mask.size() != per_row;

  const bool parallel =
      x.rows > 1 && x.rows * x.cols >= detail::kParallelElements;
  detail::for_each_index(x.rows, parallel, [&](std::size_t i) {
    detail::softmax_row_kernel(
        x.data + i * x.stride, mask_per_row ? mask + i * per_row : mask, scale,
        per_row, op, faithful(options), y.data + i * y.stride, nullptr);
  });
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
  const T scale = detail::softmax_scale<T>(function, options);
  if (chunk.empty()) return;
  RowState state{static_cast<double>(total.max), total.sum, total.sum_lo};
  detail::softmax_row_kernel(chunk.data(), mask_bytes(options), scale,
                             chunk.size(), RowOp::kApply, faithful(options),
                             y.data(), &state);
}

}  // namespace

SOFTDOT_SOFTMAX_OVERLOADS(float)
SOFTDOT_SOFTMAX_OVERLOADS(double)

SoftmaxState softmax_state(std::span<const float> chunk,
                           const SoftmaxOptions& options) {
  const RowState s = state_of<float>("softmax_state", chunk, options);
  return {static_cast<float>(s.max), s.sum, s.sum_lo};
}
SoftmaxStateD softmax_state(std::span<const double> chunk,
                            const SoftmaxOptions& options) {
  const RowState s = state_of<double>("softmax_state", chunk, options);
  return {s.max, s.sum, s.sum_lo};
}

namespace {
template <class T>
BasicSoftmaxState<T> merge_states(BasicSoftmaxState<T> a,
                                  const BasicSoftmaxState<T>& b) noexcept {
  detail::merge_softmax_state(a.max, a.sum, a.sum_lo, b.max, b.sum, b.sum_lo);
  return a;
}
}  // namespace

SoftmaxState merge(const SoftmaxState& a, const SoftmaxState& b) noexcept {
  return merge_states(a, b);
}
SoftmaxStateD merge(const SoftmaxStateD& a, const SoftmaxStateD& b) noexcept {
  return merge_states(a, b);
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
  return detail::logsumexp_of_state<float>(
      {static_cast<double>(state.max), state.sum, state.sum_lo});
}
double logsumexp(const SoftmaxStateD& state) noexcept {
  return detail::logsumexp_of_state<double>(
      {state.max, state.sum, state.sum_lo});
}

}  // namespace softdot
