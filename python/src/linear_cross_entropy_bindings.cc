// softdot Python bindings: the fused linear + cross-entropy. The Python
// layer (python/softdot/_linear_cross_entropy.py) has converted the targets
// to int64, the inputs to float32 or bfloat16 bits (uint16) with contiguous
// rows, checked the shapes and allocated the float32 outputs; this checks
// dtypes and shapes once more, releases the GIL and calls
// softdot::linear_cross_entropy (no copy). Errors name the Python function.
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
#include "softdot/linear_cross_entropy.h"

namespace softdot::python {
namespace {

MatrixView<float> grad_view(const char* name, const std::optional<Out>& g,
                            std::size_t rows, std::size_t cols) {
  if (!g) return {};
  if (g->dtype() != nb::dtype<float>())
    fail(std::string(name) + " must be float32");
  return view2<float>(name, *g, rows, cols);
}

template <class T>
double run(const In& hidden, const In& weight, const In& targets,
           const std::optional<Out>& loss, const std::optional<Out>& dh,
           const std::optional<Out>& dw, const CrossEntropyOptions& o) {
  const std::size_t n = hidden.shape(0), d = hidden.shape(1),
                    v = weight.shape(0);
  const MatrixView<const T> h = view2<const T>("hidden", hidden, n, d);
  const MatrixView<const T> w = view2<const T>("weight", weight, v, d);
  const std::span<const std::int64_t> t = targets_of(targets, n);
  const std::span<float> loss_span = loss_of<float>(loss, n);
  const MatrixView<float> gh = grad_view("grad_hidden", dh, n, d);
  const MatrixView<float> gw = grad_view("grad_weight", dw, v, d);
  nb::gil_scoped_release release;
  return linear_cross_entropy(h, w, t, loss_span, gh, gw, o);
}

double linear_cross_entropy_py(const In& hidden, const In& weight,
                               const In& targets,
                               const std::optional<Out>& loss,
                               const std::optional<Out>& grad_hidden,
                               const std::optional<Out>& grad_weight,
                               std::int64_t ignore_index,
                               double label_smoothing, int reduction) {
  return as_python("linear_cross_entropy", [&] {
    if (hidden.ndim() != 2 || weight.ndim() != 2)
      fail("hidden and weight must be 2-d");
    if (hidden.dtype() != weight.dtype())
      throw nb::type_error("hidden and weight must have the same dtype");
    const CrossEntropyOptions o =
        xent_options(ignore_index, label_smoothing, reduction);
    if (hidden.dtype() == nb::dtype<float>())
      return run<float>(hidden, weight, targets, loss, grad_hidden, grad_weight,
                        o);
    if (hidden.dtype() == nb::dtype<std::uint16_t>())  // bfloat16 bits
      return run<BFloat16>(hidden, weight, targets, loss, grad_hidden,
                           grad_weight, o);
    throw nb::type_error("hidden must be float32 or bfloat16 (as uint16)");
  });
}

}  // namespace

void bind_linear_cross_entropy(nb::module_& m) {
  using namespace nb::literals;
  m.def("linear_cross_entropy_rows", &linear_cross_entropy_py, "hidden"_a,
        "weight"_a, "targets"_a, "loss"_a.none(), "grad_hidden"_a.none(),
        "grad_weight"_a.none(), "ignore_index"_a, "label_smoothing"_a,
        "reduction"_a,
        "softdot::linear_cross_entropy on float32 or bfloat16 (uint16 bits) "
        "rows; returns the reduced loss.");
}

}  // namespace softdot::python
