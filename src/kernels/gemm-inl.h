// softdot kernels: the register-blocked tile of the packed matrix product
// that the fused linear cross-entropy runs (kernels/gemm_args.h says what
// it computes). A tile is MR rows x NV vectors of columns: MR x NV float
// accumulators, one FMA per accumulator per k, the B row loaded once and
// each A value broadcast once per k. Every kGemmChain k's, the float
// chains are added to a double tile (in memory, L1) and restarted, so an
// element's value is the same on every target with FMA whatever MR and NR
// are: the chain boundaries are fixed multiples of kGemmChain.
#if defined(SOFTDOT_KERNELS_GEMM_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SOFTDOT_KERNELS_GEMM_INL_H_
#undef SOFTDOT_KERNELS_GEMM_INL_H_
#else
#define SOFTDOT_KERNELS_GEMM_INL_H_
#endif

#include <algorithm>
#include <cstddef>

#include "hwy/highway.h"
#include "kernels/gemm_args.h"

HWY_BEFORE_NAMESPACE();
namespace softdot {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

namespace gemm {

using DF = hn::ScalableTag<float>;
using DD = hn::Rebind<double, hn::Half<DF>>;  // half the float lanes
using DFH = hn::Rebind<float, DD>;            // the floats of one DD

// Tile shape: MR rows x NV float vectors. 32 vector registers (AVX-512):
// 24 accumulators; 16 (AVX2, SSE4): 12.
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
inline constexpr std::size_t kMR = 12;
inline constexpr std::size_t kNV = 2;
#elif HWY_ARCH_ARM
inline constexpr std::size_t kMR = 6;
inline constexpr std::size_t kNV = 4;
#else
inline constexpr std::size_t kMR = 6;
inline constexpr std::size_t kNV = 2;
#endif

HWY_INLINE std::size_t NR() { return kNV * hn::Lanes(DF()); }

// tile[r * nr + c] (+)= the chains of a[k * kMR + r] * b[k * nr + c], k < kc.
HWY_INLINE void Tile(const float* HWY_RESTRICT a, const float* HWY_RESTRICT b,
                     std::size_t kc, double* HWY_RESTRICT tile) {
  const DF df;
  const DD dd;
  const DFH dfh;
  const std::size_t N = hn::Lanes(df);
  const std::size_t ND = hn::Lanes(dd);
  const std::size_t nr = kNV * N;
  using VF = hn::Vec<DF>;
  HWY_ALIGN float part[kMR * kNV * hn::MaxLanes(DF())];
  for (std::size_t i = 0; i < kMR * nr; ++i) tile[i] = 0.0;
  for (std::size_t k0 = 0; k0 < kc; k0 += detail::kGemmChain) {
    const std::size_t k1 = std::min(kc, k0 + detail::kGemmChain);
    VF acc[kMR][kNV];
#pragma GCC unroll 16
    for (std::size_t r = 0; r < kMR; ++r) {
#pragma GCC unroll 4
      for (std::size_t v = 0; v < kNV; ++v) acc[r][v] = hn::Zero(df);
    }
    const float* ak = a + k0 * kMR;
    const float* bk = b + k0 * nr;
    for (std::size_t k = k0; k < k1; ++k, ak += kMR, bk += nr) {
      VF bv[kNV];
#pragma GCC unroll 4
      for (std::size_t v = 0; v < kNV; ++v) bv[v] = hn::Load(df, bk + v * N);
#pragma GCC unroll 16
      for (std::size_t r = 0; r < kMR; ++r) {
        const VF av = hn::Set(df, ak[r]);
#pragma GCC unroll 4
        for (std::size_t v = 0; v < kNV; ++v) {
          acc[r][v] = hn::MulAdd(av, bv[v], acc[r][v]);
        }
      }
    }
#pragma GCC unroll 16
    for (std::size_t r = 0; r < kMR; ++r) {
#pragma GCC unroll 4
      for (std::size_t v = 0; v < kNV; ++v) {
        hn::Store(acc[r][v], df, part + r * nr + v * N);
      }
    }
    for (std::size_t i = 0; i < kMR * nr; i += ND) {
      const auto p = hn::PromoteTo(dd, hn::Load(dfh, part + i));
      hn::Store(hn::Add(hn::Load(dd, tile + i), p), dd, tile + i);
    }
  }
}

}  // namespace gemm

// kernels/gemm_args.h.
HWY_NOINLINE void GemmPanel(const detail::GemmArgs& g) {
  const gemm::DD dd;
  const gemm::DFH dfh;
  const std::size_t ND = hn::Lanes(dd);
  const std::size_t nr = gemm::NR();
  HWY_ALIGN double tile[gemm::kMR * gemm::kNV * hn::MaxLanes(gemm::DF())];
  for (std::size_t t = 0; t < g.mtiles; ++t) {
    gemm::Tile(g.a + t * g.kc * gemm::kMR, g.b, g.kc, tile);
    const std::size_t r0 = t * gemm::kMR;
    const std::size_t rows = std::min(gemm::kMR, g.m - r0);
    const bool add_acc = g.acc != nullptr && !g.first;
    for (std::size_t r = 0; r < rows; ++r) {
      const double* tr = tile + r * nr;
      double* ar = g.acc == nullptr ? nullptr : g.acc + (r0 + r) * g.ldacc;
      float* cr = g.c == nullptr ? nullptr : g.c + (r0 + r) * g.ldc;
      std::size_t c = 0;
      if (g.n == nr) {
        for (; c < nr; c += ND) {
          auto v = hn::Load(dd, tr + c);
          if (add_acc) v = hn::Add(v, hn::LoadU(dd, ar + c));
          if (cr == nullptr) {
            hn::StoreU(v, dd, ar + c);
            continue;
          }
          if (g.accumulate)
            v = hn::Add(v, hn::PromoteTo(dd, hn::LoadU(dfh, cr + c)));
          hn::StoreU(hn::DemoteTo(dfh, v), dfh, cr + c);
        }
      }
      for (; c < g.n; ++c) {
        double v = tr[c];
        if (add_acc) v += ar[c];
        if (cr == nullptr) {
          ar[c] = v;
          continue;
        }
        if (g.accumulate) v += static_cast<double>(cr[c]);
        cr[c] = static_cast<float>(v);
      }
    }
  }
}

// The tile shape of this target: {MR, NR}.
HWY_NOINLINE void GemmShape(std::size_t* mr, std::size_t* nr) {
  *mr = gemm::kMR;
  *nr = gemm::NR();
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace softdot
HWY_AFTER_NAMESPACE();

#endif  // include guard
