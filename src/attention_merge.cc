// softdot: attention_merge(), two partial results over disjoint key ranges
// into one, in double.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "attention_plan.h"
#include "softdot/attention.h"

namespace softdot {

using namespace detail::attn;

void attention_merge(TensorView<const float> o_a, const float* lse_a,
                     TensorView<const float> o_b, const float* lse_b,
                     TensorView<float> out, float* lse) {
  const char* fn = "attention_merge";
  check_tensor(fn, "o_a", o_a);
  check_tensor(fn, "o_b", o_b);
  check_tensor(fn, "out", out);
  auto same = [](const auto& x, const auto& y) {
    return x.batch == y.batch && x.heads == y.heads && x.rows == y.rows &&
           x.cols == y.cols;
  };
  if (!same(o_a, o_b) || !same(o_a, out)) {
    fail(fn, shape("o_a", o_a) + ", " + shape("o_b", o_b) + " and " +
                 shape("out", out) + " must have the same shape");
  }
  if (lse_a == nullptr || lse_b == nullptr || lse == nullptr) {
    fail(fn, "lse_a, lse_b and lse must not be null");
  }
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const std::size_t dv = o_a.cols;
  for (std::size_t b = 0; b < o_a.batch; ++b) {
    for (std::size_t h = 0; h < o_a.heads; ++h) {
      for (std::size_t i = 0; i < o_a.rows; ++i) {
        const std::size_t li = (b * o_a.heads + h) * o_a.rows + i;
        const float la = lse_a[li], lb = lse_b[li];
        const float* xa = o_a.row(b, h, i);
        const float* xb = o_b.row(b, h, i);
        float* y = out.row(b, h, i);
        if (std::isnan(la) || std::isnan(lb)) {
          std::fill(y, y + dv, std::numeric_limits<float>::quiet_NaN());
          lse[li] = std::numeric_limits<float>::quiet_NaN();
          continue;
        }
        if (la == -kInf && lb == -kInf) {
          std::fill(y, y + dv, 0.0f);
          lse[li] = -kInf;
          continue;
        }
        const float m = std::max(la, lb);
        const double wa = la == m ? 1.0 : std::exp(static_cast<double>(la) - m);
        const double wb = lb == m ? 1.0 : std::exp(static_cast<double>(lb) - m);
        const double inv = 1.0 / (wa + wb);
        for (std::size_t c = 0; c < dv; ++c) {
          const double ya = wa == 0.0 ? 0.0 : wa * xa[c];
          const double yb = wb == 0.0 ? 0.0 : wb * xb[c];
          y[c] = static_cast<float>((ya + yb) * inv);
        }
        lse[li] =
            static_cast<float>(static_cast<double>(m) + std::log(wa + wb));
      }
    }
  }
}

}  // namespace softdot
