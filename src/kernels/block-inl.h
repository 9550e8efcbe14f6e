// softdot kernels: the fixed logical block that every kernel reduces over.
//
// A "block" is 64 bytes of elements (16 floats, 8 doubles), whatever the
// vector width: one AVX-512 vector, two AVX2 vectors, four SSE4/NEON vectors,
// or 16 scalar lanes. Element i always lands in logical lane i % kBlock of
// its accumulator, and lanes are combined in a fixed tree, so a reduction
// gives the same bits on every target with the same arithmetic (FMA).

// Toggle include guard: this file is included once per Highway target.
#if defined(SOFTDOT_KERNELS_BLOCK_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SOFTDOT_KERNELS_BLOCK_INL_H_
#undef SOFTDOT_KERNELS_BLOCK_INL_H_
#else
#define SOFTDOT_KERNELS_BLOCK_INL_H_
#endif

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace softdot {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

inline constexpr std::size_t kBlockBytes = 64;

template <class T>
struct Block {
  static constexpr std::size_t kLanes = kBlockBytes / sizeof(T);
  using D = hn::CappedTag<T, kLanes>;
  using V = hn::Vec<D>;
  static constexpr std::size_t kVecLanes = hn::MaxLanes(D());
  static constexpr std::size_t kVecs = kLanes / kVecLanes;
  static_assert(kVecs * kVecLanes == kLanes, "vector must divide the block");
};

// Masks of one vector from `mask` bytes (0 = masked, otherwise kept).
template <class D>
HWY_INLINE hn::Mask<D> LoadKeep(D d, const std::uint8_t* HWY_RESTRICT mask) {
  using T = hn::TFromD<D>;
  const hn::Rebind<std::uint8_t, D> d8;
  const hn::Rebind<std::int32_t, D> d32;
  const auto m32 = hn::PromoteTo(d32, hn::LoadU(d8, mask));
  if constexpr (sizeof(T) == 4) {
    return hn::RebindMask(d, hn::Ne(m32, hn::Zero(d32)));
  } else {
    const hn::Rebind<std::int64_t, D> d64;
    const auto m64 = hn::PromoteTo(d64, m32);
    return hn::RebindMask(d, hn::Ne(m64, hn::Zero(d64)));
  }
}

// Runs body(x, mask, y) over every full block of n elements, then once over
// the partial last block: its inputs are copied into a stack buffer padded
// with `pad` (mask padded with 0 = masked), and its outputs (when y is not
// null) are copied back. body gets pointers to kLanes elements. `mask` and
// `y` may be null; y may equal x.
template <class T, class Body>
HWY_INLINE void ForEachBlock(const T* x, const std::uint8_t* HWY_RESTRICT mask,
                             T* y, std::size_t n, T pad, const Body& body) {
  constexpr std::size_t kLanes = Block<T>::kLanes;
  std::size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    body(x + i, mask ? mask + i : nullptr, y ? y + i : nullptr);
  }
  if (i == n) return;
  const std::size_t rest = n - i;
  alignas(64) T xb[kLanes];
  alignas(64) T yb[kLanes];
  alignas(16) std::uint8_t mb[kLanes] = {};
  for (std::size_t j = 0; j < kLanes; ++j) xb[j] = pad;
  std::memcpy(xb, x + i, rest * sizeof(T));
  if (mask) std::memcpy(mb, mask + i, rest);
  body(xb, mask ? mb : nullptr, y ? yb : nullptr);
  if (y) std::memcpy(y + i, yb, rest * sizeof(T));
}

}  // namespace HWY_NAMESPACE
}  // namespace softdot
HWY_AFTER_NAMESPACE();

#endif  // SOFTDOT_KERNELS_BLOCK_INL_H_
