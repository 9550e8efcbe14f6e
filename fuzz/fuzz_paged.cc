// Fuzz target: the serving engines' calls on a paged cache (issue 26):
// paged_attention over a ragged batch (query_start_loc, draft trees, ALiBi
// slopes, batch_invariant; bfloat16 pages with a float32 or a bfloat16
// query) and write_kv. The fuzzer picks the batch, the
// table (page indices, lengths), the query starts, the parents, the slopes,
// the slots and the formats; every buffer holds exactly the
// elements its view spans (a separate allocation, so AddressSanitizer sees
// any read or write past it). Every call either throws
// std::invalid_argument or returns; paged_attention that returns is
// repeated and must give the same bits, and must equal each sequence's call
// alone (with batch_invariant, causal and no tree, each row must equal that
// token decoded alone); write_kv that throws must leave the pages as they were,
// and one that returns must have stored each written float32 row exactly.
#include <fuzzer/FuzzedDataProvider.h>
#include <softdot/softdot.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <stdexcept>
#include <vector>

#include "fuzz_util.h"

namespace {

using softdot::BFloat16;
using softdot::Float16;
using softdot::Int8KV;
using softdot::Int8Pages;
using softdot::PagedKVTable;
using softdot::TensorView;

template <class T>
T value_of(FuzzedDataProvider& f) {
  const float x =
      static_cast<float>(f.ConsumeIntegralInRange<int>(-64, 64)) / 16.0f;
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else if constexpr (std::is_same_v<T, Float16>) {
    return softdot::to_float16(x);
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    return softdot::to_bfloat16(x);
  } else if constexpr (std::is_same_v<T, std::int8_t>) {
    return static_cast<std::int8_t>(f.ConsumeIntegralInRange<int>(-127, 127));
  } else {
    // fp8: any pattern, NaN and e5m2's infinities included.
    return T{f.ConsumeIntegral<std::uint8_t>()};
  }
}

template <class T>
constexpr bool kFp8 = std::is_same_v<T, softdot::Float8E4M3> ||
                      std::is_same_v<T, softdot::Float8E5M2>;

struct Case {
  std::size_t B = 1, H = 1, Hkv = 1, d = 1, dv = 1, ps = 1, P = 1, bps = 1;
  std::vector<std::int32_t> table, lens, qsl, parents;
  std::vector<float> slopes;
  std::size_t T = 0;
  softdot::AttentionOptions o;
};

// The ragged call of format T (int8 and fp8 with scales; fp8 per token or
// per tensor), and each sequence alone.
template <class T>
void attend(FuzzedDataProvider& f, const Case& c) {
  constexpr bool kInt8 = std::is_same_v<T, std::int8_t> || kFp8<T>;
  const bool per_tensor = kFp8<T> && f.ConsumeBool();
  std::vector<T> k(c.P * c.Hkv * c.ps * c.d), v(c.P * c.Hkv * c.ps * c.dv);
  for (auto& x : k) x = value_of<T>(f);
  for (auto& x : v) x = value_of<T>(f);
  std::vector<float> ks(kInt8 ? c.P * c.Hkv * c.ps : 0, 0.125f),
      vs(kInt8 ? c.P * c.Hkv * c.ps : 0, 0.25f);
  std::vector<float> q(c.T * c.H * c.d);
  for (auto& x : q) x = value_of<float>(f);
  // bfloat16 pages may take a bfloat16 query (the engines' call: the
  // decode form on the bfloat16 units where the CPU has them).
  const bool q_bf16 = std::is_same_v<T, BFloat16> && f.ConsumeBool();
  // The units' model (this build's one target, AVX2, has no hardware unit):
  // the decode form on the units, and the units' prefill form.
  struct Unit {
    explicit Unit(bool model) {
      if (!model) return;
      try {
        softdot::force_matrix_unit("model");
      } catch (const std::invalid_argument&) {  // no FMA target: none
      }
    }
    ~Unit() { softdot::force_matrix_unit(""); }
  } unit(q_bf16 && f.ConsumeBool());
  std::vector<BFloat16> q16(q_bf16 ? q.size() : 0);
  for (std::size_t i = 0; i < q16.size(); ++i) {
    q16[i] = softdot::to_bfloat16(q[i]);
  }
  const TensorView<const T> kp(k.data(), c.P, c.Hkv, c.ps, c.d);
  const TensorView<const T> vp(v.data(), c.P, c.Hkv, c.ps, c.dv);
  const TensorView<const float> ksv(ks.data(), c.P, c.Hkv, c.ps, 1);
  const TensorView<const float> vsv(vs.data(), c.P, c.Hkv, c.ps, 1);
  // vLLM's [T, H, d] query and output: rows q0 .. q0 + rows - 1.
  auto run = [&](std::size_t q0, std::size_t rows, const PagedKVTable& t,
                 std::vector<float>& out) {
    out.assign(rows * c.H * c.dv, -7.0f);
    const TensorView<float> ov(out.data(), 1, c.H, rows, c.dv, 0, c.dv,
                               c.H * c.dv);
    const TensorView<const float> qq(q.data() + q0 * c.H * c.d, 1, c.H, rows,
                                     c.d, 0, c.d, c.H * c.d);
    if constexpr (kFp8<T>) {
      const softdot::Float8KV<T> k8{
          kp, per_tensor ? TensorView<const float>{} : ksv,
          per_tensor ? 0.5f : 1.0f};
      const softdot::Float8KV<T> v8{
          vp, per_tensor ? TensorView<const float>{} : vsv,
          per_tensor ? 0.375f : 1.0f};
      softdot::paged_attention(qq, k8, v8, t, ov, c.o);
    } else if constexpr (kInt8) {
      softdot::paged_attention(qq, Int8KV{kp, ksv}, Int8KV{vp, vsv}, t, ov,
                               c.o);
    } else if (q_bf16) {
      softdot::AttentionRequest req;
      req.name = "paged_attention";
      req.q = TensorView<const BFloat16>(q16.data() + q0 * c.H * c.d, 1, c.H,
                                         rows, c.d, 0, c.d, c.H * c.d);
      req.kv = softdot::KVSource::pages(kp, vp, t);
      req.target = softdot::AttentionTarget::output(ov, nullptr);
      req.options = c.o;
      softdot::run_attention(req);
    } else {
      softdot::paged_attention(qq, kp, vp, t, ov, c.o);
    }
  };
  PagedKVTable t{c.table, c.bps, c.lens};
  t.query_start_loc = c.qsl;
  t.draft_parents = c.parents;
  std::vector<float> out1, out2;
  try {
    run(0, c.T, t, out1);
  } catch (const std::invalid_argument&) {
    return;
  }
  run(0, c.T, t, out2);
  FUZZ_CHECK(
      softdot_fuzz::same_bytes(out1.data(), out2.data(), out1.size() * 4));
  // Each sequence alone: the same bits.
  for (std::size_t b = 0; b < c.B; ++b) {
    const auto q0 = static_cast<std::size_t>(c.qsl[b]);
    const std::size_t n = static_cast<std::size_t>(c.qsl[b + 1]) - q0;
    if (n == 0) continue;
    PagedKVTable tb;
    tb.block_table =
        std::span<const std::int32_t>(c.table).subspan(b * c.bps, c.bps);
    tb.blocks_per_seq = c.bps;
    tb.seq_lens = std::span<const std::int32_t>(c.lens).subspan(b, 1);
    if (!c.parents.empty()) {
      tb.draft_parents =
          std::span<const std::int32_t>(c.parents).subspan(q0, n);
    }
    std::vector<float> ob;
    run(q0, n, tb, ob);
    FUZZ_CHECK(softdot_fuzz::same_bytes(
        ob.data(), out1.data() + q0 * c.H * c.dv, ob.size() * 4));
    // batch_invariant: each row as the token decoded alone (causal, no
    // tree: the row at position lens[b] - n + i sees keys 0 .. that).
    if (!c.o.batch_invariant || !c.o.causal || !c.parents.empty()) continue;
    for (std::size_t i = 0; i < n; ++i) {
      const std::int64_t len =
          std::int64_t(c.lens[b]) - std::int64_t(n) + std::int64_t(i) + 1;
      if (len < 1) continue;
      const auto len32 = static_cast<std::int32_t>(len);
      tb.seq_lens = std::span<const std::int32_t>(&len32, 1);
      tb.draft_parents = {};
      std::vector<float> oi;
      run(q0 + i, 1, tb, oi);
      FUZZ_CHECK(softdot_fuzz::same_bytes(
          oi.data(), out1.data() + (q0 + i) * c.H * c.dv, oi.size() * 4));
    }
  }
}

// write_kv of float32 rows into pages of format P.
template <class P>
void write(FuzzedDataProvider& f, const Case& c) {
  constexpr bool kInt8 = std::is_same_v<P, std::int8_t>;
  const bool per_tensor = kFp8<P> && f.ConsumeBool();
  const std::size_t T = f.ConsumeIntegralInRange<std::size_t>(0, 12);
  std::vector<std::int64_t> slots(T);
  for (auto& s : slots) {
    switch (f.ConsumeIntegralInRange<int>(0, 7)) {
      case 0:
        s = -1;
        break;
      case 1:
        s = f.ConsumeIntegral<std::int64_t>();
        break;
      default:
        s = f.ConsumeIntegralInRange<std::int64_t>(-2,
                                                   std::int64_t(c.P * c.ps));
    }
  }
  if (f.ConsumeBool() && T > 0) slots.pop_back();  // a count mismatch
  std::vector<float> key(T * c.Hkv * c.d), val(T * c.Hkv * c.dv);
  for (auto& x : key)
    x = f.ConsumeIntegralInRange<int>(0, 40) == 0
            ? std::numeric_limits<float>::infinity()
            : value_of<float>(f);
  for (auto& x : val) x = value_of<float>(f);
  std::vector<P> kp(c.P * c.Hkv * c.ps * c.d, P{}),
      vp(c.P * c.Hkv * c.ps * c.dv, P{});
  std::vector<float> ks(c.P * c.Hkv * c.ps, 3.0f), vs(c.P * c.Hkv * c.ps, 3.0f);
  const auto kp0 = kp, vp0 = vp;
  const auto ks0 = ks;
  const TensorView<const float> kv(key.data(), 1, c.Hkv, T, c.d, 0, c.d,
                                   c.Hkv * c.d);
  const TensorView<const float> vv(val.data(), 1, c.Hkv, T, c.dv, 0, c.dv,
                                   c.Hkv * c.dv);
  const TensorView<P> kpv(kp.data(), c.P, c.Hkv, c.ps, c.d);
  const TensorView<P> vpv(vp.data(), c.P, c.Hkv, c.ps, c.dv);
  try {
    if constexpr (kFp8<P>) {
      const TensorView<float> ksv(ks.data(), c.P, c.Hkv, c.ps, 1);
      const TensorView<float> vsv(vs.data(), c.P, c.Hkv, c.ps, 1);
      softdot::write_kv(
          kv, vv,
          softdot::Float8Pages<P>{kpv, per_tensor ? TensorView<float>{} : ksv,
                                  per_tensor ? 0.25f : 1.0f},
          softdot::Float8Pages<P>{vpv, per_tensor ? TensorView<float>{} : vsv,
                                  per_tensor ? 0.25f : 1.0f},
          slots);
    } else if constexpr (kInt8) {
      softdot::write_kv(
          kv, vv,
          Int8Pages{kpv, TensorView<float>(ks.data(), c.P, c.Hkv, c.ps, 1)},
          Int8Pages{vpv, TensorView<float>(vs.data(), c.P, c.Hkv, c.ps, 1)},
          slots);
    } else {
      softdot::write_kv(kv, vv, kpv, vpv, slots);
    }
  } catch (const std::invalid_argument&) {
    FUZZ_CHECK(
        softdot_fuzz::same_bytes(kp.data(), kp0.data(), kp.size() * sizeof(P)));
    FUZZ_CHECK(
        softdot_fuzz::same_bytes(vp.data(), vp0.data(), vp.size() * sizeof(P)));
    FUZZ_CHECK(softdot_fuzz::same_bytes(ks.data(), ks0.data(), ks.size() * 4));
    return;
  }
  if constexpr (std::is_same_v<P, float>) {
    for (std::size_t t = 0; t < slots.size(); ++t) {
      if (slots[t] < 0) continue;
      const auto s = static_cast<std::size_t>(slots[t]);
      for (std::size_t h = 0; h < c.Hkv; ++h) {
        FUZZ_CHECK(softdot_fuzz::same_bytes(
            kp.data() + ((s / c.ps * c.Hkv + h) * c.ps + s % c.ps) * c.d,
            key.data() + (t * c.Hkv + h) * c.d, c.d * 4));
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data,
                                      std::size_t size) {
  FuzzedDataProvider f(data, size);
  Case c;
  c.B = f.ConsumeIntegralInRange<std::size_t>(1, 5);
  c.Hkv = f.ConsumeIntegralInRange<std::size_t>(1, 3);
  c.H = c.Hkv * f.ConsumeIntegralInRange<std::size_t>(1, 4) +
        (f.ConsumeIntegralInRange<int>(0, 15) == 0
             ? 1
             : 0);  // sometimes not a multiple
  c.d = f.ConsumeIntegralInRange<std::size_t>(1, 20);
  c.dv = f.ConsumeIntegralInRange<std::size_t>(1, 20);
  c.ps = f.ConsumeIntegralInRange<std::size_t>(1, 9);
  c.P = f.ConsumeIntegralInRange<std::size_t>(1, 12);
  c.bps = f.ConsumeIntegralInRange<std::size_t>(0, 8);
  c.table.resize(c.B * c.bps);
  for (auto& e : c.table) {
    e = f.ConsumeIntegralInRange<int>(0, 20) == 0
            ? f.ConsumeIntegral<std::int32_t>()
            : f.ConsumeIntegralInRange<std::int32_t>(-1, std::int32_t(c.P) - 1);
  }
  c.lens.resize(c.B);
  for (auto& n : c.lens) {
    n = f.ConsumeIntegralInRange<int>(0, 20) == 0
            ? f.ConsumeIntegral<std::int32_t>()
            : f.ConsumeIntegralInRange<std::int32_t>(
                  0, std::int32_t(c.bps * c.ps));
  }
  // Query starts: usually valid, sometimes not.
  c.qsl.assign(1, f.ConsumeIntegralInRange<int>(0, 30) == 0 ? 1 : 0);
  for (std::size_t b = 0; b < c.B; ++b) {
    c.qsl.push_back(
        c.qsl.back() +
        f.ConsumeIntegralInRange<std::int32_t>(
            f.ConsumeIntegralInRange<int>(0, 30) == 0 ? -2 : 0, 20));
  }
  if (f.ConsumeIntegralInRange<int>(0, 30) == 0) c.qsl.pop_back();
  c.T = std::max<std::int32_t>(0, c.qsl.back()) +
        (f.ConsumeIntegralInRange<int>(0, 30) == 0 ? 1 : 0);
  c.T = std::min<std::size_t>(c.T, 200);
  c.o.causal = f.ConsumeBool();
  if (f.ConsumeBool())
    c.o.window_left = f.ConsumeIntegralInRange<std::int64_t>(0, 40);
  if (f.ConsumeBool()) c.o.softcap = 3.0f;
  c.o.batch_invariant = f.ConsumeBool();
  if (f.ConsumeIntegralInRange<int>(0, 3) == 0) {
    // A draft tree: parents usually before their row, sometimes not.
    const std::size_t n = c.T + (f.ConsumeIntegralInRange<int>(0, 20) == 0);
    for (std::size_t t = 0; t < n; ++t) {
      c.parents.push_back(f.ConsumeIntegralInRange<std::int32_t>(-2, 6));
    }
  }
  if (f.ConsumeIntegralInRange<int>(0, 3) == 0) {
    const std::size_t n = c.H + (f.ConsumeIntegralInRange<int>(0, 20) == 0);
    for (std::size_t h = 0; h < n; ++h) {
      c.slopes.push_back(f.ConsumeIntegralInRange<int>(0, 40) == 0
                             ? std::numeric_limits<float>::quiet_NaN()
                             : value_of<float>(f));
    }
    c.o.alibi_slopes = c.slopes;
  }
  switch (f.ConsumeIntegralInRange<int>(0, 5)) {
    case 0:
      attend<float>(f, c);
      write<float>(f, c);
      break;
    case 1:
      attend<Float16>(f, c);
      write<Float16>(f, c);
      break;
    case 2:
      attend<BFloat16>(f, c);
      write<BFloat16>(f, c);
      break;
    case 3:
      attend<softdot::Float8E4M3>(f, c);
      write<softdot::Float8E4M3>(f, c);
      break;
    case 4:
      attend<softdot::Float8E5M2>(f, c);
      write<softdot::Float8E5M2>(f, c);
      break;
    default:
      attend<std::int8_t>(f, c);
      write<std::int8_t>(f, c);
  }
  return 0;
}
