// softdot::dot and dot_accurate at every benchmark size (float), and at a few
// (double); read 2 arrays. BM_float_dot2 is the other way to a float dot in
// twice the working precision (Dot2 in float lanes, bench/baseline_kernels.cc),
// measured against dot_accurate's exact products summed in double.
#include <softdot/softdot.h>

#include <span>
#include <vector>

#include "bench_util.h"

namespace softdot_bench {
namespace {

// One dot-product function over two float arrays of n elements.
template <float (*kDot)(std::span<const float>, std::span<const float>)>
void RunDot(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const std::vector<float> x = RandomScores(n, 1), y = RandomScores(n, 2);
  for (auto _ : state) {
    float s = kDot(x, y);
    benchmark::DoNotOptimize(s);
  }
  SetCounters(state, state.range(0), 2, 0);
}

void BM_dot(benchmark::State& state) { RunDot<softdot::dot>(state); }
BENCHMARK(BM_dot)->Apply(AddSizes);

// dot_accurate (float): exact products summed in double; its cost against
// BM_dot at the same n is the price of twice the working precision.
void BM_dot_accurate(benchmark::State& state) {
  RunDot<softdot::dot_accurate>(state);
}
BENCHMARK(BM_dot_accurate)->Apply(AddSizes);

void BM_float_dot2(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const std::vector<float> x = RandomScores(n, 1), y = RandomScores(n, 2);
  for (auto _ : state) {
    double s = FloatDot2(x.data(), y.data(), n);
    benchmark::DoNotOptimize(s);
  }
  SetCounters(state, state.range(0), 2, 0);
}
BENCHMARK(BM_float_dot2)->Arg(4096)->Arg(65536)->Arg(1 << 20)->Arg(1 << 24);

// double: dot and dot_accurate (Dot2); bytes are 8 per element.
template <double (*kDot)(std::span<const double>, std::span<const double>)>
void RunDotF64(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const std::vector<float> xf = RandomScores(n, 1), yf = RandomScores(n, 2);
  const std::vector<double> x(xf.begin(), xf.end()), y(yf.begin(), yf.end());
  for (auto _ : state) {
    double s = kDot(x, y);
    benchmark::DoNotOptimize(s);
  }
  SetCounters(state, state.range(0), 4, 0);
}
void BM_dot_f64(benchmark::State& state) { RunDotF64<softdot::dot>(state); }
void BM_dot_accurate_f64(benchmark::State& state) {
  RunDotF64<softdot::dot_accurate>(state);
}
BENCHMARK(BM_dot_f64)->Arg(3)->Arg(4096)->Arg(1 << 20)->Arg(1 << 23);
BENCHMARK(BM_dot_accurate_f64)->Arg(3)->Arg(4096)->Arg(1 << 20)->Arg(1 << 23);

}  // namespace
}  // namespace softdot_bench

namespace softdot_bench {
namespace {

// dots: one query (d = 128) against n keys, the scores of one attention
// query; 4096 keys are 2 MiB (L2), 65536 keys 32 MiB. Bytes: keys + query +
// scores.
void BM_dots(benchmark::State& state) {
  const auto keys = static_cast<std::size_t>(state.range(0));
  constexpr std::size_t kDim = 128;
  const std::vector<float> k = RandomScores(keys * kDim, 1);
  const std::vector<float> q = RandomScores(kDim, 2);
  std::vector<float> s(keys);
  const softdot::MatrixView<const float> km(k.data(), keys, kDim);
  for (auto _ : state) {
    softdot::dots(q, km, s);
    benchmark::DoNotOptimize(s.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(keys));
  state.SetBytesProcessed(
      state.iterations() *
      static_cast<std::int64_t>((keys * kDim + kDim + keys) * sizeof(float)));
}
// 4 keys: the cost of a small serial call (no OpenMP region).
BENCHMARK(BM_dots)->Arg(4)->Arg(4096)->Arg(65536);

}  // namespace
}  // namespace softdot_bench
