// softdot_attention_memory: how much memory one softdot::attention call takes
// beyond its inputs and output, at a size where the naive score matrix
// would not fit in a small machine: n_q = n_kv = 32768, d = d_v = 128, one
// head, float32 (Q, K, V, O: 16 MiB each; scores: 4 GiB).
//
// Usage: softdot_attention_memory [n [d]]   (defaults 32768 128)
//
// Allocates and fills Q, K, V (uniform [-2, 2), fixed seeds) and O, then for
// 1 and 2 OpenMP threads runs attention once without a mask and once
// causal. Around each call it prints the resident memory from
// /proc/self/status (VmRSS before; VmHWM, the peak, after: VmHWM is reset
// before each call by writing 5 to /proc/self/clear_refs, so it is that
// call's peak when the kernel allows the reset) and getrusage's ru_maxrss
// (the process's peak, never reset), and the differences in MiB: VmHWM after
// minus VmRSS before is the memory the call added at its peak (OpenMP
// threads' stacks and the per-thread scratch). Each output is spot-checked
// against attention in double on 4 rows.
#include <omp.h>
#include <softdot/softdot.h>
#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "attention_util.h"

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

// A "VmXXX:   1234 kB" line of /proc/self/status, in bytes (-1 if absent).
double StatusBytes(const char* key) {
  std::ifstream f("/proc/self/status");
  const std::string prefix = std::string(key) + ":";
  for (std::string line; std::getline(f, line);) {
    if (line.rfind(prefix, 0) == 0)
      return std::atof(line.c_str() + prefix.size()) * 1024.0;
  }
  return -1.0;
}

double MaxRssBytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) * 1024.0;  // kB on Linux
}

// Resets VmHWM to the current VmRSS (Linux >= 4.0); false if not allowed.
bool ResetPeak() {
  std::ofstream f("/proc/self/clear_refs");
  if (!f) return false;
  f << "5";
  f.flush();
  return static_cast<bool>(f);
}

}  // namespace

int main(int argc, char** argv) {
  const std::size_t n = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 32768;
  const std::size_t d = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 128;
  if (n == 0 || d == 0) {
    std::fprintf(stderr,
                 "usage: softdot_attention_memory [n [d]]  (n, d >= 1)\n");
    return 2;
  }
  std::printf(
      "softdot_attention_memory: softdot %s, SIMD target %s, OpenMP max "
      "threads %d\n",
      softdot::version(), softdot::simd_target().c_str(),
      omp_get_max_threads());
  std::printf("shape: n_q = n_kv = %zu, d = d_v = %zu, 1 head, float32\n", n,
              d);

  const double rss_start = StatusBytes("VmRSS");
  std::vector<float> q(n * d), k(n * d), v(n * d), o(n * d, 0.0f);
  softdot_bench::FillUniform(q.data(), q.size(), 1);
  softdot_bench::FillUniform(k.data(), k.size(), 2);
  softdot_bench::FillUniform(v.data(), v.size(), 3);
  const double io_bytes = 4.0 * static_cast<double>(n * d) * sizeof(float);
  const double naive_bytes =
      static_cast<double>(n) * static_cast<double>(n) * sizeof(float);
  std::printf("inputs + output (Q, K, V, O): %.1f MiB\n", io_bytes / kMiB);
  std::printf("a naive score matrix (n_q * n_kv * 4 bytes): %.1f MiB\n",
              naive_bytes / kMiB);
  const double rss0 = StatusBytes("VmRSS"), hwm0 = StatusBytes("VmHWM"),
               maxrss0 = MaxRssBytes();
  std::printf(
      "before any call: VmRSS %.1f MiB (%.1f MiB before the buffers), VmHWM "
      "%.1f MiB, "
      "ru_maxrss %.1f MiB\n\n",
      rss0 / kMiB, rss_start / kMiB, hwm0 / kMiB, maxrss0 / kMiB);

  const softdot::TensorView<const float> qv(q.data(), 1, 1, n, d),
      kv(k.data(), 1, 1, n, d), vv(v.data(), 1, 1, n, d);
  const softdot::TensorView<float> ov(o.data(), 1, 1, n, d);
  const float scale =
      static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));

  bool reset_ok = true;
  std::printf(
      "| threads | mask | seconds | GFLOP/s (4 n^2 d) | VmRSS before MiB | "
      "VmHWM after MiB "
      "| VmHWM after - VmRSS before MiB | ru_maxrss after MiB | ru_maxrss - "
      "before "
      "first call MiB | rel_err (4 rows) |\n");
  std::printf("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    for (bool causal : {false, true}) {
      softdot::AttentionOptions options;
      options.causal = causal;
      const double rss_before = StatusBytes("VmRSS");
      reset_ok = ResetPeak() && reset_ok;
      const auto t0 = std::chrono::steady_clock::now();
      try {
        softdot::attention(qv, kv, vv, ov, options);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "softdot::attention: %s\n", e.what());
        return 1;
      }
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
              .count();
      const double hwm = StatusBytes("VmHWM"), maxrss = MaxRssBytes();
      double worst = 0.0;
      for (std::size_t i : {std::size_t{0}, n / 3, n / 2, n - 1}) {
        worst = std::max(
            worst, softdot_bench::AttentionRowError(
                       q.data() + i * d, k.data(), v.data(), causal ? i + 1 : n,
                       d, d, scale, o.data() + i * d));
      }
      const double nn = static_cast<double>(n);
      std::printf(
          "| %d | %s | %.2f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.2g "
          "|\n",
          threads, causal ? "causal" : "none", seconds,
          4.0 * nn * nn * static_cast<double>(d) / seconds * 1e-9,
          rss_before / kMiB, hwm / kMiB, (hwm - rss_before) / kMiB,
          maxrss / kMiB, (maxrss - maxrss0) / kMiB, worst);
      std::fflush(stdout);
    }
  }
  if (!reset_ok) {
    std::printf(
        "\nnote: /proc/self/clear_refs could not reset VmHWM; VmHWM is the "
        "process's "
        "peak since the start, not each call's\n");
  }
  std::printf(
      "\nextra memory of a call = VmHWM after - VmRSS before; inputs + output "
      "are "
      "%.1f MiB, a naive score matrix %.1f MiB\n",
      io_bytes / kMiB, naive_bytes / kMiB);
  return 0;
}
