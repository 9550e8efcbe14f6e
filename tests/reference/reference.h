// softdot_reference: exact (MPFR, 256-bit) reference values for the tests.
//
// Test-only; never shipped. Every reference value is computed at 256 bits and
// rounded once (round to nearest even) to the element type, so `rounded` is
// the correctly rounded result. The exact value is also kept as hi + lo (two
// doubles, about 106 significant bits) so that errors can be measured in
// fractions of an ulp, together with the ulp of the element type at the exact
// value.
//
// Softmax semantics (README, "Special values"; include/softdot/softmax.h):
//   s = (T)(1.0 / temperature), rounded to the element type;
//   score_i = x_i * s, the product exact (a product that rounds to +-inf in T
//             counts as +-inf, as the library documents);
//   a masked entry (mask[i] == false) is -inf, whatever x_i is;
//   any unmasked NaN            -> every output NaN;
//   k unmasked scores +inf      -> weight 1/k there, +0 elsewhere; log-weight
//                                  -log(k) there, -inf elsewhere; lse +inf;
//   no finite or +inf score     -> weights +0, log-weights -inf, lse -inf;
//   otherwise m = max, S = sum exp(score_j - m) over the finite scores,
//     weight_i = exp(score_i - m) / S, log-weight_i = score_i - m - log S,
//     lse = m + log S, all exact to 256 bits and rounded once.
#ifndef SOFTDOT_TESTS_REFERENCE_REFERENCE_H_
#define SOFTDOT_TESTS_REFERENCE_REFERENCE_H_

#include <cstddef>
#include <limits>
#include <span>
#include <string>
#include <vector>

namespace softdot_ref {

// One reference value.
template <class T>
struct Ref {
  T rounded = 0;  // correctly rounded to T (NaN / +-inf for special values)
  double hi = 0;  // exact value ~= hi + lo (hi = rounded to double)
  double lo = 0;
  double lo_ulps = 0;  // (exact - hi) / ulp, exact to double precision
  double ulp = 0;      // spacing of T at the exact value (subnormal spacing
                       // below the normal range); 0 for 0, inf and NaN
  bool below_subnormal = false;  // exact value != 0 but below the smallest
                                 // subnormal of T (0 may be the right answer)
};

// Options, as softdot::SoftmaxOptions.
struct RefOptions {
  double temperature = 1.0;
  std::span<const bool> mask;
};

// The three softmax-family results of one row.
template <class T>
struct SoftmaxRef {
  std::vector<Ref<T>> softmax;
  std::vector<Ref<T>> log_softmax;
  Ref<T> logsumexp;
  // Convenience: the rounded values.
  std::vector<T> softmax_rounded() const;
  std::vector<T> log_softmax_rounded() const;
};

// Exact softmax, log_softmax and logsumexp of x (any size >= 0; n = 0 gives
// empty vectors and lse -inf). Cost: one 256-bit exp per finite score.
SoftmaxRef<float> softmax_reference(std::span<const float> x,
                                    const RefOptions& options = {});
SoftmaxRef<double> softmax_reference(std::span<const double> x,
                                     const RefOptions& options = {});

// Exact dot product sum_i x_i y_i (exact products, correctly rounded sum at
// 256 bits), and sum_i |x_i y_i| rounded up to double, for the gamma_n bound.
// Products with inf/NaN follow IEEE (the value is then NaN or inf).
template <class T>
struct DotRef {
  Ref<T> value;
  double abs_sum = 0;
};
DotRef<float> dot_reference(std::span<const float> x, std::span<const float> y);
DotRef<double> dot_reference(std::span<const double> x,
                             std::span<const double> y);

// Exact softmax backward dx_i = y_i (dy_i - sum_j dy_j y_j), rounded once.
std::vector<Ref<float>> softmax_backward_reference(std::span<const float> y,
                                                   std::span<const float> dy);
std::vector<Ref<double>> softmax_backward_reference(std::span<const double> y,
                                                    std::span<const double> dy);

// Correctly rounded 0 - log(k) (+0 for k = 1), for the +inf rows of the
// table.
template <class T>
Ref<T> neg_log_reference(std::size_t k);

// Error of `computed` in ulps of T at the exact value:
//   |computed - exact| / ulp(exact).
// Special cases: a NaN reference wants a NaN (0 if so, else +inf); an
// infinite or exactly zero reference wants exactly that value (0 or +inf).
// A finite reference and a NaN/inf result give +inf.
template <class T>
double ulp_error(T computed, const Ref<T>& ref);

// Absolute error |computed - exact| (+inf / 0 for special values as above).
template <class T>
double abs_error(T computed, const Ref<T>& ref);

// Running statistics of ulp errors.
struct UlpStats {
  double max = 0;
  double sum = 0;
  std::size_t count = 0;
  std::size_t worst_index = 0;      // index given with the worst error
  std::size_t below_subnormal = 0;  // references below the smallest subnormal
  void add(double err, std::size_t index = 0, bool tiny = false);
  void merge(const UlpStats& other);
  double mean() const { return count ? sum / double(count) : 0.0; }
  std::string str() const;  // "max 1.23 mean 0.21 (n=..., tiny=...)"
};

// Machine epsilon u = 2^-p of T (2^-24 float, 2^-53 double) and
// gamma_n = n u / (1 - n u).
template <class T>
constexpr double unit_roundoff() {
  return std::numeric_limits<T>::epsilon() / 2;
}
template <class T>
double gamma(std::size_t n) {
  const double nu = double(n) * unit_roundoff<T>();
  return nu / (1.0 - nu);
}

}  // namespace softdot_ref

#endif  // SOFTDOT_TESTS_REFERENCE_REFERENCE_H_
