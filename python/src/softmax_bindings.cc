// softdot Python bindings: the softmax family and the dot products.
//
// The Python layer (python/softdot/_softmax.py) has already moved the
// reduction axis last, checked dtypes and shapes, broadcast `where`, checked
// that `out` shares no memory with an input (exactly, with np.shares_memory,
// on the caller's arrays) and allocated the outputs; these functions check
// dtype, shapes and strides once more, release the GIL and hand the rows to
// the library: one softmax_rows call per run of evenly spaced rows, a call
// per row where the rows are not evenly spaced or where the runs' address
// ranges interleave (x[::2] into out[1::2] of one buffer), which the
// library's range check would refuse. An axis that is not contiguous (axis 0
// of a row-major matrix) goes through softmax_strided: blocks of rows
// transposed into a contiguous scratch matrix, computed there, transposed
// back. Every error names the Python function (python_errors.h).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif
#if defined(__SSE2__)
#include <emmintrin.h>
#include <xmmintrin.h>
#endif

#include "arrays.h"
#include "bindings.h"
#include "python_errors.h"
#include "softdot/dot.h"
#include "softdot/softmax.h"

namespace softdot::python {
namespace {

template <class T, class A>
bool has_dtype(const A& a) {
  return a.dtype() == nb::dtype<T>();
}

// Checks that `a` has x's dtype (T), `ndim` axes and a contiguous last axis.
template <class T, class A>
void check_array(const char* name, const A& a, std::size_t ndim) {
  if (!has_dtype<T>(a))
    fail(std::string(name) + " has a different dtype from x");
  if (a.ndim() != ndim)
    fail(std::string(name) + " has " + std::to_string(a.ndim()) +
         " axes; expected " + std::to_string(ndim));
  if (ndim > 0 && a.shape(ndim - 1) > 1 && a.stride(ndim - 1) != 1)
    fail(std::string(name) + "'s last axis is not contiguous");
}

template <class A, class B>
void check_same_shape(const char* a_name, const A& a, const char* b_name,
                      const B& b, std::size_t axes) {
  bool same = a.ndim() >= axes && b.ndim() >= axes;
  for (std::size_t i = 0; same && i < axes; ++i)
    same = a.shape(i) == b.shape(i);
  if (!same)
    fail(std::string(b_name) + " has shape " + shape_of(b) + " but " + a_name +
         " has shape " + shape_of(a));
}

std::size_t row_length(const In& x) {
  if (x.ndim() == 0) fail("x is 0-d; a softmax needs at least one axis");
  const std::size_t n = x.shape(x.ndim() - 1);
  if (n == 0) fail("x has shape " + shape_of(x) + ": the rows are empty");
  return n;
}

// Calls f(float{}) or f(double{}) by a's dtype; TypeError for any other.
template <class F>
decltype(auto) by_dtype(const char* name, const In& a, F&& f) {
  if (has_dtype<float>(a)) return f(float{});
  if (has_dtype<double>(a)) return f(double{});
  throw nb::type_error(
      (std::string(name) + " must be float32 or float64").c_str());
}

// log_softmax_rows (log) or softmax_rows of x into y.
template <class T>
void matrix_softmax(bool log, MatrixView<const T> x, MatrixView<T> y,
                    const SoftmaxOptions& o) {
  if (log)
    log_softmax_rows(x, y, o);
  else
    softmax_rows(x, y, o);
}

SoftmaxOptions options_of(double temperature, bool fast) {
  SoftmaxOptions o;
  o.temperature = temperature;
  o.precision = fast ? Precision::kFast : Precision::kFaithful;
  return o;
}

// The walk over the rows of x (its outer axes) with `ops` (x first), and
// `where` appended after checking it has x's shape, bool dtype and a
// contiguous last axis.
Walk row_walk(const In& x, std::vector<Operand> ops,
              const std::optional<In>& where) {
  const std::size_t nd = x.ndim();
  if (where) {
    check_array<bool>("where", *where, nd);
    check_same_shape("x", x, "where", *where, nd);
    ops.push_back(operand_of(*where, nd - 1));
  }
  std::vector<std::int64_t> outer(nd - 1);
  for (std::size_t i = 0; i + 1 < nd; ++i) outer[i] = x.shape(i);
  return Walk(std::move(outer), std::move(ops));
}

// ---- softmax, log_softmax --------------------------------------------------

template <class T>
void softmax_rows_t(const In& x, const Out& y, const std::optional<In>& where,
                    bool log, SoftmaxOptions opt) {
  const std::size_t nd = x.ndim(), n = row_length(x);
  check_array<T>("out", y, nd);
  check_same_shape("x", x, "out", y, nd);
  check_array<T>("x", x, nd);
  const Walk walk =
      row_walk(x, {operand_of(x, nd - 1), operand_of(y, nd - 1)}, where);

  nb::gil_scoped_release release;
  const auto n64 = static_cast<std::int64_t>(n);
  walk.for_each_run([&](const std::vector<char*>& p, std::int64_t run,
                        const std::vector<std::int64_t>& step) {
    auto* xs = reinterpret_cast<const T*>(p[0]);
    auto* ys = reinterpret_cast<T*>(p[1]);
    const bool* ms = where ? reinterpret_cast<const bool*>(p[2]) : nullptr;
    // The byte ranges of the run in x and in y: one call when they coincide
    // (in place) or are disjoint.
    const auto range = [&](int k) {
      const auto lo = reinterpret_cast<std::uintptr_t>(p[k]);
      return std::pair<std::uintptr_t, std::uintptr_t>(
          lo, lo + static_cast<std::uintptr_t>(
                       ((run - 1) * step[k] + n64) *
                       static_cast<std::int64_t>(sizeof(T))));
    };
    bool apart = run == 1 || (p[0] == p[1] && step[0] == step[1]);
    if (!apart && step[0] > 0 && step[1] > 0) {
      const auto [x0, x1] = range(0);
      const auto [y0, y1] = range(1);
      apart = x1 <= y0 || y1 <= x0;
    }
    const bool rows_ok =
        run == 1 || (step[0] >= n64 && step[1] >= n64 && apart);
    const bool mask_ok = !ms || run == 1 || step[2] == 0 || step[2] == n64;
    if (rows_ok && mask_ok) {
      const auto r = static_cast<std::size_t>(run);
      const std::size_t sx = run == 1 ? n : static_cast<std::size_t>(step[0]);
      const std::size_t sy = run == 1 ? n : static_cast<std::size_t>(step[1]);
      SoftmaxOptions o = opt;
      if (ms)
        o.mask =
            std::span<const bool>(ms, (run == 1 || step[2] == 0) ? n : r * n);
      matrix_softmax(log, MatrixView<const T>(xs, r, n, sx),
                     MatrixView<T>(ys, r, n, sy), o);
      return;
    }
    for (std::int64_t i = 0; i < run; ++i) {
      SoftmaxOptions o = opt;
      if (ms) o.mask = std::span<const bool>(ms + i * step[2], n);
      std::span<const T> xr(xs + i * step[0], n);
      std::span<T> yr(ys + i * step[1], n);
      if (log)
        log_softmax(xr, yr, o);
      else
        softmax(xr, yr, o);
    }
  });
}

// ---- softmax, log_softmax along a strided axis -----------------------------
//
// x, out and where have the softmax axis last (the Python layer moved it
// there as a view) with any strides, the last one included: for axis 0 of a
// row-major [R, C] matrix the rows are C apart inside one row and adjacent
// to each other. Read in place, each element of such a row costs a cache
// line. Instead, blocks of rows are transposed into a contiguous scratch
// matrix in kTile x kTile tiles (each tile reads kTile adjacent elements of
// kTile rows), computed there in place by softmax_rows (the same row
// kernels, so the same bits as a contiguous copy of the rows), and
// transposed back into out the same way.

constexpr std::size_t kTile = 64;
// Scratch rows per block: about kScratchElements elements (in L2), and at
// least kTile rows so that the tiles read whole cache lines.
constexpr std::size_t kScratchElements = std::size_t{1} << 16;
// Calls of at least this many elements split their blocks across OpenMP
// threads (the library's threshold for softmax_rows).
constexpr std::size_t kParallelElements = std::size_t{1} << 18;

// Row stride of the scratch matrix for rows of n elements of `size` bytes:
// an odd number of 64-byte lines, so that the rows of a tile fall in
// different cache sets (with a stride of a power of two, such as 512
// floats, the 64 rows of a tile would share two sets of L1 and evict each
// other), and each row starts on a line.
inline std::size_t scratch_stride(std::size_t n, std::size_t size) {
  const std::size_t per_line = 64 / size;
  std::size_t lines = (n + per_line - 1) / per_line;
  if (lines % 2 == 0) ++lines;
  return lines * per_line;
}

// out[j os + i] = in[i is + j] for i < rows, j < cols: one tile, by 4 x 4
// (float) or 2 x 2 (double) register transposes where SSE2 is there (every
// x86-64), element by element at the edges and elsewhere.
template <class T>
void transpose_tile(const T* in, std::int64_t is, T* out, std::int64_t os,
                    std::size_t rows, std::size_t cols) {
  const auto at = [](std::size_t i, std::int64_t stride) {
    return static_cast<std::int64_t>(i) * stride;
  };
  std::size_t i = 0;
#if defined(__SSE2__)
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    constexpr std::size_t kV = 16 / sizeof(T);
    for (; i + kV <= rows; i += kV) {
      std::size_t j = 0;
      for (; j + kV <= cols; j += kV) {
        const T* p = in + at(i, is) + static_cast<std::int64_t>(j);
        T* q = out + at(j, os) + static_cast<std::int64_t>(i);
        if constexpr (std::is_same_v<T, float>) {
          __m128 r0 = _mm_loadu_ps(p), r1 = _mm_loadu_ps(p + is);
          __m128 r2 = _mm_loadu_ps(p + 2 * is), r3 = _mm_loadu_ps(p + 3 * is);
          _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
          _mm_storeu_ps(q, r0);
          _mm_storeu_ps(q + os, r1);
          _mm_storeu_ps(q + 2 * os, r2);
          _mm_storeu_ps(q + 3 * os, r3);
        } else {
          const __m128d r0 = _mm_loadu_pd(p), r1 = _mm_loadu_pd(p + is);
          _mm_storeu_pd(q, _mm_unpacklo_pd(r0, r1));
          _mm_storeu_pd(q + os, _mm_unpackhi_pd(r0, r1));
        }
      }
      for (; j < cols; ++j)
        for (std::size_t ii = i; ii < i + kV; ++ii)
          out[at(j, os) + static_cast<std::int64_t>(ii)] =
              in[at(ii, is) + static_cast<std::int64_t>(j)];
    }
  }
#endif
  for (; i < rows; ++i)
    for (std::size_t j = 0; j < cols; ++j)
      out[at(j, os) + static_cast<std::int64_t>(i)] =
          in[at(i, is) + static_cast<std::int64_t>(j)];
}

// dst[b ld + k] = src[b s + k sk] for b < rows, k < n, in kTile x kTile
// tiles: transposes where the rows are adjacent in src (s == 1).
template <class T>
void gather_rows(const T* src, std::int64_t s, std::int64_t sk,
                 std::size_t rows, std::size_t n, T* dst, std::size_t ld) {
  for (std::size_t b0 = 0; b0 < rows; b0 += kTile) {
    const std::size_t b1 = std::min(rows, b0 + kTile);
    for (std::size_t k0 = 0; k0 < n; k0 += kTile) {
      const std::size_t k1 = std::min(n, k0 + kTile);
      const T* from = src + static_cast<std::int64_t>(k0) * sk;
      T* to = dst + b0 * ld + k0;
      if (s == 1) {
        transpose_tile(from + b0, sk, to, static_cast<std::int64_t>(ld),
                       k1 - k0, b1 - b0);
        continue;
      }
      for (std::size_t k = k0; k < k1; ++k) {
        const T* col = src + static_cast<std::int64_t>(k) * sk;
        for (std::size_t b = b0; b < b1; ++b)
          dst[b * ld + k] = col[static_cast<std::int64_t>(b) * s];
      }
    }
  }
}

// dst[b s + k sk] = src[b ld + k] for b < rows, k < n, as gather_rows.
template <class T>
void scatter_rows(const T* src, std::size_t ld, std::size_t rows, std::size_t n,
                  T* dst, std::int64_t s, std::int64_t sk) {
  for (std::size_t b0 = 0; b0 < rows; b0 += kTile) {
    const std::size_t b1 = std::min(rows, b0 + kTile);
    for (std::size_t k0 = 0; k0 < n; k0 += kTile) {
      const std::size_t k1 = std::min(n, k0 + kTile);
      if (s == 1) {
        transpose_tile(src + b0 * ld + k0, static_cast<std::int64_t>(ld),
                       dst + static_cast<std::int64_t>(k0) * sk +
                           static_cast<std::int64_t>(b0),
                       sk, b1 - b0, k1 - k0);
        continue;
      }
      for (std::size_t k = k0; k < k1; ++k) {
        T* col = dst + static_cast<std::int64_t>(k) * sk;
        for (std::size_t b = b0; b < b1; ++b)
          col[static_cast<std::int64_t>(b) * s] = src[b * ld + k];
      }
    }
  }
}

// A buffer of `count` T aligned to a cache line.
template <class T>
struct LineBuffer {
  std::unique_ptr<unsigned char[]> raw;
  T* data = nullptr;
  explicit LineBuffer(std::size_t count)
      : raw(new unsigned char[count * sizeof(T) + 64]) {
    const auto p = reinterpret_cast<std::uintptr_t>(raw.get());
    data = reinterpret_cast<T*>((p + 63) / 64 * 64);
  }
};

#if defined(_OPENMP)
int max_threads() { return omp_get_max_threads(); }
std::size_t thread_index() {
  return static_cast<std::size_t>(omp_get_thread_num());
}
#else
int max_threads() { return 1; }
std::size_t thread_index() { return 0; }
#endif

template <class T>
void softmax_strided_t(const In& x, const Out& y,
                       const std::optional<In>& where, bool log,
                       SoftmaxOptions opt) {
  const std::size_t nd = x.ndim(), n = row_length(x);
  if (!has_dtype<T>(y) || y.ndim() != nd)
    fail("out must have x's dtype and " + std::to_string(nd) + " axes");
  check_same_shape("x", x, "out", y, nd);
  std::vector<Operand> ops{operand_of(x, nd - 1), operand_of(y, nd - 1)};
  if (where) {
    if (!has_dtype<bool>(*where) || where->ndim() != nd)
      fail("where must be boolean with " + std::to_string(nd) + " axes");
    check_same_shape("x", x, "where", *where, nd);
    ops.push_back(operand_of(*where, nd - 1));
  }
  std::vector<std::int64_t> outer(nd - 1);
  for (std::size_t i = 0; i + 1 < nd; ++i) outer[i] = x.shape(i);
  const Walk walk(std::move(outer), std::move(ops));
  const std::int64_t kx = x.stride(nd - 1), ky = y.stride(nd - 1);
  const std::int64_t km = where ? where->stride(nd - 1) : 0;
  const auto rows = static_cast<std::size_t>(walk.rows());
  if (rows == 0) return;
  const std::size_t block =
      std::min(rows, std::max(kTile, kScratchElements / n));
  const std::size_t ld = scratch_stride(n, sizeof(T));
  const int threads = rows * n >= kParallelElements ? max_threads() : 1;
  // One scratch matrix (and mask) per thread, allocated here, outside the
  // parallel loop.
  std::vector<LineBuffer<T>> bufs;
  std::vector<std::unique_ptr<bool[]>> masks;
  for (int t = 0; t < threads; ++t) {
    bufs.emplace_back(block * ld);
    masks.emplace_back(where ? new bool[block * n] : nullptr);
  }

  nb::gil_scoped_release release;
  std::exception_ptr error;
  walk.for_each_run([&](const std::vector<char*>& p, std::int64_t run,
                        const std::vector<std::int64_t>& step) {
    const auto* xs = reinterpret_cast<const T*>(p[0]);
    auto* ys = reinterpret_cast<T*>(p[1]);
    const bool* ms = where ? reinterpret_cast<const bool*>(p[2]) : nullptr;
    const auto b64 = static_cast<std::int64_t>(block);
    const std::int64_t blocks = (run + b64 - 1) / b64;
    // Blocks are independent (each thread its own scratch), so the bits do
    // not depend on the thread count. No exception may leave an OpenMP
    // loop's body: the first is kept and rethrown after the loop.
#pragma omp parallel for num_threads(threads) if (threads > 1 && blocks > 1) \
    schedule(static)
    for (std::int64_t bi = 0; bi < blocks; ++bi) {
      try {
        const std::size_t t = thread_index();
        T* scratch = bufs[t].data;
        bool* flags = masks[t].get();
        const std::int64_t i0 = bi * b64;
        const auto r = static_cast<std::size_t>(std::min(b64, run - i0));
        gather_rows(xs + i0 * step[0], step[0], kx, r, n, scratch, ld);
        SoftmaxOptions o = opt;
        if (ms) {
          gather_rows(ms + i0 * step[2], step[2], km, r, n, flags, n);
          o.mask = std::span<const bool>(flags, r * n);
        }
        matrix_softmax(log, MatrixView<const T>(scratch, r, n, ld),
                       MatrixView<T>(scratch, r, n, ld), o);
        scatter_rows(static_cast<const T*>(scratch), ld, r, n,
                     ys + i0 * step[1], step[1], ky);
      } catch (...) {
#pragma omp critical(softdot_strided_error)
        if (!error) error = std::current_exception();
      }
    }
  });
  if (error) std::rethrow_exception(error);
}

// softmax or log_softmax (log) of rows with a contiguous last axis
// (softmax_rows_t) or along a strided axis (Strided: softmax_strided_t), by
// x's dtype; messages name the Python function.
template <bool Strided>
void softmax_py(const In& x, const Out& out, const std::optional<In>& where,
                bool log, double temperature, bool fast) {
  const SoftmaxOptions opt = options_of(temperature, fast);
  as_python(log ? "log_softmax" : "softmax", [&] {
    by_dtype("x", x, [&](auto t) {
      using T = decltype(t);
      if constexpr (Strided) {
        softmax_strided_t<T>(x, out, where, log, opt);
      } else {
        softmax_rows_t<T>(x, out, where, log, opt);
      }
    });
  });
}

// ---- logsumexp
// ---------------------------------------------------------------

template <class T>
void logsumexp_t(const In& x, const Out& out, const std::optional<In>& where,
                 double temperature) {
  const std::size_t nd = x.ndim(), n = row_length(x);
  check_array<T>("x", x, nd);
  if (!has_dtype<T>(out) || out.ndim() != nd - 1)
    fail("out must have x's dtype and " + std::to_string(nd - 1) + " axes");
  check_same_shape("x", x, "out", out, nd - 1);
  const Walk walk =
      row_walk(x, {operand_of(x, nd - 1), operand_of(out, nd - 1)}, where);
  const SoftmaxOptions opt = options_of(temperature, false);

  nb::gil_scoped_release release;
  walk.for_each_run([&](const std::vector<char*>& p, std::int64_t run,
                        const std::vector<std::int64_t>& step) {
    auto* xs = reinterpret_cast<const T*>(p[0]);
    auto* os = reinterpret_cast<T*>(p[1]);
    const bool* ms = where ? reinterpret_cast<const bool*>(p[2]) : nullptr;
    for (std::int64_t i = 0; i < run; ++i) {
      SoftmaxOptions o = opt;
      if (ms) o.mask = std::span<const bool>(ms + i * step[2], n);
      os[i * step[1]] = logsumexp(std::span<const T>(xs + i * step[0], n), o);
    }
  });
}

void logsumexp_py(const In& x, const Out& out, const std::optional<In>& where,
                  double temperature) {
  as_python("logsumexp", [&] {
    by_dtype("x", x, [&](auto t) {
      logsumexp_t<decltype(t)>(x, out, where, temperature);
    });
  });
}

// ---- softmax_backward -------------------------------------------------------

template <class T>
void backward_t(const In& y, const In& dy, const Out& dx) {
  const std::size_t nd = y.ndim();
  if (nd == 0) fail("y is 0-d; softmax_backward needs at least one axis");
  const std::size_t n = y.shape(nd - 1);
  if (n == 0) fail("y has shape " + shape_of(y) + ": the rows are empty");
  check_array<T>("y", y, nd);
  check_array<T>("dy", dy, nd);
  check_array<T>("out", dx, nd);
  check_same_shape("y", y, "dy", dy, nd);
  check_same_shape("y", y, "out", dx, nd);
  const Walk walk = row_walk(
      y,
      {operand_of(y, nd - 1), operand_of(dy, nd - 1), operand_of(dx, nd - 1)},
      std::nullopt);
  nb::gil_scoped_release release;
  walk.for_each_run([&](const std::vector<char*>& p, std::int64_t run,
                        const std::vector<std::int64_t>& step) {
    for (std::int64_t i = 0; i < run; ++i)
      softmax_backward(
          std::span<const T>(reinterpret_cast<const T*>(p[0]) + i * step[0], n),
          std::span<const T>(reinterpret_cast<const T*>(p[1]) + i * step[1], n),
          std::span<T>(reinterpret_cast<T*>(p[2]) + i * step[2], n));
  });
}

void backward_py(const In& y, const In& dy, const Out& dx) {
  as_python("softmax_backward", [&] {
    by_dtype("y", y, [&](auto t) { backward_t<decltype(t)>(y, dy, dx); });
  });
}

// ---- online softmax (chunk states)
// --------------------------------------------

using StateTuple = std::tuple<double, double, double>;  // max, sum, sum_lo

template <class T>
BasicSoftmaxState<T> state_of(const StateTuple& s) {
  BasicSoftmaxState<T> r;
  r.max = static_cast<T>(std::get<0>(s));
  r.sum = std::get<1>(s);
  r.sum_lo = std::get<2>(s);
  return r;
}
template <class T>
StateTuple tuple_of(const BasicSoftmaxState<T>& s) {
  return {static_cast<double>(s.max), s.sum, s.sum_lo};
}

template <class T>
SoftmaxOptions chunk_options(const In& chunk, const std::optional<In>& where,
                             double temperature) {
  check_array<T>("chunk", chunk, 1);
  SoftmaxOptions o = options_of(temperature, false);
  if (where) {
    check_array<bool>("where", *where, 1);
    check_same_shape("chunk", chunk, "where", *where, 1);
    o.mask = std::span<const bool>(static_cast<const bool*>(where->data()),
                                   where->shape(0));
  }
  return o;
}

StateTuple state_py(const In& chunk, const std::optional<In>& where,
                    double temperature) {
  return as_python("softmax_state", [&] {
    if (chunk.ndim() != 1)
      fail("chunk has shape " + shape_of(chunk) + "; expected a 1-d array");
    return by_dtype("chunk", chunk, [&](auto t) {
      using T = decltype(t);
      const SoftmaxOptions o = chunk_options<T>(chunk, where, temperature);
      std::span<const T> c(static_cast<const T*>(chunk.data()), chunk.shape(0));
      nb::gil_scoped_release release;
      return tuple_of(softmax_state(c, o));
    });
  });
}

StateTuple merge_py(bool is_double, const StateTuple& a, const StateTuple& b) {
  return as_python("SoftmaxState.merge", [&] {
    nb::gil_scoped_release release;
    if (is_double)
      return tuple_of(merge(state_of<double>(a), state_of<double>(b)));
    return tuple_of(merge(state_of<float>(a), state_of<float>(b)));
  });
}

double state_lse_py(bool is_double, const StateTuple& s) {
  return as_python("SoftmaxState.logsumexp", [&] {
    nb::gil_scoped_release release;
    if (is_double) return logsumexp(state_of<double>(s));
    return static_cast<double>(logsumexp(state_of<float>(s)));
  });
}

template <class T>
void apply_t(const In& chunk, const StateTuple& total, const Out& out,
             const std::optional<In>& where, double temperature) {
  const SoftmaxOptions o = chunk_options<T>(chunk, where, temperature);
  check_array<T>("out", out, 1);
  check_same_shape("chunk", chunk, "out", out, 1);
  std::span<const T> c(static_cast<const T*>(chunk.data()), chunk.shape(0));
  std::span<T> y(static_cast<T*>(out.data()), out.shape(0));
  nb::gil_scoped_release release;
  softmax_apply(c, state_of<T>(total), y, o);
}

void apply_py(const In& chunk, const StateTuple& total, const Out& out,
              const std::optional<In>& where, double temperature) {
  as_python("softmax_apply", [&] {
    if (chunk.ndim() != 1)
      fail("chunk has shape " + shape_of(chunk) + "; expected a 1-d array");
    by_dtype("chunk", chunk, [&](auto t) {
      apply_t<decltype(t)>(chunk, total, out, where, temperature);
    });
  });
}

// ---- dot, dots
// ----------------------------------------------------------------

template <class T>
double dot_t(const In& x, const In& y, bool accurate) {
  check_array<T>("y", y, 1);
  std::span<const T> a(static_cast<const T*>(x.data()), x.shape(0));
  std::span<const T> b(static_cast<const T*>(y.data()), y.shape(0));
  if (a.size() != b.size())
    fail("x has shape " + shape_of(x) + " but y has shape " + shape_of(y));
  nb::gil_scoped_release release;
  return accurate ? dot_accurate(a, b) : dot(a, b);
}

double dot_py(const In& x, const In& y, bool accurate) {
  return as_python("dot", [&] {
    if (x.ndim() != 1)
      fail("x has shape " + shape_of(x) + "; expected a 1-d array");
    if (x.shape(0) > 1 && x.stride(0) != 1) fail("x is not contiguous");
    return by_dtype("x", x,
                    [&](auto t) { return dot_t<decltype(t)>(x, y, accurate); });
  });
}

template <class T>
void dots_t(const In& q, const In& keys, const Out& out) {
  check_array<T>("query", q, 1);
  check_array<T>("keys", keys, 2);
  check_array<T>("out", out, 1);
  const std::size_t n = keys.shape(0), d = keys.shape(1);
  if (q.shape(0) != d)
    fail("keys has shape " + shape_of(keys) + " but query has shape " +
         shape_of(q) + " (keys.shape[1] must equal len(query))");
  if (out.shape(0) != n)
    fail("out has shape " + shape_of(out) + " but keys has shape " +
         shape_of(keys));
  if (n > 1 && keys.stride(0) < static_cast<std::int64_t>(d))
    fail("keys' rows overlap or run backwards (stride " +
         std::to_string(keys.stride(0)) + " elements)");
  std::span<const T> qs(static_cast<const T*>(q.data()), d);
  MatrixView<const T> kv(static_cast<const T*>(keys.data()), n, d,
                         n > 1 ? static_cast<std::size_t>(keys.stride(0)) : d);
  std::span<T> s(static_cast<T*>(out.data()), n);
  nb::gil_scoped_release release;
  dots(qs, kv, s);
}

void dots_py(const In& q, const In& keys, const Out& out) {
  as_python("dots", [&] {
    by_dtype("query", q, [&](auto t) { dots_t<decltype(t)>(q, keys, out); });
  });
}

}  // namespace

