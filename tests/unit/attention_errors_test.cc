// Attention tests: Argument errors: every message names the argument and both
// shapes.
#include "attention_test_util.h"

namespace softdot_test {
namespace {

// ---- errors ----------------------------------------------------------------

TEST(AttentionErrors, Shapes) {
  std::vector<float> buf(1 << 16, 0.5f);
  std::vector<float> out(1 << 16);
  std::vector<Float16> hbuf(1 << 16, softdot::to_float16(0.5f));
  float* o = out.data();
  const float* d = buf.data();
  using CV = TensorView<const float>;
  using OV = TensorView<float>;
  expect_invalid("q/k d differ",
                 [&] {
                   softdot::attention(CV(d, 1, 1, 4, 13), CV(d, 1, 1, 5, 17),
                                      CV(d, 1, 1, 5, 8), OV(o, 1, 1, 4, 8));
                 },
                 {"13", "17"});
  expect_invalid("k/v n_kv differ",
                 [&] {
                   softdot::attention(CV(d, 1, 1, 4, 8), CV(d, 1, 1, 23, 8),
                                      CV(d, 1, 1, 29, 8), OV(o, 1, 1, 4, 8));
                 },
                 {"23", "29"});
  expect_invalid("k/v n_kv differ (f16)",
                 [&] {
                   using HV = TensorView<const Float16>;
                   softdot::attention(
                       CV(d, 1, 1, 4, 8), HV(hbuf.data(), 1, 1, 23, 8),
                       HV(hbuf.data(), 1, 1, 29, 8), OV(o, 1, 1, 4, 8));
                 },
                 {"23", "29"});
  expect_invalid("H not a multiple of H_kv",
                 [&] {
                   softdot::attention(CV(d, 1, 21, 2, 8), CV(d, 1, 10, 3, 8),
                                      CV(d, 1, 10, 3, 8), OV(o, 1, 21, 2, 8));
                 },
                 {"21", "10"});
  expect_invalid("k/v heads differ",
                 [&] {
                   softdot::attention(CV(d, 1, 12, 2, 8), CV(d, 1, 6, 3, 8),
                                      CV(d, 1, 4, 3, 8), OV(o, 1, 12, 2, 8));
                 },
                 {"6", "4"});
  expect_invalid("batch differs",
                 [&] {
                   softdot::attention(CV(d, 31, 1, 2, 8), CV(d, 37, 1, 3, 8),
                                      CV(d, 37, 1, 3, 8), OV(o, 31, 1, 2, 8));
                 },
                 {"31", "37"});
  expect_invalid("out rows",
                 [&] {
                   softdot::attention(CV(d, 1, 1, 41, 8), CV(d, 1, 1, 3, 8),
                                      CV(d, 1, 1, 3, 8), OV(o, 1, 1, 43, 8));
                 },
                 {"41", "43"});
  expect_invalid("out cols",
                 [&] {
                   softdot::attention(CV(d, 1, 1, 4, 8), CV(d, 1, 1, 3, 8),
                                      CV(d, 1, 1, 3, 47), OV(o, 1, 1, 4, 53));
                 },
                 {"47", "53"});
  expect_invalid("out heads", [&] {
    softdot::attention(CV(d, 1, 4, 4, 8), CV(d, 1, 2, 3, 8), CV(d, 1, 2, 3, 8),
                       OV(o, 1, 2, 4, 8));
  });
  expect_invalid("d = 0", [&] {
    softdot::attention(CV(d, 1, 1, 4, 0), CV(d, 1, 1, 3, 0), CV(d, 1, 1, 3, 8),
                       OV(o, 1, 1, 4, 8));
  });
  expect_invalid("n_q = 0", [&] {
    softdot::attention(CV(d, 1, 1, 0, 8), CV(d, 1, 1, 3, 8), CV(d, 1, 1, 3, 8),
                       OV(o, 1, 1, 0, 8));
  });
  expect_invalid("row stride < cols", [&] {
    softdot::attention(CV(d, 1, 1, 4, 8, 32, 32, 5), CV(d, 1, 1, 3, 8),
                       CV(d, 1, 1, 3, 8), OV(o, 1, 1, 4, 8));
  });
  {
    std::unique_ptr<bool[]> mask(new bool[1 << 14]());
    AttentionOptions mo;
    mo.mask = TensorView<const bool>(mask.get(), 1, 1, 4, 59);
    expect_invalid("mask cols",
                   [&] {
                     softdot::attention(CV(d, 1, 1, 4, 8), CV(d, 1, 1, 61, 8),
                                        CV(d, 1, 1, 61, 8), OV(o, 1, 1, 4, 8),
                                        mo);
                   },
                   {"59", "61"});
    mo.mask = TensorView<const bool>(mask.get(), 1, 1, 67, 5);
    expect_invalid("mask rows",
                   [&] {
                     softdot::attention(CV(d, 1, 1, 71, 8), CV(d, 1, 1, 5, 8),
                                        CV(d, 1, 1, 5, 8), OV(o, 1, 1, 71, 8),
                                        mo);
                   },
                   {"67", "71"});
    mo.mask = TensorView<const bool>(mask.get(), 1, 3, 4, 5);
    expect_invalid("mask heads (neither 1 nor H)", [&] {
      softdot::attention(CV(d, 1, 4, 4, 8), CV(d, 1, 2, 5, 8),
                         CV(d, 1, 2, 5, 8), OV(o, 1, 4, 4, 8), mo);
    });
    mo.mask = TensorView<const bool>(mask.get(), 3, 1, 4, 5);
    expect_invalid("mask batch (neither 1 nor B)", [&] {
      softdot::attention(CV(d, 2, 1, 4, 8), CV(d, 2, 1, 5, 8),
                         CV(d, 2, 1, 5, 8), OV(o, 2, 1, 4, 8), mo);
    });
    AttentionOptions bo;
    bo.bias = CV(d, 1, 1, 4, 73);
    expect_invalid("bias cols",
                   [&] {
                     softdot::attention(CV(d, 1, 1, 4, 8), CV(d, 1, 1, 79, 8),
                                        CV(d, 1, 1, 79, 8), OV(o, 1, 1, 4, 8),
                                        bo);
                   },
                   {"73", "79"});
  }
  {
    const std::vector<float> sinks(11, 0.0f);
    AttentionOptions so;
    so.sinks = sinks;
    expect_invalid("sinks size",
                   [&] {
                     softdot::attention(CV(d, 1, 12, 2, 8), CV(d, 1, 12, 3, 8),
                                        CV(d, 1, 12, 3, 8), OV(o, 1, 12, 2, 8),
                                        so);
                   },
                   {"11", "12"});
  }
  // attention_weights: weights [B, H, n_q, n_kv].
  expect_invalid("weights cols",
                 [&] {
                   softdot::attention_weights(CV(d, 1, 1, 4, 8),
                                              CV(d, 1, 1, 83, 8),
                                              OV(o, 1, 1, 4, 89));
                 },
                 {"83", "89"});
  expect_invalid("weights rows", [&] {
    softdot::attention_weights(CV(d, 1, 1, 4, 8), CV(d, 1, 1, 5, 8),
                               OV(o, 1, 1, 7, 5));
  });
  // attention_scores: scores [B, H, n_q, n_kv], the messages naming the
  // function and the argument.
  std::vector<BFloat16> bbuf(1 << 10, softdot::to_bfloat16(0.5f));
  expect_invalid("scores cols",
                 [&] {
                   softdot::attention_scores(CV(d, 1, 1, 4, 8),
                                             CV(d, 1, 1, 83, 8),
                                             OV(o, 1, 1, 4, 89));
                 },
                 {"softdot::attention_scores", "scores [1, 1, 4, 89]",
                  "scores [1, 1, 4, 83]"});
  expect_invalid("scores rows",
                 [&] {
                   softdot::attention_scores(
                       CV(d, 1, 1, 4, 8), CV(d, 1, 1, 5, 8), OV(o, 1, 1, 7, 5));
                 },
                 {"softdot::attention_scores", "scores [1, 1, 7, 5]"});
  expect_invalid("scores: q/k d differ (bf16)",
                 [&] {
                   softdot::attention_scores(
                       CV(d, 1, 1, 4, 13),
                       TensorView<const BFloat16>(bbuf.data(), 1, 1, 5, 17),
                       OV(o, 1, 1, 4, 5));
                 },
                 {"softdot::attention_scores", "13", "17"});
  expect_invalid("scores: H not a multiple of H_kv (f16)",
                 [&] {
                   softdot::attention_scores(
                       CV(d, 1, 21, 2, 8),
                       TensorView<const Float16>(hbuf.data(), 1, 10, 3, 8),
                       OV(o, 1, 21, 2, 3));
                 },
                 {"softdot::attention_scores", "21", "10"});
  expect_invalid("scores null data",
                 [&] {
                   softdot::attention_scores(CV(d, 1, 1, 4, 8),
                                             CV(d, 1, 1, 5, 8),
                                             OV(nullptr, 1, 1, 4, 5));
                 },
                 {"softdot::attention_scores", "scores", "null"});
  {
    std::unique_ptr<bool[]> mask(new bool[1 << 14]());
    AttentionOptions mo;
    mo.mask = TensorView<const bool>(mask.get(), 1, 1, 4, 59);
    expect_invalid("scores: mask cols",
                   [&] {
                     softdot::attention_scores(CV(d, 1, 1, 4, 8),
                                               CV(d, 1, 1, 61, 8),
                                               OV(o, 1, 1, 4, 61), mo);
                   },
                   {"softdot::attention_scores", "mask", "59", "61"});
    const std::vector<float> sinks(11, 0.0f);
    AttentionOptions so;
    so.sinks = sinks;
    expect_invalid("scores: sinks size",
                   [&] {
                     softdot::attention_scores(CV(d, 1, 12, 2, 8),
                                               CV(d, 1, 12, 3, 8),
                                               OV(o, 1, 12, 2, 3), so);
                   },
                   {"softdot::attention_scores", "sinks", "11", "12"});
  }
  // attention_merge: shapes of o_a, o_b, out equal.
  std::vector<float> la(64, 0.0f), lb(64, 0.0f), lo(64);
  expect_invalid("merge o_b cols",
                 [&] {
                   softdot::attention_merge(CV(d, 1, 1, 4, 97), la.data(),
                                            CV(d, 1, 1, 4, 101), lb.data(),
                                            OV(o, 1, 1, 4, 97), lo.data());
                 },
                 {"97", "101"});
  expect_invalid("merge out rows", [&] {
    softdot::attention_merge(CV(d, 1, 1, 4, 8), la.data(), CV(d, 1, 1, 4, 8),
                             lb.data(), OV(o, 1, 1, 5, 8), lo.data());
  });
}

TEST(AttentionErrors, Options) {
  std::vector<float> buf(4096, 0.5f);
  std::vector<float> out(4096);
  using CV = TensorView<const float>;
  const CV q(buf.data(), 1, 1, 4, 8), k(buf.data(), 1, 1, 5, 8);
  const TensorView<float> o(out.data(), 1, 1, 4, 8);
  const TensorView<float> w(out.data(), 1, 1, 4, 5);
  auto both = [&](const std::string& what, const AttentionOptions& opt) {
    expect_invalid(what, [&] { softdot::attention(q, k, k, o, opt); });
    expect_invalid(what + " (weights)",
                   [&] { softdot::attention_weights(q, k, w, opt); });
    expect_invalid(what + " (scores)",
                   [&] { softdot::attention_scores(q, k, w, opt); },
                   {"softdot::attention_scores"});
  };
  const double inf = std::numeric_limits<double>::infinity();
  for (double scale : {0.0, -0.0, -1.0, inf, -inf, 1e-50, 1e39}) {
    AttentionOptions opt;
    opt.scale = scale;
    both("scale " + fmt(scale), opt);
  }
  for (float cap : {-1.0f, -kInfF, kInfF, kNaNF}) {
    AttentionOptions opt;
    opt.softcap = cap;
    both("softcap " + fmt(cap), opt);
  }
  for (std::ptrdiff_t wdw : {-2, -5, -1000}) {
    AttentionOptions opt;
    opt.window_left = wdw;
    both("window_left " + std::to_string(wdw), opt);
    AttentionOptions opt2;
    opt2.window_right = wdw;
    both("window_right " + std::to_string(wdw), opt2);
  }
  // The valid edge cases are accepted.
  AttentionOptions ok;
  ok.scale = 1e-30;
  ok.window_left = 0;
  ok.window_right = 0;
  ok.softcap = 0;
  EXPECT_NO_THROW(softdot::attention(q, k, k, o, ok));
  EXPECT_NO_THROW(softdot::attention_scores(q, k, w, ok));
}

}  // namespace
}  // namespace softdot_test
