// softdot_peers: softdot's softmax, dot and dots next to other libraries'
// (XNNPACK, oneDNN, Eigen, libtorch, OpenBLAS, Highway's contrib Dot — each
// one only when CMake found it), a naive scalar loop, and the copy and 2R+1W
// bandwidth loops of bench/baseline_kernels.cc, in one process on the same
// buffers. scripts/peers.sh runs it and scripts/peers_report.py prints the
// tables. (Over 600 lines on purpose: one adapter per peer, each a few lines
// of that library's API, registered side by side so that every peer runs on
// the same buffers; the attention cases have their own file.)
//
// Benchmark names: <family>/<case>/<shape>/<implementation>[/threads:<t>]
//   family  softmax (rows x n), dot (n), dots (n_keys x d), threads, and
//           attention and decode (attention_cases.cc, where the attention
//           benchmarks are described)
//   case    cache:  the same input and output buffers every iteration;
//           memory: each iteration uses the next copy in 512 MiB arenas, so
//                   the data comes from DRAM (see Layout).
// Everything runs on one thread (OpenMP, OpenBLAS and libtorch set to 1)
// except the threads/ family, which sets omp_set_num_threads(t) around its
// loop. SOFTDOT_PEERS_SET=single registers everything but threads/,
// SOFTDOT_PEERS_SET=threads only threads/ (peers.sh runs the first pinned to
// one core and the second on two); unset or "all": both.
//
// Self-check, outside the timed loop, once per implementation and shape:
// every softmax is compared with softdot's output on the same input (and
// softdot with a double-precision loop); a maximum absolute difference above
// 1e-5 skips the benchmark with an error, so a wrongly wired peer cannot
// report a time. Dots and dot products are checked against a double sum
// (relative to sum |x_i y_i|). The difference is kept as the counter
// max_abs_diff (softmax) or rel_err (dot, dots).
#include <benchmark/benchmark.h>
#include <omp.h>
#include <sched.h>
#include <softdot/softdot.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "bench_util.h"
#include "peers.h"

namespace softdot_peers {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

// ---- arenas -----------------------------------------------------------------
// Three arenas of 512 MiB, allocated and filled once: A (scores, N(0, 2),
// seed 1), B (second operand of dot / keys, N(0, 2), seed 2), O (outputs).
// The `cache` case uses copy 0 of a shape's buffers; the `memory` case walks
// through all copies, one per iteration. The arenas start at different
// offsets within a page (0, 1088, 2112 bytes) so that an input and the
// output of the same copy never share the address bits below 4 KiB (which
// would add 4K-aliasing stalls that real buffers rarely have).
constexpr std::size_t kArenaBytes = 512 * kMiB;
constexpr std::size_t kArenaSlackBytes = 1 * kMiB;  // past the last copy

class Arena {
 public:
  Arena(std::size_t offset_bytes, std::uint32_t seed, bool random) {
    const std::size_t bytes = kArenaBytes + kArenaSlackBytes + 4096;
    raw_ = static_cast<char*>(std::aligned_alloc(
        2 * kMiB, (bytes + 2 * kMiB - 1) / (2 * kMiB) * (2 * kMiB)));
    if (raw_ == nullptr) {
      std::fprintf(stderr, "softdot_peers: cannot allocate %zu MiB\n",
                   bytes / kMiB);
      std::exit(1);
    }
    data_ = reinterpret_cast<float*>(raw_ + offset_bytes);
    const std::size_t n = (kArenaBytes + kArenaSlackBytes) / sizeof(float);
    if (random) {
      // N(0, 2) scores like bench_util.h's RandomScores, one stream per arena.
      std::mt19937 rng(seed);
      std::normal_distribution<float> dist(0.0f, 2.0f);
      for (std::size_t i = 0; i < n; ++i) data_[i] = dist(rng);
    } else {
      std::memset(data_, 0, n * sizeof(float));  // touch every page now
    }
  }
  ~Arena() { std::free(raw_); }
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  float* data() const { return data_; }

