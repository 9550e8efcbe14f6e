// softdot Python bindings: the attention bindings' shared pieces (float,
// 16-bit and int8 K/V): a 4-d array as a TensorView with its own strides
// (nothing copied), dtype checks, the lse output, and an int8 K or V with
// its scales as an Int8KV. (The options dict's conversion is
// request_views.h's.)
#ifndef SOFTDOT_PYTHON_ATTENTION_VIEWS_H_
#define SOFTDOT_PYTHON_ATTENTION_VIEWS_H_

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <type_traits>

#include "arrays.h"
#include "softdot/attention.h"

namespace softdot::python {

// A TensorView of a 4-d array of element type T (checked by the caller)
// with its strides; negative strides and a strided last axis are refused.
// An array with no elements has no element to address, and numpy and torch
// give such arrays any strides (numpy: 0): its view gets the contiguous ones.
template <class T, class A>
TensorView<T> view4(const char* name, const A& a) {
  if (a.ndim() != 4)
    fail(std::string(name) + " has " + std::to_string(a.ndim()) +
         " axes; expected 4");
  if (a.size() == 0) {
    using U = std::remove_const_t<T>;
    auto* p = reinterpret_cast<T*>(const_cast<U*>(
        static_cast<const U*>(static_cast<const void*>(a.data()))));
    return TensorView<T>(p, a.shape(0), a.shape(1), a.shape(2), a.shape(3));
  }
  for (std::size_t i = 0; i < 4; ++i)
    if (a.stride(i) < 0)
      fail(std::string(name) + " has a negative stride on axis " +
           std::to_string(i));
  if (a.shape(3) > 1 && a.stride(3) != 1)
    fail(std::string(name) + "'s last axis is not contiguous");
  using U = std::remove_const_t<T>;
  auto* p = reinterpret_cast<T*>(const_cast<U*>(
      static_cast<const U*>(static_cast<const void*>(a.data()))));
  auto st = [&](std::size_t i) {
    return static_cast<std::size_t>(a.stride(i));
  };
  return TensorView<T>(p, a.shape(0), a.shape(1), a.shape(2), a.shape(3), st(0),
                       st(1), st(2));
}

template <class A>
void check_dtype(const char* name, const A& a, nb::dlpack::dtype want,
                 const char* want_name) {
  if (a.dtype() != want)
    throw nb::type_error((std::string(name) + " must be " + want_name).c_str());
}

// The number of elements of a C-contiguous array (fail() naming it
// otherwise).
template <class A>
std::size_t contiguous_size(const char* name, const A& a) {
  std::int64_t expect = 1;
  std::size_t size = 1;
  for (std::size_t i = a.ndim(); i-- > 0;) {
    if (a.shape(i) > 1 && a.stride(i) != expect)
      fail(std::string(name) + " must be C-contiguous");
    expect *= static_cast<std::int64_t>(a.shape(i));
    size *= a.shape(i);
  }
  return size;
}

// The float data of a C-contiguous array of exactly batch x heads x rows
// values, one per row of q in (b, h, i) order (an lse array).
template <class A>
float* lse_data(const char* name, const A& a,
                const TensorView<const float>& q) {
  check_dtype(name, a, nb::dtype<float>(), "float32");
  const std::size_t want = q.batch * q.heads * q.rows;
  const std::size_t size = contiguous_size(name, a);
  if (size != want)
    fail(std::string(name) + " holds " + std::to_string(size) +
         " values; expected " + std::to_string(want) +
         " (batch x heads x query rows)");
  return static_cast<float*>(
      const_cast<void*>(static_cast<const void*>(a.data())));
}

// An int8 K or V (values, int8 [B, H, n, d]) and its scales (float32
// [B, H, n, 1]) as the library's Int8KV; `name` is "key" or "value". The
// shapes are checked by the library (std::invalid_argument naming both).
template <class A>
Int8KV int8_kv(const char* name, const A& values, const A& scales) {
  const std::string v = name, s = v + " scales";
  check_dtype(v.c_str(), values, nb::dtype<std::int8_t>(), "int8");
  check_dtype(s.c_str(), scales, nb::dtype<float>(), "float32");
  return Int8KV{view4<const std::int8_t>(v.c_str(), values),
                view4<const float>(s.c_str(), scales)};
}

}  // namespace softdot::python

#endif  // SOFTDOT_PYTHON_ATTENTION_VIEWS_H_
