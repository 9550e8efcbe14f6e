// Fuzz target: the 16-bit rows (softdot/softmax.h "16-bit rows",
// softdot/cross_entropy.h, softdot/sample.h): softmax, log_softmax,
// logsumexp, softmax_rows, log_softmax_rows, softmax_backward and
// cross_entropy on bfloat16 and float16, Precision::kFaithful and kFast,
// temperature and mask; and sample on float32, bfloat16 and float16 logits.
// The fuzzer picks sizes (sometimes 0 or mismatched), strides, values
// (finite, +-inf, NaN) and options.
// Properties (docs/accuracy.md's special values): every call returns or
// throws std::invalid_argument; a call that throws wrote nothing; a call
// that returns repeats bit for bit; softmax weights lie in [0, 1], a masked
// or -inf score's weight is +0 and its log-weight -inf, a row with an
// unmasked NaN is all NaN, a fully masked row is all +0 (log: -inf,
// logsumexp -inf); otherwise a row's weights sum to 1 within n 16-bit
// ulps of their size (a weight within 1 ulp, kFast too) plus n times the
// smallest subnormal; with temperature 1 and finite scores each weight is
// within 1 16-bit ulp of softmax computed here in long double; softmax_rows
// gives each row softmax()'s bits; cross_entropy's losses are >= 0 (or NaN
// or +inf), an ignored row's loss and gradient are 0; sample's tokens lie
// in [0, V), are allowed by the bitmask and have a logit that is not -inf,
// and a logprob is <= 0.
#include <fuzzer/FuzzedDataProvider.h>
#include <softdot/softdot.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <span>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "fuzz_util.h"

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

float widen(float x) { return x; }
float widen(softdot::Float16 x) { return softdot::to_float(x); }
float widen(softdot::BFloat16 x) { return softdot::to_float(x); }

template <class T>
T narrow(float x) {
  if constexpr (std::is_same_v<T, softdot::Float16>) {
    return softdot::to_float16(x);
  } else {
    return softdot::to_bfloat16(x);
  }
}

// Significand bits (with the implicit one) and the smallest subnormal.
template <class T>
constexpr int kPrecision = std::is_same_v<T, softdot::Float16> ? 11 : 8;
template <class T>
constexpr double kTiny =
    std::is_same_v<T, softdot::Float16> ? 0x1p-24 : 0x1p-133;

template <class T>
T pick16(FuzzedDataProvider& f) {
  switch (f.ConsumeIntegralInRange<int>(0, 31)) {
    case 0:
      return narrow<T>(std::numeric_limits<float>::quiet_NaN());
    case 1:
      return narrow<T>(kInf);
    case 2:
      return narrow<T>(-kInf);
    case 3: {
      // Any bit pattern.
      T x;
      const auto bits = f.ConsumeIntegral<std::uint16_t>();
      std::memcpy(&x, &bits, sizeof(x));
      return x;
    }
    case 4:
      return narrow<T>(f.ConsumeFloatingPointInRange<float>(-60000.f, 60000.f));
    default:
      return narrow<T>(f.ConsumeFloatingPointInRange<float>(-12.0f, 12.0f));
  }
}

// Calls fn; returns false when it threw std::invalid_argument (then `out`
// must keep its bits), else runs it again and checks the bits repeat.
template <class V, class Fn>
bool twice(Fn fn, V& out) {
  const V before = out;
  try {
    fn();
  } catch (const std::invalid_argument&) {
    FUZZ_CHECK(softdot_fuzz::same_bits(out, before));
    return false;
  }
  const V first = out;
  fn();
  FUZZ_CHECK(softdot_fuzz::same_bits(out, first));
  return true;
}

