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
// attention_prefill-inl.h (RunPrefill), attention_decode-inl.h (RunDecode),
// attention_units-inl.h (RunPrefillUnits). Each form is compiled in its own
// dispatch file (dispatch_attention.cc, dispatch_attention_decode.cc,
// dispatch_attention_units.cc, which hold the other forms' entry points), so
// that they compile in parallel; this file holds the float prefill form's
// entry point and the two every form shares, for dispatch_attention.cc.

#if defined(SOFTDOT_KERNELS_ATTENTION_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SOFTDOT_KERNELS_ATTENTION_INL_H_
#undef SOFTDOT_KERNELS_ATTENTION_INL_H_
#else
#define SOFTDOT_KERNELS_ATTENTION_INL_H_
#endif

#include "kernels/attention_common-inl.h"
#include "kernels/attention_prefill-inl.h"

HWY_BEFORE_NAMESPACE();
namespace softdot {
namespace HWY_NAMESPACE {

// The float prefill form (a.decode false, a.units 0) over the vectors of
// rows a.rows needs.
void AttentionPrefillRows(const AttnArgs& a) {
  attn::ByRowVectors(a.rows, [&](auto nv) HWY_ATTR {
    attn::RunPrefill<decltype(nv)::value>(a);
  });
}

std::size_t AttentionMaxRows() { return attn::MaxRows(); }

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