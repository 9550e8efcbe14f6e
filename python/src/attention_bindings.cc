// softdot Python bindings: attention, its merge and its explicit weights.
//
// The Python layer hands over 4-d arrays [B, H, L, E] (leading ones added,
// masks broadcast with stride-0 views, K and V of 16 bits as float16,
// bfloat16 or their uint16 bits with `kv_format` saying which); here they
// become TensorViews with the arrays' own strides, so nothing is copied.
// The Python layer has also checked, exactly (np.shares_memory on the
// caller's arrays), that `out` shares no memory with an input.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "arrays.h"
#include "attention_views.h"
#include "bindings.h"
#include "softdot/attention.h"

namespace softdot::python {
namespace {

void attention_py(const In& q, const In& k, const In& v, const Out& out,
                  int kv_format, const std::optional<In>& mask,
                  const std::optional<In>& bias, const std::optional<In>& sinks,
                  const std::optional<Out>& lse, double scale, bool causal,
                  std::ptrdiff_t window_left, std::ptrdiff_t window_right,
                  double softcap, std::size_t kv_begin, std::size_t kv_end,
                  bool precise) {
  check_dtype("query", q, nb::dtype<float>(), "float32");
  check_dtype("out", out, nb::dtype<float>(), "float32");
  const auto qv = view4<const float>("query", q);
  const auto ov = view4<float>("out", out);
  AttentionOptions o =
      make_options(mask, bias, sinks, scale, causal, window_left, window_right,
                   softcap, kv_begin, kv_end);
  o.precise = precise;
  float* l = lse ? lse_data("lse", *lse, qv) : nullptr;
  with_kv(kv_format, k, &v, [&](const auto& kv, const auto& vv) {
    nb::gil_scoped_release release;
    attention(qv, kv, vv, ov, o, l);
  });
}

void weights_py(const In& q, const In& k, const Out& w, int kv_format,
                const std::optional<In>& mask, const std::optional<In>& bias,
                const std::optional<In>& sinks, double scale, bool causal,
                std::ptrdiff_t window_left, std::ptrdiff_t window_right,
                double softcap, std::size_t kv_begin, std::size_t kv_end) {
  check_dtype("query", q, nb::dtype<float>(), "float32");
  check_dtype("out", w, nb::dtype<float>(), "float32");
  const auto qv = view4<const float>("query", q);
  const auto wv = view4<float>("out", w);
  AttentionOptions o =
      make_options(mask, bias, sinks, scale, causal, window_left, window_right,
                   softcap, kv_begin, kv_end);
  with_kv(kv_format, k, nullptr, [&](const auto& kv, const auto&) {
    nb::gil_scoped_release release;
    attention_weights(qv, kv, wv, o);
  });
}

void merge_py(const In& oa, const In& la, const In& ob, const In& lb,
              const Out& out, const Out& lse) {
  check_dtype("out_a", oa, nb::dtype<float>(), "float32");
  check_dtype("out_b", ob, nb::dtype<float>(), "float32");
  check_dtype("out", out, nb::dtype<float>(), "float32");
  const auto av = view4<const float>("out_a", oa);
  const auto bv = view4<const float>("out_b", ob);
  const auto ov = view4<float>("out", out);
  float* l = lse_data("lse", lse, av);
  const float* pa = lse_data("lse_a", la, av);
  const float* pb = lse_data("lse_b", lb, av);
  nb::gil_scoped_release release;
  attention_merge(av, pa, bv, pb, ov, l);
}

}  // namespace

void bind_attention(nb::module_& m) {
  using namespace nb::literals;
  m.def("attention", &attention_py, "query"_a, "key"_a, "value"_a, "out"_a,
        "kv_format"_a, "mask"_a.none(), "bias"_a.none(), "sinks"_a.none(),
        "lse"_a.none(), "scale"_a, "causal"_a, "window_left"_a,
        "window_right"_a, "softcap"_a, "kv_begin"_a, "kv_end"_a,
        "precise"_a = false, "Fused attention on 4-d arrays.");
  m.def("attention_weights", &weights_py, "query"_a, "key"_a, "out"_a,
        "kv_format"_a, "mask"_a.none(), "bias"_a.none(), "sinks"_a.none(),
        "scale"_a, "causal"_a, "window_left"_a, "window_right"_a, "softcap"_a,
        "kv_begin"_a, "kv_end"_a, "Explicit attention weights on 4-d arrays.");
  m.def("attention_merge", &merge_py, "out_a"_a, "lse_a"_a, "out_b"_a,
        "lse_b"_a, "out"_a, "lse"_a, "Merges two partial attention results.");
}

}  // namespace softdot::python
