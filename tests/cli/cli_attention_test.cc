// `softdot attention`: the real binary on .npy files, its outputs checked
// against the float64 reference of cli_attention_util.h, and its --explain
// text. Bad input: cli_attention_errors_test.cc.
#include "cli_attention_util.h"

namespace softdot_test {
namespace {

using namespace cli_attention;

TEST(CliAttention, OneHeadMatchesFloat64Reference) {
  Files f;
  const Array q = make_array({5, 8}, 1), k = make_array({7, 8}, 2),
              v = make_array({7, 3}, 3);
  f.put("q.npy", f32_npy(q));
  f.put("k.npy", f32_npy(k));
  f.put("v.npy", f32_npy(v));
  const Reference want = reference(q, k, v, {});
  expect_matches_reference({"attention", "--q", f.q, "--k", f.k, "--v", f.v,
                            "-o", f.out, "--lse", f.lse},
                           want, f.out, "(5, 3)", f.lse, "(5,)");
  EXPECT_EQ(f.dir.list(),
            (std::vector<std::string>{"k.npy", "lse.npy", "out.npy", "q.npy",
                                      "v.npy"}));
  // A hand-checked value: the reference's first element is a real number of
  // the right size (guards against a reference that computes nothing).
  EXPECT_GT(want.scale_w[0], 0.1);
}

TEST(CliAttention, ScaleOptionAndSoftcap) {
  Files f;
  const Array q = make_array({4, 6}, 11), k = make_array({9, 6}, 12),
              v = make_array({9, 5}, 13);
  f.put("q.npy", f32_npy(q));
  f.put("k.npy", f32_npy(k));
  f.put("v.npy", f32_npy(v));
  Options o;
  o.scale = 1.5;
  expect_matches_reference({"attention", "--q", f.q, "--k", f.k, "--v", f.v,
                            "--scale", "1.5", "-o", f.out},
                           reference(q, k, v, o), f.out, "(4, 5)");
  o.softcap = 2.5;
  expect_matches_reference({"attention", "--q", f.q, "--k", f.k, "--v", f.v,
                            "--scale", "1.5", "--softcap", "2.5", "-o", f.out},
                           reference(q, k, v, o), f.out, "(4, 5)");
  // The two differ (the cap is active), so the test can tell them apart.
  EXPECT_NE(reference(q, k, v, o).out[0],
            reference(q, k, v, Options{.scale = 1.5}).out[0]);
}

TEST(CliAttention, Causal3x3FirstRowIsV0Exactly) {
  Files f;
  const Array q = make_array({3, 4}, 21), k = make_array({3, 4}, 22),
              v = make_array({3, 2}, 23);
  f.put("q.npy", f32_npy(q));
  f.put("k.npy", f32_npy(k));
  f.put("v.npy", f32_npy(v));
  Options o;
  o.causal = true;
  expect_matches_reference({"attention", "--q", f.q, "--k", f.k, "--v", f.v,
                            "--causal", "-o", f.out, "--lse", f.lse},
                           reference(q, k, v, o), f.out, "(3, 2)", f.lse,
                           "(3,)");
  const std::vector<float> out = read_output(f.out);
  // Query 0 sees only key 0: its weight is exactly 1.
  EXPECT_EQ(out[0], v.values[0]);
  EXPECT_EQ(out[1], v.values[1]);
  // And the last row is the unmasked attention's last row.
  ASSERT_EQ(run_softdot({"attention", "--q", f.q, "--k", f.k, "--v", f.v, "-o",
                         f.dir.path("full.npy")})
                .status,
            0);
  const std::vector<float> full = read_output(f.dir.path("full.npy"));
  EXPECT_NEAR(out[4], full[4], 1e-6);
  EXPECT_NEAR(out[5], full[5], 1e-6);
  EXPECT_NE(out[0], full[0]);
}

TEST(CliAttention, CausalAlignsTheLastQueryWithTheLastKey) {
  // n_q = 2, n_kv = 5: query 0 sees keys 0..3, query 1 all five.
  Files f;
  const Array q = make_array({2, 4}, 31), k = make_array({5, 4}, 32),
              v = make_array({5, 3}, 33);
  f.put("q.npy", f32_npy(q));
  f.put("k.npy", f32_npy(k));
  f.put("v.npy", f32_npy(v));
  Options o;
  o.causal = true;
  const Reference want = reference(q, k, v, o);
  EXPECT_EQ(want.weight[4], 0.0);  // query 0, key 4
  EXPECT_GT(want.weight[3], 0.0);  // query 0, key 3
  expect_matches_reference({"attention", "--q", f.q, "--k", f.k, "--v", f.v,
                            "--causal", "-o", f.out},
                           want, f.out, "(2, 3)");
}

TEST(CliAttention, SlidingWindow) {
  Files f;
  const Array q = make_array({6, 4}, 41), k = make_array({6, 4}, 42),
              v = make_array({6, 2}, 43);
  f.put("q.npy", f32_npy(q));
  f.put("k.npy", f32_npy(k));
  f.put("v.npy", f32_npy(v));
  Options o;
  o.window_left = 2;
  o.window_right = 1;
  expect_matches_reference(
      {"attention", "--q", f.q, "--k", f.k, "--v", f.v, "--window-left", "2",
       "--window-right", "1", "-o", f.out},
      reference(q, k, v, o), f.out, "(6, 2)");
  o.window_right = -1;
  o.causal = true;
  expect_matches_reference({"attention", "--q", f.q, "--k", f.k, "--v", f.v,
                            "--window-left", "2", "--causal", "-o", f.out},
                           reference(q, k, v, o), f.out, "(6, 2)");
}

TEST(CliAttention, MaskFileTrueMeansAttend) {
  Files f;
  const Array q = make_array({3, 4}, 51), k = make_array({4, 4}, 52),
              v = make_array({4, 2}, 53);
  f.put("q.npy", f32_npy(q));
  f.put("k.npy", f32_npy(k));
  f.put("v.npy", f32_npy(v));
  // Row 0 sees keys 1 and 3, row 1 only key 2, row 2 nothing.
  const Array mask{{3, 4}, {0, 1, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0}};
  const std::string m = f.put("mask.npy", bool_npy(mask));
  Options o;
  o.mask = &mask;
  expect_matches_reference({"attention", "--q", f.q, "--k", f.k, "--v", f.v,
                            "--mask", m, "-o", f.out, "--lse", f.lse},
                           reference(q, k, v, o), f.out, "(3, 2)", f.lse,
                           "(3,)");
  const std::vector<float> out = read_output(f.out);
  EXPECT_EQ(out[2], v.values[2 * 2 + 0]);  // row 1 = V[2]
  EXPECT_EQ(out[3], v.values[2 * 2 + 1]);
  EXPECT_EQ(out[4], 0.0f);  // fully masked row: zeros, lse -inf
  EXPECT_EQ(out[5], 0.0f);
  EXPECT_EQ(read_output(f.lse)[2], -std::numeric_limits<float>::infinity());

  // One mask row for every query: [1 x n_kv].
  const Array row{{1, 4}, {1, 1, 0, 1}};
  o.mask = &row;
  expect_matches_reference(
      {"attention", "--q", f.q, "--k", f.k, "--v", f.v, "--mask",
       f.put("row.npy", bool_npy(row)), "-o", f.out},
      reference(q, k, v, o), f.out, "(3, 2)");
}

TEST(CliAttention, BiasFileIsAddedToTheScores) {
  Files f;
  const Array q = make_array({3, 4}, 61), k = make_array({5, 4}, 62),
              v = make_array({5, 3}, 63);
  f.put("q.npy", f32_npy(q));
  f.put("k.npy", f32_npy(k));
  f.put("v.npy", f32_npy(v));
  Array bias = make_array({3, 5}, 64);
  for (float& x : bias.values) x *= 2;
  bias.values[1] = -std::numeric_limits<float>::infinity();  // masks (0, 1)
  const std::string b = f.put("bias.npy", f32_npy(bias));
  Options o;
  o.bias = &bias;
  const Reference want = reference(q, k, v, o);
  EXPECT_EQ(want.weight[1], 0.0);
  expect_matches_reference({"attention", "--q", f.q, "--k", f.k, "--v", f.v,
                            "--bias", b, "-o", f.out, "--lse", f.lse},
                           want, f.out, "(3, 3)", f.lse, "(3,)");
  // Bias and mask together, with --scale.
  const Array mask{{3, 5}, {1, 1, 1, 0, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 0}};
  o.mask = &mask;
  o.scale = 0.75;
  expect_matches_reference(
      {"attention", "--q", f.q, "--k", f.k, "--v", f.v, "--bias", b, "--mask",
       f.put("mask.npy", bool_npy(mask)), "--scale", "0.75", "-o", f.out},
      reference(q, k, v, o), f.out, "(3, 3)");
}

TEST(CliAttention, FourDimensionalGroupedQueryAttention) {
  Files f;
  // batch 2, 6 query heads over 2 k/v heads (3 query heads per k/v head).
  const Array q = make_array({2, 6, 3, 4}, 71);
  const Array k = make_array({2, 2, 5, 4}, 72);
  const Array v = make_array({2, 2, 5, 3}, 73);
  f.put("q.npy", f32_npy(q));
  f.put("k.npy", f32_npy(k));
  f.put("v.npy", f32_npy(v));
  expect_matches_reference({"attention", "--q", f.q, "--k", f.k, "--v", f.v,
                            "-o", f.out, "--lse", f.lse},
                           reference(q, k, v, {}), f.out, "(2, 6, 3, 3)", f.lse,
                           "(2, 6, 3)");
  // A per-batch mask broadcast over heads, a per-head bias broadcast over
  // batch and queries, and causal.
  Array mask = make_array({2, 1, 3, 5}, 74);
  for (float& x : mask.values) x = x > -1 ? 1 : 0;
  const Array bias = make_array({1, 6, 1, 5}, 75);
  Options o;
  o.mask = &mask;
  o.bias = &bias;
  o.causal = true;
  expect_matches_reference({"attention", "--q", f.q, "--k", f.k, "--v", f.v,
                            "--mask", f.put("mask.npy", bool_npy(mask)),
                            "--bias", f.put("bias.npy", f32_npy(bias)),
                            "--causal", "-o", f.out, "--lse", f.lse},
                           reference(q, k, v, o), f.out, "(2, 6, 3, 3)", f.lse,
                           "(2, 6, 3)");
  // A 2-D mask with 4-D q: the same mask for every batch and head.
  const Array mask2{{3, 5}, {1, 0, 1, 1, 1, 1, 1, 0, 1, 1, 0, 1, 1, 1, 1}};
  o = Options{};
  o.mask = &mask2;
  expect_matches_reference(
      {"attention", "--q", f.q, "--k", f.k, "--v", f.v, "--mask",
       f.put("mask2.npy", bool_npy(mask2)), "-o", f.out},
      reference(q, k, v, o), f.out, "(2, 6, 3, 3)");
}

TEST(CliAttention, Float16KeysAndValues) {
  Files f;
  const Array q = make_array({2, 4, 3, 8}, 81);
  const Array k = make_array({2, 1, 6, 8}, 82);
  const Array v = make_array({2, 1, 6, 4}, 83);
  f.put("q.npy", f32_npy(q));
  f.put("k.npy", f16_npy(k));
  f.put("v.npy", f16_npy(v));
  Options o;
  o.causal = true;
  const Reference want = reference(q, k, v, o);
  expect_matches_reference({"attention", "--q", f.q, "--k", f.k, "--v", f.v,
                            "--causal", "-o", f.out},
                           want, f.out, "(2, 4, 3, 4)");
  // The same values as float32: the same result (widening is exact).
  const std::vector<float> half = read_output(f.out);
  f.put("k32.npy", f32_npy(k));
  f.put("v32.npy", f32_npy(v));
  expect_matches_reference(
      {"attention", "--q", f.q, "--k", f.dir.path("k32.npy"), "--v",
       f.dir.path("v32.npy"), "--causal", "-o", f.out},
      want, f.out, "(2, 4, 3, 4)");
  const std::vector<float> single = read_output(f.out);
  ASSERT_EQ(half.size(), single.size());
  for (std::size_t i = 0; i < half.size(); ++i)
    EXPECT_NEAR(half[i], single[i],
                1e-6 * std::max(1.0f, std::fabs(single[i])));
  // Mixed: float16 keys, float32 values.
  expect_matches_reference({"attention", "--q", f.q, "--k", f.k, "--v",
                            f.dir.path("v32.npy"), "--causal", "-o", f.out},
                           want, f.out, "(2, 4, 3, 4)");
}

TEST(CliAttention, ManyKeyBlocksAndLongDecode) {
  // More keys than one block of the online softmax, and a long key range
  // with few queries (the library then splits the keys into chunks).
  Files f;
  const Array q = make_array({1, 4, 70, 16}, 111),
              k = make_array({1, 2, 130, 16}, 112),
              v = make_array({1, 2, 130, 8}, 113);
  f.put("q.npy", f32_npy(q));
  f.put("k.npy", f32_npy(k));
  f.put("v.npy", f32_npy(v));
  Options o;
  o.causal = true;
  expect_matches_reference({"attention", "--q", f.q, "--k", f.k, "--v", f.v,
                            "--causal", "-o", f.out, "--lse", f.lse},
                           reference(q, k, v, o), f.out, "(1, 4, 70, 8)", f.lse,
                           "(1, 4, 70)");

  const Array dq = make_array({2, 4, 2, 16}, 114),
              dk = make_array({2, 1, 1100, 16}, 115),
              dv = make_array({2, 1, 1100, 8}, 116);
  f.put("dq.npy", f32_npy(dq));
  f.put("dk.npy", f16_npy(dk));
  f.put("dv.npy", f16_npy(dv));
  expect_matches_reference(
      {"attention", "--q", f.dir.path("dq.npy"), "--k", f.dir.path("dk.npy"),
       "--v", f.dir.path("dv.npy"), "--causal", "-o", f.out, "--lse", f.lse},
      reference(dq, dk, dv, o), f.out, "(2, 4, 2, 8)", f.lse, "(2, 4, 2)");
}

TEST(CliAttention, ExplainShowsScoresWeightsHeatMapAndOutput) {
  Files f;
  // Scores q_i . k_j * 0.5 with q . k in {0, 1, 2}: exact.
  const Array q{{3, 4}, {1, 0, 0, 0, 0, 1, 0, 0, 1, 1, 0, 0}};
  const Array k{{3, 4}, {1, 0, 0, 0, 0, 1, 0, 0, 1, 1, 0, 0}};
  const Array v{{3, 2}, {1, 2, 3, 4, 5, 6}};
  f.put("q.npy", f32_npy(q));
  f.put("k.npy", f32_npy(k));
  f.put("v.npy", f32_npy(v));
  Options o;
  o.causal = true;
  const Reference want = reference(q, k, v, o);
  const CommandResult r = run_softdot({"attention", "--q", f.q, "--k", f.k,
                                       "--v", f.v, "--causal", "--explain"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err, "");
  const std::string& text = r.out;
  EXPECT_NE(text.find("scale = 0.5 = 1/sqrt(4)"), std::string::npos) << text;
  EXPECT_NE(text.find("causal: query i sees key j only if j <= i"),
            std::string::npos)
      << text;
  // Score rows: q1 . k = [0, 1, 1] * 0.5, key 2 hidden; q2 . k = [1, 1, 2].
  EXPECT_NE(text.find("q1  0.000   0.500  masked\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("q2  0.500   0.500   1.000\n"), std::string::npos)
      << text;
  // Weight rows, from the reference.
  std::string w1 = "q1";
  for (int j = 0; j < 3; ++j) w1 += "  " + fixed(want.weight[3 + j], 3);
  w1 += "  1.000\n";
  EXPECT_NE(text.find(w1), std::string::npos) << w1 << "\n" << text;
  EXPECT_EQ(w1, "q1  0.378  0.622  0.000  1.000\n");
  // Heat map: q0 sees only k0 (weight 1), q1 = [0.378, 0.622, 0].
  EXPECT_NE(text.find("q0  ██····\n"), std::string::npos) << text;
  EXPECT_NE(text.find("q1  ▒▒▓▓··\n"), std::string::npos) << text;
  // Output rows.
  std::string o2 = "o2";
  for (int c = 0; c < 2; ++c) o2 += "  " + fixed(want.out[4 + c], 3);
  EXPECT_NE(text.find(o2 + "\n"), std::string::npos) << o2 << "\n" << text;
  EXPECT_NE(text.find("o0  1.000  2.000\n"), std::string::npos) << text;
  EXPECT_EQ(f.dir.list(),
            (std::vector<std::string>{"k.npy", "q.npy", "v.npy"}));

  // With -o as well: the same text, and the file.
  const CommandResult r2 =
      run_softdot({"attention", "--q", f.q, "--k", f.k, "--v", f.v, "--causal",
                   "--explain", "-o", f.out});
  ASSERT_EQ(r2.status, 0) << r2.err;
  EXPECT_EQ(r2.out, r.out);
  EXPECT_EQ(read_output(f.out).size(), 6u);
}

TEST(CliAttention, ExplainFourDimensionalNamesEachHead) {
  Files f;
  f.put("q.npy", f32_npy(make_array({1, 2, 2, 4}, 91)));
  f.put("k.npy", f32_npy(make_array({1, 1, 3, 4}, 92)));
  f.put("v.npy", f32_npy(make_array({1, 1, 3, 2}, 93)));
  const CommandResult r = run_softdot(
      {"attention", "--q", f.q, "--k", f.k, "--v", f.v, "--explain"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("== batch 0, head 0 (k/v head 0) =="),
            std::string::npos);
  EXPECT_NE(r.out.find("== batch 0, head 1 (k/v head 0) =="),
            std::string::npos);
  EXPECT_NE(r.out.find("grouped-query: query head h uses k/v head h / 2"),
            std::string::npos)
      << r.out;
}

TEST(CliAttention, ExplainShowsTheLibrarysScoresWithBiasAndSoftcap) {
  // The score table is softdot::attention_scores': soft-capped, the bias
  // added, and "masked" wherever the library's score is -inf, a -inf bias
  // included (it hides the key as causal, the window or the mask do).
  Files f;
  const Array q{{3, 4}, {1, 0, 0, 0, 0, 1, 0, 0, 1, 1, 0, 0}};
  const Array v{{3, 2}, {1, 2, 3, 4, 5, 6}};
  const float inf = std::numeric_limits<float>::infinity();
  const Array bias{{3, 3}, {0, -inf, 1, 2, 0, 0, 0, 0, 0.5f}};
  f.put("q.npy", f32_npy(q));
  f.put("k.npy", f32_npy(q));
  f.put("v.npy", f32_npy(v));
  const std::string b = f.put("b.npy", f32_npy(bias));
  Options o;
  o.softcap = 2;
  o.bias = &bias;
  const Reference want = reference(q, q, v, o);
  const CommandResult r =
      run_softdot({"attention", "--q", f.q, "--k", f.k, "--v", f.v, "--bias", b,
                   "--softcap", "2", "--explain"});
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string& text = r.out;
  EXPECT_NE(text.find("(softdot::attention_scores;"), std::string::npos)
      << text;
  // q . k * 0.5 in {0, 0.5, 1}: 2 tanh(0.25) = 0.490, 2 tanh(0.5) = 0.924,
  // plus the bias.
  EXPECT_NE(text.find("q0  0.490  masked  1.490\n"), std::string::npos) << text;
  EXPECT_NE(text.find("q1  2.000   0.490  0.490\n"), std::string::npos) << text;
  EXPECT_NE(text.find("q2  0.490   0.490  1.424\n"), std::string::npos) << text;
  std::string w0 = "q0";
  for (int j = 0; j < 3; ++j) w0 += "  " + fixed(want.weight[j], 3);
  w0 += "  1.000\n";
  EXPECT_EQ(w0, "q0  0.269  0.000  0.731  1.000\n");
  EXPECT_NE(text.find(w0), std::string::npos) << w0 << "\n" << text;
}

}  // namespace
}  // namespace softdot_test
