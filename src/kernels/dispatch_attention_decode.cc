// softdot: the attention kernel's decode form (attention_decode-inl.h) and
// the scalar score of attention_weights(), compiled once per SIMD target
// (Highway's foreach_target / HWY_EXPORT pattern; attention_kernel, in
// dispatch_attention.cc, calls attention_decode_kernel).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/dispatch_attention_decode.cc"
#include <algorithm>
#include <cstddef>
#include <cstring>

#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/attention_common-inl.h"
#include "kernels/attention_decode-inl.h"

HWY_BEFORE_NAMESPACE();
namespace softdot {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using detail::AttnArgs;

void AttentionDecodeRows(const AttnArgs& a) { attn::RunDecode(a); }

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

}  // namespace HWY_NAMESPACE
}  // namespace softdot
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "kernels/dispatch.h"
#include "kernels/dispatch_call.h"

namespace softdot::detail {

HWY_EXPORT(AttentionDecodeRows);
HWY_EXPORT(AttentionScore);

void attention_decode_kernel(const AttnArgs& args) noexcept {
  HWY_DYNAMIC_DISPATCH(AttentionDecodeRows)(args);
}
float attention_score(const float* q, const float* k, std::size_t d,
                      bool decode, float* scratch) noexcept {
  return HWY_DYNAMIC_DISPATCH(AttentionScore)(q, k, d, decode, scratch);
}

}  // namespace softdot::detail
#endif  // HWY_ONCE
