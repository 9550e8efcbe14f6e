// The worked examples of the seed text ("Softmax and dot products"), which
// must come out exactly, on every SIMD target.
#include <cmath>
#include <vector>

#include "test_util.h"

namespace softdot_test {
namespace {

class SeedTest : public PerTarget {};

template <class T>
void CheckSeedDot() {
  // q = [1, 2, 0], k = [2, 1, 3]: q . k = 1*2 + 2*1 + 0*3 = 4.
  const std::vector<T> q = {1, 2, 0};
  const std::vector<T> k = {2, 1, 3};
  EXPECT_EQ(softdot::dot(std::span<const T>(q), std::span<const T>(k)), T(4));
  EXPECT_EQ(softdot::dot(std::span<const T>(k), std::span<const T>(q)), T(4));
}

TEST_P(SeedTest, DotOfQueryAndKeyIsFour) {
  CheckSeedDot<float>();
  CheckSeedDot<double>();
}

// Rounds each weight to `decimals` places and returns them as integers, so
// that the comparison is exact: 0.659 -> 659.
template <class T>
std::vector<long> rounded_weights(const std::vector<T>& x, int decimals) {
  std::vector<T> y(x.size());
  softdot::softmax(std::span<const T>(x), std::span<T>(y));
  std::vector<long> r;
  const double scale = std::pow(10.0, decimals);
  for (T v : y) r.push_back(std::lround(double(v) * scale));
  return r;
}

TEST_P(SeedTest, SoftmaxOfTwoOneZeroPointOne) {
  // [2.0, 1.0, 0.1] -> [0.659 0.242 0.099]
  const std::vector<long> want = {659, 242, 99};
  EXPECT_EQ(rounded_weights<double>({2.0, 1.0, 0.1}, 3), want);
  EXPECT_EQ(rounded_weights<float>({2.0f, 1.0f, 0.1f}, 3), want);
}

TEST_P(SeedTest, SoftmaxOfLargeScoresDoesNotOverflow) {
  // [1002, 1000, 997] -> [0.8756 0.1185 0.0059]; exp(1002) overflows double,
  // so this only works with the max subtracted.
  const std::vector<long> want = {8756, 1185, 59};
  EXPECT_EQ(rounded_weights<double>({1002.0, 1000.0, 997.0}, 4), want);
  EXPECT_EQ(rounded_weights<float>({1002.0f, 1000.0f, 997.0f}, 4), want);
}

template <class T>
void CheckSeedMatchesReference(const std::vector<T>& x) {
  std::vector<T> y(x.size());
  softdot::softmax(std::span<const T>(x), std::span<T>(y));
  const auto ref = softdot_ref::softmax_reference(std::span<const T>(x));
  for (std::size_t i = 0; i < x.size(); ++i) {
    EXPECT_LE(softdot_ref::ulp_error(y[i], ref.softmax[i]), 4.0)
        << type_name<T>() << " i=" << i << " got " << fmt(y[i]) << " want "
        << fmt(ref.softmax[i].hi);
  }
}

TEST_P(SeedTest, SeedExamplesMatchTheExactReference) {
  CheckSeedMatchesReference<double>({2.0, 1.0, 0.1});
  CheckSeedMatchesReference<float>({2.0f, 1.0f, 0.1f});
  CheckSeedMatchesReference<double>({1002.0, 1000.0, 997.0});
  CheckSeedMatchesReference<float>({1002.0f, 1000.0f, 997.0f});
}

// "If all scores are equal, what are the weights for n entries? Each weight
// is 1/n" -- the correctly rounded 1/n, exactly.
template <class T>
void CheckAllEqual(std::size_t n, T value) {
  Guarded<T> x(n, n % 16);
  for (auto& v : x.span()) v = value;
  Guarded<T> y(n, (n + 5) % 16);
  softdot::softmax(x.cspan(), y.span());
  const T want = T(1) / T(n);  // IEEE division: correctly rounded
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_EQ(bits(y[i]), bits(want))
        << type_name<T>() << " n=" << n << " value=" << value << " i=" << i
        << " got " << fmt(y[i]) << " want " << fmt(want);
  }
  EXPECT_TRUE(y.guards_intact());
}

TEST_P(SeedTest, AllEqualScoresGiveCorrectlyRoundedOneOverN) {
  std::vector<std::size_t> sizes;
  for (std::size_t n = 1; n <= 300; ++n) sizes.push_back(n);
  for (std::size_t n : {511, 1000, 4097, 65536, 100000}) sizes.push_back(n);
  for (std::size_t n : sizes) {
    for (double v : {0.0, 5.0, -3.25, 1000.0, -87.5}) {
      CheckAllEqual<float>(n, float(v));
      CheckAllEqual<double>(n, v);
      if (HasFatalFailure()) return;
    }
  }
}

// "Why does softmax of [5, 5] equal softmax of [0, 0]?" -- same bits.
template <class T>
void CheckFiveFive() {
  const std::vector<T> a = {5, 5}, b = {0, 0};
  std::vector<T> ya(2), yb(2);
  softdot::softmax(std::span<const T>(a), std::span<T>(ya));
  softdot::softmax(std::span<const T>(b), std::span<T>(yb));
  EXPECT_TRUE(SameBits(ya, yb));
  EXPECT_EQ(ya[0], T(0.5));
  EXPECT_EQ(ya[1], T(0.5));
}

TEST_P(SeedTest, FiveFiveEqualsZeroZero) {
  CheckFiveFive<float>();
  CheckFiveFive<double>();
}

// softmax(x + c) == softmax(x) bit for bit when x + c is exact: x are
// multiples of 1/8 in [-10, 10] and c an integer, so every sum is exact.
template <class T>
void CheckShiftInvariance(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> eighths(-80, 80);
  std::uniform_int_distribution<int> shift(-1000, 1000);
  std::vector<T> x(n);
  for (auto& v : x) v = T(eighths(rng)) / T(8);
  const T c = T(shift(rng));
  std::vector<T> xc(n);
  for (std::size_t i = 0; i < n; ++i) {
    xc[i] = x[i] + c;
    ASSERT_EQ(double(xc[i]) - double(c), double(x[i]));  // exact
  }
  std::vector<T> y(n), yc(n), ly(n), lyc(n);
  softdot::softmax(std::span<const T>(x), std::span<T>(y));
  softdot::softmax(std::span<const T>(xc), std::span<T>(yc));
  EXPECT_TRUE(SameBits(y, yc)) << type_name<T>() << " n=" << n << " c=" << c;
  // Also with a mask (the masked entries are ignored either way).
  Mask mask(n);
  for (std::size_t i = 0; i < n; i += 3) mask[i] = (n == 1);
  softdot::softmax(std::span<const T>(x), std::span<T>(y), {1.0, mask.span()});
  softdot::softmax(std::span<const T>(xc), std::span<T>(yc),
                   {1.0, mask.span()});
  EXPECT_TRUE(SameBits(y, yc)) << type_name<T>() << " masked n=" << n;
}

TEST_P(SeedTest, ShiftInvarianceIsBitwise) {
  std::uint64_t seed = 1;
  for (std::size_t n :
       {1, 2, 3, 7, 8, 9, 16, 17, 31, 64, 100, 129, 300, 1000}) {
    CheckShiftInvariance<float>(n, seed++);
    CheckShiftInvariance<double>(n, seed++);
  }
}

SOFTDOT_INSTANTIATE_PER_TARGET(SeedTest);

}  // namespace
}  // namespace softdot_test
