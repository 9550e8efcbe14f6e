// A rank killed (SIGKILL) in the middle of ring_attention_backward (and of
// the forward), or of the vocabulary-split cross-entropy: run by
// kill_test.sh under mpirun, which must end the job, naming the lost rank,
// instead of leaving the other ranks waiting.
// Usage: softdot_mpi_ring_kill_test VICTIM DELAY_MS [ring|vocab]
// Every rank runs, in a loop for up to 60 s, either (ring, the default) the
// ring forward and backward, or (vocab) softdot::mpi::cross_entropy with its
// gradient (default and deterministic) and softdot::mpi::linear_cross_entropy
// with both gradients; rank VICTIM raises SIGKILL on itself after DELAY_MS
// milliseconds, wherever it is (a timer thread). Exit status 0 only if no
// rank was killed.
#include <mpi.h>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "softdot/attention.h"
#include "softdot/mpi.h"

namespace {

// The vocabulary split: V = 3000 classes (cross_entropy) and 2000 rows of
// the weight (linear_cross_entropy), rank r holding an uneven slice.
void vocab_loop(int rank, int P, int& calls) {
  const std::size_t N = 64, V = 3000, D = 64, Vw = 2000;
  auto slice = [&](std::size_t total, int r) {
    // Uneven: rank r holds about (r + 1) / sum(1..P) of the classes.
    const std::size_t den = std::size_t(P) * (P + 1) / 2;
    std::size_t begin = 0;
    for (int i = 0; i < r; ++i) begin += total * (i + 1) / den;
    const std::size_t cols = r == P - 1 ? total - begin : total * (r + 1) / den;
    return std::pair<std::size_t, std::size_t>(begin, cols);
  };
  const auto [vb, vc] = slice(V, rank);
  const auto [wb, wc] = slice(Vw, rank);
  std::vector<float> logits(N * vc), grad(N * vc), loss(N);
  for (std::size_t i = 0; i < logits.size(); ++i) {
    logits[i] = float((i * 7 + vb) % 13) * 0.3f - 2.0f;
  }
  std::vector<std::int64_t> targets(N), wtargets(N);
  for (std::size_t i = 0; i < N; ++i) {
    targets[i] = std::int64_t((i * 977) % V);
    wtargets[i] = std::int64_t((i * 131) % Vw);
  }
  std::vector<float> hidden(N * D), weight(wc * D), gh(N * D), gw(wc * D);
  for (std::size_t i = 0; i < hidden.size(); ++i) {
    hidden[i] = float(i % 11) * 0.1f - 0.5f;
  }
  for (std::size_t i = 0; i < weight.size(); ++i) {
    weight[i] = float((i + wb * D) % 5) * 0.05f - 0.1f;
  }
  const auto start = std::chrono::steady_clock::now();
  softdot::mpi::VocabOptions det;
  det.deterministic = true;
  while (std::chrono::steady_clock::now() - start < std::chrono::seconds(60)) {
    for (const softdot::mpi::VocabOptions& vo :
         {softdot::mpi::VocabOptions{}, det}) {
      softdot::mpi::cross_entropy(
          MPI_COMM_WORLD,
          softdot::MatrixView<const float>(logits.data(), N, vc), vb, targets,
          loss, softdot::MatrixView<float>(grad.data(), N, vc), {}, vo);
    }
    softdot::mpi::linear_cross_entropy(
        MPI_COMM_WORLD, softdot::MatrixView<const float>(hidden.data(), N, D),
        softdot::MatrixView<const float>(weight.data(), wc, D), wb, wtargets,
        loss, softdot::MatrixView<float>(gh.data(), N, D),
        softdot::MatrixView<float>(gw.data(), wc, D));
    ++calls;
  }
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rank = 0, P = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  const int victim = argc > 1 ? std::atoi(argv[1]) : 1;
  const int delay_ms = argc > 2 ? std::atoi(argv[2]) : 200;
  const bool vocab = argc > 3 && std::strcmp(argv[3], "vocab") == 0;
  if (rank == victim) {
    std::thread([delay_ms] {
      std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
      std::raise(SIGKILL);
    }).detach();
  }
  if (vocab) {
    int calls = 0;
    vocab_loop(rank, P, calls);
    if (rank == 0) std::printf("no rank was killed after %d calls\n", calls);
    MPI_Finalize();
    return 0;
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
