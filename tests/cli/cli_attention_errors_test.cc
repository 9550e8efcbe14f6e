// `softdot attention` on bad input: exit status 2, one line naming the
// problem, no output file left behind; --help; input from standard input.
#include "cli_attention_util.h"

namespace softdot_test {
namespace {

using namespace cli_attention;

TEST(CliAttention, HelpNamesTheOptionsAndTheCausalAlignment) {
  const CommandResult r = run_softdot({"attention", "--help"});
  EXPECT_EQ(r.status, 0);
  EXPECT_NE(r.out.find("Usage: softdot attention"), std::string::npos);
  for (const char* option :
       {"--q", "--k", "--v", "--causal", "--mask", "--bias", "--scale",
        "--window-left", "--window-right", "--softcap", "--lse", "--output",
        "--explain"})
    EXPECT_NE(r.out.find(option), std::string::npos) << option;
  EXPECT_NE(r.out.find("the last query sees the last key"), std::string::npos);
  EXPECT_NE(run_softdot({"--help"}).out.find("attention"), std::string::npos);
}

// --- Errors ---------------------------------------------------------------

struct ErrorCase {
  const char* name;
  std::vector<std::string> args;  // "$D" is the directory; -o is added
  std::string expected;           // the stderr line after "softdot: error: "
  bool add_output = true;
};

std::string substitute(std::string s, const std::string& dir) {
  for (std::size_t p = s.find("$D"); p != std::string::npos;
       p = s.find("$D", p + dir.size()))
    s.replace(p, 2, dir);
  return s;
}

void write_error_inputs(const TempDir& dir) {
  const auto put = [&](const char* name, const std::string& bytes) {
    write_whole_file(dir.path(name), bytes);
  };
  put("q.npy", f32_npy(make_array({3, 4}, 1)));
  put("k.npy", f32_npy(make_array({7, 4}, 2)));
  put("v.npy", f32_npy(make_array({7, 2}, 3)));
  put("k5.npy", f32_npy(make_array({7, 5}, 4)));
  put("v6.npy", f32_npy(make_array({6, 2}, 5)));
  put("q4.npy", f32_npy(make_array({2, 6, 3, 4}, 6)));
  put("k4.npy", f32_npy(make_array({2, 4, 7, 4}, 7)));
  put("k4b.npy", f32_npy(make_array({3, 2, 7, 4}, 8)));
  put("k4ok.npy", f32_npy(make_array({2, 2, 7, 4}, 9)));
  put("v4ok.npy", f32_npy(make_array({2, 2, 7, 2}, 10)));
  put("v4h.npy", f32_npy(make_array({2, 3, 7, 2}, 11)));
  put("q3d.npy", f32_npy(make_array({1, 3, 4}, 12)));
  put("q64.npy",
      make_npy("<f8", "(3, 4)", raw_bytes(std::vector<double>(12, 1.0))));
  put("kint.npy",
      make_npy("<i4", "(7, 4)", raw_bytes(std::vector<std::int32_t>(28, 1))));
  put("mask.npy", bool_npy(Array{{3, 7}, std::vector<float>(21, 1)}));
  put("mask36.npy", bool_npy(Array{{3, 6}, std::vector<float>(18, 1)}));
  put("mask4.npy", bool_npy(Array{{2, 4, 3, 7}, std::vector<float>(168, 1)}));
  put("maskf.npy", f32_npy(make_array({3, 7}, 13)));
  put("bias.npy", f32_npy(make_array({3, 7}, 14)));
  put("bias2.npy", f32_npy(make_array({2, 7}, 15)));
  const std::string good = f32_npy(make_array({3, 4}, 16));
  put("truncated.npy", good.substr(0, good.size() - 3));
  put("text.npy", "1,2,3\n");
  put("q0.npy", make_npy("<f4", "(0, 4)", ""));
  put("k65.npy", f32_npy(make_array({65, 4}, 17)));
  put("v65.npy", f32_npy(make_array({65, 2}, 18)));
}

std::vector<ErrorCase> error_cases() {
  const std::vector<std::string> qkv = {"attention", "--q", "$D/q.npy", "--k",
                                        "$D/k.npy",  "--v", "$D/v.npy"};
  const auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = qkv;
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  return {
      {"d_mismatch",
       {"attention", "--q", "$D/q.npy", "--k", "$D/k5.npy", "--v", "$D/v.npy"},
       "--k has d = 5 but --q has d = 4 (q is [3 x 4], k is [7 x 5])"},
      {"n_kv_mismatch",
       {"attention", "--q", "$D/q.npy", "--k", "$D/k.npy", "--v", "$D/v6.npy"},
       "--v has n_kv = 6 but --k has n_kv = 7 (k is [7 x 4], v is [6 x 2])"},
      {"rank_mismatch",
       {"attention", "--q", "$D/q4.npy", "--k", "$D/k.npy", "--v", "$D/v.npy"},
       "--k is 2-D but --q is 4-D (q is [2 x 6 x 3 x 4], k is [7 x 4]); q, k "
       "and v must all be 2-D [n x d] or all 4-D [batch x heads x n x d]"},
      {"heads_not_multiple",
       {"attention", "--q", "$D/q4.npy", "--k", "$D/k4.npy", "--v",
        "$D/v4ok.npy"},
       "--q has heads = 6, not a multiple of --k's heads = 4 (q is [2 x 6 x 3 "
       "x 4], k is [2 x 4 x 7 x 4]); grouped-query attention shares each k/v "
       "head among heads(q) / heads(k) query heads"},
      {"batch_mismatch",
       {"attention", "--q", "$D/q4.npy", "--k", "$D/k4b.npy", "--v",
        "$D/v4ok.npy"},
       "--k has batch = 3 but --q has batch = 2 (q is [2 x 6 x 3 x 4], k is [3 "
       "x 2 x 7 x 4])"},
      {"v_heads_mismatch",
       {"attention", "--q", "$D/q4.npy", "--k", "$D/k4ok.npy", "--v",
        "$D/v4h.npy"},
       "--v has heads = 3 but --k has heads = 2 (k is [2 x 2 x 7 x 4], v is [2 "
       "x 3 x 7 x 2])"},
      {"three_dimensions",
       {"attention", "--q", "$D/q3d.npy", "--k", "$D/k.npy", "--v", "$D/v.npy"},
       "--q: $D/q3d.npy: shape [1 x 3 x 4] has 3 dimensions; need a 2-D array "
       "[n_q x d] or a 4-D array [batch x heads x n_q x d]"},
      {"no_queries",
       {"attention", "--q", "$D/q0.npy", "--k", "$D/k.npy", "--v", "$D/v.npy"},
       "--q is [0 x 4]: n_q must be at least 1"},
      {"mask_shape", with({"--mask", "$D/mask36.npy"}),
       "--mask is [3 x 6] but the scores are [3 x 7] (q is [3 x 4], k is [7 x "
       "4]); --mask must be [n_q x n_kv] or [batch x heads x n_q x n_kv], with "
       "1 allowed for batch, heads and n_q"},
      {"mask_4d_with_2d_q", with({"--mask", "$D/mask4.npy"}),
       "--mask is [2 x 4 x 3 x 7] but the scores are [3 x 7] (q is [3 x 4], k "
       "is [7 x 4]); --mask must be [n_q x n_kv] or [batch x heads x n_q x "
       "n_kv], with 1 allowed for batch, heads and n_q"},
      {"bias_shape", with({"--bias", "$D/bias2.npy"}),
       "--bias is [2 x 7] but the scores are [3 x 7] (q is [3 x 4], k is [7 x "
       "4]); --bias must be [n_q x n_kv] or [batch x heads x n_q x n_kv], with "
       "1 allowed for batch, heads and n_q"},
      {"missing_file",
       {"attention", "--q", "$D/nope.npy", "--k", "$D/k.npy", "--v",
        "$D/v.npy"},
       "--q: $D/nope.npy: cannot open: No such file or directory"},
      {"missing_mask_file", with({"--mask", "$D/nope.npy"}),
       "--mask: $D/nope.npy: cannot open: No such file or directory"},
      {"q_float64",
       {"attention", "--q", "$D/q64.npy", "--k", "$D/k.npy", "--v", "$D/v.npy"},
       "--q: $D/q64.npy: dtype '<f8' (float64) is not supported; need float32 "
       "'<f4'"},
      {"k_int32",
       {"attention", "--q", "$D/q.npy", "--k", "$D/kint.npy", "--v",
        "$D/v.npy"},
       "--k: $D/kint.npy: dtype '<i4' (int32) is not supported; need float32 "
       "'<f4', float16 '<f2' or int8 '|i1'"},
      {"mask_not_bool", with({"--mask", "$D/maskf.npy"}),
       "--mask: $D/maskf.npy: dtype '<f4' (float32) is not supported; need "
       "bool '|b1'"},
      {"bias_bool", with({"--bias", "$D/mask.npy"}),
       "--bias: $D/mask.npy: dtype '|b1' (bool) is not supported; need "
       "float32 '<f4'"},
      {"truncated",
       {"attention", "--q", "$D/truncated.npy", "--k", "$D/k.npy", "--v",
        "$D/v.npy"},
       "--q: $D/truncated.npy: truncated: shape (3, 4) needs 48 bytes of data, "
       "the file has 45"},
      {"not_npy",
       {"attention", "--q", "$D/q.npy", "--k", "$D/k.npy", "--v",
        "$D/text.npy"},
       "--v: $D/text.npy: not a .npy file (no \\x93NUMPY magic), or truncated"},
      // The option values: the library's messages (the same text as every
      // entry point's, tests/unit/attention_request_test.cc).
      {"scale_zero", with({"--scale", "0"}),
       "attention: scale must be finite and > 0 (also as a float), got 0"},
      {"scale_negative", with({"--scale", "-2"}),
       "attention: scale must be finite and > 0 (also as a float), got -2"},
      {"scale_inf", with({"--scale", "inf"}),
       "attention: scale must be finite and > 0 (also as a float), got inf"},
      {"scale_nan", with({"--scale", "nan"}),
       "attention: scale must be finite and > 0 (also as a float), got nan"},
      {"scale_text", with({"--scale", "half"}),
       "--scale: \"half\" is not a number"},
      {"scale_float_underflow", with({"--scale", "1e-60"}),
       "attention: scale must be finite and > 0 (also as a float), got "
       "1e-60"},
      {"scale_float_overflow", with({"--scale", "1e39"}),
       "attention: scale must be finite and > 0 (also as a float), got "
       "1e+39"},
      {"softcap_negative", with({"--softcap", "-1"}),
       "attention: softcap must be finite and >= 0, got -1"},
      {"softcap_inf", with({"--softcap", "inf"}),
       "attention: softcap must be finite and >= 0, got inf"},
      {"window_negative", with({"--window-left", "-2"}),
       "attention: window_left and window_right must be >= -1, got -2 and "
       "-1"},
      {"window_right_negative", with({"--window-right", "-3"}),
       "attention: window_left and window_right must be >= -1, got -1 and "
       "-3"},
      {"window_text", with({"--window-right", "x"}),
       "--window-right: \"x\" must be a whole number from -1 (no limit) to "
       "999999999"},
      {"explain_too_large",
       {"attention", "--q", "$D/q.npy", "--k", "$D/k65.npy", "--v",
        "$D/v65.npy", "--explain"},
       "--explain prints every number, so it is for small inputs: n_kv = 65 "
       "(q is [3 x 4], k is [65 x 4]), at most 64 (leave out --explain and "
       "use -o)"},
      {"two_stdin",
       {"attention", "--q", "-", "--k", "-", "--v", "$D/v.npy"},
       "only one input can be read from standard input ('-')"},
      {"missing_q",
       {"attention", "--k", "$D/k.npy", "--v", "$D/v.npy"},
       "--q is required (see softdot attention --help)"},
      {"missing_output", qkv,
       "--output is required: -o FILE.npy for the result (only --explain "
       "prints to standard output)",
       false},
      {"unknown_option", with({"--dropout", "0.1"}),
       "unknown option \"--dropout\" (see softdot attention --help)"},
  };
}

void expect_one_error_line(const CommandResult& r, const std::string& want,
                           const char* name) {
  EXPECT_EQ(r.status, 2) << name;
  EXPECT_EQ(r.out, "") << name;
  EXPECT_EQ(r.err, "softdot: error: " + want + "\n") << name;
}

TEST(CliAttention, EveryBadInputIsOneLineStatus2AndNoOutputFile) {
  for (const ErrorCase& c : error_cases()) {
    TempDir dir;
    write_error_inputs(dir);
    const std::string& d = dir.root();
    std::vector<std::string> args;
    for (const std::string& a : c.args) args.push_back(substitute(a, d));
    const std::vector<std::string> before = dir.list();
    if (!c.add_output) {
      expect_one_error_line(run_softdot(args), substitute(c.expected, d),
                            c.name);
      EXPECT_EQ(dir.list(), before) << c.name;
      continue;
    }
    // A new output file (and lse file): none is created, no temporary left.
    std::vector<std::string> with_output = args;
    for (const std::string& extra : {std::string("-o"), dir.path("out.npy"),
                                     std::string("--lse"), dir.path("lse.npy")})
      with_output.push_back(extra);
    expect_one_error_line(run_softdot(with_output), substitute(c.expected, d),
                          c.name);
    EXPECT_EQ(dir.list(), before) << c.name;
    // An existing output file keeps its content.
    write_whole_file(dir.path("out.npy"), "precious");
    expect_one_error_line(run_softdot(with_output), substitute(c.expected, d),
                          c.name);
    EXPECT_EQ(read_whole_file(dir.path("out.npy")), "precious") << c.name;
  }
}

TEST(CliAttention, OutputErrorsLeaveNothingBehind) {
  TempDir dir;
  write_error_inputs(dir);
  const std::vector<std::string> before = dir.list();
  const std::vector<std::string> qkv = {
      "attention",       "--q", dir.path("q.npy"), "--k",
      dir.path("k.npy"), "--v", dir.path("v.npy")};
  const auto run_with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = qkv;
    a.insert(a.end(), extra.begin(), extra.end());
    return run_softdot(a);
  };
  expect_one_error_line(run_with({"-o", dir.path("out.csv")}),
                        "--output \"" + dir.path("out.csv") +
                            "\": unknown file type; the name must end in .npy",
                        "csv");
  expect_one_error_line(
      run_with({"-o", "-"}),
      "--output \"-\": unknown file type; the name must end in .npy", "dash");
  expect_one_error_line(
      run_with({"-o", dir.path("no/dir/out.npy")}),
      dir.path("no/dir/out.npy") +
          ": cannot create a file there: No such file or directory",
      "no_dir");
  // A bad --lse is found before -o is written.
  expect_one_error_line(
      run_with({"-o", dir.path("out.npy"), "--lse", dir.path("no/lse.npy")}),
      dir.path("no/lse.npy") +
          ": cannot create a file there: No such file or directory",
      "lse_no_dir");
  expect_one_error_line(
      run_with({"-o", dir.path("out.npy"), "--lse", dir.path("out.npy")}),
      "--lse and --output name the same file \"" + dir.path("out.npy") + "\"",
      "same");
  EXPECT_EQ(dir.list(), before);
}

TEST(CliAttention, InputFromStandardInput) {
  Files f;
  const Array q = make_array({2, 4}, 101), k = make_array({3, 4}, 102),
              v = make_array({3, 2}, 103);
  f.put("k.npy", f32_npy(k));
  f.put("v.npy", f32_npy(v));
  const CommandResult r = run_softdot(
      {"attention", "--q", "-", "--k", f.k, "--v", f.v, "-o", f.out},
      f32_npy(q));
  ASSERT_EQ(r.status, 0) << r.err;
  const Reference want = reference(q, k, v, {});
  const std::vector<float> got = read_output(f.out);
  ASSERT_EQ(got.size(), want.out.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want.out[i],
                kTolerance * std::max(std::fabs(want.out[i]), want.scale_w[i]));
}

}  // namespace
}  // namespace softdot_test
