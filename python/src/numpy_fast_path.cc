// softdot Python bindings: the fast path for the most common call, a softmax
// (or log-softmax, or dot) of a row-major numpy array along its last axis
// with no options. Through the general path a 3-element softmax cost 1.17 us
// from Python (two DLPack imports and np.empty_like called from Python; timeit
// loops at the Python prompt, not a command of the project); through this
// path bench/python/bench_softdot.py measures 0.29-0.34 us over the C++ call.
// Here NumPy's C API reads the array and allocates the result directly.
// Anything else (other layouts, torch, options) returns None and the caller
// takes the general path, which gives the same bits.
#include <nanobind/nanobind.h>

#define NPY_NO_DEPRECATED_API NPY_2_0_API_VERSION
#define PY_ARRAY_UNIQUE_SYMBOL softdot_ARRAY_API
#include <numpy/arrayobject.h>

#include <cstddef>
#include <span>

#include "bindings.h"
#include "python_errors.h"
#include "softdot/dot.h"
#include "softdot/softmax.h"

namespace softdot::python {
namespace {

namespace nb = nanobind;

// A row-major, aligned array of float32 or float64 with at least one axis and
// non-empty rows: (type number, rows, row length), or type number -1.
struct Rows {
  int type = -1;
  std::size_t rows = 0, n = 0;
};

Rows rows_of(PyObject* o) {
  Rows r;
  if (!PyArray_CheckExact(o)) return r;
  auto* a = reinterpret_cast<PyArrayObject*>(o);
  const int t = PyArray_TYPE(a);
  const int nd = PyArray_NDIM(a);
  if ((t != NPY_FLOAT && t != NPY_DOUBLE) || nd < 1 ||
      !PyArray_ISCARRAY_RO(a) || !PyArray_ISNOTSWAPPED(a))
    return r;
  const npy_intp* shape = PyArray_DIMS(a);
  r.n = static_cast<std::size_t>(shape[nd - 1]);
  if (PyArray_SIZE(a) == 0) return r;  // no rows, or empty ones: general path
  r.rows = static_cast<std::size_t>(PyArray_SIZE(a)) / r.n;
  r.type = t;
  return r;
}

template <class T>
void run_rows(PyArrayObject* x, PyArrayObject* y, const Rows& r, bool log,
              bool fast) {
  SoftmaxOptions o;
  o.precision = fast ? Precision::kFast : Precision::kFaithful;
  MatrixView<const T> xv(static_cast<const T*>(PyArray_DATA(x)), r.rows, r.n);
  MatrixView<T> yv(static_cast<T*>(PyArray_DATA(y)), r.rows, r.n);
  nb::gil_scoped_release release;
  if (r.rows == 1) {  // the span form, as bench_softdot.py's C++ figure
    std::span<const T> xs(xv.data, r.n);
    std::span<T> ys(yv.data, r.n);
    if (log)
      log_softmax(xs, ys, o);
    else
      softmax(xs, ys, o);
  } else if (log) {
    log_softmax_rows(xv, yv, o);
  } else {
    softmax_rows(xv, yv, o);
  }
}

// True when `out` can receive the rows r of x: a C-ordered, aligned,
// writable numpy array of x's dtype and shape that is x itself (in place) or
// does not overlap it.
bool out_fits(PyArrayObject* x, PyObject* o, const Rows& r) {
  if (!PyArray_CheckExact(o)) return false;
  auto* a = reinterpret_cast<PyArrayObject*>(o);
  if (PyArray_TYPE(a) != r.type || !PyArray_ISCARRAY(a) ||
      !PyArray_ISNOTSWAPPED(a) || PyArray_NDIM(a) != PyArray_NDIM(x) ||
      !PyArray_CompareLists(PyArray_DIMS(a), PyArray_DIMS(x), PyArray_NDIM(x)))
    return false;
  const auto* xb = static_cast<const char*>(PyArray_DATA(x));
  const auto* ob = static_cast<const char*>(PyArray_DATA(a));
  const std::size_t bytes = static_cast<std::size_t>(PyArray_NBYTES(x));
  return xb == ob || ob + bytes <= xb || xb + bytes <= ob;
}

// softmax (log = false) or log_softmax of the rows of x into `out` (or a new
// array when out is None); None when x is not a row-major float32/float64
// numpy array or out does not fit (the general path then copies, or raises).
nb::object softmax_fast(nb::handle x, nb::handle out, bool log, bool fast) {
  const Rows r = rows_of(x.ptr());
  if (r.type < 0) return nb::none();
  auto* xa = reinterpret_cast<PyArrayObject*>(x.ptr());
  nb::object result;
  if (out.is_none()) {
    PyObject* y = PyArray_NewLikeArray(xa, NPY_CORDER, nullptr, 0);
    if (!y) throw nb::python_error();
    result = nb::steal(y);
  } else {
    if (!out_fits(xa, out.ptr(), r)) return nb::none();
    result = nb::borrow(out);
  }
  auto* ya = reinterpret_cast<PyArrayObject*>(result.ptr());
  as_python(log ? "log_softmax" : "softmax", [&] {
    if (r.type == NPY_FLOAT)
      run_rows<float>(xa, ya, r, log, fast);
    else
      run_rows<double>(xa, ya, r, log, fast);
  });
  return result;
}

PyObject* scalar(void* value, int type) {
  PyArray_Descr* descr = PyArray_DescrFromType(type);
  PyObject* s = PyArray_Scalar(value, descr, nullptr);
  Py_DECREF(descr);
  return s;
}

// dot of the n values of T at px and py as a new numpy scalar of type
// `npy` (null on failure).
template <class T>
PyObject* dot_scalar_t(const void* px, const void* py, std::size_t n,
                       bool accurate, int npy) {
  const std::span<const T> u(static_cast<const T*>(px), n),
      v(static_cast<const T*>(py), n);
  T d;
  {
    nb::gil_scoped_release release;
    d = accurate ? dot_accurate(u, v) : dot(u, v);
  }
  return scalar(&d, npy);
}

// dot of the rows a of px and py as a new numpy scalar (null on failure).
PyObject* dot_scalar(const void* px, const void* py, const Rows& a,
                     bool accurate) {
  if (a.type == NPY_FLOAT)
    return dot_scalar_t<float>(px, py, a.n, accurate, NPY_FLOAT);
  return dot_scalar_t<double>(px, py, a.n, accurate, NPY_DOUBLE);
}

// dot(x, y) as a numpy scalar of their dtype, or None unless both are 1-d
// contiguous arrays of the same dtype and length.
nb::object dot_fast(nb::handle x, nb::handle y, bool accurate) {
  const Rows a = rows_of(x.ptr()), b = rows_of(y.ptr());
  if (a.type < 0 || a.type != b.type || a.rows != 1 || b.rows != 1 ||
      a.n != b.n ||
      PyArray_NDIM(reinterpret_cast<PyArrayObject*>(x.ptr())) != 1 ||
      PyArray_NDIM(reinterpret_cast<PyArrayObject*>(y.ptr())) != 1)
    return nb::none();
  const void* px = PyArray_DATA(reinterpret_cast<PyArrayObject*>(x.ptr()));
  const void* py = PyArray_DATA(reinterpret_cast<PyArrayObject*>(y.ptr()));
  PyObject* s = nullptr;
  as_python("dot", [&] { s = dot_scalar(px, py, a, accurate); });
  if (!s) throw nb::python_error();
  return nb::steal(s);
}

}  // namespace

void bind_numpy_fast_path(nb::module_& m) {
  if (PyArray_ImportNumPyAPI() < 0) throw nb::python_error();
  using namespace nb::literals;
  m.def("softmax_fast", &softmax_fast, "x"_a, "out"_a.none(), "log"_a, "fast"_a,
        "softmax or log_softmax of a row-major numpy array along its last axis "
        "(into out, or a new array), or None.");
  m.def("dot_fast", &dot_fast, "x"_a, "y"_a, "accurate"_a,
        "dot of two contiguous 1-d numpy arrays of one dtype as a numpy "
        "scalar, or None.");
}

}  // namespace softdot::python
