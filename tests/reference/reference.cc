// MPFR implementation of the softdot test reference (see reference.h).
#include "reference.h"

#include <mpfr.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <stdexcept>
#include <type_traits>

namespace softdot_ref {
namespace {

// 256 bits: a product of two doubles needs 106, and the shift score - max of
// scores within 2^150 of each other stays exact; the rounding error of exp,
// log and the sums is 2^-256 relative, far below any ulp of double.
constexpr mpfr_prec_t kPrec = 256;

// RAII wrapper of one mpfr_t.
class Mp {
 public:
  Mp() {
    mpfr_init2(v_, kPrec);
    mpfr_set_zero(v_, 1);
  }
  ~Mp() { mpfr_clear(v_); }
  Mp(const Mp&) = delete;
  Mp& operator=(const Mp&) = delete;
  mpfr_ptr get() { return v_; }
  mpfr_srcptr get() const { return v_; }

 private:
  mpfr_t v_;
};

template <class T>
T round_to(mpfr_srcptr v) {
  if constexpr (std::is_same_v<T, float>) {
    return mpfr_get_flt(v, MPFR_RNDN);
  } else {
    return mpfr_get_d(v, MPFR_RNDN);
  }
}

// log2 of the smallest subnormal: -149 (float), -1074 (double).
template <class T>
constexpr int kLogDenormMin =
    std::numeric_limits<T>::min_exponent - std::numeric_limits<T>::digits;

template <class T>
Ref<T> make_ref(mpfr_srcptr v) {
  Ref<T> r;
  r.rounded = round_to<T>(v);
  if (mpfr_nan_p(v)) {
    r.hi = r.lo = std::numeric_limits<double>::quiet_NaN();
    return r;
  }
  if (mpfr_inf_p(v) || mpfr_zero_p(v)) {
    r.hi = mpfr_get_d(v, MPFR_RNDN);
    return r;
  }
  r.hi = mpfr_get_d(v, MPFR_RNDN);
  Mp rest;
  mpfr_sub_d(rest.get(), v, r.hi, MPFR_RNDN);
  r.lo = mpfr_get_d(rest.get(), MPFR_RNDN);
  // |v| is in [2^(e-1), 2^e); the spacing of T there is 2^(e - digits), but
  // never below the subnormal spacing.
  const long e = mpfr_get_exp(v);
  const long ulp_exp =
      std::max<long>(e - std::numeric_limits<T>::digits, kLogDenormMin<T>);
  r.ulp = std::ldexp(1.0, int(ulp_exp));
  r.below_subnormal = e <= kLogDenormMin<T>;
  // (v - hi) / ulp in MPFR: as a double, lo itself underflows when T is
  // double and v is subnormal, and the error would read 0 or 1 ulp.
  mpfr_div_2si(rest.get(), rest.get(), ulp_exp, MPFR_RNDN);
  r.lo_ulps = mpfr_get_d(rest.get(), MPFR_RNDN);
  return r;
}

template <class T>
Ref<T> make_ref(double special) {
  Mp v;
  mpfr_set_d(v.get(), special, MPFR_RNDN);
  return make_ref<T>(v.get());
}

enum class Kind { kMinusInf, kFinite, kPlusInf, kNaN };

template <class T>
SoftmaxRef<T> softmax_impl(std::span<const T> x, const RefOptions& options) {
  const std::size_t n = x.size();
  if (!options.mask.empty() && options.mask.size() != n) {
    throw std::invalid_argument("softdot_ref: mask size != row size");
  }
  constexpr double kInf = std::numeric_limits<double>::infinity();
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  SoftmaxRef<T> out;
  out.softmax.resize(n);
  out.log_softmax.resize(n);

  const T scale = static_cast<T>(1.0 / options.temperature);
  std::unique_ptr<Mp[]> score(new Mp[n]);
  std::vector<Kind> kind(n);
  std::size_t plus_inf = 0, finite = 0;
  bool any_nan = false;
  for (std::size_t i = 0; i < n; ++i) {
    if (!options.mask.empty() && !options.mask[i]) {
      kind[i] = Kind::kMinusInf;
      continue;
    }
    const T xi = x[i];
    if (std::isnan(xi)) {
      kind[i] = Kind::kNaN;
      any_nan = true;
      continue;
    }
    mpfr_set_d(score[i].get(), double(xi), MPFR_RNDN);
    mpfr_mul_d(score[i].get(), score[i].get(), double(scale), MPFR_RNDN);
    if (mpfr_nan_p(score[i].get())) {  // inf * 0 cannot happen (scale > 0)
      kind[i] = Kind::kNaN;
      any_nan = true;
      continue;
    }
    // A product beyond the range of T counts as +-inf.
    const T rounded = round_to<T>(score[i].get());
    if (std::isinf(rounded)) {
      kind[i] = rounded > 0 ? Kind::kPlusInf : Kind::kMinusInf;
      plus_inf += rounded > 0;
      continue;
    }
    kind[i] = Kind::kFinite;
    ++finite;
  }

  if (any_nan) {
    const Ref<T> nan = make_ref<T>(kNaN);
    std::fill(out.softmax.begin(), out.softmax.end(), nan);
    std::fill(out.log_softmax.begin(), out.log_softmax.end(), nan);
    out.logsumexp = nan;
    return out;
  }
  const Ref<T> zero = make_ref<T>(0.0);
  const Ref<T> minus_inf = make_ref<T>(-kInf);
  if (plus_inf > 0) {
    Mp w, lw;
    mpfr_set_ui(w.get(), 1, MPFR_RNDN);
    mpfr_div_ui(w.get(), w.get(), plus_inf, MPFR_RNDN);
    // 0 - log(k): +0 for k = 1, as the table writes it.
    mpfr_set_ui(lw.get(), plus_inf, MPFR_RNDN);
    mpfr_log(lw.get(), lw.get(), MPFR_RNDN);
    mpfr_neg(lw.get(), lw.get(), MPFR_RNDN);
    // MPFR's 0 - (+0) is -0; IEEE's (and the table's) is +0.
    if (mpfr_zero_p(lw.get())) mpfr_set_zero(lw.get(), +1);
    const Ref<T> weight = make_ref<T>(w.get());
    const Ref<T> log_weight = make_ref<T>(lw.get());
    for (std::size_t i = 0; i < n; ++i) {
      const bool top = kind[i] == Kind::kPlusInf;
      out.softmax[i] = top ? weight : zero;
      out.log_softmax[i] = top ? log_weight : minus_inf;
    }
    out.logsumexp = make_ref<T>(kInf);
    return out;
  }
  if (finite == 0) {  // empty or fully masked
    std::fill(out.softmax.begin(), out.softmax.end(), zero);
    std::fill(out.log_softmax.begin(), out.log_softmax.end(), minus_inf);
    out.logsumexp = minus_inf;
    return out;
  }

  std::size_t imax = n;
  for (std::size_t i = 0; i < n; ++i) {
    if (kind[i] != Kind::kFinite) continue;
    if (imax == n || mpfr_greater_p(score[i].get(), score[imax].get())) {
      imax = i;
    }
  }
  Mp m, rest, sum, log_sum, t;
  mpfr_set(m.get(), score[imax].get(), MPFR_RNDN);
  // score[i] <- score[i] - m (exact here), then e_i kept in a second array.
  // The sum is kept as 1 + rest, rest = the terms other than the max's
  // exp(0) = 1, and log S = log1p(rest): rest may be far below 2^-256 (a
  // second score 480 below the max gives rest = 1e-209, and lse = m + 1e-209
  // must not come out as m).
  std::unique_ptr<Mp[]> e(new Mp[n]);
  for (std::size_t i = 0; i < n; ++i) {
    if (kind[i] != Kind::kFinite) continue;
    mpfr_sub(score[i].get(), score[i].get(), m.get(), MPFR_RNDN);
    mpfr_exp(e[i].get(), score[i].get(), MPFR_RNDN);
    if (i != imax) mpfr_add(rest.get(), rest.get(), e[i].get(), MPFR_RNDN);
  }
  mpfr_add_ui(sum.get(), rest.get(), 1, MPFR_RNDN);
  mpfr_log1p(log_sum.get(), rest.get(), MPFR_RNDN);
  for (std::size_t i = 0; i < n; ++i) {
    if (kind[i] != Kind::kFinite) {
      out.softmax[i] = zero;
      out.log_softmax[i] = minus_inf;
      continue;
    }
    mpfr_div(t.get(), e[i].get(), sum.get(), MPFR_RNDN);
    out.softmax[i] = make_ref<T>(t.get());
    mpfr_sub(t.get(), score[i].get(), log_sum.get(), MPFR_RNDN);
    out.log_softmax[i] = make_ref<T>(t.get());
  }
  mpfr_add(t.get(), m.get(), log_sum.get(), MPFR_RNDN);
  out.logsumexp = make_ref<T>(t.get());
  return out;
}

template <class T>
DotRef<T> dot_impl(std::span<const T> x, std::span<const T> y) {
  if (x.size() != y.size()) {
    throw std::invalid_argument("softdot_ref: dot size mismatch");
  }
  const std::size_t n = x.size();
  std::unique_ptr<Mp[]> prod(new Mp[n]);
  std::unique_ptr<Mp[]> mag(new Mp[n]);
  std::vector<mpfr_ptr> prod_ptr(n), mag_ptr(n);
  for (std::size_t i = 0; i < n; ++i) {
    mpfr_set_d(prod[i].get(), double(x[i]), MPFR_RNDN);
    mpfr_mul_d(prod[i].get(), prod[i].get(), double(y[i]), MPFR_RNDN);  // exact
    mpfr_abs(mag[i].get(), prod[i].get(), MPFR_RNDN);
    prod_ptr[i] = prod[i].get();
    mag_ptr[i] = mag[i].get();
  }
  Mp sum, abs_sum;
  // mpfr_sum is correctly rounded whatever the cancellation.
  mpfr_sum(sum.get(), prod_ptr.data(), n, MPFR_RNDN);
  mpfr_sum(abs_sum.get(), mag_ptr.data(), n, MPFR_RNDU);
  DotRef<T> out;
  out.value = make_ref<T>(sum.get());
  out.abs_sum = mpfr_get_d(abs_sum.get(), MPFR_RNDU);
  return out;
}

}  // namespace

template <class T>
std::vector<T> SoftmaxRef<T>::softmax_rounded() const {
  std::vector<T> r(softmax.size());
  for (std::size_t i = 0; i < r.size(); ++i) r[i] = softmax[i].rounded;
  return r;
}
template <class T>
std::vector<T> SoftmaxRef<T>::log_softmax_rounded() const {
  std::vector<T> r(log_softmax.size());
  for (std::size_t i = 0; i < r.size(); ++i) r[i] = log_softmax[i].rounded;
  return r;
}
template struct SoftmaxRef<float>;
template struct SoftmaxRef<double>;

SoftmaxRef<float> softmax_reference(std::span<const float> x,
                                    const RefOptions& options) {
  return softmax_impl<float>(x, options);
}
SoftmaxRef<double> softmax_reference(std::span<const double> x,
                                     const RefOptions& options) {
  return softmax_impl<double>(x, options);
}

template <class T>
std::vector<Ref<T>> backward_impl(std::span<const T> y, std::span<const T> dy) {
  if (y.size() != dy.size()) {
    throw std::invalid_argument("softdot_ref: backward size mismatch");
  }
  // g = sum dy_i y_i exactly (products of T are exact at 256 bits, and so is
  // the sum for the exponent ranges the tests use).
  Mp g, t;
  for (std::size_t i = 0; i < y.size(); ++i) {
    mpfr_set_d(t.get(), static_cast<double>(dy[i]), MPFR_RNDN);
    mpfr_mul_d(t.get(), t.get(), static_cast<double>(y[i]), MPFR_RNDN);
    mpfr_add(g.get(), g.get(), t.get(), MPFR_RNDN);
  }
  std::vector<Ref<T>> out(y.size());
  for (std::size_t i = 0; i < y.size(); ++i) {
    mpfr_set_d(t.get(), static_cast<double>(dy[i]), MPFR_RNDN);
    mpfr_sub(t.get(), t.get(), g.get(), MPFR_RNDN);
    mpfr_mul_d(t.get(), t.get(), static_cast<double>(y[i]), MPFR_RNDN);
    out[i] = make_ref<T>(t.get());
  }
  return out;
}

std::vector<Ref<float>> softmax_backward_reference(std::span<const float> y,
                                                   std::span<const float> dy) {
  return backward_impl<float>(y, dy);
}
std::vector<Ref<double>> softmax_backward_reference(
    std::span<const double> y, std::span<const double> dy) {
  return backward_impl<double>(y, dy);
}

DotRef<float> dot_reference(std::span<const float> x,
                            std::span<const float> y) {
  return dot_impl<float>(x, y);
}
DotRef<double> dot_reference(std::span<const double> x,
                             std::span<const double> y) {
  return dot_impl<double>(x, y);
}

template <class T>
Ref<T> neg_log_reference(std::size_t k) {
  Mp v;
  mpfr_set_ui(v.get(), k, MPFR_RNDN);
  mpfr_log(v.get(), v.get(), MPFR_RNDN);
  mpfr_neg(v.get(), v.get(), MPFR_RNDN);
  // MPFR's 0 - (+0) is -0; IEEE's (and the table's) 0 - log(1) is +0.
  if (mpfr_zero_p(v.get())) mpfr_set_zero(v.get(), +1);
  return make_ref<T>(v.get());
}
template Ref<float> neg_log_reference<float>(std::size_t);
template Ref<double> neg_log_reference<double>(std::size_t);

template <class T>
double ulp_error(T computed, const Ref<T>& ref) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  if (std::isnan(ref.hi)) return std::isnan(computed) ? 0.0 : kInf;
  if (ref.ulp == 0) {  // exact 0 or +-inf: only that value is right
    return double(computed) == ref.hi ? 0.0 : kInf;
  }
  if (!std::isfinite(computed)) return kInf;
  // computed - hi is exact (Sterbenz) wherever the error is small.
  return std::fabs((double(computed) - ref.hi) / ref.ulp - ref.lo_ulps);
}
template double ulp_error<float>(float, const Ref<float>&);
template double ulp_error<double>(double, const Ref<double>&);

