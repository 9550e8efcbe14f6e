// softdot: one attention call, described once. Every attention entry point
// (attention, attention_partial, paged_attention, paged_attention_partial,
// attention_weights, attention_scores, and softdot::mpi::ring_attention's
// steps) builds an AttentionRequest — the query, a K/V source, a target and
// the options — which AttentionPlan checks once and then runs. The bindings
// (Python) and the softdot command build requests too, so an option is
// checked in one place with one message, and the values the plan derives
// (the float scale, each query's visible keys, the form) are read from it
// rather than derived again.
//
// Where things plug in (docs/design.md, "The attention request"):
//   a new K/V storage format  a KVTensor alternative, its checks in
//                             attention_checks.cc, its reader in
//                             src/kernels/attention_kv-inl.h and its case
//                             in RunDecode (attention_decode-inl.h);
//   a new option              a field of AttentionOptions, checked in
//                             plan_options (attention_checks.cc), and its
//                             entry in option_fingerprint (same file; a
//                             static_assert on sizeof(AttentionOptions)
//                             enforces it), so every ring compares it
//                             across ranks;
//   a new entry point         a wrapper that builds a request (attention.cc,
//                             attention_backward.cc for the gradients).
#ifndef SOFTDOT_ATTENTION_REQUEST_H_
#define SOFTDOT_ATTENTION_REQUEST_H_

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <variant>

#include "softdot/attention.h"

namespace softdot {

// The storage format of keys and values.
enum class KVFormat : int {
  kFloat32 = 0,
  kFloat16 = 1,
  kBFloat16 = 2,
  kInt8 = 3,
  kFloat8E4M3 = 4,
  kFloat8E5M2 = 5
};

// "float32", "float16", "bfloat16", "int8", "float8_e4m3fn" or
// "float8_e5m2".
const char* kv_format_name(KVFormat f) noexcept;

// Keys or values in one of the formats attention reads. Implicit from each
// view, so a TensorView, an Int8KV or a Float8KV can be passed where one is
// expected.
class KVTensor {
 public:
  using Variant =
      std::variant<TensorView<const float>, TensorView<const Float16>,
                   TensorView<const BFloat16>, Int8KV, Float8E4M3KV,
                   Float8E5M2KV>;
  KVTensor() = default;
  KVTensor(TensorView<const float> t) : v_(t) {}     // NOLINT: implicit
  KVTensor(TensorView<const Float16> t) : v_(t) {}   // NOLINT: implicit
  KVTensor(TensorView<const BFloat16> t) : v_(t) {}  // NOLINT: implicit
  KVTensor(const Int8KV& t) : v_(t) {}               // NOLINT: implicit
  KVTensor(const Float8E4M3KV& t) : v_(t) {}         // NOLINT: implicit
  KVTensor(const Float8E5M2KV& t) : v_(t) {}         // NOLINT: implicit

  KVFormat format() const noexcept { return static_cast<KVFormat>(v_.index()); }
  const Variant& variant() const noexcept { return v_; }
  // The values' shape (for int8 and fp8, of the values, not of the scales).
  std::size_t batch() const noexcept;
  std::size_t heads() const noexcept;
  std::size_t rows() const noexcept;
  std::size_t cols() const noexcept;

 private:
  Variant v_;
};

// A query (const) or an output (mutable) in float32, float16 or bfloat16.
// Implicit from each view. 16-bit queries are widened exactly; 16-bit
// outputs are rounded once from the double result (attention.h, "16-bit
// attention").
template <bool kConst>
class QOTensor {
  template <class T>
  using View = TensorView<std::conditional_t<kConst, const T, T>>;

 public:
  using Variant = std::variant<View<float>, View<Float16>, View<BFloat16>>;
  QOTensor() = default;
  QOTensor(View<float> t) : v_(t) {}     // NOLINT: implicit
  QOTensor(View<Float16> t) : v_(t) {}   // NOLINT: implicit
  QOTensor(View<BFloat16> t) : v_(t) {}  // NOLINT: implicit

  // kFloat32, kFloat16 or kBFloat16.
  KVFormat format() const noexcept { return static_cast<KVFormat>(v_.index()); }
  const Variant& variant() const noexcept { return v_; }
  // The float view, or null for a 16-bit tensor.
  const View<float>* f32() const noexcept {
    return std::get_if<View<float>>(&v_);
  }
  // The shape and strides (in elements) with the data address, typed as
  // float: for the checks of shapes, never for reading.
  View<float> shape_view() const noexcept {
    using P = std::conditional_t<kConst, const float*, float*>;
    // The address is only compared with null, never read as float.
    auto as_float = [](const auto& t) {
      return View<float>(reinterpret_cast<P>(t.data), t.batch, t.heads, t.rows,
                         t.cols, t.batch_stride, t.head_stride, t.row_stride);
    };
    // std::get_if, not std::visit (which may throw): the variant always
    // holds one of its alternatives.
    if (const auto* t = std::get_if<View<Float16>>(&v_)) return as_float(*t);
    if (const auto* t = std::get_if<View<BFloat16>>(&v_)) return as_float(*t);
    if (const auto* t = std::get_if<View<float>>(&v_)) return *t;
    return {};
  }

