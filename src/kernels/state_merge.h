// softdot: the one merge rule of online softmax, and the finalisation of a
// state. Scalar code, shared by src/softmax.cc (SoftmaxState), the decode
// chunks of src/attention.cc, AttentionPartial and attention_merge.
//
// A state summarises a set of scores s_j (and, for attention, the value rows
// V_j they weight) by its max m, its sum S = sum_j exp(s_j - m) and, for
// attention, its unnormalised output O = sum_j exp(s_j - m) V_j. Two states
// over disjoint sets merge into the state of their union:
//   m = max(m_a, m_b),  w_x = exp(m_x - m),
//   S = w_a S_a + w_b S_b,  O = w_a O_a + w_b O_b,
// with three rules that keep the special values right:
//   - a NaN max or sum on either side gives the NaN state;
//   - an empty state (S = 0: no visible score) is the identity, and the
//     other state is returned as it is, bit for bit;
//   - a side whose max is m gets w = 1 exactly, without an exp: no rounding
//     for the larger side, and two +inf maxima (S then counts the +inf
//     scores) never compute exp(inf - inf).
// The rule is written once, in merge_plan(); the three state forms apply it
// in their own precision, stated at each:
//   merge_softmax_state  double-double sums, w in long double;
//   merge_row_state      double sums and output, w in double;
//   merge_normalized     the float (O / S, m + log S) form, in double.
#ifndef SOFTDOT_SRC_KERNELS_STATE_MERGE_H_
#define SOFTDOT_SRC_KERNELS_STATE_MERGE_H_

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "kernels/dispatch.h"
#include "round16.h"
#include "row_op.h"
#include "softdot/float16.h"
#include "two_sum.h"

