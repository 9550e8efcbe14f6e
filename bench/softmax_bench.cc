// softdot::softmax (out of place) at every benchmark size, and softmax_rows on
// a 4096 x 1024 matrix (16 MiB in, 16 MiB out: attention scores of 4096
// queries against 1024 keys). Bytes count 1 read + 1 write per element.
#include <softdot/softdot.h>

#include <vector>

#include "bench_util.h"

namespace softdot_bench {
namespace {

void BM_softmax(benchmark::State& state) {
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
BENCHMARK(BM_softmax)->Apply(AddSizes);

void BM_softmax_rows(benchmark::State& state) {
  const auto rows = static_cast<std::size_t>(state.range(0));
  const auto cols = static_cast<std::size_t>(state.range(1));
  const std::vector<float> x = RandomScores(rows * cols);
  std::vector<float> y(rows * cols);
  const softdot::MatrixView<const float> in(x.data(), rows, cols);
  const softdot::MatrixView<float> out(y.data(), rows, cols);
  for (auto _ : state) {
    softdot::softmax_rows(in, out);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  SetCounters(state, state.range(0) * state.range(1), 1, 1);
}
BENCHMARK(BM_softmax_rows)->Args({4096, 1024});

}  // namespace
}  // namespace softdot_bench
