// softdot: attention_backward(), the gradients of attention() by
// recomputation (FlashAttention-2's backward), deterministic for any thread
// count.
//
// Work split. For every batch b and KV head kh the keys of the key range
// are cut into blocks of kKeyTile (64) keys from kv_begin, and each block is
// one task: it runs the backward kernel against every block of query rows
// of the g query heads that share kh (rows r = (h - kh g) n_q + i, as the
// forward numbers them), in row order, so its keys' dK and dV are summed by
// one thread in one fixed order (GQA: the query heads in head order), and
// are written when the task ends. dQ gathers a contribution from every key
// block: each task computes its contribution to a row block, then waits
// until the key blocks before it have added theirs into the row block's
// double accumulator, adds its own and lets the next key block go. The
// tasks are handed out in index order (key blocks of one KV head in key
// order, OpenMP's dynamic schedule), so the lowest unfinished task never
// waits and the wait always ends; and every dQ row is the sum over key
// blocks in key order, whatever the thread count. Row blocks are cut at
// attention_max_rows() rows (a multiple of 16), and the kernel's row sums
// go into double per 16 rows, so the bits do not depend on the SIMD target
// (among those with FMA) either.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "attention_checks.h"
#include "attention_rows.h"
#include "kernels/attention_args.h"
#include "kernels/dispatch.h"
#include "parallel.h"
#include "softdot/attention.h"
#include "softdot/attention_request.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace softdot {
namespace {

using namespace detail::attn;

template <class T>
void check_dims(const char* fn, const char* name, const TensorView<T>& t,
                const char* like, std::size_t b, std::size_t h, std::size_t r,
                std::size_t c) {
  check_tensor(fn, name, t);
  if (t.batch != b || t.heads != h || t.rows != r || t.cols != c) {
    fail(fn, shape(name, t) + " must have " + like + "'s shape " +
                 shape(like, b, h, r, c).substr(std::strlen(like) + 1));
  }
}

// Every element of a view set to +0.
void zero_view(const TensorView<float>& t) {
  // A view with no elements spans nothing, so its strides are unchecked: no
  // row address may be formed from them (found by fuzz_backward: a dbias of
  // 0 columns, n_kv = 0, with huge strides overflowed the pointer).
  if (t.batch == 0 || t.heads == 0 || t.rows == 0 || t.cols == 0) return;
  for (std::size_t b = 0; b < t.batch; ++b) {
    for (std::size_t h = 0; h < t.heads; ++h) {
      for (std::size_t r = 0; r < t.rows; ++r) {
        std::fill_n(t.row(b, h, r), t.cols, 0.0f);
      }
    }
  }
}

// Each element of t, in dense (b, h, r, c) order in x, set to f x[i]
// rounded once to T (float, bfloat16 or float16).
template <class T>
void round_sums_into(const TensorView<T>& t, const std::vector<double>& x,
                     double f) {
  if (t.batch == 0 || t.heads == 0 || t.rows == 0 || t.cols == 0) return;
  std::size_t at = 0;
  for (std::size_t b = 0; b < t.batch; ++b) {
    for (std::size_t h = 0; h < t.heads; ++h) {
      for (std::size_t r = 0; r < t.rows; ++r) {
        T* o = t.row(b, h, r);
        for (std::size_t c = 0; c < t.cols; ++c) {
          const double y = f * x[at++];
          if constexpr (std::is_same_v<T, BFloat16>) {
            o[c] = to_bfloat16(y);
          } else if constexpr (std::is_same_v<T, Float16>) {
            o[c] = to_float16(y);
          } else {
            o[c] = static_cast<float>(y);
          }
        }
      }
    }
  }
}

// Per-thread scratch that only grows.
struct BackBuffers {
  std::vector<float> scratch;
  std::vector<float> dk_tile, dv_tile;  // the row groups' float chains
  std::vector<double> dk, dv;
  std::vector<float> dq;
};

BackBuffers& thread_buffers() {
  thread_local BackBuffers b;
  return b;
}

void pause_briefly(unsigned spins) {
  if (spins < 64) {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#endif
  } else {
    std::this_thread::yield();
  }
}

// attention_backward() (part null: the gradients rounded into grads) and
// attention_backward_partial() (the unrounded sums added into *part).
// Returns the plan's float scale (AttentionPlan::scale()). whole_dbias: a
// partial call still sets every column of dbias (the 16-bit overloads, whose
// partial is the whole call), not only its key range's.
float run_backward(const char* kFn, TensorView<const float> q,
                   TensorView<const float> k, TensorView<const float> v,
                   TensorView<const float> out, const float* lse,
                   TensorView<const float> dout, const float* dlse,
                   const AttentionGradients& grads,
                   AttentionGradientPartial* part,
                   const AttentionOptions& options, bool whole_dbias = false) {
  // q, k, v, out and the options: the forward's checks and plan.
  AttentionRequest req;
  req.name = kFn;
  req.q = q;
  req.kv = KVSource::contiguous(k, v);
  TensorView<float> out_w(const_cast<float*>(out.data), out.batch, out.heads,
                          out.rows, out.cols, out.batch_stride, out.head_stride,
                          out.row_stride);
  req.target = AttentionTarget::output(out_w, const_cast<float*>(lse));
  req.options = options;
  const AttentionPlan plan = AttentionPlan::make(req);
  const Plan& p = plan.data();
  const std::size_t B = p.B, H = p.H, Hkv = p.Hkv, g = p.g, n_q = p.n_q,
                    n_kv = p.n_kv, d = p.d, dv = p.dv;
  if (lse == nullptr) fail(kFn, "lse is null (the forward's lse is needed)");
  check_dims(kFn, "dout", dout, "out", B, H, n_q, dv);
  if (part == nullptr) {
    check_dims(kFn, "dq", grads.dq, "q", B, H, n_q, d);
    check_dims(kFn, "dk", grads.dk, "k", B, Hkv, n_kv, d);
    check_dims(kFn, "dv", grads.dv, "v", B, Hkv, n_kv, dv);
  } else {
    if (!grads.dq.empty() || !grads.dk.empty() || !grads.dv.empty()) {
      fail(kFn, "grads.dq, dk and dv must be empty (the partial holds them)");
    }
    const AttentionGradientPartial& a = *part;
    if (a.batch != B || a.heads != H || a.kv_heads != Hkv || a.rows != n_q ||
        a.keys != n_kv || a.d != d || a.dv != dv ||
        a.dq.size() != B * H * n_q * d || a.dk.size() != B * Hkv * n_kv * d ||
        a.dv_sum.size() != B * Hkv * n_kv * dv) {
      fail(kFn,
           "the partial is for [" + count(a.batch) + ", " + count(a.heads) +
               "/" + count(a.kv_heads) + ", " + count(a.rows) + " x " +
               count(a.keys) + ", d " + count(a.d) + ", d_v " + count(a.dv) +
               "] (or its vectors were resized); the call is [" + count(B) +
               ", " + count(H) + "/" + count(Hkv) + ", " + count(n_q) + " x " +
               count(n_kv) + ", d " + count(d) + ", d_v " + count(dv) +
               "]: make it with "
               "AttentionGradientPartial::zeros");
    }
  }
  const bool want_dbias = !grads.dbias.empty();
  if (want_dbias) {
    check_dims(kFn, "dbias", grads.dbias, "scores", B, H, n_q,
               p.mask_col0 + n_kv);
  }
  const bool want_dsinks = !grads.dsinks.empty();
  if (want_dsinks && options.sinks.empty()) {
    fail(kFn, "dsinks given (" + count(grads.dsinks.size()) +
                  " floats) but options.sinks is empty");
  }
  if (want_dsinks && grads.dsinks.size() != H) {
    fail(kFn, "dsinks has " + count(grads.dsinks.size()) +
                  " floats; expected one per query head (" + count(H) + ")");
  }
  // No gradient may overlap an input or another gradient.
  const std::size_t rows = B * H * n_q;
  const std::string clash = first_overlap(
      {named_span("dq", grads.dq), named_span("dk", grads.dk),
       named_span("dv", grads.dv), named_span("dbias", grads.dbias),
       named_span("dsinks", grads.dsinks.data(),
                  grads.dsinks.size() * sizeof(float))},
      {named_span("q", q), named_span("k", k), named_span("v", v),
       named_span("out", out), named_span("dout", dout),
       named_span("mask", options.mask), named_span("bias", options.bias),
       named_span("lse", lse, rows * sizeof(float)),
       named_span("dlse", dlse, rows * sizeof(float)),
       named_span("sinks", options.sinks.data(),
                  options.sinks.size() * sizeof(float))});
  if (!clash.empty()) fail(kFn, clash);

  // Everything is checked: from here on nothing throws.
  if (part == nullptr) {
    zero_view(grads.dq);
    zero_view(grads.dk);
    zero_view(grads.dv);
  }
  const bool dbias_cols = part != nullptr && !whole_dbias;
  if (want_dbias && !dbias_cols) zero_view(grads.dbias);
  if (want_dbias && dbias_cols) {
    // The call's key columns (the rest is left as it is, for the other
    // parts of a ring).
    TensorView<float> cols = grads.dbias;
    cols.data += p.mask_col0 + p.kv_begin;
    cols.cols = p.kv_end - p.kv_begin;
    if (cols.cols != 0) zero_view(cols);
  }
  const std::size_t rows_total = B * H * n_q;
  const std::size_t max_rows =
      std::min(detail::attention_max_rows(), detail::kMaxKernelRows);
  const std::size_t group_rows = g * n_q;
  const std::size_t row_blocks = (group_rows + max_rows - 1) / max_rows;
  const std::size_t range = p.kv_end - p.kv_begin;
  const std::size_t key_blocks =
      (range + detail::kKeyTile - 1) / detail::kKeyTile;
  const double work = static_cast<double>(rows_total) *
                      static_cast<double>(range) * static_cast<double>(d + dv);
  const bool parallel = work >= 2e5 && omp_get_max_threads() > 1;
  auto lse_at = [&](std::size_t b, std::size_t h, std::size_t i) {
    return lse[(b * H + h) * n_q + i];
  };

  // Delta = rowsum(dO * O) - dlse in double (terms where O is exactly 0
  // skipped: a row that sees no key has O = 0, whatever dO holds). The
  // gradient of lse enters here: d lse_i / d s_ij = P_ij, so it adds
  // P_ij dlse_i to dS_ij.
  std::vector<double> delta(rows_total);
  detail::for_each_index(
      rows_total, parallel && rows_total >= 64, [&](std::size_t r) {
        const std::size_t i = r % n_q;
        const std::size_t h = (r / n_q) % H;
        const std::size_t b = r / (n_q * H);
        const float* o = out.row(b, h, i);
        const float* go = dout.row(b, h, i);
        double s = 0.0;
        for (std::size_t c = 0; c < dv; ++c) {
          if (o[c] != 0.0f) {
            s += static_cast<double>(o[c]) * static_cast<double>(go[c]);
          }
        }
        if (dlse != nullptr) {
          s -= static_cast<double>(dlse[r]);
        }
        delta[r] = s;
      });
  if (want_dsinks) {
    // d lse / d sink = exp(sink - lse): dsink = -sum_rows P_sink Delta.
    for (std::size_t h = 0; h < H; ++h) {
      const float sink = options.sinks[h];
      double s = 0.0;
      for (std::size_t b = 0; b < B; ++b) {
        for (std::size_t i = 0; i < n_q; ++i) {
          const float l = lse_at(b, h, i);
          const double ps = sink == -std::numeric_limits<float>::infinity()
                                ? 0.0
                                : std::exp(static_cast<double>(sink) -
                                           static_cast<double>(l));
          const double dl = delta[(b * H + h) * n_q + i];
          if (ps != 0.0 || std::isnan(dl)) s -= ps * dl;
        }
      }
      grads.dsinks[h] = static_cast<float>(s);
    }
  }
  if (key_blocks == 0 || rows_total == 0) return p.scale;

  std::vector<float> delta_f(rows_total);
  for (std::size_t r = 0; r < rows_total; ++r) {
    delta_f[r] = static_cast<float>(delta[r]);
  }
  // Rows whose lse is +inf: 1/k, k their count of +inf scores (the
  // forward's limit), counted by the kernel on the calling thread.
  std::vector<float> share;
  bool any_inf = false;
  for (std::size_t r = 0; r < rows_total && !any_inf; ++r) {
    any_inf = lse[r] == std::numeric_limits<float>::infinity();
  }
  const std::size_t dpad = (d + 15) / 16 * 16, dvpad = (dv + 15) / 16 * 16;
  auto prepare = [&](BackBuffers& buf) {
    buf.scratch.resize(detail::attention_backward_scratch_floats(d, dv));
    buf.dk_tile.resize(detail::kKeyTile * dpad);
    buf.dv_tile.resize(detail::kKeyTile * dvpad);
    buf.dk.resize(detail::kKeyTile * dpad);
    buf.dv.resize(detail::kKeyTile * dvpad);
    buf.dq.resize(d * detail::kMaxKernelRows);
  };
  // Each block of rows packed once for every key block: Q and dO
  // transposed ([d][max_rows] then [dv][max_rows], zeros past the block's
  // rows), and which rows hold inf or NaN. O(rows (d + dv)) floats.
  const std::size_t pack_floats = (d + dv) * max_rows;
  // (ScoreTile loads the transposed rows aligned: 64-byte aligned blocks.)
  std::vector<float> packed_store(B * Hkv * row_blocks * pack_floats + 16);
  float* const packed = reinterpret_cast<float*>(
      (reinterpret_cast<std::uintptr_t>(packed_store.data()) + 63) &
      ~std::uintptr_t{63});
  std::vector<std::uint8_t> q_bad(rows_total), do_bad(rows_total);
  detail::for_each_index(B * Hkv * row_blocks, parallel, [&](std::size_t blk) {
    const std::size_t rb = blk % row_blocks;
    const std::size_t kh = (blk / row_blocks) % Hkv;
    const std::size_t b = blk / (row_blocks * Hkv);
    const std::size_t row0 = rb * max_rows;
    const std::size_t cnt = std::min(max_rows, group_rows - row0);
    float* qt = packed + blk * pack_floats;
    float* dot = qt + d * max_rows;
    std::fill(qt, qt + pack_floats, 0.0f);
    for (std::size_t r = 0; r < cnt; ++r) {
      const std::size_t row = row0 + r;
      const std::size_t h = kh * g + row / n_q, i = row % n_q;
      const float* qr = q.row(b, h, i);
      const float* gr = dout.row(b, h, i);
      bool qb = false, gb = false;
      for (std::size_t c = 0; c < d; ++c) {
        qt[c * max_rows + r] = qr[c];
        qb = qb || !std::isfinite(qr[c]);
      }
      for (std::size_t c = 0; c < dv; ++c) {
        dot[c * max_rows + r] = gr[c];
        gb = gb || !std::isfinite(gr[c]);
      }
      const std::size_t at = (b * H + h) * n_q + i;
      q_bad[at] = qb ? 1 : 0;
      do_bad[at] = gb ? 1 : 0;
    }
  });
  // The arguments of one kernel call: rows row0 .. row0 + cnt - 1 of KV
  // head kh of batch b against key block kbi.
  struct Call {
    RowTables t;
    const float* do_rows[detail::kMaxKernelRows];
    std::uint8_t q_bad[detail::kMaxKernelRows], do_bad[detail::kMaxKernelRows];
    float lse[detail::kMaxKernelRows], delta[detail::kMaxKernelRows],
        share[detail::kMaxKernelRows];
    float* dbias[detail::kMaxKernelRows];
    detail::AttnBackArgs a;
  };
  auto setup = [&](Call& c, BackBuffers& buf, std::size_t b, std::size_t kh,
                   std::size_t row0, std::size_t cnt, std::size_t j0,
                   std::size_t kb) {
    fill_row_tables(p, p, options, req.q, nullptr, b, b, 0, kh, row0, cnt, c.t);
    for (std::size_t r = 0; r < cnt; ++r) {
      const std::size_t row = row0 + r;
      const std::size_t h = kh * g + row / n_q, i = row % n_q;
      const std::size_t at = (b * H + h) * n_q + i;
      c.do_rows[r] = dout.row(b, h, i);
      c.q_bad[r] = q_bad[at];
      c.do_bad[r] = do_bad[at];
      c.lse[r] = lse[at];
      c.delta[r] = delta_f[at];
      c.share[r] = share.empty() ? 0.0f : share[at];
      // The kernel writes key j at column j: the row from mask_col0 on.
      c.dbias[r] =
          want_dbias ? grads.dbias.row(b, h, i) + p.mask_col0 : nullptr;
    }
    detail::AttnBackArgs& a = c.a;
    a = detail::AttnBackArgs{};
    a.f.kv_type = detail::kKvF32;
    a.f.k = k.row(b, kh, 0);
    a.f.k_stride = k.row_stride;
    a.f.v = v.row(b, kh, 0);
    a.f.v_stride = v.row_stride;
    a.f.d = d;
    a.f.dv = dv;
    a.f.j_begin = j0;
    a.f.j_end = j0 + kb;
    a.f.scale = p.scale;
    a.f.softcap = p.softcap;
    a.f.rows = cnt;
    a.f.q_rows = c.t.q;
    a.f.first_key = c.t.first;
    a.f.last_key = c.t.last;
    a.f.mask_rows = options.mask.empty() ? nullptr : c.t.mask;
    a.f.bias_rows = options.bias.empty() ? nullptr : c.t.bias;
    if (!options.alibi_slopes.empty()) {
      a.f.alibi_slopes = c.t.alibi;
      a.f.alibi_base = c.t.alibi_base;
      a.f.alibi_stride = static_cast<double>(p.kv_stride);
    }
    a.f.scratch = buf.scratch.data();
    a.qt =
        packed + ((b * Hkv + kh) * row_blocks + row0 / max_rows) * pack_floats;
    a.dot = a.qt + d * max_rows;
    a.bq = max_rows;
    a.do_rows = c.do_rows;
    a.q_bad = c.q_bad;
    a.do_bad = c.do_bad;
    a.lse = c.lse;
    a.delta = c.delta;
    a.inf_share = c.share;
    a.dv_tile = buf.dv_tile.data();
    a.dk_tile = buf.dk_tile.data();
    a.dv_acc = buf.dv.data();
    a.dv_stride = dvpad;
    a.dk_acc = buf.dk.data();
    a.dk_stride = dpad;
    // The last call of a group of kBackRowGroup rows (or of the rows).
    a.flush =
        (row0 + cnt) % detail::kBackRowGroup == 0 || row0 + cnt == group_rows;
    a.dq = buf.dq.data();
    a.dq_stride = max_rows;
    a.dbias_rows = want_dbias ? c.dbias : nullptr;
  };
  auto sees = [](const RowTables& t, std::size_t cnt, std::size_t j0,
                 std::size_t kb) {
    const KeyHull hull = row_hull(t.first, t.last, cnt);
    return !hull.empty() && hull.lo < j0 + kb && hull.hi >= j0;
  };
  if (any_inf) {
    std::vector<double> infs(rows_total, 0.0);
    BackBuffers& buf = thread_buffers();
    prepare(buf);
    Call c;
    for (std::size_t b = 0; b < B; ++b) {
      for (std::size_t kh = 0; kh < Hkv; ++kh) {
        for (std::size_t rb = 0; rb < row_blocks; ++rb) {
          const std::size_t row0 = rb * max_rows;
          const std::size_t cnt = std::min(max_rows, group_rows - row0);
          double counts[detail::kMaxKernelRows] = {};
          for (std::size_t kbi = 0; kbi < key_blocks; ++kbi) {
            const std::size_t j0 = p.kv_begin + kbi * detail::kKeyTile;
            const std::size_t kb = std::min(detail::kKeyTile, p.kv_end - j0);
            setup(c, buf, b, kh, row0, cnt, j0, kb);
            if (!sees(c.t, cnt, j0, kb)) continue;
            c.a.inf_count = counts;
            detail::attention_backward_kernel(c.a);
          }
          for (std::size_t r = 0; r < cnt; ++r) {
            const std::size_t row = row0 + r;
            const std::size_t h = kh * g + row / n_q, i = row % n_q;
            infs[(b * H + h) * n_q + i] = counts[r];
          }
        }
      }
    }
    share.assign(rows_total, 0.0f);
    for (std::size_t r = 0; r < rows_total; ++r) {
      if (lse[r] == std::numeric_limits<float>::infinity() && infs[r] > 0) {
        share[r] = static_cast<float>(1.0 / infs[r]);
      }
    }
  }

  // dQ in double, and each row block's count of key blocks added so far.
  // dQ in double, each block of rows transposed as the kernel writes its
  // tile ([d][max_rows] per block: the adds run along memory); a partial's
  // sums are copied in first and back at the end (the same additions, in
  // the same order, as adding into the partial itself).
  const std::size_t acc_floats = d * max_rows;
  std::vector<double> dq_acc(B * Hkv * row_blocks * acc_floats, 0.0);
  auto acc_at = [&](std::size_t b, std::size_t h, std::size_t i,
                    std::size_t c) -> double& {
    const std::size_t kh = h / g;
    const std::size_t row = (h - kh * g) * n_q + i;
    const std::size_t blk = (b * Hkv + kh) * row_blocks + row / max_rows;
    return dq_acc[blk * acc_floats + c * max_rows + row % max_rows];
  };
  if (part != nullptr) {
    for (std::size_t r = 0; r < rows_total; ++r) {
      const std::size_t i = r % n_q, h = (r / n_q) % H, b = r / (n_q * H);
      for (std::size_t c = 0; c < d; ++c)
        acc_at(b, h, i, c) = part->dq[r * d + c];
    }
  }
  const std::size_t counters = B * Hkv * row_blocks;
  std::unique_ptr<std::atomic<std::uint32_t>[]> done(
      new std::atomic<std::uint32_t>[counters]);
  for (std::size_t i = 0; i < counters; ++i) {
    done[i].store(0, std::memory_order_relaxed);
  }
  const std::size_t tasks = B * Hkv * key_blocks;
  const double scale = static_cast<double>(p.scale);
  detail::for_each_index<detail::Schedule::kDynamic>(
      tasks, parallel && tasks > 1, [&](std::size_t task) {
        const std::size_t kbi = task % key_blocks;
        const std::size_t kh = (task / key_blocks) % Hkv;
        const std::size_t b = task / (key_blocks * Hkv);
        const std::size_t j0 = p.kv_begin + kbi * detail::kKeyTile;
        const std::size_t kb = std::min(detail::kKeyTile, p.kv_end - j0);
        BackBuffers& buf = thread_buffers();
        prepare(buf);
        std::fill(buf.dk.begin(), buf.dk.end(), 0.0);
        std::fill(buf.dv.begin(), buf.dv.end(), 0.0);
        std::fill(buf.dk_tile.begin(), buf.dk_tile.end(), 0.0f);
        std::fill(buf.dv_tile.begin(), buf.dv_tile.end(), 0.0f);
        Call c;
        // Whether the float tiles hold chains not yet added into double.
        bool dirty = false;
        for (std::size_t rb = 0; rb < row_blocks; ++rb) {
          const std::size_t row0 = rb * max_rows;
          const std::size_t cnt = std::min(max_rows, group_rows - row0);
          setup(c, buf, b, kh, row0, cnt, j0, kb);
          const bool run = sees(c.t, cnt, j0, kb);
          if (run) {
            detail::attention_backward_kernel(c.a);
            dirty = !c.a.flush;
          } else if (dirty && c.a.flush) {
            // A group's chains end in a block that sees none of these keys.
            for (std::size_t x = 0; x < buf.dk.size(); ++x) {
              buf.dk[x] += static_cast<double>(buf.dk_tile[x]);
            }
            for (std::size_t x = 0; x < buf.dv.size(); ++x) {
              buf.dv[x] += static_cast<double>(buf.dv_tile[x]);
            }
            std::fill(buf.dk_tile.begin(), buf.dk_tile.end(), 0.0f);
            std::fill(buf.dv_tile.begin(), buf.dv_tile.end(), 0.0f);
            dirty = false;
          }
          std::atomic<std::uint32_t>& turn =
              done[(b * Hkv + kh) * row_blocks + rb];
          for (unsigned spins = 0; turn.load(std::memory_order_acquire) != kbi;
               ++spins) {
            pause_briefly(spins);
          }
          if (run) {
            double* acc =
                dq_acc.data() + ((b * Hkv + kh) * row_blocks + rb) * acc_floats;
            const float* tile = buf.dq.data();
            for (std::size_t x = 0; x < acc_floats; ++x) {
              acc[x] += static_cast<double>(tile[x]);
            }
          }
          turn.store(static_cast<std::uint32_t>(kbi + 1),
                     std::memory_order_release);
        }
        for (std::size_t j = 0; j < kb; ++j) {
          const double* ka = buf.dk.data() + j * dpad;
          const double* va = buf.dv.data() + j * dvpad;
          const std::size_t key = (b * Hkv + kh) * n_kv + j0 + j;
          if (part != nullptr) {
            double* pk = part->dk.data() + key * d;
            double* pv = part->dv_sum.data() + key * dv;
            for (std::size_t cc = 0; cc < d; ++cc) pk[cc] += ka[cc];
            for (std::size_t cc = 0; cc < dv; ++cc) pv[cc] += va[cc];
            continue;
          }
          float* dkr = grads.dk.row(b, kh, j0 + j);
          float* dvr = grads.dv.row(b, kh, j0 + j);
          for (std::size_t cc = 0; cc < d; ++cc) {
            dkr[cc] = static_cast<float>(scale * ka[cc]);
          }
          for (std::size_t cc = 0; cc < dv; ++cc) {
            dvr[cc] = static_cast<float>(va[cc]);
          }
        }
      });
  if (part != nullptr) {
    for (std::size_t r = 0; r < rows_total; ++r) {
      const std::size_t i = r % n_q, h = (r / n_q) % H, b = r / (n_q * H);
      for (std::size_t c = 0; c < d; ++c)
        part->dq[r * d + c] = acc_at(b, h, i, c);
    }
    return p.scale;
  }
  detail::for_each_index(
      rows_total, parallel && rows_total >= 64, [&](std::size_t r) {
        const std::size_t i = r % n_q;
        const std::size_t h = (r / n_q) % H;
        const std::size_t b = r / (n_q * H);
        float* o = grads.dq.row(b, h, i);
        for (std::size_t c = 0; c < d; ++c) {
          o[c] = static_cast<float>(scale * acc_at(b, h, i, c));
        }
      });
  return p.scale;
}

}  // namespace

