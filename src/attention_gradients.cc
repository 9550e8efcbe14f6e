// softdot: the gradients target of an attention request (the runner of
// attention_backward() and attention_backward_partial(), whose entry points
// are in attention_backward.cc): the gradients of attention() by
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

}  // namespace

namespace detail::attn {

void check_gradients(const char* kFn, const AttentionRequest& r,
                     const Plan& p) {
  const AttentionBackwardIO& io = r.target.backward;
  const AttentionGradients& grads = io.grads;
  const AttentionOptions& options = r.options;
  const AttentionGradientPartial* part = io.partial;
  const TensorView<const float>& q = *r.q.f32();
  const auto& k = std::get<TensorView<const float>>(r.kv.k.variant());
  const auto& v = std::get<TensorView<const float>>(r.kv.v.variant());
  const std::size_t B = p.B, H = p.H, Hkv = p.Hkv, n_q = p.n_q, n_kv = p.n_kv,
                    d = p.d, dv = p.dv;
  check_tensor(kFn, "out", io.out);
  if (io.out.batch != B || io.out.heads != H || io.out.rows != n_q ||
      io.out.cols != dv) {
    fail(kFn, shape("out", io.out) + " must be " + shape("out", B, H, n_q, dv) +
                  " for " + shape("q", q) + " and " + shape("v", v));
  }
  if (io.lse == nullptr) {
    fail(kFn, "lse is null (the forward's lse is needed)");
  }
  check_dims(kFn, "dout", io.dout, "out", B, H, n_q, dv);
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
  if (!grads.dbias.empty()) {
    check_dims(kFn, "dbias", grads.dbias, "scores", B, H, n_q,
               p.mask_col0 + n_kv);
  }
  if (!grads.dsinks.empty() && options.sinks.empty()) {
    fail(kFn, "dsinks given (" + count(grads.dsinks.size()) +
                  " floats) but options.sinks is empty");
  }
  if (!grads.dsinks.empty() && grads.dsinks.size() != H) {
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
       named_span("out", io.out), named_span("dout", io.dout),
       named_span("mask", options.mask), named_span("bias", options.bias),
       named_span("lse", io.lse, rows * sizeof(float)),
       named_span("dlse", io.dlse, rows * sizeof(float)),
       named_span("sinks", options.sinks.data(),
                  options.sinks.size() * sizeof(float))});
  if (!clash.empty()) fail(kFn, clash);
}

namespace {

// The gradients of a checked plan (attention_backward(): part null, the
// gradients rounded into grads; attention_backward_partial(): the unrounded
// sums added into *part); see the file comment for the split.
class BackwardRunner {
 public:
  explicit BackwardRunner(const AttentionPlan& plan)
      : p_(plan.data()),
        o_(plan.request().options),
        io_(plan.request().target.backward),
        grads_(io_.grads),
        part_(io_.partial),
        q_(*plan.request().q.f32()),
        k_(std::get<TensorView<const float>>(plan.request().kv.k.variant())),
        v_(std::get<TensorView<const float>>(plan.request().kv.v.variant())),
        req_q_(plan.request().q),
        rows_total_(p_.B * p_.H * p_.n_q),
        max_rows_(
            std::min(detail::attention_max_rows(), detail::kMaxKernelRows)),
        group_rows_(p_.g * p_.n_q),
        row_blocks_((group_rows_ + max_rows_ - 1) / max_rows_),
        key_blocks_((p_.kv_end - p_.kv_begin + detail::kKeyTile - 1) /
                    detail::kKeyTile),
        dpad_((p_.d + 15) / 16 * 16),
        dvpad_((p_.dv + 15) / 16 * 16),
        pack_floats_((p_.d + p_.dv) * max_rows_),
        acc_floats_(p_.d * max_rows_) {
    const double work = static_cast<double>(rows_total_) *
                        static_cast<double>(p_.kv_end - p_.kv_begin) *
                        static_cast<double>(p_.d + p_.dv);
    parallel_ = work >= 2e5 && omp_get_max_threads() > 1;
  }

