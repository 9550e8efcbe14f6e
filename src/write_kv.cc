// softdot: write_kv(), new keys and values into their slots of a paged
// cache (kv_cache.h). Everything is checked first (shapes, slots, int8
// rows); then each row is widened to float exactly and stored in the pages'
// format.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "attention_checks.h"
#include "kernels/dequantize.h"
#include "kernels/dispatch.h"
#include "softdot/float16.h"
#include "softdot/kv_cache.h"

namespace softdot {

using namespace detail::attn;

namespace {

constexpr const char* kFn = "write_kv";

// The view of the rows (float32, float16 or bfloat16), checked the first
// time (check); int8 rows are rejected.
template <class F>
void with_rows(const char* name, const KVTensor& t, F&& f, bool check = true) {
  std::visit(
      [&](const auto& v) {
        using V = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<V, Int8KV> || kIsFloat8KV<V>) {
          fail(kFn, std::string(name) + " is " + kv_format_name(t.format()) +
                        "; write_kv takes float32, float16 or bfloat16 rows "
                        "(it quantises into int8 and fp8 pages)");
        } else {
          if (check) check_tensor(kFn, name, v);
          f(v);
        }
      },
      t.variant());
}

// An fp8 page set's per-tensor scale (1 for int8 pages, which have none).
template <class V>
float tensor_scale_of(const V& v) {
  if constexpr (requires { v.scale; }) {
    return v.scale;
  } else {
    return 1.0f;
  }
}

// The page values' view (int8 and fp8: the values), checked; their scales
// too (an fp8 per-tensor scale: finite and > 0).
template <class F>
void with_pages(const char* name, const KVPages& p, F&& f) {
  std::visit(
      [&](const auto& v) {
        if constexpr (requires { v.scales; }) {  // int8 or fp8 pages
          constexpr bool kFp8 = requires { v.scale; };
          check_tensor(kFn, name, v.values);
          const std::string sname = std::string(name) + " scales";
          if (kFp8 && v.scales.data == nullptr) {  // fp8, one per tensor
            const float scale = tensor_scale_of(v);
            if (!(std::isfinite(scale) && scale > 0.0f)) {
              fail(kFn, std::string(name) + " scale = " + number(scale) +
                            " must be finite and > 0 to write");
            }
          } else {
            check_tensor(kFn, sname.c_str(), v.scales);
            if (v.scales.batch != v.values.batch ||
                v.scales.heads != v.values.heads ||
                v.scales.rows != v.values.rows || v.scales.cols != 1) {
              fail(kFn, shape(sname.c_str(), v.scales) + " must be " +
                            shape(sname.c_str(), v.values.batch, v.values.heads,
                                  v.values.rows, 1) +
                            " for " + shape(name, v.values));
            }
            if (kFp8 && tensor_scale_of(v) != 1.0f) {
              fail(kFn, std::string(name) + " has scales and scale = " +
                            number(tensor_scale_of(v)) +
                            ": give one of them (scale must stay 1 with "
                            "per-token scales)");
            }
          }
          f(v.values);
        } else {
          check_tensor(kFn, name, v);
          f(v);
        }
      },
      p.variant());
}

struct Dims {
  std::size_t batch = 0, heads = 0, rows = 0, cols = 0;
  std::string str;  // "name [b, h, r, c]"
};

template <class T>
Dims dims_of(const char* name, const TensorView<T>& v) {
  return {v.batch, v.heads, v.rows, v.cols, shape(name, v)};
}

// Row t of head h as floats (exact: every format widens exactly; 16-bit
// rows through the kernels' vector conversion, float16.cc's bits).
template <class T>
void widen_row(const TensorView<const T>& v, std::size_t h, std::size_t t,
               float* dst) {
  const T* src = v.row(0, h, t);
  if constexpr (std::is_same_v<T, float>) {
    std::copy(src, src + v.cols, dst);
  } else {
    static_assert(sizeof(T) == sizeof(std::uint16_t));
    detail::widen16(reinterpret_cast<const std::uint16_t*>(src), v.cols, dst,
                    std::is_same_v<T, BFloat16>);
  }
}

// Stores a float row into page row (page, h, r) of p.
void store_row(const KVPages& p, std::size_t page, std::size_t h, std::size_t r,
               const float* x, std::size_t n) {
  std::visit(
      [&](const auto& v) {
        using V = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<V, Int8Pages>) {
          // Finite rows only (checked before anything was written).
          detail::quantize_int8_row(x, n, v.values.row(page, h, r),
                                    v.scales.row(page, h, r));
        } else if constexpr (requires { v.scale; }) {  // fp8 pages
          using T = std::remove_pointer_t<decltype(v.values.data)>;
          T* dst = v.values.row(page, h, r);
          if (v.scales.data != nullptr) {
            detail::quantize_fp8_row(x, n, dst, v.scales.row(page, h, r));
          } else {
            for (std::size_t c = 0; c < n; ++c) {
              dst[c] = detail::quantize_fp8<T>(x[c], v.scale);
            }
          }
        } else if constexpr (std::is_same_v<V, TensorView<float>>) {
          std::copy(x, x + n, v.row(page, h, r));
        } else if constexpr (std::is_same_v<V, TensorView<Float16>>) {
          Float16* dst = v.row(page, h, r);
          for (std::size_t c = 0; c < n; ++c) dst[c] = to_float16(x[c]);
        } else {
          BFloat16* dst = v.row(page, h, r);
          for (std::size_t c = 0; c < n; ++c) dst[c] = to_bfloat16(x[c]);
        }
      },
      p.variant());
}

}  // namespace

