// softdot: the argument checks of an attention request (defined in
// attention_checks.cc) and what the runners share with them: the plan's
// values (detail::AttentionPlanData, softdot/attention_request.h), the decode
// split constants, and each query's visible key range. Internal (src/ only).
#ifndef SOFTDOT_SRC_ATTENTION_CHECKS_H_
#define SOFTDOT_SRC_ATTENTION_CHECKS_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "check.h"
#include "kernels/attention_args.h"
#include "kernels/dequantize.h"
#include "softdot/attention.h"
#include "softdot/attention_request.h"

namespace softdot::detail::attn {

using detail::count;
using detail::fail;
using detail::number;
using detail::span_error;
using detail::span_fits;

// Decode split: chunk size, and the most rows per KV head that use it.
constexpr std::size_t kDecodeChunk = 512;
constexpr std::size_t kDecodeRows = detail::kDecodeMaxRows;
// A split KV head (decode) runs its chunks on the units (bfloat16 query,
// keys and values) from this many rows up (attention.cc). The units hold
// the rows in lanes (16 on AVX-512), so their time hardly depends on the
// rows, while the decode form's grows with them: on an AMD EPYC Zen 4
// (n_kv = 32768, d = 128) 8 rows took 1.05-1.11x the decode form's time
// on the units and 16 rows 0.65-0.72x (BM_decode_sweep/bf16q), a
// crossing near 9 rows.
constexpr std::size_t kUnitsDecodeMinRows = 12;

inline std::string shape(const char* name, std::size_t b, std::size_t h,
                         std::size_t r, std::size_t c) {
  return std::string(name) + " [" + count(b) + ", " + count(h) + ", " +
         count(r) + ", " + count(c) + "]";
}

template <class T>
std::string shape(const char* name, const TensorView<T>& t) {
  return shape(name, t.batch, t.heads, t.rows, t.cols);
}

template <class T>
void check_tensor(const char* fn, const char* name, const TensorView<T>& t) {
  std::size_t elements = 0;
  const std::size_t dims[3] = {t.batch, t.heads, t.rows};
  const std::size_t strides[3] = {t.batch_stride, t.head_stride, t.row_stride};
  if (!span_fits(dims, strides, 3, t.cols, sizeof(T), &elements)) {
    fail(fn,
         span_error(shape(name, t) + " with strides [" + count(t.batch_stride) +
                        ", " + count(t.head_stride) + ", " +
                        count(t.row_stride) + "]",
                    sizeof(T)));
  }
  // elements is 0 exactly when a dimension is 0 (a product of the
  // dimensions could wrap to 0 and let a null view through).
  if (t.data == nullptr && elements != 0) {
    fail(fn, shape(name, t) + " has null data");
  }
  if (t.rows > 1 && t.row_stride < t.cols) {
    fail(fn, shape(name, t) + " has row_stride " + count(t.row_stride) +
                 " < cols " + count(t.cols));
  }
}

// check_tensor of the query, then of what check_kv checks (K and V), then
// of the output when out_name is non-null, each view in its own element
// type (a 16-bit query or output spans half a float view's bytes): the
// checks' fixed order, q first.
template <class F>
void check_query_and_output(const char* fn, const QueryTensor& q,
                            const OutputTensor& out, const char* out_name,
                            F check_kv) {
  std::visit([&](const auto& t) { check_tensor(fn, "q", t); }, q.variant());
  check_kv();
  if (out_name != nullptr) {
    std::visit([&](const auto& t) { check_tensor(fn, out_name, t); },
               out.variant());
  }
}

// The keys (named k_name: "k" or "k_pages") against the query: a
// non-empty q, the same d, and q's heads a multiple of k's (GQA).
template <class QT, class KT>
void check_query_keys(const char* fn, const TensorView<QT>& q,
                      const TensorView<const KT>& k, const char* k_name) {
  if (q.rows == 0 || q.cols == 0) fail(fn, shape("q", q) + " is empty");
  if (k.cols != q.cols) {
    fail(fn, shape(k_name, k) + " has d = " + count(k.cols) + " but " +
                 shape("q", q) + " has d = " + count(q.cols));
  }
  if (k.heads == 0 || q.heads == 0 || q.heads % k.heads != 0) {
    fail(fn, shape("q", q) + " has " + count(q.heads) +
                 " heads, not a multiple of the " + count(k.heads) +
                 " heads of " + shape(k_name, k));
  }
}

// The output (when out_name is non-null) must be [batch, heads, n_q, dv] of
// the query; `from` names what gives dv ("v", "k" or "v_pages": from_view).
template <class OT, class QT, class VT>
void check_output_shape(const char* fn, const char* out_name,
                        const TensorView<OT>& out, const TensorView<QT>& q,
                        std::size_t dv, const char* from,
                        const TensorView<VT>& from_view) {
  if (out_name != nullptr && (out.batch != q.batch || out.heads != q.heads ||
                              out.rows != q.rows || out.cols != dv)) {
    fail(fn, shape(out_name, out) + " must be " +
                 shape(out_name, q.batch, q.heads, q.rows, dv) + " for " +
                 shape("q", q) + " and " + shape(from, from_view));
  }
}

// The bytes a view (or a raw array) spans, named for the messages: the
// overlap checks of the forward (check_forward_overlap), of the gradients
// of attention_backward() and of softdot::mpi::ring_attention_backward().
// A view without elements (or a null array) spans nothing. A 4-d view also
// keeps its rows' layout (row bytes and the three strides in bytes), so that
// two views whose spans meet but whose rows interleave (rows of one buffer
// taken alternately) are told apart: they share no element.
struct NamedSpan {
  const char* name = "";
  std::uintptr_t lo = 0, hi = 0;
  std::size_t batch = 1, heads = 1, rows = 1;  // 1 x 1 x 1 for an array
  std::size_t row_bytes = 0;                   // 0: one segment [lo, hi)
  std::size_t batch_bytes = 0, head_bytes = 0, row_step = 0;
};

template <class T>
NamedSpan named_span(const char* name, const TensorView<T>& t) {
  NamedSpan s{name};
  if (t.data == nullptr || t.batch == 0 || t.heads == 0 || t.rows == 0 ||
      t.cols == 0) {
    return s;
  }
  const std::size_t last = (t.batch - 1) * t.batch_stride +
                           (t.heads - 1) * t.head_stride +
                           (t.rows - 1) * t.row_stride + t.cols;
  s.lo = reinterpret_cast<std::uintptr_t>(t.data);
  s.hi = s.lo + last * sizeof(T);
  s.batch = t.batch;
  s.heads = t.heads;
  s.rows = t.rows;
  s.row_bytes = t.cols * sizeof(T);
  s.batch_bytes = t.batch_stride * sizeof(T);
  s.head_bytes = t.head_stride * sizeof(T);
  s.row_step = t.row_stride * sizeof(T);
  return s;
}

inline NamedSpan named_span(const char* name, const void* p,
                            std::size_t bytes) {
  const auto lo = reinterpret_cast<std::uintptr_t>(p);
  return NamedSpan{name, lo, p == nullptr ? lo : lo + bytes};
}

// A 1-d array's span.
template <class T>
NamedSpan span_of(const char* name, std::span<const T> x) {
  return named_span(name, x.data(), x.size() * sizeof(T));
}

// add(span) for each array of the options a call reads: the mask, the
// bias, the sinks and the ALiBi slopes (the forward's and the float64
// functions' overlap checks).
template <class Add>
void add_option_spans(const AttentionOptions& o, Add add) {
  add(named_span("mask", o.mask));
  add(named_span("bias", o.bias));
  add(span_of("sinks", o.sinks));
  add(span_of("alibi_slopes", o.alibi_slopes));
}

// True when x and y share a byte: their spans meet and, for views, some row
// of one meets some row of the other (the rows sorted and swept; only when
// the spans meet, which separate buffers never do).
bool spans_share_bytes(const NamedSpan& x, const NamedSpan& y);

// "" when no output shares a byte with an input or an output before it;
// else "<output> overlaps <other>" for the first such pair.
inline std::string first_overlap(std::span<const NamedSpan> outs,
                                 std::span<const NamedSpan> ins) {
  for (std::size_t i = 0; i < outs.size(); ++i) {
    for (const NamedSpan& in : ins) {
      if (spans_share_bytes(outs[i], in)) {
        return std::string(outs[i].name) + " overlaps " + in.name;
      }
    }
    for (std::size_t j = 0; j < i; ++j) {
      if (spans_share_bytes(outs[i], outs[j])) {
        return std::string(outs[i].name) + " overlaps " + outs[j].name;
      }
    }
  }
  return {};
}
inline std::string first_overlap(const std::vector<NamedSpan>& outs,
                                 const std::vector<NamedSpan>& ins) {
  return first_overlap(std::span<const NamedSpan>(outs),
                       std::span<const NamedSpan>(ins));
}

template <class KT>
constexpr int kv_type() {
  if constexpr (std::is_same_v<KT, Float16>) return detail::kKvF16;
  if constexpr (std::is_same_v<KT, BFloat16>) return detail::kKvBF16;
  if constexpr (std::is_same_v<KT, std::int8_t>) return detail::kKvI8;
  if constexpr (std::is_same_v<KT, Float8E4M3>) return detail::kKvE4M3;
  if constexpr (std::is_same_v<KT, Float8E5M2>) return detail::kKvE5M2;
  return detail::kKvF32;
}

// Everything the row loop needs, checked (AttentionPlan::data()).
using Plan = detail::AttentionPlanData;

// Checks every argument of attention() (v non-null) or of
// attention_weights() and attention_scores() (v null; out is the weights or
// the scores, out_cols = n_kv) and returns the plan (out_name null: there is
// no out to check, as in attention_partial()); std::invalid_argument naming
// the function, the argument and the shapes otherwise.
// The options part of the plan (p's shapes already filled in): every
// option's value checked (check_attention_options is the same check) and
// its derived values (scale, window, positions, the key range). k_shape
// names the keys in the messages; paged: the mask and bias need at least
// the longest sequence's columns.
void plan_options(const char* fn, const std::string& q_shape,
                  const std::string& k_shape, const AttentionOptions& o,
                  bool paged, Plan& p);

// The shape part of check_and_plan, on views already checked with
// check_tensor: q, k, v and out against each other, and the options
// (plan_options). Q and O are const float and float (a 16-bit query or
// output enters as QOTensor::shape_view) or const double and double
// (attention_double.cc, with K double).
template <class QT, class KT, class OT>
Plan plan_contiguous(const char* fn, const TensorView<QT>& q,
                     const TensorView<const KT>& k,
                     const TensorView<const KT>* v, const TensorView<OT>& out,
                     const char* out_name, std::size_t out_cols,
                     const AttentionOptions& o);

template <class KT>
Plan check_and_plan(const char* fn, const QueryTensor& q,
                    const TensorView<const KT>& k,
                    const TensorView<const KT>* v, const OutputTensor& out,
                    const char* out_name, std::size_t out_cols,
                    const AttentionOptions& o);

// The scales of int8 keys or values (name "k" or "v"): [batch, heads, rows,
// 1] as the values' first three dimensions, non-null when not empty, and
// every scale finite and >= 0 (a NaN or negative scale is a caller's bug
// that would otherwise pass silently into every score).
void check_scales(const char* fn, const char* name,
                  const TensorView<const std::int8_t>& values,
                  const TensorView<const float>& scales);

// Checks every argument of paged_attention() (out_name null: of
// paged_attention_partial()), the table entry by entry (attention.h), and
// returns the plan with n_kv = the longest sequence and the unclamped key
// range (sequence_plan gives each sequence's).
template <class KT>
Plan check_paged_and_plan(const char* fn, const QueryTensor& q,
                          const TensorView<const KT>& k,
                          const TensorView<const KT>& v,
                          const PagedKVTable& table, const OutputTensor& out,
                          const char* out_name, const AttentionOptions& o);

// The scales of int8 values (named name + " scales"): a valid view of shape
// [batch, heads, rows, 1] of the values'. Returns that name.
std::string check_scales_shape(const char* fn, const char* name,
                               const TensorView<const std::int8_t>& values,
                               const TensorView<const float>& scales);

// check_scales for int8 pages: [pages, heads, page_size, 1] as the values,
// and every scale a key of the (checked) table reads finite and >= 0.
void check_paged_scales(const char* fn, const char* name,
                        const TensorView<const std::int8_t>& values,
                        const TensorView<const float>& scales,
                        const PagedKVTable& table);

// The values of an 8-bit format as a view of bytes of the same shape and
// strides (the scale checks only read their shape).
template <class T>
TensorView<const std::int8_t> byte_view(const TensorView<const T>& t) {
  static_assert(sizeof(T) == 1);
  return {reinterpret_cast<const std::int8_t*>(t.data),
          t.batch,
          t.heads,
          t.rows,
          t.cols,
          t.batch_stride,
          t.head_stride,
          t.row_stride};
}

// A per-tensor fp8 scale (name "k", "v_pages", ...): finite and >= 0.
void check_tensor_scale(const char* fn, const char* name, float scale);

// A request's K/V views typed by format (int8 and fp8: the values, and the
// scales; an fp8 per-tensor scale is a scales view with strides 0 over the
// request's own float, k_per_tensor / v_per_tensor set).
template <class KT>
struct KVViews {
  TensorView<const KT> k, v;
  TensorView<const float> k_scales, v_scales;  // int8 and fp8 only
  bool k_per_tensor = false, v_per_tensor = false;
};

// M(KT) for each K/V element type a request may carry (explicit
// instantiations of the runners over KVViews<KT>).
#define SOFTDOT_FOR_EACH_KV_TYPE(M) \
  M(float)                          \
  M(Float16)                        \
  M(BFloat16)                       \
  M(std::int8_t)                    \
  M(Float8E4M3)                     \
  M(Float8E5M2)

template <class K>
inline constexpr bool kIsFloat8KV =
    std::is_same_v<K, Float8E4M3KV> || std::is_same_v<K, Float8E5M2KV>;

// The scales of fp8 keys or values x as the kernels read them: the view,
// or one float broadcast over every row (strides 0; the request's own
// `scale`, alive as long as the request).
template <class T>
TensorView<const float> float8_scales(const Float8KV<T>& x, bool* per_tensor) {
  *per_tensor = x.scales.data == nullptr;
  if (!*per_tensor) return x.scales;
  return {&x.scale, x.values.batch, x.values.heads, x.values.rows, 1, 0, 0, 0};
}

// Calls f(KVViews<KT>) with the request's keys and values in their format
// (v empty when the source has none). The formats of k and v must agree
// (AttentionPlan::make checks that first).
template <class F>
void visit_kv(const KVSource& s, F&& f) {
  std::visit(
      [&](const auto& k) {
        using K = std::decay_t<decltype(k)>;
        if constexpr (std::is_same_v<K, Int8KV>) {
          KVViews<std::int8_t> w;
          w.k = k.values;
          w.k_scales = k.scales;
          if (s.has_v) {
            const auto& v = std::get<Int8KV>(s.v.variant());
            w.v = v.values;
            w.v_scales = v.scales;
          }
          f(w);
        } else if constexpr (kIsFloat8KV<K>) {
          using KT = std::remove_const_t<
              std::remove_pointer_t<decltype(k.values.data)>>;
          KVViews<KT> w;
          w.k = k.values;
          w.k_scales = float8_scales(k, &w.k_per_tensor);
          if (s.has_v) {
            const auto& v = std::get<K>(s.v.variant());
            w.v = v.values;
            w.v_scales = float8_scales(v, &w.v_per_tensor);
          }
          f(w);
        } else {
          using KT =
              std::remove_const_t<std::remove_pointer_t<decltype(k.data)>>;
          KVViews<KT> w;
          w.k = k;
          if (s.has_v) w.v = std::get<K>(s.v.variant());
          f(w);
        }
      },
      s.k.variant());
}

// The request of a public entry point (attention.cc, attention_weights.cc):
// named fn, checked and run.
inline void run_request(const char* fn, const QueryTensor& q,
                        const KVSource& kv, const AttentionTarget& target,
                        const AttentionOptions& o) {
  AttentionRequest r;
  r.name = fn;
  r.q = q;
  r.kv = kv;
  r.target = target;
  r.options = o;
  run_attention(r);
}

// The runners of a checked plan: the output or the partial result
// (attention.cc), the explicit weights or scores (attention_weights.cc).
template <class KT>
void run_rows(const AttentionPlan& plan, const KVViews<KT>& kv);
template <class KT>
void run_explicit(const AttentionPlan& plan, const KVViews<KT>& kv);
// The gradients target (attention_backward.cc): its checks, made by
// AttentionPlan::make after the forward's (p: the plan's values), and its
// runner.
void check_gradients(const char* fn, const AttentionRequest& r, const Plan& p);
void run_gradients(const AttentionPlan& plan);

// The plan of one sequence of n_kv keys and n_q queries: positions from
// its own n_kv and n_q, the key range clamped to it.
inline Plan sequence_plan(const Plan& p, std::size_t n_kv, std::size_t n_q) {
  Plan s = p;
  s.n_kv = n_kv;
  s.n_q = n_q;
  s.q_shift = static_cast<std::int64_t>(n_kv) - static_cast<std::int64_t>(n_q);
  s.kv_end = std::min(p.kv_end, n_kv);
  s.kv_begin = std::min(p.kv_begin, s.kv_end);
  return s;
}

// Sequence b's positions from a paged table's arrays (PagedKVTable, when
// given): row 0 at query_positions[b], key j at j stride + offsets[b].
inline Plan positioned_plan(const Plan& s, const PagedKVTable& t,
                            std::size_t b) {
  if (t.query_positions.empty()) return s;
  Plan r = s;
  r.q_shift = t.query_positions[b];
  r.kv_offset = t.kv_position_offsets.empty() ? 0 : t.kv_position_offsets[b];
  r.kv_stride = static_cast<std::int64_t>(t.kv_position_stride);
  return r;
}

// floor(a / b) and ceil(a / b) for b >= 1.
inline std::int64_t floor_div(std::int64_t a, std::int64_t b) {
  const std::int64_t q = a / b;
  return (a % b != 0 && a < 0) ? q - 1 : q;
}
inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  const std::int64_t q = a / b;
  return (a % b != 0 && a > 0) ? q + 1 : q;
}

