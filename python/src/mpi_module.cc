// softdot Python bindings over MPI: the _softdot_mpi extension module, built
// only when CMake finds MPI (softdot::mpi). softdot.distributed hands over an
// mpi4py communicator as its Fortran handle (comm.py2f()), turned back into
// an MPI_Comm with MPI_Comm_f2c, so mpi4py's C API is not needed to build.
// The Python layer has prepared the arrays as for scaled_dot_product_attention
// (4-d views, 16-bit K/V as their bits with kv_format saying which).
#include <mpi.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <variant>

#include "arrays.h"
#include "attention_views.h"
#include "python_errors.h"
#include "request_views.h"
#include "softdot/attention.h"
#include "softdot/attention_request.h"
#include "softdot/cross_entropy.h"
#include "softdot/matrix.h"
#include "softdot/mpi.h"

namespace softdot::python {
namespace {

MPI_Comm comm_of(std::int64_t handle) {
  int init = 0, done = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&done);
  if (!init || done)
    throw std::runtime_error(
        "MPI is not initialised (import mpi4py.MPI first) or already "
        "finalised");
  const MPI_Comm c = MPI_Comm_f2c(static_cast<MPI_Fint>(handle));
  if (c == MPI_COMM_NULL) fail("comm is MPI_COMM_NULL");
  return c;
}

mpi::Layout layout_of(bool zigzag) {
  return zigzag ? mpi::Layout::zigzag : mpi::Layout::contiguous;
}

// ring_attention on the K/V source and options dicts of every attention
// entry point (request_views.h): the options' key range and positions keep
// their defaults (the ring sets them per step).
void ring_py(std::int64_t comm, const In& q, const nb::dict& kv, const Out& out,
             const std::optional<Out>& lse, const nb::dict& options,
             std::size_t seq_len, bool zigzag, bool deterministic) {
  const MPI_Comm c = comm_of(comm);
  check_dtype("query", q, nb::dtype<float>(), "float32");
  check_dtype("out", out, nb::dtype<float>(), "float32");
  const auto qv = view4<const float>("query", q);
  const auto ov = view4<float>("out", out);
  const KVSource source = kv_source_of(kv);
  if (source.paged || !source.has_v) {
    fail("ring_attention takes contiguous keys and values");
  }
  mpi::RingOptions o;
  o.attention = options_of(options);
  o.seq_len = seq_len;
  o.layout = layout_of(zigzag);
  o.deterministic = deterministic;
  float* l = lse ? lse_data("lse", *lse, qv) : nullptr;
  if (source.k.format() != source.v.format()) {
    fail(std::string("ring_attention: key is ") +
         kv_format_name(source.k.format()) + " but value is " +
         kv_format_name(source.v.format()));
  }
  std::visit(
      [&](const auto& k) {
        using K = std::decay_t<decltype(k)>;
        if constexpr (std::is_same_v<K, Float8E4M3KV> ||
                      std::is_same_v<K, Float8E5M2KV>) {
          // The ring has no fp8 form (its shards travel as float32, 16-bit
          // or int8): refused rather than converted.
          fail(std::string("ring_attention takes float32, float16, bfloat16 "
                           "or int8 keys and values, not ") +
               kv_format_name(source.k.format()));
        } else {
          const K& v = std::get<K>(source.v.variant());
          as_python("ring_attention", [&] {
            nb::gil_scoped_release release;
            mpi::ring_attention(c, qv, k, v, ov, o, l);
          });
        }
      },
      source.k.variant());
}

// ring_attention_backward on 4-d float32 views prepared by
// softdot.distributed (the options dict as ring_py's; dsinks and dlse
// optional).
void ring_backward_py(std::int64_t comm, const In& q, const In& k, const In& v,
                      const In& out, const In& lse, const In& dout,
                      const Out& dq, const Out& dk, const Out& dv,
                      const std::optional<Out>& dsinks,
                      const std::optional<In>& dlse, const nb::dict& options,
                      std::size_t seq_len, bool zigzag, bool deterministic) {
  const MPI_Comm c = comm_of(comm);
  const char* names[] = {"query", "key", "value", "out", "grad_out"};
  const In* ins[] = {&q, &k, &v, &out, &dout};
  for (int i = 0; i < 5; ++i)
    check_dtype(names[i], *ins[i], nb::dtype<float>(), "float32");
  for (const Out* o : {&dq, &dk, &dv})
    check_dtype("a gradient", *o, nb::dtype<float>(), "float32");
  const auto qv = view4<const float>("query", q);
  mpi::RingOptions o;
  o.attention = options_of(options);
  o.seq_len = seq_len;
  o.layout = layout_of(zigzag);
  o.deterministic = deterministic;
  AttentionGradients g;
  g.dq = view4<float>("dq", dq);
  g.dk = view4<float>("dk", dk);
  g.dv = view4<float>("dv", dv);
  if (dsinks) {
    check_dtype("dsinks", *dsinks, nb::dtype<float>(), "float32");
    g.dsinks = std::span<float>(static_cast<float*>(dsinks->data()),
                                contiguous_size("dsinks", *dsinks));
  }
  const float* l = lse_data("lse", lse, qv);
  const float* dl = dlse ? lse_data("grad_lse", *dlse, qv) : nullptr;
  const auto kv = view4<const float>("key", k);
  const auto vv = view4<const float>("value", v);
  const auto ov = view4<const float>("out", out);
  const auto dov = view4<const float>("grad_out", dout);
  as_python("ring_attention_backward", [&] {
    nb::gil_scoped_release release;
    mpi::ring_attention_backward(c, qv, kv, vv, ov, l, dov, g, o, dl);
  });
}

// ---- vocabulary-parallel softmax family and cross-entropy -----------------

template <class F>
void by_float(const In& x, F&& f) {
  if (x.dtype() == nb::dtype<float>()) return f(float{});
  if (x.dtype() == nb::dtype<double>()) return f(double{});
  throw nb::type_error("x must be float32 or float64");
}

template <class T, class A>
void check_same(const char* name, const A& a, const In& x) {
  if (a.dtype() != nb::dtype<T>())
    throw nb::type_error((std::string(name) + " must have x's dtype").c_str());
  if (a.ndim() != x.ndim() || a.shape(0) != x.shape(0) ||
      (a.ndim() == 2 && a.shape(1) != x.shape(1)))
    fail(std::string(name) + " has shape " + shape_of(a) + " but x has " +
         shape_of(x));
}

// op 0: softmax, 1: log_softmax, of the rows of this rank's columns.
void vocab_rows_py(std::int64_t comm, const In& x, const Out& y,
                   std::size_t vocab_begin, int op, bool deterministic) {
  const MPI_Comm c = comm_of(comm);
  mpi::VocabOptions o;
  o.deterministic = deterministic;
  by_float(x, [&](auto t) {
    using T = decltype(t);
    check_same<T>("out", y, x);
    const auto xv = view2<const T>("x", x);
    const auto yv = view2<T>("out", y);
    nb::gil_scoped_release release;
    if (op == 0)
      mpi::softmax(c, xv, vocab_begin, yv, o);
    else
      mpi::log_softmax(c, xv, vocab_begin, yv, o);
  });
}

void vocab_lse_py(std::int64_t comm, const In& x, const Out& lse,
                  std::size_t vocab_begin, bool deterministic) {
  const MPI_Comm c = comm_of(comm);
  mpi::VocabOptions o;
  o.deterministic = deterministic;
  by_float(x, [&](auto t) {
    using T = decltype(t);
    const auto xv = view2<const T>("x", x);
    if (lse.dtype() != nb::dtype<T>() || lse.ndim() != 1 ||
        lse.shape(0) != xv.rows || (xv.rows > 1 && lse.stride(0) != 1))
      fail("lse must be a contiguous array of x's dtype, shape (" +
           std::to_string(xv.rows) + ",)");
    const std::span<T> l(static_cast<T*>(lse.data()), xv.rows);
    nb::gil_scoped_release release;
    mpi::logsumexp(c, xv, vocab_begin, l, o);
  });
}

double vocab_xent_py(std::int64_t comm, const In& logits,
                     std::size_t vocab_begin, const In& targets,
                     const std::optional<Out>& loss,
                     const std::optional<Out>& grad, std::int64_t ignore_index,
                     double label_smoothing, int reduction,
                     bool deterministic) {
  const MPI_Comm c = comm_of(comm);
  const CrossEntropyOptions o =
      xent_options(ignore_index, label_smoothing, reduction);
  mpi::VocabOptions vo;
  vo.deterministic = deterministic;
  double value = 0.0;
  by_float(logits, [&](auto t) {
    using T = decltype(t);
    const auto xv = view2<const T>("logits", logits);
    const std::size_t rows = xv.rows;
    const std::span<const std::int64_t> ts = targets_of(targets, rows);
    const std::span<T> ls = loss_of<T>(loss, rows);
    MatrixView<T> gv;
    if (grad) {
      if (grad->dtype() != nb::dtype<T>())
        throw nb::type_error("grad must have the logits' dtype");
      gv = view2<T>("grad", *grad);
    }
    nb::gil_scoped_release release;
    value = mpi::cross_entropy(c, xv, vocab_begin, ts, ls, gv, o, vo);
  });
  return value;
}

// The fused linear + cross-entropy with this rank's rows of the weight:
// hidden and weight float32, or bfloat16 as uint16 bits (the Python layer
// checked that both have the same dtype).
double vocab_linear_xent_py(std::int64_t comm, const In& hidden,
                            const In& weight, std::size_t vocab_begin,
                            const In& targets, const std::optional<Out>& loss,
                            const std::optional<Out>& grad_hidden,
                            const std::optional<Out>& grad_weight,
                            std::int64_t ignore_index, double label_smoothing,
                            int reduction, bool deterministic) {
  const MPI_Comm c = comm_of(comm);
  const CrossEntropyOptions o =
      xent_options(ignore_index, label_smoothing, reduction);
  mpi::VocabOptions vo;
  vo.deterministic = deterministic;
  const auto grad_of = [](const char* name, const std::optional<Out>& g) {
    if (!g) return MatrixView<float>{};
    if (g->dtype() != nb::dtype<float>())
      throw nb::type_error((std::string(name) + " must be float32").c_str());
    return view2<float>(name, *g);
  };
  const auto run = [&](auto t) {
    using T = decltype(t);
    const auto hv = view2<const T>("hidden", hidden);
    const auto wv = view2<const T>("weight", weight);
    const std::span<const std::int64_t> ts = targets_of(targets, hv.rows);
    const std::span<float> ls = loss_of<float>(loss, hv.rows);
    const MatrixView<float> ghv = grad_of("grad_hidden", grad_hidden);
    const MatrixView<float> gwv = grad_of("grad_weight", grad_weight);
    nb::gil_scoped_release release;
    return mpi::linear_cross_entropy(c, hv, wv, vocab_begin, ts, ls, ghv, gwv,
                                     o, vo);
  };
  if (hidden.dtype() != weight.dtype())
    throw nb::type_error("hidden and weight must have the same dtype");
  if (hidden.dtype() == nb::dtype<float>()) return run(float{});
  if (hidden.dtype() == nb::dtype<std::uint16_t>()) return run(BFloat16{});
  throw nb::type_error("hidden must be float32 or bfloat16 (as uint16)");
}

}  // namespace
}  // namespace softdot::python

