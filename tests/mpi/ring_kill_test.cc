// A rank killed (SIGKILL) in the middle of ring_attention_backward (and of
// the forward): run by kill_test.sh under mpirun, which must end the job,
// naming the lost rank, instead of leaving the other ranks waiting.
// Usage: softdot_mpi_ring_kill_test VICTIM DELAY_MS
// Every rank runs the ring forward and backward in a loop for up to 60 s;
// rank VICTIM raises SIGKILL on itself after DELAY_MS milliseconds, wherever
// it is (a timer thread). Exit status 0 only if no rank was killed.
#include <mpi.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "softdot/attention.h"
#include "softdot/mpi.h"

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rank = 0, P = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  const int victim = argc > 1 ? std::atoi(argv[1]) : 1;
  const int delay_ms = argc > 2 ? std::atoi(argv[2]) : 200;
  if (rank == victim) {
    std::thread([delay_ms] {
      std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
      std::raise(SIGKILL);
    }).detach();
  }
  const std::size_t n = 640, H = 2, d = 32;
  softdot::mpi::RingOptions ro;
  ro.seq_len = n;
  ro.attention.causal = true;
  ro.deterministic = (delay_ms % 2) == 1;
  const softdot::mpi::RingLayout L =
      softdot::mpi::ring_layout(n, P, ro.layout, ro.deterministic);
  const std::size_t rows = L.rows();
  std::vector<float> x(H * rows * d), out(H * rows * d), lse(H * rows);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(i % 7) * 0.1f;
  std::vector<float> dq(x.size()), dk(x.size()), dv(x.size());
  const softdot::TensorView<const float> t(x.data(), 1, H, rows, d);
  softdot::AttentionGradients g;
  g.dq = softdot::TensorView<float>(dq.data(), 1, H, rows, d);
  g.dk = softdot::TensorView<float>(dk.data(), 1, H, rows, d);
  g.dv = softdot::TensorView<float>(dv.data(), 1, H, rows, d);
  const auto start = std::chrono::steady_clock::now();
  int calls = 0;
  while (std::chrono::steady_clock::now() - start < std::chrono::seconds(60)) {
    softdot::mpi::ring_attention(
        MPI_COMM_WORLD, t, t, t,
        softdot::TensorView<float>(out.data(), 1, H, rows, d), ro, lse.data());
    softdot::mpi::ring_attention_backward(
        MPI_COMM_WORLD, t, t, t,
        softdot::TensorView<const float>(out.data(), 1, H, rows, d), lse.data(),
        t, g, ro);
    ++calls;
  }
  if (rank == 0) std::printf("no rank was killed after %d calls\n", calls);
  MPI_Finalize();
  return 0;
}
