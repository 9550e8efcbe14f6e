// write_kv (kv_cache.h): new keys and values into their slots of a paged
// cache. Every written page row holds what the format's conversion gives
// (exact, to nearest even, or quantize_kv's row); every other row is
// untouched; a cache built by write_kv and read by paged_attention gives the
// bits of attention() on the contiguous keys; every bad argument is an
// error that writes nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "attention_test_util.h"
#include "softdot/attention.h"
#include "softdot/kv_cache.h"

namespace softdot_test {
namespace {

using softdot::Int8KV;
using softdot::Int8Pages;
using softdot::PagedKVTable;

template <class P>
P page_sentinel() {
  if constexpr (std::is_same_v<P, std::int8_t>) {
    return std::int8_t{-128};
  } else {
    return from_float<P>(kNaNF);
  }
}

// Pages in vLLM's [P, page_size, H_kv, C] layout, seen as
// [P, H_kv, page_size, C] through strides.
template <class P>
struct VPages {
  Tensor<P> t;
  VPages(std::size_t pages, std::size_t hkv, std::size_t ps, std::size_t c)
      : t(pages, ps, hkv, c, 1, page_sentinel<P>(), 2) {}
  TensorView<P> view() {
    return TensorView<P>(t.data(), t.B, t.R, t.H, t.C, t.bs, t.rs, t.hs);
  }
  TensorView<const P> cview() const {
    return TensorView<const P>(t.data(), t.B, t.R, t.H, t.C, t.bs, t.rs, t.hs);
  }
  P& at(std::size_t p, std::size_t h, std::size_t r, std::size_t c) {
    return t.at(p, r, h, c);
  }
};

template <class T>
std::uint32_t raw_bits(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return bits(x);
  } else if constexpr (std::is_same_v<T, std::int8_t>) {
    return static_cast<std::uint8_t>(x);
  } else {
    return x.bits;
  }
}

// Rows [1, H_kv, T, C] in format In, from uniform floats (vLLM's
// [T, H_kv, C] layout through strides).
template <class In>
struct Rows {
  Tensor<In> t;
  Rows(std::size_t T, std::size_t hkv, std::size_t c, std::uint64_t seed)
      : t(1, T, hkv, c, 0, In{}) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> u(-3.0, 3.0);
    t.for_each([&](In& x) { x = from_float<In>(float(u(rng))); });
  }
  TensorView<const In> view() const {
    return TensorView<const In>(t.data(), 1, t.R, t.H, t.C, t.bs, t.rs, t.hs);
  }
  float at(std::size_t h, std::size_t r, std::size_t c) const {
    return widen(t.at(0, r, h, c));
  }
};

