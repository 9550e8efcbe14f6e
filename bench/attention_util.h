// softdot attention benchmarks: what bench/attention_bench.cc (softdot_bench)
// and bench/peers/attention_cases.cc (softdot_peers) share: the two
// rooflines measured in the same run (the FMA peak of the cores used, and a
// read-only pass over the same arena as the K/V data), aligned buffers and
// their random fill, the arena of distinct K/V copies of the decode
// benchmarks, and a double-precision reference for single output rows.
// The dispatched loops and the measurements are in attention_kernels.cc.
#ifndef SOFTDOT_BENCH_ATTENTION_UTIL_H_
#define SOFTDOT_BENCH_ATTENTION_UTIL_H_

#include <benchmark/benchmark.h>
#include <omp.h>
#include <sched.h>
#include <softdot/attention.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <type_traits>
#include <vector>

namespace softdot_bench {

// ---- prefill counters -------------------------------------------------------
// GFLOP/s at 4 n^2 d (causal: also the useful rate at 2 n (n + 1) d, and the
// dense one named _dense_equiv), and the useful fraction of `peak` flop/s,
// from `iters` calls that took `seconds` of wall time.
inline void SetPrefillCounters(benchmark::State& state, double seconds,
                               double iters, std::size_t n, std::size_t d,
                               bool causal, double peak) {
  const double nn = static_cast<double>(n), dd = static_cast<double>(d);
  const double dense = 4.0 * nn * nn * dd;
  const double useful = causal ? 4.0 * dd * nn * (nn + 1) / 2 : dense;
  if (causal) {
    state.counters["GFLOP/s_dense_equiv"] = iters * dense / seconds * 1e-9;
    state.counters["GFLOP/s_useful"] = iters * useful / seconds * 1e-9;
  } else {
    state.counters["GFLOP/s"] = iters * dense / seconds * 1e-9;
  }
  state.counters["of_peak"] = iters * useful / seconds / peak;
  state.counters["peak_GFLOP/s"] = peak * 1e-9;
}

// ---- rooflines (attention_kernels.cc)
// ------------------------------------------ flop/s of `threads` cores:
// bench_util.h's FmaPeak (the loop of BM_fma_peak: 12 independent vector FMA
// chains in registers) on `threads` OpenMP threads at once, total flops / wall
// time, best of 5 runs of about 20 ms. Measured on the first call for each
// thread count and remembered (thread-safe).
double FmaPeakFlops(int threads);

// A read-only pass over [p, p + bytes): 32-bit lanes added with four vector
// accumulators (integer adds: the bits of float16 or bfloat16 pairs are no
// float, and a float add of them could hit subnormal slow paths). Highway
// dynamic dispatch, never -march=native. bytes is a multiple of 4.
std::uint32_t ReadSum(const void* p, std::size_t bytes);
// The same pass split into `threads` contiguous parts of whole cache lines,
// one per OpenMP thread (threads <= 1: the calling thread alone).
std::uint32_t ReadSumThreads(const void* p, std::size_t bytes, int threads);

// Bytes per second of ReadSumThreads(base + c * stride_bytes, bytes, threads)
// for c = 0, 1, ..., copies - 1, 0, 1, ...: the same walk through an arena as
// a benchmark that reads `bytes` of the next copy per call. One warm-up walk,
// then the best of 3 runs of at least 0.1 s and one walk each. Remembered per
// (base, stride, copies, bytes, threads).
double ReadBandwidth(const void* base, std::size_t stride_bytes,
                     std::size_t copies, std::size_t bytes, int threads);

// ---- buffers
// -------------------------------------------------------------------- An
// uninitialised, aligned heap buffer of `bytes` (rounded up to `align`).
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(std::size_t bytes, std::size_t align = 64)
      : bytes_(bytes),
        data_(std::aligned_alloc(
            align,
            (std::max<std::size_t>(bytes, 1) + align - 1) / align * align)) {
    if (data_ == nullptr) {
      std::fprintf(stderr, "softdot attention bench: cannot allocate %zu MiB\n",
                   bytes >> 20);
      std::exit(1);
    }
  }
  ~AlignedBuffer() { std::free(data_); }
  AlignedBuffer(AlignedBuffer&& o) noexcept : bytes_(o.bytes_), data_(o.data_) {
    o.data_ = nullptr;
    o.bytes_ = 0;
  }
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept {
    std::swap(bytes_, o.bytes_);
    std::swap(data_, o.data_);
    return *this;
  }
  template <class T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  std::size_t bytes() const { return bytes_; }

 private:
  std::size_t bytes_ = 0;
  void* data_ = nullptr;
};

// Element conversions for the three K/V formats.
inline float Widen(float x) { return x; }
inline float Widen(softdot::Float16 x) { return softdot::to_float(x); }
inline float Widen(softdot::BFloat16 x) { return softdot::to_float(x); }
template <class T>
T Narrow(float x);
template <>
inline float Narrow<float>(float x) {
  return x;
}
template <>
inline softdot::Float16 Narrow<softdot::Float16>(float x) {
  return softdot::to_float16(x);
}
template <>
inline softdot::BFloat16 Narrow<softdot::BFloat16>(float x) {
  return softdot::to_bfloat16(x);
}

