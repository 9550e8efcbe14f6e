// softdot kernels: the decode form on the CPU's bfloat16 dot-product units
// (features in lanes; fewer than kUnitsDecodeMinRows = 12 rows of a KV
// head: decode and short verification rows; src/kernels/attention-inl.h has
// the overview). Queries, keys and values are bfloat16, d and d_v multiples
// of 32. Q K^T and P V are VDPBF16PS products or their model
// (attention_units-inl.h: DotHw, DotModel, the same bits): 32 products per
// instruction where the float decode form's FMA takes 16, and no widening
// (a key row's bfloat16 pairs are the instruction's operand as loaded).
// At 4 rows per KV head and d = 128 a key costs 32 instructions, 16 for
// the scores and 16 for P V (AMD Zen 4 issues one 512-bit VDPBF16PS per
// cycle, as one 512-bit FMA).
//
// Where the bits come from (tests/unit/attention_units_test.cc checks the
// instruction against the model bit for bit, the model's bits on every FMA
// target, and the bound of attention.h's "16-bit attention"):
// - a score: 8 logical lanes, lane i a chain of pair steps over features
//   (16 c + 2 i, 16 c + 2 i + 1) for c = 0, 1, ... (odd feature first, as
//   the instruction takes them), then UnitsTree8's fixed tree (the tiles
//   fold 16 or 4 scores at once with the same bits): 2 d / 16 + 3
//   roundings (19 at d = 128, within the units' 35); then the decode form's
//   softmax step (scale, cap, bias, mask, max, exp); the block sums of the
//   unrounded weights in double, in UnitsBlockSum's fixed order (not a chain
//   in key order);
// - P V: each weight rounded once to the nearest bfloat16 (or split into a
//   bfloat16 high part and the bfloat16 nearest to the rest), key j of a
//   64-key block paired with key j + 32 (a missing partner: weight and value
//   zero), one chain over the block's 32 pairs for each output element,
//   key j + 32's product first (the high half), then key j's, with split
//   each pair's low parts right after its high parts (64 roundings per
//   term, 128 split: the units' own); the block's chain enters the double
//   accumulator as in the decode form (O = alpha O + chain).
// A block with a masked score and a value that is not finite runs the float
// decode form's guarded P V, as the units' prefill form does.
//
// The pairs of values are made in registers: the per-128-bit interleave of
// two value rows (InterleaveLower / Upper on 16-bit lanes) gives each
// 32-bit lane (value j, value j + 32) of one column, with the columns in
// the interleave's order, put back in order when a block's chains are
// flushed (UnitsPairColumns).

#if defined(SOFTDOT_KERNELS_ATTENTION_DECODE_UNITS_INL_H_) == \
    defined(HWY_TARGET_TOGGLE)
#ifdef SOFTDOT_KERNELS_ATTENTION_DECODE_UNITS_INL_H_
#undef SOFTDOT_KERNELS_ATTENTION_DECODE_UNITS_INL_H_
#else
#define SOFTDOT_KERNELS_ATTENTION_DECODE_UNITS_INL_H_
#endif

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/attention_common-inl.h"
#include "kernels/attention_decode-inl.h"
#include "kernels/attention_decode_scores-inl.h"
#include "kernels/attention_kv-inl.h"
#include "kernels/attention_units-inl.h"
#include "kernels/reduce-inl.h"