 private:
  char* raw_ = nullptr;
  float* data_ = nullptr;
};

Arena& ArenaA() {
  static Arena a(0, 1, true);
  return a;
}
Arena& ArenaB() {
  static Arena a(1088, 2, true);
  return a;
}
Arena& ArenaO() {
  static Arena a(2112, 0, false);
  return a;
}

// Copies of a buffer of `count` floats in an arena: each starts 64-byte
// aligned with at least 64 bytes after it (XNNPACK reads up to 16 bytes past
// an input). As many copies as fit in 512 MiB; a 64 MiB buffer gets 7.
struct Layout {
  explicit Layout(std::size_t count)
      : stride((count + 16 + 15) / 16 * 16),
        copies(std::max<std::size_t>(2, kArenaBytes / sizeof(float) / stride)) {
    if (copies * stride * sizeof(float) > kArenaBytes + kArenaSlackBytes) {
      std::fprintf(stderr,
                   "softdot_peers: %zu floats do not fit twice in an arena\n",
                   count);
      std::exit(1);
    }
  }
  std::size_t offset(std::size_t copy) const { return copy * stride; }
  std::size_t stride;  // floats
  std::size_t copies;
};

enum class Case { kCache, kMemory };
const char* CaseName(Case c) { return c == Case::kCache ? "cache" : "memory"; }

// Copy index for the next iteration.
inline void Advance(Case c, std::size_t& k, std::size_t copies) {
  if (c == Case::kMemory && ++k == copies) k = 0;
}

// ---- softdot, the naive loop and the bandwidth baselines as runners
// ----------
template <softdot::Precision kPrecision>
class SoftdotSoftmax final : public SoftmaxRunner {
 public:
  SoftdotSoftmax(std::size_t rows, std::size_t n) : rows_(rows), n_(n) {
    options_.precision = kPrecision;
  }
  void Run(const float* x, float* y) override {
    if (rows_ == 1) {
      softdot::softmax(std::span<const float>(x, n_), std::span<float>(y, n_),
                       options_);
    } else {
      softdot::softmax_rows(softdot::MatrixView<const float>(x, rows_, n_),
                            softdot::MatrixView<float>(y, rows_, n_), options_);
    }
  }

 private:
  std::size_t rows_, n_;
  softdot::SoftmaxOptions options_;
};

// The textbook float softmax of bench/bench_util.h, row by row.
class NaiveSoftmax final : public SoftmaxRunner {
 public:
  NaiveSoftmax(std::size_t rows, std::size_t n) : rows_(rows), n_(n) {}
  void Run(const float* x, float* y) override {
    for (std::size_t r = 0; r < rows_; ++r)
      softdot_bench::NaiveSoftmax(x + r * n_, y + r * n_, n_);
  }

 private:
  std::size_t rows_, n_;
};

// The 1-D baselines over the whole buffer (same bytes as the softmax).
class CopyRunner final : public SoftmaxRunner {
 public:
  CopyRunner(std::size_t rows, std::size_t n) : count_(rows * n) {}
  void Run(const float* x, float* y) override {
    softdot_bench::CopyLoop(x, y, count_);
  }

 private:
  std::size_t count_;
};

class RooflineRunner final : public SoftmaxRunner {
 public:
  RooflineRunner(std::size_t rows, std::size_t n) : count_(rows * n) {
    benchmark::DoNotOptimize(scale_);
  }
  void Run(const float* x, float* y) override {
    softdot_bench::RooflineTwoReadsOneWrite(x, y, count_, scale_);
  }

 private:
  std::size_t count_;
  float scale_ = 1.0f;
};

template <class R>
SoftmaxFactory Factory() {
  return [](std::size_t rows, std::size_t n) {
    return std::unique_ptr<SoftmaxRunner>(new R(rows, n));
  };
}

float SoftdotDot(const float* x, const float* y, std::size_t n) {
  return softdot::dot(std::span<const float>(x, n),
                      std::span<const float>(y, n));
}

// One float accumulator, like bench/baseline_bench.cc's BM_naive_dot.
float NaiveDot(const float* x, const float* y, std::size_t n) {
  float s = 0.0f;
  for (std::size_t i = 0; i < n; ++i) s += x[i] * y[i];
  return s;
}

class SoftdotDots final : public DotsRunner {
 public:
  SoftdotDots(std::size_t n_keys, std::size_t d) : n_keys_(n_keys), d_(d) {}
  void Run(const float* query, const float* keys, float* scores) override {
    softdot::dots(std::span<const float>(query, d_),
                  softdot::MatrixView<const float>(keys, n_keys_, d_),
                  std::span<float>(scores, n_keys_));
  }

