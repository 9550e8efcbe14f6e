// softdot: the argument checks of attention(), attention_weights() and
// attention_scores(), and the plan they produce (src/attention_plan.h).
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "attention_plan.h"

namespace softdot::detail::attn {

template <class KT>
Plan check_and_plan(const char* fn, const TensorView<const float>& q,
                    const TensorView<const KT>& k,
                    const TensorView<const KT>* v, const TensorView<float>& out,
                    const char* out_name, std::size_t out_cols,
                    const AttentionOptions& o) {
  check_tensor(fn, "q", q);
  check_tensor(fn, "k", k);
  if (v != nullptr) check_tensor(fn, "v", *v);
  if (out_name != nullptr) check_tensor(fn, out_name, out);
  if (q.rows == 0 || q.cols == 0) fail(fn, shape("q", q) + " is empty");
  if (k.batch != q.batch) {
    fail(fn, shape("k", k) + " has batch " + count(k.batch) + " but " +
                 shape("q", q) + " has batch " + count(q.batch));
  }
  if (k.cols != q.cols) {
    fail(fn, shape("k", k) + " has d = " + count(k.cols) + " but " +
                 shape("q", q) + " has d = " + count(q.cols));
  }
  if (k.heads == 0 || q.heads == 0 || q.heads % k.heads != 0) {
    fail(fn, shape("q", q) + " has " + count(q.heads) +
                 " heads, not a multiple of the " + count(k.heads) +
                 " heads of " + shape("k", k));
  }
  std::size_t dv = out_cols;
  if (v != nullptr) {
    if (v->batch != k.batch || v->heads != k.heads || v->rows != k.rows) {
      fail(fn, shape("v", *v) + " does not match " + shape("k", k) +
                   " in batch, heads and keys");
    }
    if (v->cols == 0) fail(fn, shape("v", *v) + " has d_v = 0");
    dv = v->cols;
  }
  if (out_name != nullptr && (out.batch != q.batch || out.heads != q.heads ||
                              out.rows != q.rows || out.cols != dv)) {
    fail(fn, shape(out_name, out) + " must be " +
                 shape(out_name, q.batch, q.heads, q.rows, dv) + " for " +
                 shape("q", q) + " and " + shape(v ? "v" : "k", v ? *v : k));
  }
  constexpr std::size_t kMaxIndex = std::size_t{1} << 30;
  if (k.rows >= kMaxIndex || q.rows >= kMaxIndex) {
    fail(fn, "n_q = " + count(q.rows) + " and n_kv = " + count(k.rows) +
                 " must be below 2^30");
  }
  Plan p{};
  p.B = q.batch;
  p.H = q.heads;
  p.Hkv = k.heads;
  p.g = q.heads / k.heads;
  p.n_q = q.rows;
  p.n_kv = k.rows;
  p.d = q.cols;
  p.dv = dv;
  // Scale.
  double scale = o.scale;
  if (std::isnan(scale)) scale = 1.0 / std::sqrt(static_cast<double>(p.d));
  const float sf = static_cast<float>(scale);
  if (!(scale > 0.0) || !std::isfinite(scale) || !(sf > 0.0f) ||
      !std::isfinite(sf)) {
    fail(fn, "scale must be finite and > 0 (also as a float), got " +
                 number(o.scale));
  }
  p.scale = sf;
  if (!(o.softcap >= 0.0f) || !std::isfinite(o.softcap)) {
    fail(fn, "softcap must be finite and >= 0, got " + number(o.softcap));
  }
  p.softcap = o.softcap;
  if (o.window_left < -1 || o.window_right < -1) {
    fail(fn, "window_left and window_right must be >= -1, got " +
                 std::to_string(o.window_left) + " and " +
                 std::to_string(o.window_right));
  }
  p.wl = o.window_left;
  p.wr = o.window_right;
  if (o.causal && (p.wr < 0 || p.wr > 0)) p.wr = 0;
  p.kv_end = std::min(o.kv_end, p.n_kv);
  p.kv_begin = o.kv_begin;
  if (p.kv_begin > p.kv_end) {
    fail(fn, "kv_begin " + count(o.kv_begin) + " is past kv_end " +
                 count(p.kv_end) + " (n_kv = " + count(p.n_kv) + ")");
  }
  auto check_extra = [&](const char* name, auto& t) {
    if (t.data == nullptr) return;
    if (t.rows != p.n_q || t.cols != p.n_kv) {
      fail(fn, shape(name, t) + " must have n_q x n_kv = " + count(p.n_q) +
                   " x " + count(p.n_kv) + " rows and cols (" + shape("q", q) +
                   ", " + shape("k", k) + ")");
    }
    if ((t.batch != 1 && t.batch != p.B) || (t.heads != 1 && t.heads != p.H)) {
      fail(fn, shape(name, t) + " must have batch 1 or " + count(p.B) +
                   " and heads 1 or " + count(p.H) + " (" + shape("q", q) +
                   ")");
    }
  };
  check_extra("mask", o.mask);
  check_extra("bias", o.bias);
  if (!o.sinks.empty() && o.sinks.size() != p.H) {
    fail(fn, "sinks has " + count(o.sinks.size()) + " values but " +
                 shape("q", q) + " has " + count(p.H) + " heads");
  }
  return p;
}

template Plan check_and_plan<float>(const char*, const TensorView<const float>&,
                                    const TensorView<const float>&,
                                    const TensorView<const float>*,
                                    const TensorView<float>&, const char*,
                                    std::size_t, const AttentionOptions&);
template Plan check_and_plan<Float16>(const char*,
                                      const TensorView<const float>&,
                                      const TensorView<const Float16>&,
                                      const TensorView<const Float16>*,
                                      const TensorView<float>&, const char*,
                                      std::size_t, const AttentionOptions&);
template Plan check_and_plan<BFloat16>(const char*,
                                       const TensorView<const float>&,
                                       const TensorView<const BFloat16>&,
                                       const TensorView<const BFloat16>*,
                                       const TensorView<float>&, const char*,
                                       std::size_t, const AttentionOptions&);

template Plan check_and_plan<std::int8_t>(const char*,
                                          const TensorView<const float>&,
                                          const TensorView<const std::int8_t>&,
                                          const TensorView<const std::int8_t>*,
                                          const TensorView<float>&, const char*,
                                          std::size_t, const AttentionOptions&);

void check_scales(const char* fn, const char* name,
                  const TensorView<const std::int8_t>& values,
                  const TensorView<const float>& scales) {
  const std::string sname = std::string(name) + " scales";
  check_tensor(fn, sname.c_str(), scales);
  if (scales.batch != values.batch || scales.heads != values.heads ||
      scales.rows != values.rows || scales.cols != 1) {
    fail(fn,
         shape(sname.c_str(), scales) + " must be " +
             shape(sname.c_str(), values.batch, values.heads, values.rows, 1) +
             " for " + shape(name, values));
  }
  for (std::size_t b = 0; b < scales.batch; ++b) {
    for (std::size_t h = 0; h < scales.heads; ++h) {
      for (std::size_t j = 0; j < scales.rows; ++j) {
        const float s = *scales.row(b, h, j);
        if (!(std::isfinite(s) && s >= 0.0f)) {
          fail(fn, sname + "[" + count(b) + ", " + count(h) + ", " + count(j) +
                       "] = " + number(s) + " is not finite and >= 0");
        }
      }
    }
  }
}

}  // namespace softdot::detail::attn
