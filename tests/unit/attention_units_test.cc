// bfloat16 attention on the dot-product units (src/kernels/attention_units-
// inl.h): the scalar model of VDPBF16PS against the kernels' vector model
// and, where the CPU has it, the instruction; the kernels on the instruction
// against the same kernels on the model, bit for bit; accuracy within
// attention.h's bound ("16-bit attention"); special values; threads; 16-bit
// queries and outputs. On a CPU without the units the model still runs the
// kernels (matrix unit "model"), so everything but the hardware comparison
// is tested everywhere; the tests print which units ran.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "attention_test_util.h"
#include "kernels/dispatch.h"
#include "kernels/units_model.h"
#include "softdot/attention.h"
#include "softdot/attention_request.h"
#include "softdot/simd.h"

namespace {

using namespace softdot_test;
using softdot::AttentionRequest;
using softdot::AttentionTarget;
using softdot::KVSource;
using UnitWeights = softdot::AttentionOptions::UnitWeights;

bool has_unit(const std::string& name) {
  const auto u = softdot::matrix_units();
  return std::find(u.begin(), u.end(), name) != u.end();
}

// Restores the automatic target and unit when a test ends.
struct Restore {
  ~Restore() {
    softdot::force_simd_target("");
    softdot::force_matrix_unit("");
  }
};

// A random pair of bfloat16 in one 32-bit lane: mode 0 ordinary numbers,
// 1 any bits, 2 tiny numbers (subnormal products and sums).
std::uint32_t random_pair(std::mt19937& g, int mode) {
  auto one = [&]() -> std::uint32_t {
    const std::uint32_t sign = g() & 0x8000u, mant = g() & 0x7Fu;
    if (mode == 1) return g() & 0xFFFFu;
    const std::uint32_t e =
        mode == 0 ? 120 + g() % 16 : (g() % 3 == 0 ? 0 : g() % 70);
    return sign | (e << 7) | mant;
  };
  return one() | (one() << 16);
}

float random_acc(std::mt19937& g, int mode) {
  std::uint32_t u = g();
  if (mode == 0) u = (u & 0x807FFFFFu) | ((118 + g() % 14) << 23);
  if (mode == 2) u = (u & 0x80FFFFFFu) | ((g() % 8) << 23);
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

bool same_or_both_nan(float a, float b) {
  return bits(a) == bits(b) || (std::isnan(a) && std::isnan(b));
}

// Compares detail::dpbf16_model with the current target's vector model
// (hw false) or the instruction (hw true) on random lanes of every mode.
void compare_lanes(bool hw, const std::string& label) {
  std::mt19937 g(hw ? 7 : 11);
  constexpr std::size_t kN = 4099;  // not a multiple of any vector
  std::vector<float> acc(kN), want(kN);
  std::vector<std::uint32_t> a(kN), b(kN);
  std::size_t mismatches = 0, checked = 0;
  for (int mode = 0; mode < 3; ++mode) {
    for (int round = 0; round < 40; ++round) {
      for (std::size_t i = 0; i < kN; ++i) {
        acc[i] = random_acc(g, mode);
        a[i] = random_pair(g, mode);
        b[i] = random_pair(g, mode);
        want[i] = softdot::detail::dpbf16_model(acc[i], a[i], b[i]);
      }
      ASSERT_TRUE(softdot::detail::attention_units_dot(acc.data(), a.data(),
                                                       b.data(), kN, hw))
          << label;
      for (std::size_t i = 0; i < kN; ++i, ++checked) {
        if (!same_or_both_nan(acc[i], want[i]) && mismatches++ < 5) {
          ADD_FAILURE() << label << " mode " << mode << ": a " << std::hex
                        << a[i] << " b " << b[i] << std::dec << " gives "
                        << fmt(acc[i]) << ", the model " << fmt(want[i]);
        }
      }
    }
  }
  EXPECT_EQ(mismatches, 0u) << label;
  std::printf("[ units    ] %s: %zu lanes, %zu differ from the scalar model\n",
              label.c_str(), checked, mismatches);
}

TEST(AttentionUnits, ListsAndForcesUnits) {
  Restore restore;
  const auto units = softdot::matrix_units();
  ASSERT_FALSE(units.empty());
  EXPECT_EQ(units.back(), "none");
  std::string list;
  for (const auto& u : units) list += " " + u;
  std::printf("[ units    ] target %s, units:%s, chosen: %s\n",
              softdot::simd_target().c_str(), list.c_str(),
              softdot::matrix_unit().c_str());
  // The automatic choice is the hardware unit, never the model (unless the
  // environment chose one for the process).
  if (std::getenv("SOFTDOT_MATRIX_UNIT") == nullptr) {
    EXPECT_EQ(softdot::matrix_unit(),
              has_unit("avx512bf16") ? "avx512bf16" : "none");
  }
  const std::string by_default = softdot::matrix_unit();
  softdot::force_matrix_unit("NONE");
  EXPECT_EQ(softdot::matrix_unit(), "none");
  if (has_unit("model")) {
    softdot::force_matrix_unit("model");
    EXPECT_EQ(softdot::matrix_unit(), "model");
  }
  expect_invalid(
      "force_matrix_unit(\"amx-fp8\")",
      [] { softdot::force_matrix_unit("amx-fp8"); },
      {"force_matrix_unit", "\"amx-fp8\"", "is not a matrix unit", "none"});
  softdot::force_matrix_unit("");
  EXPECT_EQ(softdot::matrix_unit(), by_default);
  // A forced hardware unit that the forced SIMD target lacks runs its model
  // (the same bits).
  if (has_unit("avx512bf16") && has_unit("model")) {
    softdot::force_matrix_unit("avx512bf16");
    softdot::force_simd_target("AVX2");
    EXPECT_EQ(softdot::matrix_unit(), "model");
  }
}

TEST(AttentionUnits, VectorModelMatchesScalarModel) {
  Restore restore;
  for (const auto& t : fma_targets()) {
    softdot::force_simd_target(t);
    compare_lanes(false, "vector model on " + t);
  }
}

TEST(AttentionUnits, InstructionMatchesScalarModel) {
  Restore restore;
  if (!has_unit("avx512bf16")) {
    GTEST_SKIP() << "this CPU has no AVX512-BF16 (units: the model only)";
  }
  compare_lanes(true, "VDPBF16PS on " + softdot::simd_target());
}

// ---- 16-bit query rows and outputs: the vector conversions ---------------

// detail::widen16 and detail::round16_quotient (convert16-inl.h) give the
// bits of float16.cc's scalar conversions on every target: every 16-bit
// pattern widened; quotients near every rounding edge of both formats (ties,
// subnormals, the overflow threshold, the float range), signed zeros, inf
// and NaN, and random ones, rounded; at lengths with vector tails.
TEST(AttentionUnits, SixteenBitConversionsMatchTheScalarOnes) {
  Restore restore;
  std::vector<std::uint16_t> all(65536 + 7);
  for (std::size_t i = 0; i < all.size(); ++i)
    all[i] = static_cast<std::uint16_t>(i * 40503u);  // odd: a permutation
  std::vector<double> xs = {0.0,
                            -0.0,
                            1.0,
                            -1.0,
                            65504.0,
                            65519.99,
                            65520.0,
                            -65520.0,
                            0x1p-24,
                            0x1p-25,
                            0x1.8p-25,
                            0x1p-14,
                            0x1.ffcp-15,
                            3.0e38,
                            3.4028234663852886e38,
                            3.402823567797337e38,
                            3.5e38,
                            1e300,
                            -1e300,
                            0x1p-149,
                            0x1p-150,
                            0x1.8p-150,
                            1e-320,
                            std::numeric_limits<double>::infinity(),
                            -std::numeric_limits<double>::infinity(),
                            std::numeric_limits<double>::quiet_NaN()};
  // Ties and near-ties of both formats at several exponents: 1 + k 2^-11
  // (float16's half ulp), 1 + k 2^-8 (bfloat16's), nudged by a double ulp
  // and by a float ulp.
  for (int e : {-20, -14, -1, 0, 7, 15, 100}) {
    for (int k = 1; k < 8; ++k) {
      for (double half : {0x1p-11, 0x1p-8}) {
        const double t = std::ldexp(1.0 + k * half, e);
        for (double nudge : {0.0, 0x1p-52, -0x1p-52, 0x1p-23, -0x1p-23})
          xs.push_back(t * (1.0 + nudge)), xs.push_back(-t * (1.0 + nudge));
      }
    }
  }
  std::mt19937_64 g(25);
  std::uniform_real_distribution<double> m(-2.0, 2.0);
  std::uniform_int_distribution<int> ex(-160, 140);
  while (xs.size() < 20000) xs.push_back(std::ldexp(m(g), ex(g)));
  for (const std::string& target : softdot::simd_targets()) {
    softdot::force_simd_target(target);
    for (bool bf16 : {true, false}) {
      const char* fmt16 = bf16 ? "bfloat16" : "float16";
      std::vector<float> wide(all.size());
      softdot::detail::widen16(all.data(), all.size(), wide.data(), bf16);
      std::size_t bad = 0;
      for (std::size_t i = 0; i < all.size(); ++i) {
        const float want = bf16 ? softdot::to_float(BFloat16{all[i]})
                                : softdot::to_float(Float16{all[i]});
        if (bits(wide[i]) != bits(want) && bad++ < 5)
          ADD_FAILURE() << target << " " << fmt16 << " widen " << all[i];
      }
      for (double l : {1.0, 3.0, -0.7}) {
        std::vector<double> o(xs.size());
        for (std::size_t i = 0; i < xs.size(); ++i) o[i] = xs[i] * l;
        std::vector<std::uint16_t> got(xs.size());
        softdot::detail::round16_quotient(o.data(), l, o.size(), got.data(),
                                          bf16);
        for (std::size_t i = 0; i < xs.size(); ++i) {
          const double q = o[i] / l;
          const std::uint16_t want =
              bf16 ? softdot::to_bfloat16(q).bits : softdot::to_float16(q).bits;
          if (got[i] != want && bad++ < 5)
            ADD_FAILURE() << target << " " << fmt16 << " round " << fmt(q)
                          << ": " << got[i] << ", want " << want;
        }
      }
    }
  }
}

// ---- attention on the units ---------------------------------------------

// A problem whose query holds bfloat16 values, with the bfloat16 copy.
struct Bf16Case {
  Problem<BFloat16> p;
  Tensor<BFloat16> q16;
};

Bf16Case make_case(const Shape& s) {
  Bf16Case c{make_problem<BFloat16>(s), {}};
  c.q16 = Tensor<BFloat16>(s.B, s.H, s.nq, s.d, s.pad,
                           softdot::to_bfloat16(kNaNF), s.off);
  for (std::size_t b = 0; b < s.B; ++b)
    for (std::size_t h = 0; h < s.H; ++h)
      for (std::size_t i = 0; i < s.nq; ++i)
        for (std::size_t k = 0; k < s.d; ++k) {
          const BFloat16 x = softdot::to_bfloat16(c.p.q.at(b, h, i, k));
          c.q16.at(b, h, i, k) = x;
          c.p.q.at(b, h, i, k) = softdot::to_float(x);
        }
  return c;
}

// The request with a bfloat16 query and a float32 output (and lse), on the
// unit `unit` ("" automatic).
Result run_unit(const Bf16Case& c, const AttentionOptions& o,
                const std::string& unit) {
  softdot::force_matrix_unit(unit);
  const Shape& s = c.p.s;
  Result r{Tensor<float>(s.B, s.H, s.nq, s.dv, s.pad + 1, kOutSentinel, s.off),
           std::vector<float>(s.B * s.H * s.nq + kLseGuard, kLseSentinel)};
  AttentionRequest req;
  req.name = "attention";
  req.q = c.q16.cview();
  req.kv = KVSource::contiguous(c.p.k.cview(), c.p.v.cview());
  req.target = AttentionTarget::output(r.o.view(), r.lse.data());
  req.options = o;
  softdot::run_attention(req);
  softdot::force_matrix_unit("");
  return r;
}

// The bound of attention.h's "16-bit attention" for a float32 output: the
// float path's (the reference's, with 70 u W) plus the longer P V chain
// (120 u W in all, 190 u W split), the weights' rounding and the units'
// underflow (inputs here have no subnormal bfloat16). The score's n_d is
// the reference's (chains of 16) there; the units' 35 at d = 128 against
// 23 is covered by a factor 35 / 19 on the D term (19 is the reference's
// smallest n_d at d >= 16), taken as 2 D W more.
double units_extra(const AttnRef& ref, std::size_t oi, std::size_t row,
                   UnitWeights w, std::size_t n_kv, double vmax) {
  const bool split = w == UnitWeights::kSplit;
  const double wr = split ? 0x1p-16 : 0x1p-8;
  const double chain = split ? 120 * kU : 50 * kU;
  return (wr + chain + 2 * ref.D[row]) * ref.W[oi] +
         0x1p-126 * (double(n_kv) + 1 + double(n_kv) * vmax);
}

struct UnitStats {
  double ratio = 0;  // max err / (u_bf16 W)
  std::size_t elements = 0, failures = 0;
};

void check_units(const AttnRef& ref, const Result& r, const Shape& s,
                 UnitWeights w, const std::string& what, UnitStats& st) {
  const double vmax = std::max(std::fabs(s.v_lo), std::fabs(s.v_hi));
  for (std::size_t b = 0; b < ref.batch; ++b)
    for (std::size_t h = 0; h < ref.heads; ++h)
      for (std::size_t i = 0; i < ref.n_q; ++i) {
        const std::size_t row = ref.li(b, h, i);
        for (std::size_t c = 0; c < ref.d_v; ++c) {
          const std::size_t oi = ref.oi(b, h, i, c);
          const float got = r.o.at(b, h, i, c);
          const LD want = ref.out[oi];
          ++st.elements;
          bool ok;
          double err = 0, bound = 0;
          if (std::isnan(want)) {
            ok = std::isnan(got);
          } else if (ref.visible[row] == 0) {
            ok = bits(got) == 0u;
          } else {
            err = double(std::fabs(LD(got) - want));
            bound =
                ref.bound[oi] + units_extra(ref, oi, row, w, ref.n_kv, vmax);
            ok = std::isfinite(got) && err <= bound;
            if (ref.W[oi] > 0) {
              st.ratio = std::max(st.ratio, err / (0x1p-8 * ref.W[oi]));
            }
          }
          if (!ok && st.failures++ < kMaxMessages) {
            ADD_FAILURE() << what << ": out[" << b << "," << h << "," << i
                          << "," << c << "] = " << fmt(got) << ", reference "
                          << fmt(double(want)) << ", error " << fmt(err)
                          << " > bound " << fmt(bound);
          }
        }
      }
  EXPECT_TRUE(r.guards_ok()) << what << ": wrote outside the output";
}

struct OptionCase {
  std::string name;
  std::function<void(AttentionOptions&, const Shape&)> set;
};

std::vector<OptionCase> option_cases() {
  return {
      {"plain", [](AttentionOptions&, const Shape&) {}},
      {"causal", [](AttentionOptions& o, const Shape&) { o.causal = true; }},
      {"window",
       [](AttentionOptions& o, const Shape&) {
         o.causal = true;
         o.window_left = 37;
       }},
      {"softcap", [](AttentionOptions& o, const Shape&) { o.softcap = 5.0f; }},
      {"kv_range",
       [](AttentionOptions& o, const Shape& s) {
         o.kv_begin = 3;
         o.kv_end = s.nkv - 5;
       }},
  };
}

// Shapes of the decode form on the units (fewer than 12 rows per KV head,
// d and d_v multiples of 32).
std::vector<Shape> decode_unit_shapes() {
  std::vector<Shape> v;
  Shape h;  // decode, GQA 4, d = 128: 3 chunks, the last block of 49 keys
  h.B = 2, h.H = 8, h.Hkv = 2, h.nkv = 1201, h.d = 128, h.dv = 128, h.seed = 9;
  v.push_back(h);
  Shape i;  // 3 rows, d_v = 96 (a column tile of 32 left), a block of 19
  i.H = 3, i.Hkv = 1, i.nkv = 83, i.d = 64, i.dv = 96, i.pad = 1, i.seed = 10;
  v.push_back(i);
  Shape j;  // n_q = 2 on 5 heads: 10 rows (row tiles of 4, 4 and 2)
  j.H = 5, j.Hkv = 1, j.nq = 2, j.nkv = 300, j.d = 32, j.dv = 32, j.qk = 3;
  j.seed = 11;
  v.push_back(j);
  Shape k;  // one row, d = 256, large values
  k.nkv = 130, k.d = 256, k.dv = 64, k.v_lo = 2, k.v_hi = 3, k.seed = 12;
  v.push_back(k);
  return v;
}

std::vector<Shape> unit_shapes() {
  std::vector<Shape> v;
  Shape a;  // GQA prefill: 4 query heads share 2 KV heads, odd key count
  a.B = 2, a.H = 4, a.Hkv = 2, a.nq = 40, a.nkv = 141, a.d = 64, a.dv = 64;
  v.push_back(a);
  Shape b;  // d = 128, a full 64-row block, strided
  b.H = 2, b.Hkv = 2, b.nq = 70, b.nkv = 200, b.d = 128, b.dv = 128, b.pad = 3;
  b.seed = 2;
  v.push_back(b);
  Shape c;  // odd d, d_v != d, 17 rows (NV = 2 on AVX-512)
  c.nq = 17, c.nkv = 65, c.d = 23, c.dv = 9, c.seed = 3;
  v.push_back(c);
  Shape e;  // large scores: qk 4 (max weights well apart), V offset
  e.nq = 33, e.nkv = 300, e.d = 32, e.dv = 48, e.qk = 4, e.v_lo = 2, e.v_hi = 3,
  e.seed = 4;
  v.push_back(e);
  Shape f;  // decode: 16 query heads on one KV head, 3 chunks of keys
  f.H = 16, f.Hkv = 1, f.nkv = 1200, f.d = 64, f.dv = 64, f.seed = 5;
  v.push_back(f);
  Shape g;  // speculative verification: n_q = 4, GQA 4, 12 rows per KV head
  g.B = 2, g.H = 6, g.Hkv = 2, g.nq = 4, g.nkv = 700, g.d = 128, g.dv = 128;
  g.pad = 2, g.seed = 6;
  v.push_back(g);
  for (const Shape& x : decode_unit_shapes()) v.push_back(x);
  return v;
}

// Every shape and option on the model and (where present) the instruction,
// both weight modes: within the bound; the instruction's bits are the
// model's; one and two threads give the same bits.
TEST(AttentionUnits, WithinBoundAndHardwareMatchesModel) {
  Restore restore;
  if (!has_unit("model")) GTEST_SKIP() << "no FMA target: no units path";
  const bool hw = has_unit("avx512bf16");
  std::printf("[ units    ] running on: model%s\n",
              hw ? " and avx512bf16" : " (no AVX512-BF16 here)");
  for (const Shape& s : unit_shapes()) {
    const Bf16Case c = make_case(s);
    for (const auto& oc : option_cases()) {
      for (UnitWeights w : {UnitWeights::kRounded, UnitWeights::kSplit}) {
        AttentionOptions o;
        oc.set(o, s);
        o.unit_weights = w;
        const AttnRef ref = reference(c.p, o);
        const std::string what =
            s.str() + " " + oc.name +
            (w == UnitWeights::kSplit ? " split" : " rounded");
        UnitStats st;
        const Result m1 =
            with_threads(1, [&] { return run_unit(c, o, "model"); });
        check_units(ref, m1, s, w, what + " [model]", st);
        const Result m2 =
            with_threads(2, [&] { return run_unit(c, o, "model"); });
        EXPECT_TRUE(SameBits(m1.all(), m2.all()))
            << what << ": the model's bits depend on the thread count";
        if (hw) {
          const Result h1 =
              with_threads(2, [&] { return run_unit(c, o, "avx512bf16"); });
          EXPECT_TRUE(SameBits(m1.all(), h1.all()))
              << what << ": VDPBF16PS's bits differ from its model's";
        }
        // "none": the float32 path, for comparison.
        UnitStats sn;
        const Result n1 = run_unit(c, o, "none");
        check_units(ref, n1, s, w, what + " [none]", sn);
        std::printf(
            "[ units    ] %-58s err/(u_bf16 W) units %.2e  float32 path "
            "%.2e\n",
            what.c_str(), st.ratio, sn.ratio);
      }
    }
  }
}

// The split mode is far more accurate than the rounded one (the measured
// ratio, not only the bound), and the rounded one is no worse than the
// weights' rounding allows.
TEST(AttentionUnits, SplitWeightsAreNearTheFloatPath) {
  Restore restore;
  if (!has_unit("model")) GTEST_SKIP() << "no FMA target: no units path";
  Shape s;
  s.H = 2, s.Hkv = 1, s.nq = 64, s.nkv = 512, s.d = 64, s.dv = 64, s.seed = 9;
  const Bf16Case c = make_case(s);
  double ratio[3] = {};
  const char* names[3] = {"rounded", "split", "float32 path"};
  for (int m = 0; m < 3; ++m) {
    AttentionOptions o;
    o.unit_weights = m == 1 ? UnitWeights::kSplit : UnitWeights::kRounded;
    const AttnRef ref = reference(c.p, o);
    UnitStats st;
    const Result r = run_unit(c, o, m == 2 ? "none" : "model");
    check_units(ref, r, s, o.unit_weights, names[m], st);
    ratio[m] = st.ratio;
    std::printf("[ units    ] %-14s max err/(u_bf16 W) = %.3e\n", names[m],
                st.ratio);
  }
  EXPECT_LT(ratio[1], ratio[0] / 64) << "split is not much better than rounded";
  EXPECT_LE(ratio[0], 1.0 + 1e-3) << "rounded beyond the weights' rounding";
  EXPECT_GT(ratio[0], 0.01) << "rounded looks unrounded: did the units run?";
}

// Masked keys never reach the output, even holding NaN and inf values (the
// guarded block); a fully masked row is +0 with lse -inf; a NaN in a query
// row makes that row NaN; +inf scores give the mean of their values.
TEST(AttentionUnits, SpecialValues) {
  Restore restore;
  if (!has_unit("model")) GTEST_SKIP() << "no FMA target: no units path";
  Shape s;
  s.nq = 20, s.nkv = 90, s.d = 16, s.dv = 16, s.seed = 5;
  Bf16Case c = make_case(s);
  // Keys 10 and 70 hold NaN and inf values and are masked for every row;
  // row 3 sees no key; row 5's query has a NaN.
  Tensor<bool> mask(1, 1, s.nq, s.nkv, 0, true);
  for (std::size_t i = 0; i < s.nq; ++i) {
    mask.at(0, 0, i, 10) = false;
    mask.at(0, 0, i, 70) = false;
  }
  for (std::size_t j = 0; j < s.nkv; ++j) mask.at(0, 0, 3, j) = false;
  for (std::size_t k = 0; k < s.dv; ++k) {
    c.p.v.at(0, 0, 10, k) = softdot::to_bfloat16(kNaNF);
    c.p.v.at(0, 0, 70, k) = softdot::to_bfloat16(k % 2 ? kInfF : -kInfF);
  }
  c.q16.at(0, 0, 5, 7) = softdot::to_bfloat16(kNaNF);
  c.p.q.at(0, 0, 5, 7) = kNaNF;
  c.p.rewiden();
  AttentionOptions o;
  o.mask = mask.cview();
  const AttnRef ref = reference(c.p, o);
  for (const char* unit : {"model", "avx512bf16"}) {
    if (!has_unit(unit)) continue;
    for (UnitWeights w : {UnitWeights::kRounded, UnitWeights::kSplit}) {
      o.unit_weights = w;
      UnitStats st;
      const Result r = run_unit(c, o, unit);
      check_units(ref, r, s, w, std::string("special values [") + unit + "]",
                  st);
      EXPECT_EQ(r.lse[3], -kInfF);
      EXPECT_TRUE(std::isnan(r.lse[5]));
    }
  }
  // Scores of +inf (a bias of +inf at keys 4 and 8 of row 0): the mean of
  // their values.
  const Bf16Case d = make_case(s);
  Tensor<float> bias(1, 1, s.nq, s.nkv, 0, 0.0f);
  bias.at(0, 0, 0, 4) = kInfF;
  bias.at(0, 0, 0, 8) = kInfF;
  AttentionOptions ob;
  ob.bias = bias.cview();
  const AttnRef ref2 = reference(d.p, ob);
  ASSERT_EQ(ref2.inf_scores[0], 2u);
  for (const char* unit : {"model", "avx512bf16"}) {
    if (!has_unit(unit)) continue;
    const Result r = run_unit(d, ob, unit);
    for (std::size_t k = 0; k < s.dv; ++k) {
      const float mean = 0.5f * (softdot::to_float(d.p.v.at(0, 0, 4, k)) +
                                 softdot::to_float(d.p.v.at(0, 0, 8, k)));
      EXPECT_EQ(r.o.at(0, 0, 0, k), mean) << unit << " column " << k;
    }
    EXPECT_EQ(r.lse[0], kInfF) << unit;
  }
}

// The same on the decode form on the units: 8 heads on 2 KV heads, one
// query row each; masked keys 10 and 70 hold NaN and inf values; head 3
// sees no key; head 5's query has a NaN; head 6 has scores of +inf at keys
// 4 and 8 (the mean of their values).
TEST(AttentionUnits, DecodeSpecialValues) {
  Restore restore;
  if (!has_unit("model")) GTEST_SKIP() << "no FMA target: no units path";
  Shape s;
  s.H = 8, s.Hkv = 2, s.nkv = 150, s.d = 32, s.dv = 32, s.seed = 14;
  Bf16Case c = make_case(s);
  Tensor<bool> mask(1, s.H, 1, s.nkv, 0, true);
  for (std::size_t h = 0; h < s.H; ++h) {
    mask.at(0, h, 0, 10) = false;
    mask.at(0, h, 0, 70) = false;
  }
  for (std::size_t j = 0; j < s.nkv; ++j) mask.at(0, 3, 0, j) = false;
  for (std::size_t h = 0; h < s.Hkv; ++h)
    for (std::size_t k = 0; k < s.dv; ++k) {
      c.p.v.at(0, h, 10, k) = softdot::to_bfloat16(kNaNF);
      c.p.v.at(0, h, 70, k) = softdot::to_bfloat16(k % 2 ? kInfF : -kInfF);
    }
  c.q16.at(0, 5, 0, 7) = softdot::to_bfloat16(kNaNF);
  c.p.q.at(0, 5, 0, 7) = kNaNF;
  c.p.rewiden();
  Tensor<float> bias(1, s.H, 1, s.nkv, 0, 0.0f);
  bias.at(0, 6, 0, 4) = kInfF;
  bias.at(0, 6, 0, 8) = kInfF;
  AttentionOptions o;
  o.mask = mask.cview();
  o.bias = bias.cview();
  const AttnRef ref = reference(c.p, o);
  ASSERT_EQ(ref.inf_scores[6], 2u);
  for (const char* unit : {"model", "avx512bf16"}) {
    if (!has_unit(unit)) continue;
    for (UnitWeights w : {UnitWeights::kRounded, UnitWeights::kSplit}) {
      o.unit_weights = w;
      const Result r = run_unit(c, o, unit);
      for (std::size_t h = 0; h < s.H; ++h) {
        for (std::size_t k = 0; k < s.dv; ++k) {
          const float got = r.o.at(0, h, 0, k);
          if (h == 3) {
            EXPECT_EQ(bits(got), 0u) << unit << " head 3 column " << k;
          } else if (h == 5) {
            EXPECT_TRUE(std::isnan(got)) << unit << " head 5 column " << k;
          } else if (h == 6) {
            const float mean = 0.5f * (softdot::to_float(c.p.v.at(0, 1, 4, k)) +
                                       softdot::to_float(c.p.v.at(0, 1, 8, k)));
            EXPECT_EQ(got, mean) << unit << " head 6 column " << k;
          } else {
            const std::size_t oi = ref.oi(0, h, 0, k);
            const double err = std::fabs(double(got) - double(ref.out[oi]));
            const double bound =
                ref.bound[oi] +
                units_extra(ref, oi, ref.li(0, h, 0), w, ref.n_kv, 1.0);
            EXPECT_TRUE(std::isfinite(got) && err <= bound)
                << unit << " head " << h << " column " << k << ": " << got
                << ", reference " << double(ref.out[oi]);
          }
        }
      }
      EXPECT_EQ(r.lse[3], -kInfF) << unit;
      EXPECT_TRUE(std::isnan(r.lse[5])) << unit;
      EXPECT_EQ(r.lse[6], kInfF) << unit;
    }
  }
}

// bfloat16 and float16 outputs are the double result rounded once: equal
// to the partial result's o / l rounded by to_bfloat16(double) /
// to_float16(double); through the public 16-bit attention() overloads.
TEST(AttentionUnits, SixteenBitOutputsAreRoundedOnce) {
  Restore restore;
  Shape s;
  s.H = 2, s.Hkv = 1, s.nq = 24, s.nkv = 100, s.d = 32, s.dv = 32, s.seed = 6;
  const Bf16Case c = make_case(s);
  for (const std::string unit : {"none", "model", "avx512bf16"}) {
    if (!has_unit(unit)) continue;
    softdot::force_matrix_unit(unit);
    AttentionOptions o;
    o.causal = true;
    softdot::AttentionPartial part;
    AttentionRequest req;
    req.name = "attention_partial";
    req.q = c.q16.cview();
    req.kv = KVSource::contiguous(c.p.k.cview(), c.p.v.cview());
    req.target = AttentionTarget::partial_result(part);
    req.options = o;
    softdot::run_attention(req);
    Tensor<BFloat16> out(s.B, s.H, s.nq, s.dv, 0, BFloat16{0xFFFF});
    std::vector<float> lse(s.B * s.H * s.nq);
    softdot::attention(c.q16.cview(), c.p.k.cview(), c.p.v.cview(), out.view(),
                       o, lse.data());
    std::size_t bad = 0;
    for (std::size_t h = 0; h < s.H; ++h)
      for (std::size_t i = 0; i < s.nq; ++i) {
        const std::size_t r = h * s.nq + i;
        for (std::size_t k = 0; k < s.dv; ++k) {
          const double x = part.out[r * s.dv + k] / part.sum[r];
          if (out.at(0, h, i, k).bits != softdot::to_bfloat16(x).bits) ++bad;
        }
      }
    EXPECT_EQ(bad, 0u) << unit;
    softdot::force_matrix_unit("");
  }
  // float16 everywhere (the float32 path's products).
  Problem<Float16> p = make_problem<Float16>(s);
  Tensor<Float16> q16(s.B, s.H, s.nq, s.d, 0, Float16{});
  for (std::size_t h = 0; h < s.H; ++h)
    for (std::size_t i = 0; i < s.nq; ++i)
      for (std::size_t k = 0; k < s.d; ++k) {
        q16.at(0, h, i, k) = softdot::to_float16(p.q.at(0, h, i, k));
        p.q.at(0, h, i, k) = softdot::to_float(q16.at(0, h, i, k));
      }
  const Result f32 = run(p, AttentionOptions{});
  Tensor<Float16> out(s.B, s.H, s.nq, s.dv, 0, Float16{0xFFFF});
  softdot::attention(q16.cview(), p.k.cview(), p.v.cview(), out.view());
  const AttnRef ref = reference(p, AttentionOptions{});
  for (std::size_t h = 0; h < s.H; ++h)
    for (std::size_t i = 0; i < s.nq; ++i)
      for (std::size_t k = 0; k < s.dv; ++k) {
        const std::size_t oi = ref.oi(0, h, i, k);
        const double got = softdot::to_float(out.at(0, h, i, k));
        const double want = double(ref.out[oi]);
        EXPECT_LE(std::fabs(got - want),
                  ref.bound[oi] + 0x1p-11 * std::fabs(want) * 1.0001)
            << "float16 out[" << h << "," << i << "," << k << "]";
        // The same computation as the float query's.
        EXPECT_EQ(got, double(softdot::to_float(
                           softdot::to_float16(double(f32.o.at(0, h, i, k))))))
            << "float16 out[" << h << "," << i << "," << k << "]";
      }
}

// A float32 query takes the float32 path whatever the unit (the golden
// hashes of the float32 path hold with the units present); so does the
// decode form of a bfloat16 query whose d or d_v is not a multiple of 32,
// and any bfloat16 decode with batch_invariant. Elsewhere the decode form
// runs on the units (fewer than 12 rows per KV head: its own decode form;
// 12 to 16: the units' prefill form per chunk), the weights rounded: not the
// float path's bits.
TEST(AttentionUnits, Float32QueriesAndDecodeKeepTheFloatPath) {
  Restore restore;
  Shape s;
  s.nq = 40, s.nkv = 100, s.d = 32, s.dv = 32, s.seed = 8;
  const Bf16Case c = make_case(s);
  AttentionOptions o;
  softdot::force_matrix_unit("none");
  const Result none = run(c.p, o);
  for (const std::string unit : {"model", "avx512bf16"}) {
    if (!has_unit(unit)) continue;
    softdot::force_matrix_unit(unit);
    EXPECT_TRUE(SameBits(none.all(), run(c.p, o).all())) << unit;
  }
  AttentionOptions inv;
  inv.batch_invariant = true;
  for (std::size_t d : {24, 32}) {
    for (std::size_t heads : {1, 11, 12}) {
      Shape sg = s;
      sg.nq = 1, sg.H = heads, sg.d = d, sg.dv = d;
      const Bf16Case cg = make_case(sg);
      const Result gn = run_unit(cg, o, "none");
      const Result gi = run_unit(cg, inv, "none");
      for (const std::string unit : {"model", "avx512bf16"}) {
        if (!has_unit(unit)) continue;
        EXPECT_EQ(d % 32 != 0 && heads < 12,
                  SameBits(gn.all(), run_unit(cg, o, unit).all()))
            << unit << ", d " << d << ", " << heads << " rows per KV head";
        EXPECT_TRUE(SameBits(gi.all(), run_unit(cg, inv, unit).all()))
            << unit << ", batch_invariant, d " << d << ", " << heads
            << " rows per KV head";
      }
    }
  }
}

// The decode form on the units has the same bits on every SIMD target that
// runs the model (its value pairs are interleaved in 128-bit blocks and put
// back in order per target; its score trees fold per target).
TEST(AttentionUnits, DecodeOnTheUnitsHasTheSameBitsOnEveryTarget) {
  Restore restore;
  if (!has_unit("model")) GTEST_SKIP() << "no FMA target: no units path";
  for (const Shape& s : decode_unit_shapes()) {
    const Bf16Case c = make_case(s);
    for (UnitWeights w : {UnitWeights::kRounded, UnitWeights::kSplit}) {
      AttentionOptions o;
      o.unit_weights = w;
      o.causal = true;
      softdot::force_simd_target("");
      const std::string best = softdot::simd_target();
      const Result ref = run_unit(c, o, "model");
      std::size_t targets = 0;
      for (const std::string& t : softdot::simd_targets()) {
        softdot::force_simd_target(t);
        if (!has_unit("model")) continue;
        ++targets;
        EXPECT_TRUE(SameBits(ref.all(), run_unit(c, o, "model").all()))
            << s.str() << ": the model on " << t << " differs from " << best;
      }
      softdot::force_simd_target("");
      std::printf("[ units    ] decode %s: the model's bits on %zu targets\n",
                  s.str().c_str(), targets);
    }
  }
}

// The decode form on the units over pages (vLLM's NHD layout, whose KV
// heads of a chunk run block by block in one task, in groups of up to 8,
// and HND, pages in a shuffled order) gives the contiguous call's bits, out
// and lse.
void paged_decode_equals_contiguous(const Shape& s) {
  const Bf16Case c = make_case(s);
  AttentionOptions o;
  o.causal = true;
  for (std::size_t ps : {16, 48}) {
    const std::size_t per = (s.nkv + ps - 1) / ps, P = s.B * per + 3;
    std::vector<std::int32_t> order(P);
    for (std::size_t i = 0; i < P; ++i) order[i] = static_cast<std::int32_t>(i);
    std::mt19937 g(static_cast<unsigned>(ps));
    std::shuffle(order.begin(), order.end(), g);
    std::vector<std::int32_t> table(s.B * per), lens(s.B);
    for (std::size_t i = 0; i < s.B * per; ++i) table[i] = order[i];
    for (std::size_t b = 0; b < s.B; ++b) {
      lens[b] = static_cast<std::int32_t>(s.nkv);
    }
    for (bool nhd : {true, false}) {
      // NHD: [P, ps, H_kv, d] seen as [P, H_kv, ps, d].
      std::vector<BFloat16> kp(P * ps * s.Hkv * s.d,
                               softdot::to_bfloat16(kNaNF));
      std::vector<BFloat16> vp(P * ps * s.Hkv * s.dv,
                               softdot::to_bfloat16(kNaNF));
      const std::size_t k_row = nhd ? s.Hkv * s.d : s.d;
      const std::size_t k_head = nhd ? s.d : ps * s.d;
      const std::size_t v_row = nhd ? s.Hkv * s.dv : s.dv;
      const std::size_t v_head = nhd ? s.dv : ps * s.dv;
      for (std::size_t b = 0; b < s.B; ++b)
        for (std::size_t h = 0; h < s.Hkv; ++h)
          for (std::size_t j = 0; j < s.nkv; ++j) {
            const auto pg = static_cast<std::size_t>(table[b * per + j / ps]);
            const std::size_t r = j % ps;
            for (std::size_t x = 0; x < s.d; ++x)
              kp[pg * ps * s.Hkv * s.d + h * k_head + r * k_row + x] =
                  c.p.k.at(b, h, j, x);
            for (std::size_t x = 0; x < s.dv; ++x)
              vp[pg * ps * s.Hkv * s.dv + h * v_head + r * v_row + x] =
                  c.p.v.at(b, h, j, x);
          }
      const softdot::PagedKVTable t{table, per, lens};
      for (const std::string unit : {"model", "avx512bf16"}) {
        if (!has_unit(unit)) continue;
        const Result want = run_unit(c, o, unit);
        softdot::force_matrix_unit(unit);
        Result got{
            Tensor<float>(s.B, s.H, s.nq, s.dv, 0, kOutSentinel, 0),
            std::vector<float>(s.B * s.H * s.nq + kLseGuard, kLseSentinel)};
        AttentionRequest req;
        req.name = "paged_attention";
        req.q = c.q16.cview();
        req.kv = KVSource::pages(
            TensorView<const BFloat16>(kp.data(), P, s.Hkv, ps, s.d,
                                       ps * s.Hkv * s.d, k_head, k_row),
            TensorView<const BFloat16>(vp.data(), P, s.Hkv, ps, s.dv,
                                       ps * s.Hkv * s.dv, v_head, v_row),
            t);
        req.target = AttentionTarget::output(got.o.view(), got.lse.data());
        req.options = o;
        for (int threads : {1, 2}) {
          with_threads(threads, [&] {
            softdot::run_attention(req);
            return 0;
          });
          EXPECT_TRUE(SameBits(want.all(), got.all()))
              << s.str() << " " << unit << ", pages of " << ps
              << (nhd ? " NHD, " : " HND, ") << threads << " threads";
        }
        softdot::force_matrix_unit("");
      }
    }
  }
}

TEST(AttentionUnits, PagedDecodeEqualsContiguous) {
  Restore restore;
  if (!has_unit("model")) GTEST_SKIP() << "no FMA target: no units path";
  Shape s;
  s.B = 2, s.H = 8, s.Hkv = 2, s.nkv = 700, s.d = 64, s.dv = 64, s.seed = 13;
  paged_decode_equals_contiguous(s);
  // 10 KV heads over 5 chunks: groups of 8 and 2 (at least 4 tasks per
  // thread: SequenceSchedule::head_group); 3 rows per KV head.
  Shape t;
  t.H = 30, t.Hkv = 10, t.nkv = 2100, t.d = 32, t.dv = 64, t.seed = 15;
  paged_decode_equals_contiguous(t);
}

// A contiguous cache whose rows interleave the KV heads ([n, H_kv, d] seen
// as [1, H_kv, n, d]: its KV heads run block by block in one task) gives
// the bits of the same values stored head after head.
TEST(AttentionUnits, InterleavedDecodeEqualsContiguous) {
  Restore restore;
  if (!has_unit("model")) GTEST_SKIP() << "no FMA target: no units path";
  Shape s;
  s.H = 36, s.Hkv = 9, s.nkv = 1100, s.d = 64, s.dv = 32, s.seed = 16;
  const Bf16Case c = make_case(s);
  std::vector<BFloat16> k(s.nkv * s.Hkv * s.d), v(s.nkv * s.Hkv * s.dv);
  for (std::size_t h = 0; h < s.Hkv; ++h)
    for (std::size_t j = 0; j < s.nkv; ++j) {
      for (std::size_t x = 0; x < s.d; ++x)
        k[(j * s.Hkv + h) * s.d + x] = c.p.k.at(0, h, j, x);
      for (std::size_t x = 0; x < s.dv; ++x)
        v[(j * s.Hkv + h) * s.dv + x] = c.p.v.at(0, h, j, x);
    }
  AttentionOptions o;
  for (const std::string unit : {"model", "avx512bf16"}) {
    if (!has_unit(unit)) continue;
    const Result want = run_unit(c, o, unit);
    softdot::force_matrix_unit(unit);
    Result got{Tensor<float>(s.B, s.H, s.nq, s.dv, 0, kOutSentinel, 0),
               std::vector<float>(s.B * s.H * s.nq + kLseGuard, kLseSentinel)};
    AttentionRequest req;
    req.name = "attention";
    req.q = c.q16.cview();
    req.kv = KVSource::contiguous(
        TensorView<const BFloat16>(k.data(), 1, s.Hkv, s.nkv, s.d, 0, s.d,
                                   s.Hkv * s.d),
        TensorView<const BFloat16>(v.data(), 1, s.Hkv, s.nkv, s.dv, 0, s.dv,
                                   s.Hkv * s.dv));
    req.target = AttentionTarget::output(got.o.view(), got.lse.data());
    req.options = o;
    // 1 thread: groups of 8 and 1; 2 threads: of 4, 4 and 1.
    for (int threads : {1, 2}) {
      with_threads(threads, [&] {
        softdot::run_attention(req);
        return 0;
      });
      EXPECT_TRUE(SameBits(want.all(), got.all()))
          << unit << ", " << threads << " threads";
    }
    softdot::force_matrix_unit("");
  }
}

}  // namespace
