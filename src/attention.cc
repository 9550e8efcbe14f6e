// softdot: attention() and attention_partial(): the split into kernel
// calls, threads, the merge of decode chunks and the final normalisation
// (the argument checks are in attention_checks.cc; attention_merge(),
// attention_finalize() and attention_scores()/attention_weights() have
// files of their own).
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
// so the bits do not either. A paged cache (paged_attention) gives each
// sequence b its own n_kv = seq_lens[b], hence its own positions, key range
// and chunk count; the tasks run the longest sequence's chunk count and skip
// a sequence's chunks past its own, so each sequence is split (and its bits
// are) as attention() on that sequence alone.
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
#include <type_traits>
#include <vector>

#include "attention_checks.h"
#include "attention_rows.h"
#include "kernels/attention_args.h"
#include "kernels/dispatch.h"
#include "kernels/state_merge.h"
#include "parallel.h"
#include "softdot/attention_request.h"

namespace softdot {

namespace {

using namespace detail::attn;

// A per-thread buffer that only grows, so that repeated calls (decode
// steps) do not allocate, zero and fault in the scratch every time
// (attention_scratch_floats: 204 KB at d = d_v = 128, attention.h). Slot 0:
// the calling thread's chunk states; slot 1: kernel scratch; slot 2: the
// widened rows of a 16-bit query. Uninitialised.
template <class T>
T* thread_buffer(int slot, std::size_t n) {
  struct Buf {
    std::unique_ptr<double[]> p;
    std::size_t size = 0;
  };
  thread_local Buf bufs[3];
  Buf& b = bufs[slot];
  const std::size_t doubles =
      (n * sizeof(T) + sizeof(double) - 1) / sizeof(double);
  if (b.size < doubles) {
    b.p.reset(new double[doubles]);
    b.size = doubles;
  }
  return reinterpret_cast<T*>(b.p.get());
}

}  // namespace

namespace detail::attn {

// Query row (b, h, i): its address, or, for a 16-bit query, its values
// widened (exactly) into dst (d floats).
const float* query_row(const QueryTensor& q, std::size_t b, std::size_t h,
                       std::size_t i, std::size_t d, float* dst) {
  if (const auto* f = q.f32()) return f->row(b, h, i);
  std::visit(
      [&](const auto& t) {
        using T = std::remove_const_t<std::remove_pointer_t<decltype(t.data)>>;
        if constexpr (!std::is_same_v<T, float>) {
          // to_float's values, in vectors (dispatch.h).
          static_assert(sizeof(T) == sizeof(std::uint16_t));
          detail::widen16(
              reinterpret_cast<const std::uint16_t*>(t.row(b, h, i)), d, dst,
              std::is_same_v<T, BFloat16>);
        }
      },
      q.variant());
  return dst;
}

// Rows row0 .. row0 + cnt - 1 of KV head kh of sequence b (row r is query
// head kh g + r / n_q, query i = r % n_q, n_q the sequence's own); ps is
// the sequence's plan, and its query i is q's row (q_batch, h, q_row0 + i).
// A 16-bit query's rows are widened into widened (cnt * d floats).
void fill_row_tables(const Plan& p, const Plan& ps, const AttentionOptions& o,
                     const QueryTensor& q, float* widened, std::size_t b,
                     std::size_t q_batch, std::size_t q_row0, std::size_t kh,
                     std::size_t row0, std::size_t cnt, RowTables& t) {
  for (std::size_t r = 0; r < cnt; ++r) {
    const std::size_t row = row0 + r;
    const std::size_t h = kh * p.g + row / ps.n_q;
    const std::size_t i = row % ps.n_q;
    t.q[r] = query_row(q, q_batch, h, q_row0 + i, p.d,
                       widened != nullptr ? widened + r * p.d : nullptr);
    visible_keys(ps, i, t.first[r], t.last[r]);
    // A mask or bias of 0 columns (n_kv = 0) spans nothing: its strides
    // are unchecked and it has nothing to read (fuzz_attention). (A ragged
    // batch has neither.)
    if (!o.mask.empty() && o.mask.cols != 0) {
      const std::size_t mb = o.mask.batch == 1 ? 0 : b;
      const std::size_t mh = o.mask.heads == 1 ? 0 : h;
      t.mask[r] = reinterpret_cast<const std::uint8_t*>(o.mask.row(mb, mh, i)) +
                  ps.mask_col0;
    }
    if (!o.bias.empty() && o.bias.cols != 0) {
      const std::size_t bb = o.bias.batch == 1 ? 0 : b;
      const std::size_t bh = o.bias.heads == 1 ? 0 : h;
      t.bias[r] = o.bias.row(bb, bh, i) + ps.mask_col0;
    }
    if (!o.sinks.empty()) t.sinks[r] = o.sinks[h];
    if (!o.alibi_slopes.empty()) {
      t.alibi[r] = o.alibi_slopes[h];
      t.alibi_base[r] = static_cast<double>(alibi_base(ps, i));
    }
  }
}

KeyHull row_hull(const std::int32_t* first, const std::int32_t* last,
                 std::size_t n) {
  KeyHull h;
  for (std::size_t r = 0; r < n; ++r) h.add(first[r], last[r]);
  return h;
}

// Query rows i0 .. i1 - 1 of a sequence (any head: the rows of all heads
// see the same keys).
KeyHull visible_hull(const Plan& ps, std::size_t i0, std::size_t i1) {
  KeyHull h;
  for (std::size_t i = i0; i < i1; ++i) {
    std::int32_t first = 0, last = 0;
    visible_keys(ps, i, first, last);
    h.add(first, last);
  }
  return h;
}

// A sink logit merged into a finished row state as the state (sink, 1, 0)
// (batch_invariant merges it last), by merge_row_state; a -inf sink adds
// nothing (as InitialState), a NaN one makes the row NaN.
void merge_sink(float& m, double& l, double* acc, float sink, std::size_t dv) {
  if (sink == -std::numeric_limits<float>::infinity()) return;
  detail::merge_row_state(m, l, acc, sink, 1.0, nullptr, dv);
}

// Where the kernel reads KV head kh of batch b: the first row of K and V
// (and of the int8 scales) and their strides; paged, the rows of this KV
// head in page 0 and sequence b's row of the table.
template <class KT>
void set_kv_args(detail::AttnArgs& a, const KVViews<KT>& kv,
                 const PagedKVTable* table, std::size_t b, std::size_t kh) {
  constexpr bool kInt8 = std::is_same_v<KT, std::int8_t>;
  a.kv_type = kv_type<KT>();
  const std::size_t kb = table ? 0 : b;
  // A view with no keys spans nothing, so its strides were not checked
  // against anything and may point anywhere: its base pointer, not a
  // row's (computing that row's address overflowed: fuzz_attention).
  auto first_row = [kb, kh](const auto& t) {
    return t.rows == 0 ? t.data : t.row(kb, kh, 0);
  };
  a.k = first_row(kv.k);
  a.k_stride = kv.k.row_stride;
  a.v = first_row(kv.v);
  a.v_stride = kv.v.row_stride;
  if (kInt8) {
    a.k_scale = first_row(kv.k_scales);
    a.k_scale_stride = kv.k_scales.row_stride;
    a.v_scale = first_row(kv.v_scales);
    a.v_scale_stride = kv.v_scales.row_stride;
  }
  if (table) {
    a.block_table = table->block_table.data() + b * table->blocks_per_seq;
    a.page_size = kv.k.rows;
    a.k_page_stride = kv.k.batch_stride;
    a.v_page_stride = kv.v.batch_stride;
    if (kInt8) {
      a.k_scale_page_stride = kv.k_scales.batch_stride;
      a.v_scale_page_stride = kv.v_scales.batch_stride;
    }
  }
}

// The rows of a checked plan: finalised into the output and lse, or kept as
// the partial result (AttentionPartial). With a paged source (k and v are
// the pages) each sequence has its own n_kv; int8 K and V come with their
// scales.
template <class KT>
void run_rows(const AttentionPlan& plan, const KVViews<KT>& kv) {
  const AttentionRequest& req = plan.request();
  const Plan& p = plan.data();
  const AttentionOptions& o = req.options;
  const QueryTensor& q = req.q;
  const OutputTensor& out = req.target.out;
  const bool q16 = q.format() != KVFormat::kFloat32;
  // bfloat16 queries, keys and values run their prefill products on the
  // units matrix_unit() names (simd.h); precise keeps float products.
  unsigned units = 0;
  if constexpr (std::is_same_v<KT, BFloat16>) {
    if (q.format() == KVFormat::kBFloat16 && !o.precise) {
      units = detail::attention_units();
    }
  }
  const bool pv_split = o.unit_weights == AttentionOptions::UnitWeights::kSplit;
  const bool invariant = o.batch_invariant;
  float* lse = req.target.lse;
  AttentionPartial* partial = req.target.kind == AttentionTarget::Kind::kPartial
                                  ? req.target.partial
                                  : nullptr;
  const PagedKVTable* table = req.kv.paged ? &req.kv.table : nullptr;
  // A ragged batch (query_start_loc, paged only): sequence b's rows are rows
  // query_start_loc[b] .. query_start_loc[b + 1] - 1 of the packed query
  // (batch 1), its output and lse rows the same.
  const bool ragged = table != nullptr && !table->query_start_loc.empty();
  if (partial) {
    partial->batch = ragged ? 1 : p.B;
    partial->heads = p.H;
    partial->rows = p.n_q;
    partial->dv = p.dv;
    const std::size_t n = partial->batch * p.H * p.n_q;
    partial->max.resize(n);
    partial->sum.resize(n);
    partial->out.resize(n * p.dv);
  }
  const std::size_t max_rows = detail::attention_max_rows();
  const std::size_t rows_cap = std::min(max_rows, detail::kMaxKernelRows);
  const std::size_t dv = p.dv;

  // Per sequence: its plan (its own n_kv and n_q when paged or ragged),
  // where its rows lie, its form, its tasks and its chunk states. Every
  // choice depends on the sequence's own shape only (never on the other
  // sequences, the thread count or the SIMD target), so a sequence's bits
  // are those of the same call on that sequence alone.
  struct Seq {
    Plan plan;
    std::size_t q_batch = 0,
                q_row0 = 0;    // row i: q row (q_batch, h, q_row0 + i)
    std::size_t rows = 0;      // g n_q: rows per KV head
    bool split = false;        // the decode form's chunks
    bool split_units = false;  // ... on the units
    // batch_invariant with more than kDecodeRows rows per KV head: groups of
    // kDecodeMaxRows rows, each task folding its group's chunks in order.
    bool grouped = false;
    std::size_t row_blocks = 0, chunks = 1;
    // The first chunk's index: chunk c covers keys chunk_base + (chunk0 +
    // c) kDecodeChunk onwards (chunk_base is kv_begin by default, 0 with
    // batch_invariant: chunks at fixed key indices).
    std::size_t chunk0 = 0, chunk_base = 0;
    bool no_keys = false;    // batch_invariant: no row sees a key
    std::size_t task0 = 0;   // its first task
    std::size_t state0 = 0;  // a split sequence's first chunk-state row
    // A draft tree (draft_parents): row i's mask at tree_masks[tree0 + i
    // n_kv] (n_kv bytes, 1 = visible), kNoTree without one.
    std::size_t tree0 = kNoTree;
    // The decode form's chunks as tasks of their own (one row block, the
    // states merged by merge_group); else one chunk per task.
    bool chunked() const { return split && !grouped; }
  };
  // The draft trees' masks: per row, the prefix and its ancestors.
  // (A reference: the tasks on other threads must see the calling
  // thread's buffer, not their own.)
  thread_local std::vector<std::uint8_t> tree_buffer;
  std::vector<std::uint8_t>& tree_masks = tree_buffer;
  tree_masks.clear();
  const bool trees = table != nullptr && !table->draft_parents.empty();
  thread_local std::vector<Seq> seq_buffer;
  std::vector<Seq>& seqs = seq_buffer;
  seqs.assign(p.B, Seq{});
  std::size_t tasks = 0, split_states = 0;
  double work = 0.0;
  for (std::size_t b = 0; b < p.B; ++b) {
    Seq& s = seqs[b];
    std::size_t n_q = p.n_q;
    if (ragged) {
      s.q_row0 = static_cast<std::size_t>(table->query_start_loc[b]);
      n_q = static_cast<std::size_t>(table->query_start_loc[b + 1]) - s.q_row0;
    } else {
      s.q_batch = b;
    }
    s.plan =
        table ? positioned_plan(
                    sequence_plan(
                        p, static_cast<std::size_t>(table->seq_lens[b]), n_q),
                    *table, b)
              : p;
    s.rows = p.g * n_q;
    s.task0 = tasks;
    if (s.rows == 0) continue;  // a ragged sequence without rows: no task
    if (trees) {
      // Checked: n_q <= n_kv and every parent before its row.
      const std::size_t n_kv = s.plan.n_kv, pre = n_kv - n_q;
      const std::size_t p0 = ragged ? s.q_row0 : b * p.n_q;
      s.tree0 = tree_masks.size();
      tree_masks.resize(s.tree0 + n_q * n_kv, 0);
      for (std::size_t i = 0; i < n_q; ++i) {
        std::uint8_t* row = tree_masks.data() + s.tree0 + i * n_kv;
        std::fill(row, row + pre, std::uint8_t{1});
        for (auto a = static_cast<std::int64_t>(i); a >= 0;
             a = table->draft_parents[p0 + static_cast<std::size_t>(a)]) {
          row[pre + static_cast<std::size_t>(a)] = 1;
        }
      }
    }
    // precise runs in the prefill form only (whatever the rows).
    s.split = s.rows <= kDecodeRows && !o.precise && !o.prefill_form;
    s.grouped = invariant && !s.split;
    s.split = s.split || s.grouped;
    // A split KV head with enough rows to fill the units' lanes runs its
    // chunks in the prefill form on the units (rows in lanes: a few rows
    // would leave most lanes idle, and the decode form reads K and V at the
    // memory's speed there). Not with batch_invariant (the units round
    // differently from the decode form).
    s.split_units =
        s.split && !invariant && units != 0 && s.rows >= kUnitsDecodeMinRows;
    s.row_blocks = s.grouped ? (s.rows + detail::kDecodeMaxRows - 1) /
                                   detail::kDecodeMaxRows
                   : s.split ? 1
                             : (s.rows + max_rows - 1) / max_rows;
    const std::size_t range = s.plan.kv_end - s.plan.kv_begin;
    s.chunk_base = invariant ? 0 : s.plan.kv_begin;
    if (s.chunked()) {
      if (invariant) {
        // The chunks (at fixed key indices) that hold a key some row sees.
        const KeyHull hull = visible_hull(s.plan, 0, n_q);
        s.no_keys = hull.empty();
        s.chunk0 = s.no_keys ? 0 : hull.lo / kDecodeChunk;
        s.chunks = s.no_keys ? 1 : hull.hi / kDecodeChunk - s.chunk0 + 1;
      } else {
        s.chunks =
            std::max<std::size_t>(1, (range + kDecodeChunk - 1) / kDecodeChunk);
      }
      s.state0 = split_states;
      split_states += p.Hkv * s.chunks * s.rows;
    }
    tasks += p.Hkv * s.row_blocks * s.chunks;
    work += static_cast<double>(p.H * n_q) * static_cast<double>(range) *
            static_cast<double>(p.d + dv);
  }
  // A finished row i of sequence b, head h: finalised, or kept as a
  // partial result.
  auto emit = [&](const Seq& s, std::size_t h, std::size_t i, float m, double l,
                  const double* acc) {
    const std::size_t row = s.q_row0 + i;
    const std::size_t r = (s.q_batch * p.H + h) * p.n_q + row;
    if (partial) {
      partial->max[r] = m;
      partial->sum[r] = l;
      std::copy(acc, acc + dv, partial->out.data() + r * dv);
    } else {
      std::visit(
          [&](const auto& t) {
            detail::finalize_row_state(m, l, acc, dv, t.row(s.q_batch, h, row),
                                       lse ? lse + r : nullptr);
          },
          out.variant());
    }
  };

  // Per-thread scratch and row tables; states: the split sequences' chunk
  // states (by sequence, KV head, chunk and row), then one block of rows per
  // thread for the others. They live in the calling thread's reusable
  // buffer.
  const int threads = omp_get_max_threads();
  const std::size_t scratch_floats =
      detail::attention_scratch_floats(p.d, dv, o.precise, units != 0);
  const std::size_t q16_floats =
      q16 ? std::max(max_rows, detail::kDecodeMaxRows) * p.d : 0;
  // Per thread: one kernel call's rows, or a group's running state and
  // its chunk's state (grouped).
  const std::size_t thread_rows =
      std::max(rows_cap, 2 * detail::kDecodeMaxRows);
  const std::size_t n_states =
      split_states + static_cast<std::size_t>(threads) * thread_rows;
  double* states = thread_buffer<double>(0, n_states * (dv + 2));
  double* st_l = states;
  double* st_o = states + n_states;
  float* st_m = reinterpret_cast<float*>(states + n_states * (dv + 1));

  const bool parallel = tasks > 1 && work >= 4.0 * detail::kParallelElements;
  // Rows row0 .. row0 + cnt - 1 of sequence s (numbered as in
  // fill_row_tables) read their draft tree's masks.
  auto set_tree_masks = [&](const Seq& s, std::size_t row0, std::size_t cnt,
                            RowTables& rows) {
    if (s.tree0 == kNoTree) return;
    for (std::size_t r = 0; r < cnt; ++r) {
      const std::size_t i = (row0 + r) % s.plan.n_q;
      rows.mask[r] = tree_masks.data() + s.tree0 + i * s.plan.n_kv;
    }
  };

  std::exception_ptr error;
  bool failed = false;
  auto run_task = [&](std::size_t t) {
    if (failed) return;
    // Only the scratch allocation can throw (std::bad_alloc); an exception
    // must not leave an OpenMP region, so it is carried out.
    float* scratch_ptr = nullptr;
    float* widened = nullptr;
    try {
      scratch_ptr = thread_buffer<float>(1, scratch_floats);
      if (q16) widened = thread_buffer<float>(2, q16_floats);
    } catch (...) {
#pragma omp critical(softdot_attention_error)
      {
        if (!failed) error = std::current_exception();
        failed = true;
      }
      return;
    }
    const int tid = omp_get_thread_num();
    // The sequence: the last whose first task is at or before t (one
    // without tasks shares its first task with the next, which has them).
    const auto it = std::upper_bound(
        seqs.begin(), seqs.end(), t,
        [](std::size_t x, const Seq& s) { return x < s.task0; });
    const std::size_t b = static_cast<std::size_t>(it - seqs.begin()) - 1;
    const Seq& s = seqs[b];
    // The order of the tasks never changes the bits. Decode chunks: the KV
    // heads vary fastest, so consecutive tasks read the same keys of every
    // KV head and a page whose rows interleave the heads (vLLM's NHD layout)
    // is read whole while it is in cache, rather than once per head. Row
    // blocks: the blocks vary fastest, so consecutive tasks reuse one KV
    // head's keys from cache.
    const std::size_t rest = t - s.task0;
    const bool chunked = s.chunked();  // row_blocks 1, else chunks 1
    const std::size_t kh = chunked ? rest % p.Hkv : rest / s.row_blocks;
    const std::size_t rb = chunked ? 0 : rest % s.row_blocks;
    const std::size_t chunk = chunked ? rest / p.Hkv : 0;
    const Plan& ps = s.plan;
    const std::size_t block_rows =
        s.grouped ? detail::kDecodeMaxRows : max_rows;
    const std::size_t r0 = rb * block_rows;
    const std::size_t nr = chunked ? s.rows : std::min(block_rows, s.rows - r0);

    const std::size_t state_row =
        chunked ? s.state0 + (kh * s.chunks + chunk) * s.rows
                : split_states + static_cast<std::size_t>(tid) * thread_rows;
    float* out_m = st_m + state_row;
    double* out_l = st_l + state_row;
    double* out_o = st_o + state_row * dv;
    // Kernel calls of at most max_rows rows (a split KV head may have more
    // rows than a scalar target's kernel takes).
    const bool decode = s.split && !s.split_units;
    const std::size_t step = decode ? detail::kDecodeMaxRows : max_rows;
    // One kernel call: rows r0 + s0 .. + cnt - 1 over chunk c (split) or
    // the whole key range, its states at m, l and acc.
    auto call = [&](std::size_t cnt, const RowTables& rows, std::size_t c,
                    bool empty, float* m, double* l, double* acc) {
      detail::AttnArgs a;
      set_kv_args(a, kv, table, b, kh);
      a.d = p.d;
      a.dv = dv;
      a.j_begin = s.chunk_base + c * kDecodeChunk;
      a.j_end =
          s.split ? std::min(ps.kv_end, a.j_begin + kDecodeChunk) : ps.kv_end;
      if (empty) a.j_end = a.j_begin;
      a.prefetch_end = ps.kv_end;
      a.scale = p.scale;
      a.softcap = p.softcap;
      a.rows = cnt;
      a.decode = decode;
      a.precise = o.precise;
      a.units = decode ? 0 : units;
      a.pv_split = pv_split;
      a.q_rows = rows.q;
      a.first_key = rows.first;
      a.last_key = rows.last;
      a.mask_rows = o.mask.empty() && !trees ? nullptr : rows.mask;
      a.bias_rows = o.bias.empty() ? nullptr : rows.bias;
      if (!o.alibi_slopes.empty()) {
        a.alibi_slopes = rows.alibi;
        a.alibi_base = rows.alibi_base;
        a.alibi_stride = static_cast<double>(ps.kv_stride);
      }
      // With a split, the sinks go into the first chunk only; with
      // batch_invariant they are merged after the last.
      a.sinks = (!o.sinks.empty() && c == s.chunk0 && !invariant) ? rows.sinks
                                                                  : nullptr;
      a.scratch = scratch_ptr;
      a.out_m = m;
      a.out_l = l;
      a.out_o = acc;
      // An empty range (j_begin >= j_end) runs no block: the kernel returns
      // the initial state, the identity or the sink alone.
      detail::attention_kernel(a);
    };
    if (s.grouped) {
      // A group of at most kDecodeMaxRows rows: the chunks that hold a key
      // one of its rows sees, folded in chunk order as merge_group folds a
      // split sequence's (chunk states at out_*, chunk temporaries after).
      RowTables rows;
      fill_row_tables(p, ps, o, q, widened, b, s.q_batch, s.q_row0, kh, r0, nr,
                      rows);
      set_tree_masks(s, r0, nr, rows);
      const KeyHull hull = row_hull(rows.first, rows.last, nr);
      const std::size_t c_lo = hull.empty() ? 0 : hull.lo / kDecodeChunk;
      const std::size_t c_hi = hull.empty() ? 0 : hull.hi / kDecodeChunk;
      float* tm = out_m + detail::kDecodeMaxRows;
      double* tl = out_l + detail::kDecodeMaxRows;
      double* to = out_o + detail::kDecodeMaxRows * dv;
      for (std::size_t c = c_lo; c <= c_hi; ++c) {
        const bool first = c == c_lo;
        call(nr, rows, c, hull.empty(), first ? out_m : tm, first ? out_l : tl,
             first ? out_o : to);
        if (first) continue;
        for (std::size_t r = 0; r < nr; ++r) {
          detail::merge_row_state(out_m[r], out_l[r], out_o + r * dv, tm[r],
                                  tl[r], to + r * dv, dv);
        }
      }
      for (std::size_t r = 0; r < nr; ++r) {
        if (!o.sinks.empty()) {
          merge_sink(out_m[r], out_l[r], out_o + r * dv, rows.sinks[r], dv);
        }
        const std::size_t h = kh * p.g + (r0 + r) / ps.n_q;
        const std::size_t i = (r0 + r) % ps.n_q;
        emit(s, h, i, out_m[r], out_l[r], out_o + r * dv);
      }
      return;
    }
    for (std::size_t s0 = 0; s0 < nr; s0 += step) {
      const std::size_t cnt = std::min(step, nr - s0);
      RowTables rows;
      fill_row_tables(p, ps, o, q, widened, b, s.q_batch, s.q_row0, kh, r0 + s0,
                      cnt, rows);
      set_tree_masks(s, r0 + s0, cnt, rows);
      call(cnt, rows, s.chunk0 + chunk, s.no_keys, out_m + s0, out_l + s0,
           out_o + s0 * dv);
    }
    if (!s.split) {
      for (std::size_t r = 0; r < nr; ++r) {
        const std::size_t h = kh * p.g + (r0 + r) / ps.n_q;
        const std::size_t i = (r0 + r) % ps.n_q;
        emit(s, h, i, out_m[r], out_l[r], out_o + r * dv);
      }
    }
  };
  // Small calls run on the calling thread (parallel.h; bench/'s
  // BM_attention_one_key measures one: 0.19 us).
  detail::for_each_index<detail::Schedule::kDynamic>(tasks, parallel, run_task);
  if (failed) std::rethrow_exception(error);
  if (split_states == 0) return;

  // Merge each split sequence's chunk states in chunk order, per KV head.
  const std::size_t groups = p.B * p.Hkv;
  auto merge_group = [&](std::size_t gi) {
    const std::size_t b = gi / p.Hkv, kh = gi % p.Hkv;
    const Seq& s = seqs[b];
    if (!s.chunked()) return;
    const std::size_t base = s.state0 + kh * s.chunks * s.rows;
    for (std::size_t r = 0; r < s.rows; ++r) {
      float m = st_m[base + r];
      double l = st_l[base + r];
      double* acc = st_o + (base + r) * dv;
      for (std::size_t c = 1; c < s.chunks; ++c) {
        const std::size_t st = base + c * s.rows + r;
        detail::merge_row_state(m, l, acc, st_m[st], st_l[st], st_o + st * dv,
                                dv);
      }
      if (invariant && !o.sinks.empty()) {
        merge_sink(m, l, acc, o.sinks[kh * p.g + r / s.plan.n_q], dv);
      }
      const std::size_t h = kh * p.g + r / s.plan.n_q;
      const std::size_t i = r % s.plan.n_q;
      emit(s, h, i, m, l, acc);
    }
  };
  detail::for_each_index(groups, parallel && groups > 1, merge_group);
}

#define SOFTDOT_RUNNERS(KT) \
  template void run_rows<KT>(const AttentionPlan&, const KVViews<KT>&);
SOFTDOT_RUNNERS(float)
SOFTDOT_RUNNERS(Float16)
SOFTDOT_RUNNERS(BFloat16)
SOFTDOT_RUNNERS(std::int8_t)
#undef SOFTDOT_RUNNERS

}  // namespace detail::attn

namespace {

void output(const char* fn, QueryTensor q, KVSource kv, OutputTensor out,
            const AttentionOptions& o, float* lse) {
  run_request(fn, q, kv, AttentionTarget::output(out, lse), o);
}

void partial(const char* fn, TensorView<const float> q, KVSource kv,
             AttentionPartial& part, const AttentionOptions& o) {
  run_request(fn, q, kv, AttentionTarget::partial_result(part), o);
}

}  // namespace

// The public entry points: each builds a request (attention_request.h).
void attention(TensorView<const float> q, TensorView<const float> k,
               TensorView<const float> v, TensorView<float> out,
               const AttentionOptions& options, float* lse) {
  output("attention", q, KVSource::contiguous(k, v), out, options, lse);
}
void attention(TensorView<const float> q, TensorView<const Float16> k,
               TensorView<const Float16> v, TensorView<float> out,
               const AttentionOptions& options, float* lse) {
  output("attention", q, KVSource::contiguous(k, v), out, options, lse);
}
void attention(TensorView<const float> q, TensorView<const BFloat16> k,
               TensorView<const BFloat16> v, TensorView<float> out,
               const AttentionOptions& options, float* lse) {
  output("attention", q, KVSource::contiguous(k, v), out, options, lse);
}
void attention(TensorView<const float> q, const Int8KV& k, const Int8KV& v,
               TensorView<float> out, const AttentionOptions& options,
               float* lse) {
  output("attention", q, KVSource::contiguous(k, v), out, options, lse);
}
void attention(TensorView<const BFloat16> q, TensorView<const BFloat16> k,
               TensorView<const BFloat16> v, TensorView<BFloat16> out,
               const AttentionOptions& options, float* lse) {
  output("attention", q, KVSource::contiguous(k, v), out, options, lse);
}
void attention(TensorView<const Float16> q, TensorView<const Float16> k,
               TensorView<const Float16> v, TensorView<Float16> out,
               const AttentionOptions& options, float* lse) {
  output("attention", q, KVSource::contiguous(k, v), out, options, lse);
}

void attention_partial(TensorView<const float> q, TensorView<const float> k,
                       TensorView<const float> v, AttentionPartial& p,
                       const AttentionOptions& options) {
  partial("attention_partial", q, KVSource::contiguous(k, v), p, options);
}
void attention_partial(TensorView<const float> q, TensorView<const Float16> k,
                       TensorView<const Float16> v, AttentionPartial& p,
                       const AttentionOptions& options) {
  partial("attention_partial", q, KVSource::contiguous(k, v), p, options);
}
void attention_partial(TensorView<const float> q, TensorView<const BFloat16> k,
                       TensorView<const BFloat16> v, AttentionPartial& p,
                       const AttentionOptions& options) {
  partial("attention_partial", q, KVSource::contiguous(k, v), p, options);
}
void attention_partial(TensorView<const float> q, const Int8KV& k,
                       const Int8KV& v, AttentionPartial& p,
                       const AttentionOptions& options) {
  partial("attention_partial", q, KVSource::contiguous(k, v), p, options);
}

void paged_attention(TensorView<const float> q, TensorView<const float> k_pages,
                     TensorView<const float> v_pages, const PagedKVTable& table,
                     TensorView<float> out, const AttentionOptions& options,
                     float* lse) {
  output("paged_attention", q, KVSource::pages(k_pages, v_pages, table), out,
         options, lse);
}
void paged_attention(TensorView<const float> q,
                     TensorView<const Float16> k_pages,
                     TensorView<const Float16> v_pages,
                     const PagedKVTable& table, TensorView<float> out,
                     const AttentionOptions& options, float* lse) {
  output("paged_attention", q, KVSource::pages(k_pages, v_pages, table), out,
         options, lse);
}
void paged_attention(TensorView<const float> q,
                     TensorView<const BFloat16> k_pages,
                     TensorView<const BFloat16> v_pages,
                     const PagedKVTable& table, TensorView<float> out,
                     const AttentionOptions& options, float* lse) {
  output("paged_attention", q, KVSource::pages(k_pages, v_pages, table), out,
         options, lse);
}
void paged_attention(TensorView<const float> q, const Int8KV& k_pages,
                     const Int8KV& v_pages, const PagedKVTable& table,
                     TensorView<float> out, const AttentionOptions& options,
                     float* lse) {
  output("paged_attention", q, KVSource::pages(k_pages, v_pages, table), out,
         options, lse);
}

void paged_attention_partial(TensorView<const float> q,
                             TensorView<const float> k_pages,
                             TensorView<const float> v_pages,
                             const PagedKVTable& table, AttentionPartial& p,
                             const AttentionOptions& options) {
  partial("paged_attention_partial", q,
          KVSource::pages(k_pages, v_pages, table), p, options);
}
void paged_attention_partial(TensorView<const float> q,
                             TensorView<const Float16> k_pages,
                             TensorView<const Float16> v_pages,
                             const PagedKVTable& table, AttentionPartial& p,
                             const AttentionOptions& options) {
  partial("paged_attention_partial", q,
          KVSource::pages(k_pages, v_pages, table), p, options);
}
void paged_attention_partial(TensorView<const float> q,
                             TensorView<const BFloat16> k_pages,
                             TensorView<const BFloat16> v_pages,
                             const PagedKVTable& table, AttentionPartial& p,
                             const AttentionOptions& options) {
  partial("paged_attention_partial", q,
          KVSource::pages(k_pages, v_pages, table), p, options);
}
void paged_attention_partial(TensorView<const float> q, const Int8KV& k_pages,
                             const Int8KV& v_pages, const PagedKVTable& table,
                             AttentionPartial& p,
                             const AttentionOptions& options) {
  partial("paged_attention_partial", q,
          KVSource::pages(k_pages, v_pages, table), p, options);
}

}  // namespace softdot