// Checks one softmax (log: log_softmax) row y of scores x against the
// special-value table and the accuracy bound. s is the scale (1 /
// temperature rounded to float).
template <class T>
void check_row(const T* x, const T* y, std::size_t n, const bool* mask,
               bool log, float s) {
  bool any_nan = false, any_kept = false, overflow = false;
  std::size_t n_pos_inf = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (mask != nullptr && !mask[i]) continue;
    const float v = widen(x[i]);
    if (std::isnan(v)) any_nan = true;
    const double p = static_cast<double>(v) * s;
    if (p == static_cast<double>(kInf)) ++n_pos_inf;
    if (p != -static_cast<double>(kInf)) any_kept = true;
    // A scaled score beyond float's range counts as +-inf (softmax.h).
    if (std::isfinite(p) &&
        std::fabs(p) >=
            static_cast<double>(std::numeric_limits<float>::max())) {
      overflow = true;
    }
  }
  if (any_nan) {
    for (std::size_t i = 0; i < n; ++i) FUZZ_CHECK(std::isnan(widen(y[i])));
    return;
  }
  for (std::size_t i = 0; i < n; ++i) {
    const float w = widen(y[i]);
    const bool hidden =
        (mask != nullptr && !mask[i]) ||
        static_cast<double>(widen(x[i])) * s == -static_cast<double>(kInf);
    if (log) {
      FUZZ_CHECK(!std::isnan(w) && w <= 0.0f);
      if (hidden) FUZZ_CHECK(w == -kInf);
    } else {
      FUZZ_CHECK(w >= 0.0f && w <= 1.0f);
      if (hidden) FUZZ_CHECK(w == 0.0f && !std::signbit(w));
    }
  }
  if (!any_kept) {
    // Every score masked or -inf: weights +0, log-weights -inf (checked
    // above as hidden entries).
    return;
  }
  if (log || overflow) return;
  // The weights sum to 1: each is within 1 ulp (2^(1-p) relative, or the
  // smallest subnormal) of the exact weight.
  double sum = 0.0;
  for (std::size_t i = 0; i < n; ++i) sum += widen(y[i]);
  const double ulp = std::ldexp(1.0, 1 - kPrecision<T>);
  const double tol = ulp * (1.0 + 1e-9) + static_cast<double>(n) * kTiny<T>;
  if (std::fabs(sum - 1.0) > tol && std::getenv("FUZZ_VERBOSE") != nullptr) {
    std::fprintf(stderr, "n %zu s %g sum %.17g tol %g\n", n,
                 static_cast<double>(s), sum, tol);
    for (std::size_t i = 0; i < n; ++i) {
      std::fprintf(stderr, "x %.9g mask %d y %.9g\n",
                   static_cast<double>(widen(x[i])),
                   mask == nullptr ? 1 : static_cast<int>(mask[i]),
                   static_cast<double>(widen(y[i])));
    }
  }
  FUZZ_CHECK(std::fabs(sum - 1.0) <= tol);
  if (n_pos_inf > 0 || s != 1.0f) return;
  // Finite scores, temperature 1: each weight within 1 ulp of the exact one.
  long double m = -INFINITY;
  for (std::size_t i = 0; i < n; ++i) {
    if (mask != nullptr && !mask[i]) continue;
    m = std::fmax(m, static_cast<long double>(widen(x[i])));
  }
  long double total = 0.0L;
  for (std::size_t i = 0; i < n; ++i) {
    if (mask != nullptr && !mask[i]) continue;
    total += std::exp(static_cast<long double>(widen(x[i])) - m);
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (mask != nullptr && !mask[i]) continue;
    const long double exact =
        std::exp(static_cast<long double>(widen(x[i])) - m) / total;
    const long double err =
        std::fabs(static_cast<long double>(widen(y[i])) - exact);
    // One ulp of the exact weight (the binade of its value), at least the
    // subnormal spacing.
    int e = 0;
    std::frexp(static_cast<double>(exact), &e);
    const long double one_ulp = std::fmax(std::ldexp(1.0L, e - kPrecision<T>),
                                          static_cast<long double>(kTiny<T>));
    FUZZ_CHECK(err <= one_ulp * (1.0L + 1e-6L));
  }
}

