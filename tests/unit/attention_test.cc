// Attention: softdot::attention, attention_merge and attention_weights against
// the long-double reference (tests/reference/attention_reference.h) within the
// bound include/softdot/attention.h states, for every option; the special
// values of docs/numerics.md; bitwise reproducibility over threads, FMA
// targets and alignments; argument errors; the Float16 / BFloat16
// conversions.
//
// Each accuracy case prints one line
//   [ attn-err ] <case>  err/(uW) max ...  err/bound max ...  lse err/u max ...
// with err = |O - O*| and W = sum_j w_j |V_jc| (u = 2^-24): the measured
// figure that docs/accuracy.md quotes.
#include "softdot/attention.h"

#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <iterator>
#include <limits>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "attention_reference.h"
#include "test_util.h"

namespace softdot_test {
namespace {

using softdot::AttentionOptions;
using softdot::BFloat16;
using softdot::Float16;
using softdot::TensorView;
using softdot_ref::AttnRef;
using LD = long double;

constexpr double kU = 0x1p-24;
constexpr float kInfF = std::numeric_limits<float>::infinity();
constexpr float kNaNF = std::numeric_limits<float>::quiet_NaN();
constexpr std::size_t kNone = std::numeric_limits<std::size_t>::max();

// ---- element types ---------------------------------------------------------

template <class T>
const char* kv_name() {
  if constexpr (std::is_same_v<T, float>) {
    return "f32";
  } else if constexpr (std::is_same_v<T, Float16>) {
    return "f16";
  } else {
    return "bf16";
  }
}

template <class T>
T from_float(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else if constexpr (std::is_same_v<T, Float16>) {
    return softdot::to_float16(x);
  } else {
    return softdot::to_bfloat16(x);
  }
}

inline float widen(float x) { return x; }
inline float widen(Float16 x) { return softdot::to_float(x); }
inline float widen(BFloat16 x) { return softdot::to_float(x); }

// ---- tensors ---------------------------------------------------------------

// An owned [B, H, R, C] tensor with padding between rows (pad), heads
// (2 pad) and batches (3 pad), starting `off` elements into its storage.
// The padding holds `fill` (NaN for inputs: it must never be read).
template <class T>
class Tensor {
 public:
  std::size_t B = 1, H = 1, R = 0, C = 0, pad = 0, off = 0;
  std::size_t bs = 0, hs = 0, rs = 0;

  Tensor() = default;
  Tensor(std::size_t b, std::size_t h, std::size_t r, std::size_t c,
         std::size_t pad_, T fill, std::size_t off_ = 0)
      : B(b), H(h), R(r), C(c), pad(pad_), off(off_) {
    rs = c + pad;
    hs = r * rs + 2 * pad;
    bs = h * hs + 3 * pad;
    n_ = off + std::max<std::size_t>(1, b * bs);
    p_ = std::make_unique<T[]>(n_);
    std::fill_n(p_.get(), n_, fill);
  }
  Tensor(const Tensor& o) { *this = o; }
  Tensor& operator=(const Tensor& o) {
    if (this != &o) {
      B = o.B, H = o.H, R = o.R, C = o.C, pad = o.pad, off = o.off;
      bs = o.bs, hs = o.hs, rs = o.rs, n_ = o.n_;
      p_ = std::make_unique<T[]>(n_);
      std::copy_n(o.p_.get(), n_, p_.get());
    }
    return *this;
  }
  Tensor(Tensor&&) = default;
  Tensor& operator=(Tensor&&) = default;

  std::size_t index(std::size_t b, std::size_t h, std::size_t r,
                    std::size_t c) const {
    return off + b * bs + h * hs + r * rs + c;
  }
  T& at(std::size_t b, std::size_t h, std::size_t r, std::size_t c) {
    return p_[index(b, h, r, c)];
  }
  const T& at(std::size_t b, std::size_t h, std::size_t r,
              std::size_t c) const {
    return p_[index(b, h, r, c)];
  }
  T* data() { return p_.get() + off; }
  const T* data() const { return p_.get() + off; }
  std::size_t storage() const { return n_; }
  const T& raw(std::size_t t) const { return p_[t]; }
  T& raw(std::size_t t) { return p_[t]; }

  TensorView<const T> cview() const {
    return TensorView<const T>(data(), B, H, R, C, bs, hs, rs);
  }
  TensorView<T> view() { return TensorView<T>(data(), B, H, R, C, bs, hs, rs); }
  softdot_ref::AttnTensor<T> ref() const {
    return {data(), B, H, R, C, bs, hs, rs};
  }
  template <class F>
  void for_each(F f) {
    for (std::size_t b = 0; b < B; ++b)
      for (std::size_t h = 0; h < H; ++h)
        for (std::size_t r = 0; r < R; ++r)
          for (std::size_t c = 0; c < C; ++c) f(at(b, h, r, c));
  }
  // The elements, dense, in (b, h, r, c) order.
  std::vector<T> dense() const {
    std::vector<T> v;
    v.reserve(B * H * R * C);
    for (std::size_t b = 0; b < B; ++b)
      for (std::size_t h = 0; h < H; ++h)
        for (std::size_t r = 0; r < R; ++r)
          for (std::size_t c = 0; c < C; ++c) v.push_back(at(b, h, r, c));
    return v;
  }
  // The same elements in another layout.
  Tensor relayout(std::size_t new_pad, std::size_t new_off, T fill) const {
    Tensor t(B, H, R, C, new_pad, fill, new_off);
    for (std::size_t b = 0; b < B; ++b)
      for (std::size_t h = 0; h < H; ++h)
        for (std::size_t r = 0; r < R; ++r)
          for (std::size_t c = 0; c < C; ++c) t.at(b, h, r, c) = at(b, h, r, c);
    return t;
  }

