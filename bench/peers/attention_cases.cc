// softdot_peers' attention benchmarks: softdot::attention next to the
// attention peers (peers.h: libtorch matmul + softmax + matmul, libtorch's
// scaled_dot_product_attention, OpenBLAS sgemm + Eigen softmax + sgemm) and
// a naive loop, in the same process and on the same buffers.
//
// Benchmark names:
//   attention/<mask>/<n>x<d>/<impl>/threads:<t>
//     prefill, one head, n_q = n_kv = n in {1024, 4096}, d = d_v in
//     {64, 128}, float32, mask "full" (none) or "causal"; Q, K, V the same
//     buffers every iteration (the work is compute-bound);
//   decode/memory/<n_kv>x128/<impl>/threads:<t>
//     one query token, 8 query heads on 2 KV heads, d = 128, float32 K and
//     V, n_kv in {4096, 65536}; every iteration reads the next copy of K
//     and V in a 512 MiB arena (attention_util.h's KvArena), so they come
//     from DRAM; read_roofline is a vectorized read-only pass over the same
//     bytes (Highway, dispatched).
// t = 1 (SOFTDOT_PEERS_SET single or all) or 2 (threads or all): OpenMP,
// libtorch and OpenBLAS are all set to t threads around the loop, then back
// to 1.
//
// Self-checks, outside the timed loop, once per implementation, shape and
// thread count: softdot against attention in double (39 rows of a prefill,
// every head of a decode; rel_err = max |O - exact| / W, attention_util.h);
// every other implementation against softdot's output, rel_diff = max
// |O - O_softdot| / max |V| (|O| <= max |V|). Above 1e-4 the benchmark is
// skipped with an error. Counters (rates over the wall time of the loop):
// GFLOP/s at 4 n^2 d (causal: GFLOP/s_dense_equiv at the same 4 n^2 d, and
// GFLOP/s_useful at 4 d n (n + 1) / 2), of_peak = useful flops / the FMA
// peak of t cores measured in this run (peak_GFLOP/s); decode: GB/s of K + V.
#include <benchmark/benchmark.h>
#include <omp.h>
#include <softdot/softdot.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "attention_util.h"
#include "bench_util.h"
#include "peers.h"

namespace softdot_peers {
namespace {

using softdot_bench::AlignedBuffer;
using Clock = std::chrono::steady_clock;

constexpr double kMaxRelErr = 1e-4;
constexpr std::size_t kPrefillN[] = {1024, 4096};
constexpr std::size_t kPrefillD[] = {64, 128};
constexpr std::size_t kNaiveMaxN = 1024;
constexpr std::size_t kHeads = 8, kKvHeads = 2, kHeadDim = 128;
constexpr std::size_t kDecodeNkv[] = {4096, 65536};

float Scale(std::size_t d) {
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
}

// The libraries' thread setters (a copy of Registry::set_threads).
std::vector<std::function<void(int)>>& ThreadSetters() {
  static std::vector<std::function<void(int)>> setters;
  return setters;
}

// Every library and OpenMP at t threads for a scope, 1 after it.
class LibraryThreads {
 public:
  explicit LibraryThreads(int t) { Set(t); }
  ~LibraryThreads() { Set(1); }
  LibraryThreads(const LibraryThreads&) = delete;
  LibraryThreads& operator=(const LibraryThreads&) = delete;

 private:
  static void Set(int t) {
    for (const auto& f : ThreadSetters()) f(t);
    omp_set_num_threads(t);  // after libtorch, which sets it too
  }
};

// ---- softdot and the naive loop
// ------------------------------------------------
class SoftdotAttention final : public AttentionRunner {
 public:
  SoftdotAttention(std::size_t n, std::size_t d, bool causal) : n_(n), d_(d) {
    options_.causal = causal;
  }
  void Run(const float* q, const float* k, const float* v, float* o) override {
    softdot::attention(softdot::TensorView<const float>(q, 1, 1, n_, d_),
                       softdot::TensorView<const float>(k, 1, 1, n_, d_),
                       softdot::TensorView<const float>(v, 1, 1, n_, d_),
                       softdot::TensorView<float>(o, 1, 1, n_, d_), options_);
  }

