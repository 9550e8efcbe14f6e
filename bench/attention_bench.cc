// softdot::attention, float32 prefill and grouped-query decode, at 1 and 2
// OpenMP threads (omp_set_num_threads around the loop; the thread count is
// part of the name). The rooflines are measured in the same process
// (attention_util.h, attention_kernels.cc). (Over 600 lines on purpose:
// prefill, decode and the memory cases share the buffers, counters and
// rooflines of one process, so that their figures compare.)
//
// Prefill, one head, n_q = n_kv = n, d = d_v, Q K V in cache-sized buffers:
//   BM_attention_prefill_{1thread,2threads}/<n>/<d>         no mask
//   BM_attention_prefill_causal_{1thread,2threads}/<n>/<d>  causal
//   BM_attention_prefill_precise_1thread/<n>/<d>            no mask,
//                                   AttentionOptions::precise
//   BM_attention_prefill_bf16{,_causal}_{units,split,fma}_{1thread,2threads}
//     /<n>/<d>  Q, K, V and the output in bfloat16: on the unit
//     matrix_unit() picks (units: P rounded once; split:
//     UnitWeights::kSplit) or forced to "none" (fma: the float32 path's
//     products on the exactly widened inputs); the counter "unit" is 2 for
//     avx512bf16, 1 for the model, 0 for none. rel_err is against the
//     bfloat16 inputs in double; above 1e-2 (the output's rounding is 2^-9)
//     the benchmark fails.
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
// Decode, d = d_v = 128, Q float32, K and V float32, float16, bfloat16 or
// int8 (Int8KV from softdot::quantize_kv of uniform float data) or fp8
// e4m3fn (BM_decode_sweep only: uniform bytes, a per-tensor scale), causal
// (bottom-right: no mask at n_q = 1):
//   BM_attention_decode_{f32,bf16,f16,int8}_{1thread,2threads}/<n_kv>
//     n_q = 1, 8 query heads on 2 KV heads, batch 1, n_kv in {4096, 65536}
//     (the default run);
//   BM_decode_sweep/<f32|f16|bf16|bf16q|int8|e4m3>/H<heads>_<kv_heads>/nq<n_q>/B<batch>/
//     nkv<n_kv>/<1thread|2threads>
//     the decode issue's shapes, run only when a filter names them
//     (scripts/decode_table.sh): heads 32/8 and 8/2, n_q 1 and 4, batch 1
//     and 8, n_kv 4096, 32768 and 131072.
// Each call reads the next copy of K and V in an arena (DecodeArena) that
// spans at least max(512 MiB, 2 x L3), so K and V come from DRAM, not cache;
// memory is capped at SOFTDOT_BENCH_MAX_GIB (default 5) GiB and a case whose
// two copies exceed it is skipped with a message (float32, float16 and
// bfloat16 at 8 KV heads, batch 8, n_kv 131072). Counters:
//   GB/s           bytes of K and V per second (float: 2 B H_kv n_kv 128 size;
//                  int8: 2 B H_kv n_kv (128 + 4), the values and the scales);
//   roofline_GB/s  a read-only vectorized pass (ReadSum) walking through the
//                  same arena, the same bytes per call, on as many threads;
//   of_roofline    GB/s / roofline_GB/s;
//   rel_err        rows of batches 0 and B - 1, query heads 0, H/2 + 1 and
//                  H - 1, every query row, of copy 0 against double (K and V
//                  widened; int8: the dequantised values, which attention
//                  computes with exactly); above 1e-4 the benchmark fails.
//
// A 2-thread benchmark whose affinity mask (taskset) has one CPU is skipped
// with an error: its threads would only take turns (scripts/bench.sh pins
// softdot_bench to one core; run these with two, e.g.
// `taskset -c 0,1 softdot_bench --benchmark_filter=attention`).
#include <softdot/softdot.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <tuple>
#include <utility>
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
// The worst row error (CheckRows, AttentionRowError) of a prefill output o
// of n rows against attention in double over q, k, v ([n, d] floats each).
double PrefillError(const float* q, const float* k, const float* v,
                    const float* o, std::size_t n, std::size_t d, bool causal) {
  const float scale =
      static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  double worst = 0.0;
  for (std::size_t i : CheckRows(n)) {
    worst =
        std::max(worst, AttentionRowError(q + i * d, k, v, causal ? i + 1 : n,
                                          d, d, scale, o + i * d));
  }
  return worst;
}

