// Attention tests: AttentionOptions::precise (scores in double, carried as
// hi + lo into exp). Every case checks each output element and lse against
// the long-double reference within the precise bound (the reference's D_i
// for precise: no u |s| term, attention_reference.h), on every target, and
// that every FMA target gives the same bits. Scores near +-100 are where the
// default mode's float scores cost hundreds of u W; the precise mode must
// stay within a few u W there (the figure docs/accuracy.md quotes).
#include "attention_test_util.h"

namespace softdot_test {
namespace {

// The bits of attention() with precise on every FMA target are the same.
template <class KV>
void same_bits_on_fma_targets(const Problem<KV>& p, const AttentionOptions& o,
                              const std::string& label) {
  std::vector<float> want;
  for (const auto& t : fma_targets()) {
    softdot::force_simd_target(t);
    const std::vector<float> got = run(p, o).all();
    if (want.empty()) {
      want = got;
    } else {
      EXPECT_TRUE(SameBits(got, want)) << label << " [" << t << "]";
    }
  }
  softdot::force_simd_target("");
}

// Q and K uniform in [-10, 10], d = 64, scale 1/8: scores of standard
// deviation about 33, up to about 150 in magnitude.
Shape wide_shape(std::size_t nq, std::size_t nkv, std::uint64_t seed) {
  return Shape{
      .nq = nq, .nkv = nkv, .d = 64, .dv = 64, .qk = 10.0, .seed = seed};
}

TEST(AttentionPrecise, WideScoresFewUW) {
  const auto p = make_problem<float>(wide_shape(100, 300, 31));
  AttentionOptions o;
  o.precise = true;
  const Stats st = accuracy_case<float>("precise, scores to ~150", p, o);
  EXPECT_EQ(st.failures, 0u);
  EXPECT_LE(st.ratio, 8.0) << "precise should stay within a few u W";
  same_bits_on_fma_targets(p, o, "precise wide");
  // The same data without precise: the float scores' rounding shows (so the
  // case does test what precise removes).
  o.precise = false;
  const Stats def = accuracy_case<float>("default, scores to ~150", p, o);
  EXPECT_GT(def.ratio, 4 * st.ratio);
}

TEST(AttentionPrecise, OptionsAndForms) {
  // Causal, window, bias (its add's error goes into lo), mask, sinks,
  // soft-cap (lo dropped: the default's D term), GQA and decode shapes (run
  // in the prefill form), partial ranges, f16 and bf16 K/V.
  AttentionOptions o;
  o.precise = true;
  {
    auto p = make_problem<float>(wide_shape(70, 130, 32));
    AttentionOptions c = o;
    c.causal = true;
    accuracy_case<float>("precise causal", p, c);
    c.window_left = 20;
    accuracy_case<float>("precise causal window 20", p, c);
    Tensor<float> bias(1, 1, 70, 130, 0, 0.0f, 0);
    std::mt19937_64 rng(3);
    std::uniform_real_distribution<double> u(-30, 30);
    bias.for_each([&](float& x) { x = float(u(rng)); });
    bias.at(0, 0, 5, 7) = -std::numeric_limits<float>::infinity();
    AttentionOptions b = o;
    b.bias = bias.cview();
    const Stats st = accuracy_case<float>("precise bias", p, b);
    EXPECT_LE(st.ratio, 8.0);
    const Tensor<bool> mask = random_mask(1, 1, 70, 130, 9);
    AttentionOptions m = o;
    m.mask = mask.cview();
    const std::vector<float> sinks = {40.0f};
    m.sinks = sinks;
    accuracy_case<float>("precise mask sinks", p, m);
    AttentionOptions sc = o;
    sc.softcap = 50.0f;
    accuracy_case<float>("precise softcap 50", p, sc);
    AttentionOptions r = o;
    r.kv_begin = 30;
    r.kv_end = 100;
    accuracy_case<float>("precise kv range", p, r);
    same_bits_on_fma_targets(p, b, "precise bias");
  }
  for (std::size_t nq : {1, 2, 16}) {
    Shape s = wide_shape(nq, 700, 33 + nq);
    s.H = 4;
    s.Hkv = 1;
    const auto p = make_problem<float>(s);
    const Stats st = accuracy_case<float>("precise decode shape", p, o);
    EXPECT_LE(st.ratio, 8.0);
  }
  accuracy_case<Float16>("precise",
                         make_problem<Float16>(wide_shape(40, 90, 35)), o);
  accuracy_case<BFloat16>("precise",
                          make_problem<BFloat16>(wide_shape(40, 90, 36)), o);
}

TEST(AttentionPrecise, MaskedNonFiniteNeverLeaks) {
  // Hidden keys hold inf in K and NaN in V: beyond kv_end, and under a
  // false mask. Their scores are -inf with a low part that must not turn
  // into NaN in exp's correction term.
  auto p = make_problem<float>(wide_shape(40, 80, 37));
  for (std::size_t j = 60; j < 80; ++j) {
    p.k.at(0, 0, j, 3) = std::numeric_limits<float>::infinity();
    p.v.at(0, 0, j, 5) = std::numeric_limits<float>::quiet_NaN();
  }
  p.rewiden();
  AttentionOptions o;
  o.precise = true;
  o.kv_end = 60;
  Stats st = accuracy_case<float>("precise, NaN/inf beyond kv_end", p, o);
  EXPECT_EQ(st.failures, 0u);
  Tensor<bool> mask(1, 1, 40, 80, 0, true);
  for (std::size_t i = 0; i < 40; ++i) {
    for (std::size_t j = 60; j < 80; ++j) mask.at(0, 0, i, j) = false;
  }
  AttentionOptions m;
  m.precise = true;
  m.mask = mask.cview();
  st = accuracy_case<float>("precise, NaN/inf under a false mask", p, m);
  EXPECT_EQ(st.failures, 0u);
  // A -inf bias: the bias add's TwoSum error is NaN there (finite K: a
  // -inf bias on an infinite score is NaN in the reference).
  for (std::size_t j = 60; j < 80; ++j) p.k.at(0, 0, j, 3) = 1.0f;
  p.rewiden();
  Tensor<float> bias(1, 1, 40, 80, 0, 0.0f, 0);
  for (std::size_t i = 0; i < 40; ++i) {
    for (std::size_t j = 60; j < 80; ++j) {
      bias.at(0, 0, i, j) = -std::numeric_limits<float>::infinity();
    }
  }
  AttentionOptions b;
  b.precise = true;
  b.bias = bias.cview();
  st = accuracy_case<float>("precise, NaN V under a -inf bias", p, b);
  EXPECT_EQ(st.failures, 0u);
}

}  // namespace
}  // namespace softdot_test
