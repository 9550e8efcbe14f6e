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
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "arrays.h"
#include "attention_views.h"
#include "softdot/attention.h"
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

mpi::RingOptions ring_options(const std::optional<In>& mask,
                              const std::optional<In>& bias,
                              const std::optional<In>& sinks, double scale,
                              bool causal, std::ptrdiff_t window_left,
                              std::ptrdiff_t window_right, double softcap,
                              bool precise, std::size_t seq_len, bool zigzag,
                              bool deterministic) {
  mpi::RingOptions r;
  r.attention =
      make_options(mask, bias, sinks, scale, causal, window_left, window_right,
                   softcap, 0, static_cast<std::size_t>(-1));
  r.attention.precise = precise;
  r.seq_len = seq_len;
  r.layout = layout_of(zigzag);
  r.deterministic = deterministic;
  return r;
}

void ring_py(std::int64_t comm, const In& q, const In& k, const In& v,
             const Out& out, int kv_format, const std::optional<In>& mask,
             const std::optional<In>& bias, const std::optional<In>& sinks,
             const std::optional<Out>& lse, double scale, bool causal,
             std::ptrdiff_t window_left, std::ptrdiff_t window_right,
             double softcap, bool precise, std::size_t seq_len, bool zigzag,
             bool deterministic) {
  const MPI_Comm c = comm_of(comm);
  check_dtype("query", q, nb::dtype<float>(), "float32");
  check_dtype("out", out, nb::dtype<float>(), "float32");
  const auto qv = view4<const float>("query", q);
  const auto ov = view4<float>("out", out);
  const mpi::RingOptions o =
      ring_options(mask, bias, sinks, scale, causal, window_left, window_right,
                   softcap, precise, seq_len, zigzag, deterministic);
  float* l = lse ? lse_data("lse", *lse, qv) : nullptr;
  with_kv(kv_format, k, &v, [&](const auto& kv, const auto& vv) {
    nb::gil_scoped_release release;
    mpi::ring_attention(c, qv, kv, vv, ov, o, l);
  });
}

void ring_int8_py(std::int64_t comm, const In& q, const In& k, const In& ks,
                  const In& v, const In& vs, const Out& out,
                  const std::optional<In>& mask, const std::optional<In>& bias,
                  const std::optional<In>& sinks, const std::optional<Out>& lse,
                  double scale, bool causal, std::ptrdiff_t window_left,
                  std::ptrdiff_t window_right, double softcap, bool precise,
                  std::size_t seq_len, bool zigzag, bool deterministic) {
  const MPI_Comm c = comm_of(comm);
  check_dtype("query", q, nb::dtype<float>(), "float32");
  check_dtype("out", out, nb::dtype<float>(), "float32");
  const auto qv = view4<const float>("query", q);
  const auto ov = view4<float>("out", out);
  const Int8KV kk = int8_kv("key", k, ks);
  const Int8KV vk = int8_kv("value", v, vs);
  const mpi::RingOptions o =
      ring_options(mask, bias, sinks, scale, causal, window_left, window_right,
                   softcap, precise, seq_len, zigzag, deterministic);
  float* l = lse ? lse_data("lse", *lse, qv) : nullptr;
  nb::gil_scoped_release release;
  mpi::ring_attention(c, qv, kk, vk, ov, o, l);
}

// (rows per rank, chunk, the global positions of `rank`'s rows).
std::tuple<std::size_t, std::size_t, std::vector<std::size_t>> layout_py(
    std::size_t seq_len, int ranks, bool zigzag, bool deterministic, int rank) {
  const mpi::RingLayout L =
      mpi::ring_layout(seq_len, ranks, layout_of(zigzag), deterministic);
  if (rank < 0 || rank >= ranks)
    fail("rank " + std::to_string(rank) + " is not in [0, " +
         std::to_string(ranks) + ")");
  return {L.rows(), L.chunk, L.positions(rank)};
}

}  // namespace
}  // namespace softdot::python

NB_MODULE(_softdot_mpi, m) {
  using namespace nanobind::literals;
  using namespace softdot::python;
  m.doc() = "softdot over MPI (softdot::mpi); use softdot.distributed.";
  m.def("ring_attention", &ring_py, "comm"_a, "query"_a, "key"_a, "value"_a,
        "out"_a, "kv_format"_a, "mask"_a.none(), "bias"_a.none(),
        "sinks"_a.none(), "lse"_a.none(), "scale"_a, "causal"_a,
        "window_left"_a, "window_right"_a, "softcap"_a, "precise"_a,
        "seq_len"_a, "zigzag"_a, "deterministic"_a,
        "Ring attention over the communicator with Fortran handle comm.");
  m.def("ring_attention_int8", &ring_int8_py, "comm"_a, "query"_a, "key"_a,
        "key_scales"_a, "value"_a, "value_scales"_a, "out"_a, "mask"_a.none(),
        "bias"_a.none(), "sinks"_a.none(), "lse"_a.none(), "scale"_a,
        "causal"_a, "window_left"_a, "window_right"_a, "softcap"_a, "precise"_a,
        "seq_len"_a, "zigzag"_a, "deterministic"_a,
        "Ring attention with int8 K and V.");
  m.def("ring_layout", &layout_py, "seq_len"_a, "ranks"_a, "zigzag"_a,
        "deterministic"_a, "rank"_a,
        "(rows per rank, chunk, global positions of rank's rows).");
}