// The self-check's verdict (rel_err against limit: the counter, or the
// benchmark skipped), then the timed loop of call() and the prefill
// counters.
template <class F>
void TimePrefill(benchmark::State& state, double rel_err, double limit,
                 std::size_t n, std::size_t d, bool causal, int threads,
                 F call) {
  state.counters["rel_err"] = rel_err;
  if (!(rel_err <= limit)) {
    char msg[96];
    std::snprintf(msg, sizeof msg, "self-check failed: rel_err %g > %g",
                  rel_err, limit);
    state.SkipWithError(msg);
    return;
  }
  const double peak = FmaPeakFlops(threads);
  const auto t0 = Clock::now();
  for (auto _ : state) {
    call();
    benchmark::ClobberMemory();
  }
  const double seconds =
      std::chrono::duration<double>(Clock::now() - t0).count();
  SetPrefillCounters(state, seconds, static_cast<double>(state.iterations()), n,
                     d, causal, peak);
}

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
    it = checked
             .emplace(std::make_tuple(n, d),
                      PrefillError(q, k, v, o, n, d, kCausal))
             .first;
  }
  TimePrefill(state, it->second, kMaxRelErr, n, d, kCausal, kThreads, [&] {
    softdot::attention(qv, kv, vv, ov, options);
    benchmark::DoNotOptimize(o);
  });
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
// bfloat16 prefill; kMode 0: the automatic unit, P rounded; 1: split;
// 2: forced "none" (the float32 FMA path).
template <bool kCausal, int kThreads, int kMode>
void BM_attention_prefill_bf16(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const auto d = static_cast<std::size_t>(state.range(1));
  if (!CheckAffinity(state, kThreads)) return;
  const OmpThreadsScope omp(kThreads);
  std::vector<float> qf(n * d), kf(n * d), vf(n * d), of(n * d);
  FillUniform(qf.data(), n * d, 1);
  FillUniform(kf.data(), n * d, 2);
  FillUniform(vf.data(), n * d, 3);
  std::vector<softdot::BFloat16> q(n * d), k(n * d), v(n * d), o(n * d);
  for (std::size_t i = 0; i < n * d; ++i) {
    q[i] = softdot::to_bfloat16(qf[i]);
    k[i] = softdot::to_bfloat16(kf[i]);
    v[i] = softdot::to_bfloat16(vf[i]);
    qf[i] = softdot::to_float(q[i]);
    kf[i] = softdot::to_float(k[i]);
    vf[i] = softdot::to_float(v[i]);
  }
  const softdot::TensorView<const softdot::BFloat16> qv(q.data(), 1, 1, n, d),
      kv(k.data(), 1, 1, n, d), vv(v.data(), 1, 1, n, d);
  const softdot::TensorView<softdot::BFloat16> ov(o.data(), 1, 1, n, d);
  softdot::AttentionOptions options;
  options.causal = kCausal;
  if (kMode == 1) {
    options.unit_weights = softdot::AttentionOptions::UnitWeights::kSplit;
  }
  // The unit for this benchmark, the automatic choice again after it.
  struct UnitScope {
    explicit UnitScope(const char* name) { softdot::force_matrix_unit(name); }
    ~UnitScope() { softdot::force_matrix_unit(""); }
  } unit_scope(kMode == 2 ? "none" : "");
  const std::string unit = softdot::matrix_unit();
  state.counters["unit"] = unit == "avx512bf16" ? 2 : unit == "model" ? 1 : 0;
  try {
    softdot::attention(qv, kv, vv, ov, options);
  } catch (const std::exception& e) {
    state.SkipWithError(
        (std::string("softdot::attention: ") + e.what()).c_str());
    return;
  }
  for (std::size_t i = 0; i < n * d; ++i) of[i] = softdot::to_float(o[i]);
  TimePrefill(
      state,
      PrefillError(qf.data(), kf.data(), vf.data(), of.data(), n, d, kCausal),
      1e-2, n, d, kCausal, kThreads, [&] {
        softdot::attention(qv, kv, vv, ov, options);
        benchmark::DoNotOptimize(o.data());
      });
}

