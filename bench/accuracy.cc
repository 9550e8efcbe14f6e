// softdot_accuracy: the ulp table of docs/accuracy.md. For each distribution
// of logits and each size, the error of softdot's softmax (both precisions),
// log_softmax and logsumexp (float and double) against the MPFR reference
// (256 bits, rounded once), next to a naive float softmax (float expf, float
// sum, divide), and the largest |sum(y) - 1| with the sum taken exactly.
//
//   build/bench/softdot_accuracy [--max-n N]      (default N = 1048576)
//
// log_softmax: the contract is 1 ulp where |result| >= 1 and an absolute
// 2^-23 (float) / 2^-52 (double) below; "ulp" is the ulp error over the
// first range, "score" the error over its allowance on every entry (<= 1
// meets the contract).
#include <mpfr.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "reference.h"
#include "softdot/softdot.h"

namespace {

struct Dist {
  const char* name;
  double sigma;
  double offset;
  bool uniform100;
  bool half_masked;
  bool wide;  // weights spanning the subnormal range
};

const Dist kDists[] = {
    {"N(0,0.1)", 0.1, 0, false, false, false},
    {"N(0,1)", 1, 0, false, false, false},
    {"N(0,10)", 10, 0, false, false, false},
    {"N(0,40)", 40, 0, false, false, false},
    {"N(0,3)+1000", 3, 1000, false, false, false},
    {"N(0,3)-1000", 3, -1000, false, false, false},
    {"N(0,3)+1e4", 3, 1e4, false, false, false},
    {"N(0,3)-1e4", 3, -1e4, false, false, false},
    {"U[-100,100]", 0, 0, true, false, false},
    {"N(0,1), 50% masked", 1, 0, false, true, false},
    {"subnormal weights", 0, 0, false, false, true},
};

template <class T>
std::vector<T> make(const Dist& d, std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> g(0.0, 1.0);
  // Wide: weights from 1 down past the smallest subnormal (e^-104 < 2^-149,
  // e^-745 < 2^-1074).
  const double spread = sizeof(T) == 4 ? 115.0 : 760.0;
  std::uniform_real_distribution<double> u(-100.0, 100.0), w(-spread, 0.0);
  std::vector<T> x(n);
  for (auto& v : x) {
    if (d.uniform100) {
      v = T(u(rng));
    } else if (d.wide) {
      v = T(w(rng));
    } else {
      v = T(d.offset + d.sigma * g(rng));
    }
  }
  return x;
}

// The textbook float formula: m = max, e = expf(x - m), y = e / sum(e).
void naive_softmax(const std::vector<float>& x, std::vector<float>& y) {
  float m = -INFINITY;
  for (float v : x) m = std::max(m, v);
  float s = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    y[i] = std::exp(x[i] - m);
    s += y[i];
  }
  for (float& v : y) v /= s;
}

// |sum(y) - 1| with the sum exact (MPFR, enough bits for any float/double).
template <class T>
double sum_error(const std::vector<T>& y) {
  mpfr_t s, t;
  mpfr_init2(s, 2200);
  mpfr_init2(t, 64);
  mpfr_set_zero(s, 1);
  for (T v : y) {
    mpfr_set_d(t, static_cast<double>(v), MPFR_RNDN);
    mpfr_add(s, s, t, MPFR_RNDN);
  }
  mpfr_sub_ui(s, s, 1, MPFR_RNDN);
  const double e = std::fabs(mpfr_get_d(s, MPFR_RNDN));
  mpfr_clear(s);
  mpfr_clear(t);
  return e;
}

struct Row {
  softdot_ref::UlpStats sm, fast, lsm, lsm_allow, lse, naive;
  double sum_err = 0, fast_sum_err = 0, naive_sum_err = 0;
};

