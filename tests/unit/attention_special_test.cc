// Attention tests: the special values of the contract (README, "Special
// values") on every target: fully masked rows, NaN in queries, keys and values,
// masked junk that never leaks, +inf scores, 16-bit inputs.
#include "attention_test_util.h"

namespace softdot_test {
namespace {

// ---- special values --------------------------------------------------------

class AttentionSpecial : public PerTarget {};

// Whole rows (b, h, i) of x and y are the same bits.
bool same_row(const Result& x, const Result& y, std::size_t b, std::size_t h,
              std::size_t i) {
  for (std::size_t c = 0; c < x.o.C; ++c) {
    if (!same_value(x.o.at(b, h, i, c), y.o.at(b, h, i, c))) return false;
  }
  const std::size_t row = (b * x.o.H + h) * x.o.R + i;
  return same_value(x.lse[row], y.lse[row]);
}

bool zero_row(const Result& x, std::size_t b, std::size_t h, std::size_t i) {
  for (std::size_t c = 0; c < x.o.C; ++c) {
    if (bits(x.o.at(b, h, i, c)) != 0u) return false;
  }
  const std::size_t row = (b * x.o.H + h) * x.o.R + i;
  return x.lse[row] == -kInfF;
}

bool nan_row(const Result& x, std::size_t b, std::size_t h, std::size_t i) {
  for (std::size_t c = 0; c < x.o.C; ++c) {
    if (!std::isnan(x.o.at(b, h, i, c))) return false;
  }
  const std::size_t row = (b * x.o.H + h) * x.o.R + i;
  return std::isnan(x.lse[row]);
}

// Checks that the rows where `masked(b, h, i)` are +0 with lse -inf and
// the others match the reference.
template <class KV>
void expect_fully_masked(const std::string& what, const Problem<KV>& p,
                         const AttentionOptions& o, const RowFilter& masked) {
  const Result r = run(p, o);
  const AttnRef ref = reference(p, o);
  std::size_t n_masked = 0, fails = 0;
  for (std::size_t b = 0; b < p.s.B; ++b)
    for (std::size_t h = 0; h < p.s.H; ++h)
      for (std::size_t i = 0; i < p.s.nq; ++i) {
        if (!masked(b, h, i)) continue;
        ++n_masked;
        ATTN_EXPECT(zero_row(r, b, h, i), fails)
            << what << ": row b=" << b << " h=" << h << " i=" << i
            << " should be +0 with lse -inf; got " << fmt(r.o.at(b, h, i, 0))
            << ", lse " << fmt(r.lse[(b * p.s.H + h) * p.s.nq + i]);
        EXPECT_EQ(ref.visible[ref.li(b, h, i)], 0u) << what << " (test setup)";
      }
  EXPECT_GT(n_masked, 0u) << what;
  Stats st;
  check_output(ref, r.o, r.lse.data(), what, st);
  EXPECT_TRUE(r.guards_ok()) << what;
}

TEST_P(AttentionSpecial, FullyMaskedRows) {
  Shape s{.B = 2,
          .H = 2,
          .Hkv = 1,
          .nq = 9,
          .nkv = 70,
          .d = 16,
          .dv = 16,
          .pad = 1,
          .seed = 200};
  const auto p = make_problem<float>(s);
  {
    // By the mask: rows 2 and 5 of every head, batch 1 only.
    Tensor<bool> m = random_mask(2, 1, s.nq, s.nkv, 201);
    for (std::size_t j = 0; j < s.nkv; ++j) {
      m.at(1, 0, 2, j) = false;
      m.at(1, 0, 5, j) = false;
    }
    AttentionOptions o;
    o.mask = m.cview();
    expect_fully_masked("mask", p, o,
                        [](std::size_t b, std::size_t, std::size_t i) {
                          return b == 1 && (i == 2 || i == 5);
                        });
  }
  {
    // By a bias of -inf on a whole row.
    Tensor<float> bias(1, 2, s.nq, s.nkv, 0, kNaNF);
    bias.for_each([](float& x) { x = 0.5f; });
    for (std::size_t j = 0; j < s.nkv; ++j) bias.at(0, 1, 4, j) = -kInfF;
    AttentionOptions o;
    o.bias = bias.cview();
    expect_fully_masked("bias -inf", p, o,
                        [](std::size_t, std::size_t h, std::size_t i) {
                          return h == 1 && i == 4;
                        });
  }
  {
    // By causal with n_q > n_kv: the first n_q - n_kv rows.
    Shape s2 = s;
    s2.nq = 100;
    s2.nkv = 30;
    AttentionOptions o;
    o.causal = true;
    expect_fully_masked(
        "causal nq > nkv", make_problem<float>(s2), o,
        [](std::size_t, std::size_t, std::size_t i) { return i < 70; });
    expect_fully_masked(
        "causal nq > nkv", make_problem<Float16>(s2), o,
        [](std::size_t, std::size_t, std::size_t i) { return i < 70; });
  }
  {
    // By a window alone: p(i) = i - 15, keys [p - 1, p + 1] exist only
    // from i = 14 on.
    Shape s2 = s;
    s2.nq = 20;
    s2.nkv = 5;
    AttentionOptions o;
    o.window_left = 1;
    o.window_right = 1;
    expect_fully_masked(
        "window", make_problem<float>(s2), o,
        [](std::size_t, std::size_t, std::size_t i) { return i < 14; });
  }
  {
    // By the key range: empty, at the end, and entirely in the causal
    // future of the first rows. (kv_begin past n_kv is rejected by the
    // implementation; attention.h does not say either way.)
    for (auto [kb, ke] : {std::pair<std::size_t, std::size_t>{3, 3},
                          {70, kNone},
                          {70, 70},
                          {0, 0}}) {
      AttentionOptions o;
      o.kv_begin = kb;
      o.kv_end = ke;
      expect_fully_masked(
          "empty key range " + std::to_string(kb), p, o,
          [](std::size_t, std::size_t, std::size_t) { return true; });
    }
    Shape s2 = s;
    s2.nq = 70;
    AttentionOptions o;
    o.causal = true;
    o.kv_begin = 40;
    expect_fully_masked(
        "key range in the causal future", make_problem<float>(s2), o,
        [](std::size_t, std::size_t, std::size_t i) { return i < 40; });
  }
  {
    // n_kv = 0.
    Shape s2 = s;
    s2.nkv = 0;
    expect_fully_masked(
        "n_kv = 0", make_problem<float>(s2), {},
        [](std::size_t, std::size_t, std::size_t) { return true; });
    expect_fully_masked(
        "n_kv = 0", make_problem<BFloat16>(s2), {},
        [](std::size_t, std::size_t, std::size_t) { return true; });
  }
}

// NaN in a query row: that row NaN; every other row the same bits as
// without it.
TEST_P(AttentionSpecial, NaNInQueryRow) {
  Shape s{.B = 2,
          .H = 4,
          .Hkv = 2,
          .nq = 9,
          .nkv = 130,
          .d = 64,
          .dv = 32,
          .pad = 1,
          .seed = 210};
  for (bool causal : {false, true}) {
    auto p = make_problem<float>(s);
    AttentionOptions o;
    o.causal = causal;
    const Result base = run(p, o);
    p.q.at(1, 2, 3, 17) = kNaNF;
    const Result r = run(p, o);
    std::size_t fails = 0;
    for (std::size_t b = 0; b < s.B; ++b)
      for (std::size_t h = 0; h < s.H; ++h)
        for (std::size_t i = 0; i < s.nq; ++i) {
          if (b == 1 && h == 2 && i == 3) {
            EXPECT_TRUE(nan_row(r, b, h, i)) << "the NaN row";
          } else {
            ATTN_EXPECT(same_row(r, base, b, h, i), fails)
                << "row b=" << b << " h=" << h << " i=" << i << " changed";
          }
        }
  }
}

// NaN in a visible key row or value element: NaN in exactly the rows that
// see it (causal: rows with p(i) >= j; GQA: the heads of that kv head);
// the other rows the same bits.
template <class KV>
void nan_kv_case(bool in_key) {
  Shape s{.B = 1,
          .H = 4,
          .Hkv = 2,
          .nq = 100,
          .nkv = 100,
          .d = 32,
          .dv = 32,
          .pad = 1,
          .seed = 220};
  auto p = make_problem<KV>(s);
  AttentionOptions o;
  o.causal = true;
  const Result base = run(p, o);
  const std::size_t j = 40, hk = 1, col = 3;
  if (in_key) {
    p.k.at(0, hk, j, 5) = from_float<KV>(kNaNF);
  } else {
    p.v.at(0, hk, j, col) = from_float<KV>(kNaNF);
  }
  const Result r = run(p, o);
  const std::string what =
      std::string(kv_name<KV>()) + (in_key ? " NaN key" : " NaN value");
  std::size_t fails = 0;
  for (std::size_t h = 0; h < s.H; ++h)
    for (std::size_t i = 0; i < s.nq; ++i) {
      const bool sees = h / 2 == hk && i >= j;
      if (!sees) {
        ATTN_EXPECT(same_row(r, base, 0, h, i), fails)
            << what << ": row h=" << h << " i=" << i << " changed";
      } else if (in_key) {
        ATTN_EXPECT(nan_row(r, 0, h, i), fails)
            << what << ": row h=" << h << " i=" << i << " should be NaN";
      } else {
        // The NaN element; the row's other elements are either all NaN
        // (the row) or all unchanged (the element); lse is unchanged
        // (it does not depend on V).
        ATTN_EXPECT(std::isnan(r.o.at(0, h, i, col)), fails)
            << what << ": h=" << h << " i=" << i << " should be NaN";
        bool all_nan = true, all_same = true;
        for (std::size_t c = 0; c < s.dv; ++c) {
          if (c == col) continue;
          all_nan = all_nan && std::isnan(r.o.at(0, h, i, c));
          all_same =
              all_same && same_value(r.o.at(0, h, i, c), base.o.at(0, h, i, c));
        }
        ATTN_EXPECT(all_nan || all_same, fails)
            << what << ": h=" << h << " i=" << i;
        const std::size_t row = h * s.nq + i;
        EXPECT_TRUE(same_value(r.lse[row], base.lse[row]))
            << what << ": lse changed by a NaN value, h=" << h << " i=" << i;
      }
    }
}

TEST_P(AttentionSpecial, NaNInVisibleKeyOrValue) {
  nan_kv_case<float>(true);
  nan_kv_case<float>(false);
  nan_kv_case<Float16>(true);
  nan_kv_case<Float16>(false);
  nan_kv_case<BFloat16>(true);
  nan_kv_case<BFloat16>(false);
}

// Masked positions holding NaN / +-inf never reach the output: the result
// equals (bitwise) the result with finite values there, in every row that
// does not see them.
template <class KV>
void masked_junk_case(const std::string& label, const Shape& s,
                      const AttentionOptions& o,
                      const std::vector<std::size_t>& junk_keys,
                      const std::function<bool(std::size_t i)>& sees) {
  const auto base_p = make_problem<KV>(s);
  const Result base = run(base_p, o);
  const float junk[][2] = {
      {kNaNF, kNaNF}, {kInfF, -kInfF}, {-kInfF, kNaNF}, {3e38f, kInfF}};
  for (const auto& jv : junk) {
    auto p = base_p;
    for (std::size_t hk = 0; hk < s.Hkv; ++hk)
      for (std::size_t j : junk_keys) {
        for (std::size_t c = 0; c < s.d; ++c) {
          p.k.at(0, hk, j, c) = from_float<KV>(c % 2 ? jv[0] : 1.0f);
        }
        for (std::size_t c = 0; c < s.dv; ++c) {
          p.v.at(0, hk, j, c) = from_float<KV>(jv[1]);
        }
      }
    const Result r = run(p, o);
    std::size_t checked = 0, fails = 0;
    for (std::size_t h = 0; h < s.H; ++h)
      for (std::size_t i = 0; i < s.nq; ++i) {
        if (sees(i)) continue;
        ++checked;
        ATTN_EXPECT(same_row(r, base, 0, h, i), fails)
            << kv_name<KV>() << " " << label << ": junk K " << fmt(jv[0])
            << " V " << fmt(jv[1]) << " leaked into row h=" << h << " i=" << i;
      }
    EXPECT_GT(checked, 0u) << label;
  }
}

TEST_P(AttentionSpecial, MaskedJunkNeverLeaks) {
  const Shape s{.B = 1,
                .H = 2,
                .Hkv = 1,
                .nq = 30,
                .nkv = 200,
                .d = 32,
                .dv = 16,
                .pad = 1,
                .seed = 230};
  {
    // Causal future keys: p(i) = i + 170, so rows i < 20 do not see keys
    // 190.. (nor do rows before the first junk key see the later ones).
    AttentionOptions o;
    o.causal = true;
    std::vector<std::size_t> keys;
    for (std::size_t j = 190; j < 200; ++j) keys.push_back(j);
    masked_junk_case<float>("causal future", s, o, keys,
                            [](std::size_t i) { return i + 170 >= 190; });
    masked_junk_case<Float16>("causal future", s, o, keys,
                              [](std::size_t i) { return i + 170 >= 190; });
    Shape s2 = s;
    s2.nq = 200;
    keys.clear();
    for (std::size_t j = 128; j < 200; ++j) keys.push_back(j);
    masked_junk_case<float>("causal future, whole blocks", s2, o, keys,
                            [](std::size_t i) { return i >= 128; });
  }
  {
    // Masked by a mask column (one mask row for every query).
    Tensor<bool> m(1, 1, 1, s.nkv, 0, true);
    const std::vector<std::size_t> keys = {0, 63, 64, 100, 199};
    for (std::size_t j : keys) m.at(0, 0, 0, j) = false;
    AttentionOptions o;
    o.mask = TensorView<const bool>(m.data(), 1, 1, s.nq, s.nkv, 0, 0, 0);
    masked_junk_case<float>("mask", s, o, keys,
                            [](std::size_t) { return false; });
    masked_junk_case<BFloat16>("mask", s, o, keys,
                               [](std::size_t) { return false; });
    // Masked by a bias of -inf.
    Tensor<float> bias(1, 1, 1, s.nkv, 0, 0.0f);
    for (std::size_t j : keys) bias.at(0, 0, 0, j) = -kInfF;
    AttentionOptions ob;
    ob.bias = TensorView<const float>(bias.data(), 1, 1, s.nq, s.nkv, 0, 0, 0);
    masked_junk_case<float>("bias -inf", s, ob, keys,
                            [](std::size_t) { return false; });
  }
  {
    // Outside the window: window_left 10, n_q = n_kv = 200: key 5 is seen
    // by rows 0..15 only; window_right 3: key 150 by rows 140..153 only.
    Shape s2 = s;
    s2.nq = 200;
    AttentionOptions o;
    o.window_left = 10;
    masked_junk_case<float>("outside window_left", s2, o, {5},
                            [](std::size_t i) { return i <= 15; });
    o.window_right = 3;
    masked_junk_case<float>("outside window", s2, o, {150}, [](std::size_t i) {
      return i + 3 >= 150 && i <= 160;
    });
  }
  {
    // Outside the key range.
    AttentionOptions o;
    o.kv_begin = 20;
    o.kv_end = 130;
    std::vector<std::size_t> keys;
    for (std::size_t j = 0; j < 20; ++j) keys.push_back(j);
    for (std::size_t j = 130; j < 200; ++j) keys.push_back(j);
    masked_junk_case<float>("outside key range", s, o, keys,
                            [](std::size_t) { return false; });
    masked_junk_case<Float16>("outside key range", s, o, keys,
                              [](std::size_t) { return false; });
  }
}

// Scores of +inf (here a bias of +inf): the mean of their values; lse +inf.
TEST_P(AttentionSpecial, PlusInfScores) {
  Shape s{.B = 1,
          .H = 2,
          .Hkv = 1,
          .nq = 9,
          .nkv = 130,
          .d = 32,
          .dv = 16,
          .pad = 1,
          .seed = 240};
  const auto p = make_problem<float>(s);
  Tensor<float> bias(1, 1, s.nq, s.nkv, 0, 0.0f);
  std::mt19937_64 rng(241);
  std::uniform_real_distribution<double> u(-1, 1);
  bias.for_each([&](float& x) { x = float(u(rng)); });
  bias.at(0, 0, 2, 17) = kInfF;
  for (std::size_t j : {3, 64, 129}) bias.at(0, 0, 5, j) = kInfF;
  AttentionOptions o;
  o.bias = bias.cview();
  const Result r = run(p, o);
  const AttnRef ref = reference(p, o);
  Stats st;
  check_output(ref, r.o, r.lse.data(), "+inf scores", st);
  for (std::size_t h = 0; h < 2; ++h) {
    EXPECT_EQ(r.lse[h * s.nq + 2], kInfF);
    EXPECT_EQ(r.lse[h * s.nq + 5], kInfF);
    for (std::size_t c = 0; c < s.dv; ++c) {
      // One +inf score: exactly that value row.
      EXPECT_EQ(r.o.at(0, h, 2, c), p.v.at(0, 0, 17, c)) << "h=" << h;
    }
  }
}

// Float16 / BFloat16 keys and values are widened exactly (attention.h) and
// then take the float path: the same bits as attention() on the widened
// float tensors, on every target, with inf, NaN, the largest finite and
// subnormal half values in visible keys and values. And with one key the
// output is that value row, exactly.
template <class KV>
void half_matches_float(const std::string& label, const Shape& s,
                        const AttentionOptions& o) {
  static_assert(!std::is_same_v<KV, float>);
  constexpr bool kF16 = std::is_same_v<KV, Float16>;
  // +inf, -inf, NaN, largest finite, smallest subnormal, a negative
  // subnormal, smallest normal.
  const std::uint16_t special[] = {std::uint16_t(kF16 ? 0x7C00 : 0x7F80),
                                   std::uint16_t(kF16 ? 0xFC00 : 0xFF80),
                                   std::uint16_t(kF16 ? 0x7E00 : 0x7FC0),
                                   std::uint16_t(kF16 ? 0x7BFF : 0x7F7F),
                                   0x0001,
                                   std::uint16_t(kF16 ? 0x8200 : 0x8040),
                                   std::uint16_t(kF16 ? 0x0400 : 0x0080)};
  {
    // One key: O = V exactly.
    Shape s1 = s;
    s1.nkv = 1;
    s1.dv = std::size(special) + 3;
    auto p = make_problem<KV>(s1);
    for (std::size_t hk = 0; hk < s1.Hkv; ++hk)
      for (std::size_t c = 0; c < std::size(special); ++c) {
        p.v.at(0, hk, 0, c) = KV{special[c]};
      }
    p.rewiden();
    const Result r = run(p, {});
    std::size_t fails = 0;
    for (std::size_t h = 0; h < s1.H; ++h)
      for (std::size_t i = 0; i < s1.nq; ++i)
        for (std::size_t c = 0; c < s1.dv; ++c) {
          const float want = p.vw.at(0, h / (s1.H / s1.Hkv), 0, c);
          ATTN_EXPECT(same_value(r.o.at(0, h, i, c), want), fails)
              << kv_name<KV>() << " " << label << ", one key: out[h=" << h
              << ",i=" << i << ",c=" << c << "] = " << fmt(r.o.at(0, h, i, c))
              << ", the value is " << fmt(want) << " (bits 0x" << std::hex
              << (c < std::size(special) ? special[c] : 0) << std::dec << ")";
        }
  }
  for (bool specials : {false, true}) {
    auto p = make_problem<KV>(s);
    if (specials) {
      for (std::size_t c = 0; c < std::min(s.dv, std::size(special)); ++c) {
        p.v.at(0, 0, 5, c) = KV{special[c]};
      }
      p.k.at(0, 0, 9, 0) = KV{special[3]};  // largest finite in a key
      p.k.at(0, 0, 11, 1) = KV{special[4]};
      p.rewiden();
    }
    Problem<float> pf;
    pf.s = s;
    pf.q = p.q;
    pf.k = p.kw;
    pf.v = p.vw;
    pf.rewiden();
    EXPECT_TRUE(SameBits(run(p, o).all(), run(pf, o).all()))
        << kv_name<KV>() << " " << label << (specials ? " with specials" : "")
        << ": differs from the widened float inputs";
  }
}

TEST_P(AttentionSpecial, HalfInputsMatchWidenedFloat) {
  const Shape prefill{.B = 1,
                      .H = 2,
                      .Hkv = 1,
                      .nq = 20,
                      .nkv = 70,
                      .d = 19,
                      .dv = 21,
                      .pad = 1,
                      .seed = 250};
  const Shape decode{.B = 1,
                     .H = 4,
                     .Hkv = 2,
                     .nq = 1,
                     .nkv = 600,
                     .d = 33,
                     .dv = 40,
                     .pad = 1,
                     .seed = 251};
  AttentionOptions causal;
  causal.causal = true;
  half_matches_float<Float16>("prefill", prefill, {});
  half_matches_float<Float16>("prefill causal", prefill, causal);
  half_matches_float<Float16>("decode", decode, {});
  half_matches_float<BFloat16>("prefill", prefill, {});
  half_matches_float<BFloat16>("decode", decode, causal);
}

SOFTDOT_INSTANTIATE_PER_TARGET(AttentionSpecial);

}  // namespace
}  // namespace softdot_test
