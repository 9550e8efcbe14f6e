// softdot Python bindings: the softmax family on bfloat16 / float16 rows.
// The Python layer (python/softdot/_softmax16.py) passes the rows as their
// bits, uint16 arrays of 2 axes (rows, n) with a contiguous last axis (no
// copy of a row-major input), and says which format (bf16); this checks
// shapes and strides, releases the GIL and calls the 16-bit overloads of
// include/softdot/softmax.h (cross_entropy's 16-bit rows are
// cross_entropy_bindings.cc's, with the float ones).
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
#include "softdot/float16.h"
#include "softdot/softmax.h"

namespace softdot::python {
namespace {

// A uint16 array of shape (rows, cols) with a contiguous last axis and rows
// that do not overlap, as a MatrixView of H.
template <class H, class A>
MatrixView<H> rows_of(const char* name, const A& a, std::size_t rows,
                      std::size_t cols) {
  if (a.dtype() != nb::dtype<std::uint16_t>())
    fail(std::string(name) + " must hold 16-bit values (uint16 bits)");
  return view2<H>(name, a, rows, cols);
}

template <class H>
void softmax_t(const In& x, const Out& out, const std::optional<In>& where,
               bool log, double temperature, bool fast) {
  if (x.ndim() != 2) fail("x must be 2-d (rows, n)");
  const std::size_t rows = x.shape(0), n = x.shape(1);
  if (rows == 0 || n == 0) fail("x has shape " + shape_of(x) + "; empty");
  const MatrixView<const H> xv = rows_of<const H>("x", x, rows, n);
  const MatrixView<H> yv = rows_of<H>("out", out, rows, n);
  SoftmaxOptions o;
  o.temperature = temperature;
  o.precision = fast ? Precision::kFast : Precision::kFaithful;
  if (where) {
    if (where->dtype() != nb::dtype<bool>() || where->ndim() != 2 ||
        where->shape(0) != rows || where->shape(1) != n ||
        (n > 1 && where->stride(1) != 1) ||
        (rows > 1 && where->stride(0) != static_cast<std::int64_t>(n)))
      fail("where must be a contiguous bool array of x's shape");
    o.mask = std::span<const bool>(static_cast<const bool*>(where->data()),
                                   rows * n);
  }
  nb::gil_scoped_release release;
  if (log)
    log_softmax_rows(xv, yv, o);
  else
    softmax_rows(xv, yv, o);
}

void softmax16_py(const In& x, const Out& out, const std::optional<In>& where,
                  bool log, double temperature, bool bf16, bool fast) {
  as_python(log ? "log_softmax" : "softmax", [&] {
    if (bf16)
      softmax_t<BFloat16>(x, out, where, log, temperature, fast);
    else
      softmax_t<Float16>(x, out, where, log, temperature, fast);
  });
}

template <class H>
void logsumexp_t(const In& x, const Out& out, const std::optional<In>& where,
                 double temperature) {
  if (x.ndim() != 2) fail("x must be 2-d (rows, n)");
  const std::size_t rows = x.shape(0), n = x.shape(1);
  if (n == 0) fail("x has shape " + shape_of(x) + "; the rows are empty");
  const MatrixView<const H> xv = rows_of<const H>("x", x, rows, n);
  if (out.dtype() != nb::dtype<std::uint16_t>() || out.ndim() != 1 ||
      out.shape(0) != rows || (rows > 1 && out.stride(0) != 1))
    fail("out must be a contiguous uint16 array of shape (rows,)");
  if (where &&
      (where->dtype() != nb::dtype<bool>() || where->ndim() != 2 ||
       where->shape(0) != rows || where->shape(1) != n ||
       (rows > 1 && where->stride(0) != static_cast<std::int64_t>(n)) ||
       (n > 1 && where->stride(1) != 1)))
    fail("where must be a contiguous bool array of x's shape");
  H* o = static_cast<H*>(out.data());
  const bool* m = where ? static_cast<const bool*>(where->data()) : nullptr;
  nb::gil_scoped_release release;
  for (std::size_t i = 0; i < rows; ++i) {
    SoftmaxOptions opt;
    opt.temperature = temperature;
    if (m) opt.mask = std::span<const bool>(m + i * n, n);
    o[i] = logsumexp(std::span<const H>(xv.data + i * xv.stride, n), opt);
  }
}

void logsumexp16_py(const In& x, const Out& out, const std::optional<In>& where,
                    double temperature, bool bf16) {
  as_python("logsumexp", [&] {
    if (bf16)
      logsumexp_t<BFloat16>(x, out, where, temperature);
    else
      logsumexp_t<Float16>(x, out, where, temperature);
  });
}

template <class H>
void backward_t(const In& y, const In& dy, const Out& dx) {
  if (y.ndim() != 2) fail("y must be 2-d (rows, n)");
  const std::size_t rows = y.shape(0), n = y.shape(1);
  if (n == 0) fail("y has shape " + shape_of(y) + "; the rows are empty");
  const MatrixView<const H> yv = rows_of<const H>("y", y, rows, n);
  const MatrixView<const H> dv = rows_of<const H>("dy", dy, rows, n);
  const MatrixView<H> xv = rows_of<H>("out", dx, rows, n);
  nb::gil_scoped_release release;
  for (std::size_t i = 0; i < rows; ++i) {
    softmax_backward(std::span<const H>(yv.data + i * yv.stride, n),
                     std::span<const H>(dv.data + i * dv.stride, n),
                     std::span<H>(xv.data + i * xv.stride, n));
  }
}

void backward16_py(const In& y, const In& dy, const Out& dx, bool bf16) {
  as_python("softmax_backward", [&] {
    if (bf16)
      backward_t<BFloat16>(y, dy, dx);
    else
      backward_t<Float16>(y, dy, dx);
  });
}

}  // namespace

void bind_softmax16(nb::module_& m) {
  using namespace nb::literals;
  m.def("softmax16_rows", &softmax16_py, "x"_a, "out"_a, "where"_a.none(),
        "log"_a, "temperature"_a, "bf16"_a, "fast"_a = false,
        "softmax / log_softmax of 16-bit rows (uint16 bits, 2-d); fast: "
        "Precision::kFast (softmax only).");
  m.def("logsumexp16_rows", &logsumexp16_py, "x"_a, "out"_a, "where"_a.none(),
        "temperature"_a, "bf16"_a, "logsumexp of 16-bit rows (uint16 bits).");
  m.def("softmax16_backward_rows", &backward16_py, "y"_a, "dy"_a, "out"_a,
        "bf16"_a, "softmax_backward of 16-bit rows (uint16 bits).");
}

}  // namespace softdot::python
