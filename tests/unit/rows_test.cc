// softmax_rows / log_softmax_rows: strides, in place, masks, threads; every
// row bitwise equal to softmax() / log_softmax() of that row.
#include <omp.h>

#include <vector>

#include "test_util.h"

namespace softdot_test {
namespace {

using softdot::MatrixView;
using softdot::SoftmaxOptions;

class RowsTest : public PerTarget {};

enum class MaskKind { kNone, kCols, kRowsCols };

template <class T>
void CheckRows(std::size_t rows, std::size_t cols, std::size_t xs,
               std::size_t ys, MaskKind mk, double temperature,
               std::uint64_t seed) {
  const std::string what =
      std::string(type_name<T>()) + " " + std::to_string(rows) + "x" +
      std::to_string(cols) + " strides " + std::to_string(xs) + "/" +
      std::to_string(ys) + " mask " + std::to_string(int(mk));
  const T pad = T(-4242);
  std::vector<T> x(rows * xs, pad);
  for (std::size_t r = 0; r < rows; ++r) {
    const auto v = make_logits<T>(cols, kAllDists[r % 4], seed + r);
    std::copy(v.begin(), v.end(), x.begin() + r * xs);
  }
  Mask mask;
  if (mk == MaskKind::kCols) {
    mask = Mask(cols);
    for (std::size_t i = 0; i < cols; i += 3) mask[i] = false;
  } else if (mk == MaskKind::kRowsCols) {
    mask = Mask(rows * cols);
    std::mt19937_64 rng(seed);
    for (std::size_t i = 0; i < rows * cols; ++i) mask[i] = rng() % 4 != 0;
  }
  const SoftmaxOptions o{temperature, mask.span()};
  auto row_options = [&](std::size_t r) {
    SoftmaxOptions ro{temperature, {}};
    if (mk == MaskKind::kCols) ro.mask = mask.span();
    if (mk == MaskKind::kRowsCols)
      ro.mask = mask.span().subspan(r * cols, cols);
    return ro;
  };
  for (bool log : {false, true}) {
    const auto fn = [&](MatrixView<const T> a, MatrixView<T> b) {
      log ? softdot::log_softmax_rows(a, b, o) : softdot::softmax_rows(a, b, o);
    };
    const std::string w = what + (log ? " log" : "");
    std::vector<T> y(rows * ys, pad);
    fn(MatrixView<const T>(x.data(), rows, cols, xs),
       MatrixView<T>(y.data(), rows, cols, ys));
    // In place (same view for x and y).
    std::vector<T> z = x;
    fn(MatrixView<const T>(z.data(), rows, cols, xs),
       MatrixView<T>(z.data(), rows, cols, xs));
    for (std::size_t r = 0; r < rows; ++r) {
      std::vector<T> want(cols);
      const std::span<const T> xr(&x[r * xs], cols);
      if (log) {
        softdot::log_softmax(xr, std::span<T>(want), row_options(r));
      } else {
        softdot::softmax(xr, std::span<T>(want), row_options(r));
      }
      ASSERT_TRUE(SameBits(std::span<const T>(&y[r * ys], cols),
                           std::span<const T>(want)))
          << w << " row " << r;
      ASSERT_TRUE(SameBits(std::span<const T>(&z[r * xs], cols),
                           std::span<const T>(want)))
          << w << " in place, row " << r;
      // The gaps between rows are never written.
      for (std::size_t g = cols; g < ys && r + 1 < rows; ++g) {
        ASSERT_EQ(y[r * ys + g], pad) << w << " gap of row " << r;
      }
      for (std::size_t g = cols; g < xs && r + 1 < rows; ++g) {
        ASSERT_EQ(z[r * xs + g], pad) << w << " in-place gap of row " << r;
      }
    }
  }
}

TEST_P(RowsTest, EveryRowEqualsSoftmaxOfThatRow) {
  std::uint64_t seed = 1;
  for (std::size_t cols : {1, 2, 7, 16, 17, 64, 100, 257}) {
    for (MaskKind mk :
         {MaskKind::kNone, MaskKind::kCols, MaskKind::kRowsCols}) {
      CheckRows<float>(9, cols, cols + 3, cols + 11, mk, 1.0, seed++);
      CheckRows<double>(9, cols, cols + 5, cols + 2, mk, 1.0, seed++);
      CheckRows<float>(5, cols, cols, cols, mk, 0.7, seed++);  // dense
      CheckRows<double>(5, cols, cols, cols + 1, mk, 2.0, seed++);
    }
  }
  // One row: the stride is not used.
  CheckRows<float>(1, 33, 0 + 33, 40, MaskKind::kCols, 1.0, seed++);
}

template <class T>
void CheckRowsThreads(bool log) {
  // 600 x 512 > 2^18 elements: split across threads.
  const std::size_t rows = 600, cols = 512, xs = 520, ys = 515;
  std::vector<T> x(rows * xs);
  for (std::size_t r = 0; r < rows; ++r) {
    const auto v = make_logits<T>(cols, kAllDists[r % 4], r);
    std::copy(v.begin(), v.end(), x.begin() + r * xs);
  }
  std::vector<T> y1(rows * ys, T(0)), y2(rows * ys, T(0));
  const auto run = [&](std::vector<T>& y) {
    if (log) {
      softdot::log_softmax_rows(MatrixView<const T>(x.data(), rows, cols, xs),
                                MatrixView<T>(y.data(), rows, cols, ys));
    } else {
      softdot::softmax_rows(MatrixView<const T>(x.data(), rows, cols, xs),
                            MatrixView<T>(y.data(), rows, cols, ys));
    }
  };
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  run(y1);
  omp_set_num_threads(2);
  run(y2);
  omp_set_num_threads(saved);
  EXPECT_TRUE(SameBits(y1, y2)) << type_name<T>() << " log=" << log;
  std::vector<T> want(cols);
  for (std::size_t r = 0; r < rows; r += 61) {
    const std::span<const T> xr(&x[r * xs], cols);
    if (log) {
      softdot::log_softmax(xr, std::span<T>(want));
    } else {
      softdot::softmax(xr, std::span<T>(want));
    }
    EXPECT_TRUE(SameBits(std::span<const T>(&y2[r * ys], cols),
                         std::span<const T>(want)))
        << "row " << r;
  }
}

TEST_P(RowsTest, SameBitsForOneAndTwoThreads) {
  for (bool log : {false, true}) {
    CheckRowsThreads<float>(log);
    CheckRowsThreads<double>(log);
  }
}

SOFTDOT_INSTANTIATE_PER_TARGET(RowsTest);

}  // namespace
}  // namespace softdot_test