void bind_softmax(nb::module_& m) {
  using namespace nb::literals;
  m.def("softmax_rows", &softmax_py<false>, "x"_a, "out"_a, "where"_a.none(),
        "log"_a, "temperature"_a, "fast"_a,
        "Softmax (log=False) or log-softmax of every row (last axis) of x into "
        "out.");
  m.def("softmax_strided", &softmax_py<true>, "x"_a, "out"_a, "where"_a.none(),
        "log"_a, "temperature"_a, "fast"_a,
        "As softmax_rows, for rows (last axis) with any stride: blocks of rows "
        "transposed into a contiguous scratch matrix and back.");
  m.def("logsumexp_rows", &logsumexp_py, "x"_a, "out"_a, "where"_a.none(),
        "temperature"_a, "logsumexp of every row (last axis) of x into out.");
  m.def("softmax_backward_rows", &backward_py, "y"_a, "dy"_a, "out"_a,
        "Softmax gradient of every row.");
  m.def("state", &state_py, "chunk"_a, "where"_a.none(), "temperature"_a,
        "(max, sum, sum_lo) of a 1-d chunk.");
  m.def("merge", &merge_py, "is_double"_a, "a"_a, "b"_a, "Merges two states.");
  m.def("state_logsumexp", &state_lse_py, "is_double"_a, "state"_a,
        "logsumexp of a state.");
  m.def("apply", &apply_py, "chunk"_a, "total"_a, "out"_a, "where"_a.none(),
        "temperature"_a, "Weights of a chunk given the row's total state.");
  m.def("dot", &dot_py, "x"_a, "y"_a, "accurate"_a,
        "Dot product of two 1-d arrays.");
  m.def("dots", &dots_py, "query"_a, "keys"_a, "out"_a,
        "Scores of one query against the rows of keys.");
}

}  // namespace softdot::python