template <class T>
double abs_error(T computed, const Ref<T>& ref) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  if (std::isnan(ref.hi)) return std::isnan(computed) ? 0.0 : kInf;
  if (ref.ulp == 0) return double(computed) == ref.hi ? 0.0 : kInf;
  if (!std::isfinite(computed)) return kInf;
  return std::fabs((double(computed) - ref.hi) - ref.lo);
}
template double abs_error<float>(float, const Ref<float>&);
template double abs_error<double>(double, const Ref<double>&);

void UlpStats::add(double err, std::size_t index, bool tiny) {
  if (count == 0 || err > max) {
    max = err;
    worst_index = index;
  }
  sum += err;
  ++count;
  below_subnormal += tiny;
}

void UlpStats::merge(const UlpStats& other) {
  if (other.count == 0) return;
  if (count == 0 || other.max > max) {
    max = other.max;
    worst_index = other.worst_index;
  }
  sum += other.sum;
  count += other.count;
  below_subnormal += other.below_subnormal;
}

std::string UlpStats::str() const {
  char buf[160];
  std::snprintf(buf, sizeof buf,
                "max %.3f mean %.4f (n=%zu, below subnormal=%zu)", max, mean(),
                count, below_subnormal);
  return buf;
}

}  // namespace softdot_ref
