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
#include <string>
#include <type_traits>
#include <utility>

#include "arrays.h"
#include "attention_views.h"
#include "bindings.h"
#include "request_views.h"
#include "softdot/attention.h"
#include "softdot/attention_request.h"

namespace softdot::python {
namespace {

// One attention request (attention_request.h): kind "output" (out and,
// when given, lse), "weights" or "scores" (out [B, H, L, S]); kv and options
// are the dicts of request_views.h; name is the Python function the
// library's messages name.
void request_py(const std::string& name, const In& q, int q_format,
                const nb::dict& kv, const std::string& kind, const Out& out,
                int out_format, const std::optional<Out>& lse,
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
  // Checked with the GIL held (the messages are built then), run without.
  with_python_messages([&] {
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

}  // namespace

void bind_attention(nb::module_& m) {
  using namespace nb::literals;
  m.def("attention_request", &request_py, "name"_a, "query"_a, "q_format"_a,
        "kv"_a, "kind"_a, "out"_a, "out_format"_a, "lse"_a.none(), "options"_a,
        "One attention request: query, K/V source, target, options.");
  m.def("attention_merge", &merge_py, "out_a"_a, "lse_a"_a, "out_b"_a,
        "lse_b"_a, "out"_a, "lse"_a, "Merges two partial attention results.");
}

}  // namespace softdot::python
