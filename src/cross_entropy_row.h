// softdot: one row of the cross-entropy, from the quantities of the whole
// row (its softmax state, the target's logit, the sum of its logits). Shared
// by the one-process cross_entropy (src/cross_entropy.cc) and the
// vocabulary-parallel one (src/mpi/), which gathers those quantities from
// the ranks' shards first. Scalar code; nothing here throws or allocates.
//
// A stated internal interface: src/mpi/ reaches the softmax through the
// public API (softmax_state, merge, softmax_apply, logsumexp of a state:
// include/softdot/softmax.h) and this header, and includes no kernel header
// itself. This header includes three, none with SIMD code:
// kernels/dispatch.h (the gradient row calls softmax_row_kernel's kApply),
// kernels/row_op.h (RowOp, RowState) and kernels/two_sum.h
// (add_compensated, for the float sum).
// The states here are the public SoftmaxStateD (a float row's max is exact
// in double).
#ifndef SOFTDOT_SRC_CROSS_ENTROPY_ROW_H_
#define SOFTDOT_SRC_CROSS_ENTROPY_ROW_H_

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "kernels/dispatch.h"
#include "kernels/row_op.h"
#include "kernels/two_sum.h"
#include "softdot/softmax.h"

namespace softdot::detail {

// log of a state's sum, sum + sum_lo, in long double (as
// logsumexp_of_state: log1p where the sum holds the max's exact 1).
inline long double log_state_sum(const SoftmaxStateD& s) {
  return s.sum >= 1.0
             ? std::log1p(static_cast<long double>(s.sum - 1.0) + s.sum_lo)
             : std::log(static_cast<long double>(s.sum) + s.sum_lo);
}

// Sum of n values, in a fixed order (the bits depend on n and the values
// only): float in eight double-double (TwoSum) lanes, whose error is far
// below the long double rounding of the total; double in four long double
// lanes (relative error about n 2^-64 of sum |x|, and no overflow). -inf if
// a value is -inf and none is +inf or NaN.
template <class T>
long double sum_in_long_double(const T* x, std::size_t n) {
  if constexpr (sizeof(T) == 4) {
    constexpr std::size_t kLanes = 8;
    double s[kLanes] = {}, c[kLanes] = {};
    const auto add = [&](std::size_t k, double v) {
      add_compensated(s[k], c[k], v);
    };
    std::size_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
      for (std::size_t k = 0; k < kLanes; ++k) {
        add(k, static_cast<double>(x[i + k]));
      }
    }
    for (; i < n; ++i) add(i % kLanes, static_cast<double>(x[i]));
    bool finite = true;
    for (std::size_t k = 0; k < kLanes; ++k)
      finite = finite && std::isfinite(s[k]);
    long double total = 0;
    for (std::size_t k = 0; k < kLanes; ++k) {
      // An infinite lane makes its compensation NaN: the lanes alone then.
      total += static_cast<long double>(s[k]) +
               (finite ? static_cast<long double>(c[k]) : 0.0L);
    }
    return total;
  } else {
    long double a[4] = {0, 0, 0, 0};
    std::size_t i = 0;
    for (; i + 4 <= n; i += 4) {
      for (std::size_t k = 0; k < 4; ++k) a[k] += x[i + k];
    }
    for (; i < n; ++i) a[i % 4] += x[i];
    return (a[0] + a[1]) + (a[2] + a[3]);
  }
}

