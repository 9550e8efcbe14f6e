// Shared sweeps for the attention tests: the option cases (option_sweep())
// and the prefill/decode shapes (form_shapes()) every "X equals Y bit for
// bit" sweep loops over (paged, partial, int8, ...).
//
// A new option is one line in option_sweep(); every sweep then covers it.
// A new form or edge size is one entry in form_shapes(), likewise.
//
// Use:
//   for (const FormShape& f : form_shapes()) {
//     const SweepArrays x(f.shape);
//     for (const OptionCase& c : option_sweep()) {
//       const AttentionOptions o = c.make(x);  // views into x
//       ... f.name, c.name, o ...
//     }
//   }
#ifndef SOFTDOT_TESTS_UNIT_ATTENTION_SWEEPS_H_
#define SOFTDOT_TESTS_UNIT_ATTENTION_SWEEPS_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "attention_checks.h"
#include "attention_test_util.h"

namespace softdot_test {

// ---- the arrays an option case may point into ------------------------------

// Built once per shape s (B, H, n_q, n_kv); the options of a case are views
// into them, so they must outlive the options. `spare_cols` extra columns
// in the mask and bias (paged attention: wider than the longest sequence;
// the rest are never read); 0 for attention() itself (cols must be n_kv).
struct SweepArrays {
  Shape s;
  Tensor<bool> mask;         // [B, 1, n_q, n_kv + spare], about 30% false
  Tensor<bool> head_mask;    // [1, H, n_q, n_kv + spare], about 30% false
  Tensor<float> bias;        // [1, H, n_q, n_kv + spare], 10% -inf, else +-1
  std::vector<float> sinks;  // 0.25 h - 0.5
  std::vector<float> sinks_inf;  // 0.5, -inf, 2, 1, 3, 0, -1, 4, ...

  explicit SweepArrays(const Shape& shape, std::size_t spare_cols = 0)
      : s(shape) {
    const std::size_t cols = s.nkv + spare_cols;
    mask = random_mask(s.B, 1, s.nq, cols, s.seed + 2);
    head_mask = random_mask(1, s.H, s.nq, cols, s.seed + 7);
    bias = Tensor<float>(1, s.H, s.nq, cols, 1, kNaNF);
    std::mt19937_64 rng(s.seed + 3);
    std::uniform_real_distribution<double> u(-1.0, 1.0);
    std::bernoulli_distribution hide(0.1);
    bias.for_each([&](float& x) { x = hide(rng) ? -kInfF : float(u(rng)); });
    const float with_inf[8] = {0.5f, -kInfF, 2.0f, 1.0f,
                               3.0f, 0.0f,   -1.f, 4.0f};
    for (std::size_t h = 0; h < s.H; ++h) {
      sinks.push_back(0.25f * float(h) - 0.5f);
      sinks_inf.push_back(with_inf[h % 8]);
    }
  }
  SweepArrays(const SweepArrays&) = delete;
  SweepArrays& operator=(const SweepArrays&) = delete;