namespace softdot::detail {

// What merging (m_a, S_a) with (m_b, S_b) does.
enum class MergeCase { kNaN, kTakeA, kTakeB, kCombine };

template <class Real, class M>
struct MergePlan {
  MergeCase what;
  M max;       // kCombine: the merged max
  Real w_a;    // kCombine: exp(m_a - max) in Real, exactly 1 if m_a == max
  Real w_b;    // kCombine: likewise for b
  bool a_top;  // kCombine: m_a == max (w_a is exactly 1)
  bool b_top;
};

// The merge rule (see the top of this file). Real is the precision of the
// weights: the exp of m_x - m is taken in Real, m_x - m itself is exact
// there when Real is at least as wide as M (a difference of two floats is
// exact in double; of two doubles, within 2^-64 relative in x86's long
// double).
template <class Real, class M>
MergePlan<Real, M> merge_plan(M m_a, double s_a, M m_b, double s_b) {
  if (std::isnan(m_a) || std::isnan(s_a) || std::isnan(m_b) ||
      std::isnan(s_b)) {
    return {MergeCase::kNaN, M{}, Real{}, Real{}, false, false};
  }
  if (s_b == 0.0) return {MergeCase::kTakeA, m_a, Real{1}, Real{}, true, false};
  if (s_a == 0.0) return {MergeCase::kTakeB, m_b, Real{}, Real{1}, false, true};
  const M m = std::max(m_a, m_b);
  const auto weight = [m](M x) -> Real {
    return x == m ? Real{1}
                  : std::exp(static_cast<Real>(x) - static_cast<Real>(m));
  };
  return {MergeCase::kCombine, m, weight(m_a), weight(m_b), m_a == m, m_b == m};
}

// ---- SoftmaxState: (max, sum + sum_lo), the sum in double-double ---------

// Double-double arithmetic (Dekker / Knuth): the unevaluated sum hi + lo.
using DD = TwoSumResult<double>;

inline DD fast_two_sum(double a, double b) {  // |a| >= |b| or a == 0
  const double s = a + b;
  return {s, b - (s - a)};
}

// a + b; symmetric in a and b, bit for bit.
inline DD dd_add(DD a, DD b) {
  const DD s = two_sum(a.hi, b.hi);
  return fast_two_sum(s.hi, s.lo + (a.lo + b.lo));
}

// a * f with f in long double (64-bit mantissa on x86, split in two doubles).
inline DD dd_scale(DD a, long double f) {
  const double f_hi = static_cast<double>(f);
  const double f_lo = static_cast<double>(f - f_hi);
  const double p = a.hi * f_hi;
  const double e = std::fma(a.hi, f_hi, -p);
  return fast_two_sum(p, e + (a.hi * f_lo + a.lo * f_hi));
}

// (max, sum, sum_lo) of a and b merged; M is float or double. The sum in
// double-double, each weight in long double: relative error about 2^-104
// for the sum beside the weight's (2^-64 relative); commutative bit for bit.
template <class M>
void merge_softmax_state(M& max, double& sum, double& sum_lo, M max_b,
                         double sum_b, double sum_lo_b) {
  const auto plan = merge_plan<long double>(max, sum, max_b, sum_b);
  switch (plan.what) {
    case MergeCase::kNaN:
      max = std::numeric_limits<M>::quiet_NaN();
      sum = std::numeric_limits<double>::quiet_NaN();
      sum_lo = 0.0;
      return;
    case MergeCase::kTakeA:
      return;
    case MergeCase::kTakeB:
      max = max_b;
      sum = sum_b;
      sum_lo = sum_lo_b;
      return;
    case MergeCase::kCombine:
      break;
  }
  const DD a{sum, sum_lo}, b{sum_b, sum_lo_b};
  const DD s = dd_add(plan.a_top ? a : dd_scale(a, plan.w_a),
                      plan.b_top ? b : dd_scale(b, plan.w_b));
  max = plan.max;
  sum = s.hi;
  sum_lo = s.lo;
}

// log-sum-exp of a softmax state, max + log(sum + sum_lo), rounded once to T
// (the log in long double).
template <class T>
T logsumexp_of_state(const RowState& s) {
  if (std::isnan(s.max) || std::isnan(s.sum)) {
    return std::numeric_limits<T>::quiet_NaN();
  }
  if (std::isinf(s.max)) return static_cast<T>(s.max);
  // sum >= 1 for a row state (see Log in softmax_common-inl.h); a merged or
  // hand-made state may hold less, where plain log is as good.
  const long double log_sum =
      s.sum >= 1.0
          ? std::log1p(static_cast<long double>(s.sum - 1.0) + s.sum_lo)
          : std::log(static_cast<long double>(s.sum) + s.sum_lo);
  return static_cast<T>(static_cast<long double>(s.max) + log_sum);
}

// ---- Attention row state: float max, double sum, double output -----------

// a = merge(a, b) for attention row states (max m, sum l, output o[dv]),
// everything in double: each merge adds at most 2 rounding errors of 2^-53
// to l and o, so a chain of P merges stays within about 2P 2^-53 relative
// of the exact merge of its parts. Commutative bit for bit. A null o_b is
// an output of zeros (a sink: the state (sink, 1, 0)).
inline void merge_row_state(float& m_a, double& l_a, double* o_a, float m_b,
                            double l_b, const double* o_b, std::size_t dv) {
  const auto plan = merge_plan<double>(m_a, l_a, m_b, l_b);
  switch (plan.what) {
    case MergeCase::kNaN:
      l_a = std::numeric_limits<double>::quiet_NaN();
      return;
    case MergeCase::kTakeA:
      return;
    case MergeCase::kTakeB:
      m_a = m_b;
      l_a = l_b;
      if (o_b == nullptr) {
        std::fill(o_a, o_a + dv, 0.0);
      } else {
        std::copy(o_b, o_b + dv, o_a);
      }
      return;
    case MergeCase::kCombine:
      break;
  }
  if (o_b == nullptr) {
    for (std::size_t c = 0; c < dv; ++c) o_a[c] = o_a[c] * plan.w_a + 0.0;
  } else {
    for (std::size_t c = 0; c < dv; ++c) {
      o_a[c] = o_a[c] * plan.w_a + o_b[c] * plan.w_b;
    }
  }
  l_a = l_a * plan.w_a + l_b * plan.w_b;
  m_a = plan.max;
}

// One attention row state -> its output o / l (each rounded once to float)
// and lse = m + log l (in double, rounded once). A NaN state gives NaN, an
// empty one (l = 0) zeros and -inf.
template <class T>
inline void finalize_row_state(float m, double l, const double* o,
                               std::size_t dv, T* out, float* lse) {
  // A float output, or a 16-bit one rounded once from the double quotient.
  auto put = [](double x) -> T {
    if constexpr (std::is_same_v<T, float>) {
      return static_cast<float>(x);
    } else if constexpr (std::is_same_v<T, BFloat16>) {
      return BFloat16{bfloat16_bits(x)};
    } else {
      return to_float16(round_to_odd(x));
    }
  };
  if (std::isnan(l)) {
    std::fill(out, out + dv, put(std::numeric_limits<double>::quiet_NaN()));
    if (lse) *lse = std::numeric_limits<float>::quiet_NaN();
  } else if (l == 0.0) {
    std::fill(out, out + dv, put(0.0));
    if (lse) *lse = -std::numeric_limits<float>::infinity();
  } else {
    if constexpr (std::is_same_v<T, float>) {
      for (std::size_t c = 0; c < dv; ++c) out[c] = put(o[c] / l);
    } else {
      // The same quotients and rounding, in vectors (dispatch.h).
      static_assert(sizeof(T) == sizeof(std::uint16_t));
      round16_quotient(o, l, dv, reinterpret_cast<std::uint16_t*>(out),
                       std::is_same_v<T, BFloat16>);
    }
    if (lse) *lse = static_cast<float>(static_cast<double>(m) + std::log(l));
  }
}

// ---- The normalised float form (O = o / l, lse = m + log l) --------------

// One row of attention_merge: the state of a part is (lse, S = 1, O = o)
// (S = 0 when lse = -inf), so the rule gives O = (w_a o_a + w_b o_b) /
// (w_a + w_b) and lse = m + log(w_a + w_b), computed in double and rounded
// once to float. A part with weight 0 contributes 0 even where its output
// holds inf (its keys' weights are below 2^-1074 of the other part's).
inline void merge_normalized(float lse_a, const float* o_a, float lse_b,
                             const float* o_b, std::size_t dv, float* out,
                             float* lse) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const double s_a = lse_a == -kInf ? 0.0 : 1.0;
  const double s_b = lse_b == -kInf ? 0.0 : 1.0;
  const auto plan = merge_plan<double>(lse_a, s_a, lse_b, s_b);
  if (plan.what == MergeCase::kNaN) {
    std::fill(out, out + dv, std::numeric_limits<float>::quiet_NaN());
    *lse = std::numeric_limits<float>::quiet_NaN();
    return;
  }
  if (s_a == 0.0 && s_b == 0.0) {
    std::fill(out, out + dv, 0.0f);
    *lse = -kInf;
    return;
  }
  // One formula for kTakeA / kTakeB too (weights 1 and 0), so that a merge
  // with an empty part rounds as any other (-0 becomes +0).
  const float m = plan.what == MergeCase::kCombine ? plan.max
                  : plan.what == MergeCase::kTakeA ? lse_a
                                                   : lse_b;
  const double w_a = plan.w_a, w_b = plan.w_b;
  const double inv = 1.0 / (w_a + w_b);
  for (std::size_t c = 0; c < dv; ++c) {
    const double y_a = w_a == 0.0 ? 0.0 : w_a * o_a[c];
    const double y_b = w_b == 0.0 ? 0.0 : w_b * o_b[c];
    out[c] = static_cast<float>((y_a + y_b) * inv);
  }
  *lse = static_cast<float>(static_cast<double>(m) + std::log(w_a + w_b));
}

}  // namespace softdot::detail

#endif  // SOFTDOT_SRC_KERNELS_STATE_MERGE_H_
