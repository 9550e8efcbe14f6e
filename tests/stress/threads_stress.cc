// Concurrent callers (issue 29, "Concurrency and faults"): T std::threads
// call softmax_rows, attention (float32, float16, bfloat16 and int8 K/V;
// prefill and decode forms), cross_entropy (float32, bfloat16) and
// linear_cross_entropy on SHARED inputs with separate outputs, each call's
// output compared bit for bit with the result the main thread computed
// alone before any worker started. OpenMP runs underneath (each caller's
// parallel regions get their own team; OMP_NUM_THREADS as the caller sets).
//
// Resident memory (VmRSS of /proc/self/status) is sampled once every worker
// has made WARMUP_PASSES passes over all the calls (each OpenMP team and
// its per-thread scratch buffers exist by then) and at the end; it is
// judged flat when the end exceeds the warm sample by less than
// --rss-limit-mib (default 4 MiB). Under AddressSanitizer (whose
// quarantine holds freed memory) the growth is reported, not judged.
//
// Usage: softdot_threads_stress [--seconds S] [--threads T]
//                               [--rss-limit-mib M]
// Prints one summary line; exit status 0 only with no mismatch, no
// exception and flat memory.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "softdot/attention.h"
#include "softdot/cross_entropy.h"
#include "softdot/float16.h"
#include "softdot/linear_cross_entropy.h"
#include "softdot/matrix.h"
#include "softdot/softmax.h"

#if defined(__SANITIZE_ADDRESS__)
#define SOFTDOT_STRESS_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SOFTDOT_STRESS_ASAN 1
#endif
#endif
#ifndef SOFTDOT_STRESS_ASAN
#define SOFTDOT_STRESS_ASAN 0
#endif

namespace {

using softdot::BFloat16;
using softdot::Float16;
using softdot::MatrixView;
using softdot::TensorView;

// VmRSS in KiB, or -1.
long rss_kib() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return -1;
  char line[256];
  long kib = -1;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::strncmp(line, "VmRSS:", 6) == 0) {
      kib = std::strtol(line + 6, nullptr, 10);
      break;
    }
  }
  std::fclose(f);
  return kib;
}

// One kind of call: writes its whole result (every output, as bytes) into
// `out`, which has `bytes` bytes.
struct Job {
  std::string name;
  std::size_t bytes = 0;
  std::function<void(unsigned char* out)> run;
};

template <class T>
T* as(unsigned char* p) {
  return reinterpret_cast<T*>(p);
}

// The shared inputs: built once, read by every thread.
struct Inputs {
  std::vector<float> x;                 // softmax / cross-entropy logits
  std::vector<BFloat16> x16;            // the same, bfloat16
  std::vector<std::int64_t> targets;    // CE targets
  std::vector<float> q, k, v;           // attention, prefill
  std::vector<Float16> k_h, v_h;        // float16 K/V
  std::vector<BFloat16> k_b, v_b;       // bfloat16 K/V
  std::vector<std::int8_t> k_i8, v_i8;  // int8 K/V
  std::vector<float> k_sc, v_sc;        // their scales
  std::vector<float> qd, kd, vd;        // attention, decode (n_q = 1)
  std::vector<float> hidden, weight;    // linear cross-entropy
  std::vector<std::int64_t> lce_targets;
};

constexpr std::size_t kRows = 64, kCols = 4096;  // 2^18: CE uses OpenMP
constexpr std::size_t kB = 1, kH = 4, kHkv = 2, kNq = 96, kNkv = 256, kD = 64;
constexpr std::size_t kDecodeKv = 4096;
constexpr std::size_t kN = 48, kDim = 64, kV = 1000;