  // A key range [begin, end) fitted to the shape: begin at most n_kv (an
  // error past it); end is clamped by attention() itself.
  std::size_t kv(std::size_t j) const { return std::min(j, s.nkv); }
};

// ---- the option cases ------------------------------------------------------

struct OptionCase {
  const char* name;
  void (*set)(AttentionOptions&, const SweepArrays&);
  AttentionOptions make(const SweepArrays& x) const {
    AttentionOptions o;
    set(o, x);
    return o;
  }
};

// Every option case, one line each. Each case changes what a row sees or
// how its state is built: positions, masks, bias, sinks, key ranges,
// softcap, scale.
inline const std::vector<OptionCase>& option_sweep() {
  using O = AttentionOptions;
  using X = SweepArrays;
  // clang-format off
  static const std::vector<OptionCase> cases = {
      {"plain", [](O&, const X&) {}},
      {"causal", [](O& o, const X&) { o.causal = true; }},
      {"causal window softcap", [](O& o, const X&) { o.causal = true, o.window_left = 70, o.softcap = 3.0f; }},
      {"causal window softcap sinks(-inf)", [](O& o, const X& x) { o.causal = true, o.window_left = 70, o.softcap = 5.0f, o.sinks = x.sinks_inf; }},
      {"causal window softcap kv_begin", [](O& o, const X& x) { o.causal = true, o.window_left = 50, o.softcap = 4.0f, o.kv_begin = x.kv(9); }},
      {"window mask", [](O& o, const X& x) { o.window_left = 40, o.window_right = 5, o.mask = x.mask.cview(); }},
      {"head mask", [](O& o, const X& x) { o.mask = x.head_mask.cview(); }},
      {"bias sinks scale", [](O& o, const X& x) { o.bias = x.bias.cview(), o.sinks = x.sinks, o.scale = 0.3; }},
      {"kv range 70..700 causal", [](O& o, const X& x) { o.kv_begin = x.kv(70), o.kv_end = 700, o.causal = true; }},
      {"kv range 5..6 sinks", [](O& o, const X& x) { o.kv_begin = x.kv(5), o.kv_end = 6, o.sinks = x.sinks; }},
      {"kv range 20..n_kv-30", [](O& o, const X& x) { o.kv_begin = x.kv(20), o.kv_end = std::max(x.kv(20), x.s.nkv - std::min<std::size_t>(30, x.s.nkv)); }},
      {"empty kv range 20..20", [](O& o, const X& x) { o.kv_begin = o.kv_end = x.kv(20); }},
  };
  // clang-format on
  return cases;
}

// ---- the shapes ------------------------------------------------------------

struct FormShape {
  const char* name;
  Shape shape;
  // An edge size of the kernels (a d_v, a d, a chunk count) rather than a
  // form: sweeps that only rearrange the kernels' inputs (paged attention:
  // the same kernels over pages) may leave these out, as they always have.
  bool edge = false;
};

// Query rows per KV head: at most kDecodeRows is the decode (split-KV)
// form, more the prefill form (src/attention_checks.h).
inline std::size_t rows_per_kv_head(const Shape& s) {
  return s.nq * (s.H / s.Hkv);
}

// The decode/prefill pairs, GQA and MHA, then the edge sizes: several
// 512-key decode chunks with a ragged end, strided views, exactly
// kDecodeRows rows per KV head (the last decode size) and one more (the
// first prefill size), d = d_v = 128, d and d_v not a multiple of any
// vector width.
inline const std::vector<FormShape>& form_shapes() {
  using softdot::detail::attn::kDecodeChunk;
  using softdot::detail::attn::kDecodeRows;
  // clang-format off
  static const std::vector<FormShape> shapes = {
      {"decode GQA, 3 chunks + 17", {.B = 1, .H = 8, .Hkv = 2, .nq = 1, .nkv = 3 * kDecodeChunk + 17, .d = 64, .dv = 48, .seed = 301}},
      {"prefill GQA, strided", {.B = 2, .H = 4, .Hkv = 2, .nq = 2 * kDecodeRows + 5, .nkv = 150, .d = 40, .dv = 24, .pad = 1, .seed = 300}},
      {"decode MHA, kDecodeRows rows, strided", {.B = 2, .H = 2, .Hkv = 2, .nq = kDecodeRows, .nkv = 130, .d = 24, .dv = 20, .pad = 2, .seed = 302}},
      {"prefill MHA, kDecodeRows + 1 rows", {.B = 1, .H = 3, .Hkv = 3, .nq = kDecodeRows + 1, .nkv = 90, .d = 32, .dv = 16, .seed = 303}},
      {"decode GQA d 128, 2 chunks + 70", {.B = 1, .H = 8, .Hkv = 2, .nq = 1, .nkv = 2 * kDecodeChunk + 70, .d = 128, .dv = 128, .seed = 501}, true},
      {"prefill GQA odd d, strided", {.B = 2, .H = 4, .Hkv = 2, .nq = 2 * kDecodeRows + 3, .nkv = 150, .d = 37, .dv = 29, .pad = 1, .seed = 500}, true},
  };
  // clang-format on
  return shapes;
}

}  // namespace softdot_test

#endif  // SOFTDOT_TESTS_UNIT_ATTENTION_SWEEPS_H_
