// Attention tests: AttentionOptions::q_position / kv_position (global
// positions of a call's first query and key rows, mask and bias columns by
// key position) and prefill_form.
#include <bit>
#include <cstdint>
#include <cstring>
#include <random>

#include "attention_test_util.h"

namespace softdot_test {
namespace {

std::vector<float> uniform(std::size_t n, unsigned seed, float lo, float hi) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> x(n);
  for (float& e : x) e = u(g);
  return x;
}

bool bits_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Rows [r0, r0 + n) of a dense [B, H, rows, cols] buffer.
std::vector<float> rows_of(const std::vector<float>& x, std::size_t BH,
                           std::size_t rows, std::size_t cols, std::size_t r0,
                           std::size_t n) {
  std::vector<float> y(BH * n * cols);
  for (std::size_t b = 0; b < BH; ++b) {
    std::memcpy(&y[b * n * cols], &x[(b * rows + r0) * cols],
                n * cols * sizeof(float));
  }
  return y;
}

// Query rows [q0, q0 + m) against keys [a, b) of a sequence of n positions,
// given as a slice with q_position = q0 and kv_position = a, equal bit for
// bit to the same rows of the whole-sequence partial over kv_begin = a,
// kv_end = b (its keys' tiles start at a too), with causal, a window, a
// mask and a bias read by global column.
TEST(AttentionPositions, SliceEqualsWholeSequenceRange) {
  const std::size_t n = 150, d = 24, dv = 16, H = 2;
  const auto q = uniform(H * n * d, 1, -2, 2);
  const auto k = uniform(H * n * d, 2, -2, 2);
  const auto v = uniform(H * n * dv, 3, -1, 1);
  const auto bias = uniform(n * n, 4, -1, 1);
  std::vector<char> mask(n * n);
  std::mt19937 g(5);
  for (auto& e : mask) e = (g() % 8) != 0;
  struct Range {
    std::size_t q0, m, a, b;
    bool causal;
    std::ptrdiff_t wl;
  };
  const Range ranges[] = {{70, 40, 64, 128, true, -1},
                          {100, 20, 3, 90, true, 50},
                          {0, 150, 17, 150, false, -1},
                          {10, 5, 100, 150, false, 30},
                          {30, 33, 40, 41, true, -1}};
  for (const Range& r : ranges) {
    for (bool with_extras : {false, true}) {
      AttentionOptions whole;
      whole.causal = r.causal;
      whole.window_left = r.wl;
      whole.kv_begin = r.a;
      whole.kv_end = r.b;
      whole.prefill_form = true;
      if (with_extras) {
        whole.mask = TensorView<const bool>(
            reinterpret_cast<const bool*>(mask.data()), 1, 1, n, n);
        whole.bias = TensorView<const float>(bias.data(), 1, 1, n, n);
      }
      softdot::AttentionPartial full;
      softdot::attention_partial(TensorView<const float>(q.data(), 1, H, n, d),
                                 TensorView<const float>(k.data(), 1, H, n, d),
                                 TensorView<const float>(v.data(), 1, H, n, dv),
                                 full, whole);
      std::vector<float> want(H * n * dv), want_lse(H * n);
      softdot::attention_finalize(
          full, TensorView<float>(want.data(), 1, H, n, dv), want_lse.data());

      const auto qs = rows_of(q, H, n, d, r.q0, r.m);
      const auto ks = rows_of(k, H, n, d, r.a, r.b - r.a);
      const auto vs = rows_of(v, H, n, dv, r.a, r.b - r.a);
      AttentionOptions slice;
      slice.causal = r.causal;
      slice.window_left = r.wl;
      slice.q_position = r.q0;
      slice.kv_position = r.a;
      slice.prefill_form = true;
      if (with_extras) {
        // The rows of these queries, every column of the sequence.
        slice.mask = TensorView<const bool>(
            reinterpret_cast<const bool*>(mask.data()) + r.q0 * n, 1, 1, r.m,
            n);
        slice.bias =
            TensorView<const float>(bias.data() + r.q0 * n, 1, 1, r.m, n);
      }
      std::vector<float> got(H * r.m * dv), got_lse(H * r.m);
      softdot::attention(
          TensorView<const float>(qs.data(), 1, H, r.m, d),
          TensorView<const float>(ks.data(), 1, H, r.b - r.a, d),
          TensorView<const float>(vs.data(), 1, H, r.b - r.a, dv),
          TensorView<float>(got.data(), 1, H, r.m, dv), slice, got_lse.data());
      const std::string label = "q0 " + std::to_string(r.q0) + " a " +
                                std::to_string(r.a) + " extras " +
                                std::to_string(with_extras);
      EXPECT_TRUE(bits_equal(got, rows_of(want, H, n, dv, r.q0, r.m))) << label;
      EXPECT_TRUE(bits_equal(got_lse, rows_of(want_lse, H, n, 1, r.q0, r.m)))
          << label;
      // attention_scores reads the same positions and columns.
      std::vector<float> s_got(H * r.m * (r.b - r.a)), s_full(H * n * n);
      softdot::attention_scores(
          TensorView<const float>(qs.data(), 1, H, r.m, d),
          TensorView<const float>(ks.data(), 1, H, r.b - r.a, d),
          TensorView<float>(s_got.data(), 1, H, r.m, r.b - r.a), slice);
      AttentionOptions whole_scores = whole;
      whole_scores.kv_begin = 0;
      whole_scores.kv_end = kNone;
      softdot::attention_scores(TensorView<const float>(q.data(), 1, H, n, d),
                                TensorView<const float>(k.data(), 1, H, n, d),
                                TensorView<float>(s_full.data(), 1, H, n, n),
                                whole_scores);
      for (std::size_t h = 0; h < H; ++h) {
        for (std::size_t i = 0; i < r.m; ++i) {
          for (std::size_t j = 0; j < r.b - r.a; ++j) {
            const float a = s_got[(h * r.m + i) * (r.b - r.a) + j];
            const float b = s_full[(h * n + r.q0 + i) * n + r.a + j];
            ASSERT_EQ(std::bit_cast<std::uint32_t>(a),
                      std::bit_cast<std::uint32_t>(b))
                << label << " score " << h << " " << i << " " << j;
          }
        }
      }
    }
  }
}

// The defaults, stated explicitly, change no bit (q_position = n_kv - n_q,
// kv_position 0), for either form.
TEST(AttentionPositions, ExplicitDefaultsKeepTheBits) {
  for (std::size_t nq : {1, 3, 40}) {
    const std::size_t nkv = 90, d = 16, dv = 8;
    const auto q = uniform(nq * d, 7, -1, 1);
    const auto k = uniform(nkv * d, 8, -1, 1);
    const auto v = uniform(nkv * dv, 9, -1, 1);
    std::vector<float> a(nq * dv), b(nq * dv);
    AttentionOptions o;
    o.causal = true;
    softdot::attention(TensorView<const float>(q.data(), 1, 1, nq, d),
                       TensorView<const float>(k.data(), 1, 1, nkv, d),
                       TensorView<const float>(v.data(), 1, 1, nkv, dv),
                       TensorView<float>(a.data(), 1, 1, nq, dv), o);
    o.q_position = nkv - nq;
    softdot::attention(TensorView<const float>(q.data(), 1, 1, nq, d),
                       TensorView<const float>(k.data(), 1, 1, nkv, d),
                       TensorView<const float>(v.data(), 1, 1, nkv, dv),
                       TensorView<float>(b.data(), 1, 1, nq, dv), o);
    EXPECT_TRUE(bits_equal(a, b)) << nq;
  }
}

// prefill_form: a decode-shaped call (one row) gives the bits of the same
// row in a large (prefill) call.
TEST(AttentionPositions, PrefillFormMakesRowsIndependentOfTheCall) {
  const std::size_t n = 200, d = 64, dv = 32;
  const auto q = uniform(n * d, 11, -2, 2);
  const auto k = uniform(n * d, 12, -2, 2);
  const auto v = uniform(n * dv, 13, -1, 1);
  std::vector<float> all(n * dv), one(dv), one_decode(dv);
  softdot::attention(TensorView<const float>(q.data(), 1, 1, n, d),
                     TensorView<const float>(k.data(), 1, 1, n, d),
                     TensorView<const float>(v.data(), 1, 1, n, dv),
                     TensorView<float>(all.data(), 1, 1, n, dv));
  const std::size_t i = 123;
  AttentionOptions o;
  o.q_position = 0;  // the row's own position: 0 among n keys, no causal
  o.prefill_form = true;
  softdot::attention(TensorView<const float>(q.data() + i * d, 1, 1, 1, d),
                     TensorView<const float>(k.data(), 1, 1, n, d),
                     TensorView<const float>(v.data(), 1, 1, n, dv),
                     TensorView<float>(one.data(), 1, 1, 1, dv), o);
  EXPECT_TRUE(bits_equal(one, rows_of(all, 1, n, dv, i, 1)));
  // Without it the decode form runs: other roundings (this is what makes
  // the flag needed).
  o.prefill_form = false;
  softdot::attention(TensorView<const float>(q.data() + i * d, 1, 1, 1, d),
                     TensorView<const float>(k.data(), 1, 1, n, d),
                     TensorView<const float>(v.data(), 1, 1, n, dv),
                     TensorView<float>(one_decode.data(), 1, 1, 1, dv), o);
  EXPECT_FALSE(bits_equal(one_decode, rows_of(all, 1, n, dv, i, 1)));
}

TEST(AttentionPositions, Errors) {
  const std::size_t n = 10, d = 4;
  std::vector<float> x(n * d, 0.5f), out(n * d);
  std::vector<char> mask(n * 20, 1);
  const TensorView<const float> t(x.data(), 1, 1, n, d);
  AttentionOptions o;
  o.kv_position = 11;
  o.mask = TensorView<const bool>(reinterpret_cast<const bool*>(mask.data()), 1,
                                  1, n, 20);
  // 11 + 10 keys need 21 columns.
  expect_invalid("mask columns",
                 [&] {
                   softdot::attention(
                       t, t, t, TensorView<float>(out.data(), 1, 1, n, d), o);
                 },
                 {"attention", "mask [1, 1, 10, 20]", "kv_position + n_kv"});
  o.kv_position = 10;  // 20 columns suffice
  softdot::attention(t, t, t, TensorView<float>(out.data(), 1, 1, n, d), o);
  // Paged attention rejects positions.
  const std::int32_t table[] = {0};
  const std::int32_t lens[] = {static_cast<std::int32_t>(n)};
  softdot::PagedKVTable pt{table, 1, lens};
  AttentionOptions po;
  po.q_position = 3;
  expect_invalid(
      "paged",
      [&] {
        softdot::paged_attention(t, t, t, pt,
                                 TensorView<float>(out.data(), 1, 1, n, d), po);
      },
      {"paged_attention", "q_position and kv_position are not supported"});
}

}  // namespace
}  // namespace softdot_test
