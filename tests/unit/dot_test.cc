// dot() and dots(): accuracy against the exact (MPFR) value, alignment
// independence, dots() == dot() per row, threads, and argument checks.
#include <omp.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "test_util.h"

namespace softdot_test {
namespace {

using softdot::MatrixView;

class DotTest : public PerTarget {};

template <class T>
void CheckDotSweep(const std::string& target) {
  std::vector<std::size_t> sizes;
  for (std::size_t n = 1; n <= 300; ++n) sizes.push_back(n);
  for (std::size_t n : {1000, 4097, 65536, 100000}) sizes.push_back(n);
  double worst = 0;  // error / (u * sum |x_i y_i|)
  std::string where;
  std::uint64_t seed = 1;
  for (std::size_t n : sizes) {
    // Mixed signs: cancellation makes the relative error large, the bound
    // gamma_n sum |x_i y_i| still holds.
    const auto xv = make_uniform<T>(n, -1.0, 1.0, seed++);
    const auto yv = make_uniform<T>(n, -2.0, 3.0, seed++);
    Guarded<T> x(std::span<const T>(xv), 1 + n % 15);
    Guarded<T> y(std::span<const T>(yv), 1 + (n * 7) % 15);
    const T got = softdot::dot(x.cspan(), y.cspan());
    const auto ref = softdot_ref::dot_reference(x.cspan(), y.cspan());
    const double err = softdot_ref::abs_error(got, ref.value);
    const double bound = softdot_ref::gamma<T>(n) * ref.abs_sum;
    ASSERT_LE(err, bound) << type_name<T>() << " n=" << n << " got " << fmt(got)
                          << " want " << fmt(ref.value.hi);
    const double rel = err / (softdot_ref::unit_roundoff<T>() * ref.abs_sum);
    if (rel > worst) {
      worst = rel;
      where = "n=" + std::to_string(n);
    }
    // The same data at another alignment gives the same bits.
    Guarded<T> x2(std::span<const T>(xv), (n * 3) % 16);
    Guarded<T> y2(std::span<const T>(yv), 0);
    EXPECT_EQ(bits(softdot::dot(x2.cspan(), y2.cspan())), bits(got))
        << type_name<T>() << " n=" << n << ": result depends on alignment";
  }
  std::printf("[ dot      ] %s %s max |err| / (u sum|x_i y_i|) = %.3f at %s\n",
              type_name<T>(), target.c_str(), worst, where.c_str());
}

TEST_P(DotTest, WithinGammaNBoundOfExact) {
  CheckDotSweep<float>(target());
  CheckDotSweep<double>(target());
}

// dot() in the order dot-inl.h states, written out in scalar code: element
// i is added by FMA (on FMA targets; else a product, then a sum) into lane
// i % L of accumulator (i / L) % 8 (L = 64 bytes of T), in increasing i,
// from +0; then the 8 L lanes (lane j of
// accumulator b is leaf b L + j) in the pairwise tree of reduce.h: leaf
// j + half into leaf j, for half = 4 L, 2 L, ..., 1.
template <class T>
T DotInStatedOrder(std::span<const T> x, std::span<const T> y, bool fma) {
  constexpr std::size_t kLanes = 64 / sizeof(T);
  std::vector<T> leaf(8 * kLanes, T(0));
  for (std::size_t i = 0; i < x.size(); ++i) {
    T& acc = leaf[((i / kLanes) % 8) * kLanes + i % kLanes];
    acc = fma ? std::fma(x[i], y[i], acc) : acc + x[i] * y[i];
  }
  for (std::size_t half = leaf.size() / 2; half >= 1; half /= 2) {
    for (std::size_t j = 0; j < half; ++j) leaf[j] = leaf[j] + leaf[j + half];
  }
  return leaf[0];
}

// Every n up to 300 (the short dots of 1, 2, 4 and 8 blocks, the unrolled
// loop and its tails) and a few large ones, at every alignment of x and
// y: the same bits as the stated order. The data hold zeros of both signs
// (-0 products), and some rows +-inf or NaN.
template <class T>
void CheckStatedOrder(bool fma) {
  std::vector<std::size_t> sizes;
  for (std::size_t n = 0; n <= 300; ++n) sizes.push_back(n);
  for (std::size_t n : {1000, 4097, 8191}) sizes.push_back(n);
  std::uint64_t seed = 100;
  for (std::size_t n : sizes) {
    auto xv = make_uniform<T>(n, -1.0, 1.0, seed++);
    auto yv = make_uniform<T>(n, -2.0, 3.0, seed++);
    for (std::size_t i = 0; i < n; i += 7) xv[i] = (i % 2) ? T(0) : -T(0);
    const std::size_t special = n == 0 ? 0 : (n * 5 / 7) % n;
    if (n % 5 == 1) xv[special] = std::numeric_limits<T>::infinity();
    if (n % 5 == 2) yv[special] = std::numeric_limits<T>::quiet_NaN();
    if (n % 5 == 3) {  // +inf and -inf products: NaN
      xv[special] = std::numeric_limits<T>::infinity();
      xv[n - 1 - special] = -std::numeric_limits<T>::infinity();
    }
    const T want = DotInStatedOrder<T>(xv, yv, fma);
    for (std::size_t offset = 0; offset < 16; ++offset) {
      Guarded<T> x(std::span<const T>(xv), offset);
      Guarded<T> y(std::span<const T>(yv), (offset * 5 + n) % 16);
      const T got = softdot::dot(x.cspan(), y.cspan());
      if (std::isnan(want)) {
        ASSERT_TRUE(std::isnan(got)) << type_name<T>() << " n=" << n;
      } else {
        ASSERT_EQ(bits(got), bits(want))
            << type_name<T>() << " n=" << n << " offset " << offset << " got "
            << fmt(got) << " want " << fmt(want);
      }
    }
  }
}

TEST_P(DotTest, SameBitsAsStatedOrder) {
  CheckStatedOrder<float>(is_fma_target(target()));
  CheckStatedOrder<double>(is_fma_target(target()));
}

template <class T>
void CheckSmall() {
  EXPECT_EQ(softdot::dot(std::span<const T>(), std::span<const T>()), T(0));
  const T one[] = {T(3)}, two[] = {T(-2)};
  EXPECT_EQ(softdot::dot(std::span<const T>(one), std::span<const T>(two)),
            T(-6));
  // Exact integer data: exact result whatever the order.
  std::vector<T> a(1000), b(1000);
  for (std::size_t i = 0; i < a.size(); ++i) {
    a[i] = T(int(i % 17) - 8);
    b[i] = T(int(i % 5) - 2);
  }
  long exact = 0;
  for (std::size_t i = 0; i < a.size(); ++i) exact += long(a[i]) * long(b[i]);
  EXPECT_EQ(softdot::dot(std::span<const T>(a), std::span<const T>(b)),
            T(exact));
  // IEEE special values: NaN in, NaN out; inf * 0 is NaN.
  a[10] = kNaN<T>;
  EXPECT_TRUE(
      std::isnan(softdot::dot(std::span<const T>(a), std::span<const T>(b))));
  a[10] = kInf<T>;
  b[10] = T(0);
  EXPECT_TRUE(
      std::isnan(softdot::dot(std::span<const T>(a), std::span<const T>(b))));
  b[10] = T(1);
  EXPECT_EQ(softdot::dot(std::span<const T>(a), std::span<const T>(b)),
            kInf<T>);
}

TEST_P(DotTest, SmallAndSpecialCases) {
  CheckSmall<float>();
  CheckSmall<double>();
}

template <class T>
void CheckMismatch() {
  std::vector<T> a(17), b(23);
  try {
    softdot::dot(std::span<const T>(a), std::span<const T>(b));
    ADD_FAILURE() << "size mismatch not rejected";
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("17"), std::string::npos) << msg;
    EXPECT_NE(msg.find("23"), std::string::npos) << msg;
  }
  EXPECT_THROW(softdot::dot(std::span<const T>(a), std::span<const T>()),
               std::invalid_argument);
}

TEST_P(DotTest, SizeMismatchNamesBothSizes) {
  CheckMismatch<float>();
  CheckMismatch<double>();
}

template <class T>
void CheckDots(std::size_t rows, std::size_t cols, std::size_t stride,
               std::uint64_t seed) {
  const auto q = make_uniform<T>(cols, -1.0, 1.0, seed);
  const auto k = make_uniform<T>(rows ? (rows - 1) * stride + cols : 0, -1.0,
                                 1.0, seed + 1);
  Guarded<T> scores(rows, 3);
  softdot::dots(std::span<const T>(q),
                MatrixView<const T>(k.data(), rows, cols, stride),
                scores.span());
  ASSERT_TRUE(scores.guards_intact());
  for (std::size_t r = 0; r < rows; ++r) {
    const T want = softdot::dot(std::span<const T>(q),
                                std::span<const T>(&k[r * stride], cols));
    ASSERT_EQ(bits(scores[r]), bits(want))
        << type_name<T>() << " rows=" << rows << " cols=" << cols
        << " stride=" << stride << " row " << r;
  }
}

TEST_P(DotTest, DotsEqualsDotPerRow) {
  std::uint64_t seed = 10;
  // 1..8: dot() takes the scalar small_dot there, dots() the kernel.
  for (std::size_t cols : {1, 2, 3, 4, 5, 6, 7, 8, 16, 17, 64, 100, 129, 300}) {
    for (std::size_t extra : {0, 1, 5, 64}) {
      CheckDots<float>(13, cols, cols + extra, seed++);
      CheckDots<double>(13, cols, cols + extra, seed++);
    }
  }
  CheckDots<float>(1, 10, 0, seed++);  // one row: any stride
  CheckDots<double>(0, 10, 10, seed++);
}

template <class T>
void CheckDotsThreads() {
  // 512 x 520 >= 2^18 elements: split across threads.
  const std::size_t rows = 520, cols = 512, stride = 515;
  const auto q = make_uniform<T>(cols, -1.0, 1.0, 1);
  const auto k = make_uniform<T>(rows * stride, -1.0, 1.0, 2);
  std::vector<T> s1(rows), s2(rows);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  softdot::dots(std::span<const T>(q),
                MatrixView<const T>(k.data(), rows, cols, stride),
                std::span<T>(s1));
  omp_set_num_threads(2);
  softdot::dots(std::span<const T>(q),
                MatrixView<const T>(k.data(), rows, cols, stride),
                std::span<T>(s2));
  omp_set_num_threads(saved);
  EXPECT_TRUE(SameBits(s1, s2)) << type_name<T>();
  for (std::size_t r = 0; r < rows; r += 37) {
    EXPECT_EQ(bits(s1[r]),
              bits(softdot::dot(std::span<const T>(q),
                                std::span<const T>(&k[r * stride], cols))));
  }
}

TEST_P(DotTest, DotsSameBitsForOneAndTwoThreads) {
  CheckDotsThreads<float>();
  CheckDotsThreads<double>();
}

template <class T>
void CheckDotsErrors() {
  std::vector<T> q(8), k(64), s(8);
  auto call = [&](std::size_t qn, MatrixView<const T> m, std::size_t sn) {
    softdot::dots(std::span<const T>(q.data(), qn), m,
                  std::span<T>(s.data(), sn));
  };
  // cols != query size
  EXPECT_THROW(call(7, MatrixView<const T>(k.data(), 8, 8), 8),
               std::invalid_argument);
  // scores size != rows
  EXPECT_THROW(call(8, MatrixView<const T>(k.data(), 8, 8), 7),
               std::invalid_argument);
  // stride < cols with rows > 1
  EXPECT_THROW(call(8, MatrixView<const T>(k.data(), 4, 8, 7), 4),
               std::invalid_argument);
  // null data for a non-empty matrix
  EXPECT_THROW(call(8, MatrixView<const T>(nullptr, 2, 8), 2),
               std::invalid_argument);
  // Valid shapes do not throw.
  EXPECT_NO_THROW(call(8, MatrixView<const T>(k.data(), 8, 8), 8));
  EXPECT_NO_THROW(call(8, MatrixView<const T>(k.data(), 7, 8, 9), 7));
}

TEST_P(DotTest, DotsRejectsBadShapes) {
  CheckDotsErrors<float>();
  CheckDotsErrors<double>();
}

SOFTDOT_INSTANTIATE_PER_TARGET(DotTest);

}  // namespace
}  // namespace softdot_test
