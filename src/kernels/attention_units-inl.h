// softdot kernels: the prefill form on the CPU's bfloat16 dot-product units
// (AttnArgs::units; src/kernels/attention-inl.h has the overview). Queries,
// keys and values are bfloat16; Q K^T and P V are VDPBF16PS products
// (AVX512-BF16: each 32-bit lane adds the products of two bfloat16 pairs to
// a float accumulator) or the model of that instruction in plain vector
// arithmetic, which gives the same bits on every FMA target (tests compare
// the two wherever the hardware is present). The softmax steps between the
// products (mask, max, exp, the double sums and the double output
// accumulators) are the float path's own (attention_prefill-inl.h).
//
// The instruction, as measured on AMD Zen 4 and as Intel's manual writes
// it: for lane i, acc = fma(a.odd, b.odd, acc), rounded to float, then
// acc = fma(a.even, b.even, acc), rounded to float; round to nearest even,
// denormal inputs (bfloat16 and the accumulator) read as zero of their
// sign, denormal results written as zero of their sign (DAZ, FTZ), MXCSR
// ignored. detail::dpbf16_model (units_model.h) is the scalar form.
//
// Where the bits come from: the scores are blocked chains like the float
// path's (a chain of products over each block of kUnitsScoreBlock
// features, taken in pairs, odd feature first, the blocks added in float,
// then one multiply by the scale); the weights P enter P V rounded once to
// bfloat16 (AttnArgs::pv_split: as a bfloat16 high part and the bfloat16
// nearest to the rest, two products), in one chain over the key tile; a
// block with a masked score and a value that is not
// finite runs the float path's guarded P V (0 * inf must not reach the
// output).

#if defined(SOFTDOT_KERNELS_ATTENTION_UNITS_INL_H_) == \
    defined(HWY_TARGET_TOGGLE)
#ifdef SOFTDOT_KERNELS_ATTENTION_UNITS_INL_H_
#undef SOFTDOT_KERNELS_ATTENTION_UNITS_INL_H_
#else
#define SOFTDOT_KERNELS_ATTENTION_UNITS_INL_H_
#endif

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/attention_common-inl.h"
#include "kernels/attention_kv-inl.h"
#include "kernels/attention_prefill-inl.h"

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
#include <immintrin.h>
#endif

// The hardware instruction exists for the AVX-512 targets of x86; every
// function that may inline it carries the extra target attribute (GCC
// refuses to inline an intrinsic into a function without it). GCC 12 and
// clang 14 emit no AVX512-BF16 instruction of their own from plain code,
// so the model path compiled with the attribute runs on CPUs without it.
#undef SOFTDOT_UNITS_HW
#undef SOFTDOT_UNITS_ATTR
#if (HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL) && defined(__x86_64__)
#define SOFTDOT_UNITS_HW 1
#define SOFTDOT_UNITS_ATTR __attribute__((target(HWY_TARGET_STR ",avx512bf16")))
#else
#define SOFTDOT_UNITS_HW 0
#define SOFTDOT_UNITS_ATTR
#endif

// The model needs a fused multiply-add (FMA targets: AVX2, AVX-512, NEON).
#undef SOFTDOT_UNITS_MODEL
#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3 || \
    HWY_TARGET == HWY_AVX3_DL || HWY_TARGET == HWY_NEON
#define SOFTDOT_UNITS_MODEL 1
#else
#define SOFTDOT_UNITS_MODEL 0
#endif

