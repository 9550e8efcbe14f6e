// softdot: attention_weights(), the explicit weights of attention() with the
// scores of the form attention() takes for the same shapes.
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
#include "kernels.h"
#include "kernels/weights_row.h"
#include "softdot/attention.h"

namespace softdot {

namespace {

using namespace detail::attn;

template <class KT>
void run_weights(const TensorView<const float>& q,
                 const TensorView<const KT>& k, const TensorView<float>& w,
                 const AttentionOptions& o) {
  const char* fn = "attention_weights";
  const Plan p = check_and_plan<KT>(fn, q, k, nullptr, w, "weights", k.rows, o);
  constexpr float kInf = std::numeric_limits<float>::infinity();
  std::vector<float> s(p.n_kv);
  std::vector<char> vis(p.n_kv);
  std::vector<float> krow_f(p.n_kv * p.d);
  std::vector<float> score_scratch(detail::attention_score_scratch(p.d));
  // The form attention() takes for these shapes decides how scores round.
  const bool decode = p.g * p.n_q <= kDecodeRows;
  for (std::size_t b = 0; b < p.B; ++b) {
    for (std::size_t h = 0; h < p.H; ++h) {
      const std::size_t kh = h / p.g;
      for (std::size_t j = 0; j < p.n_kv; ++j) {
        const KT* kr = k.row(b, kh, j);
        for (std::size_t c = 0; c < p.d; ++c) {
          if constexpr (std::is_same_v<KT, float>) {
            krow_f[j * p.d + c] = kr[c];
          } else {
            krow_f[j * p.d + c] = to_float(kr[c]);
          }
        }
      }
      for (std::size_t i = 0; i < p.n_q; ++i) {
        const float* qr = q.row(b, h, i);
        std::int32_t first, last;
        visible_keys(p, i, first, last);
        for (std::size_t j = 0; j < p.n_kv; ++j) {
          s[j] = detail::attention_score(qr, krow_f.data() + j * p.d, p.d,
                                         decode, score_scratch.data()) *
                 p.scale;
        }
        if (p.softcap > 0.0f)
          detail::attention_softcap(s.data(), p.n_kv, p.softcap);
        for (std::size_t j = 0; j < p.n_kv; ++j) {
          const auto jj = static_cast<std::int32_t>(j);
          bool keep = jj >= first && jj <= last;
          if (!o.bias.empty()) {
            const float bv = o.bias.row(o.bias.batch == 1 ? 0 : b,
                                        o.bias.heads == 1 ? 0 : h, i)[j];
            if (bv == -kInf) keep = false;
            s[j] = s[j] + bv;
          }
          if (!o.mask.empty() && !o.mask.row(o.mask.batch == 1 ? 0 : b,
                                             o.mask.heads == 1 ? 0 : h, i)[j]) {
            keep = false;
          }
          vis[j] = keep;
        }
        const bool has_sink = !o.sinks.empty();
        detail::weights_row(s.data(), vis.data(), p.n_kv,
                            has_sink ? o.sinks[h] : -kInf, w.row(b, h, i));
      }
    }
  }
}

}  // namespace

void attention_weights(TensorView<const float> q, TensorView<const float> k,
                       TensorView<float> weights,
                       const AttentionOptions& options) {
  run_weights(q, k, weights, options);
}
void attention_weights(TensorView<const float> q, TensorView<const Float16> k,
                       TensorView<float> weights,
                       const AttentionOptions& options) {
  run_weights(q, k, weights, options);
}
void attention_weights(TensorView<const float> q, TensorView<const BFloat16> k,
                       TensorView<float> weights,
                       const AttentionOptions& options) {
  run_weights(q, k, weights, options);
}

}  // namespace softdot
