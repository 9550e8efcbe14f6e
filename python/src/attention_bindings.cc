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

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

#include "arrays.h"
#include "attention_views.h"
#include "bindings.h"
#include "python_errors.h"
#include "request_views.h"
#include "softdot/attention.h"
#include "softdot/attention_request.h"
#include "softdot/kv_cache.h"

namespace softdot::python {
namespace {

// One attention request (attention_request.h): kind "output" (out and,
// when given, lse), "weights" or "scores" (out [B, H, L, S]); kv and options
// are the dicts of request_views.h; name is the Python function the
// library's messages name.
// The request of the Python layer's arguments (the arrays must outlive it).
AttentionRequest request_of(const std::string& name, const In& q, int q_format,
                            const nb::dict& kv, const std::string& kind,
                            const Out& out, int out_format,
                            const std::optional<Out>& lse,
                            const nb::dict& options) {
  AttentionRequest r;
  r.name = name.c_str();
  // The query and the output: float32, or 16-bit (their bits, as uint16).
  switch (static_cast<KVFormat>(q_format)) {
    case KVFormat::kFloat32:
      check_dtype("query", q, nb::dtype<float>(), "float32");
      r.q = view4<const float>("query", q);
      break;
    case KVFormat::kFloat16:
      r.q = view4<const Float16>("query", q);
      break;
    case KVFormat::kBFloat16:
      r.q = view4<const BFloat16>("query", q);
      break;
    default:
      fail("query format must be 0 (float32), 1 (float16) or 2 (bfloat16)");
  }
  r.kv = kv_source_of(kv);
  r.options = options_of(options);
  OutputTensor ov;
  switch (static_cast<KVFormat>(out_format)) {
    case KVFormat::kFloat32:
      check_dtype("out", out, nb::dtype<float>(), "float32");
      ov = view4<float>("out", out);
      break;
    case KVFormat::kFloat16:
      ov = view4<Float16>("out", out);
      break;
    case KVFormat::kBFloat16:
      ov = view4<BFloat16>("out", out);
      break;
    default:
      fail("out format must be 0 (float32), 1 (float16) or 2 (bfloat16)");
  }
  if (kind == "output") {
    const TensorView<const float> shape = r.q.shape_view();
    r.target = AttentionTarget::output(
        ov, lse ? lse_data("lse", *lse, shape) : nullptr);
  } else if (kind == "weights" || kind == "scores") {
    // Written as float32: the Python layer makes out float32 for them (the
    // library refuses a 16-bit query, with its message).
    const auto* f = ov.f32();
    if (f == nullptr) fail(name + ": the weights and scores are float32");
    r.target = kind == "weights" ? AttentionTarget::weights(*f)
                                 : AttentionTarget::scores(*f);
  } else {
    fail("kind must be 'output', 'weights' or 'scores', got '" + kind + "'");
  }
  return r;
}

void request_py(const std::string& name, const In& q, int q_format,
                const nb::dict& kv, const std::string& kind, const Out& out,
                int out_format, const std::optional<Out>& lse,
                const nb::dict& options) {
  const AttentionRequest r =
      request_of(name, q, q_format, kv, kind, out, out_format, lse, options);
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
// float32 scales [P, H_kv, page_size, 1]), slots int64 [T].
struct WriteArgs {
  KVTensor k, v;
  KVPages kp, vp;
  std::span<const std::int64_t> slots;
};

WriteArgs write_args(const In& key, const In& value, int in_format,
                     const Out& k_pages, const Out& v_pages, int page_format,
                     const std::optional<Out>& k_scales,
                     const std::optional<Out>& v_scales, const In& slots) {
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
  auto pages = [&](const char* name, const Out& a,
                   const std::optional<Out>& sc) -> KVPages {
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
      default:
        fail("page format must be 0, 1, 2 or 3");
    }
  };
  const KVTensor k = rows("key", key), v = rows("value", value);
  const KVPages kp = pages("key_cache", k_pages, k_scales);
  const KVPages vp = pages("value_cache", v_pages, v_scales);
  check_dtype("slot_mapping", slots, nb::dtype<std::int64_t>(), "int64");
  return WriteArgs{k, v, kp, vp,
                   std::span<const std::int64_t>(
                       static_cast<const std::int64_t*>(slots.data()),
                       contiguous_size("slot_mapping", slots))};
}

void write_kv_py(const In& key, const In& value, int in_format,
                 const Out& k_pages, const Out& v_pages, int page_format,
                 const std::optional<Out>& k_scales,
                 const std::optional<Out>& v_scales, const In& slots) {
  const WriteArgs w = write_args(key, value, in_format, k_pages, v_pages,
                                 page_format, k_scales, v_scales, slots);
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
                         const std::optional<Out>& lse,
                         const nb::dict& options) {
  const WriteArgs w = write_args(key, value, in_format, k_pages, v_pages,
                                 page_format, k_scales, v_scales, slots);
  const AttentionRequest r = request_of(name, q, q_format, kv, "output", out,
                                        out_format, lse, options);
  as_python(name.c_str(), [&] {
    nb::gil_scoped_release release;
    write_kv_and_attend(w.k, w.v, w.kp, w.vp, w.slots, r);
  });
}

// attention_backward (attention.h) in T = float or double: 4-d arrays
// [B, H, L, E] for query, key, value, out, dout and the gradients dq, dk,
// dv (dbias [B, H, L, S] or None), lse and dlse (None) flat [B H L], dsinks
// [H] or None, all of T's dtype; options as attention_request's dict. name
// is the Python function the messages name.
template <class T>
void backward_py(const std::string& name, const In& q, const In& k, const In& v,
                 const In& out, const In& lse, const In& dout, const Out& dq,
                 const Out& dk, const Out& dv, const std::optional<Out>& dbias,
                 const std::optional<Out>& dsinks,
                 const std::optional<In>& dlse, const nb::dict& options) {
  const char* type = std::is_same_v<T, float> ? "float32" : "float64";
  auto in4 = [&](const char* n, const In& a) {
    check_dtype(n, a, nb::dtype<T>(), type);
    return view4<const T>(n, a);
  };
  auto out4 = [&](const char* n, const Out& a) {
    check_dtype(n, a, nb::dtype<T>(), type);
    return view4<T>(n, a);
  };
  const auto qv = in4("query", q), kv = in4("key", k), vv = in4("value", v),
             ov = in4("out", out), gv = in4("dout", dout);
  auto flat = [&](const char* n, const auto& a) {
    check_dtype(n, a, nb::dtype<T>(), type);
    if (contiguous_size(n, a) != qv.batch * qv.heads * qv.rows)
      fail(std::string(n) +
           " must hold batch x heads x query rows values, C-contiguous");
    return static_cast<T*>(
        const_cast<void*>(static_cast<const void*>(a.data())));
  };
  const T* l = flat("lse", lse);
  const T* dl = dlse ? flat("dlse", *dlse) : nullptr;
  std::conditional_t<std::is_same_v<T, float>, AttentionGradients,
                     AttentionGradients64>
      g;
  g.dq = out4("dq", dq);
  g.dk = out4("dk", dk);
  g.dv = out4("dv", dv);
  if (dbias) g.dbias = out4("dbias", *dbias);
  if (dsinks) {  // its length is the library's check (one per query head)
    check_dtype("dsinks", *dsinks, nb::dtype<T>(), type);
    g.dsinks = std::span<T>(static_cast<T*>(dsinks->data()),
                            contiguous_size("dsinks", *dsinks));
  }
  const AttentionOptions o = options_of(options);
  as_python(name.c_str(), [&] {
    nb::gil_scoped_release release;
    attention_backward(qv, kv, vv, ov, l, gv, g, o, dl);
  });
}

// float64 attention (attention.h): 4-d float64 arrays, lse float64 [B H L]
// or None.
void attention_f64_py(const std::string& name, const In& q, const In& k,
                      const In& v, const Out& out,
                      const std::optional<Out>& lse, const nb::dict& options) {
  auto in4 = [](const char* n, const In& a) {
    check_dtype(n, a, nb::dtype<double>(), "float64");
    return view4<const double>(n, a);
  };
  const auto qv = in4("query", q), kv = in4("key", k), vv = in4("value", v);
  check_dtype("out", out, nb::dtype<double>(), "float64");
  const auto ov = view4<double>("out", out);
  double* l = nullptr;
  if (lse) {
    check_dtype("lse", *lse, nb::dtype<double>(), "float64");
    if (contiguous_size("lse", *lse) != qv.batch * qv.heads * qv.rows)
      fail("lse must hold batch x heads x query rows values");
    l = static_cast<double*>(lse->data());
  }
  const AttentionOptions o = options_of(options);
  as_python(name.c_str(), [&] {
    nb::gil_scoped_release release;
    attention(qv, kv, vv, ov, o, l);
  });
}

}  // namespace

void bind_attention(nb::module_& m) {
  using namespace nb::literals;
  // The storage formats' codes (KVFormat, attention_request.h) by name: the
  // Python layer reads them here rather than keeping a copy.
  nb::dict formats;
  for (const KVFormat f : {KVFormat::kFloat32, KVFormat::kFloat16,
                           KVFormat::kBFloat16, KVFormat::kInt8}) {
    formats[kv_format_name(f)] = static_cast<int>(f);
  }
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
        "kv"_a, "kind"_a, "out"_a, "out_format"_a, "lse"_a.none(), "options"_a,
        "One attention request: query, K/V source, target, options.");
  m.def("write_kv", &write_kv_py, "key"_a, "value"_a, "in_format"_a,
        "k_pages"_a, "v_pages"_a, "page_format"_a, "k_scales"_a.none(),
        "v_scales"_a.none(), "slot_mapping"_a,
        "New keys and values into their slots of a paged cache.");
  m.def("write_kv_and_attend", &write_and_attend_py, "name"_a, "key"_a,
        "value"_a, "in_format"_a, "k_pages"_a, "v_pages"_a, "page_format"_a,
        "k_scales"_a.none(), "v_scales"_a.none(), "slot_mapping"_a, "query"_a,
        "q_format"_a, "kv"_a, "out"_a, "out_format"_a, "lse"_a.none(),
        "options"_a,
        "write_kv, then the attention request over the pages written (the "
        "rows put back if it fails).");
  m.def("attention_backward", &backward_py<float>, "name"_a, "query"_a, "key"_a,
        "value"_a, "out"_a, "lse"_a, "dout"_a, "dq"_a, "dk"_a, "dv"_a,
        "dbias"_a.none(), "dsinks"_a.none(), "dlse"_a.none(), "options"_a,
        "The gradients of attention (float32), by recomputation.");
  m.def("attention_f64", &attention_f64_py, "name"_a, "query"_a, "key"_a,
        "value"_a, "out"_a, "lse"_a.none(), "options"_a,
        "Attention on float64 arrays, in double arithmetic.");
  m.def("attention_backward_f64", &backward_py<double>, "name"_a, "query"_a,
        "key"_a, "value"_a, "out"_a, "lse"_a, "dout"_a, "dq"_a, "dk"_a, "dv"_a,
        "dbias"_a.none(), "dsinks"_a.none(), "dlse"_a.none(), "options"_a,
        "The gradients of attention on float64 arrays.");
  m.def("attention_merge", &merge_py, "out_a"_a, "lse_a"_a, "out_b"_a,
        "lse_b"_a, "out"_a, "lse"_a, "Merges two partial attention results.");
}

}  // namespace softdot::python
