// softdot kernels: the decode form of attention (features in vector lanes,
// at most kDecodeMaxRows rows; src/kernels/attention-inl.h has the
// overview): the value tiles, the block steps and RunDecode; the 16-chain
// scores and their per-target tiles are in attention_decode_scores-inl.h.
// Each step of a block is its own HWY_INLINE function.

#if defined(SOFTDOT_KERNELS_ATTENTION_DECODE_INL_H_) == \
    defined(HWY_TARGET_TOGGLE)
#ifdef SOFTDOT_KERNELS_ATTENTION_DECODE_INL_H_
#undef SOFTDOT_KERNELS_ATTENTION_DECODE_INL_H_
#else
#define SOFTDOT_KERNELS_ATTENTION_DECODE_INL_H_
#endif

#include "kernels/attention_common-inl.h"
#include "kernels/attention_decode_scores-inl.h"
#include "kernels/attention_kv-inl.h"
#include "kernels/reduce-inl.h"

HWY_BEFORE_NAMESPACE();
namespace softdot {
namespace HWY_NAMESPACE {

namespace attn {

// Decode form, for at most kDecodeMaxRows rows (few queries, long key
// range): features in lanes. Each score is a 16-lane FMA chain over the
// features reduced in a fixed tree (DecodeScoreRows: the same bits on every
// FMA target), times the scale; the rest of the arithmetic is the one above,
// element for element: the same exp of s - m, block sums in double in key
// order, the same FMA chain over the block's keys for each output element, the
// same double flush. So only the scores' rounding differs from the prefill
// form.
template <std::size_t CV, class T>
HWY_INLINE void DecodeValues(const float* HWY_RESTRICT p,
                             const float* HWY_RESTRICT s, bool guard,
                             const T* const* vrows, const float* vscales,
                             std::size_t kb, std::size_t c0, VF (&acc)[CV]) {
  const DF df;
  const std::size_t N = hn::Lanes(df);
#pragma GCC unroll 8
  for (std::size_t i = 0; i < CV; ++i) acc[i] = hn::Zero(df);
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (std::size_t j = 0; j < kb; ++j) {
    if (guard && s[j] == kNegInf) continue;
    const VF pj = hn::Set(df, p[j]);
    const T* vr = vrows[j] + c0;
#pragma GCC unroll 8
    for (std::size_t i = 0; i < CV; ++i) {
      acc[i] = hn::MulAdd(LoadRow(df, vr + i * N, vscales[j]), pj, acc[i]);
    }
  }
}

// Four rows at once: acc[r][i] = sum_j P[r][j] V[j][c0 + i N + lane].
template <class T>
HWY_INLINE void DecodeValues4(const float* HWY_RESTRICT p, std::size_t pstride,
                              const T* const* vrows, const float* vscales,
                              std::size_t kb, std::size_t c0, VF (&acc)[4][4]) {
  const DF df;
  const std::size_t N = hn::Lanes(df);
#pragma GCC unroll 4
  for (std::size_t r = 0; r < 4; ++r) {
#pragma GCC unroll 4
    for (std::size_t i = 0; i < 4; ++i) acc[r][i] = hn::Zero(df);
  }
  for (std::size_t j = 0; j < kb; ++j) {
    const T* vr = vrows[j] + c0;
    VF vv[4];
#pragma GCC unroll 4
    for (std::size_t i = 0; i < 4; ++i) {
      vv[i] = LoadRow(df, vr + i * N, vscales[j]);
    }
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
template <class T, class Flush>
HWY_INLINE void DecodeRowTail(const float* pr, const float* sr, bool guard,
                              const T* const* vrows, const float* vscales,
                              std::size_t kb, std::size_t c, std::size_t dv,
                              double* o, double alpha, const Flush& flush) {
  const std::size_t N = hn::Lanes(DF());
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (; c + N <= dv; c += N) {
    VF a1[1];
    DecodeValues<1>(pr, sr, guard, vrows, vscales, kb, c, a1);
    flush(a1[0], o + c);
  }
  for (; c < dv; ++c) {
    float acc1 = 0.0f;
    for (std::size_t j = 0; j < kb; ++j) {
      if (guard && sr[j] == kNegInf) continue;
      acc1 = std::fma(RowElement(vrows[j], c, vscales[j]), pr[j], acc1);
    }
    o[c] = std::fma(o[c], alpha, static_cast<double>(acc1));
  }
}

// True when the kb value rows of dv elements hold no inf or NaN (AllFinite
// for rows given by pointers).
HWY_INLINE bool AllFiniteRows(const float* const* v, std::size_t kb,
                              std::size_t dv) {
  for (std::size_t j = 0; j < kb; ++j) {
    for (std::size_t c = 0; c < dv; ++c) {
      if (!std::isfinite(v[j][c])) return false;
    }
  }
  return true;
}

// Rows above which the tiled decode of stored K and V widens each block once
// instead of in every group of rows of the tiles (4 rows on AVX-512, 2 on
// AVX2).
#if HWY_TARGET == HWY_AVX2
inline constexpr std::size_t kWidenRows = 2;
#else
inline constexpr std::size_t kWidenRows = 4;
#endif

// How far ahead the tiled decode prefetches, in keys. Rows stored one after
// another (contiguous K and V, HND pages): the next block (the hardware
// streams the rest). Rows far apart (vLLM's NHD pages: one KV head's rows
// 2 KiB apart at H_kv = 8, d = 128, bfloat16): about 256 KiB of K and V
// ahead, up to a chunk. AMD EPYC Zen 4, one thread, the 12 decode rows of
// bench/python/ragged_peers.py (4k-32k keys, 16-key pages in a random order):
// NHD a block ahead read 5.0 GB/s (bfloat16) and 10.4 (float32), 256 KiB
// ahead 9.3 and 11.8; HND 10.5 and 14.8 a block ahead, less farther on.
// (With the KV heads of a chunk in consecutive tasks, run_rows.)
HWY_INLINE std::size_t DecodePrefetchAhead(const AttnArgs& a) {
  constexpr std::size_t B = kKeyTile;
  if (a.k_stride <= a.d && a.v_stride <= a.dv) return B;
  const std::size_t block_bytes = B * (a.d + a.dv) * KvElementBytes(a);
  const std::size_t blocks =
      std::clamp<std::size_t>((std::size_t{256} << 10) / block_bytes, 1, 8);
  return blocks * B;
}

// The decode form's pieces of the scratch buffer.
struct DecodeScratch {
  float* S;              // [rows][kKeyTile] scores
  float* P;              // [rows][kKeyTile] exp(S - m)
  float* qp;             // [rows][dpad] the rows, zero-padded
  std::size_t dpad;      // d rounded up to a multiple of 16
  float* kc;             // widened keys (or null)
  float* vc;             // widened values (or null)
  double* od;            // [rows][dv] output accumulators
  float* add;            // [kKeyTile] bias / mask of one row
  std::size_t pf_ahead;  // tiled: a block prefetches the block this far on
};

// The running state of each row.
struct DecodeRowStates {
  float m[detail::kDecodeMaxRows];
  double l[detail::kDecodeMaxRows];
  bool nan[detail::kDecodeMaxRows];
};

// Scratch taken, the rows copied zero-padded, the output zeroed.
// `widen`: the widening scratch (LoadBlock's blocks untiled; a key left
// over by the tiles and the values of a guarded block, tiled).
HWY_INLINE DecodeScratch DecodeSetUp(const AttnArgs& a, bool widen) {
  const std::size_t d = a.d, dv = a.dv, rows = a.rows;
  constexpr std::size_t B = kKeyTile;
  DecodeScratch sc;
  float* f = AlignUp(a.scratch);
  auto take = [&f](std::size_t n) {
    float* r = f;
    f = AlignUp(f + n);
    return r;
  };
  sc.S = take(rows * B);
  sc.P = take(rows * B);
  sc.dpad = (d + 15) / 16 * 16;
  sc.qp = take(rows * sc.dpad);
  for (std::size_t r = 0; r < rows; ++r) {
    std::memcpy(sc.qp + r * sc.dpad, a.q_rows[r], d * sizeof(float));
    std::memset(sc.qp + r * sc.dpad + d, 0, (sc.dpad - d) * sizeof(float));
  }
  sc.kc = widen ? take(B * d) : nullptr;
  sc.vc = widen ? take(B * dv) : nullptr;
  sc.od = reinterpret_cast<double*>(take(2 * rows * dv));
  sc.add = take(B);
  sc.pf_ahead = DecodePrefetchAhead(a);
  std::memset(sc.od, 0, rows * dv * sizeof(double));
  return sc;
}

// The scores S of every row against the block's kb keys. Tiled: transposed
// trees (DecodeScoreTile), AVX-512 tiles of 4 rows x 4 keys, 2 x 8 or
// 1 x 16, AVX2 tiles of 2 x 2 or 1 x 4, with the block sc.pf_ahead keys
// ahead prefetched (nb_next keys) during the first group of rows. Untiled:
// tiles of 4 rows x 2 keys, or 1 row x 4 keys, over the float rows of
// LoadBlock (kv).
template <bool kTiled, class RR>
HWY_INLINE void DecodeBlockScores(const AttnArgs& a, const DecodeScratch& sc,
                                  const RR& rr, const BlockRows& kv,
                                  std::size_t j0, std::size_t kb,
                                  std::size_t nb_next) {
  constexpr std::size_t B = kKeyTile;
  const std::size_t d = a.d, rows = a.rows, dpad = sc.dpad;
  const float* qp = sc.qp;
  float* S = sc.S;
  if constexpr (kTiled) {
    (void)kv;
    std::size_t r = 0;
    bool first_group = true;
    auto on_keys = [&](std::size_t j, std::size_t n) {
      if (first_group && j < nb_next) {
        PrefetchBlock<2>(a, j0 + sc.pf_ahead + j, std::min(n, nb_next - j));
      }
    };
    if constexpr (kTileScores == 16) {
      for (; r + 4 <= rows; r += 4) {
        DecodeScoreRowGroup<4, 4>(qp + r * dpad, dpad, rr, d, kb, S + r * B, B,
                                  sc.kc, on_keys);
        first_group = false;
      }
      for (; r + 2 <= rows; r += 2) {
        DecodeScoreRowGroup<2, 8>(qp + r * dpad, dpad, rr, d, kb, S + r * B, B,
                                  sc.kc, on_keys);
        first_group = false;
      }
      for (; r < rows; ++r) {
        DecodeScoreRowGroup<1, 16>(qp + r * dpad, dpad, rr, d, kb, S + r * B, B,
                                   sc.kc, on_keys);
        first_group = false;
      }
    } else if constexpr (kTileScores == 4) {
      for (; r + 2 <= rows; r += 2) {
        DecodeScoreRowGroup<2, 2>(qp + r * dpad, dpad, rr, d, kb, S + r * B, B,
                                  sc.kc, on_keys);
        first_group = false;
      }
      for (; r < rows; ++r) {
        DecodeScoreRowGroup<1, 4>(qp + r * dpad, dpad, rr, d, kb, S + r * B, B,
                                  sc.kc, on_keys);
        first_group = false;
      }
    }
  } else {
    (void)rr;
    (void)j0;
    (void)nb_next;
    const float* kbase = kv.k;
    const std::size_t kstride = kv.k_stride;
    std::size_t j = 0;
    for (; j + 4 <= kb; j += 4) {
      const float* kr = kbase + j * kstride;
      std::size_t r = 0;
      for (; r + 4 <= rows; r += 4) {
        DecodeScoreRows<4, 2>(qp + r * dpad, dpad, kr, kstride, d,
                              S + r * B + j, B);
        DecodeScoreRows<4, 2>(qp + r * dpad, dpad, kr + 2 * kstride, kstride, d,
                              S + r * B + j + 2, B);
      }
      for (; r < rows; ++r) {
        DecodeScoreRows<1, 4>(qp + r * dpad, dpad, kr, kstride, d,
                              S + r * B + j, B);
      }
    }
    for (; j < kb; ++j) {
      for (std::size_t r = 0; r < rows; ++r) {
        DecodeScoreRows<1, 1>(qp + r * dpad, dpad, kbase + j * kstride, kstride,
                              d, S + r * B + j, B);
      }
    }
  }
}

// Per row: scale, cap, bias, mask and limits applied to the block's scores
// (by vectors of keys), the new max and alpha (with the vector exp), and
// P = exp(S - m). Returns whether a score of the block is -inf (masked).
HWY_INLINE bool DecodeSoftmaxStep(const AttnArgs& a, const DecodeScratch& sc,
                                  std::size_t j0, std::size_t kb,
                                  DecodeRowStates& st, double* alpha) {
  const DF df;
  const std::size_t N = hn::Lanes(df);
  constexpr float kInf = std::numeric_limits<float>::infinity();
  constexpr std::size_t B = kKeyTile;
  const VF scale = hn::Set(df, a.scale);
  const VF cap = hn::Set(df, a.softcap);
  const bool softcap = a.softcap > 0.0f;
  float* add = sc.add;
  bool any_masked = false;
  for (std::size_t r = 0; r < a.rows; ++r) {
    float* sr = sc.S + r * B;
    float* pr = sc.P + r * B;
    // Scale, cap, bias, mask and limits, by vectors of keys.
    const bool ext = (a.bias_rows != nullptr && a.bias_rows[r] != nullptr) ||
                     (a.mask_rows != nullptr && a.mask_rows[r] != nullptr) ||
                     a.alibi_slopes != nullptr;
    if (ext) {
      for (std::size_t j = 0; j < kb; ++j) {
        float x = 0.0f;
        if (a.bias_rows != nullptr && a.bias_rows[r] != nullptr) {
          x = a.bias_rows[r][j0 + j];
        }
        if (a.alibi_slopes != nullptr) {
          x = detail::alibi_term(a.alibi_slopes[r], j0 + j, a.alibi_base[r],
                                 a.alibi_stride);
        }
        if (a.mask_rows != nullptr && a.mask_rows[r] != nullptr &&
            a.mask_rows[r][j0 + j] == 0) {
          x = -kInf;
        }
        add[j] = x;
      }
    }
    const DI di;
    const auto first = hn::Set(di, a.first_key[r]),
               last = hn::Set(di, a.last_key[r]);
    const auto iota = hn::Iota(di, 0);
    VF mxv = hn::Set(df, -kInf), mnv = hn::Set(df, kInf);
    auto nanv = hn::Lt(mxv, mxv);  // all false
    for (std::size_t j = 0; j < kb; j += N) {
      const auto valid = hn::FirstN(df, kb - j);
      VF x = hn::Mul(hn::LoadU(df, sr + j), scale);
      if (softcap) x = Softcap(x, cap);
      if (ext) {
        const VF ad = hn::LoadU(df, add + j);
        x = hn::IfThenElse(hn::Eq(ad, hn::Set(df, -kInf)), ad, hn::Add(x, ad));
      }
      const auto jv =
          hn::Add(iota, hn::Set(di, static_cast<std::int32_t>(j0 + j)));
      const auto out = hn::Or(hn::Lt(jv, first), hn::Gt(jv, last));
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
    if (row_nan) st.nan[r] = true;
    if (mn == -kInf) any_masked = true;
    // New max and alpha with the vector exp (the same bits as above).
    const float m_old = st.m[r];
    const float m_new = row_nan ? m_old : std::max(m_old, mx);
    const float ms = std::isfinite(m_new) ? m_new : 0.0f;
    const bool inf_row = m_new == kInf;
    float al =
        hn::GetLane(ExpNonPositive(df, hn::Set(df, m_old - ms), hn::Zero(df)));
    if (inf_row) al = m_old == kInf ? 1.0f : 0.0f;
    alpha[r] = al;
    st.m[r] = m_new;
    const VF msv = hn::Set(df, ms);
    for (std::size_t j = 0; j < kb; j += N) {
      const VF x = hn::LoadU(df, sr + j);
      VF pv = ExpNonPositive(df, hn::Sub(x, msv), hn::Zero(df));
      if (HWY_UNLIKELY(inf_row)) {
        pv =
            hn::IfThenElseZero(hn::Eq(x, hn::Set(df, kInf)), hn::Set(df, 1.0f));
      }
      hn::StoreU(pv, df, pr + j);
    }
  }
  return any_masked;
}

// The block sums in double, each a chain in key order; four rows' chains
// side by side (one chain alone waits on every addition): l = alpha l + sum.
HWY_INLINE void DecodeBlockSums(const float* P, std::size_t rows,
                                std::size_t kb, const double* alpha,
                                double* l) {
  constexpr std::size_t B = kKeyTile;
  std::size_t r = 0;
  for (; r + 4 <= rows; r += 4) {
    double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
    const float* p0 = P + r * B;
    for (std::size_t j = 0; j < kb; ++j) {
      s0 += static_cast<double>(p0[j]);
      s1 += static_cast<double>(p0[B + j]);
      s2 += static_cast<double>(p0[2 * B + j]);
      s3 += static_cast<double>(p0[3 * B + j]);
    }
    l[r] = std::fma(l[r], alpha[r], s0);
    l[r + 1] = std::fma(l[r + 1], alpha[r + 1], s1);
    l[r + 2] = std::fma(l[r + 2], alpha[r + 2], s2);
    l[r + 3] = std::fma(l[r + 3], alpha[r + 3], s3);
  }
  for (; r < rows; ++r) {
    double sum = 0.0;
    for (std::size_t j = 0; j < kb; ++j) {
      sum += static_cast<double>(P[r * B + j]);
    }
    l[r] = std::fma(l[r], alpha[r], sum);
  }
}

// O = alpha O + P V over the value rows vr: tiles of 4 rows x 4 vectors of
// columns (V loaded once for 4 rows), then single rows; with the guard
// (masked terms skipped), row by row.
template <class VR>
HWY_INLINE void DecodeBlockValues(const DecodeScratch& sc, std::size_t rows,
                                  std::size_t dv, std::size_t kb, const VR& vr,
                                  bool guard, const double* alpha) {
  const std::size_t N = hn::Lanes(DF());
  constexpr std::size_t B = kKeyTile;
  const float* P = sc.P;
  const float* S = sc.S;
  double* od = sc.od;
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
        DecodeValues4(P + r * B, B, vr.v, vr.vs, kb, c, acc);
        for (std::size_t rr = 0; rr < 4; ++rr) {
          for (std::size_t i = 0; i < 4; ++i) {
            flush(acc[rr][i], od + (r + rr) * dv + c + i * N, r + rr);
          }
        }
      }
      for (std::size_t rr = 0; rr < 4; ++rr) {
        DecodeRowTail(P + (r + rr) * B, S + (r + rr) * B, false, vr.v, vr.vs,
                      kb, c, dv, od + (r + rr) * dv, alpha[r + rr],
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
      DecodeValues<4>(pr, sr, guard, vr.v, vr.vs, kb, c, acc);
      for (std::size_t i = 0; i < 4; ++i) flush(acc[i], o + c + i * N, r);
    }
    DecodeRowTail(pr, sr, guard, vr.v, vr.vs, kb, c, dv, o, alpha[r],
                  [&](const VF& acc, double* o2) { flush(acc, o2, r); });
  }
}

// The kb value rows of dv elements widened into float rows at vc (LoadRow:
// exact), and pointed to by out. With keys, the key rows of d elements too,
// into kc; without, out's keys are left as they are.
template <class T>
HWY_INLINE void WidenDecodeRows(const DecodeRows<T>& in, std::size_t kb,
                                std::size_t d, std::size_t dv, float* kc,
                                float* vc, bool keys, DecodeRows<float>& out) {
  const DF df;
  const std::size_t N = hn::Lanes(df);
  for (std::size_t j = 0; j < kb; ++j) {
    if (keys) {
      float* kd = kc + j * d;
      for (std::size_t c = 0; c < d; c += N) {
        hn::StoreU(LoadRow(df, in.k[j] + c, in.ks[j]), df, kd + c);
      }
      out.k[j] = kd;
      out.ks[j] = 0.0f;
    }
    float* vd = vc + j * dv;
    for (std::size_t c = 0; c < dv; c += N) {
      hn::StoreU(LoadRow(df, in.v[j] + c, in.vs[j]), df, vd + c);
    }
    out.v[j] = vd;
    out.vs[j] = 0.0f;
  }
}

// One block over the rows rr (K and V as stored, or widened to float):
// scores, softmax step, block sums, O = alpha O + P V. A block with a
// masked score whose values hold inf or NaN takes the guard (values read as
// float, widened first).
template <bool kTiled, class RR>
HWY_INLINE void DecodeBlock(const AttnArgs& a, const DecodeScratch& sc,
                            const RR& rr, const BlockRows& kv, std::size_t j0,
                            std::size_t kb, std::size_t nb_next,
                            DecodeRowStates& st) {
  using RT = std::remove_cv_t<std::remove_pointer_t<
      std::remove_cv_t<std::remove_reference_t<decltype(rr.k[0])>>>>;
  const std::size_t rows = a.rows, dv = a.dv;
  DecodeBlockScores<kTiled>(a, sc, rr, kv, j0, kb, nb_next);
  double alpha[detail::kDecodeMaxRows];
  const bool any_masked = DecodeSoftmaxStep(a, sc, j0, kb, st, alpha);
  DecodeBlockSums(sc.P, rows, kb, alpha, st.l);
  if (!any_masked) {
    DecodeBlockValues(sc, rows, dv, kb, rr, false, alpha);
  } else if constexpr (kTiled && !std::is_same_v<RT, float>) {
    DecodeRows<float> vf;
    WidenDecodeRows(rr, kb, a.d, dv, nullptr, sc.vc, false, vf);
    DecodeBlockValues(sc, rows, dv, kb, vf, !AllFiniteRows(vf.v, kb, dv),
                      alpha);
  } else {
    DecodeBlockValues(sc, rows, dv, kb, rr, !AllFiniteRows(rr.v, kb, dv),
                      alpha);
  }
}

// The decode form over K and V stored as T. kTiled (AVX2 and AVX-512, d and
// d_v multiples of 16): scores by DecodeScoreTile, rows read in place and
// widened in the loops (LoadRow), or, with more than kWidenRows rows, each
// block widened once into float rows first (LoadRow in both: the same bits).
// Otherwise (T = float): blocks widened by LoadBlock, one tree per score.
template <class T, bool kTiled>
void RunDecodeT(const AttnArgs& a) {
  static_assert(kTiled || std::is_same_v<T, float>,
                "untiled decode reads the float rows of LoadBlock");
  const std::size_t dv = a.dv, rows = a.rows;
  constexpr std::size_t B = kKeyTile;
  constexpr bool kStored = !std::is_same_v<T, float>;
  const DecodeScratch sc = DecodeSetUp(a, kTiled ? kStored : KvWidened(a));
  DecodeRows<T> kvr;
  if constexpr (!detail::kScaledKv<T>) {
    std::fill(kvr.ks, kvr.ks + B, 0.0f);
    std::fill(kvr.vs, kvr.vs + B, 0.0f);
  }
  DecodeRowStates st;
  std::int32_t first_min = std::numeric_limits<std::int32_t>::max();
  std::int32_t last_max = std::numeric_limits<std::int32_t>::min();
  for (std::size_t r = 0; r < rows; ++r) {
    first_min = std::min(first_min, a.first_key[r]);
    last_max = std::max(last_max, a.last_key[r]);
    InitialState(a.sinks, r, st.m[r], st.l[r], st.nan[r]);
  }

  // The last block prefetches the first of the next chunk (prefetch_end).
  const std::size_t pf_end = std::max(a.j_end, a.prefetch_end);
  for (std::size_t j0 = a.j_begin; j0 < a.j_end; j0 += B) {
    const std::size_t kb = std::min(B, a.j_end - j0);
    const auto first = static_cast<std::int64_t>(j0);
    const auto last = static_cast<std::int64_t>(j0 + kb - 1);
    if (last < first_min || first > last_max) continue;
    // The next block's keys and values, a cache line at a time. The tiled
    // path spreads these prefetches over its score loop (into L2, one tile
    // of keys at a time); the other path issues them all here, before this
    // block is computed (without any prefetch the loop waited on memory: f32
    // from DRAM 15.1 GB/s, with this 17.4 GB/s).
    const std::size_t ahead = kTiled ? sc.pf_ahead : B;
    const std::size_t nb_next =
        j0 + ahead < pf_end ? std::min(B, pf_end - j0 - ahead) : 0;
    BlockRows kv{};
    if constexpr (kTiled) {
      FillDecodeRows(a, j0, kb, kvr);
    } else {
      if (nb_next != 0) PrefetchBlock(a, j0 + B, nb_next);
      kv = LoadBlock(a, j0, kb, sc.kc, sc.vc);
      for (std::size_t j = 0; j < kb; ++j) {
        kvr.k[j] = kv.k + j * kv.k_stride;
        kvr.v[j] = kv.v + j * kv.v_stride;
      }
    }
    if constexpr (kTiled && kStored) {
      // Many rows (a GQA group of several queries each): widen the block
      // once into float rows, rather than once per group of rows in the
      // tiles. LoadRow is exact, so the bits are the same.
      if (rows > kWidenRows) {
        DecodeRows<float> wf;
        WidenDecodeRows(kvr, kb, a.d, dv, sc.kc, sc.vc, true, wf);
        DecodeBlock<kTiled>(a, sc, wf, kv, j0, kb, nb_next, st);
        continue;
      }
    }
    DecodeBlock<kTiled>(a, sc, kvr, kv, j0, kb, nb_next, st);
  }
  for (std::size_t r = 0; r < rows; ++r) {
    a.out_m[r] = st.m[r];
    a.out_l[r] = st.nan[r] ? std::numeric_limits<double>::quiet_NaN() : st.l[r];
    std::memcpy(a.out_o + r * dv, sc.od + r * dv, dv * sizeof(double));
  }
}

inline void RunDecode(const AttnArgs& a) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL || \
    HWY_TARGET == HWY_AVX2
  if (a.d % 16 == 0 && a.dv % 16 == 0) {
    switch (a.kv_type) {
      case detail::kKvF16:
        return RunDecodeT<hwy::float16_t, true>(a);
      case detail::kKvBF16:
        return RunDecodeT<hwy::bfloat16_t, true>(a);
      case detail::kKvI8:
        return RunDecodeT<std::int8_t, true>(a);
      case detail::kKvE4M3:
        return RunDecodeT<Float8E4M3, true>(a);
      case detail::kKvE5M2:
        return RunDecodeT<Float8E5M2, true>(a);
      default:
        return RunDecodeT<float, true>(a);
    }
  }
#endif
  RunDecodeT<float, false>(a);
}

}  // namespace attn
}  // namespace HWY_NAMESPACE
}  // namespace softdot
HWY_AFTER_NAMESPACE();

#endif  // SOFTDOT_KERNELS_ATTENTION_DECODE_INL_H_
