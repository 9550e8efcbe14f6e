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
#include <cstdint>
#include <cstring>

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

// Where a tile's operands come from: packed panels (float, k-major), or
// read in place: A as kMR row pointers (row r's k at a[r][k]), B as rows
// (B's row k at b + k * ldb, nr elements), float or bfloat16 (widened
// exactly). Rows are k-contiguous in both.
struct PackedA {
  const float* p;
  HWY_INLINE float Get(std::size_t k, std::size_t r) const {
    return p[k * kMR + r];
  }
};
template <class T>
struct RowsA {
  const T* const* rows;
  HWY_INLINE float Get(std::size_t k, std::size_t r) const {
    if constexpr (sizeof(T) == 4) {
      return rows[r][k];
    } else {
      const std::uint32_t u = static_cast<std::uint32_t>(rows[r][k]) << 16;
      float f;
      std::memcpy(&f, &u, sizeof(f));
      return f;
    }
  }
};
struct PackedB {
  const float* p;
  std::size_t ld;  // nr
  HWY_INLINE hn::Vec<DF> Get(std::size_t k, std::size_t off) const {
    return hn::Load(DF(), p + k * ld + off);
  }
};
template <class T>
struct RowsB {
  const T* p;
  std::size_t ld;
  HWY_INLINE hn::Vec<DF> Get(std::size_t k, std::size_t off) const {
    const DF df;
    if constexpr (sizeof(T) == 4) {
      return hn::LoadU(df, p + k * ld + off);
    } else {
      const hn::RebindToUnsigned<DF> du;
      const hn::Rebind<std::uint16_t, DF> d16;
      const auto w = hn::PromoteTo(du, hn::LoadU(d16, p + k * ld + off));
      return hn::BitCast(df, hn::ShiftLeft<16>(w));
    }
  }
};

// tile[r * nr + c] = the chains of A(k, r) * B(k, c), k < kc, added in
// double.
template <class OA, class OB>
HWY_INLINE void Tile(const OA a, const OB b, std::size_t kc,
                     double* HWY_RESTRICT tile) {
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
    for (std::size_t k = k0; k < k1; ++k) {
      VF bv[kNV];
#pragma GCC unroll 4
      for (std::size_t v = 0; v < kNV; ++v) bv[v] = b.Get(k, v * N);
#pragma GCC unroll 16
      for (std::size_t r = 0; r < kMR; ++r) {
        const VF av = hn::Set(df, a.Get(k, r));
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

// The tile of A's tile t against g's B, from wherever they are.
template <class OB>
HWY_INLINE void TileFromA(const detail::GemmArgs& g, std::size_t t, const OB b,
                          double* tile) {
  if (g.a_rows == nullptr) {
    Tile(PackedA{g.a + t * g.kc * kMR}, b, g.kc, tile);
    return;
  }
  // Rows past m repeat the last row (their results are not written).
  const std::size_t r0 = t * kMR;
  if (g.a_bf16) {
    const std::uint16_t* rows[kMR];
    const auto* base = static_cast<const std::uint16_t*>(g.a_rows);
    for (std::size_t r = 0; r < kMR; ++r) {
      rows[r] = base + std::min(r0 + r, g.m - 1) * g.lda;
    }
    Tile(RowsA<std::uint16_t>{rows}, b, g.kc, tile);
  } else {
    const float* rows[kMR];
    const auto* base = static_cast<const float*>(g.a_rows);
    for (std::size_t r = 0; r < kMR; ++r) {
      rows[r] = base + std::min(r0 + r, g.m - 1) * g.lda;
    }
    Tile(RowsA<float>{rows}, b, g.kc, tile);
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
    if (g.b_rows == nullptr) {
      gemm::TileFromA(g, t, gemm::PackedB{g.b, nr}, tile);
    } else if (g.b_bf16) {
      gemm::TileFromA(g, t,
                      gemm::RowsB<std::uint16_t>{
                          static_cast<const std::uint16_t*>(g.b_rows), g.ldb},
                      tile);
    } else {
      gemm::TileFromA(
          g, t, gemm::RowsB<float>{static_cast<const float*>(g.b_rows), g.ldb},
          tile);
    }
    const std::size_t r0 = t * gemm::kMR;
    const std::size_t rows = std::min(gemm::kMR, g.m - r0);
    const bool add_acc = g.acc != nullptr && !g.first;
    if (g.c_transposed) {
      // c(r, col) at c + col * ldc + r: column by column, so that each
      // output row gets its `rows` consecutive floats at once.
      for (std::size_t c = 0; c < g.n; ++c) {
        float* out = g.c == nullptr ? nullptr : g.c + c * g.ldc + r0;
        for (std::size_t r = 0; r < rows; ++r) {
          double v = tile[r * nr + c];
          double* a =
              g.acc == nullptr ? nullptr : g.acc + (r0 + r) * g.ldacc + c;
          if (add_acc) v += *a;
          if (out == nullptr) {
            *a = v;
            continue;
          }
          if (g.accumulate) v += static_cast<double>(out[r]);
          out[r] = static_cast<float>(v);
        }
      }
      continue;
    }
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