  void run() {
    zero_outputs();
    compute_delta();
    if (!grads_.dsinks.empty()) compute_dsinks();
    if (key_blocks_ == 0 || rows_total_ == 0) return;
    delta_f_.resize(rows_total_);
    for (std::size_t r = 0; r < rows_total_; ++r) {
      delta_f_[r] = static_cast<float>(delta_[r]);
    }
    pack_rows();
    bool any_inf = false;
    for (std::size_t r = 0; r < rows_total_ && !any_inf; ++r) {
      any_inf = io_.lse[r] == std::numeric_limits<float>::infinity();
    }
    if (any_inf) inf_shares();
    run_key_blocks();
    write_dq();
  }

 private:
  // The arguments of one kernel call: rows row0 .. row0 + cnt - 1 of KV
  // head kh of batch b against a key block.
  struct Call {
    RowTables t;
    const float* do_rows[detail::kMaxKernelRows];
    std::uint8_t q_bad[detail::kMaxKernelRows], do_bad[detail::kMaxKernelRows];
    float lse[detail::kMaxKernelRows], delta[detail::kMaxKernelRows],
        share[detail::kMaxKernelRows];
    float* dbias[detail::kMaxKernelRows];
    detail::AttnBackArgs a;
  };

  // Everything is checked: from here on nothing throws.
  void zero_outputs() {
    if (part_ == nullptr) {
      zero_view(grads_.dq);
      zero_view(grads_.dk);
      zero_view(grads_.dv);
    }
    if (grads_.dbias.empty()) return;
    if (part_ == nullptr) {
      zero_view(grads_.dbias);
      return;
    }
    // The call's key columns (the rest is left as it is, for the other
    // parts of a ring).
    TensorView<float> cols = grads_.dbias;
    cols.data += p_.mask_col0 + p_.kv_begin;
    cols.cols = p_.kv_end - p_.kv_begin;
    if (cols.cols != 0) zero_view(cols);
  }

  // Delta = rowsum(dO * O) - dlse in double (terms where O is exactly 0
  // skipped: a row that sees no key has O = 0, whatever dO holds). The
  // gradient of lse enters here: d lse_i / d s_ij = P_ij, so it adds
  // P_ij dlse_i to dS_ij.
  void compute_delta() {
    delta_.resize(rows_total_);
    detail::for_each_index(
        rows_total_, parallel_ && rows_total_ >= 64, [&](std::size_t r) {
          const std::size_t i = r % p_.n_q;
          const std::size_t h = (r / p_.n_q) % p_.H;
          const std::size_t b = r / (p_.n_q * p_.H);
          const float* o = io_.out.row(b, h, i);
          const float* go = io_.dout.row(b, h, i);
          double s = 0.0;
          for (std::size_t c = 0; c < p_.dv; ++c) {
            if (o[c] != 0.0f) {
              s += static_cast<double>(o[c]) * static_cast<double>(go[c]);
            }
          }
          if (io_.dlse != nullptr) s -= static_cast<double>(io_.dlse[r]);
          delta_[r] = s;
        });
  }

  // d lse / d sink = exp(sink - lse): dsink = -sum_rows P_sink Delta.
  void compute_dsinks() {
    for (std::size_t h = 0; h < p_.H; ++h) {
      const float sink = o_.sinks[h];
      double s = 0.0;
      for (std::size_t b = 0; b < p_.B; ++b) {
        for (std::size_t i = 0; i < p_.n_q; ++i) {
          const std::size_t r = (b * p_.H + h) * p_.n_q + i;
          const double ps = sink == -std::numeric_limits<float>::infinity()
                                ? 0.0
                                : std::exp(static_cast<double>(sink) -
                                           static_cast<double>(io_.lse[r]));
          const double dl = delta_[r];
          if (ps != 0.0 || std::isnan(dl)) s -= ps * dl;
        }
      }
      grads_.dsinks[h] = static_cast<float>(s);
    }
  }

