// The vocabulary-parallel fused linear + cross-entropy across processes:
// loss and both gradients on P ranks (each its V / P rows of the weight)
// against softdot::linear_cross_entropy on the whole weight in one process
// (rank 0 alone), the same threads per rank. Not a Google Benchmark (it
// runs under mpirun).
//
//   OMP_NUM_THREADS=T mpirun -np P softdot_mpi_linear_cross_entropy_bench
//       [N [D [V [REPS]]]]
//
// Prints (rank 0): t1 (one process, best of REPS), tP (P ranks, best of
// REPS, the slowest rank), the speed-up t1 / tP and the efficiency
// t1 / (P tP), and the GFLOP/s of the three products (6 N D V flops).
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "softdot/linear_cross_entropy.h"
#include "softdot/mpi.h"
#include "softdot/simd.h"

namespace {

double now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::size_t arg(int argc, char** argv, int i, std::size_t def) {
  return argc > i ? static_cast<std::size_t>(std::atoll(argv[i])) : def;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const std::size_t N = arg(argc, argv, 1, 1024), D = arg(argc, argv, 2, 1024),
                    V = arg(argc, argv, 3, 32768),
                    reps = std::max<std::size_t>(1, arg(argc, argv, 4, 3));
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> h(N * D), w(V * D);
  for (float& x : h) x = u(rng);
  for (float& x : w) x = u(rng) * 0.05f;
  std::vector<std::int64_t> t(N);
  for (auto& x : t) x = static_cast<std::int64_t>(rng() % V);
  const std::size_t p = static_cast<std::size_t>(size),
                    r = static_cast<std::size_t>(rank);
  const std::size_t b = V * r / p, e = V * (r + 1) / p;
  std::vector<float> gh(N * D), gw((e - b) * D), gw_all;
  const softdot::MatrixView<const float> hv(h.data(), N, D);
  double t1 = 0;
  if (rank == 0) {
    gw_all.resize(V * D);
    t1 = 1e30;
    for (std::size_t k = 0; k < reps; ++k) {
      const double s = now();
      softdot::linear_cross_entropy(
          hv, softdot::MatrixView<const float>(w.data(), V, D), t, {},
          softdot::MatrixView<float>(gh.data(), N, D),
          softdot::MatrixView<float>(gw_all.data(), V, D));
      t1 = std::min(t1, now() - s);
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  double tp = 1e30;
  for (std::size_t k = 0; k < reps; ++k) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double s = now();
    softdot::mpi::linear_cross_entropy(
        MPI_COMM_WORLD, hv,
        softdot::MatrixView<const float>(w.data() + b * D, e - b, D), b, t, {},
        softdot::MatrixView<float>(gh.data(), N, D),
        softdot::MatrixView<float>(gw.data(), e - b, D));
    double mine = now() - s, slowest = 0;
    MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    tp = std::min(tp, slowest);
  }
  if (rank == 0) {
    const double flops = 6.0 * static_cast<double>(N) * static_cast<double>(D) *
                         static_cast<double>(V);
    const char* omp = std::getenv("OMP_NUM_THREADS");
    std::printf(
        "linear_cross_entropy N=%zu D=%zu V=%zu, %s, P=%d, threads/rank=%s\n"
        "t1 %.3f s (%.1f GFLOP/s)  tP %.3f s (%.1f GFLOP/s)  speed-up %.2f  "
        "efficiency %.2f\n",
        N, D, V, softdot::simd_target().c_str(), size,
        omp != nullptr ? omp : "default", t1, flops / t1 * 1e-9, tp,
        flops / tp * 1e-9, t1 / tp, t1 / (static_cast<double>(size) * tp));
  }
  MPI_Finalize();
  return 0;
}
