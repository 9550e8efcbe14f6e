// The largest arrays the API accepts (docs/limits.md): a view whose span,
// (n_0 - 1) s_0 + ... + cols elements, does not fit in PTRDIFF_MAX bytes is
// rejected with std::invalid_argument before anything is read, written or
// allocated, and no size product is allowed to wrap. The pointers passed
// here point at a few valid elements: a check that let a view through would
// read far outside them (ASan reports it; without ASan it would crash).
#include <gtest/gtest.h>
#include <softdot/softdot.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

constexpr std::size_t k2_32 = std::size_t{1} << 32;

// Runs f, expecting std::invalid_argument whose message contains every
// piece of `parts`.
template <class F>
void ExpectInvalid(F f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no exception";
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    for (const std::string& p : parts) {
      EXPECT_NE(what.find(p), std::string::npos)
          << "message \"" << what << "\" lacks \"" << p << "\"";
    }
  } catch (const std::exception& e) {
    ADD_FAILURE() << "unexpected exception: " << e.what();
  }
}

TEST(Limits, NullViewWhoseElementCountWrapsToZeroIsRejected) {
  // 2^32 x 2^32 x 1 x 1 elements: the product is 2^64, 0 in size_t; the
  // null check used to multiply the dimensions and let this through.
  std::vector<float> k(4, 1.0f), v(4, 1.0f), o(4, 0.0f);
  const softdot::TensorView<const float> q(nullptr, k2_32, k2_32, 1, 1);
  const softdot::TensorView<const float> kv(k.data(), 1, 1, 1, 1);
  const softdot::TensorView<const float> vv(v.data(), 1, 1, 1, 1);
  const softdot::TensorView<float> ov(o.data(), 1, 1, 1, 1);
  ExpectInvalid([&] { softdot::attention(q, kv, vv, ov); },
                {"softdot::attention: ", "q [4294967296, 4294967296, 1, 1]",
                 "spans more than PTRDIFF_MAX (9223372036854775807) bytes"});
}

TEST(Limits, TensorSpanBeyondPtrdiffMaxIsRejected) {
  // k: 2^31 rows of stride 2^31 floats: 2^62 elements, 2^64 bytes.
  std::vector<float> q(4, 1.0f), buf(4, 1.0f), o(4, 0.0f);
  const softdot::TensorView<const float> qv(q.data(), 1, 1, 1, 1);
  const softdot::TensorView<const float> k(
      buf.data(), 1, 1, std::size_t{1} << 31, 1, 0, 0, std::size_t{1} << 31);
  const softdot::TensorView<const float> v(buf.data(), 1, 1,
                                           std::size_t{1} << 31, 1, 0, 0, 1);
  const softdot::TensorView<float> ov(o.data(), 1, 1, 1, 1);
  ExpectInvalid([&] { softdot::attention(qv, k, v, ov); },
                {"k [1, 1, 2147483648, 1] with strides [0, 0, 2147483648]",
                 "spans more than PTRDIFF_MAX", "4-byte elements"});
}

TEST(Limits, SpanJustBelowTheLimitPassesTheSpanCheck) {
  // 2^61 - 1 float elements (just under 2^63 bytes) fit; the call then fails
  // on the next rule (n_kv must be below 2^30), which shows that the span
  // check itself accepted the view.
  std::vector<float> q(4, 1.0f), buf(4, 1.0f), o(4, 0.0f);
  const softdot::TensorView<const float> qv(q.data(), 1, 1, 1, 1);
  const std::size_t rows = (std::size_t{1} << 61) - 1;
  const softdot::TensorView<const float> k(buf.data(), 1, 1, rows, 1, 0, 0, 1);
  ExpectInvalid(
      [&] {
        softdot::attention(qv, k, k,
                           softdot::TensorView<float>(o.data(), 1, 1, 1, 1));
      },
      {"must be below 2^30"});
}

TEST(Limits, MatrixSpanBeyondPtrdiffMaxIsRejected) {
  // 2^61 rows of stride 16 doubles: 2^65 elements.
  std::vector<double> buf(16, 0.0), out(16, 0.0);
  const softdot::MatrixView<const double> x(buf.data(), std::size_t{1} << 61,
                                            16, 16);
  const softdot::MatrixView<double> y(out.data(), std::size_t{1} << 61, 16, 16);
  ExpectInvalid(
      [&] { softdot::softmax_rows(x, y); },
      {"softdot::softmax_rows: x (2305843009213693952 x 16, stride 16)",
       "spans more than PTRDIFF_MAX", "8-byte elements"});
  std::vector<double> query(16, 1.0), scores(4, 0.0);
  ExpectInvalid([&] { softdot::dots(query, x, scores); },
                {"softdot::dots: keys", "spans more than PTRDIFF_MAX"});
}