// In rows into P pages: the written rows hold the conversion, the others
// their sentinel.
template <class In, class P>
void check_write(const std::string& label) {
  const std::size_t hkv = 3, d = 20, dv = 12, ps = 5, pages = 7, T = 17;
  const Rows<In> key(T, hkv, d, 11), value(T, hkv, dv, 12);
  VPages<P> kp(pages, hkv, ps, d), vp(pages, hkv, ps, dv);
  VPages<float> ks(pages, hkv, ps, 1), vs(pages, hkv, ps, 1);
  // Distinct slots in random order, three rows skipped.
  std::vector<std::int64_t> slots(pages * ps);
  std::iota(slots.begin(), slots.end(), 0);
  std::mt19937_64 rng(5);
  std::shuffle(slots.begin(), slots.end(), rng);
  slots.resize(T);
  slots[2] = slots[9] = slots[16] = softdot::kSkipSlot;
  if constexpr (std::is_same_v<P, std::int8_t>) {
    softdot::write_kv(key.view(), value.view(), Int8Pages{kp.view(), ks.view()},
                      Int8Pages{vp.view(), vs.view()}, slots);
  } else {
    softdot::write_kv(key.view(), value.view(), kp.view(), vp.view(), slots);
  }
  std::vector<int> writer(pages * ps, -1);
  for (std::size_t t = 0; t < T; ++t)
    if (slots[t] >= 0) writer[std::size_t(slots[t])] = int(t);
  std::size_t bad = 0;
  auto expect_row = [&](VPages<P>& pg, VPages<float>& sc, const Rows<In>& x,
                        std::size_t c_n, std::size_t slot, std::size_t h,
                        const char* what) {
    const std::size_t page = slot / ps, r = slot % ps;
    const int t = writer[slot];
    std::vector<P> want(c_n, page_sentinel<P>());
    float want_scale = kNaNF;
    if (t >= 0) {
      std::vector<float> row(c_n);
      for (std::size_t c = 0; c < c_n; ++c) row[c] = x.at(h, std::size_t(t), c);
      if constexpr (std::is_same_v<P, std::int8_t>) {
        softdot::quantize_kv(TensorView<const float>(row.data(), 1, 1, 1, c_n),
                             TensorView<std::int8_t>(want.data(), 1, 1, 1, c_n),
                             TensorView<float>(&want_scale, 1, 1, 1, 1));
      } else {
        for (std::size_t c = 0; c < c_n; ++c) want[c] = from_float<P>(row[c]);
      }
    }
    bool same = true;
    for (std::size_t c = 0; c < c_n; ++c)
      same = same && raw_bits(pg.at(page, h, r, c)) == raw_bits(want[c]);
    if constexpr (std::is_same_v<P, std::int8_t>) {
      same = same && bits(sc.at(page, h, r, 0)) == bits(want_scale);
    }
    if (!same && bad++ < 5)
      ADD_FAILURE() << label << ": " << what << " slot " << slot << " head "
                    << h << (t >= 0 ? " (written)" : " (not written)");
  };
  for (std::size_t slot = 0; slot < pages * ps; ++slot)
    for (std::size_t h = 0; h < hkv; ++h) {
      expect_row(kp, ks, key, d, slot, h, "k_pages");
      expect_row(vp, vs, value, dv, slot, h, "v_pages");
    }
}

TEST(WriteKV, EveryFormatHoldsItsConversion) {
  check_write<float, float>("f32 -> f32");
  check_write<float, Float16>("f32 -> f16");
  check_write<float, BFloat16>("f32 -> bf16");
  check_write<float, std::int8_t>("f32 -> int8");
  check_write<Float16, Float16>("f16 -> f16");
  check_write<BFloat16, BFloat16>("bf16 -> bf16");
  check_write<BFloat16, std::int8_t>("bf16 -> int8");
  check_write<Float16, float>("f16 -> f32");
}