  // Each block of rows packed once for every key block: Q and dO
  // transposed ([d][max_rows] then [dv][max_rows], zeros past the block's
  // rows), and which rows hold inf or NaN. O(rows (d + dv)) floats.
  // (ScoreTile loads the transposed rows aligned: 64-byte aligned blocks.)
  void pack_rows() {
    packed_store_.assign(p_.B * p_.Hkv * row_blocks_ * pack_floats_ + 16, 0.0f);
    packed_ = reinterpret_cast<float*>(
        (reinterpret_cast<std::uintptr_t>(packed_store_.data()) + 63) &
        ~std::uintptr_t{63});
    q_bad_.assign(rows_total_, 0);
    do_bad_.assign(rows_total_, 0);
    detail::for_each_index(
        p_.B * p_.Hkv * row_blocks_, parallel_, [&](std::size_t blk) {
          const std::size_t rb = blk % row_blocks_;
          const std::size_t kh = (blk / row_blocks_) % p_.Hkv;
          const std::size_t b = blk / (row_blocks_ * p_.Hkv);
          const std::size_t row0 = rb * max_rows_;
          const std::size_t cnt = std::min(max_rows_, group_rows_ - row0);
          float* qt = packed_ + blk * pack_floats_;
          float* dot = qt + p_.d * max_rows_;
          std::fill(qt, qt + pack_floats_, 0.0f);
          for (std::size_t r = 0; r < cnt; ++r) {
            const std::size_t row = row0 + r;
            const std::size_t h = kh * p_.g + row / p_.n_q, i = row % p_.n_q;
            const float* qr = q_.row(b, h, i);
            const float* gr = io_.dout.row(b, h, i);
            bool qb = false, gb = false;
            for (std::size_t c = 0; c < p_.d; ++c) {
              qt[c * max_rows_ + r] = qr[c];
              qb = qb || !std::isfinite(qr[c]);
            }
            for (std::size_t c = 0; c < p_.dv; ++c) {
              dot[c * max_rows_ + r] = gr[c];
              gb = gb || !std::isfinite(gr[c]);
            }
            const std::size_t at = (b * p_.H + h) * p_.n_q + i;
            q_bad_[at] = qb ? 1 : 0;
            do_bad_[at] = gb ? 1 : 0;
          }
        });
  }

  void prepare(BackBuffers& buf) const {
    buf.scratch.resize(detail::attention_backward_scratch_floats(p_.d, p_.dv));
    buf.dk_tile.resize(detail::kKeyTile * dpad_);
    buf.dv_tile.resize(detail::kKeyTile * dvpad_);
    buf.dk.resize(detail::kKeyTile * dpad_);
    buf.dv.resize(detail::kKeyTile * dvpad_);
    buf.dq.resize(p_.d * detail::kMaxKernelRows);
  }

