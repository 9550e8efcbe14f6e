// softdot: the per-row tables of the attention kernels' calls, shared by
// the forward's runner (attention.cc) and the backward's
// (attention_backward.cc). Internal (src/ only).
#ifndef SOFTDOT_SRC_ATTENTION_ROWS_H_
#define SOFTDOT_SRC_ATTENTION_ROWS_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#include "attention_checks.h"
#include "kernels/attention_args.h"
#include "softdot/attention.h"
#include "softdot/attention_request.h"

namespace softdot::detail::attn {

// The per-row tables of one kernel call: each query row's address, visible
// keys, mask and bias rows (at the plan's mask column of key 0) and sink.
constexpr std::size_t kNoTree = std::numeric_limits<std::size_t>::max();

struct RowTables {
  const float* q[detail::kMaxKernelRows];
  std::int32_t first[detail::kMaxKernelRows], last[detail::kMaxKernelRows];
  const std::uint8_t* mask[detail::kMaxKernelRows] = {};
  const float* bias[detail::kMaxKernelRows] = {};
  float sinks[detail::kMaxKernelRows] = {};
  float alibi[detail::kMaxKernelRows] = {};
  double alibi_base[detail::kMaxKernelRows] = {};
};

// Query row (b, h, i): its address, or, for a 16-bit query, its values
// widened (exactly) into dst (d floats).
const float* query_row(const QueryTensor& q, std::size_t b, std::size_t h,
                       std::size_t i, std::size_t d, float* dst);

// Rows row0 .. row0 + cnt - 1 of KV head kh of sequence b (row r is query
// head kh g + r / n_q, query i = r % n_q, n_q the sequence's own); ps is
// the sequence's plan, and its query i is q's row (q_batch, h, q_row0 + i).
// A 16-bit query's rows are widened into widened (cnt * d floats).
void fill_row_tables(const Plan& p, const Plan& ps, const AttentionOptions& o,
                     const QueryTensor& q, float* widened, std::size_t b,
                     std::size_t q_batch, std::size_t q_row0, std::size_t kh,
                     std::size_t row0, std::size_t cnt, RowTables& t);

// The keys a set of rows sees, together: lo .. hi (inclusive), empty when
// no row sees a key.
struct KeyHull {
  std::size_t lo = 0, hi = 0;
  bool none = true;
  bool empty() const { return none; }
  void add(std::int32_t first, std::int32_t last) {
    if (first > last) return;
    const auto f = static_cast<std::size_t>(first);
    const auto l = static_cast<std::size_t>(last);
    lo = none ? f : std::min(lo, f);
    hi = none ? l : std::max(hi, l);
    none = false;
  }
};

KeyHull row_hull(const std::int32_t* first, const std::int32_t* last,
                 std::size_t n);

// Query rows i0 .. i1 - 1 of a sequence (any head: the rows of all heads
// see the same keys).
KeyHull visible_hull(const Plan& ps, std::size_t i0, std::size_t i1);

// t checked as a view and as [b, h, r, c], the shape of `like` (the
// backward's messages).
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
inline void zero_view(const TensorView<float>& t) {
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

}  // namespace softdot::detail::attn

#endif  // SOFTDOT_SRC_ATTENTION_ROWS_H_
