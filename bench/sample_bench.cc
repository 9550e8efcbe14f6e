// softdot::sample on one row of V logits (N(0, 2), V = 131072 and 262144)
// for each filter of issue 28, beside one softdot::softmax pass over the
// same row (BM_sample_softmax_row): the issue asks sampling to stay within
// 1.5x of that pass. docs/performance.md, "Sampling", has the figures.
#include <softdot/softdot.h>

#include <cstdint>
#include <vector>

#include "bench_util.h"

namespace softdot_bench {
namespace {

void RunSample(benchmark::State& state, const softdot::SampleOptions& options) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const std::vector<float> x = RandomScores(n);
  const std::vector<std::uint64_t> seeds = {7};
  std::vector<std::int64_t> tokens(1);
  std::vector<float> logprobs(1);
  const softdot::MatrixView<const float> logits(x.data(), 1, n, n);
  for (auto _ : state) {
    softdot::sample(logits, seeds, tokens, logprobs, options);
    benchmark::DoNotOptimize(tokens.data());
    benchmark::ClobberMemory();
  }
  SetCounters(state, state.range(0), 1, 0);
}

void BM_sample_temperature(benchmark::State& state) {
  RunSample(state, {.temperature = 0.8});
}
void BM_sample_top_k(benchmark::State& state) {
  RunSample(state, {.top_k = 50});
}
void BM_sample_top_p(benchmark::State& state) {
  RunSample(state, {.top_p = 0.9});
}
void BM_sample_top_k_top_p(benchmark::State& state) {
  RunSample(state, {.top_k = 50, .top_p = 0.9});
}
void BM_sample_min_p(benchmark::State& state) {
  RunSample(state, {.min_p = 0.05});
}
void BM_sample_softmax_row(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const std::vector<float> x = RandomScores(n);
  std::vector<float> y(n);
  for (auto _ : state) {
    softdot::softmax(x, y);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  SetCounters(state, state.range(0), 1, 1);
}

void VocabSizes(benchmark::internal::Benchmark* b) {
  b->Arg(131072)->Arg(262144);
}
BENCHMARK(BM_sample_softmax_row)->Apply(VocabSizes);
BENCHMARK(BM_sample_temperature)->Apply(VocabSizes);
BENCHMARK(BM_sample_top_k)->Apply(VocabSizes);
BENCHMARK(BM_sample_top_p)->Apply(VocabSizes);
BENCHMARK(BM_sample_top_k_top_p)->Apply(VocabSizes);
BENCHMARK(BM_sample_min_p)->Apply(VocabSizes);

}  // namespace
}  // namespace softdot_bench