 private:
  std::size_t n_ = 0;
  std::unique_ptr<T[]> p_;
};

// True when every storage slot of t outside its elements still holds
// `sentinel` (bitwise).
bool padding_intact(const Tensor<float>& t, float sentinel) {
  std::vector<char> used(t.storage(), 0);
  for (std::size_t b = 0; b < t.B; ++b)
    for (std::size_t h = 0; h < t.H; ++h)
      for (std::size_t r = 0; r < t.R; ++r)
        for (std::size_t c = 0; c < t.C; ++c) used[t.index(b, h, r, c)] = 1;
  for (std::size_t i = 0; i < t.storage(); ++i) {
    if (!used[i] && bits(t.raw(i)) != bits(sentinel)) return false;
  }
  return true;
}

template <class T>
Tensor<float> widened(const Tensor<T>& t) {
  Tensor<float> w(t.B, t.H, t.R, t.C, t.pad, 0.0f, t.off);
  for (std::size_t i = 0; i < t.storage(); ++i) w.raw(i) = widen(t.raw(i));
  return w;
}

// ---- problems --------------------------------------------------------------

struct Shape {
  std::size_t B = 1, H = 1, Hkv = 1, nq = 1, nkv = 1, d = 64, dv = 64;
  std::size_t pad = 0, off = 0;
  double qk = 1.0;             // Q and K uniform in [-qk, qk]
  double v_lo = -1, v_hi = 1;  // V uniform in [v_lo, v_hi]
  std::uint64_t seed = 1;
  std::string str() const {
    char buf[160];
    std::snprintf(buf, sizeof buf, "B%zu H%zu/%zu nq%zu nkv%zu d%zu dv%zu%s", B,
                  H, Hkv, nq, nkv, d, dv, pad ? " strided" : "");
    return buf;
  }
};

template <class KV>
struct Problem {
  Shape s;
  Tensor<float> q;
  Tensor<KV> k, v;
  Tensor<float> kw, vw;  // exact float widening of k and v
  void rewiden() {
    kw = widened(k);
    vw = widened(v);
  }
};

template <class KV>
Problem<KV> make_problem(const Shape& s) {
  Problem<KV> p;
  p.s = s;
  // Padding holds NaN: reading it would show.
  p.q = Tensor<float>(s.B, s.H, s.nq, s.d, s.pad, kNaNF, s.off);
  p.k = Tensor<KV>(s.B, s.Hkv, s.nkv, s.d, s.pad, from_float<KV>(kNaNF), s.off);
  p.v =
      Tensor<KV>(s.B, s.Hkv, s.nkv, s.dv, s.pad, from_float<KV>(kNaNF), s.off);
  std::mt19937_64 rng(s.seed * 0x9E3779B97F4A7C15ull + 4321);
  std::uniform_real_distribution<double> qk(-s.qk, s.qk);
  std::uniform_real_distribution<double> vd(s.v_lo, s.v_hi);
  p.q.for_each([&](float& x) { x = float(qk(rng)); });
  p.k.for_each([&](KV& x) { x = from_float<KV>(float(qk(rng))); });
  p.v.for_each([&](KV& x) { x = from_float<KV>(float(vd(rng))); });
  p.rewiden();
  return p;
}

softdot_ref::AttnRefOptions to_ref(const AttentionOptions& o) {
  softdot_ref::AttnRefOptions r;
  r.scale = o.scale;
  r.causal = o.causal;
  r.window_left = o.window_left;
  r.window_right = o.window_right;
  r.softcap = o.softcap;
  if (!o.mask.empty()) {
    r.mask = {o.mask.data,        o.mask.batch,     o.mask.heads,
              o.mask.rows,        o.mask.cols,      o.mask.batch_stride,
              o.mask.head_stride, o.mask.row_stride};
  }
  if (!o.bias.empty()) {
    r.bias = {o.bias.data,        o.bias.batch,     o.bias.heads,
              o.bias.rows,        o.bias.cols,      o.bias.batch_stride,
              o.bias.head_stride, o.bias.row_stride};
  }
  r.sinks.assign(o.sinks.begin(), o.sinks.end());
  r.kv_begin = o.kv_begin;
  r.kv_end = o.kv_end;
  return r;
}

template <class KV>
AttnRef reference(const Problem<KV>& p, const AttentionOptions& o,
                  bool weights = false) {
  return softdot_ref::attention_reference(p.q.ref(), p.kw.ref(), p.vw.ref(),
                                          to_ref(o), weights);
}

// ---- running ---------------------------------------------------------------

constexpr float kOutSentinel = -777.25f;
constexpr float kLseSentinel = 4242.5f;
constexpr std::size_t kLseGuard = 3;

struct Result {
  Tensor<float> o;
  std::vector<float> lse;  // B * H * n_q values, then kLseGuard guards
  bool guards_ok() const {
    if (!padding_intact(o, kOutSentinel)) return false;
    for (std::size_t i = lse.size() - std::min(lse.size(), kLseGuard);
         i < lse.size(); ++i) {
      if (bits(lse[i]) != bits(kLseSentinel)) return false;
    }
    return true;
  }
  // Output then lse, dense.
  std::vector<float> all() const {
    std::vector<float> v = o.dense();
    v.insert(v.end(), lse.begin(), lse.end() - std::min(lse.size(), kLseGuard));
    return v;
  }
};

template <class KV>
Result run(const Problem<KV>& p, const AttentionOptions& o,
           bool with_lse = true) {
  const Shape& s = p.s;
  Result r{Tensor<float>(s.B, s.H, s.nq, s.dv, s.pad + 1, kOutSentinel, s.off),
           {}};
  if (with_lse) r.lse.assign(s.B * s.H * s.nq + kLseGuard, kLseSentinel);
  softdot::attention(p.q.cview(), p.k.cview(), p.v.cview(), r.o.view(), o,
                     with_lse ? r.lse.data() : nullptr);
  return r;
}

// Runs f with n OpenMP threads, restoring the previous setting.
template <class F>
auto with_threads(int n, F f) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(n);
  auto r = f();
  omp_set_num_threads(saved);
  return r;
}

std::vector<std::string> all_targets() { return softdot::simd_targets(); }
std::vector<std::string> fma_targets() {
  std::vector<std::string> t;
  for (const auto& n : softdot::simd_targets()) {
    if (is_fma_target(n)) t.push_back(n);
  }
  return t;
}

// ---- checking against the reference ---------------------------------------

struct Stats {
  double ratio = 0;  // max err / (u W)
  double frac = 0;   // max err / bound
  double lse = 0;    // max |lse - lse*| / u
  std::size_t elements = 0, failures = 0;
};

constexpr std::size_t kMaxMessages = 6;

// EXPECT_TRUE(cond), reporting at most kMaxMessages failures per counter.
#define ATTN_EXPECT(cond, counter)             \
  if ((cond) || (counter)++ >= kMaxMessages) { \
  } else                                       \
    ADD_FAILURE() << "Expected: " #cond "\n"

using RowFilter = std::function<bool(std::size_t, std::size_t, std::size_t)>;

// The lse bound. lse = m + log(S): a score error of at most D_i moves lse by
// at most D_i; exp and the float block sums (the 70u of the output bound)
// make S relative error <= 70u, so log(S) absolute error <= 70u; the final
// float rounding adds u|lse| (and log's own rounding another u|lse| at
// most). Hence |lse - lse*| <= D_i + 70u + 2u|lse*|.
double lse_bound(double D, LD lse) {
  return D + 70 * kU + 2 * kU * double(std::fabs(lse));
}

bool check_lse(float got, LD want, double D, std::string* why, double* ratio) {
  if (std::isnan(want)) {
    if (std::isnan(got)) return true;
    *why = "want NaN";
    return false;
  }
  if (std::isinf(want)) {
    if (LD(got) == want) return true;
    *why = want > 0 ? "want +inf" : "want -inf";
    return false;
  }
  const double err = double(std::fabs(LD(got) - want));
  *ratio = err / kU;
  if (std::isfinite(got) && err <= lse_bound(D, want)) return true;
  *why = "error " + fmt(err) + " > bound " + fmt(lse_bound(D, want));
  return false;
}

// Checks every output element (and lse when given) against the reference:
// NaN where the reference is NaN; a row of exactly +0.0 where no key is
// visible; |O - O*| <= (2 D + 70 u) W + u |O*| elsewhere (attention.h).
// Rows where skip(b, h, i) is true are left out.
void check_output(const AttnRef& ref, const Tensor<float>& out,
                  const float* lse, const std::string& what, Stats& st,
                  const RowFilter& skip = {}) {
  for (std::size_t b = 0; b < ref.batch; ++b) {
    for (std::size_t h = 0; h < ref.heads; ++h) {
      for (std::size_t i = 0; i < ref.n_q; ++i) {
        if (skip && skip(b, h, i)) continue;
        const std::size_t row = ref.li(b, h, i);
        for (std::size_t c = 0; c < ref.d_v; ++c) {
          const std::size_t oi = ref.oi(b, h, i, c);
          const float got = out.at(b, h, i, c);
          const LD want = ref.out[oi];
          bool ok;
          const char* kind = "";
          double err = 0, bound = 0;
          ++st.elements;
          if (std::isnan(want)) {
            ok = std::isnan(got);
            kind = "want NaN";
          } else if (ref.visible[row] == 0) {
            ok = bits(got) == 0u;
            kind = "fully masked row: want +0.0";
          } else {
            err = double(std::fabs(LD(got) - want));
            bound = ref.bound[oi];
            ok = std::isfinite(got) && err <= bound;
            if (ref.W[oi] > 0) {
              st.ratio = std::max(st.ratio, err / (kU * ref.W[oi]));
            }
            if (bound > 0) st.frac = std::max(st.frac, err / bound);
          }
          if (!ok && st.failures++ < kMaxMessages) {
            const std::string why =
                *kind
                    ? std::string(kind)
                    : "error " + fmt(err) + " > bound " + fmt(bound) + " (W " +
                          fmt(ref.W[oi]) + ", D " + fmt(ref.D[row]) + ")";
            ADD_FAILURE() << what << ": out[b=" << b << ",h=" << h << ",i=" << i
                          << ",c=" << c << "] = " << fmt(got) << ", reference "
                          << fmt(double(want)) << ": " << why;
          }
        }
        if (lse) {
          std::string why;
          double ratio = 0;
          if (!check_lse(lse[row], ref.lse[row], ref.D[row], &why, &ratio)) {
            if (st.failures++ < kMaxMessages) {
              ADD_FAILURE()
                  << what << ": lse[b=" << b << ",h=" << h << ",i=" << i
                  << "] = " << fmt(lse[row]) << ", reference "
                  << fmt(double(ref.lse[row])) << ": " << why;
            }
          }
          st.lse = std::max(st.lse, ratio);
        }
      }
    }
  }
}

void print_stats(const std::string& label, const Stats& st) {
  std::printf(
      "[ attn-err ] %-62s err/(uW) max %7.3f  err/bound max %.4f  lse err/u "
      "max %7.3f  (%zu elements)\n",
      label.c_str(), st.ratio, st.frac, st.lse, st.elements);
  std::fflush(stdout);
}

// One accuracy case: the reference once, then attention() on each target
// ("" = the automatic choice), with lse; the output without lse must be the
// same bits. Prints the measured figures.
template <class KV>
Stats accuracy_case(const std::string& label, const Problem<KV>& p,
                    const AttentionOptions& o,
                    const std::vector<std::string>& targets = all_targets(),
                    const RowFilter& skip = {}) {
  const AttnRef ref = reference(p, o);
  Stats st;
  bool first = true;
  for (const auto& t : targets) {
    softdot::force_simd_target(t);
    const Result r = run(p, o);
    const std::string what = std::string(kv_name<KV>()) + " " + label + " " +
                             p.s.str() + " [" + (t.empty() ? "auto" : t) + "]";
    check_output(ref, r.o, r.lse.data(), what, st, skip);
    EXPECT_TRUE(r.guards_ok()) << what << ": wrote outside the output";
    if (first) {
      const Result r2 = run(p, o, /*with_lse=*/false);
      EXPECT_TRUE(SameBits(r.o.dense(), r2.o.dense()))
          << what << ": the output depends on whether lse is asked for";
      first = false;
    }
  }
  softdot::force_simd_target("");
  print_stats(std::string(kv_name<KV>()) + " " + label + " " + p.s.str(), st);
  return st;
}

// ---- Float16 / BFloat16 ----------------------------------------------------

// Independent decoding of binary16.
float decode_f16(std::uint16_t h) {
  const int e = (h >> 10) & 0x1f;
  const int m = h & 0x3ff;
  float v;
  if (e == 0) {
    v = std::ldexp(float(m), -24);
  } else if (e == 31) {
    v = m ? kNaNF : kInfF;
  } else {
    v = std::ldexp(float(m + 1024), e - 25);
  }
  return (h & 0x8000) ? -v : v;
}

TEST(AttentionConvert, Float16Exhaustive) {
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const float want = decode_f16(std::uint16_t(h));
    const float got = softdot::to_float(Float16{std::uint16_t(h)});
    ASSERT_TRUE(same_value(got, want)) << "to_float(Float16 " << h << ")";
    if (!std::isnan(want)) {
      ASSERT_EQ(softdot::to_float16(want).bits, h) << "round trip " << h;
    } else {
      ASSERT_TRUE(std::isnan(softdot::to_float(softdot::to_float16(want))));
    }
  }
  // Ties to even, just below and just above every midpoint between adjacent
  // positive finite values (the last one rounds up to inf on a tie: 0x7BFF
  // is odd), also negated.
  for (std::uint32_t h = 0; h < 0x7C00; ++h) {
    const double a = decode_f16(std::uint16_t(h));
    const double b =
        h + 1 < 0x7C00 ? decode_f16(std::uint16_t(h + 1)) : 65536.0;
    const float mid = float((a + b) / 2);  // exact: 12 significant bits
    ASSERT_EQ(double(mid), (a + b) / 2);
    const std::uint16_t even =
        (h & 1) ? std::uint16_t(h + 1) : std::uint16_t(h);
    for (float sign : {1.0f, -1.0f}) {
      const std::uint16_t sb = sign < 0 ? 0x8000 : 0;
      ASSERT_EQ(softdot::to_float16(sign * mid).bits, even | sb) << h;
      ASSERT_EQ(softdot::to_float16(sign * std::nextafter(mid, 0.0f)).bits,
                h | sb)
          << h;
      ASSERT_EQ(softdot::to_float16(sign * std::nextafter(mid, kInfF)).bits,
                (h + 1) | sb)
          << h;
    }
  }
  EXPECT_EQ(softdot::to_float16(1e10f).bits, 0x7C00);
  EXPECT_EQ(softdot::to_float16(-kInfF).bits, 0xFC00);
  EXPECT_EQ(softdot::to_float16(65519.99f).bits, 0x7BFF);
  EXPECT_EQ(softdot::to_float16(0x1p-25f).bits, 0);  // tie to even: 0
  EXPECT_EQ(softdot::to_float16(0x1.8p-25f).bits, 1);
  EXPECT_EQ(softdot::to_float16(-0.0f).bits, 0x8000);
  EXPECT_TRUE(std::isnan(softdot::to_float(softdot::to_float16(kNaNF))));
}

