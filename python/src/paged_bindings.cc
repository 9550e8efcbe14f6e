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
#include "bindings.h"
#include "softdot/attention.h"

namespace softdot::python {
namespace {

enum KvFormat : int { kF32 = 0, kF16 = 1, kBF16 = 2, kI8 = 3 };

template <class T, class A>
TensorView<T> view4(const char* name, const A& a) {
  if (a.ndim() != 4)
    fail(std::string(name) + " has " + std::to_string(a.ndim()) +
         " axes; expected 4");
  for (std::size_t i = 0; i < 4; ++i)
    if (a.stride(i) < 0)
      fail(std::string(name) + " has a negative stride on axis " +
           std::to_string(i));
  if (a.shape(3) > 1 && a.stride(3) != 1)
    fail(std::string(name) + "'s last axis is not contiguous");
  using U = std::remove_const_t<T>;
  auto* p = reinterpret_cast<T*>(const_cast<U*>(
      static_cast<const U*>(static_cast<const void*>(a.data()))));
  auto st = [&](std::size_t i) {
    return static_cast<std::size_t>(a.stride(i));
  };
  return TensorView<T>(p, a.shape(0), a.shape(1), a.shape(2), a.shape(3), st(0),
                       st(1), st(2));
}

template <class A>
void check_dtype(const char* name, const A& a, nb::dlpack::dtype want,
                 const char* want_name) {
  if (a.dtype() != want)
    throw nb::type_error((std::string(name) + " must be " + want_name).c_str());
}

// A C-contiguous int32 array as a span (the block table, the lengths).
std::span<const std::int32_t> int32_span(const char* name, const In& a) {
  check_dtype(name, a, nb::dtype<std::int32_t>(), "int32");
  std::int64_t expect = 1;
  std::size_t size = 1;
  for (std::size_t i = a.ndim(); i-- > 0;) {
    if (a.shape(i) > 1 && a.stride(i) != expect)
      fail(std::string(name) + " must be C-contiguous");
    expect *= static_cast<std::int64_t>(a.shape(i));
    size *= a.shape(i);
  }
  return {static_cast<const std::int32_t*>(a.data()), size};
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
  AttentionOptions o;
  o.scale = scale;
  o.causal = causal;
  o.window_left = window_left;
  o.window_right = window_right;
  o.softcap = static_cast<float>(softcap);
  o.kv_begin = kv_begin;
  o.kv_end = kv_end;
  if (mask) {
    check_dtype("attn_mask", *mask, nb::dtype<bool>(), "bool");
    o.mask = view4<const bool>("attn_mask", *mask);
  }
  if (bias) {
    check_dtype("bias", *bias, nb::dtype<float>(), "float32");
    o.bias = view4<const float>("bias", *bias);
  }
  if (sinks) {
    check_dtype("sinks", *sinks, nb::dtype<float>(), "float32");
    if (sinks->ndim() != 1 || (sinks->shape(0) > 1 && sinks->stride(0) != 1))
      fail("sinks must be a contiguous 1-d array, one logit per query head");
    o.sinks = std::span<const float>(static_cast<const float*>(sinks->data()),
                                     sinks->shape(0));
  }
  float* l = nullptr;
  if (lse) {
    check_dtype("lse", *lse, nb::dtype<float>(), "float32");
    l = static_cast<float*>(lse->data());  // C-contiguous, shaped by Python
  }
  const PagedKVTable table{int32_span("block_table", block_table),
                           blocks_per_seq, int32_span("seq_lens", seq_lens)};
  auto run = [&](const auto& kp, const auto& vp) {
    nb::gil_scoped_release release;
    paged_attention(qv, kp, vp, table, ov, o, l);
  };
  switch (kv_format) {
    case kF32:
      check_dtype("key_cache", k, nb::dtype<float>(), "float32");
      check_dtype("value_cache", v, nb::dtype<float>(), "float32");
      run(view4<const float>("key_cache", k),
          view4<const float>("value_cache", v));
      break;
    case kF16:
    case kBF16:
      if (k.itemsize() != 2 || v.itemsize() != 2)
        throw nb::type_error("key_cache and value_cache must be 16-bit");
      if (kv_format == kF16) {
        run(view4<const Float16>("key_cache", k),
            view4<const Float16>("value_cache", v));
      } else {
        run(view4<const BFloat16>("key_cache", k),
            view4<const BFloat16>("value_cache", v));
      }
      break;
    case kI8: {
      check_dtype("key_cache", k, nb::dtype<std::int8_t>(), "int8");
      check_dtype("value_cache", v, nb::dtype<std::int8_t>(), "int8");
      if (!k_scales || !v_scales) fail("int8 caches need their scales");
      check_dtype("key_cache scales", *k_scales, nb::dtype<float>(), "float32");
      check_dtype("value_cache scales", *v_scales, nb::dtype<float>(),
                  "float32");
      run(Int8KV{view4<const std::int8_t>("key_cache", k),
                 view4<const float>("key_cache scales", *k_scales)},
          Int8KV{view4<const std::int8_t>("value_cache", v),
                 view4<const float>("value_cache scales", *v_scales)});
      break;
    }
    default:
      fail(
          "kv_format must be 0 (float32), 1 (float16), 2 (bfloat16) or 3 "
          "(int8)");
  }
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