NB_MODULE(_softdot_mpi, m) {
  using namespace nanobind::literals;
  using namespace softdot::python;
  m.doc() = "softdot over MPI (softdot::mpi); use softdot.distributed.";
  m.def("ring_attention", &ring_py, "comm"_a, "query"_a, "kv"_a, "out"_a,
        "lse"_a.none(), "options"_a, "seq_len"_a, "zigzag"_a, "deterministic"_a,
        "Ring attention over an MPI communicator (one attention request per "
        "rank).");
  m.def("ring_attention_backward", &ring_backward_py, "comm"_a, "query"_a,
        "key"_a, "value"_a, "out"_a, "lse"_a, "grad_out"_a, "dq"_a, "dk"_a,
        "dv"_a, "dsinks"_a.none(), "grad_lse"_a.none(), "options"_a,
        "seq_len"_a, "zigzag"_a, "deterministic"_a,
        "The backward of ring_attention over an MPI communicator.");
  m.def("vocab_rows", &vocab_rows_py, "comm"_a, "x"_a, "out"_a, "vocab_begin"_a,
        "op"_a, "deterministic"_a,
        "softmax (op 0) or log_softmax (op 1) of rows split by columns.");
  m.def("vocab_logsumexp", &vocab_lse_py, "comm"_a, "x"_a, "lse"_a,
        "vocab_begin"_a, "deterministic"_a,
        "logsumexp of rows split by columns.");
  m.def("vocab_cross_entropy", &vocab_xent_py, "comm"_a, "logits"_a,
        "vocab_begin"_a, "targets"_a, "loss"_a.none(), "grad"_a.none(),
        "ignore_index"_a, "label_smoothing"_a, "reduction"_a, "deterministic"_a,
        "Cross-entropy of rows split by columns; returns the reduced loss.");
  m.def("vocab_linear_cross_entropy", &vocab_linear_xent_py, "comm"_a,
        "hidden"_a, "weight"_a, "vocab_begin"_a, "targets"_a, "loss"_a.none(),
        "grad_hidden"_a.none(), "grad_weight"_a.none(), "ignore_index"_a,
        "label_smoothing"_a, "reduction"_a, "deterministic"_a,
        "Linear + cross-entropy with the weight's rows split across ranks; "
        "returns the reduced loss.");
}