// A cache filled by write_kv, a few tokens per step in a random page order
// (vLLM's page pool), read by paged_attention: the bits of attention() on
// the contiguous keys (int8: on quantize_kv's output).
template <class P>
void write_then_attend(const std::string& label) {
  const std::size_t B = 3, H = 4, hkv = 2, d = 16, dv = 16, ps = 8, nq = 3;
  const std::vector<std::int32_t> lens = {37, 5, 70};
  const std::size_t n_max = 70, bps = (n_max + ps - 1) / ps;
  const std::size_t pages = B * bps + 2;
  // Contiguous float keys and values [B, H_kv, n_max, d].
  Tensor<float> kc(B, hkv, n_max, d, 0, 0.0f), vc(B, hkv, n_max, dv, 0, 0.0f);
  std::mt19937_64 rng(9);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  kc.for_each([&](float& x) { x = float(u(rng)); });
  vc.for_each([&](float& x) { x = float(u(rng)); });
  // 16-bit pages take keys already in their format (stored exactly).
  if constexpr (!std::is_same_v<P, float> && !std::is_same_v<P, std::int8_t>) {
    kc.for_each([&](float& x) { x = widen(from_float<P>(x)); });
    vc.for_each([&](float& x) { x = widen(from_float<P>(x)); });
  }
  std::vector<std::int32_t> order(pages);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<std::int32_t> table(B * bps);
  for (std::size_t i = 0; i < table.size(); ++i) table[i] = order[i];
  VPages<P> kp(pages, hkv, ps, d), vp(pages, hkv, ps, dv);
  VPages<float> ks(pages, hkv, ps, 1), vs(pages, hkv, ps, 1);
  // Steps of up to 9 tokens, every sequence's tokens in position order,
  // the sequences interleaved.
  std::vector<std::size_t> done(B, 0);
  for (bool more = true; more;) {
    more = false;
    std::vector<std::int64_t> slots;
    std::vector<float> krows, vrows;
    for (std::size_t b = 0; b < B; ++b) {
      const std::size_t n = std::min<std::size_t>(
          std::size_t(lens[b]) - done[b], 1 + (rng() % 9));
      for (std::size_t j = done[b]; j < done[b] + n; ++j) {
        slots.push_back(std::int64_t(table[b * bps + j / ps]) * ps + j % ps);
        for (std::size_t h = 0; h < hkv; ++h) {
          for (std::size_t c = 0; c < d; ++c)
            krows.push_back(kc.at(b, h, j, c));
          for (std::size_t c = 0; c < dv; ++c)
            vrows.push_back(vc.at(b, h, j, c));
        }
      }
      done[b] += n;
      more = more || done[b] < std::size_t(lens[b]);
    }
    slots.push_back(softdot::kSkipSlot);  // a padding row
    krows.resize(krows.size() + hkv * d, kNaNF);
    vrows.resize(vrows.size() + hkv * dv, kNaNF);
    const std::size_t T = slots.size();
    const TensorView<const float> kv(krows.data(), 1, hkv, T, d, 0, d, hkv * d);
    const TensorView<const float> vv(vrows.data(), 1, hkv, T, dv, 0, dv,
                                     hkv * dv);
    if constexpr (std::is_same_v<P, std::int8_t>) {
      // NaN in a skipped row is not read.
      softdot::write_kv(kv, vv, Int8Pages{kp.view(), ks.view()},
                        Int8Pages{vp.view(), vs.view()}, slots);
    } else {
      softdot::write_kv(kv, vv, kp.view(), vp.view(), slots);
    }
  }
  Tensor<float> q(B, H, nq, d, 0, 0.0f);
  q.for_each([&](float& x) { x = float(u(rng)); });
  AttentionOptions o;
  o.causal = true;
  const PagedKVTable t{table, bps, lens};
  Tensor<float> got(B, H, nq, dv, 0, kOutSentinel);
  if constexpr (std::is_same_v<P, std::int8_t>) {
    softdot::paged_attention(q.cview(), Int8KV{kp.cview(), ks.cview()},
                             Int8KV{vp.cview(), vs.cview()}, t, got.view(), o);
  } else {
    softdot::paged_attention(q.cview(), kp.cview(), vp.cview(), t, got.view(),
                             o);
  }
  for (std::size_t b = 0; b < B; ++b) {
    const auto n = std::size_t(lens[b]);
    Tensor<float> want(1, H, nq, dv, 0, 0.0f);
    const TensorView<const float> qb(q.data() + b * q.bs, 1, H, nq, d);
    const TensorView<const float> kb(kc.data() + b * kc.bs, 1, hkv, n, d, kc.bs,
                                     kc.hs, kc.rs);
    const TensorView<const float> vb(vc.data() + b * vc.bs, 1, hkv, n, dv,
                                     vc.bs, vc.hs, vc.rs);
    if constexpr (std::is_same_v<P, std::int8_t>) {
      Tensor<std::int8_t> k8(1, hkv, n, d, 0, std::int8_t{0}),
          v8(1, hkv, n, dv, 0, std::int8_t{0});
      Tensor<float> ksc(1, hkv, n, 1, 0, 0.0f), vsc(1, hkv, n, 1, 0, 0.0f);
      softdot::quantize_kv(kb, k8.view(), ksc.view());
      softdot::quantize_kv(vb, v8.view(), vsc.view());
      softdot::attention(qb, Int8KV{k8.cview(), ksc.cview()},
                         Int8KV{v8.cview(), vsc.cview()}, want.view(), o);
    } else if constexpr (std::is_same_v<P, float>) {
      softdot::attention(qb, kb, vb, want.view(), o);
    } else {
      Tensor<P> k16(1, hkv, n, d, 0, P{}), v16(1, hkv, n, dv, 0, P{});
      for (std::size_t h = 0; h < hkv; ++h)
        for (std::size_t j = 0; j < n; ++j) {
          for (std::size_t c = 0; c < d; ++c)
            k16.at(0, h, j, c) = from_float<P>(kb.row(0, h, j)[c]);
          for (std::size_t c = 0; c < dv; ++c)
            v16.at(0, h, j, c) = from_float<P>(vb.row(0, h, j)[c]);
        }
      softdot::attention(qb, k16.cview(), v16.cview(), want.view(), o);
    }
    bool same = true;
    for (std::size_t h = 0; h < H; ++h)
      for (std::size_t i = 0; i < nq; ++i)
        for (std::size_t c = 0; c < dv; ++c)
          same = same && bits(got.at(b, h, i, c)) == bits(want.at(0, h, i, c));
    EXPECT_TRUE(same) << label << ": sequence " << b;
  }
}

