// softdot Python bindings: int8 K/V caches: quantize_kv, and attention and
// attention_weights on int8 keys and values with one float scale per row
// (the library's Int8KV).
//
// The Python layer (python/softdot/_int8.py) has unpacked each (values,
// scales) pair, checked the dtypes and shapes, made every array 4-d (leading
// ones, batch axes merged) and checked that the outputs share no memory with
// an input; here the arrays become TensorViews with their own strides,
// nothing is copied, and the library checks the shapes and the scales once
// more (std::invalid_argument, a Python ValueError).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>

#include <cstddef>
#include <cstdint>
#include <optional>

#include "arrays.h"
#include "attention_views.h"
#include "bindings.h"
#include "softdot/attention.h"

namespace softdot::python {
namespace {

void quantize_kv_py(const In& x, const Out& values, const Out& scales) {
  check_dtype("x", x, nb::dtype<float>(), "float32");
  check_dtype("values", values, nb::dtype<std::int8_t>(), "int8");
  check_dtype("scales", scales, nb::dtype<float>(), "float32");
  const auto xv = view4<const float>("x", x);
  const auto vv = view4<std::int8_t>("values", values);
  const auto sv = view4<float>("scales", scales);
  nb::gil_scoped_release release;
  quantize_kv(xv, vv, sv);
}

void attention_int8_py(const In& q, const In& k, const In& k_scales,
                       const In& v, const In& v_scales, const Out& out,
                       const std::optional<In>& mask,
                       const std::optional<In>& bias,
                       const std::optional<In>& sinks,
                       const std::optional<Out>& lse, double scale, bool causal,
                       std::ptrdiff_t window_left, std::ptrdiff_t window_right,
                       double softcap, std::size_t kv_begin, std::size_t kv_end,
                       bool precise) {
  check_dtype("query", q, nb::dtype<float>(), "float32");
  check_dtype("out", out, nb::dtype<float>(), "float32");
  const auto qv = view4<const float>("query", q);
  const auto ov = view4<float>("out", out);
  const Int8KV kv = int8_kv("key", k, k_scales);
  const Int8KV vv = int8_kv("value", v, v_scales);
  AttentionOptions o =
      make_options(mask, bias, sinks, scale, causal, window_left, window_right,
                   softcap, kv_begin, kv_end);
  o.precise = precise;
  float* l = lse ? lse_data("lse", *lse, qv) : nullptr;
  nb::gil_scoped_release release;
  attention(qv, kv, vv, ov, o, l);
}

void weights_int8_py(const In& q, const In& k, const In& k_scales, const Out& w,
                     const std::optional<In>& mask,
                     const std::optional<In>& bias,
                     const std::optional<In>& sinks, double scale, bool causal,
                     std::ptrdiff_t window_left, std::ptrdiff_t window_right,
                     double softcap, std::size_t kv_begin, std::size_t kv_end) {
  check_dtype("query", q, nb::dtype<float>(), "float32");
  check_dtype("out", w, nb::dtype<float>(), "float32");
  const auto qv = view4<const float>("query", q);
  const auto wv = view4<float>("out", w);
  const Int8KV kv = int8_kv("key", k, k_scales);
  const AttentionOptions o =
      make_options(mask, bias, sinks, scale, causal, window_left, window_right,
                   softcap, kv_begin, kv_end);
  nb::gil_scoped_release release;
  attention_weights(qv, kv, wv, o);
}

}  // namespace

void bind_int8(nb::module_& m) {
  using namespace nb::literals;
  m.def("quantize_kv", &quantize_kv_py, "x"_a, "values"_a, "scales"_a,
        "int8 values and one float scale per row of a 4-d float32 array.");
  m.def("attention_int8", &attention_int8_py, "query"_a, "key"_a,
        "key_scales"_a, "value"_a, "value_scales"_a, "out"_a, "mask"_a.none(),
        "bias"_a.none(), "sinks"_a.none(), "lse"_a.none(), "scale"_a,
        "causal"_a, "window_left"_a, "window_right"_a, "softcap"_a,
        "kv_begin"_a, "kv_end"_a, "precise"_a = false,
        "Fused attention on 4-d arrays, int8 keys and values.");
  m.def("attention_weights_int8", &weights_int8_py, "query"_a, "key"_a,
        "key_scales"_a, "out"_a, "mask"_a.none(), "bias"_a.none(),
        "sinks"_a.none(), "scale"_a, "causal"_a, "window_left"_a,
        "window_right"_a, "softcap"_a, "kv_begin"_a, "kv_end"_a,
        "Explicit attention weights on 4-d arrays, int8 keys.");
}

}  // namespace softdot::python
