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
#include <type_traits>

#include "hwy/highway.h"
#include "kernels/target-inl.h"

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

#if SOFTDOT_MASKED_TAIL
// Masked load / store of the first k lanes of a vector through the narrowest
// vector (down to 128 bits) that holds them. A masked access still spans its
// full width for the CPU's store-to-load ordering: a 64-byte masked store to
// y, then a 64-byte masked load of x from the same line (two 3-float
// vectors allocated one after the other; each row of an in-place
// softmax_rows with short rows) waited for the store to complete. Measured:
// a 3-element softmax took 63 ns with x and y 32 bytes apart, 35 ns apart.
template <class D>
HWY_INLINE hn::Vec<D> MaskedLoadNarrow(D d, const hn::TFromD<D>* HWY_RESTRICT p,
                                       std::size_t k) {
  if constexpr (hn::MaxLanes(D()) * sizeof(hn::TFromD<D>) > 16) {
    const hn::Half<D> dh;
    if (k <= hn::MaxLanes(dh)) {
      return hn::ZeroExtendVector(d, MaskedLoadNarrow(dh, p, k));
    }
  }
  return hn::MaskedLoad(hn::FirstN(d, k), d, p);
}

template <class D>
HWY_INLINE void BlendedStoreNarrow(D d, hn::Vec<D> v,
                                   hn::TFromD<D>* HWY_RESTRICT p,
                                   std::size_t k) {
  if constexpr (hn::MaxLanes(D()) * sizeof(hn::TFromD<D>) > 16) {
    const hn::Half<D> dh;
    if (k <= hn::MaxLanes(dh)) {
      BlendedStoreNarrow(dh, hn::LowerHalf(dh, v), p, k);
      return;
    }
  }
  hn::BlendedStore(v, hn::FirstN(d, k), d, p);
}
#endif

// The first `count` lanes of p (count <= MaxLanes(d)), zeros in the rest,
// never touching memory past p + count: one masked load where loads cannot
// fault, else a copy into a zeroed buffer.
template <class D>
HWY_INLINE hn::Vec<D> LoadFirstN(D d, const hn::TFromD<D>* HWY_RESTRICT p,
                                 std::size_t count) {
#if SOFTDOT_MASKED_TAIL
  return MaskedLoadNarrow(d, p, count);
#else
  alignas(64) hn::TFromD<D> buf[hn::MaxLanes(D())] = {};
  for (std::size_t j = 0; j < count; ++j) buf[j] = p[j];
  return hn::Load(d, buf);
#endif
}

// Lanes of part v (vector v of a block, or block v of a step) that hold
// data when the first `count` elements of the whole do, parts being
// kVecLanes elements each.
template <std::size_t kVecLanes>
HWY_INLINE std::size_t CountInVec(std::size_t count, std::size_t v) {
  const std::size_t at = v * kVecLanes;
  return count <= at ? 0 : (count - at < kVecLanes ? count - at : kVecLanes);
}

// Copies the first `rest` (< kLanes) elements of x into the block buffer xb
// and fills the others with pad. With masked loads this is one load, one
// select and one aligned store per vector, which the body's loads of xb then
// take by store forwarding; the scalar fill + memcpy it replaces stalled
// those loads (a 3-element softmax spent about 60 of its 110 ns there).
template <class T>
HWY_INLINE void LoadPartialBlock(const T* HWY_RESTRICT x, std::size_t rest,
                                 T pad, T* HWY_RESTRICT xb) {
#if SOFTDOT_MASKED_TAIL
  using B = Block<T>;
  const typename B::D d;
  for (std::size_t v = 0; v < B::kVecs; ++v) {
    const std::size_t at = v * B::kVecLanes;
    const std::size_t k = CountInVec<B::kVecLanes>(rest, v);
    if (k == 0) {  // no masked load: it would still touch the line
      hn::Store(hn::Set(d, pad), d, xb + at);
      continue;
    }
    hn::Store(hn::IfThenElse(hn::FirstN(d, k), MaskedLoadNarrow(d, x + at, k),
                             hn::Set(d, pad)),
              d, xb + at);
  }
#else
  for (std::size_t j = 0; j < Block<T>::kLanes; ++j) xb[j] = pad;
  std::memcpy(xb, x, rest * sizeof(T));
#endif
}

// Stores the first `rest` elements of the block buffer yb to y.
template <class T>
HWY_INLINE void StorePartialBlock(const T* HWY_RESTRICT yb, std::size_t rest,
                                  T* HWY_RESTRICT y) {
#if SOFTDOT_MASKED_TAIL
  using B = Block<T>;
  const typename B::D d;
  for (std::size_t v = 0; v < B::kVecs; ++v) {
    const std::size_t at = v * B::kVecLanes;
    if (rest <= at) break;
    BlendedStoreNarrow(d, hn::Load(d, yb + at), y + at, rest - at);
  }
#else
  std::memcpy(y, yb, rest * sizeof(T));
#endif
}

// The mask bytes of a partial block, padded with 0 (= masked).
HWY_INLINE void LoadPartialMask(const std::uint8_t* HWY_RESTRICT mask,
                                std::size_t rest, std::size_t lanes,
                                std::uint8_t* HWY_RESTRICT mb) {
#if SOFTDOT_AVX512
  const hn::Full128<std::uint8_t> d8;
  for (std::size_t at = 0; at < lanes; at += 16) {
    const std::size_t k = rest > at ? rest - at : 0;
    hn::Store(hn::MaskedLoad(hn::FirstN(d8, k), d8, mask + at), d8, mb + at);
  }
#else
  for (std::size_t j = 0; j < lanes; ++j) mb[j] = 0;
  std::memcpy(mb, mask, rest);
#endif
}

// Runs body(x, mask, y) over every full block of n elements, then once over
// the partial last block: its inputs are copied into a stack buffer padded
// with `pad` (mask padded with 0 = masked), and its outputs (when y is not
// null) are copied back. body gets pointers to kLanes elements. `mask` and
// `y` may be null; y may equal x. The outputs' type Y may differ from T
// (the 16-bit rows write uint16_t bits).
template <class T, class Y = T, class Body>
HWY_INLINE void ForEachBlock(const T* x, const std::uint8_t* HWY_RESTRICT mask,
                             std::type_identity_t<Y>* y, std::size_t n, T pad,
                             const Body& body) {
  constexpr std::size_t kLanes = Block<T>::kLanes;
  std::size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    body(x + i, mask ? mask + i : nullptr, y ? y + i : nullptr);
  }
  if (i == n) return;
  const std::size_t rest = n - i;
  alignas(64) T xb[kLanes];
  alignas(64) Y yb[kLanes];
  alignas(64) std::uint8_t mb[kLanes < 16 ? 16 : kLanes];
  LoadPartialBlock(x + i, rest, pad, xb);
  if (mask) LoadPartialMask(mask + i, rest, kLanes, mb);
  body(xb, mask ? mb : nullptr, y ? yb : nullptr);
  if (y == nullptr) return;
  if constexpr (std::is_same_v<T, Y>) {
    StorePartialBlock(yb, rest, y + i);
  } else {
    for (std::size_t j = 0; j < rest; ++j) y[i + j] = yb[j];
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace softdot
HWY_AFTER_NAMESPACE();

#endif  // SOFTDOT_KERNELS_BLOCK_INL_H_
