// softdot Python bindings: errors as the Python caller reads them. The C++
// library names its own functions in its messages ("softdot::softmax_rows:
// temperature ... "); a Python user called softdot.softmax and should read
// "softmax: temperature ...". as_python(fn, f) runs f and rewrites the
// message of a std::invalid_argument (ValueError) or a nanobind builtin
// exception (TypeError, ...) to start with the Python function's name.
#ifndef SOFTDOT_PYTHON_PYTHON_ERRORS_H_
#define SOFTDOT_PYTHON_PYTHON_ERRORS_H_

#include <nanobind/nanobind.h>

#include <stdexcept>
#include <string>
#include <string_view>

namespace softdot::python {

// `what` with a leading "softdot::<name>: " removed, after "<fn>: ".
inline std::string python_message(const char* fn, const char* what) {
  std::string_view w(what);
  constexpr std::string_view kLibrary = "softdot::";
  if (w.starts_with(kLibrary)) {
    const std::size_t colon = w.find(": ");
    if (colon != std::string_view::npos) w.remove_prefix(colon + 2);
  }
  return std::string(fn) + ": " + std::string(w);
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
