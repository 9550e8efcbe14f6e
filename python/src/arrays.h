// softdot Python bindings: what the binding needs to know about an array
// (pointer, shape, strides in elements) and the walk over the rows of an
// n-d array whose last axis is the row. Nothing here computes a softmax: the
// rows go to the C++ library as MatrixViews (dense or strided) or spans.
#ifndef SOFTDOT_PYTHON_ARRAYS_H_
#define SOFTDOT_PYTHON_ARRAYS_H_

#include <nanobind/ndarray.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "softdot/cross_entropy.h"
#include "softdot/matrix.h"

namespace softdot::python {

namespace nb = nanobind;

// An array as the binding sees it: any framework (numpy through the buffer
// protocol or DLPack, torch through DLPack), on the CPU, any dtype. Inputs
// are read-only views; outputs need write access, which the caster checks.
using In = nb::ndarray<nb::ro, nb::device::cpu>;
using Out = nb::ndarray<nb::device::cpu>;

// Throws std::invalid_argument (Python ValueError) with `what`.
[[noreturn]] inline void fail(const std::string& what) {
  throw std::invalid_argument(what);
}

// "(2, 3, 4)", as numpy prints a shape.
template <class A>
std::string shape_of(const A& a) {
  std::string s = "(";
  for (std::size_t i = 0; i < a.ndim(); ++i) {
    if (i) s += ", ";
    s += std::to_string(a.shape(i));
  }
  if (a.ndim() == 1) s += ",";
  return s + ")";
}

// Any extent, for view2's expected shape.
inline constexpr std::size_t kAnyExtent = static_cast<std::size_t>(-1);

// A 2-d array as a MatrixView of T (its dtype checked by the caller): a
// contiguous last axis and rows that do not overlap (overlap: rows a
// read-only input may share, a stride of 0 broadcasting one row; never a
// negative stride), and, where rows or cols are given, that shape. A view
// with no row or no column spans nothing (its strides are not read). The
// one 2-d converter of the bindings.
template <class T, class A>
MatrixView<T> view2(const char* name, const A& a, std::size_t rows = kAnyExtent,
                    std::size_t cols = kAnyExtent, bool overlap = false) {
  if (a.ndim() != 2 || (rows != kAnyExtent && a.shape(0) != rows) ||
      (cols != kAnyExtent && a.shape(1) != cols)) {
    const auto dim = [](std::size_t n, const char* any) {
      return n == kAnyExtent ? std::string(any) : std::to_string(n);
    };
    fail(std::string(name) + " has shape " + shape_of(a) + "; expected (" +
         dim(rows, "rows") + ", " + dim(cols, "columns") + ")");
  }
  const std::size_t r = a.shape(0), c = a.shape(1);
  if (r > 0 && c > 1 && a.stride(1) != 1)
    fail(std::string(name) + "'s last axis is not contiguous");
  if (r > 1 && c > 0 && overlap && a.stride(0) < 0)
    fail(std::string(name) + " has a negative stride");
  if (r > 1 && c > 0 && !overlap && a.stride(0) < static_cast<std::int64_t>(c))
    fail(std::string(name) + "'s rows overlap (stride < columns)");
  using U = std::remove_const_t<T>;
  auto* p = reinterpret_cast<T*>(const_cast<U*>(
      static_cast<const U*>(static_cast<const void*>(a.data()))));
  return MatrixView<T>(
      p, r, c, r > 1 && c > 0 ? static_cast<std::size_t>(a.stride(0)) : c);
}

// One operand of a row walk: its base pointer (bytes) and the strides of the
// outer axes in elements. The row axis (the last one) is contiguous, or has
// no extent for per-row outputs such as logsumexp's.
struct Operand {
  char* data = nullptr;
  std::int64_t itemsize = 0;
  std::vector<std::int64_t> stride;  // per outer axis, in elements
};

template <class A>
Operand operand_of(const A& a, std::size_t outer_axes) {
  Operand op;
  op.data = reinterpret_cast<char*>(
      const_cast<void*>(static_cast<const void*>(a.data())));
  op.itemsize = static_cast<std::int64_t>(a.itemsize());
  for (std::size_t i = 0; i < outer_axes; ++i) op.stride.push_back(a.stride(i));
  return op;
}

// The outer axes of a row walk after merging the axes that every operand
// steps through evenly (axis i with i+1 when stride[i] == stride[i+1] *
// shape[i+1]) and dropping axes of extent 1, so a C-ordered array becomes a
// single run of rows and goes to the library in one call.
struct Walk {
  std::vector<std::int64_t> shape;  // outer extents, outermost first
  std::vector<Operand> ops;