void attention_backward(TensorView<const float> q, TensorView<const float> k,
                        TensorView<const float> v, TensorView<const float> out,
                        const float* lse, TensorView<const float> dout,
                        const AttentionGradients& grads,
                        const AttentionOptions& options, const float* dlse) {
  run_backward("attention_backward", q, k, v, out, lse, dout, dlse, grads,
               nullptr, options);
}

void attention_backward_partial(
    TensorView<const float> q, TensorView<const float> k,
    TensorView<const float> v, TensorView<const float> out, const float* lse,
    TensorView<const float> dout, AttentionGradientPartial& partial,
    const AttentionOptions& options, const AttentionGradients& extras,
    const float* dlse) {
  run_backward("attention_backward_partial", q, k, v, out, lse, dout, dlse,
               extras, &partial, options);
}

AttentionGradientPartial AttentionGradientPartial::zeros(
    std::size_t batch, std::size_t heads, std::size_t kv_heads,
    std::size_t rows, std::size_t keys, std::size_t d, std::size_t dv) {
  AttentionGradientPartial p;
  p.batch = batch;
  p.heads = heads;
  p.kv_heads = kv_heads;
  p.rows = rows;
  p.keys = keys;
  p.d = d;
  p.dv = dv;
  p.dq.assign(batch * heads * rows * d, 0.0);
  p.dk.assign(batch * kv_heads * keys * d, 0.0);
  p.dv_sum.assign(batch * kv_heads * keys * dv, 0.0);
  return p;
}

