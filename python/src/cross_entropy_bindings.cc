// softdot Python bindings: the fused cross-entropy. The Python layer
// (python/softdot/_cross_entropy.py) has converted the targets to int64,
// checked the shapes, allocated the outputs and checked that they share no
// memory with the inputs; this checks dtypes, shapes and strides once more,
// releases the GIL and calls softdot::cross_entropy on the rows as a strided
// MatrixView (no copy). Errors name the Python function (python_errors.h).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "arrays.h"
#include "bindings.h"
#include "python_errors.h"
#include "softdot/cross_entropy.h"

namespace softdot::python {
namespace {

template <class T>
double run(const In& logits, const In& targets, const std::optional<Out>& loss,
           const std::optional<Out>& grad, const CrossEntropyOptions& o) {
  const std::size_t rows = logits.shape(0), cols = logits.shape(1);
  const MatrixView<const T> x = view2<const T>("logits", logits, rows, cols);
  const std::span<const std::int64_t> t = targets_of(targets, rows);
  const std::span<T> loss_span = loss_of<T>(loss, rows);
  MatrixView<T> grad_view;
  if (grad) {
    if (grad->dtype() != nb::dtype<T>())
      fail("grad has a different dtype from logits");
    grad_view = view2<T>("grad", *grad, rows, cols);
  }
  nb::gil_scoped_release release;
  return cross_entropy(x, t, loss_span, grad_view, o);
}

double cross_entropy_py(const In& logits, const In& targets,
                        const std::optional<Out>& loss,
                        const std::optional<Out>& grad,
                        std::int64_t ignore_index, double label_smoothing,
                        int reduction) {
  return as_python("cross_entropy", [&] {
    if (logits.ndim() != 2) fail("logits must be 2-d (rows, classes)");
    const CrossEntropyOptions o =
        xent_options(ignore_index, label_smoothing, reduction);
    if (logits.dtype() == nb::dtype<float>())
      return run<float>(logits, targets, loss, grad, o);
    if (logits.dtype() == nb::dtype<double>())
      return run<double>(logits, targets, loss, grad, o);
    throw nb::type_error("logits must be float32 or float64");
  });
}

}  // namespace

void bind_cross_entropy(nb::module_& m) {
  using namespace nb::literals;
  m.def("cross_entropy_rows", &cross_entropy_py, "logits"_a, "targets"_a,
        "loss"_a.none(), "grad"_a.none(), "ignore_index"_a, "label_smoothing"_a,
        "reduction"_a,
        "softdot::cross_entropy on 2-d rows; returns the reduced loss.");
}

}  // namespace softdot::python
