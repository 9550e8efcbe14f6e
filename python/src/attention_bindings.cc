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

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "arrays.h"
#include "bindings.h"
#include "softdot/attention.h"

namespace softdot::python {
namespace {

enum KvFormat : int { kF32 = 0, kF16 = 1, kBF16 = 2 };

// A TensorView of a 4-d array of element type T (checked by the caller)
// with its strides; negative strides and a strided last axis are refused.
template <class T, class A>
TensorView<T> view4(const char* name, const A& a) {
  if (a.ndim() != 4)
    fail(std::string(name) + " has " + std::to_string(a.ndim()) +
         " axes; expected 4");
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

bool is_16bit(const In& a) { return a.itemsize() == 2; }

// Calls f(k, v) with K (and V, when v is not null; else an empty view) as
// TensorViews of the element type kv_format names: float32, or the 16-bit
// bits of float16 or bfloat16.
template <class F>
void with_kv(int kv_format, const In& k, const In* v, F&& f) {
  auto run = [&](auto tag, const char* want) {
    using KV = decltype(tag);
    if constexpr (std::is_same_v<KV, float>) {
      check_dtype("key", k, nb::dtype<float>(), want);
      if (v) check_dtype("value", *v, nb::dtype<float>(), want);
    } else if (!is_16bit(k) || (v && !is_16bit(*v))) {
      throw nb::type_error("key and value must be 16-bit");
    }
    const auto kv = view4<const KV>("key", k);
    const auto vv = v ? view4<const KV>("value", *v) : TensorView<const KV>();
    f(kv, vv);
  };
  if (kv_format == kF32)
    run(float{}, "float32");
  else if (kv_format == kF16)
    run(Float16{}, "float16");
  else if (kv_format == kBF16)
    run(BFloat16{}, "bfloat16");
  else
    fail("kv_format must be 0 (float32), 1 (float16) or 2 (bfloat16)");
}

AttentionOptions make_options(const std::optional<In>& mask,
                              const std::optional<In>& bias,
                              const std::optional<In>& sinks, double scale,
                              bool causal, std::ptrdiff_t window_left,
                              std::ptrdiff_t window_right, double softcap,
                              std::size_t kv_begin, std::size_t kv_end) {
  AttentionOptions o;
  o.scale = scale;
  o.causal = causal;
  o.window_left = window_left;
  o.window_right = window_right;
  o.softcap = static_cast<float>(softcap);
  o.kv_begin = kv_begin;
  o.kv_end = kv_end;
  if (mask) {
    check_dtype("attn_mask", *mask, nb::dtype<bool>(), "bool");
    o.mask = view4<const bool>("attn_mask", *mask);
  }
  if (bias) {
    check_dtype("bias", *bias, nb::dtype<float>(), "float32");
    o.bias = view4<const float>("bias", *bias);
  }
  if (sinks) {
    check_dtype("sinks", *sinks, nb::dtype<float>(), "float32");
    if (sinks->ndim() != 1 || (sinks->shape(0) > 1 && sinks->stride(0) != 1))
      fail("sinks must be a contiguous 1-d array, one logit per query head");
    o.sinks = std::span<const float>(static_cast<const float*>(sinks->data()),
                                     sinks->shape(0));
  }
  return o;
}

// The float data of a C-contiguous array of exactly batch x heads x rows
// values, one per row of q in (b, h, i) order (an lse array).
template <class A>
float* lse_data(const char* name, const A& a,
                const TensorView<const float>& q) {
  check_dtype(name, a, nb::dtype<float>(), "float32");
  const std::size_t want = q.batch * q.heads * q.rows;
  std::int64_t expect = 1;
  std::size_t size = 1;
  for (std::size_t i = a.ndim(); i-- > 0;) {
    if (a.shape(i) > 1 && a.stride(i) != expect)
      fail(std::string(name) + " must be C-contiguous");
    expect *= static_cast<std::int64_t>(a.shape(i));
    size *= a.shape(i);
  }
  if (size != want)
    fail(std::string(name) + " holds " + std::to_string(size) +
         " values; expected " + std::to_string(want) +
         " (batch x heads x query rows)");
  return static_cast<float*>(
      const_cast<void*>(static_cast<const void*>(a.data())));
}

void attention_py(const In& q, const In& k, const In& v, const Out& out,
                  int kv_format, const std::optional<In>& mask,
                  const std::optional<In>& bias, const std::optional<In>& sinks,
                  const std::optional<Out>& lse, double scale, bool causal,
                  std::ptrdiff_t window_left, std::ptrdiff_t window_right,
                  double softcap, std::size_t kv_begin, std::size_t kv_end,
                  bool precise) {
  check_dtype("query", q, nb::dtype<float>(), "float32");
  check_dtype("out", out, nb::dtype<float>(), "float32");
  const auto qv = view4<const float>("query", q);
  const auto ov = view4<float>("out", out);
  AttentionOptions o =
      make_options(mask, bias, sinks, scale, causal, window_left, window_right,
                   softcap, kv_begin, kv_end);
  o.precise = precise;
  float* l = lse ? lse_data("lse", *lse, qv) : nullptr;
  with_kv(kv_format, k, &v, [&](const auto& kv, const auto& vv) {
    nb::gil_scoped_release release;
    attention(qv, kv, vv, ov, o, l);
  });
}

void weights_py(const In& q, const In& k, const Out& w, int kv_format,
                const std::optional<In>& mask, const std::optional<In>& bias,
                const std::optional<In>& sinks, double scale, bool causal,
                std::ptrdiff_t window_left, std::ptrdiff_t window_right,
                double softcap, std::size_t kv_begin, std::size_t kv_end) {
  check_dtype("query", q, nb::dtype<float>(), "float32");
  check_dtype("out", w, nb::dtype<float>(), "float32");
  const auto qv = view4<const float>("query", q);
  const auto wv = view4<float>("out", w);
  AttentionOptions o =
      make_options(mask, bias, sinks, scale, causal, window_left, window_right,
                   softcap, kv_begin, kv_end);
  with_kv(kv_format, k, nullptr, [&](const auto& kv, const auto&) {
    nb::gil_scoped_release release;
    attention_weights(qv, kv, wv, o);
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
  m.def("attention", &attention_py, "query"_a, "key"_a, "value"_a, "out"_a,
        "kv_format"_a, "mask"_a.none(), "bias"_a.none(), "sinks"_a.none(),
        "lse"_a.none(), "scale"_a, "causal"_a, "window_left"_a,
        "window_right"_a, "softcap"_a, "kv_begin"_a, "kv_end"_a,
        "precise"_a = false, "Fused attention on 4-d arrays.");
  m.def("attention_weights", &weights_py, "query"_a, "key"_a, "out"_a,
        "kv_format"_a, "mask"_a.none(), "bias"_a.none(), "sinks"_a.none(),
        "scale"_a, "causal"_a, "window_left"_a, "window_right"_a, "softcap"_a,
        "kv_begin"_a, "kv_end"_a, "Explicit attention weights on 4-d arrays.");
  m.def("attention_merge", &merge_py, "out_a"_a, "lse_a"_a, "out_b"_a,
        "lse_b"_a, "out"_a, "lse"_a, "Merges two partial attention results.");
}

}  // namespace softdot::python