Inputs make_inputs() {
  Inputs in;
  std::mt19937 rng(29);
  std::normal_distribution<float> g(0.0f, 1.0f);
  auto fill = [&](std::vector<float>& a, std::size_t n, float s) {
    a.resize(n);
    for (float& e : a) e = s * g(rng);
  };
  fill(in.x, kRows * kCols, 3.0f);
  in.x16.resize(in.x.size());
  for (std::size_t i = 0; i < in.x.size(); ++i) {
    in.x16[i] = softdot::to_bfloat16(in.x[i]);
  }
  in.targets.resize(kRows);
  for (std::size_t i = 0; i < kRows; ++i) {
    in.targets[i] = static_cast<std::int64_t>((i * 977) % kCols);
  }
  in.targets[3] = -100;  // an ignored row
  const std::size_t kv_elems = kB * kHkv * kNkv * kD;
  fill(in.q, kB * kH * kNq * kD, 1.0f);
  fill(in.k, kv_elems, 1.0f);
  fill(in.v, kv_elems, 1.0f);
  in.k_h.resize(kv_elems);
  in.v_h.resize(kv_elems);
  in.k_b.resize(kv_elems);
  in.v_b.resize(kv_elems);
  for (std::size_t i = 0; i < kv_elems; ++i) {
    in.k_h[i] = softdot::to_float16(in.k[i]);
    in.v_h[i] = softdot::to_float16(in.v[i]);
    in.k_b[i] = softdot::to_bfloat16(in.k[i]);
    in.v_b[i] = softdot::to_bfloat16(in.v[i]);
  }
  in.k_i8.resize(kv_elems);
  in.v_i8.resize(kv_elems);
  in.k_sc.resize(kB * kHkv * kNkv);
  in.v_sc.resize(kB * kHkv * kNkv);
  softdot::quantize_kv(
      TensorView<const float>(in.k.data(), kB, kHkv, kNkv, kD),
      TensorView<std::int8_t>(in.k_i8.data(), kB, kHkv, kNkv, kD),
      TensorView<float>(in.k_sc.data(), kB, kHkv, kNkv, 1));
  softdot::quantize_kv(
      TensorView<const float>(in.v.data(), kB, kHkv, kNkv, kD),
      TensorView<std::int8_t>(in.v_i8.data(), kB, kHkv, kNkv, kD),
      TensorView<float>(in.v_sc.data(), kB, kHkv, kNkv, 1));
  fill(in.qd, kB * kH * 1 * kD, 1.0f);
  fill(in.kd, kB * kHkv * kDecodeKv * kD, 1.0f);
  fill(in.vd, kB * kHkv * kDecodeKv * kD, 1.0f);
  fill(in.hidden, kN * kDim, 1.0f);
  fill(in.weight, kV * kDim, 0.2f);
  in.lce_targets.resize(kN);
  for (std::size_t i = 0; i < kN; ++i) {
    in.lce_targets[i] = static_cast<std::int64_t>((i * 131) % kV);
  }
  return in;
}