  void setup(Call& c, BackBuffers& buf, std::size_t b, std::size_t kh,
             std::size_t row0, std::size_t cnt, std::size_t j0,
             std::size_t kb) const {
    fill_row_tables(p_, p_, o_, req_q_, nullptr, b, b, 0, kh, row0, cnt, c.t);
    const bool want_dbias = !grads_.dbias.empty();
    for (std::size_t r = 0; r < cnt; ++r) {
      const std::size_t row = row0 + r;
      const std::size_t h = kh * p_.g + row / p_.n_q, i = row % p_.n_q;
      const std::size_t at = (b * p_.H + h) * p_.n_q + i;
      c.do_rows[r] = io_.dout.row(b, h, i);
      c.q_bad[r] = q_bad_[at];
      c.do_bad[r] = do_bad_[at];
      c.lse[r] = io_.lse[at];
      c.delta[r] = delta_f_[at];
      c.share[r] = share_.empty() ? 0.0f : share_[at];
      // The kernel writes key j at column j: the row from mask_col0 on.
      c.dbias[r] =
          want_dbias ? grads_.dbias.row(b, h, i) + p_.mask_col0 : nullptr;
    }
    detail::AttnBackArgs& a = c.a;
    a = detail::AttnBackArgs{};
    a.f.kv_type = detail::kKvF32;
    a.f.k = k_.row(b, kh, 0);
    a.f.k_stride = k_.row_stride;
    a.f.v = v_.row(b, kh, 0);
    a.f.v_stride = v_.row_stride;
    a.f.d = p_.d;
    a.f.dv = p_.dv;
    a.f.j_begin = j0;
    a.f.j_end = j0 + kb;
    a.f.scale = p_.scale;
    a.f.softcap = p_.softcap;
    a.f.rows = cnt;
    a.f.q_rows = c.t.q;
    a.f.first_key = c.t.first;
    a.f.last_key = c.t.last;
    a.f.mask_rows = o_.mask.empty() ? nullptr : c.t.mask;
    a.f.bias_rows = o_.bias.empty() ? nullptr : c.t.bias;
    if (!o_.alibi_slopes.empty()) {
      a.f.alibi_slopes = c.t.alibi;
      a.f.alibi_base = c.t.alibi_base;
      a.f.alibi_stride = static_cast<double>(p_.kv_stride);
    }
    a.f.scratch = buf.scratch.data();
    a.qt = packed_ +
           ((b * p_.Hkv + kh) * row_blocks_ + row0 / max_rows_) * pack_floats_;
    a.dot = a.qt + p_.d * max_rows_;
    a.bq = max_rows_;
    a.do_rows = c.do_rows;
    a.q_bad = c.q_bad;
    a.do_bad = c.do_bad;
    a.lse = c.lse;
    a.delta = c.delta;
    a.inf_share = c.share;
    a.dv_tile = buf.dv_tile.data();
    a.dk_tile = buf.dk_tile.data();
    a.dv_acc = buf.dv.data();
    a.dv_stride = dvpad_;
    a.dk_acc = buf.dk.data();
    a.dk_stride = dpad_;
    // The last call of a group of kBackRowGroup rows (or of the rows).
    a.flush =
        (row0 + cnt) % detail::kBackRowGroup == 0 || row0 + cnt == group_rows_;
    a.dq = buf.dq.data();
    a.dq_stride = max_rows_;
    a.dbias_rows = want_dbias ? c.dbias : nullptr;
  }

  static bool sees(const RowTables& t, std::size_t cnt, std::size_t j0,
                   std::size_t kb) {
    const KeyHull hull = row_hull(t.first, t.last, cnt);
    return !hull.empty() && hull.lo < j0 + kb && hull.hi >= j0;
  }

  // Rows whose lse is +inf: 1/k, k their count of +inf scores (the
  // forward's limit), counted by the kernel on the calling thread.
  void inf_shares() {
    std::vector<double> infs(rows_total_, 0.0);
    BackBuffers& buf = thread_buffers();
    prepare(buf);
    Call c;
    for (std::size_t b = 0; b < p_.B; ++b) {
      for (std::size_t kh = 0; kh < p_.Hkv; ++kh) {
        for (std::size_t rb = 0; rb < row_blocks_; ++rb) {
          const std::size_t row0 = rb * max_rows_;
          const std::size_t cnt = std::min(max_rows_, group_rows_ - row0);
          double counts[detail::kMaxKernelRows] = {};
          for (std::size_t kbi = 0; kbi < key_blocks_; ++kbi) {
            const std::size_t j0 = p_.kv_begin + kbi * detail::kKeyTile;
            const std::size_t kb = std::min(detail::kKeyTile, p_.kv_end - j0);
            setup(c, buf, b, kh, row0, cnt, j0, kb);
            if (!sees(c.t, cnt, j0, kb)) continue;
            c.a.inf_count = counts;
            detail::attention_backward_kernel(c.a);
          }
          for (std::size_t r = 0; r < cnt; ++r) {
            const std::size_t row = row0 + r;
            const std::size_t h = kh * p_.g + row / p_.n_q, i = row % p_.n_q;
            infs[(b * p_.H + h) * p_.n_q + i] = counts[r];
          }
        }
      }
    }
    share_.assign(rows_total_, 0.0f);
    for (std::size_t r = 0; r < rows_total_; ++r) {
      if (io_.lse[r] == std::numeric_limits<float>::infinity() && infs[r] > 0) {
        share_[r] = static_cast<float>(1.0 / infs[r]);
      }
    }
  }

