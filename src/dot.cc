// softdot: checked dot products.
#include "softdot/dot.h"

#include <cstddef>

#include "check.h"
#include "kernels.h"

namespace softdot {
namespace {

template <class T>
void check_sizes(const char* function, std::span<const T> x,
                 std::span<const T> y) {
  if (x.size() != y.size()) {
    detail::fail(function, "x has " + detail::count(x.size()) +
                               " elements but y has " +
                               detail::count(y.size()));
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
  const auto n_chunks = static_cast<std::ptrdiff_t>(chunks);
  const auto chunk = [&](std::ptrdiff_t c) {
    const std::size_t first = static_cast<std::size_t>(c) * kDotsChunk;
    const std::size_t rows =
        keys.rows - first < kDotsChunk ? keys.rows - first : kDotsChunk;
    detail::dots_kernel(query.data(), keys.data + first * keys.stride,
                        keys.stride, query.size(), rows, scores.data() + first);
  };
  // Without a region when serial: an OpenMP region with if(false) still
  // cost about 1 us per call here (a throwaway loop: 4 x 16 took 1.18 us
  // with it; BM_dots/4 now measures 0.03 us).
  if (parallel) {
#pragma omp parallel for schedule(static)
    for (std::ptrdiff_t c = 0; c < n_chunks; ++c) chunk(c);
  } else {
    for (std::ptrdiff_t c = 0; c < n_chunks; ++c) chunk(c);
  }
}

// A dot of fewer than 8 elements without the dispatch: the kernel's lanes
// would hold x_j * y_j + 0 (the + 0 turns a -0 product into +0) for j < n
// and +0 after, added in the fixed tree j + 8, j + 4, j + 2, j + 1. Adding
// +0 to a lane that is not -0 changes nothing, so for n <= 8 the tree is
// ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)) with the missing
// lanes left out: the same bits as the kernel on every target (a product
// rounds the same with or without FMA). Saves ~3 of the ~8 ns of a
// 3-element dot.
template <class T>
T tiny_dot(const T* x, const T* y, std::size_t n) {
  T l[8];
  for (std::size_t j = 0; j < 8; ++j) l[j] = j < n ? x[j] * y[j] + T(0) : T(0);
  return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

}  // namespace

float dot(std::span<const float> x, std::span<const float> y) {
  check_sizes("dot", x, y);
  if (x.size() <= 8) return tiny_dot(x.data(), y.data(), x.size());
  return detail::dot_kernel(x.data(), y.data(), x.size());
}
double dot(std::span<const double> x, std::span<const double> y) {
  check_sizes("dot", x, y);
  if (x.size() <= 8) return tiny_dot(x.data(), y.data(), x.size());
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
