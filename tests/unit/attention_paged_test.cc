// Attention tests: paged_attention and paged_attention_partial. Every
// sequence's rows must be, bit for bit, those of attention() (and
// attention_partial()) on contiguous K and V holding that sequence's keys,
// for every format, option, page size, page order, layout, thread count and
// SIMD target; and every bad table is an error that writes nothing.
// (Over 600 lines on purpose: one contiguous-vs-paged comparison harness
// shared by every format, option and layout sweep, and the table errors
// beside the cases they guard.)
#include <bit>
#include <cstdint>

#include "attention_checks.h"
#include "attention_sweeps.h"
#include "attention_test_util.h"

namespace softdot_test {
namespace {

using softdot::AttentionPartial;
using softdot::Int8KV;
using softdot::PagedKVTable;

// ---- a contiguous cache and its paged copy ---------------------------------

// Contiguous K and V [B, H_kv, max_len, d] in format T (int8: with scales
// [B, H_kv, max_len, 1]); sequence b uses its first lens[b] keys.
template <class T>
struct Cache {
  Tensor<T> k, v;
  Tensor<float> ks, vs;  // int8 only
};

// int8 or fp8: values with a float scale per row.
template <class T>
constexpr bool kInt8 =
    std::is_same_v<T, std::int8_t> || std::is_same_v<T, softdot::Float8E4M3> ||
    std::is_same_v<T, softdot::Float8E5M2>;
template <class T>
constexpr bool kFp8 = kInt8<T> && !std::is_same_v<T, std::int8_t>;

// The K/V argument of scaled values and their scales.
template <class T>
auto scaled_kv(TensorView<const T> values, TensorView<const float> scales) {
  if constexpr (kFp8<T>) {
    return softdot::Float8KV<T>{values, scales};
  } else {
    return Int8KV{values, scales};
  }
}

template <class T>
Tensor<T> random_tensor(std::size_t B, std::size_t H, std::size_t R,
                        std::size_t C, std::mt19937_64& rng) {
  Tensor<T> t(B, H, R, C, 1, T{});
  if constexpr (kFp8<T>) {
    // Every finite pattern (no NaN; no e5m2 infinity), subnormals included.
    std::uniform_int_distribution<int> u(0, 255);
    t.for_each([&](T& x) {
      do {
        x.bits = static_cast<std::uint8_t>(u(rng));
      } while (!std::isfinite(softdot::to_float(x)));
    });
  } else if constexpr (kInt8<T>) {
    std::uniform_int_distribution<int> u(-127, 127);
    t.for_each([&](T& x) { x = static_cast<std::int8_t>(u(rng)); });
  } else {
    std::uniform_real_distribution<double> u(-1.0, 1.0);
    t.for_each([&](T& x) { x = from_float<T>(float(u(rng))); });
  }
  return t;
}

template <class T>
Cache<T> make_cache(std::size_t B, std::size_t Hkv, std::size_t max_len,
                    std::size_t d, std::size_t dv, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  Cache<T> c;
  c.k = random_tensor<T>(B, Hkv, max_len, d, rng);
  c.v = random_tensor<T>(B, Hkv, max_len, dv, rng);
  if constexpr (kInt8<T>) {
    // fp8 values reach 448 (e4m3fn) or 57344 (e5m2).
    const double top = !kFp8<T>                                 ? 0.02
                       : std::is_same_v<T, softdot::Float8E4M3> ? 0.005
                                                                : 4e-5;
    std::uniform_real_distribution<double> u(top / 20, top);
    c.ks = Tensor<float>(B, Hkv, max_len, 1, 0, 0.0f);
    c.vs = Tensor<float>(B, Hkv, max_len, 1, 0, 0.0f);
    c.ks.for_each([&](float& x) { x = float(u(rng)); });
    c.vs.for_each([&](float& x) { x = float(u(rng)); });
  }
  return c;
}

// Pages [P, H_kv, page_size, C], or vLLM's [P, page_size, H_kv, C] seen
// through strides; unused rows and spare pages hold `fill` (NaN for floats:
// reading one would show).
template <class T>
struct Pages {
  Tensor<T> t;
  bool vllm = false;
  T& at(std::size_t p, std::size_t h, std::size_t r, std::size_t c) {
    return vllm ? t.at(p, r, h, c) : t.at(p, h, r, c);
  }
  TensorView<const T> view() const {
    if (!vllm) return t.cview();
    return TensorView<const T>(t.data(), t.B, t.R, t.H, t.C, t.bs, t.rs, t.hs);
  }
};

template <class T>
T poison() {
  if constexpr (kFp8<T>) {
    return T{0x7f};  // NaN (e4m3fn) or a large value (e5m2): it would show
  } else if constexpr (kInt8<T>) {
    return std::int8_t{-128};
  } else {
    return from_float<T>(kNaNF);
  }
}

template <class T>
Pages<T> make_pages(std::size_t P, std::size_t Hkv, std::size_t ps,
                    std::size_t C, bool vllm, T fill) {
  Pages<T> p;
  p.vllm = vllm;
  p.t = vllm ? Tensor<T>(P, ps, Hkv, C, 1, fill, 3)
             : Tensor<T>(P, Hkv, ps, C, 2, fill, 5);
  return p;
}

template <class T>
struct Paged {
  std::vector<std::int32_t> table, lens;
  std::size_t blocks_per_seq = 0;
  Pages<T> k, v;
  Pages<float> ks, vs;
  PagedKVTable pkv() const { return {table, blocks_per_seq, lens}; }
  // Sequence b's row of the table alone (a batch of one).
  PagedKVTable sequence(std::size_t b) const {
    return {std::span<const std::int32_t>(table).subspan(b * blocks_per_seq,
                                                         blocks_per_seq),
            blocks_per_seq, std::span<const std::int32_t>(lens).subspan(b, 1)};
  }
};

// Pages the cache: page_size ps, the pages of all sequences in a random
// order among `spare` extra pages, table entries past a sequence's last
// page -1 (never read).
template <class T>
Paged<T> page(const Cache<T>& c, const std::vector<std::int32_t>& lens,
              std::size_t ps, bool vllm, std::uint64_t seed,
              std::size_t spare = 3) {
  Paged<T> p;
  p.lens = lens;
  const std::size_t B = lens.size(), Hkv = c.k.H, d = c.k.C, dv = c.v.C;
  std::size_t used = 0, most = 0;
  for (auto n : lens) {
    const std::size_t blocks = (std::size_t(n) + ps - 1) / ps;
    used += blocks;
    most = std::max(most, blocks);
  }
  p.blocks_per_seq = most + 1;
  const std::size_t P = used + spare;
  std::vector<std::int32_t> order(P);
  for (std::size_t i = 0; i < P; ++i) order[i] = std::int32_t(i);
  std::mt19937_64 rng(seed);
  std::shuffle(order.begin(), order.end(), rng);
  p.k = make_pages<T>(P, Hkv, ps, d, vllm, poison<T>());
  p.v = make_pages<T>(P, Hkv, ps, dv, vllm, poison<T>());
  if constexpr (kInt8<T>) {
    p.ks = make_pages<float>(P, Hkv, ps, 1, vllm, kNaNF);
    p.vs = make_pages<float>(P, Hkv, ps, 1, vllm, kNaNF);
  }
  p.table.assign(B * p.blocks_per_seq, -1);
  std::size_t next = 0;
  for (std::size_t b = 0; b < B; ++b) {
    const auto n = std::size_t(lens[b]);
    for (std::size_t i = 0; i < (n + ps - 1) / ps; ++i) {
      p.table[b * p.blocks_per_seq + i] = order[next++];
    }
    for (std::size_t t = 0; t < n; ++t) {
      const auto pg = std::size_t(p.table[b * p.blocks_per_seq + t / ps]);
      for (std::size_t h = 0; h < Hkv; ++h) {
        for (std::size_t x = 0; x < d; ++x)
          p.k.at(pg, h, t % ps, x) = c.k.at(b, h, t, x);
        for (std::size_t x = 0; x < dv; ++x)
          p.v.at(pg, h, t % ps, x) = c.v.at(b, h, t, x);
        if constexpr (kInt8<T>) {
          p.ks.at(pg, h, t % ps, 0) = c.ks.at(b, h, t, 0);
          p.vs.at(pg, h, t % ps, 0) = c.vs.at(b, h, t, 0);
        }
      }
    }
  }
  return p;
}

// ---- running both ----------------------------------------------------------

// Batch b of t with `rows` rows (a sequence of the contiguous cache).
template <class E>
TensorView<const E> seq_view(const Tensor<E>& t, std::size_t b,
                             std::size_t rows) {
  return TensorView<const E>(t.data() + b * t.bs, 1, t.H, rows, t.C, t.bs, t.hs,
                             t.rs);
}
template <class E>
TensorView<E> seq_view(Tensor<E>& t, std::size_t b) {
  return TensorView<E>(t.data() + b * t.bs, 1, t.H, t.R, t.C, t.bs, t.hs, t.rs);
}
// Batch b of a mask or bias (batch 1: broadcast), with n_kv columns.
template <class E>
TensorView<const E> seq_extra(const TensorView<const E>& t, std::size_t b,
                              std::size_t n_kv) {
  if (t.empty()) return t;
  TensorView<const E> s = t;
  if (t.batch != 1) s.data = t.data + b * t.batch_stride;
  s.batch = 1;
  s.cols = n_kv;
  return s;
}

template <class T>
void run_paged(const Tensor<float>& q, const Paged<T>& p, Tensor<float>& out,
               const AttentionOptions& o, float* lse) {
  if constexpr (kInt8<T>) {
    softdot::paged_attention(q.cview(), scaled_kv(p.k.view(), p.ks.view()),
                             scaled_kv(p.v.view(), p.vs.view()), p.pkv(),
                             out.view(), o, lse);
  } else {
    softdot::paged_attention(q.cview(), p.k.view(), p.v.view(), p.pkv(),
                             out.view(), o, lse);
  }
}
template <class T>
void run_paged_partial(const Tensor<float>& q, const Paged<T>& p,
                       AttentionPartial& part, const AttentionOptions& o) {
  if constexpr (kInt8<T>) {
    softdot::paged_attention_partial(
        q.cview(), scaled_kv(p.k.view(), p.ks.view()),
        scaled_kv(p.v.view(), p.vs.view()), p.pkv(), part, o);
  } else {
    softdot::paged_attention_partial(q.cview(), p.k.view(), p.v.view(), p.pkv(),
                                     part, o);
  }
}

// attention() and attention_partial() on each sequence alone, contiguous:
// the expected output [B, H, n_q, d_v], lse and partial. A key range past
// a sequence's end is empty for it (attention.h).
template <class T>
void run_contiguous(const Tensor<float>& q, const Cache<T>& c,
                    const std::vector<std::int32_t>& lens, Tensor<float>& out,
                    std::vector<float>& lse, AttentionPartial& part,
                    const AttentionOptions& o) {
  const std::size_t B = lens.size(), H = q.H, nq = q.R, dv = c.v.C;
  part = AttentionPartial::empty(B, H, nq, dv);
  for (std::size_t b = 0; b < B; ++b) {
    const auto n = std::size_t(lens[b]);
    AttentionOptions ob = o;
    ob.kv_begin = std::min(o.kv_begin, n);
    ob.mask = seq_extra(o.mask, b, n);
    ob.bias = seq_extra(o.bias, b, n);
    const auto qb = seq_view(q, b, nq);
    auto ob_out = seq_view(out, b);
    float* lb = lse.data() + b * H * nq;
    AttentionPartial pb;
    if constexpr (kInt8<T>) {
      const auto kb = scaled_kv(seq_view(c.k, b, n), seq_view(c.ks, b, n));
      const auto vb = scaled_kv(seq_view(c.v, b, n), seq_view(c.vs, b, n));
      softdot::attention(qb, kb, vb, ob_out, ob, lb);
      softdot::attention_partial(qb, kb, vb, pb, ob);
    } else {
      const auto kb = seq_view(c.k, b, n);
      const auto vb = seq_view(c.v, b, n);
      softdot::attention(qb, kb, vb, ob_out, ob, lb);
      softdot::attention_partial(qb, kb, vb, pb, ob);
    }
    const std::size_t r0 = b * H * nq;
    std::copy(pb.max.begin(), pb.max.end(), part.max.begin() + r0);
    std::copy(pb.sum.begin(), pb.sum.end(), part.sum.begin() + r0);
    std::copy(pb.out.begin(), pb.out.end(), part.out.begin() + r0 * dv);
  }
}

bool same_partial(const AttentionPartial& a, const AttentionPartial& b) {
  return a.batch == b.batch && a.heads == b.heads && a.rows == b.rows &&
         a.dv == b.dv && SameBits(a.max, b.max) && SameBits(a.sum, b.sum) &&
         SameBits(a.out, b.out);
}

struct Expected {
  Tensor<float> out;
  std::vector<float> lse;
  AttentionPartial part;
};

// paged_attention (out, lse; lse not asked: the same out) and
// paged_attention_partial against `want`, with 1 and 2 threads.
template <class T>
void expect_paged_equals(const std::string& what, const Tensor<float>& q,
                         const Paged<T>& p, const AttentionOptions& o,
                         const Expected& want) {
  const std::size_t B = q.B, H = q.H, nq = q.R, dv = want.out.C;
  for (int threads : {1, 2}) {
    const std::string w = what + ", " + std::to_string(threads) + " threads";
    Result got{Tensor<float>(B, H, nq, dv, 2, kOutSentinel, 1), {}};
    got.lse.assign(B * H * nq + kLseGuard, kLseSentinel);
    with_threads(threads, [&] {
      run_paged(q, p, got.o, o, got.lse.data());
      return 0;
    });
    EXPECT_TRUE(got.guards_ok()) << w << ": wrote outside out or lse";
    EXPECT_TRUE(SameBits(got.o.dense(), want.out.dense())) << w << ": out";
    EXPECT_TRUE(SameBits(
        std::vector<float>(got.lse.begin(), got.lse.begin() + B * H * nq),
        want.lse))
        << w << ": lse";
    if (threads == 1) {
      Tensor<float> o2(B, H, nq, dv, 0, kOutSentinel);
      run_paged(q, p, o2, o, nullptr);
      EXPECT_TRUE(SameBits(o2.dense(), want.out.dense())) << w << ": no lse";
    }
    AttentionPartial part;
    with_threads(threads, [&] {
      run_paged_partial(q, p, part, o);
      return 0;
    });
    EXPECT_TRUE(same_partial(part, want.part)) << w << ": partial";
  }
}

// Lengths: empty, one key, around the 64-key tile and the 512-key decode
// chunk, and none a multiple of every page size.
const std::vector<std::int32_t> kLens = {0, 1, 63, 65, 130, 513, 1100};

// One form shape (its H, H_kv, n_q, d, d_v and seed; the batch is one
// sequence per length of kLens): every option case, against each sequence
// alone (contiguous), paged with each page size, both layouts.
template <class T>
void paged_sweep(const std::string& label, const Shape& form,
                 const std::vector<std::size_t>& page_sizes) {
  const std::vector<std::int32_t>& lens = kLens;
  std::size_t max_len = 0;
  for (auto n : lens) max_len = std::max(max_len, std::size_t(n));
  Shape s = form;
  s.B = lens.size();
  s.nkv = max_len;
  const std::size_t B = s.B, H = s.H, nq = s.nq, d = s.d, dv = s.dv;
  const std::uint64_t seed = s.seed;
  const Cache<T> c = make_cache<T>(B, s.Hkv, max_len, d, dv, seed);
  Tensor<float> q(B, H, nq, d, 1, kNaNF);
  {
    std::mt19937_64 rng(seed + 1);
    std::uniform_real_distribution<double> u(-2.0, 2.0);
    q.for_each([&](float& x) { x = float(u(rng)); });
  }
  // Mask and bias with more columns than the longest sequence (the rest
  // are never read).
  const SweepArrays x(s, /*spare_cols=*/3);
  // The paged copies, each page size and layout, made once for every case.
  std::vector<std::pair<std::string, Paged<T>>> paged;
  for (std::size_t ps : page_sizes) {
    for (bool vllm : {false, true}) {
      paged.emplace_back(
          ", page_size " + std::to_string(ps) + (vllm ? " vLLM layout" : ""),
          page(c, lens, ps, vllm, seed + ps));
    }
  }
  for (const OptionCase& oc : option_sweep()) {
    const AttentionOptions o = oc.make(x);
    Expected want{Tensor<float>(B, H, nq, dv, 0, kOutSentinel),
                  std::vector<float>(B * H * nq, kLseSentinel),
                  {}};
    run_contiguous(q, c, lens, want.out, want.lse, want.part, o);
    for (const auto& [layout, p] : paged) {
      const std::string what =
          label + " " + oc.name + layout + " [" + softdot::simd_target() + "]";
      expect_paged_equals(what, q, p, o, want);
    }
  }
}

// Under AddressSanitizer (test.sh's ASan+UBSan tree), the SCALAR target
// runs two of the four page sizes: 1 (every tile of 64 keys gathered across
// 64 pages) and 256 (tiles read in place, some ending on a page's last row).
// 16 and 64 take the same kernel paths there (LoadBlock: a tile across pages
// is gathered, one inside a page is read in place), and the four SIMD
// targets still run all four under ASan. SCALAR, one lane at a time, made
// these four tests 70-97 s each under ASan (a third of that suite's time).
// Release and clang run every page size on every target.
#if defined(__SANITIZE_ADDRESS__)
#define SOFTDOT_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SOFTDOT_TEST_ASAN 1
#endif
#endif
#ifndef SOFTDOT_TEST_ASAN
#define SOFTDOT_TEST_ASAN 0
#endif

std::vector<std::size_t> page_sizes() {
  if (SOFTDOT_TEST_ASAN && softdot::simd_target() == "SCALAR") return {1, 256};
  return {1, 16, 64, 256};
}

template <class T>
void sweep_format(const char* name) {
  const std::vector<std::size_t> sizes = page_sizes();
  for (const FormShape& f : form_shapes()) {
    // The kernels' edges are the other sweeps' business; so is the MHA
    // pair (the partial and int8 sweeps run it), which would double this
    // sweep's cost (x 4 page sizes x 2 layouts x 5 targets, under ASan too)
    // for the same paging code: paged covers the GQA decode/prefill pair.
    if (f.edge ||
        std::string_view(f.name).find("MHA") != std::string_view::npos) {
      continue;
    }
    paged_sweep<T>(std::string(name) + " " + f.name, f.shape, sizes);
  }
}

class PagedTargets : public PerTarget {};

TEST_P(PagedTargets, F32EqualsContiguous) { sweep_format<float>("f32"); }
TEST_P(PagedTargets, F16EqualsContiguous) { sweep_format<Float16>("f16"); }
TEST_P(PagedTargets, BF16EqualsContiguous) { sweep_format<BFloat16>("bf16"); }
TEST_P(PagedTargets, Int8EqualsContiguous) {
  sweep_format<std::int8_t>("int8");
}
TEST_P(PagedTargets, Fp8E4M3EqualsContiguous) {
  sweep_format<softdot::Float8E4M3>("e4m3");
}
TEST_P(PagedTargets, Fp8E5M2EqualsContiguous) {
  sweep_format<softdot::Float8E5M2>("e5m2");
}

SOFTDOT_INSTANTIATE_PER_TARGET(PagedTargets);

// Empty sequences give rows of +0 and lse -inf (the sink with sinks); two
// sequences may share pages (a common prefix).
TEST(AttentionPaged, EmptySequencesAndSharedPages) {
  const std::size_t H = 2, d = 8, ps = 4;
  Tensor<float> kp(3, 1, ps, d, 0, 0.5f), vp(3, 1, ps, d, 0, 0.25f);
  for (std::size_t j = 0; j < ps; ++j) {
    for (std::size_t c = 0; c < d; ++c) {
      kp.at(1, 0, j, c) = float(j + c) / 16.0f;
      vp.at(1, 0, j, c) = float(j) - float(c);
    }
  }
  const std::vector<std::int32_t> table = {-7, 1, 2, 1};
  const std::vector<std::int32_t> lens = {0, 3, 0, 4};
  Tensor<float> q(4, H, 1, d, 0, 1.0f);
  Tensor<float> out(4, H, 1, d, 0, kOutSentinel);
  std::vector<float> lse(4 * H, kLseSentinel);
  softdot::paged_attention(q.cview(), kp.cview(), vp.cview(), {table, 1, lens},
                           out.view(), {}, lse.data());
  for (std::size_t b : {0, 2}) {
    for (std::size_t h = 0; h < H; ++h) {
      EXPECT_EQ(lse[b * H + h], -kInfF);
      for (std::size_t c = 0; c < d; ++c)
        EXPECT_EQ(bits(out.at(b, h, 0, c)), 0u);
    }
  }
  // Sequences 1 and 3 both read page 1 (3 and 4 of its rows).
  Tensor<float> want(1, H, 1, d, 0, 0.0f);
  std::vector<float> wl(H);
  for (std::size_t b : {1, 3}) {
    const std::size_t n = std::size_t(lens[b]);
    softdot::attention(TensorView<const float>(q.data(), 1, H, 1, d),
                       TensorView<const float>(kp.data() + kp.bs, 1, 1, n, d),
                       TensorView<const float>(vp.data() + vp.bs, 1, 1, n, d),
                       want.view(), {}, wl.data());
    for (std::size_t h = 0; h < H; ++h) {
      EXPECT_EQ(bits(lse[b * H + h]), bits(wl[h])) << b;
      for (std::size_t c = 0; c < d; ++c)
        EXPECT_EQ(bits(out.at(b, h, 0, c)), bits(want.at(0, h, 0, c))) << b;
    }
  }
  // With sinks, an empty sequence's lse is the sink.
  const std::vector<float> sinks = {0.5f, -1.25f};
  AttentionOptions o;
  o.sinks = sinks;
  softdot::paged_attention(q.cview(), kp.cview(), vp.cview(), {table, 1, lens},
                           out.view(), o, lse.data());
  EXPECT_EQ(lse[0], 0.5f);
  EXPECT_EQ(lse[1], -1.25f);
  for (std::size_t c = 0; c < d; ++c) EXPECT_EQ(bits(out.at(2, 1, 0, c)), 0u);
}

// ---- errors
// ------------------------------------------------------------------

// Every bad argument is a std::invalid_argument naming the function, the
// argument, the sequence and the entry; out, lse and a partial keep their
// contents.
TEST(AttentionPaged, BadTablesAreErrors) {
  const std::size_t B = 2, H = 4, Hkv = 2, nq = 3, d = 8, ps = 4, P = 5;
  Tensor<float> q(B, H, nq, d, 0, 0.5f);
  Tensor<float> kp(P, Hkv, ps, d, 0, 0.25f), vp(P, Hkv, ps, d, 0, 0.125f);
  Tensor<std::int8_t> k8(P, Hkv, ps, d, 0, std::int8_t{3});
  Tensor<std::int8_t> v8(P, Hkv, ps, d, 0, std::int8_t{-3});
  Tensor<float> ks(P, Hkv, ps, 1, 0, 0.5f), vs(P, Hkv, ps, 1, 0, 0.5f);
  // Sequence 0: 5 keys in pages 3, 0; sequence 1: 8 keys in pages 4, 2.
  std::vector<std::int32_t> table = {3, 0, -1, 4, 2, 99};
  std::vector<std::int32_t> lens = {5, 8};
  Tensor<float> out(B, H, nq, d, 0, kOutSentinel);
  std::vector<float> lse(B * H * nq, kLseSentinel);
  AttentionPartial part = AttentionPartial::empty(1, 1, 1, 1);
  part.max[0] = 7.0f;
  const AttentionPartial part0 = part;

  auto untouched = [&](const std::string& what) {
    for (float x : out.dense()) {
      if (bits(x) != bits(kOutSentinel)) {
        ADD_FAILURE() << what << ": out written";
        break;
      }
    }
    for (float x : lse) {
      if (bits(x) != bits(kLseSentinel)) {
        ADD_FAILURE() << what << ": lse written";
        break;
      }
    }
    EXPECT_TRUE(same_partial(part, part0)) << what << ": partial written";
  };
  // Runs the float, the int8 and the partial forms with `t`.
  auto expect = [&](const std::string& what, std::size_t bps,
                    const std::vector<std::string>& needles,
                    const AttentionOptions& o = {}) {
    const PagedKVTable t{table, bps, lens};
    std::vector<std::string> n = needles;
    n.insert(n.begin(), "paged_attention");
    expect_invalid(
        what,
        [&] {
          softdot::paged_attention(q.cview(), kp.cview(), vp.cview(), t,
                                   out.view(), o, lse.data());
        },
        n);
    expect_invalid(
        what + " (int8)",
        [&] {
          softdot::paged_attention(q.cview(), Int8KV{k8.cview(), ks.cview()},
                                   Int8KV{v8.cview(), vs.cview()}, t,
                                   out.view(), o, lse.data());
        },
        n);
    n[0] = "paged_attention_partial";
    expect_invalid(
        what + " (partial)",
        [&] {
          softdot::paged_attention_partial(q.cview(), kp.cview(), vp.cview(), t,
                                           part, o);
        },
        n);
    untouched(what);
  };
  // The valid table works (and is the base of every case below).
  softdot::paged_attention(q.cview(), kp.cview(), vp.cview(), {table, 3, lens},
                           out.view(), {}, lse.data());
  out = Tensor<float>(B, H, nq, d, 0, kOutSentinel);
  lse.assign(B * H * nq, kLseSentinel);

  table[4] = 5;  // one past the last page
  expect("page index out of range", 3,
         {"block_table[1, 1] = 5 (sequence 1, entry 1) is not a page: k_pages "
          "has 5 pages (0 to 4)"});
  table[4] = -1;
  expect("negative page index", 3,
         {"block_table[1, 1] = -1", "sequence 1, entry 1"});
  table[4] = 2;
  table[1] = std::numeric_limits<std::int32_t>::min();
  expect("most negative page index", 3, {"sequence 0, entry 1"});
  table[1] = 0;
  lens[1] = 13;
  expect("length longer than its pages", 3,
         {"seq_lens[1] = 13", "sequence 1", "blocks_per_seq 3"});
  lens[1] = 9;  // fits 3 pages of 4, but entry 2 is 99
  expect("length reaching a bad entry", 3,
         {"block_table[1, 2] = 99", "sequence 1, entry 2"});
  lens[1] = -1;
  expect("negative length", 3, {"seq_lens[1] = -1", "negative"});
  lens[1] = 8;
  expect("table too short", 4, {"block_table has 6 entries", "8"});
  expect("table too long", 2, {"block_table has 6 entries", "4"});
  lens.push_back(0);
  expect("seq_lens too long", 3, {"seq_lens has 3 entries", "batch 2"});
  lens.pop_back();
  {
    AttentionOptions o;
    o.kv_begin = 4;
    o.kv_end = 3;
    expect("kv_begin past kv_end", 3, {"kv_begin 4 is past kv_end 3"}, o);
    Tensor<bool> m(B, 1, nq, 7, 0, true);  // max(seq_lens) = 8
    AttentionOptions om;
    om.mask = m.cview();
    expect("mask narrower than the longest sequence", 3,
           {"mask [2, 1, 3, 7]", "max(seq_lens) = 8"}, om);
  }
  // Shapes.
  {
    const PagedKVTable t{table, 3, lens};
    Tensor<float> vbad(P, Hkv, ps + 1, d, 0, 0.0f);
    expect_invalid(
        "v_pages page_size",
        [&] {
          softdot::paged_attention(q.cview(), kp.cview(), vbad.cview(), t,
                                   out.view());
        },
        {"paged_attention", "v_pages [5, 2, 5, 8]", "k_pages [5, 2, 4, 8]"});
    Tensor<float> obad(B, H, nq + 1, d, 0, kOutSentinel);
    expect_invalid("out shape",
                   [&] {
                     softdot::paged_attention(q.cview(), kp.cview(), vp.cview(),
                                              t, obad.view());
                   },
                   {"paged_attention", "out [2, 4, 4, 8]", "[2, 4, 3, 8]"});
    Tensor<float> kd(P, Hkv, ps, d + 1, 0, 0.0f);
    expect_invalid(
        "k_pages d",
        [&] {
          softdot::paged_attention(q.cview(), kd.cview(), vp.cview(), t,
                                   out.view());
        },
        {"paged_attention", "k_pages [5, 2, 4, 9]", "q [2, 4, 3, 8]"});
    Tensor<float> k0(P, Hkv, 0, d, 0, 0.0f);
    expect_invalid("page_size 0",
                   [&] {
                     softdot::paged_attention(q.cview(), k0.cview(), k0.cview(),
                                              t, out.view());
                   },
                   {"paged_attention", "page_size 0"});
    untouched("shapes");
  }
  // int8 scales: a bad scale a key reads is an error naming the page row,
  // the sequence and the position; one no key reads is not.
  {
    const PagedKVTable t{table, 3, lens};
    auto run8 = [&] {
      softdot::paged_attention(q.cview(), Int8KV{k8.cview(), ks.cview()},
                               Int8KV{v8.cview(), vs.cview()}, t, out.view(),
                               {}, lse.data());
    };
    vs.at(2, 1, 3, 0) = kNaNF;  // sequence 1, position 7 (page 2, row 3)
    expect_invalid("NaN scale", run8,
                   {"paged_attention", "v_pages scales[2, 1, 3]",
                    "sequence 1, position 7"});
    untouched("NaN scale");
    vs.at(2, 1, 3, 0) = 0.5f;
    ks.at(0, 0, 0, 0) = -1.0f;  // sequence 0, position 4 (page 0, row 0)
    expect_invalid("negative scale", run8,
                   {"k_pages scales[0, 0, 0]", "sequence 0, position 4"});
    untouched("negative scale");
    ks.at(0, 0, 0, 0) = 0.5f;
    ks.at(0, 0, 1, 0) = kNaNF;  // row 1 of page 0: past sequence 0's end
    ks.at(1, 1, 0, 0) = kNaNF;  // page 1: in no sequence
    EXPECT_NO_THROW(run8());
    Tensor<float> ks_bad(P, Hkv, ps + 1, 1, 0, 0.5f);
    expect_invalid("scales shape",
                   [&] {
                     softdot::paged_attention(
                         q.cview(), Int8KV{k8.cview(), ks_bad.cview()},
                         Int8KV{v8.cview(), vs.cview()}, t, out.view());
                   },
                   {"k_pages scales [5, 2, 5, 1]", "[5, 2, 4, 1]"});
  }
}

// ---- ragged batches (query_start_loc) ---------------------------------------

// A ragged batch: the sequences' query rows packed one after another in
// vLLM's [T, H, d] layout (q [1, H, T, d] through strides), the output the
// same; lens[b] keys and nqs[b] rows per sequence.
template <class T>
struct Ragged {
  Cache<T> c;
  Paged<T> p;
  std::vector<std::int32_t> qsl;
  Tensor<float> q;  // [1, T, H, d]
  std::size_t H = 0, T_rows = 0;
  TensorView<const float> qview() const {
    return TensorView<const float>(q.data(), 1, H, T_rows, q.C, q.bs, q.rs,
                                   q.hs);
  }
  PagedKVTable table() const {
    PagedKVTable t = p.pkv();
    t.query_start_loc = qsl;
    return t;
  }
  // Sequence b's query rows alone, [1, H, n_q, d].
  Tensor<float> sequence_q(std::size_t b) const {
    const auto q0 = std::size_t(qsl[b]);
    const std::size_t nq = std::size_t(qsl[b + 1]) - q0, d = q.C;
    Tensor<float> qb(1, H, nq, d, 0, 0.0f);
    for (std::size_t h = 0; h < H; ++h)
      for (std::size_t i = 0; i < nq; ++i)
        for (std::size_t x = 0; x < d; ++x)
          qb.at(0, h, i, x) = q.at(0, q0 + i, h, x);
    return qb;
  }
};

template <class T>
Ragged<T> make_ragged(std::size_t H, std::size_t Hkv, std::size_t d,
                      std::size_t dv, const std::vector<std::int32_t>& lens,
                      const std::vector<std::int32_t>& nqs, std::size_t ps,
                      bool vllm, std::uint64_t seed) {
  Ragged<T> r;
  std::size_t max_len = 1;
  for (auto n : lens) max_len = std::max(max_len, std::size_t(n));
  r.c = make_cache<T>(lens.size(), Hkv, max_len, d, dv, seed);
  r.p = page(r.c, lens, ps, vllm, seed + 7);
  r.qsl.assign(1, 0);
  for (auto n : nqs) r.qsl.push_back(r.qsl.back() + n);
  r.H = H;
  r.T_rows = std::size_t(r.qsl.back());
  r.q = Tensor<float>(1, r.T_rows, H, d, 1, kNaNF);
  std::mt19937_64 rng(seed + 1);
  std::uniform_real_distribution<double> u(-2.0, 2.0);
  r.q.for_each([&](float& x) { x = float(u(rng)); });
  return r;
}

template <class T>
void run_paged_view(const TensorView<const float>& q, const Paged<T>& p,
                    const PagedKVTable& t, const TensorView<float>& out,
                    const AttentionOptions& o, float* lse,
                    AttentionPartial* part) {
  if constexpr (kInt8<T>) {
    const auto k = scaled_kv(p.k.view(), p.ks.view());
    const auto v = scaled_kv(p.v.view(), p.vs.view());
    if (part) {
      softdot::paged_attention_partial(q, k, v, t, *part, o);
    } else {
      softdot::paged_attention(q, k, v, t, out, o, lse);
    }
  } else {
    if (part) {
      softdot::paged_attention_partial(q, p.k.view(), p.v.view(), t, *part, o);
    } else {
      softdot::paged_attention(q, p.k.view(), p.v.view(), t, out, o, lse);
    }
  }
}

// The ragged call against each sequence alone (paged_attention with its own
// q [1, H, n_q, d] and one row of the table): out, lse and the partial
// result bit for bit, 1 and 2 threads.
template <class T>
void expect_ragged_equals_alone(const std::string& what, const Ragged<T>& r,
                                const AttentionOptions& o) {
  const std::size_t H = r.H, TR = r.T_rows, dv = r.c.v.C;
  const std::size_t B = r.p.lens.size();
  for (int threads : {1, 2}) {
    const std::string w = what + ", " + std::to_string(threads) + " threads";
    Tensor<float> out(1, TR, H, dv, 1, kOutSentinel);
    const TensorView<float> oview(out.data(), 1, H, TR, dv, out.bs, out.rs,
                                  out.hs);
    std::vector<float> lse(H * TR + kLseGuard, kLseSentinel);
    AttentionPartial part;
    with_threads(threads, [&] {
      run_paged_view(r.qview(), r.p, r.table(), oview, o, lse.data(), nullptr);
      run_paged_view(r.qview(), r.p, r.table(), oview, o, nullptr, &part);
      return 0;
    });
    ASSERT_EQ(part.batch, 1u) << w;
    ASSERT_EQ(part.rows, TR) << w;
    for (std::size_t i = H * TR; i < lse.size(); ++i)
      EXPECT_EQ(bits(lse[i]), bits(kLseSentinel)) << w << ": lse overrun";
    for (std::size_t b = 0; b < B; ++b) {
      const auto q0 = std::size_t(r.qsl[b]);
      const std::size_t nq = std::size_t(r.qsl[b + 1]) - q0;
      if (nq == 0) continue;
      const Tensor<float> qb = r.sequence_q(b);
      Tensor<float> ob(1, H, nq, dv, 0, kOutSentinel);
      std::vector<float> lb(H * nq);
      const PagedKVTable tb = r.p.sequence(b);
      AttentionPartial pb;
      run_paged_view(qb.cview(), r.p, tb, ob.view(), o, lb.data(), nullptr);
      run_paged_view(qb.cview(), r.p, tb, ob.view(), o, nullptr, &pb);
      std::size_t bad = 0;
      for (std::size_t h = 0; h < H; ++h)
        for (std::size_t i = 0; i < nq; ++i) {
          const std::size_t ri = h * TR + q0 + i, bi = h * nq + i;
          auto bits64 = [](double x) {
            return std::bit_cast<std::uint64_t>(x);
          };
          bool same = bits(lse[ri]) == bits(lb[bi]) &&
                      bits(part.max[ri]) == bits(pb.max[bi]) &&
                      bits64(part.sum[ri]) == bits64(pb.sum[bi]);
          for (std::size_t x = 0; x < dv; ++x)
            same = same &&
                   bits(out.at(0, q0 + i, h, x)) == bits(ob.at(0, h, i, x)) &&
                   bits64(part.out[ri * dv + x]) == bits64(pb.out[bi * dv + x]);
          if (!same && bad++ < 3)
            ADD_FAILURE() << w << ": sequence " << b << " head " << h << " row "
                          << i << " differs from the call alone";
        }
    }
  }
}

// Sequences of every kind in one batch (GQA 4): decode rows (4 rows per KV
// head), a 16-row verification block, prefill chunks on a cached prefix
// (n_q 70 of 1100, 17 of 300), as many rows as keys (one key, one row), an
// empty cache without rows, a sequence without rows; every option. (More
// rows than keys is an error: BadQueryStartsAreErrors.)
template <class T>
void ragged_sweep(const std::string& label) {
  const std::vector<std::int32_t> lens = {700, 1, 1100, 65, 0, 300, 513, 40};
  const std::vector<std::int32_t> nqs = {1, 1, 70, 0, 0, 17, 4, 2};
  std::vector<float> sinks = {0.5f, -1.0f, 2.0f,  0.0f,
                              1.5f, -0.5f, 0.25f, 3.0f};
  struct Opt {
    std::string name;
    std::function<void(AttentionOptions&)> set;
  };
  const std::vector<Opt> opts = {
      {"plain", [](AttentionOptions&) {}},
      {"causal", [](AttentionOptions& o) { o.causal = true; }},
      {"window",
       [](AttentionOptions& o) {
         o.causal = true;
         o.window_left = 37;
       }},
      {"softcap+scale",
       [](AttentionOptions& o) {
         o.softcap = 4.0f;
         o.scale = 0.3f;
       }},
      {"sinks",
       [&](AttentionOptions& o) {
         o.causal = true;
         o.sinks = sinks;
       }},
      {"kv_range",
       [](AttentionOptions& o) {
         o.kv_begin = 3;
         o.kv_end = 600;
       }},
      {"prefill_form",
       [](AttentionOptions& o) {
         o.causal = true;
         o.prefill_form = true;
       }},
  };
  for (std::size_t ps : {16, 7}) {
    const bool vllm = ps == 16;
    const Ragged<T> r =
        make_ragged<T>(8, 2, 64, 48, lens, nqs, ps, vllm, 77 + ps);
    for (const Opt& oc : opts) {
      AttentionOptions o;
      oc.set(o);
      expect_ragged_equals_alone(
          label + " " + oc.name + ", page_size " + std::to_string(ps), r, o);
    }
  }
}

TEST(AttentionRagged, F32EqualsEachSequenceAlone) {
  ragged_sweep<float>("f32");
}
TEST(AttentionRagged, F16EqualsEachSequenceAlone) {
  ragged_sweep<Float16>("f16");
}
TEST(AttentionRagged, BF16EqualsEachSequenceAlone) {
  ragged_sweep<BFloat16>("bf16");
}
TEST(AttentionRagged, Int8EqualsEachSequenceAlone) {
  ragged_sweep<std::int8_t>("int8");
}

// bfloat16 queries and outputs over bfloat16 pages (the units decide per
// sequence: decode rows, a 16-row verification block, prefill chunks): the
// ragged call equals each sequence alone, on the model and the automatic
// unit, 1 and 2 threads.
TEST(AttentionRagged, SixteenBitQueriesEqualEachSequenceAlone) {
  const std::vector<std::int32_t> lens = {700, 1100, 300, 40};
  const std::vector<std::int32_t> nqs = {1, 4, 70, 2};
  const std::size_t H = 8, Hkv = 2, d = 64, dv = 64;
  const Ragged<BFloat16> r =
      make_ragged<BFloat16>(H, Hkv, d, dv, lens, nqs, 16, true, 5);
  const std::size_t TR = r.T_rows;
  std::vector<BFloat16> q16(TR * H * d), out16(TR * H * dv);
  for (std::size_t t = 0; t < TR; ++t)
    for (std::size_t h = 0; h < H; ++h)
      for (std::size_t x = 0; x < d; ++x)
        q16[(t * H + h) * d + x] = softdot::to_bfloat16(r.q.at(0, t, h, x));
  auto run = [&](TensorView<const BFloat16> q, const PagedKVTable& t,
                 TensorView<BFloat16> out, float* lse) {
    softdot::AttentionRequest req;
    req.name = "paged_attention";
    req.q = q;
    req.kv = softdot::KVSource::pages(r.p.k.view(), r.p.v.view(), t);
    req.target = softdot::AttentionTarget::output(out, lse);
    req.options.causal = true;
    softdot::run_attention(req);
  };
  for (const std::string unit : {"model", ""}) {
    softdot::force_matrix_unit(unit);
    for (int threads : {1, 2}) {
      std::vector<float> lse(H * TR);
      with_threads(threads, [&] {
        run(TensorView<const BFloat16>(q16.data(), 1, H, TR, d, 0, d, H * d),
            r.table(),
            TensorView<BFloat16>(out16.data(), 1, H, TR, dv, 0, dv, H * dv),
            lse.data());
        return 0;
      });
      for (std::size_t b = 0; b < lens.size(); ++b) {
        const auto q0 = std::size_t(r.qsl[b]);
        const std::size_t nq = std::size_t(nqs[b]);
        std::vector<BFloat16> ob(nq * H * dv);
        std::vector<float> lb(H * nq);
        const PagedKVTable tb = r.p.sequence(b);
        run(TensorView<const BFloat16>(q16.data() + q0 * H * d, 1, H, nq, d, 0,
                                       d, H * d),
            tb, TensorView<BFloat16>(ob.data(), 1, H, nq, dv, 0, dv, H * dv),
            lb.data());
        bool same = true;
        for (std::size_t i = 0; i < nq * H * dv; ++i)
          same = same && ob[i].bits == out16[q0 * H * dv + i].bits;
        for (std::size_t h = 0; h < H; ++h)
          for (std::size_t i = 0; i < nq; ++i)
            same = same && bits(lb[h * nq + i]) == bits(lse[h * TR + q0 + i]);
        EXPECT_TRUE(same) << "unit '" << unit << "', " << threads
                          << " threads: sequence " << b
                          << " differs from the call alone";
      }
    }
  }
  softdot::force_matrix_unit("");
}

// A bad query_start_loc, a batched q or a mask with a ragged batch: a clear
// error, nothing written.
TEST(AttentionRagged, BadQueryStartsAreErrors) {
  const Ragged<float> r =
      make_ragged<float>(4, 2, 8, 8, {5, 9}, {2, 3}, 4, false, 3);
  const std::size_t TR = r.T_rows;  // 5
  Tensor<float> out(1, 4, TR, 8, 0, kOutSentinel);
  auto expect = [&](const std::string& what, std::vector<std::int32_t> qsl,
                    const std::vector<std::string>& needles,
                    TensorView<const float> q, const AttentionOptions& o = {},
                    Tensor<float>* out_other = nullptr) {
    Tensor<float>& o_t = out_other != nullptr ? *out_other : out;
    PagedKVTable t = r.p.pkv();
    t.query_start_loc = qsl;
    std::vector<std::string> n = needles;
    n.insert(n.begin(), "paged_attention");
    expect_invalid(
        what,
        [&] {
          softdot::paged_attention(q, r.p.k.view(), r.p.v.view(), t, o_t.view(),
                                   o);
        },
        n);
    for (float x : o_t.dense()) {
      if (bits(x) != bits(kOutSentinel)) {
        ADD_FAILURE() << what << ": out written";
        break;
      }
    }
  };
  const TensorView<const float> q(r.q.data(), 1, 4, TR, 8, r.q.bs, r.q.rs,
                                  r.q.hs);
  expect("too few starts", {0, 2},
         {"query_start_loc has 2 entries", "seq_lens has 2"}, q);
  expect("first start", {1, 2, 5}, {"query_start_loc[0] = 1", "must be 0"}, q);
  expect(
      "decreasing", {0, 3, 2},
      {"query_start_loc[2] = 2", "below query_start_loc[1] = 3", "sequence 1"},
      q);
  expect("last start", {0, 2, 4},
         {"query_start_loc[2] = 4", "must equal the 5 rows"}, q);
  Tensor<float> q2(2, 4, TR, 8, 0, 0.5f), out2(2, 4, TR, 8, 0, kOutSentinel);
  expect("batched q", {0, 2, 5}, {"must have batch 1 with query_start_loc"},
         q2.cview(), {}, &out2);
  std::unique_ptr<bool[]> mask(new bool[TR * 9]());
  AttentionOptions om;
  om.mask = TensorView<const bool>(mask.get(), 1, 1, TR, 9);
  expect("mask", {0, 2, 5}, {"ragged batch (query_start_loc) takes no mask"}, q,
         om);
  // A sequence with more query rows than keys: its rows' keys were never
  // written (it ran with the first rows seeing no key before).
  const std::vector<std::int32_t> qsl = {0, 2, 5}, lens = {1, 9};
  PagedKVTable t = r.p.pkv();
  t.query_start_loc = qsl;
  t.seq_lens = lens;
  expect_invalid(
      "more rows than keys",
      [&] {
        softdot::paged_attention(q, r.p.k.view(), r.p.v.view(), t, out.view());
      },
      {"paged_attention", "sequence 0 has 2 query rows", "seq_lens[0] = 1"});
  for (float x : out.dense()) ASSERT_EQ(bits(x), bits(kOutSentinel));
}

// ---- positions: a cache sharded by position (decode context parallelism) ---

// Each of R ranks holds the keys at global positions c R + r of every
// sequence (its own pages); each runs the ragged batch with query_positions
// and kv_position_offsets = r, stride R, as paged_attention_partial; the
// partials merged with attention_merge give the attention over the whole
// cache (within a few float roundings; rows that see no key are exact
// zeros in both).
TEST(AttentionPaged, ShardedPositionsMergeToTheWholeCache) {
  const std::vector<std::int32_t> lens = {700, 130, 3, 64};
  const std::vector<std::int32_t> nqs = {1, 4, 3, 2};
  const std::size_t H = 4, Hkv = 2, d = 32, R = 3;
  for (int opt = 0; opt < 3; ++opt) {
    AttentionOptions o;
    o.causal = opt >= 1;
    if (opt == 2) o.window_left = 37;
    const std::string what = opt == 0   ? "plain"
                             : opt == 1 ? "causal"
                                        : "window";
    const Ragged<float> full =
        make_ragged<float>(H, Hkv, d, d, lens, nqs, 16, true, 41);
    const std::size_t TR = full.T_rows, B = lens.size();
    Tensor<float> want(1, TR, H, d, 0, kOutSentinel);
    const TensorView<float> wv(want.data(), 1, H, TR, d, want.bs, want.rs,
                               want.hs);
    std::vector<float> want_lse(H * TR);
    run_paged_view(full.qview(), full.p, full.table(), wv, o, want_lse.data(),
                   nullptr);
    AttentionPartial merged;
    for (std::size_t r = 0; r < R; ++r) {
      // Rank r's shard of every sequence, contiguous then paged.
      std::vector<std::int32_t> shard_lens(B);
      std::size_t most = 1;
      for (std::size_t b = 0; b < B; ++b) {
        const auto n = std::size_t(lens[b]);
        shard_lens[b] = std::int32_t(n > r ? (n - r + R - 1) / R : 0);
        most = std::max(most, std::size_t(shard_lens[b]));
      }
      Cache<float> c;
      c.k = Tensor<float>(B, Hkv, most, d, 0, 0.0f);
      c.v = Tensor<float>(B, Hkv, most, d, 0, 0.0f);
      for (std::size_t b = 0; b < B; ++b)
        for (std::size_t h = 0; h < Hkv; ++h)
          for (std::size_t j = 0; j < std::size_t(shard_lens[b]); ++j)
            for (std::size_t x = 0; x < d; ++x) {
              c.k.at(b, h, j, x) = full.c.k.at(b, h, j * R + r, x);
              c.v.at(b, h, j, x) = full.c.v.at(b, h, j * R + r, x);
            }
      const Paged<float> pg = page(c, shard_lens, 8, false, 50 + r);
      std::vector<std::int64_t> qpos(B), offs(B, std::int64_t(r));
      for (std::size_t b = 0; b < B; ++b) qpos[b] = lens[b] - nqs[b];
      PagedKVTable t = pg.pkv();
      t.query_start_loc = full.qsl;
      t.query_positions = qpos;
      t.kv_position_offsets = offs;
      t.kv_position_stride = R;
      AttentionPartial part;
      run_paged_view(full.qview(), pg, t, TensorView<float>(), o, nullptr,
                     &part);
      if (r == 0) {
        merged = part;
      } else {
        softdot::attention_merge(merged, part);
      }
    }
    Tensor<float> got(1, H, TR, d, 0, kOutSentinel);
    std::vector<float> got_lse(H * TR);
    softdot::attention_finalize(merged, got.view(), got_lse.data());
    std::size_t bad = 0;
    for (std::size_t h = 0; h < H; ++h)
      for (std::size_t t = 0; t < TR; ++t) {
        const float wl = want_lse[h * TR + t], gl = got_lse[h * TR + t];
        bool ok = std::isinf(wl)
                      ? bits(gl) == bits(wl)
                      : std::fabs(gl - wl) <= 1e-5f * (1 + std::fabs(wl));
        for (std::size_t x = 0; x < d; ++x) {
          const float w = want.at(0, t, h, x), g = got.at(0, h, t, x);
          ok = ok &&
               (std::isinf(wl) ? bits(g) == 0u : std::fabs(g - w) <= 1e-5f);
        }
        if (!ok && bad++ < 3)
          ADD_FAILURE() << what << ": head " << h << " row " << t
                        << ": the merged shards differ from the whole cache";
      }
  }
}

// The default positions given explicitly (row 0 at seq_lens[b] - n_q, which
// is negative when n_q > seq_lens[b]; keys at their index): the same bits as
// no positions; bad positions are errors.
TEST(AttentionPaged, ExplicitDefaultPositionsAreTheDefault) {
  const std::vector<std::int32_t> lens = {300, 7, 70};
  const std::vector<std::int32_t> nqs = {2, 7, 1};
  const Ragged<float> r =
      make_ragged<float>(4, 2, 16, 16, lens, nqs, 8, false, 9);
  AttentionOptions o;
  o.causal = true;
  o.window_left = 20;
  const std::size_t TR = r.T_rows;
  Tensor<float> a(1, 4, TR, 16, 0, 0.0f), b(1, 4, TR, 16, 0, 0.0f);
  run_paged_view(r.qview(), r.p, r.table(), a.view(), o, nullptr, nullptr);
  std::vector<std::int64_t> qpos = {298, 0, 69}, offs = {0, 0, 0};
  PagedKVTable t = r.table();
  t.query_positions = qpos;
  t.kv_position_offsets = offs;
  run_paged_view(r.qview(), r.p, t, b.view(), o, nullptr, nullptr);
  EXPECT_TRUE(SameBits(a.dense(), b.dense()));
  t.kv_position_stride = 0;
  expect_invalid(
      "stride 0",
      [&] { run_paged_view(r.qview(), r.p, t, b.view(), o, nullptr, nullptr); },
      {"paged_attention", "kv_position_stride 0 must be in [1, 2^62)"});
  t.kv_position_stride = 1;
  offs[2] = -1;
  expect_invalid(
      "negative offset",
      [&] { run_paged_view(r.qview(), r.p, t, b.view(), o, nullptr, nullptr); },
      {"paged_attention", "kv_position_offsets[2] = -1", "sequence 2"});
  PagedKVTable t2 = r.table();
  t2.kv_position_offsets = offs;
  expect_invalid("offsets alone",
                 [&] {
                   run_paged_view(r.qview(), r.p, t2, b.view(), o, nullptr,
                                  nullptr);
                 },
                 {"paged_attention", "need query_positions"});
}

// ---- batch-invariant bits (batch_invariant) ---------------------------------

// Rows i0 .. i1 - 1 of sequence b of a Ragged batch (token i at position
// lens[b] - nqs[b] + i), computed against the cache up to the last of them
// (seq_len lens[b] - nqs[b] + i1): a prefill chunk, a decode row (one
// row), verification rows.
struct RowsItem {
  std::size_t b, i0, i1;
};

// One ragged paged_attention call over the items: for item n and its row
// i, the bits of out (head-major, H dv) and lse (H) in result[n][i - i0].
template <class T>
std::vector<std::vector<std::vector<std::uint32_t>>> invariant_call(
    const Ragged<T>& r, const std::vector<RowsItem>& items,
    const AttentionOptions& o) {
  const std::size_t H = r.H, d = r.q.C, dv = r.c.v.C;
  const std::size_t bps = r.p.blocks_per_seq;
  std::vector<std::int32_t> table, lens, qsl = {0};
  for (const RowsItem& it : items) {
    const std::size_t pre = std::size_t(r.p.lens[it.b]) -
                            std::size_t(r.qsl[it.b + 1] - r.qsl[it.b]);
    table.insert(table.end(), r.p.table.begin() + it.b * bps,
                 r.p.table.begin() + (it.b + 1) * bps);
    lens.push_back(std::int32_t(pre + it.i1));
    qsl.push_back(qsl.back() + std::int32_t(it.i1 - it.i0));
  }
  const auto TR = std::size_t(qsl.back());
  Tensor<float> q(1, TR, H, d, 0, 0.0f), out(1, TR, H, dv, 0, kOutSentinel);
  std::size_t t = 0;
  for (const RowsItem& it : items)
    for (std::size_t i = it.i0; i < it.i1; ++i, ++t)
      for (std::size_t h = 0; h < H; ++h)
        for (std::size_t x = 0; x < d; ++x)
          q.at(0, t, h, x) = r.q.at(0, std::size_t(r.qsl[it.b]) + i, h, x);
  PagedKVTable tb{table, bps, lens};
  tb.query_start_loc = qsl;
  std::vector<float> lse(H * TR, kLseSentinel);
  run_paged_view(
      TensorView<const float>(q.data(), 1, H, TR, d, q.bs, q.rs, q.hs), r.p, tb,
      TensorView<float>(out.data(), 1, H, TR, dv, out.bs, out.rs, out.hs), o,
      lse.data(), nullptr);
  std::vector<std::vector<std::vector<std::uint32_t>>> res;
  t = 0;
  for (const RowsItem& it : items) {
    auto& rows = res.emplace_back();
    for (std::size_t i = it.i0; i < it.i1; ++i, ++t) {
      auto& bits_row = rows.emplace_back();
      for (std::size_t h = 0; h < H; ++h) {
        for (std::size_t x = 0; x < dv; ++x)
          bits_row.push_back(bits(out.at(0, t, h, x)));
        bits_row.push_back(bits(lse[h * TR + t]));
      }
    }
  }
  return res;
}

// With batch_invariant, every token's bits are those of the token alone as
// a decode row: in ragged batches of all 17 sequences and of random 3,
// with prompts cut into chunks at random rows (chunks of random batches
// of 3), as 4-token verification blocks (16 rows per KV head: the units'
// decode form for bfloat16 by default), 1 and 2 threads. Contexts up to 1300
// keys (three 512-key chunks) and up to 40 rows (160 rows per KV head:
// groups of 16); every FMA target gives the same bits. Then the same bits
// from the contiguous attention().
template <class T>
void invariant_sweep(const std::string& label) {
  std::mt19937_64 rng(91);
  std::vector<std::int32_t> lens, nqs;
  for (int b = 0; b < 17; ++b) {
    const int L = std::uniform_int_distribution<int>(1, 1300)(rng);
    lens.push_back(L);
    nqs.push_back(std::uniform_int_distribution<int>(1, std::min(L, 40))(rng));
  }
  const std::size_t H = 8;
  std::vector<float> sinks = {0.5f, -1.0f, 2.0f,  0.0f,
                              1.5f, -0.5f, 0.25f, 3.0f};
  struct Opt {
    std::string name;
    std::function<void(AttentionOptions&)> set;
  };
  const std::vector<Opt> opts = {
      {"causal", [](AttentionOptions& o) { o.causal = true; }},
      {"window+sinks+softcap", [&](AttentionOptions& o) {
         o.causal = true;
         o.window_left = 300;
         o.sinks = sinks;
         o.softcap = 30.0f;
         o.scale = 0.2;
       }}};
  for (const std::size_t ps : {16, 5}) {
    const Ragged<T> r =
        make_ragged<T>(H, 2, 64, 64, lens, nqs, ps, ps == 16, 13 + ps);
    for (const Opt& oc : opts) {
      AttentionOptions o;
      oc.set(o);
      o.batch_invariant = true;
      const std::string w0 =
          label + " " + oc.name + ", page_size " + std::to_string(ps);
      // Each token alone as a decode row (one thread).
      std::vector<std::vector<std::vector<std::uint32_t>>> ref(lens.size());
      with_threads(1, [&] {
        for (std::size_t b = 0; b < lens.size(); ++b)
          for (std::size_t i = 0; i < std::size_t(nqs[b]); ++i)
            ref[b].push_back(invariant_call(r, {{b, i, i + 1}}, o)[0][0]);
        return 0;
      });
      auto expect = [&](const std::string& what,
                        const std::vector<RowsItem>& items) {
        const auto got = invariant_call(r, items, o);
        std::size_t bad = 0;
        for (std::size_t n = 0; n < items.size(); ++n)
          for (std::size_t i = items[n].i0; i < items[n].i1; ++i)
            if (got[n][i - items[n].i0] != ref[items[n].b][i] && bad++ < 3)
              ADD_FAILURE() << what << ": sequence " << items[n].b << " token "
                            << i << " differs from the token alone";
      };
      for (int threads : {1, 2}) {
        const std::string w = w0 + ", " + std::to_string(threads) + " threads";
        with_threads(threads, [&] {
          std::vector<RowsItem> all;
          for (std::size_t b = 0; b < lens.size(); ++b)
            all.push_back({b, 0, std::size_t(nqs[b])});
          expect(w + ", batch of 17", all);
          for (int k = 0; k < 4; ++k) {
            std::shuffle(all.begin(), all.end(), rng);
            expect(w + ", batch of 3",
                   std::vector<RowsItem>(all.begin(), all.begin() + 3));
          }
          // Prompts cut at random rows; chunks in random batches of 3.
          std::vector<RowsItem> chunks;
          for (std::size_t b = 0; b < lens.size(); ++b) {
            std::size_t i = 0;
            while (i < std::size_t(nqs[b])) {
              const std::size_t n =
                  std::uniform_int_distribution<std::size_t>(1, 24)(rng);
              chunks.push_back({b, i, std::min<std::size_t>(nqs[b], i + n)});
              i = chunks.back().i1;
            }
          }
          std::shuffle(chunks.begin(), chunks.end(), rng);
          for (std::size_t c = 0; c < chunks.size(); c += 3)
            expect(w + ", chunks",
                   std::vector<RowsItem>(
                       chunks.begin() + c,
                       chunks.begin() + std::min(chunks.size(), c + 3)));
          // Verification blocks of 4 tokens, alone and together.
          std::vector<RowsItem> verify;
          for (std::size_t b = 0; b < lens.size(); ++b)
            if (nqs[b] >= 4) verify.push_back({b, 0, 4});
          expect(w + ", verification", verify);
          for (const RowsItem& v : verify) expect(w + ", verification", {v});
          return 0;
        });
      }
      // Every FMA target: the same bits (the decode form's scores are one
      // fixed tree, its exp the same on every target).
      for (const std::string& t : fma_targets()) {
        softdot::force_simd_target(t);
        std::vector<RowsItem> all;
        for (std::size_t b = 0; b < lens.size(); ++b)
          all.push_back({b, 0, std::size_t(nqs[b])});
        expect(w0 + ", target " + t, all);
      }
      softdot::force_simd_target("");
      // The contiguous call on one sequence's whole rows: the same bits.
      const std::size_t b = 0, n = std::size_t(nqs[b]);
      const auto L = std::size_t(lens[b]);
      const Tensor<float> qb = r.sequence_q(b);
      Tensor<float> ob(1, H, n, 64, 0, 0.0f);
      std::vector<float> lb(H * n);
      if constexpr (kInt8<T>) {
        softdot::attention(
            qb.cview(),
            scaled_kv(seq_view(r.c.k, b, L), seq_view(r.c.ks, b, L)),
            scaled_kv(seq_view(r.c.v, b, L), seq_view(r.c.vs, b, L)), ob.view(),
            o, lb.data());
      } else {
        softdot::attention(qb.cview(), seq_view(r.c.k, b, L),
                           seq_view(r.c.v, b, L), ob.view(), o, lb.data());
      }
      bool same = true;
      for (std::size_t i = 0; i < n; ++i) {
        std::vector<std::uint32_t> row;
        for (std::size_t h = 0; h < H; ++h) {
          for (std::size_t x = 0; x < 64; ++x)
            row.push_back(bits(ob.at(0, h, i, x)));
          row.push_back(bits(lb[h * n + i]));
        }
        same = same && row == ref[b][i];
      }
      EXPECT_TRUE(same) << w0 << ": attention() differs from paged_attention";
    }
  }
}

TEST(AttentionInvariant, F32TokenBitsIndependentOfTheBatch) {
  invariant_sweep<float>("f32");
}
TEST(AttentionInvariant, F16TokenBitsIndependentOfTheBatch) {
  invariant_sweep<Float16>("f16");
}
TEST(AttentionInvariant, BF16TokenBitsIndependentOfTheBatch) {
  invariant_sweep<BFloat16>("bf16");
}
TEST(AttentionInvariant, Int8TokenBitsIndependentOfTheBatch) {
  invariant_sweep<std::int8_t>("int8");
}

// batch_invariant with precise or prefill_form: a clear error.
TEST(AttentionInvariant, WithPreciseOrPrefillFormIsAnError) {
  const Ragged<float> r =
      make_ragged<float>(4, 2, 8, 8, {5, 9}, {2, 3}, 4, false, 3);
  Tensor<float> out(1, 4, r.T_rows, 8, 0, kOutSentinel);
  for (const bool precise : {true, false}) {
    AttentionOptions o;
    o.batch_invariant = true;
    o.precise = precise;
    o.prefill_form = !precise;
    expect_invalid(precise ? "precise" : "prefill_form",
                   [&] {
                     softdot::paged_attention(r.qview(), r.p.k.view(),
                                              r.p.v.view(), r.table(),
                                              out.view(), o);
                   },
                   {"paged_attention", "batch_invariant",
                    precise ? "precise" : "prefill_form"});
  }
}

// ---- draft trees (draft_parents) -------------------------------------------

// Random parents: row i's parent uniform in -1 .. i - 1.
std::vector<std::int32_t> random_parents(const std::vector<std::int32_t>& nqs,
                                         std::mt19937_64& rng) {
  std::vector<std::int32_t> par;
  for (const auto n : nqs)
    for (std::int32_t i = 0; i < n; ++i)
      par.push_back(
          std::uniform_int_distribution<std::int32_t>(-1, i - 1)(rng));
  return par;
}

// A ragged batch of draft trees against each sequence alone with the dense
// mask the tree stands for (mask [1, 1, n_q, seq_len]: the prefix and the
// row's ancestors): the same bits, 1 and 2 threads; a chain (parent i - 1)
// is plain causal attention, bit for bit.
template <class T>
void tree_sweep(const std::string& label) {
  const std::vector<std::int32_t> lens = {700, 300, 40, 1100, 9};
  const std::vector<std::int32_t> nqs = {7, 16, 5, 20, 0};
  const std::size_t H = 8, dv = 48;
  std::mt19937_64 rng(5);
  const Ragged<T> r = make_ragged<T>(H, 2, 64, dv, lens, nqs, 16, true, 29);
  const std::vector<std::int32_t> par = random_parents(nqs, rng);
  std::vector<float> sinks = {0.5f, -1.0f, 2.0f,  0.0f,
                              1.5f, -0.5f, 0.25f, 3.0f};
  const std::size_t TR = r.T_rows;
  for (const bool inv : {false, true}) {
    AttentionOptions o;
    o.causal = true;
    o.batch_invariant = inv;
    if (inv) o.sinks = sinks;
    const std::string w0 = label + (inv ? " batch_invariant+sinks" : " causal");
    for (int threads : {1, 2}) {
      const std::string w = w0 + ", " + std::to_string(threads) + " threads";
      Tensor<float> out(1, TR, H, dv, 0, kOutSentinel);
      const TensorView<float> ov(out.data(), 1, H, TR, dv, out.bs, out.rs,
                                 out.hs);
      std::vector<float> lse(H * TR);
      PagedKVTable t = r.table();
      t.draft_parents = par;
      with_threads(threads, [&] {
        run_paged_view(r.qview(), r.p, t, ov, o, lse.data(), nullptr);
        return 0;
      });
      for (std::size_t b = 0; b < lens.size(); ++b) {
        const auto q0 = std::size_t(r.qsl[b]), nq = std::size_t(nqs[b]);
        const auto L = std::size_t(lens[b]);
        if (nq == 0) continue;
        const Tensor<float> qb = r.sequence_q(b);
        Tensor<float> ob(1, H, nq, dv, 0, 0.0f);
        std::vector<std::uint8_t> mask(nq * L, 0);
        for (std::size_t i = 0; i < nq; ++i) {
          for (std::size_t j = 0; j < L - nq; ++j) mask[i * L + j] = 1;
          for (auto a = std::int32_t(i); a >= 0; a = par[q0 + std::size_t(a)])
            mask[i * L + L - nq + std::size_t(a)] = 1;
        }
        AttentionOptions ob_o = o;
        ob_o.mask = softdot::TensorView<const bool>(
            reinterpret_cast<const bool*>(mask.data()), 1, 1, nq, L, 0, 0, L);
        std::vector<float> lb(H * nq);
        run_paged_view(qb.cview(), r.p, r.p.sequence(b), ob.view(), ob_o,
                       lb.data(), nullptr);
        bool same = true;
        for (std::size_t h = 0; h < H; ++h)
          for (std::size_t i = 0; i < nq; ++i) {
            same = same && bits(lse[h * TR + q0 + i]) == bits(lb[h * nq + i]);
            for (std::size_t x = 0; x < dv; ++x)
              same = same &&
                     bits(out.at(0, q0 + i, h, x)) == bits(ob.at(0, h, i, x));
          }
        EXPECT_TRUE(same) << w << ": sequence " << b
                          << " differs from its dense mask";
      }
      // A chain: plain causal.
      std::vector<std::int32_t> chain;
      for (const auto n : nqs)
        for (std::int32_t i = 0; i < n; ++i) chain.push_back(i - 1);
      t.draft_parents = chain;
      Tensor<float> oc(1, TR, H, dv, 0, kOutSentinel),
          op(1, TR, H, dv, 0, kOutSentinel);
      with_threads(threads, [&] {
        run_paged_view(
            r.qview(), r.p, t,
            TensorView<float>(oc.data(), 1, H, TR, dv, oc.bs, oc.rs, oc.hs), o,
            nullptr, nullptr);
        run_paged_view(
            r.qview(), r.p, r.table(),
            TensorView<float>(op.data(), 1, H, TR, dv, op.bs, op.rs, op.hs), o,
            nullptr, nullptr);
        return 0;
      });
      EXPECT_TRUE(SameBits(oc.dense(), op.dense()))
          << w << ": a chain differs from causal attention";
    }
  }
}

TEST(AttentionTree, F32EqualsItsDenseMask) { tree_sweep<float>("f32"); }
TEST(AttentionTree, BF16EqualsItsDenseMask) { tree_sweep<BFloat16>("bf16"); }
TEST(AttentionTree, Int8EqualsItsDenseMask) { tree_sweep<std::int8_t>("int8"); }

// Bad trees: a clear error naming the entry, nothing written.
TEST(AttentionTree, BadParentsAreErrors) {
  const Ragged<float> r =
      make_ragged<float>(4, 2, 8, 8, {5, 9}, {2, 3}, 4, false, 3);
  Tensor<float> out(1, 4, r.T_rows, 8, 0, kOutSentinel);
  auto expect = [&](const std::string& what, std::vector<std::int32_t> par,
                    const std::vector<std::string>& needles,
                    std::vector<std::int32_t> lens = {5, 9}) {
    PagedKVTable t = r.table();
    t.seq_lens = lens;
    t.draft_parents = par;
    std::vector<std::string> n = needles;
    n.insert(n.begin(), "paged_attention");
    expect_invalid(
        what,
        [&] {
          softdot::paged_attention(r.qview(), r.p.k.view(), r.p.v.view(), t,
                                   out.view(), {});
        },
        n);
    for (float x : out.dense()) {
      if (bits(x) != bits(kOutSentinel)) {
        ADD_FAILURE() << what << ": out written";
        break;
      }
    }
  };
  expect("too few", {-1, 0, -1, 0}, {"draft_parents has 4 entries", "5"});
  expect("parent after", {-1, 1, -1, 0, 1}, {"draft_parents[1] = 1", "0 .. 0"});
  expect("parent below -1", {-1, 0, -1, -2, 1},
         {"draft_parents[3] = -2", "sequence 1"});
  expect("own row", {-1, 0, -1, 0, 2}, {"draft_parents[4] = 2"});
  expect("more rows than keys", {-1, 0, -1, 0, 1},
         {"sequence 0 has 2 draft rows", "seq_lens[0] = 1"}, {1, 9});
}

}  // namespace
}  // namespace softdot_test
