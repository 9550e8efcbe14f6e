// softdot: writing new keys and values into a paged K/V cache, as serving
// engines do after each step (vLLM's reshape_and_cache): the pages that
// paged_attention() reads (attention.h, PagedKVTable).
#ifndef SOFTDOT_KV_CACHE_H_
#define SOFTDOT_KV_CACHE_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <variant>

#include "softdot/attention.h"
#include "softdot/attention_request.h"
#include "softdot/float16.h"

namespace softdot {

// A slot_mapping entry that writes nothing (vLLM's padding slot).
inline constexpr std::int64_t kSkipSlot = -1;

// int8 pages and their scales, written by write_kv.
struct Int8Pages {
  TensorView<std::int8_t> values;  // [P, H_kv, page_size, d]
  TensorView<float> scales;        // [P, H_kv, page_size, 1]
};

// fp8 pages (e4m3fn or e5m2), with one scale per token and KV head
// (scales has data: write_kv computes and writes each row's) or one
// per-tensor scale (scales has no data: vLLM's k_scale / v_scale, which
// write_kv divides by). Read back through Float8KV (attention.h).
template <class T>
struct Float8Pages {
  TensorView<T> values;      // [P, H_kv, page_size, d]
  TensorView<float> scales;  // [P, H_kv, page_size, 1], or no data
  float scale = 1.0f;        // per tensor, when scales has no data
};
using Float8E4M3Pages = Float8Pages<Float8E4M3>;
using Float8E5M2Pages = Float8Pages<Float8E5M2>;

// The pages write_kv writes: float32, float16, bfloat16, int8 with scales,
// or fp8 with scales or a scale. Implicit from each view.
class KVPages {
 public:
  using Variant =
      std::variant<TensorView<float>, TensorView<Float16>, TensorView<BFloat16>,
                   Int8Pages, Float8E4M3Pages, Float8E5M2Pages>;
  KVPages(TensorView<float> t) : v_(t) {}       // NOLINT: implicit
  KVPages(TensorView<Float16> t) : v_(t) {}     // NOLINT: implicit
  KVPages(TensorView<BFloat16> t) : v_(t) {}    // NOLINT: implicit
  KVPages(const Int8Pages& t) : v_(t) {}        // NOLINT: implicit
  KVPages(const Float8E4M3Pages& t) : v_(t) {}  // NOLINT: implicit
  KVPages(const Float8E5M2Pages& t) : v_(t) {}  // NOLINT: implicit
  KVFormat format() const noexcept { return static_cast<KVFormat>(v_.index()); }
  const Variant& variant() const noexcept { return v_; }

 private:
  Variant v_;
};

// Writes T new keys and values into their slots: for each row t with
// slot_mapping[t] = s != kSkipSlot, and every KV head h,
//   k_pages[s / page_size, h, s % page_size, :] = key[0, h, t, :],
//   v_pages[s / page_size, h, s % page_size, :] = value[0, h, t, :]
// (page_size = k_pages.rows). Shapes: key [1, H_kv, T, d] and value
// [1, H_kv, T, d_v] in float32, float16 or bfloat16 (vLLM's [T, H_kv, d] is
// the view with head_stride d and row_stride H_kv d), k_pages
// [P, H_kv, page_size, d] and v_pages [P, H_kv, page_size, d_v] in one format
// (either layout through strides, as paged_attention reads them), T =
// slot_mapping.size(). A value is stored exactly when the pages' format holds
// it (float32 pages; 16-bit pages of the key's own format), else rounded to
// nearest even (float32 keys into 16-bit pages, as to_float16 /
// to_bfloat16); into int8 pages each row of each head is quantised as
// quantize_kv quantises it (its scale into the scales), from the key's
// exact float value: what paged_attention then reads for that row is what
// quantize_kv's output gives. Into fp8 pages with scales, each row of each
// head gets scale = max_c |x_c| / F (F the format's largest finite value,
// 448 or 57344; rounded to float, rounded up when below 2^-126; 0 for a
// row of zeros) and values x_c / scale rounded to nearest even (the
// quotient in double); with a per-tensor scale, x_c / scale rounded so,
// saturating at +-F as vLLM's and SGLang's caches do. The error of each
// dequantised element fl(scale * value) against x_c is at most
// 2^-(m+1) |x_c| (1 + 2^-20) + 2^(e_min - m - 1) scale, m the mantissa bits
// (3 for e4m3fn, 2 for e5m2) and 2^e_min the smallest normal (2^-6, 2^-14)
// (tested), unless the per-tensor write saturated.
// Errors (std::invalid_argument naming write_kv, the argument and the
// shapes, or the row and the slot), all found before anything is written:
// shapes and strides; K and V pages of different formats, page counts or
// page sizes; a slot >= P page_size, negative other than kSkipSlot, or the
// same slot in two rows (both rows named); for int8 and fp8 pages, a key
// or value row holding inf or NaN; for fp8 pages with a per-tensor scale,
// a scale that is not finite and > 0, or scales with a scale other than 1.
// Single-threaded; rows may be written in any order (no two share a slot). The
// pages must not overlap key or value.
void write_kv(const KVTensor& key, const KVTensor& value,
              const KVPages& k_pages, const KVPages& v_pages,
              std::span<const std::int64_t> slot_mapping);

// Write and attend in one call (an engine step): write_kv(key, value,
// k_pages, v_pages, slot_mapping), then run_attention(attend), where attend
// reads the same pages (KVSource::pages over views of k_pages' and v_pages'
// memory, format and shape: std::invalid_argument otherwise, before
// anything is written). Everything write_kv checks is checked before
// anything is written; if the attention then fails (a bad table or option,
// std::bad_alloc), the rows written are put back as they were, bit for bit,
// and the exception is rethrown, so a failed call leaves the pages
// unchanged. The result is that of the two calls, bit for bit.
void write_kv_and_attend(const KVTensor& key, const KVTensor& value,
                         const KVPages& k_pages, const KVPages& v_pages,
                         std::span<const std::int64_t> slot_mapping,
                         const AttentionRequest& attend);

}  // namespace softdot

#endif  // SOFTDOT_KV_CACHE_H_