 private:
  std::size_t n_, d_;
  softdot::AttentionOptions options_;
};

// The textbook loop with the whole n x n score matrix: scalar dot products
// (one float accumulator), a max-subtracted softmax per row with std::exp,
// then O = P V; one thread.
class NaiveAttention final : public AttentionRunner {
 public:
  NaiveAttention(std::size_t n, std::size_t d, bool causal)
      : n_(n), d_(d), causal_(causal), scale_(Scale(d)), s_(n * n) {}
  void Run(const float* q, const float* k, const float* v, float* o) override {
    for (std::size_t i = 0; i < n_; ++i) {
      const std::size_t visible = causal_ ? i + 1 : n_;
      float* s = s_.data() + i * n_;
      float m = -std::numeric_limits<float>::infinity();
      for (std::size_t j = 0; j < visible; ++j) {
        float acc = 0.0f;
        for (std::size_t c = 0; c < d_; ++c)
          acc += q[i * d_ + c] * k[j * d_ + c];
        s[j] = acc * scale_;
        m = std::max(m, s[j]);
      }
      float sum = 0.0f;
      for (std::size_t j = 0; j < visible; ++j)
        sum += (s[j] = std::exp(s[j] - m));
      for (std::size_t j = 0; j < visible; ++j) s[j] /= sum;
      for (std::size_t c = 0; c < d_; ++c) o[i * d_ + c] = 0.0f;
      for (std::size_t j = 0; j < visible; ++j) {
        for (std::size_t c = 0; c < d_; ++c)
          o[i * d_ + c] += s[j] * v[j * d_ + c];
      }
    }
  }

 private:
  std::size_t n_, d_;
  bool causal_;
  float scale_;
  std::vector<float> s_;
};

class SoftdotDecode final : public DecodeRunner {
 public:
  SoftdotDecode(std::size_t heads, std::size_t kv_heads, std::size_t n_kv,
                std::size_t d)
      : heads_(heads), kv_heads_(kv_heads), n_kv_(n_kv), d_(d) {}
  void Run(const float* q, const float* k, const float* v, float* o) override {
    softdot::attention(
        softdot::TensorView<const float>(q, 1, heads_, 1, d_),
        softdot::TensorView<const float>(k, 1, kv_heads_, n_kv_, d_),
        softdot::TensorView<const float>(v, 1, kv_heads_, n_kv_, d_),
        softdot::TensorView<float>(o, 1, heads_, 1, d_));
  }

 private:
  std::size_t heads_, kv_heads_, n_kv_, d_;
};

// The read-only pass over K and V of the call (no output: not checked).
class ReadRoofline final : public DecodeRunner {
 public:
  ReadRoofline(std::size_t, std::size_t kv_heads, std::size_t n_kv,
               std::size_t d)
      : count_(kv_heads * n_kv * d) {}
  void Run(const float*, const float* k, const float* v, float*) override {
    const int t = omp_get_max_threads();
    std::uint32_t s;
    if (v == k + count_) {
      s = softdot_bench::ReadSumThreads(k, 2 * count_ * sizeof(float), t);
    } else {
      s = softdot_bench::ReadSumThreads(k, count_ * sizeof(float), t) +
          softdot_bench::ReadSumThreads(v, count_ * sizeof(float), t);
    }
    benchmark::DoNotOptimize(s);
  }