HWY_BEFORE_NAMESPACE();
namespace softdot {
namespace HWY_NAMESPACE {

namespace attn {

#if SOFTDOT_UNITS_MODEL

// Keys of a 64-key block paired in P V: key j with key j + kUnitsPairOffset.
inline constexpr std::size_t kUnitsPairOffset = kKeyTile / 2;

// Scores: 8 logical lanes per score, lane i a chain of pair steps over
// features (16 c + 2 i, 16 c + 2 i + 1) for c = 0, 1, ..., then
// UnitsTree8. A vector holds kRowsPerVec rows' lanes for one key (AVX-512:
// two rows, the key's 8 pairs loaded once into both halves) and a score
// spans kVecsPerScore vectors (128-bit targets: two).
inline constexpr std::size_t kScoreLanes = 8;
inline constexpr std::size_t kRowsPerVec =
    hn::MaxLanes(DF()) >= kScoreLanes ? hn::MaxLanes(DF()) / kScoreLanes : 1;
inline constexpr std::size_t kVecsPerScore =
    hn::MaxLanes(DF()) >= kScoreLanes ? 1 : kScoreLanes / hn::MaxLanes(DF());

// The tree of one score's 8 lanes: ((l0 + l4) + (l2 + l6)) + ((l1 + l5) +
// (l3 + l7)), as the tiles fold it.
HWY_INLINE float UnitsTree8(const float* l) {
  return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

// The query rows as the tiles read them: group g (kRowsPerVec rows, a
// missing row zero), feature step c, at qq + (g csteps + c) N kVecsPerScore:
// each row's pairs c 8 .. c 8 + 7 (features 16 c .. 16 c + 15), rows one
// after another. The rows' floats are bfloat16 values, so their high halves
// are exact.
HWY_INLINE void PackUnitsQuery(const AttnArgs& a, std::uint32_t* qq) {
  const std::size_t csteps = a.d / 16;
  const std::size_t groups = (a.rows + kRowsPerVec - 1) / kRowsPerVec;
  for (std::size_t g = 0; g < groups; ++g) {
    for (std::size_t c = 0; c < csteps; ++c) {
      std::uint32_t* dst = qq + (g * csteps + c) * kRowsPerVec * kScoreLanes;
      for (std::size_t h = 0; h < kRowsPerVec; ++h) {
        const std::size_t r = g * kRowsPerVec + h;
        for (std::size_t i = 0; i < kScoreLanes; ++i) {
          std::uint32_t lo = 0, hi = 0;
          if (r < a.rows) {
            std::memcpy(&lo, a.q_rows[r] + 16 * c + 2 * i, 4);
            std::memcpy(&hi, a.q_rows[r] + 16 * c + 2 * i + 1, 4);
          }
          dst[h * kScoreLanes + i] = (lo >> 16) | (hi & 0xFFFF0000u);
        }
      }
    }
  }
}

// Key pairs c 8 .. c 8 + 7 of a row as the tiles' other operand: in both
// halves of a 512-bit vector, or spread over kVecsPerScore vectors.
HWY_INLINE VU LoadKeyPairs(const std::uint32_t* p, std::size_t w) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  (void)w;
  return VU{_mm512_broadcast_i64x4(
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))};
#else
  return hn::LoadU(DU(), p + w * hn::Lanes(DU()));
#endif
}

// The scores of RG groups of rows (g0 on) x KC keys, each written to
// out[r out_stride + k] for the rows that exist (r < rows).
template <class Dot, std::size_t RG, std::size_t KC>
SOFTDOT_UNITS_ATTR HWY_INLINE void DecodeUnitsScoreTile(
    const std::uint32_t* HWY_RESTRICT qq, std::size_t csteps, std::size_t g0,
    std::size_t rows, const hwy::bfloat16_t* const* krows, float* out,
    std::size_t out_stride) {
  const DF df;
  const DU du;
  const std::size_t N = hn::Lanes(df);
  constexpr std::size_t W = kVecsPerScore;
  VF acc[RG * KC][W];
#pragma GCC unroll 16
  for (std::size_t p = 0; p < RG * KC; ++p) {
#pragma GCC unroll 2
    for (std::size_t w = 0; w < W; ++w) acc[p][w] = hn::Zero(df);
  }
  for (std::size_t c = 0; c < csteps; ++c) {
    VU kv[KC][W];
#pragma GCC unroll 8
    for (std::size_t k = 0; k < KC; ++k) {
      const auto* kr =
          reinterpret_cast<const std::uint32_t*>(krows[k] + 16 * c);
#pragma GCC unroll 2
      for (std::size_t w = 0; w < W; ++w) kv[k][w] = LoadKeyPairs(kr, w);
    }
#pragma GCC unroll 4
    for (std::size_t g = 0; g < RG; ++g) {
#pragma GCC unroll 2
      for (std::size_t w = 0; w < W; ++w) {
        const VU qv =
            hn::Load(du, qq + ((g0 + g) * csteps + c) * N * W + w * N);
#pragma GCC unroll 8
        for (std::size_t k = 0; k < KC; ++k) {
          acc[g * KC + k][w] = Dot::Dot(acc[g * KC + k][w], qv, kv[k][w]);
        }
      }
    }
  }
  auto put = [&](std::size_t a, std::size_t h, float v) {
    const std::size_t r = (g0 + a / KC) * kRowsPerVec + h;
    if (r < rows) out[(r - g0 * kRowsPerVec) * out_stride + a % KC] = v;
  };
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  if constexpr (RG * KC == 8) {
    // Eight vectors of two scores: 128-bit blocks added (lanes i, i + 4),
    // then 64-bit halves (i, i + 2), then lanes. Lane 4 b + m of the result
    // is block b of Z_m: half b & 1 of accumulator 2 m + (b >> 1).
    VF z[4];
#pragma GCC unroll 4
    for (std::size_t m = 0; m < 4; ++m) {
      const __m512 x = acc[2 * m][0].raw, y = acc[2 * m + 1][0].raw;
      z[m] = VF{
          _mm512_add_ps(_mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(2, 0, 2, 0)),
                        _mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(3, 1, 3, 1)))};
    }
    __m512 w2[2];
#pragma GCC unroll 2
    for (std::size_t n = 0; n < 2; ++n) {
      const __m512d x = _mm512_castps_pd(z[2 * n].raw);
      const __m512d y = _mm512_castps_pd(z[2 * n + 1].raw);
      w2[n] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                            _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
    const __m512 fin =
        _mm512_add_ps(_mm512_shuffle_ps(w2[0], w2[1], _MM_SHUFFLE(2, 0, 2, 0)),
                      _mm512_shuffle_ps(w2[0], w2[1], _MM_SHUFFLE(3, 1, 3, 1)));
    HWY_ALIGN float lanes[16];
    _mm512_storeu_ps(lanes, fin);
#pragma GCC unroll 4
    for (std::size_t b = 0; b < 4; ++b) {
#pragma GCC unroll 4
      for (std::size_t m = 0; m < 4; ++m) {
        put(2 * m + (b >> 1), b & 1, lanes[4 * b + m]);
      }
    }
    return;
  }
#elif HWY_TARGET == HWY_AVX2
  if constexpr (RG * KC == 4) {
    // Four vectors of one score: halves (i, i + 4), 64-bit pieces (i, i + 2),
    // lanes; score p ends in lane 2 p.
    const VF v0 = hn::Add(hn::ConcatLowerLower(df, acc[2][0], acc[0][0]),
                          hn::ConcatUpperUpper(df, acc[2][0], acc[0][0]));
    const VF v1 = hn::Add(hn::ConcatLowerLower(df, acc[3][0], acc[1][0]),
                          hn::ConcatUpperUpper(df, acc[3][0], acc[1][0]));
    const hn::Repartition<double, DF> dd;
    const VF w =
        hn::Add(hn::BitCast(df, hn::InterleaveLower(dd, hn::BitCast(dd, v0),
                                                    hn::BitCast(dd, v1))),
                hn::BitCast(df, hn::InterleaveUpper(dd, hn::BitCast(dd, v0),
                                                    hn::BitCast(dd, v1))));
    HWY_ALIGN float lanes[8];
    hn::Store(hn::Add(w, hn::Shuffle2301(w)), df, lanes);
#pragma GCC unroll 4
    for (std::size_t p = 0; p < 4; ++p) put(p, 0, lanes[2 * p]);
    return;
  }
#endif
  // One tree per score.
  HWY_ALIGN float lanes[kScoreLanes * kRowsPerVec];
  for (std::size_t p = 0; p < RG * KC; ++p) {
    for (std::size_t w = 0; w < W; ++w) hn::Store(acc[p][w], df, lanes + w * N);
    for (std::size_t h = 0; h < kRowsPerVec; ++h) {
      put(p, h, UnitsTree8(lanes + h * kScoreLanes));
    }
  }
}

// The scores of every row against the block's kb keys, in tiles of RG
// groups of rows x KC keys (8 vectors of accumulators on AVX-512, 4 on
// AVX2), the keys left one at a time; the block sc.pf_ahead keys ahead
// prefetched (nb_next keys) during the first group of rows.
template <class Dot>
SOFTDOT_UNITS_ATTR HWY_INLINE void DecodeUnitsScores(
    const AttnArgs& a, const DecodeScratch& sc,
    const std::uint32_t* HWY_RESTRICT qq, const DecodeRows<hwy::bfloat16_t>& kv,
    std::size_t j0, std::size_t kb, std::size_t nb_next) {
  constexpr std::size_t B = kKeyTile;
  const std::size_t csteps = a.d / 16, rows = a.rows;
  const std::size_t groups = (rows + kRowsPerVec - 1) / kRowsPerVec;
  float* S = sc.S;
  bool first_group = true;
  auto tiles = [&](auto rg, auto kc, std::size_t g) SOFTDOT_UNITS_ATTR {
    constexpr std::size_t RG = decltype(rg)::value, KC = decltype(kc)::value;
    float* Sg = S + g * kRowsPerVec * B;
    std::size_t j = 0;
    for (; j + KC <= kb; j += KC) {
      if (first_group && j < nb_next) {
        PrefetchBlock<2>(a, j0 + sc.pf_ahead + j, std::min(KC, nb_next - j));
      }
      DecodeUnitsScoreTile<Dot, RG, KC>(qq, csteps, g, rows, kv.k + j, Sg + j,
                                        B);
    }
    if (first_group && j < nb_next) {
      PrefetchBlock<2>(a, j0 + sc.pf_ahead + j, nb_next - j);
    }
    for (; j < kb; ++j) {
      DecodeUnitsScoreTile<Dot, RG, 1>(qq, csteps, g, rows, kv.k + j, Sg + j,
                                       B);
    }
    first_group = false;
  };
  using C1 = std::integral_constant<std::size_t, 1>;
  using C2 = std::integral_constant<std::size_t, 2>;
  using C4 = std::integral_constant<std::size_t, 4>;
  std::size_t g = 0;
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  using C8 = std::integral_constant<std::size_t, 8>;
  for (; g + 2 <= groups; g += 2) tiles(C2(), C4(), g);
  for (; g < groups; ++g) tiles(C1(), C8(), g);
#elif HWY_TARGET == HWY_AVX2
  for (; g + 2 <= groups; g += 2) tiles(C2(), C2(), g);
  for (; g < groups; ++g) tiles(C1(), C4(), g);
#else
  (void)sizeof(C2), (void)sizeof(C4);
  for (; g < groups; ++g) tiles(C1(), C1(), g);
#endif
}

// The chains of one block's P V for columns c0 .. c0 + ST 2N - 1 of rows
// r0 .. r0 + RT - 1 (N float lanes): acc[r][s][0] holds the columns the
// interleave puts in the low halves (UnitsPairColumns has the order),
// acc[r][s][1] the high halves. pp (pl: split's low parts): row r's 32
// weight pairs at pp + r * 32; v0[t], v1[t]: the value rows of pair t.
template <class Dot, std::size_t RT, std::size_t ST, bool kSplit>
SOFTDOT_UNITS_ATTR HWY_INLINE void DecodeUnitsValueTile(
    const std::uint32_t* HWY_RESTRICT pp, const std::uint32_t* HWY_RESTRICT pl,
    std::size_t r0, const std::uint16_t* const* v0,
    const std::uint16_t* const* v1, std::size_t c0, VF (&acc)[RT][ST][2]) {
  const DF df;
  const DU du;
  const hn::Repartition<std::uint16_t, DU> d16;
  const std::size_t N2 = hn::Lanes(d16);
#pragma GCC unroll 4
  for (std::size_t r = 0; r < RT; ++r) {
#pragma GCC unroll 4
    for (std::size_t s = 0; s < ST; ++s) {
      acc[r][s][0] = hn::Zero(df);
      acc[r][s][1] = hn::Zero(df);
    }
  }
  for (std::size_t t = 0; t < kUnitsPairOffset; ++t) {
    VU lo[ST], hi[ST];
#pragma GCC unroll 4
    for (std::size_t s = 0; s < ST; ++s) {
      const auto x = hn::LoadU(d16, v0[t] + c0 + s * N2);
      const auto y = hn::LoadU(d16, v1[t] + c0 + s * N2);
      lo[s] = hn::BitCast(du, hn::InterleaveLower(d16, x, y));
      hi[s] = hn::BitCast(du, hn::InterleaveUpper(d16, x, y));
    }
#pragma GCC unroll 4
    for (std::size_t r = 0; r < RT; ++r) {
      const VU p = hn::Set(du, pp[(r0 + r) * kUnitsPairOffset + t]);
#pragma GCC unroll 4
      for (std::size_t s = 0; s < ST; ++s) {
        acc[r][s][0] = Dot::Dot(acc[r][s][0], p, lo[s]);
        acc[r][s][1] = Dot::Dot(acc[r][s][1], p, hi[s]);
      }
      if constexpr (kSplit) {
        const VU q = hn::Set(du, pl[(r0 + r) * kUnitsPairOffset + t]);
#pragma GCC unroll 4
        for (std::size_t s = 0; s < ST; ++s) {
          acc[r][s][0] = Dot::Dot(acc[r][s][0], q, lo[s]);
          acc[r][s][1] = Dot::Dot(acc[r][s][1], q, hi[s]);
        }
      }
    }
  }
}

// The columns of an interleaved pair of chains in order: InterleaveLower
// and Upper work within 128-bit blocks, so block b of lo holds columns
// 8 b .. 8 b + 3 of the 2N and block b of hi columns 8 b + 4 .. 8 b + 7.
// n0 receives columns 0 .. N - 1, n1 columns N .. 2N - 1.
HWY_INLINE void UnitsPairColumns(VF lo, VF hi, VF& n0, VF& n1) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  const __m512i i0 =
      _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i i1 = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14,
                                       15, 28, 29, 30, 31);
  n0 = VF{_mm512_permutex2var_ps(lo.raw, i0, hi.raw)};
  n1 = VF{_mm512_permutex2var_ps(lo.raw, i1, hi.raw)};
