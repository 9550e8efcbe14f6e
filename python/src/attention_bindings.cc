// softdot Python bindings: attention, its merge and its explicit weights.
//
// The Python layer hands over 4-d arrays [B, H, L, E] (leading ones added,
// masks broadcast with stride-0 views, K and V of 16 bits as float16,
// bfloat16 or their uint16 bits with `kv_format` saying which); here they
// become TensorViews with the arrays' own strides, so nothing is copied.
// The Python layer has also checked, exactly (np.shares_memory on the
// caller's arrays), that `out` shares no memory with an input.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "arrays.h"
#include "attention_views.h"
#include "bindings.h"
#include "python_errors.h"
#include "request_views.h"
#include "softdot/attention.h"
#include "softdot/attention_request.h"
#include "softdot/kv_cache.h"
#include "softdot/ring_layout.h"

namespace softdot::python {
namespace {

// The bindings' own storage code for float64 arrays (beside KVFormat's
// codes in kv_formats): a float64 query, K and V run the double functions
// of attention_backward.h (plain loops, for gradient checks), which are not
// AttentionRequests; the Python layer still makes one attention_request.
constexpr int kFloat64 = 4;

// The query of a request: float32, or 16-bit (its bits, as uint16).
QueryTensor query_of(const In& q, int q_format) {
  switch (static_cast<KVFormat>(q_format)) {
    case KVFormat::kFloat32:
      check_dtype("query", q, nb::dtype<float>(), "float32");
      return view4<const float>("query", q);
    case KVFormat::kFloat16:
      return view4<const Float16>("query", q);
    case KVFormat::kBFloat16:
      return view4<const BFloat16>("query", q);
    default:
      fail("query format must be 0 (float32), 1 (float16) or 2 (bfloat16)");
  }
}

// The output of kind "output" (float32 or 16-bit bits), "weights" and
// "scores" (float32).
OutputTensor output_of(const std::optional<Out>& out, int out_format) {
  if (!out) fail("the request's kind needs out");
  switch (static_cast<KVFormat>(out_format)) {
    case KVFormat::kFloat32:
      check_dtype("out", *out, nb::dtype<float>(), "float32");
      return view4<float>("out", *out);
    case KVFormat::kFloat16:
      return view4<Float16>("out", *out);
    case KVFormat::kBFloat16:
      return view4<BFloat16>("out", *out);
    default:
      fail("out format must be 0 (float32), 1 (float16) or 2 (bfloat16)");
  }
}

// The arrays of a backward request in T (float or double): the backward
// dict {out, lse, dout, dlse, dq, dk, dv, dbias, dsinks} (AttentionBackwardIO,
// attention_request.h): out and dout [B, H, L, Ev] and the gradients 4-d
// views, lse and dlse flat [B H L] (dlse, dbias, dsinks None or absent:
// not given), all of T's dtype.
template <class T>
struct BackwardArrays {
  TensorView<const T> out, dout;
  const T* lse = nullptr;
  const T* dlse = nullptr;
  TensorView<T> dq, dk, dv, dbias;
  std::span<T> dsinks;
};

template <class T>
BackwardArrays<T> backward_arrays(const nb::dict& d, std::size_t rows) {
  check_keys(
      "backward", d,
      {"out", "lse", "dout", "dlse", "dq", "dk", "dv", "dbias", "dsinks"});
  const char* type = std::is_same_v<T, float> ? "float32" : "float64";
  auto in = [&](const char* n) {
    const In a = nb::cast<In>(d[n]);
    check_dtype(n, a, nb::dtype<T>(), type);
    return a;
  };
  auto out = [&](const char* n) {
    const Out a = nb::cast<Out>(d[n]);
    check_dtype(n, a, nb::dtype<T>(), type);
    return a;
  };
  auto flat = [&](const char* n) {
    const In a = in(n);
    if (contiguous_size(n, a) != rows)
      fail(std::string(n) +
           " must hold batch x heads x query rows values, C-contiguous");
    return static_cast<const T*>(a.data());
  };
  BackwardArrays<T> g;
  g.out = view4<const T>("out", in("out"));
  g.dout = view4<const T>("dout", in("dout"));
  g.lse = flat("lse");
  if (array_or_none(d, "dlse")) g.dlse = flat("dlse");
  g.dq = view4<T>("dq", out("dq"));
  g.dk = view4<T>("dk", out("dk"));
  g.dv = view4<T>("dv", out("dv"));
  if (array_or_none(d, "dbias")) g.dbias = view4<T>("dbias", out("dbias"));
  if (array_or_none(d, "dsinks")) {  // its length is the library's check
    const Out a = out("dsinks");
    g.dsinks =
        std::span<T>(static_cast<T*>(a.data()), contiguous_size("dsinks", a));
  }
  return g;
}

// The request of the Python layer's arguments (the arrays must outlive it):
// kind "output" (out and, when given, lse), "weights" or "scores" (out
// [B, H, L, S]), "partial" (into *partial) or "gradients" (the backward
// dict, backward_arrays).
AttentionRequest request_of(const std::string& name, const In& q, int q_format,
                            const nb::dict& kv, const std::string& kind,
                            const std::optional<Out>& out, int out_format,
                            const std::optional<Out>& lse,
                            const nb::dict& options,
                            const std::optional<nb::dict>& backward,
                            AttentionPartial* partial) {
  AttentionRequest r;
  r.name = name.c_str();
  r.q = query_of(q, q_format);
  r.kv = kv_source_of(kv);
  r.options = options_of(options);
  const TensorView<const float> shape = r.q.shape_view();
  if (kind == "output") {
    r.target =
        AttentionTarget::output(output_of(out, out_format),
                                lse ? lse_data("lse", *lse, shape) : nullptr);
  } else if (kind == "weights" || kind == "scores") {
    // Written as float32: the Python layer makes out float32 for them (the
    // library refuses a 16-bit query, with its message).
    const auto* f = output_of(out, out_format).f32();
    if (f == nullptr) fail(name + ": the weights and scores are float32");
    r.target = kind == "weights" ? AttentionTarget::weights(*f)
                                 : AttentionTarget::scores(*f);
  } else if (kind == "partial") {
    if (partial == nullptr) fail("kind 'partial' needs partial");
    r.target = AttentionTarget::partial_result(*partial);
  } else if (kind == "gradients") {
    if (!backward) fail("kind 'gradients' needs the backward dict");
    const BackwardArrays<float> g = backward_arrays<float>(
        *backward, shape.batch * shape.heads * shape.rows);
    r.target = AttentionTarget::gradients(
        {g.out, g.lse, g.dout, g.dlse,
         AttentionGradients{g.dq, g.dk, g.dv, g.dbias, g.dsinks}, nullptr});
  } else {
    fail(
        "kind must be 'output', 'weights', 'scores', 'partial' or "
        "'gradients', got '" +
        kind + "'");
  }
  return r;
}

// A float64 request (kFloat64): kind "output" (attention in double, lse
// optional) or "gradients" (attention_backward in double); kv holds k and v
// (float64).
void request_f64(const std::string& name, const In& q, const nb::dict& kv,
                 const std::string& kind, const std::optional<Out>& out,
                 const std::optional<Out>& lse, const nb::dict& options,
                 const std::optional<nb::dict>& backward) {
  auto in4 = [](const char* n, const In& a) {
    check_dtype(n, a, nb::dtype<double>(), "float64");
    return view4<const double>(n, a);
  };
  const auto qv = in4("query", q);
  const auto kv4 = in4("key", nb::cast<In>(kv["k"]));
  const auto vv = in4("value", nb::cast<In>(kv["v"]));
  const std::size_t rows = qv.batch * qv.heads * qv.rows;
  const AttentionOptions o = options_of(options);
  if (kind == "output") {
    if (!out) fail("the request's kind needs out");
    check_dtype("out", *out, nb::dtype<double>(), "float64");
    const auto ov = view4<double>("out", *out);
    double* l = nullptr;
    if (lse) {
      check_dtype("lse", *lse, nb::dtype<double>(), "float64");
      if (contiguous_size("lse", *lse) != rows)
        fail("lse must hold batch x heads x query rows values");
      l = static_cast<double*>(lse->data());
    }
    as_python(name.c_str(), [&] {
      nb::gil_scoped_release release;
      attention(qv, kv4, vv, ov, o, l);
    });
  } else if (kind == "gradients") {
    if (!backward) fail("kind 'gradients' needs the backward dict");
    const BackwardArrays<double> g = backward_arrays<double>(*backward, rows);
    as_python(name.c_str(), [&] {
      nb::gil_scoped_release release;
      attention_backward(
          qv, kv4, vv, g.out, g.lse, g.dout,
          AttentionGradients64{g.dq, g.dk, g.dv, g.dbias, g.dsinks}, o, g.dlse);
    });
  } else {
    fail("a float64 request's kind must be 'output' or 'gradients', got '" +
         kind + "'");
  }
}

void request_py(const std::string& name, const In& q, int q_format,
                const nb::dict& kv, const std::string& kind,
                const std::optional<Out>& out, int out_format,
                const std::optional<Out>& lse, const nb::dict& options,
                const std::optional<nb::dict>& backward,
                AttentionPartial* partial) {
  if (q_format == kFloat64)
    return request_f64(name, q, kv, kind, out, lse, options, backward);
  const AttentionRequest r =
      request_of(name, q, q_format, kv, kind, out, out_format, lse, options,
                 backward, partial);
  // Checked with the GIL held (the messages are built then), run without.
  as_python(name.c_str(), [&] {
    const AttentionPlan plan = AttentionPlan::make(r);
    nb::gil_scoped_release release;
    plan.run();
  });
}

void merge_py(const In& oa, const In& la, const In& ob, const In& lb,
              const Out& out, const Out& lse) {
  check_dtype("out_a", oa, nb::dtype<float>(), "float32");
  check_dtype("out_b", ob, nb::dtype<float>(), "float32");
  check_dtype("out", out, nb::dtype<float>(), "float32");
  const auto av = view4<const float>("out_a", oa);
  const auto bv = view4<const float>("out_b", ob);
  const auto ov = view4<float>("out", out);
  float* l = lse_data("lse", lse, av);
  const float* pa = lse_data("lse_a", la, av);
  const float* pb = lse_data("lse_b", lb, av);
  nb::gil_scoped_release release;
  attention_merge(av, pa, bv, pb, ov, l);
}

// The arguments of write_kv (kv_cache.h): key and value [1, H_kv, T, E] in
// in_format (0 float32, 1 float16, 2 bfloat16: 16-bit as their bits), the
// pages [P, H_kv, page_size, E] in page_format (3: int8 values with their
// float32 scales [P, H_kv, page_size, 1]; 4, 5: fp8 values with such scales
// or, without them, the per-tensor k_scale / v_scale), slots int64 [T].
struct WriteArgs {
  KVTensor k, v;
  KVPages kp, vp;
  std::span<const std::int64_t> slots;
};

WriteArgs write_args(const In& key, const In& value, int in_format,
                     const Out& k_pages, const Out& v_pages, int page_format,
                     const std::optional<Out>& k_scales,
                     const std::optional<Out>& v_scales, const In& slots,
                     float k_scale, float v_scale) {
  auto rows = [&](const char* name, const In& a) -> KVTensor {
    switch (static_cast<KVFormat>(in_format)) {
      case KVFormat::kFloat32:
        check_dtype(name, a, nb::dtype<float>(), "float32");
        return view4<const float>(name, a);
      case KVFormat::kFloat16:
        return view4<const Float16>(name, a);
      case KVFormat::kBFloat16:
        return view4<const BFloat16>(name, a);
      default:
        fail("key format must be 0, 1 or 2");
    }
  };
  auto pages = [&](const char* name, const Out& a, const std::optional<Out>& sc,
                   float scale) -> KVPages {
    switch (static_cast<KVFormat>(page_format)) {
      case KVFormat::kFloat32:
        check_dtype(name, a, nb::dtype<float>(), "float32");
        return view4<float>(name, a);
      case KVFormat::kFloat16:
        return view4<Float16>(name, a);
      case KVFormat::kBFloat16:
        return view4<BFloat16>(name, a);
      case KVFormat::kInt8: {
        if (!sc) fail(std::string(name) + " is int8 and needs its scales");
        check_dtype(name, a, nb::dtype<std::int8_t>(), "int8");
        const std::string sname = std::string(name) + " scales";
        check_dtype(sname.c_str(), *sc, nb::dtype<float>(), "float32");
        return Int8Pages{view4<std::int8_t>(name, a),
                         view4<float>(sname.c_str(), *sc)};
      }
      case KVFormat::kFloat8E4M3:
      case KVFormat::kFloat8E5M2: {
        if (a.itemsize() != 1) fail(std::string(name) + " must be 8-bit");
        TensorView<float> sv;
        if (sc) {
          const std::string sname = std::string(name) + " scales";
          check_dtype(sname.c_str(), *sc, nb::dtype<float>(), "float32");
          sv = view4<float>(sname.c_str(), *sc);
        }
        if (static_cast<KVFormat>(page_format) == KVFormat::kFloat8E4M3) {
          return Float8E4M3Pages{view4<Float8E4M3>(name, a), sv, scale};
        }
        return Float8E5M2Pages{view4<Float8E5M2>(name, a), sv, scale};
      }
      default:
        fail("page format must be 0 to 5");
    }
  };
  const KVTensor k = rows("key", key), v = rows("value", value);
  const KVPages kp = pages("key_cache", k_pages, k_scales, k_scale);
  const KVPages vp = pages("value_cache", v_pages, v_scales, v_scale);
  check_dtype("slot_mapping", slots, nb::dtype<std::int64_t>(), "int64");
  return WriteArgs{k, v, kp, vp,
                   std::span<const std::int64_t>(
                       static_cast<const std::int64_t*>(slots.data()),
                       contiguous_size("slot_mapping", slots))};
}

void write_kv_py(const In& key, const In& value, int in_format,
                 const Out& k_pages, const Out& v_pages, int page_format,
                 const std::optional<Out>& k_scales,
                 const std::optional<Out>& v_scales, const In& slots,
                 float k_scale, float v_scale) {
  const WriteArgs w =
      write_args(key, value, in_format, k_pages, v_pages, page_format, k_scales,
                 v_scales, slots, k_scale, v_scale);
  as_python("write_kv", [&] {
    nb::gil_scoped_release release;
    write_kv(w.k, w.v, w.kp, w.vp, w.slots);
  });
}

// write_kv_and_attend (kv_cache.h): the write's arguments as write_kv_py's
// (the pages the same arrays as the request's), then the attention request;
// a failed attention puts the written rows back.
void write_and_attend_py(const std::string& name, const In& key,
                         const In& value, int in_format, const Out& k_pages,
                         const Out& v_pages, int page_format,
                         const std::optional<Out>& k_scales,
                         const std::optional<Out>& v_scales, const In& slots,
                         const In& q, int q_format, const nb::dict& kv,
                         const Out& out, int out_format,
                         const std::optional<Out>& lse, const nb::dict& options,
                         float k_scale, float v_scale) {
  const WriteArgs w =
      write_args(key, value, in_format, k_pages, v_pages, page_format, k_scales,
                 v_scales, slots, k_scale, v_scale);
  const AttentionRequest r =
      request_of(name, q, q_format, kv, "output", out, out_format, lse, options,
                 std::nullopt, nullptr);
  as_python(name.c_str(), [&] {
    nb::gil_scoped_release release;
    write_kv_and_attend(w.k, w.v, w.kp, w.vp, w.slots, r);
  });
}

// The ring layout (ring_layout.h): (rows per rank, chunk, the global
// positions of `rank`'s rows), for softdot.distributed.ring_layout and the
// torch.distributed ring.
std::tuple<std::size_t, std::size_t, std::vector<std::size_t>> layout_py(
    std::size_t seq_len, int ranks, bool zigzag, bool deterministic, int rank) {
  const RingLayout L = as_python("ring_layout", [&] {
    return ring_layout(seq_len, ranks,
                       zigzag ? Layout::zigzag : Layout::contiguous,
                       deterministic);
  });
  if (rank < 0 || rank >= ranks)
    fail("rank " + std::to_string(rank) + " is not in [0, " +
         std::to_string(ranks) + ")");
  return {L.rows(), L.chunk, L.positions(rank)};
}

}  // namespace

void bind_attention(nb::module_& m) {
  using namespace nb::literals;
  // The storage formats' codes (KVFormat, attention_request.h) by name: the
  // Python layer reads them here rather than keeping a copy.
  nb::dict formats;
  for (const KVFormat f :
       {KVFormat::kFloat32, KVFormat::kFloat16, KVFormat::kBFloat16,
        KVFormat::kInt8, KVFormat::kFloat8E4M3, KVFormat::kFloat8E5M2}) {
    formats[kv_format_name(f)] = static_cast<int>(f);
  }
  formats["float64"] = kFloat64;
  m.attr("kv_formats") = formats;
  m.def(
      "option_fingerprint",
      [](const nb::dict& options) {
        nb::list out;
        for (const OptionField& f : option_fingerprint(options_of(options)))
          out.append(nb::make_tuple(std::string(f.name), f.value));
        return out;
      },
      "options"_a,
      "Every option of the request as (name, value) pairs (softdot::"
      "option_fingerprint): what the processes of a ring compare.");
  m.def("attention_request", &request_py, "name"_a, "query"_a, "q_format"_a,
        "kv"_a, "kind"_a, "out"_a.none(), "out_format"_a, "lse"_a.none(),
        "options"_a, "backward"_a.none() = nb::none(),
        "partial"_a.none() = nb::none(),
        "One attention request: query, K/V source, target (kind 'output', "
        "'weights', 'scores', 'partial' or 'gradients'), options; q_format "
        "kv_formats['float64'] runs the double functions.");
  m.def("write_kv", &write_kv_py, "key"_a, "value"_a, "in_format"_a,
        "k_pages"_a, "v_pages"_a, "page_format"_a, "k_scales"_a.none(),
        "v_scales"_a.none(), "slot_mapping"_a, "k_scale"_a = 1.0f,
        "v_scale"_a = 1.0f,
        "New keys and values into their slots of a paged cache.");
  m.def("write_kv_and_attend", &write_and_attend_py, "name"_a, "key"_a,
        "value"_a, "in_format"_a, "k_pages"_a, "v_pages"_a, "page_format"_a,
        "k_scales"_a.none(), "v_scales"_a.none(), "slot_mapping"_a, "query"_a,
        "q_format"_a, "kv"_a, "out"_a, "out_format"_a, "lse"_a.none(),
        "options"_a, "k_scale"_a = 1.0f, "v_scale"_a = 1.0f,
        "write_kv, then the attention request over the pages written (the "
        "rows put back if it fails).");
  m.def("ring_layout", &layout_py, "seq_len"_a, "ranks"_a, "zigzag"_a,
        "deterministic"_a, "rank"_a,
        "(rows per rank, chunk, global positions of rank's rows).");
  m.def("attention_merge", &merge_py, "out_a"_a, "lse_a"_a, "out_b"_a,
        "lse_b"_a, "out"_a, "lse"_a, "Merges two partial attention results.");
  // The unrounded partial result (attention.h): what a ring's steps give
  // (kind "partial") and merge; finalize rounds it once.
  nb::class_<AttentionPartial>(m, "AttentionPartial")
      .def_static("empty", &AttentionPartial::empty, "batch"_a, "heads"_a,
                  "rows"_a, "dv"_a,
                  "Every row empty (max -inf, sum 0): the identity of merge.")
      .def_ro("batch", &AttentionPartial::batch)
      .def_ro("heads", &AttentionPartial::heads)
      .def_ro("rows", &AttentionPartial::rows)
      .def_ro("dv", &AttentionPartial::dv)
      .def(
          "merge",
          [](AttentionPartial& a, const AttentionPartial& b) {
            as_python("attention_merge", [&] { attention_merge(a, b); });
          },
          "other"_a, "self = merge(self, other), in double (attention_merge).")
      .def(
          "finalize",
          [](const AttentionPartial& p, const Out& out,
             const std::optional<Out>& lse) {
            check_dtype("out", out, nb::dtype<float>(), "float32");
            const auto ov = view4<float>("out", out);
            float* l = lse ? lse_data("lse", *lse, TensorView<const float>(ov))
                           : nullptr;
            as_python("attention_finalize", [&] {
              nb::gil_scoped_release release;
              attention_finalize(p, ov, l);
            });
          },
          "out"_a, "lse"_a.none(),
          "out = out_r / sum_r and lse = max_r + log(sum_r), each rounded "
          "once to float32 (attention_finalize).");
}

}  // namespace softdot::python
