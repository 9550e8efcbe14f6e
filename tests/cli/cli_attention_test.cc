// `softdot attention`: the real binary on .npy files, its outputs checked
// against a float64 reference written here (independent of the library and
// of the command), its --explain text, and its errors (exit status 2, one
// line naming the problem, no output file left behind).
#include <gtest/gtest.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "npy_test_io.h"
#include "run_command.h"

namespace softdot_test {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kTolerance = 1e-6;  // relative

// An array for a .npy file: shape and values (float32, or bool as 0/1).
struct Array {
  std::vector<std::size_t> shape;
  std::vector<float> values;

  std::size_t dim(int axis) const {  // [batch, heads, rows, cols]
    if (shape.size() == 4) return shape[static_cast<std::size_t>(axis)];
    return axis < 2 ? 1 : shape[static_cast<std::size_t>(axis - 2)];
  }
  float at(std::size_t b, std::size_t h, std::size_t i, std::size_t j) const {
    // Broadcasting: a dimension of 1 serves every index.
    const std::size_t B = dim(0), H = dim(1), R = dim(2), C = dim(3);
    b = B == 1 ? 0 : b;
    h = H == 1 ? 0 : h;
    i = R == 1 ? 0 : i;
    return values[((b * H + h) * R + i) * C + j];
  }
};

std::string npy_shape(const std::vector<std::size_t>& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  if (shape.size() == 1) s += ",";
  return s + ")";
}

// Deterministic values in [-2, 2), multiples of 1/64: exact in float16.
Array make_array(std::vector<std::size_t> shape, std::uint32_t seed) {
  Array a;
  a.shape = std::move(shape);
  std::size_t n = 1;
  for (std::size_t d : a.shape) n *= d;
  std::uint32_t s = seed;
  for (std::size_t i = 0; i < n; ++i) {
    s = s * 1664525u + 1013904223u;
    a.values.push_back(static_cast<float>(static_cast<int>(s >> 25) - 64) /
                       32.0f);
  }
  return a;
}

std::string f32_npy(const Array& a) {
  return make_npy("<f4", npy_shape(a.shape), raw_bytes(a.values));
}

std::string bool_npy(const Array& a) {
  std::string data;
  for (float v : a.values) data += v != 0 ? '\1' : '\0';
  return make_npy("|b1", npy_shape(a.shape), data);
}

// float16 bits of a value that float16 holds exactly (normal or zero).
std::uint16_t half_bits(float x) {
  if (x == 0) return std::signbit(x) ? 0x8000 : 0;
  int e = 0;
  const double m = std::frexp(std::fabs(static_cast<double>(x)), &e);
  const double mantissa = (2 * m - 1) * 1024;  // 2m in [1, 2)
  EXPECT_EQ(mantissa, std::floor(mantissa)) << x << " is not a float16";
  const int biased = e - 1 + 15;
  EXPECT_TRUE(biased > 0 && biased < 31) << x;
  return static_cast<std::uint16_t>((x < 0 ? 0x8000 : 0) | (biased << 10) |
                                    static_cast<int>(mantissa));
}

std::string f16_npy(const Array& a) {
  std::string data;
  for (float v : a.values) {
    const std::uint16_t h = half_bits(v);
    data += static_cast<char>(h & 0xff);
    data += static_cast<char>(h >> 8);
  }
  return make_npy("<f2", npy_shape(a.shape), data);
}

struct Options {
  std::optional<double> scale;
  bool causal = false;
  long window_left = -1, window_right = -1;
  double softcap = 0;
  const Array* mask = nullptr;  // 0 / 1
  const Array* bias = nullptr;
};

struct Reference {
  std::vector<double> out;      // [B, H, n_q, d_v]
  std::vector<double> lse;      // [B, H, n_q]
  std::vector<double> weight;   // [B, H, n_q, n_kv]
  std::vector<double> scale_w;  // per output element: sum_j w_ij |v_jc|
};

// Attention in float64, straight from the definition (attention.h).
Reference reference(const Array& q, const Array& k, const Array& v,
                    const Options& o) {
  const std::size_t B = q.dim(0), H = q.dim(1), n_q = q.dim(2), d = q.dim(3);
  const std::size_t H_kv = k.dim(1), n_kv = k.dim(2), d_v = v.dim(3);
  const double scale = static_cast<float>(
      o.scale ? *o.scale : 1.0 / std::sqrt(static_cast<double>(d)));
  Reference r;
  for (std::size_t b = 0; b < B; ++b) {
    for (std::size_t h = 0; h < H; ++h) {
      const std::size_t hk = h / (H / H_kv);
      for (std::size_t i = 0; i < n_q; ++i) {
        const long p = static_cast<long>(i + n_kv) - static_cast<long>(n_q);
        std::vector<double> s(n_kv, -kInf);
        double m = -kInf;
        for (std::size_t j = 0; j < n_kv; ++j) {
          const long jj = static_cast<long>(j);
          if (o.causal && jj > p) continue;
          if (o.window_left >= 0 && jj < p - o.window_left) continue;
          if (o.window_right >= 0 && jj > p + o.window_right) continue;
          if (o.mask && o.mask->at(b, h, i, j) == 0) continue;
          double dot = 0;
          for (std::size_t c = 0; c < d; ++c)
            dot += static_cast<double>(q.at(b, h, i, c)) * k.at(b, hk, j, c);
          double x = dot * scale;
          if (o.softcap > 0) x = o.softcap * std::tanh(x / o.softcap);
          if (o.bias) x += o.bias->at(b, h, i, j);
          s[j] = x;
          m = std::max(m, x);
        }
        double sum = 0;
        for (std::size_t j = 0; j < n_kv; ++j)
          if (m > -kInf) sum += std::exp(s[j] - m);
        r.lse.push_back(m > -kInf ? m + std::log(sum) : -kInf);
        std::vector<double> w(n_kv, 0.0);
        for (std::size_t j = 0; j < n_kv; ++j) {
          if (m > -kInf) w[j] = std::exp(s[j] - m) / sum;
          r.weight.push_back(w[j]);
        }
        for (std::size_t c = 0; c < d_v; ++c) {
          double acc = 0, abs_acc = 0;
          for (std::size_t j = 0; j < n_kv; ++j) {
            acc += w[j] * v.at(b, hk, j, c);
            abs_acc += w[j] * std::fabs(v.at(b, hk, j, c));
          }
          r.out.push_back(acc);
          r.scale_w.push_back(abs_acc);
        }
      }
    }
  }
  return r;
}

struct Files {
  TempDir dir;
  std::string q, k, v, out, lse;
  Files()
      : q(dir.path("q.npy")),
        k(dir.path("k.npy")),
        v(dir.path("v.npy")),
        out(dir.path("out.npy")),
        lse(dir.path("lse.npy")) {}
  std::string put(const std::string& name, const std::string& bytes) {
    write_whole_file(dir.path(name), bytes);
    return dir.path(name);
  }
};

// Runs the command and checks its output (and lse) against the reference:
// |got - want| <= 1e-6 * max(|want|, sum_j w_ij |v_jc|), the relative error
// of the weighted sum measured against its natural size.
void expect_matches_reference(const std::vector<std::string>& args,
                              const Reference& want,
                              const std::string& out_path,
                              const std::string& shape,
                              const std::string& lse_path = "",
                              const std::string& lse_shape = "") {
  const CommandResult r = run_softdot(args);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "");
  const ParsedNpy out = parse_npy(read_whole_file(out_path));
  EXPECT_EQ(out.descr, "<f4");
  EXPECT_EQ(out.shape, shape);
  const std::vector<float> got = values_of<float>(out.data);
  ASSERT_EQ(got.size(), want.out.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double size = std::max(std::fabs(want.out[i]), want.scale_w[i]);
    EXPECT_NEAR(got[i], want.out[i], kTolerance * size + 1e-30)
        << "element " << i;
  }
  if (lse_path.empty()) return;
  const ParsedNpy lse = parse_npy(read_whole_file(lse_path));
  EXPECT_EQ(lse.descr, "<f4");
  EXPECT_EQ(lse.shape, lse_shape);
  const std::vector<float> got_lse = values_of<float>(lse.data);
  ASSERT_EQ(got_lse.size(), want.lse.size());
  for (std::size_t i = 0; i < got_lse.size(); ++i) {
    if (std::isinf(want.lse[i])) {
      EXPECT_EQ(got_lse[i], want.lse[i]) << "lse " << i;
    } else {
      EXPECT_NEAR(got_lse[i], want.lse[i],
                  kTolerance * std::max(1.0, std::fabs(want.lse[i])))
          << "lse " << i;
    }
  }
}