void write_kv(const KVTensor& key, const KVTensor& value,
              const KVPages& k_pages, const KVPages& v_pages,
              std::span<const std::int64_t> slot_mapping) {
  // Shapes, in a fixed order: key, value, k_pages, v_pages.
  Dims k, v, kp, vp;
  with_rows("key", key, [&](const auto& t) { k = dims_of("key", t); });
  with_rows("value", value, [&](const auto& t) { v = dims_of("value", t); });
  with_pages("k_pages", k_pages,
             [&](const auto& t) { kp = dims_of("k_pages", t); });
  with_pages("v_pages", v_pages,
             [&](const auto& t) { vp = dims_of("v_pages", t); });
  if (k_pages.format() != v_pages.format()) {
    fail(kFn, std::string("k_pages is ") + kv_format_name(k_pages.format()) +
                  " but v_pages is " + kv_format_name(v_pages.format()) +
                  "; they must have the same format");
  }
  if (k.batch != 1 || v.batch != 1) {
    fail(kFn, (k.batch != 1 ? k.str : v.str) +
                  " must have batch 1 (rows t of [1, H_kv, T, d])");
  }
  if (v.heads != k.heads || v.rows != k.rows) {
    fail(kFn, v.str + " must have the heads and rows of " + k.str);
  }
  if (vp.batch != kp.batch || vp.heads != kp.heads || vp.rows != kp.rows) {
    fail(kFn, vp.str + " does not match " + kp.str +
                  " in pages, heads and page_size");
  }
  if (kp.heads != k.heads || kp.cols != k.cols) {
    fail(kFn, kp.str + " must have the " + count(k.heads) +
                  " heads and d = " + count(k.cols) + " of " + k.str);
  }
  if (vp.cols != v.cols) {
    fail(kFn,
         vp.str + " must have the d_v = " + count(v.cols) + " of " + v.str);
  }
  if (slot_mapping.size() != k.rows) {
    fail(kFn, "slot_mapping has " + count(slot_mapping.size()) +
                  " entries but " + k.str + " has " + count(k.rows) + " rows");
  }
  if (kp.rows == 0 && !slot_mapping.empty()) {
    fail(kFn, kp.str + " has page_size 0");
  }
  // The slots: in range, and no slot twice.
  std::size_t capacity = 0;
  if (__builtin_mul_overflow(kp.batch, kp.rows, &capacity)) {
    capacity = static_cast<std::size_t>(-1);
  }
  std::vector<std::pair<std::int64_t, std::size_t>> used;
  used.reserve(slot_mapping.size());
  for (std::size_t t = 0; t < slot_mapping.size(); ++t) {
    const std::int64_t s = slot_mapping[t];
    if (s == kSkipSlot) continue;
    if (s < 0 || static_cast<std::uint64_t>(s) >= capacity) {
      fail(kFn, "slot_mapping[" + count(t) + "] = " + std::to_string(s) +
                    (s < 0 ? " is negative (only -1, skip, is allowed)"
                           : " is not a slot: " + kp.str + " holds " +
                                 count(kp.batch) + " pages of " +
                                 count(kp.rows) + " (slots 0 to " +
                                 std::to_string(capacity - 1) + ")"));
    }
    used.emplace_back(s, t);
  }
  std::sort(used.begin(), used.end());
  for (std::size_t i = 1; i < used.size(); ++i) {
    if (used[i].first == used[i - 1].first) {
      fail(kFn, "slot " + std::to_string(used[i].first) +
                    " is written twice: by row " + count(used[i - 1].second) +
                    " and row " + count(used[i].second) + " of slot_mapping");
    }
  }
  // int8 and fp8 pages: every row written must be finite (quantize_kv's
  // rule; an fp8 scale cannot be computed from inf, and e4m3fn has none).
  const bool int8 = k_pages.format() == KVFormat::kInt8 ||
                    k_pages.format() == KVFormat::kFloat8E4M3 ||
                    k_pages.format() == KVFormat::kFloat8E5M2;
  std::vector<float> row(std::max(k.cols, v.cols));
  if (int8) {
    auto check_rows = [&](const char* name, const KVTensor& x, std::size_t n) {
      with_rows(
          name, x,
          [&](const auto& t) {
            for (const auto& [s, r] : used) {
              for (std::size_t h = 0; h < t.heads; ++h) {
                widen_row(t, h, r, row.data());
                for (std::size_t c = 0; c < n; ++c) {
                  if (!std::isfinite(row[c])) {
                    fail(kFn, std::string(name) + " holds " + number(row[c]) +
                                  " at [0, " + count(h) + ", " + count(r) +
                                  ", " + count(c) + "] (slot " +
                                  std::to_string(s) +
                                  "): only finite values can be quantised");
                  }
                }
              }
            }
          },
          /*check=*/false);
    };
    check_rows("key", key, k.cols);
    check_rows("value", value, v.cols);
  }
  // Write.
  const std::size_t ps = kp.rows;
  auto write = [&](const KVTensor& x, const KVPages& pages, std::size_t n) {
    with_rows(
        "", x,
        [&](const auto& t) {
          for (const auto& [s, r] : used) {
            const auto slot = static_cast<std::size_t>(s);
            for (std::size_t h = 0; h < t.heads; ++h) {
              widen_row(t, h, r, row.data());
              store_row(pages, slot / ps, h, slot % ps, row.data(), n);
            }
          }
        },
        /*check=*/false);
  };
  write(key, k_pages, k.cols);
  write(value, v_pages, v.cols);
}

