// softdot kernels: fused attention for one block of query rows against a
// range of keys (online softmax over blocks of kKeyBlock keys).
//
// Layout: query rows live in vector lanes. A block of up to kMaxRows rows is
// packed transposed, Qt[k][r] = Q[r][k], so that for one key j and one
// feature k, the FMA acc[r] += K[j][k] * Qt[k][r] advances the scores of
// every row at once. Each score is therefore a plain float FMA chain over
// k = 0..d-1 in index order, whatever the vector width or the number of rows
// in the block: the same bits on every FMA target, and the same bits as the
// scalar loop of attention_weights(). Row-wise steps of the softmax (max,
// exp, sums, rescaling) are lane-wise too, so nothing is reduced across
// lanes.
//
// Per key block (64 keys, relative to the first key of the range):
//   1. skip the block if the causal/window limits hide it from every row;
//   2. (Float16/BFloat16) widen the block of K and V to float scratch;
//   3. S[j][r] = scale * (Q_r . K_j): tiles of KT keys x NV vectors of rows,
//      K broadcast from memory, Qt loaded;
//   4. soft-cap, bias and mask (-inf), causal/window limits (per-lane key
//      bounds, only in blocks that straddle them); track NaN and the max;
//   5. m' = max(m, block max); alpha = exp(m - m'); P = exp(S - m') (float);
//      the block sum of P is taken in double;
//   6. O[c][r] = alpha O[c][r] + sum_j P[j][r] V[j][c]: the inner sum is a
//      float FMA chain over the block's (at most 64) keys, in tiles of CT
//      columns x NV vectors of rows, then added into a double accumulator.
//      If the block holds a masked (-inf) score and the V block holds a
//      non-finite value, the FMA is skipped lane by lane where the score is
//      -inf, so that masked NaN/inf values never reach the output.
// +inf scores: a lane whose max is +inf gets P = 1 at its +inf scores and 0
// elsewhere, and alpha = 1 or 0, so it ends with the mean of those values.
// The result is the state (m, l, O) of each row; the caller normalises and
// merges (src/attention.cc).

#if defined(SOFTDOT_KERNELS_ATTENTION_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SOFTDOT_KERNELS_ATTENTION_INL_H_
#undef SOFTDOT_KERNELS_ATTENTION_INL_H_
#else
#define SOFTDOT_KERNELS_ATTENTION_INL_H_
#endif

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>

#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"
#include "kernels/attention_args.h"
#include "kernels/dot-inl.h"
#include "kernels/exp-inl.h"
#include "softdot/attention.h"

