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
#include "attention_schedule.h"
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

// Row states of a kernel call: max, sum and output sums of row r at m[r],
// l[r] and o + r dv.
struct State {
  float* m;
  double* l;
  double* o;
  State at(std::size_t r, std::size_t dv) const {
    return {m + r, l + r, o + r * dv};
  }
};

// Where the kernel reads KV head kh of batch b: the first row of K and V
// (and of the int8 scales) and their strides; paged, the rows of this KV
// head in page 0 and sequence b's row of the table.
template <class KT>
void set_kv_args(detail::AttnArgs& a, const KVViews<KT>& kv,
                 const PagedKVTable* table, std::size_t b, std::size_t kh) {
  constexpr bool kInt8 = detail::kScaledKv<KT>;  // int8 or fp8: scales
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

// The rows of a checked plan, run by its schedule (attention_schedule.h):
// finalised into the output and lse, or kept as the partial result
// (AttentionPartial). With a paged source (k and v are the pages) each
// sequence has its own n_kv; int8 K and V come with their scales. One
// runner per call: the schedule, the state buffers and the task loop.
template <class KT>
class RowRunner {
 public:
  RowRunner(const AttentionPlan& plan, const KVViews<KT>& kv)
      : plan_(plan),
        req_(plan.request()),
        p_(plan.data()),
        o_(req_.options),
        q_(req_.q),
        kv_(kv),
        table_(req_.kv.paged ? &req_.kv.table : nullptr),
        max_rows_(detail::attention_max_rows()) {
    // bfloat16 queries, keys and values run their prefill products on the
    // units matrix_unit() names (simd.h); precise keeps float products.
    units_ = request_units(req_);
    lse_ = req_.target.lse;
    if (req_.target.kind == AttentionTarget::Kind::kPartial) {
      partial_ = req_.target.partial;
    }
  }

  void run() {
    thread_local Schedule buffer;  // reused: a decode step allocates nothing
    build_schedule(plan_, units_, max_rows_, buffer);
    sch_ = &buffer;
    size_partial();
    allocate_states();
    const bool parallel =
        sch_->tasks > 1 && sch_->work >= 4.0 * detail::kParallelElements;
    // Small calls run on the calling thread (parallel.h; bench/'s
    // BM_attention_one_key measures one: 0.19 us).
    detail::for_each_index<detail::Schedule::kDynamic>(
        sch_->tasks, parallel, [&](std::size_t t) { guarded_task(t); });
    if (failed_) std::rethrow_exception(error_);
    if (sch_->split_states == 0) return;
    // Merge each chunked sequence's chunk states in chunk order, per KV
    // head.
    const std::size_t groups = p_.B * p_.Hkv;
    detail::for_each_index(groups, parallel && groups > 1,
                           [&](std::size_t gi) { merge_group(gi); });
  }

 private:
  void size_partial() {
    if (partial_ == nullptr) return;
    const bool ragged = table_ != nullptr && !table_->query_start_loc.empty();
    partial_->batch = ragged ? 1 : p_.B;
    partial_->heads = p_.H;
    partial_->rows = p_.n_q;
    partial_->dv = p_.dv;
    const std::size_t n = partial_->batch * p_.H * p_.n_q;
    partial_->max.resize(n);
    partial_->sum.resize(n);
    partial_->out.resize(n * p_.dv);
  }

  // The states: the chunked sequences' chunk states (by sequence, KV head,
  // chunk and row), then one block of rows per thread for the others (one
  // kernel call's rows, or a group's running state and its chunk's state).
  // They live in the calling thread's reusable buffer.
  void allocate_states() {
    const int threads = omp_get_max_threads();
    thread_rows_ = std::max(std::min(max_rows_, detail::kMaxKernelRows),
                            2 * detail::kDecodeMaxRows);
    const std::size_t n =
        sch_->split_states + static_cast<std::size_t>(threads) * thread_rows_;
    double* states = thread_buffer<double>(0, n * (p_.dv + 2));
    st_l_ = states;
    st_o_ = states + n;
    st_m_ = reinterpret_cast<float*>(states + n * (p_.dv + 1));
  }

  // A task on its thread; an exception must not leave an OpenMP region, so
  // it is carried out (only the scratch allocation can throw).
  void guarded_task(std::size_t t) {
    if (failed_) return;
    float* scratch = nullptr;
    float* widened = nullptr;
    try {
      // A task of several KV heads (head_group) takes a scratch and a
      // widened query per head.
      const std::size_t heads = sch_->head_group;
      scratch = thread_buffer<float>(1, heads * scratch_floats());
      if (q_.format() != KVFormat::kFloat32) {
        widened = thread_buffer<float>(2, heads * widened_floats());
      }
    } catch (...) {
#pragma omp critical(softdot_attention_error)
      {
        if (!failed_) error_ = std::current_exception();
        failed_ = true;
      }
      return;
    }
    run_task(sch_->task(t), scratch, widened);
  }

  std::size_t scratch_floats() const {
    return detail::attention_scratch_floats(p_.d, p_.dv, o_.precise,
                                            units_ != 0);
  }
  std::size_t widened_floats() const {
    return std::max(max_rows_, detail::kDecodeMaxRows) * p_.d;
  }

  // A task's states: its chunk's rows (chunked), else its thread's block.
  std::size_t state_row(const SequenceSchedule& s, const Task& k) const {
    if (s.chunked()) return s.state0 + (k.kh * s.chunks + k.chunk) * s.rows;
    return sch_->split_states +
           static_cast<std::size_t>(omp_get_thread_num()) * thread_rows_;
  }

  void run_task(const Task& k, float* scratch, float* widened) {
    const SequenceSchedule& s = sch_->seqs[k.b];
    const std::size_t block_rows =
        s.grouped() ? detail::kDecodeMaxRows : max_rows_;
    const std::size_t r0 = k.row_block * block_rows;
    const std::size_t nr =
        s.chunked() ? s.rows : std::min(block_rows, s.rows - r0);
    const std::size_t st = state_row(s, k);
    State out{st_m_ + st, st_l_ + st, st_o_ + st * p_.dv};
    if (s.grouped()) {
      run_group(s, k, r0, nr, out, scratch, widened);
      return;
    }
    if (k.heads > 1) {
      run_heads(s, k, scratch, widened);
      return;
    }
    // Kernel calls of at most max_rows rows (a chunked KV head may have
    // more rows than a scalar target's kernel takes).
    const std::size_t step =
        decode_kernel(s.form) ? detail::kDecodeMaxRows : max_rows_;
    for (std::size_t s0 = 0; s0 < nr; s0 += step) {
      const std::size_t cnt = std::min(step, nr - s0);
      RowTables rows;
      tables(s, k, r0 + s0, cnt, widened, rows);
      call(s, k, cnt, rows, s.chunk0 + k.chunk, s.no_keys, out.at(s0, p_.dv),
           scratch);
    }
    if (s.split()) return;  // chunk states: merged after every task
    for (std::size_t r = 0; r < nr; ++r) emit_row(s, k.kh, r0 + r, out, r);
  }

  // KV heads k.kh .. k.kh + k.heads - 1 of one chunk (a head group: the
  // decode form on the units over pages that interleave the heads), run
  // block by block in one kernel call, each head with its own scratch,
  // widened query rows and chunk states: the bits of one call per head.
  void run_heads(const SequenceSchedule& s, const Task& k, float* scratch,
                 float* widened) {
    detail::AttnArgs args[detail::kDecodeHeadGroup];
    RowTables rows[detail::kDecodeHeadGroup];
    for (std::size_t i = 0; i < k.heads; ++i) {
      Task ki = k;
      ki.kh = k.kh + i;
      ki.heads = 1;
      const std::size_t st = state_row(s, ki);
      const State out{st_m_ + st, st_l_ + st, st_o_ + st * p_.dv};
      tables(s, ki, 0, s.rows,
             widened == nullptr ? nullptr : widened + i * widened_floats(),
             rows[i]);
      args[i] = kernel_args(s, ki, s.rows, rows[i], s.chunk0 + k.chunk,
                            s.no_keys, out, scratch + i * scratch_floats());
    }
    detail::attention_decode_units_heads(args, k.heads);
  }

  // A group of at most kDecodeMaxRows rows (batch_invariant): the chunks
  // that hold a key one of its rows sees, folded in chunk order as
  // merge_group folds a chunked sequence's (the running state at out, the
  // chunk's after it).
  void run_group(const SequenceSchedule& s, const Task& k, std::size_t r0,
                 std::size_t nr, const State& out, float* scratch,
                 float* widened) {
    RowTables rows;
    tables(s, k, r0, nr, widened, rows);
    const KeyHull hull = row_hull(rows.first, rows.last, nr);
    const std::size_t c_lo = hull.empty() ? 0 : hull.lo / kDecodeChunk;
    const std::size_t c_hi = hull.empty() ? 0 : hull.hi / kDecodeChunk;
    const State chunk = out.at(detail::kDecodeMaxRows, p_.dv);
    for (std::size_t c = c_lo; c <= c_hi; ++c) {
      const bool first = c == c_lo;
      call(s, k, nr, rows, c, hull.empty(), first ? out : chunk, scratch);
      if (first) continue;
      for (std::size_t r = 0; r < nr; ++r) {
        detail::merge_row_state(out.m[r], out.l[r], out.o + r * p_.dv,
                                chunk.m[r], chunk.l[r], chunk.o + r * p_.dv,
                                p_.dv);
      }
    }
    for (std::size_t r = 0; r < nr; ++r) {
      if (!o_.sinks.empty()) {
        merge_sink(out.m[r], out.l[r], out.o + r * p_.dv, rows.sinks[r], p_.dv);
      }
      emit_row(s, k.kh, r0 + r, out, r);
    }
  }

  // The row tables of rows row0 .. row0 + cnt - 1 of a task's KV head,
  // with their draft tree's masks.
  void tables(const SequenceSchedule& s, const Task& k, std::size_t row0,
              std::size_t cnt, float* widened, RowTables& rows) const {
    fill_row_tables(p_, s.plan, o_, q_, widened, k.b, s.q_batch, s.q_row0, k.kh,
                    row0, cnt, rows);
    if (s.tree0 == kNoTree) return;
    for (std::size_t r = 0; r < cnt; ++r) {
      const std::size_t i = (row0 + r) % s.plan.n_q;
      rows.mask[r] = sch_->tree_masks.data() + s.tree0 + i * s.plan.n_kv;
    }
  }

  // One kernel call: cnt rows over chunk c (split) or the whole key range,
  // its states at out. An empty range (j_begin >= j_end) runs no block: the
  // kernel returns the initial state, the identity or the sink alone.
  void call(const SequenceSchedule& s, const Task& k, std::size_t cnt,
            const RowTables& rows, std::size_t c, bool empty, const State& out,
            float* scratch) const {
    detail::attention_kernel(
        kernel_args(s, k, cnt, rows, c, empty, out, scratch));
  }

  // The arguments of that kernel call.
  detail::AttnArgs kernel_args(const SequenceSchedule& s, const Task& k,
                               std::size_t cnt, const RowTables& rows,
                               std::size_t c, bool empty, const State& out,
                               float* scratch) const {
    const Plan& ps = s.plan;
    const bool decode = decode_kernel(s.form);
    detail::AttnArgs a;
    set_kv_args(a, kv_, table_, k.b, k.kh);
    a.d = p_.d;
    a.dv = p_.dv;
    a.j_begin = s.chunk_base + c * kDecodeChunk;
    a.j_end =
        s.split() ? std::min(ps.kv_end, a.j_begin + kDecodeChunk) : ps.kv_end;
    if (empty) a.j_end = a.j_begin;
    a.prefetch_end = ps.kv_end;
    a.scale = p_.scale;
    a.softcap = p_.softcap;
    a.rows = cnt;
    a.decode = decode;
    a.precise = o_.precise;
    // The decode form runs on the units where they apply (bfloat16 Q, K
    // and V: units_ != 0) and the shape fits; never with batch_invariant,
    // whose bits are the float decode form's for every row.
    const bool decode_units = s.form == Form::kDecode && !o_.batch_invariant &&
                              detail::decode_units_fit(p_.d, p_.dv, cnt);
    a.units = !decode || decode_units ? units_ : 0;
    a.pv_split = o_.unit_weights == AttentionOptions::UnitWeights::kSplit;
    a.q_rows = rows.q;
    a.first_key = rows.first;
    a.last_key = rows.last;
    a.mask_rows =
        o_.mask.empty() && sch_->tree_masks.empty() ? nullptr : rows.mask;
    a.bias_rows = o_.bias.empty() ? nullptr : rows.bias;
    if (!o_.alibi_slopes.empty()) {
      a.alibi_slopes = rows.alibi;
      a.alibi_base = rows.alibi_base;
      a.alibi_stride = static_cast<double>(ps.kv_stride);
    }
    // Split, the sinks go into the first chunk only; batch_invariant merges
    // them after the last.
    a.sinks = (!o_.sinks.empty() && c == s.chunk0 && !o_.batch_invariant)
                  ? rows.sinks
                  : nullptr;
    a.scratch = scratch;
    a.out_m = out.m;
    a.out_l = out.l;
    a.out_o = out.o;
    return a;
  }

  void merge_group(std::size_t gi) {
    const std::size_t b = gi / p_.Hkv, kh = gi % p_.Hkv;
    const SequenceSchedule& s = sch_->seqs[b];
    if (!s.chunked()) return;
    const std::size_t base = s.state0 + kh * s.chunks * s.rows;
    const std::size_t dv = p_.dv;
    for (std::size_t r = 0; r < s.rows; ++r) {
      float m = st_m_[base + r];
      double l = st_l_[base + r];
      double* acc = st_o_ + (base + r) * dv;
      for (std::size_t c = 1; c < s.chunks; ++c) {
        const std::size_t st = base + c * s.rows + r;
        detail::merge_row_state(m, l, acc, st_m_[st], st_l_[st],
                                st_o_ + st * dv, dv);
      }
      const std::size_t h = kh * p_.g + r / s.plan.n_q;
      if (o_.batch_invariant && !o_.sinks.empty()) {
        merge_sink(m, l, acc, o_.sinks[h], dv);
      }
      emit(s, h, r % s.plan.n_q, m, l, acc);
    }
  }

  // Row `row` (numbered within the KV head) of a task, from state slot r.
  void emit_row(const SequenceSchedule& s, std::size_t kh, std::size_t row,
                const State& st, std::size_t r) {
    emit(s, kh * p_.g + row / s.plan.n_q, row % s.plan.n_q, st.m[r], st.l[r],
         st.o + r * p_.dv);
  }

  // A finished row i of a sequence, head h: finalised, or kept as a
  // partial result.
  void emit(const SequenceSchedule& s, std::size_t h, std::size_t i, float m,
            double l, const double* acc) {
    const std::size_t dv = p_.dv;
    const std::size_t row = s.q_row0 + i;
    const std::size_t r = (s.q_batch * p_.H + h) * p_.n_q + row;
    if (partial_ != nullptr) {
      partial_->max[r] = m;
      partial_->sum[r] = l;
      std::copy(acc, acc + dv, partial_->out.data() + r * dv);
      return;
    }
    std::visit(
        [&](const auto& t) {
          detail::finalize_row_state(m, l, acc, dv, t.row(s.q_batch, h, row),
                                     lse_ ? lse_ + r : nullptr);
        },
        req_.target.out.variant());
  }

  const AttentionPlan& plan_;
  const AttentionRequest& req_;
  const Plan& p_;
  const AttentionOptions& o_;
  const QueryTensor& q_;
  const KVViews<KT>& kv_;
  const PagedKVTable* table_;
  const std::size_t max_rows_;
  unsigned units_ = 0;
  float* lse_ = nullptr;
  AttentionPartial* partial_ = nullptr;
  const Schedule* sch_ = nullptr;
  std::size_t thread_rows_ = 0;
  float* st_m_ = nullptr;
  double* st_l_ = nullptr;
  double* st_o_ = nullptr;
  std::exception_ptr error_;
  bool failed_ = false;
};

template <class KT>
void run_rows(const AttentionPlan& plan, const KVViews<KT>& kv) {
  RowRunner<KT>(plan, kv).run();
}

#define SOFTDOT_RUNNER(KT) \
  template void run_rows<KT>(const AttentionPlan&, const KVViews<KT>&);
SOFTDOT_FOR_EACH_KV_TYPE(SOFTDOT_RUNNER)
#undef SOFTDOT_RUNNER

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
// The float-query overloads, one set per K/V argument type KV:
#define SOFTDOT_FLOAT_QUERY_ENTRIES(KV)                                        \
  void attention(TensorView<const float> q, KV k, KV v, TensorView<float> out, \
                 const AttentionOptions& options, float* lse) {                \
    output("attention", q, KVSource::contiguous(k, v), out, options, lse);     \
  }                                                                            \
  void attention_partial(TensorView<const float> q, KV k, KV v,                \
                         AttentionPartial& p,                                  \
                         const AttentionOptions& options) {                    \
    partial("attention_partial", q, KVSource::contiguous(k, v), p, options);   \
  }                                                                            \
  void paged_attention(TensorView<const float> q, KV k_pages, KV v_pages,      \
                       const PagedKVTable& table, TensorView<float> out,       \
                       const AttentionOptions& options, float* lse) {          \
    output("paged_attention", q, KVSource::pages(k_pages, v_pages, table),     \
           out, options, lse);                                                 \
  }                                                                            \
  void paged_attention_partial(TensorView<const float> q, KV k_pages,          \
                               KV v_pages, const PagedKVTable& table,          \
                               AttentionPartial& p,                            \
                               const AttentionOptions& options) {              \
    partial("paged_attention_partial", q,                                      \
            KVSource::pages(k_pages, v_pages, table), p, options);             \
  }
SOFTDOT_FLOAT_QUERY_ENTRIES(TensorView<const float>)
SOFTDOT_FLOAT_QUERY_ENTRIES(TensorView<const Float16>)
SOFTDOT_FLOAT_QUERY_ENTRIES(TensorView<const BFloat16>)
SOFTDOT_FLOAT_QUERY_ENTRIES(const Int8KV&)
SOFTDOT_FLOAT_QUERY_ENTRIES(const Float8E4M3KV&)
SOFTDOT_FLOAT_QUERY_ENTRIES(const Float8E5M2KV&)
#undef SOFTDOT_FLOAT_QUERY_ENTRIES

// The 16-bit-query overloads: q, k, v and out all of one format.
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

}  // namespace softdot