#define SOFTDOT_BF16_PREFILL(NAME, CAUSAL, MODE)                            \
  void BM_attention_prefill_bf16##NAME##_1thread(benchmark::State& s) {     \
    BM_attention_prefill_bf16<CAUSAL, 1, MODE>(s);                          \
  }                                                                         \
  void BM_attention_prefill_bf16##NAME##_2threads(benchmark::State& s) {    \
    BM_attention_prefill_bf16<CAUSAL, 2, MODE>(s);                          \
  }                                                                         \
  BENCHMARK(BM_attention_prefill_bf16##NAME##_1thread)->Apply(PrefillArgs); \
  BENCHMARK(BM_attention_prefill_bf16##NAME##_2threads)->Apply(PrefillArgs);
SOFTDOT_BF16_PREFILL(_units, false, 0)
SOFTDOT_BF16_PREFILL(_split, false, 1)
SOFTDOT_BF16_PREFILL(_fma, false, 2)
SOFTDOT_BF16_PREFILL(_causal_units, true, 0)
SOFTDOT_BF16_PREFILL(_causal_split, true, 1)
SOFTDOT_BF16_PREFILL(_causal_fma, true, 2)
#undef SOFTDOT_BF16_PREFILL

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
constexpr std::size_t kHeadDim = 128;

enum class KvFormat { kF32, kF16, kBF16, kInt8, kE4M3 };

// The per-tensor scale of the fp8 cases (vLLM's k_scale / v_scale).
constexpr float kFp8Scale = 1.0f / 256;

const char* FormatName(KvFormat f) {
  switch (f) {
    case KvFormat::kF32:
      return "f32";
    case KvFormat::kF16:
      return "f16";
    case KvFormat::kBF16:
      return "bf16";
    case KvFormat::kInt8:
      return "int8";
    case KvFormat::kE4M3:
      return "e4m3";
  }
  return "?";
}

// One decode benchmark: Q [batch, heads, n_q, 128] float32 against K and V
// [batch, kv_heads, n_kv, 128] of `format`, causal (bottom-right: query i
// sees keys 0 .. n_kv - n_q + i), on `threads` OpenMP threads.
struct DecodeCase {
  KvFormat format = KvFormat::kF32;
  std::size_t batch = 1, heads = 8, kv_heads = 2, n_q = 1, n_kv = 4096;
  int threads = 1;
  // bfloat16 query and output (kBF16 only): the units' decode form.
  bool q16 = false;
};

std::size_t EnvGiB(const char* name, std::size_t fallback) {
  const char* s = std::getenv(name);
  if (s == nullptr || *s == '\0') return fallback;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(s, &end, 10);
  return end != s && *end == '\0' && v > 0 ? static_cast<std::size_t>(v)
                                           : fallback;
}

// Distinct copies of one call's K and V, walked in turn (call c reads copy
// c mod copies), so that K and V come from memory and not from a cache. The
// copies walked span at least max(512 MiB, 2 x the L3 that sysconf reports)
// and there are at least 2 of them. Copy c starts at byte c * stride
// (4 KiB-aligned) and holds, contiguously,
//   float32, float16, bfloat16: K then V, each [batch, kv_heads, n_kv, 128];
//   int8: K values, V values (int8, same shape), K scales, V scales (float,
//         [batch, kv_heads, n_kv, 1]), made by softdot::quantize_kv from
//         uniform float data (FillUniform), a distinct stream per copy;
// pair_bytes counts all of it (the scales included). Memory is capped at
// SOFTDOT_BENCH_MAX_GIB GiB (default 5): a case whose two copies do not fit
// is skipped with a message. The float formats fill the whole buffer once per
// format and reuse it for every shape that fits; int8 is quantised again
// for each shape.
class DecodeArena {
 public:
  // Empty on success, else why the case cannot run.
  std::string Prepare(KvFormat format, std::size_t batch, std::size_t kv_heads,
                      std::size_t n_kv) {
    const std::size_t rows = batch * kv_heads * n_kv;
    const std::size_t size =
        format == KvFormat::kF32                                 ? 4
        : format == KvFormat::kInt8 || format == KvFormat::kE4M3 ? 1
                                                                 : 2;
    pair_bytes_ = 2 * rows * kHeadDim * size +
                  (format == KvFormat::kInt8 ? 2 * rows * sizeof(float) : 0);
    stride_ = (pair_bytes_ + 4095) / 4096 * 4096;
    const std::size_t walk = std::max(MinWalkBytes(), 2 * stride_);
    copies_ = (walk + stride_ - 1) / stride_;
    const std::size_t need = copies_ * stride_;
    const std::size_t cap = EnvGiB("SOFTDOT_BENCH_MAX_GIB", 5) << 30;
    if (2 * stride_ > cap) {
      return "skipped: K and V of one call take " +
             std::to_string(pair_bytes_ >> 20) +
             " MiB; the two copies the arena needs exceed " +
             std::to_string(cap >> 30) + " GiB (SOFTDOT_BENCH_MAX_GIB)";
    }
    if (need > cap) {  // fewer copies, still at least 2
      copies_ = cap / stride_;
    }
    const std::size_t bytes = copies_ * stride_;
    const bool grow = bytes > buffer_.bytes();
    if (grow) {
      buffer_ = AlignedBuffer();  // free first: never two arenas at once
      buffer_ =
          AlignedBuffer(std::max(bytes, MinWalkBytes()), std::size_t{2} << 20);
    }
    if (format == KvFormat::kInt8) {
      if (grow || format_ != format || rows_ != rows) FillInt8(rows);
    } else if (grow || format_ != format) {
      FillFloat(format);
    }
    format_ = format;
    rows_ = rows;
    return {};
  }

  const char* copy(std::size_t c) const {
    return buffer_.as<const char>() + c * stride_;
  }
  template <class T>
  const T* k(std::size_t c) const {
    return reinterpret_cast<const T*>(copy(c));
  }
  template <class T>
  const T* v(std::size_t c) const {
    return k<T>(c) + rows_ * kHeadDim;
  }
  const float* k_scales(std::size_t c) const {
    return reinterpret_cast<const float*>(copy(c) + 2 * rows_ * kHeadDim);
  }
  const float* v_scales(std::size_t c) const { return k_scales(c) + rows_; }
  const void* base() const { return buffer_.as<const void>(); }
  std::size_t stride() const { return stride_; }
  std::size_t copies() const { return copies_; }
  std::size_t pair_bytes() const { return pair_bytes_; }

 private:
  static std::size_t MinWalkBytes() {
    const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    return std::max(std::size_t{512} << 20,
                    l3 > 0 ? 2 * static_cast<std::size_t>(l3) : 0);
  }
  void FillFloat(KvFormat format) {
    const std::size_t n = buffer_.bytes();
    switch (format) {
      case KvFormat::kF32:
        FillUniform(buffer_.as<float>(), n / 4, 7);
        break;
      case KvFormat::kF16:
        FillUniform(buffer_.as<softdot::Float16>(), n / 2, 7);
        break;
      case KvFormat::kE4M3: {
        // Uniform bytes, e4m3fn's NaN (S.1111.111) made 0: values in
        // [-448, 448], times kFp8Scale.
        auto* b = buffer_.as<std::uint8_t>();
#pragma omp parallel for
        for (std::int64_t i = 0; i < static_cast<std::int64_t>(n); ++i) {
          std::uint64_t x = static_cast<std::uint64_t>(i) * 0x9E3779B97F4A7C15u;
          x ^= x >> 29;
          auto v = static_cast<std::uint8_t>(x >> 7);
          if ((v & 0x7f) == 0x7f) v = 0;
          b[i] = v;
        }
        break;
      }
      default:
        FillUniform(buffer_.as<softdot::BFloat16>(), n / 2, 7);
        break;
    }
  }
  // Quantises blocks of 1024 rows of uniform floats into K and V of every
  // copy walked; one block per OpenMP iteration (FillUniform's own parallel
  // loop is nested there and runs on the one thread).
  void FillInt8(std::size_t rows) {
    constexpr std::size_t kBlock = 1024;
    const std::size_t blocks = (rows + kBlock - 1) / kBlock;
    const auto units = static_cast<std::int64_t>(copies_ * 2 * blocks);
    char* base = buffer_.as<char>();
#pragma omp parallel
    {
      std::vector<float> x(kBlock * kHeadDim);
#pragma omp for schedule(dynamic)
      for (std::int64_t u = 0; u < units; ++u) {
        const auto unit = static_cast<std::size_t>(u);
        const std::size_t c = unit / (2 * blocks), kv = unit / blocks % 2,
                          b = unit % blocks;
        const std::size_t r0 = b * kBlock, nr = std::min(kBlock, rows - r0);
        // FillUniform's streams for seeds s and s + 1 are one element
        // apart: seeds 2^24 apart give disjoint streams of 2^24 elements.
        FillUniform(x.data(), nr * kHeadDim, (unit + 1) << 24);
        char* copy = base + c * stride_;
        auto* values =
            reinterpret_cast<std::int8_t*>(copy) + (kv * rows + r0) * kHeadDim;
        auto* scales = reinterpret_cast<float*>(copy + 2 * rows * kHeadDim) +
                       kv * rows + r0;
        softdot::quantize_kv(
            softdot::TensorView<const float>(x.data(), 1, 1, nr, kHeadDim),
            softdot::TensorView<std::int8_t>(values, 1, 1, nr, kHeadDim),
            softdot::TensorView<float>(scales, 1, 1, nr, 1));
      }
    }
  }

  AlignedBuffer buffer_;
  KvFormat format_ = KvFormat::kF32;
  std::size_t rows_ = 0, pair_bytes_ = 0, stride_ = 0, copies_ = 0;
};

DecodeArena& TheDecodeArena() {
  static DecodeArena arena;
  return arena;
}

// softdot::attention on copy c of the arena.
void DecodeCall(const DecodeCase& c, const DecodeArena& arena, std::size_t copy,
                const softdot::TensorView<const float>& q,
                const softdot::TensorView<float>& o,
                const softdot::AttentionOptions& options) {
  const std::size_t b = c.batch, h = c.kv_heads, n = c.n_kv, d = kHeadDim;
  switch (c.format) {
    case KvFormat::kF32:
      softdot::attention(
          q, softdot::TensorView<const float>(arena.k<float>(copy), b, h, n, d),
          softdot::TensorView<const float>(arena.v<float>(copy), b, h, n, d), o,
          options);
      return;
    case KvFormat::kF16: {
      using T = softdot::Float16;
      softdot::attention(
          q, softdot::TensorView<const T>(arena.k<T>(copy), b, h, n, d),
          softdot::TensorView<const T>(arena.v<T>(copy), b, h, n, d), o,
          options);
      return;
    }
    case KvFormat::kBF16: {
      using T = softdot::BFloat16;
      softdot::attention(
          q, softdot::TensorView<const T>(arena.k<T>(copy), b, h, n, d),
          softdot::TensorView<const T>(arena.v<T>(copy), b, h, n, d), o,
          options);
      return;
    }
    case KvFormat::kE4M3: {
      using T = softdot::Float8E4M3;
      const softdot::Float8E4M3KV k{
          softdot::TensorView<const T>(arena.k<T>(copy), b, h, n, d),
          {},
          kFp8Scale};
      const softdot::Float8E4M3KV v{
          softdot::TensorView<const T>(arena.v<T>(copy), b, h, n, d),
          {},
          kFp8Scale};
      softdot::attention(q, k, v, o, options);
      return;
    }
    case KvFormat::kInt8: {
      using I = std::int8_t;
      const softdot::Int8KV k{
          softdot::TensorView<const I>(arena.k<I>(copy), b, h, n, d),
          softdot::TensorView<const float>(arena.k_scales(copy), b, h, n, 1)};
      const softdot::Int8KV v{
          softdot::TensorView<const I>(arena.v<I>(copy), b, h, n, d),
          softdot::TensorView<const float>(arena.v_scales(copy), b, h, n, 1)};
      softdot::attention(q, k, v, o, options);
      return;
    }
  }
}

// Worst AttentionRowError of the output rows of batches {0, B - 1}, query
// heads {0, H/2 + 1, H - 1} and every query row, on copy 0 (int8: against
// the dequantised values, scale * value rounded to float, which the
// contract says attention computes with exactly).
double DecodeCheck(const DecodeCase& c, const DecodeArena& arena,
                   const std::vector<float>& q, const std::vector<float>& o,
                   float scale) {
  const std::size_t d = kHeadDim, n = c.n_kv, group = c.heads / c.kv_heads;
  std::vector<float> kd, vd;
  double worst = 0.0;
  const std::size_t batch_step = std::max<std::size_t>(1, c.batch - 1);
  for (std::size_t b = 0; b < c.batch; b += batch_step) {
    for (std::size_t h : {std::size_t{0}, c.heads / 2 + 1, c.heads - 1}) {
      const std::size_t g = h / group;
      const std::size_t off = (b * c.kv_heads + g) * n;  // first row of K, V
      if (c.format == KvFormat::kInt8) {
        kd.resize(n * d);
        vd.resize(n * d);
        const auto* kq = arena.k<std::int8_t>(0) + off * d;
        const auto* vq = arena.v<std::int8_t>(0) + off * d;
        const float* ks = arena.k_scales(0) + off;
        const float* vs = arena.v_scales(0) + off;
        for (std::size_t j = 0; j < n; ++j) {
          for (std::size_t x = 0; x < d; ++x) {
            kd[j * d + x] = ks[j] * static_cast<float>(kq[j * d + x]);
            vd[j * d + x] = vs[j] * static_cast<float>(vq[j * d + x]);
          }
        }
      } else if (c.format == KvFormat::kE4M3) {
        kd.resize(n * d);
        vd.resize(n * d);
        const auto* kq = arena.k<softdot::Float8E4M3>(0) + off * d;
        const auto* vq = arena.v<softdot::Float8E4M3>(0) + off * d;
        for (std::size_t j = 0; j < n * d; ++j) {
          kd[j] = softdot::to_float(kq[j]) * kFp8Scale;
          vd[j] = softdot::to_float(vq[j]) * kFp8Scale;
        }
      }
      for (std::size_t i = 0; i < c.n_q; ++i) {
        const std::size_t row = (b * c.heads + h) * c.n_q + i;
        const float* qr = q.data() + row * d;
        const float* orow = o.data() + row * d;
        const std::size_t visible = n - c.n_q + i + 1;
        double err = 0.0;
        switch (c.format) {
          case KvFormat::kF32:
            err = AttentionRowError(qr, arena.k<float>(0) + off * d,
                                    arena.v<float>(0) + off * d, visible, d, d,
                                    scale, orow);
            break;
          case KvFormat::kF16:
            err = AttentionRowError(qr, arena.k<softdot::Float16>(0) + off * d,
                                    arena.v<softdot::Float16>(0) + off * d,
                                    visible, d, d, scale, orow);
            break;
          case KvFormat::kBF16:
            err = AttentionRowError(qr, arena.k<softdot::BFloat16>(0) + off * d,
                                    arena.v<softdot::BFloat16>(0) + off * d,
                                    visible, d, d, scale, orow);
            break;
          case KvFormat::kInt8:
          case KvFormat::kE4M3:
            err = AttentionRowError(qr, kd.data(), vd.data(), visible, d, d,
                                    scale, orow);
            break;
        }
        worst = std::max(worst, err);
      }
    }
  }
  return worst;
}

void RunDecode(benchmark::State& state, const DecodeCase& c) {
  if (!CheckAffinity(state, c.threads)) return;
  DecodeArena& arena = TheDecodeArena();
  if (const std::string why =
          arena.Prepare(c.format, c.batch, c.kv_heads, c.n_kv);
      !why.empty()) {
    state.SkipWithError(why.c_str());
    return;
  }
  const OmpThreadsScope omp(c.threads);
  const std::size_t q_size = c.batch * c.heads * c.n_q * kHeadDim;
  std::vector<float> q(q_size), o(q_size);
  FillUniform(q.data(), q.size(), 4);
  // A bfloat16 query is the float query rounded (the check reads the
  // rounded values); its output is widened for the check.
  std::vector<softdot::BFloat16> q16, o16;
  if (c.q16) {
    q16.resize(q_size);
    o16.resize(q_size);
    for (std::size_t i = 0; i < q_size; ++i) {
      q16[i] = softdot::to_bfloat16(q[i]);
      q[i] = softdot::to_float(q16[i]);
    }
  }
  const softdot::TensorView<const float> qv(q.data(), c.batch, c.heads, c.n_q,
                                            kHeadDim);
  const softdot::TensorView<float> ov(o.data(), c.batch, c.heads, c.n_q,
                                      kHeadDim);
  const softdot::TensorView<const softdot::BFloat16> qv16(
      q16.data(), c.batch, c.heads, c.n_q, kHeadDim);
  const softdot::TensorView<softdot::BFloat16> ov16(o16.data(), c.batch,
                                                    c.heads, c.n_q, kHeadDim);
  auto call = [&](std::size_t copy, const softdot::AttentionOptions& opt) {
    if (!c.q16) {
      DecodeCall(c, arena, copy, qv, ov, opt);
      return;
    }
    const std::size_t b = c.batch, h = c.kv_heads, n = c.n_kv, d = kHeadDim;
    using T = softdot::BFloat16;
    softdot::attention(
        qv16, softdot::TensorView<const T>(arena.k<T>(copy), b, h, n, d),
        softdot::TensorView<const T>(arena.v<T>(copy), b, h, n, d), ov16, opt);
  };
  softdot::AttentionOptions options;
  options.causal = true;  // bottom-right; no mask at n_q = 1
  const float scale =
      static_cast<float>(1.0 / std::sqrt(static_cast<double>(kHeadDim)));

  // Self-check, remembered per format and shape (not per thread count).
  static std::map<std::tuple<int, std::size_t, std::size_t, std::size_t,
                             std::size_t, std::size_t>,
                  double>
      checked;
  try {
    call(0, options);
    for (std::size_t i = 0; i < o16.size(); ++i)
      o[i] = softdot::to_float(o16[i]);
  } catch (const std::exception& e) {
    state.SkipWithError(
        (std::string("softdot::attention: ") + e.what()).c_str());
    return;
  }
  const auto key =
      std::make_tuple(static_cast<int>(c.format) + (c.q16 ? 16 : 0), c.batch,
                      c.heads, c.kv_heads, c.n_q, c.n_kv);
  auto it = checked.find(key);
  if (it == checked.end())
    it = checked.emplace(key, DecodeCheck(c, arena, q, o, scale)).first;
  state.counters["rel_err"] = it->second;
  // A bfloat16 output and the units' rounded weights: attention.h's
  // 16-bit bound, 2^-8 W for P plus 2^-8 |o| for the output's rounding.
  const double allowed = c.q16 ? 2.0 * std::ldexp(1.0, -8) : kMaxRelErr;
  if (!(it->second <= allowed)) {
    state.SkipWithError(("self-check failed: rel_err " +
                         std::to_string(it->second) + " > " +
                         std::to_string(allowed))
                            .c_str());
    return;
  }
  const double roofline =
      ReadBandwidth(arena.base(), arena.stride(), arena.copies(),
                    arena.pair_bytes(), c.threads);

  std::size_t copy = 0;
  const auto t0 = Clock::now();
  for (auto _ : state) {
    call(copy, options);
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

// The short default set: 8 query heads on 2 KV heads, n_q = 1, batch 1.
template <KvFormat kFormat, int kThreads>
void BM_attention_decode(benchmark::State& state) {
  DecodeCase c;
  c.format = kFormat;
  c.n_kv = static_cast<std::size_t>(state.range(0));
  c.threads = kThreads;
  RunDecode(state, c);
}

void DecodeArgs(benchmark::internal::Benchmark* b) {
  b->Arg(4096)->Arg(65536)->Unit(benchmark::kMicrosecond);
}

void BM_attention_decode_f32_1thread(benchmark::State& s) {
  BM_attention_decode<KvFormat::kF32, 1>(s);
}
void BM_attention_decode_f32_2threads(benchmark::State& s) {
  BM_attention_decode<KvFormat::kF32, 2>(s);
}
void BM_attention_decode_bf16_1thread(benchmark::State& s) {
  BM_attention_decode<KvFormat::kBF16, 1>(s);
}
void BM_attention_decode_bf16_2threads(benchmark::State& s) {
  BM_attention_decode<KvFormat::kBF16, 2>(s);
}
void BM_attention_decode_f16_1thread(benchmark::State& s) {
  BM_attention_decode<KvFormat::kF16, 1>(s);
}
void BM_attention_decode_f16_2threads(benchmark::State& s) {
  BM_attention_decode<KvFormat::kF16, 2>(s);
}
void BM_attention_decode_int8_1thread(benchmark::State& s) {
  BM_attention_decode<KvFormat::kInt8, 1>(s);
}
void BM_attention_decode_int8_2threads(benchmark::State& s) {
  BM_attention_decode<KvFormat::kInt8, 2>(s);
}
BENCHMARK(BM_attention_decode_f32_1thread)->Apply(DecodeArgs);
BENCHMARK(BM_attention_decode_f32_2threads)->Apply(DecodeArgs);
BENCHMARK(BM_attention_decode_bf16_1thread)->Apply(DecodeArgs);
BENCHMARK(BM_attention_decode_bf16_2threads)->Apply(DecodeArgs);
BENCHMARK(BM_attention_decode_f16_1thread)->Apply(DecodeArgs);
BENCHMARK(BM_attention_decode_f16_2threads)->Apply(DecodeArgs);
BENCHMARK(BM_attention_decode_int8_1thread)->Apply(DecodeArgs);
BENCHMARK(BM_attention_decode_int8_2threads)->Apply(DecodeArgs);

// The sweep, registered by name so that only a filter runs it:
//   BM_decode_sweep/<f32|f16|bf16|bf16q|int8|e4m3>/H<heads>_<kv_heads>/nq<n_q>/B<batch>/
//     nkv<n_kv>/<1thread|2threads>
// in an order that keeps one arena fill per format and shape.
bool RegisterDecodeSweep() {
  // bf16q: bfloat16 K and V with a bfloat16 query and output (the units).
  for (const auto& [f, q16] :
       {std::pair{KvFormat::kF32, false}, std::pair{KvFormat::kF16, false},
        std::pair{KvFormat::kBF16, false}, std::pair{KvFormat::kBF16, true},
        std::pair{KvFormat::kInt8, false}, std::pair{KvFormat::kE4M3, false}}) {
    for (const auto& [hq, hkv] : {std::pair<std::size_t, std::size_t>{32, 8},
                                  std::pair<std::size_t, std::size_t>{8, 2}}) {
      for (std::size_t batch : {std::size_t{1}, std::size_t{8}}) {
        for (std::size_t n_kv :
             {std::size_t{4096}, std::size_t{32768}, std::size_t{131072}}) {
          for (std::size_t n_q :
               {std::size_t{1}, std::size_t{2}, std::size_t{4}}) {
            for (int threads : {1, 2}) {
              DecodeCase c;
              c.format = f;
              c.heads = hq;
              c.kv_heads = hkv;
              c.batch = batch;
              c.n_kv = n_kv;
              c.n_q = n_q;
              c.threads = threads;
              c.q16 = q16;
              const std::string name =
                  std::string("BM_decode_sweep/") + FormatName(f) +
                  (q16 ? "q" : "") + "/H" + std::to_string(hq) + "_" +
                  std::to_string(hkv) + "/nq" + std::to_string(n_q) + "/B" +
                  std::to_string(batch) + "/nkv" + std::to_string(n_kv) + "/" +
                  std::to_string(threads) +
                  (threads == 1 ? "thread" : "threads");
              benchmark::RegisterBenchmark(
                  name.c_str(),
                  [c](benchmark::State& state) { RunDecode(state, c); })
                  ->Unit(benchmark::kMicrosecond)
                  ->UseRealTime();
            }
          }
        }
      }
    }
  }
  return true;
}
const bool kDecodeSweepRegistered = RegisterDecodeSweep();

}  // namespace
}  // namespace softdot_bench
