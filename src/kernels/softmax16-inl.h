// softdot kernels: the last pass of a 16-bit softmax row. The row has been
// widened to float (exactly) and its state (max c and sum S) taken by the
// faithful float state pass; this pass computes each weight
// exp(p_i - c) / S in double lanes (ExpForFloat, relative error below
// 2^-31) and rounds it once to bfloat16 or float16 (round to odd to float,
// then to 16 bits: round16.h, RoundFinite16), so no weight is rounded
// twice.

#if defined(SOFTDOT_KERNELS_SOFTMAX16_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SOFTDOT_KERNELS_SOFTMAX16_INL_H_
#undef SOFTDOT_KERNELS_SOFTMAX16_INL_H_
#else
#define SOFTDOT_KERNELS_SOFTMAX16_INL_H_
#endif

#include <cstddef>
#include <cstdint>
#include <limits>

#include "kernels/convert16-inl.h"
#include "kernels/softmax_faithful-inl.h"
#include "round16.h"

HWY_BEFORE_NAMESPACE();
namespace softdot {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// One block of kLanes widened scores (xb, mb padded) -> kLanes 16-bit
// weights at yb.
template <class WS>
HWY_INLINE void Apply16Block(const WS& ws, const float* xb,
                             const std::uint8_t* mb, typename WS::V cv,
                             typename WS::V iv, std::uint16_t* yb, bool bf16) {
  const typename WS::DW d;
  for (std::size_t v = 0; v < WS::kVecs; ++v) {
    const auto e = hn::Mul(ExpForFloat(d, hn::Sub(ws.Load(xb, mb, v), cv)), iv);
#if HWY_TARGET <= HWY_AVX2
    hn::StoreU(RoundFinite16(d, e, bf16),
               hn::Rebind<std::uint16_t, typename WS::DW>(),
               yb + v * WS::kVecLanes);
#else
    alignas(64) double buf[WS::kVecLanes];
    hn::StoreU(e, d, buf);
    for (std::size_t j = 0; j < WS::kVecLanes; ++j) {
      yb[v * WS::kVecLanes + j] =
          bf16 ? detail::bfloat16_bits(buf[j]) : to_float16(buf[j]).bits;
    }
#endif
  }
}

template <bool kMasked, bool kScaled>
HWY_INLINE void Apply16Row(const float* x, const std::uint8_t* mask,
                           float scale, std::size_t n, double c, double inv,
                           std::uint16_t* y, bool bf16) {
  using WS = DoubleLaneScores<kMasked, kScaled>;
  constexpr std::size_t kLanes = Block<float>::kLanes;
  const WS ws{static_cast<double>(scale)};
  const typename WS::DW d;
  const auto cv = hn::Set(d, c), iv = hn::Set(d, inv);
  std::size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    Apply16Block(ws, x + i, kMasked ? mask + i : nullptr, cv, iv, y + i, bf16);
  }
  if (i == n) return;
  const std::size_t rest = n - i;
  alignas(64) float xb[kLanes];
  alignas(64) std::uint8_t mb[kLanes < 16 ? 16 : kLanes];
  alignas(64) std::uint16_t yb[kLanes];
  LoadPartialBlock(x + i, rest, -std::numeric_limits<float>::infinity(), xb);
  if (kMasked) LoadPartialMask(mask + i, rest, kLanes, mb);
  Apply16Block(ws, xb, kMasked ? mb : nullptr, cv, iv, yb, bf16);
  for (std::size_t j = 0; j < rest; ++j) y[i + j] = yb[j];
}

// y[i] = exp(x[i] * scale - c) * inv rounded once to 16 bits, i < n; masked
// entries (mask[i] == 0) give +0. The row is finite where kept, and
// x[i] * scale - c <= about 2^-20 (c the float max of the scaled scores).
HWY_NOINLINE void Softmax16Apply(const float* x, const std::uint8_t* mask,
                                 float scale, std::size_t n, double c,
                                 double inv, std::uint16_t* y, bool bf16) {
  const bool scaled = scale != 1.0f;
  if (mask) {
    scaled ? Apply16Row<true, true>(x, mask, scale, n, c, inv, y, bf16)
           : Apply16Row<true, false>(x, mask, scale, n, c, inv, y, bf16);
  } else {
    scaled ? Apply16Row<false, true>(x, mask, scale, n, c, inv, y, bf16)
           : Apply16Row<false, false>(x, mask, scale, n, c, inv, y, bf16);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace softdot
HWY_AFTER_NAMESPACE();

#endif  // SOFTDOT_KERNELS_SOFTMAX16_INL_H_