namespace {

// The bytes of a view's rows (page, h, r), and the view's identity.
struct RowBytes {
  char* base = nullptr;
  std::size_t batch = 0, heads = 0, rows = 0, cols = 0, esize = 0;
  std::size_t bs = 0, hs = 0, rs = 0;  // strides in elements
  char* row(std::size_t p, std::size_t h, std::size_t r) const {
    return base + (p * bs + h * hs + r * rs) * esize;
  }
};

template <class T>
RowBytes bytes_of(const TensorView<T>& v) {
  using E = std::remove_const_t<T>;
  return {reinterpret_cast<char*>(const_cast<E*>(v.data)),
          v.batch,
          v.heads,
          v.rows,
          v.cols,
          sizeof(E),
          v.batch_stride,
          v.head_stride,
          v.row_stride};
}

// The views of pages, written (KVPages) or read (KVTensor): the values,
// and an int8 cache's scales.
template <class Variant>
std::vector<RowBytes> views_of(const Variant& pages) {
  return std::visit(
      [](const auto& v) -> std::vector<RowBytes> {
        if constexpr (requires { v.scales; }) {
          return {bytes_of(v.values), bytes_of(v.scales)};
        } else {
          return {bytes_of(v)};
        }
      },
      pages);
}

// An fp8 source's per-tensor scale (0 for every other format and for
// per-token scales, whose memory same_views compares).
template <class Variant>
float tensor_scale(const Variant& pages) {
  return std::visit(
      [](const auto& v) -> float {
        if constexpr (requires { v.scale; }) {
          return v.scales.data == nullptr ? v.scale : 0.0f;
        } else {
          return 0.0f;
        }
      },
      pages);
}

bool same_views(const std::vector<RowBytes>& a,
                const std::vector<RowBytes>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const RowBytes &x = a[i], &y = b[i];
    if (x.base != y.base || x.batch != y.batch || x.heads != y.heads ||
        x.rows != y.rows || x.cols != y.cols || x.esize != y.esize ||
        x.bs != y.bs || x.hs != y.hs || x.rs != y.rs) {
      return false;
    }
  }
  return true;
}

}  // namespace