 private:
  Variant v_;
};
using QueryTensor = QOTensor<true>;
using OutputTensor = QOTensor<false>;

// Where the keys and values come from: contiguous tensors
// [B, H_kv, n_kv, d] (and d_v), or the pages of a paged cache read through a
// page table (paged_attention()'s layout and rules, attention.h). v is left
// empty (has_v false) by attention_weights() and attention_scores().
struct KVSource {
  KVTensor k;
  KVTensor v;
  bool has_v = false;
  bool paged = false;
  PagedKVTable table;  // paged only

  static KVSource contiguous(KVTensor k, KVTensor v) {
    KVSource s;
    s.k = k;
    s.v = v;
    s.has_v = true;
    return s;
  }
  static KVSource keys(KVTensor k) {
    KVSource s;
    s.k = k;
    return s;
  }
  static KVSource pages(KVTensor k_pages, KVTensor v_pages,
                        const PagedKVTable& table) {
    KVSource s = contiguous(k_pages, v_pages);
    s.paged = true;
    s.table = table;
    return s;
  }
};

// What a backward request reads beside q, k and v, and where its gradients
// go (attention_backward(), attention.h): the forward's out and lse, the
// gradient dout of the loss with respect to out (and dlse, with respect to
// lse, or null), and either grads (dq, dk and dv rounded once; dbias and
// dsinks optional) or, with partial set, the unrounded sums added into
// *partial (grads then holds only the optional dbias, at the call's key
// columns, and dsinks: attention_backward_partial()).
struct AttentionBackwardIO {
  TensorView<const float> out;
  const float* lse = nullptr;
  TensorView<const float> dout;
  const float* dlse = nullptr;
  AttentionGradients grads;
  AttentionGradientPartial* partial = nullptr;
};

// What a request writes.
struct AttentionTarget {
  enum class Kind {
    kOutput,     // out [B, H, n_q, d_v] and, when lse is non-null, lse
    kPartial,    // *partial (AttentionPartial), unnormalised
    kWeights,    // out = the weights [B, H, n_q, n_kv]
    kScores,     // out = the final scores [B, H, n_q, n_kv]
    kGradients,  // the backward: backward (AttentionBackwardIO)
  };
  Kind kind = Kind::kOutput;
  OutputTensor out;  // float32 for the weights and the scores
  float* lse = nullptr;
  AttentionPartial* partial = nullptr;
  AttentionBackwardIO backward;

