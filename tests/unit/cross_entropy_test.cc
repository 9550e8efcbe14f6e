// softdot::cross_entropy: accuracy against a long double reference, the
// reductions and ignore_index, label smoothing, special values, the
// gradient by finite differences, and the errors.
#include "softdot/cross_entropy.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "softdot/simd.h"
#include "test_util.h"

namespace {

using softdot::CrossEntropyOptions;
using softdot::MatrixView;
using softdot::Reduction;
using softdot_test::bits;
using softdot_test::kInf;
using softdot_test::kNaN;
using L = long double;

// Long double reference of one row: lse = m + log(sum exp(x - m)), the loss
// as (m - x_t) + log S (no cancellation against lse), the weights.
template <class T>
struct RowRef {
  L loss = 0;
  std::vector<L> p;
};

template <class T>
RowRef<T> row_reference(const std::vector<T>& x, std::int64_t t, double eps) {
  L m = -std::numeric_limits<L>::infinity();
  for (T v : x) m = std::max<L>(m, v);
  L s = 0, c = 0, sx = 0, cx = 0;  // Kahan sums
  for (T v : x) {
    const L e = std::exp(static_cast<L>(v) - m) - c;
    const L ns = s + e;
    c = (ns - s) - e;
    s = ns;
    const L ex = static_cast<L>(v) - cx;
    const L nx = sx + ex;
    cx = (nx - sx) - ex;
    sx = nx;
  }
  RowRef<T> r;
  const L log_s = std::log1p(s - 1);
  const L nll = (m - static_cast<L>(x[t])) + log_s;
  const L smooth = (m - sx / static_cast<L>(x.size())) + log_s;
  r.loss = (1 - static_cast<L>(eps)) * nll + static_cast<L>(eps) * smooth;
  for (T v : x) r.p.push_back(std::exp(static_cast<L>(v) - m) / s);
  return r;
}

template <class T>
L ulp_at(L v) {
  const T a = static_cast<T>(std::fabs(v));
  return static_cast<L>(std::nextafter(a, kInf<T>) - a);
}

template <class T>
std::vector<T> random_row(std::size_t n, double spread, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(-spread / 2, spread / 2);
  std::vector<T> x(n);
  for (auto& v : x) v = static_cast<T>(u(rng));
  return x;
}

// Rows of random logits, strided, with random targets (some ignored); the
// loss within 1 ulp + d loss + V 2^-63 max|x| and the gradient within c (ulp(p)
// + ulp(g)) of the reference, for every SIMD target, reduction and eps.
template <class T>
void check_accuracy(std::size_t rows, std::size_t vocab, double spread,
                    double offset, double eps, Reduction reduction,
                    std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const std::size_t stride = vocab + 3;
  std::vector<T> logits(rows * stride, T(7));
  std::vector<std::int64_t> targets(rows);
  std::vector<std::vector<T>> row_x(rows);
  for (std::size_t i = 0; i < rows; ++i) {
    row_x[i] = random_row<T>(vocab, spread, rng);
    for (auto& v : row_x[i]) v = static_cast<T>(v + offset);
    std::copy(row_x[i].begin(), row_x[i].end(), logits.begin() + i * stride);
    targets[i] = static_cast<std::int64_t>(rng() % vocab);
  }
  if (rows > 2) targets[1] = -100;  // ignored
  const std::vector<T> logits_before = logits;
  std::size_t counted = 0;
  for (auto t : targets) counted += t != -100;
  const L c = reduction == Reduction::kMean ? 1.0L / counted : 1.0L;

  for (const std::string& target : softdot::simd_targets()) {
    softdot::force_simd_target(target);
    std::vector<T> loss(rows), grad(rows * (vocab + 1), T(-1));
    CrossEntropyOptions options;
    options.label_smoothing = eps;
    options.reduction = reduction;
    const double total = softdot::cross_entropy(
        MatrixView<const T>(logits.data(), rows, vocab, stride), targets, loss,
        MatrixView<T>(grad.data(), rows, vocab, vocab + 1), options);
    ASSERT_EQ(logits, logits_before) << "logits modified";
    L sum = 0, tol_sum = 0;
    for (std::size_t i = 0; i < rows; ++i) {
      SCOPED_TRACE(target + " row " + std::to_string(i) + " " +
                   softdot_test::type_name<T>() + " V=" +
                   std::to_string(vocab) + " eps=" + std::to_string(eps));
      const T* g = grad.data() + i * (vocab + 1);
      if (targets[i] == -100) {
        EXPECT_EQ(loss[i], T(0));
        for (std::size_t j = 0; j < vocab; ++j) ASSERT_EQ(g[j], T(0));
        continue;
      }
      const RowRef<T> ref = row_reference(row_x[i], targets[i], eps);
      sum += ref.loss;
      L max_abs = 0;
      for (T v : row_x[i]) max_abs = std::max<L>(max_abs, std::fabs(L(v)));
      const L sum_x_err = eps > 0 ? vocab * 0x1p-63L * max_abs : 0.0L;
      // The state's sum: d (S - 1) with d = 2^-32 (float), 2^-50 (double).
      const L d = sizeof(T) == 4 ? 0x1p-32L : 0x1p-50L;
      tol_sum += d * ref.loss + sum_x_err;
      const L loss_err = std::fabs(static_cast<L>(loss[i]) - ref.loss);
      EXPECT_LE(loss_err, ulp_at<T>(ref.loss) + d * ref.loss + sum_x_err)
          << "loss " << loss[i] << " ref " << static_cast<double>(ref.loss);
      for (std::size_t j = 0; j < vocab; ++j) {
        const L onehot = j == static_cast<std::size_t>(targets[i]) ? 1 : 0;
        const L exact = c * (ref.p[j] - (1 - static_cast<L>(eps)) * onehot -
                             static_cast<L>(eps) / vocab);
        const L err = std::fabs(static_cast<L>(g[j]) - exact);
        ASSERT_LE(err, c * ulp_at<T>(ref.p[j]) + ulp_at<T>(exact))
            << "grad[" << j << "] " << g[j] << " ref "
            << static_cast<double>(exact);
      }
      ASSERT_EQ(g[vocab], T(-1)) << "wrote past the row";
    }
    const L want = reduction == Reduction::kMean ? sum / counted : sum;
    EXPECT_LE(std::fabs(static_cast<L>(total) - want),
              (reduction == Reduction::kMean ? tol_sum / counted : tol_sum) +
                  std::fabs(want) * 0x1p-52L)
        << target;
  }
  softdot::force_simd_target("");
}

TEST(CrossEntropy, AccuracyFloat) {
  std::uint64_t seed = 1;
  for (std::size_t vocab : {1, 2, 7, 64, 1000, 4099}) {
    for (double eps : {0.0, 0.1, 1.0}) {
      check_accuracy<float>(5, vocab, 20.0, 0.0, eps, Reduction::kMean, seed++);
      check_accuracy<float>(3, vocab, 60.0, 1000.0, eps, Reduction::kSum,
                            seed++);
    }
  }
}

TEST(CrossEntropy, AccuracyDouble) {
  std::uint64_t seed = 100;
  for (std::size_t vocab : {1, 3, 64, 1000, 4099}) {
    for (double eps : {0.0, 0.25}) {
      check_accuracy<double>(5, vocab, 20.0, 0.0, eps, Reduction::kMean,
                             seed++);
      check_accuracy<double>(3, vocab, 60.0, -500.0, eps, Reduction::kNone,
                             seed++);
    }
  }
}

// A target that is the row's clear argmax: the loss is tiny (log S with S
// close to 1) and must keep its relative accuracy.
TEST(CrossEntropy, SmallLossKeepsRelativeAccuracy) {
  std::vector<float> x = {30.0f, 0.0f, -1.0f, 2.0f};
  std::vector<std::int64_t> t = {0};
  std::vector<float> loss(1);
  softdot::cross_entropy(MatrixView<const float>(x.data(), 1, 4), t, loss);
  const L exact =
      std::log1p(std::exp(-30.0L) + std::exp(-31.0L) + std::exp(-28.0L));
  EXPECT_LE(std::fabs(loss[0] - exact), ulp_at<float>(exact)) << loss[0];
  EXPECT_GT(loss[0], 0.0f);
}

// The gradient of the returned value by central differences (double).
TEST(CrossEntropy, GradientMatchesFiniteDifferences) {
  std::mt19937_64 rng(7);
  const std::size_t rows = 4, vocab = 9;
  std::vector<double> x(rows * vocab);
  for (auto& v : x) v = std::uniform_real_distribution<double>(-3, 3)(rng);
  const std::vector<std::int64_t> targets = {2, -100, 8, 0};
  for (Reduction red : {Reduction::kMean, Reduction::kSum, Reduction::kNone}) {
    for (double eps : {0.0, 0.3}) {
      CrossEntropyOptions o;
      o.reduction = red;
      o.label_smoothing = eps;
      std::vector<double> grad(rows * vocab);
      softdot::cross_entropy(MatrixView<const double>(x.data(), rows, vocab),
                             targets, {},
                             MatrixView<double>(grad.data(), rows, vocab), o);
      const double h = 1e-5;
      for (std::size_t k = 0; k < x.size(); ++k) {
        std::vector<double> xp = x, xm = x;
        xp[k] += h;
        xm[k] -= h;
        const double fp = softdot::cross_entropy(
            MatrixView<const double>(xp.data(), rows, vocab), targets, {}, {},
            o);
        const double fm = softdot::cross_entropy(
            MatrixView<const double>(xm.data(), rows, vocab), targets, {}, {},
            o);
        EXPECT_NEAR(grad[k], (fp - fm) / (2 * h), 1e-8)
            << "element " << k << " eps " << eps;
      }
    }
  }
}

TEST(CrossEntropy, ReductionsAndIgnoreIndex) {
  std::vector<float> x = {1, 2, 3, 0, 0, 0, -1, 5, 2};
  const MatrixView<const float> lv(x.data(), 3, 3);
  std::vector<std::int64_t> t = {2, 7, 1};  // row 1 ignored (ignore_index 7)
  CrossEntropyOptions o;
  o.ignore_index = 7;
  o.reduction = Reduction::kNone;
  std::vector<float> loss(3, -1.0f);
  const double sum = softdot::cross_entropy(lv, t, loss, {}, o);
  EXPECT_EQ(loss[1], 0.0f);
  const L l0 = std::log(std::exp(-2.0L) + std::exp(-1.0L) + 1.0L);
  const L l2 = std::log(std::exp(-6.0L) + 1.0L + std::exp(-3.0L));
  EXPECT_LE(std::fabs(loss[0] - l0), ulp_at<float>(l0));
  EXPECT_LE(std::fabs(loss[2] - l2), ulp_at<float>(l2));
  EXPECT_NEAR(sum, static_cast<double>(l0 + l2), 0x1p-32 * sum);
  o.reduction = Reduction::kMean;
  std::vector<float> g(9);
  const double mean =
      softdot::cross_entropy(lv, t, {}, MatrixView<float>(g.data(), 3, 3), o);
  EXPECT_NEAR(mean, static_cast<double>((l0 + l2) / 2), 0x1p-32 * mean);
  // grad / 2 of the sum's gradient, row 1 zero.
  EXPECT_EQ(g[3], 0.0f);
  EXPECT_NEAR(g[2], static_cast<double>((1 / std::exp(l0) - 1) / 2), 1e-7);
  // Every row ignored: NaN mean (as torch), zero gradient.
  std::vector<std::int64_t> all_ignored = {7, 7, 7};
  std::fill(g.begin(), g.end(), 1.0f);
  EXPECT_TRUE(std::isnan(softdot::cross_entropy(
      lv, all_ignored, {}, MatrixView<float>(g.data(), 3, 3), o)));
  for (float v : g) EXPECT_EQ(bits(v), bits(0.0f));
  o.reduction = Reduction::kSum;
  EXPECT_EQ(softdot::cross_entropy(lv, all_ignored, {}, {}, o), 0.0);
}

template <class T>
void check_special_values() {
  const T inf = kInf<T>;
  // Rows: target -inf; all -inf; two +inf with the target one of them; +inf
  // elsewhere; NaN.
  std::vector<T> x = {0,   -inf, 1, -inf, -inf, -inf,    inf, 0,
                      inf, inf,  1, 2,    0,    kNaN<T>, 3};
  const std::size_t V = 3;
  std::vector<std::int64_t> t = {1, 0, 0, 1, 2};
  for (double eps : {0.0, 0.2, 1.0}) {
    SCOPED_TRACE("eps " + std::to_string(eps));
    CrossEntropyOptions o;
    o.label_smoothing = eps;
    o.reduction = Reduction::kSum;
    std::vector<T> loss(5), g(15);
    softdot::cross_entropy(MatrixView<const T>(x.data(), 5, V), t, loss,
                           MatrixView<T>(g.data(), 5, V), o);
    const T off = static_cast<T>(eps / V);
    const double ulp1 = std::numeric_limits<T>::epsilon();
    // Row 0: target -inf -> inf (eps < 1); eps = 1: the mean is -inf -> inf.
    EXPECT_EQ(loss[0], inf);
    EXPECT_NEAR(g[1], static_cast<T>(0 - (1 - eps) - eps / V), 2 * ulp1);
    EXPECT_TRUE(std::isfinite(g[0]) && std::isfinite(g[2]));
    // Row 1: every logit -inf: loss +inf, grad -(1-eps) onehot - eps/V.
    EXPECT_EQ(loss[1], inf);
    EXPECT_NEAR(g[3], static_cast<T>(-(1 - eps) - eps / V), 2 * ulp1);
    EXPECT_EQ(g[4], -off);
    // Row 2: {inf, 0, inf}, target 0: nll log 2, smooth inf.
    if (eps == 0.0) {
      EXPECT_EQ(loss[2], static_cast<T>(std::log(2.0L)));
    } else {
      EXPECT_EQ(loss[2], inf);
    }
    EXPECT_NEAR(g[6], static_cast<T>(0.5L - (1 - eps) - eps / V), 2 * ulp1);
    EXPECT_EQ(g[7], -off);
    // Row 3: {inf, 1, 2}, target 1 (probability 0): loss inf.
    EXPECT_EQ(loss[3], inf);
    EXPECT_NEAR(g[9], static_cast<T>(1 - eps / V), 2 * ulp1);
    // Row 4: NaN anywhere -> NaN loss and NaN grad row.
    EXPECT_TRUE(std::isnan(loss[4]));
    for (std::size_t j = 12; j < 15; ++j) EXPECT_TRUE(std::isnan(g[j]));
  }
  // All +inf: weight 1/V each; loss log V with any eps.
  std::vector<T> all_inf = {inf, inf, inf, inf};
  std::vector<std::int64_t> t0 = {3};
  std::vector<T> loss(1);
  CrossEntropyOptions o;
  o.label_smoothing = 0.5;
  softdot::cross_entropy(MatrixView<const T>(all_inf.data(), 1, 4), t0, loss,
                         {}, o);
  EXPECT_EQ(loss[0], static_cast<T>(std::log(4.0L)));
}

TEST(CrossEntropy, SpecialValuesFloat) { check_special_values<float>(); }
TEST(CrossEntropy, SpecialValuesDouble) { check_special_values<double>(); }

// The gradient's special values, row by row, in one call with ordinary rows:
// -inf logits get exactly c (0 - eps / V) (0 without smoothing); a fully
// masked row and +inf rows finite gradients; a NaN row NaN in that row only,
// an ignored NaN row zeros; every other row the bits of a call of its own.
template <class T>
void check_gradient_special_rows() {
  const T inf = kInf<T>, nan = kNaN<T>;
  const std::size_t V = 5;
  // Rows: ordinary; two -inf; all -inf; two +inf; NaN; NaN but ignored;
  // ordinary.
  const std::vector<T> x = {T(0.5), -1,     2,    T(0.25), 3,     //
                            1,      -inf,   0,    -inf,    2,     //
                            -inf,   -inf,   -inf, -inf,    -inf,  //
                            inf,    0,      inf,  7,       -inf,  //
                            1,      nan,    2,    3,       4,     //
                            nan,    1,      2,    3,       4,     //
                            -2,     T(1.5), 0,    1,       T(0.75)};
  const std::size_t rows = x.size() / V;
  const std::vector<std::int64_t> t = {3, 0, 2, 2, 1, -100, 4};
  for (Reduction red : {Reduction::kMean, Reduction::kSum, Reduction::kNone}) {
    for (double eps : {0.0, 0.1}) {
      SCOPED_TRACE("eps " + std::to_string(eps) + " reduction " +
                   std::to_string(static_cast<int>(red)));
      CrossEntropyOptions o;
      o.label_smoothing = eps;
      o.reduction = red;
      std::vector<T> g(x.size());
      softdot::cross_entropy(MatrixView<const T>(x.data(), rows, V), t, {},
                             MatrixView<T>(g.data(), rows, V), o);
      const double c = red == Reduction::kMean ? 1.0 / 6 : 1.0;
      const double ulp1 = std::numeric_limits<T>::epsilon();
      for (std::size_t i = 0; i < rows; ++i) {
        for (std::size_t j = 0; j < V; ++j) {
          const T v = g[i * V + j];
          if (i == 4) {
            EXPECT_TRUE(std::isnan(v)) << i << "," << j;
          } else if (i == 5) {
            EXPECT_EQ(bits(v), bits(T{0})) << i << "," << j;
          } else {
            EXPECT_TRUE(std::isfinite(v)) << i << "," << j << " " << v;
          }
        }
      }
      // -inf logits, not the target: weight 0.
      for (std::size_t k : {6u, 8u, 19u}) {
        if (eps == 0.0) {
          EXPECT_EQ(g[k], T{0}) << k;
        } else {
          EXPECT_NEAR(g[k], -c * eps / V, ulp1 * c) << k;
        }
      }
      // Fully masked row, target 2: -c ((1 - eps) onehot + eps / V).
      EXPECT_NEAR(g[12], -c * ((1 - eps) + eps / V), 2 * ulp1 * c);
      EXPECT_NEAR(g[10], -c * eps / V, ulp1 * c);
      // +inf row, target 2 (one of the two +inf): 1/2 - (1 - eps) - eps / V.
      EXPECT_NEAR(g[17], c * (0.5 - (1 - eps) - eps / V), 2 * ulp1 * c);
      EXPECT_NEAR(g[15], c * (0.5 - eps / V), 2 * ulp1 * c);
      EXPECT_NEAR(g[16], -c * eps / V, ulp1 * c);
      // Ordinary rows: the bits of a call on that row alone with the same c
      // (a mean over 6 rows: the one-row call gets c through kSum and the
      // comparison is then within an ulp, so compare kSum and kNone only).
      if (red != Reduction::kMean) {
        for (std::size_t i : {0u, 6u}) {
          std::vector<T> gi(V);
          const std::vector<std::int64_t> ti = {t[i]};
          softdot::cross_entropy(MatrixView<const T>(x.data() + i * V, 1, V),
                                 ti, {}, MatrixView<T>(gi.data(), 1, V), o);
          for (std::size_t j = 0; j < V; ++j) {
            EXPECT_EQ(bits(g[i * V + j]), bits(gi[j])) << i << "," << j;
          }
        }
      }
    }
  }
}

TEST(CrossEntropy, GradientSpecialRowsFloat) {
  check_gradient_special_rows<float>();
}
TEST(CrossEntropy, GradientSpecialRowsDouble) {
  check_gradient_special_rows<double>();
}

// Large enough for the OpenMP split: each row equals the one-row call.
TEST(CrossEntropy, ThreadedRowsEqualSingleRows) {
  const std::size_t rows = 70, vocab = 4000;
  std::mt19937_64 rng(3);
  std::vector<float> x(rows * vocab);
  for (auto& v : x) v = std::uniform_real_distribution<float>(-8, 8)(rng);
  std::vector<std::int64_t> t(rows);
  for (auto& v : t) v = static_cast<std::int64_t>(rng() % vocab);
  CrossEntropyOptions o;
  o.label_smoothing = 0.1;
  o.reduction = Reduction::kSum;
  std::vector<float> loss(rows), g(rows * vocab);
  softdot::cross_entropy(MatrixView<const float>(x.data(), rows, vocab), t,
                         loss, MatrixView<float>(g.data(), rows, vocab), o);
  for (std::size_t i = 0; i < rows; i += 13) {
    std::vector<float> l1(1), g1(vocab);
    softdot::cross_entropy(
        MatrixView<const float>(x.data() + i * vocab, 1, vocab),
        std::span<const std::int64_t>(&t[i], 1), l1,
        MatrixView<float>(g1.data(), 1, vocab), o);
    EXPECT_EQ(bits(l1[0]), bits(loss[i]));
    for (std::size_t j = 0; j < vocab; ++j) {
      ASSERT_EQ(bits(g1[j]), bits(g[i * vocab + j])) << i << " " << j;
    }
  }
}

TEST(CrossEntropy, Errors) {
  std::vector<float> x(6, 1.0f);
  const MatrixView<const float> lv(x.data(), 2, 3);
  std::vector<float> loss(2, 9.0f), g(6, 9.0f);
  const MatrixView<float> gv(g.data(), 2, 3);
  const auto expect_error = [&](std::vector<std::int64_t> t,
                                const CrossEntropyOptions& o,
                                const std::string& needle,
                                MatrixView<float> grad, std::span<float> l) {
    try {
      softdot::cross_entropy(lv, t, l, grad, o);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const std::invalid_argument& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("cross_entropy"), std::string::npos) << what;
      EXPECT_NE(what.find(needle), std::string::npos) << what;
    }
    for (float v : loss) EXPECT_EQ(v, 9.0f) << "loss written on error";
    for (float v : g) EXPECT_EQ(v, 9.0f) << "grad written on error";
  };
  CrossEntropyOptions o;
  expect_error({0, 3}, o, "targets[1] = 3", gv, loss);
  expect_error({-1, 0}, o, "targets[0] = -1", gv, loss);
  expect_error({0}, o, "targets 1", gv, loss);
  expect_error({0, 1}, o, "grad is 2 x 2", MatrixView<float>(g.data(), 2, 2),
               loss);
  expect_error({0, 1}, o, "loss has 1", gv, std::span<float>(loss.data(), 1));
  o.label_smoothing = 1.5;
  expect_error({0, 1}, o, "label_smoothing", gv, loss);
  o.label_smoothing = kNaN<double>;
  expect_error({0, 1}, o, "label_smoothing", gv, loss);
  o = {};
  o.ignore_index = 3;
  softdot::cross_entropy(lv, std::vector<std::int64_t>{3, 2}, {}, {}, o);
  // Aliasing: grad over the logits.
  try {
    softdot::cross_entropy(lv, std::vector<std::int64_t>{0, 1}, {},
                           MatrixView<float>(x.data(), 2, 3));
    ADD_FAILURE() << "grad == logits accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("overlaps"), std::string::npos);
  }
  try {
    softdot::cross_entropy(MatrixView<const float>(x.data(), 2, 0),
                           std::vector<std::int64_t>{0, 1}, {});
    ADD_FAILURE() << "empty vocabulary accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("2 x 0"), std::string::npos);
  }
}

}  // namespace