HWY_BEFORE_NAMESPACE();
namespace softdot {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using detail::AttnArgs;
using detail::kKeyBlock;
using detail::kKvBF16;
using detail::kKvF32;
using ::softdot::Float16;

namespace attn {

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;
using DD = hn::ScalableTag<double>;
using VD = hn::Vec<DD>;
using DI = hn::RebindToSigned<DF>;

// Accumulator registers the tiles may use: 16 of 32 vector registers on
// AVX-512 and NEON, 8 of 16 elsewhere.
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL || \
    HWY_TARGET == HWY_NEON
constexpr std::size_t kAccRegs = 16;
#else
constexpr std::size_t kAccRegs = 8;
#endif

HWY_INLINE std::size_t Lanes() { return hn::Lanes(DF()); }

// Rows per kernel call on this target: four vectors of lanes.
HWY_INLINE std::size_t MaxRows() { return 4 * Lanes(); }

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

// Widens n elements of K or V storage to float.
HWY_INLINE void Widen(const float* src, float* dst, std::size_t n) {
  std::memcpy(dst, src, n * sizeof(float));
}
HWY_INLINE void Widen(const std::uint16_t* src, float* dst, std::size_t n,
                      bool bf16) {
  const DF df;
  const std::size_t N = hn::Lanes(df);
  std::size_t i = 0;
  if (bf16) {
    const hn::RebindToUnsigned<DF> du;
    const hn::Rebind<std::uint16_t, DF> d16;
    for (; i + N <= n; i += N) {
      const auto w = hn::PromoteTo(du, hn::LoadU(d16, src + i));
      hn::StoreU(hn::BitCast(df, hn::ShiftLeft<16>(w)), df, dst + i);
    }
    for (; i < n; ++i) {
      const std::uint32_t w = static_cast<std::uint32_t>(src[i]) << 16;
      std::memcpy(dst + i, &w, 4);
    }
  } else {
#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3 || \
    HWY_TARGET == HWY_AVX3_DL || HWY_TARGET == HWY_NEON
    // F16C / NEON conversions: exact, infinities and NaN included.
    const hn::Rebind<hwy::float16_t, DF> dh;
    const auto* h = reinterpret_cast<const hwy::float16_t*>(src);
    for (; i + N <= n; i += N) {
      hn::StoreU(hn::PromoteTo(df, hn::LoadU(dh, h + i)), df, dst + i);
    }
#endif
    // Elsewhere Highway 1.0.3 emulates the conversion and turns exponent 31
    // (inf, NaN) into finite numbers, so the rest goes bit by bit.
    for (; i < n; ++i) dst[i] = ::softdot::to_float(Float16{src[i]});
  }
}

// Scores of KT keys against NV vectors of rows: s[jj][r] for jj < KT.
// krow[jj] points at key jj's d features; qt is [d][BQ].
template <std::size_t NV, std::size_t KT>
HWY_INLINE void ScoreTile(const float* HWY_RESTRICT qt, std::size_t bq,
                          const float* const* krow, std::size_t d, VF scale,
                          float* HWY_RESTRICT s) {
  const DF df;
  const std::size_t N = hn::Lanes(df);
  VF acc[KT][NV];
#pragma GCC unroll 16
  for (std::size_t jj = 0; jj < KT; ++jj) {
#pragma GCC unroll 4
    for (std::size_t v = 0; v < NV; ++v) acc[jj][v] = hn::Zero(df);
  }
  const float* kp[KT];
#pragma GCC unroll 16
  for (std::size_t jj = 0; jj < KT; ++jj) kp[jj] = krow[jj];
  for (std::size_t k = 0; k < d; ++k) {
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
#pragma GCC unroll 16
  for (std::size_t jj = 0; jj < KT; ++jj) {
#pragma GCC unroll 4
    for (std::size_t v = 0; v < NV; ++v) {
      hn::Store(hn::Mul(acc[jj][v], scale), df, s + jj * bq + v * N);
    }
  }
}

// acc[c][r] = sum_{j < kb} P[j][r] * V[j][c0 + c] for CT columns, as a float
// FMA chain over j; with kGuard, lanes whose score S[j][r] is -inf skip the
// term (masked values must not reach the output, even NaN * 0).
template <std::size_t NV, std::size_t CT, bool kGuard>
HWY_INLINE void ValueTile(const float* HWY_RESTRICT p,
                          const float* HWY_RESTRICT sc, std::size_t bq,
                          const float* HWY_RESTRICT vb, std::size_t vstride,
                          std::size_t kb, VF (&acc)[CT][NV]) {
  const DF df;
  const std::size_t N = hn::Lanes(df);
#pragma GCC unroll 16
  for (std::size_t c = 0; c < CT; ++c) {
#pragma GCC unroll 4
    for (std::size_t v = 0; v < NV; ++v) acc[c][v] = hn::Zero(df);
  }
  const VF neg_inf = hn::Set(df, -std::numeric_limits<float>::infinity());
  for (std::size_t j = 0; j < kb; ++j) {
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
          acc[c][v] = hn::IfThenElse(live[v], hn::MulAdd(vv, pv[v], acc[c][v]),
                                     acc[c][v]);
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

// The float rows of one block of keys and values: the caller's memory for
// float32, else the block widened into scratch (kc [kb][d], vc [kb][dv]).
struct BlockRows {
  const float* k;
  std::size_t k_stride;
  const float* v;
  std::size_t v_stride;
};

HWY_INLINE BlockRows LoadBlock(const AttnArgs& a, std::size_t j0,
                               std::size_t kb, float* kc, float* vc) {
  if (a.kv_type == kKvF32) {
    return {static_cast<const float*>(a.k) + j0 * a.k_stride, a.k_stride,
            static_cast<const float*>(a.v) + j0 * a.v_stride, a.v_stride};
  }
  const bool bf16 = a.kv_type == kKvBF16;
  const auto* k16 = static_cast<const std::uint16_t*>(a.k);
  const auto* v16 = static_cast<const std::uint16_t*>(a.v);
  for (std::size_t j = 0; j < kb; ++j) {
    Widen(k16 + (j0 + j) * a.k_stride, kc + j * a.d, a.d, bf16);
    Widen(v16 + (j0 + j) * a.v_stride, vc + j * a.dv, a.dv, bf16);
  }
  return {kc, a.d, vc, a.dv};
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
  float* qt;         // [d][bq]
  float* s;          // [kKeyBlock][bq] scores (then kept for the guard)
  float* p;          // [kKeyBlock][bq] exp(s - m)
  float* kc;         // [kKeyBlock][d] widened keys
  float* vc;         // [kKeyBlock][dv] widened values
  float* add;        // [bq] bias / mask of one key
  double* od;        // [dv][bq] output accumulators
  double* l;         // [bq] sums
  double* alpha;     // [bq]
  float* m;          // [bq] running max
  float* nan;        // [bq] 1 where a NaN was seen
  std::int32_t* lo;  // [bq]
  std::int32_t* hi;  // [bq]
};

HWY_INLINE float* AlignUp(float* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  return reinterpret_cast<float*>((a + 63) & ~std::uintptr_t{63});
}

template <std::size_t NV>
void RunBlock(const AttnArgs& a) {
  const DF df;
  const DD dd;
  const DI di;
  const std::size_t N = hn::Lanes(df);
  const std::size_t bq = NV * N;
  const std::size_t d = a.d, dv = a.dv, rows = a.rows;
  constexpr std::size_t KT = kAccRegs / NV;
  constexpr std::size_t CT = kAccRegs / NV;
  constexpr float kInf = std::numeric_limits<float>::infinity();

  // Scratch (sizes: attention_scratch_floats in attention_args.h).
  Scratch sc;
  float* f = AlignUp(a.scratch);
  auto take = [&f](std::size_t n) {
    float* r = f;
    f = AlignUp(f + n);
    return r;
  };
  sc.qt = take(d * bq);
  sc.s = take(kKeyBlock * bq);
  sc.p = take(kKeyBlock * bq);
  sc.kc = a.kv_type == kKvF32 ? nullptr : take(kKeyBlock * d);
  sc.vc = a.kv_type == kKvF32 ? nullptr : take(kKeyBlock * dv);
  sc.add = take(bq);
  sc.od = reinterpret_cast<double*>(take(2 * dv * bq));
  sc.l = reinterpret_cast<double*>(take(2 * bq));
  sc.alpha = reinterpret_cast<double*>(take(2 * bq));
  sc.m = take(bq);
  sc.nan = take(bq);
  sc.lo = reinterpret_cast<std::int32_t*>(take(bq));
  sc.hi = reinterpret_cast<std::int32_t*>(take(bq));

  // Pack Q transposed; padding lanes hold zeros and see every key.
  for (std::size_t k = 0; k < d; ++k) {
    float* dst = sc.qt + k * bq;
    for (std::size_t r = 0; r < rows; ++r) dst[r] = a.q_rows[r][k];
    for (std::size_t r = rows; r < bq; ++r) dst[r] = 0.0f;
  }
  std::int32_t lo_min = std::numeric_limits<std::int32_t>::max();
  std::int32_t lo_max = std::numeric_limits<std::int32_t>::min();
  std::int32_t hi_min = lo_min, hi_max = lo_max;
  for (std::size_t r = 0; r < bq; ++r) {
    const bool live = r < rows;
    sc.lo[r] = live ? a.lo[r] : 0;
    sc.hi[r] = live ? a.hi[r] : std::numeric_limits<std::int32_t>::max();
    if (live) {
      lo_min = std::min(lo_min, a.lo[r]);
      lo_max = std::max(lo_max, a.lo[r]);
      hi_min = std::min(hi_min, a.hi[r]);
      hi_max = std::max(hi_max, a.hi[r]);
    }
    float m0;
    double l0;
    bool nan0;
    InitialState(live ? a.sinks : nullptr, r, m0, l0, nan0);
    sc.m[r] = m0;
    sc.l[r] = l0;
    sc.nan[r] = nan0 ? 1.0f : 0.0f;
  }
  std::memset(sc.od, 0, dv * bq * sizeof(double));

  const bool extra = a.mask_rows != nullptr || a.bias_rows != nullptr;
  const VF scale = hn::Set(df, a.scale);
  const VF neg_inf = hn::Set(df, -kInf);
  const VF pos_inf = hn::Set(df, kInf);
  const bool softcap = a.softcap > 0.0f;
  const VF cap = hn::Set(df, a.softcap);

  for (std::size_t j0 = a.j_begin; j0 < a.j_end; j0 += kKeyBlock) {
    const std::size_t kb = std::min(kKeyBlock, a.j_end - j0);
    const auto first = static_cast<std::int64_t>(j0);
    const auto last = static_cast<std::int64_t>(j0 + kb - 1);
    if (last < lo_min || first > hi_max) continue;  // hidden from every row
    const bool straddles = first < lo_max || last > hi_min;

    // Keys and values of the block, as float rows.
    const BlockRows kv = LoadBlock(a, j0, kb, sc.kc, sc.vc);
    const float* kbase = kv.k;
    const std::size_t kstride = kv.k_stride;
    const float* vbase = kv.v;
    const std::size_t vstride = kv.v_stride;

    // 3. Scores.
    {
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

    // 4. Soft-cap, bias, mask, limits; NaN flags, max and min.
    VF mx[NV], mn[NV];
    hn::Mask<DF> nan[NV];
    for (std::size_t v = 0; v < NV; ++v) {
      mx[v] = neg_inf;
      mn[v] = pos_inf;
      nan[v] = hn::Ne(hn::Load(df, sc.nan + v * N), hn::Zero(df));
    }
    for (std::size_t j = 0; j < kb; ++j) {
      if (extra) {
        for (std::size_t r = 0; r < bq; ++r) {
          float add = 0.0f;
          if (r < rows) {
            if (a.bias_rows != nullptr && a.bias_rows[r] != nullptr) {
              add = a.bias_rows[r][j0 + j];
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
        if (extra) {
          const VF add = hn::Load(df, sc.add + v * N);
          s = hn::IfThenElse(hn::Eq(add, neg_inf), neg_inf, hn::Add(s, add));
        }
        if (straddles) {
          const auto out = hn::Or(hn::Lt(jv, hn::Load(di, sc.lo + v * N)),
                                  hn::Gt(jv, hn::Load(di, sc.hi + v * N)));
          s = hn::IfThenElse(hn::RebindMask(df, out), neg_inf, s);
        }
        if (softcap || extra || straddles) hn::Store(s, df, sp);
        nan[v] = hn::Or(nan[v], hn::IsNaN(s));
        mx[v] = hn::Max(mx[v], s);
        mn[v] = hn::Min(mn[v], s);
      }
    }

    // 5. New max, alpha, P = exp(S - m), block sums in double.
    bool any_masked = false;
    bool any_inf = false;
    VF msafe[NV], inf_lane_v[NV];
    for (std::size_t v = 0; v < NV; ++v) {
      const VF m_old = hn::Load(df, sc.m + v * N);
      const VF m_new = hn::Max(m_old, mx[v]);
      const auto inf_lane = hn::Eq(m_new, pos_inf);
      any_inf = any_inf || !hn::AllFalse(df, inf_lane);
      any_masked = any_masked || !hn::AllFalse(df, hn::Eq(mn[v], neg_inf));
      const VF ms = hn::IfThenElseZero(hn::IsFinite(m_new), m_new);
      msafe[v] = ms;
      inf_lane_v[v] = hn::IfThenElseZero(inf_lane, hn::Set(df, 1.0f));
      VF alpha = ExpNonPositive(df, hn::Sub(m_old, ms), hn::Zero(df));
      alpha = hn::IfThenElse(
          inf_lane,
          hn::IfThenElseZero(hn::Eq(m_old, pos_inf), hn::Set(df, 1.0f)), alpha);
      hn::Store(m_new, df, sc.m + v * N);
      hn::Store(hn::IfThenElseZero(nan[v], hn::Set(df, 1.0f)), df,
                sc.nan + v * N);
      HWY_ALIGN float al[hn::MaxLanes(DF())];
      hn::Store(alpha, df, al);
      for (std::size_t i = 0; i < N; ++i) sc.alpha[v * N + i] = al[i];
    }
    {
      HWY_ALIGN float pt[hn::MaxLanes(DF())];
      HWY_ALIGN double sum[4 * hn::MaxLanes(DF())];
      for (std::size_t i = 0; i < bq; ++i) sum[i] = 0.0;
      const std::size_t ND = hn::Lanes(dd);
      const hn::Rebind<float, DD> dfh;
      for (std::size_t j = 0; j < kb; ++j) {
        for (std::size_t v = 0; v < NV; ++v) {
          const VF s = hn::Load(df, sc.s + j * bq + v * N);
          VF p = ExpNonPositive(df, hn::Sub(s, msafe[v]), hn::Zero(df));
          if (HWY_UNLIKELY(any_inf)) {
            const auto il = hn::Ne(inf_lane_v[v], hn::Zero(df));
            p = hn::IfThenElse(
                il, hn::IfThenElseZero(hn::Eq(s, pos_inf), hn::Set(df, 1.0f)),
                p);
          }
          hn::Store(p, df, sc.p + j * bq + v * N);
          hn::Store(p, df, pt);
          for (std::size_t i = 0; i < N; i += ND) {
            double* sp = sum + v * N + i;
            hn::Store(hn::Add(hn::Load(dd, sp),
                              hn::PromoteTo(dd, hn::LoadU(dfh, pt + i))),
                      dd, sp);
          }
        }
      }
      for (std::size_t i = 0; i < bq; i += ND) {
        hn::Store(hn::MulAdd(hn::Load(dd, sc.l + i), hn::Load(dd, sc.alpha + i),
                             hn::Load(dd, sum + i)),
                  dd, sc.l + i);
      }
    }

    // 6. O = alpha O + P V.
    const bool guard = any_masked && !AllFinite(vbase, vstride, kb, dv);
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
  for (std::size_t r = 0; r < rows; ++r) {
    const bool is_nan = sc.nan[r] != 0.0f;
    a.out_m[r] = sc.m[r];
    a.out_l[r] = is_nan ? std::numeric_limits<double>::quiet_NaN() : sc.l[r];
    double* o = a.out_o + r * dv;
    for (std::size_t cc = 0; cc < dv; ++cc) o[cc] = sc.od[cc * bq + r];
  }
}

// Decode form, for at most kDecodeMaxRows rows (few queries, long key
// range): features in lanes. Each score is a 16-lane FMA chain over the
// features reduced in a fixed tree (DecodeScoreRows: the same bits on every
// FMA target), times the scale; the rest of the arithmetic is the one above,
// element for element: the same exp of s - m, block sums in double in key
// order, the same FMA chain over the block's keys for each output element, the
// same double flush. So only the scores' rounding differs from the prefill
// form.
template <std::size_t CV>
HWY_INLINE void DecodeValues(const float* HWY_RESTRICT p,
                             const float* HWY_RESTRICT s, bool guard,
                             const float* HWY_RESTRICT vb, std::size_t vstride,
                             std::size_t kb, std::size_t c0, VF (&acc)[CV]) {
  const DF df;
  const std::size_t N = hn::Lanes(df);
#pragma GCC unroll 8
  for (std::size_t i = 0; i < CV; ++i) acc[i] = hn::Zero(df);
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (std::size_t j = 0; j < kb; ++j) {
    if (guard && s[j] == kNegInf) continue;
    const VF pj = hn::Set(df, p[j]);
    const float* vr = vb + j * vstride + c0;
#pragma GCC unroll 8
    for (std::size_t i = 0; i < CV; ++i) {
      acc[i] = hn::MulAdd(hn::LoadU(df, vr + i * N), pj, acc[i]);
    }
  }
}

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

// Four rows at once: acc[r][i] = sum_j P[r][j] V[j][c0 + i N + lane].
HWY_INLINE void DecodeValues4(const float* HWY_RESTRICT p, std::size_t pstride,
                              const float* HWY_RESTRICT vb, std::size_t vstride,
                              std::size_t kb, std::size_t c0, VF (&acc)[4][4]) {
  const DF df;
  const std::size_t N = hn::Lanes(df);
#pragma GCC unroll 4
  for (std::size_t r = 0; r < 4; ++r) {
#pragma GCC unroll 4
    for (std::size_t i = 0; i < 4; ++i) acc[r][i] = hn::Zero(df);
  }
  for (std::size_t j = 0; j < kb; ++j) {
    const float* vr = vb + j * vstride + c0;
    VF vv[4];
#pragma GCC unroll 4
    for (std::size_t i = 0; i < 4; ++i) vv[i] = hn::LoadU(df, vr + i * N);
#pragma GCC unroll 4
    for (std::size_t r = 0; r < 4; ++r) {
      const VF pj = hn::Set(df, p[r * pstride + j]);
#pragma GCC unroll 4
      for (std::size_t i = 0; i < 4; ++i) {
        acc[r][i] = hn::MulAdd(vv[i], pj, acc[r][i]);
      }
    }
  }
}

// Columns c0..dv of one row: whole vectors, then a scalar FMA chain (the
// same per-element arithmetic).
template <class Flush>
HWY_INLINE void DecodeRowTail(const float* pr, const float* sr, bool guard,
                              const float* vbase, std::size_t vstride,
                              std::size_t kb, std::size_t c, std::size_t dv,
                              double* o, double alpha, const Flush& flush) {
  const std::size_t N = hn::Lanes(DF());
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (; c + N <= dv; c += N) {
    VF a1[1];
    DecodeValues<1>(pr, sr, guard, vbase, vstride, kb, c, a1);
    flush(a1[0], o + c);
  }
  for (; c < dv; ++c) {
    float acc1 = 0.0f;
    for (std::size_t j = 0; j < kb; ++j) {
      if (guard && sr[j] == kNegInf) continue;
      acc1 = std::fma(vbase[j * vstride + c], pr[j], acc1);
    }
    o[c] = std::fma(o[c], alpha, static_cast<double>(acc1));
  }
}

void RunDecode(const AttnArgs& a) {
  const DF df;
  const std::size_t N = hn::Lanes(df);
  const std::size_t d = a.d, dv = a.dv, rows = a.rows;
  constexpr float kInf = std::numeric_limits<float>::infinity();
  constexpr std::size_t B = kKeyBlock;

  float* f = AlignUp(a.scratch);
  auto take = [&f](std::size_t n) {
    float* r = f;
    f = AlignUp(f + n);
    return r;
  };
  float* S = take(rows * B);
  float* P = take(rows * B);
  const std::size_t dpad = (d + 15) / 16 * 16;
  float* qp = take(rows * dpad);
  for (std::size_t r = 0; r < rows; ++r) {
    std::memcpy(qp + r * dpad, a.q_rows[r], d * sizeof(float));
    std::memset(qp + r * dpad + d, 0, (dpad - d) * sizeof(float));
  }
  float* kc = a.kv_type == kKvF32 ? nullptr : take(B * d);
  float* vc = a.kv_type == kKvF32 ? nullptr : take(B * dv);
  double* od = reinterpret_cast<double*>(take(2 * rows * dv));
  float* add = take(B);
  float m[detail::kDecodeMaxRows];
  double l[detail::kDecodeMaxRows];
  bool nan[detail::kDecodeMaxRows];
  std::int32_t lo_min = std::numeric_limits<std::int32_t>::max();
  std::int32_t hi_max = std::numeric_limits<std::int32_t>::min();
  for (std::size_t r = 0; r < rows; ++r) {
    lo_min = std::min(lo_min, a.lo[r]);
    hi_max = std::max(hi_max, a.hi[r]);
    InitialState(a.sinks, r, m[r], l[r], nan[r]);
  }
  std::memset(od, 0, rows * dv * sizeof(double));
  const VF scale = hn::Set(df, a.scale);
  const VF cap = hn::Set(df, a.softcap);
  const bool softcap = a.softcap > 0.0f;

  for (std::size_t j0 = a.j_begin; j0 < a.j_end; j0 += B) {
    const std::size_t kb = std::min(B, a.j_end - j0);
    const auto first = static_cast<std::int64_t>(j0);
    const auto last = static_cast<std::int64_t>(j0 + kb - 1);
    if (last < lo_min || first > hi_max) continue;
    // The next block's keys and values, a cache line at a time, before
    // this block is computed: without it the loop waited on memory (f32
    // from DRAM: 15.1 GB/s; with it 17.4 GB/s; prefetching the same lines
    // spread over the score loop instead: 16.0 GB/s).
    if (j0 + B < a.j_end) {
      const std::size_t nb = std::min(B, a.j_end - j0 - B);
      const std::size_t esize = a.kv_type == kKvF32 ? 4 : 2;
      const char* kn =
          static_cast<const char*>(a.k) + (j0 + B) * a.k_stride * esize;
      const char* vn =
          static_cast<const char*>(a.v) + (j0 + B) * a.v_stride * esize;
      for (std::size_t j = 0; j < nb; ++j) {
        for (std::size_t off = 0; off < d * esize; off += 64) {
          __builtin_prefetch(kn + j * a.k_stride * esize + off);
        }
        for (std::size_t off = 0; off < dv * esize; off += 64) {
          __builtin_prefetch(vn + j * a.v_stride * esize + off);
        }
      }
    }
    const BlockRows kv = LoadBlock(a, j0, kb, kc, vc);
    const float* kbase = kv.k;
    const std::size_t kstride = kv.k_stride;
    const float* vbase = kv.v;
    const std::size_t vstride = kv.v_stride;
    {
      // Tiles of 4 rows x 2 keys, or 1 row x 4 keys.
      std::size_t j = 0;
      for (; j + 4 <= kb; j += 4) {
        const float* kr = kbase + j * kstride;
        std::size_t r = 0;
        for (; r + 4 <= rows; r += 4) {
          DecodeScoreRows<4, 2>(qp + r * dpad, dpad, kr, kstride, d,
                                S + r * B + j, B);
          DecodeScoreRows<4, 2>(qp + r * dpad, dpad, kr + 2 * kstride, kstride,
                                d, S + r * B + j + 2, B);
        }
        for (; r < rows; ++r) {
          DecodeScoreRows<1, 4>(qp + r * dpad, dpad, kr, kstride, d,
                                S + r * B + j, B);
        }
      }
      for (; j < kb; ++j) {
        for (std::size_t r = 0; r < rows; ++r) {
          DecodeScoreRows<1, 1>(qp + r * dpad, dpad, kbase + j * kstride,
                                kstride, d, S + r * B + j, B);
        }
      }
    }
    bool any_masked = false;
    double alpha[detail::kDecodeMaxRows];
    for (std::size_t r = 0; r < rows; ++r) {
      float* sr = S + r * B;
      float* pr = P + r * B;
      // Scale, cap, bias, mask and limits, by vectors of keys.
      const bool ext = (a.bias_rows != nullptr && a.bias_rows[r] != nullptr) ||
                       (a.mask_rows != nullptr && a.mask_rows[r] != nullptr);
      if (ext) {
        for (std::size_t j = 0; j < kb; ++j) {
          float x = 0.0f;
          if (a.bias_rows != nullptr && a.bias_rows[r] != nullptr) {
            x = a.bias_rows[r][j0 + j];
          }
          if (a.mask_rows != nullptr && a.mask_rows[r] != nullptr &&
              a.mask_rows[r][j0 + j] == 0) {
            x = -kInf;
          }
          add[j] = x;
        }
      }
      const DI di;
      const auto lo = hn::Set(di, a.lo[r]), hi = hn::Set(di, a.hi[r]);
      const auto iota = hn::Iota(di, 0);
      VF mxv = hn::Set(df, -kInf), mnv = hn::Set(df, kInf);
      auto nanv = hn::Lt(mxv, mxv);  // all false
      for (std::size_t j = 0; j < kb; j += N) {
        const auto valid = hn::FirstN(df, kb - j);
        VF x = hn::Mul(hn::LoadU(df, sr + j), scale);
        if (softcap) x = Softcap(x, cap);
        if (ext) {
          const VF ad = hn::LoadU(df, add + j);
          x = hn::IfThenElse(hn::Eq(ad, hn::Set(df, -kInf)), ad,
                             hn::Add(x, ad));
        }
        const auto jv =
            hn::Add(iota, hn::Set(di, static_cast<std::int32_t>(j0 + j)));
        const auto out = hn::Or(hn::Lt(jv, lo), hn::Gt(jv, hi));
        x = hn::IfThenElse(hn::RebindMask(df, out), hn::Set(df, -kInf), x);
        x = hn::IfThenElse(valid, x, hn::Set(df, -kInf));
        hn::StoreU(x, df, sr + j);
        nanv = hn::Or(nanv, hn::IsNaN(x));
        mxv = hn::Max(mxv, x);
        mnv = hn::Min(mnv, hn::IfThenElse(valid, x, hn::Set(df, kInf)));
      }
      HWY_ALIGN float red[hn::MaxLanes(DF())];
      float mx = -kInf, mn = kInf;
      hn::Store(mxv, df, red);
      for (std::size_t t = 0; t < N; ++t) mx = std::max(mx, red[t]);
      hn::Store(mnv, df, red);
      for (std::size_t t = 0; t < N; ++t) mn = std::min(mn, red[t]);
      const bool row_nan = !hn::AllFalse(df, nanv);
      if (row_nan) nan[r] = true;
      if (mn == -kInf) any_masked = true;
      // New max and alpha with the vector exp (the same bits as above).
      const float m_old = m[r];
      const float m_new = row_nan ? m_old : std::max(m_old, mx);
      const float ms = std::isfinite(m_new) ? m_new : 0.0f;
      const bool inf_row = m_new == kInf;
      float al = hn::GetLane(
          ExpNonPositive(df, hn::Set(df, m_old - ms), hn::Zero(df)));
      if (inf_row) al = m_old == kInf ? 1.0f : 0.0f;
      alpha[r] = al;
      m[r] = m_new;
      double sum = 0.0;
      const VF msv = hn::Set(df, ms);
      for (std::size_t j = 0; j < kb; j += N) {
        const VF x = hn::LoadU(df, sr + j);
        VF pv = ExpNonPositive(df, hn::Sub(x, msv), hn::Zero(df));
        if (HWY_UNLIKELY(inf_row)) {
          pv = hn::IfThenElseZero(hn::Eq(x, hn::Set(df, kInf)),
                                  hn::Set(df, 1.0f));
        }
        hn::StoreU(pv, df, pr + j);
      }
      for (std::size_t j = 0; j < kb; ++j) sum += static_cast<double>(pr[j]);
      l[r] = std::fma(l[r], alpha[r], sum);
    }

    const bool guard = any_masked && !AllFinite(vbase, vstride, kb, dv);
    // O = alpha O + P V: tiles of 4 rows x 4 vectors of columns (V loaded
    // once for 4 rows), then single rows; with the guard, row by row.
    // Each row's alpha in every lane, for FlushVector.
    HWY_ALIGN double alpha_lanes[detail::kDecodeMaxRows][hn::MaxLanes(DF())];
    for (std::size_t r = 0; r < rows; ++r) {
      for (std::size_t i = 0; i < N; ++i) alpha_lanes[r][i] = alpha[r];
    }
    auto flush = [&](const VF& acc, double* o, std::size_t row) {
      FlushVector(acc, alpha_lanes[row], o);
    };
    std::size_t r = 0;
    if (!guard) {
      for (; r + 4 <= rows; r += 4) {
        std::size_t c = 0;
        for (; c + 4 * N <= dv; c += 4 * N) {
          VF acc[4][4];
          DecodeValues4(P + r * B, B, vbase, vstride, kb, c, acc);
          for (std::size_t rr = 0; rr < 4; ++rr) {
            for (std::size_t i = 0; i < 4; ++i) {
              flush(acc[rr][i], od + (r + rr) * dv + c + i * N, r + rr);
            }
          }
        }
        for (std::size_t rr = 0; rr < 4; ++rr) {
          DecodeRowTail(
              P + (r + rr) * B, S + (r + rr) * B, false, vbase, vstride, kb, c,
              dv, od + (r + rr) * dv, alpha[r + rr],
              [&](const VF& acc, double* o) { flush(acc, o, r + rr); });
        }
      }
    }
    for (; r < rows; ++r) {
      const float* pr = P + r * B;
      const float* sr = S + r * B;
      double* o = od + r * dv;
      std::size_t c = 0;
      for (; c + 4 * N <= dv; c += 4 * N) {
        VF acc[4];
        DecodeValues<4>(pr, sr, guard, vbase, vstride, kb, c, acc);
        for (std::size_t i = 0; i < 4; ++i) flush(acc[i], o + c + i * N, r);
      }
      DecodeRowTail(pr, sr, guard, vbase, vstride, kb, c, dv, o, alpha[r],
                    [&](const VF& acc, double* o2) { flush(acc, o2, r); });
    }
  }
  for (std::size_t r = 0; r < rows; ++r) {
    a.out_m[r] = m[r];
    a.out_l[r] = nan[r] ? std::numeric_limits<double>::quiet_NaN() : l[r];
    std::memcpy(a.out_o + r * dv, od + r * dv, dv * sizeof(double));
  }
}

}  // namespace attn

void AttentionBlock(const AttnArgs& a) {
  const std::size_t N = attn::Lanes();
  if (a.decode) {
    attn::RunDecode(a);
  } else if (a.rows <= N) {
    attn::RunBlock<1>(a);
  } else if (a.rows <= 2 * N) {
    attn::RunBlock<2>(a);
  } else {
    attn::RunBlock<4>(a);
  }
}

std::size_t AttentionMaxRows() { return attn::MaxRows(); }

// The unscaled score q . k of one row and one key, in the prefill form (a
// float FMA chain in index order) or the decode form (16 chains and the
// fixed tree), exactly as the kernels compute it. The decode form copies q,
// zero-padded to a multiple of 16, into the caller's scratch (at least
// attention_score_scratch(d) floats; unused by the prefill form): kernels
// never allocate.
float AttentionScore(const float* q, const float* k, std::size_t d, bool decode,
                     float* scratch) {
  if (!decode) {
    float acc = 0.0f;
    for (std::size_t c = 0; c < d; ++c) {
      acc = hn::GetLane(hn::MulAdd(hn::Set(attn::DF(), k[c]),
                                   hn::Set(attn::DF(), q[c]),
                                   hn::Set(attn::DF(), acc)));
    }
    return acc;
  }
  const std::size_t dpad = (d + 15) / 16 * 16;
  float* p = attn::AlignUp(scratch);
  std::memcpy(p, q, d * sizeof(float));
  std::memset(p + d, 0, (dpad - d) * sizeof(float));
  float out = 0.0f;
  attn::DecodeScoreRows<1, 1>(p, dpad, k, d, d, &out, 1);
  return out;
}

// s = cap * tanh(s / cap) for n scores, with the kernel's own arithmetic.
void AttentionSoftcap(float* s, std::size_t n, float cap) {
  const attn::DF df;
  const std::size_t N = hn::Lanes(df);
  const attn::VF c = hn::Set(df, cap);
  HWY_ALIGN float tmp[hn::MaxLanes(attn::DF())];
  for (std::size_t i = 0; i < n; i += N) {
    const std::size_t m = std::min(N, n - i);
    for (std::size_t t = 0; t < N; ++t) tmp[t] = t < m ? s[i + t] : 0.0f;
    const attn::VF x = hn::Load(df, tmp);
    hn::Store(attn::Softcap(x, c), df, tmp);
    std::memcpy(s + i, tmp, m * sizeof(float));
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace softdot
HWY_AFTER_NAMESPACE();

#endif  // SOFTDOT_KERNELS_ATTENTION_INL_H_
