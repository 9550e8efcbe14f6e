// softdot::softmax (out of place) at every benchmark size, and softmax_rows on
// a 4096 x 1024 matrix (16 MiB in, 16 MiB out: attention scores of 4096
// queries against 1024 keys), in the default Precision::kFaithful and, as
// *_fast, in Precision::kFast. Bytes count 1 read + 1 write per element.
#include <softdot/softdot.h>

#include <vector>

#include "bench_util.h"

namespace softdot_bench {
namespace {

template <softdot::Precision kPrecision, class T = float>
void RunSoftmax(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const std::vector<float> scores = RandomScores(n);
  const std::vector<T> x(scores.begin(), scores.end());
  std::vector<T> y(n);
  softdot::SoftmaxOptions options;
  options.precision = kPrecision;
  for (auto _ : state) {
    softdot::softmax(x, y, options);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  SetCounters(state, state.range(0), 1, 1);
  if (sizeof(T) == 8) state.SetBytesProcessed(2 * state.bytes_processed());
}
void BM_softmax(benchmark::State& state) {
  RunSoftmax<softdot::Precision::kFaithful>(state);
}
void BM_softmax_fast(benchmark::State& state) {
  RunSoftmax<softdot::Precision::kFast>(state);
}
BENCHMARK(BM_softmax)->Apply(AddSizes);
BENCHMARK(BM_softmax_fast)->Apply(AddSizes);

// log_softmax (out of place) and logsumexp (reads only) at the same sizes,
// default options: issue 14 asks for each at most the time of BM_softmax.
void BM_log_softmax(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const std::vector<float> x = RandomScores(n);
  std::vector<float> y(n);
  for (auto _ : state) {
    softdot::log_softmax(std::span<const float>(x), std::span<float>(y));
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  SetCounters(state, state.range(0), 1, 1);
}
void BM_logsumexp(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const std::vector<float> x = RandomScores(n);
  for (auto _ : state) {
    float lse = softdot::logsumexp(std::span<const float>(x));
    benchmark::DoNotOptimize(lse);
  }
  SetCounters(state, state.range(0), 1, 0);
}
BENCHMARK(BM_log_softmax)->Apply(AddSizes);
BENCHMARK(BM_logsumexp)->Apply(AddSizes);
// double, in cache and from L3/memory.
void BM_softmax_f64(benchmark::State& state) {
  RunSoftmax<softdot::Precision::kFaithful, double>(state);
}
void BM_softmax_f64_fast(benchmark::State& state) {
  RunSoftmax<softdot::Precision::kFast, double>(state);
}
BENCHMARK(BM_softmax_f64)->Arg(4096)->Arg(1 << 20);
BENCHMARK(BM_softmax_f64_fast)->Arg(4096)->Arg(1 << 20);

template <softdot::Precision kPrecision>
void RunSoftmaxRows(benchmark::State& state) {
  const auto rows = static_cast<std::size_t>(state.range(0));
  const auto cols = static_cast<std::size_t>(state.range(1));
  const std::vector<float> x = RandomScores(rows * cols);
  std::vector<float> y(rows * cols);
  const softdot::MatrixView<const float> in(x.data(), rows, cols);
  const softdot::MatrixView<float> out(y.data(), rows, cols);
  softdot::SoftmaxOptions options;
  options.precision = kPrecision;
  for (auto _ : state) {
    softdot::softmax_rows(in, out, options);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  SetCounters(state, state.range(0) * state.range(1), 1, 1);
}
void BM_softmax_rows(benchmark::State& state) {
  RunSoftmaxRows<softdot::Precision::kFaithful>(state);
}
void BM_softmax_rows_fast(benchmark::State& state) {
  RunSoftmaxRows<softdot::Precision::kFast>(state);
}
// 4 x 16: the cost of a small serial call (no OpenMP region).
BENCHMARK(BM_softmax_rows)->Args({4096, 1024})->Args({4, 16});
BENCHMARK(BM_softmax_rows_fast)->Args({4096, 1024});

}  // namespace
}  // namespace softdot_bench
