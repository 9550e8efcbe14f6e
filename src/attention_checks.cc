// softdot: the argument checks of an attention request (every entry point:
// attention(), paged_attention(), attention_weights(), attention_scores(),
// the gradients and their partial forms), AttentionPlan::make, which runs
// them in one fixed order, and the plan they produce (src/attention_checks.h;
// a paged cache's checks are in attention_paged_checks.cc, the gradients'
// in attention_gradients.cc). Each option's value is checked here
// (plan_options) for every request: the bindings and the command pass the
// user's values through a request and show this file's messages.
#include "attention_checks.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "attention_schedule.h"

namespace softdot::detail::attn {

namespace {

// The options part of the plan (p's shapes already filled in). Mask and
// bias need n_kv columns, or at least n_kv (the longest sequence) when
// paged; the paged key range is clamped per sequence (sequence_plan).
// The options whose validity does not depend on the inputs: the one place
// their values are checked (check_attention_options is this, public).
void check_option_values(const char* fn, const AttentionOptions& o) {
  if (o.scale) {  // not set: the default 1/sqrt(d)
    const double s = *o.scale;
    const auto sf = static_cast<float>(s);
    if (!(s > 0.0) || !std::isfinite(s) || !(sf > 0.0f) || !std::isfinite(sf)) {
      fail(fn,
           "scale must be finite and > 0 (also as a float), got " + number(s));
    }
  }
  if (!(o.softcap >= 0.0f) || !std::isfinite(o.softcap)) {
    fail(fn, "softcap must be finite and >= 0, got " + number(o.softcap));
  }
  if (o.window_left < -1 || o.window_right < -1) {
    fail(fn, "window_left and window_right must be >= -1, got " +
                 std::to_string(o.window_left) + " and " +
                 std::to_string(o.window_right));
  }
  if (o.batch_invariant && (o.precise || o.prefill_form)) {
    fail(fn, std::string("batch_invariant cannot be combined with ") +
                 (o.precise ? "precise" : "prefill_form") +
                 " (each computes every row alone in the prefill form)");
  }
  if (o.kv_begin > o.kv_end) {
    fail(fn, "kv_begin " + count(o.kv_begin) + " is past kv_end " +
                 count(o.kv_end));
  }
}

}  // namespace

void plan_options(const char* fn, const std::string& q_shape,
                  const std::string& k_shape, const AttentionOptions& o,
                  bool paged, Plan& p) {
  check_option_values(fn, o);
  // Scale (1/sqrt(d) when not given: finite and > 0 for every d >= 1).
  const double scale =
      o.scale.value_or(1.0 / std::sqrt(static_cast<double>(p.d)));
  p.scale = static_cast<float>(scale);
  p.softcap = o.softcap;
  p.wl = o.window_left;
  p.wr = o.window_right;
  if (o.causal && (p.wr < 0 || p.wr > 0)) p.wr = 0;
  if (paged) {
    // Clamped per sequence (sequence_plan).
    p.kv_begin = o.kv_begin;
    p.kv_end = o.kv_end;
  } else {
    // kv_end is clamped to n_kv (attention.h); the message shows the
    // caller's own kv_end and says so.
    p.kv_end = std::min(o.kv_end, p.n_kv);
    p.kv_begin = o.kv_begin;
    if (p.kv_begin > p.kv_end) {
      const bool open = o.kv_end == std::numeric_limits<std::size_t>::max();
      fail(fn, "kv_begin " + count(o.kv_begin) +
                   " is past n_kv = " + count(p.n_kv) +
                   (open ? "" : " (kv_end " + count(o.kv_end) + ")"));
    }
  }
  const bool positioned =
      o.q_position != AttentionOptions::kAutoPosition || o.kv_position != 0;
  p.q_shift =
      static_cast<std::int64_t>(p.n_kv) - static_cast<std::int64_t>(p.n_q);
  p.mask_col0 = 0;
  if (positioned) {
    if (paged) {
      fail(fn, "q_position and kv_position are not supported (got " +
                   count(o.q_position) + " and " + count(o.kv_position) + ")");
    }
    constexpr std::size_t kMaxPosition = std::size_t{1} << 62;
    if (o.kv_position >= kMaxPosition ||
        (o.q_position != AttentionOptions::kAutoPosition &&
         o.q_position >= kMaxPosition)) {
      fail(fn, "q_position " + count(o.q_position) + " and kv_position " +
                   count(o.kv_position) + " must be below 2^62");
    }
    if (o.q_position != AttentionOptions::kAutoPosition) {
      p.q_shift = static_cast<std::int64_t>(o.q_position) -
                  static_cast<std::int64_t>(o.kv_position);
    }
    p.mask_col0 = o.kv_position;
  }
  auto check_extra = [&](const char* name, auto& t) {
    if (t.data == nullptr) return;
    // The span rule of every view (docs/limits.md); row_stride 0 (one row
    // for every query) is allowed here, so not check_tensor. Found by
    // fuzz_attention: a mask whose span wrapped was read far out of bounds.
    std::size_t elements = 0;
    const std::size_t dims[3] = {t.batch, t.heads, t.rows};
    const std::size_t strides[3] = {t.batch_stride, t.head_stride,
                                    t.row_stride};
    if (!span_fits(dims, strides, 3, t.cols, sizeof(*t.data), &elements)) {
      fail(fn,
           span_error(shape(name, t) + " with strides [" +
                          count(t.batch_stride) + ", " + count(t.head_stride) +
                          ", " + count(t.row_stride) + "]",
                      sizeof(*t.data)));
    }
    if (positioned) {
      if (t.rows != p.n_q || t.cols < o.kv_position + p.n_kv) {
        fail(fn, shape(name, t) + " must have n_q = " + count(p.n_q) +
                     " rows and at least kv_position + n_kv = " +
                     count(o.kv_position) + " + " + count(p.n_kv) + " cols (" +
                     q_shape + ", " + k_shape + ")");
      }
    }
    if (paged && (t.rows != p.n_q || t.cols < p.n_kv)) {
      fail(fn, shape(name, t) + " must have n_q = " + count(p.n_q) +
                   " rows and at least max(seq_lens) = " + count(p.n_kv) +
                   " cols (" + q_shape + ")");
    }
    if (!paged && !positioned && (t.rows != p.n_q || t.cols != p.n_kv)) {
      fail(fn, shape(name, t) + " must have n_q x n_kv = " + count(p.n_q) +
                   " x " + count(p.n_kv) + " rows and cols (" + q_shape + ", " +
                   k_shape + ")");
    }
    if ((t.batch != 1 && t.batch != p.B) || (t.heads != 1 && t.heads != p.H)) {
      fail(fn, shape(name, t) + " must have batch 1 or " + count(p.B) +
                   " and heads 1 or " + count(p.H) + " (" + q_shape + ")");
    }
  };
  check_extra("mask", o.mask);
  check_extra("bias", o.bias);
  if (!o.sinks.empty() && o.sinks.size() != p.H) {
    fail(fn, "sinks has " + count(o.sinks.size()) + " values but " + q_shape +
                 " has " + count(p.H) + " heads");
  }
  if (!o.alibi_slopes.empty()) {
    if (o.alibi_slopes.size() != p.H) {
      fail(fn, "alibi_slopes has " + count(o.alibi_slopes.size()) +
                   " values but " + q_shape + " has " + count(p.H) + " heads");
    }
    for (std::size_t h = 0; h < p.H; ++h) {
      if (!std::isfinite(o.alibi_slopes[h])) {
        fail(fn, "alibi_slopes[" + count(h) +
                     "] = " + number(o.alibi_slopes[h]) + " must be finite");
      }
    }
    if (!o.bias.empty()) {
      fail(fn,
           "alibi_slopes cannot be combined with a bias (add the ALiBi "
           "terms to the bias instead)");
    }
  }
}

template <class KT>
Plan check_and_plan(const char* fn, const QueryTensor& qt,
                    const TensorView<const KT>& k,
                    const TensorView<const KT>* v, const OutputTensor& outt,
                    const char* out_name, std::size_t out_cols,
                    const AttentionOptions& o) {
  check_query_and_output(fn, qt, outt, out_name, [&] {
    check_tensor(fn, "k", k);
    if (v != nullptr) check_tensor(fn, "v", *v);
  });
  return plan_contiguous(fn, qt.shape_view(), k, v, outt.shape_view(), out_name,
                         out_cols, o);
}

template <class QT, class KT, class OT>
Plan plan_contiguous(const char* fn, const TensorView<QT>& q,
                     const TensorView<const KT>& k,
                     const TensorView<const KT>* v, const TensorView<OT>& out,
                     const char* out_name, std::size_t out_cols,
                     const AttentionOptions& o) {
  if (q.rows == 0 || q.cols == 0) fail(fn, shape("q", q) + " is empty");
  if (k.batch != q.batch) {
    fail(fn, shape("k", k) + " has batch " + count(k.batch) + " but " +
                 shape("q", q) + " has batch " + count(q.batch));
  }
  check_query_keys(fn, q, k, "k");
  std::size_t dv = out_cols;
  if (v != nullptr) {
    if (v->batch != k.batch || v->heads != k.heads || v->rows != k.rows) {
      fail(fn, shape("v", *v) + " does not match " + shape("k", k) +
                   " in batch, heads and keys");
    }
    if (v->cols == 0) fail(fn, shape("v", *v) + " has d_v = 0");
    dv = v->cols;
  }
  check_output_shape(fn, out_name, out, q, dv, v ? "v" : "k", v ? *v : k);
  constexpr std::size_t kMaxIndex = std::size_t{1} << 30;
  if (k.rows >= kMaxIndex || q.rows >= kMaxIndex) {
    fail(fn, "n_q = " + count(q.rows) + " and n_kv = " + count(k.rows) +
                 " must be below 2^30");
  }
  // Every query row gets an lse and, split into decode chunks, a state of
  // 8 (d_v + 2) bytes; their count must not wrap (strides of 0 make a view
  // span less than its rows).
  std::size_t rows_total = 0, row_bytes = 0, state_bytes = 0;
  if (__builtin_mul_overflow(q.batch, q.heads, &rows_total) ||
      __builtin_mul_overflow(rows_total, q.rows, &rows_total) ||
      __builtin_mul_overflow(dv + 2, sizeof(double), &row_bytes) ||
      __builtin_mul_overflow(rows_total, row_bytes, &state_bytes) ||
      state_bytes > static_cast<std::size_t>(PTRDIFF_MAX)) {
    fail(fn, shape("q", q) +
                 " has more query rows (batch x heads x n_q) "
                 "than fit in memory with d_v = " +
                 count(dv));
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
  plan_options(fn, shape("q", q), shape("k", k), o, /*paged=*/false, p);
  return p;
}

template Plan plan_contiguous<const double, double, double>(
    const char*, const TensorView<const double>&,
    const TensorView<const double>&, const TensorView<const double>*,
    const TensorView<double>&, const char*, std::size_t,
    const AttentionOptions&);

template Plan check_and_plan<float>(const char*, const QueryTensor&,
                                    const TensorView<const float>&,
                                    const TensorView<const float>*,
                                    const OutputTensor&, const char*,
                                    std::size_t, const AttentionOptions&);
template Plan check_and_plan<Float16>(const char*, const QueryTensor&,
                                      const TensorView<const Float16>&,
                                      const TensorView<const Float16>*,
                                      const OutputTensor&, const char*,
                                      std::size_t, const AttentionOptions&);
template Plan check_and_plan<BFloat16>(const char*, const QueryTensor&,
                                       const TensorView<const BFloat16>&,
                                       const TensorView<const BFloat16>*,
                                       const OutputTensor&, const char*,
                                       std::size_t, const AttentionOptions&);

template Plan check_and_plan<std::int8_t>(const char*, const QueryTensor&,
                                          const TensorView<const std::int8_t>&,
                                          const TensorView<const std::int8_t>*,
                                          const OutputTensor&, const char*,
                                          std::size_t, const AttentionOptions&);
template Plan check_and_plan<Float8E4M3>(const char*, const QueryTensor&,
                                         const TensorView<const Float8E4M3>&,
                                         const TensorView<const Float8E4M3>*,
                                         const OutputTensor&, const char*,
                                         std::size_t, const AttentionOptions&);
template Plan check_and_plan<Float8E5M2>(const char*, const QueryTensor&,
                                         const TensorView<const Float8E5M2>&,
                                         const TensorView<const Float8E5M2>*,
                                         const OutputTensor&, const char*,
                                         std::size_t, const AttentionOptions&);

namespace {

// The rows of a span as sorted [lo, hi) byte intervals (one for an array).
std::vector<std::pair<std::uintptr_t, std::uintptr_t>> row_segments(
    const NamedSpan& s) {
  std::vector<std::pair<std::uintptr_t, std::uintptr_t>> r;
  if (s.row_bytes == 0) {
    r.emplace_back(s.lo, s.hi);
    return r;
  }
  r.reserve(s.batch * s.heads * s.rows);
  for (std::size_t b = 0; b < s.batch; ++b) {
    for (std::size_t h = 0; h < s.heads; ++h) {
      for (std::size_t i = 0; i < s.rows; ++i) {
        const std::uintptr_t lo =
            s.lo + b * s.batch_bytes + h * s.head_bytes + i * s.row_step;
        r.emplace_back(lo, lo + s.row_bytes);
      }
    }
  }
  std::sort(r.begin(), r.end());
  return r;
}

// The rows row_segments would list (saturating at SIZE_MAX).
std::size_t segment_count(const NamedSpan& s) {
  if (s.row_bytes == 0) return 1;
  std::size_t n = 0;
  if (__builtin_mul_overflow(s.batch, s.heads, &n) ||
      __builtin_mul_overflow(n, s.rows, &n)) {
    return SIZE_MAX;
  }
  return n;
}

// The most rows the sweep lists for one pair (16 bytes each): beyond it two
// views whose spans meet count as overlapping without the sweep. Strides of
// 0 let a view of few bytes have any number of rows, so the bound is on the
// rows, not on the bytes.
constexpr std::size_t kMaxSweptRows = std::size_t{1} << 20;

}  // namespace

bool spans_share_bytes(const NamedSpan& x, const NamedSpan& y) {
  if (!(x.lo < x.hi && y.lo < y.hi && x.lo < y.hi && y.lo < x.hi)) {
    return false;
  }
  if (x.row_bytes == 0 && y.row_bytes == 0) return true;
  const std::size_t nx = segment_count(x), ny = segment_count(y);
  if (nx > kMaxSweptRows || ny > kMaxSweptRows - nx) return true;
  const auto a = row_segments(x), b = row_segments(y);
  // Two sorted lists of intervals: advance the one that ends first.
  std::size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (a[i].first < b[j].second && b[j].first < a[i].second) return true;
    if (a[i].second <= b[j].second) {
      ++i;
    } else {
      ++j;
    }
  }
  return false;
}

}  // namespace softdot::detail::attn