  static AttentionTarget output(TensorView<float> out, float* lse = nullptr) {
    return output(OutputTensor(out), lse);
  }
  static AttentionTarget output(OutputTensor out, float* lse = nullptr) {
    AttentionTarget t;
    t.out = out;
    t.lse = lse;
    return t;
  }
  static AttentionTarget partial_result(AttentionPartial& p) {
    AttentionTarget t;
    t.kind = Kind::kPartial;
    t.partial = &p;
    return t;
  }
  static AttentionTarget weights(TensorView<float> w) {
    AttentionTarget t;
    t.kind = Kind::kWeights;
    t.out = w;
    return t;
  }
  static AttentionTarget scores(TensorView<float> s) {
    AttentionTarget t;
    t.kind = Kind::kScores;
    t.out = s;
    return t;
  }
  // The gradients of attention over the request's q, k and v (float32,
  // contiguous K/V): attention_backward() and attention_backward_partial().
  static AttentionTarget gradients(const AttentionBackwardIO& io) {
    AttentionTarget t;
    t.kind = Kind::kGradients;
    t.backward = io;
    return t;
  }
};

// One attention call. name is the entry point the caller's messages name
// ("attention", "paged_attention", a Python function's name, ...); every
// std::invalid_argument the request raises starts with "softdot::<name>: "
// (the Python bindings show it without "softdot::").
struct AttentionRequest {
  const char* name = "attention";
  QueryTensor q;
  KVSource kv;
  AttentionTarget target;
  AttentionOptions options;
};

// The visible keys of one query row: [begin, end), empty when begin >= end.
// Mask and bias entries and -inf biases are not counted: only the key range,
// causal and the window.
struct KeyRange {
  std::size_t begin = 0;
  std::size_t end = 0;
  bool empty() const noexcept { return begin >= end; }
  std::size_t size() const noexcept { return empty() ? 0 : end - begin; }
};

namespace detail {
// The checked, derived values of a request (plain data: AttentionPlan's).
struct AttentionPlanData {
  std::size_t B = 0, H = 0, Hkv = 0, g = 0, n_q = 0, n_kv = 0, d = 0, dv = 0;
  std::size_t kv_begin = 0, kv_end = 0;
  float scale = 0.0f, softcap = 0.0f;
  std::int64_t wl = -1, wr = -1;  // -1: unbounded
  // Query i sees key j at the distance (q_shift + i) - (j kv_stride +
  // kv_offset) (positions in key index units): n_kv - n_q by default,
  // q_position - kv_position when set; a paged table's positions set all
  // three per sequence.
  std::int64_t q_shift = 0;
  std::int64_t kv_stride = 1, kv_offset = 0;
  // Column of key j in the mask and bias rows: mask_col0 + j.
  std::size_t mask_col0 = 0;
};
}  // namespace detail

// A checked request. make() validates every argument (shapes, strides and
// spans, the options, the page table, int8 scales), in a fixed order, and
// throws std::invalid_argument naming the request's name, the argument and
// the shapes; nothing is read beyond what the checks need and nothing is
// written. run() then computes (threads, allocation and bits as the entry
// point the request stands for, attention.h). The plan refers to the
// caller's memory: the views must stay valid until run() returns.
// The form a sequence of a request runs in (attention.h, "two forms"),
// decided once by the plan from its rows per KV head (g n_q) and the
// options:
//   kPrefill: blocks of query rows, each over the whole key range (more
//     than 16 rows per KV head, and always with precise or prefill_form);
//   kDecode: at most 16 rows per KV head, the keys in chunks of 512 whose
//     states merge in chunk order (also batch_invariant's shorter rows);
//   kDecodeUnits: kDecode's chunks, each in the prefill form on the
//     bfloat16 units (bfloat16 query, keys and values, 12 to 16 rows per KV
//     head; not batch_invariant);
//   kInvariantGroups: batch_invariant with more than 16 rows per KV head:
//     groups of 16 rows, each folding its chunks in order.
enum class AttentionForm { kPrefill, kDecode, kDecodeUnits, kInvariantGroups };

class AttentionPlan {
 public:
  static AttentionPlan make(const AttentionRequest& request);
  void run() const;

  const AttentionRequest& request() const noexcept { return r_; }
  // The float the scaled dot products are multiplied by (options.scale, or
  // 1/sqrt(d), rounded to float).
  float scale() const noexcept { return p_.scale; }
  float softcap() const noexcept { return p_.softcap; }
  std::size_t batch() const noexcept { return p_.B; }
  std::size_t heads() const noexcept { return p_.H; }
  std::size_t kv_heads() const noexcept { return p_.Hkv; }
  std::size_t query_rows() const noexcept { return p_.n_q; }
  std::size_t head_dim() const noexcept { return p_.d; }
  std::size_t value_dim() const noexcept { return p_.dv; }
  // The keys of sequence b (n_kv; seq_lens[b] for a paged cache).
  std::size_t keys(std::size_t b) const noexcept;
  // The query rows of sequence b (query_rows(), or its own count in a
  // ragged batch).
  std::size_t sequence_rows(std::size_t b) const noexcept;
  // The keys query row i of sequence b can see (i counted within the
  // sequence): the key range, causal and the window applied (the mask and
  // the bias are not).
  KeyRange visible_keys(std::size_t b, std::size_t i) const noexcept;
  // The form sequence b runs in (AttentionForm); every sequence has the
  // same form unless the batch is ragged.
  AttentionForm form(std::size_t b = 0) const noexcept;
  // The derived values (internal use: src/, the command's --explain).
  const detail::AttentionPlanData& data() const noexcept { return p_; }

 private:
  AttentionPlan(const AttentionRequest& r, const detail::AttentionPlanData& p)
      : r_(r), p_(p) {}
  AttentionRequest r_;
  detail::AttentionPlanData p_;
};

// AttentionPlan::make(request).run().
void run_attention(const AttentionRequest& request);

// The checks AttentionPlan::make makes first, of the options whose validity
// does not depend on the inputs (scale, softcap, the window, kv_begin <=
// kv_end), with make's messages ("softdot::<name>: ..."): for a caller that
// checks its options before it reads any input (the softdot command).
void check_attention_options(const AttentionOptions& options,
                             const char* name = "attention");

}  // namespace softdot

#endif  // SOFTDOT_ATTENTION_REQUEST_H_