void write_kv_and_attend(const KVTensor& key, const KVTensor& value,
                         const KVPages& k_pages, const KVPages& v_pages,
                         std::span<const std::int64_t> slot_mapping,
                         const AttentionRequest& attend) {
  constexpr const char* fn = "write_kv_and_attend";
  const std::vector<RowBytes> kw = views_of(k_pages.variant()),
                              vw = views_of(v_pages.variant());
  if (!attend.kv.paged || !attend.kv.has_v ||
      !same_views(kw, views_of(attend.kv.k.variant())) ||
      !same_views(vw, views_of(attend.kv.v.variant())) ||
      k_pages.format() != attend.kv.k.format() ||
      tensor_scale(k_pages.variant()) != tensor_scale(attend.kv.k.variant()) ||
      tensor_scale(v_pages.variant()) != tensor_scale(attend.kv.v.variant())) {
    fail(fn,
         "the attention request must read the pages written: a paged "
         "KVSource over k_pages and v_pages (the same memory, format, shape "
         "and strides, and an fp8 cache's per-tensor scales)");
  }
  // The old contents of every slot in range (a bad slot fails write_kv's
  // checks before anything is written).
  struct Saved {
    const RowBytes* view;
    char* row;
    std::size_t at;  // in bytes
  };
  std::vector<Saved> rows;
  std::vector<char> bytes;
  for (const std::vector<RowBytes>* views : {&kw, &vw}) {
    for (const RowBytes& v : *views) {
      const std::size_t capacity = v.batch * v.rows;
      for (const std::int64_t s : slot_mapping) {
        if (s < 0 || static_cast<std::uint64_t>(s) >= capacity) continue;
        const auto slot = static_cast<std::size_t>(s);
        for (std::size_t h = 0; h < v.heads; ++h) {
          char* row = v.row(slot / v.rows, h, slot % v.rows);
          rows.push_back({&v, row, bytes.size()});
          bytes.insert(bytes.end(), row, row + v.cols * v.esize);
        }
      }
    }
  }
  write_kv(key, value, k_pages, v_pages, slot_mapping);
  try {
    run_attention(attend);
  } catch (...) {
    for (const Saved& r : rows) {
      std::copy_n(bytes.data() + r.at, r.view->cols * r.view->esize, r.row);
    }
    throw;
  }
}

}  // namespace softdot