TEST(AttentionConvert, BFloat16Exhaustive) {
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const float want = std::bit_cast<float>(h << 16);
    const float got = softdot::to_float(BFloat16{std::uint16_t(h)});
    ASSERT_TRUE(same_value(got, want)) << "to_float(BFloat16 " << h << ")";
    if (!std::isnan(want)) {
      ASSERT_EQ(softdot::to_bfloat16(want).bits, h) << "round trip " << h;
    }
  }
  for (std::uint32_t h = 0; h < 0x7F80; ++h) {
    const std::uint32_t mid = (h << 16) | 0x8000;
    const std::uint16_t even =
        (h & 1) ? std::uint16_t(h + 1) : std::uint16_t(h);
    for (std::uint32_t sb : {0u, 0x80000000u}) {
      const std::uint16_t s16 = sb ? 0x8000 : 0;
      ASSERT_EQ(softdot::to_bfloat16(std::bit_cast<float>(mid | sb)).bits,
                even | s16)
          << h;
      ASSERT_EQ(softdot::to_bfloat16(std::bit_cast<float>((mid - 1) | sb)).bits,
                h | s16)
          << h;
      ASSERT_EQ(softdot::to_bfloat16(std::bit_cast<float>((mid + 1) | sb)).bits,
                (h + 1) | s16)
          << h;
    }
  }
  // NaN stays NaN, even a signalling NaN whose payload is only in the low
  // half (truncating or rounding the bits would give inf).
  for (std::uint32_t nan :
       {0x7F800001u, 0xFF800001u, 0x7FC00000u, 0x7F80FFFFu, 0x7FFFFFFFu}) {
    const BFloat16 b = softdot::to_bfloat16(std::bit_cast<float>(nan));
    EXPECT_TRUE(std::isnan(softdot::to_float(b))) << std::hex << nan;
  }
  EXPECT_EQ(softdot::to_bfloat16(std::numeric_limits<float>::max()).bits,
            0x7F80);
  EXPECT_EQ(softdot::to_bfloat16(-kInfF).bits, 0xFF80);
}

// ---- accuracy over shapes --------------------------------------------------

const std::pair<std::size_t, std::size_t> kDims[] = {
    {64, 64}, {7, 7},  {1, 1},    {65, 65}, {128, 128},
    {64, 7},  {7, 64}, {65, 128}, {128, 1}, {1, 65}};

template <class KV>
void shape_sweep(const std::vector<std::size_t>& nqs,
                 const std::vector<std::size_t>& nkvs, std::size_t dim0) {
  std::size_t idx = dim0;
  for (std::size_t nq : nqs) {
    for (std::size_t nkv : nkvs) {
      const auto [d, dv] = kDims[idx++ % std::size(kDims)];
      Shape s;
      s.nq = nq;
      s.nkv = nkv;
      s.d = d;
      s.dv = dv;
      s.seed = 1000 * nq + nkv + d;
      accuracy_case<KV>("plain", make_problem<KV>(s), {});
    }
  }
}

