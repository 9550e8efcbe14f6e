// softdot_bench main: Google Benchmark plus the context a reader needs to
// interpret the numbers (which SIMD target ran, how many OpenMP threads).
// SOFTDOT_BENCH_TARGET=AVX2 (any name simd_targets() lists) forces a target.
#include <benchmark/benchmark.h>
#include <omp.h>
#include <softdot/softdot.h>

#include <cstdio>
#include <cstdlib>
#include <string>

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  if (const char* target = std::getenv("SOFTDOT_BENCH_TARGET")) {
    try {
      softdot::force_simd_target(target);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "softdot_bench: %s\n", e.what());
      return 2;
    }
  }
  benchmark::AddCustomContext("simd_target", softdot::simd_target());
  benchmark::AddCustomContext("omp_max_threads",
                              std::to_string(omp_get_max_threads()));
  benchmark::AddCustomContext("softdot_version", softdot::version());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
