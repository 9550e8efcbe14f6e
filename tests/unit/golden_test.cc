// Golden outputs: a fixed set of inputs through every public function, on
// every compiled target, hashed (FNV-1a over the output bits) and compared
// with hashes recorded before the restructuring of issue 12 ("what must not
// change": the bits of every function on every target stay the same).
//
// The inputs come from an integer generator defined here, so they are the
// same with every compiler and standard library, on x86 and on Arm. FMA
// targets (AVX2, AVX3, and NEON on aarch64, run under qemu by
// scripts/test_arm64.sh) share one row of hashes: the library promises the
// same bits on all of them, so NEON checks the hashes x86 recorded (except
// the long double rows, see uses_long_double). SSE4, SSSE3 and SCALAR round
// products separately and have rows of their own. A target with no
// recorded row is reported and skipped.
//
// To record: SOFTDOT_GOLDEN_PRINT=1 build/tests/unit/softdot_golden_test
// prints the table for every target; paste it over kGolden below, and say
// why in the commit (a change of bits is a change of results).
//
// (Over 600 lines on purpose: the hash table of every target and the calls
// that produce it must sit side by side, one row per public function.)
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "test_util.h"

namespace softdot_test {
namespace {

using softdot::AttentionOptions;
using softdot::BFloat16;
using softdot::Float16;
using softdot::MatrixView;
using softdot::SoftmaxOptions;
using softdot::TensorView;

// ---- inputs
// ------------------------------------------------------------------

// A 64-bit LCG (Knuth's MMIX constants); values are k / 2^30 for an integer
// k, exact in double and correctly rounded to float, so that products round
// (FMA and non-FMA targets differ) and float16 and bfloat16 keys differ.
struct Gen {
  std::uint64_t s;
  explicit Gen(std::uint64_t seed) : s(seed * 2654435761u + 1) {}
  std::uint32_t next() {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<std::uint32_t>(s >> 33);
  }
  // Uniform on [-range, range] in steps of 2^-30.
  double value(int range) {
    const std::int64_t span = std::int64_t{1} << 30;
    const std::uint64_t wide = (std::uint64_t{next()} << 32) | next();
    const std::int64_t k =
        static_cast<std::int64_t>(
            wide % static_cast<std::uint64_t>(2 * span * range + 1)) -
        span * range;
    return static_cast<double>(k) / static_cast<double>(span);
  }
  template <class T>
  std::vector<T> vec(std::size_t n, int range) {
    std::vector<T> v(n);
    for (auto& x : v) x = static_cast<T>(value(range));
    return v;
  }
  std::vector<bool> flags(std::size_t n, unsigned keep_of_8) {
    std::vector<bool> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = next() % 8 < keep_of_8;
    return v;
  }
};

// std::vector<bool> is packed; the library takes spans of bool.
std::unique_ptr<bool[]> as_bools(const std::vector<bool>& v) {
  std::unique_ptr<bool[]> b(new bool[v.size()]);
  for (std::size_t i = 0; i < v.size(); ++i) b[i] = v[i];
  return b;
}

// ---- hashing
// -------------------------------------------------------------------

struct Hash {
  std::uint64_t h = 1469598103934665603ull;
  void bytes(const void* p, std::size_t n) {
    const auto* c = static_cast<const unsigned char*>(p);
    for (std::size_t i = 0; i < n; ++i) h = (h ^ c[i]) * 1099511628211ull;
  }
  template <class T>
  void add(std::span<const T> v) {
    bytes(v.data(), v.size_bytes());
  }
  template <class T>
  void add(const std::vector<T>& v) {
    add(std::span<const T>(v));
  }
  template <class T>
  void value(T v) {
    bytes(&v, sizeof v);
  }
};

const std::size_t kRowSizes[] = {1, 3, 8, 16, 17, 64, 100, 1000, 4099};

// ---- the functions
// ---------------------------------------------------------------

template <class T>
std::uint64_t hash_dot() {
  Hash h;
  Gen g(sizeof(T));
  for (std::size_t n : kRowSizes) {
    const auto x = g.vec<T>(n, 4), y = g.vec<T>(n, 4);
    h.value(softdot::dot(std::span<const T>(x), std::span<const T>(y)));
    h.value(
        softdot::dot_accurate(std::span<const T>(x), std::span<const T>(y)));
  }
  // dots: 37 keys of 70 features with a row stride of 75.
  const auto keys = g.vec<T>(37 * 75, 3), q = g.vec<T>(70, 3);
  std::vector<T> s(37);
  softdot::dots(std::span<const T>(q),
                MatrixView<const T>(keys.data(), 37, 70, 75), std::span<T>(s));
  h.add(s);
  return h.h;
}

template <class T>
std::uint64_t hash_softmax(softdot::Precision precision) {
  Hash h;
  Gen g(10 + sizeof(T));
  std::vector<std::size_t> sizes(std::begin(kRowSizes), std::end(kRowSizes));
  sizes.push_back(40000);  // the chunked faithful path for float
  for (std::size_t n : sizes) {
    for (int variant = 0; variant < 3; ++variant) {
      const auto x = g.vec<T>(n, variant == 2 ? 300 : 20);
      const auto keep = g.flags(n, 6);
      const auto mask = as_bools(keep);
      SoftmaxOptions o;
      o.precision = precision;
      if (variant >= 1) o.mask = std::span<const bool>(mask.get(), n);
      if (variant == 2) o.temperature = 0.7;
      std::vector<T> y(n);
      softdot::softmax(std::span<const T>(x), std::span<T>(y), o);
      h.add(y);
      if (precision == softdot::Precision::kFaithful) {
        softdot::log_softmax(std::span<const T>(x), std::span<T>(y), o);
        h.add(y);
        h.value(softdot::logsumexp(std::span<const T>(x), o));
      }
    }
  }
  // Rows: 9 x 33 with a row stride of 40 (35 in the output) and a per-row
  // mask.
  constexpr std::size_t kRows = 9, kCols = 33, kInStride = 40, kOutStride = 35;
  const auto x = g.vec<T>(kRows * kInStride, 10);
  const auto keep = g.flags(kRows * kCols, 7);
  const auto mask = as_bools(keep);
  SoftmaxOptions o;
  o.precision = precision;
  o.mask = std::span<const bool>(mask.get(), kRows * kCols);
  std::vector<T> y(kRows * kOutStride);
  softdot::softmax_rows(MatrixView<const T>(x.data(), kRows, kCols, kInStride),
                        MatrixView<T>(y.data(), kRows, kCols, kOutStride), o);
  h.add(y);
  softdot::log_softmax_rows(
      MatrixView<const T>(x.data(), kRows, kCols, kInStride),
      MatrixView<T>(y.data(), kRows, kCols, kOutStride), o);
  h.add(y);
  return h.h;
}

template <class T>
std::uint64_t hash_backward_and_states() {
  Hash h;
  Gen g(20 + sizeof(T));
  for (std::size_t n : kRowSizes) {
    auto y = g.vec<T>(n, 1);
    for (auto& v : y) v = v < 0 ? -v : v;
    const auto dy = g.vec<T>(n, 5);
    std::vector<T> dx(n);
    softdot::softmax_backward(std::span<const T>(y), std::span<const T>(dy),
                              std::span<T>(dx));
    h.add(dx);
  }
  // A row of 1000 in chunks of 1, 7, 64 and the rest, merged in order.
  const auto x = g.vec<T>(1000, 30);
  const std::size_t cuts[] = {0, 1, 8, 72, 1000};
  softdot::BasicSoftmaxState<T> total;
  for (int c = 0; c < 4; ++c) {
    std::span<const T> chunk(x.data() + cuts[c], cuts[c + 1] - cuts[c]);
    total = softdot::merge(total, softdot::softmax_state(chunk));
  }
  h.value(total.max);
  h.value(total.sum);
  h.value(total.sum_lo);
  h.value(softdot::logsumexp(total));
  std::vector<T> y(1000);
  for (int c = 0; c < 4; ++c) {
    const std::size_t b = cuts[c], e = cuts[c + 1];
    softdot::softmax_apply(std::span<const T>(x.data() + b, e - b), total,
                           std::span<T>(y.data() + b, e - b));
  }
  h.add(y);
  return h.h;
}

template <class KV>
KV to_kv(float v) {
  if constexpr (std::is_same_v<KV, float>)
    return v;
  else if constexpr (std::is_same_v<KV, Float16>)
    return softdot::to_float16(v);
  else
    return softdot::to_bfloat16(v);
}

// Attention on [B=2, H, n_q, d] against [2, H_kv, n_kv, d] with every option
// in turn; prefill (n_q = 70) and decode (n_q = 1, 3) forms.
template <class KV>
std::uint64_t hash_attention() {
  Hash h;
  Gen g(30 + sizeof(KV));
  const std::size_t B = 2, H = 4, Hkv = 2, d = 40, dv = 24, n_kv = 150;
  const auto kf = g.vec<float>(B * Hkv * n_kv * d, 2);
  const auto vf = g.vec<float>(B * Hkv * n_kv * dv, 3);
  std::vector<KV> k(kf.size()), v(vf.size());
  for (std::size_t i = 0; i < kf.size(); ++i) k[i] = to_kv<KV>(kf[i]);
  for (std::size_t i = 0; i < vf.size(); ++i) v[i] = to_kv<KV>(vf[i]);
  const TensorView<const KV> kv(k.data(), B, Hkv, n_kv, d),
      vv(v.data(), B, Hkv, n_kv, dv);
  const auto maskv = g.flags(n_kv * 70, 6);
  const auto mask = as_bools(maskv);
  const auto bias = g.vec<float>(n_kv * 70, 2);
  const std::vector<float> sinks = {0.5f, -1.0f, 2.0f, 0.0f};
  for (std::size_t n_q : {std::size_t(70), std::size_t(3), std::size_t(1)}) {
    const auto q = g.vec<float>(B * H * n_q * d, 2);
    const TensorView<const float> qv(q.data(), B, H, n_q, d);
    for (int variant = 0; variant < 6; ++variant) {
      AttentionOptions o;
      switch (variant) {
        case 1:
          o.causal = true;
          break;
        case 2:
          o.window_left = 20;
          o.window_right = 5;
          o.softcap = 3.0f;
          break;
        case 3:  // one mask row per query, broadcast over batch and heads
          o.mask =
              TensorView<const bool>(mask.get(), 1, 1, n_q, n_kv, 0, 0, n_kv);
          o.sinks = sinks;
          break;
        case 4:
          o.bias =
              TensorView<const float>(bias.data(), 1, 1, n_q, n_kv, 0, 0, n_kv);
          o.scale = 0.3;
          break;
        case 5:
          o.kv_begin = 17;
          o.kv_end = 130;
          o.causal = true;
          break;
        default:
          break;
      }
      std::vector<float> out(B * H * n_q * dv), lse(B * H * n_q);
      softdot::attention(qv, kv, vv,
                         TensorView<float>(out.data(), B, H, n_q, dv), o,
                         lse.data());
      h.add(out);
      h.add(lse);
      if (variant == 5) {  // merged with the rest of the keys
        AttentionOptions a = o, b = o;
        a.kv_begin = 0;
        a.kv_end = 17;
        b.kv_begin = 130;
        b.kv_end = n_kv;
        std::vector<float> oa(out.size()), la(lse.size()), ob(out.size()),
            lb(lse.size());
        softdot::attention(qv, kv, vv,
                           TensorView<float>(oa.data(), B, H, n_q, dv), a,
                           la.data());
        softdot::attention(qv, kv, vv,
                           TensorView<float>(ob.data(), B, H, n_q, dv), b,
                           lb.data());
        const TensorView<const float> ov(out.data(), B, H, n_q, dv);
        softdot::attention_merge(
            ov, lse.data(), TensorView<const float>(oa.data(), B, H, n_q, dv),
            la.data(), TensorView<float>(out.data(), B, H, n_q, dv),
            lse.data());
        softdot::attention_merge(
            ov, lse.data(), TensorView<const float>(ob.data(), B, H, n_q, dv),
            lb.data(), TensorView<float>(out.data(), B, H, n_q, dv),
            lse.data());
        h.add(out);
        h.add(lse);
      }
      if (n_q <= 3 || variant == 1) {
        std::vector<float> w(B * H * n_q * n_kv);
        softdot::attention_weights(
            qv, kv, TensorView<float>(w.data(), B, H, n_q, n_kv), o);
        h.add(w);
      }
    }
  }
  return h.h;
}

// AttentionPartial (added after the recording at 6e27f53, with the
// functions): prefill (n_q = 70) and decode (n_q = 1) partials over three
// key ranges (the first with sinks), merged in a chain; the raw states and
// the finalised output and lse are hashed.
template <class KV>
std::uint64_t hash_attention_partial() {
  Hash h;
  Gen g(50 + sizeof(KV));
  const std::size_t B = 2, H = 4, Hkv = 2, d = 40, dv = 24, n_kv = 1200;
  const auto kf = g.vec<float>(B * Hkv * n_kv * d, 2);
  const auto vf = g.vec<float>(B * Hkv * n_kv * dv, 3);
  std::vector<KV> k(kf.size()), v(vf.size());
  for (std::size_t i = 0; i < kf.size(); ++i) k[i] = to_kv<KV>(kf[i]);
  for (std::size_t i = 0; i < vf.size(); ++i) v[i] = to_kv<KV>(vf[i]);
  const TensorView<const KV> kv(k.data(), B, Hkv, n_kv, d),
      vv(v.data(), B, Hkv, n_kv, dv);
  const std::vector<float> sinks = {0.5f, -1.0f, 2.0f, 0.0f};
  for (std::size_t n_q : {std::size_t(70), std::size_t(1)}) {
    const auto q = g.vec<float>(B * H * n_q * d, 2);
    const TensorView<const float> qv(q.data(), B, H, n_q, d);
    softdot::AttentionPartial chain =
        softdot::AttentionPartial::empty(B, H, n_q, dv);
    softdot::AttentionPartial part;
    const std::size_t cuts[] = {0, 100, 777, n_kv};
    for (int c = 0; c < 3; ++c) {
      AttentionOptions o;
      o.causal = true;
      o.kv_begin = cuts[c];
      o.kv_end = cuts[c + 1];
      if (c == 0) o.sinks = sinks;
      softdot::attention_partial(qv, kv, vv, part, o);
      h.add(part.max);
      h.add(part.sum);
      h.add(part.out);
      softdot::attention_merge(chain, part);
    }
    h.add(chain.max);
    h.add(chain.sum);
    h.add(chain.out);
    std::vector<float> out(B * H * n_q * dv), lse(B * H * n_q);
    softdot::attention_finalize(
        chain, TensorView<float>(out.data(), B, H, n_q, dv), lse.data());
    h.add(out);
    h.add(lse);
  }
  return h.h;
}

// attention_scores on the shapes of hash_attention (inputs of their own):
// prefill (n_q = 70) and decode (n_q = 3, 1) forms, every option that
// changes a score or hides a key. Added after the hashes above were
// recorded (the function is new), with a -inf bias to hide keys too.
template <class KV>
std::uint64_t hash_attention_scores() {
  Hash h;
  Gen g(50 + sizeof(KV));
  const std::size_t B = 2, H = 4, Hkv = 2, d = 40, n_kv = 150;
  const auto kf = g.vec<float>(B * Hkv * n_kv * d, 2);
  std::vector<KV> k(kf.size());
  for (std::size_t i = 0; i < kf.size(); ++i) k[i] = to_kv<KV>(kf[i]);
  const TensorView<const KV> kv(k.data(), B, Hkv, n_kv, d);
  const auto maskv = g.flags(n_kv * 70, 6);
  const auto mask = as_bools(maskv);
  auto bias = g.vec<float>(n_kv * 70, 2);
  for (std::size_t i = 0; i < bias.size(); i += 13)
    bias[i] = -std::numeric_limits<float>::infinity();
  for (std::size_t n_q : {std::size_t(70), std::size_t(3), std::size_t(1)}) {
    const auto q = g.vec<float>(B * H * n_q * d, 2);
    const TensorView<const float> qv(q.data(), B, H, n_q, d);
    for (int variant = 0; variant < 5; ++variant) {
      AttentionOptions o;
      switch (variant) {
        case 1:
          o.causal = true;
          break;
        case 2:
          o.window_left = 20;
          o.window_right = 5;
          o.softcap = 3.0f;
          break;
        case 3:
          o.mask =
              TensorView<const bool>(mask.get(), 1, 1, n_q, n_kv, 0, 0, n_kv);
          o.bias =
              TensorView<const float>(bias.data(), 1, 1, n_q, n_kv, 0, 0, n_kv);
          o.scale = 0.3;
          break;
        case 4:
          o.kv_begin = 17;
          o.kv_end = 130;
          o.causal = true;
          break;
        default:
          break;
      }
      std::vector<float> s(B * H * n_q * n_kv);
      softdot::attention_scores(
          qv, kv, TensorView<float>(s.data(), B, H, n_q, n_kv), o);
      h.add(s);
    }
  }
  return h.h;
}

// x [B, H, n, d] quantised by quantize_kv, kept with its Int8KV view.
struct Quantized {
  std::vector<std::int8_t> values;
  std::vector<float> scales;
  softdot::Int8KV kv;
};
Quantized quantize(const std::vector<float>& x, std::size_t B, std::size_t H,
                   std::size_t n, std::size_t d) {
  Quantized r{
      std::vector<std::int8_t>(x.size()), std::vector<float>(B * H * n), {}};
  softdot::quantize_kv(TensorView<const float>(x.data(), B, H, n, d),
                       TensorView<std::int8_t>(r.values.data(), B, H, n, d),
                       TensorView<float>(r.scales.data(), B, H, n, 1));
  r.kv = {TensorView<const std::int8_t>(r.values.data(), B, H, n, d),
          TensorView<const float>(r.scales.data(), B, H, n, 1)};
  return r;
}

// quantize_kv and attention on its int8 K/V (added with Int8KV, issue 13):
// prefill (n_q = 70) and decode (n_q = 1), causal.
std::uint64_t hash_int8() {
  Hash h;
  Gen g(60);
  const std::size_t B = 2, H = 4, Hkv = 2, d = 40, dv = 24, n_kv = 700;
  const auto kf = g.vec<float>(B * Hkv * n_kv * d, 2);
  const auto vf = g.vec<float>(B * Hkv * n_kv * dv, 3);
  const Quantized kq = quantize(kf, B, Hkv, n_kv, d);
  const Quantized vq = quantize(vf, B, Hkv, n_kv, dv);
  h.add(kq.values);
  h.add(kq.scales);
  h.add(vq.values);
  h.add(vq.scales);
  const softdot::Int8KV& k = kq.kv;
  const softdot::Int8KV& v = vq.kv;
  for (std::size_t n_q : {std::size_t(70), std::size_t(1)}) {
    const auto q = g.vec<float>(B * H * n_q * d, 2);
    AttentionOptions o;
    o.causal = true;
    std::vector<float> out(B * H * n_q * dv), lse(B * H * n_q);
    softdot::attention(TensorView<const float>(q.data(), B, H, n_q, d), k, v,
                       TensorView<float>(out.data(), B, H, n_q, dv), o,
                       lse.data());
    h.add(out);
    h.add(lse);
  }
  return h.h;
}

// The decode form at head sizes that are whole 16-lane blocks (d = 64, 128:
// the AVX2 and AVX-512 kernels reduce the scores of a tile together there),
// for 1 to 16 rows per KV head, n_kv = 300 (a last block of 44 keys); none,
// causal with a mask row, and a window. Added in issue 13, recorded with the
// kernels from before that change (one tree per score), so the tiled
// reduction is checked against them.
template <class KV>
std::uint64_t hash_attention_decode() {
  Hash h;
  Gen g(70 + sizeof(KV));
  const std::size_t n_kv = 300;
  struct S {
    std::size_t H, Hkv, n_q;
  };
  const auto maskv = g.flags(n_kv, 5);
  const auto mask = as_bools(maskv);
  for (std::size_t d : {std::size_t(64), std::size_t(128)}) {
    for (const S s : {S{2, 2, 1}, S{4, 2, 1}, S{6, 2, 1}, S{8, 2, 1},
                      S{10, 2, 1}, S{6, 1, 2}, S{8, 2, 4}}) {
      const auto kf = g.vec<float>(s.Hkv * n_kv * d, 2);
      const auto vf = g.vec<float>(s.Hkv * n_kv * d, 3);
      std::vector<KV> k(kf.size()), v(vf.size());
      for (std::size_t i = 0; i < kf.size(); ++i) k[i] = to_kv<KV>(kf[i]);
      for (std::size_t i = 0; i < vf.size(); ++i) v[i] = to_kv<KV>(vf[i]);
      const auto q = g.vec<float>(s.H * s.n_q * d, 2);
      for (int variant = 0; variant < 3; ++variant) {
        AttentionOptions o;
        if (variant == 1) {
          o.causal = true;
          o.mask =
              TensorView<const bool>(mask.get(), 1, 1, s.n_q, n_kv, 0, 0, 0);
        } else if (variant == 2) {
          o.window_left = 100;
          o.causal = true;
        }
        std::vector<float> out(s.H * s.n_q * d), lse(s.H * s.n_q);
        softdot::attention(TensorView<const float>(q.data(), 1, s.H, s.n_q, d),
                           TensorView<const KV>(k.data(), 1, s.Hkv, n_kv, d),
                           TensorView<const KV>(v.data(), 1, s.Hkv, n_kv, d),
                           TensorView<float>(out.data(), 1, s.H, s.n_q, d), o,
                           lse.data());
        h.add(out);
        h.add(lse);
      }
    }
  }
  return h.h;
}

// int8 K/V in the decode form at d = 128 (widened inside the AVX2 and
// AVX-512 loops since issue 13; recorded with the widening pass before it):
// 4 and 16 rows per KV head, causal with a window.
std::uint64_t hash_attention_decode_int8() {
  Hash h;
  Gen g(80);
  const std::size_t Hkv = 2, d = 128, n_kv = 300;
  const auto kf = g.vec<float>(Hkv * n_kv * d, 2);
  const auto vf = g.vec<float>(Hkv * n_kv * d, 3);
  const Quantized kq = quantize(kf, 1, Hkv, n_kv, d);
  const Quantized vq = quantize(vf, 1, Hkv, n_kv, d);
  const softdot::Int8KV& k = kq.kv;
  const softdot::Int8KV& v = vq.kv;
  for (std::size_t n_q : {std::size_t(1), std::size_t(4)}) {
    const std::size_t H = 8;
    const auto q = g.vec<float>(H * n_q * d, 2);
    AttentionOptions o;
    o.causal = true;
    o.window_left = 200;
    std::vector<float> out(H * n_q * d), lse(H * n_q);
    softdot::attention(TensorView<const float>(q.data(), 1, H, n_q, d), k, v,
                       TensorView<float>(out.data(), 1, H, n_q, d), o,
                       lse.data());
    h.add(out);
    h.add(lse);
  }
  return h.h;
}

// paged_attention (added with it, issue 13): three sequences of 0, 45 and
// 290 keys in pages of 16 tokens taken in a scrambled order, decode
// (n_q = 1) and chunked prefill (n_q = 37), causal with sinks; out and lse
// hashed. KV is float, Float16, BFloat16, or std::int8_t (the pages
// quantised by quantize_kv).
template <class KV>
std::uint64_t hash_paged() {
  Hash h;
  Gen g(70 + sizeof(KV));
  const std::size_t B = 3, H = 4, Hkv = 2, d = 40, dv = 24, ps = 16, P = 24;
  const std::size_t bps = 20;
  const std::vector<std::int32_t> lens = {0, 45, 290};
  std::vector<std::int32_t> table(B * bps, -1);
  std::size_t next = 0;
  for (std::size_t b = 0; b < B; ++b) {
    for (std::size_t i = 0; i < (std::size_t(lens[b]) + ps - 1) / ps; ++i) {
      table[b * bps + i] = static_cast<std::int32_t>((7 * next++ + 3) % P);
    }
  }
  const softdot::PagedKVTable t{table, bps, lens};
  const auto kf = g.vec<float>(P * Hkv * ps * d, 2);
  const auto vf = g.vec<float>(P * Hkv * ps * dv, 3);
  const std::vector<float> sinks = {0.5f, -1.0f, 2.0f, 0.0f};
  std::vector<KV> k(kf.size()), v(vf.size());
  std::vector<float> ks(P * Hkv * ps), vs(P * Hkv * ps);
  if constexpr (std::is_same_v<KV, std::int8_t>) {
    softdot::quantize_kv(TensorView<const float>(kf.data(), P, Hkv, ps, d),
                         TensorView<std::int8_t>(k.data(), P, Hkv, ps, d),
                         TensorView<float>(ks.data(), P, Hkv, ps, 1));
    softdot::quantize_kv(TensorView<const float>(vf.data(), P, Hkv, ps, dv),
                         TensorView<std::int8_t>(v.data(), P, Hkv, ps, dv),
                         TensorView<float>(vs.data(), P, Hkv, ps, 1));
  } else {
    for (std::size_t i = 0; i < kf.size(); ++i) k[i] = to_kv<KV>(kf[i]);
    for (std::size_t i = 0; i < vf.size(); ++i) v[i] = to_kv<KV>(vf[i]);
  }
  const TensorView<const KV> kp(k.data(), P, Hkv, ps, d),
      vp(v.data(), P, Hkv, ps, dv);
  for (std::size_t n_q : {std::size_t(37), std::size_t(1)}) {
    const auto q = g.vec<float>(B * H * n_q * d, 2);
    const TensorView<const float> qv(q.data(), B, H, n_q, d);
    AttentionOptions o;
    o.causal = true;
    o.sinks = sinks;
    std::vector<float> out(B * H * n_q * dv), lse(B * H * n_q);
    const TensorView<float> ov(out.data(), B, H, n_q, dv);
    if constexpr (std::is_same_v<KV, std::int8_t>) {
      softdot::paged_attention(
          qv, {kp, TensorView<const float>(ks.data(), P, Hkv, ps, 1)},
          {vp, TensorView<const float>(vs.data(), P, Hkv, ps, 1)}, t, ov, o,
          lse.data());
    } else {
      softdot::paged_attention(qv, kp, vp, t, ov, o, lse.data());
    }
    h.add(out);
    h.add(lse);
  }
  return h.h;
}

std::uint64_t hash_conversions() {
  Hash h;
  for (std::uint32_t b = 0; b < 65536; ++b) {
    h.value(softdot::to_float(Float16{static_cast<std::uint16_t>(b)}));
    h.value(softdot::to_float(BFloat16{static_cast<std::uint16_t>(b)}));
  }
  Gen g(40);
  for (int i = 0; i < 20000; ++i) {
    const std::uint32_t u = g.next() ^ (g.next() << 16);
    float f;
    std::memcpy(&f, &u, 4);
    h.value(softdot::to_float16(f).bits);
    h.value(softdot::to_bfloat16(f).bits);
  }
  return h.h;
}

using Table = std::map<std::string, std::uint64_t>;

Table hashes_now() {
  using P = softdot::Precision;
  return {
      {"dot float", hash_dot<float>()},
      {"dot double", hash_dot<double>()},
      {"softmax faithful float", hash_softmax<float>(P::kFaithful)},
      {"softmax faithful double", hash_softmax<double>(P::kFaithful)},
      {"softmax fast float", hash_softmax<float>(P::kFast)},
      {"softmax fast double", hash_softmax<double>(P::kFast)},
      {"backward+states float", hash_backward_and_states<float>()},
      {"backward+states double", hash_backward_and_states<double>()},
      {"attention f32", hash_attention<float>()},
      {"attention f16", hash_attention<Float16>()},
      {"attention bf16", hash_attention<BFloat16>()},
      {"attention partial f32", hash_attention_partial<float>()},
      {"attention partial f16", hash_attention_partial<Float16>()},
      {"attention partial bf16", hash_attention_partial<BFloat16>()},
      {"attention_scores f32", hash_attention_scores<float>()},
      {"attention_scores f16", hash_attention_scores<Float16>()},
      {"attention_scores bf16", hash_attention_scores<BFloat16>()},
      {"conversions", hash_conversions()},
      {"int8", hash_int8()},
      {"attention decode f32", hash_attention_decode<float>()},
      {"attention decode bf16", hash_attention_decode<BFloat16>()},
      {"attention decode f16", hash_attention_decode<Float16>()},
      {"attention decode int8", hash_attention_decode_int8()},
      {"paged_attention f32", hash_paged<float>()},
      {"paged_attention f16", hash_paged<Float16>()},
      {"paged_attention bf16", hash_paged<BFloat16>()},
      {"paged_attention int8", hash_paged<std::int8_t>()},
  };
}

// Recorded at commit 6e27f53 (before issue 12 moved any code) on an Intel
// Sapphire Rapids (AVX3, AVX2, SSE4, SSSE3, SCALAR). "FMA" is AVX2 and AVX3.
// The "attention partial" and "attention_scores" rows were added with those
// functions (issue 12, after the others were recorded), and the "int8" rows
// with Int8KV (issue 13), on the same machine and targets, the
// "attention decode" rows (issue 13) with the decode kernel from before its
// scores were reduced by tiles, and the "paged_attention" rows (issue 13)
// after the blocked score chains; every other row is unchanged.
struct Golden {
  const char* target_class;
  const char* function;
  std::uint64_t hash;
};
const Golden kGolden[] = {
    {"FMA", "attention bf16", 0x2d5f9d23e669d50bull},
    {"FMA", "attention f16", 0x5180631403f09270ull},
    {"FMA", "attention f32", 0x50f5262d9a047feaull},
    {"FMA", "attention partial bf16", 0x4a9422f1d77394eeull},
    {"FMA", "attention partial f16", 0x028bf868b8accfdfull},
    {"FMA", "attention partial f32", 0xa810f614c39155beull},
    {"FMA", "attention_scores bf16", 0x62cdcf8d2fd92fa8ull},
    {"FMA", "attention_scores f16", 0x07cca5e942645168ull},
    {"FMA", "attention_scores f32", 0xb8ffc6c7e516c9b6ull},
    {"FMA", "backward+states double", 0x709abcb05f92c31eull},
    {"FMA", "backward+states float", 0xfecc0e4cb128d86aull},
    {"FMA", "conversions", 0x52eea8b7facb10afull},
    {"FMA", "dot double", 0x93fdcb55e88ded3eull},
    {"FMA", "dot float", 0x3193df949dedc795ull},
    {"FMA", "softmax faithful double", 0xb6b24383cdb4ae09ull},
    {"FMA", "softmax faithful float", 0x501de0fbd8987468ull},
    {"FMA", "softmax fast double", 0x8e4692090f7cb422ull},
    {"FMA", "softmax fast float", 0x00b9d767599ea627ull},
    {"FMA", "int8", 0xc9b78dc84eaffb61ull},
    {"FMA", "attention decode f32", 0xa48dae7be01ac860ull},
    {"FMA", "attention decode bf16", 0x8cadc63ca4eb69c8ull},
    {"FMA", "attention decode f16", 0x1e23c1eee138c275ull},
    {"FMA", "attention decode int8", 0xb66b4384efb4092dull},
    {"FMA", "paged_attention bf16", 0xc9467eb50c14ebfaull},
    {"FMA", "paged_attention f16", 0x2b7d3f9d0c7297aaull},
    {"FMA", "paged_attention f32", 0xb610f7b75f432aafull},
    {"FMA", "paged_attention int8", 0xe3bed395e65a2e63ull},
    {"SSE4", "attention bf16", 0x310665a319f7bbd8ull},
    {"SSE4", "attention f16", 0xb3de26d8da940bafull},
    {"SSE4", "attention f32", 0x6695947d0f42e762ull},
    {"SSE4", "attention partial bf16", 0xd52f1726f95f3f3dull},
    {"SSE4", "attention partial f16", 0x596a5aa991564894ull},
    {"SSE4", "attention partial f32", 0xe3162c6aaf287e58ull},
    {"SSE4", "attention_scores bf16", 0x6e22e7e9b6d0c947ull},
    {"SSE4", "attention_scores f16", 0xfe4ce67f948a42dbull},
    {"SSE4", "attention_scores f32", 0x7efc5e2280c07d04ull},
    {"SSE4", "backward+states double", 0xae0aba73682a3e8aull},
    {"SSE4", "backward+states float", 0xbe7ddea2ebd21782ull},
    {"SSE4", "conversions", 0x52eea8b7facb10afull},
    {"SSE4", "dot double", 0x8b80c45dfb18f897ull},
    {"SSE4", "dot float", 0x838417beff6b12d4ull},
    {"SSE4", "softmax faithful double", 0xd664f15b542ce435ull},
    {"SSE4", "softmax faithful float", 0xd5aca32cd3689ba7ull},
    {"SSE4", "softmax fast double", 0x81020729e4eb232aull},
    {"SSE4", "softmax fast float", 0xf701576761d7aa26ull},
    {"SSE4", "int8", 0x7a6231d3d1104707ull},
    {"SSE4", "attention decode f32", 0x55e26baa4b7db08dull},
    {"SSE4", "attention decode bf16", 0x01dd889889dec56bull},
    {"SSE4", "attention decode f16", 0x5f4b9eda4005d338ull},
    {"SSE4", "attention decode int8", 0x3ba7af7a8d0b8d0aull},
    {"SSE4", "paged_attention bf16", 0x5ead67de5badf3a5ull},
    {"SSE4", "paged_attention f16", 0x09f0ff0c0799a2baull},
    {"SSE4", "paged_attention f32", 0x14a384c6304a2aa3ull},
    {"SSE4", "paged_attention int8", 0xf1283b06b9543217ull},
    {"SSSE3", "attention bf16", 0x310665a319f7bbd8ull},
    {"SSSE3", "attention f16", 0xb3de26d8da940bafull},
    {"SSSE3", "attention f32", 0x6695947d0f42e762ull},
    {"SSSE3", "attention partial bf16", 0xd52f1726f95f3f3dull},
    {"SSSE3", "attention partial f16", 0x596a5aa991564894ull},
    {"SSSE3", "attention partial f32", 0xe3162c6aaf287e58ull},
    {"SSSE3", "attention_scores bf16", 0x6e22e7e9b6d0c947ull},
    {"SSSE3", "attention_scores f16", 0xfe4ce67f948a42dbull},
    {"SSSE3", "attention_scores f32", 0x7efc5e2280c07d04ull},
    {"SSSE3", "backward+states double", 0xae0aba73682a3e8aull},
    {"SSSE3", "backward+states float", 0xbe7ddea2ebd21782ull},
    {"SSSE3", "conversions", 0x52eea8b7facb10afull},
    {"SSSE3", "dot double", 0x8b80c45dfb18f897ull},
    {"SSSE3", "dot float", 0x838417beff6b12d4ull},
    {"SSSE3", "softmax faithful double", 0xd664f15b542ce435ull},
    {"SSSE3", "softmax faithful float", 0xd5aca32cd3689ba7ull},
    {"SSSE3", "softmax fast double", 0x81020729e4eb232aull},
    {"SSSE3", "softmax fast float", 0xf701576761d7aa26ull},
    {"SSSE3", "int8", 0x7a6231d3d1104707ull},
    {"SSSE3", "attention decode f32", 0x55e26baa4b7db08dull},
    {"SSSE3", "attention decode bf16", 0x01dd889889dec56bull},
    {"SSSE3", "attention decode f16", 0x5f4b9eda4005d338ull},
    {"SSSE3", "attention decode int8", 0x3ba7af7a8d0b8d0aull},
    {"SSSE3", "paged_attention bf16", 0x5ead67de5badf3a5ull},
    {"SSSE3", "paged_attention f16", 0x09f0ff0c0799a2baull},
    {"SSSE3", "paged_attention f32", 0x14a384c6304a2aa3ull},
    {"SSSE3", "paged_attention int8", 0xf1283b06b9543217ull},
    {"SCALAR", "attention bf16", 0x310665a319f7bbd8ull},
    {"SCALAR", "attention f16", 0xb3de26d8da940bafull},
    {"SCALAR", "attention f32", 0x6695947d0f42e762ull},
    {"SCALAR", "attention partial bf16", 0xd52f1726f95f3f3dull},
    {"SCALAR", "attention partial f16", 0x596a5aa991564894ull},
    {"SCALAR", "attention partial f32", 0xe3162c6aaf287e58ull},
    {"SCALAR", "attention_scores bf16", 0x6e22e7e9b6d0c947ull},
    {"SCALAR", "attention_scores f16", 0xfe4ce67f948a42dbull},
    {"SCALAR", "attention_scores f32", 0x7efc5e2280c07d04ull},
    {"SCALAR", "backward+states double", 0xae0aba73682a3e8aull},
    {"SCALAR", "backward+states float", 0xbe7ddea2ebd21782ull},
    {"SCALAR", "conversions", 0x52eea8b7facb10afull},
    {"SCALAR", "dot double", 0x8b80c45dfb18f897ull},
    {"SCALAR", "dot float", 0x838417beff6b12d4ull},
    {"SCALAR", "softmax faithful double", 0xd664f15b542ce435ull},
    {"SCALAR", "softmax faithful float", 0xd5aca32cd3689ba7ull},
    {"SCALAR", "softmax fast double", 0x81020729e4eb232aull},
    {"SCALAR", "softmax fast float", 0xf701576761d7aa26ull},
    {"SCALAR", "int8", 0x7a6231d3d1104707ull},
    {"SCALAR", "attention decode f32", 0x55e26baa4b7db08dull},
    {"SCALAR", "attention decode bf16", 0x01dd889889dec56bull},
    {"SCALAR", "attention decode f16", 0x5f4b9eda4005d338ull},
    {"SCALAR", "attention decode int8", 0x3ba7af7a8d0b8d0aull},
    {"SCALAR", "paged_attention bf16", 0x5ead67de5badf3a5ull},
    {"SCALAR", "paged_attention f16", 0x09f0ff0c0799a2baull},
    {"SCALAR", "paged_attention f32", 0x14a384c6304a2aa3ull},
    {"SCALAR", "paged_attention int8", 0xf1283b06b9543217ull},
    // aarch64 (long double is binary128 there): recorded under qemu-aarch64
    // with NEON, the one target softdot compiles there (stop 22).
    {"AARCH64 NEON", "backward+states double", 0x4dd57a13e255b02cull},
    {"AARCH64 NEON", "backward+states float", 0xc68b33143fa38084ull},
};

// The softmax states (merge, logsumexp of a state) and the double backward
// use long double: the x87 80-bit format on x86-64, IEEE binary128 on
// aarch64, which rounds differently. So on Arm those rows have hashes of
// their own (recorded under qemu-aarch64, scripts/test_arm64.sh), and every
// other row must match x86's.
bool uses_long_double(const std::string& function) {
  return function.rfind("backward+states", 0) == 0;
}

std::string target_class(const std::string& target,
                         const std::string& function) {
#if defined(__aarch64__)
  if (uses_long_double(function)) return "AARCH64 " + target;
#else
  (void)uses_long_double;
  (void)function;
#endif
  return is_fma_target(target) ? "FMA" : target;
}

class GoldenOutputs : public PerTarget {};

TEST_P(GoldenOutputs, EveryPublicFunctionKeepsItsBits) {
  const Table now = hashes_now();
  if (std::getenv("SOFTDOT_GOLDEN_PRINT")) {
    for (const auto& [fn, hash] : now)
      std::printf("    {\"%s\", \"%s\", 0x%016llxull},\n",
                  target_class(target(), fn).c_str(), fn.c_str(),
                  static_cast<unsigned long long>(hash));
  }
  std::size_t checked = 0;
  for (const auto& [fn, hash] : now) {
    const std::string cls = target_class(target(), fn);
    for (const Golden& g : kGolden) {
      if (cls != g.target_class || fn != g.function) continue;
      EXPECT_EQ(hash, g.hash)
          << fn << " on " << target() << " (" << cls << "): the bits changed";
      ++checked;
    }
  }
  if (checked == 0)
    GTEST_SKIP() << "no golden hashes recorded for " << target();
  EXPECT_EQ(checked, now.size())
      << "functions without a recorded hash on " << target();
}

SOFTDOT_INSTANTIATE_PER_TARGET(GoldenOutputs);

}  // namespace
}  // namespace softdot_test
