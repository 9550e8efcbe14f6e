// softdot kernels: the softmax row of attention_weights(), scalar, in
// double: the weights of one query row, each rounded once to float, with the
// sink's term in the denominator. It is not the softmax kernel (whose float
// path uses a polynomial exp in double lanes): it keeps the bits
// attention_weights() has always had, and its own special values (the
// attention table of include/softdot/attention.h).
#ifndef SOFTDOT_KERNELS_WEIGHTS_ROW_H_
#define SOFTDOT_KERNELS_WEIGHTS_ROW_H_

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

namespace softdot::detail {

// out[j] = exp(s[j] - m) / (exp(sink - m) + sum over visible k of
// exp(s[k] - m)) for visible j (vis[j] != 0), else +0; sink = -inf when there
// is none. A NaN among the visible scores or the sink: the row is NaN; no
// visible score and no sink: zeros; k scores of +inf (the sink included):
// 1/k each at the visible +inf scores.
inline void weights_row(const float* s, const char* vis, std::size_t n,
                        float sink, float* out) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const bool has_sink = sink != -kInf;
  bool nan = std::isnan(sink);
  float m = sink;
  std::size_t n_inf = sink == kInf ? 1 : 0;
  for (std::size_t j = 0; j < n; ++j) {
    if (!vis[j]) continue;
    if (std::isnan(s[j])) nan = true;
    m = std::max(m, s[j]);
    if (s[j] == kInf) ++n_inf;
  }
  if (nan) {
    std::fill(out, out + n, std::numeric_limits<float>::quiet_NaN());
    return;
  }
  if (m == -kInf) {
    std::fill(out, out + n, 0.0f);
    return;
  }
  if (m == kInf) {
    for (std::size_t j = 0; j < n; ++j) {
      out[j] = vis[j] && s[j] == kInf
                   ? static_cast<float>(1.0 / static_cast<double>(n_inf))
                   : 0.0f;
    }
    return;
  }
  double sum = has_sink ? std::exp(static_cast<double>(sink) - m) : 0.0;
  for (std::size_t j = 0; j < n; ++j) {
    if (vis[j]) sum += std::exp(static_cast<double>(s[j]) - m);
  }
  for (std::size_t j = 0; j < n; ++j) {
    out[j] =
        vis[j]
            ? static_cast<float>(std::exp(static_cast<double>(s[j]) - m) / sum)
            : 0.0f;
  }
}

}  // namespace softdot::detail

#endif  // SOFTDOT_KERNELS_WEIGHTS_ROW_H_