void attention_backward_finalize(const AttentionGradientPartial& partial,
                                 float scale, TensorView<float> dq,
                                 TensorView<float> dk, TensorView<float> dv) {
  const char* fn = "attention_backward_finalize";
  const AttentionGradientPartial& a = partial;
  if (!dq.empty())
    check_dims(fn, "dq", dq, "the partial's dq", a.batch, a.heads, a.rows, a.d);
  if (!dk.empty())
    check_dims(fn, "dk", dk, "the partial's dk", a.batch, a.kv_heads, a.keys,
               a.d);
  if (!dv.empty())
    check_dims(fn, "dv", dv, "the partial's dv", a.batch, a.kv_heads, a.keys,
               a.dv);
  const double sc = static_cast<double>(scale);
  if (!dq.empty()) round_sums_into(dq, a.dq, sc);
  if (!dk.empty()) round_sums_into(dk, a.dk, sc);
  if (!dv.empty()) round_sums_into(dv, a.dv_sum, 1.0);
}

namespace {

// A 16-bit view widened (exactly) into a dense float32 copy.
template <class T>
std::vector<float> widened(const TensorView<const T>& t) {
  std::vector<float> x;
  if (t.batch == 0 || t.heads == 0 || t.rows == 0 || t.cols == 0) return x;
  x.reserve(t.batch * t.heads * t.rows * t.cols);
  for (std::size_t b = 0; b < t.batch; ++b) {
    for (std::size_t h = 0; h < t.heads; ++h) {
      for (std::size_t r = 0; r < t.rows; ++r) {
        const T* row = t.row(b, h, r);
        for (std::size_t c = 0; c < t.cols; ++c) x.push_back(to_float(row[c]));
      }
    }
  }
  return x;
}

template <class T>
TensorView<const float> dense(const std::vector<float>& x,
                              const TensorView<const T>& like) {
  return TensorView<const float>(x.data(), like.batch, like.heads, like.rows,
                                 like.cols);
}

template <class T>
void backward16(TensorView<const T> q, TensorView<const T> k,
                TensorView<const T> v, TensorView<const float> out,
                const float* lse, TensorView<const T> dout,
                const AttentionGradients16<T>& grads,
                const AttentionOptions& options, const float* dlse) {
  const char* fn = "attention_backward";
  check_tensor(fn, "q", q);
  check_tensor(fn, "k", k);
  check_tensor(fn, "v", v);
  check_tensor(fn, "dout", dout);
  check_dims(fn, "dq", grads.dq, "q", q.batch, q.heads, q.rows, q.cols);
  check_dims(fn, "dk", grads.dk, "k", k.batch, k.heads, k.rows, k.cols);
  check_dims(fn, "dv", grads.dv, "v", v.batch, v.heads, v.rows, v.cols);
  {
    // The forward's checks (shapes against each other, strides, options)
    // and dout's shape before the widening, whose loops follow the views'
    // shapes: found by fuzz_backward, a q of [2^62, 2^62, 2, 0] with invalid
    // options looped for ever (0 columns pass check_tensor) instead of
    // being rejected.
    AttentionRequest req;
    req.name = fn;
    req.q = q;
    req.kv = KVSource::contiguous(k, v);
    const TensorView<float> out_w(
        const_cast<float*>(out.data), out.batch, out.heads, out.rows, out.cols,
        out.batch_stride, out.head_stride, out.row_stride);
    req.target = AttentionTarget::output(out_w, const_cast<float*>(lse));
    req.options = options;
    const AttentionPlan plan = AttentionPlan::make(req);
    check_dims(fn, "dout", dout, "out", plan.batch(), plan.heads(),
               plan.query_rows(), plan.value_dim());
  }
  const std::vector<float> qf = widened(q), kf = widened(k), vf = widened(v),
                           gf = widened(dout);
  auto part = AttentionGradientPartial::zeros(q.batch, q.heads, k.heads, q.rows,
                                              k.rows, q.cols, v.cols);
  AttentionGradients extras;
  extras.dbias = grads.dbias;
  extras.dsinks = grads.dsinks;
  const double scale =
      run_backward(fn, dense(qf, q), dense(kf, k), dense(vf, v), out, lse,
                   dense(gf, dout), dlse, extras, &part, options,
                   /*whole_dbias=*/true);

  round_sums_into(grads.dq, part.dq, scale);
  round_sums_into(grads.dk, part.dk, scale);
  round_sums_into(grads.dv, part.dv_sum, 1.0);
}

}  // namespace

void attention_backward(TensorView<const BFloat16> q,
                        TensorView<const BFloat16> k,
                        TensorView<const BFloat16> v,
                        TensorView<const float> out, const float* lse,
                        TensorView<const BFloat16> dout,
                        const AttentionGradients16<BFloat16>& grads,
                        const AttentionOptions& options, const float* dlse) {
  backward16(q, k, v, out, lse, dout, grads, options, dlse);
}

void attention_backward(TensorView<const Float16> q,
                        TensorView<const Float16> k,
                        TensorView<const Float16> v,
                        TensorView<const float> out, const float* lse,
                        TensorView<const Float16> dout,
                        const AttentionGradients16<Float16>& grads,
                        const AttentionOptions& options, const float* dlse) {
  backward16(q, k, v, out, lse, dout, grads, options, dlse);
}

}  // namespace softdot
