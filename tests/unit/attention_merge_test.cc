// Attention tests: Partial key ranges and attention_merge: parts merge to the
// whole, sinks, identity and special values.
#include "attention_test_util.h"

namespace softdot_test {
namespace {

// ---- partial key ranges and attention_merge --------------------------------

// The merge bound. Part x (a or b) has exact output O*_x, weight share
// lambda_x = exp(lse*_x - lse*) (lambda_a + lambda_b = 1), and bounds
//   |o_x - O*_x| <= (2 D_x + 70u) W_x + u|O*_x|       (attention.h)
//   |lse_x - lse*_x| <= L_x = D_x + 70u + 2u|lse*_x|   (lse_bound above;
//                                                       this includes the
//                                                       rounding of lse to
//                                                       float, u|lse_x|).
// The merge computes lambda_x in double from the float lse values: the
// derivative of the logistic gives |dlambda_a| <= lambda_a lambda_b (L_a +
// L_b). With O* = lambda_a O*_a + lambda_b O*_b, W = lambda_a W_a +
// lambda_b W_b (the full W: the full weights are lambda_x times the part's
// weights), lambda_x |O*_x| <= lambda_x W_x, and the final rounding u|O*|:
//   |out - O*| <= (2 D + 70u) W + u W + (L_a + L_b) W + u |O*|
// with D the full row's D (>= D_a, D_b); a part with lse* = -inf adds no
// L term (it is the identity). For lse: |lse - lse*| <= L_a + L_b + u|lse*|.
// So the lse rounding contributes 2u(|lse_a| + |lse_b|) to the relative
// error of the merge weights, beside the scores' D and the sums' 70u.
double part_L(const AttnRef& ref, std::size_t row) {
  const LD l = ref.lse[row];
  if (std::isinf(l) && l < 0) return 0;
  return lse_bound(ref.D[row], l);
}

void check_merged(const AttnRef& full, const AttnRef& ra, const AttnRef& rb,
                  const Result& m, const std::string& what, Stats& st) {
  for (std::size_t b = 0; b < full.batch; ++b) {
    for (std::size_t h = 0; h < full.heads; ++h) {
      for (std::size_t i = 0; i < full.n_q; ++i) {
        const std::size_t row = full.li(b, h, i);
        const double L = part_L(ra, row) + part_L(rb, row);
        for (std::size_t c = 0; c < full.d_v; ++c) {
          const std::size_t oi = full.oi(b, h, i, c);
          const float got = m.o.at(b, h, i, c);
          const LD want = full.out[oi];
          bool ok;
          double bound = 0;
          ++st.elements;
          if (full.visible[row] == 0) {
            ok = bits(got) == 0u;
          } else {
            const double err = double(std::fabs(LD(got) - want));
            bound = (2 * full.D[row] + 71 * kU + L) * full.W[oi] +
                    kU * double(std::fabs(want));
            ok = std::isfinite(got) && err <= bound;
            if (full.W[oi] > 0) {
              st.ratio = std::max(st.ratio, err / (kU * full.W[oi]));
            }
            if (bound > 0) st.frac = std::max(st.frac, err / bound);
          }
          if (!ok && st.failures++ < kMaxMessages) {
            ADD_FAILURE() << what << ": merged out[b=" << b << ",h=" << h
                          << ",i=" << i << ",c=" << c << "] = " << fmt(got)
                          << ", full reference " << fmt(double(want))
                          << ", bound " << fmt(bound);
          }
        }
        const LD wl = full.lse[row];
        const float gl = m.lse[row];
        bool ok;
        if (std::isinf(wl)) {
          ok = LD(gl) == wl;
        } else {
          const double err = double(std::fabs(LD(gl) - wl));
          ok = err <= L + kU * double(std::fabs(wl));
          st.lse = std::max(st.lse, err / kU);
        }
        if (!ok && st.failures++ < kMaxMessages) {
          ADD_FAILURE() << what << ": merged lse[b=" << b << ",h=" << h
                        << ",i=" << i << "] = " << fmt(gl) << ", full "
                        << fmt(double(wl));
        }
      }
    }
  }
}

// attention_merge into a fresh dense output.
Result merge(const Result& a, const Result& b) {
  Result m{Tensor<float>(a.o.B, a.o.H, a.o.R, a.o.C, 0, kOutSentinel), {}};
  m.lse.assign(a.lse.size(), kLseSentinel);
  softdot::attention_merge(a.o.cview(), a.lse.data(), b.o.cview(), b.lse.data(),
                           m.o.view(), m.lse.data());
  return m;
}

// Splits the key range at `split`, runs both parts (the sinks go to the
// first), checks each part against the reference of its range, the merge
// against the full reference, and the in-place merges bitwise.
template <class KV>
void split_case(const std::string& label, const Problem<KV>& p,
                const AttentionOptions& o, std::size_t split) {
  AttentionOptions oa = o, ob = o;
  oa.kv_end = split;
  ob.kv_begin = split;
  ob.sinks = {};
  const AttnRef full = reference(p, o), ra = reference(p, oa),
                rb = reference(p, ob);
  const Result a = run(p, oa), b = run(p, ob);
  const std::string what = std::string(kv_name<KV>()) + " " + label +
                           " split " + std::to_string(split) + " " + p.s.str();
  Stats sa, sm;
  check_output(ra, a.o, a.lse.data(), what + " part a", sa);
  check_output(rb, b.o, b.lse.data(), what + " part b", sa);
  EXPECT_TRUE(a.guards_ok() && b.guards_ok()) << what;
  const Result m = merge(a, b);
  EXPECT_TRUE(m.guards_ok()) << what << ": merge wrote outside";
  check_merged(full, ra, rb, m, what, sm);
  // Commutes (the formula is symmetric).
  EXPECT_TRUE(SameBits(m.all(), merge(b, a).all())) << what << ": a,b vs b,a";
  // In place: out = o_a with lse = lse_a, and out = o_b with lse = lse_b.
  Result ia = a;
  softdot::attention_merge(ia.o.cview(), ia.lse.data(), b.o.cview(),
                           b.lse.data(), ia.o.view(), ia.lse.data());
  EXPECT_TRUE(SameBits(ia.all(), m.all())) << what << ": in place into a";
  Result ib = b;
  softdot::attention_merge(a.o.cview(), a.lse.data(), ib.o.cview(),
                           ib.lse.data(), ib.o.view(), ib.lse.data());
  EXPECT_TRUE(SameBits(ib.all(), m.all())) << what << ": in place into b";
  print_stats(what + " parts", sa);
  print_stats(what + " merged", sm);
}

TEST(AttentionMerge, PartialRangesMergeToFull) {
  Shape s{.B = 2,
          .H = 4,
          .Hkv = 2,
          .nq = 7,
          .nkv = 150,
          .d = 64,
          .dv = 65,
          .pad = 1,
          .seed = 100};
  const auto p = make_problem<float>(s);
  const auto ph = make_problem<Float16>(s);
  const std::vector<float> sinks = {-kInfF, 0.5f, 2.0f, 5.0f};
  for (std::size_t split : {37, 64, 149}) {
    split_case<float>("plain", p, {}, split);
    AttentionOptions o;
    o.sinks = sinks;
    split_case<float>("sinks", p, o, split);
    split_case<Float16>("sinks", ph, o, split);
  }
  // Causal prefill: for rows before the split, part b is fully masked
  // (lse -inf: the identity).
  Shape sc{.B = 1,
           .H = 2,
           .Hkv = 1,
           .nq = 150,
           .nkv = 150,
           .d = 32,
           .dv = 32,
           .seed = 101};
  const auto pc = make_problem<float>(sc);
  AttentionOptions oc;
  oc.causal = true;
  split_case<float>("causal", pc, oc, 64);
  split_case<float>("causal", pc, oc, 100);
  oc.window_left = 20;
  oc.sinks = std::span<const float>(sinks.data() + 1, 2);
  split_case<float>("causal window 20 sinks", pc, oc, 77);
  // Decode.
  Shape sd{.B = 1,
           .H = 8,
           .Hkv = 2,
           .nq = 1,
           .nkv = 4000,
           .d = 128,
           .dv = 128,
           .seed = 102};
  split_case<BFloat16>("decode", make_problem<BFloat16>(sd), {}, 1500);
  // Scores around 1000 (|lse| large: the lse rounding term matters).
  Shape sl{.B = 1,
           .H = 1,
           .Hkv = 1,
           .nq = 5,
           .nkv = 100,
           .d = 64,
           .dv = 64,
           .seed = 103};
  auto pl = make_problem<float>(sl);
  Tensor<float> bias(1, 1, 5, 100, 0, kNaNF);
  bias.for_each([](float& x) { x = 1000.0f; });
  AttentionOptions ol;
  ol.bias = bias.cview();
  split_case<float>("scores near 1000", pl, ol, 50);
}

// The first part holds the sinks but no visible key for the later rows
// (the window only reaches keys of the second part): its lse must be the
// sink for the merge to equal the full result.
TEST(AttentionMerge, SinkOnAFullyMaskedPart) {
  Shape s{.B = 1,
          .H = 2,
          .Hkv = 1,
          .nq = 100,
          .nkv = 100,
          .d = 32,
          .dv = 32,
          .seed = 105};
  const auto p = make_problem<float>(s);
  const std::vector<float> sinks = {1.0f, 4.0f};
  AttentionOptions o;
  o.causal = true;
  o.window_left = 10;
  o.sinks = sinks;
  split_case<float>("sinks, part a empty for rows >= 61", p, o, 50);
}

// Identity: merging with a fully masked part (lse -inf, zeros) gives the
// other part's bits; both fully masked give +0 and -inf; NaN propagates.
TEST(AttentionMerge, IdentityAndSpecialValues) {
  Shape s{.B = 2,
          .H = 2,
          .Hkv = 1,
          .nq = 9,
          .nkv = 70,
          .d = 16,
          .dv = 24,
          .pad = 2,
          .seed = 110};
  const auto p = make_problem<float>(s);
  const Result a = run(p, {});
  AttentionOptions empty;
  empty.kv_begin = 30;
  empty.kv_end = 30;  // an empty range: every row fully masked
  const Result e = run(p, empty);
  for (float x : e.lse) {
    if (bits(x) != bits(kLseSentinel)) {
      ASSERT_EQ(x, -kInfF);
    }
  }
  EXPECT_TRUE(SameBits(merge(a, e).all(), a.all())) << "a + empty";
  EXPECT_TRUE(SameBits(merge(e, a).all(), a.all())) << "empty + a";
  const Result ee = merge(e, e);
  for (float x : ee.o.dense()) EXPECT_EQ(bits(x), 0u);
  for (std::size_t r = 0; r + kLseGuard < ee.lse.size(); ++r) {
    EXPECT_EQ(ee.lse[r], -kInfF);
  }
  // A NaN lse or a NaN output element gives NaN there.
  Result an = a;
  an.lse[3] = kNaNF;
  an.o.at(1, 1, 4, 5) = kNaNF;
  const Result mn = merge(an, a);
  const std::size_t rb = 3 / s.nq, ri = 3 % s.nq;  // row 3: b 0, h 0, i 3
  for (std::size_t c = 0; c < s.dv; ++c) {
    EXPECT_TRUE(std::isnan(mn.o.at(0, rb, ri, c))) << "NaN lse, c=" << c;
  }
  EXPECT_TRUE(std::isnan(mn.lse[3]));
  EXPECT_TRUE(std::isnan(mn.o.at(1, 1, 4, 5))) << "NaN output element";
  // Other rows: the merge of a with itself (weights 1/2 each).
  const Result aa = merge(a, a);
  for (std::size_t b = 0; b < 2; ++b)
    for (std::size_t h = 0; h < 2; ++h)
      for (std::size_t i = 0; i < s.nq; ++i) {
        if (b == 0 && h == 0 && i == 3) continue;
        for (std::size_t c = 0; c < s.dv; ++c) {
          if (b == 1 && h == 1 && i == 4 && c == 5) continue;
          EXPECT_TRUE(same_value(mn.o.at(b, h, i, c), aa.o.at(b, h, i, c)));
        }
      }
  // a merged with itself: the same output, lse + log 2.
  for (std::size_t b = 0; b < 2; ++b)
    for (std::size_t h = 0; h < 2; ++h)
      for (std::size_t i = 0; i < s.nq; ++i) {
        const std::size_t row = (b * 2 + h) * s.nq + i;
        for (std::size_t c = 0; c < s.dv; ++c) {
          EXPECT_EQ(aa.o.at(b, h, i, c), a.o.at(b, h, i, c));
        }
        const double want = double(a.lse[row]) + std::log(2.0);
        EXPECT_LE(std::fabs(double(aa.lse[row]) - want),
                  kU * std::fabs(want) * 1.01)
            << "lse of a merged with itself";
      }
}

}  // namespace
}  // namespace softdot_test
