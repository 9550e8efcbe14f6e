// Attention tests: ALiBi slopes (AttentionOptions::alibi_slopes) are, bit for
// bit, the bias slope_h (pos_j - pos_i) rounded once to float, in every form
// (decode, verification, prefill, precise, batch_invariant), with positions,
// in attention_weights(), and its errors.
#include "attention_test_util.h"

namespace softdot_test {
namespace {

// The bias ALiBi stands for: [B, H, n_q, n_kv] with query i at position
// q_pos0 + i and key j at kv_pos0 + j, slope_h (pos_j - pos_i) computed in
// double and rounded once to float.
Tensor<float> alibi_bias(std::size_t B, std::size_t H, std::size_t nq,
                         std::size_t nkv, const std::vector<float>& slopes,
                         std::int64_t q_pos0, std::int64_t kv_pos0) {
  Tensor<float> t(B, H, nq, nkv, 0, 0.0f);
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t h = 0; h < H; ++h)
      for (std::size_t i = 0; i < nq; ++i)
        for (std::size_t j = 0; j < nkv; ++j) {
          const auto dist = double(kv_pos0 + std::int64_t(j)) -
                            double(q_pos0 + std::int64_t(i));
          t.at(b, h, i, j) = float(double(slopes[h]) * dist);
        }
  return t;
}

template <class KV>
void alibi_equals_bias(const std::string& label) {
  const std::vector<float> slopes = {0.5f, 0.25f,  0.125f,      0.0625f,
                                     0.0f, -0.03f, 1.0f / 3.0f, 2.0f};
  struct Case {
    const char* name;
    std::size_t nq, nkv;
    std::function<void(AttentionOptions&)> set;
    std::int64_t q_pos0, kv_pos0;  // -1: bottom-right (nkv - nq)
  };
  const std::vector<Case> cases = {
      {"decode causal", 1, 1300, [](AttentionOptions& o) { o.causal = true; },
       -1, 0},
      {"verify causal+window", 4, 1300,
       [](AttentionOptions& o) {
         o.causal = true;
         o.window_left = 400;
       },
       -1, 0},
      {"prefill causal", 37, 700, [](AttentionOptions& o) { o.causal = true; },
       -1, 0},
      {"prefill non-causal softcap", 20, 300,
       [](AttentionOptions& o) { o.softcap = 5.0f; }, -1, 0},
      {"precise", 20, 300,
       [](AttentionOptions& o) {
         o.causal = true;
         o.precise = true;
       },
       -1, 0},
      {"batch_invariant", 37, 1100,
       [](AttentionOptions& o) {
         o.causal = true;
         o.batch_invariant = true;
       },
       -1, 0},
      {"positions", 9, 500,
       [](AttentionOptions& o) {
         o.causal = true;
         o.q_position = 2000;
         o.kv_position = 1600;
       },
       2000, 1600},
  };
  for (const Case& c : cases) {
    Shape s{.B = 2,
            .H = 8,
            .Hkv = 2,
            .nq = c.nq,
            .nkv = c.nkv,
            .d = 64,
            .dv = 32,
            .seed = 3 + c.nq};
    const Problem<KV> p = make_problem<KV>(s);
    AttentionOptions oa;
    c.set(oa);
    AttentionOptions ob = oa;
    oa.alibi_slopes = slopes;
    const std::int64_t q0 =
        c.q_pos0 >= 0 ? c.q_pos0 : std::int64_t(c.nkv) - std::int64_t(c.nq);
    // With positions, the bias columns are key positions from kv_position.
    const std::size_t col0 = std::size_t(c.kv_pos0);
    const Tensor<float> bias0 =
        alibi_bias(s.B, s.H, s.nq, s.nkv, slopes, q0, c.kv_pos0);
    Tensor<float> bias(s.B, s.H, s.nq, col0 + s.nkv, 0, 0.0f);
    for (std::size_t b = 0; b < s.B; ++b)
      for (std::size_t h = 0; h < s.H; ++h)
        for (std::size_t i = 0; i < s.nq; ++i)
          for (std::size_t j = 0; j < s.nkv; ++j)
            bias.at(b, h, i, col0 + j) = bias0.at(b, h, i, j);
    ob.bias = bias.cview();
    for (int threads : {1, 2}) {
      const Result ra = with_threads(threads, [&] { return run(p, oa); });
      const Result rb = with_threads(threads, [&] { return run(p, ob); });
      EXPECT_TRUE(SameBits(ra.all(), rb.all()))
          << label << " " << c.name << ", " << threads
          << " threads: ALiBi differs from its bias";
    }
    if constexpr (std::is_same_v<KV, float>) {
      if (!oa.precise) {
        // attention_weights(): the same weights.
        Tensor<float> wa(s.B, s.H, s.nq, s.nkv, 0, 0.0f),
            wb(s.B, s.H, s.nq, s.nkv, 0, 0.0f);
        softdot::attention_weights(p.q.cview(), p.k.cview(), wa.view(), oa);
        softdot::attention_weights(p.q.cview(), p.k.cview(), wb.view(), ob);
        EXPECT_TRUE(SameBits(wa.dense(), wb.dense()))
            << label << " " << c.name << ": attention_weights differs";
      }
    }
  }
}

TEST(AttentionAlibi, F32EqualsItsBias) { alibi_equals_bias<float>("f32"); }
TEST(AttentionAlibi, BF16EqualsItsBias) { alibi_equals_bias<BFloat16>("bf16"); }

// Within the bound of the exact attention with that bias (the reference
// takes the bias tensor).
TEST(AttentionAlibi, WithinBound) {
  const std::vector<float> slopes = {0.5f, 0.25f, 0.125f, 0.0625f};
  for (const std::size_t nq : {1, 40}) {
    Shape s{.B = 1,
            .H = 4,
            .Hkv = 1,
            .nq = nq,
            .nkv = 900,
            .d = 64,
            .dv = 64,
            .seed = 9};
    AttentionOptions o;
    o.causal = true;
    o.alibi_slopes = slopes;
    const Problem<float> p = make_problem<float>(s);
    const Tensor<float> bias =
        alibi_bias(1, 4, nq, 900, slopes, std::int64_t(900 - nq), 0);
    AttentionOptions ref_o = o;
    ref_o.alibi_slopes = {};
    ref_o.bias = bias.cview();
    const AttnRef ref = reference(p, ref_o);
    Stats st;
    const Result r = run(p, o);
    check_output(ref, r.o, r.lse.data(), "alibi nq " + std::to_string(nq), st);
  }
}

TEST(AttentionAlibi, BadSlopesAreErrors) {
  Shape s{.B = 1, .H = 2, .Hkv = 1, .nq = 3, .nkv = 5, .d = 8, .dv = 8};
  const Problem<float> p = make_problem<float>(s);
  Tensor<float> out(1, 2, 3, 8, 0, kOutSentinel);
  auto expect = [&](const std::string& what, const AttentionOptions& o,
                    const std::vector<std::string>& needles) {
    std::vector<std::string> n = needles;
    n.insert(n.begin(), "attention");
    expect_invalid(
        what,
        [&] {
          softdot::attention(p.q.cview(), p.k.cview(), p.v.cview(), out.view(),
                             o);
        },
        n);
    EXPECT_TRUE(padding_intact(out, kOutSentinel));
    for (float x : out.dense())
      if (bits(x) != bits(kOutSentinel)) {
        ADD_FAILURE() << what << ": out written";
        break;
      }
  };
  const std::vector<float> one = {0.5f}, nan = {0.5f, kNaNF},
                           two = {0.5f, 0.25f};
  AttentionOptions o;
  o.alibi_slopes = one;
  expect("too few", o, {"alibi_slopes has 1 values", "2 heads"});
  o.alibi_slopes = nan;
  expect("NaN", o, {"alibi_slopes[1] = nan", "finite"});
  const Tensor<float> bias(1, 2, 3, 5, 0, 0.0f);
  o.alibi_slopes = two;
  o.bias = bias.cview();
  expect("with a bias", o, {"alibi_slopes cannot be combined with a bias"});
}

}  // namespace
}  // namespace softdot_test
