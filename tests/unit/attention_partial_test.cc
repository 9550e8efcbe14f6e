// Attention tests: AttentionPartial: attention_partial + attention_finalize
// equals attention() bit for bit; long chains of merged parts stay within
// the one-call bound; identity, commutativity, special values and errors.
#include <gtest/gtest-spi.h>

#include "attention_checks.h"
#include "attention_sweeps.h"
#include "attention_test_util.h"

namespace softdot_test {
namespace {

using softdot::AttentionPartial;

template <class KV>
AttentionPartial partial_of(const Problem<KV>& p, const AttentionOptions& o) {
  AttentionPartial part;
  softdot::attention_partial(p.q.cview(), p.k.cview(), p.v.cview(), part, o);
  return part;
}

// attention_finalize into a fresh output shaped like run()'s.
Result finalize(const Shape& s, const AttentionPartial& part) {
  Result r{Tensor<float>(s.B, s.H, s.nq, s.dv, s.pad + 1, kOutSentinel, s.off),
           {}};
  r.lse.assign(s.B * s.H * s.nq + kLseGuard, kLseSentinel);
  softdot::attention_finalize(part, r.o.view(), r.lse.data());
  return r;
}

bool same_partial(const AttentionPartial& a, const AttentionPartial& b) {
  return a.batch == b.batch && a.heads == b.heads && a.rows == b.rows &&
         a.dv == b.dv && SameBits(a.max, b.max) && SameBits(a.sum, b.sum) &&
         SameBits(a.out, b.out);
}

template <class KV>
void expect_finalize_equals_attention(const std::string& label,
                                      const Problem<KV>& p,
                                      const AttentionOptions& o) {
  const std::string what =
      std::string(kv_name<KV>()) + " " + label + " " + p.s.str();
  for (int threads : {1, 2}) {
    const Result want = with_threads(threads, [&] { return run(p, o); });
    const AttentionPartial part =
        with_threads(threads, [&] { return partial_of(p, o); });
    ASSERT_EQ(part.row_count(), p.s.B * p.s.H * p.s.nq) << what;
    ASSERT_EQ(part.dv, p.s.dv) << what;
    const Result got = finalize(p.s, part);
    EXPECT_TRUE(got.guards_ok()) << what << ": wrote outside";
    EXPECT_TRUE(SameBits(got.all(), want.all()))
        << what << ", " << threads << " threads: finalize(partial) differs "
        << "from attention()";
  }
}

// Every form (prefill: more than kDecodeRows rows per KV head; decode: at
// most, with several chunks), every K/V format, every option case (those
// that change the state: sinks, causal, window, mask, kv range, softcap).
TEST(AttentionPartial, FinalizeEqualsAttentionBitwise) {
  for (const FormShape& f : form_shapes()) {
    const Shape& s = f.shape;
    const auto pf = make_problem<float>(s);
    const auto ph = make_problem<Float16>(s);
    const auto pb = make_problem<BFloat16>(s);
    const SweepArrays x(s);
    for (const OptionCase& c : option_sweep()) {
      const AttentionOptions o = c.make(x);
      const std::string label = std::string(f.name) + ", " + c.name;
      expect_finalize_equals_attention<float>(label, pf, o);
      expect_finalize_equals_attention<Float16>(label, ph, o);
      expect_finalize_equals_attention<BFloat16>(label, pb, o);
    }
  }
}

// The shared shapes are the forms their names say: a decode shape has at
// most kDecodeRows query rows per KV head, a prefill shape more.
TEST(AttentionSweeps, FormShapesAreTheirForms) {
  using softdot::detail::attn::kDecodeRows;
  for (const FormShape& f : form_shapes()) {
    const std::string name = f.name;
    ASSERT_EQ(f.shape.H % f.shape.Hkv, 0u) << name;
    if (name.rfind("decode", 0) == 0) {
      EXPECT_LE(rows_per_kv_head(f.shape), kDecodeRows) << name;
    } else {
      ASSERT_EQ(name.rfind("prefill", 0), 0u) << name;
      EXPECT_GT(rows_per_kv_head(f.shape), kDecodeRows) << name;
    }
  }
}

// An empty range's partial is AttentionPartial::empty; the state of a row
// is (max of the visible scores, their sum, their unnormalised output).
TEST(AttentionPartial, EmptyRangeIsTheIdentity) {
  Shape s{.B = 2, .H = 3, .Hkv = 1, .nq = 5, .nkv = 40, .d = 8, .dv = 6};
  const auto p = make_problem<float>(s);
  AttentionOptions o;
  o.kv_begin = o.kv_end = 10;
  const AttentionPartial part = partial_of(p, o);
  EXPECT_TRUE(same_partial(part, AttentionPartial::empty(2, 3, 5, 6)));
  const Result r = finalize(s, part);
  for (float x : r.o.dense()) EXPECT_EQ(bits(x), 0u);
  for (std::size_t i = 0; i < part.row_count(); ++i) {
    EXPECT_EQ(r.lse[i], -kInfF);
  }
}

// Splits [0, nkv) into parts at `cuts`, merges the parts' partials in a
// chain (double) and the parts' float results in a chain (attention_merge's
// float form), and checks the double chain against the full reference with
// the bound of one attention() call. The float chain rounds the output and
// lse at every merge; its errors are printed beside, not checked.
template <class KV>
void chain_case(const std::string& label, const Problem<KV>& p,
                const AttentionOptions& o,
                const std::vector<std::size_t>& cuts) {
  const AttnRef full = reference(p, o);
  const Shape& s = p.s;
  AttentionPartial chain = AttentionPartial::empty(s.B, s.H, s.nq, s.dv);
  Result fchain{Tensor<float>(s.B, s.H, s.nq, s.dv, 0, 0.0f), {}};
  fchain.lse.assign(s.B * s.H * s.nq, -kInfF);
  AttentionPartial part;
  for (std::size_t c = 0; c + 1 < cuts.size(); ++c) {
    AttentionOptions oc = o;
    oc.kv_begin = cuts[c];
    oc.kv_end = cuts[c + 1];
    if (c > 0) oc.sinks = {};
    softdot::attention_partial(p.q.cview(), p.k.cview(), p.v.cview(), part, oc);
    softdot::attention_merge(chain, part);
    const Result r = run(p, oc, true);
    softdot::attention_merge(fchain.o.cview(), fchain.lse.data(), r.o.cview(),
                             r.lse.data(), fchain.o.view(), fchain.lse.data());
  }
  const std::string what = std::string(kv_name<KV>()) + " " + label + ", " +
                           std::to_string(cuts.size() - 1) + " parts " +
                           s.str();
  const Result got = finalize(s, chain);
  Stats st, fst;
  check_output(full, got.o, got.lse.data(), what + " (double chain)", st);
  print_stats(what + " double chain", st);
  // The float chain, for comparison only: its lse can leave the one-call
  // bound (one rounding of u|lse| per merge).
  testing::TestPartResultArray ignored;
  {
    testing::ScopedFakeTestPartResultReporter quiet(
        testing::ScopedFakeTestPartResultReporter::
            INTERCEPT_ONLY_CURRENT_THREAD,
        &ignored);
    check_output(full, fchain.o, fchain.lse.data(), what, fst);
  }
  print_stats(what + " float chain (not checked)", fst);
}

TEST(AttentionPartial, LongChainsStayWithinTheOneCallBound) {
  using softdot::detail::kKeyTile;
  // 64 parts of one key tile each (split-KV decode over 64 ranges).
  Shape sd{.B = 1,
           .H = 8,
           .Hkv = 2,
           .nq = 1,
           .nkv = 64 * kKeyTile,
           .d = 128,
           .dv = 128,
           .seed = 310};
  std::vector<std::size_t> tiles;
  for (std::size_t j = 0; j <= sd.nkv; j += kKeyTile) tiles.push_back(j);
  const std::vector<float> sinks8(8, 1.5f);
  AttentionOptions o;
  o.sinks = sinks8;
  chain_case<float>("decode, tile parts, sinks", make_problem<float>(sd), o,
                    tiles);
  // Ragged parts (37 keys, not a tile multiple), scores near 1000 (|lse|
  // large: the float chain's lse roundings are largest there).
  Shape sr{.B = 1,
           .H = 2,
           .Hkv = 1,
           .nq = 3,
           .nkv = std::size_t{37} * 40,
           .d = 64,
           .dv = 32,
           .seed = 311};
  const auto pr = make_problem<Float16>(sr);
  Tensor<float> bias(1, 1, sr.nq, sr.nkv, 0, kNaNF);
  bias.for_each([](float& x) { x = 1000.0f; });
  AttentionOptions ob;
  ob.bias = bias.cview();
  std::vector<std::size_t> ragged;
  for (std::size_t j = 0; j <= sr.nkv; j += 37) ragged.push_back(j);
  chain_case<Float16>("ragged parts, scores near 1000", pr, ob, ragged);
  // Causal prefill in 5 parts (later rows see no key of some parts).
  Shape sc{.B = 1,
           .H = 2,
           .Hkv = 1,
           .nq = 200,
           .nkv = 200,
           .d = 32,
           .dv = 32,
           .seed = 312};
  AttentionOptions oc;
  oc.causal = true;
  chain_case<float>("causal prefill", make_problem<float>(sc), oc,
                    {0, 13, 64, 100, 150, 200});
}

// Merging with the identity gives the other partial bit for bit (both
// orders), the merge commutes bit for bit, b may be a, and NaN rows stay NaN.
TEST(AttentionPartial, IdentityCommutesAndSpecialValues) {
  Shape s{.B = 2,
          .H = 2,
          .Hkv = 1,
          .nq = 9,
          .nkv = 100,
          .d = 16,
          .dv = 24,
          .seed = 320};
  const auto p = make_problem<float>(s);
  AttentionOptions oa, ob;
  oa.kv_end = 45;
  ob.kv_begin = 45;
  const AttentionPartial a = partial_of(p, oa), b = partial_of(p, ob);
  const AttentionPartial e = AttentionPartial::empty(2, 2, 9, 24);
  AttentionPartial x = a;
  softdot::attention_merge(x, e);
  EXPECT_TRUE(same_partial(x, a)) << "a + empty";
  x = e;
  softdot::attention_merge(x, a);
  EXPECT_TRUE(same_partial(x, a)) << "empty + a";
  AttentionPartial ab = a, ba = b;
  softdot::attention_merge(ab, b);
  softdot::attention_merge(ba, a);
  EXPECT_TRUE(same_partial(ab, ba)) << "a + b vs b + a";
  // The merged rows: max is the larger max, and sum is at least the sum of
  // the side holding it.
  for (std::size_t r = 0; r < ab.row_count(); ++r) {
    EXPECT_EQ(ab.max[r], std::max(a.max[r], b.max[r])) << r;
    EXPECT_GE(ab.sum[r], a.max[r] >= b.max[r] ? a.sum[r] : b.sum[r]) << r;
  }
  // a + a: the same max, twice the sum and output, exactly.
  AttentionPartial aa = a;
  softdot::attention_merge(aa, aa);
  for (std::size_t r = 0; r < aa.row_count(); ++r) {
    EXPECT_EQ(aa.max[r], a.max[r]);
    EXPECT_EQ(aa.sum[r], 2 * a.sum[r]);
  }
  for (std::size_t i = 0; i < aa.out.size(); ++i) {
    ASSERT_EQ(aa.out[i], 2 * a.out[i]) << i;
  }
  // A NaN sum in a row of b makes that row NaN in a + b, and only that row.
  AttentionPartial bn = b;
  bn.sum[5] = std::numeric_limits<double>::quiet_NaN();
  AttentionPartial an = a;
  softdot::attention_merge(an, bn);
  const Result r = finalize(s, an);
  const Result rab = finalize(s, ab);
  for (std::size_t row = 0; row < an.row_count(); ++row) {
    const std::size_t bb = row / (s.H * s.nq), h = row / s.nq % s.H,
                      i = row % s.nq;
    for (std::size_t c = 0; c < s.dv; ++c) {
      if (row == 5) {
        EXPECT_TRUE(std::isnan(r.o.at(bb, h, i, c))) << c;
      } else {
        EXPECT_EQ(bits(r.o.at(bb, h, i, c)), bits(rab.o.at(bb, h, i, c)));
      }
    }
    EXPECT_EQ(std::isnan(r.lse[row]), row == 5) << row;
  }
}

// Every error names the function and the shapes; nothing is written.
TEST(AttentionPartial, Errors) {
  Shape s{.B = 1, .H = 2, .Hkv = 1, .nq = 3, .nkv = 10, .d = 8, .dv = 4};
  const auto p = make_problem<float>(s);
  const AttentionPartial a = partial_of(p, {});
  // Shapes differ.
  AttentionPartial x = a;
  const AttentionPartial other = AttentionPartial::empty(1, 2, 3, 5);
  expect_invalid(
      "merge shapes", [&] { softdot::attention_merge(x, other); },
      {"attention_merge", "a [1, 2, 3] with d_v 4", "b [1, 2, 3] with d_v 5"});
  EXPECT_TRUE(same_partial(x, a)) << "a changed by a failed merge";
  // Vectors that do not hold what the shape says.
  AttentionPartial bad = a;
  bad.out.pop_back();
  expect_invalid(
      "merge sizes", [&] { softdot::attention_merge(x, bad); },
      {"attention_merge", "b [1, 2, 3]", "23 outputs", "expected 6, 6 and 24"});
  EXPECT_TRUE(same_partial(x, a));
  // finalize: out's shape.
  Tensor<float> out(1, 2, 3, 5, 0, kOutSentinel);
  expect_invalid("finalize out",
                 [&] { softdot::attention_finalize(a, out.view()); },
                 {"attention_finalize", "out [1, 2, 3, 5]", "[1, 2, 3, 4]"});
  for (float v : out.dense()) EXPECT_EQ(bits(v), bits(kOutSentinel));
  // attention_partial: a bad argument leaves the partial as it was.
  AttentionPartial y = a;
  AttentionOptions o;
  o.kv_begin = 11;
  expect_invalid("partial kv_begin",
                 [&] {
                   softdot::attention_partial(p.q.cview(), p.k.cview(),
                                              p.v.cview(), y, o);
                 },
                 {"attention_partial", "kv_begin 11"});
  EXPECT_TRUE(same_partial(y, a));
  // A partial is reused across shapes (its vectors only grow).
  Shape small{.B = 1, .H = 1, .Hkv = 1, .nq = 2, .nkv = 5, .d = 8, .dv = 3};
  const auto ps = make_problem<float>(small);
  softdot::attention_partial(ps.q.cview(), ps.k.cview(), ps.v.cview(), y, {});
  EXPECT_EQ(y.row_count(), 2u);
  EXPECT_EQ(y.out.size(), 6u);
  EXPECT_TRUE(SameBits(finalize(small, y).all(), run(ps, {}).all()));
}

}  // namespace
}  // namespace softdot_test