// Fills p[0, n) with uniform values in [-2, 2) (rounded to T), from a
// splitmix64 stream per block of 2^16 elements so that the contents depend
// on the seed only, not on the number of OpenMP threads that fill it. Scores
// of such Q and K at d = 64 or 128 and scale 1/sqrt(d) have a standard
// deviation of 1.3: neither a flat nor a one-hot softmax.
template <class T>
void FillUniform(T* p, std::size_t n, std::uint64_t seed) {
  constexpr std::size_t kBlock = std::size_t{1} << 16;
  const std::int64_t blocks =
      static_cast<std::int64_t>((n + kBlock - 1) / kBlock);
#pragma omp parallel for schedule(static)
  for (std::int64_t b = 0; b < blocks; ++b) {
    std::uint64_t state =
        seed * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(b) + 1;
    const std::size_t begin = static_cast<std::size_t>(b) * kBlock;
    const std::size_t end = std::min(n, begin + kBlock);
    for (std::size_t i = begin; i < end; ++i) {
      std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      z ^= z >> 31;
      const float u = static_cast<float>(z >> 40) * 0x1p-24f;  // [0, 1)
      p[i] = Narrow<T>(4.0f * u - 2.0f);
    }
  }
}

// ---- the decode arena
// ------------------------------------------------------------- At least 512
// MiB of distinct copies of one call's K and V, so that a call that moves to
// the next copy reads K and V from DRAM (the `memory` case of bench/peers):
// copy c holds K at byte c * stride and V right after it. The arena is 2
// MiB-aligned, filled (every page touched) once per element type; as many
// copies as fit in 512 MiB (at least 2: K + V of up to 256 MiB).
class KvArena {
 public:
  static constexpr std::size_t kBytes = std::size_t{512} << 20;

  // K and V of `elements` each, of type T, seed fixed: the same data every
  // run. Refills the arena only when T changes.
  template <class T>
  void Prepare(std::size_t elements) {
    const int type = TypeId<T>();
    if (type_ != type) {
      if (buffer_.bytes() == 0)
        buffer_ = AlignedBuffer(kBytes, std::size_t{2} << 20);
      FillUniform(buffer_.as<T>(), kBytes / sizeof(T), 7);
      type_ = type;
    }
    pair_bytes_ = 2 * elements * sizeof(T);
    stride_ = (pair_bytes_ + 4095) / 4096 * 4096;
    copies_ = kBytes / stride_;
    if (copies_ < 2) {
      std::fprintf(
          stderr,
          "softdot attention bench: K + V of %zu MiB do not fit twice\n",
          pair_bytes_ >> 20);
      std::exit(1);
    }
  }
  template <class T>
  const T* k(std::size_t copy) const {
    return reinterpret_cast<const T*>(buffer_.as<const char>() +
                                      copy * stride_);
  }
  template <class T>
  const T* v(std::size_t copy) const {
    return k<T>(copy) + pair_bytes_ / 2 / sizeof(T);
  }
  const void* base() const { return buffer_.as<const void>(); }
  std::size_t stride() const { return stride_; }
  std::size_t copies() const { return copies_; }
  std::size_t pair_bytes() const { return pair_bytes_; }  // K + V of one copy

 private:
  template <class T>
  static int TypeId() {
    return sizeof(T) == 4 ? 1 : std::is_same_v<T, softdot::Float16> ? 2 : 3;
  }
  AlignedBuffer buffer_;
  int type_ = 0;
  std::size_t pair_bytes_ = 0, stride_ = 0, copies_ = 0;
};

// ---- reference
// ------------------------------------------------------------------- Error of
// one output row o[0, dv) against attention computed in double over keys [0,
// visible) of k (row stride d) and v (row stride dv) with the float scale:
// max_c |o_c - exact_c| / W_c, W_c = sum_j w_j |v_jc| with the exact weights w
// (the measure of docs/accuracy.md's bound, whose worst case here is about 1e-4
// and whose measured values are a few 1e-7). NaN in o gives +inf.
template <class KV>
double AttentionRowError(const float* q, const KV* k, const KV* v,
                         std::size_t visible, std::size_t d, std::size_t dv,
                         float scale, const float* o) {
  std::vector<double> w(visible);
  double m = -std::numeric_limits<double>::infinity();
  for (std::size_t j = 0; j < visible; ++j) {
    double s = 0.0;
    for (std::size_t c = 0; c < d; ++c)
      s += static_cast<double>(q[c]) * Widen(k[j * d + c]);
    w[j] = s * scale;
    m = std::max(m, w[j]);
  }
  double sum = 0.0;
  for (std::size_t j = 0; j < visible; ++j) sum += (w[j] = std::exp(w[j] - m));
  std::vector<double> exact(dv, 0.0), mass(dv, 0.0);
  for (std::size_t j = 0; j < visible; ++j) {
    for (std::size_t c = 0; c < dv; ++c) {
      const double x = Widen(v[j * dv + c]);
      exact[c] += w[j] * x;
      mass[c] += w[j] * std::fabs(x);
    }
  }
  double worst = 0.0;
  for (std::size_t c = 0; c < dv; ++c) {
    const double err =
        std::fabs(o[c] - exact[c] / sum) / std::max(mass[c] / sum, 1e-300);
    if (!(err <= worst))
      worst = err == err ? err : std::numeric_limits<double>::infinity();
  }
  return worst;
}

// CPUs in this thread's affinity mask (taskset), or -1.
inline int AffinityCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return -1;
  return CPU_COUNT(&set);
}

// omp_set_num_threads(t) for a scope; restores the previous maximum.
class OmpThreadsScope {
 public:
  explicit OmpThreadsScope(int t) : previous_(omp_get_max_threads()) {
    omp_set_num_threads(t);
  }
  ~OmpThreadsScope() { omp_set_num_threads(previous_); }
  OmpThreadsScope(const OmpThreadsScope&) = delete;
  OmpThreadsScope& operator=(const OmpThreadsScope&) = delete;

 private:
  int previous_;
};

}  // namespace softdot_bench

#endif  // SOFTDOT_BENCH_ATTENTION_UTIL_H_