TEST(Limits, AttentionWeightsRowsTimesKeysBeyondMemoryIsRejected) {
  // weights [2^21, 2^21, 2^21, 1]: 2^63 floats, 2^65 bytes (q of the same
  // rows is rejected first, naming q).
  std::vector<float> q(4, 1.0f), k(4, 1.0f), w(4, 0.0f);
  const std::size_t n = std::size_t{1} << 21;
  const softdot::TensorView<const float> qv(q.data(), n, n, n, 1);
  const softdot::TensorView<const float> kv(k.data(), n, 1, 1, 1);
  const softdot::TensorView<float> wv(w.data(), n, n, n, 1);
  ExpectInvalid([&] { softdot::attention_weights(qv, kv, wv); },
                {"softdot::attention_weights: q [2097152, 2097152, 2097152, 1]",
                 "spans more than PTRDIFF_MAX"});
}

TEST(Limits, QueryRowsWithZeroStridesThatWouldWrapAreRejected) {
  // Strides of 0 make q span one element, but 2^32 x 2^32 query rows each
  // need an lse and a state: their count wraps.
  std::vector<float> one(4, 1.0f), o(4, 0.0f);
  const softdot::TensorView<const float> q(one.data(), k2_32, k2_32, 1, 1, 0, 0,
                                           1);
  const softdot::TensorView<const float> kv(one.data(), k2_32, 1, 1, 1, 0, 0,
                                            1);
  const softdot::TensorView<float> ov(o.data(), k2_32, k2_32, 1, 1, 0, 0, 1);
  ExpectInvalid([&] { softdot::attention(q, kv, kv, ov); },
                {"softdot::attention: q [4294967296, 4294967296, 1, 1]",
                 "more query rows", "than fit in memory"});
}

TEST(Limits, AttentionPartialOfWrappingSizeIsRejected) {
  ExpectInvalid(
      [] { (void)softdot::AttentionPartial::empty(k2_32, k2_32, 1, 1); },
      {"softdot::AttentionPartial::empty: the partial [4294967296, "
       "4294967296, 1] with d_v 1",
       "more outputs than fit in memory"});
  // A partial whose declared shape wraps cannot be merged either.
  softdot::AttentionPartial a = softdot::AttentionPartial::empty(1, 1, 1, 1);
  softdot::AttentionPartial b = a;
  b.batch = k2_32;
  b.heads = k2_32;
  ExpectInvalid([&] { softdot::attention_merge(a, b); },
                {"softdot::attention_merge: b [4294967296, 4294967296, 1]",
                 "more outputs than fit in memory"});
}

TEST(Limits, QuantizeKvOfHugeViewIsRejected) {
  std::vector<float> x(4, 1.0f), scales(4, 0.0f);
  std::vector<std::int8_t> values(4, 0);
  const std::size_t n = std::size_t{1} << 40;
  const softdot::TensorView<const float> xv(x.data(), n, n, 1, 1);
  const softdot::TensorView<std::int8_t> vv(values.data(), 1, 1, 1, 1);
  const softdot::TensorView<float> sv(scales.data(), 1, 1, 1, 1);
  ExpectInvalid([&] { softdot::quantize_kv(xv, vv, sv); },
                {"softdot::quantize_kv: x [1099511627776, 1099511627776, 1, 1]",
                 "spans more than PTRDIFF_MAX"});
}

TEST(Limits, MaskAndBiasSpansBeyondPtrdiffMaxAreRejected) {
  // Found by fuzz_attention: the mask and bias views skipped the span rule
  // (they may broadcast rows with row_stride 0, so they are not checked
  // like q, k and v), and a mask whose span wrapped was read out of bounds.
  std::vector<float> q(11, 1.0f), k(48, 1.0f), v(48, 1.0f), o(11, 0.0f);
  std::vector<float> bias(1, 0.0f);
  std::unique_ptr<bool[]> mask = std::make_unique<bool[]>(1);
  const softdot::TensorView<const float> qv(q.data(), 1, 1, 11, 1);
  const softdot::TensorView<const float> kv(k.data(), 1, 1, 48, 1);
  const softdot::TensorView<float> ov(o.data(), 1, 1, 11, 1);
  const std::size_t wraps = 11781794683991405395ull;  // 10 x this wraps
  softdot::AttentionOptions opt;
  opt.mask =
      softdot::TensorView<const bool>(mask.get(), 1, 1, 11, 48, 0, 0, wraps);
  ExpectInvalid([&] { softdot::attention(qv, kv, kv, ov, opt); },
                {"softdot::attention: mask [1, 1, 11, 48] with strides [0, 0, "
                 "11781794683991405395]",
                 "spans more than PTRDIFF_MAX"});
  softdot::AttentionOptions opt2;
  opt2.bias = softdot::TensorView<const float>(bias.data(), 1, 1, 11, 48, 0, 0,
                                               std::size_t{1} << 60);
  ExpectInvalid([&] { softdot::attention(qv, kv, kv, ov, opt2); },
                {"bias [1, 1, 11, 48]", "spans more than PTRDIFF_MAX",
                 "4-byte elements"});
}

