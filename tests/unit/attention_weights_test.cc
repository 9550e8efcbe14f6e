// Attention tests: attention_weights against the reference and against the
// fused output, with the scores of both forms.
#include "attention_test_util.h"

namespace softdot_test {
namespace {

// ---- attention_weights -----------------------------------------------------

template <class KV>
void weights_case(const std::string& label, const Problem<KV>& p,
                  const AttentionOptions& o) {
  const Shape& s = p.s;
  const AttnRef ref = reference(p, o, /*weights=*/true);
  const std::string what =
      std::string(kv_name<KV>()) + " weights " + label + " " + s.str();
  Tensor<float> w(s.B, s.H, s.nq, s.nkv, 3, kOutSentinel);
  softdot::attention_weights(p.q.cview(), p.k.cview(), w.view(), o);
  EXPECT_TRUE(padding_intact(w, kOutSentinel)) << what << ": wrote outside";
  const Result r = run(p, o);
  double wmax = 0, omax = 0;
  std::size_t failures = 0;
  for (std::size_t b = 0; b < s.B; ++b) {
    for (std::size_t h = 0; h < s.H; ++h) {
      const std::size_t hk = h / (s.H / s.Hkv);
      for (std::size_t i = 0; i < s.nq; ++i) {
        const std::size_t row = ref.li(b, h, i);
        const double D = ref.D[row];
        for (std::size_t j = 0; j < s.nkv; ++j) {
          const float got = w.at(b, h, i, j);
          const LD want = ref.weights[ref.wi(b, h, i, j)];
          bool ok;
          if (want == 0) {
            ok = bits(got) == 0u;  // masked, out of range: +0
          } else {
            // The scores' error D moves each weight by at most 2D
            // relative (exp(s_j - lse)); the weights are rounded once from
            // double: 3u covers that rounding and the double arithmetic.
            const double err = double(std::fabs(LD(got) - want) / want);
            ok = err <= 2 * D + 3 * kU;
            wmax = std::max(wmax, err / kU);
          }
          if (!ok && failures++ < kMaxMessages) {
            ADD_FAILURE() << what << ": weight[b=" << b << ",h=" << h
                          << ",i=" << i << ",j=" << j << "] = " << fmt(got)
                          << ", reference " << fmt(double(want)) << " (D "
                          << fmt(D) << ")";
          }
        }
        // The fused output against sum_j weights_j V_j, in long double.
        // attention_weights computes the same float scores as attention()
        // (attention.h), so the two differ only by attention()'s exp and
        // sums (70u W, from its bound with D = 0), the weights' rounding
        // (u W) and the output rounding: |O - sum w^ V| <= 72u W^ + u|O^|.
        // The bound of attention.h itself, (2D + 70u) W + u|O*| plus the
        // weights' (2D + 3u) W, would follow from the two checks above.
        for (std::size_t c = 0; c < s.dv; ++c) {
          LD acc = 0, aw = 0;
          for (std::size_t j = 0; j < s.nkv; ++j) {
            const LD x = p.vw.at(b, hk, j, c);
            const LD wj = w.at(b, h, i, j);
            if (wj == 0) continue;
            acc += wj * x;
            aw += wj * std::fabs(x);
          }
          const float got = r.o.at(b, h, i, c);
          const double err = double(std::fabs(LD(got) - acc));
          const double bound =
              72 * kU * double(aw) + kU * double(std::fabs(acc));
          if (aw > 0) omax = std::max(omax, err / (kU * double(aw)));
          if (!(err <= bound) && failures++ < kMaxMessages) {
            ADD_FAILURE() << what << ": out[b=" << b << ",h=" << h << ",i=" << i
                          << ",c=" << c << "] = " << fmt(got)
                          << ", sum_j weights_j V_j " << fmt(double(acc))
                          << ": error " << fmt(err) << " > " << fmt(bound);
          }
        }
      }
    }
  }
  std::printf(
      "[ attn-err ] %-62s weights err/(u w) max %7.3f  |O - w.V|/(u W) max "
      "%7.3f\n",
      what.c_str(), wmax, omax);
  std::fflush(stdout);
}

TEST(AttentionWeights, AgainstReferenceAndFused) {
  Shape s{.B = 2,
          .H = 4,
          .Hkv = 2,
          .nq = 9,
          .nkv = 130,
          .d = 64,
          .dv = 32,
          .pad = 1,
          .seed = 120};
  const auto p = make_problem<float>(s);
  const auto ph = make_problem<Float16>(s);
  const auto pb = make_problem<BFloat16>(s);
  weights_case<float>("plain", p, {});
  weights_case<Float16>("plain", ph, {});
  weights_case<BFloat16>("plain", pb, {});
  AttentionOptions o;
  o.causal = true;
  o.window_left = 60;
  const std::vector<float> sinks = {0.0f, -kInfF, 2.0f, 8.0f};
  o.sinks = sinks;
  weights_case<float>("causal window sinks", p, o);
  Tensor<bool> m = random_mask(1, 4, s.nq, s.nkv, 121);
  Tensor<float> bias(2, 1, s.nq, s.nkv, 0, kNaNF);
  std::mt19937_64 rng(122);
  std::uniform_real_distribution<double> u(-4, 4);
  bias.for_each([&](float& x) { x = float(u(rng)); });
  AttentionOptions o2;
  o2.mask = m.cview();
  o2.bias = bias.cview();
  o2.softcap = 2.5f;
  o2.kv_begin = 10;
  o2.kv_end = 100;
  weights_case<Float16>("mask bias softcap range", ph, o2);
  // Wide scores and a fully masked row region (causal with n_q > n_kv).
  Shape s2{.B = 1,
           .H = 2,
           .Hkv = 1,
           .nq = 80,
           .nkv = 65,
           .d = 64,
           .dv = 64,
           .qk = 3.0,
           .seed = 123};
  AttentionOptions o3;
  o3.causal = true;
  o3.scale = 0.25;
  weights_case<float>("wide causal nq>nkv", make_problem<float>(s2), o3);
}

TEST(AttentionWeights, SameScoresAsDecodeAndPrefillForms) {
  // Decode shapes (at most 16 query rows per KV head: attention() takes its
  // decode form), with scores near 640 whose last bits depend on the order
  // of the dot product's additions: the weights must come from the same
  // float scores as attention()'s (attention.h), which the second check
  // (|O - w.V| <= 72u W) sees. The same data through the prefill form
  // (18 rows per KV head) for comparison.
  for (std::size_t nq : {1, 8, 9}) {
    Shape sd{.B = 1,
             .H = 4,
             .Hkv = 2,
             .nq = nq,
             .nkv = 20,
             .d = 64,
             .dv = 16,
             .seed = 124};
    auto pd = make_problem<float>(sd);
    std::mt19937_64 r2(125);
    std::uniform_real_distribution<double> ku(1.0, 1.01);
    pd.q.for_each([](float& x) { x = 10.0f; });
    pd.k.for_each([&](float& x) { x = float(ku(r2)); });
    pd.rewiden();
    AttentionOptions od;
    od.scale = 1.0;
    const std::string form = nq <= 8 ? "decode form" : "prefill form";
    weights_case<float>("scores near 640, " + form, pd, od);
    if (nq == 9) {
      od.softcap = 800.0f;  // the same tanh bits in both
      weights_case<float>("scores near 640, softcap 800, " + form, pd, od);
    }
  }
}

}  // namespace
}  // namespace softdot_test