#elif HWY_TARGET == HWY_AVX2
  const DF df;
  n0 = hn::ConcatLowerLower(df, hi, lo);
  n1 = hn::ConcatUpperUpper(df, hi, lo);
#else
  static_assert(hn::MaxLanes(DF()) == 4, "one 128-bit block per vector");
  n0 = lo;
  n1 = hi;
#endif
}

// The block's O = alpha O + P V on the units, for every row.
template <class Dot, bool kSplit>
SOFTDOT_UNITS_ATTR HWY_INLINE void DecodeUnitsValues(
    const DecodeScratch& sc, std::uint32_t* pp, std::uint32_t* pl,
    const std::uint16_t* zrow, const DecodeRows<hwy::bfloat16_t>& kv,
    std::size_t rows, std::size_t dv, std::size_t kb, const double* alpha) {
  const DF df;
  const DU du;
  const std::size_t N = hn::Lanes(df);
  constexpr std::size_t B = kKeyTile, H = kUnitsPairOffset;
  // The weights in pairs (key j low, key j + 32 high), rounded.
  for (std::size_t r = 0; r < rows; ++r) {
    const float* pr = sc.P + r * B;  // zero past kb (DecodeUnitsBody)
    for (std::size_t t = 0; t < H; t += N) {
      const VU u0 = hn::BitCast(du, hn::Load(df, pr + t));
      const VU u1 = hn::BitCast(du, hn::Load(df, pr + H + t));
      const VU h0 = RoundBf16High(u0), h1 = RoundBf16High(u1);
      hn::Store(hn::Or(hn::ShiftRight<16>(h0), h1), du, pp + r * H + t);
      if constexpr (kSplit) {
        const VF l0 = hn::Sub(hn::BitCast(df, u0), hn::BitCast(df, h0));
        const VF l1 = hn::Sub(hn::BitCast(df, u1), hn::BitCast(df, h1));
        const VU g0 = RoundBf16High(hn::BitCast(du, l0));
        const VU g1 = RoundBf16High(hn::BitCast(du, l1));
        hn::Store(hn::Or(hn::ShiftRight<16>(g0), g1), du, pl + r * H + t);
      }
    }
  }
  const std::uint16_t* v0[H];
  const std::uint16_t* v1[H];
  for (std::size_t t = 0; t < H; ++t) {
    v0[t] = t < kb ? reinterpret_cast<const std::uint16_t*>(kv.v[t]) : zrow;
    v1[t] =
        t + H < kb ? reinterpret_cast<const std::uint16_t*>(kv.v[t + H]) : zrow;
  }
  HWY_ALIGN double alpha_lanes[detail::kDecodeMaxRows][hn::MaxLanes(DF())];
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t i = 0; i < N; ++i) alpha_lanes[r][i] = alpha[r];
  }
  auto tile = [&](auto rt, auto st, std::size_t r0,
                  std::size_t c0) SOFTDOT_UNITS_ATTR {
    constexpr std::size_t RT = decltype(rt)::value, ST = decltype(st)::value;
    VF acc[RT][ST][2];
    DecodeUnitsValueTile<Dot, RT, ST, kSplit>(pp, pl, r0, v0, v1, c0, acc);
#pragma GCC unroll 4
    for (std::size_t r = 0; r < RT; ++r) {
#pragma GCC unroll 4
      for (std::size_t s = 0; s < ST; ++s) {
        VF n0, n1;
        UnitsPairColumns(acc[r][s][0], acc[r][s][1], n0, n1);
        double* o = sc.od + (r0 + r) * dv + c0 + s * 2 * N;
        FlushVector(n0, alpha_lanes[r0 + r], o);
        FlushVector(n1, alpha_lanes[r0 + r], o + N);
      }
    }
  };
  auto columns = [&](auto rt, std::size_t r0) SOFTDOT_UNITS_ATTR {
    using C1 = std::integral_constant<std::size_t, 1>;
    using C2 = std::integral_constant<std::size_t, 2>;
    std::size_t c = 0;
    for (; c + 4 * N <= dv; c += 4 * N) tile(rt, C2(), r0, c);
    for (; c < dv; c += 2 * N) tile(rt, C1(), r0, c);
  };
