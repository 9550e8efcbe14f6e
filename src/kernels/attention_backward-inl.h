// softdot kernels: the backward pass of attention for one block of keys
// against one block of query rows (FlashAttention-2's recomputation, in the
// prefill form's layout: query rows in vector lanes).
//
// Per call (keys j0 .. j0 + kb - 1, at most kKeyTile; rows r < rows):
//   1. (the caller) Qt[k][r] and dOt[c][r] packed transposed, once per
//      block of rows for every key block;
//   2. S[j][r]: the forward's scores, bit for bit: ScoreTile's blocked
//      chains times the scale, then PrefillMaskScores (soft-cap, bias,
//      ALiBi, mask, causal / window limits; -inf where a key is hidden);
//   3. P[j][r] = exp(S - lse_r) with the forward's exp (ExpNonPositive), +0
//      where S is -inf; a row whose lse is +inf (k scores of +inf) gets
//      1/k at its +inf scores and 0 elsewhere, the forward's limit; a NaN
//      score or lse gives NaN;
//   4. dP[j][r] = dO_r . V_j (ScoreTile's chains, scale 1);
//   5. dS = P (dP - Delta_r) where S is not -inf, +0 elsewhere (written to
//      the bias gradient when asked); dT = dS times the soft-cap's
//      derivative 1 - tanh^2(t / cap) (t the scaled score);
//   6. dV[j][c] += sum_r P[j][r] dO[r][c] and dK[j][c] += sum_r dT[j][r]
//      Q[r][c]: features in lanes, one float FMA chain per element over a
//      group of kBackRowGroup (64) rows in order (continued across the
//      calls of a group through a float tile), added into the caller's
//      double accumulators when the group ends: the same chains whatever
//      the rows per call (the target's lanes);
//   7. dQt[c][r] = sum_j dT[j][r] K[j][c]: one float FMA chain over the
//      64-key tile, stored in double for the caller to add, in key-block
//      order, into its accumulator.
// The scale multiplies dQ and dK once, in double, when the caller rounds
// them. Masked pairs never reach a gradient, even when their Q, K, V or dO
// rows hold inf or NaN: where a tile holds a masked score and a non-finite
// operand, the products skip the masked terms (as the forward's P V).

#if defined(SOFTDOT_KERNELS_ATTENTION_BACKWARD_INL_H_) == \
    defined(HWY_TARGET_TOGGLE)
#ifdef SOFTDOT_KERNELS_ATTENTION_BACKWARD_INL_H_
#undef SOFTDOT_KERNELS_ATTENTION_BACKWARD_INL_H_
#else
#define SOFTDOT_KERNELS_ATTENTION_BACKWARD_INL_H_
#endif

#include "kernels/attention_common-inl.h"
#include "kernels/attention_kv-inl.h"
#include "kernels/attention_prefill-inl.h"

