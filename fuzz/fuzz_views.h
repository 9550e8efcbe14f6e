// libFuzzer targets of the tensor API: the shapes, strides, values and
// exactly sized buffers fuzz_attention, fuzz_request and fuzz_backward share.
#ifndef SOFTDOT_FUZZ_FUZZ_VIEWS_H_
#define SOFTDOT_FUZZ_FUZZ_VIEWS_H_

#include <fuzzer/FuzzedDataProvider.h>
#include <softdot/softdot.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>

namespace softdot_fuzz {

// Most elements a view may span here (the rest get a one-element buffer).
constexpr std::size_t kCapElements = std::size_t{1} << 16;

struct Shape {
  std::size_t batch = 1, heads = 1, rows = 1, cols = 1;
  std::size_t bs = 0, hs = 0, rs = 0;
};

// (n_0 - 1) s_0 + ... + cols, or SIZE_MAX when it wraps; 0 when empty.
inline std::size_t span_of(const Shape& s) {
  if (s.batch == 0 || s.heads == 0 || s.rows == 0 || s.cols == 0) return 0;
  std::size_t total = s.cols, step = 0;
  const std::size_t n[3] = {s.batch, s.heads, s.rows};
  const std::size_t st[3] = {s.bs, s.hs, s.rs};
  for (int i = 0; i < 3; ++i) {
    if (__builtin_mul_overflow(n[i] - 1, st[i], &step) ||
        __builtin_add_overflow(total, step, &total)) {
      return std::numeric_limits<std::size_t>::max();
    }
  }
  return total;
}

// A dimension: usually small, sometimes 0 or huge.
inline std::size_t pick_dim(FuzzedDataProvider& f, std::size_t typical) {
  switch (f.ConsumeIntegralInRange<int>(0, 15)) {
    case 0:
      return 0;
    case 1:
      return f.ConsumeIntegral<std::size_t>();
    case 2:
      return std::size_t{1} << f.ConsumeIntegralInRange<int>(20, 63);
    default:
      return f.ConsumeIntegralInRange<std::size_t>(1, typical);
  }
}

// Strides: dense, padded, zero (broadcast), too small, or arbitrary.
inline void pick_strides(FuzzedDataProvider& f, Shape& s) {
  const int mode = f.ConsumeIntegralInRange<int>(0, 7);
  if (mode <= 3) {
    s.rs =
        s.cols + (mode == 1 ? f.ConsumeIntegralInRange<std::size_t>(0, 5) : 0);
    s.hs = s.rs * s.rows +
           (mode == 2 ? f.ConsumeIntegralInRange<std::size_t>(0, 9) : 0);
    s.bs = s.hs * s.heads;
    if (mode == 3) s.bs = 0;
  } else if (mode == 4) {
    s.rs = s.cols > 0 ? s.cols - 1 : 0;
    s.hs = s.rs * s.rows;
    s.bs = s.hs * s.heads;
  } else {
    s.rs = f.ConsumeIntegral<std::size_t>() >>
           f.ConsumeIntegralInRange<int>(0, 63);
    s.hs = f.ConsumeIntegral<std::size_t>() >>
           f.ConsumeIntegralInRange<int>(0, 63);
    s.bs = f.ConsumeIntegral<std::size_t>() >>
           f.ConsumeIntegralInRange<int>(0, 63);
  }
}

inline float pick_value(FuzzedDataProvider& f) {
  switch (f.ConsumeIntegralInRange<int>(0, 31)) {
    case 0:
      return std::numeric_limits<float>::quiet_NaN();
    case 1:
      return std::numeric_limits<float>::infinity();
    case 2:
      return -std::numeric_limits<float>::infinity();
    case 3:
      return f.ConsumeFloatingPoint<float>();
    default:
      return f.ConsumeFloatingPointInRange<float>(-4.0f, 4.0f);
  }
}

// A buffer for a view of shape s: exactly its span, or one element.
template <class T>
struct Buffer {
  std::unique_ptr<T[]> data;
  std::size_t size = 0;
};

// Set when a view spans more than kCapElements but fits in memory: the
// library accepts such a view (it cannot know the caller's buffer), so the
// case is not run.
inline bool g_skip = false;

template <class T, class Fill>
Buffer<T> buffer_for(const Shape& s, Fill fill) {
  std::size_t n = span_of(s);
  if (n > kCapElements) {
    const bool fits = n != std::numeric_limits<std::size_t>::max() &&
                      n <= static_cast<std::size_t>(PTRDIFF_MAX) / sizeof(T);
    if (fits) g_skip = true;
    n = 1;  // a view too large for memory must be rejected
  }
  if (n == 0) n = 1;
  Buffer<T> b;
  b.data = std::make_unique<T[]>(n);
  b.size = n;
  for (std::size_t i = 0; i < n; ++i) b.data[i] = fill();
  return b;
}

inline Shape pick_shape(FuzzedDataProvider& f, std::size_t b, std::size_t h,
                        std::size_t r, std::size_t c) {
  Shape s;
  s.batch = f.ConsumeIntegralInRange<int>(0, 9) == 0 ? pick_dim(f, 3) : b;
  s.heads = f.ConsumeIntegralInRange<int>(0, 9) == 0 ? pick_dim(f, 4) : h;
  s.rows = f.ConsumeIntegralInRange<int>(0, 9) == 0 ? pick_dim(f, 40) : r;
  s.cols = f.ConsumeIntegralInRange<int>(0, 9) == 0 ? pick_dim(f, 20) : c;
  pick_strides(f, s);
  return s;
}

template <class T>
softdot::TensorView<const T> view_of(const Buffer<T>& b, const Shape& s) {
  return softdot::TensorView<const T>(b.data.get(), s.batch, s.heads, s.rows,
                                      s.cols, s.bs, s.hs, s.rs);
}

// A mutable view of a buffer.
template <class T>
softdot::TensorView<T> mut_view_of(const Buffer<T>& b, const Shape& s) {
  return softdot::TensorView<T>(b.data.get(), s.batch, s.heads, s.rows, s.cols,
                                s.bs, s.hs, s.rs);
}

}  // namespace softdot_fuzz

#endif  // SOFTDOT_FUZZ_FUZZ_VIEWS_H_
