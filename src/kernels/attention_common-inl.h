// softdot kernels: what both attention forms share (src/kernels/
// attention-inl.h has the overview): vector types, the soft-cap, a row's
// initial state from its sink, flushing float block sums into double
// accumulators, the finiteness check of a V block, and the per-thread
// scratch layout. K and V enter through attention_kv-inl.h.

#if defined(SOFTDOT_KERNELS_ATTENTION_COMMON_INL_H_) == \
    defined(HWY_TARGET_TOGGLE)
#ifdef SOFTDOT_KERNELS_ATTENTION_COMMON_INL_H_
#undef SOFTDOT_KERNELS_ATTENTION_COMMON_INL_H_
#else
#define SOFTDOT_KERNELS_ATTENTION_COMMON_INL_H_
#endif

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>

#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"
#include "kernels/attention_args.h"
#include "kernels/eft-inl.h"
#include "kernels/exp-inl.h"

HWY_BEFORE_NAMESPACE();
namespace softdot {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using detail::AttnArgs;
using detail::kKeyTile;

namespace attn {

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;
using DD = hn::ScalableTag<double>;
using VD = hn::Vec<DD>;
using DI = hn::RebindToSigned<DF>;

// Accumulator registers the tiles may use: 16 of 32 vector registers on
// AVX-512 and NEON, 12 of 16 elsewhere (AVX2: 8 made the row tiles of 4
// vectors take 2 keys, with 6 loads per 8 FMAs; 12 take 3 keys, 7 loads
// per 12 FMAs, and measured 5-10% faster prefill, the same bits).
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL || \
    HWY_TARGET == HWY_NEON
constexpr std::size_t kAccRegs = 16;
#else
constexpr std::size_t kAccRegs = 12;
#endif

HWY_INLINE std::size_t Lanes() { return hn::Lanes(DF()); }

// Rows per kernel call on this target: four vectors of lanes.
HWY_INLINE std::size_t MaxRows() { return 4 * Lanes(); }

// Calls run(std::integral_constant<std::size_t, NV>()) with NV = 1, 2 or 4:
// the fewest vectors of Lanes() rows that hold `rows` (a prefill form's
// entry point picks its RunPrefill* instantiation with it).
template <class F>
HWY_INLINE void ByRowVectors(std::size_t rows, F&& run) {
  const std::size_t N = Lanes();
  if (rows <= N) {
    run(std::integral_constant<std::size_t, 1>());
  } else if (rows <= 2 * N) {
    run(std::integral_constant<std::size_t, 2>());
  } else {
    run(std::integral_constant<std::size_t, 4>());
  }
}

// Logit soft-capping, cap * tanh(s / cap): the one expression the prefill
// and decode forms and attention_weights (AttentionSoftcap) all use.
HWY_INLINE VF Softcap(VF s, VF cap) {
  return hn::Mul(cap, hn::Tanh(DF(), hn::Div(s, cap)));
}

// The initial state of a row: its sink as a score with no value, or the
// identity (m = -inf, l = 0); a NaN sink makes the row NaN.
HWY_INLINE void InitialState(const float* sinks, std::size_t r, float& m,
                             double& l, bool& nan) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  m = -kInf;
  l = 0.0;
  nan = false;
  if (sinks == nullptr) return;
  const float sk = sinks[r];
  if (std::isnan(sk)) {
    nan = true;
  } else if (sk != -kInf) {
    m = sk;
    l = 1.0;
  }
}

// o[i] = o[i] * alpha[i] + acc[i] in double for the N lanes of one vector
// (o and alpha need no alignment).
HWY_INLINE void FlushVector(const VF& acc, const double* alpha,
                            double* HWY_RESTRICT o) {
  const DF df;
  const DD dd;
  const std::size_t ND = hn::Lanes(dd);
#if HWY_TARGET != HWY_SCALAR
  if constexpr (hn::MaxLanes(DF()) >= 2) {
    const hn::Half<DF> dh;
    const VD lo = hn::PromoteTo(dd, hn::LowerHalf(dh, acc));
    const VD hi = hn::PromoteTo(dd, hn::UpperHalf(dh, acc));
    hn::StoreU(hn::MulAdd(hn::LoadU(dd, o), hn::LoadU(dd, alpha), lo), dd, o);
    hn::StoreU(hn::MulAdd(hn::LoadU(dd, o + ND), hn::LoadU(dd, alpha + ND), hi),
               dd, o + ND);
    return;
  }
#endif
  HWY_ALIGN float tmp[hn::MaxLanes(DF())];
  const hn::Rebind<float, DD> dfh;
  hn::Store(acc, df, tmp);
  for (std::size_t i = 0; i < hn::Lanes(df); i += ND) {
    const VD x = hn::PromoteTo(dd, hn::LoadU(dfh, tmp + i));
    hn::StoreU(hn::MulAdd(hn::LoadU(dd, o + i), hn::LoadU(dd, alpha + i), x),
               dd, o + i);
  }
}

// od[r] = od[r] * alpha[r] + acc[r] in double, for NV vectors of rows.
template <std::size_t NV>
HWY_INLINE void FlushColumn(const VF (&acc)[NV], const double* alpha,
                            double* HWY_RESTRICT od) {
  const std::size_t N = hn::Lanes(DF());
#pragma GCC unroll 4
  for (std::size_t v = 0; v < NV; ++v) {
    FlushVector(acc[v], alpha + v * N, od + v * N);
  }
}

// True when the kb rows of n values hold no inf or NaN. A block with a
// masked score checks its values with this: if one is not finite, P V skips
// the masked terms lane by lane (0 * NaN would otherwise leak).
HWY_INLINE bool AllFinite(const float* v, std::size_t stride, std::size_t kb,
                          std::size_t n) {
  for (std::size_t j = 0; j < kb; ++j) {
    for (std::size_t c = 0; c < n; ++c) {
      if (!std::isfinite(v[j * stride + c])) return false;
    }
  }
  return true;
}

// Everything the block loop needs, laid out in the scratch buffer.
struct Scratch {
  float* qt;                // [d][bq]
  float* s;                 // [kKeyTile][bq] scores (then kept for the guard)
  float* p;                 // [kKeyTile][bq] exp(s - m)
  float* kc;                // [kKeyTile][d] widened keys
  float* vc;                // [kKeyTile][dv] widened values
  float* add;               // [bq] bias / mask of one key
  double* od;               // [dv][bq] output accumulators
  double* l;                // [bq] sums
  double* alpha;            // [bq]
  float* m;                 // [bq] running max
  float* nan;               // [bq] 1 where a NaN was seen
  std::int32_t* first_key;  // [bq] first visible key of each row
  std::int32_t* last_key;   // [bq] last visible key of each row
  double* qtd;              // [d][bq] Qt in double (precise only)
  float* slo;               // [kKeyTile][bq] scores' low parts (precise)
  // The units' bfloat16 pairs (AttnArgs::units; attention_units-inl.h).
  std::uint32_t* qp;  // [ceil(d / 2)][bq] query pairs
  std::uint32_t* pp;  // [kKeyTile / 2][bq] weight pairs (high parts)
  std::uint32_t* pl;  // [kKeyTile / 2][bq] weight pairs (low parts, split)
  std::uint32_t* vp;  // [kKeyTile / 2][dv] value pairs
};

HWY_INLINE float* AlignUp(float* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  return reinterpret_cast<float*>((a + 63) & ~std::uintptr_t{63});
}

}  // namespace attn
}  // namespace HWY_NAMESPACE
}  // namespace softdot
HWY_AFTER_NAMESPACE();

#endif  // SOFTDOT_KERNELS_ATTENTION_COMMON_INL_H_
