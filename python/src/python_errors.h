// softdot Python bindings: errors as the Python caller reads them. The C++
// library names its own functions in its messages ("softdot::softmax_rows:
// temperature ... "); a Python user called softdot.softmax and should read
// "softmax: temperature ...". as_python(fn, f) runs f and rewrites the
// message of a std::invalid_argument (ValueError) or a nanobind builtin
// exception (TypeError, ...) to start with the Python function's name: the
// one rewriter of the bindings (the caller's argument names, shapes and
// indices are the Python layer's: python/softdot/_terms.py).
#ifndef SOFTDOT_PYTHON_PYTHON_ERRORS_H_
#define SOFTDOT_PYTHON_PYTHON_ERRORS_H_

#include <nanobind/nanobind.h>

#include <stdexcept>
#include <string>
#include <string_view>

namespace softdot::python {

// `what` with a leading "softdot::<name>: " (or "softdot::mpi::<name>: ")
// removed, after "<fn>: "; a collective check's leading "rank N: " (the
// rank that failed, softdot::mpi) stays first.
inline std::string python_message(const char* fn, const char* what) {
  std::string_view w(what);
  std::string rank;
  if (w.starts_with("rank ")) {
    const std::size_t colon = w.find(": ");
    if (colon != std::string_view::npos) {
      rank = std::string(w.substr(0, colon + 2));
      w.remove_prefix(colon + 2);
    }
  }
  constexpr std::string_view kLibrary = "softdot::";
  if (w.starts_with(kLibrary)) {
    const std::size_t colon = w.find(": ");
    if (colon != std::string_view::npos) w.remove_prefix(colon + 2);
  }
  return rank + std::string(fn) + ": " + std::string(w);
}

template <class F>
decltype(auto) as_python(const char* fn, F&& f) {
  try {
    return f();
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(python_message(fn, e.what()));
  } catch (const nanobind::builtin_exception& e) {
    throw nanobind::builtin_exception(e.type(),
                                      python_message(fn, e.what()).c_str());
  }
}

}  // namespace softdot::python

#endif  // SOFTDOT_PYTHON_PYTHON_ERRORS_H_
