// softdot Python bindings: one attention request from Python objects. The
// Python layer (python/softdot/_request.py) turns every entry point's
// keyword arguments into two dicts — the options and the K/V source — and
// this header turns them into the library's AttentionOptions and KVSource
// (attention_request.h), with the arrays' own strides, nothing copied. The
// library checks every value (one place, one message); the converters only
// check what a view needs (dtypes, 4 axes, a contiguous last axis) and that
// no key is misspelt.
#ifndef SOFTDOT_PYTHON_REQUEST_VIEWS_H_
#define SOFTDOT_PYTHON_REQUEST_VIEWS_H_

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>

#include "arrays.h"
#include "attention_views.h"
#include "softdot/attention.h"
#include "softdot/attention_request.h"

namespace softdot::python {

// Fails naming the first key of d that is not in `known` (a caller's typo
// in the Python layer would otherwise drop an option silently).
inline void check_keys(const char* what, const nb::dict& d,
                       std::initializer_list<const char*> known) {
  for (auto item : d) {
    const std::string key = nb::cast<std::string>(item.first);
    bool ok = false;
    for (const char* k : known) ok = ok || key == k;
    if (!ok) fail(std::string(what) + " has an unknown key '" + key + "'");
  }
}

template <class T>
T get_or(const nb::dict& d, const char* key, T fallback) {
  if (!d.contains(key)) return fallback;
  nb::handle h = d[key];
  if (h.is_none()) return fallback;
  return nb::cast<T>(h);
}

inline std::optional<In> array_or_none(const nb::dict& d, const char* key) {
  if (!d.contains(key)) return std::nullopt;
  nb::handle h = d[key];
  if (h.is_none()) return std::nullopt;
  return nb::cast<In>(h);
}

// The float32 1-d array under `name` (empty when absent): the sinks or the
// ALiBi slopes, `what` saying how many the library expects.
inline std::span<const float> per_head(const nb::dict& d, const char* name,
                                       const char* what) {
  const std::optional<In> a = array_or_none(d, name);
  if (!a) return {};
  check_dtype(name, *a, nb::dtype<float>(), "float32");
  if (a->ndim() != 1 || (a->shape(0) > 1 && a->stride(0) != 1))
    fail(std::string(name) + " must be a contiguous 1-d array, " + what);
  return {static_cast<const float*>(a->data()), a->shape(0)};
}

// The options dict: scale (None: 1/sqrt(d)), causal, window_left,
// window_right, softcap, kv_begin, kv_end (None: every key), precise,
// prefill_form, batch_invariant, q_position (None: automatic),
// kv_position, and the arrays mask (bool), bias (float32), sinks and
// alibi_slopes (float32, 1-d). The arrays must outlive the call (the dict
// holds them).
inline AttentionOptions options_of(const nb::dict& d) {
  check_keys(
      "options", d,
      {"scale", "causal", "window_left", "window_right", "softcap", "kv_begin",
       "kv_end", "precise", "prefill_form", "batch_invariant", "q_position",
       "kv_position", "mask", "bias", "sinks", "unit_weights", "alibi_slopes"});
  AttentionOptions o;
  // None or absent: not set (1/sqrt(d)); a NaN is the core's error.
  if (d.contains("scale") && !d["scale"].is_none()) {
    o.scale = nb::cast<double>(d["scale"]);
  }
  o.causal = get_or<bool>(d, "causal", false);
  o.window_left = get_or<std::ptrdiff_t>(d, "window_left", -1);
  o.window_right = get_or<std::ptrdiff_t>(d, "window_right", -1);
  o.softcap = static_cast<float>(get_or<double>(d, "softcap", 0.0));
  o.kv_begin = get_or<std::size_t>(d, "kv_begin", 0);
  o.kv_end =
      get_or<std::size_t>(d, "kv_end", std::numeric_limits<std::size_t>::max());
  o.precise = get_or<bool>(d, "precise", false);
  o.prefill_form = get_or<bool>(d, "prefill_form", false);
  o.batch_invariant = get_or<bool>(d, "batch_invariant", false);
  if (const std::optional<In> m = array_or_none(d, "mask")) {
    check_dtype("attn_mask", *m, nb::dtype<bool>(), "bool");
    o.mask = view4<const bool>("attn_mask", *m);
  }
  if (const std::optional<In> b = array_or_none(d, "bias")) {
    check_dtype("bias", *b, nb::dtype<float>(), "float32");
    o.bias = view4<const float>("bias", *b);
  }
  o.sinks = per_head(d, "sinks", "one logit per query head");
  o.alibi_slopes = per_head(d, "alibi_slopes", "one slope per head");
  o.q_position =
      get_or<std::size_t>(d, "q_position", AttentionOptions::kAutoPosition);
  o.kv_position = get_or<std::size_t>(d, "kv_position", 0);
  const std::string w = get_or<std::string>(d, "unit_weights", "rounded");
  if (w == "split") {
    o.unit_weights = AttentionOptions::UnitWeights::kSplit;
  } else if (w != "rounded") {
    fail("unit_weights must be 'rounded' or 'split', got '" + w + "'");
  }
  return o;
}

// One K or V tensor of the source dict: its array under `key` (and, for
// int8, the scales under `key`_scales), named `name` in errors.
inline KVTensor kv_tensor(KVFormat f, const nb::dict& d, const char* key,
                          const char* name) {
  const In a = nb::cast<In>(d[key]);
  switch (f) {
    case KVFormat::kFloat32:
      check_dtype(name, a, nb::dtype<float>(), "float32");
      return view4<const float>(name, a);
    case KVFormat::kFloat16:
    case KVFormat::kBFloat16:
      if (a.itemsize() != 2) {
        throw nb::type_error(
            (std::string(name) + " must be " + kv_format_name(f) + " (16-bit)")
                .c_str());
      }
      if (f == KVFormat::kFloat16) return view4<const Float16>(name, a);
      return view4<const BFloat16>(name, a);
    case KVFormat::kInt8: {
      const std::string skey = std::string(key) + "_scales";
      const std::optional<In> s = array_or_none(d, skey.c_str());
      if (!s) fail(std::string(name) + " is int8 and needs its scales");
      return int8_kv(name, a, *s);
    }
    case KVFormat::kFloat8E4M3:
    case KVFormat::kFloat8E5M2: {
      if (a.itemsize() != 1) {
        throw nb::type_error(
            (std::string(name) + " must be " + kv_format_name(f) + " (8-bit)")
                .c_str());
      }
      // Per-token scales under `key`_scales, or a per-tensor `key`_scale.
      const std::string skey = std::string(key) + "_scales";
      const std::string tkey = std::string(key) + "_scale";
      TensorView<const float> sv;
      if (const std::optional<In> s = array_or_none(d, skey.c_str())) {
        const std::string sname = std::string(name) + " scales";
        check_dtype(sname.c_str(), *s, nb::dtype<float>(), "float32");
        sv = view4<const float>(sname.c_str(), *s);
      }
      const float scale = get_or<float>(d, tkey.c_str(), 1.0f);
      if (f == KVFormat::kFloat8E4M3) {
        return Float8E4M3KV{view4<const Float8E4M3>(name, a), sv, scale};
      }
      return Float8E5M2KV{view4<const Float8E5M2>(name, a), sv, scale};
    }
  }
  fail("unknown K/V format");
}

// A C-contiguous int32 array as a span (the block table, the lengths).
inline std::span<const std::int32_t> int32_span(const char* name, const In& a) {
  check_dtype(name, a, nb::dtype<std::int32_t>(), "int32");
  return {static_cast<const std::int32_t*>(a.data()), contiguous_size(name, a)};
}

// The source dict: format (0 float32, 1 float16, 2 bfloat16, 3 int8,
// 4 float8_e4m3fn, 5 float8_e5m2), k, v (None for weights and scores),
// k_scales, v_scales (int8; fp8 per token), k_scale, v_scale (fp8 per
// tensor, default 1), k_name, v_name
// (the arrays' names in errors), and for a paged cache block_table (int32),
// blocks_per_seq, seq_lens (int32) and, for a ragged batch,
// query_start_loc (int32, or None); positions: query_positions and
// kv_position_offsets (int64, or None), kv_position_stride; a draft tree:
// draft_parents (int32, or None).
inline KVSource kv_source_of(const nb::dict& d) {
  check_keys("kv", d,
             {"format", "k", "v", "k_scales", "v_scales", "k_scale", "v_scale",
              "k_name", "v_name", "block_table", "blocks_per_seq", "seq_lens",
              "query_start_loc", "query_positions", "kv_position_offsets",
              "kv_position_stride", "draft_parents"});
  const int code = nb::cast<int>(d["format"]);
  if (code < 0 || code > 5) fail("kv format must be 0 to 5");
  const auto f = static_cast<KVFormat>(code);
  const std::string k_name = get_or<std::string>(d, "k_name", "key");
  const std::string v_name = get_or<std::string>(d, "v_name", "value");
  const KVTensor k = kv_tensor(f, d, "k", k_name.c_str());
  const bool has_v = d.contains("v") && !d["v"].is_none();
  if (!d.contains("block_table") || d["block_table"].is_none()) {
    if (!has_v) return KVSource::keys(k);
    return KVSource::contiguous(k, kv_tensor(f, d, "v", v_name.c_str()));
  }
  if (!has_v) fail("a paged cache needs its values");
  PagedKVTable table{int32_span("block_table", nb::cast<In>(d["block_table"])),
                     nb::cast<std::size_t>(d["blocks_per_seq"]),
                     int32_span("seq_lens", nb::cast<In>(d["seq_lens"]))};
  if (const std::optional<In> qsl = array_or_none(d, "query_start_loc")) {
    table.query_start_loc = int32_span("query_start_loc", *qsl);
  }
  if (const std::optional<In> dp = array_or_none(d, "draft_parents")) {
    table.draft_parents = int32_span("draft_parents", *dp);
  }
  auto int64_span = [](const char* name, const In& a) {
    check_dtype(name, a, nb::dtype<std::int64_t>(), "int64");
    return std::span<const std::int64_t>(
        static_cast<const std::int64_t*>(a.data()), contiguous_size(name, a));
  };
  if (const std::optional<In> qp = array_or_none(d, "query_positions")) {
    table.query_positions = int64_span("query_positions", *qp);
  }
  if (const std::optional<In> ko = array_or_none(d, "kv_position_offsets")) {
    table.kv_position_offsets = int64_span("kv_position_offsets", *ko);
  }
  table.kv_position_stride =
      get_or<std::size_t>(d, "kv_position_stride", std::size_t{1});
  return KVSource::pages(k, kv_tensor(f, d, "v", v_name.c_str()), table);
}

}  // namespace softdot::python

#endif  // SOFTDOT_PYTHON_REQUEST_VIEWS_H_
