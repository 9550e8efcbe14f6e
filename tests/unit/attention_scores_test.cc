// Attention tests: attention_scores, the explicit scores: the weights of
// attention_weights are the softmax of its rows bit for bit, hidden keys are
// -inf, visible ones within D of the exact score, on every target.
#include "attention_test_util.h"
#include "kernels/weights_row.h"

namespace softdot_test {
namespace {

class AttentionScores : public PerTarget {};

template <class KV>
Tensor<float> scores_of(const Problem<KV>& p, const AttentionOptions& o) {
  const Shape& s = p.s;
  Tensor<float> out(s.B, s.H, s.nq, s.nkv, 2, kOutSentinel, 1);
  softdot::attention_scores(p.q.cview(), p.k.cview(), out.view(), o);
  EXPECT_TRUE(padding_intact(out, kOutSentinel)) << "wrote outside the scores";
  return out;
}

template <class KV>
Tensor<float> weights_of(const Problem<KV>& p, const AttentionOptions& o) {
  const Shape& s = p.s;
  Tensor<float> out(s.B, s.H, s.nq, s.nkv, 1, kOutSentinel);
  softdot::attention_weights(p.q.cview(), p.k.cview(), out.view(), o);
  return out;
}

// The weights of attention_weights are the softmax of the rows of
// attention_scores, bit for bit, in two ways:
//  1. the library's scalar softmax row (weights_row, with the sink), taking
//     the keys whose score is not -inf;
//  2. attention_weights itself with q = 0 and k = 0, the scores as the bias
//     and the same sinks: every dot product is then +0, so each score is
//     0 + bias = the given score exactly, and a -inf bias hides the key.
template <class KV>
void expect_softmax_of_scores(const std::string& label, const Problem<KV>& p,
                              const AttentionOptions& o) {
  const Shape& s = p.s;
  const std::string what = std::string(kv_name<KV>()) + " " + label + " " +
                           s.str() + " [" + softdot::simd_target() + "]";
  const Tensor<float> sc = scores_of(p, o);
  const Tensor<float> w = weights_of(p, o);
  std::vector<float> row(s.nkv);
  std::vector<char> vis(s.nkv);
  std::size_t failures = 0, hidden = 0;
  for (std::size_t b = 0; b < s.B; ++b) {
    for (std::size_t h = 0; h < s.H; ++h) {
      for (std::size_t i = 0; i < s.nq; ++i) {
        std::vector<float> srow(s.nkv), wrow(s.nkv);
        for (std::size_t j = 0; j < s.nkv; ++j) {
          srow[j] = sc.at(b, h, i, j);
          wrow[j] = w.at(b, h, i, j);
          vis[j] = srow[j] != -kInfF;
          hidden += !vis[j];
        }
        softdot::detail::weights_row(srow.data(), vis.data(), s.nkv,
                                     o.sinks.empty() ? -kInfF : o.sinks[h],
                                     row.data());
        const auto same = SameBits(row, wrow);
        ATTN_EXPECT(same, failures)
            << what << ": row b=" << b << " h=" << h << " i=" << i
            << ": softmax of the scores vs attention_weights: "
            << same.message();
      }
    }
  }
  // The test must see hidden keys whenever the options hide some.
  if (o.causal || o.window_left >= 0 || !o.mask.empty() || o.kv_begin > 0) {
    EXPECT_GT(hidden, 0u) << what << " (test setup)";
  }

  Tensor<float> zq(s.B, s.H, s.nq, s.d, 0, 0.0f);
  Tensor<KV> zk(s.B, s.Hkv, s.nkv, s.d, 0, from_float<KV>(0.0f));
  AttentionOptions zo;
  zo.scale = o.scale;
  zo.sinks = o.sinks;
  zo.bias = sc.cview();
  Tensor<float> zw(s.B, s.H, s.nq, s.nkv, 0, kOutSentinel);
  softdot::attention_weights(zq.cview(), zk.cview(), zw.view(), zo);
  EXPECT_TRUE(SameBits(zw.dense(), w.dense()))
      << what << ": attention_weights with the scores as the bias";
}

TEST_P(AttentionScores, WeightsAreTheSoftmaxOfTheScores) {
  // Prefill (9 x 4 / 2 rows per KV head > 16) and decode (n_q = 3: 6 rows
  // per KV head) shapes, strided.
  for (std::size_t nq : {std::size_t(9), std::size_t(3)}) {
    Shape s{.B = 2,
            .H = 4,
            .Hkv = 2,
            .nq = nq,
            .nkv = 70,
            .d = 40,
            .dv = 8,
            .pad = 1,
            .seed = 300 + nq};
    const auto p = make_problem<float>(s);
    const auto ph = make_problem<Float16>(s);
    const auto pb = make_problem<BFloat16>(s);
    expect_softmax_of_scores<float>("plain", p, {});
    expect_softmax_of_scores<Float16>("plain", ph, {});
    expect_softmax_of_scores<BFloat16>("plain", pb, {});
    AttentionOptions o;
    o.causal = true;
    o.window_left = 30;
    const std::vector<float> sinks = {0.0f, -kInfF, 2.0f, 8.0f};
    o.sinks = sinks;
    expect_softmax_of_scores<float>("causal window sinks", p, o);
    Tensor<bool> m = random_mask(1, 4, s.nq, s.nkv, 301);
    Tensor<float> bias(2, 1, s.nq, s.nkv, 0, kNaNF);
    std::mt19937_64 rng(302);
    std::uniform_real_distribution<double> u(-4, 4);
    bias.for_each([&](float& x) { x = float(u(rng)); });
    bias.at(1, 0, 0, 5) = -kInfF;  // a -inf bias hides the key
    AttentionOptions o2;
    o2.mask = m.cview();
    o2.bias = bias.cview();
    o2.softcap = 2.5f;
    o2.scale = 0.7;
    o2.kv_begin = 4;
    o2.kv_end = 60;
    expect_softmax_of_scores<Float16>("mask bias softcap range", ph, o2);
    expect_softmax_of_scores<BFloat16>("mask bias softcap range", pb, o2);
  }
  // Causal with n_q > n_kv: the first rows see no key (all -inf, weights
  // +0); wide scores.
  Shape s2{.B = 1,
           .H = 2,
           .Hkv = 1,
           .nq = 40,
           .nkv = 33,
           .d = 16,
           .dv = 4,
           .qk = 3.0,
           .seed = 303};
  AttentionOptions o3;
  o3.causal = true;
  expect_softmax_of_scores<float>("causal nq>nkv", make_problem<float>(s2), o3);
}

// Every entry on its own: -inf (bitwise) exactly where the key is hidden (by
// range, causal, window, mask or a -inf bias), even where the hidden key's K
// row or bias holds NaN; elsewhere within D_i of the exact score
// cap(scale * q . k) + bias (attention.h), NaN where the key holds NaN.
TEST_P(AttentionScores, HiddenKeysAreMinusInfinityVisibleOnesExact) {
  Shape s{.B = 2,
          .H = 2,
          .Hkv = 1,
          .nq = 6,
          .nkv = 40,
          .d = 24,
          .dv = 4,
          .pad = 1,
          .seed = 310};
  auto p = make_problem<float>(s);
  Tensor<bool> m = random_mask(2, 1, s.nq, s.nkv, 311);
  Tensor<float> bias(1, 2, s.nq, s.nkv, 0, kNaNF);
  std::mt19937_64 rng(312);
  std::uniform_real_distribution<double> u(-2, 2);
  bias.for_each([&](float& x) { x = float(u(rng)); });
  AttentionOptions o;
  o.causal = true;
  o.window_left = 20;
  o.softcap = 5.0f;
  o.kv_begin = 3;
  o.kv_end = 39;
  o.mask = m.cview();
  o.bias = bias.cview();
  const softdot_ref::AttnRefOptions ro = to_ref(o);
  const auto position_visible = [&](std::size_t i, std::size_t j) {
    return softdot_ref::attention_position_visible(ro, s.nq, s.nkv, i, j);
  };
  // A -inf bias at a visible position; NaN in a key that no query sees (key
  // 1, outside the range), NaN in a bias entry the mask hides.
  bias.at(0, 1, 5, 30) = -kInfF;
  for (std::size_t c = 0; c < s.d; ++c) p.k.at(1, 0, 1, c) = kNaNF;
  bool planted = false;
  for (std::size_t j = 0; j < s.nkv && !planted; ++j) {
    if (position_visible(4, j) && !m.at(1, 0, 4, j)) {
      bias.at(0, 0, 4, j) = kNaNF;
      planted = true;
    }
  }
  ASSERT_TRUE(planted) << "test setup";
  // NaN in key 36 of batch 0, which the last query rows see.
  p.k.at(0, 0, 36, 7) = kNaNF;
  p.rewiden();
  ASSERT_TRUE(position_visible(5, 36) && position_visible(5, 30));

  const Tensor<float> sc = scores_of(p, o);
  const AttnRef ref = reference(p, o);
  const float scale = softdot_ref::attention_scale(o.scale, s.d);
  std::size_t failures = 0, n_hidden = 0, n_visible = 0, n_nan = 0;
  for (std::size_t b = 0; b < s.B; ++b) {
    for (std::size_t h = 0; h < s.H; ++h) {
      for (std::size_t i = 0; i < s.nq; ++i) {
        const double D = ref.D[ref.li(b, h, i)];
        for (std::size_t j = 0; j < s.nkv; ++j) {
          const float got = sc.at(b, h, i, j);
          const float bv = bias.at(0, h, i, j);
          const bool visible =
              position_visible(i, j) && m.at(b, 0, i, j) && bv != -kInfF;
          std::string why;
          if (!visible) {
            ++n_hidden;
            if (bits(got) != bits(-kInfF)) why = "hidden: want -inf";
          } else {
            ++n_visible;
            LD dot = 0;
            for (std::size_t c = 0; c < s.d; ++c)
              dot += LD(p.q.at(b, h, i, c)) * LD(p.kw.at(b, 0, j, c));
            LD want = dot * LD(scale);
            want = LD(o.softcap) * std::tanh(want / LD(o.softcap));
            want += LD(bv);
            if (std::isnan(want)) {
              ++n_nan;
              if (!std::isnan(got)) why = "want NaN";
            } else {
              const double err = double(std::fabs(LD(got) - want));
              // D is NaN for the rows that see the NaN key; the other
              // entries of those rows are still within the bound computed
              // without it (D_i over the finite keys), so use the score's
              // own term for them.
              double bound = D;
              if (std::isnan(bound)) {
                LD abs = 0;
                for (std::size_t c = 0; c < s.d; ++c)
                  abs += std::fabs(LD(p.q.at(b, h, i, c)) *
                                   LD(p.kw.at(b, 0, j, c)));
                const double n_d =
                    double(softdot_ref::attention_dot_roundings(s.d));
                const double gamma = n_d * kU / (1 - n_d * kU);
                bound = double(LD(scale) * gamma * abs) +
                        2 * kU *
                            (std::fabs(double(dot * LD(scale))) +
                             std::fabs(double(want))) +
                        4 * kU * o.softcap;
              }
              if (!(std::isfinite(got) && err <= bound)) {
                why = "error " + fmt(err) + " > D " + fmt(bound) + ", exact " +
                      fmt(double(want));
              }
            }
          }
          if (!why.empty() && failures++ < kMaxMessages) {
            ADD_FAILURE() << "scores[b=" << b << ",h=" << h << ",i=" << i
                          << ",j=" << j << "] = " << fmt(got) << ": " << why
                          << " [" << softdot::simd_target() << "]";
          }
        }
      }
    }
  }
  EXPECT_GT(n_hidden, 0u);
  EXPECT_GT(n_visible, 0u);
  EXPECT_GT(n_nan, 0u);  // the NaN key, seen by the last rows of batch 0
}

// A row that sees no key is all -inf; n_kv = 0 writes nothing.
TEST_P(AttentionScores, EmptyRangesAndNoKeys) {
  Shape s{.B = 1, .H = 2, .Hkv = 2, .nq = 5, .nkv = 7, .d = 8, .seed = 320};
  const auto p = make_problem<float>(s);
  AttentionOptions o;
  o.kv_begin = 4;
  o.kv_end = 4;
  const Tensor<float> sc = scores_of(p, o);
  for (float x : sc.dense()) EXPECT_EQ(bits(x), bits(-kInfF));

  std::vector<float> q(std::size_t{2} * 5 * 8, 1.0f);
  std::vector<float> none(4, kOutSentinel);
  EXPECT_NO_THROW(
      softdot::attention_scores(TensorView<const float>(q.data(), 1, 2, 5, 8),
                                TensorView<const float>(nullptr, 1, 2, 0, 8),
                                TensorView<float>(none.data(), 1, 2, 5, 0)));
  for (float x : none) EXPECT_EQ(bits(x), bits(kOutSentinel));
}

SOFTDOT_INSTANTIATE_PER_TARGET(AttentionScores);

}  // namespace
}  // namespace softdot_test