TEST(AttentionAccuracy, F32Shapes) {
  shape_sweep<float>({1, 7, 63, 65}, {1, 7, 63, 65}, 0);
  // Long rows and many rows (not every pair at 1000).
  const std::size_t big[][4] = {{1, 1000, 128, 128}, {7, 1000, 64, 65},
                                {1000, 1, 64, 64},   {1000, 65, 7, 64},
                                {65, 1000, 65, 7},   {1000, 1000, 64, 64}};
  for (const auto& c : big) {
    Shape s;
    s.nq = c[0];
    s.nkv = c[1];
    s.d = c[2];
    s.dv = c[3];
    s.seed = c[0] + 7 * c[1];
    const bool huge = c[0] * c[1] >= 1000000;
    accuracy_case<float>("plain", make_problem<float>(s), {},
                         huge ? fma_targets() : all_targets());
  }
}

TEST(AttentionAccuracy, F16Shapes) {
  shape_sweep<Float16>({1, 7, 65}, {7, 63, 1000}, 3);
}

TEST(AttentionAccuracy, BF16Shapes) {
  shape_sweep<BFloat16>({1, 7, 65}, {7, 63, 1000}, 6);
}

// Batch and heads with padding between rows, heads and batches (and a
// misaligned start), GQA (H = 8, H_kv = 2) and MQA (H_kv = 1).
TEST(AttentionAccuracy, BatchHeadsStridedGqaMqa) {
  {
    Shape s{.B = 2,
            .H = 3,
            .Hkv = 3,
            .nq = 7,
            .nkv = 65,
            .d = 64,
            .dv = 65,
            .pad = 3,
            .off = 1,
            .seed = 11};
    accuracy_case<float>("batch/heads", make_problem<float>(s), {});
  }
  {
    Shape s{.B = 2,
            .H = 8,
            .Hkv = 2,
            .nq = 65,
            .nkv = 63,
            .d = 64,
            .dv = 64,
            .pad = 5,
            .off = 3,
            .seed = 12};
    accuracy_case<float>("GQA", make_problem<float>(s), {});
    accuracy_case<Float16>("GQA", make_problem<Float16>(s), {});
    accuracy_case<BFloat16>("GQA", make_problem<BFloat16>(s), {});
  }
  {
    Shape s{.B = 3,
            .H = 4,
            .Hkv = 1,
            .nq = 63,
            .nkv = 130,
            .d = 7,
            .dv = 128,
            .pad = 1,
            .off = 0,
            .seed = 13};
    accuracy_case<float>("MQA", make_problem<float>(s), {});
    accuracy_case<BFloat16>("MQA", make_problem<BFloat16>(s), {});
  }
  {
    // Decode over a GQA cache, split into 512-key chunks across threads.
    Shape s{.B = 1,
            .H = 8,
            .Hkv = 2,
            .nq = 1,
            .nkv = 5000,
            .d = 128,
            .dv = 128,
            .pad = 2,
            .off = 1,
            .seed = 14};
    accuracy_case<float>("GQA decode", make_problem<float>(s), {});
    accuracy_case<Float16>("GQA decode", make_problem<Float16>(s), {});
    Shape s2 = s;
    s2.nq = 2;
    s2.nkv = 1500;
    s2.H = 4;
    s2.Hkv = 1;
    accuracy_case<BFloat16>("MQA decode", make_problem<BFloat16>(s2), {});
  }
}

// Larger scores (spread about 50: the score error term D dominates), an
// explicit scale, and values far from 0 (a well-conditioned sum) or of
// mixed magnitude.
TEST(AttentionAccuracy, WideScoresAndScales) {
  Shape s{.nq = 65, .nkv = 200, .d = 64, .dv = 64, .qk = 3.0, .seed = 21};
  AttentionOptions o;
  o.scale = 0.25;
  accuracy_case<float>("wide scores, scale 0.25", make_problem<float>(s), o);
  accuracy_case<Float16>("wide scores, scale 0.25", make_problem<Float16>(s),
                         o);
  Shape s2 = s;
  s2.d = 128;
  s2.nkv = 1000;
  s2.v_lo = 100;
  s2.v_hi = 101;
  o.scale = 1.0 / 3.0;  // rounded to float
  accuracy_case<float>("wide scores, scale 1/3, V in [100,101]",
                       make_problem<float>(s2), o);
  Shape s3{.nq = 7, .nkv = 300, .d = 65, .dv = 7, .seed = 23};
  auto p = make_problem<float>(s3);
  std::mt19937_64 rng(5);
  p.v.for_each([&](float& x) { x = std::ldexp(x, int(rng() % 40) - 20); });
  p.rewiden();
  accuracy_case<float>("V of mixed magnitude", p, {});
}

// ---- options ---------------------------------------------------------------

TEST(AttentionOptions, Causal) {
  AttentionOptions o;
  o.causal = true;
  const std::size_t shapes[][2] = {{7, 65}, {65, 65},  {130, 130},
                                   {65, 7}, {1, 1000}, {200, 1000}};
  for (const auto& sh : shapes) {
    Shape s{.B = 1,
            .H = 2,
            .Hkv = 1,
            .nq = sh[0],
            .nkv = sh[1],
            .d = 64,
            .dv = 64,
            .pad = 1,
            .seed = 30 + sh[0]};
    accuracy_case<float>("causal", make_problem<float>(s), o);
  }
  Shape s{.B = 2,
          .H = 4,
          .Hkv = 2,
          .nq = 100,
          .nkv = 70,
          .d = 32,
          .dv = 48,
          .seed = 31};
  accuracy_case<Float16>("causal", make_problem<Float16>(s), o);
  accuracy_case<BFloat16>("causal", make_problem<BFloat16>(s), o);
}

TEST(AttentionOptions, Window) {
  const std::ptrdiff_t windows[][3] = {// left, right, causal
                                       {5, -1, 0},      {-1, 3, 0}, {10, 4, 0},
                                       {20, -1, 1},     {0, 0, 0},  {70, 70, 0},
                                       {1000, 1000, 0}, {3, 50, 1}, {0, -1, 1}};
  std::uint64_t seed = 40;
  for (const auto& w : windows) {
    AttentionOptions o;
    o.window_left = w[0];
    o.window_right = w[1];
    o.causal = w[2] != 0;
    const std::string label = "window " + std::to_string(w[0]) + "/" +
                              std::to_string(w[1]) +
                              (o.causal ? " causal" : "");
    for (const auto& sh : {std::pair<std::size_t, std::size_t>{130, 130},
                           {30, 200},
                           {150, 40}}) {
      Shape s{.B = 1,
              .H = 2,
              .Hkv = 2,
              .nq = sh.first,
              .nkv = sh.second,
              .d = 32,
              .dv = 16,
              .seed = seed++};
      accuracy_case<float>(label, make_problem<float>(s), o);
    }
  }
  AttentionOptions o;
  o.window_left = 100;
  o.window_right = 0;
  Shape s{.B = 1,
          .H = 8,
          .Hkv = 2,
          .nq = 1,
          .nkv = 3000,
          .d = 64,
          .dv = 64,
          .seed = 49};
  accuracy_case<Float16>("window 100/0 decode", make_problem<Float16>(s), o);
}

// A random mask in [mb, mh, n_q, n_kv] with about 30% false.
Tensor<bool> random_mask(std::size_t mb, std::size_t mh, std::size_t nq,
                         std::size_t nkv, std::uint64_t seed,
                         double p_false = 0.3) {
  Tensor<bool> m(mb, mh, nq, nkv, 2, true);
  std::mt19937_64 rng(seed);
  std::bernoulli_distribution f(p_false);
  m.for_each([&](bool& x) { x = !f(rng); });
  return m;
}

