// Baselines, in the same binary as the softdot benchmarks so ratios come from
// one run on one core:
//   BM_naive_softmax  the textbook float softmax: max; exp + sum + store;
//                     divide (3 passes, std::exp, float sum; 5 memory accesses
//                     per element once the data is out of cache);
//   BM_naive_dot      a plain loop with one float accumulator;
//   BM_copy           y = x, ordinary vector stores (1 read + 1 write);
//   BM_memcpy         glibc memcpy (uses streaming stores for large copies);
//   BM_roofline_2r1w  max pass + (x - max) * s pass: a two-pass softmax's
//                     traffic (2 reads + 1 write) with no exp, i.e. the speed
//                     limit for a softmax whose input stays in memory.
#include <cstring>
#include <vector>

#include "bench_util.h"

namespace softdot_bench {
namespace {

float NaiveDot(const float* x, const float* y, std::size_t n) {
  float s = 0.0f;
  for (std::size_t i = 0; i < n; ++i) s += x[i] * y[i];
  return s;
}

void BM_naive_softmax(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const std::vector<float> x = RandomScores(n);
  std::vector<float> y(n);
  for (auto _ : state) {
    NaiveSoftmax(x.data(), y.data(), n);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  SetCounters(state, state.range(0), 1, 1);
}
BENCHMARK(BM_naive_softmax)->Apply(AddSizes);

void BM_naive_dot(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const std::vector<float> x = RandomScores(n, 1), y = RandomScores(n, 2);
  for (auto _ : state) {
    // The pointers go through DoNotOptimize so the loop is not hoisted out.
    const float* px = x.data();
    const float* py = y.data();
    benchmark::DoNotOptimize(px);
    benchmark::DoNotOptimize(py);
    float s = NaiveDot(px, py, n);
    benchmark::DoNotOptimize(s);
  }
  SetCounters(state, state.range(0), 2, 0);
}
BENCHMARK(BM_naive_dot)->Apply(AddSizes);

void BM_copy(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const std::vector<float> x = RandomScores(n);
  std::vector<float> y(n);
  for (auto _ : state) {
    CopyLoop(x.data(), y.data(), n);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  SetCounters(state, state.range(0), 1, 1);
}
BENCHMARK(BM_copy)->Apply(AddSizesAndRows);

void BM_memcpy(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const std::vector<float> x = RandomScores(n);
  std::vector<float> y(n);
  for (auto _ : state) {
    float* py = y.data();
    benchmark::DoNotOptimize(py);
    std::memcpy(py, x.data(), n * sizeof(float));
    benchmark::ClobberMemory();
  }
  SetCounters(state, state.range(0), 1, 1);
}
BENCHMARK(BM_memcpy)->Apply(AddSizesAndRows);

void BM_roofline_2r1w(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const std::vector<float> x = RandomScores(n);
  std::vector<float> y(n);
  float scale = 1.0f;
  benchmark::DoNotOptimize(scale);
  for (auto _ : state) {
    RooflineTwoReadsOneWrite(x.data(), y.data(), n, scale);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  SetCounters(state, state.range(0), 1, 1);
}
BENCHMARK(BM_roofline_2r1w)->Apply(AddSizesAndRows);

// The FMA peak of one core: 12 independent vector FMA chains, 10^5 rounds
// per iteration. The counter flop/s (2 flops per lane per FMA) is the
// compute roofline that attention results are read against.
void BM_fma_peak(benchmark::State& state) {
  constexpr std::size_t kRounds = 100000;
  float m = 0.999999f, c = 1e-7f;
  benchmark::DoNotOptimize(m);
  benchmark::DoNotOptimize(c);
  for (auto _ : state) {
    float r = FmaPeak(kRounds, m, c);
    benchmark::DoNotOptimize(r);
  }
  state.counters["flop/s"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * kRounds *
                             12 * 2 * static_cast<double>(FloatLanes()),
                         benchmark::Counter::kIsRate);
}
BENCHMARK(BM_fma_peak);

}  // namespace
}  // namespace softdot_bench
