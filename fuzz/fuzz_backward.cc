// Fuzz target: softdot::attention_backward (softdot/attention.h), float32
// and its 16-bit forms (bfloat16 and float16 q, k, v, dout and gradients).
// The fuzzer picks shapes, strides (fuzz_attention's: dense, padded, 0, too
// small, arbitrary) and options (causal, window, softcap, scale, mask, bias
// with dbias, sinks with dsinks, key range, positions), lse and dlse; each
// view has its own exactly sized buffer (fuzz_views.h). out and lse come
// from the forward with the same arguments when it accepts them, else they
// are the fuzzer's values.
// Properties: every call returns or throws std::invalid_argument; a call
// that throws wrote no gradient (dq, dk, dv, dbias and dsinks keep their
// bits); a call that returns gives the same bits when repeated; with finite
// inputs and the forward's out and lse, the gradients of a fully hidden row
// are exactly 0 (dq) — checked as: with every mask entry false, dq, dk and
// dv are all +-0.
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
#include <vector>

#include "fuzz_util.h"
#include "fuzz_views.h"

namespace {

using namespace softdot_fuzz;  // NOLINT: the harness's helpers

template <class T>
std::vector<unsigned char> bytes_of(const Buffer<T>& b) {
  const auto* p = reinterpret_cast<const unsigned char*>(b.data.get());
  return std::vector<unsigned char>(p, p + b.size * sizeof(T));
}

template <class T>
T from_float(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else if constexpr (std::is_same_v<T, softdot::Float16>) {
    return softdot::to_float16(x);
  } else {
    return softdot::to_bfloat16(x);
  }
}

float widen(float x) { return x; }
float widen(softdot::Float16 x) { return softdot::to_float(x); }
float widen(softdot::BFloat16 x) { return softdot::to_float(x); }

// Every element of the view s of buffer b is +-0 (padding is not looked at:
// the call does not write it).
template <class T>
bool all_zero(const Buffer<T>& b, const Shape& s) {
  for (std::size_t i = 0; i < s.batch; ++i) {
    for (std::size_t h = 0; h < s.heads; ++h) {
      for (std::size_t r = 0; r < s.rows; ++r) {
        for (std::size_t c = 0; c < s.cols; ++c) {
          if (widen(b.data[i * s.bs + h * s.hs + r * s.rs + c]) != 0.0f) {
            return false;
          }
        }
      }
    }
  }
  return true;
}

template <class T>
void run_case(FuzzedDataProvider& f) {
  const std::size_t B = f.ConsumeIntegralInRange<std::size_t>(1, 2);
  const std::size_t Hkv = f.ConsumeIntegralInRange<std::size_t>(1, 3);
  const std::size_t H = Hkv * f.ConsumeIntegralInRange<std::size_t>(1, 3);
  const std::size_t n_q = f.ConsumeIntegralInRange<std::size_t>(1, 24);
  const std::size_t n_kv = f.ConsumeIntegralInRange<std::size_t>(0, 80);
  const std::size_t d = f.ConsumeIntegralInRange<std::size_t>(1, 16);
  const std::size_t dv = f.ConsumeIntegralInRange<std::size_t>(1, 16);

  const Shape qs = pick_shape(f, B, H, n_q, d);
  const Shape ks = pick_shape(f, B, Hkv, n_kv, d);
  const Shape vs = pick_shape(f, B, Hkv, n_kv, dv);
  const Shape os = pick_shape(f, B, H, n_q, dv);
  const Shape dos = pick_shape(f, B, H, n_q, dv);
  const Shape dqs = pick_shape(f, B, H, n_q, d);
  const Shape dks = pick_shape(f, B, Hkv, n_kv, d);
  const Shape dvs = pick_shape(f, B, Hkv, n_kv, dv);
  auto value = [&f] { return from_float<T>(pick_value(f)); };
  const Buffer<T> q = buffer_for<T>(qs, value);
  const Buffer<T> k = buffer_for<T>(ks, value);
  const Buffer<T> v = buffer_for<T>(vs, value);
  const Buffer<T> dout = buffer_for<T>(dos, value);
  const T fill = from_float<T>(-7.25f);
  const Buffer<T> dq = buffer_for<T>(dqs, [fill] { return fill; });
  const Buffer<T> dk = buffer_for<T>(dks, [fill] { return fill; });
  const Buffer<T> dvb = buffer_for<T>(dvs, [fill] { return fill; });

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
  bool all_hidden = false;
  if (f.ConsumeIntegralInRange<int>(0, 3) == 0) {
    const Shape ms = pick_shape(f, B, H, n_q, n_kv);
    all_hidden = f.ConsumeIntegralInRange<int>(0, 3) == 0;
    mask = buffer_for<bool>(
        ms, [&f, all_hidden] { return all_hidden ? false : f.ConsumeBool(); });
    o.mask = view_of(mask, ms);
  }
  Buffer<float> bias, dbias;
  Shape dbs;
  if (f.ConsumeIntegralInRange<int>(0, 3) == 0) {
    const Shape bs = pick_shape(f, B, H, n_q, n_kv);
    bias = buffer_for<float>(bs, [&f] { return pick_value(f); });
    o.bias = view_of(bias, bs);
  }
  if (f.ConsumeIntegralInRange<int>(0, 3) == 0) {
    dbs = pick_shape(f, B, H, n_q, n_kv);
    dbias = buffer_for<float>(dbs, [] { return -7.25f; });
  }
  std::vector<float> sinks, dsinks;
  if (f.ConsumeIntegralInRange<int>(0, 3) == 0) {
    sinks.resize(f.ConsumeIntegralInRange<int>(0, 9) == 0
                     ? f.ConsumeIntegralInRange<std::size_t>(0, 12)
                     : H);
    for (float& s : sinks) s = pick_value(f);
    o.sinks = sinks;
  }
  if (f.ConsumeIntegralInRange<int>(0, 3) == 0) {
    dsinks.assign(f.ConsumeIntegralInRange<int>(0, 9) == 0
                      ? f.ConsumeIntegralInRange<std::size_t>(0, 12)
                      : H,
                  -7.25f);
  }
  if (f.ConsumeIntegralInRange<int>(0, 3) == 0) {
    o.kv_begin = f.ConsumeIntegralInRange<std::size_t>(0, n_kv + 2);
    o.kv_end = f.ConsumeIntegralInRange<std::size_t>(0, n_kv + 2);
  }
  if (f.ConsumeIntegralInRange<int>(0, 7) == 0) {
    o.kv_position = f.ConsumeIntegralInRange<std::size_t>(0, 100);
    o.q_position = f.ConsumeIntegralInRange<std::size_t>(0, 100);
  }
  // out (float32) and lse: the forward's when it accepts the case (its
  // output written dense into the out buffer's view), else the fuzzer's.
  Buffer<float> out = buffer_for<float>(os, [&f] { return pick_value(f); });
  std::size_t lse_n = 0;
  std::vector<float> lse, dlse;
  const bool forward = f.ConsumeIntegralInRange<int>(0, 3) != 0;
  if (!__builtin_mul_overflow(qs.batch, qs.heads, &lse_n) &&
      !__builtin_mul_overflow(lse_n, qs.rows, &lse_n) && lse_n > 0 &&
      lse_n <= kCapElements) {
    lse.resize(lse_n);
    for (float& x : lse) x = pick_value(f);
    if (f.ConsumeIntegralInRange<int>(0, 3) == 0) {
      dlse.resize(lse_n);
      for (float& x : dlse) x = pick_value(f);
    }
  }
  if (g_skip) return;
  if (std::getenv("FUZZ_VERBOSE") != nullptr) {
    // The case, for reading a reproducer: FUZZ_VERBOSE=1 fuzz_backward FILE.
    auto print = [](const char* name, const Shape& s) {
      std::fprintf(stderr, "%s [%zu, %zu, %zu, %zu] strides [%zu, %zu, %zu]\n",
                   name, s.batch, s.heads, s.rows, s.cols, s.bs, s.hs, s.rs);
    };
    print("q", qs);
    print("k", ks);
    print("v", vs);
    print("out", os);
    print("dout", dos);
    print("dq", dqs);
    print("dk", dks);
    print("dv", dvs);
    if (dbias.data) print("dbias", dbs);
    std::fprintf(stderr,
                 "bytes %zu causal %d window %td %td softcap %g scale %g "
                 "mask %d (all hidden %d) bias %d sinks %zu dsinks %zu "
                 "kv [%zu, %zu) lse %zu dlse %zu forward %d\n",
                 sizeof(T), o.causal, o.window_left, o.window_right,
                 static_cast<double>(o.softcap), o.scale.value_or(std::nan("")),
                 o.mask.data != nullptr, all_hidden, o.bias.data != nullptr,
                 o.sinks.size(), dsinks.size(), o.kv_begin, o.kv_end,
                 lse.size(), dlse.size(), forward);
  }
  bool forward_ran = false;
  if (forward && !lse.empty()) {
    try {
      // A 16-bit query with a float32 output: a request (as the Python
      // autograd asks for it, attention.h).
      softdot::AttentionRequest r;
      r.q = view_of(q, qs);
      r.kv = softdot::KVSource::contiguous(view_of(k, ks), view_of(v, vs));
      r.target =
          softdot::AttentionTarget::output(mut_view_of(out, os), lse.data());
      r.options = o;
      softdot::run_attention(r);
      forward_ran = true;
    } catch (const std::invalid_argument&) {
    }
  }
  const float* lse_p = lse.empty() ? nullptr : lse.data();
  const float* dlse_p = dlse.empty() ? nullptr : dlse.data();

  auto grad_bytes = [&] {
    std::vector<unsigned char> all = bytes_of(dq);
    for (const auto& part : {bytes_of(dk), bytes_of(dvb), bytes_of(dbias)}) {
      all.insert(all.end(), part.begin(), part.end());
    }
    const auto* s = reinterpret_cast<const unsigned char*>(dsinks.data());
    all.insert(all.end(), s, s + dsinks.size() * sizeof(float));
    return all;
  };
  auto call = [&] {
    const softdot::TensorView<float> dbias_v =
        dbias.data ? mut_view_of(dbias, dbs) : softdot::TensorView<float>();
    if constexpr (std::is_same_v<T, float>) {
      softdot::AttentionGradients g;
      g.dq = mut_view_of(dq, dqs);
      g.dk = mut_view_of(dk, dks);
      g.dv = mut_view_of(dvb, dvs);
      g.dbias = dbias_v;
      g.dsinks = dsinks;
      softdot::attention_backward(view_of(q, qs), view_of(k, ks),
                                  view_of(v, vs), view_of(out, os), lse_p,
                                  view_of(dout, dos), g, o, dlse_p);
    } else {
      softdot::AttentionGradients16<T> g;
      g.dq = mut_view_of(dq, dqs);
      g.dk = mut_view_of(dk, dks);
      g.dv = mut_view_of(dvb, dvs);
      g.dbias = dbias_v;
      g.dsinks = dsinks;
      softdot::attention_backward(view_of(q, qs), view_of(k, ks),
                                  view_of(v, vs), view_of(out, os), lse_p,
                                  view_of(dout, dos), g, o, dlse_p);
    }
  };
  const std::vector<unsigned char> before = grad_bytes();
  try {
    call();
  } catch (const std::invalid_argument&) {
    FUZZ_CHECK(grad_bytes() == before);
    return;
  }
  const std::vector<unsigned char> first = grad_bytes();
  call();
  FUZZ_CHECK(grad_bytes() == first);
  // Every key hidden (the forward ran, so the mask has its shape): no
  // gradient reaches q, k or v, whatever the inputs hold.
  if (forward_ran && all_hidden && dlse.empty() && o.sinks.empty()) {
    FUZZ_CHECK(all_zero(dq, dqs));
    FUZZ_CHECK(all_zero(dk, dks));
    FUZZ_CHECK(all_zero(dvb, dvs));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data,
                                      std::size_t size) {
  FuzzedDataProvider f(data, size);
  g_skip = false;
  switch (f.ConsumeIntegralInRange<int>(0, 5)) {
    case 4:
      run_case<softdot::BFloat16>(f);
      break;
    case 5:
      run_case<softdot::Float16>(f);
      break;
    default:
      run_case<float>(f);
      break;
  }
  return 0;
}