namespace softdot {

using detail::attn::add_option_spans;
using detail::attn::byte_view;
using detail::attn::check_and_plan;
using detail::attn::check_paged_and_plan;
using detail::attn::check_paged_scales;
using detail::attn::check_scales;
using detail::attn::check_tensor_scale;
using detail::attn::fail;
using detail::attn::first_overlap;
using detail::attn::kIsFloat8KV;
using detail::attn::KVViews;
using detail::attn::named_span;
using detail::attn::NamedSpan;
using detail::attn::Plan;
using detail::attn::span_of;

const char* kv_format_name(KVFormat f) noexcept {
  switch (f) {
    case KVFormat::kFloat32:
      return "float32";
    case KVFormat::kFloat16:
      return "float16";
    case KVFormat::kBFloat16:
      return "bfloat16";
    case KVFormat::kInt8:
      return "int8";
    case KVFormat::kFloat8E4M3:
      return "float8_e4m3fn";
    case KVFormat::kFloat8E5M2:
      return "float8_e5m2";
  }
  return "unknown";
}

namespace {

// What the forward writes (out or the weights or scores, named out_name
// when the target has one, and lse) against everything the call reads and
// against each other: the kernels read q, K and V while out is written, so
// a shared byte would give a wrong answer with no error. Spans in bytes, each
// tensor in its own element type. (The partial target writes its own
// buffers; the gradients check theirs in check_gradients.)
template <class KT>
void check_forward_overlap(const char* fn, const AttentionRequest& r,
                           const KVViews<KT>& w, const char* out_name) {
  const AttentionTarget& t = r.target;
  const KVSource& s = r.kv;
  const TensorView<const float> q = r.q.shape_view();
  // Fixed arrays: every forward call runs this, a small decode call too.
  std::array<NamedSpan, 2> outs;
  std::size_t n_outs = 0;
  if (out_name != nullptr) {
    std::visit([&](const auto& o) { outs[n_outs++] = named_span(out_name, o); },
               t.out.variant());
  }
  if (t.kind == AttentionTarget::Kind::kOutput && t.lse != nullptr) {
    outs[n_outs++] =
        named_span("lse", t.lse, q.batch * q.heads * q.rows * sizeof(float));
  }
  if (n_outs == 0) return;
  std::array<NamedSpan, 12> ins;
  std::size_t n_ins = 0;
  const auto add = [&](const NamedSpan& x) { ins[n_ins++] = x; };
  std::visit([&](const auto& v) { add(named_span("q", v)); }, r.q.variant());
  add(named_span(s.paged ? "k_pages" : "k", w.k));
  if (s.has_v) add(named_span(s.paged ? "v_pages" : "v", w.v));
  if constexpr (detail::kScaledKv<KT>) {
    // (A per-tensor scale is the request's own float.)
    if (!w.k_per_tensor) {
      add(named_span(s.paged ? "k_pages scales" : "k scales", w.k_scales));
    }
    if (s.has_v && !w.v_per_tensor) {
      add(named_span(s.paged ? "v_pages scales" : "v scales", w.v_scales));
    }
  }
  add_option_spans(r.options, add);
  if (s.paged) {
    add(span_of("block_table", s.table.block_table));
    add(span_of("seq_lens", s.table.seq_lens));
    add(span_of("query_start_loc", s.table.query_start_loc));
  }
  const std::string clash =
      first_overlap(std::span<const NamedSpan>(outs.data(), n_outs),
                    std::span<const NamedSpan>(ins.data(), n_ins));
  if (!clash.empty()) fail(fn, clash + " (no aliasing)");
}

// The checks of a request whose keys (and values) have element type KT.
template <class KT>
Plan check_typed(const char* fn, const AttentionRequest& r,
                 const KVViews<KT>& w) {
  using Kind = AttentionTarget::Kind;
  const KVSource& s = r.kv;
  const AttentionTarget& t = r.target;
  const char* out_name = nullptr;
  std::size_t out_cols = 0;
  switch (t.kind) {
    case Kind::kOutput:
      out_name = "out";
      break;
    case Kind::kPartial:
      break;
    case Kind::kWeights:
      out_name = "weights";
      out_cols = w.k.rows;
      break;
    case Kind::kScores:
      out_name = "scores";
      out_cols = w.k.rows;
      break;
    case Kind::kGradients:  // out is an input there: check_gradients
      break;
  }
  Plan p;
  if (s.paged) {
    p = check_paged_and_plan(fn, r.q, w.k, w.v, s.table, t.out, out_name,
                             r.options);
  } else {
    p = check_and_plan(fn, r.q, w.k, s.has_v ? &w.v : nullptr, t.out, out_name,
                       out_cols, r.options);
  }
  check_forward_overlap(fn, r, w, out_name);
  if constexpr (detail::kScaledKv<KT>) {
    const auto check_one = [&](const char* name, const TensorView<const KT>& x,
                               const TensorView<const float>& sc,
                               bool per_tensor) {
      if (per_tensor) {
        check_tensor_scale(fn, name, *sc.data);
      } else if (s.paged) {
        check_paged_scales(fn, name, byte_view(x), sc, s.table);
      } else {
        check_scales(fn, name, byte_view(x), sc);
      }
    };
    check_one(s.paged ? "k_pages" : "k", w.k, w.k_scales, w.k_per_tensor);
    if (s.has_v) {
      check_one(s.paged ? "v_pages" : "v", w.v, w.v_scales, w.v_per_tensor);
    }
    // fp8: a per-tensor scale beside per-row scales would be ignored.
    const auto check_both = [&](const char* name, const KVTensor& t) {
      std::visit(
          [&](const auto& x) {
            using X = std::decay_t<decltype(x)>;
            if constexpr (kIsFloat8KV<X>) {
              if (x.scales.data != nullptr && x.scale != 1.0f) {
                fail(fn, std::string(name) + " has scales and scale = " +
                             detail::number(x.scale) +
                             ": give one of them (scale must stay 1 with "
                             "per-token scales)");
              }
            }
          },
          t.variant());
    };
    check_both(s.paged ? "k_pages" : "k", s.k);
    if (s.has_v) check_both(s.paged ? "v_pages" : "v", s.v);
  }
  return p;
}

}  // namespace

namespace {

// The values' view of a KVTensor (std::get_if: no exception, the variant
// always holds one of its alternatives).
template <class F>
std::size_t dim_of(const KVTensor::Variant& v, F f) noexcept {
  if (const auto* t = std::get_if<TensorView<const float>>(&v)) return f(*t);
  if (const auto* t = std::get_if<TensorView<const Float16>>(&v)) return f(*t);
  if (const auto* t = std::get_if<TensorView<const BFloat16>>(&v)) {
    return f(*t);
  }
  if (const auto* t = std::get_if<Int8KV>(&v)) return f(t->values);
  if (const auto* t = std::get_if<Float8E4M3KV>(&v)) return f(t->values);
  if (const auto* t = std::get_if<Float8E5M2KV>(&v)) return f(t->values);
  return 0;
}

}  // namespace

std::size_t KVTensor::batch() const noexcept {
  return dim_of(v_, [](const auto& t) { return t.batch; });
}
std::size_t KVTensor::heads() const noexcept {
  return dim_of(v_, [](const auto& t) { return t.heads; });
}
std::size_t KVTensor::rows() const noexcept {
  return dim_of(v_, [](const auto& t) { return t.rows; });
}
std::size_t KVTensor::cols() const noexcept {
  return dim_of(v_, [](const auto& t) { return t.cols; });
}

AttentionPlan AttentionPlan::make(const AttentionRequest& r) {
  using Kind = AttentionTarget::Kind;
  const char* fn = r.name != nullptr ? r.name : "attention";
  const KVSource& s = r.kv;
  const Kind kind = r.target.kind;
  const bool explicit_target = kind == Kind::kWeights || kind == Kind::kScores;
  if (kind == Kind::kPartial && r.target.partial == nullptr) {
    fail(fn, "the partial target has no AttentionPartial");
  }
  if (explicit_target && s.paged) {
    fail(fn,
         "the weights and scores of a paged cache are not computed; "
         "gather the sequence's keys into a contiguous k");
  }
  if (!explicit_target && !s.has_v) fail(fn, "the request has no values (v)");
  if (s.has_v && s.k.format() != s.v.format()) {
    const std::string k = s.paged ? "k_pages" : "k";
    const std::string v = s.paged ? "v_pages" : "v";
    fail(fn, k + " is " + kv_format_name(s.k.format()) + " but " + v + " is " +
                 kv_format_name(s.v.format()) +
                 "; they must have the same format");
  }
  if (explicit_target && (r.q.format() != KVFormat::kFloat32 ||
                          r.target.out.format() != KVFormat::kFloat32)) {
    fail(fn, std::string("q is ") + kv_format_name(r.q.format()) +
                 " and the result " + kv_format_name(r.target.out.format()) +
                 "; the weights and scores take a float32 query and write "
                 "float32");
  }
  if (kind == Kind::kGradients &&
      (s.paged || !s.has_v || r.q.format() != KVFormat::kFloat32 ||
       s.k.format() != KVFormat::kFloat32)) {
    fail(fn, std::string("the gradients take a float32 q, k and v (q is ") +
                 kv_format_name(r.q.format()) + ", k " +
                 kv_format_name(s.k.format()) + (s.paged ? ", paged" : "") +
                 ")");
  }
  Plan p;
  detail::attn::visit_kv(s, [&](const auto& w) { p = check_typed(fn, r, w); });
  if (kind == Kind::kGradients) detail::attn::check_gradients(fn, r, p);
  AttentionRequest copy = r;
  copy.name = fn;
  return AttentionPlan(copy, p);
}

std::size_t AttentionPlan::keys(std::size_t b) const noexcept {
  if (r_.kv.paged) return static_cast<std::size_t>(r_.kv.table.seq_lens[b]);
  return p_.n_kv;
}

std::size_t AttentionPlan::sequence_rows(std::size_t b) const noexcept {
  const auto& qsl = r_.kv.table.query_start_loc;
  if (!r_.kv.paged || qsl.empty()) return p_.n_q;
  return static_cast<std::size_t>(qsl[b + 1] - qsl[b]);
}

KeyRange AttentionPlan::visible_keys(std::size_t b,
                                     std::size_t i) const noexcept {
  const Plan s =
      r_.kv.paged
          ? detail::attn::positioned_plan(
                detail::attn::sequence_plan(p_, keys(b), sequence_rows(b)),
                r_.kv.table, b)
          : p_;
  std::int32_t first = 0, last = 0;
  detail::attn::visible_keys(s, i, first, last);
  if (first > last) return {};
  return {static_cast<std::size_t>(first), static_cast<std::size_t>(last) + 1};
}

AttentionForm AttentionPlan::form(std::size_t b) const noexcept {
  return detail::attn::form_of(p_.g * sequence_rows(b), r_.options,
                               detail::attn::request_units(r_));
}

void AttentionPlan::run() const {
  using Kind = AttentionTarget::Kind;
  const Kind kind = r_.target.kind;
  detail::attn::visit_kv(r_.kv, [&](const auto& w) {
    if (kind == Kind::kWeights || kind == Kind::kScores) {
      detail::attn::run_explicit(*this, w);
    } else if (kind == Kind::kGradients) {
      detail::attn::run_gradients(*this);
    } else {
      detail::attn::run_rows(*this, w);
    }
  });
}

void check_attention_options(const AttentionOptions& options,
                             const char* name) {
  detail::attn::check_option_values(name != nullptr ? name : "attention",
                                    options);
}

void run_attention(const AttentionRequest& request) {
  AttentionPlan::make(request).run();
}

namespace {
// FNV-1a over the bits of the floats.
std::int64_t bits_hash(std::span<const float> x) {
  std::uint64_t h = 1469598103934665603ULL;
  for (const float f : x) {
    std::uint32_t b = std::bit_cast<std::uint32_t>(f);
    for (int i = 0; i < 4; ++i, b >>= 8)
      h = (h ^ (b & 0xffU)) * 1099511628211ULL;
  }
  return std::bit_cast<std::int64_t>(h);
}
}  // namespace

std::vector<OptionField> option_fingerprint(const AttentionOptions& o) {
  // AttentionOptions' size on LP64: a new option changes it, and must be
  // added below (then this number).
  static_assert(sizeof(void*) != 8 || sizeof(AttentionOptions) == 256,
                "AttentionOptions changed: add the new option to "
                "option_fingerprint");
  auto i64 = [](auto x) { return static_cast<std::int64_t>(x); };
  return {
      {"scale", o.scale ? std::bit_cast<std::int64_t>(*o.scale) : -1},
      {"causal", i64(o.causal)},
      {"window_left", i64(o.window_left)},
      {"window_right", i64(o.window_right)},
      {"softcap", i64(std::bit_cast<std::uint32_t>(o.softcap))},
      {"mask", i64(!o.mask.empty())},
      {"bias", i64(!o.bias.empty())},
      {"sinks", i64(o.sinks.size())},
      {"sinks values", bits_hash(o.sinks)},
      {"alibi_slopes", i64(o.alibi_slopes.size())},
      {"alibi_slopes values", bits_hash(o.alibi_slopes)},
      {"kv_begin", i64(o.kv_begin)},
      {"kv_end", i64(o.kv_end)},
      {"q_position", i64(o.q_position)},
      {"kv_position", i64(o.kv_position)},
      {"prefill_form", i64(o.prefill_form)},
      {"batch_invariant", i64(o.batch_invariant)},
      {"unit_weights", i64(o.unit_weights)},
      {"precise", i64(o.precise)},
  };
}

}  // namespace softdot
