// softdot: argument checks shared by the public entry points. Every failure
// is a std::invalid_argument whose message names the function, the argument
// and the sizes involved.
#ifndef SOFTDOT_SRC_CHECK_H_
#define SOFTDOT_SRC_CHECK_H_

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "softdot/matrix.h"

namespace softdot::detail {

[[noreturn]] inline void fail(const char* function, const std::string& what) {
  throw std::invalid_argument(std::string("softdot::") + function + ": " +
                              what);
}

inline std::string count(std::size_t n) { return std::to_string(n); }

// Shortest text that reads back as the same double ("0", "1e-300", "nan").
inline std::string number(double v) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, r.ptr);
}

// Matrices with more than this many elements are split across threads.
inline constexpr std::size_t kParallelElements = std::size_t{1} << 18;

// The elements a strided array spans, from its first element to its last
// plus one: (n_0 - 1) s_0 + ... + (n_k - 1) s_k + cols, or 0 when any
// dimension is 0. Returns false when that count, in bytes of `elem`, does
// not fit in PTRDIFF_MAX (no object is larger, and the kernels take
// pointer differences across the array), computed without wrapping.
inline bool span_fits(const std::size_t* dims, const std::size_t* strides,
                      std::size_t n, std::size_t cols, std::size_t elem,
                      std::size_t* elements) {
  *elements = 0;
  if (cols == 0) return true;
  for (std::size_t i = 0; i < n; ++i) {
    if (dims[i] == 0) return true;
  }
  std::size_t total = cols;
  for (std::size_t i = 0; i < n; ++i) {
    std::size_t step = 0;
    if (__builtin_mul_overflow(dims[i] - 1, strides[i], &step) ||
        __builtin_add_overflow(total, step, &total)) {
      return false;
    }
  }
  std::size_t bytes = 0;
  if (__builtin_mul_overflow(total, elem, &bytes) ||
      bytes > static_cast<std::size_t>(PTRDIFF_MAX)) {
    return false;
  }
  *elements = total;
  return true;
}

// The message for a view that span_fits rejected.
inline std::string span_error(const std::string& view, std::size_t elem) {
  return view + " spans more than PTRDIFF_MAX (" +
         count(static_cast<std::size_t>(PTRDIFF_MAX)) + ") bytes of " +
         count(elem) + "-byte elements";
}

template <class T>
void check_matrix(const char* function, const char* name,
                  const MatrixView<T>& m) {
  std::size_t elements = 0;
  const std::size_t dims[1] = {m.rows}, strides[1] = {m.stride};
  if (!span_fits(dims, strides, 1, m.cols, sizeof(T), &elements)) {
    fail(function,
         span_error(std::string(name) + " (" + count(m.rows) + " x " +
                        count(m.cols) + ", stride " + count(m.stride) + ")",
                    sizeof(T)));
  }
  if (m.rows > 1 && m.stride < m.cols) {
    fail(function, std::string(name) + " has stride " + count(m.stride) +
                       " < cols " + count(m.cols));
  }
  if (m.data == nullptr && m.rows != 0 && m.cols != 0) {
    fail(function, std::string(name) + " is " + count(m.rows) + " x " +
                       count(m.cols) + " but its data is null");
  }
}

// True when [a, a + na) and [b, b + nb) share memory but do not start at the
// same address (exact aliasing is allowed, partial overlap is not).
template <class T>
bool partial_overlap(const T* a, std::size_t na, const T* b, std::size_t nb) {
  if (a == b || na == 0 || nb == 0) return false;
  const auto pa = reinterpret_cast<std::uintptr_t>(a);
  const auto pb = reinterpret_cast<std::uintptr_t>(b);
  return pa < pb + nb * sizeof(T) && pb < pa + na * sizeof(T);
}

}  // namespace softdot::detail

#endif  // SOFTDOT_SRC_CHECK_H_
