// softdot kernels: rows of 16-bit values widened to float (a 16-bit query)
// and double quotients rounded once to 16 bits (a 16-bit output), with the
// bits of float16.cc's scalar conversions on every target.
//
// The vector forms run where the target converts float16 in hardware (F16C:
// AVX2 and AVX-512), whose conversions are exact (widening) and to nearest
// even (narrowing), as float16.cc's. Chunks holding inf or NaN take the
// scalar form (F16C quiets a signalling NaN, float16.cc keeps its bits);
// other targets take it throughout.
#if defined(SOFTDOT_KERNELS_CONVERT16_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SOFTDOT_KERNELS_CONVERT16_INL_H_
#undef SOFTDOT_KERNELS_CONVERT16_INL_H_
#else
#define SOFTDOT_KERNELS_CONVERT16_INL_H_
#endif

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "hwy/highway.h"
#include "round16.h"
#include "softdot/float16.h"

HWY_BEFORE_NAMESPACE();
namespace softdot {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

namespace convert16 {

inline void WidenScalar(const std::uint16_t* src, std::size_t n, float* dst,
                        bool bf16) {
  for (std::size_t c = 0; c < n; ++c) {
    dst[c] = bf16 ? to_float(BFloat16{src[c]}) : to_float(Float16{src[c]});
  }
}

inline void RoundScalar(const double* o, double l, std::size_t n,
                        std::uint16_t* dst, bool bf16) {
  for (std::size_t c = 0; c < n; ++c) {
    const double x = o[c] / l;
    dst[c] = bf16 ? detail::bfloat16_bits(x) : to_float16(x).bits;
  }
}

}  // namespace convert16

// dst[c] = the float value of the 16-bit src[c] (bf16: bfloat16, else
// float16), c < n.
HWY_NOINLINE void Widen16(const std::uint16_t* HWY_RESTRICT src, std::size_t n,
                          float* HWY_RESTRICT dst, bool bf16) {
  std::size_t c = 0;
#if HWY_TARGET <= HWY_AVX2
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du32;
  const hn::Rebind<std::uint16_t, decltype(df)> du16;
  const hn::Rebind<hwy::float16_t, decltype(df)> df16;
  const std::size_t N = hn::Lanes(df);
  for (; c + N <= n; c += N) {
    const auto bits = hn::LoadU(du16, src + c);
    if (bf16) {
      hn::StoreU(hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du32, bits))),
                 df, dst + c);
      continue;
    }
    const auto special =
        hn::Eq(hn::And(bits, hn::Set(du16, 0x7c00)), hn::Set(du16, 0x7c00));
    if (!hn::AllFalse(du16, special)) {
      convert16::WidenScalar(src + c, N, dst + c, false);
      continue;
    }
    hn::StoreU(hn::PromoteTo(df, hn::BitCast(df16, bits)), df, dst + c);
  }
#endif
  convert16::WidenScalar(src + c, n - c, dst + c, bf16);
}

#if HWY_TARGET <= HWY_AVX2
// The finite double lanes x rounded once to 16 bits (bf16: bfloat16, else
// float16; to nearest, ties to even): rounded to float toward zero with the
// last bit set when inexact (round to odd, round16.h), then to 16 bits.
template <class DD>
HWY_INLINE hn::Vec<hn::Rebind<std::uint16_t, DD>> RoundFinite16(DD dd,
                                                                hn::Vec<DD> x,
                                                                bool bf16) {
  const hn::Rebind<float, DD> df;
  const hn::Rebind<std::int32_t, DD> di32;
  const hn::RebindToUnsigned<decltype(df)> du32;
  const hn::Rebind<std::uint16_t, DD> du16;
  const hn::Rebind<hwy::float16_t, DD> df16;
  const auto one = hn::Set(dd, 1.0);
  // Round to odd: the nearest float, one step toward zero where it lies
  // beyond x, the last bit set where inexact (round16.h's round_to_odd).
  const auto f = hn::DemoteTo(df, x);
  const auto back = hn::PromoteTo(dd, f);
  const auto inexact = hn::Ne(back, x);
  const auto away = hn::And(inexact, hn::Gt(hn::Abs(back), hn::Abs(x)));
  const auto step =
      hn::BitCast(du32, hn::DemoteTo(di32, hn::IfThenElseZero(away, one)));
  const auto odd =
      hn::BitCast(du32, hn::DemoteTo(di32, hn::IfThenElseZero(inexact, one)));
  const auto u = hn::Or(hn::Sub(hn::BitCast(du32, f), step), odd);
  if (bf16) {
    // Finite: to nearest even on the upper half (round16.h).
    const auto lsb = hn::And(hn::ShiftRight<16>(u), hn::Set(du32, 1));
    const auto r =
        hn::ShiftRight<16>(hn::Add(hn::Add(u, hn::Set(du32, 0x7fff)), lsb));
    return hn::DemoteTo(du16, hn::BitCast(di32, r));
  }
  return hn::BitCast(du16, hn::DemoteTo(df16, hn::BitCast(df, u)));
}
#endif

// dst[c] = o[c] / l rounded once to 16 bits (bf16: bfloat16, else float16;
// to nearest, ties to even), c < n: the quotient in double, rounded to
// float toward zero with the last bit set when inexact (round to odd,
// round16.h), then to 16 bits.
HWY_NOINLINE void Round16Quotient(const double* HWY_RESTRICT o, double l,
                                  std::size_t n,
                                  std::uint16_t* HWY_RESTRICT dst, bool bf16) {
  std::size_t c = 0;
#if HWY_TARGET <= HWY_AVX2
  const hn::ScalableTag<double> dd;
  const hn::Rebind<std::uint16_t, decltype(dd)> du16;
  const std::size_t N = hn::Lanes(dd);
  const auto vl = hn::Set(dd, l);
  for (; c + N <= n; c += N) {
    const auto x = hn::Div(hn::LoadU(dd, o + c), vl);
    if (!hn::AllTrue(dd, hn::IsFinite(x))) {
      convert16::RoundScalar(o + c, l, N, dst + c, bf16);
      continue;
    }
    hn::StoreU(RoundFinite16(dd, x, bf16), du16, dst + c);
  }
#endif
  convert16::RoundScalar(o + c, l, n - c, dst + c, bf16);
}

}  // namespace HWY_NAMESPACE
}  // namespace softdot
HWY_AFTER_NAMESPACE();

#endif  // SOFTDOT_KERNELS_CONVERT16_INL_H_