#if HWY_TARGET == HWY_AVX2
  constexpr std::size_t kRowTile = 2;
#else
  constexpr std::size_t kRowTile = 4;
#endif
  std::size_t r = 0;
  for (; r + kRowTile <= rows; r += kRowTile) {
    columns(std::integral_constant<std::size_t, kRowTile>(), r);
  }
  for (; r + 2 <= rows; r += 2) {
    columns(std::integral_constant<std::size_t, 2>(), r);
  }
  for (; r < rows; ++r) columns(std::integral_constant<std::size_t, 1>(), r);
}

// The sum of one row's 64 weights of a block (zero past the block's keys)
// in double, in one order on every target: the 8 logical lanes i = 0..7
// each take keys i + 8 m as ((m0 + m1) + (m2 + m3)) + ((m4 + m5) + (m6 +
// m7)), then lanes i and i + 4 are added, then i and i + 2, then the two
// left. 7 vector additions per row where a chain in key order waited on 64
// dependent ones (the float decode form's DecodeBlockSums).
HWY_INLINE double UnitsBlockSum(const float* HWY_RESTRICT p) {
  const DD dd;
  const hn::Rebind<float, DD> dh;
  const std::size_t ND = hn::Lanes(dd);
  constexpr std::size_t kL = 8;
  static_assert(hn::MaxLanes(DD()) <= kL, "at most 8 double lanes");
  HWY_ALIGN double t[kL];
  for (std::size_t k = 0; k < kL; k += ND) {
    VD v[8];
#pragma GCC unroll 8
    for (std::size_t m = 0; m < 8; ++m) {
      v[m] = hn::PromoteTo(dd, hn::LoadU(dh, p + kL * m + k));
    }
    const VD a = hn::Add(hn::Add(v[0], v[1]), hn::Add(v[2], v[3]));
    const VD b = hn::Add(hn::Add(v[4], v[5]), hn::Add(v[6], v[7]));
    hn::Store(hn::Add(a, b), dd, t + k);
  }
  const double u0 = t[0] + t[4], u1 = t[1] + t[5], u2 = t[2] + t[6],
               u3 = t[3] + t[7];
  return (u0 + u2) + (u1 + u3);
}

