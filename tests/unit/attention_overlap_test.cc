// Attention tests: no output may share a byte with an input. The forward
// reads q, K and V while it writes out (and lse), so an overlap would give
// a wrong answer with no error; each such call must throw, naming both, in
// every element type (the spans are in bytes: a float64 view spans twice
// the bytes of a float32 view of the same shape) and on every path
// (contiguous, weights, scores, paged, double, the double backward).
#include "attention_test_util.h"
#include "softdot/attention_backward.h"

namespace softdot_test {
namespace {

using CV = TensorView<const float>;
using OV = TensorView<float>;

TEST(AttentionOverlap, FloatOutputsAgainstEveryInput) {
  // q [1, 1, 8, 8] = 64 floats at buf[0, 64); k, v apart.
  std::vector<float> buf(256, 0.5f), k(64, 0.25f), v(64, 1.0f);
  const CV q(buf.data(), 1, 1, 8, 8);
  expect_invalid("out inside q",
                 [&] {
                   softdot::attention(q, CV(k.data(), 1, 1, 8, 8),
                                      CV(v.data(), 1, 1, 8, 8),
                                      OV(buf.data() + 40, 1, 1, 8, 8));
                 },
                 {"out overlaps q"});
  expect_invalid("out on v",
                 [&] {
                   softdot::attention(q, CV(k.data(), 1, 1, 8, 8),
                                      CV(v.data(), 1, 1, 8, 8),
                                      OV(v.data(), 1, 1, 8, 8));
                 },
                 {"out overlaps v"});
  expect_invalid("lse inside k",
                 [&] {
                   softdot::attention(
                       q, CV(k.data(), 1, 1, 8, 8), CV(v.data(), 1, 1, 8, 8),
                       OV(buf.data() + 128, 1, 1, 8, 8), {}, k.data() + 60);
                 },
                 {"lse overlaps k"});
  expect_invalid("weights on k",
                 [&] {
                   softdot::attention_weights(q, CV(k.data(), 1, 1, 8, 8),
                                              OV(k.data() + 8, 1, 1, 8, 8));
                 },
                 {"weights overlaps k"});
  expect_invalid("scores on the bias",
                 [&] {
                   AttentionOptions o;
                   o.bias = CV(buf.data() + 64, 1, 1, 8, 8);
                   softdot::attention_scores(q, CV(k.data(), 1, 1, 8, 8),
                                             OV(buf.data() + 100, 1, 1, 8, 8),
                                             o);
                 },
                 {"scores overlaps bias"});
  // Apart: no error, and the same result as in separate buffers.
  std::vector<float> sep(64);
  softdot::attention(q, CV(k.data(), 1, 1, 8, 8), CV(v.data(), 1, 1, 8, 8),
                     OV(sep.data(), 1, 1, 8, 8));
  softdot::attention(q, CV(k.data(), 1, 1, 8, 8), CV(v.data(), 1, 1, 8, 8),
                     OV(buf.data() + 64, 1, 1, 8, 8));
  for (std::size_t i = 0; i < 64; ++i) {
    EXPECT_EQ(bits(sep[i]), bits(buf[64 + i])) << i;
  }
}

TEST(AttentionOverlap, InterleavedRowsShareNoElement) {
  // One buffer of 8 rows of 16 floats: q is the first half of every row, out
  // the second half. Their spans meet but no element is shared: allowed,
  // and the same bits as on separate arrays. Shifted by one float, out's
  // first element is q's last of row 0: refused.
  std::vector<float> buf(std::size_t{8} * 16), k(64, 0.25f), v(64);
  for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = 0.01f * float(i % 37);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = 0.1f * float(i % 11);
  const CV q(buf.data(), 1, 1, 8, 8, 128, 128, 16);
  std::vector<float> qc(64), want(64);
  for (std::size_t i = 0; i < 8; ++i) {
    std::memcpy(qc.data() + i * 8, buf.data() + i * 16, 8 * sizeof(float));
  }
  const CV kk(k.data(), 1, 1, 8, 8), vv(v.data(), 1, 1, 8, 8);
  softdot::attention(CV(qc.data(), 1, 1, 8, 8), kk, vv,
                     OV(want.data(), 1, 1, 8, 8));
  softdot::attention(q, kk, vv, OV(buf.data() + 8, 1, 1, 8, 8, 128, 128, 16));
  for (std::size_t i = 0; i < 8; ++i) {
    for (std::size_t c = 0; c < 8; ++c) {
      EXPECT_EQ(bits(want[i * 8 + c]), bits(buf[i * 16 + 8 + c]))
          << "row " << i << " col " << c;
    }
  }
  expect_invalid("out one float into q's rows",
                 [&] {
                   softdot::attention(
                       q, kk, vv, OV(buf.data() + 7, 1, 1, 8, 8, 128, 128, 16));
                 },
                 {"out overlaps q"});
}

TEST(AttentionOverlap, ViewsOfManyRowsOverFewBytes) {
  // Strides of 0 give a view of 16 floats 2^40 rows. q and out meet: the
  // check must refuse them without listing their rows (it reserved 2^40
  // pairs and threw std::length_error or bad_alloc; the fuzzers found it).
  std::vector<float> buf(64, 0.5f), k(8, 0.25f);
  const std::size_t huge = std::size_t{1} << 40;
  expect_invalid("2^40 rows of q and out over 16 floats",
                 [&] {
                   softdot::attention(
                       CV(buf.data(), huge, 1, 1, 8, 0, 0, 8),
                       CV(k.data(), huge, 1, 1, 8, 0, 0, 8),
                       CV(k.data(), huge, 1, 1, 8, 0, 0, 8),
                       OV(buf.data() + 4, huge, 1, 1, 8, 0, 0, 8));
                 },
                 {"out overlaps q"});
}

TEST(AttentionOverlap, SixteenBitOutputSpansItsOwnBytes) {
  // bfloat16 q and out in one buffer: q is elements [0, 64); an out from
  // element 63 meets it, one from element 64 does not.
  std::vector<BFloat16> k16(64, softdot::to_bfloat16(0.25f)), buf(200);
  using BV = TensorView<const BFloat16>;
  expect_invalid("bf16 out inside bf16 q",
                 [&] {
                   softdot::attention(
                       BV(buf.data(), 1, 1, 8, 8), BV(k16.data(), 1, 1, 8, 8),
                       BV(k16.data(), 1, 1, 8, 8),
                       TensorView<BFloat16>(buf.data() + 63, 1, 1, 8, 8));
                 },
                 {"out overlaps q"});
  // One element past q's last: apart.
  softdot::attention(BV(buf.data(), 1, 1, 8, 8), BV(k16.data(), 1, 1, 8, 8),
                     BV(k16.data(), 1, 1, 8, 8),
                     TensorView<BFloat16>(buf.data() + 64, 1, 1, 8, 8));
}

TEST(AttentionOverlap, PagedOutputAgainstThePages) {
  // Two pages of 4 keys, 1 head, d = 8; one sequence of 6 keys.
  std::vector<float> pages(std::size_t{2} * 4 * 8, 0.5f), q(8, 0.25f), out(8);
  const std::vector<std::int32_t> table = {0, 1}, lens = {6};
  softdot::PagedKVTable t;
  t.block_table = table;
  t.blocks_per_seq = 2;
  t.seq_lens = lens;
  expect_invalid("out on the pages",
                 [&] {
                   softdot::paged_attention(CV(q.data(), 1, 1, 1, 8),
                                            CV(pages.data(), 2, 1, 4, 8),
                                            CV(pages.data(), 2, 1, 4, 8), t,
                                            OV(pages.data() + 8, 1, 1, 1, 8));
                 },
                 {"out overlaps k_pages"});
  softdot::paged_attention(
      CV(q.data(), 1, 1, 1, 8), CV(pages.data(), 2, 1, 4, 8),
      CV(pages.data(), 2, 1, 4, 8), t, OV(out.data(), 1, 1, 1, 8));
  EXPECT_FLOAT_EQ(out[0], 0.5f);
}

TEST(AttentionOverlap, DoubleSpansTwiceTheBytesOfFloat) {
  // q [1, 1, 8, 8] doubles = 512 bytes. An out starting at element 40 of
  // q overlaps it; as float views of the same shape (256 bytes) they would
  // not: this passed with no error before the double path checked in
  // double.
  using DV = TensorView<const double>;
  std::vector<double> buf(160, 0.5), k(64, 0.25), v(64, 1.0), lse(8);
  const DV q(buf.data(), 1, 1, 8, 8), kk(k.data(), 1, 1, 8, 8),
      vv(v.data(), 1, 1, 8, 8);
  expect_invalid("double out inside q",
                 [&] {
                   softdot::attention(
                       q, kk, vv,
                       TensorView<double>(buf.data() + 40, 1, 1, 8, 8));
                 },
                 {"out overlaps q"});
  expect_invalid("double lse inside v",
                 [&] {
                   softdot::attention(
                       q, kk, vv,
                       TensorView<double>(buf.data() + 64, 1, 1, 8, 8), {},
                       v.data() + 60);
                 },
                 {"lse overlaps v"});
  // The backward: a gradient on an input.
  std::vector<double> out(64), dout(64, 1.0), dq(64), dk(64), dv(64);
  softdot::attention(q, kk, vv, TensorView<double>(out.data(), 1, 1, 8, 8), {},
                     lse.data());
  softdot::AttentionGradients64 g{
      TensorView<double>(dq.data(), 1, 1, 8, 8),
      TensorView<double>(buf.data() + 36, 1, 1, 8, 8),  // dk inside q
      TensorView<double>(dv.data(), 1, 1, 8, 8),
      {},
      {}};
  expect_invalid("double dk inside q",
                 [&] {
                   softdot::attention_backward(
                       q, kk, vv, DV(out.data(), 1, 1, 8, 8), lse.data(),
                       DV(dout.data(), 1, 1, 8, 8), g);
                 },
                 {"dk overlaps q"});
  g.dk = TensorView<double>(dk.data(), 1, 1, 8, 8);
  softdot::attention_backward(q, kk, vv, DV(out.data(), 1, 1, 8, 8), lse.data(),
                              DV(dout.data(), 1, 1, 8, 8), g);
  // Equal keys: every weight 1/8, so dV_j = 8 rows x 1/8 x dout = 1.
  EXPECT_NEAR(dv[0], 1.0, 1e-14);
}

}  // namespace
}  // namespace softdot_test