TEST(AttentionOptions, MaskBroadcast) {
  const std::size_t B = 2, H = 4, Hkv = 2, nq = 33, nkv = 150;
  Shape s{.B = B,
          .H = H,
          .Hkv = Hkv,
          .nq = nq,
          .nkv = nkv,
          .d = 64,
          .dv = 64,
          .pad = 1,
          .seed = 50};
  const auto p = make_problem<float>(s);
  const auto pb = make_problem<BFloat16>(s);
  struct Variant {
    const char* name;
    std::size_t mb, mh, rows;
  };
  const Variant variants[] = {
      {"mask full", B, H, nq},
      {"mask batch 1", 1, H, nq},
      {"mask heads 1", B, 1, nq},
      {"mask batch 1 heads 1", 1, 1, nq},
      {"mask row stride 0", B, H, 1},
      {"mask batch stride 0, row stride 0", 1, 1, 1},
  };
  std::uint64_t seed = 51;
  for (const auto& v : variants) {
    Tensor<bool> m = random_mask(v.mb, v.mh, v.rows, nkv, seed++);
    AttentionOptions o;
    if (std::string(v.name) == "mask batch stride 0, row stride 0") {
      // batch = B and heads = H given, but with strides 0.
      o.mask = TensorView<const bool>(m.data(), B, H, nq, nkv, 0, 0, 0);
    } else if (v.rows == 1) {
      o.mask =
          TensorView<const bool>(m.data(), v.mb, v.mh, nq, nkv, m.bs, m.hs, 0);
    } else {
      o.mask = m.cview();
    }
    accuracy_case<float>(v.name, p, o);
    accuracy_case<BFloat16>(v.name, pb, o);
    o.causal = true;
    accuracy_case<float>(std::string(v.name) + " causal", p, o);
  }
}

TEST(AttentionOptions, Bias) {
  const std::size_t B = 2, H = 4, Hkv = 2, nq = 40, nkv = 100;
  Shape s{.B = B,
          .H = H,
          .Hkv = Hkv,
          .nq = nq,
          .nkv = nkv,
          .d = 64,
          .dv = 32,
          .pad = 2,
          .seed = 60};
  const auto p = make_problem<float>(s);
  const auto ph = make_problem<Float16>(s);
  std::mt19937_64 rng(61);
  std::uniform_real_distribution<double> u(-3, 3);
  // Full-shape bias with some -inf (which mask).
  Tensor<float> bias(B, H, nq, nkv, 1, kNaNF);
  bias.for_each([&](float& x) { x = rng() % 7 == 0 ? -kInfF : float(u(rng)); });
  AttentionOptions o;
  o.bias = bias.cview();
  accuracy_case<float>("bias with -inf", p, o);
  accuracy_case<Float16>("bias with -inf", ph, o);
  o.causal = true;
  accuracy_case<float>("bias with -inf, causal", p, o);
  // Broadcast: heads 1, one row for every query (ALiBi-like per key).
  Tensor<float> b1(B, 1, 1, nkv, 0, kNaNF);
  b1.for_each([&](float& x) { x = float(u(rng)); });
  AttentionOptions o2;
  o2.bias = TensorView<const float>(b1.data(), B, 1, nq, nkv, b1.bs, 0, 0);
  accuracy_case<float>("bias heads 1, row stride 0", p, o2);
  // Bias and mask together.
  Tensor<bool> m = random_mask(1, H, nq, nkv, 62);
  o2.mask = m.cview();
  accuracy_case<float>("bias and mask", p, o2);
}

TEST(AttentionOptions, Softcap) {
  Shape s{.B = 1,
          .H = 2,
          .Hkv = 1,
          .nq = 65,
          .nkv = 150,
          .d = 64,
          .dv = 64,
          .qk = 3.0,
          .seed = 70};
  const auto p = make_problem<float>(s);
  const auto pb = make_problem<BFloat16>(s);
  for (float cap : {5.0f, 30.0f, 50.0f}) {
    AttentionOptions o;
    o.softcap = cap;
    o.scale = 0.25;
    const std::string label = "softcap " + fmt(cap);
    accuracy_case<float>(label, p, o);
    accuracy_case<BFloat16>(label, pb, o);
    // The cap applies before the bias: a bias pushes past the cap.
    Tensor<float> bias(1, 2, s.nq, s.nkv, 0, kNaNF);
    std::mt19937_64 rng(71);
    std::uniform_real_distribution<double> u(-20, 20);
    bias.for_each([&](float& x) { x = float(u(rng)); });
    o.bias = bias.cview();
    o.causal = true;
    accuracy_case<float>(label + ", bias, causal", p, o);
  }
}

TEST(AttentionOptions, Sinks) {
  Shape s{.B = 2,
          .H = 4,
          .Hkv = 2,
          .nq = 33,
          .nkv = 130,
          .d = 64,
          .dv = 64,
          .pad = 1,
          .seed = 80};
  const auto p = make_problem<float>(s);
  const auto ph = make_problem<Float16>(s);
  // -inf (no effect), moderate ones, one that dominates (weights ~e^-20).
  const std::vector<float> sinks = {-kInfF, 0.5f, 3.0f, 20.0f};
  AttentionOptions o;
  o.sinks = sinks;
  accuracy_case<float>("sinks -inf/0.5/3/20", p, o);
  accuracy_case<Float16>("sinks -inf/0.5/3/20", ph, o);
  o.causal = true;
  accuracy_case<float>("sinks, causal", p, o);
  o.window_left = 10;
  accuracy_case<float>("sinks, causal, window 10", p, o);
  // A sink of -inf changes nothing: the same bits as no sink.
  const std::vector<float> none(4, -kInfF);
  AttentionOptions a, b;
  a.sinks = none;
  EXPECT_TRUE(SameBits(run(p, a).all(), run(p, b).all()))
      << "sinks of -inf differ from no sinks";
  // Decode split with sinks.
  Shape sd{.B = 1,
           .H = 4,
           .Hkv = 2,
           .nq = 1,
           .nkv = 3000,
           .d = 64,
           .dv = 64,
           .seed = 81};
  AttentionOptions od;
  od.sinks = sinks;
  accuracy_case<float>("sinks decode", make_problem<float>(sd), od);
}

// A sink far above every score: the weights are below e^-900, so the exact
// output is below 1e-390 (which float cannot hold), and lse is the sink.
// The bound of attention.h has no underflow term, so here the output is
// checked to be (nearly) zero: |O| <= 2^-126, the smallest normal float.
TEST(AttentionOptions, LargeSink) {
  Shape s{.B = 1,
          .H = 4,
          .Hkv = 2,
          .nq = 9,
          .nkv = 200,
          .d = 64,
          .dv = 64,
          .seed = 90};
  const auto p = make_problem<float>(s);
  const std::vector<float> sinks = {1000.0f, 0.0f, 1e4f, -kInfF};
  AttentionOptions o;
  o.sinks = sinks;
  const AttnRef ref = reference(p, o);
  for (const auto& t : all_targets()) {
    softdot::force_simd_target(t);
    const Result r = run(p, o);
    Stats st;
    check_output(ref, r.o, r.lse.data(), "large sink [" + t + "]", st,
                 [](std::size_t, std::size_t h, std::size_t) {
                   return h == 0 || h == 2;
                 });
    for (std::size_t h : {0, 2}) {
      for (std::size_t i = 0; i < s.nq; ++i) {
        for (std::size_t c = 0; c < s.dv; ++c) {
          const float got = r.o.at(0, h, i, c);
          EXPECT_TRUE(std::fabs(got) <= 0x1p-126f)
              << "large sink [" << t << "] h=" << h << " i=" << i << " c=" << c
              << ": " << fmt(got);
        }
        const std::size_t row = ref.li(0, h, i);
        std::string why;
        double ratio = 0;
        EXPECT_TRUE(
            check_lse(r.lse[row], ref.lse[row], ref.D[row], &why, &ratio))
            << "large sink [" << t << "] lse h=" << h << " i=" << i << ": "
            << fmt(r.lse[row]) << " want " << fmt(double(ref.lse[row])) << ": "
            << why;
      }
    }
    if (t == all_targets().front())
      print_stats("f32 large sinks 1000/0/1e4/-inf " + s.str(), st);
  }
  softdot::force_simd_target("");
}

