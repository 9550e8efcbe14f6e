// softdot Python bindings: the parts of the _softdot module.
#ifndef SOFTDOT_PYTHON_BINDINGS_H_
#define SOFTDOT_PYTHON_BINDINGS_H_

#include <nanobind/nanobind.h>

namespace softdot::python {

void bind_softmax(nanobind::module_& m);          // softmax family, states, dot
void bind_attention(nanobind::module_& m);        // attention requests, merge
void bind_int8(nanobind::module_& m);             // quantize_kv
void bind_numpy_fast_path(nanobind::module_& m);  // no-option numpy calls
void bind_cross_entropy(nanobind::module_& m);    // cross_entropy
void bind_softmax16(nanobind::module_& m);        // 16-bit softmax family
void bind_sample(nanobind::module_& m);           // sample, speculative
void bind_linear_cross_entropy(nanobind::module_& m);  // linear_cross_entropy

}  // namespace softdot::python

#endif  // SOFTDOT_PYTHON_BINDINGS_H_
