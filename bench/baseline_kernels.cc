// Bandwidth baselines for the softmax benchmarks, written with Highway and
// dispatched at run time like the library (no -march flags), so they use the
// same vector width as the kernels they are compared with.
//   CopyLoop:                 y = x with ordinary vector stores (1 read, 1
//   write). RooflineTwoReadsOneWrite: pass 1 max over x, pass 2 y = (x - max) *
//   scale:
//     the memory traffic of a two-pass softmax (2 reads, 1 write) with no exp,
//     i.e. the speed limit of a softmax that keeps the input in memory.
//   FloatDot2: Ogita-Rump-Oishi Dot2 in float lanes (exact products by FMA,
//     TwoSum, errors gathered), 8 independent accumulators. The alternative
//     to dot_accurate's exact products summed in double, kept here to
//     measure which is cheaper for the same accuracy.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

#include "bench_util.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "baseline_kernels.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace softdot_bench {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

void CopyLoopImpl(const float* HWY_RESTRICT x, float* HWY_RESTRICT y,
                  std::size_t n) {
  const hn::ScalableTag<float> d;
  const std::size_t N = hn::Lanes(d);
  std::size_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    const auto v0 = hn::LoadU(d, x + i);
    const auto v1 = hn::LoadU(d, x + i + N);
    const auto v2 = hn::LoadU(d, x + i + 2 * N);
    const auto v3 = hn::LoadU(d, x + i + 3 * N);
    hn::StoreU(v0, d, y + i);
    hn::StoreU(v1, d, y + i + N);
    hn::StoreU(v2, d, y + i + 2 * N);
    hn::StoreU(v3, d, y + i + 3 * N);
  }
  for (; i + N <= n; i += N) hn::StoreU(hn::LoadU(d, x + i), d, y + i);
  for (; i < n; ++i) y[i] = x[i];
}

void RooflineImpl(const float* HWY_RESTRICT x, float* HWY_RESTRICT y,
                  std::size_t n, float scale) {
  const hn::ScalableTag<float> d;
  const std::size_t N = hn::Lanes(d);
  // Pass 1: max with 4 independent accumulators (max latency 4 cycles on
  // 2 ports would otherwise bound an in-cache pass).
  auto m0 = hn::Set(d, -hwy::HighestValue<float>());
  auto m1 = m0, m2 = m0, m3 = m0;
  std::size_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    m0 = hn::Max(m0, hn::LoadU(d, x + i));
    m1 = hn::Max(m1, hn::LoadU(d, x + i + N));
    m2 = hn::Max(m2, hn::LoadU(d, x + i + 2 * N));
    m3 = hn::Max(m3, hn::LoadU(d, x + i + 3 * N));
  }
  for (; i + N <= n; i += N) m0 = hn::Max(m0, hn::LoadU(d, x + i));
  float m =
      hn::GetLane(hn::MaxOfLanes(d, hn::Max(hn::Max(m0, m1), hn::Max(m2, m3))));
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  // Pass 2: one subtract and one multiply per element, then store.
  const auto vm = hn::Set(d, m);
  const auto vs = hn::Set(d, scale);
  i = 0;
  for (; i + 2 * N <= n; i += 2 * N) {
    hn::StoreU(hn::Mul(hn::Sub(hn::LoadU(d, x + i), vm), vs), d, y + i);
    hn::StoreU(hn::Mul(hn::Sub(hn::LoadU(d, x + i + N), vm), vs), d, y + i + N);
  }
  for (; i + N <= n; i += N)
    hn::StoreU(hn::Mul(hn::Sub(hn::LoadU(d, x + i), vm), vs), d, y + i);
  for (; i < n; ++i) y[i] = (x[i] - m) * scale;
}

double FloatDot2Impl(const float* HWY_RESTRICT x, const float* HWY_RESTRICT y,
                     std::size_t n) {
  const hn::ScalableTag<float> d;
  using V = hn::Vec<decltype(d)>;
  const std::size_t N = hn::Lanes(d);
  constexpr std::size_t kAcc = 8;
  V s[kAcc], c[kAcc];
  for (std::size_t a = 0; a < kAcc; ++a) s[a] = c[a] = hn::Zero(d);
  std::size_t i = 0;
  for (; i + kAcc * N <= n; i += kAcc * N) {
    for (std::size_t a = 0; a < kAcc; ++a) {
      const V xv = hn::LoadU(d, x + i + a * N),
              yv = hn::LoadU(d, y + i + a * N);
      const V p = hn::Mul(xv, yv);
      const V pe = hn::MulAdd(xv, yv, hn::Neg(p));  // exact with FMA
      const V t = hn::Add(s[a], p);
      const V bb = hn::Sub(t, s[a]);
      const V q = hn::Add(hn::Sub(s[a], hn::Sub(t, bb)), hn::Sub(p, bb));
      c[a] = hn::Add(c[a], hn::Add(q, pe));
      s[a] = t;
    }
  }
  double hi = 0, lo = 0;
  auto add = [&](double v) {
    const double t = hi + v, bb = t - hi;
    lo += (hi - (t - bb)) + (v - bb);
    hi = t;
  };
  alignas(64) float sl[hn::MaxLanes(d)], cl[hn::MaxLanes(d)];
  for (std::size_t a = 0; a < kAcc; ++a) {
    hn::Store(s[a], d, sl);
    hn::Store(c[a], d, cl);
    for (std::size_t j = 0; j < N; ++j) {
      add(sl[j]);
      lo += cl[j];
    }
  }
  for (; i < n; ++i) add(static_cast<double>(x[i]) * y[i]);
  return hi + lo;
}

