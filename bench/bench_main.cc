// softdot_bench main: Google Benchmark plus the context a reader needs to
// interpret the numbers (which SIMD target ran, how many OpenMP threads).
#include <benchmark/benchmark.h>
#include <omp.h>
#include <softdot/softdot.h>

#include <string>

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("simd_target", softdot::simd_target());
  benchmark::AddCustomContext("omp_max_threads", std::to_string(omp_get_max_threads()));
  benchmark::AddCustomContext("softdot_version", softdot::version());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