template <class T>
void run_softmax(FuzzedDataProvider& f) {
  const std::size_t n = f.ConsumeIntegralInRange<int>(0, 15) == 0
                            ? f.ConsumeIntegralInRange<std::size_t>(0, 3)
                            : f.ConsumeIntegralInRange<std::size_t>(1, 300);
  std::vector<T> x(n);
  for (T& v : x) v = pick16<T>(f);
  softdot::SoftmaxOptions o;
  if (f.ConsumeIntegralInRange<int>(0, 3) == 0) {
    o.temperature = f.ConsumeIntegralInRange<int>(0, 3) == 0
                        ? f.ConsumeFloatingPoint<double>()
                        : f.ConsumeFloatingPointInRange<double>(0.05, 8.0);
  }
  o.precision = f.ConsumeBool() ? softdot::Precision::kFast
                                : softdot::Precision::kFaithful;
  std::unique_ptr<bool[]> mask;
  std::size_t mask_n = 0;
  if (f.ConsumeIntegralInRange<int>(0, 2) == 0) {
    mask_n = f.ConsumeIntegralInRange<int>(0, 15) == 0
                 ? f.ConsumeIntegralInRange<std::size_t>(0, 4)
                 : n;
    mask = std::make_unique<bool[]>(mask_n + 1);
    const bool none = f.ConsumeIntegralInRange<int>(0, 5) == 0;
    for (std::size_t i = 0; i < mask_n; ++i) {
      mask[i] = none ? false : f.ConsumeBool();
    }
    o.mask = std::span<const bool>(mask.get(), mask_n);
  }
  const std::size_t y_n = f.ConsumeIntegralInRange<int>(0, 15) == 0
                              ? f.ConsumeIntegralInRange<std::size_t>(0, 4)
                              : n;
  std::vector<T> y(y_n, narrow<T>(-7.25f));
  // s as the library takes it: 1 / temperature rounded to float.
  const float s = static_cast<float>(1.0 / o.temperature);
  const bool* m = o.mask.empty() ? nullptr : mask.get();
  switch (f.ConsumeIntegralInRange<int>(0, 4)) {
    case 0:
      if (twice([&] { softdot::softmax(x, y, o); }, y)) {
        check_row(x.data(), y.data(), n, m, false, s);
      }
      break;
    case 1:
      if (twice([&] { softdot::log_softmax(x, y, o); }, y)) {
        check_row(x.data(), y.data(), n, m, true, s);
      }
      break;
    case 2: {
      std::vector<T> r(1, narrow<T>(-7.25f));
      if (twice([&] { r[0] = softdot::logsumexp(x, o); }, r)) {
        const float l = widen(r[0]);
        bool nan = false, kept = false;
        for (std::size_t i = 0; i < n; ++i) {
          if (m != nullptr && !m[i]) continue;
          const float v = widen(x[i]);
          nan = nan || std::isnan(v);
          kept =
              kept || static_cast<double>(v) * s != -static_cast<double>(kInf);
        }
        if (nan) {
          FUZZ_CHECK(std::isnan(l));
        } else if (!kept) {
          FUZZ_CHECK(l == -kInf);
        } else {
          FUZZ_CHECK(!std::isnan(l));
        }
      }
      break;
    }
    case 3: {
      // In place: y is x.
      std::vector<T> z = x;
      if (twice(
              [&] {
                z = x;
                softdot::softmax(std::span<const T>(z), std::span<T>(z), o);
              },
              z)) {
        std::vector<T> ref(n);
        softdot::softmax(x, ref, o);
        FUZZ_CHECK(softdot_fuzz::same_bits(z, ref));
      }
      break;
    }
    default: {
      // softmax_backward on weights and a gradient.
      std::vector<T> dy(n);
      for (T& v : dy) v = pick16<T>(f);
      std::vector<T> w(n);
      try {
        softdot::softmax(x, w, o);
      } catch (const std::invalid_argument&) {
        for (T& v : w) v = pick16<T>(f);
      }
      if (twice([&] { softdot::softmax_backward(w, dy, y); }, y)) {
        // A NaN in w or dy makes the row NaN, and so does an infinite w
        // (not a softmax output) times dy = 0 in <dy, w> (IEEE's 0 inf, the
        // rule of softmax_backward_special_row); a zero weight gets exactly
        // 0 otherwise.
        bool nan = false;
        for (std::size_t i = 0; i < n; ++i) {
          const float wi = widen(w[i]), di = widen(dy[i]);
          nan = nan || std::isnan(wi) || std::isnan(di) ||
                (std::isinf(wi) && di == 0.0f);
        }
        if (std::getenv("FUZZ_VERBOSE") != nullptr) {
          for (std::size_t i = 0; i < n; ++i) {
            std::fprintf(stderr, "i %zu w %a dy %a dx %a\n", i,
                         static_cast<double>(widen(w[i])),
                         static_cast<double>(widen(dy[i])),
                         static_cast<double>(widen(y[i])));
          }
        }
        for (std::size_t i = 0; i < n; ++i) {
          if (nan) {
            FUZZ_CHECK(std::isnan(widen(y[i])));
          } else if (widen(w[i]) == 0.0f) {
            FUZZ_CHECK(widen(y[i]) == 0.0f);
          }
        }
      }
      break;
    }
  }
}