// Underflowing weights. A weight below 2^-126 (a score more than about 87
// below the max) is a subnormal float with an absolute, not relative,
// rounding error, and so is an output below 2^-126. With scores 0 and -g,
// V = [0, 1], the exact output is e^-g / (1 + e^-g); for g = 100 it is
// 3.72e-44, which float can only hold to within 2^-150 = 7e-46, far above
// (2 D + 70u) W + u|O*| = 2.4e-48. Hence attention.h's underflow term: each
// P_j = exp(s_j - m), each FMA of the value sum and the final output may
// round to the subnormal grid (absolute error 2^-150 each), so
//   |O - O*| <= (2 D + 70u) W + u|O*| + 2^-149 (n_kv + 1 + sum_j |V_jc|),
// which the reference's bound includes. It still fails if subnormals are
// flushed to zero (the error would then be |O*|, up to 2^-126). The test
// also prints whether the bound without the underflow term held.
TEST(AttentionAccuracy, UnderflowingWeights) {
  for (float g : {80.0f, 90.0f, 100.0f, 103.0f, 110.0f}) {
    Shape s{.nq = 1, .nkv = 2, .d = 1, .dv = 1, .seed = 1};
    auto p = make_problem<float>(s);
    p.q.at(0, 0, 0, 0) = 1.0f;
    p.k.at(0, 0, 0, 0) = 0.0f;
    p.k.at(0, 0, 1, 0) = -g;
    p.v.at(0, 0, 0, 0) = 0.0f;
    p.v.at(0, 0, 1, 0) = 1.0f;
    p.rewiden();
    AttentionOptions o;
    o.scale = 1.0;
    const AttnRef ref = reference(p, o);
    for (const auto& t : all_targets()) {
      softdot::force_simd_target(t);
      const Result r = run(p, o);
      const double err = double(std::fabs(LD(r.o.at(0, 0, 0, 0)) - ref.out[0]));
      const double bound = ref.bound[0];
      const double without = bound - 0x1p-149 * (2 + 1 + 1);
      EXPECT_LE(err, bound)
          << "gap " << g << " [" << t << "]: out " << fmt(r.o.at(0, 0, 0, 0))
          << ", exact " << fmt(double(ref.out[0]));
      if (t == all_targets().front()) {
        std::printf(
            "[ attn-err ] underflow: scores 0, -%-5g exact %.6g, got %.6g: "
            "err %.3g, bound without the underflow term %.3g (%s), "
            "attention.h bound %.3g\n",
            double(g), double(ref.out[0]), double(r.o.at(0, 0, 0, 0)), err,
            without, err <= without ? "holds" : "exceeded", bound);
      }
    }
    softdot::force_simd_target("");
  }
}

// A row with no visible key but a sink: the output is +0, and lse is the
// log of its denominator exp(sink) (the lse definition of attention.h),
// which is what lets such a part merge correctly (see
// AttentionMerge.SinkOnAFullyMaskedPart), as the header's special-value
// paragraph states.
TEST(AttentionOptions, SinkOnFullyMaskedRow) {
  Shape s{.B = 1,
          .H = 2,
          .Hkv = 1,
          .nq = 20,
          .nkv = 8,
          .d = 16,
          .dv = 16,
          .seed = 95};
  const auto p = make_problem<float>(s);
  const std::vector<float> sinks = {1.5f, -kInfF};
  AttentionOptions o;
  o.sinks = sinks;
  o.causal = true;  // rows 0..11 see nothing
  const Result r = run(p, o);
  for (std::size_t h = 0; h < 2; ++h) {
    for (std::size_t i = 0; i < 12; ++i) {
      for (std::size_t c = 0; c < s.dv; ++c) {
        EXPECT_EQ(bits(r.o.at(0, h, i, c)), 0u) << "h=" << h << " i=" << i;
      }
      const float want = h == 0 ? 1.5f : -kInfF;
      EXPECT_EQ(r.lse[h * s.nq + i], want)
          << "lse of a fully masked row with sink " << fmt(sinks[h])
          << ", h=" << h << " i=" << i;
    }
  }
}

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

// ---- attention_weights -----------------------------------------------------

template <class KV>
void weights_case(const std::string& label, const Problem<KV>& p,
                  const AttentionOptions& o) {
  const Shape& s = p.s;
  const AttnRef ref = reference(p, o, /*weights=*/true);
  const std::string what =
      std::string(kv_name<KV>()) + " weights " + label + " " + s.str();
  Tensor<float> w(s.B, s.H, s.nq, s.nkv, 3, kOutSentinel);
  softdot::attention_weights(p.q.cview(), p.k.cview(), w.view(), o);
  EXPECT_TRUE(padding_intact(w, kOutSentinel)) << what << ": wrote outside";
  const Result r = run(p, o);
  double wmax = 0, omax = 0;
  std::size_t failures = 0;
  for (std::size_t b = 0; b < s.B; ++b) {
    for (std::size_t h = 0; h < s.H; ++h) {
      const std::size_t hk = h / (s.H / s.Hkv);
      for (std::size_t i = 0; i < s.nq; ++i) {
        const std::size_t row = ref.li(b, h, i);
        const double D = ref.D[row];
        for (std::size_t j = 0; j < s.nkv; ++j) {
          const float got = w.at(b, h, i, j);
          const LD want = ref.weights[ref.wi(b, h, i, j)];
          bool ok;
          if (want == 0) {
            ok = bits(got) == 0u;  // masked, out of range: +0
          } else {
            // The scores' error D moves each weight by at most 2D
            // relative (exp(s_j - lse)); the weights are rounded once from
            // double: 3u covers that rounding and the double arithmetic.
            const double err = double(std::fabs(LD(got) - want) / want);
            ok = err <= 2 * D + 3 * kU;
            wmax = std::max(wmax, err / kU);
          }
          if (!ok && failures++ < kMaxMessages) {
            ADD_FAILURE() << what << ": weight[b=" << b << ",h=" << h
                          << ",i=" << i << ",j=" << j << "] = " << fmt(got)
                          << ", reference " << fmt(double(want)) << " (D "
                          << fmt(D) << ")";
          }
        }
        // The fused output against sum_j weights_j V_j, in long double.
        // attention_weights computes the same float scores as attention()
        // (attention.h), so the two differ only by attention()'s exp and
        // sums (70u W, from its bound with D = 0), the weights' rounding
        // (u W) and the output rounding: |O - sum w^ V| <= 72u W^ + u|O^|.
        // The bound of attention.h itself, (2D + 70u) W + u|O*| plus the
        // weights' (2D + 3u) W, would follow from the two checks above.
        for (std::size_t c = 0; c < s.dv; ++c) {
          LD acc = 0, aw = 0;
          for (std::size_t j = 0; j < s.nkv; ++j) {
            const LD x = p.vw.at(b, hk, j, c);
            const LD wj = w.at(b, h, i, j);
            if (wj == 0) continue;
            acc += wj * x;
            aw += wj * std::fabs(x);
          }
          const float got = r.o.at(b, h, i, c);
          const double err = double(std::fabs(LD(got) - acc));
          const double bound =
              72 * kU * double(aw) + kU * double(std::fabs(acc));
          if (aw > 0) omax = std::max(omax, err / (kU * double(aw)));
          if (!(err <= bound) && failures++ < kMaxMessages) {
            ADD_FAILURE() << what << ": out[b=" << b << ",h=" << h << ",i=" << i
                          << ",c=" << c << "] = " << fmt(got)
                          << ", sum_j weights_j V_j " << fmt(double(acc))
                          << ": error " << fmt(err) << " > " << fmt(bound);
          }
        }
      }
    }
  }
  std::printf(
      "[ attn-err ] %-62s weights err/(u w) max %7.3f  |O - w.V|/(u W) max "
      "%7.3f\n",
      what.c_str(), wmax, omax);
  std::fflush(stdout);
}