 private:
  std::size_t n_keys_, d_;
};

// ---- self-checks
// ---------------------------------------------------------------
constexpr double kSoftmaxTolerance = 1e-5;  // max abs difference to softdot
constexpr double kDotTolerance = 1e-5;      // relative to sum |x_i y_i|

// softdot's output for copy 0 of the shape (one shape kept at a time: the
// benchmarks are registered shape by shape).
const std::vector<float>& SoftdotOutput(std::size_t rows, std::size_t n) {
  static std::size_t cached_rows = 0, cached_n = 0;
  static std::vector<float> out;
  if (rows != cached_rows || n != cached_n) {
    out.assign(rows * n, 0.0f);
    SoftdotSoftmax<softdot::Precision::kFaithful>(rows, n).Run(ArenaA().data(),
                                                               out.data());
    cached_rows = rows;
    cached_n = n;
  }
  return out;
}

// max |a - b|; NaN when either holds a NaN or the sizes differ.
double MaxAbsDiff(const float* a, const float* b, std::size_t count) {
  double m = 0.0;
  for (std::size_t i = 0; i < count; ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - b[i]);
    if (!(d <= m)) m = d;  // also catches NaN
  }
  return m;
}

// softdot's own output against a double-precision loop.
double CheckSoftdotAgainstDouble(std::size_t rows, std::size_t n) {
  const std::vector<float>& got = SoftdotOutput(rows, n);
  const float* x = ArenaA().data();
  std::vector<double> e(n);
  double worst = 0.0;
  for (std::size_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    double m = -std::numeric_limits<double>::infinity(), sum = 0.0;
    for (std::size_t i = 0; i < n; ++i) m = std::max<double>(m, xr[i]);
    for (std::size_t i = 0; i < n; ++i) sum += (e[i] = std::exp(xr[i] - m));
    for (std::size_t i = 0; i < n; ++i) {
      const double d = std::fabs(e[i] / sum - got[r * n + i]);
      if (!(d <= worst)) worst = d;
    }
  }
  return worst;
}

// Runs the implementation once on copy 0 (into a separate buffer, so no
// timed run can leave the right answer behind) and compares with softdot.
double CheckSoftmax(const std::string& impl, SoftmaxRunner& runner,
                    std::size_t rows, std::size_t n) {
  if (impl == "softdot") return CheckSoftdotAgainstDouble(rows, n);
  const std::vector<float>& want = SoftdotOutput(rows, n);
  std::vector<float> got(rows * n + 16,
                         std::numeric_limits<float>::quiet_NaN());
  runner.Run(ArenaA().data(), got.data());
  return MaxAbsDiff(got.data(), want.data(), rows * n);
}

// Relative error of a dot product against a double sum.
double DotRelErr(const float* x, const float* y, std::size_t n, float got) {
  double exact = 0.0, abs_sum = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    const double p = static_cast<double>(x[i]) * y[i];
    exact += p;
    abs_sum += std::fabs(p);
  }
  const double err = std::fabs(got - exact) / std::max(abs_sum, 1e-30);
  return err == err ? err : std::numeric_limits<double>::infinity();
}

// ---- the benchmarks
// -------------------------------------------------------------- Runners are
// made once per (implementation, shape) and kept for the whole run (Google
// Benchmark calls a benchmark function several times: to find the iteration
// count and once per repetition); self-checks are memoised.
template <class Runner>
Runner& Cached(std::map<std::string, std::unique_ptr<Runner>>& cache,
               const std::string& key,
               const std::function<std::unique_ptr<Runner>()>& make) {
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, make()).first;
  return *it->second;
}

std::map<std::string, std::unique_ptr<SoftmaxRunner>>& SoftmaxRunners() {
  static std::map<std::string, std::unique_ptr<SoftmaxRunner>> m;
  return m;
}
std::map<std::string, std::unique_ptr<DotsRunner>>& DotsRunners() {
  static std::map<std::string, std::unique_ptr<DotsRunner>> m;
  return m;
}
std::map<std::string, double>& CheckResults() {
  static std::map<std::string, double> m;
  return m;
}

std::string ShapeName(std::size_t rows, std::size_t n) {
  return std::to_string(rows) + "x" + std::to_string(n);
}

// Sets the OpenMP thread count for one benchmark and restores 1 after it.
struct OmpThreads {
  explicit OmpThreads(int t) { omp_set_num_threads(t); }
  ~OmpThreads() { omp_set_num_threads(1); }
};

void SetCounters(benchmark::State& state, std::int64_t items,
                 std::int64_t bytes) {
  const auto iters = static_cast<std::int64_t>(state.iterations());
  state.SetItemsProcessed(iters * items);
  state.SetBytesProcessed(iters * bytes);
}

