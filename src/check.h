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

template <class T>
void check_matrix(const char* function, const char* name,
                  const MatrixView<T>& m) {
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
