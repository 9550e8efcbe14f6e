// softdot benchmarks: sizes, buffers and counters shared by the bench files.
#ifndef SOFTDOT_BENCH_BENCH_UTIL_H_
#define SOFTDOT_BENCH_BENCH_UTIL_H_

#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace softdot_bench {

// Vector lengths of every 1-D benchmark: a tiny call (overhead), L1 (64, 4 KiB
// at 4096), L2 (1000, 4096, 65536 = 256 KiB), and out of the last useful cache
// level (2^20 = 4 MiB per buffer sits in the 2 MiB L2 + L3; 2^24 = 64 MiB per
// buffer streams from memory). 2^22 is the element count of the 4096 x 1024
// softmax_rows benchmark; the baselines run at it too so its ratio can be read.
inline constexpr std::int64_t kSizes[] = {3,     64,      1000,   4096,
                                          65536, 1 << 20, 1 << 24};
inline constexpr std::int64_t kRowsSize = 4096 * 1024;

inline void AddSizes(benchmark::internal::Benchmark* b) {
  for (std::int64_t n : kSizes) b->Arg(n);
}
inline void AddSizesAndRows(benchmark::internal::Benchmark* b) {
  AddSizes(b);
  b->Arg(kRowsSize);
}

// Scores like attention logits: normal, sigma 2, fixed seed (same data every
// run).
inline std::vector<float> RandomScores(std::size_t n, std::uint32_t seed = 1) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Counters for a kernel that reads `reads` and writes `writes` arrays of n
// floats: bytes are the sizes of the arguments (not the traffic of a given
// algorithm), so GB/s of different kernels at the same n compare as times do.
inline void SetCounters(benchmark::State& state, std::int64_t n, int reads,
                        int writes) {
  const std::int64_t iters = static_cast<std::int64_t>(state.iterations());
  state.SetItemsProcessed(iters * n);
  state.SetBytesProcessed(iters * n * static_cast<std::int64_t>(sizeof(float)) *
                          (reads + writes));
}

// The textbook float softmax, the benchmarks' naive baseline: max; std::exp,
// store and float sum; divide (3 passes, 5 memory accesses per element once
// the data is out of cache). Scalar, not dispatched (baseline_kernels.cc).
void NaiveSoftmax(const float* x, float* y, std::size_t n);

// Baseline kernels (baseline_kernels.cc), dispatched to the best SIMD target.
void CopyLoop(const float* x, float* y, std::size_t n);
void RooflineTwoReadsOneWrite(const float* x, float* y, std::size_t n,
                              float scale);
double FloatDot2(const float* x, const float* y, std::size_t n);
// 12 independent FMA chains for `rounds` rounds (12 * rounds vector FMAs),
// at the dispatched target's width; FloatLanes() is that width in floats.
float FmaPeak(std::size_t rounds, float m, float c);
std::size_t FloatLanes();

}  // namespace softdot_bench

#endif  // SOFTDOT_BENCH_BENCH_UTIL_H_