TEST(AttentionWeights, AgainstReferenceAndFused) {
  Shape s{.B = 2,
          .H = 4,
          .Hkv = 2,
          .nq = 9,
          .nkv = 130,
          .d = 64,
          .dv = 32,
          .pad = 1,
          .seed = 120};
  const auto p = make_problem<float>(s);
  const auto ph = make_problem<Float16>(s);
  const auto pb = make_problem<BFloat16>(s);
  weights_case<float>("plain", p, {});
  weights_case<Float16>("plain", ph, {});
  weights_case<BFloat16>("plain", pb, {});
  AttentionOptions o;
  o.causal = true;
  o.window_left = 60;
  const std::vector<float> sinks = {0.0f, -kInfF, 2.0f, 8.0f};
  o.sinks = sinks;
  weights_case<float>("causal window sinks", p, o);
  Tensor<bool> m = random_mask(1, 4, s.nq, s.nkv, 121);
  Tensor<float> bias(2, 1, s.nq, s.nkv, 0, kNaNF);
  std::mt19937_64 rng(122);
  std::uniform_real_distribution<double> u(-4, 4);
  bias.for_each([&](float& x) { x = float(u(rng)); });
  AttentionOptions o2;
  o2.mask = m.cview();
  o2.bias = bias.cview();
  o2.softcap = 2.5f;
  o2.kv_begin = 10;
  o2.kv_end = 100;
  weights_case<Float16>("mask bias softcap range", ph, o2);
  // Wide scores and a fully masked row region (causal with n_q > n_kv).
  Shape s2{.B = 1,
           .H = 2,
           .Hkv = 1,
           .nq = 80,
           .nkv = 65,
           .d = 64,
           .dv = 64,
           .qk = 3.0,
           .seed = 123};
  AttentionOptions o3;
  o3.causal = true;
  o3.scale = 0.25;
  weights_case<float>("wide causal nq>nkv", make_problem<float>(s2), o3);
}

TEST(AttentionWeights, SameScoresAsDecodeAndPrefillForms) {
  // Decode shapes (at most 16 query rows per KV head: attention() takes its
  // decode form), with scores near 640 whose last bits depend on the order
  // of the dot product's additions: the weights must come from the same
  // float scores as attention()'s (attention.h), which the second check
  // (|O - w.V| <= 72u W) sees. The same data through the prefill form
  // (18 rows per KV head) for comparison.
  for (std::size_t nq : {1, 8, 9}) {
    Shape sd{.B = 1,
             .H = 4,
             .Hkv = 2,
             .nq = nq,
             .nkv = 20,
             .d = 64,
             .dv = 16,
             .seed = 124};
    auto pd = make_problem<float>(sd);
    std::mt19937_64 r2(125);
    std::uniform_real_distribution<double> ku(1.0, 1.01);
    pd.q.for_each([](float& x) { x = 10.0f; });
    pd.k.for_each([&](float& x) { x = float(ku(r2)); });
    pd.rewiden();
    AttentionOptions od;
    od.scale = 1.0;
    const std::string form = nq <= 8 ? "decode form" : "prefill form";
    weights_case<float>("scores near 640, " + form, pd, od);
    if (nq == 9) {
      od.softcap = 800.0f;  // the same tanh bits in both
      weights_case<float>("scores near 640, softcap 800, " + form, pd, od);
    }
  }
}

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

// ---- reproducibility -------------------------------------------------------

// The same bits for 1, 2 and 3 threads, every FMA target, and other
// layouts (padding, misaligned starts) of the same values.
template <class KV>
void repro_case(const std::string& label, const Shape& s,
                const AttentionOptions& o) {
  const auto p = make_problem<KV>(s);
  Problem<KV> p2 = p;  // the same values, another layout
  p2.s.pad = s.pad + 3;
  p2.s.off = s.off + 1;
  p2.q = p.q.relayout(p2.s.pad, p2.s.off, kNaNF);
  p2.k = p.k.relayout(p2.s.pad, p2.s.off, from_float<KV>(kNaNF));
  p2.v = p.v.relayout(p2.s.pad, p2.s.off, from_float<KV>(kNaNF));
  std::vector<float> want;
  std::string first;
  int configurations = 0;
  for (const auto& t : fma_targets()) {
    softdot::force_simd_target(t);
    for (int threads : {1, 2, 3}) {
      for (int layout = 0; layout < 2; ++layout) {
        if (layout == 1 && threads != 2) continue;
        const auto got = with_threads(
            threads, [&] { return (layout ? run(p2, o) : run(p, o)).all(); });
        const std::string where = t + ", " + std::to_string(threads) +
                                  " threads" + (layout ? ", other layout" : "");
        ++configurations;
        if (want.empty()) {
          want = got;
          first = where;
          continue;
        }
        EXPECT_TRUE(SameBits(got, want)) << kv_name<KV>() << " " << label
                                         << ": " << where << " vs " << first;
      }
    }
  }
  softdot::force_simd_target("");
  std::printf("[ attn-rep ] %s %s %s: %d configurations compared\n",
              kv_name<KV>(), label.c_str(), s.str().c_str(), configurations);
  EXPECT_GE(configurations, 2);
}

TEST(AttentionReproducible, ThreadsTargetsLayouts) {
  const Shape prefill{.B = 1,
                      .H = 2,
                      .Hkv = 2,
                      .nq = 300,
                      .nkv = 300,
                      .d = 64,
                      .dv = 64,
                      .seed = 300};
  repro_case<float>("prefill", prefill, {});
  AttentionOptions causal;
  causal.causal = true;
  repro_case<float>("prefill causal", prefill, causal);
  repro_case<BFloat16>("prefill causal", prefill, causal);
  const Shape decode{.B = 1,
                     .H = 8,
                     .Hkv = 2,
                     .nq = 1,
                     .nkv = 5000,
                     .d = 128,
                     .dv = 128,
                     .seed = 301};
  repro_case<float>("decode", decode, {});
  repro_case<Float16>("decode", decode, {});
  AttentionOptions w;
  w.window_left = 3000;
  w.causal = true;
  const std::vector<float> sinks = {0.5f, 1.0f, -1.0f,  2.0f,
                                    0.0f, 3.0f, -kInfF, 1.5f};
  w.sinks = sinks;
  repro_case<float>("decode window sinks", decode, w);
  Shape decode4 = decode;
  decode4.nq = 4;
  decode4.nkv = 2100;
  repro_case<float>("decode 4 rows", decode4, causal);
}

// ---- errors ----------------------------------------------------------------

// Runs f, which must throw std::invalid_argument whose message contains
// every string of `needles`.
template <class F>
void expect_invalid(const std::string& what, F f,
                    const std::vector<std::string>& needles = {}) {
  try {
    f();
    ADD_FAILURE() << what << ": did not throw";
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    EXPECT_FALSE(msg.empty()) << what;
    for (const auto& n : needles) {
      EXPECT_NE(msg.find(n), std::string::npos)
          << what << ": the message \"" << msg << "\" does not name " << n;
    }
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": threw something else: " << e.what();
  }
}

