// softdot::attention, float32 prefill and grouped-query decode, at 1 and 2
// OpenMP threads (omp_set_num_threads around the loop; the thread count is
// part of the name). The rooflines are measured in the same process
// (attention_util.h, attention_kernels.cc).
//
// Prefill, one head, n_q = n_kv = n, d = d_v, Q K V in cache-sized buffers:
//   BM_attention_prefill_{1thread,2threads}/<n>/<d>         no mask
//   BM_attention_prefill_causal_{1thread,2threads}/<n>/<d>  causal
//   BM_attention_prefill_precise_1thread/<n>/<d>            no mask,
//                                   AttentionOptions::precise
// Counters (rates over the wall time of the timed loop):
//   GFLOP/s               4 n^2 d (2 n^2 d for Q K^T, 2 n^2 d_v for P V);
//   causal: GFLOP/s_dense_equiv  the same 4 n^2 d, a speed with the same
//                                numerator as the unmasked benchmark;
//           GFLOP/s_useful       the flops of the visible pairs,
//                                4 d n (n + 1) / 2 (about 2 n^2 d);
//   of_peak               useful flops (= GFLOP/s unmasked) / peak_GFLOP/s;
//   peak_GFLOP/s          BM_fma_peak's loop on as many threads at once;
//   rel_err               self-check before timing: the worst row of 39
//                         against attention in double, max_c |O - exact| / W
//                         (attention_util.h); above 1e-4 the benchmark fails.
//
// Decode, n_q = 1, 8 query heads on 2 KV heads (grouped-query), d = d_v =
// 128, Q float, K and V float32, bfloat16 or float16, n_kv in {4096, 65536}:
//   BM_attention_decode_{f32,bf16,f16}_{1thread,2threads}/<n_kv>
// Each call reads the next copy of K and V in an arena of 512 MiB (KvArena),
// so K and V come from DRAM, not cache. Counters:
//   GB/s           bytes of K and V per second (2 * 2 * n_kv * 128 * size);
//   roofline_GB/s  a read-only vectorized pass (ReadSum) walking through the
//                  same arena, the same bytes per call, on as many threads;
//   of_roofline    GB/s / roofline_GB/s;
//   rel_err        every head of copy 0 against double (K and V widened).
//
// A 2-thread benchmark whose affinity mask (taskset) has one CPU is skipped
// with an error: its threads would only take turns (scripts/bench.sh pins
// softdot_bench to one core; run these with two, e.g.
// `taskset -c 0,1 softdot_bench --benchmark_filter=attention`).
#include <softdot/softdot.h>

#include <chrono>
#include <cmath>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "attention_util.h"
#include "bench_util.h"

namespace softdot_bench {
namespace {

using Clock = std::chrono::steady_clock;
constexpr double kMaxRelErr = 1e-4;

// Skips the benchmark when `threads` cannot run at once; returns false then.
bool CheckAffinity(benchmark::State& state, int threads) {
  const int cpus = AffinityCpus();
  if (threads > 1 && cpus >= 0 && cpus < threads) {
    state.SkipWithError(("needs " + std::to_string(threads) +
                         " CPUs in the affinity mask, has " +
                         std::to_string(cpus) + " (taskset)")
                            .c_str());
    return false;
  }
  return true;
}

// Rows of the self-check: the first and last few, and every (n / 32)-th.
std::vector<std::size_t> CheckRows(std::size_t n) {
  std::vector<std::size_t> rows;
  for (std::size_t i = 0; i < std::min<std::size_t>(n, 4); ++i)
    rows.push_back(i);
  for (std::size_t i = 1; i < 32; ++i) rows.push_back(i * n / 32);
  for (std::size_t i = n - std::min<std::size_t>(n, 4); i < n; ++i)
    rows.push_back(i);
  return rows;
}

// ---- prefill
// ---------------------------------------------------------------------
template <bool kCausal, int kThreads, bool kPrecise = false>
void BM_attention_prefill(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const auto d = static_cast<std::size_t>(state.range(1));
  if (!CheckAffinity(state, kThreads)) return;
  const OmpThreadsScope omp(kThreads);
  AlignedBuffer qb(n * d * sizeof(float)), kb(n * d * sizeof(float)),
      vb(n * d * sizeof(float)), ob(n * d * sizeof(float));
  float* q = qb.as<float>();
  float* k = kb.as<float>();
  float* v = vb.as<float>();
  float* o = ob.as<float>();
  FillUniform(q, n * d, 1);
  FillUniform(k, n * d, 2);
  FillUniform(v, n * d, 3);
  const softdot::TensorView<const float> qv(q, 1, 1, n, d), kv(k, 1, 1, n, d),
      vv(v, 1, 1, n, d);
  const softdot::TensorView<float> ov(o, 1, 1, n, d);
  softdot::AttentionOptions options;
  options.causal = kCausal;
  options.precise = kPrecise;
  const float scale =
      static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));

