// softdot: the checks of a request over a paged cache (paged_attention()
// and its partial form): the pages against the query, the table, a ragged
// batch's row starts, a draft tree's parents, the positions of a sharded
// cache, the int8 and fp8 scales (contiguous ones too: check_scales, the
// per-tensor check_tensor_scale). AttentionPlan::make runs them
// (attention_checks.cc has the contiguous checks and the options').
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "attention_checks.h"

namespace softdot::detail::attn {

namespace {

constexpr std::size_t kMaxIndex = std::size_t{1} << 30;

// The query, the pages and the output against each other; returns d_v.
template <class KT>
std::size_t check_pages(const char* fn, const QueryTensor& qt,
                        const TensorView<const KT>& k,
                        const TensorView<const KT>& v, const OutputTensor& outt,
                        const char* out_name) {
  check_query_and_output(fn, qt, outt, out_name, [&] {
    check_tensor(fn, "k_pages", k);
    check_tensor(fn, "v_pages", v);
  });
  const TensorView<const float> q = qt.shape_view();
  const TensorView<float> out = outt.shape_view();
  check_query_keys(fn, q, k, "k_pages");
  if (k.rows == 0) fail(fn, shape("k_pages", k) + " has page_size 0");
  if (v.batch != k.batch || v.heads != k.heads || v.rows != k.rows) {
    fail(fn, shape("v_pages", v) + " does not match " + shape("k_pages", k) +
                 " in pages, heads and page_size");
  }
  if (v.cols == 0) fail(fn, shape("v_pages", v) + " has d_v = 0");
  const std::size_t dv = v.cols;
  check_output_shape(fn, out_name, out, q, dv, "v_pages", v);
  if (q.rows >= kMaxIndex) {
    fail(fn, "n_q = " + count(q.rows) + " must be below 2^30");
  }
  return dv;
}

// A ragged batch's row starts (query_start_loc), or the batch of seq_lens.
void check_row_starts(const char* fn, const PagedKVTable& t,
                      const TensorView<const float>& q, std::size_t B,
                      bool ragged, const AttentionOptions& o) {
  if (ragged) {
    // The packed form: the sequences' rows one after another.
    if (q.batch != 1) {
      fail(fn, shape("q", q) +
                   " must have batch 1 with query_start_loc (the sequences' "
                   "rows one after another)");
    }
    if (t.query_start_loc.size() != B + 1) {
      fail(fn, "query_start_loc has " + count(t.query_start_loc.size()) +
                   " entries but seq_lens has " + count(B) +
                   " (it needs one more: sequence b's rows are "
                   "query_start_loc[b] to query_start_loc[b + 1] - 1)");
    }
    if (t.query_start_loc[0] != 0) {
      fail(fn, "query_start_loc[0] = " + std::to_string(t.query_start_loc[0]) +
                   " must be 0");
    }
    for (std::size_t b = 0; b < B; ++b) {
      if (t.query_start_loc[b + 1] < t.query_start_loc[b]) {
        fail(fn, "query_start_loc[" + count(b + 1) +
                     "] = " + std::to_string(t.query_start_loc[b + 1]) +
                     " is below query_start_loc[" + count(b) +
                     "] = " + std::to_string(t.query_start_loc[b]) +
                     " (sequence " + count(b) + ")");
      }
    }
    if (static_cast<std::size_t>(t.query_start_loc[B]) != q.rows) {
      fail(fn, "query_start_loc[" + count(B) + "] = " +
                   std::to_string(t.query_start_loc[B]) + " must equal the " +
                   count(q.rows) + " rows of " + shape("q", q));
    }
    if (!o.mask.empty() || !o.bias.empty()) {
      fail(fn, std::string("a ragged batch (query_start_loc) takes no ") +
                   (o.mask.empty() ? "bias" : "mask"));
    }
  } else if (t.seq_lens.size() != B) {
    fail(fn, "seq_lens has " + count(t.seq_lens.size()) + " entries but " +
                 shape("q", q) + " has batch " + count(B));
  }
  // A ragged sequence's rows are its newest tokens, their keys the last n_q
  // of its cache (row i at position i + seq_lens[b] - n_q): more rows than
  // keys means keys that were never written (explicit query_positions place
  // the rows themselves; a draft tree's rows have their own message below).
  if (ragged && t.query_positions.empty() && t.draft_parents.empty()) {
    for (std::size_t b = 0; b < B; ++b) {
      const std::int64_t n_q =
          std::int64_t{t.query_start_loc[b + 1]} - t.query_start_loc[b];
      if (t.seq_lens[b] >= 0 && n_q > t.seq_lens[b]) {
        fail(fn, "sequence " + count(b) + " has " + std::to_string(n_q) +
                     " query rows (query_start_loc[" + count(b) +
                     "] = " + std::to_string(t.query_start_loc[b]) + " to " +
                     std::to_string(t.query_start_loc[b + 1]) +
                     ") but seq_lens[" + count(b) +
                     "] = " + std::to_string(t.seq_lens[b]) +
                     " keys: a ragged batch's rows are the newest tokens of "
                     "their sequence, their keys already in the cache");
      }
    }
  }
}

// A draft tree: one parent per query row, each before its row.
void check_draft_parents(const char* fn, const PagedKVTable& t,
                         const TensorView<const float>& q, std::size_t B,
                         bool ragged, const AttentionOptions& o) {
  if (t.draft_parents.empty()) return;
  const std::size_t rows = ragged ? q.rows : B * q.rows;
  if (t.draft_parents.size() != rows) {
    fail(fn, "draft_parents has " + count(t.draft_parents.size()) +
                 " entries but there are " + count(rows) +
                 " query rows (one parent per row)");
  }
  if (!o.mask.empty() || !o.bias.empty() || !t.query_positions.empty()) {
    fail(fn, std::string("draft_parents cannot be combined with ") +
                 (!o.mask.empty()   ? "a mask"
                  : !o.bias.empty() ? "a bias"
                                    : "query_positions"));
  }
  for (std::size_t b = 0; b < B; ++b) {
    const std::size_t r0 =
        ragged ? static_cast<std::size_t>(t.query_start_loc[b]) : b * q.rows;
    const std::size_t n_q =
        ragged ? static_cast<std::size_t>(t.query_start_loc[b + 1]) - r0
               : q.rows;
    if (n_q != 0 && t.seq_lens[b] >= 0 &&
        n_q > static_cast<std::size_t>(t.seq_lens[b])) {
      fail(fn, "sequence " + count(b) + " has " + count(n_q) +
                   " draft rows but seq_lens[" + count(b) +
                   "] = " + std::to_string(t.seq_lens[b]) +
                   " keys (a draft tree's rows need their keys, the last " +
                   "n_q, in the cache)");
    }
    for (std::size_t i = 0; i < n_q; ++i) {
      const std::int32_t p = t.draft_parents[r0 + i];
      if (p < -1 || p >= static_cast<std::int64_t>(i)) {
        fail(fn, "draft_parents[" + count(r0 + i) + "] = " + std::to_string(p) +
                     " must be -1 or a row before it (" + "0 .. " +
                     std::to_string(static_cast<std::int64_t>(i) - 1) +
                     " of sequence " + count(b) + "'s rows)");
      }
    }
  }
}

// The positions of a cache sharded by position.
void check_positions(const char* fn, const PagedKVTable& t, std::size_t B) {
  constexpr std::int64_t kMaxPos = std::int64_t{1} << 62;
  if (t.query_positions.empty()) {
    if (!t.kv_position_offsets.empty() || t.kv_position_stride != 1) {
      fail(fn,
           "kv_position_offsets and kv_position_stride need query_positions");
    }
  } else {
    if (t.query_positions.size() != B) {
      fail(fn, "query_positions has " + count(t.query_positions.size()) +
                   " entries but there are " + count(B) + " sequences");
    }
    if (!t.kv_position_offsets.empty() && t.kv_position_offsets.size() != B) {
      fail(fn, "kv_position_offsets has " +
                   count(t.kv_position_offsets.size()) +
                   " entries but there are " + count(B) + " sequences");
    }
    if (t.kv_position_stride == 0 ||
        t.kv_position_stride >= static_cast<std::size_t>(kMaxPos)) {
      fail(fn, "kv_position_stride " + count(t.kv_position_stride) +
                   " must be in [1, 2^62)");
    }
    for (std::size_t b = 0; b < B; ++b) {
      const std::int64_t qp = t.query_positions[b];
      const std::int64_t ko =
          t.kv_position_offsets.empty() ? 0 : t.kv_position_offsets[b];
      if (qp <= -kMaxPos || qp >= kMaxPos || ko < 0 || ko >= kMaxPos) {
        fail(fn, "query_positions[" + count(b) + "] = " + std::to_string(qp) +
                     " must be in (-2^62, 2^62) and kv_position_offsets[" +
                     count(b) + "] = " + std::to_string(ko) +
                     " in [0, 2^62) (sequence " + count(b) + ")");
      }
    }
  }
}

// The block table against the pages and seq_lens; returns the longest
// sequence's length.
template <class KT>
std::size_t check_block_table(const char* fn, const PagedKVTable& t,
                              const TensorView<const KT>& k, std::size_t B) {
  const std::size_t bps = t.blocks_per_seq, ps = k.rows;
  if (bps != 0 && B > std::numeric_limits<std::size_t>::max() / bps) {
    fail(fn, "batch " + count(B) + " x blocks_per_seq " + count(bps) +
                 " overflows");
  }
  if (t.block_table.size() != B * bps) {
    fail(fn, "block_table has " + count(t.block_table.size()) +
                 " entries but batch " + count(B) + " x blocks_per_seq " +
                 count(bps) + " = " + count(B * bps));
  }
  std::size_t max_len = 0;
  for (std::size_t b = 0; b < B; ++b) {
    const std::int64_t len = t.seq_lens[b];
    const std::string seq = "seq_lens[" + count(b) +
                            "] = " + std::to_string(len) + " (sequence " +
                            count(b) + ")";
    if (len < 0) fail(fn, seq + " is negative");
    const auto n = static_cast<std::size_t>(len);
    if (n >= kMaxIndex) fail(fn, seq + " must be below 2^30");
    // bps x ps may wrap (a huge blocks_per_seq): it then holds any n.
    std::size_t capacity = 0;
    if (!__builtin_mul_overflow(bps, ps, &capacity) && n > capacity) {
      fail(fn, seq + " is longer than its blocks_per_seq " + count(bps) +
                   " pages of page_size " + count(ps) + " hold (" +
                   shape("k_pages", k) + ")");
    }
    max_len = std::max(max_len, n);
    for (std::size_t i = 0; i < (n + ps - 1) / ps; ++i) {
      const std::int32_t page = t.block_table[b * bps + i];
      if (page < 0 || static_cast<std::size_t>(page) >= k.batch) {
        // The table is [batch, blocks_per_seq]; the cache's page count is
        // its first axis in every layout (its other axes are not shown: a
        // caller's layout may differ from this view's).
        fail(fn, "block_table[" + count(b) + ", " + count(i) +
                     "] = " + std::to_string(page) + " (sequence " + count(b) +
                     ", entry " + count(i) + ") is not a page: k_pages has " +
                     count(k.batch) + " pages (0 to " +
                     std::to_string(std::int64_t(k.batch) - 1) + ")");
      }
    }
  }
  return max_len;
}

}  // namespace

template <class KT>
Plan check_paged_and_plan(const char* fn, const QueryTensor& qt,
                          const TensorView<const KT>& k,
                          const TensorView<const KT>& v, const PagedKVTable& t,
                          const OutputTensor& outt, const char* out_name,
                          const AttentionOptions& o) {
  const std::size_t dv = check_pages(fn, qt, k, v, outt, out_name);
  const TensorView<const float> q = qt.shape_view();
  const bool ragged = !t.query_start_loc.empty();
  const std::size_t B = ragged ? t.seq_lens.size() : q.batch;
  check_row_starts(fn, t, q, B, ragged, o);
  check_draft_parents(fn, t, q, B, ragged, o);
  check_positions(fn, t, B);
  const std::size_t max_len = check_block_table(fn, t, k, B);
  Plan p{};
  p.B = B;
  p.H = q.heads;
  p.Hkv = k.heads;
  p.g = q.heads / k.heads;
  p.n_q = q.rows;
  p.n_kv = max_len;
  p.d = q.cols;
  p.dv = dv;
  plan_options(fn, shape("q", q), shape("k_pages", k), o, /*paged=*/true, p);
  return p;
}

#define SOFTDOT_PAGED_PLAN(KT)                                               \
  template Plan check_paged_and_plan<KT>(                                    \
      const char*, const QueryTensor&, const TensorView<const KT>&,          \
      const TensorView<const KT>&, const PagedKVTable&, const OutputTensor&, \
      const char*, const AttentionOptions&);
SOFTDOT_PAGED_PLAN(float)
SOFTDOT_PAGED_PLAN(Float16)
SOFTDOT_PAGED_PLAN(BFloat16)
SOFTDOT_PAGED_PLAN(std::int8_t)
SOFTDOT_PAGED_PLAN(Float8E4M3)
SOFTDOT_PAGED_PLAN(Float8E5M2)
#undef SOFTDOT_PAGED_PLAN

std::string check_scales_shape(const char* fn, const char* name,
                               const TensorView<const std::int8_t>& values,
                               const TensorView<const float>& scales) {
  std::string sname = std::string(name) + " scales";
  check_tensor(fn, sname.c_str(), scales);
  if (scales.batch != values.batch || scales.heads != values.heads ||
      scales.rows != values.rows || scales.cols != 1) {
    fail(fn,
         shape(sname.c_str(), scales) + " must be " +
             shape(sname.c_str(), values.batch, values.heads, values.rows, 1) +
             " for " + shape(name, values));
  }
  return sname;
}

void check_tensor_scale(const char* fn, const char* name, float scale) {
  if (!(std::isfinite(scale) && scale >= 0.0f)) {
    fail(fn, std::string(name) + " scale = " + number(scale) +
                 " is not finite and >= 0");
  }
}

void check_scales(const char* fn, const char* name,
                  const TensorView<const std::int8_t>& values,
                  const TensorView<const float>& scales) {
  const std::string sname = check_scales_shape(fn, name, values, scales);
  for (std::size_t b = 0; b < scales.batch; ++b) {
    for (std::size_t h = 0; h < scales.heads; ++h) {
      for (std::size_t j = 0; j < scales.rows; ++j) {
        const float s = *scales.row(b, h, j);
        if (!(std::isfinite(s) && s >= 0.0f)) {
          fail(fn, sname + "[" + count(b) + ", " + count(h) + ", " + count(j) +
                       "] = " + number(s) + " is not finite and >= 0");
        }
      }
    }
  }
}

void check_paged_scales(const char* fn, const char* name,
                        const TensorView<const std::int8_t>& values,
                        const TensorView<const float>& scales,
                        const PagedKVTable& t) {
  const std::string sname = check_scales_shape(fn, name, values, scales);
  // Only the rows a key reads (the table is checked): unused rows of a page
  // pool may hold anything.
  const std::size_t ps = values.rows;
  for (std::size_t b = 0; b < t.seq_lens.size(); ++b) {
    const auto n = static_cast<std::size_t>(t.seq_lens[b]);
    for (std::size_t j = 0; j < n; ++j) {
      const auto page = static_cast<std::size_t>(
          t.block_table[b * t.blocks_per_seq + j / ps]);
      for (std::size_t h = 0; h < scales.heads; ++h) {
        const float s = *scales.row(page, h, j % ps);
        if (!(std::isfinite(s) && s >= 0.0f)) {
          fail(fn, sname + "[" + count(page) + ", " + count(h) + ", " +
                       count(j % ps) + "] = " + number(s) + " (sequence " +
                       count(b) + ", position " + count(j) +
                       ") is not finite and >= 0");
        }
      }
    }
  }
}

}  // namespace softdot::detail::attn
