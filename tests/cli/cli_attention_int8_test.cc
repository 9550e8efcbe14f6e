// `softdot attention` with int8 keys and values: int8 .npy files with their
// float32 scales (--k-scales, --v-scales), and --kv int8 (float keys and
// values quantised by the command). The outputs are checked bit for bit
// against the command's float32 run on the dequantised values (scale *
// value rounded to float, computed here), which the library promises, and
// against the float64 reference; the quantisation of --kv int8 against the
// rule of attention.h written out here. Bad input: one line, status 2, no
// output file.
#include <cstring>
#include <type_traits>

#include "cli_attention_util.h"
#include "softdot/float8.h"

namespace softdot_test {
namespace {

using namespace cli_attention;

// int8 values and their scales, [..., n, d] and [..., n, 1].
struct Int8Array {
  std::vector<std::size_t> shape;
  std::vector<std::int8_t> values;
  std::vector<float> scales;

  std::vector<std::size_t> scale_shape() const {
    std::vector<std::size_t> s = shape;
    s.back() = 1;
    return s;
  }
  // scale * value, rounded once to float (the library's dequantised value).
  Array dequantised() const {
    Array a{shape, {}};
    const std::size_t d = shape.back();
    for (std::size_t i = 0; i < values.size(); ++i)
      a.values.push_back(scales[i / d] * static_cast<float>(values[i]));
    return a;
  }
};

std::string i8_npy(const std::vector<std::size_t>& shape,
                   const std::vector<std::int8_t>& values) {
  std::string data(values.size(), '\0');
  std::memcpy(data.data(), values.data(), values.size());
  return make_npy("|i1", npy_shape(shape), data);
}

// Deterministic int8 values in [-127, 127] and scales of a few magnitudes
// (one row with scale 0, whose values must read as zeros).
Int8Array make_int8(std::vector<std::size_t> shape, std::uint32_t seed) {
  Int8Array a;
  a.shape = std::move(shape);
  std::size_t n = 1;
  for (std::size_t x : a.shape) n *= x;
  std::uint32_t s = seed;
  for (std::size_t i = 0; i < n; ++i) {
    s = s * 1664525u + 1013904223u;
    a.values.push_back(
        static_cast<std::int8_t>(static_cast<int>((s >> 16) % 255u) - 127));
  }
  const std::size_t rows = n / a.shape.back();
  for (std::size_t r = 0; r < rows; ++r) {
    s = s * 1664525u + 1013904223u;
    const float mantissa =
        1.0f + static_cast<float>((s >> 12) % 1000u) / 997.0f;
    a.scales.push_back(r == 1 ? 0.0f : mantissa * 0.01f);
  }
  return a;
}

// The rule of attention.h for quantize_kv, written out: scale = max|x| / 127
// in float, value = round(x / scale), ties away from zero (std::round).
Int8Array quantize(const Array& x) {
  Int8Array a;
  a.shape = x.shape;
  const std::size_t d = x.shape.back();
  for (std::size_t r = 0; r * d < x.values.size(); ++r) {
    float amax = 0;
    for (std::size_t c = 0; c < d; ++c)
      amax = std::max(amax, std::fabs(x.values[r * d + c]));
    const float scale = amax / 127.0f;
    a.scales.push_back(scale);
    for (std::size_t c = 0; c < d; ++c) {
      const float t =
          scale == 0 ? 0.0f : std::round(x.values[r * d + c] / scale);
      a.values.push_back(static_cast<std::int8_t>(t));
    }
  }
  return a;
}

std::vector<std::uint32_t> bits_of(const std::vector<float>& v) {
  std::vector<std::uint32_t> b(v.size());
  if (!v.empty()) std::memcpy(b.data(), v.data(), v.size() * sizeof(float));
  return b;
}

// Runs the command and returns the bits of -o (and --lse when lse_path).
std::vector<std::uint32_t> run_bits(const std::vector<std::string>& args,
                                    const std::string& out_path) {
  const CommandResult r = run_softdot(args);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err, "");
  return bits_of(read_output(out_path));
}

TEST(CliAttentionInt8, Int8FilesEqualTheFloatRunOnTheDequantisedValues) {
  Files f;
  const Array q = make_array({2, 4, 3, 8}, 201);
  const Int8Array k = make_int8({2, 2, 6, 8}, 202);
  const Int8Array v = make_int8({2, 2, 6, 4}, 203);
  f.put("q.npy", f32_npy(q));
  f.put("k8.npy", i8_npy(k.shape, k.values));
  f.put("v8.npy", i8_npy(v.shape, v.values));
  f.put("ks.npy", f32_npy(Array{k.scale_shape(), k.scales}));
  f.put("vs.npy", f32_npy(Array{v.scale_shape(), v.scales}));
  const Array kd = k.dequantised(), vd = v.dequantised();
  f.put("kd.npy", f32_npy(kd));
  f.put("vd.npy", f32_npy(vd));
  Options o;
  o.causal = true;
  const Reference want = reference(q, kd, vd, o);
  const std::vector<std::string> int8_args = {"attention",
                                              "--q",
                                              f.q,
                                              "--k",
                                              f.dir.path("k8.npy"),
                                              "--v",
                                              f.dir.path("v8.npy"),
                                              "--k-scales",
                                              f.dir.path("ks.npy"),
                                              "--v-scales",
                                              f.dir.path("vs.npy"),
                                              "--causal",
                                              "-o",
                                              f.out,
                                              "--lse",
                                              f.lse};
  expect_matches_reference(int8_args, want, f.out, "(2, 4, 3, 4)", f.lse,
                           "(2, 4, 3)");
  const std::vector<std::uint32_t> out8 = bits_of(read_output(f.out));
  const std::vector<std::uint32_t> lse8 = bits_of(read_output(f.lse));
  expect_matches_reference(
      {"attention", "--q", f.q, "--k", f.dir.path("kd.npy"), "--v",
       f.dir.path("vd.npy"), "--causal", "-o", f.out, "--lse", f.lse},
      want, f.out, "(2, 4, 3, 4)", f.lse, "(2, 4, 3)");
  EXPECT_EQ(out8, bits_of(read_output(f.out)));
  EXPECT_EQ(lse8, bits_of(read_output(f.lse)));
  // The zero scale of row 1 made its keys zeros: its score is exactly 0
  // (visible in the reference's weights as the same weight for rows whose
  // scores are equal); and the values are far from their dequantised size
  // without scales, so a command ignoring the scales would fail above.
  EXPECT_EQ(kd.values[8], 0.0f);
  EXPECT_NE(k.values[8], 0);
}

TEST(CliAttentionInt8, TwoDimensionalWithMaskBiasAndWindow) {
  Files f;
  const Array q = make_array({5, 8}, 211);
  const Int8Array k = make_int8({9, 8}, 212);
  const Int8Array v = make_int8({9, 3}, 213);
  f.put("q.npy", f32_npy(q));
  f.put("k8.npy", i8_npy(k.shape, k.values));
  f.put("v8.npy", i8_npy(v.shape, v.values));
  f.put("ks.npy", f32_npy(Array{k.scale_shape(), k.scales}));
  f.put("vs.npy", f32_npy(Array{v.scale_shape(), v.scales}));
  f.put("kd.npy", f32_npy(k.dequantised()));
  f.put("vd.npy", f32_npy(v.dequantised()));
  Array mask = make_array({5, 9}, 214);
  for (float& m : mask.values) m = m > -1.5f ? 1.0f : 0.0f;
  f.put("mask.npy", bool_npy(mask));
  f.put("bias.npy", f32_npy(make_array({1, 9}, 215)));
  const std::vector<std::string> options = {"--mask",
                                            f.dir.path("mask.npy"),
                                            "--bias",
                                            f.dir.path("bias.npy"),
                                            "--window-left",
                                            "5",
                                            "--softcap",
                                            "3",
                                            "-o",
                                            f.out};
  std::vector<std::string> a8 = {"attention",
                                 "--q",
                                 f.q,
                                 "--k",
                                 f.dir.path("k8.npy"),
                                 "--v",
                                 f.dir.path("v8.npy"),
                                 "--k-scales",
                                 f.dir.path("ks.npy"),
                                 "--v-scales",
                                 f.dir.path("vs.npy")};
  std::vector<std::string> af = {
      "attention",         "--q", f.q, "--k", f.dir.path("kd.npy"), "--v",
      f.dir.path("vd.npy")};
  a8.insert(a8.end(), options.begin(), options.end());
  af.insert(af.end(), options.begin(), options.end());
  const std::vector<std::uint32_t> out8 = run_bits(a8, f.out);
  EXPECT_EQ(out8, run_bits(af, f.out));
  EXPECT_EQ(out8.size(), 15u);
}

TEST(CliAttentionInt8, KvInt8QuantisesAsTheRuleSays) {
  Files f;
  const Array q = make_array({2, 4, 5, 16}, 221);
  Array k = make_array({2, 2, 70, 16}, 222);
  const Array v = make_array({2, 2, 70, 8}, 223);
  for (std::size_t i = 0; i < k.values.size(); i += 7) k.values[i] *= 3;
  f.put("q.npy", f32_npy(q));
  f.put("k.npy", f32_npy(k));
  f.put("v.npy", f32_npy(v));
  const std::vector<std::uint32_t> quantised =
      run_bits({"attention", "--q", f.q, "--k", f.k, "--v", f.v, "--kv", "int8",
                "-o", f.out},
               f.out);
  // The same K and V quantised here, as int8 files with their scales.
  const Int8Array k8 = quantize(k), v8 = quantize(v);
  f.put("k8.npy", i8_npy(k8.shape, k8.values));
  f.put("v8.npy", i8_npy(v8.shape, v8.values));
  f.put("ks.npy", f32_npy(Array{k8.scale_shape(), k8.scales}));
  f.put("vs.npy", f32_npy(Array{v8.scale_shape(), v8.scales}));
  EXPECT_EQ(
      quantised,
      run_bits({"attention", "--q", f.q, "--k", f.dir.path("k8.npy"), "--v",
                f.dir.path("v8.npy"), "--k-scales", f.dir.path("ks.npy"),
                "--v-scales", f.dir.path("vs.npy"), "-o", f.out},
               f.out));
  // Which is the float run on the dequantised values, and differs from the
  // float run on the original ones (the quantisation is real).
  f.put("kd.npy", f32_npy(k8.dequantised()));
  f.put("vd.npy", f32_npy(v8.dequantised()));
  EXPECT_EQ(quantised,
            run_bits({"attention", "--q", f.q, "--k", f.dir.path("kd.npy"),
                      "--v", f.dir.path("vd.npy"), "-o", f.out},
                     f.out));
  const std::vector<std::uint32_t> exact = run_bits(
      {"attention", "--q", f.q, "--k", f.k, "--v", f.v, "-o", f.out}, f.out);
  EXPECT_NE(quantised, exact);
  // float16 files hold these values exactly: the same quantisation.
  f.put("k16.npy", f16_npy(k));
  f.put("v16.npy", f16_npy(v));
  EXPECT_EQ(
      quantised,
      run_bits({"attention", "--q", f.q, "--k", f.dir.path("k16.npy"), "--v",
                f.dir.path("v16.npy"), "--kv", "int8", "-o", f.out},
               f.out));
}

// --kv float8_e4m3fn / float8_e5m2: each row quantised as write_kv writes
// fp8 pages with scales (scale = max |x| / 448 or 57344 in float, value
// x / scale rounded to nearest even, the quotient in double), written out
// here with the public conversions; the output is the float run on the
// dequantised values, bit for bit, and differs from the exact run.
template <class T>
Array fp8_dequantised(const Array& x, float fmax) {
  Array a{x.shape, {}};
  const std::size_t d = x.shape.back();
  for (std::size_t r = 0; r * d < x.values.size(); ++r) {
    float amax = 0;
    for (std::size_t c = 0; c < d; ++c)
      amax = std::max(amax, std::fabs(x.values[r * d + c]));
    const float scale = amax / fmax;
    for (std::size_t c = 0; c < d; ++c) {
      float v = 0;
      if (scale != 0) {
        const double t = double(x.values[r * d + c]) / scale;
        if constexpr (std::is_same_v<T, softdot::Float8E4M3>) {
          v = softdot::to_float(softdot::to_float8_e4m3(t));
        } else {
          v = softdot::to_float(softdot::to_float8_e5m2(t));
        }
      }
      a.values.push_back(v * scale);
    }
  }
  return a;
}

TEST(CliAttentionInt8, KvFloat8QuantisesAsWriteKv) {
  Files f;
  const Array q = make_array({2, 4, 5, 16}, 241);
  Array k = make_array({2, 2, 70, 16}, 242);
  const Array v = make_array({2, 2, 70, 8}, 243);
  for (std::size_t i = 0; i < k.values.size(); i += 7) k.values[i] *= 3;
  f.put("q.npy", f32_npy(q));
  f.put("k.npy", f32_npy(k));
  f.put("v.npy", f32_npy(v));
  const std::vector<std::uint32_t> exact = run_bits(
      {"attention", "--q", f.q, "--k", f.k, "--v", f.v, "-o", f.out}, f.out);
  const auto check = [&](const char* format, const Array& kd, const Array& vd) {
    const std::vector<std::uint32_t> quantised =
        run_bits({"attention", "--q", f.q, "--k", f.k, "--v", f.v, "--kv",
                  format, "-o", f.out},
                 f.out);
    f.put("kd.npy", f32_npy(kd));
    f.put("vd.npy", f32_npy(vd));
    EXPECT_EQ(quantised,
              run_bits({"attention", "--q", f.q, "--k", f.dir.path("kd.npy"),
                        "--v", f.dir.path("vd.npy"), "-o", f.out},
                       f.out))
        << format;
    EXPECT_NE(quantised, exact) << format;
    const CommandResult r = run_softdot({"attention", "--q", f.q, "--k", f.k,
                                         "--v", f.v, "--kv", format, "--ring"});
    EXPECT_EQ(r.status, 2) << format;
  };
  check("float8_e4m3fn", fp8_dequantised<softdot::Float8E4M3>(k, 448.0f),
        fp8_dequantised<softdot::Float8E4M3>(v, 448.0f));
  check("float8_e5m2", fp8_dequantised<softdot::Float8E5M2>(k, 57344.0f),
        fp8_dequantised<softdot::Float8E5M2>(v, 57344.0f));
}

TEST(CliAttentionInt8, ExplainSaysHowTheKeysAreStored) {
  Files f;
  const Array q = make_array({2, 4}, 231), k = make_array({3, 4}, 232),
              v = make_array({3, 2}, 233);
  f.put("q.npy", f32_npy(q));
  f.put("k.npy", f32_npy(k));
  f.put("v.npy", f32_npy(v));
  CommandResult r = run_softdot({"attention", "--q", f.q, "--k", f.k, "--v",
                                 f.v, "--kv", "int8", "--explain"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("--kv int8: each key/value row is quantised to int8 "
                       "values and one scale (max |x| / 127)"),
            std::string::npos)
      << r.out;
  const Int8Array k8 = quantize(k), v8 = quantize(v);
  f.put("k8.npy", i8_npy(k8.shape, k8.values));
  f.put("v8.npy", i8_npy(v8.shape, v8.values));
  f.put("ks.npy", f32_npy(Array{k8.scale_shape(), k8.scales}));
  f.put("vs.npy", f32_npy(Array{v8.scale_shape(), v8.scales}));
  const CommandResult r8 =
      run_softdot({"attention", "--q", f.q, "--k", f.dir.path("k8.npy"), "--v",
                   f.dir.path("v8.npy"), "--k-scales", f.dir.path("ks.npy"),
                   "--v-scales", f.dir.path("vs.npy"), "--explain"});
  ASSERT_EQ(r8.status, 0) << r8.err;
  EXPECT_NE(r8.out.find("int8 keys/values: each row is its scale "
                        "(--k-scales, --v-scales) times its int8 values"),
            std::string::npos)
      << r8.out;
  // The tables are the same numbers: only the line on the storage differs.
  const auto tables = [](const std::string& s) {
    return s.substr(s.find("scale = "));
  };
  EXPECT_EQ(tables(r.out), tables(r8.out));
}

TEST(CliAttentionInt8, HelpNamesTheOptions) {
  const CommandResult r = run_softdot({"attention", "--help"});
  EXPECT_EQ(r.status, 0);
  for (const char* option : {"--k-scales", "--v-scales", "--kv"})
    EXPECT_NE(r.out.find(option), std::string::npos) << option;
}

// --- Errors ---------------------------------------------------------------

struct ErrorCase {
  const char* name;
  std::vector<std::string> args;  // "$D" is the directory
  std::string expected;           // the stderr line after "softdot: error: "
};

std::string substitute(std::string s, const std::string& dir) {
  for (std::size_t p = s.find("$D"); p != std::string::npos;
       p = s.find("$D", p + dir.size()))
    s.replace(p, 2, dir);
  return s;
}

void write_inputs(const TempDir& dir) {
  const auto put = [&](const char* name, const std::string& bytes) {
    write_whole_file(dir.path(name), bytes);
  };
  put("q.npy", f32_npy(make_array({3, 4}, 1)));
  put("k.npy", f32_npy(make_array({7, 4}, 2)));
  put("v.npy", f32_npy(make_array({7, 2}, 3)));
  const Int8Array k = make_int8({7, 4}, 4), v = make_int8({7, 2}, 5);
  put("k8.npy", i8_npy(k.shape, k.values));
  put("v8.npy", i8_npy(v.shape, v.values));
  put("ks.npy", f32_npy(Array{{7, 1}, k.scales}));
  put("vs.npy", f32_npy(Array{{7, 1}, v.scales}));
  put("ks7.npy", f32_npy(Array{{7}, k.scales}));
  put("ks6.npy", f32_npy(Array{{6, 1}, std::vector<float>(6, 1.0f)}));
  put("ks4d.npy", f32_npy(Array{{1, 1, 7, 1}, k.scales}));
  put("ks64.npy",
      make_npy("<f8", "(7, 1)", raw_bytes(std::vector<double>(7, 1.0))));
  std::vector<float> bad = k.scales;
  bad[5] = -0.5f;
  put("ksneg.npy", f32_npy(Array{{7, 1}, bad}));
  bad[5] = std::numeric_limits<float>::quiet_NaN();
  put("ksnan.npy", f32_npy(Array{{7, 1}, bad}));
  Array kinf = make_array({7, 4}, 6);
  kinf.values[13] = std::numeric_limits<float>::infinity();
  put("kinf.npy", f32_npy(kinf));
}

std::vector<ErrorCase> error_cases() {
  const std::vector<std::string> int8_qkv = {
      "attention", "--q", "$D/q.npy", "--k", "$D/k8.npy", "--v", "$D/v8.npy"};
  const auto with = [&](std::vector<std::string> base,
                        std::vector<std::string> extra) {
    base.insert(base.end(), extra.begin(), extra.end());
    return base;
  };
  const std::vector<std::string> vs = {"--v-scales", "$D/vs.npy"};
  return {
      {"int8_k_float_v",
       {"attention", "--q", "$D/q.npy", "--k", "$D/k8.npy", "--v", "$D/v.npy",
        "--k-scales", "$D/ks.npy"},
       "--k $D/k8.npy is int8 but --v $D/v.npy is float32 '<f4'; int8 keys "
       "and values go together, each with its scales (--k-scales, "
       "--v-scales)"},
      {"no_k_scales", with(int8_qkv, vs),
       "--k $D/k8.npy is int8 and needs its scales: --k-scales FILE.npy, "
       "float32 [n_kv x 1] or [batch x kv_heads x n_kv x 1]"},
      {"no_v_scales", with(int8_qkv, {"--k-scales", "$D/ks.npy"}),
       "--v $D/v8.npy is int8 and needs its scales: --v-scales FILE.npy, "
       "float32 [n_kv x 1] or [batch x kv_heads x n_kv x 1]"},
      {"scales_for_float_keys",
       {"attention", "--q", "$D/q.npy", "--k", "$D/k.npy", "--v", "$D/v.npy",
        "--k-scales", "$D/ks.npy"},
       "--k-scales is for int8 keys, but --k $D/k.npy is float32 '<f4'"},
      {"scales_1d",
       with(int8_qkv, {"--k-scales", "$D/ks7.npy", "--v-scales", "$D/vs.npy"}),
       "--k-scales: $D/ks7.npy: shape [7] has 1 dimension; need a 2-D array "
       "[n_kv x 1] or a 4-D array [batch x kv_heads x n_kv x 1]"},
      {"scales_rows",
       with(int8_qkv, {"--k-scales", "$D/ks6.npy", "--v-scales", "$D/vs.npy"}),
       "--k-scales is [6 x 1] but --k is [7 x 4]; --k-scales must be "
       "[7 x 1], one scale per row of --k"},
      {"scales_rank",
       with(int8_qkv, {"--k-scales", "$D/ks4d.npy", "--v-scales", "$D/vs.npy"}),
       "--k-scales is [1 x 1 x 7 x 1] but --k is [7 x 4]; --k-scales must be "
       "[7 x 1], one scale per row of --k"},
      {"scales_float64",
       with(int8_qkv, {"--k-scales", "$D/ks64.npy", "--v-scales", "$D/vs.npy"}),
       "--k-scales: $D/ks64.npy: dtype '<f8' (float64) is not supported; "
       "need float32 '<f4'"},
      {"scale_negative",
       with(int8_qkv,
            {"--k-scales", "$D/ksneg.npy", "--v-scales", "$D/vs.npy"}),
       "--k-scales: $D/ksneg.npy: the scale at [5, 0] is -0.5; scales must "
       "be finite and >= 0"},
      {"scale_nan",
       with(int8_qkv,
            {"--k-scales", "$D/ks.npy", "--v-scales", "$D/ksnan.npy"}),
       "--v-scales: $D/ksnan.npy: the scale at [5, 0] is nan; scales must be "
       "finite and >= 0"},
      {"kv_unknown",
       {"attention", "--q", "$D/q.npy", "--k", "$D/k.npy", "--v", "$D/v.npy",
        "--kv", "int4"},
       "--kv: \"int4\" is not a key/value format; the ones there are: int8, "
       "float8_e4m3fn, float8_e5m2 (leave out --kv to use the files' own "
       "dtypes)"},
      {"kv_int8_of_int8",
       with(int8_qkv, {"--k-scales", "$D/ks.npy", "--v-scales", "$D/vs.npy",
                       "--kv", "int8"}),
       "--kv int8 quantises float32 or float16 keys and values, but --k "
       "$D/k8.npy is int8 already (give its scales with --k-scales and "
       "--v-scales instead)"},
      {"kv_fp8_inf",
       {"attention", "--q", "$D/q.npy", "--k", "$D/kinf.npy", "--v", "$D/v.npy",
        "--kv", "float8_e5m2"},
       "--k: $D/kinf.npy: the value at [3, 1] is inf; --kv float8_e5m2 "
       "quantises finite values only"},
      {"kv_int8_inf",
       {"attention", "--q", "$D/q.npy", "--k", "$D/kinf.npy", "--v", "$D/v.npy",
        "--kv", "int8"},
       "--k: $D/kinf.npy: the value at [3, 1] is inf; --kv int8 quantises "
       "finite values only"},
      {"two_stdin", with(int8_qkv, {"--k-scales", "-", "--v-scales", "-"}),
       "only one input can be read from standard input ('-')"},
  };
}

TEST(CliAttentionInt8, EveryBadInputIsOneLineStatus2AndNoOutputFile) {
  for (const ErrorCase& c : error_cases()) {
    TempDir dir;
    write_inputs(dir);
    const std::string& d = dir.root();
    std::vector<std::string> args;
    for (const std::string& a : c.args) args.push_back(substitute(a, d));
    for (const std::string& extra : {std::string("-o"), dir.path("out.npy"),
                                     std::string("--lse"), dir.path("lse.npy")})
      args.push_back(extra);
    const std::vector<std::string> before = dir.list();
    const CommandResult r = run_softdot(args);
    EXPECT_EQ(r.status, 2) << c.name;
    EXPECT_EQ(r.out, "") << c.name;
    EXPECT_EQ(r.err, "softdot: error: " + substitute(c.expected, d) + "\n")
        << c.name;
    EXPECT_EQ(dir.list(), before) << c.name;
  }
}

}  // namespace
}  // namespace softdot_test
