// Shared by the attention test files (attention_*_test.cc): element types,
// strided tensors with guard padding, problems, running softdot with a
// thread count, and checking outputs against the long-double reference
// within the bound of include/softdot/attention.h.
#ifndef SOFTDOT_TESTS_UNIT_ATTENTION_TEST_UTIL_H_
#define SOFTDOT_TESTS_UNIT_ATTENTION_TEST_UTIL_H_

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
#include "softdot/attention.h"
#include "test_util.h"

namespace softdot_test {

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
  Tensor(Tensor&&) noexcept = default;
  Tensor& operator=(Tensor&&) noexcept = default;

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
inline bool padding_intact(const Tensor<float>& t, float sentinel) {
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

inline softdot_ref::AttnRefOptions to_ref(const AttentionOptions& o) {
  softdot_ref::AttnRefOptions r;
  r.scale = o.scale.value_or(std::numeric_limits<double>::quiet_NaN());
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
  r.precise = o.precise;
  return r;
}

template <class KV>
AttnRef reference(const Problem<KV>& p, const AttentionOptions& o,
                  bool weights = false) {
  return softdot_ref::attention_reference(p.q.ref(), p.kw.ref(), p.vw.ref(),
                                          to_ref(o), weights);
}

// Runs f, which must throw std::invalid_argument whose message contains
// every string of `needles`.
template <class F>
inline void expect_invalid(const std::string& what, F f,
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

inline std::vector<std::string> all_targets() {
  return softdot::simd_targets();
}
inline std::vector<std::string> fma_targets() {
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
inline double lse_bound(double D, LD lse) {
  return D + 70 * kU + 2 * kU * double(std::fabs(lse));
}

inline bool check_lse(float got, LD want, double D, std::string* why,
                      double* ratio) {
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
inline void check_output(const AttnRef& ref, const Tensor<float>& out,
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

inline void print_stats(const std::string& label, const Stats& st) {
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

// A random mask in [mb, mh, n_q, n_kv] with about 30% false.
inline Tensor<bool> random_mask(std::size_t mb, std::size_t mh, std::size_t nq,
                                std::size_t nkv, std::uint64_t seed,
                                double p_false = 0.3) {
  Tensor<bool> m(mb, mh, nq, nkv, 2, true);
  std::mt19937_64 rng(seed);
  std::bernoulli_distribution f(p_false);
  m.for_each([&](bool& x) { x = !f(rng); });
  return m;
}

}  // namespace softdot_test

#endif  // SOFTDOT_TESTS_UNIT_ATTENTION_TEST_UTIL_H_