// True when the kb bfloat16 value rows of dv elements hold no inf or NaN.
HWY_INLINE bool FiniteRowsBf16(const hwy::bfloat16_t* const* v, std::size_t kb,
                               std::size_t dv) {
  for (std::size_t j = 0; j < kb; ++j) {
    const auto* x = reinterpret_cast<const std::uint16_t*>(v[j]);
    std::uint32_t bad = 0;
    for (std::size_t c = 0; c < dv; ++c) {
      bad |= static_cast<std::uint32_t>((x[c] & 0x7F80u) == 0x7F80u);
    }
    if (bad != 0) return false;
  }
  return true;
}

// The decode form on the units (or their model) for one KV head's call:
// RunDecodeT's blocks with the products replaced, one block at a time
// (Block), so that RunDecodeUnitsHeads can run several KV heads' calls
// block by block. Needs bfloat16 K and V and decode_units_fit
// (attention_args.h).
template <class Dot>
struct DecodeUnitsRun {
  const AttnArgs* a = nullptr;
  DecodeScratch sc;
  std::uint32_t* qq = nullptr;    // the query rows as the score tiles read them
  std::uint32_t* pp = nullptr;    // the weights' pairs
  std::uint32_t* pl = nullptr;    // split's low parts
  std::uint16_t* zrow = nullptr;  // a row of zero values
  DecodeRows<hwy::bfloat16_t> kvr;
  DecodeRowStates st;
  std::int32_t first_min = 0, last_max = 0;
  std::size_t pf_end = 0;