TEST(WriteKV, WrittenCacheAttendsAsContiguous) {
  write_then_attend<float>("f32");
  write_then_attend<Float16>("f16");
  write_then_attend<BFloat16>("bf16");
  write_then_attend<std::int8_t>("int8");
}

// Every bad argument: a clear error, and no page written.
TEST(WriteKV, BadArgumentsAreErrorsAndWriteNothing) {
  const std::size_t hkv = 2, d = 4, ps = 3, pages = 2;
  std::vector<float> k(4 * hkv * d, 0.5f), v(4 * hkv * d, 0.25f);
  const TensorView<const float> kv(k.data(), 1, hkv, 4, d, 0, d, hkv * d);
  const TensorView<const float> vv(v.data(), 1, hkv, 4, d, 0, d, hkv * d);
  Tensor<float> kp(pages, hkv, ps, d, 0, kOutSentinel),
      vp(pages, hkv, ps, d, 0, kOutSentinel);
  Tensor<std::int8_t> k8(pages, hkv, ps, d, 0, std::int8_t{7}),
      v8(pages, hkv, ps, d, 0, std::int8_t{7});
  Tensor<float> ks(pages, hkv, ps, 1, 0, kOutSentinel),
      vs(pages, hkv, ps, 1, 0, kOutSentinel);
  Tensor<Float16> kh(pages, hkv, ps, d, 0, Float16{1});
  auto untouched = [&](const std::string& what) {
    bool same = true;
    for (float x : kp.dense()) same = same && bits(x) == bits(kOutSentinel);
    for (float x : vp.dense()) same = same && bits(x) == bits(kOutSentinel);
    for (float x : ks.dense()) same = same && bits(x) == bits(kOutSentinel);
    for (std::int8_t x : k8.dense()) same = same && x == 7;
    EXPECT_TRUE(same) << what << ": a page was written";
  };
  auto expect = [&](const std::string& what, auto call,
                    std::vector<std::string> needles) {
    needles.insert(needles.begin(), "write_kv");
    expect_invalid(what, call, needles);
    untouched(what);
  };
  using S = std::vector<std::int64_t>;
  expect("slot out of range",
         [&] {
           softdot::write_kv(kv, vv, kp.view(), vp.view(), S{0, 1, 6, 2});
         },
         {"slot_mapping[2] = 6", "is not a slot", "slots 0 to 5"});
  expect("negative slot",
         [&] {
           softdot::write_kv(kv, vv, kp.view(), vp.view(), S{0, -2, 3, 2});
         },
         {"slot_mapping[1] = -2", "only -1"});
  expect("duplicate",
         [&] {
           softdot::write_kv(kv, vv, kp.view(), vp.view(), S{4, -1, 1, 4});
         },
         {"slot 4 is written twice", "row 0 and row 3"});
  expect("too few slots",
         [&] {
           softdot::write_kv(kv, vv, kp.view(), vp.view(), S{0, 1, 2});
         },
         {"slot_mapping has 3 entries", "has 4 rows"});
  expect("formats differ",
         [&] {
           softdot::write_kv(kv, vv, kp.view(), kh.view(), S{0, 1, 2, 3});
         },
         {"k_pages is float32 but v_pages is float16"});
  Tensor<float> kp5(pages, hkv, ps, d + 1, 0, kOutSentinel);
  expect("d differs",
         [&] {
           softdot::write_kv(kv, vv, kp5.view(), vp.view(), S{0, 1, 2, 3});
         },
         {"k_pages [2, 2, 3, 5] must have", "d = 4 of key"});
  Tensor<float> kp3(pages, hkv + 1, ps, d, 0, kOutSentinel),
      vp3(pages, hkv + 1, ps, d, 0, kOutSentinel);
  expect("heads differ",
         [&] {
           softdot::write_kv(kv, vv, kp3.view(), vp3.view(), S{0, 1, 2, 3});
         },
         {"k_pages [2, 3, 3, 4] must have the 2 heads"});
  std::vector<float> knan = k;
  knan[1 * hkv * d + d + 2] = kNaNF;  // row 1, head 1, element 2
  const TensorView<const float> kvn(knan.data(), 1, hkv, 4, d, 0, d, hkv * d);
  expect("NaN into int8",
         [&] {
           softdot::write_kv(kvn, vv, Int8Pages{k8.view(), ks.view()},
                             Int8Pages{v8.view(), vs.view()}, S{0, 1, 2, 3});
         },
         {"key holds nan at [0, 1, 1, 2]", "slot 1", "finite"});
  // The same NaN row skipped: written without error (float pages take NaN).
  softdot::write_kv(kvn, vv, Int8Pages{k8.view(), ks.view()},
                    Int8Pages{v8.view(), vs.view()}, S{0, -1, 2, 3});
  EXPECT_EQ(k8.at(0, 0, 0, 0), std::int8_t{127});
}

