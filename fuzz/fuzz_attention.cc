// Fuzz target: the argument checks of softdot::attention (src/
// attention_checks.cc, src/attention_checks.h, src/check.h). The fuzzer picks
// shapes, strides, options and the K/V format; each view gets a buffer of
// exactly the elements it spans (a separate allocation, so AddressSanitizer
// sees any read past it), or one element when its span exceeds PTRDIFF_MAX
// bytes (the call must then be rejected). Cases with a view that fits in
// memory but exceeds the harness's cap are not run.
// Every call either throws std::invalid_argument or returns; a call that
// returns is repeated and must give the same bits.
#include <fuzzer/FuzzedDataProvider.h>
#include <softdot/softdot.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <stdexcept>
#include <vector>

#include "fuzz_util.h"
#include "fuzz_views.h"

namespace {

using namespace softdot_fuzz;  // NOLINT: the harness's helpers

// Runs attention twice; the second run must give the same bits.
template <class Call>
void run_twice(Call call, float* out, std::size_t out_n, float* lse,
               std::size_t lse_n) {
  if (g_skip) return;
  try {
    call();
  } catch (const std::invalid_argument&) {
    return;
  }
  std::vector<float> first(out, out + out_n), first_lse;
  if (lse != nullptr) first_lse.assign(lse, lse + lse_n);
  call();
  FUZZ_CHECK(same_bytes(first.data(), out, out_n * sizeof(float)));
  if (lse != nullptr) {
    FUZZ_CHECK(same_bytes(first_lse.data(), lse, lse_n * sizeof(float)));
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
  const std::size_t n_q = f.ConsumeIntegralInRange<std::size_t>(1, 40);
  const std::size_t n_kv = f.ConsumeIntegralInRange<std::size_t>(0, 140);
  const std::size_t d = f.ConsumeIntegralInRange<std::size_t>(1, 20);
  const std::size_t dv = f.ConsumeIntegralInRange<std::size_t>(1, 20);
  const int format = f.ConsumeIntegralInRange<int>(0, 3);

  const Shape qs = pick_shape(f, B, H, n_q, d);
  const Shape ks = pick_shape(f, B, Hkv, n_kv, d);
  const Shape vs = pick_shape(f, B, Hkv, n_kv, dv);
  Shape os = pick_shape(f, B, H, n_q, dv);
  auto value = [&f] { return pick_value(f); };
  const Buffer<float> q = buffer_for<float>(qs, value);
  Buffer<float> out = buffer_for<float>(os, [] { return 0.0f; });
  const softdot::TensorView<float> ov(out.data.get(), os.batch, os.heads,
                                      os.rows, os.cols, os.bs, os.hs, os.rs);

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
    bias = buffer_for<float>(bs, value);
    o.bias = view_of(bias, bs);
  }
  std::vector<float> sinks;
  if (f.ConsumeIntegralInRange<int>(0, 3) == 0) {
    sinks.resize(f.ConsumeIntegralInRange<int>(0, 9) == 0
                     ? f.ConsumeIntegralInRange<std::size_t>(0, 12)
                     : H);
    for (float& s : sinks) s = pick_value(f);
    o.sinks = sinks;
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
  // lse holds batch x heads x n_q of q (the caller's side of the contract),
  // when that is small enough to allocate here.
  std::vector<float> lse;
  std::size_t lse_n = 0;
  if (f.ConsumeBool() && !__builtin_mul_overflow(qs.batch, qs.heads, &lse_n) &&
      !__builtin_mul_overflow(lse_n, qs.rows, &lse_n) && lse_n > 0 &&
      lse_n <= kCapElements) {
    lse.resize(lse_n);
  }
  float* lse_p = lse.empty() ? nullptr : lse.data();
  const softdot::TensorView<const float> qv = view_of(q, qs);
  if (std::getenv("FUZZ_VERBOSE") != nullptr) {
    // The case, for reading a reproducer: FUZZ_VERBOSE=1 fuzz_attention FILE.
    auto print = [](const char* name, const Shape& s, std::size_t buffer) {
      std::fprintf(
          stderr,
          "%s [%zu, %zu, %zu, %zu] strides [%zu, %zu, %zu] buffer %zu\n", name,
          s.batch, s.heads, s.rows, s.cols, s.bs, s.hs, s.rs, buffer);
    };
    print("q", qs, q.size);
    print("k", ks, span_of(ks));
    print("v", vs, span_of(vs));
    print("out", os, out.size);
    if (o.mask.data != nullptr) {
      print("mask",
            Shape{o.mask.batch, o.mask.heads, o.mask.rows, o.mask.cols,
                  o.mask.batch_stride, o.mask.head_stride, o.mask.row_stride},
            mask.size);
    }
    if (o.bias.data != nullptr) {
      print("bias",
            Shape{o.bias.batch, o.bias.heads, o.bias.rows, o.bias.cols,
                  o.bias.batch_stride, o.bias.head_stride, o.bias.row_stride},
            bias.size);
    }
    std::fprintf(
        stderr,
        "format %d causal %d window %td %td softcap %g scale %g mask %d "
        "bias %d sinks %zu kv [%zu, %zu) positions %zu %zu prefill %d "
        "precise %d lse %zu\n",
        format, o.causal, o.window_left, o.window_right,
        static_cast<double>(o.softcap), o.scale.value_or(std::nan("")),
        !o.mask.data ? 0 : 1, !o.bias.data ? 0 : 1, o.sinks.size(), o.kv_begin,
        o.kv_end, o.q_position, o.kv_position, o.prefill_form, o.precise,
        lse.size());
  }

  switch (format) {
    case 0: {
      const Buffer<float> k = buffer_for<float>(ks, value);
      const Buffer<float> v = buffer_for<float>(vs, value);
      run_twice(
          [&] {
            softdot::attention(qv, view_of(k, ks), view_of(v, vs), ov, o,
                               lse_p);
          },
          out.data.get(), out.size, lse_p, lse.size());
      break;
    }
    case 1: {
      auto half = [&] { return softdot::to_float16(pick_value(f)); };
      const Buffer<softdot::Float16> k = buffer_for<softdot::Float16>(ks, half);
      const Buffer<softdot::Float16> v = buffer_for<softdot::Float16>(vs, half);
      run_twice(
          [&] {
            softdot::attention(qv, view_of(k, ks), view_of(v, vs), ov, o,
                               lse_p);
          },
          out.data.get(), out.size, lse_p, lse.size());
      break;
    }
    case 2: {
      auto bf = [&] { return softdot::to_bfloat16(pick_value(f)); };
      const Buffer<softdot::BFloat16> k = buffer_for<softdot::BFloat16>(ks, bf);
      const Buffer<softdot::BFloat16> v = buffer_for<softdot::BFloat16>(vs, bf);
      run_twice(
          [&] {
            softdot::attention(qv, view_of(k, ks), view_of(v, vs), ov, o,
                               lse_p);
          },
          out.data.get(), out.size, lse_p, lse.size());
      break;
    }
    default: {
      auto i8 = [&] { return f.ConsumeIntegral<std::int8_t>(); };
      const Buffer<std::int8_t> k = buffer_for<std::int8_t>(ks, i8);
      const Buffer<std::int8_t> v = buffer_for<std::int8_t>(vs, i8);
      const Shape kss = pick_shape(f, ks.batch, ks.heads, ks.rows, 1);
      const Shape vss = pick_shape(f, vs.batch, vs.heads, vs.rows, 1);
      auto scale = [&] {
        return f.ConsumeIntegralInRange<int>(0, 15) == 0
                   ? pick_value(f)
                   : f.ConsumeFloatingPointInRange<float>(0.0f, 0.1f);
      };
      const Buffer<float> ksc = buffer_for<float>(kss, scale);
      const Buffer<float> vsc = buffer_for<float>(vss, scale);
      const softdot::Int8KV kk{view_of(k, ks), view_of(ksc, kss)};
      const softdot::Int8KV vv{view_of(v, vs), view_of(vsc, vss)};
      run_twice([&] { softdot::attention(qv, kk, vv, ov, o, lse_p); },
                out.data.get(), out.size, lse_p, lse.size());
      break;
    }
  }
  return 0;
}