  // heads: how many calls run block by block (the prefetch distance is
  // shared between them).
  SOFTDOT_UNITS_ATTR HWY_INLINE void Init(const AttnArgs& args,
                                          std::size_t heads) {
    constexpr std::size_t B = kKeyTile, H = kUnitsPairOffset;
    a = &args;
    const std::size_t rows = args.rows;
    sc = DecodeSetUp(args, /*widen=*/true);
    sc.pf_ahead = std::max(B, sc.pf_ahead / B / heads * B);
    // Over the float copy of the rows and the key widening's room (neither
    // used here).
    qq = reinterpret_cast<std::uint32_t*>(sc.qp);
    PackUnitsQuery(args, qq);
    pp = reinterpret_cast<std::uint32_t*>(sc.kc);
    pl = pp + rows * H;
    zrow = reinterpret_cast<std::uint16_t*>(pl + rows * H);
    std::memset(zrow, 0, args.dv * sizeof(std::uint16_t));
    std::fill(kvr.ks, kvr.ks + B, 0.0f);
    std::fill(kvr.vs, kvr.vs + B, 0.0f);
    first_min = std::numeric_limits<std::int32_t>::max();
    last_max = std::numeric_limits<std::int32_t>::min();
    for (std::size_t r = 0; r < rows; ++r) {
      first_min = std::min(first_min, args.first_key[r]);
      last_max = std::max(last_max, args.last_key[r]);
      InitialState(args.sinks, r, st.m[r], st.l[r], st.nan[r]);
    }
    pf_end = std::max(args.j_end, args.prefetch_end);
  }