template <class T>
void run_rows(FuzzedDataProvider& f) {
  const std::size_t rows = f.ConsumeIntegralInRange<std::size_t>(0, 6);
  const std::size_t cols = f.ConsumeIntegralInRange<std::size_t>(0, 70);
  const std::size_t pad = f.ConsumeIntegralInRange<std::size_t>(0, 3);
  const std::size_t stride =
      f.ConsumeIntegralInRange<int>(0, 15) == 0
          ? f.ConsumeIntegralInRange<std::size_t>(0, cols + 3)
          : cols + pad;
  const std::size_t ystride = f.ConsumeBool() ? cols : stride;
  const std::size_t span = rows == 0 ? 1 : (rows - 1) * stride + cols + 1;
  const std::size_t yspan = rows == 0 ? 1 : (rows - 1) * ystride + cols + 1;
  std::vector<T> x(span);
  for (T& v : x) v = pick16<T>(f);
  softdot::SoftmaxOptions o;
  o.precision = f.ConsumeBool() ? softdot::Precision::kFast
                                : softdot::Precision::kFaithful;
  std::unique_ptr<bool[]> mask;
  if (f.ConsumeIntegralInRange<int>(0, 2) == 0) {
    const std::size_t mask_n = f.ConsumeBool() ? cols : rows * cols;
    mask = std::make_unique<bool[]>(mask_n + 1);
    for (std::size_t i = 0; i < mask_n; ++i) mask[i] = f.ConsumeBool();
    o.mask = std::span<const bool>(mask.get(), mask_n);
  }
  const bool log = f.ConsumeBool();
  std::vector<T> y(yspan, narrow<T>(-7.25f));
  const softdot::MatrixView<const T> xv(x.data(), rows, cols, stride);
  const softdot::MatrixView<T> yv(y.data(), rows, cols, ystride);
  const bool ok = twice(
      [&] {
        if (log) {
          softdot::log_softmax_rows(xv, yv, o);
        } else {
          softdot::softmax_rows(xv, yv, o);
        }
      },
      y);
  if (!ok) return;
  // Each row is softmax() (log_softmax()) of that row, bit for bit.
  for (std::size_t i = 0; i < rows; ++i) {
    softdot::SoftmaxOptions oi = o;
    if (o.mask.size() == rows * cols && rows > 1) {
      oi.mask = o.mask.subspan(i * cols, cols);
    }
    std::vector<T> one(cols);
    const std::span<const T> xi(x.data() + i * stride, cols);
    if (log) {
      softdot::log_softmax(xi, one, oi);
    } else {
      softdot::softmax(xi, one, oi);
    }
    FUZZ_CHECK(softdot_fuzz::same_bytes(one.data(), y.data() + i * ystride,
                                        cols * sizeof(T)));
  }
}

