// attention_backward(): the gradients against a long double reference of
// the exact gradients of the same float inputs, within the bound of
// docs/accuracy.md ("Attention backward"); bitwise the same for any thread
// count and target; special values; argument errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attention_test_util.h"
#include "softdot/attention.h"

namespace softdot_test {
namespace {

using softdot::AttentionGradients;

// The exact gradients (long double) of the float inputs' attention.
struct GradRef {
  std::vector<LD> dq, dk, dv, dbias, dsinks;
  // Per element, the magnitude the error is measured against (below).
  std::vector<double> cq, ck, cv, cb;
  std::vector<double> D;  // per row: the score's rounding bound D_i
};

struct Case {
  Shape s;
  AttentionOptions o;
  Tensor<float> dout;
  std::uint64_t seed = 7;
};

// Key j visible to row i under o (default positions: row i at
// i + n_kv - n_q), before the mask and the bias.
bool in_range(const AttentionOptions& o, std::size_t nq, std::size_t nkv,
              std::size_t i, std::size_t j) {
  const std::size_t end = std::min(o.kv_end, nkv);
  if (j < o.kv_begin || j >= end) return false;
  const auto pos =
      static_cast<std::int64_t>(i + nkv) - static_cast<std::int64_t>(nq);
  const auto jj = static_cast<std::int64_t>(j);
  const std::int64_t wr = o.causal ? 0 : o.window_right;
  const std::int64_t wl = o.window_left;
  if (wr >= 0 && jj > pos + wr) return false;
  if (wl >= 0 && jj < pos - wl) return false;
  return true;
}

GradRef grad_reference(const Problem<float>& p, const AttentionOptions& o,
                       const Tensor<float>& dout) {
  const Shape& s = p.s;
  const std::size_t g = s.H / s.Hkv;
  const float scale = softdot_ref::attention_scale(o.scale, s.d);
  const AttnRef fwd = reference(p, o);
  GradRef r;
  r.dq.assign(s.B * s.H * s.nq * s.d, 0);
  r.cq.assign(r.dq.size(), 0);
  r.dk.assign(s.B * s.Hkv * s.nkv * s.d, 0);
  r.ck.assign(r.dk.size(), 0);
  r.dv.assign(s.B * s.Hkv * s.nkv * s.dv, 0);
  r.cv.assign(r.dv.size(), 0);
  r.dbias.assign(s.B * s.H * s.nq * s.nkv, 0);
  r.cb.assign(r.dbias.size(), 0);
  r.dsinks.assign(s.H, 0);
  r.D = fwd.D;
  const LD cap = o.softcap;
  for (std::size_t b = 0; b < s.B; ++b) {
    for (std::size_t h = 0; h < s.H; ++h) {
      const std::size_t kh = h / g;
      for (std::size_t i = 0; i < s.nq; ++i) {
        const std::size_t row = (b * s.H + h) * s.nq + i;
        // Scores, weights (with the sink), dP.
        std::vector<LD> sc(s.nkv), pw(s.nkv, 0), dp(s.nkv, 0), capd(s.nkv, 1);
        std::vector<char> vis(s.nkv, 0);
        LD m = -INFINITY;
        const bool sink = !o.sinks.empty();
        const LD sk = sink ? LD(o.sinks[h]) : -INFINITY;
        if (sink) m = sk;
        for (std::size_t j = 0; j < s.nkv; ++j) {
          if (!in_range(o, s.nq, s.nkv, i, j)) continue;
          if (!o.mask.empty()) {
            const std::size_t mb = o.mask.batch == 1 ? 0 : b;
            const std::size_t mh = o.mask.heads == 1 ? 0 : h;
            if (!o.mask.row(mb, mh, i)[j]) continue;
          }
          LD t = 0;
          for (std::size_t c = 0; c < s.d; ++c) {
            t += LD(p.q.at(b, h, i, c)) * LD(p.kw.at(b, kh, j, c));
          }
          t *= LD(scale);
          LD x = t;
          if (cap > 0) {
            const LD th = std::tanh(t / cap);
            x = cap * th;
            capd[j] = 1 - th * th;
          }
          if (!o.bias.empty()) {
            const std::size_t bb = o.bias.batch == 1 ? 0 : b;
            const std::size_t bh = o.bias.heads == 1 ? 0 : h;
            const float bv = o.bias.row(bb, bh, i)[j];
            if (bv == -kInfF) continue;
            x += LD(bv);
          }
          vis[j] = 1;
          sc[j] = x;
          m = std::max(m, x);
        }
        LD den = sink ? std::exp(sk - m) : 0;
        for (std::size_t j = 0; j < s.nkv; ++j) {
          if (vis[j]) den += std::exp(sc[j] - m);
        }
        if (den == 0) continue;  // no key: zero gradients
        LD delta = 0;
        for (std::size_t j = 0; j < s.nkv; ++j) {
          if (!vis[j]) continue;
          pw[j] = std::exp(sc[j] - m) / den;
          for (std::size_t c = 0; c < s.dv; ++c) {
            dp[j] += LD(dout.at(b, h, i, c)) * LD(p.vw.at(b, kh, j, c));
          }
          delta += pw[j] * dp[j];
        }
        if (sink) {
          r.dsinks[h] -= std::exp(sk - m) / den * delta;
        }
        for (std::size_t j = 0; j < s.nkv; ++j) {
          if (!vis[j]) continue;
          double dpabs = 0;
          for (std::size_t c = 0; c < s.dv; ++c) {
            dpabs += std::fabs(double(dout.at(b, h, i, c)) *
                               double(p.vw.at(b, kh, j, c)));
          }
          const LD ds = pw[j] * (dp[j] - delta);
          const double cds =
              double(pw[j]) * (dpabs + std::fabs(double(delta)) +
                               std::fabs(double(dp[j] - delta)) *
                                   (1 + std::fabs(double(sc[j]))));
          r.dbias[row * s.nkv + j] = ds;
          r.cb[row * s.nkv + j] = cds;
          const LD dt = ds * capd[j];
          for (std::size_t c = 0; c < s.d; ++c) {
            r.dq[row * s.d + c] += LD(scale) * dt * LD(p.kw.at(b, kh, j, c));
            r.cq[row * s.d + c] +=
                double(scale) * cds * std::fabs(double(p.kw.at(b, kh, j, c)));
            const std::size_t ki = ((b * s.Hkv + kh) * s.nkv + j) * s.d + c;
            r.dk[ki] += LD(scale) * dt * LD(p.q.at(b, h, i, c));
            r.ck[ki] +=
                double(scale) * cds * std::fabs(double(p.q.at(b, h, i, c)));
          }
          for (std::size_t c = 0; c < s.dv; ++c) {
            const std::size_t vi = ((b * s.Hkv + kh) * s.nkv + j) * s.dv + c;
            r.dv[vi] += pw[j] * LD(dout.at(b, h, i, c));
            r.cv[vi] += double(pw[j]) * std::fabs(double(dout.at(b, h, i, c)));
          }
        }
      }
    }
  }
  return r;
}

struct Grads {
  Tensor<float> dq, dk, dv, dbias;
  std::vector<float> dsinks;
  std::vector<float> all() const {
    std::vector<float> a = dq.dense();
    for (const auto* t : {&dk, &dv, &dbias}) {
      const auto x = t->dense();
      a.insert(a.end(), x.begin(), x.end());
    }
    a.insert(a.end(), dsinks.begin(), dsinks.end());
    return a;
  }
};

Tensor<float> random_dout(const Shape& s, std::uint64_t seed) {
  Tensor<float> t(s.B, s.H, s.nq, s.dv, s.pad, kNaNF, s.off);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  t.for_each([&](float& x) { x = float(u(rng)); });
  return t;
}

Grads run_backward(const Problem<float>& p, const AttentionOptions& o,
                   const Tensor<float>& dout, bool want_dbias = false) {
  const Shape& s = p.s;
  const Result fwd = run(p, o);
  Grads g;
  g.dq = Tensor<float>(s.B, s.H, s.nq, s.d, s.pad + 1, kOutSentinel, s.off);
  g.dk = Tensor<float>(s.B, s.Hkv, s.nkv, s.d, s.pad, kOutSentinel, s.off);
  g.dv = Tensor<float>(s.B, s.Hkv, s.nkv, s.dv, s.pad, kOutSentinel, s.off);
  AttentionGradients gr;
  gr.dq = g.dq.view();
  gr.dk = g.dk.view();
  gr.dv = g.dv.view();
  if (want_dbias) {
    g.dbias = Tensor<float>(s.B, s.H, s.nq, s.nkv, 0, kOutSentinel);
    gr.dbias = g.dbias.view();
  }
  if (!o.sinks.empty()) {
    g.dsinks.assign(s.H, kOutSentinel);
    gr.dsinks = g.dsinks;
  }
  softdot::attention_backward(p.q.cview(), p.k.cview(), p.v.cview(),
                              fwd.o.cview(), fwd.lse.data(), dout.cview(), gr,
                              o);
  return g;
}

// The bound of attention.h / docs/accuracy.md: each gradient element within
// (2 D_i + kC u) of its condition (the sum of its terms' magnitudes, each
// dS term weighted as the reference's cb), D_i the score's rounding.
constexpr double kC = 96;

struct Worst {
  double units = 0;  // the largest error over condition, in u
  std::string where;
};

void check_grads(const std::string& label, const Problem<float>& p,
                 const AttentionOptions& o, const Tensor<float>& dout,
                 Worst* worst = nullptr) {
  const Shape& s = p.s;
  const GradRef r = grad_reference(p, o, dout);
  const Grads g = run_backward(p, o, dout, /*want_dbias=*/true);
  double Dmax = 0;
  for (double x : r.D) {
    if (std::isfinite(x)) Dmax = std::max(Dmax, x);
  }
  const double tol = 2 * Dmax + kC * kU;
  Worst w;
  auto check = [&](const char* name, float got, LD want, double cond,
                   std::size_t at) {
    const double err = std::fabs(double(LD(got) - want));
    const double lim = tol * cond + 1e-37;
    if (!(err <= lim)) {
      ADD_FAILURE() << label << ": " << name << "[" << at << "] = " << got
                    << ", exact " << double(want) << ", error " << err
                    << " > bound " << lim;
    }
    if (cond > 0) {
      const double units = err / cond / kU;
      if (units > w.units)
        w = {units, std::string(name) + "[" + std::to_string(at) + "]"};
    }
  };
  const auto dq = g.dq.dense(), dk = g.dk.dense(), dv = g.dv.dense(),
             db = g.dbias.dense();
  for (std::size_t i = 0; i < dq.size(); ++i)
    check("dq", dq[i], r.dq[i], r.cq[i], i);
  for (std::size_t i = 0; i < dk.size(); ++i)
    check("dk", dk[i], r.dk[i], r.ck[i], i);
  for (std::size_t i = 0; i < dv.size(); ++i)
    check("dv", dv[i], r.dv[i], r.cv[i], i);
  for (std::size_t i = 0; i < db.size(); ++i)
    check("dbias", db[i], r.dbias[i], r.cb[i], i);
  for (std::size_t h = 0; h < g.dsinks.size(); ++h) {
    EXPECT_NEAR(double(g.dsinks[h]), double(r.dsinks[h]),
                1e-5 * (1 + std::fabs(double(r.dsinks[h]))))
        << label << " dsinks[" << h << "]";
  }
  EXPECT_TRUE(padding_intact(g.dq, kOutSentinel)) << label;
  if (worst) *worst = w;
  std::printf("  %-40s worst %.1f u (%s), bound 2D + %.0f u = %.1f u\n",
              label.c_str(), w.units, w.where.c_str(), kC, tol / kU);
  (void)s;
}

Shape shape(std::size_t B, std::size_t H, std::size_t Hkv, std::size_t nq,
            std::size_t nkv, std::size_t d, std::size_t dv,
            std::uint64_t seed = 1) {
  Shape s;
  s.B = B, s.H = H, s.Hkv = Hkv, s.nq = nq, s.nkv = nkv, s.d = d, s.dv = dv;
  s.seed = seed;
  return s;
}

TEST(AttentionBackward, MatchesTheExactGradients) {
  struct C {
    const char* name;
    Shape s;
    AttentionOptions o;
  };
  std::vector<C> cases;
  AttentionOptions plain, causal, window, capped, range;
  causal.causal = true;
  window.window_left = 20;
  window.window_right = 5;
  capped.softcap = 5.0f;
  capped.causal = true;
  range.kv_begin = 10;
  range.kv_end = 100;
  cases.push_back({"plain", shape(1, 2, 2, 70, 90, 64, 64), plain});
  cases.push_back({"causal GQA", shape(2, 4, 2, 100, 100, 32, 48, 2), causal});
  cases.push_back({"window", shape(1, 2, 1, 40, 130, 16, 16, 3), window});
  cases.push_back({"softcap", shape(1, 2, 2, 65, 65, 24, 8, 4), capped});
  cases.push_back({"kv_range", shape(1, 1, 1, 33, 120, 20, 17, 5), range});
  cases.push_back({"decode shape", shape(1, 8, 2, 1, 300, 64, 64, 6), plain});
  cases.push_back({"d=1", shape(1, 1, 1, 17, 19, 1, 3, 7), causal});
  for (auto& c : cases) {
    c.s.qk = 2.0;
    const auto p = make_problem<float>(c.s);
    const auto dout = random_dout(c.s, c.s.seed + 100);
    check_grads(c.name, p, c.o, dout);
  }
}

TEST(AttentionBackward, MaskBiasSinksAndTheirGradients) {
  Shape s = shape(2, 4, 2, 50, 80, 32, 32, 11);
  s.qk = 1.5;
  const auto p = make_problem<float>(s);
  const auto dout = random_dout(s, 99);
  std::mt19937_64 rng(5);
  Tensor<bool> mask(1, s.H, s.nq, s.nkv, 0, false);
  mask.for_each([&](bool& x) { x = (rng() % 4) != 0; });
  Tensor<float> bias(s.B, 1, s.nq, s.nkv, 0, 0.0f);
  std::normal_distribution<double> nd(0, 2);
  bias.for_each(
      [&](float& x) { x = (rng() % 10) == 0 ? -kInfF : float(nd(rng)); });
  std::vector<float> sinks = {0.5f, -1.0f, 2.0f, -kInfF};
  AttentionOptions o;
  o.mask = mask.cview();
  check_grads("mask", p, o, dout);
  AttentionOptions ob;
  ob.bias = bias.cview();
  ob.causal = true;
  check_grads("bias causal", p, ob, dout);
  AttentionOptions os;
  os.sinks = sinks;
  os.softcap = 3.0f;
  check_grads("sinks softcap", p, os, dout);
}

// Bitwise the same for 1 and 2 threads and on every FMA target.
TEST(AttentionBackward, SameBitsForAnyThreadCountAndTarget) {
  Shape s = shape(1, 4, 2, 300, 300, 64, 64, 21);
  const auto p = make_problem<float>(s);
  const auto dout = random_dout(s, 3);
  AttentionOptions o;
  o.causal = true;
  const auto one =
      with_threads(1, [&] { return run_backward(p, o, dout).all(); });
  for (int t : {2, 3, 5}) {
    const auto many =
        with_threads(t, [&] { return run_backward(p, o, dout).all(); });
    ASSERT_EQ(many.size(), one.size());
    for (std::size_t i = 0; i < one.size(); ++i) {
      ASSERT_EQ(bits(many[i]), bits(one[i])) << t << " threads, element " << i;
    }
  }
  for (const auto& target : fma_targets()) {
    softdot::force_simd_target(target);
    const auto got = run_backward(p, o, dout).all();
    softdot::force_simd_target("");
    for (std::size_t i = 0; i < one.size(); ++i) {
      ASSERT_EQ(bits(got[i]), bits(one[i])) << target << ", element " << i;
    }
  }
}

TEST(AttentionBackward, FullyMaskedRowsGiveZerosWhateverDoutHolds) {
  Shape s = shape(1, 1, 1, 8, 8, 16, 16, 31);
  auto p = make_problem<float>(s);
  auto dout = random_dout(s, 4);
  Tensor<bool> mask(1, 1, s.nq, s.nkv, 0, true);
  for (std::size_t j = 0; j < s.nkv; ++j) mask.at(0, 0, 2, j) = false;
  // The masked row's dout holds inf and NaN; key 5 (hidden from row 3)
  // holds NaN in K and V.
  dout.at(0, 0, 2, 0) = kInfF;
  dout.at(0, 0, 2, 1) = kNaNF;
  mask.at(0, 0, 3, 5) = false;
  AttentionOptions o;
  o.mask = mask.cview();
  const auto g = run_backward(p, o, dout, true);
  for (std::size_t c = 0; c < s.d; ++c) {
    EXPECT_EQ(bits(g.dq.at(0, 0, 2, c)), bits(0.0f)) << c;
  }
  for (std::size_t j = 0; j < s.nkv; ++j) {
    for (std::size_t c = 0; c < s.d; ++c) {
      EXPECT_TRUE(std::isfinite(g.dk.at(0, 0, j, c))) << j << " " << c;
    }
    for (std::size_t c = 0; c < s.dv; ++c) {
      EXPECT_TRUE(std::isfinite(g.dv.at(0, 0, j, c))) << j << " " << c;
    }
    EXPECT_EQ(bits(g.dbias.at(0, 0, 2, j)), bits(0.0f));
  }
  // NaN in a hidden key's K and V reaches no gradient of row 3.
  auto p2 = p;
  for (std::size_t c = 0; c < s.d; ++c) p2.k.at(0, 0, 5, c) = kNaNF;
  for (std::size_t c = 0; c < s.dv; ++c) p2.v.at(0, 0, 5, c) = kNaNF;
  p2.rewiden();
  Tensor<bool> only5(1, 1, s.nq, s.nkv, 0, true);
  for (std::size_t i = 0; i < s.nq; ++i) only5.at(0, 0, i, 5) = false;
  o.mask = only5.cview();
  const auto g2 = run_backward(p2, o, random_dout(s, 4), true);
  for (std::size_t i = 0; i < s.nq; ++i) {
    for (std::size_t c = 0; c < s.d; ++c) {
      EXPECT_TRUE(std::isfinite(g2.dq.at(0, 0, i, c))) << i << " " << c;
    }
  }
}

TEST(AttentionBackward, NanStaysInTheRowsThatSeeIt) {
  Shape s = shape(1, 1, 1, 6, 10, 8, 8, 41);
  auto p = make_problem<float>(s);
  const auto dout = random_dout(s, 5);
  p.q.at(0, 0, 4, 3) = kNaNF;  // row 4's query
  AttentionOptions o;
  o.causal = true;  // row 4 sees keys 0 .. 8
  const auto g = run_backward(p, o, dout);
  for (std::size_t i = 0; i < s.nq; ++i) {
    EXPECT_EQ(std::isnan(g.dq.at(0, 0, i, 0)), i == 4) << i;
  }
  for (std::size_t j = 0; j < s.nkv; ++j) {
    EXPECT_EQ(std::isnan(g.dv.at(0, 0, j, 0)), j <= 8) << j;
  }
}

TEST(AttentionBackward, InfiniteScoresTakeTheLimit) {
  Shape s = shape(1, 1, 1, 2, 6, 4, 4, 51);
  auto p = make_problem<float>(s);
  const auto dout = random_dout(s, 6);
  Tensor<float> bias(1, 1, s.nq, s.nkv, 0, 0.0f);
  bias.at(0, 0, 0, 1) = kInfF;
  bias.at(0, 0, 0, 4) = kInfF;
  for (std::size_t j = 0; j < s.nkv; ++j) bias.at(0, 0, 1, j) = -kInfF;
  AttentionOptions o;
  o.bias = bias.cview();
  const auto g = run_backward(p, o, dout, true);
  // Row 0 weighs keys 1 and 4 by 1/2 each (the forward's limit); row 1
  // sees nothing. So dV_j is dO_0 / 2 at keys 1 and 4 and 0 elsewhere.
  for (std::size_t j = 0; j < s.nkv; ++j) {
    for (std::size_t c = 0; c < s.dv; ++c) {
      const float want = (j == 1 || j == 4) ? dout.at(0, 0, 0, c) / 2 : 0.0f;
      EXPECT_EQ(g.dv.at(0, 0, j, c), want) << j << " " << c;
    }
  }
  // dS of row 0 at keys 1 and 4: (dP_j - (dP_1 + dP_4) / 2) / 2.
  double dp[2] = {0, 0};
  for (std::size_t c = 0; c < s.dv; ++c) {
    dp[0] += double(dout.at(0, 0, 0, c)) * double(p.vw.at(0, 0, 1, c));
    dp[1] += double(dout.at(0, 0, 0, c)) * double(p.vw.at(0, 0, 4, c));
  }
  EXPECT_NEAR(g.dbias.at(0, 0, 0, 1), (dp[0] - dp[1]) / 4, 1e-6);
  EXPECT_NEAR(g.dbias.at(0, 0, 0, 4), (dp[1] - dp[0]) / 4, 1e-6);
  for (float x : g.all()) EXPECT_FALSE(std::isnan(x));
  for (std::size_t c = 0; c < s.d; ++c) EXPECT_EQ(g.dq.at(0, 0, 1, c), 0.0f);
}

// Shards of the keys cut at multiples of 64 add up, in place, to the
// whole call's bits (the blocks and their order are the same).
TEST(AttentionBackward, PartialsOverKeyShardsGiveTheWholeCallsBits) {
  Shape s = shape(2, 4, 2, 150, 200, 32, 24, 71);
  const auto p = make_problem<float>(s);
  const auto dout = random_dout(s, 8);
  AttentionOptions o;
  o.causal = true;
  std::vector<float> sinks = {0.25f, -0.5f, 1.0f, 0.0f};
  o.sinks = sinks;
  const Grads whole = run_backward(p, o, dout);
  const Result fwd = run(p, o);
  for (int threads : {1, 2}) {
    auto part = softdot::AttentionGradientPartial::zeros(s.B, s.H, s.Hkv, s.nq,
                                                         s.nkv, s.d, s.dv);
    std::vector<float> dsinks(s.H, kOutSentinel);
    for (auto [a, b] :
         {std::pair<std::size_t, std::size_t>{128, 200}, {0, 64}, {64, 128}}) {
      AttentionOptions oo = o;
      oo.kv_begin = a;
      oo.kv_end = b;
      AttentionGradients extras;
      if (a == 0) extras.dsinks = dsinks;
      with_threads(threads, [&] {
        softdot::attention_backward_partial(
            p.q.cview(), p.k.cview(), p.v.cview(), fwd.o.cview(),
            fwd.lse.data(), dout.cview(), part, oo, extras);
        return 0;
      });
    }
    Tensor<float> dq(s.B, s.H, s.nq, s.d, 0, 0.0f),
        dk(s.B, s.Hkv, s.nkv, s.d, 0, 0.0f),
        dv(s.B, s.Hkv, s.nkv, s.dv, 0, 0.0f);
    const float scale = softdot_ref::attention_scale(o.scale, s.d);
    softdot::attention_backward_finalize(part, scale, dq.view(), dk.view(),
                                         dv.view());
    const auto want = whole.all();
    std::vector<float> got = dq.dense();
    for (const auto* t : {&dk, &dv}) {
      const auto x = t->dense();
      got.insert(got.end(), x.begin(), x.end());
    }
    got.insert(got.end(), dsinks.begin(), dsinks.end());
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(bits(got[i]), bits(want[i])) << threads << " threads, " << i;
    }
  }
  // A partial of other shapes is refused with the shapes named.
  auto bad = softdot::AttentionGradientPartial::zeros(1, 1, 1, 1, 1, 1, 1);
  expect_invalid("partial shape",
                 [&] {
                   softdot::attention_backward_partial(
                       p.q.cview(), p.k.cview(), p.v.cview(), fwd.o.cview(),
                       fwd.lse.data(), dout.cview(), bad, o);
                 },
                 {"partial", "zeros"});
}

// dlse: the gradient of lse enters as Delta - dlse; against finite
// differences of lse in long double through the reference.
TEST(AttentionBackward, TheGradientOfLse) {
  Shape s = shape(1, 2, 1, 20, 30, 16, 16, 81);
  const auto p = make_problem<float>(s);
  Tensor<float> zero(s.B, s.H, s.nq, s.dv, 0, 0.0f);
  const Result fwd = run(p, {});
  std::vector<float> dlse(s.B * s.H * s.nq);
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> u(-1, 1);
  for (float& x : dlse) x = float(u(rng));
  Tensor<float> dq(s.B, s.H, s.nq, s.d, 0, 0.0f),
      dk(s.B, s.Hkv, s.nkv, s.d, 0, 0.0f), dv(s.B, s.Hkv, s.nkv, s.dv, 0, 0.0f);
  AttentionGradients g;
  g.dq = dq.view();
  g.dk = dk.view();
  g.dv = dv.view();
  softdot::attention_backward(p.q.cview(), p.k.cview(), p.v.cview(),
                              fwd.o.cview(), fwd.lse.data(), zero.cview(), g,
                              {}, dlse.data());
  // d/dq of sum_i dlse_i lse_i = sum_i dlse_i scale sum_j P_ij K_j.
  const AttnRef r = reference(p, {}, /*weights=*/true);
  const float scale = softdot_ref::attention_scale(std::nan(""), s.d);
  for (std::size_t h = 0; h < s.H; ++h) {
    for (std::size_t i = 0; i < s.nq; ++i) {
      for (std::size_t c = 0; c < s.d; ++c) {
        LD want = 0;
        for (std::size_t j = 0; j < s.nkv; ++j) {
          want += r.weights[r.wi(0, h, i, j)] * LD(p.kw.at(0, 0, j, c));
        }
        want *= LD(scale) * LD(dlse[h * s.nq + i]);
        EXPECT_NEAR(double(dq.at(0, h, i, c)), double(want), 1e-6)
            << h << " " << i;
      }
    }
  }
  // dV gets nothing from lse.
  for (float x : dv.dense()) EXPECT_EQ(x, 0.0f);
}

// float64: the forward and the gradients within a few 2^-53 of the long
// double reference (the gradient's condition as for float32).
TEST(AttentionBackward, Float64WithinAFewUlpOfDouble) {
  Shape s = shape(2, 4, 2, 40, 50, 16, 12, 91);
  const auto p = make_problem<float>(s);
  const auto dout = random_dout(s, 12);
  std::vector<float> sinks = {0.5f, -1.0f, 2.0f, 0.0f};
  for (int variant = 0; variant < 3; ++variant) {
    AttentionOptions o;
    o.causal = variant != 1;
    if (variant == 1) o.softcap = 3.0f;
    if (variant == 2) o.sinks = sinks;
    auto to64 = [](const Tensor<float>& t) {
      std::vector<double> x = {};
      for (float f : t.dense()) x.push_back(f);
      return x;
    };
    const auto q = to64(p.q), k = to64(p.kw), v = to64(p.vw), g = to64(dout);
    using V = TensorView<const double>;
    const V qv(q.data(), s.B, s.H, s.nq, s.d),
        kv(k.data(), s.B, s.Hkv, s.nkv, s.d),
        vv(v.data(), s.B, s.Hkv, s.nkv, s.dv),
        gv(g.data(), s.B, s.H, s.nq, s.dv);
    std::vector<double> out(s.B * s.H * s.nq * s.dv), lse(s.B * s.H * s.nq);
    softdot::attention(qv, kv, vv,
                       TensorView<double>(out.data(), s.B, s.H, s.nq, s.dv), o,
                       lse.data());
    const AttnRef fr = reference(p, o);
    // The reference rounds the scale to float; the float64 call uses
    // 1/sqrt(d) exactly: d = 16 gives 0.25 in both.
    for (std::size_t x = 0; x < out.size(); ++x) {
      EXPECT_NEAR(out[x], double(fr.out[x]), 1e-14) << variant << " out " << x;
    }
    std::vector<double> dq(q.size()), dk(k.size()), dv(v.size()), ds(s.H);
    softdot::AttentionGradients64 gr;
    gr.dq = TensorView<double>(dq.data(), s.B, s.H, s.nq, s.d);
    gr.dk = TensorView<double>(dk.data(), s.B, s.Hkv, s.nkv, s.d);
    gr.dv = TensorView<double>(dv.data(), s.B, s.Hkv, s.nkv, s.dv);
    if (variant == 2) gr.dsinks = ds;
    softdot::attention_backward(
        qv, kv, vv, TensorView<const double>(out.data(), s.B, s.H, s.nq, s.dv),
        lse.data(), gv, gr, o);
    const GradRef r = grad_reference(p, o, dout);
    auto check = [&](const char* name, const std::vector<double>& got,
                     const std::vector<LD>& want,
                     const std::vector<double>& cond) {
      for (std::size_t x = 0; x < got.size(); ++x) {
        const double err = std::fabs(double(LD(got[x]) - want[x]));
        EXPECT_LE(
            err, 64 * 0x1p-53 * (cond[x] + std::fabs(double(want[x]))) + 1e-300)
            << variant << " " << name << "[" << x << "]";
      }
    };
    check("dq", dq, r.dq, r.cq);
    check("dk", dk, r.dk, r.ck);
    check("dv", dv, r.dv, r.cv);
    for (std::size_t h = 0; h < ds.size() && variant == 2; ++h) {
      EXPECT_NEAR(ds[h], double(r.dsinks[h]),
                  1e-13 * (1 + std::fabs(double(r.dsinks[h]))));
    }
  }
}

// 16-bit gradients: the float32 backward of the widened inputs, rounded once
// from double to the 16-bit format.
TEST(AttentionBackward, SixteenBitGradientsAreTheFloatOnesRoundedOnce) {
  Shape s = shape(1, 4, 2, 70, 80, 32, 16, 101);
  s.qk = 1.5;
  auto p = make_problem<float>(s);
  // The inputs on the bfloat16 grid.
  auto grid = [](Tensor<float>& t) {
    t.for_each(
        [](float& x) { x = softdot::to_float(softdot::to_bfloat16(x)); });
  };
  grid(p.q);
  grid(p.k);
  grid(p.v);
  p.rewiden();
  auto dout = random_dout(s, 13);
  grid(dout);
  AttentionOptions o;
  o.causal = true;
  const Grads g32 = run_backward(p, o, dout);
  const Result fwd = run(p, o);
  auto to16 = [](const Tensor<float>& t) {
    Tensor<BFloat16> x(t.B, t.H, t.R, t.C, 0, BFloat16{});
    for (std::size_t b = 0; b < t.B; ++b)
      for (std::size_t h = 0; h < t.H; ++h)
        for (std::size_t r = 0; r < t.R; ++r)
          for (std::size_t c = 0; c < t.C; ++c)
            x.at(b, h, r, c) = softdot::to_bfloat16(t.at(b, h, r, c));
    return x;
  };
  const auto q16 = to16(p.q), k16 = to16(p.kw), v16 = to16(p.vw),
             g16 = to16(dout);
  Tensor<BFloat16> dq(s.B, s.H, s.nq, s.d, 0, BFloat16{}),
      dk(s.B, s.Hkv, s.nkv, s.d, 0, BFloat16{}),
      dv(s.B, s.Hkv, s.nkv, s.dv, 0, BFloat16{});
  softdot::AttentionGradients16<BFloat16> gr;
  gr.dq = dq.view();
  gr.dk = dk.view();
  gr.dv = dv.view();
  softdot::attention_backward(q16.cview(), k16.cview(), v16.cview(),
                              fwd.o.cview(), fwd.lse.data(), g16.cview(), gr,
                              o);
  auto near = [](const char* name, const Tensor<BFloat16>& got,
                 const Tensor<float>& want) {
    const auto a = got.dense();
    const auto b = want.dense();
    for (std::size_t i = 0; i < a.size(); ++i) {
      const float x = softdot::to_float(a[i]);
      // One bfloat16 rounding of the double sum, which is within a few float
      // roundings of the float32 result.
      EXPECT_LE(std::fabs(x - b[i]), std::fabs(b[i]) * 0x1p-8f + 1e-30f)
          << name << "[" << i << "]";
    }
  };
  near("dq", dq, g32.dq);
  near("dk", dk, g32.dk);
  near("dv", dv, g32.dv);
}

TEST(AttentionBackward, ErrorsNameTheArgument) {
  Shape s = shape(1, 2, 1, 4, 5, 8, 8, 61);
  const auto p = make_problem<float>(s);
  const auto dout = random_dout(s, 7);
  const Result fwd = run(p, {});
  Tensor<float> dq(1, 2, 4, 8, 0, 0.0f), dk(1, 1, 5, 8, 0, 0.0f),
      dv(1, 1, 5, 8, 0, 0.0f), bad(1, 2, 4, 7, 0, 0.0f);
  AttentionGradients g;
  g.dq = dq.view();
  g.dk = dk.view();
  g.dv = dv.view();
  auto call = [&](AttentionGradients gg, const float* lse,
                  const AttentionOptions& o) {
    softdot::attention_backward(p.q.cview(), p.k.cview(), p.v.cview(),
                                fwd.o.cview(), lse, dout.cview(), gg, o);
  };
  expect_invalid("null lse", [&] { call(g, nullptr, {}); }, {"lse"});
  AttentionGradients g2 = g;
  g2.dq = bad.view();
  expect_invalid("dq shape", [&] { call(g2, fwd.lse.data(), {}); },
                 {"dq", "q"});
  std::vector<float> ds(2);
  AttentionGradients g3 = g;
  g3.dsinks = ds;
  expect_invalid("dsinks without sinks", [&] { call(g3, fwd.lse.data(), {}); },
                 {"dsinks"});
  AttentionGradients g4 = g;
  g4.dk = TensorView<float>(dq.data(), 1, 1, 5, 8);
  expect_invalid("dk overlaps dq", [&] { call(g4, fwd.lse.data(), {}); },
                 {"dk", "dq"});
}

}  // namespace
}  // namespace softdot_test
