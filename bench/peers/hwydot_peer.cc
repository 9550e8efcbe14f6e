// Highway's contrib dot product (hwy/contrib/dot/dot-inl.h), compiled for
// every target with foreach_target.h and dispatched at run time like softdot
// and bench/baseline_kernels.cc (no -march flags). kAssumptions = 0: valid
// for any n and unpadded buffers (below one vector it runs a scalar loop; the
// tail is one unaligned vector ending at the last element), so the
// benchmark's buffers need no padding.
#include <cstddef>

#include "peers.h"

// foreach_target.h must come before the -inl.h it re-includes per target
// (clang-format would sort it after).
// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "peers/hwydot_peer.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <hwy/contrib/dot/dot-inl.h>
// clang-format on

HWY_BEFORE_NAMESPACE();
namespace softdot_peers {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

float HwyDotImpl(const float* HWY_RESTRICT x, const float* HWY_RESTRICT y,
                 std::size_t n) {
  const hn::ScalableTag<float> d;
  return hn::Dot::Compute<0>(d, x, y, n);
}

// Which target the dispatch picked, for the benchmark context.
const char* HwyDotTargetImpl() { return hwy::TargetName(HWY_TARGET); }

}  // namespace HWY_NAMESPACE
}  // namespace softdot_peers
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace softdot_peers {
HWY_EXPORT(HwyDotImpl);
HWY_EXPORT(HwyDotTargetImpl);

namespace {
float HwyDot(const float* x, const float* y, std::size_t n) {
  return HWY_DYNAMIC_DISPATCH(HwyDotImpl)(x, y, n);
}
}  // namespace

void RegisterHwyDot(Registry& r) {
  r.dot.emplace_back("hwy_dot", &HwyDot);
  r.context.emplace_back("hwy_dot_target",
                         HWY_DYNAMIC_DISPATCH(HwyDotTargetImpl)());
}
}  // namespace softdot_peers
#endif  // HWY_ONCE