TEST(Limits, NoKeysWithHugeStridesGiveZeroRows) {
  // n_kv = 0: K, V and their int8 scales span nothing, so their strides are
  // unchecked; the library must not compute addresses from them (found by
  // fuzz_attention: the address of "row 0 of batch 1" overflowed, which
  // UBSan reports in the ASan + UBSan tree). Every row is fully masked:
  // zeros, lse -inf.
  std::vector<float> q(24, 1.0f), out(28, -1.0f),
      lse(4, 0.0f);  // [2, 2, 1, 6], [2, 2, 1, 7]
  std::vector<std::int8_t> kv(1, 0);
  std::vector<float> scale(1, 1.0f);
  const std::size_t huge = std::size_t{1} << 62;
  const softdot::TensorView<const std::int8_t> k(kv.data(), 2, 2, 0, 6, huge,
                                                 huge, huge);
  const softdot::TensorView<const std::int8_t> v(kv.data(), 2, 2, 0, 7, huge,
                                                 huge, huge);
  const softdot::TensorView<const float> s(scale.data(), 2, 2, 0, 1, huge, huge,
                                           huge);
  softdot::AttentionOptions o;
  o.causal = true;
  softdot::attention(softdot::TensorView<const float>(q.data(), 2, 2, 1, 6),
                     softdot::Int8KV{k, s}, softdot::Int8KV{v, s},
                     softdot::TensorView<float>(out.data(), 2, 2, 1, 7), o,
                     lse.data());
  for (float x : out) EXPECT_EQ(x, 0.0f);
  for (float x : lse) EXPECT_EQ(x, -std::numeric_limits<float>::infinity());
  const softdot::TensorView<const float> kf(q.data(), 2, 2, 0, 6, huge, huge,
                                            huge);
  const softdot::TensorView<const float> vf(q.data(), 2, 2, 0, 7, huge, huge,
                                            huge);
  softdot::attention(softdot::TensorView<const float>(q.data(), 2, 2, 1, 6), kf,
                     vf, softdot::TensorView<float>(out.data(), 2, 2, 1, 7), o,
                     lse.data());
  for (float x : out) EXPECT_EQ(x, 0.0f);
  // A mask and a bias of 0 columns (n_kv = 0) with huge strides: nothing to
  // read, no address computed from them (fuzz_attention).
  std::unique_ptr<bool[]> mask = std::make_unique<bool[]>(1);
  o.mask =
      softdot::TensorView<const bool>(mask.get(), 2, 2, 1, 0, huge, huge, huge);
  o.bias = softdot::TensorView<const float>(scale.data(), 2, 2, 1, 0, huge,
                                            huge, huge);
  softdot::attention(softdot::TensorView<const float>(q.data(), 2, 2, 1, 6), kf,
                     vf, softdot::TensorView<float>(out.data(), 2, 2, 1, 7), o,
                     lse.data());
  for (float x : out) EXPECT_EQ(x, 0.0f);
}

TEST(Limits, WeightsAndScoresOfNoKeysWithHugeStridesWriteNothing) {
  // n_kv = 0: the weights and scores targets have no columns, so their
  // strides (and those of k) are unchecked, and no row address may be formed
  // from them (found by fuzz_request: UBSan reported the overflowing
  // address of a scores row). The call returns and writes nothing.
  std::vector<float> q(18, 1.0f), k(1, 0.0f), target(1, -7.25f);
  const std::size_t huge = std::size_t{1} << 62;
  const softdot::TensorView<const float> qv(q.data(), 2, 1, 9, 1);
  const softdot::TensorView<const float> kv(k.data(), 2, 1, 0, 1, huge, huge,
                                            huge);
  const softdot::TensorView<float> tv(target.data(), 2, 1, 9, 0, 0, huge, huge);
  softdot::AttentionOptions o;
  o.causal = true;
  softdot::attention_scores(qv, kv, tv, o);
  EXPECT_EQ(target[0], -7.25f);
  softdot::attention_weights(qv, kv, tv, o);
  EXPECT_EQ(target[0], -7.25f);
  const std::vector<softdot::Float16> k16(1);
  softdot::attention_scores(qv,
                            softdot::TensorView<const softdot::Float16>(
                                k16.data(), 2, 1, 0, 1, huge, huge, huge),
                            tv, o);
  EXPECT_EQ(target[0], -7.25f);
}

