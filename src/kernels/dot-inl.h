// softdot kernels: dot product with a fixed, index-defined reduction order.
//
// Lane types: float, double. Accumulators: 8 blocks of 64 bytes (128 float
// or 64 double logical lanes); element i is added by FMA into block
// (i / kLanes) % 8, lane i % kLanes, in increasing i. Why 8: FMA latency 4
// cycles x 2 ports = 8 independent chains keep both AVX-512 FMA units busy.
// The blocks are added in a fixed pairwise tree, then the lanes of the last
// block in a fixed pairwise tree, so the result depends only on n and the
// data, not on the vector width, alignment or thread split (on targets with
// FMA). Error: |result - x.y| <= gamma_n sum |x_i y_i|.

#if defined(SOFTDOT_KERNELS_DOT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SOFTDOT_KERNELS_DOT_INL_H_
#undef SOFTDOT_KERNELS_DOT_INL_H_
#else
#define SOFTDOT_KERNELS_DOT_INL_H_
#endif

#include <cstddef>
#include <cstring>

#include "hwy/highway.h"
#include "kernels/block-inl.h"

HWY_BEFORE_NAMESPACE();
namespace softdot {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

inline constexpr std::size_t kDotAccumulators = 8;

// Adds one block of x*y into acc (kVecs vectors).
template <class T>
HWY_INLINE void DotBlock(const T* HWY_RESTRICT x, const T* HWY_RESTRICT y,
                         typename Block<T>::V* acc) {
  using B = Block<T>;
  const typename B::D d;
  for (std::size_t v = 0; v < B::kVecs; ++v) {
    acc[v] = hn::MulAdd(hn::LoadU(d, x + v * B::kVecLanes),
                        hn::LoadU(d, y + v * B::kVecLanes), acc[v]);
  }
}

// Sums the kLanes logical lanes of one block in a fixed pairwise tree.
template <class T>
HWY_INLINE T ReduceBlockTree(const typename Block<T>::V* acc) {
  using B = Block<T>;
  const typename B::D d;
  alignas(64) T lanes[B::kLanes];
  for (std::size_t v = 0; v < B::kVecs; ++v) {
    hn::Store(acc[v], d, lanes + v * B::kVecLanes);
  }
  for (std::size_t half = B::kLanes / 2; half >= 1; half /= 2) {
    for (std::size_t j = 0; j < half; ++j) lanes[j] += lanes[j + half];
  }
  return lanes[0];
}

template <class T>
HWY_INLINE T DotImpl(const T* HWY_RESTRICT x, const T* HWY_RESTRICT y,
                     std::size_t n) {
  using B = Block<T>;
  using V = typename B::V;
  const typename B::D d;
  constexpr std::size_t kLanes = B::kLanes;
  constexpr std::size_t kStep = kDotAccumulators * kLanes;

  V acc[kDotAccumulators][B::kVecs];
  for (auto& a : acc) {
    for (auto& v : a) v = hn::Zero(d);
  }
  std::size_t i = 0;
  for (; i + kStep <= n; i += kStep) {
    for (std::size_t b = 0; b < kDotAccumulators; ++b) {
      DotBlock(x + i + b * kLanes, y + i + b * kLanes, acc[b]);
    }
  }
  std::size_t b = 0;
  for (; i + kLanes <= n; i += kLanes, ++b) DotBlock(x + i, y + i, acc[b]);
  if (i < n) {
    // Zero padding adds +0 to the lanes past n, which leaves them unchanged.
    alignas(64) T xb[kLanes] = {};
    alignas(64) T yb[kLanes] = {};
    std::memcpy(xb, x + i, (n - i) * sizeof(T));
    std::memcpy(yb, y + i, (n - i) * sizeof(T));
    DotBlock(xb, yb, acc[b]);
  }
  // Fixed tree over the 8 blocks: (0+4, 1+5, 2+6, 3+7), (0+2, 1+3), 0+1.
  for (std::size_t half = kDotAccumulators / 2; half >= 1; half /= 2) {
    for (std::size_t j = 0; j < half; ++j) {
      for (std::size_t v = 0; v < B::kVecs; ++v) {
        acc[j][v] = hn::Add(acc[j][v], acc[j + half][v]);
      }
    }
  }
  return ReduceBlockTree<T>(acc[0]);
}

HWY_NOINLINE float DotF32(const float* HWY_RESTRICT x,
                          const float* HWY_RESTRICT y, std::size_t n) {
  return DotImpl(x, y, n);
}
HWY_NOINLINE double DotF64(const double* HWY_RESTRICT x,
                           const double* HWY_RESTRICT y, std::size_t n) {
  return DotImpl(x, y, n);
}

}  // namespace HWY_NAMESPACE
}  // namespace softdot
HWY_AFTER_NAMESPACE();

#endif  // SOFTDOT_KERNELS_DOT_INL_H_
