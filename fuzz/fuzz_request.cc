// Fuzz target: the attention request (softdot/attention_request.h), the one
// entry point every attention call goes through: AttentionPlan::make checks
// a request, run() computes it. The fuzzer picks the target (an output with
// a float32, float16 or bfloat16 query and output, and lse; a partial
// result; the weights; the scores), the K/V source (float32, float16,
// bfloat16 or int8; keys only, or keys and values), shapes, strides and the
// options (fuzz_attention's), with each view in its own exactly sized
// buffer (fuzz_views.h).
// Properties: make() returns or throws std::invalid_argument whose message
// starts with "softdot::<name>: "; a request make() rejects wrote nothing
// (the target's memory keeps its bits); a plan that runs gives the same bits
// when run again; the plan's visible keys of each row lie in [0, n_kv); a
// weights target's weights lie in [0, 1] (or are NaN) and a row's sum at
// most 1 + n 2^-22; check_attention_options() rejects no options make()
// accepted.
#include <fuzzer/FuzzedDataProvider.h>
#include <softdot/attention_request.h>
#include <softdot/softdot.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "fuzz_views.h"

namespace {

using namespace softdot_fuzz;  // NOLINT: the harness's helpers

// The bytes of a buffer, to compare before and after a call.
template <class T>
std::vector<unsigned char> bytes_of(const Buffer<T>& b) {
  const auto* p = reinterpret_cast<const unsigned char*>(b.data.get());
  return std::vector<unsigned char>(p, p + b.size * sizeof(T));
}

template <class T>
Buffer<T> kv_buffer(FuzzedDataProvider& f, const Shape& s) {
  if constexpr (std::is_same_v<T, float>) {
    return buffer_for<float>(s, [&f] { return pick_value(f); });
  } else if constexpr (std::is_same_v<T, softdot::Float16>) {
    return buffer_for<T>(s,
                         [&f] { return softdot::to_float16(pick_value(f)); });
  } else {
    return buffer_for<T>(s,
                         [&f] { return softdot::to_bfloat16(pick_value(f)); });
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data,
                                      std::size_t size) {
  FuzzedDataProvider f(data, size);
  g_skip = false;
  const std::size_t B = f.ConsumeIntegralInRange<std::size_t>(1, 2);
  const std::size_t Hkv = f.ConsumeIntegralInRange<std::size_t>(1, 3);
  const std::size_t H = Hkv * f.ConsumeIntegralInRange<std::size_t>(1, 3);
  const std::size_t n_q = f.ConsumeIntegralInRange<std::size_t>(1, 24);
  const std::size_t n_kv = f.ConsumeIntegralInRange<std::size_t>(0, 80);
  const std::size_t d = f.ConsumeIntegralInRange<std::size_t>(1, 16);
  const std::size_t dv = f.ConsumeIntegralInRange<std::size_t>(1, 16);
  const int kv_format = f.ConsumeIntegralInRange<int>(0, 3);
  const int q_format = f.ConsumeIntegralInRange<int>(0, 5) < 3
                           ? 0
                           : f.ConsumeIntegralInRange<int>(1, 2);
  const int out_format = f.ConsumeIntegralInRange<int>(0, 5) < 3
                             ? 0
                             : f.ConsumeIntegralInRange<int>(1, 2);
  const int kind = f.ConsumeIntegralInRange<int>(0, 3);
  const bool has_v = kind <= 1 ? f.ConsumeIntegralInRange<int>(0, 15) != 0
                               : f.ConsumeIntegralInRange<int>(0, 15) == 0;

  const Shape qs = pick_shape(f, B, H, n_q, d);
  const Shape ks = pick_shape(f, B, Hkv, n_kv, d);
  const Shape vs = pick_shape(f, B, Hkv, n_kv, dv);
  const Shape os = pick_shape(f, B, H, n_q, kind >= 2 ? n_kv : dv);

  softdot::AttentionOptions o;
  if (f.ConsumeBool()) o.causal = true;
  if (f.ConsumeIntegralInRange<int>(0, 3) == 0) {
    o.window_left = f.ConsumeIntegralInRange<std::ptrdiff_t>(-2, 50);
    o.window_right = f.ConsumeIntegralInRange<std::ptrdiff_t>(-2, 50);
  }
  if (f.ConsumeIntegralInRange<int>(0, 3) == 0) o.softcap = pick_value(f);
  if (f.ConsumeIntegralInRange<int>(0, 3) == 0) {
    o.scale = f.ConsumeFloatingPoint<double>();
  }
  Buffer<bool> mask;
  if (f.ConsumeIntegralInRange<int>(0, 3) == 0) {
    const Shape ms = pick_shape(f, B, H, n_q, n_kv);
    mask = buffer_for<bool>(ms, [&f] { return f.ConsumeBool(); });
    o.mask = view_of(mask, ms);
  }
  Buffer<float> bias;
  if (f.ConsumeIntegralInRange<int>(0, 3) == 0) {
    const Shape bs = pick_shape(f, B, H, n_q, n_kv);
    bias = buffer_for<float>(bs, [&f] { return pick_value(f); });
    o.bias = view_of(bias, bs);
  }
  std::vector<float> sinks, slopes;
  if (f.ConsumeIntegralInRange<int>(0, 3) == 0) {
    sinks.resize(f.ConsumeIntegralInRange<int>(0, 9) == 0
                     ? f.ConsumeIntegralInRange<std::size_t>(0, 12)
                     : H);
    for (float& s : sinks) s = pick_value(f);
    o.sinks = sinks;
  }
  if (f.ConsumeIntegralInRange<int>(0, 5) == 0) {
    slopes.resize(f.ConsumeIntegralInRange<int>(0, 9) == 0
                      ? f.ConsumeIntegralInRange<std::size_t>(0, 12)
                      : H);
    for (float& s : slopes) s = pick_value(f);
    o.alibi_slopes = slopes;
  }
  if (f.ConsumeIntegralInRange<int>(0, 3) == 0) {
    o.kv_begin = f.ConsumeIntegralInRange<std::size_t>(0, n_kv + 2);
    o.kv_end = f.ConsumeIntegralInRange<std::size_t>(0, n_kv + 2);
  }
  if (f.ConsumeIntegralInRange<int>(0, 7) == 0) {
    o.kv_position = f.ConsumeIntegralInRange<std::size_t>(0, 100);
    o.q_position = f.ConsumeIntegralInRange<std::size_t>(0, 100);
  }
  o.prefill_form = f.ConsumeIntegralInRange<int>(0, 7) == 0;
  o.precise = f.ConsumeIntegralInRange<int>(0, 7) == 0;
  o.batch_invariant = f.ConsumeIntegralInRange<int>(0, 7) == 0;

  softdot::AttentionRequest r;
  r.name = f.ConsumeBool() ? "attention" : "fuzz_request";

  // The query.
  Buffer<float> q32;
  Buffer<softdot::Float16> q16;
  Buffer<softdot::BFloat16> qb;
  if (q_format == 0) {
    q32 = kv_buffer<float>(f, qs);
    r.q = view_of(q32, qs);
  } else if (q_format == 1) {
    q16 = kv_buffer<softdot::Float16>(f, qs);
    r.q = view_of(q16, qs);
  } else {
    qb = kv_buffer<softdot::BFloat16>(f, qs);
    r.q = view_of(qb, qs);
  }

  // Keys and values.
  Buffer<float> k32, v32, ksc, vsc;
  Buffer<softdot::Float16> k16, v16;
  Buffer<softdot::BFloat16> kb, vb;
  Buffer<std::int8_t> k8, v8;
  softdot::KVTensor kt, vt;
  switch (kv_format) {
    case 0:
      k32 = kv_buffer<float>(f, ks);
      v32 = kv_buffer<float>(f, vs);
      kt = view_of(k32, ks);
      vt = view_of(v32, vs);
      break;
    case 1:
      k16 = kv_buffer<softdot::Float16>(f, ks);
      v16 = kv_buffer<softdot::Float16>(f, vs);
      kt = view_of(k16, ks);
      vt = view_of(v16, vs);
      break;
    case 2:
      kb = kv_buffer<softdot::BFloat16>(f, ks);
      vb = kv_buffer<softdot::BFloat16>(f, vs);
      kt = view_of(kb, ks);
      vt = view_of(vb, vs);
      break;
    default: {
      auto i8 = [&] { return f.ConsumeIntegral<std::int8_t>(); };
      k8 = buffer_for<std::int8_t>(ks, i8);
      v8 = buffer_for<std::int8_t>(vs, i8);
      const Shape kss = pick_shape(f, ks.batch, ks.heads, ks.rows, 1);
      const Shape vss = pick_shape(f, vs.batch, vs.heads, vs.rows, 1);
      auto scale = [&] {
        return f.ConsumeIntegralInRange<int>(0, 15) == 0
                   ? pick_value(f)
                   : f.ConsumeFloatingPointInRange<float>(0.0f, 0.1f);
      };
      ksc = buffer_for<float>(kss, scale);
      vsc = buffer_for<float>(vss, scale);
      kt = softdot::Int8KV{view_of(k8, ks), view_of(ksc, kss)};
      vt = softdot::Int8KV{view_of(v8, vs), view_of(vsc, vss)};
      break;
    }
  }
  r.kv = has_v ? softdot::KVSource::contiguous(kt, vt)
               : softdot::KVSource::keys(kt);

  // The target, filled with a pattern so that a write shows.
  Buffer<float> o32;
  Buffer<softdot::Float16> o16;
  Buffer<softdot::BFloat16> ob;
  std::vector<float> lse;
  softdot::AttentionPartial partial;
  const float fill = -7.25f;
  if (kind == 1) {
    // run() allocates the partial: B x H x n_q x d_v doubles. Like a view
    // that fits in memory but not in the harness's cap, a partial that size
    // is the caller's to back (std::bad_alloc beyond memory), so the case is
    // not run; one beyond PTRDIFF_MAX bytes must be rejected.
    std::size_t n = 0;
    if (!__builtin_mul_overflow(qs.batch, qs.heads, &n) &&
        !__builtin_mul_overflow(n, qs.rows, &n) &&
        !__builtin_mul_overflow(n, vs.cols, &n) && n > kCapElements &&
        n <= static_cast<std::size_t>(PTRDIFF_MAX) / sizeof(double)) {
      g_skip = true;
    }
    r.target = softdot::AttentionTarget::partial_result(partial);
  } else if (kind >= 2 || out_format == 0) {
    o32 = buffer_for<float>(os, [fill] { return fill; });
    const softdot::TensorView<float> ov = mut_view_of(o32, os);
    if (kind == 2) {
      r.target = softdot::AttentionTarget::weights(ov);
    } else if (kind == 3) {
      r.target = softdot::AttentionTarget::scores(ov);
    } else {
      r.target = softdot::AttentionTarget::output(ov);
    }
  } else if (out_format == 1) {
    o16 = buffer_for<softdot::Float16>(
        os, [fill] { return softdot::to_float16(fill); });
    r.target = softdot::AttentionTarget::output(
        softdot::OutputTensor(mut_view_of(o16, os)));
  } else {
    ob = buffer_for<softdot::BFloat16>(
        os, [fill] { return softdot::to_bfloat16(fill); });
    r.target = softdot::AttentionTarget::output(
        softdot::OutputTensor(mut_view_of(ob, os)));
  }
  std::size_t lse_n = 0;
  if (kind == 0 && f.ConsumeBool() &&
      !__builtin_mul_overflow(qs.batch, qs.heads, &lse_n) &&
      !__builtin_mul_overflow(lse_n, qs.rows, &lse_n) && lse_n > 0 &&
      lse_n <= kCapElements) {
    lse.assign(lse_n, fill);
    r.target.lse = lse.data();
  }
  r.options = o;
  if (g_skip) return 0;
  if (std::getenv("FUZZ_VERBOSE") != nullptr) {
    // The case, for reading a reproducer: FUZZ_VERBOSE=1 fuzz_request FILE.
    auto print = [](const char* name, const Shape& s) {
      std::fprintf(stderr, "%s [%zu, %zu, %zu, %zu] strides [%zu, %zu, %zu]\n",
                   name, s.batch, s.heads, s.rows, s.cols, s.bs, s.hs, s.rs);
    };
    print("q", qs);
    print("k", ks);
    print("v", vs);
    print("out", os);
    std::fprintf(stderr,
                 "kind %d q %d out %d kv %d has_v %d causal %d window %td %td "
                 "softcap %g scale %g mask %d bias %d sinks %zu slopes %zu "
                 "kv [%zu, %zu) lse %zu\n",
                 kind, q_format, out_format, kv_format, has_v, o.causal,
                 o.window_left, o.window_right, static_cast<double>(o.softcap),
                 o.scale.value_or(std::nan("")), o.mask.data != nullptr,
                 o.bias.data != nullptr, o.sinks.size(), o.alibi_slopes.size(),
                 o.kv_begin, o.kv_end, lse.size());
  }

  auto target_bytes = [&] {
    std::vector<unsigned char> all = bytes_of(o32);
    const auto a = bytes_of(o16);
    const auto b = bytes_of(ob);
    all.insert(all.end(), a.begin(), a.end());
    all.insert(all.end(), b.begin(), b.end());
    const auto* l = reinterpret_cast<const unsigned char*>(lse.data());
    all.insert(all.end(), l, l + lse.size() * sizeof(float));
    return all;
  };
  const std::vector<unsigned char> before = target_bytes();
  const std::string prefix = std::string("softdot::") + r.name + ": ";

  softdot::AttentionPlan* plan_p = nullptr;
  std::vector<softdot::AttentionPlan> holder;
  try {
    holder.push_back(softdot::AttentionPlan::make(r));
    plan_p = &holder.back();
  } catch (const std::invalid_argument& e) {
    FUZZ_CHECK(std::string(e.what()).rfind(prefix, 0) == 0);
    FUZZ_CHECK(target_bytes() == before);
    FUZZ_CHECK(partial.out.empty() && partial.max.empty());
    return 0;
  }
  const softdot::AttentionPlan& plan = *plan_p;
  // Options make() accepted pass the early check too.
  try {
    softdot::check_attention_options(o, r.name);
  } catch (const std::invalid_argument&) {
    FUZZ_CHECK(false);
  }
  // Each row's visible keys lie within the keys.
  for (std::size_t b = 0; b < plan.batch(); ++b) {
    const std::size_t keys = plan.keys(b);
    for (std::size_t i = 0; i < plan.sequence_rows(b); ++i) {
      const softdot::KeyRange kr = plan.visible_keys(b, i);
      FUZZ_CHECK(kr.empty() || kr.end <= keys);
    }
  }

  plan.run();
  const std::vector<unsigned char> first = target_bytes();
  const softdot::AttentionPartial first_partial = partial;
  plan.run();
  FUZZ_CHECK(target_bytes() == first);
  if (kind == 1) {
    FUZZ_CHECK(same_bits(partial.max, first_partial.max));
    FUZZ_CHECK(same_bits(partial.sum, first_partial.sum));
    FUZZ_CHECK(same_bits(partial.out, first_partial.out));
  }
  if (kind == 2) {
    // Weights: each in [0, 1] or NaN; a row without NaN sums to at most 1
    // (sinks take a share) plus the float roundings.
    for (std::size_t b = 0; b < os.batch; ++b) {
      for (std::size_t h = 0; h < os.heads; ++h) {
        for (std::size_t i = 0; i < os.rows; ++i) {
          double sum = 0.0;
          bool nan = false;
          for (std::size_t j = 0; j < os.cols; ++j) {
            const float w = o32.data[b * os.bs + h * os.hs + i * os.rs + j];
            if (std::isnan(w)) {
              nan = true;
              continue;
            }
            FUZZ_CHECK(w >= 0.0f && w <= 1.0f);
            sum += w;
          }
          // Rows that overlap (a self-overlapping target, which the
          // library does not reject) hold another row's weights too.
          const bool disjoint =
              (os.rows <= 1 || os.rs >= os.cols) &&
              (os.heads <= 1 || os.hs >= (os.rows - 1) * os.rs + os.cols) &&
              (os.batch <= 1 || os.bs >= (os.heads - 1) * os.hs +
                                             (os.rows - 1) * os.rs + os.cols);
          if (!nan && disjoint) {
            FUZZ_CHECK(sum <= 1.0 + static_cast<double>(os.cols) * 0x1p-22);
          }
        }
      }
    }
  }
  return 0;
}