HWY_BEFORE_NAMESPACE();
namespace softdot {
namespace HWY_NAMESPACE {

namespace attn {

#if SOFTDOT_UNITS_MODEL

using DU = hn::RebindToUnsigned<DF>;
using VU = hn::Vec<DU>;

// x with a zero exponent field (zero or a denormal) replaced by the zero
// of its sign: DAZ on an input, FTZ on a result.
HWY_INLINE VF FlushDenormal(VF x) {
  const DU du;
  const VU b = hn::BitCast(du, x);
  const VU expo = hn::And(b, hn::Set(du, 0x7F800000u));
  const VU sign = hn::And(b, hn::Set(du, 0x80000000u));
  return hn::BitCast(DF(), hn::IfThenElse(hn::Eq(expo, hn::Zero(du)), sign, b));
}

// The instruction's arithmetic in vector operations, lane by lane.
struct DotModel {
  static HWY_INLINE VF Dot(VF acc, VU a, VU b) {
    const DF df;
    const DU du;
    const VU hi = hn::Set(du, 0xFFFF0000u);
    const VF a1 = FlushDenormal(hn::BitCast(df, hn::And(a, hi)));
    const VF b1 = FlushDenormal(hn::BitCast(df, hn::And(b, hi)));
    const VF a0 = FlushDenormal(hn::BitCast(df, hn::ShiftLeft<16>(a)));
    const VF b0 = FlushDenormal(hn::BitCast(df, hn::ShiftLeft<16>(b)));
    acc = FlushDenormal(hn::MulAdd(a1, b1, FlushDenormal(acc)));
    return FlushDenormal(hn::MulAdd(a0, b0, acc));
  }
};

#if SOFTDOT_UNITS_HW
// VDPBF16PS itself.
struct DotHw {
  static HWY_INLINE SOFTDOT_UNITS_ATTR VF Dot(VF acc, VU a, VU b) {
    VF r;
    r.raw = _mm512_dpbf16_ps(acc.raw, (__m512bh)a.raw, (__m512bh)b.raw);
    return r;
  }
};
#endif

// The bfloat16 nearest to each float (round to nearest even), in the high
// half of its lane (low half zero). Finite inputs only matter: a NaN weight
// belongs to a row whose result is NaN whatever its products give.
HWY_INLINE VU RoundBf16High(VU u) {
  const DU du;
  const VU lsb = hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u));
  const VU r = hn::Add(u, hn::Add(hn::Set(du, 0x7FFFu), lsb));
  return hn::And(r, hn::Set(du, 0xFFFF0000u));
}

// The pairs of the query rows: qp[t][r] holds features 2t (low half) and
// 2t + 1 (high half) of row r in bfloat16 (the rows' floats are bfloat16
// values, so taking their high halves is exact); padding rows and a
// missing feature 2t + 1 (d odd) hold zeros.
SOFTDOT_UNITS_ATTR HWY_INLINE void PackQueryPairs(const AttnArgs& a,
                                                  std::uint32_t* qp,
                                                  std::size_t bq) {
  const std::size_t d = a.d, dp = (d + 1) / 2;
  for (std::size_t t = 0; t < dp; ++t) {
    std::uint32_t* dst = qp + t * bq;
    for (std::size_t r = 0; r < bq; ++r) {
      std::uint32_t lo = 0, hi = 0;
      if (r < a.rows) {
        std::memcpy(&lo, a.q_rows[r] + 2 * t, 4);
        if (2 * t + 1 < d) std::memcpy(&hi, a.q_rows[r] + 2 * t + 1, 4);
      }
      dst[r] = (lo >> 16) | (hi & 0xFFFF0000u);
    }
  }
}

// Scores of KT keys against NV vectors of rows, as ScoreTile
// (attention_prefill-inl.h) with bfloat16 pair products: krow[jj] is key
// jj's stored bfloat16 row.
template <class Dot, std::size_t NV, std::size_t KT>
SOFTDOT_UNITS_ATTR HWY_INLINE void ScoreTileUnits(
    const std::uint32_t* HWY_RESTRICT qp, std::size_t bq,
    const std::uint16_t* const* krow, std::size_t d, VF scale,
    float* HWY_RESTRICT s) {
  const DF df;
  const DU du;
  const std::size_t N = hn::Lanes(df);
  constexpr std::size_t kB = detail::kUnitsScoreBlock;
  for (std::size_t k0 = 0; k0 < d; k0 += kB) {
    const std::size_t k1 = std::min(d, k0 + kB);
    const std::size_t k1p = k0 + ((k1 - k0) & ~std::size_t{1});
    VF acc[KT][NV];
#pragma GCC unroll 16
    for (std::size_t jj = 0; jj < KT; ++jj) {
#pragma GCC unroll 4
      for (std::size_t v = 0; v < NV; ++v) acc[jj][v] = hn::Zero(df);
    }
    for (std::size_t k = k0; k < k1p; k += 2) {
      VU q[NV];
#pragma GCC unroll 4
      for (std::size_t v = 0; v < NV; ++v)
        q[v] = hn::Load(du, qp + (k / 2) * bq + v * N);
#pragma GCC unroll 16
      for (std::size_t jj = 0; jj < KT; ++jj) {
        std::uint32_t kk;
        std::memcpy(&kk, krow[jj] + k, 4);
        const VU kv = hn::Set(du, kk);
#pragma GCC unroll 4
        for (std::size_t v = 0; v < NV; ++v)
          acc[jj][v] = Dot::Dot(acc[jj][v], q[v], kv);
      }
    }
    if (k1p < k1) {  // d odd: the last feature, paired with zero
      VU q[NV];
#pragma GCC unroll 4
      for (std::size_t v = 0; v < NV; ++v)
        q[v] = hn::Load(du, qp + (k1p / 2) * bq + v * N);
#pragma GCC unroll 16
      for (std::size_t jj = 0; jj < KT; ++jj) {
        const VU kv = hn::Set(du, std::uint32_t{krow[jj][k1p]});
#pragma GCC unroll 4
        for (std::size_t v = 0; v < NV; ++v)
          acc[jj][v] = Dot::Dot(acc[jj][v], q[v], kv);
      }
    }
    AddBlockScores<NV, KT>(acc, bq, k0 == 0, k1 == d, scale, s);
  }
}

// The scores of the block's kb keys (tiles of KT keys, then single keys).
// The nb_next keys and values of the next block are prefetched into L2 a
// tile of KT at a time, spread over the tiles' products: with a few rows
// (decode on the units) the products no longer hide the memory's latency,
// and issued all at once the prefetches filled the line buffers and stalled
// (AMD EPYC Zen 4, 16 rows, n_kv = 32768: 4.6 GB/s without a prefetch, 5.4
// all at once, 5.6 spread).
template <class Dot, std::size_t NV>
SOFTDOT_UNITS_ATTR HWY_INLINE void PrefillScoresUnits(
    const AttnArgs& a, const Scratch& sc, std::size_t bq, std::size_t j0,
    std::size_t kb, std::size_t nb_next, VF scale) {
  constexpr std::size_t KT = kAccRegs / NV;
  const std::uint16_t* kr[KT];
  std::size_t j = 0;
  for (; j + KT <= kb; j += KT) {
    if (j < nb_next)
      PrefetchBlock<2>(a, j0 + kKeyTile + j, std::min(KT, nb_next - j));
    for (std::size_t jj = 0; jj < KT; ++jj)
      kr[jj] = static_cast<const std::uint16_t*>(KeyRow(a, j0 + j + jj));
    ScoreTileUnits<Dot, NV, KT>(sc.qp, bq, kr, a.d, scale, sc.s + j * bq);
  }
  if (j < nb_next) PrefetchBlock<2>(a, j0 + kKeyTile + j, nb_next - j);
  for (; j < kb; ++j) {
    kr[0] = static_cast<const std::uint16_t*>(KeyRow(a, j0 + j));
    ScoreTileUnits<Dot, NV, 1>(sc.qp, bq, kr, a.d, scale, sc.s + j * bq);
  }
}

// True when the block's kb stored bfloat16 values are all finite.
HWY_INLINE bool ValuesFiniteBf16(const AttnArgs& a, std::size_t j0,
                                 std::size_t kb) {
  for (std::size_t j = 0; j < kb; ++j) {
    const auto* v = static_cast<const std::uint16_t*>(ValueRow(a, j0 + j));
    std::uint32_t bad = 0;
    for (std::size_t c = 0; c < a.dv; ++c) {
      bad |= static_cast<std::uint32_t>((v[c] & 0x7F80u) == 0x7F80u);
    }
    if (bad != 0) return false;
  }
  return true;
}

// The weights of the block as bfloat16 pairs of keys: pp[t][r] holds keys
// 2t (low half) and 2t + 1 (high half) of row r, each P rounded to the
// nearest bfloat16; with split, pl holds the bfloat16 nearest to what the
// rounding left (P - hi, exact in float). A missing key 2t + 1 (kb odd)
// holds zeros.
template <std::size_t NV>
SOFTDOT_UNITS_ATTR HWY_INLINE void PackWeightPairs(const Scratch& sc,
                                                   std::size_t bq,
                                                   std::size_t kb, bool split) {
  const DF df;
  const DU du;
  const std::size_t N = hn::Lanes(df);
  const std::size_t kbp = (kb + 1) / 2;
  for (std::size_t t = 0; t < kbp; ++t) {
    const bool pair = 2 * t + 1 < kb;
    for (std::size_t v = 0; v < NV; ++v) {
      const VU u0 = hn::BitCast(du, hn::Load(df, sc.p + 2 * t * bq + v * N));
      const VU u1 =
          pair ? hn::BitCast(du, hn::Load(df, sc.p + (2 * t + 1) * bq + v * N))
               : hn::Zero(du);
      const VU h0 = RoundBf16High(u0), h1 = RoundBf16High(u1);
      hn::Store(hn::Or(hn::ShiftRight<16>(h0), h1), du, sc.pp + t * bq + v * N);
      if (split) {
        const VF l0 = hn::Sub(hn::BitCast(df, u0), hn::BitCast(df, h0));
        const VF l1 = hn::Sub(hn::BitCast(df, u1), hn::BitCast(df, h1));
        const VU g0 = RoundBf16High(hn::BitCast(du, l0));
        const VU g1 = RoundBf16High(hn::BitCast(du, l1));
        hn::Store(hn::Or(hn::ShiftRight<16>(g0), g1), du,
                  sc.pl + t * bq + v * N);
      }
    }
  }
}

// The block's values as bfloat16 pairs of keys: vp[t][c] holds value
// 2t's column c (low half) and value 2t + 1's (high half; zero when kb is
// odd and 2t + 1 = kb).
SOFTDOT_UNITS_ATTR HWY_INLINE void PackValuePairs(const AttnArgs& a,
                                                  std::uint32_t* vp,
                                                  std::size_t j0,
                                                  std::size_t kb) {
  const DU du;
  const hn::Rebind<std::uint16_t, DU> d16;
  const std::size_t N = hn::Lanes(du);
  const std::size_t dv = a.dv;
  const std::size_t kbp = (kb + 1) / 2;
  for (std::size_t t = 0; t < kbp; ++t) {
    const auto* v0 = static_cast<const std::uint16_t*>(ValueRow(a, j0 + 2 * t));
    const bool pair = 2 * t + 1 < kb;
    const auto* v1 =
        pair ? static_cast<const std::uint16_t*>(ValueRow(a, j0 + 2 * t + 1))
             : nullptr;
    std::uint32_t* dst = vp + t * dv;
    std::size_t c = 0;
    if (pair) {
      for (; c + N <= dv; c += N) {
        const VU lo = hn::PromoteTo(du, hn::LoadU(d16, v0 + c));
        const VU hi = hn::PromoteTo(du, hn::LoadU(d16, v1 + c));
        hn::StoreU(hn::Or(lo, hn::ShiftLeft<16>(hi)), du, dst + c);
      }
    }
    for (; c < dv; ++c) {
      dst[c] = std::uint32_t{v0[c]} |
               (pair ? std::uint32_t{v1[c]} << 16 : std::uint32_t{0});
    }
  }
}

// acc[c][r] = sum_j P[j][r] V[j][c0 + c] over the tile's kbp pairs of keys,
// one chain over the whole tile (kKeyTile keys, attention_args.h); split
// adds each pair's low weights right after its high ones.
template <class Dot, std::size_t NV, std::size_t CT, bool kSplit>
SOFTDOT_UNITS_ATTR HWY_INLINE void ValueTileUnits(
    const std::uint32_t* HWY_RESTRICT pp, const std::uint32_t* HWY_RESTRICT pl,
    std::size_t bq, const std::uint32_t* HWY_RESTRICT vp, std::size_t dv,
    std::size_t kbp, VF (&acc)[CT][NV]) {
  const DF df;
  const DU du;
  const std::size_t N = hn::Lanes(df);
#pragma GCC unroll 16
  for (std::size_t c = 0; c < CT; ++c) {
#pragma GCC unroll 4
    for (std::size_t v = 0; v < NV; ++v) acc[c][v] = hn::Zero(df);
  }
  for (std::size_t t = 0; t < kbp; ++t) {
    VU ph[NV], plo[NV];
#pragma GCC unroll 4
    for (std::size_t v = 0; v < NV; ++v) {
      ph[v] = hn::Load(du, pp + t * bq + v * N);
      if constexpr (kSplit) plo[v] = hn::Load(du, pl + t * bq + v * N);
    }
    const std::uint32_t* vrow = vp + t * dv;
#pragma GCC unroll 16
    for (std::size_t c = 0; c < CT; ++c) {
      const VU vv = hn::Set(du, vrow[c]);
#pragma GCC unroll 4
      for (std::size_t v = 0; v < NV; ++v) {
        acc[c][v] = Dot::Dot(acc[c][v], ph[v], vv);
        if constexpr (kSplit) acc[c][v] = Dot::Dot(acc[c][v], plo[v], vv);
      }
    }
  }
}

// O = alpha O + P V from the packed pairs, in tiles of CT columns, then
// single columns.
template <class Dot, std::size_t NV, bool kSplit>
SOFTDOT_UNITS_ATTR HWY_INLINE void PrefillValuesUnits(const Scratch& sc,
                                                      std::size_t bq,
                                                      std::size_t kb,
                                                      std::size_t dv) {
  constexpr std::size_t CT = kAccRegs / NV;
  const std::size_t kbp = (kb + 1) / 2;
  std::size_t c = 0;
  VF acc[CT][NV];
  for (; c + CT <= dv; c += CT) {
    ValueTileUnits<Dot, NV, CT, kSplit>(sc.pp, sc.pl, bq, sc.vp + c, dv, kbp,
                                        acc);
    for (std::size_t cc = 0; cc < CT; ++cc) {
      FlushColumn<NV>(acc[cc], sc.alpha, sc.od + (c + cc) * bq);
    }
  }
  for (; c < dv; ++c) {
    VF acc1[1][NV];
    ValueTileUnits<Dot, NV, 1, kSplit>(sc.pp, sc.pl, bq, sc.vp + c, dv, kbp,
                                       acc1);
    FlushColumn<NV>(acc1[0], sc.alpha, sc.od + c * bq);
  }
}

// The prefill form over NV vectors of rows with the products on the units
// (or their model): RunPrefill's steps, the products replaced.
template <class Dot, std::size_t NV>
SOFTDOT_UNITS_ATTR HWY_INLINE void PrefillUnitsBody(const AttnArgs& a) {
  const DF df;
  const std::size_t bq = NV * hn::Lanes(df);
  const Scratch sc = PrefillScratch(a, bq);
  const KeyLimits lim = PrefillPackRows(a, sc, bq, /*pack_q=*/false);
  PackQueryPairs(a, sc.qp, bq);
  const VF scale = hn::Set(df, a.scale);
  const std::size_t pf_end = std::max(a.j_end, a.prefetch_end);
  for (std::size_t j0 = a.j_begin; j0 < a.j_end; j0 += kKeyTile) {
    const std::size_t kb = std::min(kKeyTile, a.j_end - j0);
    const auto first = static_cast<std::int64_t>(j0);
    const auto last = static_cast<std::int64_t>(j0 + kb - 1);
    if (last < lim.first_min || first > lim.last_max) continue;
    const bool straddles = first < lim.first_max || last > lim.last_min;
    // The next tile (the last tile's: the next chunk's first).
    const std::size_t nb_next =
        j0 + kKeyTile < pf_end ? std::min(kKeyTile, pf_end - j0 - kKeyTile) : 0;
    PrefillScoresUnits<Dot, NV>(a, sc, bq, j0, kb, nb_next, scale);
    BlockExtremes<NV> ex;
    PrefillMaskScores<NV>(a, sc, bq, j0, kb, straddles, ex);
    const bool any_masked = PrefillSoftmaxStep<NV>(sc, bq, kb, false, ex);
    if (any_masked && !ValuesFiniteBf16(a, j0, kb)) {
      const BlockRows kv = LoadBlock(a, j0, kb, sc.kc, sc.vc);
      PrefillValues<NV>(sc, bq, kv, kb, a.dv, true);
      continue;
    }
    PackWeightPairs<NV>(sc, bq, kb, a.pv_split);
    PackValuePairs(a, sc.vp, j0, kb);
    if (a.pv_split) {
      PrefillValuesUnits<Dot, NV, true>(sc, bq, kb, a.dv);
    } else {
      PrefillValuesUnits<Dot, NV, false>(sc, bq, kb, a.dv);
    }
  }
  PrefillStoreStates(a, sc, bq);
}

template <std::size_t NV>
SOFTDOT_UNITS_ATTR HWY_NOINLINE void RunPrefillUnitsModel(const AttnArgs& a) {
  PrefillUnitsBody<DotModel, NV>(a);
}

#if SOFTDOT_UNITS_HW
template <std::size_t NV>
SOFTDOT_UNITS_ATTR HWY_NOINLINE void RunPrefillUnitsHw(const AttnArgs& a) {
  PrefillUnitsBody<DotHw, NV>(a);
}
#endif

#endif  // SOFTDOT_UNITS_MODEL

#if SOFTDOT_UNITS_MODEL
// acc[i] = the instruction's lane i on (acc[i], a[i], b[i]) for i < n, with
// the model (hw false) or, where compiled in, the instruction (tests).
SOFTDOT_UNITS_ATTR HWY_NOINLINE void UnitsDotLanes(float* acc,
                                                   const std::uint32_t* a,
                                                   const std::uint32_t* b,
                                                   std::size_t n, bool hw) {
  const DF df;
  const DU du;
  const std::size_t N = hn::Lanes(df);
  HWY_ALIGN float t_acc[hn::MaxLanes(DF())];
  HWY_ALIGN std::uint32_t t_a[hn::MaxLanes(DF())], t_b[hn::MaxLanes(DF())];
  for (std::size_t i = 0; i < n; i += N) {
    const std::size_t m = std::min(N, n - i);
    for (std::size_t t = 0; t < N; ++t) {
      t_acc[t] = t < m ? acc[i + t] : 0.0f;
      t_a[t] = t < m ? a[i + t] : 0u;
      t_b[t] = t < m ? b[i + t] : 0u;
    }
    const VF x = hn::Load(df, t_acc);
    const VU va = hn::Load(du, t_a), vb = hn::Load(du, t_b);
#if SOFTDOT_UNITS_HW
    const VF r = hw ? DotHw::Dot(x, va, vb) : DotModel::Dot(x, va, vb);
#else
    (void)hw;
    const VF r = DotModel::Dot(x, va, vb);
#endif
    hn::Store(r, df, t_acc);
    std::memcpy(acc + i, t_acc, m * sizeof(float));
  }
}
#endif

// Which units this target can run (detail::kUnits* bits; the hardware bit
// still needs the CPU's flag, which the caller checks).
HWY_INLINE unsigned UnitsCompiled() {
  unsigned u = 0;
#if SOFTDOT_UNITS_MODEL
  u |= detail::kUnitsModel;
#endif
#if SOFTDOT_UNITS_HW
  u |= detail::kUnitsAvx512Bf16;
#endif
  return u;
}

// The prefill form on the units a.units names (the model where the
// hardware is not compiled in; the float path where neither is).
template <std::size_t NV>
HWY_INLINE void RunPrefillUnits(const AttnArgs& a) {
#if SOFTDOT_UNITS_HW
  if (a.units == detail::kUnitsAvx512Bf16) {
    RunPrefillUnitsHw<NV>(a);
    return;
  }
#endif
#if SOFTDOT_UNITS_MODEL
  RunPrefillUnitsModel<NV>(a);
#else
  RunPrefill<NV>(a);
#endif
}

}  // namespace attn
}  // namespace HWY_NAMESPACE
}  // namespace softdot
HWY_AFTER_NAMESPACE();

#endif  // SOFTDOT_KERNELS_ATTENTION_UNITS_INL_H_
