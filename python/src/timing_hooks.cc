// softdot Python bindings: the C++ side of bench/python's binding-cost
// measurement. Times the library call itself in a C++ loop on the caller's
// arrays, so that the Python call's cost over it is measured in one process on
// the same memory. Not part of the public API (the names start with _).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <chrono>
#include <cstddef>
#include <span>
#include <string>

#include "arrays.h"
#include "bindings.h"
#include "softdot/dot.h"
#include "softdot/softmax.h"

namespace softdot::python {
namespace {

template <class F>
double seconds_per_call(std::size_t repeats, F&& f) {
  using clock = std::chrono::steady_clock;
  f();  // warm
  const auto t0 = clock::now();
  for (std::size_t i = 0; i < repeats; ++i) f();
  return std::chrono::duration<double>(clock::now() - t0).count() /
         static_cast<double>(repeats);
}

// Seconds per call of softmax_rows (or dot of x with itself) on a
// C-contiguous float32 x of shape [rows, n], writing into y.
double time_cpp(const std::string& what, const In& x, const Out& y,
                std::size_t repeats) {
  if (x.dtype() != nb::dtype<float>() || y.dtype() != nb::dtype<float>() ||
      x.ndim() != 2 || y.ndim() != 2 || x.stride(1) != 1 || y.stride(1) != 1 ||
      x.stride(0) != static_cast<std::int64_t>(x.shape(1)) ||
      y.stride(0) != static_cast<std::int64_t>(y.shape(1)) ||
      x.shape(0) != y.shape(0) || x.shape(1) != y.shape(1))
    fail(
        "_time_cpp: x and y must be C-contiguous float32 [rows, n] of one "
        "shape");
  const auto* xp = static_cast<const float*>(x.data());
  auto* yp = static_cast<float*>(y.data());
  const std::size_t rows = x.shape(0), n = x.shape(1);
  MatrixView<const float> xv(xp, rows, n);
  MatrixView<float> yv(yp, rows, n);
  if (what != "softmax" && what != "log_softmax" && what != "dot")
    fail("_time_cpp: what must be softmax, log_softmax or dot");
  nb::gil_scoped_release release;
  // One row goes through the span form, as a C++ caller would write it.
  std::span<const float> x0(xp, n);
  std::span<float> y0(yp, n);
  if (what == "softmax" && rows == 1)
    return seconds_per_call(repeats, [&] { softmax(x0, y0); });
  if (what == "softmax")
    return seconds_per_call(repeats, [&] { softmax_rows(xv, yv); });
  if (what == "log_softmax" && rows == 1)
    return seconds_per_call(repeats, [&] { log_softmax(x0, y0); });
  if (what == "log_softmax")
    return seconds_per_call(repeats, [&] { log_softmax_rows(xv, yv); });
  std::span<const float> s(xp, rows * n);
  volatile float sink = 0;
  return seconds_per_call(repeats, [&] { sink = dot(s, s); });
}

}  // namespace

void bind_timing_hooks(nb::module_& m) {
  using namespace nb::literals;
  m.def("_time_cpp", &time_cpp, "what"_a, "x"_a, "y"_a, "repeats"_a,
        "Seconds per call of the C++ function on these arrays (bench/python).");
}

}  // namespace softdot::python