  // Self-check (remembered per shape and thread count), which is also the
  // warm-up call.
  static std::map<std::tuple<std::size_t, std::size_t>, double> checked;
  try {
    softdot::attention(qv, kv, vv, ov, options);
  } catch (const std::exception& e) {
    state.SkipWithError(
        (std::string("softdot::attention: ") + e.what()).c_str());
    return;
  }
  auto it = checked.find({n, d});
  if (it == checked.end()) {
    double worst = 0.0;
    for (std::size_t i : CheckRows(n)) {
      worst = std::max(
          worst, AttentionRowError(q + i * d, k, v, kCausal ? i + 1 : n, d, d,
                                   scale, o + i * d));
    }
    it = checked.emplace(std::make_tuple(n, d), worst).first;
  }
  state.counters["rel_err"] = it->second;
  if (!(it->second <= kMaxRelErr)) {
    state.SkipWithError(
        ("self-check failed: rel_err " + std::to_string(it->second) + " > 1e-4")
            .c_str());
    return;
  }
  const double peak = FmaPeakFlops(kThreads);

  const auto t0 = Clock::now();
  for (auto _ : state) {
    softdot::attention(qv, kv, vv, ov, options);
    benchmark::DoNotOptimize(o);
    benchmark::ClobberMemory();
  }
  const double seconds =
      std::chrono::duration<double>(Clock::now() - t0).count();
  SetPrefillCounters(state, seconds, static_cast<double>(state.iterations()), n,
                     d, kCausal, peak);
}

void PrefillArgs(benchmark::internal::Benchmark* b) {
  for (std::int64_t n : {1024, 4096}) {
    for (std::int64_t d : {64, 128}) b->Args({n, d});
  }
  b->Unit(benchmark::kMillisecond);
}

void BM_attention_prefill_1thread(benchmark::State& s) {
  BM_attention_prefill<false, 1>(s);
}
void BM_attention_prefill_2threads(benchmark::State& s) {
  BM_attention_prefill<false, 2>(s);
}
void BM_attention_prefill_causal_1thread(benchmark::State& s) {
  BM_attention_prefill<true, 1>(s);
}
void BM_attention_prefill_causal_2threads(benchmark::State& s) {
  BM_attention_prefill<true, 2>(s);
}
void BM_attention_prefill_precise_1thread(benchmark::State& s) {
  BM_attention_prefill<false, 1, true>(s);
}
// One query against one key (d = 1): the fixed cost of a call.
void BM_attention_one_key(benchmark::State& state) {
  std::vector<float> q = {0.5f}, k = {0.25f}, v = {2.0f}, o(1);
  for (auto _ : state) {
    softdot::attention(softdot::MatrixView<const float>(q.data(), 1, 1),
                       softdot::MatrixView<const float>(k.data(), 1, 1),
                       softdot::MatrixView<const float>(v.data(), 1, 1),
                       softdot::MatrixView<float>(o.data(), 1, 1));
    benchmark::DoNotOptimize(o.data());
    benchmark::ClobberMemory();
  }
}
BENCHMARK(BM_attention_one_key);

BENCHMARK(BM_attention_prefill_1thread)->Apply(PrefillArgs);
BENCHMARK(BM_attention_prefill_2threads)->Apply(PrefillArgs);
BENCHMARK(BM_attention_prefill_causal_1thread)->Apply(PrefillArgs);
BENCHMARK(BM_attention_prefill_causal_2threads)->Apply(PrefillArgs);
BENCHMARK(BM_attention_prefill_precise_1thread)->Apply(PrefillArgs);

// ---- decode
// ----------------------------------------------------------------------
constexpr std::size_t kHeads = 8, kKvHeads = 2, kHeadDim = 128;

KvArena& DecodeArena() {
  static KvArena arena;
  return arena;
}

