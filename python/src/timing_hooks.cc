// softdot._softdot_bench: the C++ side of bench/python's binding-cost
// measurement, a module of its own that the shipped wheel does not hold (it is
// built only with -DSOFTDOT_PYTHON_BENCH=ON; python/CMakeLists.txt). Times the
// library call itself in a C++ loop on the caller's arrays, so that the Python
// call's cost over it is measured in one process on the same memory.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>

#include "softdot/dot.h"
#include "softdot/softmax.h"

namespace {

namespace nb = nanobind;
using In = nb::ndarray<nb::ro, nb::device::cpu>;
using Out = nb::ndarray<nb::device::cpu>;

[[noreturn]] void fail(const std::string& what) {
  throw std::invalid_argument(what);
}

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
        "time_cpp: x and y must be C-contiguous float32 [rows, n] of one "
        "shape");
  const auto* xp = static_cast<const float*>(x.data());
  auto* yp = static_cast<float*>(y.data());
  const std::size_t rows = x.shape(0), n = x.shape(1);
  softdot::MatrixView<const float> xv(xp, rows, n);
  softdot::MatrixView<float> yv(yp, rows, n);
  if (what != "softmax" && what != "log_softmax" && what != "dot")
    fail("time_cpp: what must be softmax, log_softmax or dot");
  nb::gil_scoped_release release;
  // One row goes through the span form, as a C++ caller would write it.
  std::span<const float> x0(xp, n);
  std::span<float> y0(yp, n);
  if (what == "softmax" && rows == 1)
    return seconds_per_call(repeats, [&] { softdot::softmax(x0, y0); });
  if (what == "softmax")
    return seconds_per_call(repeats, [&] { softdot::softmax_rows(xv, yv); });
  if (what == "log_softmax" && rows == 1)
    return seconds_per_call(repeats, [&] { softdot::log_softmax(x0, y0); });
  if (what == "log_softmax")
    return seconds_per_call(repeats,
                            [&] { softdot::log_softmax_rows(xv, yv); });
  std::span<const float> s(xp, rows * n);
  volatile float sink = 0;
  return seconds_per_call(repeats, [&] { sink = softdot::dot(s, s); });
}

}  // namespace

NB_MODULE(_softdot_bench, m) {
  using namespace nb::literals;
  m.doc() =
      "softdot's benchmark hooks (bench/python; not shipped in the wheel)";
  m.def("time_cpp", &time_cpp, "what"_a, "x"_a, "y"_a, "repeats"_a,
        "Seconds per call of the C++ function on these arrays (bench/python).");
}
