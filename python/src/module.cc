// softdot Python bindings: the _softdot extension module. The public API is
// python/softdot/__init__.py; this module is its private core and takes
// arrays already shaped by it (see _core.py).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "softdot/simd.h"
#include "softdot/version.h"

NB_MODULE(_softdot, m) {
  namespace nb = nanobind;
  using namespace nb::literals;
  m.doc() = "softdot's compiled core (private: use the softdot package)";
  m.attr("__version__") = SOFTDOT_VERSION_STRING;
  m.def("simd_target", &softdot::simd_target,
        "Name of the SIMD target the library dispatches to now.");
  m.def("simd_targets", &softdot::simd_targets,
        "Targets compiled in and supported by this CPU, best first.");
  m.def("force_simd_target", &softdot::force_simd_target, "name"_a,
        "Restricts dispatch to one target ('' restores the automatic choice).");
  m.def("matrix_units", &softdot::matrix_units,
        "Units the bfloat16 attention products can run on here, best first.");
  m.def("matrix_unit", &softdot::matrix_unit,
        "The unit bfloat16 attention runs its products on now.");
  m.def("force_matrix_unit", &softdot::force_matrix_unit, "name"_a,
        "Forces a unit by name ('' restores the automatic choice).");
  softdot::python::bind_softmax(m);
  softdot::python::bind_attention(m);
  softdot::python::bind_int8(m);
  softdot::python::bind_numpy_fast_path(m);
  softdot::python::bind_cross_entropy(m);
  softdot::python::bind_softmax16(m);
  softdot::python::bind_sample(m);
  softdot::python::bind_linear_cross_entropy(m);
}