void BenchSoftmax(benchmark::State& state, const std::string& impl,
                  const SoftmaxFactory& make, std::size_t rows, std::size_t n,
                  Case c, int threads, bool check) {
  const OmpThreads omp(threads);
  const std::string key = impl + "/" + ShapeName(rows, n);
  SoftmaxRunner* runner = nullptr;
  try {
    runner = &Cached<SoftmaxRunner>(SoftmaxRunners(), key,
                                    [&] { return make(rows, n); });
    if (check) {
      auto it = CheckResults().find(key);
      if (it == CheckResults().end()) {
        it = CheckResults()
                 .emplace(key, CheckSoftmax(impl, *runner, rows, n))
                 .first;
      }
      state.counters["max_abs_diff"] = it->second;
      if (!(it->second <= kSoftmaxTolerance)) {
        state.SkipWithError(("self-check failed: max |" + impl +
                             " - softdot| = " + std::to_string(it->second) +
                             " > 1e-5")
                                .c_str());
        return;
      }
    }
  } catch (const std::exception& e) {
    state.SkipWithError((impl + ": " + e.what()).c_str());
    return;
  }
  const Layout layout(rows * n);
  const float* in = ArenaA().data();
  float* out = ArenaO().data();
  std::size_t k = 0;
  for (auto _ : state) {
    runner->Run(in + layout.offset(k), out + layout.offset(k));
    benchmark::ClobberMemory();
    Advance(c, k, layout.copies);
  }
  const auto count = static_cast<std::int64_t>(rows * n);
  SetCounters(state, count,
              count * 2 * static_cast<std::int64_t>(sizeof(float)));
}

void BenchDot(benchmark::State& state, const std::string& impl, DotFn fn,
              std::size_t n, Case c) {
  const std::string key = "dot/" + impl + "/" + std::to_string(n);
  const float* xs = ArenaA().data();
  const float* ys = ArenaB().data();
  auto it = CheckResults().find(key);
  if (it == CheckResults().end()) {
    it = CheckResults().emplace(key, DotRelErr(xs, ys, n, fn(xs, ys, n))).first;
  }
  state.counters["rel_err"] = it->second;
  if (!(it->second <= kDotTolerance)) {
    state.SkipWithError(("self-check failed: " + impl + " relative error " +
                         std::to_string(it->second) + " > 1e-5")
                            .c_str());
    return;
  }
  const Layout layout(n);
  std::size_t k = 0;
  for (auto _ : state) {
    const float* x = xs + layout.offset(k);
    const float* y = ys + layout.offset(k);
    benchmark::DoNotOptimize(x);
    benchmark::DoNotOptimize(y);
    float s = fn(x, y, n);
    benchmark::DoNotOptimize(s);
    Advance(c, k, layout.copies);
  }
  SetCounters(state, static_cast<std::int64_t>(n),
              static_cast<std::int64_t>(2 * n * sizeof(float)));
}

void BenchDots(benchmark::State& state, const std::string& impl,
               const DotsFactory& make, std::size_t n_keys, std::size_t d,
               Case c, int threads) {
  const OmpThreads omp(threads);
  const std::string key = "dots/" + impl + "/" + ShapeName(n_keys, d);
  const float* qs = ArenaA().data();
  const float* ks = ArenaB().data();
  float* ss = ArenaO().data();
  DotsRunner* runner = nullptr;
  try {
    runner = &Cached<DotsRunner>(DotsRunners(), key,
                                 [&] { return make(n_keys, d); });
    auto it = CheckResults().find(key);
    if (it == CheckResults().end()) {
      std::vector<float> scores(n_keys + 16);
      runner->Run(qs, ks, scores.data());
      double worst = 0.0;
      for (std::size_t r = 0; r < n_keys; ++r) {
        worst = std::max(worst, DotRelErr(ks + r * d, qs, d, scores[r]));
      }
      it = CheckResults().emplace(key, worst).first;
    }
    state.counters["rel_err"] = it->second;
    if (!(it->second <= kDotTolerance)) {
      state.SkipWithError(("self-check failed: " + impl + " relative error " +
                           std::to_string(it->second) + " > 1e-5")
                              .c_str());
      return;
    }
  } catch (const std::exception& e) {
    state.SkipWithError((impl + ": " + e.what()).c_str());
    return;
  }
  const Layout keys_layout(n_keys * d), query_layout(d), scores_layout(n_keys);
  std::size_t k = 0;
  for (auto _ : state) {
    runner->Run(qs + query_layout.offset(k), ks + keys_layout.offset(k),
                ss + scores_layout.offset(k));
    benchmark::ClobberMemory();
    Advance(c, k, keys_layout.copies);
  }
  SetCounters(
      state, static_cast<std::int64_t>(n_keys * d),
      static_cast<std::int64_t>((n_keys * d + d + n_keys) * sizeof(float)));
}