  // The block of keys j0 .. (a block of the call's range).
  SOFTDOT_UNITS_ATTR HWY_INLINE void Block(std::size_t j0) {
    constexpr std::size_t B = kKeyTile;
    const std::size_t rows = a->rows, d = a->d, dv = a->dv;
    const std::size_t kb = std::min(B, a->j_end - j0);
    const auto first = static_cast<std::int64_t>(j0);
    const auto last = static_cast<std::int64_t>(j0 + kb - 1);
    if (last < first_min || first > last_max) return;
    const std::size_t nb_next =
        j0 + sc.pf_ahead < pf_end ? std::min(B, pf_end - j0 - sc.pf_ahead) : 0;
    FillDecodeRows(*a, j0, kb, kvr);
    DecodeUnitsScores<Dot>(*a, sc, qq, kvr, j0, kb, nb_next);
    double alpha[detail::kDecodeMaxRows];
    const bool any_masked = DecodeSoftmaxStep(*a, sc, j0, kb, st, alpha);
    for (std::size_t r = 0; r < rows; ++r) {
      float* pr = sc.P + r * B;
      for (std::size_t j = kb; j < B; ++j) pr[j] = 0.0f;
      st.l[r] = std::fma(st.l[r], alpha[r], UnitsBlockSum(pr));
    }
    if (any_masked && !FiniteRowsBf16(kvr.v, kb, dv)) {
      DecodeRows<float> vf;
      WidenDecodeRows(kvr, kb, d, dv, nullptr, sc.vc, false, vf);
      DecodeBlockValues(sc, rows, dv, kb, vf, true, alpha);
    } else if (a->pv_split) {
      DecodeUnitsValues<Dot, true>(sc, pp, pl, zrow, kvr, rows, dv, kb, alpha);
    } else {
      DecodeUnitsValues<Dot, false>(sc, pp, pl, zrow, kvr, rows, dv, kb, alpha);
    }
  }