template <class T, int kThreads>
void BM_attention_decode(benchmark::State& state) {
  const auto n_kv = static_cast<std::size_t>(state.range(0));
  if (!CheckAffinity(state, kThreads)) return;
  const OmpThreadsScope omp(kThreads);
  KvArena& arena = DecodeArena();
  arena.Prepare<T>(kKvHeads * n_kv * kHeadDim);
  std::vector<float> q(kHeads * kHeadDim), o(kHeads * kHeadDim);
  FillUniform(q.data(), q.size(), 4);
  const softdot::TensorView<const float> qv(q.data(), 1, kHeads, 1, kHeadDim);
  const softdot::TensorView<float> ov(o.data(), 1, kHeads, 1, kHeadDim);
  auto kview = [&](std::size_t copy) {
    return softdot::TensorView<const T>(arena.k<T>(copy), 1, kKvHeads, n_kv,
                                        kHeadDim);
  };
  auto vview = [&](std::size_t copy) {
    return softdot::TensorView<const T>(arena.v<T>(copy), 1, kKvHeads, n_kv,
                                        kHeadDim);
  };
  const float scale =
      static_cast<float>(1.0 / std::sqrt(static_cast<double>(kHeadDim)));

  static std::map<std::size_t, double> checked;
  try {
    softdot::attention(qv, kview(0), vview(0), ov);
  } catch (const std::exception& e) {
    state.SkipWithError(
        (std::string("softdot::attention: ") + e.what()).c_str());
    return;
  }
  auto it = checked.find(n_kv);
  if (it == checked.end()) {
    double worst = 0.0;
    for (std::size_t h = 0; h < kHeads; ++h) {
      const std::size_t g = h / (kHeads / kKvHeads);
      worst =
          std::max(worst, AttentionRowError(q.data() + h * kHeadDim,
                                            arena.k<T>(0) + g * n_kv * kHeadDim,
                                            arena.v<T>(0) + g * n_kv * kHeadDim,
                                            n_kv, kHeadDim, kHeadDim, scale,
                                            o.data() + h * kHeadDim));
    }
    it = checked.emplace(n_kv, worst).first;
  }
  state.counters["rel_err"] = it->second;
  if (!(it->second <= kMaxRelErr)) {
    state.SkipWithError(
        ("self-check failed: rel_err " + std::to_string(it->second) + " > 1e-4")
            .c_str());
    return;
  }
  const double roofline =
      ReadBandwidth(arena.base(), arena.stride(), arena.copies(),
                    arena.pair_bytes(), kThreads);

  std::size_t copy = 0;
  const auto t0 = Clock::now();
  for (auto _ : state) {
    softdot::attention(qv, kview(copy), vview(copy), ov);
    benchmark::DoNotOptimize(o.data());
    benchmark::ClobberMemory();
    if (++copy == arena.copies()) copy = 0;
  }
  const double seconds =
      std::chrono::duration<double>(Clock::now() - t0).count();
  const double bytes = static_cast<double>(state.iterations()) *
                       static_cast<double>(arena.pair_bytes());
  state.counters["GB/s"] = bytes / seconds * 1e-9;
  state.counters["roofline_GB/s"] = roofline * 1e-9;
  state.counters["of_roofline"] = bytes / seconds / roofline;
}

void DecodeArgs(benchmark::internal::Benchmark* b) {
  b->Arg(4096)->Arg(65536)->Unit(benchmark::kMicrosecond);
}

using softdot::BFloat16;
using softdot::Float16;
void BM_attention_decode_f32_1thread(benchmark::State& s) {
  BM_attention_decode<float, 1>(s);
}
void BM_attention_decode_f32_2threads(benchmark::State& s) {
  BM_attention_decode<float, 2>(s);
}
void BM_attention_decode_bf16_1thread(benchmark::State& s) {
  BM_attention_decode<BFloat16, 1>(s);
}
void BM_attention_decode_bf16_2threads(benchmark::State& s) {
  BM_attention_decode<BFloat16, 2>(s);
}
void BM_attention_decode_f16_1thread(benchmark::State& s) {
  BM_attention_decode<Float16, 1>(s);
}
void BM_attention_decode_f16_2threads(benchmark::State& s) {
  BM_attention_decode<Float16, 2>(s);
}
BENCHMARK(BM_attention_decode_f32_1thread)->Apply(DecodeArgs);
BENCHMARK(BM_attention_decode_f32_2threads)->Apply(DecodeArgs);
BENCHMARK(BM_attention_decode_bf16_1thread)->Apply(DecodeArgs);
BENCHMARK(BM_attention_decode_bf16_2threads)->Apply(DecodeArgs);
BENCHMARK(BM_attention_decode_f16_1thread)->Apply(DecodeArgs);
BENCHMARK(BM_attention_decode_f16_2threads)->Apply(DecodeArgs);

}  // namespace
}  // namespace softdot_bench
