// softdot Python bindings: the fused cross-entropy. The Python layer
// (python/softdot/_cross_entropy.py; _softmax16.py for 16-bit logits, as
// their uint16 bits) has converted the targets to int64,
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
#include <type_traits>

#include "arrays.h"
#include "bindings.h"
#include "python_errors.h"
#include "softdot/cross_entropy.h"
#include "softdot/float16.h"

namespace softdot::python {
namespace {

// How the arrays hold T's values: T itself (float, double), or 16-bit
// values as their bits (uint16: the Python layer's view of a bfloat16 or
// float16 array).
template <class T>
inline constexpr bool kBits =
    std::is_same_v<T, BFloat16> || std::is_same_v<T, Float16>;
template <class T>
using Stored = std::conditional_t<kBits<T>, std::uint16_t, T>;

// The rows of logits or grad, (rows, cols), as a MatrixView of T (its
// storage dtype checked; logits' own dtype was chosen by the caller).
template <class T, class A>
MatrixView<T> rows_of(const char* name, const A& a, std::size_t rows,
                      std::size_t cols) {
  using U = std::remove_const_t<T>;
  if constexpr (kBits<U>) {
    if (a.dtype() != nb::dtype<std::uint16_t>())
      fail(std::string(name) + " must hold 16-bit values (uint16 bits)");
  } else if (a.dtype() != nb::dtype<U>()) {
    fail(std::string(name) + " has a different dtype from logits");
  }
  return view2<T>(name, a, rows, cols);
}

// softdot::cross_entropy of 2-d logits of T (float, double, BFloat16,
// Float16) with the optional per-row losses and gradient of the same type.
template <class T>
double run(const In& logits, const In& targets, const std::optional<Out>& loss,
           const std::optional<Out>& grad, const CrossEntropyOptions& o) {
  if (logits.ndim() != 2) fail("logits must be 2-d (rows, classes)");
  const std::size_t rows = logits.shape(0), cols = logits.shape(1);
  const MatrixView<const T> x = rows_of<const T>("logits", logits, rows, cols);
  const std::span<const std::int64_t> t = targets_of(targets, rows);
  const std::span<Stored<T>> stored = loss_of<Stored<T>>(loss, rows);
  const std::span<T> ls(reinterpret_cast<T*>(stored.data()), stored.size());
  MatrixView<T> g;
  if (grad) g = rows_of<T>("grad", *grad, rows, cols);
  nb::gil_scoped_release release;
  return cross_entropy(x, t, ls, g, o);
}

double cross_entropy_py(const In& logits, const In& targets,
                        const std::optional<Out>& loss,
                        const std::optional<Out>& grad,
                        std::int64_t ignore_index, double label_smoothing,
                        int reduction) {
  return as_python("cross_entropy", [&] {
    const CrossEntropyOptions o =
        xent_options(ignore_index, label_smoothing, reduction);
    if (logits.dtype() == nb::dtype<float>())
      return run<float>(logits, targets, loss, grad, o);
    if (logits.dtype() == nb::dtype<double>())
      return run<double>(logits, targets, loss, grad, o);
    throw nb::type_error("logits must be float32 or float64");
  });
}

// The 16-bit logits (their bits as uint16; bf16: bfloat16, else float16).
double cross_entropy16_py(const In& logits, const In& targets,
                          const std::optional<Out>& loss,
                          const std::optional<Out>& grad,
                          std::int64_t ignore_index, double label_smoothing,
                          int reduction, bool bf16) {
  return as_python("cross_entropy", [&] {
    const CrossEntropyOptions o =
        xent_options(ignore_index, label_smoothing, reduction);
    return bf16 ? run<BFloat16>(logits, targets, loss, grad, o)
                : run<Float16>(logits, targets, loss, grad, o);
  });
}

}  // namespace

void bind_cross_entropy(nb::module_& m) {
  using namespace nb::literals;
  m.def("cross_entropy_rows", &cross_entropy_py, "logits"_a, "targets"_a,
        "loss"_a.none(), "grad"_a.none(), "ignore_index"_a, "label_smoothing"_a,
        "reduction"_a,
        "softdot::cross_entropy on 2-d rows; returns the reduced loss.");
  m.def("cross_entropy16_rows", &cross_entropy16_py, "logits"_a, "targets"_a,
        "loss"_a.none(), "grad"_a.none(), "ignore_index"_a, "label_smoothing"_a,
        "reduction"_a, "bf16"_a,
        "softdot::cross_entropy on 16-bit rows; returns the reduced loss.");
}

}  // namespace softdot::python