template <class T>
void run_cross_entropy(FuzzedDataProvider& f) {
  const std::size_t rows = f.ConsumeIntegralInRange<std::size_t>(0, 5);
  const std::size_t V = f.ConsumeIntegralInRange<std::size_t>(0, 60);
  const std::size_t stride = f.ConsumeIntegralInRange<int>(0, 15) == 0
                                 ? f.ConsumeIntegralInRange<std::size_t>(0, V)
                                 : V + f.ConsumeIntegralInRange<int>(0, 2);
  const std::size_t span = rows == 0 ? 1 : (rows - 1) * stride + V + 1;
  std::vector<T> x(span);
  for (T& v : x) v = pick16<T>(f);
  softdot::CrossEntropyOptions o;
  o.ignore_index = f.ConsumeIntegralInRange<std::int64_t>(-101, 3);
  if (f.ConsumeBool()) {
    o.label_smoothing = f.ConsumeIntegralInRange<int>(0, 7) == 0
                            ? f.ConsumeFloatingPoint<double>()
                            : f.ConsumeProbability<double>();
  }
  o.reduction =
      static_cast<softdot::Reduction>(f.ConsumeIntegralInRange<int>(0, 2));
  std::vector<std::int64_t> targets(
      f.ConsumeIntegralInRange<int>(0, 15) == 0
          ? f.ConsumeIntegralInRange<std::size_t>(0, 6)
          : rows);
  for (auto& t : targets) {
    t = f.ConsumeIntegralInRange<int>(0, 7) == 0
            ? f.ConsumeIntegral<std::int64_t>()
            : f.ConsumeIntegralInRange<std::int64_t>(
                  -1, static_cast<std::int64_t>(V));
    if (f.ConsumeIntegralInRange<int>(0, 5) == 0) t = o.ignore_index;
  }
  std::vector<T> loss(f.ConsumeBool() ? rows : 0, narrow<T>(-7.25f));
  const bool want_grad = f.ConsumeBool();
  std::vector<T> grad(want_grad ? rows * V + 1 : 0, narrow<T>(-7.25f));
  const softdot::MatrixView<const T> xv(x.data(), rows, V, stride);
  const softdot::MatrixView<T> gv =
      want_grad ? softdot::MatrixView<T>(grad.data(), rows, V)
                : softdot::MatrixView<T>();
  std::vector<double> result(1, -7.25);
  const bool ok = twice(
      [&] { result[0] = softdot::cross_entropy(xv, targets, loss, gv, o); },
      result);
  if (!ok) {
    FUZZ_CHECK(std::all_of(loss.begin(), loss.end(),
                           [](T v) { return widen(v) == -7.25f; }));
    FUZZ_CHECK(std::all_of(grad.begin(), grad.end(),
                           [](T v) { return widen(v) == -7.25f; }));
    return;
  }
  // The losses and the gradient repeat too.
  const std::vector<T> loss1 = loss, grad1 = grad;
  softdot::cross_entropy(xv, targets, loss, gv, o);
  FUZZ_CHECK(softdot_fuzz::same_bits(loss, loss1) &&
             softdot_fuzz::same_bits(grad, grad1));
  for (std::size_t i = 0; i < loss.size(); ++i) {
    const float l = widen(loss[i]);
    FUZZ_CHECK(std::isnan(l) || l >= 0.0f);
    if (targets[i] == o.ignore_index) FUZZ_CHECK(l == 0.0f);
  }
  if (want_grad) {
    for (std::size_t i = 0; i < rows; ++i) {
      if (targets[i] != o.ignore_index) continue;
      for (std::size_t j = 0; j < V; ++j) {
        FUZZ_CHECK(widen(grad[i * V + j]) == 0.0f);
      }
    }
  }
}