// The ALiBi base of query row i: key j's distance pos_j - pos_i is
// j kv_stride + alibi_base (in key index units, as visible_keys counts).
inline std::int64_t alibi_base(const Plan& p, std::size_t i) {
  return p.kv_offset - (p.q_shift + static_cast<std::int64_t>(i));
}

// Visible keys of query i: [first, last] (inclusive), clamped to the key
// range (first > last when none is visible). Key j sits at position
// j kv_stride + kv_offset, query i at i + q_shift.
inline void visible_keys(const Plan& p, std::size_t i, std::int32_t& first,
                         std::int32_t& last) {
  const auto pos = static_cast<std::int64_t>(i) + p.q_shift;
  std::int64_t a = static_cast<std::int64_t>(p.kv_begin);
  std::int64_t b = static_cast<std::int64_t>(p.kv_end) - 1;
  // pos - wl - offset and pos + wr - offset, saturated (a window of up to
  // 2^63 - 1 keys is allowed).
  auto sat = [](std::int64_t x, std::int64_t y, bool add) {
    std::int64_t r = 0;
    const bool over = add ? __builtin_add_overflow(x, y, &r)
                          : __builtin_sub_overflow(x, y, &r);
    if (!over) return r;
    return (add ? y > 0 : y < 0) ? std::numeric_limits<std::int64_t>::max()
                                 : std::numeric_limits<std::int64_t>::min();
  };
  if (p.wl >= 0) {
    const std::int64_t lo = sat(sat(pos, p.wl, false), p.kv_offset, false);
    a = std::max(a, ceil_div(lo, p.kv_stride));
  }
  if (p.wr >= 0) {
    const std::int64_t hi = sat(sat(pos, p.wr, true), p.kv_offset, false);
    b = std::min(b, floor_div(hi, p.kv_stride));
  }
  a = std::min<std::int64_t>(a, static_cast<std::int64_t>(p.n_kv));
  b = std::max<std::int64_t>(b, -1);
  first = static_cast<std::int32_t>(a);
  last = static_cast<std::int32_t>(b);
}

}  // namespace softdot::detail::attn

#endif  // SOFTDOT_SRC_ATTENTION_CHECKS_H_