TEST(Limits, Backward16WithZeroColumnsAndHugeDimsIsRejectedAtOnce) {
  // Found by fuzz_backward: the 16-bit backward widened its inputs before
  // the forward's checks, and a q of [2^62, 2^62, 2, 0] (0 columns: it
  // spans nothing, so its own check passes) looped over 2^125 rows instead
  // of being rejected. Now the shapes and options are checked first.
  using softdot::BFloat16;
  const std::size_t huge = std::size_t{1} << 62;
  std::vector<BFloat16> q(1), k(std::size_t{2} * 7 * 14),
      v(std::size_t{2} * 7 * 11), dout(1), dq(1), dk(k.size()), dv(v.size());
  std::vector<float> out(std::size_t{4} * 14 * 11, 0.0f),
      lse(std::size_t{4} * 14, 0.0f);
  const softdot::TensorView<const BFloat16> qv(q.data(), huge, huge, 2, 0, 0, 0,
                                               0);
  const softdot::TensorView<const BFloat16> kv(k.data(), 1, 2, 7, 14);
  const softdot::TensorView<const BFloat16> vv(v.data(), 1, 2, 7, 11);
  const softdot::TensorView<const BFloat16> dov(dout.data(), 1, 4, 0, 11, 0, 0,
                                                11);
  softdot::AttentionGradients16<BFloat16> g;
  g.dq = softdot::TensorView<BFloat16>(dq.data(), huge, huge, 2, 0, 0, 0, 0);
  g.dk = softdot::TensorView<BFloat16>(dk.data(), 1, 2, 7, 14);
  g.dv = softdot::TensorView<BFloat16>(dv.data(), 1, 2, 7, 11);
  softdot::AttentionOptions o;
  o.scale = -1.0;
  ExpectInvalid(
      [&] {
        softdot::attention_backward(
            qv, kv, vv,
            softdot::TensorView<const float>(out.data(), 1, 4, 14, 11),
            lse.data(), dov, g, o);
      },
      {"softdot::attention_backward: "});
  for (BFloat16 x : dk) EXPECT_EQ(softdot::to_float(x), 0.0f);
}

TEST(Limits, BackwardDbiasOfNoKeysWithHugeStridesIsNotTouched) {
  // Found by fuzz_backward: with n_kv = 0, dbias has 0 columns and spans
  // nothing, so its strides are unchecked; zeroing it formed row addresses
  // from them (a pointer overflow). Every row sees no key: dq = 0.
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> q{0.5f, -1.0f}, k(1, 0.0f), out(2, 0.0f), dout{1.0f, 2.0f},
      lse{-inf, -inf}, dq(2, -7.0f), dk(1, -7.0f), dv(1, -7.0f),
      dbias(1, -7.0f);
  const std::size_t huge = std::size_t{1} << 62;
  const softdot::TensorView<const float> qv(q.data(), 2, 1, 1, 1);
  const softdot::TensorView<const float> kv(k.data(), 2, 1, 0, 1, 2, 2, 1);
  softdot::AttentionGradients g;
  g.dq = softdot::TensorView<float>(dq.data(), 2, 1, 1, 1);
  g.dk = softdot::TensorView<float>(dk.data(), 2, 1, 0, 1, 0, 0, 2);
  g.dv = softdot::TensorView<float>(dv.data(), 2, 1, 0, 1, 0, 0, 2);
  g.dbias =
      softdot::TensorView<float>(dbias.data(), 2, 1, 1, 0, huge, huge, huge);
  softdot::AttentionOptions o;
  o.causal = true;
  softdot::attention_backward(
      qv, kv, kv, softdot::TensorView<const float>(out.data(), 2, 1, 1, 1),
      lse.data(), softdot::TensorView<const float>(dout.data(), 2, 1, 1, 1), g,
      o);
  EXPECT_EQ(dq[0], 0.0f);
  EXPECT_EQ(dq[1], 0.0f);
  EXPECT_EQ(dbias[0], -7.0f);
}

}  // namespace