  HWY_INLINE void Finish() const {
    const std::size_t dv = a->dv;
    for (std::size_t r = 0; r < a->rows; ++r) {
      a->out_m[r] = st.m[r];
      a->out_l[r] =
          st.nan[r] ? std::numeric_limits<double>::quiet_NaN() : st.l[r];
      std::memcpy(a->out_o + r * dv, sc.od + r * dv, dv * sizeof(double));
    }
  }
};

// n calls (at most kDecodeHeadGroup: KV heads of one chunk, the same key
// range) block by block: each block's keys of every head before the next
// block's, so that a page whose rows interleave the heads (vLLM's NHD
// layout) is read in order, once. Each call's bits are its own call's.
template <class Dot>
SOFTDOT_UNITS_ATTR HWY_NOINLINE void RunDecodeUnitsWith(const AttnArgs* a,
                                                        std::size_t n) {
  DecodeUnitsRun<Dot> run[detail::kDecodeHeadGroup];
  for (std::size_t h = 0; h < n; ++h) run[h].Init(a[h], n);
  for (std::size_t j0 = a[0].j_begin; j0 < a[0].j_end; j0 += kKeyTile) {
    for (std::size_t h = 0; h < n; ++h) run[h].Block(j0);
  }
  for (std::size_t h = 0; h < n; ++h) run[h].Finish();
}

#endif  // SOFTDOT_UNITS_MODEL

// The decode form on the units a[0].units names (the model where the
// hardware is not compiled in) for n calls of one chunk (n KV heads, at most
// kDecodeHeadGroup); the float decode form, call by call, where neither is
// or the shape does not fit (the schedule sends only shapes that fit).
HWY_INLINE void RunDecodeUnits(const AttnArgs* a, std::size_t n) {
#if SOFTDOT_UNITS_MODEL
  if (a[0].kv_type == detail::kKvBF16 &&
      detail::decode_units_fit(a[0].d, a[0].dv, a[0].rows) &&
      n <= detail::kDecodeHeadGroup) {
#if SOFTDOT_UNITS_HW
    if (a[0].units == detail::kUnitsAvx512Bf16) {
      RunDecodeUnitsWith<DotHw>(a, n);
      return;
    }
#endif
    RunDecodeUnitsWith<DotModel>(a, n);
    return;
  }
#endif
  for (std::size_t h = 0; h < n; ++h) RunDecode(a[h]);
}

}  // namespace attn
}  // namespace HWY_NAMESPACE
}  // namespace softdot
HWY_AFTER_NAMESPACE();

#endif  // SOFTDOT_KERNELS_ATTENTION_DECODE_UNITS_INL_H_
