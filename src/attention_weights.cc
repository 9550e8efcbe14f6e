// softdot: attention_scores() and attention_weights(): the explicit scores
// of attention() (the bits of the form it takes for the same shapes) and the
// weights computed from them. One routine, for_each_score_row, produces the
// scores of both, so the two functions cannot disagree.
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

#include "attention_checks.h"
#include "attention_schedule.h"
#include "kernels/dequantize.h"
#include "kernels/dispatch.h"
#include "kernels/weights_row.h"
#include "softdot/attention.h"
#include "softdot/attention_request.h"

namespace softdot {

namespace {

using namespace detail::attn;

// Calls row(b, h, i, s, vis) for every query row in (b, h, i) order, with
// s[j] the final score cap(scale * q_i . k_j) + bias_ij of each of the n_kv
// keys and vis[j] != 0 where key j is visible (range, causal, window, mask,
// a bias that is not -inf). s holds a value for hidden keys too, which the
// callers never use. The dot products are rounded as in the form attention()
// takes for these shapes.
template <class KT, class Row>
void for_each_score_row(const Plan& p, const TensorView<const float>& q,
                        const TensorView<const KT>& k,
                        const AttentionOptions& o, Row row,
                        const TensorView<const float>* k_scales = nullptr) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  std::vector<float> s(p.n_kv);
  std::vector<char> vis(p.n_kv);
  std::vector<float> krow_f(p.n_kv * p.d);
  std::vector<float> score_scratch(detail::attention_score_scratch(p.d));
  // The form attention() takes for these shapes decides how scores round.
  const bool decode =
      decode_kernel(form_of(p.g * p.n_q, o, /*units=*/0, /*scores=*/true));
  for (std::size_t b = 0; b < p.B; ++b) {
    for (std::size_t h = 0; h < p.H; ++h) {
      const std::size_t kh = h / p.g;
      for (std::size_t j = 0; j < p.n_kv; ++j) {
        const KT* kr = k.row(b, kh, j);
        for (std::size_t c = 0; c < p.d; ++c) {
          if constexpr (std::is_same_v<KT, float>) {
            krow_f[j * p.d + c] = kr[c];
          } else if constexpr (std::is_same_v<KT, std::int8_t>) {
            krow_f[j * p.d + c] =
                detail::dequantize_int8(kr[c], *k_scales->row(b, kh, j));
          } else if constexpr (detail::kScaledKv<KT>) {
            krow_f[j * p.d + c] =
                detail::dequantize_fp8(kr[c], *k_scales->row(b, kh, j));
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
        const auto base = static_cast<double>(alibi_base(p, i));
        for (std::size_t j = 0; j < p.n_kv; ++j) {
          const auto jj = static_cast<std::int32_t>(j);
          bool keep = jj >= first && jj <= last;
          if (!o.bias.empty()) {
            const float bv =
                o.bias.row(o.bias.batch == 1 ? 0 : b, o.bias.heads == 1 ? 0 : h,
                           i)[p.mask_col0 + j];
            if (bv == -kInf) keep = false;
            s[j] = s[j] + bv;
          }
          if (!o.alibi_slopes.empty()) {
            s[j] = s[j] + detail::alibi_term(o.alibi_slopes[h], j, base,
                                             static_cast<double>(p.kv_stride));
          }
          if (!o.mask.empty() &&
              !o.mask.row(o.mask.batch == 1 ? 0 : b, o.mask.heads == 1 ? 0 : h,
                          i)[p.mask_col0 + j]) {
            keep = false;
          }
          vis[j] = keep;
        }
        row(b, h, i, static_cast<const float*>(s.data()),
            static_cast<const char*>(vis.data()));
      }
    }
  }
}

}  // namespace

namespace detail::attn {

// The explicit scores or weights of a checked plan (no values).
template <class KT>
void run_explicit(const AttentionPlan& plan, const KVViews<KT>& kv) {
  const AttentionRequest& r = plan.request();
  const Plan& p = plan.data();
  const AttentionOptions& o = r.options;
  // Float32 only (AttentionPlan::make checks): the views hold floats.
  const TensorView<float>& out = *r.target.out.f32();
  const TensorView<const float>& q = *r.q.f32();
  const TensorView<const float>* k_scales =
      detail::kScaledKv<KT> ? &kv.k_scales : nullptr;
  constexpr float kInf = std::numeric_limits<float>::infinity();
  // No keys: the target has no columns, nothing to write, and its strides
  // (like those of every view that spans nothing) are unchecked, so no row
  // address may be formed from them (found by fuzz_request).
  if (p.n_kv == 0) return;
  if (r.target.kind == AttentionTarget::Kind::kScores) {
    for_each_score_row(
        p, q, kv.k, o,
        [&](std::size_t b, std::size_t h, std::size_t i, const float* s,
            const char* vis) {
          float* row = out.row(b, h, i);
          for (std::size_t j = 0; j < p.n_kv; ++j) {
            row[j] = vis[j] ? s[j] : -kInf;
          }
        },
        k_scales);
    return;
  }
  for_each_score_row(
      p, q, kv.k, o,
      [&](std::size_t b, std::size_t h, std::size_t i, const float* s,
          const char* vis) {
        const float sink = o.sinks.empty() ? -kInf : o.sinks[h];
        detail::weights_row(s, vis, p.n_kv, sink, out.row(b, h, i));
      },
      k_scales);
}

#define SOFTDOT_RUNNER(KT) \
  template void run_explicit<KT>(const AttentionPlan&, const KVViews<KT>&);
SOFTDOT_FOR_EACH_KV_TYPE(SOFTDOT_RUNNER)
#undef SOFTDOT_RUNNER

}  // namespace detail::attn

namespace {

void explicit_target(const char* fn, TensorView<const float> q, KVTensor k,
                     AttentionTarget target, const AttentionOptions& o) {
  run_request(fn, q, KVSource::keys(k), target, o);
}

}  // namespace

// The public overloads, one pair per key format.
#define SOFTDOT_EXPLICIT_TARGETS(KArg)                                         \
  void attention_weights(TensorView<const float> q, KArg k,                    \
                         TensorView<float> weights,                            \
                         const AttentionOptions& options) {                    \
    explicit_target("attention_weights", q, k,                                 \
                    AttentionTarget::weights(weights), options);               \
  }                                                                            \
  void attention_scores(TensorView<const float> q, KArg k,                     \
                        TensorView<float> scores,                              \
                        const AttentionOptions& options) {                     \
    explicit_target("attention_scores", q, k, AttentionTarget::scores(scores), \
                    options);                                                  \
  }
SOFTDOT_EXPLICIT_TARGETS(TensorView<const float>)
SOFTDOT_EXPLICIT_TARGETS(TensorView<const Float16>)
SOFTDOT_EXPLICIT_TARGETS(TensorView<const BFloat16>)
SOFTDOT_EXPLICIT_TARGETS(const Int8KV&)
SOFTDOT_EXPLICIT_TARGETS(const Float8E4M3KV&)
SOFTDOT_EXPLICIT_TARGETS(const Float8E5M2KV&)
#undef SOFTDOT_EXPLICIT_TARGETS

}  // namespace softdot