std::vector<Job> make_jobs(const Inputs& in) {
  std::vector<Job> jobs;
  const std::size_t n = kRows * kCols;
  jobs.push_back({"softmax_rows", n * sizeof(float), [&in](unsigned char* o) {
                    softdot::softmax_rows(
                        MatrixView<const float>(in.x.data(), kRows, kCols),
                        MatrixView<float>(as<float>(o), kRows, kCols));
                  }});
  jobs.push_back(
      {"log_softmax_rows", n * sizeof(float), [&in](unsigned char* o) {
         softdot::log_softmax_rows(
             MatrixView<const float>(in.x.data(), kRows, kCols),
             MatrixView<float>(as<float>(o), kRows, kCols));
       }});
  jobs.push_back({"cross_entropy_f32",
                  (kRows + n) * sizeof(float) + sizeof(double),
                  [&in](unsigned char* o) {
                    float* loss = as<float>(o);
                    float* grad = loss + kRows;
                    const double mean = softdot::cross_entropy(
                        MatrixView<const float>(in.x.data(), kRows, kCols),
                        in.targets, std::span<float>(loss, kRows),
                        MatrixView<float>(grad, kRows, kCols));
                    std::memcpy(grad + n, &mean, sizeof mean);
                  }});
  jobs.push_back(
      {"cross_entropy_bf16", (kRows + n) * sizeof(BFloat16) + sizeof(double),
       [&in](unsigned char* o) {
         BFloat16* loss = as<BFloat16>(o);
         BFloat16* grad = loss + kRows;
         softdot::CrossEntropyOptions opt;
         opt.label_smoothing = 0.1;
         const double mean = softdot::cross_entropy(
             MatrixView<const BFloat16>(in.x16.data(), kRows, kCols),
             in.targets, std::span<BFloat16>(loss, kRows),
             MatrixView<BFloat16>(grad, kRows, kCols), opt);
         std::memcpy(o + (kRows + n) * sizeof(BFloat16), &mean, sizeof mean);
       }});
  const std::size_t o_elems = kB * kH * kNq * kD;
  const std::size_t o_bytes = (o_elems + kB * kH * kNq) * sizeof(float);
  auto attention_job = [&](const char* name, auto&& call) {
    jobs.push_back(
        {name, o_bytes, [&in, call](unsigned char* o) {
           float* out = as<float>(o);
           float* lse = out + kB * kH * kNq * kD;
           softdot::AttentionOptions opt;
           opt.causal = true;
           call(in, TensorView<const float>(in.q.data(), kB, kH, kNq, kD),
                TensorView<float>(out, kB, kH, kNq, kD), opt, lse);
         }});
  };
  attention_job("attention_f32", [](const Inputs& i, auto q, auto out,
                                    const auto& opt, float* lse) {
    softdot::attention(
        q, TensorView<const float>(i.k.data(), kB, kHkv, kNkv, kD),
        TensorView<const float>(i.v.data(), kB, kHkv, kNkv, kD), out, opt, lse);
  });
  attention_job("attention_f16", [](const Inputs& i, auto q, auto out,
                                    const auto& opt, float* lse) {
    softdot::attention(
        q, TensorView<const Float16>(i.k_h.data(), kB, kHkv, kNkv, kD),
        TensorView<const Float16>(i.v_h.data(), kB, kHkv, kNkv, kD), out, opt,
        lse);
  });
  attention_job("attention_bf16", [](const Inputs& i, auto q, auto out,
                                     const auto& opt, float* lse) {
    softdot::attention(
        q, TensorView<const BFloat16>(i.k_b.data(), kB, kHkv, kNkv, kD),
        TensorView<const BFloat16>(i.v_b.data(), kB, kHkv, kNkv, kD), out, opt,
        lse);
  });
  attention_job("attention_int8", [](const Inputs& i, auto q, auto out,
                                     const auto& opt, float* lse) {
    const softdot::Int8KV k{
        TensorView<const std::int8_t>(i.k_i8.data(), kB, kHkv, kNkv, kD),
        TensorView<const float>(i.k_sc.data(), kB, kHkv, kNkv, 1)};
    const softdot::Int8KV v{
        TensorView<const std::int8_t>(i.v_i8.data(), kB, kHkv, kNkv, kD),
        TensorView<const float>(i.v_sc.data(), kB, kHkv, kNkv, 1)};
    softdot::attention(q, k, v, out, opt, lse);
  });
  jobs.push_back(
      {"attention_decode_f32", (kB * kH * kD + kB * kH) * sizeof(float),
       [&in](unsigned char* o) {
         float* out = as<float>(o);
         softdot::attention(
             TensorView<const float>(in.qd.data(), kB, kH, 1, kD),
             TensorView<const float>(in.kd.data(), kB, kHkv, kDecodeKv, kD),
             TensorView<const float>(in.vd.data(), kB, kHkv, kDecodeKv, kD),
             TensorView<float>(out, kB, kH, 1, kD), {}, out + kB * kH * kD);
       }});
  jobs.push_back({"linear_cross_entropy",
                  (kN + kN * kDim + kV * kDim) * sizeof(float) + sizeof(double),
                  [&in](unsigned char* o) {
                    float* loss = as<float>(o);
                    float* gh = loss + kN;
                    float* gw = gh + kN * kDim;
                    const double mean = softdot::linear_cross_entropy(
                        MatrixView<const float>(in.hidden.data(), kN, kDim),
                        MatrixView<const float>(in.weight.data(), kV, kDim),
                        in.lce_targets, std::span<float>(loss, kN),
                        MatrixView<float>(gh, kN, kDim),
                        MatrixView<float>(gw, kV, kDim));
                    std::memcpy(gw + kV * kDim, &mean, sizeof mean);
                  }});
  return jobs;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 600;
  int threads = 8;
  double rss_limit_mib = 4;
  constexpr int kWarmupPasses = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--seconds") {
      seconds = std::atof(argv[i + 1]);
    } else if (a == "--threads") {
      threads = std::atoi(argv[i + 1]);
    } else if (a == "--rss-limit-mib") {
      rss_limit_mib = std::atof(argv[i + 1]);
    } else {
      std::fprintf(stderr, "threads_stress: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (threads < 1 || !(seconds > 0)) {
    std::fprintf(stderr, "threads_stress: --threads >= 1, --seconds > 0\n");
    return 2;
  }
  const Inputs in = make_inputs();
  const std::vector<Job> jobs = make_jobs(in);
  // The references: every call once, on the main thread, before any worker.
  std::vector<std::vector<unsigned char>> expected(jobs.size());
  for (std::size_t j = 0; j < jobs.size(); ++j) {
    expected[j].assign(jobs[j].bytes, 0xA5);
    jobs[j].run(expected[j].data());
  }
  std::atomic<long> calls{0}, mismatches{0}, errors{0};
  std::atomic<int> warm{0};
  std::atomic<bool> stop{false};
  std::vector<std::vector<long>> per_job(threads,
                                         std::vector<long>(jobs.size(), 0));
  auto worker = [&](int t) {
    // Separate outputs, filled with a different pattern each pass so that
    // a call that writes nothing cannot pass.
    std::vector<std::vector<unsigned char>> out(jobs.size());
    for (std::size_t j = 0; j < jobs.size(); ++j) out[j].resize(jobs[j].bytes);
    long pass = 0;
    while (!stop.load(std::memory_order_relaxed)) {
      for (std::size_t s = 0; s < jobs.size(); ++s) {
        const std::size_t j = (s + static_cast<std::size_t>(t)) % jobs.size();
        std::memset(out[j].data(), static_cast<int>(pass * 37 + t) & 0xFF,
                    out[j].size());
        try {
          jobs[j].run(out[j].data());
        } catch (const std::exception& e) {
          std::fprintf(stderr, "threads_stress: %s threw: %s\n",
                       jobs[j].name.c_str(), e.what());
          ++errors;
          continue;
        }
        ++calls;
        ++per_job[t][j];
        if (std::memcmp(out[j].data(), expected[j].data(), out[j].size()) !=
            0) {
          if (mismatches.fetch_add(1) < 10) {
            std::fprintf(stderr,
                         "threads_stress: MISMATCH: %s, thread %d, pass %ld\n",
                         jobs[j].name.c_str(), t, pass);
          }
        }
      }
      if (++pass == kWarmupPasses) ++warm;
    }
  };
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(worker, t);
  while (warm.load() < threads) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const double warm_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  const long rss_warm = rss_kib();
  const long calls_warm = calls.load();
  const auto end = start + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  stop = true;
  for (std::thread& th : pool) th.join();
  const long rss_end = rss_kib();
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  const double growth_mib = double(rss_end - rss_warm) / 1024.0;
  const bool judged = !SOFTDOT_STRESS_ASAN;
  const bool flat = !judged || growth_mib < rss_limit_mib;
  std::printf("threads_stress: per call:");
  for (std::size_t j = 0; j < jobs.size(); ++j) {
    long total = 0;
    for (int t = 0; t < threads; ++t) total += per_job[t][j];
    std::printf(" %s %ld", jobs[j].name.c_str(), total);
  }
  std::printf("\n");
  std::printf(
      "threads_stress: threads=%d seconds=%.1f calls=%ld (after warm-up "
      "%ld) mismatches=%ld errors=%ld rss_warm_kib=%ld (at %.1f s) "
      "rss_end_kib=%ld growth_mib=%.2f rule=<%.1f MiB%s -> %s\n",
      threads, elapsed, calls.load(), calls.load() - calls_warm,
      mismatches.load(), errors.load(), rss_warm, warm_s, rss_end, growth_mib,
      rss_limit_mib, judged ? "" : " (not judged under ASan)",
      (mismatches == 0 && errors == 0 && flat) ? "OK" : "FAILED");
  return (mismatches == 0 && errors == 0 && flat) ? 0 : 1;
}
