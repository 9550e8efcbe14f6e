// softdot::dot and dot_accurate (float) at every benchmark size; read 2
// arrays.
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

}  // namespace
}  // namespace softdot_bench
