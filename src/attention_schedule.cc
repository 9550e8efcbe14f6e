// softdot: the schedule of an attention request (attention_schedule.h).
#include "attention_schedule.h"

#include <omp.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <variant>
#include <vector>

#include "attention_checks.h"
#include "attention_rows.h"
#include "kernels/attention_args.h"
#include "kernels/dispatch.h"

namespace softdot::detail::attn {

Form form_of(std::size_t rows, const AttentionOptions& o, unsigned units,
             bool scores) {
  // precise runs in the prefill form only (whatever the rows); the weights
  // and scores do not compute precise scores.
  if ((o.precise && !scores) || o.prefill_form) return Form::kPrefill;
  if (rows > kDecodeRows) {
    return o.batch_invariant ? Form::kInvariantGroups : Form::kPrefill;
  }
  // A KV head with enough rows to fill the units' lanes runs its chunks in
  // the prefill form on the units (rows in lanes: a few rows would leave
  // most lanes idle, and the decode form reads K and V at the memory's
  // speed there). Not with batch_invariant (the units round differently
  // from the decode form).
  if (!o.batch_invariant && units != 0 && rows >= kUnitsDecodeMinRows) {
    return Form::kDecodeUnits;
  }
  return Form::kDecode;
}

unsigned request_units(const AttentionRequest& r) {
  const bool bf16 =
      r.q.format() == KVFormat::kBFloat16 &&
      std::holds_alternative<TensorView<const BFloat16>>(r.kv.k.variant());
  return bf16 && !r.options.precise ? detail::attention_units() : 0;
}

Task Schedule::task(std::size_t t) const {
  // The sequence: the last whose first task is at or before t (one without
  // tasks shares its first task with the next, which has them).
  const auto it = std::upper_bound(
      seqs.begin(), seqs.end(), t,
      [](std::size_t x, const SequenceSchedule& s) { return x < s.task0; });
  Task k;
  k.b = static_cast<std::size_t>(it - seqs.begin()) - 1;
  const SequenceSchedule& s = seqs[k.b];
  const std::size_t rest = t - s.task0;
  if (s.chunked()) {  // one row block
    const std::size_t groups = (kv_heads + s.head_group - 1) / s.head_group;
    k.kh = rest % groups * s.head_group;
    k.chunk = rest / groups;
    k.heads = std::min(s.head_group, kv_heads - k.kh);
  } else {  // one chunk per task
    k.kh = rest / s.row_blocks;
    k.row_block = rest % s.row_blocks;
  }
  return k;
}

namespace {

// Sequence b's draft tree: each row's mask (the prefix and its ancestors)
// appended to masks. Checked: n_q <= n_kv and every parent before its row.
void tree_rows(const PagedKVTable& t, std::size_t p0, std::size_t n_q,
               std::size_t n_kv, std::vector<std::uint8_t>& masks,
               std::size_t& tree0) {
  const std::size_t pre = n_kv - n_q;
  tree0 = masks.size();
  masks.resize(tree0 + n_q * n_kv, 0);
  for (std::size_t i = 0; i < n_q; ++i) {
    std::uint8_t* row = masks.data() + tree0 + i * n_kv;
    std::fill(row, row + pre, std::uint8_t{1});
    for (auto a = static_cast<std::int64_t>(i); a >= 0;
         a = t.draft_parents[p0 + static_cast<std::size_t>(a)]) {
      row[pre + static_cast<std::size_t>(a)] = 1;
    }
  }
}

// A chunked sequence's chunks: every chunk of its key range, or (at fixed
// key indices, batch_invariant) those that hold a key some row sees.
void chunk_range(SequenceSchedule& s, std::size_t n_q, bool invariant) {
  if (invariant) {
    const KeyHull hull = visible_hull(s.plan, 0, n_q);
    s.no_keys = hull.empty();
    s.chunk0 = s.no_keys ? 0 : hull.lo / kDecodeChunk;
    s.chunks = s.no_keys ? 1 : hull.hi / kDecodeChunk - s.chunk0 + 1;
  } else {
    const std::size_t range = s.plan.kv_end - s.plan.kv_begin;
    s.chunks =
        std::max<std::size_t>(1, (range + kDecodeChunk - 1) / kDecodeChunk);
  }
}

}  // namespace

void build_schedule(const AttentionPlan& plan, unsigned units,
                    std::size_t max_rows, Schedule& sch) {
  const AttentionRequest& req = plan.request();
  const Plan& p = plan.data();
  const AttentionOptions& o = req.options;
  const PagedKVTable* table = req.kv.paged ? &req.kv.table : nullptr;
  // A ragged batch (query_start_loc, paged only): sequence b's rows are
  // rows query_start_loc[b] .. query_start_loc[b + 1] - 1 of the packed
  // query (batch 1), its output and lse rows the same.
  const bool ragged = table != nullptr && !table->query_start_loc.empty();
  const bool trees = table != nullptr && !table->draft_parents.empty();
  const bool invariant = o.batch_invariant;
  // Pages (vLLM's NHD layout interleaves the KV heads' rows; HND puts a
  // page's heads one after another), or a contiguous cache whose rows
  // interleave the heads (a row stride past d: [n, H_kv, d] seen as
  // [1, H_kv, n, d]), read by the decode form on the units: KV heads in
  // groups per task (SequenceSchedule::head_group), so that each block's
  // keys of every head are read together, in address order.
  const auto* k16 =
      std::get_if<TensorView<const BFloat16>>(&req.kv.k.variant());
  const bool interleaved = units != 0 && k16 != nullptr && p.Hkv > 1 &&
                           (table != nullptr || k16->row_stride > p.d);
  sch.seqs.assign(p.B, SequenceSchedule{});
  sch.tree_masks.clear();
  sch.tasks = sch.split_states = 0;
  sch.work = 0.0;
  sch.kv_heads = p.Hkv;
  sch.head_group = 1;
  for (std::size_t b = 0; b < p.B; ++b) {
    SequenceSchedule& s = sch.seqs[b];
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
    s.task0 = sch.tasks;
    if (s.rows == 0) continue;  // a ragged sequence without rows: no task
    if (trees) {
      tree_rows(*table, ragged ? s.q_row0 : b * p.n_q, n_q, s.plan.n_kv,
                sch.tree_masks, s.tree0);
    }
    s.form = form_of(s.rows, o, units);
    s.row_blocks = s.grouped() ? (s.rows + detail::kDecodeMaxRows - 1) /
                                     detail::kDecodeMaxRows
                   : s.split() ? 1
                               : (s.rows + max_rows - 1) / max_rows;
    s.chunk_base = invariant ? 0 : s.plan.kv_begin;
    if (s.chunked()) {
      chunk_range(s, n_q, invariant);
      s.state0 = sch.split_states;
      sch.split_states += p.Hkv * s.chunks * s.rows;
      if (interleaved && s.form == Form::kDecode && !invariant &&
          detail::decode_units_fit(p.d, p.dv, s.rows)) {
        s.head_group = std::min(p.Hkv, detail::kDecodeHeadGroup);
        sch.head_group = std::max(sch.head_group, s.head_group);
      }
    }
    const std::size_t head_tasks = (p.Hkv + s.head_group - 1) / s.head_group;
    sch.tasks += head_tasks * s.row_blocks * s.chunks;
    const std::size_t range = s.plan.kv_end - s.plan.kv_begin;
    sch.work += static_cast<double>(p.H * n_q) * static_cast<double>(range) *
                static_cast<double>(p.d + p.dv);
  }
  // Head groups trade tasks for reading order: halve them while there are
  // fewer than 4 tasks per thread (a short batch on many cores keeps its
  // cores busy). The bits do not depend on the groups.
  const std::size_t want = 4 * static_cast<std::size_t>(omp_get_max_threads());
  while (sch.head_group > 1 && sch.tasks < want) {
    const std::size_t g = sch.head_group / 2;
    sch.tasks = 0;
    sch.head_group = 1;
    for (SequenceSchedule& s : sch.seqs) {
      s.task0 = sch.tasks;
      if (s.rows == 0) continue;
      s.head_group = std::max<std::size_t>(1, std::min(s.head_group, g));
      sch.head_group = std::max(sch.head_group, s.head_group);
      sch.tasks +=
          (p.Hkv + s.head_group - 1) / s.head_group * s.row_blocks * s.chunks;
    }
  }
}

}  // namespace softdot::detail::attn
