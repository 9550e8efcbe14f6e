// softdot: checked dot products.
#include "softdot/dot.h"

#include <cstddef>

#include "check.h"
#include "kernels/dispatch.h"
#include "kernels/small_dot.h"
#include "parallel.h"

namespace softdot {
namespace {

[[noreturn, gnu::noinline, gnu::cold]] void fail_sizes(const char* function,
                                                       std::size_t nx,
                                                       std::size_t ny) {
  detail::fail(function, "x has " + detail::count(nx) + " elements but y has " +
                             detail::count(ny));
}

// Inline, with the message built out of line: a call that builds strings
// on its error path was not inlined, one more call per dot (n = 64 takes
// about 6 ns in all).
template <class T>
void check_sizes(const char* function, std::span<const T> x,
                 std::span<const T> y) {
  if (x.size() != y.size()) [[unlikely]] {
    fail_sizes(function, x.size(), y.size());
  }
}

template <class T>
void dots_checked(std::span<const T> query, MatrixView<const T> keys,
                  std::span<T> scores) {
  detail::check_matrix("dots", "keys", keys);
  if (keys.cols != query.size()) {
    detail::fail("dots", "keys has " + detail::count(keys.cols) +
                             " columns but the query has " +
                             detail::count(query.size()) + " elements");
  }
  if (scores.size() != keys.rows) {
    detail::fail("dots", "scores has " + detail::count(scores.size()) +
                             " elements but keys has " +
                             detail::count(keys.rows) + " rows");
  }
  // Rows are split into fixed chunks of kDotsChunk (the split, and so each
  // score, does not depend on the thread count; each score is one dot
  // anyway). Small inputs stay on the calling thread.
  constexpr std::size_t kDotsChunk = 256;
  const std::size_t chunks = (keys.rows + kDotsChunk - 1) / kDotsChunk;
  const bool parallel =
      chunks > 1 && keys.rows * keys.cols >= detail::kParallelElements;
  detail::for_each_index(chunks, parallel, [&](std::size_t c) {
    const std::size_t first = c * kDotsChunk;
    const std::size_t rows =
        keys.rows - first < kDotsChunk ? keys.rows - first : kDotsChunk;
    detail::dots_kernel(query.data(), keys.data + first * keys.stride,
                        keys.stride, query.size(), rows, scores.data() + first);
  });
}

}  // namespace

float dot(std::span<const float> x, std::span<const float> y) {
  check_sizes("dot", x, y);
  if (x.size() <= 8) return detail::small_dot(x.data(), y.data(), x.size());
  return detail::dot_kernel(x.data(), y.data(), x.size());
}
double dot(std::span<const double> x, std::span<const double> y) {
  check_sizes("dot", x, y);
  if (x.size() <= 8) return detail::small_dot(x.data(), y.data(), x.size());
  return detail::dot_kernel(x.data(), y.data(), x.size());
}
float dot_accurate(std::span<const float> x, std::span<const float> y) {
  check_sizes("dot_accurate", x, y);
  return detail::dot_accurate_kernel(x.data(), y.data(), x.size());
}
double dot_accurate(std::span<const double> x, std::span<const double> y) {
  check_sizes("dot_accurate", x, y);
  return detail::dot_accurate_kernel(x.data(), y.data(), x.size());
}

void dots(std::span<const float> query, MatrixView<const float> keys,
          std::span<float> scores) {
  dots_checked<float>(query, keys, scores);
}
void dots(std::span<const double> query, MatrixView<const double> keys,
          std::span<double> scores) {
  dots_checked<double>(query, keys, scores);
}

}  // namespace softdot
