// softdot: the schedule of an attention request, decided once from its
// plan. Each sequence takes one named form (the rule is form_of, the only
// place it is written: AttentionPlan::form, the runner, the weights and the
// rings read it), and the schedule numbers its tasks, its chunk states and
// its draft-tree masks. Every choice depends on the sequence's own shape
// and the options only (never on the other sequences, the thread count or
// the SIMD target), so a sequence's bits are those of the same call on that
// sequence alone. Internal (src/ only).
#ifndef SOFTDOT_SRC_ATTENTION_SCHEDULE_H_
#define SOFTDOT_SRC_ATTENTION_SCHEDULE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "attention_checks.h"
#include "attention_rows.h"
#include "softdot/attention.h"
#include "softdot/attention_request.h"

namespace softdot::detail::attn {

// The form of a sequence (AttentionForm, attention_request.h): kPrefill
// cuts its rows into blocks of at most attention_max_rows(); kDecode its
// keys into chunks of kDecodeChunk (at most kDecodeRows rows per KV head);
// kDecodeUnits runs those chunks on the units (kUnitsDecodeMinRows rows
// up); kInvariantGroups folds the chunks of kDecodeMaxRows-row groups.
using Form = AttentionForm;

// The form of a sequence with `rows` query rows per KV head (g n_q) under
// options o, units the bfloat16 units its products may use (0: none).
// scores: the form whose rounding the weights and scores take
// (attention_weights(); precise does not apply there).
Form form_of(std::size_t rows, const AttentionOptions& o, unsigned units,
             bool scores = false);

// Whether a form computes its scores with the decode form's kernel (its
// 16-lane chains in a fixed tree; attention_weights() rounds as it does).
inline bool decode_kernel(Form f) {
  return f == Form::kDecode || f == Form::kInvariantGroups;
}

// One sequence of the schedule.
struct SequenceSchedule {
  Plan plan;  // its own n_kv and n_q when paged or ragged
  std::size_t q_batch = 0, q_row0 = 0;  // row i: q (q_batch, h, q_row0 + i)
  std::size_t rows = 0;                 // g n_q: rows per KV head
  Form form = Form::kPrefill;
  std::size_t row_blocks = 0, chunks = 1;
  // The first chunk's index: chunk c covers keys chunk_base + (chunk0 + c)
  // kDecodeChunk onwards (chunk_base is kv_begin by default, 0 with
  // batch_invariant: chunks at fixed key indices).
  std::size_t chunk0 = 0, chunk_base = 0;
  bool no_keys = false;    // batch_invariant: no row sees a key
  std::size_t task0 = 0;   // its first task
  std::size_t state0 = 0;  // a chunked sequence's first chunk-state row
  // A draft tree (draft_parents): row i's mask at tree_masks[tree0 + i
  // n_kv] (n_kv bytes, 1 = visible), kNoTree without one.
  std::size_t tree0 = kNoTree;
  // KV heads per task (chunked): more than one where the decode form on the
  // units reads pages whose rows interleave the heads (vLLM's NHD layout):
  // the heads of a chunk then run block by block in one task.
  std::size_t head_group = 1;

  // The keys cut into chunks (every form but kPrefill).
  bool split() const { return form != Form::kPrefill; }
  // The chunks as tasks of their own, their states merged after (one row
  // block); kInvariantGroups folds them inside its task.
  bool chunked() const {
    return form == Form::kDecode || form == Form::kDecodeUnits;
  }
  bool grouped() const { return form == Form::kInvariantGroups; }
};

// The task t of a schedule: its sequence, KV head, row block and chunk.
struct Task {
  std::size_t b = 0, kh = 0, row_block = 0, chunk = 0;
  std::size_t heads = 1;  // KV heads kh .. kh + heads - 1 (chunked)
};

struct Schedule {
  std::vector<SequenceSchedule> seqs;
  std::vector<std::uint8_t> tree_masks;  // the draft trees' masks
  std::size_t tasks = 0;
  std::size_t split_states = 0;  // rows of chunk states (chunked sequences)
  double work = 0.0;             // multiply-adds, for the parallel threshold
  std::size_t kv_heads = 1;
  std::size_t head_group = 1;  // the largest SequenceSchedule::head_group

  // The order of the tasks never changes the bits. Decode chunks: the KV
  // heads (or groups of them) vary fastest, so consecutive tasks read the
  // same keys of every KV head and a page whose rows interleave the heads
  // (vLLM's NHD layout) is read whole while it is in cache, rather than
  // once per head. Row blocks:
  // the blocks vary fastest, so consecutive tasks reuse one KV head's keys
  // from cache.
  Task task(std::size_t t) const;
};

// The units a request's products run on: bfloat16 query, keys and values,
// not precise (attention_units(), simd.h); 0 elsewhere.
unsigned request_units(const AttentionRequest& r);

// The schedule of a checked plan into s (its buffers reused: a decode step
// allocates nothing once they have grown), units as form_of takes them and
// max_rows = attention_max_rows().
void build_schedule(const AttentionPlan& plan, unsigned units,
                    std::size_t max_rows, Schedule& s);

}  // namespace softdot::detail::attn

#endif  // SOFTDOT_SRC_ATTENTION_SCHEDULE_H_
