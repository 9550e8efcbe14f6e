// softdot_accuracy: the ulp table of docs/accuracy.md. For each distribution
// of logits and each size, the error of softdot's softmax, log_softmax and
// logsumexp (float and double) against the MPFR reference (256 bits, rounded
// once), next to a naive float softmax (float expf, float sum, divide), and
// the largest |sum(y) - 1| with the sum taken exactly.
//
//   build/bench/softdot_accuracy [--max-n N]      (default N = 1048576)
//
// log_softmax errors are reported in ulps; where |result| < 1 the contract is
// an absolute error of 2^-23 (float) / 2^-52 (double), so a second column
// gives error / max(ulp, that allowance).
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
    {"U[-100,0] wide", 0, 0, false, false, true},
};

template <class T>
std::vector<T> make(const Dist& d, std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> g(0.0, 1.0);
  std::uniform_real_distribution<double> u(-100.0, 100.0), w(-100.0, 0.0);
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
  softdot_ref::UlpStats sm, lsm, lsm_allow, lse, naive;
  double sum_err = 0, naive_sum_err = 0;
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
  std::vector<T> y(n), l(n);
  softdot::softmax(std::span<const T>(x), std::span<T>(y), opt);
  softdot::log_softmax(std::span<const T>(x), std::span<T>(l), opt);
  const T lse = softdot::logsumexp(std::span<const T>(x), opt);
  const double allow = std::ldexp(1.0, -std::numeric_limits<T>::digits + 1);
  for (std::size_t i = 0; i < n; ++i) {
    const bool tiny = ref.softmax[i].below_subnormal;
    row.sm.add(softdot_ref::ulp_error(y[i], ref.softmax[i]), i, tiny);
    const auto& lr = ref.log_softmax[i];
    row.lsm.add(softdot_ref::ulp_error(l[i], lr), i);
    if (std::isfinite(lr.hi)) {
      row.lsm_allow.add(
          softdot_ref::abs_error(l[i], lr) /
              std::max(lr.ulp, std::fabs(lr.hi) < 1 ? allow : 0.0),
          i);
    }
  }
  row.lse.add(softdot_ref::ulp_error(lse, ref.logsumexp));
  row.sum_err = std::max(row.sum_err, sum_error(y));
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
  std::printf("\n%s, SIMD target %s\n", sizeof(T) == 4 ? "float" : "double",
              softdot::simd_target().c_str());
  std::printf("%-20s %8s | %14s | %14s %7s | %12s | %9s |%s\n", "logits", "n",
              "softmax max/mean", "log_softmax ulp", "/allow", "logsumexp",
              "|sum-1|",
              sizeof(T) == 4 ? " naive float softmax max/mean, |sum-1|" : "");
  for (const Dist& d : kDists) {
    for (std::size_t n = 10; n <= max_n; n *= (n < 1000 ? 100 : 32)) {
      Row row;
      const int reps = n <= 1000 ? 20 : 1;
      for (int r = 0; r < reps; ++r) measure<T>(d, n, 1000 * n + r, row);
      std::printf(
          "%-20s %8zu | %6.2f / %5.3f | %6.2f / %5.3f %7.3f | %12.2f | %9.2e |",
          d.name, n, row.sm.max, row.sm.mean(), row.lsm.max, row.lsm.mean(),
          row.lsm_allow.max, row.lse.max, row.sum_err);
      if (sizeof(T) == 4 && row.naive.count > 0) {
        std::printf(" %7.2f / %5.3f, %9.2e", row.naive.max, row.naive.mean(),
                    row.naive_sum_err);
      }
      std::printf("\n");
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
