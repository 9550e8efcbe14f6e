// softdot Python bindings: attention over a paged K/V cache.
//
// The Python layer (python/softdot/_paged.py) hands over the pages as 4-d
// arrays [pages, H_kv, page_size, E] (vLLM's [pages, page_size, H_kv, E]
// transposed as a view), int8 scales as [pages, H_kv, page_size, 1] views,
// and the block table and lengths as C-contiguous int32 arrays; here they
// become TensorViews and spans with the arrays' own strides, so no cache is
// copied. The C++ library checks the table entry by entry.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <type_traits>

#include "arrays.h"
#include "attention_views.h"
#include "bindings.h"
#include "softdot/attention.h"

namespace softdot::python {
namespace {

// A C-contiguous int32 array as a span (the block table, the lengths).
std::span<const std::int32_t> int32_span(const char* name, const In& a) {
  check_dtype(name, a, nb::dtype<std::int32_t>(), "int32");
  return {static_cast<const std::int32_t*>(a.data()), contiguous_size(name, a)};
}

void paged_py(const In& q, const In& k, const In& v,
              const std::optional<In>& k_scales,
              const std::optional<In>& v_scales, const In& block_table,
              std::size_t blocks_per_seq, const In& seq_lens, const Out& out,
              int kv_format, const std::optional<In>& mask,
              const std::optional<In>& bias, const std::optional<In>& sinks,
              const std::optional<Out>& lse, double scale, bool causal,
              std::ptrdiff_t window_left, std::ptrdiff_t window_right,
              double softcap, std::size_t kv_begin, std::size_t kv_end) {
  check_dtype("query", q, nb::dtype<float>(), "float32");
  check_dtype("out", out, nb::dtype<float>(), "float32");
  const auto qv = view4<const float>("query", q);
  const auto ov = view4<float>("out", out);
  const AttentionOptions o =
      make_options(mask, bias, sinks, scale, causal, window_left, window_right,
                   softcap, kv_begin, kv_end);
  float* l = lse ? lse_data("lse", *lse, qv) : nullptr;
  const PagedKVTable table{int32_span("block_table", block_table),
                           blocks_per_seq, int32_span("seq_lens", seq_lens)};
  auto run = [&](const auto& kp, const auto& vp) {
    nb::gil_scoped_release release;
    paged_attention(qv, kp, vp, table, ov, o, l);
  };
  if (kv_format != kI8) {
    with_kv(kv_format, k, &v, run, "key_cache", "value_cache");
    return;
  }
  if (!k_scales || !v_scales) fail("int8 caches need their scales");
  run(int8_kv("key_cache", k, *k_scales), int8_kv("value_cache", v, *v_scales));
}

}  // namespace

void bind_paged(nb::module_& m) {
  using namespace nb::literals;
  m.def("paged_attention", &paged_py, "query"_a, "key_cache"_a, "value_cache"_a,
        "key_scales"_a.none(), "value_scales"_a.none(), "block_table"_a,
        "blocks_per_seq"_a, "seq_lens"_a, "out"_a, "kv_format"_a,
        "mask"_a.none(), "bias"_a.none(), "sinks"_a.none(), "lse"_a.none(),
        "scale"_a, "causal"_a, "window_left"_a, "window_right"_a, "softcap"_a,
        "kv_begin"_a, "kv_end"_a,
        "Attention over a paged K/V cache (4-d arrays [pages, H_kv, "
        "page_size, E]).");
}

}  // namespace softdot::python