  // dQ in double, each block of rows transposed as the kernel writes its
  // tile ([d][max_rows] per block: the adds run along memory).
  double& acc_at(std::size_t b, std::size_t h, std::size_t i, std::size_t c) {
    const std::size_t kh = h / p_.g;
    const std::size_t row = (h - kh * p_.g) * p_.n_q + i;
    const std::size_t blk = (b * p_.Hkv + kh) * row_blocks_ + row / max_rows_;
    return dq_acc_[blk * acc_floats_ + c * max_rows_ + row % max_rows_];
  }

  // The tasks: one per key block of each KV head, each running every row
  // block; a partial's dQ sums are copied in first and back at the end (the
  // same additions, in the same order, as adding into the partial itself).
  void run_key_blocks() {
    dq_acc_.assign(p_.B * p_.Hkv * row_blocks_ * acc_floats_, 0.0);
    if (part_ != nullptr) {
      for (std::size_t r = 0; r < rows_total_; ++r) {
        const std::size_t i = r % p_.n_q, h = (r / p_.n_q) % p_.H,
                          b = r / (p_.n_q * p_.H);
        for (std::size_t c = 0; c < p_.d; ++c)
          acc_at(b, h, i, c) = part_->dq[r * p_.d + c];
      }
    }
    const std::size_t counters = p_.B * p_.Hkv * row_blocks_;
    done_.reset(new std::atomic<std::uint32_t>[counters]);
    for (std::size_t i = 0; i < counters; ++i) {
      done_[i].store(0, std::memory_order_relaxed);
    }
    const std::size_t tasks = p_.B * p_.Hkv * key_blocks_;
    detail::for_each_index<detail::Schedule::kDynamic>(
        tasks, parallel_ && tasks > 1,
        [&](std::size_t task) { key_block(task); });
  }

  // A group's float chains that end in a row block seeing none of these
  // keys: added into the double sums.
  static void flush_tiles(BackBuffers& buf) {
    for (std::size_t x = 0; x < buf.dk.size(); ++x) {
      buf.dk[x] += static_cast<double>(buf.dk_tile[x]);
    }
    for (std::size_t x = 0; x < buf.dv.size(); ++x) {
      buf.dv[x] += static_cast<double>(buf.dv_tile[x]);
    }
    std::fill(buf.dk_tile.begin(), buf.dk_tile.end(), 0.0f);
    std::fill(buf.dv_tile.begin(), buf.dv_tile.end(), 0.0f);
  }

  void key_block(std::size_t task) {
    const std::size_t kbi = task % key_blocks_;
    const std::size_t kh = (task / key_blocks_) % p_.Hkv;
    const std::size_t b = task / (key_blocks_ * p_.Hkv);
    const std::size_t j0 = p_.kv_begin + kbi * detail::kKeyTile;
    const std::size_t kb = std::min(detail::kKeyTile, p_.kv_end - j0);
    BackBuffers& buf = thread_buffers();
    prepare(buf);
    std::fill(buf.dk.begin(), buf.dk.end(), 0.0);
    std::fill(buf.dv.begin(), buf.dv.end(), 0.0);
    std::fill(buf.dk_tile.begin(), buf.dk_tile.end(), 0.0f);
    std::fill(buf.dv_tile.begin(), buf.dv_tile.end(), 0.0f);
    Call c;
    // Whether the float tiles hold chains not yet added into double.
    bool dirty = false;
    for (std::size_t rb = 0; rb < row_blocks_; ++rb) {
      const std::size_t row0 = rb * max_rows_;
      const std::size_t cnt = std::min(max_rows_, group_rows_ - row0);
      setup(c, buf, b, kh, row0, cnt, j0, kb);
      const bool run = sees(c.t, cnt, j0, kb);
      if (run) {
        detail::attention_backward_kernel(c.a);
        dirty = !c.a.flush;
      } else if (dirty && c.a.flush) {
        flush_tiles(buf);
        dirty = false;
      }
      add_dq_in_turn((b * p_.Hkv + kh) * row_blocks_ + rb, kbi,
                     run ? buf.dq.data() : nullptr);
    }
    write_keys(buf, b, kh, j0, kb);
  }

