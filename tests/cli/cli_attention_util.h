// Shared by the `softdot attention` command tests (cli_attention_test.cc,
// cli_attention_errors_test.cc): .npy writers for the inputs, a float64
// reference written here (independent of the library and of the command),
// and the check of the command's output files against it.
#ifndef SOFTDOT_TESTS_CLI_ATTENTION_UTIL_H_
#define SOFTDOT_TESTS_CLI_ATTENTION_UTIL_H_

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

namespace softdot_test::cli_attention {

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

inline std::string npy_shape(const std::vector<std::size_t>& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  if (shape.size() == 1) s += ",";
  return s + ")";
}

// Deterministic values in [-2, 2), multiples of 1/64: exact in float16.
inline Array make_array(std::vector<std::size_t> shape, std::uint32_t seed) {
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

inline std::string f32_npy(const Array& a) {
  return make_npy("<f4", npy_shape(a.shape), raw_bytes(a.values));
}

inline std::string bool_npy(const Array& a) {
  std::string data;
  for (float v : a.values) data += v != 0 ? '\1' : '\0';
  return make_npy("|b1", npy_shape(a.shape), data);
}

// float16 bits of a value that float16 holds exactly (normal or zero).
inline std::uint16_t half_bits(float x) {
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

inline std::string f16_npy(const Array& a) {
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
inline Reference reference(const Array& q, const Array& k, const Array& v,
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
inline void expect_matches_reference(const std::vector<std::string>& args,
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

inline std::vector<float> read_output(const std::string& path) {
  return values_of<float>(parse_npy(read_whole_file(path)).data);
}

inline std::string fixed(double v, int digits) {
  char b[64];
  return std::string(
      b,
      std::to_chars(b, b + sizeof b, v, std::chars_format::fixed, digits).ptr);
}

}  // namespace softdot_test::cli_attention

#endif  // SOFTDOT_TESTS_CLI_ATTENTION_UTIL_H_