// ---- registration
// ------------------------------------------------------------------
struct Shape {
  std::size_t rows, n;
};
constexpr Shape kSoftmaxShapes[] = {{1, 3},       {1, 8},        {1, 16},
                                    {1, 64},      {1, 1000},     {1, 4096},
                                    {1, 65536},   {1, 1u << 20}, {1, 1u << 24},
                                    {4096, 1024}, {256, 32000}};
constexpr std::size_t kDotSizes[] = {3,    8,     64,       1000,
                                     4096, 65536, 1u << 20, 1u << 24};
constexpr std::size_t kDotsKeys[] = {4096, 65536};
constexpr std::size_t kHeadDim = 128;
constexpr Case kCases[] = {Case::kCache, Case::kMemory};
constexpr int kThreadCounts[] = {1, 2};

void RegisterSingleThread(const Registry& peers) {
  // softmax: softdot first, then the peers, the naive loop and the baselines.
  std::vector<std::pair<std::string, SoftmaxFactory>> softmax = {
      {"softdot", Factory<SoftdotSoftmax<softdot::Precision::kFaithful>>()},
      {"softdot_fast", Factory<SoftdotSoftmax<softdot::Precision::kFast>>()}};
  softmax.insert(softmax.end(), peers.softmax.begin(), peers.softmax.end());
  softmax.emplace_back("naive", Factory<NaiveSoftmax>());
  const std::vector<std::pair<std::string, SoftmaxFactory>> baselines = {
      {"copy", Factory<CopyRunner>()},
      {"roofline_2r1w", Factory<RooflineRunner>()}};
  for (const Shape& s : kSoftmaxShapes) {
    for (Case c : kCases) {
      const std::string prefix = std::string("softmax/") + CaseName(c) + "/" +
                                 ShapeName(s.rows, s.n) + "/";
      for (const auto& [name, make] : softmax) {
        benchmark::RegisterBenchmark((prefix + name).c_str(), BenchSoftmax,
                                     name, make, s.rows, s.n, c, 1, true);
      }
      for (const auto& [name, make] : baselines) {
        benchmark::RegisterBenchmark((prefix + name).c_str(), BenchSoftmax,
                                     name, make, s.rows, s.n, c, 1, false);
      }
    }
  }

  std::vector<std::pair<std::string, DotFn>> dot = {{"softdot", &SoftdotDot}};
  dot.insert(dot.end(), peers.dot.begin(), peers.dot.end());
  dot.emplace_back("naive", &NaiveDot);
  for (std::size_t n : kDotSizes) {
    for (Case c : kCases) {
      const std::string prefix =
          std::string("dot/") + CaseName(c) + "/" + std::to_string(n) + "/";
      for (const auto& [name, fn] : dot) {
        benchmark::RegisterBenchmark((prefix + name).c_str(), BenchDot, name,
                                     fn, n, c);
      }
    }
  }

  std::vector<std::pair<std::string, DotsFactory>> dots = {
      {"softdot", [](std::size_t n_keys, std::size_t d) {
         return std::unique_ptr<DotsRunner>(new SoftdotDots(n_keys, d));
       }}};
  dots.insert(dots.end(), peers.dots.begin(), peers.dots.end());
  for (std::size_t n_keys : kDotsKeys) {
    for (Case c : kCases) {
      const std::string prefix = std::string("dots/") + CaseName(c) + "/" +
                                 ShapeName(n_keys, kHeadDim) + "/";
      for (const auto& [name, make] : dots) {
        benchmark::RegisterBenchmark((prefix + name).c_str(), BenchDots, name,
                                     make, n_keys, kHeadDim, c, 1);
      }
    }
  }
}