std::vector<float> read_output(const std::string& path) {
  return values_of<float>(parse_npy(read_whole_file(path)).data);
}

std::string fixed(double v, int digits) {
  char b[64];
  return std::string(
      b,
      std::to_chars(b, b + sizeof b, v, std::chars_format::fixed, digits).ptr);
}

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
       "'<f4' or float16 '<f2'"},
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
      {"scale_zero", with({"--scale", "0"}),
       "--scale: \"0\" must be a finite number > 0"},
      {"scale_negative", with({"--scale", "-2"}),
       "--scale: \"-2\" must be a finite number > 0"},
      {"scale_inf", with({"--scale", "inf"}),
       "--scale: \"inf\" must be a finite number > 0"},
      {"scale_nan", with({"--scale", "nan"}),
       "--scale: \"nan\" must be a finite number > 0"},
      {"scale_text", with({"--scale", "half"}),
       "--scale: \"half\" is not a number"},
      {"scale_float_underflow", with({"--scale", "1e-60"}),
       "--scale: \"1e-60\" rounds to 0 in float32; need a value float32 can "
       "hold"},
      {"scale_float_overflow", with({"--scale", "1e39"}),
       "--scale: \"1e39\" overflows in float32; need a value float32 can "
       "hold"},
      {"softcap_negative", with({"--softcap", "-1"}),
       "--softcap: \"-1\" must be a finite number >= 0"},
      {"window_negative", with({"--window-left", "-1"}),
       "--window-left: \"-1\" must be a whole number from 0 to 999999999 "
       "(leave it out for no limit)"},
      {"window_text", with({"--window-right", "x"}),
       "--window-right: \"x\" must be a whole number from 0 to 999999999 "
       "(leave it out for no limit)"},
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
       "--q is required (see softdot --help)"},
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
