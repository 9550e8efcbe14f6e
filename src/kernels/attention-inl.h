// softdot kernels: fused attention for one block of query rows against a
// range of keys (online softmax over blocks of kKeyTile keys).
//
// Layout: query rows live in vector lanes. A block of up to MaxRows() rows
// (4 vectors of lanes) is packed transposed, Qt[k][r] = Q[r][k], so that for
// one key j and one feature k, the FMA acc[r] += K[j][k] * Qt[k][r]
// advances the scores of every row at once. Each score is therefore blocked
// chains: a float FMA chain over each block of 16 features in index order, the
// blocks' chains added in order (detail::kScoreBlock), whatever the vector
// width or the number of rows in the block: the same bits on every FMA target,
// and the same bits as the scalar loop of AttentionScore (attention_weights()).
// Row-wise steps of the softmax (max, exp, sums, rescaling) are lane-wise too,
// so nothing is reduced across lanes.
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

//
// The parts: attention_common-inl.h (shared by both forms),
// attention_prefill-inl.h (RunPrefill), attention_decode-inl.h (RunDecode);
// this file holds the entry points the dispatch table exports.

#if defined(SOFTDOT_KERNELS_ATTENTION_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SOFTDOT_KERNELS_ATTENTION_INL_H_
#undef SOFTDOT_KERNELS_ATTENTION_INL_H_
#else
#define SOFTDOT_KERNELS_ATTENTION_INL_H_
#endif

#include "kernels/attention_common-inl.h"
#include "kernels/attention_decode-inl.h"
#include "kernels/attention_prefill-inl.h"
#include "kernels/attention_units-inl.h"

HWY_BEFORE_NAMESPACE();
namespace softdot {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using detail::AttnArgs;
using detail::kKeyTile;

void AttentionRows(const AttnArgs& a) {
  const std::size_t N = attn::Lanes();
  if (a.decode) {
    attn::RunDecode(a);
  } else if (a.units != 0) {
    if (a.rows <= N) {
      attn::RunPrefillUnits<1>(a);
    } else if (a.rows <= 2 * N) {
      attn::RunPrefillUnits<2>(a);
    } else {
      attn::RunPrefillUnits<4>(a);
    }
  } else if (a.rows <= N) {
    attn::RunPrefill<1>(a);
  } else if (a.rows <= 2 * N) {
    attn::RunPrefill<2>(a);
  } else {
    attn::RunPrefill<4>(a);
  }
}

std::size_t AttentionMaxRows() { return attn::MaxRows(); }

unsigned AttentionUnitsCompiled() { return attn::UnitsCompiled(); }

// The bfloat16 dot-product step on n lanes (tests: the kernels' model and,
// where compiled in, the instruction); false where this target has neither.
bool AttentionUnitsDot(float* acc, const std::uint32_t* a,
                       const std::uint32_t* b, std::size_t n, bool hw) {
#if SOFTDOT_UNITS_MODEL
  attn::UnitsDotLanes(acc, a, b, n, hw);
  return true;
#else
  (void)acc, (void)a, (void)b, (void)n, (void)hw;
  return false;
#endif
}

// The unscaled score q . k of one row and one key, in the prefill form
// (blocked chains: a float FMA chain over each block of kScoreBlock features,
// the blocks' chains added in order) or the decode form (16 chains and the
// fixed tree), exactly as the kernels compute it. The decode form copies q,
// zero-padded to a multiple of 16, into the caller's scratch (at least
// attention_score_scratch(d) floats; unused by the prefill form): kernels
// never allocate.
float AttentionScore(const float* q, const float* k, std::size_t d, bool decode,
                     float* scratch) {
  if (!decode) {
    const attn::DF df;
    float total = 0.0f;
    for (std::size_t c0 = 0; c0 < d; c0 += detail::kScoreBlock) {
      const std::size_t c1 = std::min(d, c0 + detail::kScoreBlock);
      attn::VF acc = hn::Zero(df);
      for (std::size_t c = c0; c < c1; ++c) {
        acc = hn::MulAdd(hn::Set(df, k[c]), hn::Set(df, q[c]), acc);
      }
      total = c0 == 0 ? hn::GetLane(acc)
                      : hn::GetLane(hn::Add(hn::Set(df, total), acc));
    }
    return total;
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