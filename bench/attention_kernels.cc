// The rooflines of the attention benchmarks (attention_util.h), written with
// Highway and dispatched at run time like the library and
// baseline_kernels.cc (no -march flags), so they run at the SIMD width of the
// kernels they are compared with:
//   ReadSum:       a read-only pass (32-bit integer lanes added), the speed
//                  limit of a decode step that reads K and V once;
//   FmaPeakFlops:  bench_util.h's FmaPeak (BM_fma_peak's loop) on t threads;
//   ReadBandwidth: ReadSum walking through an arena like a memory-bound
//                  benchmark does.
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>

#include "attention_util.h"
#include "bench_util.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention_kernels.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace softdot_bench {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// n 32-bit words from p (any alignment); four independent accumulators.
std::uint32_t ReadSumImpl(const std::uint32_t* HWY_RESTRICT p, std::size_t n) {
  const hn::ScalableTag<std::uint32_t> d;
  const std::size_t N = hn::Lanes(d);
  auto s0 = hn::Zero(d), s1 = hn::Zero(d), s2 = hn::Zero(d), s3 = hn::Zero(d);
  std::size_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    s0 = hn::Add(s0, hn::LoadU(d, p + i));
    s1 = hn::Add(s1, hn::LoadU(d, p + i + N));
    s2 = hn::Add(s2, hn::LoadU(d, p + i + 2 * N));
    s3 = hn::Add(s3, hn::LoadU(d, p + i + 3 * N));
  }
  for (; i + N <= n; i += N) s0 = hn::Add(s0, hn::LoadU(d, p + i));
  std::uint32_t s =
      hn::GetLane(hn::SumOfLanes(d, hn::Add(hn::Add(s0, s1), hn::Add(s2, s3))));
  for (; i < n; ++i) {
    std::uint32_t w;
    std::memcpy(&w, p + i, sizeof(w));
    s += w;
  }
  return s;
}

}  // namespace HWY_NAMESPACE
}  // namespace softdot_bench
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace softdot_bench {

HWY_EXPORT(ReadSumImpl);

std::uint32_t ReadSum(const void* p, std::size_t bytes) {
  return HWY_DYNAMIC_DISPATCH(ReadSumImpl)(static_cast<const std::uint32_t*>(p),
                                           bytes / 4);
}

std::uint32_t ReadSumThreads(const void* p, std::size_t bytes, int threads) {
  if (threads <= 1) return ReadSum(p, bytes);
  const auto* base = static_cast<const char*>(p);
  std::uint32_t sum = 0;
#pragma omp parallel num_threads(threads) reduction(+ : sum)
  {
    const auto t = static_cast<std::size_t>(omp_get_thread_num());
    const auto nt = static_cast<std::size_t>(omp_get_num_threads());
    const std::size_t lines = (bytes + 63) / 64;
    const std::size_t begin = std::min(bytes, lines * t / nt * 64);
    const std::size_t end = std::min(bytes, lines * (t + 1) / nt * 64);
    if (end > begin) sum += ReadSum(base + begin, end - begin);
  }
  return sum;
}

namespace {
using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}
}  // namespace

double FmaPeakFlops(int threads) {
  static std::mutex mu;
  static std::map<int, double> measured;
  const std::lock_guard<std::mutex> lock(mu);
  if (const auto it = measured.find(threads); it != measured.end())
    return it->second;
  // BM_fma_peak's rounds per call; about 0.2 ms per call at 512 bits.
  constexpr std::size_t kRounds = 100000;
  const double flops_per_call =
      static_cast<double>(kRounds) * 12 * 2 * static_cast<double>(FloatLanes());
  // Calls per thread and run: about 20 ms at 200 GFLOP/s per core.
  const int calls = static_cast<int>(std::max(1.0, 4e9 / flops_per_call));
  volatile float vm = 0.999999f, vc = 1e-7f;
  const float m = vm, c = vc;
  double best = 0.0;
  for (int run = 0; run < 5; ++run) {
    float sink = 0.0f;
    const auto t0 = Clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    for (int i = 0; i < calls; ++i) sink += FmaPeak(kRounds, m, c);
    const double s = Seconds(t0);
    benchmark::DoNotOptimize(sink);
    best = std::max(best, flops_per_call * calls * threads / s);
  }
  measured.emplace(threads, best);
  return best;
}

double ReadBandwidth(const void* base, std::size_t stride_bytes,
                     std::size_t copies, std::size_t bytes, int threads) {
  static std::mutex mu;
  static std::map<
      std::tuple<const void*, std::size_t, std::size_t, std::size_t, int>,
      double>
      measured;
  const std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(base, stride_bytes, copies, bytes, threads);
  if (const auto it = measured.find(key); it != measured.end())
    return it->second;
  const auto* p = static_cast<const char*>(base);
  std::uint32_t sink = 0;
  for (std::size_t c = 0; c < copies; ++c)
    sink += ReadSumThreads(p + c * stride_bytes, bytes, threads);
  double best = 0.0;
  for (int run = 0; run < 3; ++run) {
    std::size_t calls = 0, c = 0;
    const auto t0 = Clock::now();
    double s = 0.0;
    do {
      sink += ReadSumThreads(p + c * stride_bytes, bytes, threads);
      if (++c == copies) c = 0;
      ++calls;
    } while (calls < copies || (s = Seconds(t0)) < 0.1);
    best = std::max(
        best, static_cast<double>(calls) * static_cast<double>(bytes) / s);
  }
  benchmark::DoNotOptimize(sink);
  measured.emplace(key, best);
  return best;
}

}  // namespace softdot_bench
#endif  // HWY_ONCE