template <class T>
void run_sample(FuzzedDataProvider& f) {
  const std::size_t rows = f.ConsumeIntegralInRange<std::size_t>(0, 4);
  const std::size_t V = f.ConsumeIntegralInRange<std::size_t>(0, 80);
  const std::size_t stride = f.ConsumeIntegralInRange<int>(0, 7) == 0
                                 ? f.ConsumeIntegralInRange<std::size_t>(0, V)
                                 : V + f.ConsumeIntegralInRange<int>(0, 2);
  const std::size_t span = rows == 0 ? 1 : (rows - 1) * stride + V + 1;
  std::vector<T> x(span);
  for (T& v : x) {
    if constexpr (std::is_same_v<T, float>) {
      v = widen(pick16<softdot::BFloat16>(f));
    } else {
      v = pick16<T>(f);
    }
  }
  softdot::SampleOptions o;
  if (f.ConsumeBool()) {
    o.temperature = f.ConsumeIntegralInRange<int>(0, 7) == 0
                        ? f.ConsumeFloatingPoint<double>()
                        : f.ConsumeFloatingPointInRange<double>(0.0, 3.0);
  }
  if (f.ConsumeBool()) o.top_k = f.ConsumeIntegralInRange<std::int64_t>(-1, 90);
  if (f.ConsumeBool()) {
    o.top_p = f.ConsumeIntegralInRange<int>(0, 7) == 0
                  ? f.ConsumeFloatingPoint<double>()
                  : f.ConsumeProbability<double>();
  }
  if (f.ConsumeBool()) {
    o.min_p = f.ConsumeIntegralInRange<int>(0, 7) == 0
                  ? f.ConsumeFloatingPoint<double>()
                  : f.ConsumeProbability<double>();
  }
  const std::size_t words = (V + 31) / 32;
  std::vector<std::int32_t> bitmask;
  if (f.ConsumeBool()) {
    bitmask.resize(f.ConsumeIntegralInRange<int>(0, 7) == 0
                       ? f.ConsumeIntegralInRange<std::size_t>(0, 9)
                       : (f.ConsumeBool() ? words : rows * words));
    for (auto& w : bitmask) {
      w = f.ConsumeBool() ? -1 : f.ConsumeIntegral<std::int32_t>();
    }
  }
  std::vector<std::uint64_t> seeds(
      f.ConsumeIntegralInRange<int>(0, 15) == 0
          ? f.ConsumeIntegralInRange<std::size_t>(0, 6)
          : rows);
  for (auto& s : seeds) s = f.ConsumeIntegral<std::uint64_t>();
  std::vector<std::int64_t> tokens(rows, -7);
  std::vector<float> logprobs(f.ConsumeBool() ? rows : 0, -7.25f);
  const softdot::MatrixView<const T> xv(x.data(), rows, V, stride);
  const bool ok =
      twice([&] { softdot::sample(xv, seeds, tokens, logprobs, o, bitmask); },
            tokens);
  if (!ok) {
    FUZZ_CHECK(std::all_of(logprobs.begin(), logprobs.end(),
                           [](float v) { return v == -7.25f; }));
    return;
  }
  const std::vector<float> lp1 = logprobs;
  softdot::sample(xv, seeds, tokens, logprobs, o, bitmask);
  FUZZ_CHECK(softdot_fuzz::same_bits(logprobs, lp1));
  for (std::size_t i = 0; i < rows; ++i) {
    const std::int64_t t = tokens[i];
    FUZZ_CHECK(t >= 0 && static_cast<std::size_t>(t) < V);
    float logit;
    if constexpr (std::is_same_v<T, float>) {
      logit = x[i * stride + static_cast<std::size_t>(t)];
    } else {
      logit = widen(x[i * stride + static_cast<std::size_t>(t)]);
    }
    FUZZ_CHECK(logit != -kInf && !std::isnan(logit));
    if (!bitmask.empty()) {
      const std::size_t row = bitmask.size() == words ? 0 : i;
      const auto word = static_cast<std::uint32_t>(
          bitmask[row * words + static_cast<std::size_t>(t) / 32]);
      FUZZ_CHECK(((word >> (static_cast<std::size_t>(t) % 32)) & 1u) != 0);
    }
    if (!logprobs.empty()) FUZZ_CHECK(!(logprobs[i] > 0.0f));
  }
}