HWY_BEFORE_NAMESPACE();
namespace softdot {
namespace HWY_NAMESPACE {

using detail::AttnBackArgs;

namespace attn {

// The backward's pieces of the scratch buffer (attention_backward_scratch_
// floats, attention_args.h); the rows come packed (AttnBackArgs::qt, dot).
struct BackScratch {
  Scratch sc;    // qt (the caller's), s, kc, vc, add, nan, first/last key
  float* p;      // [kKeyTile][bq] P
  float* dt;     // [kKeyTile][bq] dP, then dT
  float* traw;   // [kKeyTile][bq] scaled scores before the cap (soft-cap)
  float* lse;    // [bq]
  float* delta;  // [bq]
  float* share;  // [bq] 1/k for a row whose lse is +inf
};

HWY_INLINE BackScratch BackwardScratch(const AttnBackArgs& b, std::size_t bq) {
  const AttnArgs& a = b.f;
  BackScratch bs;
  Scratch& sc = bs.sc;
  float* f = AlignUp(a.scratch);
  auto take = [&f](std::size_t n) {
    float* r = f;
    f = AlignUp(f + n);
    return r;
  };
  sc.qt = const_cast<float*>(b.qt);
  sc.s = take(kKeyTile * bq);
  sc.p = nullptr;
  sc.kc = KvWidened(a) ? take(kKeyTile * a.d) : nullptr;
  sc.vc = KvWidened(a) ? take(kKeyTile * a.dv) : nullptr;
  sc.add = take(bq);
  sc.nan = take(bq);
  sc.first_key = reinterpret_cast<std::int32_t*>(take(bq));
  sc.last_key = reinterpret_cast<std::int32_t*>(take(bq));
  sc.qtd = nullptr;
  sc.slo = nullptr;
  bs.p = take(kKeyTile * bq);
  bs.dt = take(kKeyTile * bq);
  bs.traw = take(kKeyTile * bq);
  bs.lse = take(bq);
  bs.delta = take(bq);
  bs.share = take(bq);
  return bs;
}

// Step 1: each lane's key limits and row values; padding lanes see no key.
HWY_INLINE void BackwardRows(const AttnBackArgs& b, const BackScratch& bs,
                             std::size_t bq) {
  const AttnArgs& a = b.f;
  const Scratch& sc = bs.sc;
  for (std::size_t r = 0; r < bq; ++r) {
    const bool live = r < a.rows;
    sc.first_key[r] =
        live ? a.first_key[r] : std::numeric_limits<std::int32_t>::max();
    sc.last_key[r] = live ? a.last_key[r] : -1;
    sc.nan[r] = 0.0f;
    bs.lse[r] = live ? b.lse[r] : 0.0f;
    bs.delta[r] = live ? b.delta[r] : 0.0f;
    bs.share[r] = live && b.inf_share != nullptr ? b.inf_share[r] : 0.0f;
  }
}

// s[j][r] = scale * (x_r . y_j) for the kb rows y_j of a block: ScoreTile's
// blocked chains over xt [n][bq].
template <std::size_t NV>
HWY_INLINE void BlockScores(const float* HWY_RESTRICT xt, std::size_t bq,
                            const float* y, std::size_t ystride, std::size_t n,
                            std::size_t kb, VF scale, float* HWY_RESTRICT s) {
  constexpr std::size_t KT = kAccRegs / NV;
  std::size_t j = 0;
  const float* yr[KT];
  for (; j + KT <= kb; j += KT) {
    for (std::size_t jj = 0; jj < KT; ++jj) yr[jj] = y + (j + jj) * ystride;
    ScoreTile<NV, KT>(xt, bq, yr, n, scale, s + j * bq);
  }
  for (; j < kb; ++j) {
    yr[0] = y + j * ystride;
    ScoreTile<NV, 1>(xt, bq, yr, n, scale, s + j * bq);
  }
}

// Loads columns c0 .. c0 + N - 1 of a row of n columns: a whole vector, or
// (kTail) the n - c0 < N columns left, zero-padded through a stack copy
// (the row may end at the end of its allocation).
template <bool kTail>
HWY_INLINE VF LoadCols(const float* row, std::size_t c0, std::size_t n) {
  const DF df;
  if constexpr (!kTail) {
    (void)n;
    return hn::LoadU(df, row + c0);
  } else {
    HWY_ALIGN float tmp[hn::MaxLanes(DF())] = {};
    for (std::size_t c = c0; c < n; ++c) tmp[c - c0] = row[c];
    return hn::Load(df, tmp);
  }
}

// acc[jj][w] (keys jb + jj, columns c0 + w N) starts from the float tile
// ft (row stride fs) and gains a[(jb + jj) bq + r] x_r[c0 + w N ..] for the
// rows r < rows in order: one float FMA chain per element, which the
// caller's next call continues (the tile in memory) until the group of
// kBackRowGroup rows ends. kGuard: rows flagged in bad skip the terms whose
// score s[j][r] is -inf.
template <std::size_t KT, std::size_t CW, bool kGuard, bool kTail>
HWY_INLINE void OuterTile(const float* HWY_RESTRICT a,
                          const float* HWY_RESTRICT s, std::size_t bq,
                          std::size_t jb, const float* const* x, std::size_t n,
                          std::size_t rows, std::size_t c0,
                          const std::uint8_t* bad, const float* ft,
                          std::size_t fs, VF (&acc)[KT][CW]) {
  const DF df;
  const std::size_t N = hn::Lanes(df);
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
#pragma GCC unroll 16
  for (std::size_t jj = 0; jj < KT; ++jj) {
#pragma GCC unroll 4
    for (std::size_t w = 0; w < CW; ++w) {
      acc[jj][w] = hn::LoadU(df, ft + (jb + jj) * fs + c0 + w * N);
    }
  }
  for (std::size_t r = 0; r < rows; ++r) {
    VF xv[CW];
#pragma GCC unroll 4
    for (std::size_t w = 0; w < CW; ++w) {
      xv[w] = LoadCols<kTail>(x[r], c0 + w * N, n);
    }
    const bool guard = kGuard && bad[r] != 0;
#pragma GCC unroll 16
    for (std::size_t jj = 0; jj < KT; ++jj) {
      const std::size_t at = (jb + jj) * bq + r;
      if (guard && s[at] == kNegInf) continue;
      const VF av = hn::Set(df, a[at]);
#pragma GCC unroll 4
      for (std::size_t w = 0; w < CW; ++w) {
        acc[jj][w] = hn::MulAdd(av, xv[w], acc[jj][w]);
      }
    }
  }
}

// o[c] += acc[c] in double for the N lanes of one vector.
HWY_INLINE void AddIntoDouble(const VF& acc, double* HWY_RESTRICT o) {
  const DF df;
#if HWY_TARGET != HWY_SCALAR
  if constexpr (hn::MaxLanes(DF()) >= 2) {
    const DD dd;
    const std::size_t ND = hn::Lanes(dd);
    const hn::Half<DF> dh;
    const VD lo = hn::PromoteTo(dd, hn::LowerHalf(dh, acc));
    const VD hi = hn::PromoteTo(dd, hn::UpperHalf(dh, acc));
    hn::StoreU(hn::Add(hn::LoadU(dd, o), lo), dd, o);
    hn::StoreU(hn::Add(hn::LoadU(dd, o + ND), hi), dd, o + ND);
    return;
  }
#endif
  HWY_ALIGN float tmp[hn::MaxLanes(DF())];
  hn::Store(acc, df, tmp);
  for (std::size_t i = 0; i < hn::Lanes(df); ++i) o[i] += tmp[i];
}

// One register tile's chains back to the float tile, or, at the end of a
// row group (flush), added into the double accumulators and the float tile
// zeroed.
template <std::size_t KT, std::size_t CW>
HWY_INLINE void StoreTile(const VF (&acc)[KT][CW], std::size_t jb,
                          std::size_t c0, float* ft, std::size_t fs,
                          double* out, std::size_t os, bool flush) {
  const DF df;
  const std::size_t N = hn::Lanes(df);
  for (std::size_t jj = 0; jj < KT; ++jj) {
    for (std::size_t w = 0; w < CW; ++w) {
      float* f = ft + (jb + jj) * fs + c0 + w * N;
      if (flush) {
        AddIntoDouble(acc[jj][w], out + (jb + jj) * os + c0 + w * N);
        hn::StoreU(hn::Zero(df), df, f);
      } else {
        hn::StoreU(acc[jj][w], df, f);
      }
    }
  }
}

// out[j][c] += sum_r a[j][r] x_r[c] for the kb keys and n columns: OuterTile
// in tiles of KT keys x CW vectors, the chains kept in the float tile ft
// (row stride fs >= n rounded up to whole vectors) and added into the
// double accumulators out (row stride os) when the row group ends (flush).
template <bool kGuard>
HWY_INLINE void OuterProduct(const float* a, const float* s, std::size_t bq,
                             std::size_t kb, const float* const* x,
                             std::size_t n, std::size_t rows,
                             const std::uint8_t* bad, float* ft, std::size_t fs,
                             double* out, std::size_t os, bool flush) {
  const std::size_t N = Lanes();
  constexpr std::size_t CW = 4;
  constexpr std::size_t KT = kAccRegs / CW;
  constexpr std::size_t KT1 = kAccRegs;
  const std::size_t full = n / N * N;
  std::size_t c0 = 0;
  for (; c0 + CW * N <= full; c0 += CW * N) {
    std::size_t j = 0;
    for (; j + KT <= kb; j += KT) {
      VF acc[KT][CW];
      OuterTile<KT, CW, kGuard, false>(a, s, bq, j, x, n, rows, c0, bad, ft, fs,
                                       acc);
      StoreTile<KT, CW>(acc, j, c0, ft, fs, out, os, flush);
    }
    for (; j < kb; ++j) {
      VF acc[1][CW];
      OuterTile<1, CW, kGuard, false>(a, s, bq, j, x, n, rows, c0, bad, ft, fs,
                                      acc);
      StoreTile<1, CW>(acc, j, c0, ft, fs, out, os, flush);
    }
  }
  for (; c0 < n; c0 += N) {
    const bool tail = c0 + N > n;
    std::size_t j = 0;
    for (; j + KT1 <= kb; j += KT1) {
      VF acc[KT1][1];
      if (tail) {
        OuterTile<KT1, 1, kGuard, true>(a, s, bq, j, x, n, rows, c0, bad, ft,
                                        fs, acc);
      } else {
        OuterTile<KT1, 1, kGuard, false>(a, s, bq, j, x, n, rows, c0, bad, ft,
                                         fs, acc);
      }
      StoreTile<KT1, 1>(acc, j, c0, ft, fs, out, os, flush);
    }
    for (; j < kb; ++j) {
      VF acc[1][1];
      if (tail) {
        OuterTile<1, 1, kGuard, true>(a, s, bq, j, x, n, rows, c0, bad, ft, fs,
                                      acc);
      } else {
        OuterTile<1, 1, kGuard, false>(a, s, bq, j, x, n, rows, c0, bad, ft, fs,
                                       acc);
      }
      StoreTile<1, 1>(acc, j, c0, ft, fs, out, os, flush);
    }
  }
}

HWY_INLINE bool AnyBad(const std::uint8_t* f, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    if (f[i] != 0) return true;
  }
  return false;
}

// Steps 3 and 5: P, then dT (and dS into the bias gradient) over the
// block. Returns whether a score of the block is -inf.
template <std::size_t NV>
HWY_INLINE bool BackwardWeights(const AttnBackArgs& b, const BackScratch& bs,
                                std::size_t bq, std::size_t j0,
                                std::size_t kb) {
  const AttnArgs& a = b.f;
  const DF df;
  const std::size_t N = hn::Lanes(df);
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const VF neg_inf = hn::Set(df, -kInf);
  const VF pos_inf = hn::Set(df, kInf);
  const VF zero = hn::Zero(df);
  const VF nan = hn::Set(df, std::numeric_limits<float>::quiet_NaN());
  const bool softcap = a.softcap > 0.0f;
  const VF cap = hn::Set(df, a.softcap);
  const VF one = hn::Set(df, 1.0f);
  bool any_masked = false;
  VF lse[NV], delta[NV], share[NV];
  hn::Mask<DF> inf_row[NV];
  for (std::size_t v = 0; v < NV; ++v) {
    const VF l = hn::Load(df, bs.lse + v * N);
    inf_row[v] = hn::Eq(l, pos_inf);
    lse[v] = hn::IfThenZeroElse(inf_row[v], l);
    delta[v] = hn::Load(df, bs.delta + v * N);
    share[v] = hn::Load(df, bs.share + v * N);
  }
  for (std::size_t j = 0; j < kb; ++j) {
    for (std::size_t v = 0; v < NV; ++v) {
      const std::size_t at = j * bq + v * N;
      const VF s = hn::Load(df, bs.sc.s + at);
      // Not Ne: an ordered compare is false for NaN, and a NaN score is
      // live (its NaN must reach the gradients).
      const auto live = hn::Not(hn::Eq(s, neg_inf));
      any_masked = any_masked || !hn::AllTrue(df, live);
      const VF t = hn::Sub(s, lse[v]);
      const auto t_nan = hn::IsNaN(t);
      // exp(t + c), c the exact error of t (s - lse rounded), as the
      // precise forward does: P does not inherit the subtraction's
      // rounding. (ExpNonPositive zeroes c where t is below its range;
      // c is 0 for the clamped t > 0 and NaN lanes, which are replaced.)
      const auto ok = hn::And(hn::Not(t_nan), hn::Le(t, zero));
      const VF c = hn::IfThenElseZero(ok, TwoSumErr(s, hn::Neg(lse[v]), t));
      VF p =
          ExpNonPositive(df, hn::Min(hn::IfThenElse(t_nan, zero, t), zero), c);
      p = hn::IfThenElse(t_nan, nan, p);
      p = hn::IfThenElse(inf_row[v],
                         hn::IfThenElseZero(hn::Eq(s, pos_inf), share[v]), p);
      p = hn::IfThenElseZero(live, p);
      hn::Store(p, df, bs.p + at);
      const VF dp = hn::Load(df, bs.dt + at);
      const VF ds = hn::IfThenElseZero(live, hn::Mul(p, hn::Sub(dp, delta[v])));
      VF dt = ds;
      if (softcap) {
        const VF th = hn::Tanh(df, hn::Div(hn::Load(df, bs.traw + at), cap));
        dt = hn::IfThenElseZero(live, hn::Mul(ds, hn::NegMulAdd(th, th, one)));
      }
      hn::Store(dt, df, bs.dt + at);
      if (b.dbias_rows != nullptr) {
        HWY_ALIGN float tmp[hn::MaxLanes(DF())];
        hn::Store(ds, df, tmp);
        for (std::size_t i = 0; i < N; ++i) {
          const std::size_t r = v * N + i;
          if (r < a.rows && b.dbias_rows[r] != nullptr &&
              bs.sc.s[at + i] != -kInf) {
            b.dbias_rows[r][j0 + j] = tmp[i];
          }
        }
      }
    }
  }
  return any_masked;
}

// The count of +inf scores of each row over the block (AttnBackArgs::
// inf_count): the forward's limit for a row whose lse is +inf.
template <std::size_t NV>
HWY_INLINE void CountInfScores(const AttnBackArgs& b, const BackScratch& bs,
                               std::size_t bq, std::size_t kb) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  for (std::size_t r = 0; r < b.f.rows; ++r) {
    double n = 0.0;
    for (std::size_t j = 0; j < kb; ++j) n += bs.sc.s[j * bq + r] == kInf;
    b.inf_count[r] += n;
  }
}

// acc[c][v] = sum_j dT[j][r] K[j][c0 + c] over the keys j < kb (the whole
// key tile): a float FMA chain in key order, rows in lanes. kGuard: lanes
// whose score is -inf skip the term.
template <std::size_t NV, std::size_t CT, bool kGuard>
HWY_INLINE void DqTile(const float* HWY_RESTRICT dt,
                       const float* HWY_RESTRICT s, std::size_t bq,
                       const float* HWY_RESTRICT k, std::size_t kstride,
                       std::size_t kb, std::size_t c0, VF (&acc)[CT][NV]) {
  const DF df;
  const std::size_t N = hn::Lanes(df);
  const VF neg_inf = hn::Set(df, -std::numeric_limits<float>::infinity());
#pragma GCC unroll 16
  for (std::size_t c = 0; c < CT; ++c) {
#pragma GCC unroll 4
    for (std::size_t v = 0; v < NV; ++v) acc[c][v] = hn::Zero(df);
  }
  for (std::size_t j = 0; j < kb; ++j) {
    VF t[NV];
#pragma GCC unroll 4
    for (std::size_t v = 0; v < NV; ++v)
      t[v] = hn::Load(df, dt + j * bq + v * N);
    const float* krow = k + j * kstride + c0;
    if constexpr (kGuard) {
      hn::Mask<DF> hidden[NV];
#pragma GCC unroll 4
      for (std::size_t v = 0; v < NV; ++v) {
        hidden[v] = hn::Eq(hn::Load(df, s + j * bq + v * N), neg_inf);
      }
#pragma GCC unroll 16
      for (std::size_t c = 0; c < CT; ++c) {
        const VF kv = hn::Set(df, krow[c]);
#pragma GCC unroll 4
        for (std::size_t v = 0; v < NV; ++v) {
          acc[c][v] = hn::IfThenElse(hidden[v], acc[c][v],
                                     hn::MulAdd(kv, t[v], acc[c][v]));
        }
      }
    } else {
#pragma GCC unroll 16
      for (std::size_t c = 0; c < CT; ++c) {
        const VF kv = hn::Set(df, krow[c]);
#pragma GCC unroll 4
        for (std::size_t v = 0; v < NV; ++v) {
          acc[c][v] = hn::MulAdd(kv, t[v], acc[c][v]);
        }
      }
    }
  }
}

// dq[c][r] = sum_j dT[j][r] K[j][c] for c < d: DqTile's chain over the key
// tile, CT columns at a time (row stride dq_stride).
template <std::size_t NV, bool kGuard>
HWY_INLINE void DqProduct(const BackScratch& bs, std::size_t bq,
                          const BlockRows& kv, std::size_t kb, std::size_t d,
                          float* dq, std::size_t dq_stride) {
  const std::size_t N = Lanes();
  constexpr std::size_t CT = kAccRegs / NV;
  std::size_t c = 0;
  for (; c + CT <= d; c += CT) {
    VF acc[CT][NV];
    DqTile<NV, CT, kGuard>(bs.dt, bs.sc.s, bq, kv.k, kv.k_stride, kb, c, acc);
    for (std::size_t cc = 0; cc < CT; ++cc) {
      for (std::size_t v = 0; v < NV; ++v) {
        hn::StoreU(acc[cc][v], DF(), dq + (c + cc) * dq_stride + v * N);
      }
    }
  }
  for (; c < d; ++c) {
    VF acc[1][NV];
    DqTile<NV, 1, kGuard>(bs.dt, bs.sc.s, bq, kv.k, kv.k_stride, kb, c, acc);
    for (std::size_t v = 0; v < NV; ++v) {
      hn::StoreU(acc[0][v], DF(), dq + c * dq_stride + v * N);
    }
  }
}

template <std::size_t NV>
void RunBackward(const AttnBackArgs& b) {
  const AttnArgs& a = b.f;
  const DF df;
  const std::size_t bq = b.bq;
  const BackScratch bs = BackwardScratch(b, bq);
  BackwardRows(b, bs, bq);
  const std::size_t j0 = a.j_begin, kb = a.j_end - a.j_begin;
  const BlockRows kv = LoadBlock(a, j0, kb, bs.sc.kc, bs.sc.vc);
  // Step 2: the forward's scores.
  BlockScores<NV>(bs.sc.qt, bq, kv.k, kv.k_stride, a.d, kb,
                  hn::Set(df, a.scale), bs.sc.s);
  if (a.softcap > 0.0f) {
    std::memcpy(bs.traw, bs.sc.s, kb * bq * sizeof(float));
  }
  BlockExtremes<NV> ex;
  PrefillMaskScores<NV>(a, bs.sc, bq, j0, kb, /*straddles=*/true, ex);
  if (b.inf_count != nullptr) {
    CountInfScores<NV>(b, bs, bq, kb);
    return;
  }
  // Step 4: dP, then steps 3 and 5.
  BlockScores<NV>(b.dot, bq, kv.v, kv.v_stride, a.dv, kb, hn::Set(df, 1.0f),
                  bs.dt);
  const bool any_masked = BackwardWeights<NV>(b, bs, bq, j0, kb);
  // Step 6.
  if (any_masked && AnyBad(b.do_bad, a.rows)) {
    OuterProduct<true>(bs.p, bs.sc.s, bq, kb, b.do_rows, a.dv, a.rows, b.do_bad,
                       b.dv_tile, b.dv_stride, b.dv_acc, b.dv_stride, b.flush);
  } else {
    OuterProduct<false>(bs.p, bs.sc.s, bq, kb, b.do_rows, a.dv, a.rows,
                        b.do_bad, b.dv_tile, b.dv_stride, b.dv_acc, b.dv_stride,
                        b.flush);
  }
  if (any_masked && AnyBad(b.q_bad, a.rows)) {
    OuterProduct<true>(bs.dt, bs.sc.s, bq, kb, a.q_rows, a.d, a.rows, b.q_bad,
                       b.dk_tile, b.dk_stride, b.dk_acc, b.dk_stride, b.flush);
  } else {
    OuterProduct<false>(bs.dt, bs.sc.s, bq, kb, a.q_rows, a.d, a.rows, b.q_bad,
                        b.dk_tile, b.dk_stride, b.dk_acc, b.dk_stride, b.flush);
  }
  // Step 7: dQt[c][r] = sum_j dT[j][r] K[j][c]. The guard skips the lanes
  // whose score is -inf (not NaN: a NaN score's NaN must reach dQ).
  const bool guard = any_masked && !AllFinite(kv.k, kv.k_stride, kb, a.d);
  if (guard) {
    DqProduct<NV, true>(bs, bq, kv, kb, a.d, b.dq, b.dq_stride);
  } else {
    DqProduct<NV, false>(bs, bq, kv, kb, a.d, b.dq, b.dq_stride);
  }
}

}  // namespace attn

// The dispatch table's entry: rows <= AttentionMaxRows().
void AttentionBackwardRows(const AttnBackArgs& b) {
  const std::size_t N = attn::Lanes();
  if (b.f.rows <= N) {
    attn::RunBackward<1>(b);
  } else if (b.f.rows <= 2 * N) {
    attn::RunBackward<2>(b);
  } else {
    attn::RunBackward<4>(b);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace softdot
HWY_AFTER_NAMESPACE();

#endif  // SOFTDOT_KERNELS_ATTENTION_BACKWARD_INL_H_
