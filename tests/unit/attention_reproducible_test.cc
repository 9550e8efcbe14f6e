// Attention tests: Bitwise reproducibility over threads, FMA targets and
// layouts.
#include "attention_test_util.h"

namespace softdot_test {
namespace {

// ---- reproducibility -------------------------------------------------------

// The same bits for 1, 2 and 3 threads, every FMA target, and other
// layouts (padding, misaligned starts) of the same values.
template <class KV>
void repro_case(const std::string& label, const Shape& s,
                const AttentionOptions& o) {
  const auto p = make_problem<KV>(s);
  Problem<KV> p2 = p;  // the same values, another layout
  p2.s.pad = s.pad + 3;
  p2.s.off = s.off + 1;
  p2.q = p.q.relayout(p2.s.pad, p2.s.off, kNaNF);
  p2.k = p.k.relayout(p2.s.pad, p2.s.off, from_float<KV>(kNaNF));
  p2.v = p.v.relayout(p2.s.pad, p2.s.off, from_float<KV>(kNaNF));
  std::vector<float> want;
  std::string first;
  int configurations = 0;
  for (const auto& t : fma_targets()) {
    softdot::force_simd_target(t);
    for (int threads : {1, 2, 3}) {
      for (int layout = 0; layout < 2; ++layout) {
        if (layout == 1 && threads != 2) continue;
        const auto got = with_threads(
            threads, [&] { return (layout ? run(p2, o) : run(p, o)).all(); });
        const std::string where = t + ", " + std::to_string(threads) +
                                  " threads" + (layout ? ", other layout" : "");
        ++configurations;
        if (want.empty()) {
          want = got;
          first = where;
          continue;
        }
        EXPECT_TRUE(SameBits(got, want)) << kv_name<KV>() << " " << label
                                         << ": " << where << " vs " << first;
      }
    }
  }
  softdot::force_simd_target("");
  std::printf("[ attn-rep ] %s %s %s: %d configurations compared\n",
              kv_name<KV>(), label.c_str(), s.str().c_str(), configurations);
  EXPECT_GE(configurations, 2);
}

TEST(AttentionReproducible, ThreadsTargetsLayouts) {
  const Shape prefill{.B = 1,
                      .H = 2,
                      .Hkv = 2,
                      .nq = 300,
                      .nkv = 300,
                      .d = 64,
                      .dv = 64,
                      .seed = 300};
  repro_case<float>("prefill", prefill, {});
  AttentionOptions causal;
  causal.causal = true;
  repro_case<float>("prefill causal", prefill, causal);
  repro_case<BFloat16>("prefill causal", prefill, causal);
  const Shape decode{.B = 1,
                     .H = 8,
                     .Hkv = 2,
                     .nq = 1,
                     .nkv = 5000,
                     .d = 128,
                     .dv = 128,
                     .seed = 301};
  repro_case<float>("decode", decode, {});
  repro_case<Float16>("decode", decode, {});
  AttentionOptions w;
  w.window_left = 3000;
  w.causal = true;
  const std::vector<float> sinks = {0.5f, 1.0f, -1.0f,  2.0f,
                                    0.0f, 3.0f, -kInfF, 1.5f};
  w.sinks = sinks;
  repro_case<float>("decode window sinks", decode, w);
  Shape decode4 = decode;
  decode4.nq = 4;
  decode4.nkv = 2100;
  repro_case<float>("decode 4 rows", decode4, causal);
}

}  // namespace
}  // namespace softdot_test