// FMA throughput: 12 independent chains of float FMAs held in registers
// (named variables: an array of vectors ended up on the stack, each FMA
// waiting on a load and a store), `rounds` rounds. Returns a value that
// depends on every chain so nothing is optimised away.
float FmaPeakImpl(std::size_t rounds, float m, float c) {
  const hn::ScalableTag<float> d;
  using V = hn::Vec<decltype(d)>;
  const V vm = hn::Set(d, m), vc = hn::Set(d, c);
  V a0 = hn::Set(d, 1.0f), a1 = hn::Set(d, 1.1f), a2 = hn::Set(d, 1.2f),
    a3 = hn::Set(d, 1.3f), a4 = hn::Set(d, 1.4f), a5 = hn::Set(d, 1.5f),
    a6 = hn::Set(d, 1.6f), a7 = hn::Set(d, 1.7f), a8 = hn::Set(d, 1.8f),
    a9 = hn::Set(d, 1.9f), a10 = hn::Set(d, 2.0f), a11 = hn::Set(d, 2.1f);
  for (std::size_t r = 0; r < rounds; ++r) {
    a0 = hn::MulAdd(a0, vm, vc);
    a1 = hn::MulAdd(a1, vm, vc);
    a2 = hn::MulAdd(a2, vm, vc);
    a3 = hn::MulAdd(a3, vm, vc);
    a4 = hn::MulAdd(a4, vm, vc);
    a5 = hn::MulAdd(a5, vm, vc);
    a6 = hn::MulAdd(a6, vm, vc);
    a7 = hn::MulAdd(a7, vm, vc);
    a8 = hn::MulAdd(a8, vm, vc);
    a9 = hn::MulAdd(a9, vm, vc);
    a10 = hn::MulAdd(a10, vm, vc);
    a11 = hn::MulAdd(a11, vm, vc);
  }
  const V s = hn::Add(hn::Add(hn::Add(hn::Add(a0, a1), hn::Add(a2, a3)),
                              hn::Add(hn::Add(a4, a5), hn::Add(a6, a7))),
                      hn::Add(hn::Add(a8, a9), hn::Add(a10, a11)));
  return hn::GetLane(hn::SumOfLanes(d, s));
}

std::size_t FloatLanesImpl() { return hn::Lanes(hn::ScalableTag<float>()); }

}  // namespace HWY_NAMESPACE
}  // namespace softdot_bench
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace softdot_bench {

void NaiveSoftmax(const float* x, float* y, std::size_t n) {
  float m = -std::numeric_limits<float>::infinity();
  for (std::size_t i = 0; i < n; ++i) m = std::max(m, x[i]);
  float sum = 0.0f;
  for (std::size_t i = 0; i < n; ++i) {
    y[i] = std::exp(x[i] - m);
    sum += y[i];
  }
  for (std::size_t i = 0; i < n; ++i) y[i] /= sum;
}

HWY_EXPORT(CopyLoopImpl);
HWY_EXPORT(RooflineImpl);
HWY_EXPORT(FloatDot2Impl);
HWY_EXPORT(FmaPeakImpl);
HWY_EXPORT(FloatLanesImpl);

float FmaPeak(std::size_t rounds, float m, float c) {
  return HWY_DYNAMIC_DISPATCH(FmaPeakImpl)(rounds, m, c);
}
std::size_t FloatLanes() { return HWY_DYNAMIC_DISPATCH(FloatLanesImpl)(); }

double FloatDot2(const float* x, const float* y, std::size_t n) {
  return HWY_DYNAMIC_DISPATCH(FloatDot2Impl)(x, y, n);
}

void CopyLoop(const float* x, float* y, std::size_t n) {
  HWY_DYNAMIC_DISPATCH(CopyLoopImpl)(x, y, n);
}
void RooflineTwoReadsOneWrite(const float* x, float* y, std::size_t n,
                              float scale) {
  HWY_DYNAMIC_DISPATCH(RooflineImpl)(x, y, n, scale);
}
}  // namespace softdot_bench
#endif  // HWY_ONCE