 private:
  std::size_t count_;
};

// ---- data
// ----------------------------------------------------------------------------
struct PrefillData {
  AlignedBuffer q, k, v;
  float max_abs_v = 0.0f;
};

const PrefillData& Prefill(std::size_t n, std::size_t d) {
  static std::map<std::pair<std::size_t, std::size_t>, PrefillData> data;
  auto it = data.find({n, d});
  if (it == data.end()) {
    PrefillData p;
    const std::size_t bytes = n * d * sizeof(float);
    p.q = AlignedBuffer(bytes);
    p.k = AlignedBuffer(bytes);
    p.v = AlignedBuffer(bytes);
    softdot_bench::FillUniform(p.q.as<float>(), n * d, 1);
    softdot_bench::FillUniform(p.k.as<float>(), n * d, 2);
    softdot_bench::FillUniform(p.v.as<float>(), n * d, 3);
    for (std::size_t i = 0; i < n * d; ++i) {
      p.max_abs_v = std::max(p.max_abs_v, std::fabs(p.v.as<float>()[i]));
    }
    it = data.emplace(std::make_pair(n, d), std::move(p)).first;
  }
  return it->second;
}

// softdot's output for a prefill shape (computed once).
const std::vector<float>& SoftdotPrefill(std::size_t n, std::size_t d,
                                         bool causal) {
  static std::map<std::tuple<std::size_t, std::size_t, bool>,
                  std::vector<float>>
      out;
  auto it = out.find({n, d, causal});
  if (it == out.end()) {
    const PrefillData& p = Prefill(n, d);
    std::vector<float> o(n * d);
    SoftdotAttention(n, d, causal)
        .Run(p.q.as<float>(), p.k.as<float>(), p.v.as<float>(), o.data());
    it = out.emplace(std::make_tuple(n, d, causal), std::move(o)).first;
  }
  return it->second;
}

softdot_bench::KvArena& DecodeArena(std::size_t n_kv) {
  static softdot_bench::KvArena arena;
  arena.Prepare<float>(kKvHeads * n_kv * kHeadDim);
  return arena;
}

const std::vector<float>& DecodeQuery() {
  static const std::vector<float> q = [] {
    std::vector<float> v(kHeads * kHeadDim);
    softdot_bench::FillUniform(v.data(), v.size(), 4);
    return v;
  }();
  return q;
}

const std::vector<float>& SoftdotDecodeOutput(std::size_t n_kv) {
  static std::map<std::size_t, std::vector<float>> out;
  auto it = out.find(n_kv);
  if (it == out.end()) {
    const softdot_bench::KvArena& arena = DecodeArena(n_kv);
    std::vector<float> o(kHeads * kHeadDim);
    SoftdotDecode(kHeads, kKvHeads, n_kv, kHeadDim)
        .Run(DecodeQuery().data(), arena.k<float>(0), arena.v<float>(0),
             o.data());
    it = out.emplace(n_kv, std::move(o)).first;
  }
  return it->second;
}

// ---- checks
// ---------------------------------------------------------------------------
std::map<std::string, double>& Checks() {
  static std::map<std::string, double> m;
  return m;
}

double MaxAbsDiff(const float* a, const float* b, std::size_t count) {
  double m = 0.0;
  for (std::size_t i = 0; i < count; ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - b[i]);
    if (!(d <= m)) m = d == d ? d : std::numeric_limits<double>::infinity();
  }
  return m;
}

double CheckPrefill(const std::string& impl, AttentionRunner& runner,
                    std::size_t n, std::size_t d, bool causal) {
  const PrefillData& p = Prefill(n, d);
  std::vector<float> o(n * d, std::numeric_limits<float>::quiet_NaN());
  runner.Run(p.q.as<float>(), p.k.as<float>(), p.v.as<float>(), o.data());
  if (impl != "softdot") {
    return MaxAbsDiff(o.data(), SoftdotPrefill(n, d, causal).data(), n * d) /
           p.max_abs_v;
  }
  double worst = 0.0;
  std::vector<std::size_t> rows = {0, 1, 2, 3, n - 4, n - 3, n - 2, n - 1};
  for (std::size_t i = 1; i < 32; ++i) rows.push_back(i * n / 32);
  for (std::size_t i : rows) {
    worst = std::max(
        worst, softdot_bench::AttentionRowError(
                   p.q.as<float>() + i * d, p.k.as<float>(), p.v.as<float>(),
                   causal ? i + 1 : n, d, d, Scale(d), o.data() + i * d));
  }
  return worst;
}

double CheckDecode(const std::string& impl, DecodeRunner& runner,
                   std::size_t n_kv) {
  const softdot_bench::KvArena& arena = DecodeArena(n_kv);
  const float* q = DecodeQuery().data();
  std::vector<float> o(kHeads * kHeadDim,
                       std::numeric_limits<float>::quiet_NaN());
  runner.Run(q, arena.k<float>(0), arena.v<float>(0), o.data());
  if (impl != "softdot") {
    const float* v = arena.v<float>(0);
    float max_abs_v = 0.0f;
    for (std::size_t i = 0; i < kKvHeads * n_kv * kHeadDim; ++i) {
      max_abs_v = std::max(max_abs_v, std::fabs(v[i]));
    }
    return MaxAbsDiff(o.data(), SoftdotDecodeOutput(n_kv).data(), o.size()) /
           max_abs_v;
  }
  double worst = 0.0;
  for (std::size_t h = 0; h < kHeads; ++h) {
    const std::size_t g = h / (kHeads / kKvHeads);
    worst = std::max(
        worst, softdot_bench::AttentionRowError(
                   q + h * kHeadDim, arena.k<float>(0) + g * n_kv * kHeadDim,
                   arena.v<float>(0) + g * n_kv * kHeadDim, n_kv, kHeadDim,
                   kHeadDim, Scale(kHeadDim), o.data() + h * kHeadDim));
  }
  return worst;
}

// Records a check's result as a counter; false (and the benchmark skipped)
// when it failed.
bool Passed(benchmark::State& state, const std::string& impl, double err) {
  const char* name = impl == "softdot" ? "rel_err" : "rel_diff";
  state.counters[name] = err;
  if (err <= kMaxRelErr) return true;
  state.SkipWithError(("self-check failed: " + impl + " " + name + " " +
                       std::to_string(err) + " > 1e-4")
                          .c_str());
  return false;
}

// ---- the benchmarks
// --------------------------------------------------------------------
template <class Runner, class Factory, class... Args>
Runner& Cached(const std::string& key, const Factory& make, Args... args) {
  static std::map<std::string, std::unique_ptr<Runner>> runners;
  auto it = runners.find(key);
  if (it == runners.end()) it = runners.emplace(key, make(args...)).first;
  return *it->second;
}

void BenchPrefill(benchmark::State& state, const std::string& impl,
                  const AttentionFactory& make, std::size_t n, std::size_t d,
                  bool causal, int threads) {
  const LibraryThreads lib(threads);
  const std::string key = "attention/" + impl + "/" + std::to_string(n) + "x" +
                          std::to_string(d) + (causal ? "/causal" : "/full") +
                          "/" + std::to_string(threads);
  AttentionRunner* runner = nullptr;
  try {
    runner = &Cached<AttentionRunner>(key, make, n, d, causal);
    auto it = Checks().find(key);
    if (it == Checks().end()) {
      it = Checks()
               .emplace(key, CheckPrefill(impl, *runner, n, d, causal))
               .first;
    }
    if (!Passed(state, impl, it->second)) return;
  } catch (const std::exception& e) {
    state.SkipWithError((impl + ": " + e.what()).c_str());
    return;
  }
  const double peak = softdot_bench::FmaPeakFlops(threads);
  const PrefillData& p = Prefill(n, d);
  AlignedBuffer out(n * d * sizeof(float));
  float* o = out.as<float>();
  const auto t0 = Clock::now();
  for (auto _ : state) {
    runner->Run(p.q.as<float>(), p.k.as<float>(), p.v.as<float>(), o);
    benchmark::ClobberMemory();
  }
  const double seconds =
      std::chrono::duration<double>(Clock::now() - t0).count();
  softdot_bench::SetPrefillCounters(state, seconds,
                                    static_cast<double>(state.iterations()), n,
                                    d, causal, peak);
}

void BenchDecode(benchmark::State& state, const std::string& impl,
                 const DecodeFactory& make, std::size_t n_kv, int threads,
                 bool check) {
  const LibraryThreads lib(threads);
  const std::string key = "decode/" + impl + "/" + std::to_string(n_kv) + "/" +
                          std::to_string(threads);
  DecodeRunner* runner = nullptr;
  try {
    runner = &Cached<DecodeRunner>(key, make, kHeads, kKvHeads, n_kv, kHeadDim);
    if (check) {
      auto it = Checks().find(key);
      if (it == Checks().end())
        it = Checks().emplace(key, CheckDecode(impl, *runner, n_kv)).first;
      if (!Passed(state, impl, it->second)) return;
    }
  } catch (const std::exception& e) {
    state.SkipWithError((impl + ": " + e.what()).c_str());
    return;
  }
  const softdot_bench::KvArena& arena = DecodeArena(n_kv);
  const float* q = DecodeQuery().data();
  std::vector<float> o(kHeads * kHeadDim);
  std::size_t copy = 0;
  const auto t0 = Clock::now();
  for (auto _ : state) {
    runner->Run(q, arena.k<float>(copy), arena.v<float>(copy), o.data());
    benchmark::ClobberMemory();
    if (++copy == arena.copies()) copy = 0;
  }
  const double seconds =
      std::chrono::duration<double>(Clock::now() - t0).count();
  state.counters["GB/s"] = static_cast<double>(state.iterations()) *
                           static_cast<double>(arena.pair_bytes()) / seconds *
                           1e-9;
}

}  // namespace