  // Waits until the key blocks before kbi have added their dQ into row
  // block blk, adds this one's tile (null: nothing) and lets the next go.
  void add_dq_in_turn(std::size_t blk, std::size_t kbi, const float* tile) {
    std::atomic<std::uint32_t>& turn = done_[blk];
    for (unsigned spins = 0; turn.load(std::memory_order_acquire) != kbi;
         ++spins) {
      pause_briefly(spins);
    }
    if (tile != nullptr) {
      double* acc = dq_acc_.data() + blk * acc_floats_;
      for (std::size_t x = 0; x < acc_floats_; ++x) {
        acc[x] += static_cast<double>(tile[x]);
      }
    }
    turn.store(static_cast<std::uint32_t>(kbi + 1), std::memory_order_release);
  }

  // A key block's dK and dV: added into the partial, or rounded.
  void write_keys(const BackBuffers& buf, std::size_t b, std::size_t kh,
                  std::size_t j0, std::size_t kb) {
    const double scale = static_cast<double>(p_.scale);
    for (std::size_t j = 0; j < kb; ++j) {
      const double* ka = buf.dk.data() + j * dpad_;
      const double* va = buf.dv.data() + j * dvpad_;
      const std::size_t key = (b * p_.Hkv + kh) * p_.n_kv + j0 + j;
      if (part_ != nullptr) {
        double* pk = part_->dk.data() + key * p_.d;
        double* pv = part_->dv_sum.data() + key * p_.dv;
        for (std::size_t cc = 0; cc < p_.d; ++cc) pk[cc] += ka[cc];
        for (std::size_t cc = 0; cc < p_.dv; ++cc) pv[cc] += va[cc];
        continue;
      }
      float* dkr = grads_.dk.row(b, kh, j0 + j);
      float* dvr = grads_.dv.row(b, kh, j0 + j);
      for (std::size_t cc = 0; cc < p_.d; ++cc) {
        dkr[cc] = static_cast<float>(scale * ka[cc]);
      }
      for (std::size_t cc = 0; cc < p_.dv; ++cc) {
        dvr[cc] = static_cast<float>(va[cc]);
      }
    }
  }

  void write_dq() {
    if (part_ != nullptr) {
      for (std::size_t r = 0; r < rows_total_; ++r) {
        const std::size_t i = r % p_.n_q, h = (r / p_.n_q) % p_.H,
                          b = r / (p_.n_q * p_.H);
        for (std::size_t c = 0; c < p_.d; ++c)
          part_->dq[r * p_.d + c] = acc_at(b, h, i, c);
      }
      return;
    }
    const double scale = static_cast<double>(p_.scale);
    detail::for_each_index(
        rows_total_, parallel_ && rows_total_ >= 64, [&](std::size_t r) {
          const std::size_t i = r % p_.n_q;
          const std::size_t h = (r / p_.n_q) % p_.H;
          const std::size_t b = r / (p_.n_q * p_.H);
          float* o = grads_.dq.row(b, h, i);
          for (std::size_t c = 0; c < p_.d; ++c) {
            o[c] = static_cast<float>(scale * acc_at(b, h, i, c));
          }
        });
  }

  const Plan& p_;
  const AttentionOptions& o_;
  const AttentionBackwardIO& io_;
  const AttentionGradients& grads_;
  AttentionGradientPartial* part_;
  const TensorView<const float>& q_;
  const TensorView<const float>& k_;
  const TensorView<const float>& v_;
  const QueryTensor& req_q_;
  const std::size_t rows_total_, max_rows_, group_rows_, row_blocks_,
      key_blocks_, dpad_, dvpad_, pack_floats_, acc_floats_;
  bool parallel_ = false;
  std::vector<double> delta_;
  std::vector<float> delta_f_, share_, packed_store_;
  float* packed_ = nullptr;
  std::vector<std::uint8_t> q_bad_, do_bad_;
  std::vector<double> dq_acc_;
  std::unique_ptr<std::atomic<std::uint32_t>[]> done_;
};

}  // namespace

void run_gradients(const AttentionPlan& plan) { BackwardRunner(plan).run(); }

}  // namespace detail::attn

}  // namespace softdot
