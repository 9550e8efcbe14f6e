// softdot kernels: the decode form's scores (src/kernels/attention-inl.h
// has the overview): each score a 16-lane FMA chain over the features
// reduced in a fixed tree (DecodeScoreRows), the per-target tiles that take
// the trees of many scores together with the same bits (DecodeScoreTile),
// and the rows of a block (DecodeScoreRowGroup). Used by RunDecode
// (attention_decode-inl.h).

#if defined(SOFTDOT_KERNELS_ATTENTION_DECODE_SCORES_INL_H_) == \
    defined(HWY_TARGET_TOGGLE)
#ifdef SOFTDOT_KERNELS_ATTENTION_DECODE_SCORES_INL_H_
#undef SOFTDOT_KERNELS_ATTENTION_DECODE_SCORES_INL_H_
#else
#define SOFTDOT_KERNELS_ATTENTION_DECODE_SCORES_INL_H_
#endif

#include "kernels/attention_common-inl.h"
#include "kernels/attention_kv-inl.h"
#include "kernels/reduce-inl.h"

HWY_BEFORE_NAMESPACE();
namespace softdot {
namespace HWY_NAMESPACE {

namespace attn {

// Decode scores of RC rows against key row kr: per row, 16 logical lanes
// (one Block), lane t accumulating features t, t + 16, ... as a float FMA
// chain, then the fixed pairwise tree of ReduceBlockTree: the same bits on
// every FMA target. qp holds the rows zero-padded to a multiple of 16.
template <std::size_t RC, std::size_t KJ>
HWY_INLINE void DecodeScoreRows(const float* HWY_RESTRICT qp, std::size_t dpad,
                                const float* HWY_RESTRICT kr0,
                                std::size_t kstride, std::size_t d, float* out,
                                std::size_t out_stride) {
  using BL = Block<float>;
  const typename BL::D db;
  constexpr std::size_t W = BL::kVecs;
  constexpr std::size_t VL = BL::kVecLanes;
  typename BL::V acc[RC][KJ][W];
#pragma GCC unroll 4
  for (std::size_t r = 0; r < RC; ++r) {
#pragma GCC unroll 4
    for (std::size_t k = 0; k < KJ; ++k) {
#pragma GCC unroll 16
      for (std::size_t w = 0; w < W; ++w) acc[r][k][w] = hn::Zero(db);
    }
  }
  const std::size_t full = d / 16;
  auto step = [&](std::size_t b, const typename BL::V(&kv)[KJ][W]) {
#pragma GCC unroll 4
    for (std::size_t r = 0; r < RC; ++r) {
      const float* q = qp + r * dpad + b * 16;
#pragma GCC unroll 16
      for (std::size_t w = 0; w < W; ++w) {
        const typename BL::V qv = hn::Load(db, q + w * VL);
#pragma GCC unroll 4
        for (std::size_t k = 0; k < KJ; ++k) {
          acc[r][k][w] = hn::MulAdd(qv, kv[k][w], acc[r][k][w]);
        }
      }
    }
  };
  for (std::size_t b = 0; b < full; ++b) {
    typename BL::V kv[KJ][W];
#pragma GCC unroll 4
    for (std::size_t k = 0; k < KJ; ++k) {
#pragma GCC unroll 16
      for (std::size_t w = 0; w < W; ++w) {
        kv[k][w] = hn::LoadU(db, kr0 + k * kstride + b * 16 + w * VL);
      }
    }
    step(b, kv);
  }
  if (const std::size_t rest = d - full * 16; rest != 0) {
    typename BL::V kv[KJ][W];
    for (std::size_t k = 0; k < KJ; ++k) {
      for (std::size_t w = 0; w < W; ++w) {
        const std::size_t c = CountInVec<VL>(rest, w);
        kv[k][w] =
            c == 0 ? hn::Zero(db)
                   : LoadFirstN(db, kr0 + k * kstride + full * 16 + w * VL, c);
      }
    }
    step(full, kv);
  }
#pragma GCC unroll 4
  for (std::size_t r = 0; r < RC; ++r) {
#pragma GCC unroll 4
    for (std::size_t k = 0; k < KJ; ++k) {
      out[r * out_stride + k] = ReduceBlockTree<float>(acc[r][k]);
    }
  }
}

// The decode scores of RC rows x KC keys (RC KC = kTileScores) with the
// same bits as DecodeScoreRows, the trees of all RC KC scores taken
// together: each level of the tree folds two vectors of partial sums into
// one (the lower and upper halves of every group of leaves, added lower
// first, as the tree adds leaf j and leaf j + half), so kTileScores scores
// cost kTileScores - 1 vector additions and twice as many shuffles, where
// one tree per score cost 2 log2(16) operations each. The last fold leaves
// score r KC + k in lane r KC + k (AVX-512) or 2 (r KC + k) (AVX2). Needs
// d a multiple of 16 (whole blocks, no tail).
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
inline constexpr std::size_t kTileScores = 16;
#elif HWY_TARGET == HWY_AVX2
inline constexpr std::size_t kTileScores = 4;
#else
inline constexpr std::size_t kTileScores = 0;  // one tree per score
#endif

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL || \
    HWY_TARGET == HWY_AVX2
// The trees of the RC x KC scores of a tile folded together (the leaves
// acc[r KC + k] of Block<float>'s vectors; DecodeScoreTile's comment has
// the order): out[r out_stride + k] receives score (r, k).
template <std::size_t RC, std::size_t KC>
HWY_INLINE void FoldTileScores(
    const typename Block<float>::V (&acc)[RC * KC][Block<float>::kVecs],
    float* out, std::size_t out_stride) {
  static_assert(RC * KC == kTileScores, "one tile is kTileScores scores");
  using BL = Block<float>;
  const typename BL::D db;
  HWY_ALIGN float lanes[16];
#if HWY_TARGET == HWY_AVX2
  // Leaves j and j + 8 are the two vectors of a block; then halves of 4
  // (128-bit blocks), pairs (64-bit pieces) and single lanes.
  VF u[4];
#pragma GCC unroll 4
  for (std::size_t p = 0; p < 4; ++p) u[p] = hn::Add(acc[p][0], acc[p][1]);
  const VF v0 = hn::Add(hn::ConcatLowerLower(db, u[2], u[0]),
                        hn::ConcatUpperUpper(db, u[2], u[0]));
  const VF v1 = hn::Add(hn::ConcatLowerLower(db, u[3], u[1]),
                        hn::ConcatUpperUpper(db, u[3], u[1]));
  const hn::Repartition<double, decltype(db)> dd;
  const VF w =
      hn::Add(hn::BitCast(db, hn::InterleaveLower(dd, hn::BitCast(dd, v0),
                                                  hn::BitCast(dd, v1))),
              hn::BitCast(db, hn::InterleaveUpper(dd, hn::BitCast(dd, v0),
                                                  hn::BitCast(dd, v1))));
  hn::Store(hn::Add(w, hn::Shuffle2301(w)), db, lanes);
  constexpr std::size_t kLaneStep = 2;
#else
  // Halves of 8 (256-bit), 4 (128-bit blocks), 2 and 1.
  VF v[8];
#pragma GCC unroll 8
  for (std::size_t i = 0; i < 8; ++i) {
    v[i] = hn::Add(hn::ConcatLowerLower(db, acc[2 * i + 1][0], acc[2 * i][0]),
                   hn::ConcatUpperUpper(db, acc[2 * i + 1][0], acc[2 * i][0]));
  }
  VF w[4];
#pragma GCC unroll 4
  for (std::size_t m = 0; m < 4; ++m) {
    const VF x{_mm512_shuffle_f32x4(v[2 * m].raw, v[2 * m + 1].raw,
                                    _MM_SHUFFLE(2, 0, 2, 0))};
    const VF y{_mm512_shuffle_f32x4(v[2 * m].raw, v[2 * m + 1].raw,
                                    _MM_SHUFFLE(3, 1, 3, 1))};
    w[m] = hn::Add(x, y);
  }
  const hn::Repartition<double, decltype(db)> dd;
  VF z[2];
#pragma GCC unroll 2
  for (std::size_t n = 0; n < 2; ++n) {
    const auto lo = hn::BitCast(dd, w[2 * n]);
    const auto hi = hn::BitCast(dd, w[2 * n + 1]);
    z[n] = hn::Add(hn::BitCast(db, hn::ConcatEven(dd, hi, lo)),
                   hn::BitCast(db, hn::ConcatOdd(dd, hi, lo)));
  }
  hn::Store(
      hn::Add(hn::ConcatEven(db, z[1], z[0]), hn::ConcatOdd(db, z[1], z[0])),
      db, lanes);
  constexpr std::size_t kLaneStep = 1;
#endif
#pragma GCC unroll 4
  for (std::size_t r = 0; r < RC; ++r) {
#pragma GCC unroll 16
    for (std::size_t k = 0; k < KC; ++k) {
      out[r * out_stride + k] = lanes[(r * KC + k) * kLaneStep];
    }
  }
}

// The tile's products, then FoldTileScores (the comment above kTileScores).
template <std::size_t RC, std::size_t KC, class T>
HWY_INLINE void DecodeScoreTile(const float* HWY_RESTRICT qp, std::size_t dpad,
                                const T* const* krows, const float* kscales,
                                std::size_t d, float* out,
                                std::size_t out_stride) {
  static_assert(RC * KC == kTileScores, "one tile is kTileScores scores");
  using BL = Block<float>;
  const typename BL::D db;
  constexpr std::size_t W = BL::kVecs;
  constexpr std::size_t VL = BL::kVecLanes;
  typename BL::V acc[RC * KC][W];
#pragma GCC unroll 16
  for (std::size_t p = 0; p < RC * KC; ++p) {
#pragma GCC unroll 2
    for (std::size_t w = 0; w < W; ++w) acc[p][w] = hn::Zero(db);
  }
  for (std::size_t c = 0; c < d; c += 16) {
    typename BL::V kv[KC][W];
#pragma GCC unroll 16
    for (std::size_t k = 0; k < KC; ++k) {
#pragma GCC unroll 2
      for (std::size_t w = 0; w < W; ++w) {
        kv[k][w] = LoadRow(db, krows[k] + c + w * VL, kscales[k]);
      }
    }
#pragma GCC unroll 4
    for (std::size_t r = 0; r < RC; ++r) {
#pragma GCC unroll 2
      for (std::size_t w = 0; w < W; ++w) {
        const typename BL::V qv = hn::Load(db, qp + r * dpad + c + w * VL);
#pragma GCC unroll 16
        for (std::size_t k = 0; k < KC; ++k) {
          acc[r * KC + k][w] = hn::MulAdd(qv, kv[k][w], acc[r * KC + k][w]);
        }
      }
    }
  }
  FoldTileScores<RC, KC>(acc, out, out_stride);
}
#endif

// Scores of rows r0 .. r0 + RC - 1 against the kb keys of a block: tiles
// of RC x KC, then the keys left one at a time (widened into kw first).
template <std::size_t RC, std::size_t KC, class T, class OnKeys>
HWY_INLINE void DecodeScoreRowGroup(const float* HWY_RESTRICT qp,
                                    std::size_t dpad, const DecodeRows<T>& kv,
                                    std::size_t d, std::size_t kb, float* S,
                                    std::size_t B, float* kw,
                                    const OnKeys& on_keys) {
  std::size_t j = 0;
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL || \
    HWY_TARGET == HWY_AVX2
  for (; j + KC <= kb; j += KC) {
    on_keys(j, KC);
    DecodeScoreTile<RC, KC>(qp, dpad, kv.k + j, kv.ks + j, d, S + j, B);
  }
#else
  (void)on_keys;  // no tiles: nothing to prefetch by
#endif
  for (; j < kb; ++j) {
    const float* kr;
    if constexpr (std::is_same_v<T, float>) {
      kr = kv.k[j];
    } else {
      for (std::size_t c = 0; c < d; ++c) {
        kw[c] = RowElement(kv.k[j], c, kv.ks[j]);
      }
      kr = kw;
    }
    for (std::size_t r = 0; r < RC; ++r) {
      DecodeScoreRows<1, 1>(qp + r * dpad, dpad, kr, 0, d, S + r * B + j, B);
    }
  }
}

}  // namespace attn
}  // namespace HWY_NAMESPACE
}  // namespace softdot
HWY_AFTER_NAMESPACE();

#endif  // SOFTDOT_KERNELS_ATTENTION_DECODE_SCORES_INL_H_