// softdot's OpenMP-parallel calls at 1 and 2 threads (omp_set_num_threads,
// not Google Benchmark's ->Threads, which would run the call on t threads).
void RegisterThreads() {
  const SoftmaxFactory rows =
      Factory<SoftdotSoftmax<softdot::Precision::kFaithful>>();
  const DotsFactory dots = [](std::size_t n_keys, std::size_t d) {
    return std::unique_ptr<DotsRunner>(new SoftdotDots(n_keys, d));
  };
  for (Case c : kCases) {
    for (const Shape& s : {Shape{4096, 1024}, Shape{256, 32000}}) {
      for (int t : kThreadCounts) {
        const std::string name = std::string("threads/") + CaseName(c) + "/" +
                                 ShapeName(s.rows, s.n) +
                                 "/softdot_rows/threads:" + std::to_string(t);
        benchmark::RegisterBenchmark(name.c_str(), BenchSoftmax, "softdot",
                                     rows, s.rows, s.n, c, t, true);
      }
    }
    for (int t : kThreadCounts) {
      const std::string name = std::string("threads/") + CaseName(c) + "/" +
                               ShapeName(65536, kHeadDim) +
                               "/softdot_dots/threads:" + std::to_string(t);
      benchmark::RegisterBenchmark(name.c_str(), BenchDots, "softdot", dots,
                                   65536, kHeadDim, c, t);
    }
  }
}

int AffinityCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return -1;
  return CPU_COUNT(&set);
}

}  // namespace
}  // namespace softdot_peers

int main(int argc, char** argv) {
  using namespace softdot_peers;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  const char* set_env = std::getenv("SOFTDOT_PEERS_SET");
  const std::string set =
      set_env != nullptr && *set_env != '\0' ? set_env : "all";
  if (set != "all" && set != "single" && set != "threads") {
    std::fprintf(
        stderr,
        "softdot_peers: SOFTDOT_PEERS_SET must be all, single or threads\n");
    return 2;
  }
  // SOFTDOT_BENCH_TARGET=AVX2 (a name softdot::simd_targets() lists) forces
  // softdot's SIMD target, before any peer registers. Highway's contrib Dot
  // dispatches through the same libhwy, so it follows; OpenBLAS chooses its
  // kernels itself (OPENBLAS_CORETYPE=Haswell gives its AVX2 ones).
  if (const char* target = std::getenv("SOFTDOT_BENCH_TARGET")) {
    try {
      softdot::force_simd_target(target);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "softdot_peers: %s\n", e.what());
      return 2;
    }
  }
  // Before any library changes it: what OpenMP would use by default.
  const int omp_max_threads = omp_get_max_threads();
  omp_set_num_threads(1);

  Registry peers;
  try {
#ifdef SOFTDOT_PEER_XNNPACK
    RegisterXnnpack(peers);
#endif
#ifdef SOFTDOT_PEER_ONEDNN
    RegisterOnednn(peers);
#endif
#ifdef SOFTDOT_PEER_EIGEN
    RegisterEigen(peers);
#endif
#ifdef SOFTDOT_PEER_TORCH
    RegisterTorch(peers);
#endif
#ifdef SOFTDOT_PEER_OPENBLAS
    RegisterOpenblas(peers);
#endif
#ifdef SOFTDOT_PEER_HWYDOT
    RegisterHwyDot(peers);
#endif
#ifdef SOFTDOT_PEER_TORCH_ATTENTION
    RegisterTorchAttention(peers);
#endif
#ifdef SOFTDOT_PEER_BLAS_ATTENTION
    RegisterBlasAttention(peers);
#endif
  } catch (const std::exception& e) {
    std::fprintf(stderr, "softdot_peers: %s\n", e.what());
    return 1;
  }
  omp_set_num_threads(1);  // libtorch's set_num_threads also sets it

  benchmark::AddCustomContext("simd_target", softdot::simd_target());
  benchmark::AddCustomContext("softdot_version", softdot::version());
  benchmark::AddCustomContext("omp_max_threads",
                              std::to_string(omp_max_threads));
  benchmark::AddCustomContext("affinity_cpus", std::to_string(AffinityCpus()));
  benchmark::AddCustomContext("peers_set", set);
  std::string names;
  for (const auto& [name, make] : peers.softmax)
    names += (names.empty() ? "" : ",") + name;
  benchmark::AddCustomContext("softmax_peers", names);
  names.clear();
  for (const auto& [name, make] : peers.attention)
    names += (names.empty() ? "" : ",") + name;
  benchmark::AddCustomContext("attention_peers", names);
  benchmark::AddCustomContext(
      "attention_decode",
      "n_q 1, 8 query heads on 2 KV heads, d 128, float32 K and V");
  for (const auto& [key, value] : peers.context)
    benchmark::AddCustomContext(key, value);

  if (set != "threads") RegisterSingleThread(peers);
  if (set != "single") RegisterThreads();
  RegisterAttentionBenchmarks(peers, set);  // attention_cases.cc
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