TEST(AttentionErrors, Shapes) {
  std::vector<float> buf(1 << 16, 0.5f);
  std::vector<float> out(1 << 16);
  std::vector<Float16> hbuf(1 << 16, softdot::to_float16(0.5f));
  float* o = out.data();
  const float* d = buf.data();
  using CV = TensorView<const float>;
  using OV = TensorView<float>;
  expect_invalid("q/k d differ",
                 [&] {
                   softdot::attention(CV(d, 1, 1, 4, 13), CV(d, 1, 1, 5, 17),
                                      CV(d, 1, 1, 5, 8), OV(o, 1, 1, 4, 8));
                 },
                 {"13", "17"});
  expect_invalid("k/v n_kv differ",
                 [&] {
                   softdot::attention(CV(d, 1, 1, 4, 8), CV(d, 1, 1, 23, 8),
                                      CV(d, 1, 1, 29, 8), OV(o, 1, 1, 4, 8));
                 },
                 {"23", "29"});
  expect_invalid("k/v n_kv differ (f16)",
                 [&] {
                   using HV = TensorView<const Float16>;
                   softdot::attention(
                       CV(d, 1, 1, 4, 8), HV(hbuf.data(), 1, 1, 23, 8),
                       HV(hbuf.data(), 1, 1, 29, 8), OV(o, 1, 1, 4, 8));
                 },
                 {"23", "29"});
  expect_invalid("H not a multiple of H_kv",
                 [&] {
                   softdot::attention(CV(d, 1, 21, 2, 8), CV(d, 1, 10, 3, 8),
                                      CV(d, 1, 10, 3, 8), OV(o, 1, 21, 2, 8));
                 },
                 {"21", "10"});
  expect_invalid("k/v heads differ",
                 [&] {
                   softdot::attention(CV(d, 1, 12, 2, 8), CV(d, 1, 6, 3, 8),
                                      CV(d, 1, 4, 3, 8), OV(o, 1, 12, 2, 8));
                 },
                 {"6", "4"});
  expect_invalid("batch differs",
                 [&] {
                   softdot::attention(CV(d, 31, 1, 2, 8), CV(d, 37, 1, 3, 8),
                                      CV(d, 37, 1, 3, 8), OV(o, 31, 1, 2, 8));
                 },
                 {"31", "37"});
  expect_invalid("out rows",
                 [&] {
                   softdot::attention(CV(d, 1, 1, 41, 8), CV(d, 1, 1, 3, 8),
                                      CV(d, 1, 1, 3, 8), OV(o, 1, 1, 43, 8));
                 },
                 {"41", "43"});
  expect_invalid("out cols",
                 [&] {
                   softdot::attention(CV(d, 1, 1, 4, 8), CV(d, 1, 1, 3, 8),
                                      CV(d, 1, 1, 3, 47), OV(o, 1, 1, 4, 53));
                 },
                 {"47", "53"});
  expect_invalid("out heads", [&] {
    softdot::attention(CV(d, 1, 4, 4, 8), CV(d, 1, 2, 3, 8), CV(d, 1, 2, 3, 8),
                       OV(o, 1, 2, 4, 8));
  });
  expect_invalid("d = 0", [&] {
    softdot::attention(CV(d, 1, 1, 4, 0), CV(d, 1, 1, 3, 0), CV(d, 1, 1, 3, 8),
                       OV(o, 1, 1, 4, 8));
  });
  expect_invalid("n_q = 0", [&] {
    softdot::attention(CV(d, 1, 1, 0, 8), CV(d, 1, 1, 3, 8), CV(d, 1, 1, 3, 8),
                       OV(o, 1, 1, 0, 8));
  });
  expect_invalid("row stride < cols", [&] {
    softdot::attention(CV(d, 1, 1, 4, 8, 32, 32, 5), CV(d, 1, 1, 3, 8),
                       CV(d, 1, 1, 3, 8), OV(o, 1, 1, 4, 8));
  });
  {
    std::unique_ptr<bool[]> mask(new bool[1 << 14]());
    AttentionOptions mo;
    mo.mask = TensorView<const bool>(mask.get(), 1, 1, 4, 59);
    expect_invalid("mask cols",
                   [&] {
                     softdot::attention(CV(d, 1, 1, 4, 8), CV(d, 1, 1, 61, 8),
                                        CV(d, 1, 1, 61, 8), OV(o, 1, 1, 4, 8),
                                        mo);
                   },
                   {"59", "61"});
    mo.mask = TensorView<const bool>(mask.get(), 1, 1, 67, 5);
    expect_invalid("mask rows",
                   [&] {
                     softdot::attention(CV(d, 1, 1, 71, 8), CV(d, 1, 1, 5, 8),
                                        CV(d, 1, 1, 5, 8), OV(o, 1, 1, 71, 8),
                                        mo);
                   },
                   {"67", "71"});
    mo.mask = TensorView<const bool>(mask.get(), 1, 3, 4, 5);
    expect_invalid("mask heads (neither 1 nor H)", [&] {
      softdot::attention(CV(d, 1, 4, 4, 8), CV(d, 1, 2, 5, 8),
                         CV(d, 1, 2, 5, 8), OV(o, 1, 4, 4, 8), mo);
    });
    mo.mask = TensorView<const bool>(mask.get(), 3, 1, 4, 5);
    expect_invalid("mask batch (neither 1 nor B)", [&] {
      softdot::attention(CV(d, 2, 1, 4, 8), CV(d, 2, 1, 5, 8),
                         CV(d, 2, 1, 5, 8), OV(o, 2, 1, 4, 8), mo);
    });
    AttentionOptions bo;
    bo.bias = CV(d, 1, 1, 4, 73);
    expect_invalid("bias cols",
                   [&] {
                     softdot::attention(CV(d, 1, 1, 4, 8), CV(d, 1, 1, 79, 8),
                                        CV(d, 1, 1, 79, 8), OV(o, 1, 1, 4, 8),
                                        bo);
                   },
                   {"73", "79"});
  }
  {
    const std::vector<float> sinks(11, 0.0f);
    AttentionOptions so;
    so.sinks = sinks;
    expect_invalid("sinks size",
                   [&] {
                     softdot::attention(CV(d, 1, 12, 2, 8), CV(d, 1, 12, 3, 8),
                                        CV(d, 1, 12, 3, 8), OV(o, 1, 12, 2, 8),
                                        so);
                   },
                   {"11", "12"});
  }
  // attention_weights: weights [B, H, n_q, n_kv].
  expect_invalid("weights cols",
                 [&] {
                   softdot::attention_weights(CV(d, 1, 1, 4, 8),
                                              CV(d, 1, 1, 83, 8),
                                              OV(o, 1, 1, 4, 89));
                 },
                 {"83", "89"});
  expect_invalid("weights rows", [&] {
    softdot::attention_weights(CV(d, 1, 1, 4, 8), CV(d, 1, 1, 5, 8),
                               OV(o, 1, 1, 7, 5));
  });
  // attention_merge: shapes of o_a, o_b, out equal.
  std::vector<float> la(64, 0.0f), lb(64, 0.0f), lo(64);
  expect_invalid("merge o_b cols",
                 [&] {
                   softdot::attention_merge(CV(d, 1, 1, 4, 97), la.data(),
                                            CV(d, 1, 1, 4, 101), lb.data(),
                                            OV(o, 1, 1, 4, 97), lo.data());
                 },
                 {"97", "101"});
  expect_invalid("merge out rows", [&] {
    softdot::attention_merge(CV(d, 1, 1, 4, 8), la.data(), CV(d, 1, 1, 4, 8),
                             lb.data(), OV(o, 1, 1, 5, 8), lo.data());
  });
}

TEST(AttentionErrors, Options) {
  std::vector<float> buf(4096, 0.5f);
  std::vector<float> out(4096);
  using CV = TensorView<const float>;
  const CV q(buf.data(), 1, 1, 4, 8), k(buf.data(), 1, 1, 5, 8);
  const TensorView<float> o(out.data(), 1, 1, 4, 8);
  const TensorView<float> w(out.data(), 1, 1, 4, 5);
  auto both = [&](const std::string& what, const AttentionOptions& opt) {
    expect_invalid(what, [&] { softdot::attention(q, k, k, o, opt); });
    expect_invalid(what + " (weights)",
                   [&] { softdot::attention_weights(q, k, w, opt); });
  };
  const double inf = std::numeric_limits<double>::infinity();
  for (double scale : {0.0, -0.0, -1.0, inf, -inf, 1e-50, 1e39}) {
    AttentionOptions opt;
    opt.scale = scale;
    both("scale " + fmt(scale), opt);
  }
  for (float cap : {-1.0f, -kInfF, kInfF, kNaNF}) {
    AttentionOptions opt;
    opt.softcap = cap;
    both("softcap " + fmt(cap), opt);
  }
  for (std::ptrdiff_t wdw : {-2, -5, -1000}) {
    AttentionOptions opt;
    opt.window_left = wdw;
    both("window_left " + std::to_string(wdw), opt);
    AttentionOptions opt2;
    opt2.window_right = wdw;
    both("window_right " + std::to_string(wdw), opt2);
  }
  // The valid edge cases are accepted.
  AttentionOptions ok;
  ok.scale = 1e-30;
  ok.window_left = 0;
  ok.window_right = 0;
  ok.softcap = 0;
  EXPECT_NO_THROW(softdot::attention(q, k, k, o, ok));
}

}  // namespace
}  // namespace softdot_test