// loss = (1 - eps) (lse - x_t) + eps (lse - sum_x / vocab), in long double,
// with the special values of include/softdot/cross_entropy.h. `total` is the
// softmax state of the whole row (max, sum, sum_lo; for a max of +inf, sum
// counts the +inf logits); sum_x matters only when eps > 0.
inline long double cross_entropy_row_loss(const SoftmaxStateD& total,
                                          long double x_t, long double sum_x,
                                          std::size_t vocab, double eps) {
  using L = long double;
  constexpr L kInf = std::numeric_limits<L>::infinity();
  if (std::isnan(total.max) || std::isnan(total.sum) || std::isnan(x_t) ||
      std::isnan(sum_x)) {
    return std::numeric_limits<L>::quiet_NaN();
  }
  L nll, smooth;
  if (total.max == -kInf) {  // every logit -inf: probability 0 everywhere
    nll = kInf;
    smooth = kInf;
  } else if (total.max == kInf) {  // total.sum = k logits +inf, weight 1/k
    nll = x_t == kInf ? std::log(static_cast<L>(total.sum)) : kInf;
    smooth = total.sum == static_cast<double>(vocab)
                 ? std::log(static_cast<L>(vocab))
                 : kInf;
  } else {
    const L log_s = log_state_sum(total);
    const L m = static_cast<L>(total.max);
    nll = x_t == -kInf ? kInf : (m - x_t) + log_s;
    smooth =
        sum_x == -kInf ? kInf : (m - sum_x / static_cast<L>(vocab)) + log_s;
  }
  if (eps == 0.0) return nll;
  if (eps == 1.0) return smooth;
  return (1 - static_cast<L>(eps)) * nll + static_cast<L>(eps) * smooth;
}

// One gradient row (or the columns [0, n) of a shard of it):
//   g_j = c (softmax_j - (1 - eps) [j == t_local] - eps / vocab),
// softmax_j from the faithful kApply kernel with the whole row's state, the
// rest in W (double for float, long double for double), rounded once.
// t_local < 0 or >= n: the target is not among these columns. x and g must
// not overlap.
template <class T>
void cross_entropy_row_grad(const T* x, std::size_t n, std::ptrdiff_t t_local,
                            const SoftmaxStateD& total, double c, double eps,
                            std::size_t vocab, T* g) {
  using W = std::conditional_t<sizeof(T) == 4, double, long double>;
  if (n == 0) return;
  RowState state{total.max, total.sum, total.sum_lo};
  softmax_row_kernel(x, nullptr, T{1}, n, RowOp::kApply, true, g, &state);
  const bool has_target = t_local >= 0 && static_cast<std::size_t>(t_local) < n;
  const W p_t = has_target ? static_cast<W>(g[t_local]) : W{0};
  const W cw = static_cast<W>(c);
  const W off = static_cast<W>(eps) / static_cast<W>(vocab);
  if (eps != 0.0) {
    for (std::size_t j = 0; j < n; ++j) {
      g[j] = static_cast<T>(cw * (static_cast<W>(g[j]) - off));
    }
  } else if (c != 1.0) {
    for (std::size_t j = 0; j < n; ++j) {
      g[j] = static_cast<T>(cw * static_cast<W>(g[j]));
    }
  }
  if (has_target) {
    g[t_local] = static_cast<T>(cw * ((p_t - (1 - static_cast<W>(eps))) - off));
  }
}

// One whole row of the one-process cross-entropy (src/cross_entropy.cc,
// src/linear_cross_entropy.cc): returns its unrounded loss and, when g is
// not null, writes its gradient row to g (g may be x: the loss reads x
// first, and the kApply kernel may write over its input). A row whose
// target is ignore_index has loss 0 and a zero gradient.
template <class T>
long double cross_entropy_whole_row(const T* x, std::size_t vocab,
                                    std::int64_t t, std::int64_t ignore_index,
                                    double c, double eps, T* g) {
  if (t == ignore_index) {
    if (g != nullptr) std::fill(g, g + vocab, T{0});
    return 0.0L;
  }
  RowState state{};
  softmax_row_kernel(x, nullptr, T{1}, vocab, RowOp::kState, true, nullptr,
                     &state);
  const long double sum_x = eps > 0.0 ? sum_in_long_double(x, vocab) : 0.0L;
  const SoftmaxStateD total{state.max, state.sum, state.sum_lo};
  const long double loss = cross_entropy_row_loss(
      total, static_cast<long double>(x[t]), sum_x, vocab, eps);
  if (g != nullptr) {
    cross_entropy_row_grad(x, vocab, static_cast<std::ptrdiff_t>(t), total, c,
                           eps, vocab, g);
  }
  return loss;
}

}  // namespace softdot::detail

#endif  // SOFTDOT_SRC_CROSS_ENTROPY_ROW_H_