template <class T>
void measure(const Dist& d, std::size_t n, std::uint64_t seed, Row& row) {
  const auto x = make<T>(d, n, seed);
  std::unique_ptr<bool[]> keep;
  softdot::SoftmaxOptions opt;
  softdot_ref::RefOptions ropt;
  if (d.half_masked) {
    keep.reset(new bool[n]);
    for (std::size_t i = 0; i < n; ++i) keep[i] = (i * 7919 + seed) % 2 == 0;
    keep[0] = true;
    opt.mask = ropt.mask = std::span<const bool>(keep.get(), n);
  }
  const auto ref = softdot_ref::softmax_reference(std::span<const T>(x), ropt);
  std::vector<T> y(n), f(n), l(n);
  softdot::softmax(std::span<const T>(x), std::span<T>(y), opt);
  softdot::SoftmaxOptions fast = opt;
  fast.precision = softdot::Precision::kFast;
  softdot::softmax(std::span<const T>(x), std::span<T>(f), fast);
  softdot::log_softmax(std::span<const T>(x), std::span<T>(l), opt);
  const T lse = softdot::logsumexp(std::span<const T>(x), opt);
  const double allow = sizeof(T) == 4 ? 0x1p-23 : 0x1p-52;
  for (std::size_t i = 0; i < n; ++i) {
    const bool tiny = ref.softmax[i].below_subnormal;
    row.sm.add(softdot_ref::ulp_error(y[i], ref.softmax[i]), i, tiny);
    row.fast.add(softdot_ref::ulp_error(f[i], ref.softmax[i]), i, tiny);
    const auto& lr = ref.log_softmax[i];
    if (!std::isfinite(lr.hi)) continue;
    if (std::fabs(lr.hi) >= 1) {
      const double e = softdot_ref::ulp_error(l[i], lr);
      row.lsm.add(e, i);
      row.lsm_allow.add(e, i);
    } else {
      row.lsm_allow.add(softdot_ref::abs_error(l[i], lr) / allow, i);
    }
  }
  row.lse.add(softdot_ref::ulp_error(lse, ref.logsumexp));
  row.sum_err = std::max(row.sum_err, sum_error(y));
  row.fast_sum_err = std::max(row.fast_sum_err, sum_error(f));
  if constexpr (sizeof(T) == 4) {
    if (!d.half_masked) {
      std::vector<float> z(n);
      naive_softmax(x, z);
      for (std::size_t i = 0; i < n; ++i) {
        row.naive.add(softdot_ref::ulp_error(z[i], ref.softmax[i]), i,
                      ref.softmax[i].below_subnormal);
      }
      row.naive_sum_err = std::max(row.naive_sum_err, sum_error(z));
    }
  }
}

template <class T>
void table(std::size_t max_n) {
  std::printf("\n%s, SIMD target %s; ulp max / mean; |sum-1| max\n",
              sizeof(T) == 4 ? "float" : "double",
              softdot::simd_target().c_str());
  std::printf("%-18s %7s | %-24s | %-24s | %-17s | %5s |%s\n", "logits", "n",
              "softmax (faithful) |s-1|", "softmax (fast)  |s-1|",
              "log_softmax score", "lse",
              sizeof(T) == 4 ? " naive float softmax, |sum-1|" : "");
  const std::size_t sizes[] = {1, 3, 10, 100, 1000, 4096, 32768, 1u << 20};
  for (const Dist& d : kDists) {
    for (std::size_t n : sizes) {
      if (n > max_n) break;
      Row row;
      const int reps = n <= 10 ? 200 : n <= 1000 ? 20 : n <= 4096 ? 4 : 1;
      for (int r = 0; r < reps; ++r) measure<T>(d, n, 1000 * n + r, row);
      std::printf(
          "%-18s %7zu | %4.2f / %5.3f %8.1e | %4.2f / %5.3f %8.1e | "
          "%4.2f (%4.2f ulp) | %5.2f |",
          d.name, n, row.sm.max, row.sm.mean(), row.sum_err, row.fast.max,
          row.fast.mean(), row.fast_sum_err, row.lsm_allow.max,
          row.lsm.count ? row.lsm.max : 0.0, row.lse.max);
      if (sizeof(T) == 4 && row.naive.count > 0) {
        std::printf(" %6.2f / %5.3f %8.1e", row.naive.max, row.naive.mean(),
                    row.naive_sum_err);
      }
      std::printf("\n");
      std::fflush(stdout);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t max_n = std::size_t{1} << 20;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--max-n") == 0)
      max_n = std::strtoull(argv[i + 1], nullptr, 10);
  }
  std::printf(
      "softdot %s accuracy against MPFR (256 bits, rounded once); ulp of the "
      "exact value\n",
      softdot::version());
  table<float>(max_n);
  table<double>(max_n);
  return 0;
}
