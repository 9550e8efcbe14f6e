// Reproducibility: dot, dots, softmax and softmax_rows give the same bits for
// every FMA target, every start offset 0..63 bytes (every element offset
// within a 64-byte line) and 1, 2 and 7 threads. The reduction order is fixed
// by the index alone.
#include <omp.h>

#include <string>
#include <vector>

#include "test_util.h"

namespace softdot_test {
namespace {

using softdot::MatrixView;

// Everything the test computes, as raw bits, for one configuration.
template <class T>
std::vector<T> compute_all(std::size_t offset, int threads) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(threads);
  std::vector<T> out;
  // Single rows: sizes around every block boundary and a long one.
  for (std::size_t n : {1, 3, 15, 16, 17, 127, 128, 129, 1000, 4099}) {
    const auto xv = make_uniform<T>(n, -8.0, 8.0, n);
    const auto yv = make_uniform<T>(n, -1.0, 1.0, n + 1);
    Guarded<T> x(std::span<const T>(xv), offset);
    Guarded<T> y(std::span<const T>(yv), (offset * 5) % 16);
    out.push_back(softdot::dot(x.cspan(), y.cspan()));
    out.push_back(softdot::dot_accurate(x.cspan(), y.cspan()));
    Guarded<T> sm(n, (offset * 3) % 16);
    softdot::softmax(x.cspan(), sm.span());
    out.insert(out.end(), sm.span().begin(), sm.span().end());
    out.push_back(softdot::logsumexp(x.cspan()));
  }
  // Matrices large enough (>= 2^18 elements) to be split across threads.
  const std::size_t rows = 300, cols = 1001, stride = 1003;
  const auto mv = make_uniform<T>(rows * stride, -6.0, 6.0, 99);
  Guarded<T> m(std::span<const T>(mv), offset);
  const auto qv = make_uniform<T>(cols, -1.0, 1.0, 98);
  std::vector<T> scores(rows), weights(rows * cols);
  softdot::dots(std::span<const T>(qv),
                MatrixView<const T>(m.cspan().data(), rows, cols, stride),
                std::span<T>(scores));
  softdot::softmax_rows(
      MatrixView<const T>(m.cspan().data(), rows, cols, stride),
      MatrixView<T>(weights.data(), rows, cols));
  out.insert(out.end(), scores.begin(), scores.end());
  out.insert(out.end(), weights.begin(), weights.end());
  omp_set_num_threads(saved);
  return out;
}

template <class T>
void CheckReproducible() {
  std::vector<T> want;
  std::string first;
  int configurations = 0;
  for (const auto& target : softdot::simd_targets()) {
    if (!is_fma_target(target)) continue;
    softdot::force_simd_target(target);
    for (std::size_t offset = 0; offset < 64 / sizeof(T); ++offset) {
      for (int threads : {1, 2, 7}) {
        // Thread counts only matter for the matrices; sweep them fully at
        // offset 0 and 1, and use one per offset elsewhere to keep it short.
        if (offset > 1 && threads != 1 + static_cast<int>(offset % 3) * 3 &&
            threads != 1) {
          continue;
        }
        const auto got = compute_all<T>(offset, threads);
        const std::string where =
            target + " offset " + std::to_string(offset * sizeof(T)) +
            " bytes, " + std::to_string(threads) + " threads";
        ++configurations;
        if (want.empty()) {
          want = got;
          first = where;
          continue;
        }
        ASSERT_EQ(got.size(), want.size());
        for (std::size_t i = 0; i < got.size(); ++i) {
          ASSERT_TRUE(same_value(got[i], want[i]))
              << type_name<T>() << " value " << i << ": " << where << " gives "
              << fmt(got[i]) << ", " << first << " gives " << fmt(want[i]);
        }
      }
    }
  }
  softdot::force_simd_target("");
  std::printf("[ repro    ] %s: %d configurations, identical bits\n",
              type_name<T>(), configurations);
  EXPECT_GE(configurations, 2);
}

TEST(Reproducible, FloatAcrossTargetsOffsetsAndThreads) {
  CheckReproducible<float>();
}
TEST(Reproducible, DoubleAcrossTargetsOffsetsAndThreads) {
  CheckReproducible<double>();
}

}  // namespace
}  // namespace softdot_test