void RegisterAttentionBenchmarks(const Registry& peers,
                                 const std::string& set) {
  ThreadSetters() = peers.set_threads;
  std::vector<int> thread_counts;
  if (set != "threads") thread_counts.push_back(1);
  if (set != "single") thread_counts.push_back(2);

  std::vector<std::pair<std::string, AttentionFactory>> prefill = {
      {"softdot", [](std::size_t n, std::size_t d, bool causal) {
         return std::unique_ptr<AttentionRunner>(
             new SoftdotAttention(n, d, causal));
       }}};
  prefill.insert(prefill.end(), peers.attention.begin(), peers.attention.end());
  const AttentionFactory naive = [](std::size_t n, std::size_t d, bool causal) {
    return std::unique_ptr<AttentionRunner>(new NaiveAttention(n, d, causal));
  };
  for (int t : thread_counts) {
    for (bool causal : {false, true}) {
      for (std::size_t n : kPrefillN) {
        for (std::size_t d : kPrefillD) {
          const std::string prefix =
              std::string("attention/") + (causal ? "causal/" : "full/") +
              std::to_string(n) + "x" + std::to_string(d) + "/";
          const std::string suffix = "/threads:" + std::to_string(t);
          for (const auto& [name, make] : prefill) {
            benchmark::RegisterBenchmark((prefix + name + suffix).c_str(),
                                         BenchPrefill, name, make, n, d, causal,
                                         t)
                ->Unit(benchmark::kMillisecond);
          }
          if (n <= kNaiveMaxN && t == 1) {
            benchmark::RegisterBenchmark((prefix + "naive" + suffix).c_str(),
                                         BenchPrefill, "naive", naive, n, d,
                                         causal, t)
                ->Unit(benchmark::kMillisecond);
          }
        }
      }
    }
  }

  std::vector<std::pair<std::string, DecodeFactory>> decode = {
      {"softdot",
       [](std::size_t h, std::size_t hkv, std::size_t n_kv, std::size_t d) {
         return std::unique_ptr<DecodeRunner>(
             new SoftdotDecode(h, hkv, n_kv, d));
       }}};
  decode.insert(decode.end(), peers.decode.begin(), peers.decode.end());
  const DecodeFactory roofline = [](std::size_t h, std::size_t hkv,
                                    std::size_t n_kv, std::size_t d) {
    return std::unique_ptr<DecodeRunner>(new ReadRoofline(h, hkv, n_kv, d));
  };
  for (int t : thread_counts) {
    for (std::size_t n_kv : kDecodeNkv) {
      const std::string prefix = "decode/memory/" + std::to_string(n_kv) + "x" +
                                 std::to_string(kHeadDim) + "/";
      const std::string suffix = "/threads:" + std::to_string(t);
      for (const auto& [name, make] : decode) {
        benchmark::RegisterBenchmark((prefix + name + suffix).c_str(),
                                     BenchDecode, name, make, n_kv, t, true)
            ->Unit(benchmark::kMicrosecond);
      }
      benchmark::RegisterBenchmark((prefix + "read_roofline" + suffix).c_str(),
                                   BenchDecode, "read_roofline", roofline, n_kv,
                                   t, false)
          ->Unit(benchmark::kMicrosecond);
    }
  }
}

}  // namespace softdot_peers