  Walk(std::vector<std::int64_t> outer_shape, std::vector<Operand> operands)
      : ops(std::move(operands)) {
    std::vector<std::int64_t> s;
    std::vector<std::vector<std::int64_t>> st(ops.size());
    for (std::size_t a = 0; a < outer_shape.size(); ++a) {
      if (outer_shape[a] == 1) continue;
      bool merge = !s.empty();
      for (std::size_t k = 0; merge && k < ops.size(); ++k)
        merge = st[k].back() == ops[k].stride[a] * outer_shape[a];
      if (merge) {
        s.back() *= outer_shape[a];
        for (std::size_t k = 0; k < ops.size(); ++k)
          st[k].back() = ops[k].stride[a];
      } else {
        s.push_back(outer_shape[a]);
        for (std::size_t k = 0; k < ops.size(); ++k)
          st[k].push_back(ops[k].stride[a]);
      }
    }
    shape = std::move(s);
    for (std::size_t k = 0; k < ops.size(); ++k)
      ops[k].stride = std::move(st[k]);
  }

  std::int64_t rows() const {
    std::int64_t n = 1;
    for (std::int64_t e : shape) n *= e;
    return n;
  }

  // Calls f(ptrs, run, strides) for each run of rows along the innermost
  // outer axis: ptrs[k] is operand k's first row, strides[k] its row step
  // in elements. With no outer axis, one run of one row.
  template <class F>
  void for_each_run(F&& f) const {
    const std::size_t n_ops = ops.size();
    std::vector<char*> ptr(n_ops);
    std::vector<std::int64_t> step(n_ops, 0);
    if (rows() == 0) return;
    if (shape.empty()) {
      for (std::size_t k = 0; k < n_ops; ++k) ptr[k] = ops[k].data;
      f(ptr, std::int64_t{1}, step);
      return;
    }
    const std::size_t inner = shape.size() - 1;
    for (std::size_t k = 0; k < n_ops; ++k) step[k] = ops[k].stride[inner];
    std::vector<std::int64_t> idx(inner, 0);
    for (;;) {
      for (std::size_t k = 0; k < n_ops; ++k) {
        std::int64_t off = 0;
        for (std::size_t a = 0; a < inner; ++a)
          off += idx[a] * ops[k].stride[a];
        ptr[k] = ops[k].data + off * ops[k].itemsize;
      }
      f(ptr, shape[inner], step);
      std::size_t a = inner;
      for (;;) {
        if (a == 0) return;
        --a;
        if (++idx[a] < shape[a]) break;
        idx[a] = 0;
      }
    }
  }
};

// The int64 targets of a cross-entropy over `rows` rows (one contiguous 1-d
// array), as a span; ValueError otherwise.
inline std::span<const std::int64_t> targets_of(const In& targets,
                                                std::size_t rows) {
  if (targets.dtype() != nb::dtype<std::int64_t>() || targets.ndim() != 1 ||
      targets.shape(0) != rows || (rows > 1 && targets.stride(0) != 1))
    fail("targets must be a contiguous int64 array of shape (" +
         std::to_string(rows) + ",)");
  return {static_cast<const std::int64_t*>(targets.data()), rows};
}

// The optional per-row loss output of a cross-entropy (a contiguous 1-d
// array of T and `rows` entries), as a span (empty when absent); ValueError
// otherwise.
template <class T>
std::span<T> loss_of(const std::optional<Out>& loss, std::size_t rows) {
  if (!loss) return {};
  if (loss->dtype() != nb::dtype<T>() || loss->ndim() != 1 ||
      loss->shape(0) != rows || (rows > 1 && loss->stride(0) != 1))
    fail("loss must be a contiguous array of the logits' dtype, shape (" +
         std::to_string(rows) + ",)");
  return {static_cast<T*>(loss->data()), rows};
}

// A cross-entropy's options from the Python layer's checked values
// (reduction: 0 "none", 1 "sum", 2 "mean", as _cross_entropy.REDUCTIONS).
inline CrossEntropyOptions xent_options(std::int64_t ignore_index,
                                        double label_smoothing, int reduction) {
  CrossEntropyOptions o;
  o.ignore_index = ignore_index;
  o.label_smoothing = label_smoothing;
  o.reduction = reduction == 0   ? Reduction::kNone
                : reduction == 1 ? Reduction::kSum
                                 : Reduction::kMean;
  return o;
}

}  // namespace softdot::python

#endif  // SOFTDOT_PYTHON_ARRAYS_H_