// write_kv_and_attend: the bits of write_kv then run_attention; a failing
// attention (a bad table) puts every written row back, bit for bit (int8
// pages and scales too); a request over other pages is refused before
// anything is written.
TEST(WriteKV, WriteAndAttendInOneCall) {
  const std::size_t hkv = 2, H = 4, d = 8, ps = 4, pages = 6, T = 3;
  std::mt19937_64 rng(4);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<float> k(T * hkv * d), v(T * hkv * d), q(T * H * d);
  for (float& x : k) x = float(u(rng));
  for (float& x : v) x = float(u(rng));
  for (float& x : q) x = float(u(rng));
  const TensorView<const float> kv(k.data(), 1, hkv, T, d, 0, d, hkv * d);
  const TensorView<const float> vv(v.data(), 1, hkv, T, d, 0, d, hkv * d);
  const TensorView<const float> qv(q.data(), 1, H, T, d, 0, d, H * d);
  // The new tokens: positions 7 and 8 of sequence 0, 5 of sequence 1.
  const std::vector<std::int64_t> slots = {7, 8, 17};
  const std::vector<std::int32_t> table = {0, 1, 2, 3, 4, 5}, lens = {9, 6},
                                  qsl = {0, 2, 3};
  std::vector<std::int32_t> bad_table = table;
  bad_table[4] = std::int32_t(pages);  // not a page
  auto fill = [&](Tensor<std::int8_t>& t8, Tensor<float>& sc) {
    t8.for_each([&](std::int8_t& x) { x = std::int8_t(int(u(rng) * 100)); });
    sc.for_each([&](float& x) { x = float(0.01 + 0.01 * std::abs(u(rng))); });
  };
  Tensor<std::int8_t> k8(pages, hkv, ps, d, 0, std::int8_t{0}),
      v8(pages, hkv, ps, d, 0, std::int8_t{0});
  Tensor<float> ks(pages, hkv, ps, 1, 0, 0.0f), vs(pages, hkv, ps, 1, 0, 0.0f);
  fill(k8, ks);
  fill(v8, vs);
  const auto k8_0 = k8.dense(), v8_0 = v8.dense();
  const auto ks_0 = ks.dense(), vs_0 = vs.dense();
  auto request = [&](const std::vector<std::int32_t>& tab, float* out) {
    PagedKVTable t{tab, 3, lens};
    t.query_start_loc = qsl;
    softdot::AttentionRequest r;
    r.name = "paged_attention";
    r.q = qv;
    r.kv = softdot::KVSource::pages(Int8KV{k8.cview(), ks.cview()},
                                    Int8KV{v8.cview(), vs.cview()}, t);
    r.target =
        softdot::AttentionTarget::output(TensorView<float>(out, 1, H, T, d));
    r.options.causal = true;
    return r;
  };
  const Int8Pages kp{k8.view(), ks.view()}, vp{v8.view(), vs.view()};
  // The pages as they were before any write.
  auto reset = [&] {
    k8.for_each(
        [&, i = std::size_t(0)](std::int8_t& x) mutable { x = k8_0[i++]; });
    v8.for_each(
        [&, i = std::size_t(0)](std::int8_t& x) mutable { x = v8_0[i++]; });
    ks.for_each([&, i = std::size_t(0)](float& x) mutable { x = ks_0[i++]; });
    vs.for_each([&, i = std::size_t(0)](float& x) mutable { x = vs_0[i++]; });
  };
  // Two calls, then the state restored by hand, then one call.
  std::vector<float> want(H * T * d), got(H * T * d);
  softdot::write_kv(kv, vv, kp, vp, slots);
  softdot::run_attention(request(table, want.data()));
  const auto k8_w = k8.dense();
  const auto ks_w = ks.dense();
  reset();
  softdot::write_kv_and_attend(kv, vv, kp, vp, slots,
                               request(table, got.data()));
  EXPECT_TRUE(SameBits(got, want)) << "one call differs from two";
  EXPECT_EQ(k8.dense(), k8_w);
  EXPECT_TRUE(SameBits(ks.dense(), ks_w));
  // Back to the start; a bad table: an error, and the pages as they were.
  reset();
  expect_invalid("bad table",
                 [&] {
                   softdot::write_kv_and_attend(kv, vv, kp, vp, slots,
                                                request(bad_table, got.data()));
                 },
                 {"paged_attention", "block_table"});
  EXPECT_EQ(k8.dense(), k8_0);
  EXPECT_EQ(v8.dense(), v8_0);
  EXPECT_TRUE(SameBits(ks.dense(), ks_0));
  EXPECT_TRUE(SameBits(vs.dense(), vs_0));
  // A request over other pages: refused, nothing written.
  Tensor<std::int8_t> other(pages, hkv, ps, d, 0, std::int8_t{0});
  softdot::AttentionRequest r = request(table, got.data());
  r.kv.k = Int8KV{other.cview(), ks.cview()};
  expect_invalid(
      "other pages",
      [&] { softdot::write_kv_and_attend(kv, vv, kp, vp, slots, r); },
      {"write_kv_and_attend", "must read the pages written"});
  EXPECT_EQ(k8.dense(), k8_0);
}

}  // namespace
}  // namespace softdot_test
