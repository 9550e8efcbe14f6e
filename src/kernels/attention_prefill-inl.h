// softdot kernels: the prefill form of attention (query rows in vector
// lanes; src/kernels/attention-inl.h has the overview): the score and value
// tiles and RunPrefill.

#if defined(SOFTDOT_KERNELS_ATTENTION_PREFILL_INL_H_) == \
    defined(HWY_TARGET_TOGGLE)
#ifdef SOFTDOT_KERNELS_ATTENTION_PREFILL_INL_H_
#undef SOFTDOT_KERNELS_ATTENTION_PREFILL_INL_H_
#else
#define SOFTDOT_KERNELS_ATTENTION_PREFILL_INL_H_
#endif

#include "kernels/attention_common-inl.h"
#include "kernels/attention_kv-inl.h"

HWY_BEFORE_NAMESPACE();
namespace softdot {
namespace HWY_NAMESPACE {

namespace attn {

// One block's chains acc[jj][v] into the running scores s[jj][r] (stored
// by the first block, added in float by the next ones), times the scale
// after the last block: the blocked chains of ScoreTile and ScoreTileUnits.
template <std::size_t NV, std::size_t KT>
HWY_INLINE void AddBlockScores(const VF (&acc)[KT][NV], std::size_t bq,
                               bool first, bool last, VF scale,
                               float* HWY_RESTRICT s) {
  const DF df;
  const std::size_t N = hn::Lanes(df);
#pragma GCC unroll 16
  for (std::size_t jj = 0; jj < KT; ++jj) {
#pragma GCC unroll 4
    for (std::size_t v = 0; v < NV; ++v) {
      float* sp = s + jj * bq + v * N;
      VF t = first ? acc[jj][v] : hn::Add(hn::Load(df, sp), acc[jj][v]);
      if (last) t = hn::Mul(t, scale);
      hn::Store(t, df, sp);
    }
  }
}

// Scores of KT keys against NV vectors of rows: s[jj][r] for jj < KT.
// krow[jj] points at key jj's d features; qt is [d][BQ]. Each score is
// blocked chains (detail::kScoreBlock, attention_args.h): a float FMA chain
// over each block of 16 features in index order, each block's chain added
// in float to the running total of the blocks before it (kept in s), then
// one multiply by the scale. AttentionScore (attention-inl.h) is the scalar
// twin, bit for bit.
template <std::size_t NV, std::size_t KT>
HWY_INLINE void ScoreTile(const float* HWY_RESTRICT qt, std::size_t bq,
                          const float* const* krow, std::size_t d, VF scale,
                          float* HWY_RESTRICT s) {
  const DF df;
  const std::size_t N = hn::Lanes(df);
  constexpr std::size_t kB = detail::kScoreBlock;
  const float* kp[KT];
#pragma GCC unroll 16
  for (std::size_t jj = 0; jj < KT; ++jj) kp[jj] = krow[jj];
  for (std::size_t k0 = 0; k0 < d; k0 += kB) {
    const std::size_t k1 = std::min(d, k0 + kB);
    VF acc[KT][NV];
#pragma GCC unroll 16
    for (std::size_t jj = 0; jj < KT; ++jj) {
#pragma GCC unroll 4
      for (std::size_t v = 0; v < NV; ++v) acc[jj][v] = hn::Zero(df);
    }
    for (std::size_t k = k0; k < k1; ++k) {
      VF q[NV];
#pragma GCC unroll 4
      for (std::size_t v = 0; v < NV; ++v)
        q[v] = hn::Load(df, qt + k * bq + v * N);
#pragma GCC unroll 16
      for (std::size_t jj = 0; jj < KT; ++jj) {
        const VF kv = hn::Set(df, kp[jj][k]);
#pragma GCC unroll 4
        for (std::size_t v = 0; v < NV; ++v) {
          acc[jj][v] = hn::MulAdd(kv, q[v], acc[jj][v]);
        }
      }
    }
    AddBlockScores<NV, KT>(acc, bq, k0 == 0, k1 == d, scale, s);
  }
}

// The precise form of ScoreTile (AttnArgs::precise): each score is one
// double FMA chain over d in index order (the float products are exact in
// double), multiplied by the scale in double, then split into hi, the float
// nearest to it (s), and lo, the float nearest to the rest (lo): hi + lo is
// the double score within 2^-48 |s|. qtd is Qt in double, [d][BQ].
template <std::size_t NV, std::size_t KT>
HWY_INLINE void ScoreTilePrecise(const double* HWY_RESTRICT qtd, std::size_t bq,
                                 const float* const* krow, std::size_t d,
                                 double scale, float* HWY_RESTRICT s,
                                 float* HWY_RESTRICT lo) {
  const DD dd;
  const hn::Rebind<float, DD> dfh;
  const std::size_t ND = hn::Lanes(dd);
  constexpr std::size_t kW = NV * (hn::MaxLanes(DF()) / hn::MaxLanes(DD()));
  VD acc[KT][kW];
#pragma GCC unroll 16
  for (std::size_t jj = 0; jj < KT; ++jj) {
#pragma GCC unroll 8
    for (std::size_t w = 0; w < kW; ++w) acc[jj][w] = hn::Zero(dd);
  }
  for (std::size_t k = 0; k < d; ++k) {
    VD q[kW];
#pragma GCC unroll 8
    for (std::size_t w = 0; w < kW; ++w)
      q[w] = hn::Load(dd, qtd + k * bq + w * ND);
#pragma GCC unroll 16
    for (std::size_t jj = 0; jj < KT; ++jj) {
      const VD kv = hn::Set(dd, static_cast<double>(krow[jj][k]));
#pragma GCC unroll 8
      for (std::size_t w = 0; w < kW; ++w) {
        acc[jj][w] = hn::MulAdd(kv, q[w], acc[jj][w]);
      }
    }
  }
  const VD sc = hn::Set(dd, scale);
#pragma GCC unroll 16
  for (std::size_t jj = 0; jj < KT; ++jj) {
#pragma GCC unroll 8
    for (std::size_t w = 0; w < kW; ++w) {
      const VD x = hn::Mul(acc[jj][w], sc);
      const auto hi = hn::DemoteTo(dfh, x);
      const VD rest = hn::Sub(x, hn::PromoteTo(dd, hi));
      hn::StoreU(hi, dfh, s + jj * bq + w * ND);
      hn::StoreU(hn::DemoteTo(dfh, rest), dfh, lo + jj * bq + w * ND);
    }
  }
}

// acc[c][r] = sum_{j < kb} P[j][r] * V[j][c0 + c] for CT columns, as
// blocked chains like the scores': a float FMA chain over each block of
// kValueBlock keys, each block's chain added in float to the total of the
// blocks before it (kept in a stack tile); with kGuard, lanes whose score
// S[j][r] is -inf skip the term (masked values must not reach the output,
// even NaN * 0).
template <std::size_t NV, std::size_t CT, bool kGuard>
HWY_INLINE void ValueTile(const float* HWY_RESTRICT p,
                          const float* HWY_RESTRICT sc, std::size_t bq,
                          const float* HWY_RESTRICT vb, std::size_t vstride,
                          std::size_t kb, VF (&acc)[CT][NV]) {
  const DF df;
  const std::size_t N = hn::Lanes(df);
  constexpr std::size_t kB = detail::kValueBlock;
  constexpr std::size_t kL = hn::MaxLanes(DF());
  HWY_ALIGN float tot[CT * NV * kL];
  const VF neg_inf = hn::Set(df, -std::numeric_limits<float>::infinity());
#pragma GCC unroll 16
  for (std::size_t c = 0; c < CT; ++c) {
#pragma GCC unroll 4
    for (std::size_t v = 0; v < NV; ++v) acc[c][v] = hn::Zero(df);
  }
  for (std::size_t j0 = 0; j0 < kb; j0 += kB) {
    const std::size_t j1 = std::min(kb, j0 + kB);
    // The total of the blocks before this one goes to tot.
    if (j0 != 0) {
#pragma GCC unroll 16
      for (std::size_t c = 0; c < CT; ++c) {
#pragma GCC unroll 4
        for (std::size_t v = 0; v < NV; ++v) {
          hn::Store(acc[c][v], df, tot + (c * NV + v) * kL);
          acc[c][v] = hn::Zero(df);
        }
      }
    }
    for (std::size_t j = j0; j < j1; ++j) {
      VF pv[NV];
#pragma GCC unroll 4
      for (std::size_t v = 0; v < NV; ++v)
        pv[v] = hn::Load(df, p + j * bq + v * N);
      const float* vrow = vb + j * vstride;
      if constexpr (kGuard) {
        hn::Mask<DF> live[NV];
#pragma GCC unroll 4
        for (std::size_t v = 0; v < NV; ++v) {
          live[v] = hn::Ne(hn::Load(df, sc + j * bq + v * N), neg_inf);
        }
#pragma GCC unroll 16
        for (std::size_t c = 0; c < CT; ++c) {
          const VF vv = hn::Set(df, vrow[c]);
#pragma GCC unroll 4
          for (std::size_t v = 0; v < NV; ++v) {
            acc[c][v] = hn::IfThenElse(
                live[v], hn::MulAdd(vv, pv[v], acc[c][v]), acc[c][v]);
          }
        }
      } else {
#pragma GCC unroll 16
        for (std::size_t c = 0; c < CT; ++c) {
          const VF vv = hn::Set(df, vrow[c]);
#pragma GCC unroll 4
          for (std::size_t v = 0; v < NV; ++v) {
            acc[c][v] = hn::MulAdd(vv, pv[v], acc[c][v]);
          }
        }
      }
    }
    if (j0 != 0) {
#pragma GCC unroll 16
      for (std::size_t c = 0; c < CT; ++c) {
#pragma GCC unroll 4
        for (std::size_t v = 0; v < NV; ++v) {
          acc[c][v] = hn::Add(hn::Load(df, tot + (c * NV + v) * kL), acc[c][v]);
        }
      }
    }
  }
}

// The key range the rows of a block see, over the live rows.
struct KeyLimits {
  std::int32_t first_min = std::numeric_limits<std::int32_t>::max();
  std::int32_t first_max = std::numeric_limits<std::int32_t>::min();
  std::int32_t last_min = std::numeric_limits<std::int32_t>::max();
  std::int32_t last_max = std::numeric_limits<std::int32_t>::min();
};

// The prefill form's pieces of the scratch buffer (sizes:
// attention_scratch_floats in attention_args.h), for bq lanes of rows.
HWY_INLINE Scratch PrefillScratch(const AttnArgs& a, std::size_t bq) {
  const std::size_t d = a.d, dv = a.dv;
  const bool precise = a.precise;
  Scratch sc;
  float* f = AlignUp(a.scratch);
  auto take = [&f](std::size_t n) {
    float* r = f;
    f = AlignUp(f + n);
    return r;
  };
  sc.qt = take(d * bq);
  sc.s = take(kKeyTile * bq);
  sc.p = take(kKeyTile * bq);
  sc.kc = KvWidened(a) ? take(kKeyTile * d) : nullptr;
  sc.vc = KvWidened(a) ? take(kKeyTile * dv) : nullptr;
  sc.add = take(bq);
  sc.od = reinterpret_cast<double*>(take(2 * dv * bq));
  sc.l = reinterpret_cast<double*>(take(2 * bq));
  sc.alpha = reinterpret_cast<double*>(take(2 * bq));
  sc.m = take(bq);
  sc.nan = take(bq);
  sc.first_key = reinterpret_cast<std::int32_t*>(take(bq));
  sc.last_key = reinterpret_cast<std::int32_t*>(take(bq));
  sc.qtd = precise ? reinterpret_cast<double*>(take(2 * d * bq)) : nullptr;
  sc.slo = precise ? take(kKeyTile * bq) : nullptr;
  const bool units = a.units != 0;
  auto take_u32 = [&take](std::size_t n) {
    return reinterpret_cast<std::uint32_t*>(take(n));
  };
  sc.qp = units ? take_u32((d + 1) / 2 * bq) : nullptr;
  sc.pp = units ? take_u32(kKeyTile / 2 * bq) : nullptr;
  sc.pl = units ? take_u32(kKeyTile / 2 * bq) : nullptr;
  sc.vp = units ? take_u32(kKeyTile / 2 * dv) : nullptr;
  return sc;
}

// Q packed transposed (padding lanes hold zeros and see every key; not
// with pack_q false: the units pack their own pairs), each lane's key
// limits and initial state, the output zeroed; returns the limits over the
// live rows.
HWY_INLINE KeyLimits PrefillPackRows(const AttnArgs& a, const Scratch& sc,
                                     std::size_t bq, bool pack_q = true) {
  const std::size_t d = a.d, rows = a.rows;
  for (std::size_t k = 0; pack_q && k < d; ++k) {
    float* dst = sc.qt + k * bq;
    for (std::size_t r = 0; r < rows; ++r) dst[r] = a.q_rows[r][k];
    for (std::size_t r = rows; r < bq; ++r) dst[r] = 0.0f;
    if (a.precise) {
      for (std::size_t r = 0; r < bq; ++r) sc.qtd[k * bq + r] = dst[r];
    }
  }
  KeyLimits lim;
  for (std::size_t r = 0; r < bq; ++r) {
    const bool live = r < rows;
    sc.first_key[r] = live ? a.first_key[r] : 0;
    sc.last_key[r] =
        live ? a.last_key[r] : std::numeric_limits<std::int32_t>::max();
    if (live) {
      lim.first_min = std::min(lim.first_min, a.first_key[r]);
      lim.first_max = std::max(lim.first_max, a.first_key[r]);
      lim.last_min = std::min(lim.last_min, a.last_key[r]);
      lim.last_max = std::max(lim.last_max, a.last_key[r]);
    }
    float m0;
    double l0;
    bool nan0;
    InitialState(live ? a.sinks : nullptr, r, m0, l0, nan0);
    sc.m[r] = m0;
    sc.l[r] = l0;
    sc.nan[r] = nan0 ? 1.0f : 0.0f;
  }
  std::memset(sc.od, 0, a.dv * bq * sizeof(double));
  return lim;
}

// Step 3: the scores S[j][r] of the block's kb keys (tiles of KT keys, or
// KTP in double for the precise mode, then single keys).
template <std::size_t NV>
HWY_INLINE void PrefillScores(const AttnArgs& a, const Scratch& sc,
                              std::size_t bq, const BlockRows& kv,
                              std::size_t kb, VF scale) {
  constexpr std::size_t KT = kAccRegs / NV;
  // Keys per precise score tile: double vectors of rows take twice the
  // registers.
  constexpr std::size_t kRatio = hn::MaxLanes(DF()) / hn::MaxLanes(DD());
  constexpr std::size_t KTP =
      kAccRegs / (NV * kRatio) > 0 ? kAccRegs / (NV * kRatio) : 1;
  const std::size_t d = a.d;
  const float* kbase = kv.k;
  const std::size_t kstride = kv.k_stride;
  if (a.precise) {
    std::size_t j = 0;
    const float* kr[KTP];
    for (; j + KTP <= kb; j += KTP) {
      for (std::size_t jj = 0; jj < KTP; ++jj)
        kr[jj] = kbase + (j + jj) * kstride;
      ScoreTilePrecise<NV, KTP>(sc.qtd, bq, kr, d, a.scale, sc.s + j * bq,
                                sc.slo + j * bq);
    }
    for (; j < kb; ++j) {
      kr[0] = kbase + j * kstride;
      ScoreTilePrecise<NV, 1>(sc.qtd, bq, kr, d, a.scale, sc.s + j * bq,
                              sc.slo + j * bq);
    }
  } else {
    std::size_t j = 0;
    const float* kr[KT];
    for (; j + KT <= kb; j += KT) {
      for (std::size_t jj = 0; jj < KT; ++jj)
        kr[jj] = kbase + (j + jj) * kstride;
      ScoreTile<NV, KT>(sc.qt, bq, kr, d, scale, sc.s + j * bq);
    }
    for (; j < kb; ++j) {
      kr[0] = kbase + j * kstride;
      ScoreTile<NV, 1>(sc.qt, bq, kr, d, scale, sc.s + j * bq);
    }
  }
}

// What step 4 leaves for step 5, per vector of rows: the block's max and
// min scores and the NaN flags (the rows' earlier ones included).
template <std::size_t NV>
struct BlockExtremes {
  VF mx[NV], mn[NV];
  hn::Mask<DF> nan[NV];
  // With the target's attributes, as PlainDot::State's (dot-inl.h): GCC
  // for aarch64 refuses to inline the vectors' constructors into an
  // implicit one (target specific option mismatch).
  HWY_ATTR BlockExtremes() {}
};

// Step 4: soft-cap, bias, mask and the causal / window limits applied to
// the block's scores in place; their NaN flags, max and min.
template <std::size_t NV>
HWY_INLINE void PrefillMaskScores(const AttnArgs& a, const Scratch& sc,
                                  std::size_t bq, std::size_t j0,
                                  std::size_t kb, bool straddles,
                                  BlockExtremes<NV>& ex) {
  const DF df;
  const DI di;
  const std::size_t N = hn::Lanes(df);
  const std::size_t rows = a.rows;
  const bool precise = a.precise;
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const bool extra = a.mask_rows != nullptr || a.bias_rows != nullptr ||
                     a.alibi_slopes != nullptr;
  const VF neg_inf = hn::Set(df, -kInf);
  const VF pos_inf = hn::Set(df, kInf);
  const bool softcap = a.softcap > 0.0f;
  const VF cap = hn::Set(df, a.softcap);
  for (std::size_t v = 0; v < NV; ++v) {
    ex.mx[v] = neg_inf;
    ex.mn[v] = pos_inf;
    ex.nan[v] = hn::Ne(hn::Load(df, sc.nan + v * N), hn::Zero(df));
  }
  for (std::size_t j = 0; j < kb; ++j) {
    if (extra) {
      for (std::size_t r = 0; r < bq; ++r) {
        float add = 0.0f;
        if (r < rows) {
          if (a.bias_rows != nullptr && a.bias_rows[r] != nullptr) {
            add = a.bias_rows[r][j0 + j];
          }
          if (a.alibi_slopes != nullptr) {
            add = detail::alibi_term(a.alibi_slopes[r], j0 + j, a.alibi_base[r],
                                     a.alibi_stride);
          }
          if (a.mask_rows != nullptr && a.mask_rows[r] != nullptr &&
              a.mask_rows[r][j0 + j] == 0) {
            add = -kInf;
          }
        }
        sc.add[r] = add;
      }
    }
    const auto jv = hn::Set(di, static_cast<std::int32_t>(j0 + j));
    for (std::size_t v = 0; v < NV; ++v) {
      float* sp = sc.s + j * bq + v * N;
      VF s = hn::Load(df, sp);
      if (softcap) s = Softcap(s, cap);
      // Precise: the low part (dropped by the soft-cap, which rounds the
      // capped score to float) gains the exact error of the bias add.
      VF lo = hn::Zero(df);
      if (precise && !softcap) lo = hn::Load(df, sc.slo + j * bq + v * N);
      if (extra) {
        const VF add = hn::Load(df, sc.add + v * N);
        const VF t = hn::Add(s, add);
        if (precise) lo = hn::Add(lo, TwoSumErr(s, add, t));
        s = hn::IfThenElse(hn::Eq(add, neg_inf), neg_inf, t);
      }
      if (straddles) {
        const auto out = hn::Or(hn::Lt(jv, hn::Load(di, sc.first_key + v * N)),
                                hn::Gt(jv, hn::Load(di, sc.last_key + v * N)));
        s = hn::IfThenElse(hn::RebindMask(df, out), neg_inf, s);
      }
      if (softcap || extra || straddles) hn::Store(s, df, sp);
      if (precise) {
        hn::Store(hn::IfThenElseZero(hn::IsFinite(s), lo), df,
                  sc.slo + j * bq + v * N);
      }
      ex.nan[v] = hn::Or(ex.nan[v], hn::IsNaN(s));
      ex.mx[v] = hn::Max(ex.mx[v], s);
      ex.mn[v] = hn::Min(ex.mn[v], s);
    }
  }
}

// Step 5: the new max, alpha = exp(m - m'), P = exp(S - m') and the block
// sums in double (l = alpha l + sum). Returns whether a score of the block
// is -inf (masked).
template <std::size_t NV>
HWY_INLINE bool PrefillSoftmaxStep(const Scratch& sc, std::size_t bq,
                                   std::size_t kb, bool precise,
                                   const BlockExtremes<NV>& ex) {
  const DF df;
  const DD dd;
  const std::size_t N = hn::Lanes(df);
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const VF neg_inf = hn::Set(df, -kInf);
  const VF pos_inf = hn::Set(df, kInf);
  bool any_masked = false;
  bool any_inf = false;
  VF msafe[NV], inf_lane_v[NV];
  for (std::size_t v = 0; v < NV; ++v) {
    const VF m_old = hn::Load(df, sc.m + v * N);
    const VF m_new = hn::Max(m_old, ex.mx[v]);
    const auto inf_lane = hn::Eq(m_new, pos_inf);
    any_inf = any_inf || !hn::AllFalse(df, inf_lane);
    any_masked = any_masked || !hn::AllFalse(df, hn::Eq(ex.mn[v], neg_inf));
    const VF ms = hn::IfThenElseZero(hn::IsFinite(m_new), m_new);
    msafe[v] = ms;
    inf_lane_v[v] = hn::IfThenElseZero(inf_lane, hn::Set(df, 1.0f));
    VF alpha = ExpNonPositive(df, hn::Sub(m_old, ms), hn::Zero(df));
    alpha = hn::IfThenElse(
        inf_lane, hn::IfThenElseZero(hn::Eq(m_old, pos_inf), hn::Set(df, 1.0f)),
        alpha);
    hn::Store(m_new, df, sc.m + v * N);
    hn::Store(hn::IfThenElseZero(ex.nan[v], hn::Set(df, 1.0f)), df,
              sc.nan + v * N);
    HWY_ALIGN float al[hn::MaxLanes(DF())];
    hn::Store(alpha, df, al);
    for (std::size_t i = 0; i < N; ++i) sc.alpha[v * N + i] = al[i];
  }
  // The block sums, lane by lane in key order, in double registers (the
  // lower and upper halves of each vector of rows).
  HWY_ALIGN double sum[4 * hn::MaxLanes(DF())];
  const std::size_t ND = hn::Lanes(dd);
  VD sum_lo[NV], sum_hi[NV];
  for (std::size_t v = 0; v < NV; ++v) {
    sum_lo[v] = hn::Zero(dd);
    sum_hi[v] = hn::Zero(dd);
  }
  for (std::size_t j = 0; j < kb; ++j) {
    for (std::size_t v = 0; v < NV; ++v) {
      const VF s = hn::Load(df, sc.s + j * bq + v * N);
      const VF t = hn::Sub(s, msafe[v]);
      // Precise: exp(t + c), c the exact error of t plus the score's low
      // part (ExpNonPositive zeroes c where t is below its range).
      VF c = hn::Zero(df);
      if (precise) {
        c = hn::Add(TwoSumErr(s, hn::Neg(msafe[v]), t),
                    hn::Load(df, sc.slo + j * bq + v * N));
      }
      VF p = ExpNonPositive(df, t, c);
      if (HWY_UNLIKELY(any_inf)) {
        const auto il = hn::Ne(inf_lane_v[v], hn::Zero(df));
        p = hn::IfThenElse(
            il, hn::IfThenElseZero(hn::Eq(s, pos_inf), hn::Set(df, 1.0f)), p);
      }
      hn::Store(p, df, sc.p + j * bq + v * N);
#if HWY_TARGET == HWY_SCALAR
      sum_lo[v] = hn::Add(sum_lo[v], hn::PromoteTo(dd, p));
#else
      const hn::Half<DF> dh;
      sum_lo[v] = hn::Add(sum_lo[v], hn::PromoteTo(dd, hn::LowerHalf(dh, p)));
      sum_hi[v] = hn::Add(sum_hi[v], hn::PromoteTo(dd, hn::UpperHalf(dh, p)));
#endif
    }
  }
  for (std::size_t v = 0; v < NV; ++v) {
    hn::Store(sum_lo[v], dd, sum + v * N);
    if (N > ND) hn::Store(sum_hi[v], dd, sum + v * N + ND);
  }
  for (std::size_t i = 0; i < bq; i += ND) {
    hn::Store(hn::MulAdd(hn::Load(dd, sc.l + i), hn::Load(dd, sc.alpha + i),
                         hn::Load(dd, sum + i)),
              dd, sc.l + i);
  }
  return any_masked;
}

// Step 6: O = alpha O + P V, in tiles of CT columns, then single columns;
// with the guard, masked terms are skipped lane by lane.
template <std::size_t NV>
HWY_INLINE void PrefillValues(const Scratch& sc, std::size_t bq,
                              const BlockRows& kv, std::size_t kb,
                              std::size_t dv, bool guard) {
  constexpr std::size_t CT = kAccRegs / NV;
  const float* vbase = kv.v;
  const std::size_t vstride = kv.v_stride;
  std::size_t c = 0;
  VF acc[CT][NV];
  for (; c + CT <= dv; c += CT) {
    if (guard) {
      ValueTile<NV, CT, true>(sc.p, sc.s, bq, vbase + c, vstride, kb, acc);
    } else {
      ValueTile<NV, CT, false>(sc.p, sc.s, bq, vbase + c, vstride, kb, acc);
    }
    for (std::size_t cc = 0; cc < CT; ++cc) {
      FlushColumn<NV>(acc[cc], sc.alpha, sc.od + (c + cc) * bq);
    }
  }
  for (; c < dv; ++c) {
    VF acc1[1][NV];
    if (guard) {
      ValueTile<NV, 1, true>(sc.p, sc.s, bq, vbase + c, vstride, kb, acc1);
    } else {
      ValueTile<NV, 1, false>(sc.p, sc.s, bq, vbase + c, vstride, kb, acc1);
    }
    FlushColumn<NV>(acc1[0], sc.alpha, sc.od + c * bq);
  }
}

// The state of each row; a NaN seen makes l NaN.
HWY_INLINE void PrefillStoreStates(const AttnArgs& a, const Scratch& sc,
                                   std::size_t bq) {
  const std::size_t dv = a.dv;
  for (std::size_t r = 0; r < a.rows; ++r) {
    const bool is_nan = sc.nan[r] != 0.0f;
    a.out_m[r] = sc.m[r];
    a.out_l[r] = is_nan ? std::numeric_limits<double>::quiet_NaN() : sc.l[r];
    double* o = a.out_o + r * dv;
    for (std::size_t cc = 0; cc < dv; ++cc) o[cc] = sc.od[cc * bq + r];
  }
}

// The prefill form over NV vectors of rows: the steps of attention-inl.h's
// overview, block by block.
template <std::size_t NV>
void RunPrefill(const AttnArgs& a) {
  const DF df;
  const std::size_t bq = NV * hn::Lanes(df);
  const Scratch sc = PrefillScratch(a, bq);
  const KeyLimits lim = PrefillPackRows(a, sc, bq);
  const VF scale = hn::Set(df, a.scale);
  for (std::size_t j0 = a.j_begin; j0 < a.j_end; j0 += kKeyTile) {
    const std::size_t kb = std::min(kKeyTile, a.j_end - j0);
    const auto first = static_cast<std::int64_t>(j0);
    const auto last = static_cast<std::int64_t>(j0 + kb - 1);
    if (last < lim.first_min || first > lim.last_max)
      continue;  // hidden from every row
    const bool straddles = first < lim.first_max || last > lim.last_min;

    // Keys and values of the block, as float rows.
    const BlockRows kv = LoadBlock(a, j0, kb, sc.kc, sc.vc);
    PrefillScores<NV>(a, sc, bq, kv, kb, scale);
    BlockExtremes<NV> ex;
    PrefillMaskScores<NV>(a, sc, bq, j0, kb, straddles, ex);
    const bool any_masked = PrefillSoftmaxStep<NV>(sc, bq, kb, a.precise, ex);
    const bool guard = any_masked && !AllFinite(kv.v, kv.v_stride, kb, a.dv);
    PrefillValues<NV>(sc, bq, kv, kb, a.dv, guard);
  }
  PrefillStoreStates(a, sc, bq);
}

}  // namespace attn
}  // namespace HWY_NAMESPACE
}  // namespace softdot
HWY_AFTER_NAMESPACE();

#endif  // SOFTDOT_KERNELS_ATTENTION_PREFILL_INL_H_
