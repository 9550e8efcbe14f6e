// softdot kernels for sampling (src/sample.cc): the largest logit of a row
// (with a NaN flag), the float weights exp((x - m) * s) with their block
// sums, and the block sums of the weights at or above a threshold.
//
// Lanes: float in, double arithmetic, float out. Every target gives the bits
// of sample_scalar.h's model: the exp takes only Mul, Add and Sub (no
// MulAdd; -ffp-contract=off), and the sums run in 8 fixed partial sums
// whatever the vector width (8 / N vectors of N double lanes), so a row's
// token never depends on the SIMD target. Error: see sample_exp_double.
#if defined(SOFTDOT_KERNELS_SAMPLE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SOFTDOT_KERNELS_SAMPLE_INL_H_
#undef SOFTDOT_KERNELS_SAMPLE_INL_H_
#else
#define SOFTDOT_KERNELS_SAMPLE_INL_H_
#endif

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "hwy/highway.h"
#include "kernels/sample_scalar.h"

HWY_BEFORE_NAMESPACE();
namespace softdot {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

namespace sample {

using D = hn::CappedTag<double, 8>;
using DF = hn::Rebind<float, D>;
using DI = hn::RebindToSigned<D>;

template <class V>
HWY_INLINE V ExpDouble(D d, V t) {
  const DI di;
  t = hn::Max(t, hn::Set(d, detail::kSampleMinT));
  const V shifter = hn::Set(d, detail::kSampleShifter);
  const V k = hn::Add(hn::Mul(t, hn::Set(d, detail::kSampleLog2e)), shifter);
  const V nd = hn::Sub(k, shifter);
  const V r = hn::Sub(hn::Sub(t, hn::Mul(nd, hn::Set(d, detail::kSampleLn2Hi))),
                      hn::Mul(nd, hn::Set(d, detail::kSampleLn2Lo)));
  V p = hn::Add(hn::Mul(r, hn::Set(d, 1.0 / 40320)), hn::Set(d, 1.0 / 5040));
  p = hn::Add(hn::Mul(p, r), hn::Set(d, 1.0 / 720));
  p = hn::Add(hn::Mul(p, r), hn::Set(d, 1.0 / 120));
  p = hn::Add(hn::Mul(p, r), hn::Set(d, 1.0 / 24));
  p = hn::Add(hn::Mul(p, r), hn::Set(d, 1.0 / 6));
  p = hn::Add(hn::Mul(p, r), hn::Set(d, 0.5));
  p = hn::Add(hn::Mul(p, r), hn::Set(d, 1.0));
  p = hn::Add(hn::Mul(p, r), hn::Set(d, 1.0));
  const auto n = hn::Sub(hn::BitCast(di, k), hn::BitCast(di, shifter));
  const auto bits = hn::ShiftLeft<52>(hn::Add(n, hn::Set(di, 1023)));
  return hn::Mul(p, hn::BitCast(d, bits));
}

}  // namespace sample

// The largest of x[0..n) (n >= 1) and whether any is NaN (*nan).
HWY_NOINLINE float SampleMaxF32(const float* HWY_RESTRICT x, std::size_t n,
                                bool* nan) {
  const hn::ScalableTag<float> d;
  const std::size_t N = hn::Lanes(d);
  std::size_t i = 0;
  float m = -INFINITY;
  bool any_nan = false;
  if (n >= N) {
    auto m0 = hn::Set(d, -INFINITY), m1 = m0;
    const hn::RebindToUnsigned<decltype(d)> du;
    auto bad = hn::Zero(d);  // all-ones lanes where a NaN was seen
    for (; i + 2 * N <= n; i += 2 * N) {
      const auto a = hn::LoadU(d, x + i), b = hn::LoadU(d, x + i + N);
      bad = hn::Or(bad, hn::VecFromMask(d, hn::Or(hn::IsNaN(a), hn::IsNaN(b))));
      m0 = hn::Max(m0, a);
      m1 = hn::Max(m1, b);
    }
    for (; i + N <= n; i += N) {
      const auto a = hn::LoadU(d, x + i);
      bad = hn::Or(bad, hn::VecFromMask(d, hn::IsNaN(a)));
      m0 = hn::Max(m0, a);
    }
    any_nan = !hn::AllFalse(du, hn::Ne(hn::BitCast(du, bad), hn::Zero(du)));
    m = hn::GetLane(hn::MaxOfLanes(d, hn::Max(m0, m1)));
  }
  for (; i < n; ++i) {
    if (std::isnan(x[i])) any_nan = true;
    m = x[i] > m ? x[i] : m;
  }
  *nan = any_nan;
  return m;
}

// w[i] = sample_weight(x[i], m, s) for i < n, and sums[b] = the sum of the
// weights >= tau of block b (kSampleBlock elements) in the fixed order.
HWY_NOINLINE void SampleExpF32(const float* HWY_RESTRICT x, std::size_t n,
                               float m, double s, float tau,
                               float* HWY_RESTRICT w,
                               double* HWY_RESTRICT sums) {
  const sample::D d;
  const sample::DF df;
  const std::size_t N = hn::Lanes(d);
  const auto vm = hn::Set(d, static_cast<double>(m));
  const auto vs = hn::Set(d, s);
  const auto vt = hn::Set(d, static_cast<double>(tau));
  for (std::size_t b0 = 0, blk = 0; b0 < n; b0 += detail::kSampleBlock, ++blk) {
    const std::size_t end =
        b0 + detail::kSampleBlock < n ? b0 + detail::kSampleBlock : n;
    alignas(64) double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    std::size_t i = b0;
    if (N == 8) {
      // One vector is the 8 partial sums: keep it in a register (through
      // acc[] in memory, the store-to-load chain held the pass to about 1
      // cycle per element).
      auto sum = hn::Zero(d);
      for (; i + 8 <= end; i += 8) {
        const auto xv = hn::PromoteTo(d, hn::LoadU(df, x + i));
        const auto wv = sample::ExpDouble(d, hn::Mul(hn::Sub(xv, vm), vs));
        const auto wf = hn::DemoteTo(df, wv);
        hn::StoreU(wf, df, w + i);
        const auto wd = hn::PromoteTo(d, wf);
        sum = hn::Add(sum, hn::IfThenElseZero(hn::Ge(wd, vt), wd));
      }
      hn::Store(sum, d, acc);
    }
    for (; i + 8 <= end; i += 8) {
      for (std::size_t j = 0; j < 8; j += N) {
        const auto xv = hn::PromoteTo(d, hn::LoadU(df, x + i + j));
        const auto wv = sample::ExpDouble(d, hn::Mul(hn::Sub(xv, vm), vs));
        const auto wf = hn::DemoteTo(df, wv);
        hn::StoreU(wf, df, w + i + j);
        const auto wd = hn::PromoteTo(d, wf);
        hn::Store(hn::Add(hn::Load(d, acc + j),
                          hn::IfThenElseZero(hn::Ge(wd, vt), wd)),
                  d, acc + j);
      }
    }
    for (; i < end; ++i) {
      w[i] = detail::sample_weight(x[i], m, s);
      if (w[i] >= tau) acc[(i - b0) % 8] += static_cast<double>(w[i]);
    }
    sums[blk] = detail::sample_combine8(acc);
  }
}

// sums[b] = the sum of the weights w >= tau of block b, in the fixed order.
HWY_NOINLINE void SampleKeptSumsF32(const float* HWY_RESTRICT w, std::size_t n,
                                    float tau, double* HWY_RESTRICT sums) {
  const sample::D d;
  const sample::DF df;
  const std::size_t N = hn::Lanes(d);
  const auto vt = hn::Set(d, static_cast<double>(tau));
  for (std::size_t b0 = 0, blk = 0; b0 < n; b0 += detail::kSampleBlock, ++blk) {
    const std::size_t end =
        b0 + detail::kSampleBlock < n ? b0 + detail::kSampleBlock : n;
    alignas(64) double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    std::size_t i = b0;
    if (N == 8) {  // the 8 partial sums in a register, as in SampleExpF32
      auto sum = hn::Zero(d);
      for (; i + 8 <= end; i += 8) {
        const auto wv = hn::PromoteTo(d, hn::LoadU(df, w + i));
        sum = hn::Add(sum, hn::IfThenElseZero(hn::Ge(wv, vt), wv));
      }
      hn::Store(sum, d, acc);
    }
    for (; i + 8 <= end; i += 8) {
      for (std::size_t j = 0; j < 8; j += N) {
        const auto wv = hn::PromoteTo(d, hn::LoadU(df, w + i + j));
        const auto kept = hn::IfThenElseZero(hn::Ge(wv, vt), wv);
        hn::Store(hn::Add(hn::Load(d, acc + j), kept), d, acc + j);
      }
    }
    for (; i < end; ++i) {
      if (w[i] >= tau) acc[(i - b0) % 8] += static_cast<double>(w[i]);
    }
    sums[blk] = detail::sample_combine8(acc);
  }
}

// The indices i < n (ascending) with v[i] >= lo, written to idx, and their
// values to vals unless null (room for n + 64 each: whole vectors are
// stored); returns their count. n < 2^32.
HWY_NOINLINE std::size_t SampleSelectGeF32(const float* HWY_RESTRICT v,
                                           std::size_t n, float lo,
                                           std::uint32_t* HWY_RESTRICT idx,
                                           float* HWY_RESTRICT vals) {
  const hn::ScalableTag<float> d;
  const hn::RebindToUnsigned<decltype(d)> du;
  const std::size_t N = hn::Lanes(d);
  const auto vlo = hn::Set(d, lo);
  std::size_t count = 0, i = 0;
  auto iota = hn::Iota(du, 0);
  const auto step = hn::Set(du, static_cast<std::uint32_t>(N));
  for (; i + N <= n; i += N) {
    const auto x = hn::LoadU(d, v + i);
    const auto keep = hn::Ge(x, vlo);
    if (!hn::AllFalse(d, keep)) {
      // Compress in a register, then a full store (idx has room for n + N):
      // VPCOMPRESSD with a memory operand is microcoded on Zen 4 and made
      // this pass several times slower (measured).
      const auto m = hn::RebindMask(du, keep);
      hn::StoreU(hn::Compress(iota, m), du, idx + count);
      if (vals != nullptr) hn::StoreU(hn::Compress(x, keep), d, vals + count);
      count += hn::CountTrue(du, m);
    }
    iota = hn::Add(iota, step);
  }
  for (; i < n; ++i) {
    if (!(v[i] >= lo)) continue;
    if (vals != nullptr) vals[count] = v[i];
    idx[count++] = static_cast<std::uint32_t>(i);
  }
  return count;
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace softdot
HWY_AFTER_NAMESPACE();

#endif  // include guard
