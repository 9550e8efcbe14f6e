// Argument checks of the softmax family: every bad argument is a
// std::invalid_argument with a message.
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "test_util.h"

namespace softdot_test {
namespace {

using softdot::MatrixView;
using softdot::SoftmaxOptions;

// Runs f, which must throw std::invalid_argument with a non-empty message.
template <class F>
::testing::AssertionResult Rejects(F f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    if (std::string(e.what()).empty()) {
      return ::testing::AssertionFailure() << "empty message";
    }
    return ::testing::AssertionSuccess();
  } catch (...) {
    return ::testing::AssertionFailure() << "threw something else";
  }
  return ::testing::AssertionFailure() << "did not throw";
}

// Every entry point of the softmax family called with options o on a valid
// row of n elements.
template <class T>
void ExpectAllReject(const SoftmaxOptions& o, const std::string& what,
                     std::size_t n = 8) {
  std::vector<T> x(n, T(1)), y(n);
  const std::span<const T> xs(x);
  const std::span<T> ysp(y);
  EXPECT_TRUE(Rejects([&] { softdot::softmax(xs, ysp, o); })) << what;
  EXPECT_TRUE(Rejects([&] { softdot::log_softmax(xs, ysp, o); })) << what;
  EXPECT_TRUE(Rejects([&] { softdot::logsumexp(xs, o); })) << what;
  EXPECT_TRUE(Rejects([&] { softdot::softmax_state(xs, o); })) << what;
  const auto total = softdot::softmax_state(xs);
  EXPECT_TRUE(Rejects([&] { softdot::softmax_apply(xs, total, ysp, o); }))
      << what;
  EXPECT_TRUE(Rejects([&] {
    softdot::softmax_rows(MatrixView<const T>(x.data(), 2, n / 2),
                          MatrixView<T>(y.data(), 2, n / 2), o);
  })) << what;
  EXPECT_TRUE(Rejects([&] {
    softdot::log_softmax_rows(MatrixView<const T>(x.data(), 2, n / 2),
                              MatrixView<T>(y.data(), 2, n / 2), o);
  })) << what;
}

template <class T>
void CheckTemperatures() {
  const double inf = std::numeric_limits<double>::infinity();
  for (double t :
       {0.0, -0.0, -1.0, -inf, inf, std::numeric_limits<double>::quiet_NaN()}) {
    ExpectAllReject<T>({t, {}},
                       std::string(type_name<T>()) + " temperature " + fmt(t));
  }
  // 1 / temperature must be a finite, non-zero T.
  if (sizeof(T) == 4) {
    ExpectAllReject<T>({1e-39, {}}, "float 1/temperature overflows");
    ExpectAllReject<T>({1e300, {}}, "float 1/temperature underflows to 0");
  } else {
    ExpectAllReject<T>({1e-320, {}}, "double 1/temperature overflows");
  }
  // Valid ones do not throw.
  std::vector<T> x(4, T(1)), y(4);
  for (double t : {1e-3, 0.5, 1.0, 7.0, 1e6}) {
    EXPECT_NO_THROW(
        softdot::softmax(std::span<const T>(x), std::span<T>(y), {t, {}}))
        << t;
    EXPECT_EQ(y[0], T(0.25));
  }
}

TEST(Errors, TemperatureMustBeFiniteAndPositive) {
  CheckTemperatures<float>();
  CheckTemperatures<double>();
}

template <class T>
void CheckMaskSizes() {
  for (std::size_t m : {1, 7, 9, 16}) {  // row has 8; rows*cols is also 8
    Mask mask(m);
    ExpectAllReject<T>({1.0, mask.span()}, std::string(type_name<T>()) +
                                               " mask of " + std::to_string(m) +
                                               " for 8");
  }
  // softmax_rows: cols or rows * cols flags are fine, anything else is not.
  std::vector<T> x(12, T(0)), y(12);
  const MatrixView<const T> xm(x.data(), 3, 4);
  const MatrixView<T> ym(y.data(), 3, 4);
  Mask cols(4), all(12), bad(6);
  EXPECT_NO_THROW(softdot::softmax_rows(xm, ym, {1.0, cols.span()}));
  EXPECT_NO_THROW(softdot::softmax_rows(xm, ym, {1.0, all.span()}));
  EXPECT_TRUE(Rejects([&] {
    softdot::softmax_rows(xm, ym, {1.0, bad.span()});
  }));
  EXPECT_TRUE(Rejects([&] {
    softdot::log_softmax_rows(xm, ym, {1.0, bad.span()});
  }));
}

TEST(Errors, MaskOfTheWrongSize) {
  CheckMaskSizes<float>();
  CheckMaskSizes<double>();
}

template <class T>
void CheckShapes() {
  std::vector<T> x(8, T(1)), y(9);
  const std::span<const T> xs(x);
  EXPECT_TRUE(Rejects([&] { softdot::softmax(xs, std::span<T>(y)); }));
  EXPECT_TRUE(Rejects([&] { softdot::softmax(xs, std::span<T>(y).first(7)); }));
  EXPECT_TRUE(Rejects([&] { softdot::log_softmax(xs, std::span<T>(y)); }));
  // Empty rows.
  EXPECT_TRUE(Rejects(
      [&] { softdot::softmax(xs.first(0), std::span<T>(y).first(0)); }));
  EXPECT_TRUE(Rejects([&] { softdot::logsumexp(xs.first(0)); }));
  // Matrices: stride < cols, shape mismatch, empty rows, null data.
  std::vector<T> a(64, T(1)), b(64);
  auto rows = [&](MatrixView<const T> xm, MatrixView<T> ym) {
    return Rejects([&] { softdot::softmax_rows(xm, ym); }) &&
           Rejects([&] { softdot::log_softmax_rows(xm, ym); });
  };
  EXPECT_TRUE(rows({a.data(), 4, 8, 7}, {b.data(), 4, 8, 8})) << "x stride";
  EXPECT_TRUE(rows({a.data(), 4, 8, 8}, {b.data(), 4, 8, 6})) << "y stride";
  EXPECT_TRUE(rows({a.data(), 4, 8}, {b.data(), 3, 8})) << "rows differ";
  EXPECT_TRUE(rows({a.data(), 4, 8}, {b.data(), 4, 7, 8})) << "cols differ";
  EXPECT_TRUE(rows({a.data(), 4, 0}, {b.data(), 4, 0})) << "cols = 0";
  EXPECT_TRUE(rows({nullptr, 4, 8}, {b.data(), 4, 8})) << "null x";
  EXPECT_TRUE(rows({a.data(), 4, 8}, {nullptr, 4, 8})) << "null y";
  // The header: "x and y must have the same rows and cols (>= 1 each)".
  EXPECT_TRUE(rows({a.data(), 0, 8}, {b.data(), 0, 8})) << "rows = 0";
  // Valid: strides that differ, both >= cols.
  EXPECT_NO_THROW(softdot::softmax_rows(MatrixView<const T>(a.data(), 4, 8, 12),
                                        MatrixView<T>(b.data(), 4, 8, 9)));
}

TEST(Errors, BadShapes) {
  CheckShapes<float>();
  CheckShapes<double>();
}

}  // namespace
}  // namespace softdot_test