// linear_cross_entropy on small shapes (float32 or bfloat16 hidden and
// weight). With bfloat16 and D = 1 the logits are exact float products, so
// the value and the losses equal cross_entropy()'s on those logits bit for
// bit.
template <class T>
void run_linear_ce(FuzzedDataProvider& f) {
  const std::size_t N = f.ConsumeIntegralInRange<std::size_t>(0, 5);
  const std::size_t D = f.ConsumeIntegralInRange<std::size_t>(0, 9);
  const std::size_t V = f.ConsumeIntegralInRange<std::size_t>(0, 40);
  auto stride_for = [&f](std::size_t cols) {
    return f.ConsumeIntegralInRange<int>(0, 15) == 0
               ? f.ConsumeIntegralInRange<std::size_t>(0, cols)
               : cols + f.ConsumeIntegralInRange<std::size_t>(0, 2);
  };
  const std::size_t hs = stride_for(D), ws = stride_for(D);
  auto pick = [&f] {
    if constexpr (std::is_same_v<T, float>) {
      return widen(pick16<softdot::BFloat16>(f)) *
             f.ConsumeFloatingPointInRange<float>(0.5f, 2.0f);
    } else {
      return pick16<T>(f);
    }
  };
  std::vector<T> h(N == 0 ? 1 : (N - 1) * hs + D + 1);
  std::vector<T> w(V == 0 ? 1 : (V - 1) * ws + D + 1);
  for (T& v : h) v = pick();
  for (T& v : w) v = pick();
  softdot::CrossEntropyOptions o;
  o.ignore_index = f.ConsumeIntegralInRange<std::int64_t>(-101, 3);
  if (f.ConsumeBool()) {
    o.label_smoothing = f.ConsumeIntegralInRange<int>(0, 7) == 0
                            ? f.ConsumeFloatingPoint<double>()
                            : f.ConsumeProbability<double>();
  }
  o.reduction =
      static_cast<softdot::Reduction>(f.ConsumeIntegralInRange<int>(0, 2));
  std::vector<std::int64_t> targets(
      f.ConsumeIntegralInRange<int>(0, 15) == 0
          ? f.ConsumeIntegralInRange<std::size_t>(0, 6)
          : N);
  for (auto& t : targets) {
    t = f.ConsumeIntegralInRange<std::int64_t>(-1,
                                               static_cast<std::int64_t>(V));
    if (f.ConsumeIntegralInRange<int>(0, 5) == 0) t = o.ignore_index;
  }
  std::vector<float> loss(f.ConsumeBool() ? N : 0, -7.25f);
  const bool want_gh = f.ConsumeBool(), want_gw = f.ConsumeBool();
  std::vector<float> gh(want_gh ? N * D + 1 : 0, -7.25f),
      gw(want_gw ? V * D + 1 : 0, -7.25f);
  const softdot::MatrixView<const T> hv(h.data(), N, D, hs);
  const softdot::MatrixView<const T> wv(w.data(), V, D, ws);
  const softdot::MatrixView<float> ghv =
      want_gh ? softdot::MatrixView<float>(gh.data(), N, D)
              : softdot::MatrixView<float>();
  const softdot::MatrixView<float> gwv =
      want_gw ? softdot::MatrixView<float>(gw.data(), V, D)
              : softdot::MatrixView<float>();
  std::vector<double> result(1, -7.25);
  const bool ok = twice(
      [&] {
        result[0] =
            softdot::linear_cross_entropy(hv, wv, targets, loss, ghv, gwv, o);
      },
      result);
  auto untouched = [](const std::vector<float>& v) {
    return std::all_of(v.begin(), v.end(), [](float x) { return x == -7.25f; });
  };
  if (!ok) {
    FUZZ_CHECK(untouched(loss) && untouched(gh) && untouched(gw));
    return;
  }
  const std::vector<float> loss1 = loss, gh1 = gh, gw1 = gw;
  softdot::linear_cross_entropy(hv, wv, targets, loss, ghv, gwv, o);
  FUZZ_CHECK(softdot_fuzz::same_bits(loss, loss1) &&
             softdot_fuzz::same_bits(gh, gh1) &&
             softdot_fuzz::same_bits(gw, gw1));
  for (std::size_t i = 0; i < loss.size(); ++i) {
    FUZZ_CHECK(std::isnan(loss[i]) || loss[i] >= 0.0f);
    if (targets[i] == o.ignore_index) FUZZ_CHECK(loss[i] == 0.0f);
  }
  // An ignored row's grad_hidden is 0 where the weight is finite (G's row
  // is 0; 0 x inf or NaN in G @ weight is NaN, as torch's matmul gives).
  const bool finite_w = std::all_of(
      w.begin(), w.end(), [](T x) { return std::isfinite(widen(x)); });
  if (want_gh && finite_w) {
    for (std::size_t i = 0; i < N; ++i) {
      if (targets[i] != o.ignore_index) continue;
      for (std::size_t c = 0; c < D; ++c) FUZZ_CHECK(gh[i * D + c] == 0.0f);
    }
  }
  if constexpr (std::is_same_v<T, softdot::BFloat16>) {
    if (D == 1) {
      std::vector<float> logits(N * V);
      for (std::size_t i = 0; i < N; ++i) {
        for (std::size_t j = 0; j < V; ++j) {
          logits[i * V + j] = widen(h[i * hs]) * widen(w[j * ws]);
        }
      }
      std::vector<float> ref_loss(loss.size());
      const double ref = softdot::cross_entropy(
          softdot::MatrixView<const float>(logits.data(), N, V), targets,
          ref_loss, {}, o);
      FUZZ_CHECK(softdot_fuzz::same_bits(std::vector<double>{ref}, result));
      FUZZ_CHECK(softdot_fuzz::same_bits(ref_loss, loss));
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data,
                                      std::size_t size) {
  FuzzedDataProvider f(data, size);
  const bool half = f.ConsumeBool();
  switch (f.ConsumeIntegralInRange<int>(0, 4)) {
    case 0:
    case 1:
      half ? run_softmax<softdot::Float16>(f)
           : run_softmax<softdot::BFloat16>(f);
      break;
    case 2:
      half ? run_rows<softdot::Float16>(f) : run_rows<softdot::BFloat16>(f);
      break;
    case 3:
      half ? run_cross_entropy<softdot::Float16>(f)
           : run_cross_entropy<softdot::BFloat16>(f);
      break;
    default:
      switch (f.ConsumeIntegralInRange<int>(0, 4)) {
        case 3:
          run_linear_ce<float>(f);
          break;
        case 4:
          run_linear_ce<softdot::BFloat16>(f);
          break;
        case 0:
          run_sample<float>(f);
          break;
        case 1:
          run_sample<softdot::Float16>(f);
          break;
        default:
          run_sample<softdot::BFloat16>(f);
          break;
      }
      break;
  }
  return 0;
}
