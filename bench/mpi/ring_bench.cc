// Ring attention across processes: time of ring_attention on P ranks
// against one process on the whole sequence, the compute and the
// communication of each rank measured apart, and the per-rank compute
// balance of the two layouts. Not a Google Benchmark (it runs under mpirun).
//
//   mpirun -np P [--bind-to core] softdot_mpi_ring_bench [N [H [D [REPS]]]]
//
// with OMP_NUM_THREADS=1 (one thread per rank). Prints, per layout and
// causal or not (rank 0):
//   t1      attention() on the whole sequence, one process (rank 0 alone)
//   tP      ring_attention on P ranks (best of REPS, the slowest rank)
//   eff     t1 / (P tP)
//   comp    the slowest rank's compute alone (its attention_partial calls,
//           no messages), and max/mean of the ranks' compute
//   comm    the P - 1 shard transfers alone (Isend/Irecv/Waitall)
//   hidden  (comp + comm - tP) / comm, clipped to [0, 1]: the fraction of
//           the communication the compute hid
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "softdot/attention.h"
#include "softdot/mpi.h"
#include "softdot/simd.h"

namespace {

using softdot::AttentionOptions;
using softdot::AttentionPartial;
using softdot::TensorView;
using softdot::mpi::Layout;
using softdot::mpi::RingLayout;

double now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double max_over_ranks(double t) {
  double m = 0;
  MPI_Allreduce(&t, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return m;
}
double sum_over_ranks(double t) {
  double m = 0;
  MPI_Allreduce(&t, &m, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  return m;
}

// This rank's compute of the ring, without messages: its query chunks
// against every rank's key chunks (the local K/V stand in for the others':
// the same sizes, the positions of the real owner), skipping the pairs the
// causal mask hides, as ring_attention does.
double compute_alone(const RingLayout& L, int rank,
                     const TensorView<const float>& q,
                     const TensorView<const float>& k,
                     const TensorView<const float>& v, bool causal) {
  const std::size_t c = L.chunk, n = L.seq_len;
  AttentionPartial part;
  const double t0 = now();
  for (int owner = 0; owner < L.ranks; ++owner) {
    for (std::size_t kc = 0; kc < L.chunks_per_rank(); ++kc) {
      const std::size_t kpos = L.chunk_start(owner, kc);
      const std::size_t kr = kpos < n ? std::min(c, n - kpos) : 0;
      for (std::size_t qc = 0; qc < L.chunks_per_rank(); ++qc) {
        const std::size_t qpos = L.chunk_start(rank, qc);
        const std::size_t qr = qpos < n ? std::min(c, n - qpos) : 0;
        if (qr == 0 || kr == 0 || (causal && kpos > qpos + qr - 1)) continue;
        AttentionOptions o;
        o.causal = causal;
        o.q_position = qpos;
        o.kv_position = kpos;
        TensorView<const float> qv = q, kv = k, vv = v;
        qv.data += qc * c * q.row_stride;
        qv.rows = qr;
        kv.data += kc * c * k.row_stride;
        kv.rows = kr;
        vv.data += kc * c * v.row_stride;
        vv.rows = kr;
        softdot::attention_partial(qv, kv, vv, part, o);
      }
    }
  }
  return now() - t0;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int P = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const std::size_t N = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 8192;
  const std::size_t H = argc > 2 ? std::strtoul(argv[2], nullptr, 10) : 4;
  const std::size_t D = argc > 3 ? std::strtoul(argv[3], nullptr, 10) : 64;
  const int reps = argc > 4 ? std::atoi(argv[4]) : 3;
  // SOFTDOT_BENCH_TARGET=AVX2 (say) forces a SIMD target, as bench/ does.
  if (const char* t = std::getenv("SOFTDOT_BENCH_TARGET")) {
    softdot::force_simd_target(t);
  }
  if (rank == 0) {
    std::printf(
        "ring_attention: N %zu, H %zu, d = d_v = %zu, P %d, target %s\n", N, H,
        D, P, softdot::simd_target().c_str());
    std::printf("%-10s %-6s %9s %9s %6s %9s %8s %9s %7s\n", "layout", "causal",
                "t1 ms", "tP ms", "eff", "comp ms", "max/mean", "comm ms",
                "hidden");
  }
  std::mt19937 g(7);
  std::uniform_real_distribution<float> u(-1, 1);
  for (Layout lay : {Layout::contiguous, Layout::zigzag}) {
    for (bool causal : {false, true}) {
      const RingLayout L = softdot::mpi::ring_layout(N, P, lay);
      const std::size_t rows = L.rows();
      std::vector<float> q(H * rows * D), k(H * rows * D), v(H * rows * D),
          out(H * rows * D);
      for (auto* x : {&q, &k, &v})
        for (float& e : *x) e = u(g);
      const TensorView<const float> qv(q.data(), 1, H, rows, D),
          kv(k.data(), 1, H, rows, D), vv(v.data(), 1, H, rows, D);
      // One process on the whole sequence.
      double t1 = 0;
      if (rank == 0) {
        std::vector<float> fq(H * N * D), fk(H * N * D), fv(H * N * D),
            fo(H * N * D);
        for (auto* x : {&fq, &fk, &fv})
          for (float& e : *x) e = u(g);
        AttentionOptions o;
        o.causal = causal;
        t1 = 1e30;
        for (int r = 0; r < reps; ++r) {
          const double t0 = now();
          softdot::attention(TensorView<const float>(fq.data(), 1, H, N, D),
                             TensorView<const float>(fk.data(), 1, H, N, D),
                             TensorView<const float>(fv.data(), 1, H, N, D),
                             TensorView<float>(fo.data(), 1, H, N, D), o);
          t1 = std::min(t1, now() - t0);
        }
      }
      MPI_Barrier(MPI_COMM_WORLD);
      softdot::mpi::RingOptions ro;
      ro.attention.causal = causal;
      ro.seq_len = N;
      ro.layout = lay;
      double tp = 1e30, comp = 1e30, comm = 1e30;
      for (int r = 0; r < reps; ++r) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = now();
        softdot::mpi::ring_attention(
            MPI_COMM_WORLD, qv, kv, vv,
            TensorView<float>(out.data(), 1, H, rows, D), ro);
        tp = std::min(tp, max_over_ranks(now() - t0));
        MPI_Barrier(MPI_COMM_WORLD);
        comp = std::min(comp, compute_alone(L, rank, qv, kv, vv, causal));
        // The transfers alone: P - 1 steps of the K/V shard.
        std::vector<float> a(2 * H * rows * D), b(a.size());
        MPI_Barrier(MPI_COMM_WORLD);
        t0 = now();
        for (int s = 0; s + 1 < P; ++s) {
          MPI_Request req[2];
          MPI_Irecv(b.data(), static_cast<int>(b.size()), MPI_FLOAT,
                    (rank + P - 1) % P, s, MPI_COMM_WORLD, &req[0]);
          MPI_Isend(a.data(), static_cast<int>(a.size()), MPI_FLOAT,
                    (rank + 1) % P, s, MPI_COMM_WORLD, &req[1]);
          MPI_Waitall(2, req, MPI_STATUSES_IGNORE);
          std::swap(a, b);
        }
        comm = std::min(comm, max_over_ranks(now() - t0));
      }
      const double comp_max = max_over_ranks(comp);
      const double comp_mean = sum_over_ranks(comp) / P;
      double hidden = comm > 0 ? (comp_max + comm - tp) / comm : 1.0;
      hidden = std::clamp(hidden, 0.0, 1.0);
      if (rank == 0) {
        std::printf("%-10s %-6s %9.2f %9.2f %6.2f %9.2f %8.2f %9.2f %7.2f\n",
                    lay == Layout::zigzag ? "zigzag" : "contiguous",
                    causal ? "yes" : "no", t1 * 1e3, tp * 1e3, t1 / (P * tp),
                    comp_max * 1e3, comp_max / comp_mean, comm * 1e3,
                    P > 1 ? hidden : 1.0);
      }
    }
  }
  MPI_Finalize();
  return 0;
}
