// softdot Python bindings: quantize_kv (int8 keys and values with one float
// scale per row, the library's Int8KV). Attention on int8 K/V is an
// attention request like the others (attention_bindings.cc,
// request_views.h).
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

}  // namespace

void bind_int8(nb::module_& m) {
  using namespace nb::literals;
  m.def("quantize_kv", &quantize_kv_py, "x"_a, "values"_a, "scales"_a,
        "int8 values and one float scale per row of a 4-d float32 array.");
}

}  // namespace softdot::python
