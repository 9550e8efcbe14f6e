// softdot: attention(), attention_merge(), attention_weights(): argument
// checks, the split into kernel calls, threads, and the final normalisation.
//
// Work split. For every batch b and KV head kh, the query rows of the g
// query heads that share kh are numbered r = (h - kh g) n_q + i and cut into
// blocks of at most AttentionMaxRows() rows (64 on AVX-512); each block runs
// the kernel once over its whole key range (prefill), so K and V are read
// once per block for all g heads. When a KV head has at most
// kDecodeRows rows (decode: n_q small), the key range is instead cut into
// chunks of kDecodeChunk keys, each chunk's state is computed separately
// (in parallel), and the states are merged in chunk order. Both choices
// depend only on the shapes, never on the thread count or the SIMD target,
// so the bits do not either.
#include "softdot/attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "check.h"
#include "kernels.h"
#include "kernels/attention_args.h"

namespace softdot {

namespace {

using detail::count;
using detail::fail;
using detail::number;

// Decode split: chunk size, and the most rows per KV head that use it.
constexpr std::size_t kDecodeChunk = 512;
constexpr std::size_t kDecodeRows = detail::kDecodeMaxRows;

std::string shape(const char* name, std::size_t b, std::size_t h, std::size_t r,
                  std::size_t c) {
  return std::string(name) + " [" + count(b) + ", " + count(h) + ", " +
         count(r) + ", " + count(c) + "]";
}
template <class T>
std::string shape(const char* name, const TensorView<T>& t) {
  return shape(name, t.batch, t.heads, t.rows, t.cols);
}

template <class T>
void check_tensor(const char* fn, const char* name, const TensorView<T>& t) {
  if (t.data == nullptr && t.batch * t.heads * t.rows * t.cols != 0) {
    fail(fn, shape(name, t) + " has null data");
  }
  if (t.rows > 1 && t.row_stride < t.cols) {
    fail(fn, shape(name, t) + " has row_stride " + count(t.row_stride) +
                 " < cols " + count(t.cols));
  }
}

template <class KT>
constexpr int kv_type() {
  if constexpr (std::is_same_v<KT, Float16>) return detail::kKvF16;
  if constexpr (std::is_same_v<KT, BFloat16>) return detail::kKvBF16;
  return detail::kKvF32;
}

// Everything the row loop needs, checked.
struct Plan {
  std::size_t B, H, Hkv, g, n_q, n_kv, d, dv;
  std::size_t kv_begin, kv_end;
  float scale, softcap;
  std::int64_t wl, wr;  // -1: unbounded
};

template <class KT>
Plan check_and_plan(const char* fn, const TensorView<const float>& q,
                    const TensorView<const KT>& k,
                    const TensorView<const KT>* v, const TensorView<float>& out,
                    const char* out_name, std::size_t out_cols,
                    const AttentionOptions& o) {
  check_tensor(fn, "q", q);
  check_tensor(fn, "k", k);
  if (v != nullptr) check_tensor(fn, "v", *v);
  check_tensor(fn, out_name, out);
  if (q.rows == 0 || q.cols == 0) fail(fn, shape("q", q) + " is empty");
  if (k.batch != q.batch) {
    fail(fn, shape("k", k) + " has batch " + count(k.batch) + " but " +
                 shape("q", q) + " has batch " + count(q.batch));
  }
  if (k.cols != q.cols) {
    fail(fn, shape("k", k) + " has d = " + count(k.cols) + " but " +
                 shape("q", q) + " has d = " + count(q.cols));
  }
  if (k.heads == 0 || q.heads == 0 || q.heads % k.heads != 0) {
    fail(fn, shape("q", q) + " has " + count(q.heads) +
                 " heads, not a multiple of the " + count(k.heads) +
                 " heads of " + shape("k", k));
  }
  std::size_t dv = out_cols;
  if (v != nullptr) {
    if (v->batch != k.batch || v->heads != k.heads || v->rows != k.rows) {
      fail(fn, shape("v", *v) + " does not match " + shape("k", k) +
                   " in batch, heads and keys");
    }
    if (v->cols == 0) fail(fn, shape("v", *v) + " has d_v = 0");
    dv = v->cols;
  }
  if (out.batch != q.batch || out.heads != q.heads || out.rows != q.rows ||
      out.cols != dv) {
    fail(fn, shape(out_name, out) + " must be " +
                 shape(out_name, q.batch, q.heads, q.rows, dv) + " for " +
                 shape("q", q) + " and " + shape(v ? "v" : "k", v ? *v : k));
  }
  constexpr std::size_t kMaxIndex = std::size_t{1} << 30;
  if (k.rows >= kMaxIndex || q.rows >= kMaxIndex) {
    fail(fn, "n_q = " + count(q.rows) + " and n_kv = " + count(k.rows) +
                 " must be below 2^30");
  }
  Plan p{};
  p.B = q.batch;
  p.H = q.heads;
  p.Hkv = k.heads;
  p.g = q.heads / k.heads;
  p.n_q = q.rows;
  p.n_kv = k.rows;
  p.d = q.cols;
  p.dv = dv;
  // Scale.
  double scale = o.scale;
  if (std::isnan(scale)) scale = 1.0 / std::sqrt(static_cast<double>(p.d));
  const float sf = static_cast<float>(scale);
  if (!(scale > 0.0) || !std::isfinite(scale) || !(sf > 0.0f) ||
      !std::isfinite(sf)) {
    fail(fn, "scale must be finite and > 0 (also as a float), got " +
                 number(o.scale));
  }
  p.scale = sf;
  if (!(o.softcap >= 0.0f) || !std::isfinite(o.softcap)) {
    fail(fn, "softcap must be finite and >= 0, got " + number(o.softcap));
  }
  p.softcap = o.softcap;
  if (o.window_left < -1 || o.window_right < -1) {
    fail(fn, "window_left and window_right must be >= -1, got " +
                 std::to_string(o.window_left) + " and " +
                 std::to_string(o.window_right));
  }
  p.wl = o.window_left;
  p.wr = o.window_right;
  if (o.causal && (p.wr < 0 || p.wr > 0)) p.wr = 0;
  p.kv_end = std::min(o.kv_end, p.n_kv);
  p.kv_begin = o.kv_begin;
  if (p.kv_begin > p.kv_end) {
    fail(fn, "kv_begin " + count(o.kv_begin) + " is past kv_end " +
                 count(p.kv_end) + " (n_kv = " + count(p.n_kv) + ")");
  }
  auto check_extra = [&](const char* name, auto& t) {
    if (t.data == nullptr) return;
    if (t.rows != p.n_q || t.cols != p.n_kv) {
      fail(fn, shape(name, t) + " must have n_q x n_kv = " + count(p.n_q) +
                   " x " + count(p.n_kv) + " rows and cols (" + shape("q", q) +
                   ", " + shape("k", k) + ")");
    }
    if ((t.batch != 1 && t.batch != p.B) || (t.heads != 1 && t.heads != p.H)) {
      fail(fn, shape(name, t) + " must have batch 1 or " + count(p.B) +
                   " and heads 1 or " + count(p.H) + " (" + shape("q", q) +
                   ")");
    }
  };
  check_extra("mask", o.mask);
  check_extra("bias", o.bias);
  if (!o.sinks.empty() && o.sinks.size() != p.H) {
    fail(fn, "sinks has " + count(o.sinks.size()) + " values but " +
                 shape("q", q) + " has " + count(p.H) + " heads");
  }
  return p;
}

// A per-thread buffer that only grows, so that repeated calls (decode
// steps) do not allocate, zero and fault in about 200 KB every time (a
// throwaway loop: a 64-key decode of 2 heads took 7.5 us with per-call
// vectors and 6.1 us with these buffers, before the OpenMP change below
// took off another 2 us). Slot 0: the calling thread's chunk states; slot
// 1: kernel scratch. Uninitialised.
template <class T>
T* thread_buffer(int slot, std::size_t n) {
  struct Buf {
    std::unique_ptr<double[]> p;
    std::size_t size = 0;
  };
  thread_local Buf bufs[2];
  Buf& b = bufs[slot];
  const std::size_t doubles =
      (n * sizeof(T) + sizeof(double) - 1) / sizeof(double);
  if (b.size < doubles) {
    b.p.reset(new double[doubles]);
    b.size = doubles;
  }
  return reinterpret_cast<T*>(b.p.get());
}

// Visible keys of query i: [lo, hi] (inclusive), clamped to the key range.
void limits(const Plan& p, std::size_t i, std::int32_t& lo, std::int32_t& hi) {
  const auto pos = static_cast<std::int64_t>(i) +
                   static_cast<std::int64_t>(p.n_kv) -
                   static_cast<std::int64_t>(p.n_q);
  std::int64_t a = static_cast<std::int64_t>(p.kv_begin);
  std::int64_t b = static_cast<std::int64_t>(p.kv_end) - 1;
  if (p.wl >= 0) a = std::max(a, pos - p.wl);
  if (p.wr >= 0) b = std::min(b, pos + p.wr);
  a = std::min<std::int64_t>(a, static_cast<std::int64_t>(p.n_kv));
  b = std::max<std::int64_t>(b, -1);
  lo = static_cast<std::int32_t>(a);
  hi = static_cast<std::int32_t>(b);
}

// One row's state -> its output and lse.
void finalize(float m, double l, const double* o, std::size_t dv, float* out,
              float* lse) {
  if (std::isnan(l)) {
    std::fill(out, out + dv, std::numeric_limits<float>::quiet_NaN());
    if (lse) *lse = std::numeric_limits<float>::quiet_NaN();
  } else if (l == 0.0) {
    std::fill(out, out + dv, 0.0f);
    if (lse) *lse = -std::numeric_limits<float>::infinity();
  } else {
    for (std::size_t c = 0; c < dv; ++c) {
      out[c] = static_cast<float>(o[c] / l);
    }
    if (lse) *lse = static_cast<float>(static_cast<double>(m) + std::log(l));
  }
}

// a = merge(a, b) for row states (double arithmetic).
void merge_state(float& ma, double& la, double* oa, float mb, double lb,
                 const double* ob, std::size_t dv) {
  if (std::isnan(la)) return;
  if (std::isnan(lb)) {
    la = lb;
    return;
  }
  if (lb == 0.0) return;
  if (la == 0.0) {
    ma = mb;
    la = lb;
    std::copy(ob, ob + dv, oa);
    return;
  }
  const float m = std::max(ma, mb);
  const double wa = ma == m ? 1.0 : std::exp(static_cast<double>(ma) - m);
  const double wb = mb == m ? 1.0 : std::exp(static_cast<double>(mb) - m);
  for (std::size_t c = 0; c < dv; ++c) oa[c] = oa[c] * wa + ob[c] * wb;
  la = la * wa + lb * wb;
  ma = m;
}

template <class KT>
void run_attention(const TensorView<const float>& q,
                   const TensorView<const KT>& k, const TensorView<const KT>& v,
                   const TensorView<float>& out, const AttentionOptions& o,
                   float* lse) {
  const char* fn = "attention";
  const Plan p = check_and_plan(fn, q, k, &v, out, "out", 0, o);
  const std::size_t rows_per_kvh = p.g * p.n_q;
  const std::size_t max_rows = detail::attention_max_rows();
  const bool split = rows_per_kvh <= kDecodeRows;
  const std::size_t row_blocks =
      split ? 1 : (rows_per_kvh + max_rows - 1) / max_rows;
  const std::size_t range = p.kv_end - p.kv_begin;
  const std::size_t chunks =
      split
          ? std::max<std::size_t>(1, (range + kDecodeChunk - 1) / kDecodeChunk)
          : 1;
  const std::size_t tasks = p.B * p.Hkv * row_blocks * chunks;
  const std::size_t dv = p.dv;

  // Per-thread scratch and row tables; states of the split chunks.
  const int threads = omp_get_max_threads();
  const std::size_t scratch_floats = detail::attention_scratch_floats(p.d, dv);
  const std::size_t rows_cap = std::min(max_rows, detail::kMaxKernelRows);
  const std::size_t state_rows = split ? rows_per_kvh : rows_cap;
  const std::size_t state_slots =
      split ? tasks : static_cast<std::size_t>(threads);
  // The states live in the calling thread's reusable buffer.
  const std::size_t n_states = state_slots * state_rows;
  double* states = thread_buffer<double>(0, n_states * (dv + 2));
  double* st_l = states;
  double* st_o = states + n_states;
  float* st_m = reinterpret_cast<float*>(states + n_states * (dv + 1));

  const double work = static_cast<double>(p.B * p.H * p.n_q) *
                      static_cast<double>(range) *
                      static_cast<double>(p.d + dv);
  const bool parallel = tasks > 1 && work >= 4.0 * detail::kParallelElements;

  std::exception_ptr error;
  bool failed = false;
  auto run_task = [&](std::size_t t) {
    if (failed) return;
    // Only the scratch allocation can throw (std::bad_alloc); an exception
    // must not leave an OpenMP region, so it is carried out.
    float* scratch_ptr = nullptr;
    try {
      scratch_ptr = thread_buffer<float>(1, scratch_floats);
    } catch (...) {
#pragma omp critical(softdot_attention_error)
      {
        if (!failed) error = std::current_exception();
        failed = true;
      }
      return;
    }
    const int tid = omp_get_thread_num();
    std::size_t rest = t;
    const std::size_t chunk = rest % chunks;
    rest /= chunks;
    const std::size_t rb = rest % row_blocks;
    rest /= row_blocks;
    const std::size_t kh = rest % p.Hkv;
    const std::size_t b = rest / p.Hkv;
    const std::size_t r0 = rb * max_rows;
    const std::size_t nr =
        split ? rows_per_kvh : std::min(max_rows, rows_per_kvh - r0);

    const std::size_t slot = split ? t : static_cast<std::size_t>(tid);
    float* out_m = st_m + slot * state_rows;
    double* out_l = st_l + slot * state_rows;
    double* out_o = st_o + slot * state_rows * dv;
    // Kernel calls of at most max_rows rows (a split KV head may have more
    // rows than a scalar target's kernel takes).
    const std::size_t step = split ? detail::kDecodeMaxRows : max_rows;
    for (std::size_t s0 = 0; s0 < nr; s0 += step) {
      const std::size_t cnt = std::min(step, nr - s0);
      const float* q_rows[detail::kMaxKernelRows];
      std::int32_t lo[detail::kMaxKernelRows], hi[detail::kMaxKernelRows];
      const std::uint8_t* mrows[detail::kMaxKernelRows] = {};
      const float* brows[detail::kMaxKernelRows] = {};
      float sinks[detail::kMaxKernelRows] = {};
      for (std::size_t r = 0; r < cnt; ++r) {
        const std::size_t row = r0 + s0 + r;
        const std::size_t h = kh * p.g + row / p.n_q;
        const std::size_t i = row % p.n_q;
        q_rows[r] = q.row(b, h, i);
        limits(p, i, lo[r], hi[r]);
        if (!o.mask.empty()) {
          const std::size_t mb = o.mask.batch == 1 ? 0 : b;
          const std::size_t mh = o.mask.heads == 1 ? 0 : h;
          mrows[r] =
              reinterpret_cast<const std::uint8_t*>(o.mask.row(mb, mh, i));
        }
        if (!o.bias.empty()) {
          const std::size_t bb = o.bias.batch == 1 ? 0 : b;
          const std::size_t bh = o.bias.heads == 1 ? 0 : h;
          brows[r] = o.bias.row(bb, bh, i);
        }
        if (!o.sinks.empty()) sinks[r] = o.sinks[h];
      }
      detail::AttnArgs a;
      a.kv_type = kv_type<KT>();
      a.k = k.row(b, kh, 0);
      a.k_stride = k.row_stride;
      a.v = v.row(b, kh, 0);
      a.v_stride = v.row_stride;
      a.d = p.d;
      a.dv = dv;
      a.j_begin = p.kv_begin + chunk * kDecodeChunk;
      a.j_end = split ? std::min(p.kv_end, a.j_begin + kDecodeChunk) : p.kv_end;
      a.scale = p.scale;
      a.softcap = p.softcap;
      a.rows = cnt;
      a.decode = split;
      a.q_rows = q_rows;
      a.lo = lo;
      a.hi = hi;
      a.mask_rows = o.mask.empty() ? nullptr : mrows;
      a.bias_rows = o.bias.empty() ? nullptr : brows;
      // With a split, the sinks go into the first chunk only.
      a.sinks = (!o.sinks.empty() && chunk == 0) ? sinks : nullptr;
      a.scratch = scratch_ptr;
      a.out_m = out_m + s0;
      a.out_l = out_l + s0;
      a.out_o = out_o + s0 * dv;
      // An empty range (j_begin >= j_end) runs no block: the kernel returns
      // the initial state, the identity or the sink alone.
      detail::attention_kernel(a);
    }
    if (!split) {
      for (std::size_t r = 0; r < nr; ++r) {
        const std::size_t h = kh * p.g + (r0 + r) / p.n_q;
        const std::size_t i = (r0 + r) % p.n_q;
        float* lp = lse ? lse + (b * p.H + h) * p.n_q + i : nullptr;
        finalize(out_m[r], out_l[r], out_o + r * dv, dv, out.row(b, h, i), lp);
      }
    }
  };
  // A parallel region costs about 2 us even with if(false) (a throwaway
  // loop: a one-key call took 2.5 us with it), so small calls run the loop
  // directly (BM_attention_one_key: 0.19 us).
  if (parallel) {
#pragma omp parallel for schedule(dynamic, 1)
    for (std::size_t t = 0; t < tasks; ++t) run_task(t);
  } else {
    for (std::size_t t = 0; t < tasks; ++t) run_task(t);
  }
  if (failed) std::rethrow_exception(error);
  if (!split) return;

  // Merge the chunk states in chunk order, per (batch, KV head).
  const std::size_t groups = p.B * p.Hkv;
  auto merge_group = [&](std::size_t gi) {
    const std::size_t b = gi / p.Hkv, kh = gi % p.Hkv;
    const std::size_t base = gi * chunks;
    for (std::size_t r = 0; r < rows_per_kvh; ++r) {
      float m = st_m[base * state_rows + r];
      double l = st_l[base * state_rows + r];
      double* acc = st_o + (base * state_rows + r) * dv;
      for (std::size_t c = 1; c < chunks; ++c) {
        const std::size_t s = (base + c) * state_rows + r;
        merge_state(m, l, acc, st_m[s], st_l[s], st_o + s * dv, dv);
      }
      const std::size_t h = kh * p.g + r / p.n_q;
      const std::size_t i = r % p.n_q;
      float* lp = lse ? lse + (b * p.H + h) * p.n_q + i : nullptr;
      finalize(m, l, acc, dv, out.row(b, h, i), lp);
    }
  };
  if (parallel && groups > 1) {
#pragma omp parallel for schedule(static)
    for (std::size_t gi = 0; gi < groups; ++gi) merge_group(gi);
  } else {
    for (std::size_t gi = 0; gi < groups; ++gi) merge_group(gi);
  }
}

template <class KT>
void run_weights(const TensorView<const float>& q,
                 const TensorView<const KT>& k, const TensorView<float>& w,
                 const AttentionOptions& o) {
  const char* fn = "attention_weights";
  const Plan p = check_and_plan<KT>(fn, q, k, nullptr, w, "weights", k.rows, o);
  constexpr float kInf = std::numeric_limits<float>::infinity();
  std::vector<float> s(p.n_kv);
  std::vector<char> vis(p.n_kv);
  std::vector<float> krow_f(p.n_kv * p.d);
  std::vector<float> score_scratch(detail::attention_score_scratch(p.d));
  // The form attention() takes for these shapes decides how scores round.
  const bool decode = p.g * p.n_q <= kDecodeRows;
  for (std::size_t b = 0; b < p.B; ++b) {
    for (std::size_t h = 0; h < p.H; ++h) {
      const std::size_t kh = h / p.g;
      for (std::size_t j = 0; j < p.n_kv; ++j) {
        const KT* kr = k.row(b, kh, j);
        for (std::size_t c = 0; c < p.d; ++c) {
          if constexpr (std::is_same_v<KT, float>) {
            krow_f[j * p.d + c] = kr[c];
          } else {
            krow_f[j * p.d + c] = to_float(kr[c]);
          }
        }
      }
      for (std::size_t i = 0; i < p.n_q; ++i) {
        const float* qr = q.row(b, h, i);
        std::int32_t lo, hi;
        limits(p, i, lo, hi);
        for (std::size_t j = 0; j < p.n_kv; ++j) {
          s[j] = detail::attention_score(qr, krow_f.data() + j * p.d, p.d,
                                         decode, score_scratch.data()) *
                 p.scale;
        }
        if (p.softcap > 0.0f)
          detail::attention_softcap(s.data(), p.n_kv, p.softcap);
        for (std::size_t j = 0; j < p.n_kv; ++j) {
          const auto jj = static_cast<std::int32_t>(j);
          bool keep = jj >= lo && jj <= hi;
          if (!o.bias.empty()) {
            const float bv = o.bias.row(o.bias.batch == 1 ? 0 : b,
                                        o.bias.heads == 1 ? 0 : h, i)[j];
            if (bv == -kInf) keep = false;
            s[j] = s[j] + bv;
          }
          if (!o.mask.empty() && !o.mask.row(o.mask.batch == 1 ? 0 : b,
                                             o.mask.heads == 1 ? 0 : h, i)[j]) {
            keep = false;
          }
          vis[j] = keep;
        }
        float* out = w.row(b, h, i);
        const bool has_sink = !o.sinks.empty();
        const float sink = has_sink ? o.sinks[h] : -kInf;
        bool nan = std::isnan(sink);
        float m = sink;
        std::size_t n_inf = sink == kInf ? 1 : 0;
        for (std::size_t j = 0; j < p.n_kv; ++j) {
          if (!vis[j]) continue;
          if (std::isnan(s[j])) nan = true;
          m = std::max(m, s[j]);
          if (s[j] == kInf) ++n_inf;
        }
        if (nan) {
          std::fill(out, out + p.n_kv, std::numeric_limits<float>::quiet_NaN());
          continue;
        }
        if (m == -kInf) {
          std::fill(out, out + p.n_kv, 0.0f);
          continue;
        }
        if (m == kInf) {
          for (std::size_t j = 0; j < p.n_kv; ++j) {
            out[j] = vis[j] && s[j] == kInf
                         ? static_cast<float>(1.0 / static_cast<double>(n_inf))
                         : 0.0f;
          }
          continue;
        }
        double sum = has_sink ? std::exp(static_cast<double>(sink) - m) : 0.0;
        for (std::size_t j = 0; j < p.n_kv; ++j) {
          if (vis[j]) sum += std::exp(static_cast<double>(s[j]) - m);
        }
        for (std::size_t j = 0; j < p.n_kv; ++j) {
          out[j] = vis[j] ? static_cast<float>(
                                std::exp(static_cast<double>(s[j]) - m) / sum)
                          : 0.0f;
        }
      }
    }
  }
}

}  // namespace

void attention(TensorView<const float> q, TensorView<const float> k,
               TensorView<const float> v, TensorView<float> out,
               const AttentionOptions& options, float* lse) {
  run_attention(q, k, v, out, options, lse);
}
void attention(TensorView<const float> q, TensorView<const Float16> k,
               TensorView<const Float16> v, TensorView<float> out,
               const AttentionOptions& options, float* lse) {
  run_attention(q, k, v, out, options, lse);
}
void attention(TensorView<const float> q, TensorView<const BFloat16> k,
               TensorView<const BFloat16> v, TensorView<float> out,
               const AttentionOptions& options, float* lse) {
  run_attention(q, k, v, out, options, lse);
}

void attention_weights(TensorView<const float> q, TensorView<const float> k,
                       TensorView<float> weights,
                       const AttentionOptions& options) {
  run_weights(q, k, weights, options);
}
void attention_weights(TensorView<const float> q, TensorView<const Float16> k,
                       TensorView<float> weights,
                       const AttentionOptions& options) {
  run_weights(q, k, weights, options);
}
void attention_weights(TensorView<const float> q, TensorView<const BFloat16> k,
                       TensorView<float> weights,
                       const AttentionOptions& options) {
  run_weights(q, k, weights, options);
}

void attention_merge(TensorView<const float> o_a, const float* lse_a,
                     TensorView<const float> o_b, const float* lse_b,
                     TensorView<float> out, float* lse) {
  const char* fn = "attention_merge";
  check_tensor(fn, "o_a", o_a);
  check_tensor(fn, "o_b", o_b);
  check_tensor(fn, "out", out);
  auto same = [](const auto& x, const auto& y) {
    return x.batch == y.batch && x.heads == y.heads && x.rows == y.rows &&
           x.cols == y.cols;
  };
  if (!same(o_a, o_b) || !same(o_a, out)) {
    fail(fn, shape("o_a", o_a) + ", " + shape("o_b", o_b) + " and " +
                 shape("out", out) + " must have the same shape");
  }
  if (lse_a == nullptr || lse_b == nullptr || lse == nullptr) {
    fail(fn, "lse_a, lse_b and lse must not be null");
  }
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const std::size_t dv = o_a.cols;
  for (std::size_t b = 0; b < o_a.batch; ++b) {
    for (std::size_t h = 0; h < o_a.heads; ++h) {
      for (std::size_t i = 0; i < o_a.rows; ++i) {
        const std::size_t li = (b * o_a.heads + h) * o_a.rows + i;
        const float la = lse_a[li], lb = lse_b[li];
        const float* xa = o_a.row(b, h, i);
        const float* xb = o_b.row(b, h, i);
        float* y = out.row(b, h, i);
        if (std::isnan(la) || std::isnan(lb)) {
          std::fill(y, y + dv, std::numeric_limits<float>::quiet_NaN());
          lse[li] = std::numeric_limits<float>::quiet_NaN();
          continue;
        }
        if (la == -kInf && lb == -kInf) {
          std::fill(y, y + dv, 0.0f);
          lse[li] = -kInf;
          continue;
        }
        const float m = std::max(la, lb);
        const double wa = la == m ? 1.0 : std::exp(static_cast<double>(la) - m);
        const double wb = lb == m ? 1.0 : std::exp(static_cast<double>(lb) - m);
        const double inv = 1.0 / (wa + wb);
        for (std::size_t c = 0; c < dv; ++c) {
          const double ya = wa == 0.0 ? 0.0 : wa * xa[c];
          const double yb = wb == 0.0 ? 0.0 : wb * xb[c];
          y[c] = static_cast<float>((ya + yb) * inv);
        }
        lse[li] =
            static_cast<float>(static_cast<double>(m) + std::log(wa + wb));
      }
    }
  }
}

}  // namespace softdot
