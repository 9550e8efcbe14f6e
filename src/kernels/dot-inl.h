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
#include "kernels/eft-inl.h"

HWY_BEFORE_NAMESPACE();
namespace softdot {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

inline constexpr std::size_t kDotAccumulators = 8;

// The lanes of one vector in the fixed pairwise tree: lane j + lanes/2 is
// added to lane j, then the same on the lower half, down to one lane. Half
// vectors (UpperHalf/LowerHalf) do each level in one add, where storing the
// lanes and adding them as scalars stalled on the store (~20 ns per dot).
template <class D>
HWY_INLINE hn::TFromD<D> TreeSumOfLanes(D d, hn::Vec<D> v) {
#if HWY_TARGET == HWY_SCALAR
  (void)d;
  return hn::GetLane(v);
#else
  if constexpr (hn::MaxLanes(D()) == 1) {
    (void)d;
    return hn::GetLane(v);
  } else {
    const hn::Half<D> dh;
    return TreeSumOfLanes(
        dh, hn::Add(hn::LowerHalf(dh, v), hn::UpperHalf(dh, v)));
  }
#endif
}

// Sums the kLanes logical lanes of one block in a fixed pairwise tree: lane
// j + kLanes/2 into lane j, and so on. The block's vectors hold lanes
// [v * kVecLanes, (v + 1) * kVecLanes), so the first levels add whole
// vectors; the rest is TreeSumOfLanes. Same bits on every vector width.
template <class T>
HWY_INLINE T ReduceBlockTree(const typename Block<T>::V* acc) {
  using B = Block<T>;
  const typename B::D d;
  typename B::V v[B::kVecs];
  for (std::size_t i = 0; i < B::kVecs; ++i) v[i] = acc[i];
  for (std::size_t half = B::kVecs / 2; half >= 1; half /= 2) {
    for (std::size_t j = 0; j < half; ++j) v[j] = hn::Add(v[j], v[j + half]);
  }
  return TreeSumOfLanes(d, v[0]);
}

// Adds the 8 accumulator blocks in a fixed tree: (0+4, 1+5, 2+6, 3+7),
// (0+2, 1+3), 0+1; the sum ends in acc[0].
template <class V, std::size_t kVecs>
HWY_INLINE void ReduceAccumulators(V (&acc)[kDotAccumulators][kVecs]) {
  for (std::size_t half = kDotAccumulators / 2; half >= 1; half /= 2) {
    for (std::size_t j = 0; j < half; ++j) {
      for (std::size_t v = 0; v < kVecs; ++v) {
        acc[j][v] = hn::Add(acc[j][v], acc[j + half][v]);
      }
    }
  }
}

// The loop shared by every dot product: blocks of Policy::kLanes input
// elements go, in index order, to accumulator (block index) % 8; the partial
// last block is zero-padded (adding +0 products leaves a lane unchanged).
template <class Policy, class TIn>
HWY_INLINE auto DotLoop(const TIn* HWY_RESTRICT x, const TIn* HWY_RESTRICT y,
                        std::size_t n) {
  constexpr std::size_t kLanes = Policy::kLanes;
  constexpr std::size_t kStep = kDotAccumulators * kLanes;
  typename Policy::State state[kDotAccumulators];
  for (auto& s : state) Policy::Init(s);
  std::size_t i = 0;
  for (; i + kStep <= n; i += kStep) {
    for (std::size_t b = 0; b < kDotAccumulators; ++b) {
      Policy::Add(x + i + b * kLanes, y + i + b * kLanes, state[b]);
    }
  }
  // Fewer than 8 blocks remain: they go to accumulators 0, 1, ... in order,
  // the partial one zero-padded. Unrolled over the accumulator index, so
  // the accumulators stay in registers: with a running index they lived on
  // the stack, and a 128-element dot (one row of dots) took ~15 ns.
#pragma GCC unroll 8
  for (std::size_t b = 0; b < kDotAccumulators; ++b) {
    if (i + kLanes <= n) {
      Policy::Add(x + i, y + i, state[b]);
      i += kLanes;
    } else if (i < n) {
      // LoadPartialBlock fills a whole Block<TIn>; WideDot reads only
      // kLanes (8) of those floats.
      constexpr std::size_t kBuf =
          Block<TIn>::kLanes > kLanes ? Block<TIn>::kLanes : kLanes;
      alignas(64) TIn xb[kBuf];
      alignas(64) TIn yb[kBuf];
      LoadPartialBlock(x + i, n - i, TIn(0), xb);
      LoadPartialBlock(y + i, n - i, TIn(0), yb);
      Policy::Add(xb, yb, state[b]);
      i = n;
    }
  }
  return Policy::Reduce(state);
}

// Plain dot: one FMA per element into T lanes.
template <class T>
struct PlainDot {
  using B = Block<T>;
  using V = typename B::V;
  static constexpr std::size_t kLanes = B::kLanes;
  struct State {
    V acc[B::kVecs];
  };
  static HWY_INLINE void Init(State& s) {
    for (auto& v : s.acc) v = hn::Zero(typename B::D());
  }
  static HWY_INLINE void Add(const T* x, const T* y, State& s) {
    const typename B::D d;
    for (std::size_t v = 0; v < B::kVecs; ++v) {
      s.acc[v] = hn::MulAdd(hn::LoadU(d, x + v * B::kVecLanes),
                            hn::LoadU(d, y + v * B::kVecLanes), s.acc[v]);
    }
  }
  static HWY_INLINE T Reduce(State (&s)[kDotAccumulators]) {
    V acc[kDotAccumulators][B::kVecs];
    for (std::size_t b = 0; b < kDotAccumulators; ++b) {
      for (std::size_t v = 0; v < B::kVecs; ++v) acc[b][v] = s[b].acc[v];
    }
    ReduceAccumulators(acc);
    return ReduceBlockTree<T>(acc[0]);
  }
};

// Float inputs accumulated in double. A product of two floats is exact in
// double, so each lane only rounds its sum: error <= n 2^-53 sum |x_i y_i|,
// which is below the Dot2 bound gamma_n^2 sum |x_i y_i| (gamma_n for float)
// for every n, at 2 conversions per 8 products. The same bits on every
// target, FMA or not (the product is exact either way). Only the loads
// differ from PlainDot<double>.
struct WideDot : PlainDot<double> {
  static HWY_INLINE void Add(const float* x, const float* y, State& s) {
    const typename B::D d;
    const hn::Rebind<float, typename B::D> df;
    for (std::size_t v = 0; v < B::kVecs; ++v) {
      const V xv = hn::PromoteTo(d, hn::LoadU(df, x + v * B::kVecLanes));
      const V yv = hn::PromoteTo(d, hn::LoadU(df, y + v * B::kVecLanes));
      s.acc[v] = hn::MulAdd(xv, yv, s.acc[v]);
    }
  }
};

// Ogita, Rump and Oishi's Dot2 per lane: p + pe = x * y exactly (FMA, or
// Dekker's product without FMA), s + q = s + p exactly (TwoSum), and the
// errors pe + q gathered in c. The lanes are combined in double-double.
// Result: |res - x.y| <= u |x.y| + gamma_n^2 sum |x_i y_i|.
struct CompensatedDot {
  using B = Block<double>;
  using V = typename B::V;
  static constexpr std::size_t kLanes = B::kLanes;
  struct State {
    V s[B::kVecs];
    V c[B::kVecs];
  };
  static HWY_INLINE void Init(State& st) {
    for (std::size_t v = 0; v < B::kVecs; ++v) {
      st.s[v] = st.c[v] = hn::Zero(typename B::D());
    }
  }
  static HWY_INLINE void Add(const double* x, const double* y, State& st) {
    const typename B::D d;
    for (std::size_t v = 0; v < B::kVecs; ++v) {
      const V xv = hn::LoadU(d, x + v * B::kVecLanes);
      const V yv = hn::LoadU(d, y + v * B::kVecLanes);
      const V p = hn::Mul(xv, yv);
      const V pe = ProductLow(xv, yv, p);
      const V t = hn::Add(st.s[v], p);
      st.c[v] = hn::Add(st.c[v], hn::Add(TwoSumErr(st.s[v], p, t), pe));
      st.s[v] = t;
    }
  }
  static HWY_INLINE double Reduce(State (&st)[kDotAccumulators]) {
    const typename B::D d;
    alignas(64) double s[B::kLanes], c[B::kLanes];
    double hi = 0.0, lo = 0.0;
    for (std::size_t b = 0; b < kDotAccumulators; ++b) {
      for (std::size_t v = 0; v < B::kVecs; ++v) {
        hn::Store(st[b].s[v], d, s + v * B::kVecLanes);
        hn::Store(st[b].c[v], d, c + v * B::kVecLanes);
      }
      for (std::size_t j = 0; j < B::kLanes; ++j) {
        TwoSumScalar(hi, lo, s[j]);
        lo += c[j];
      }
    }
    return hi + lo;
  }
};

// A dot of fewer than one block of elements, with the same bits as DotLoop:
// there, lane j holds fma(x_j, y_j, +0) and then gains +0 from the other
// accumulators, which is x_j * y_j + 0 (the +0 turns a -0 product into +0);
// the lanes past n are +0; then the same lane tree. Skips the accumulator
// set-up, the copies into the padding buffer and the block reduction, which
// cost ~40 ns for n = 3.
template <class T>
HWY_INLINE T SmallDot(const T* HWY_RESTRICT x, const T* HWY_RESTRICT y,
                      std::size_t n) {
  constexpr std::size_t kLanes = Block<T>::kLanes;
  T lanes[kLanes];
  for (std::size_t j = 0; j < kLanes; ++j) {
    lanes[j] = j < n ? x[j] * y[j] + T(0) : T(0);
  }
  for (std::size_t half = kLanes / 2; half >= 1; half /= 2) {
    for (std::size_t j = 0; j < half; ++j) lanes[j] += lanes[j + half];
  }
  return lanes[0];
}

template <class T>
HWY_INLINE T PlainDotDispatch(const T* HWY_RESTRICT x, const T* HWY_RESTRICT y,
                              std::size_t n) {
  if (n < Block<T>::kLanes) return SmallDot(x, y, n);
  return DotLoop<PlainDot<T>>(x, y, n);
}

// dots: one query against `rows` keys (row r at keys + r * stride), each
// score exactly PlainDotDispatch of that row, so dots() == dot() bitwise.
// One dispatch for the whole range; the rows are independent, so the
// reductions of one row overlap the loads and FMAs of the next.
template <class T>
HWY_INLINE void DotsRange(const T* HWY_RESTRICT query, const T* keys,
                          std::size_t stride, std::size_t n, std::size_t rows,
                          T* HWY_RESTRICT out) {
  for (std::size_t r = 0; r < rows; ++r) {
    out[r] = PlainDotDispatch(query, keys + r * stride, n);
  }
}

HWY_NOINLINE void DotsF32(const float* HWY_RESTRICT query, const float* keys,
                          std::size_t stride, std::size_t n, std::size_t rows,
                          float* HWY_RESTRICT out) {
  DotsRange(query, keys, stride, n, rows, out);
}
HWY_NOINLINE void DotsF64(const double* HWY_RESTRICT query, const double* keys,
                          std::size_t stride, std::size_t n, std::size_t rows,
                          double* HWY_RESTRICT out) {
  DotsRange(query, keys, stride, n, rows, out);
}

HWY_NOINLINE float DotF32(const float* HWY_RESTRICT x,
                          const float* HWY_RESTRICT y, std::size_t n) {
  return PlainDotDispatch(x, y, n);
}
HWY_NOINLINE double DotF64(const double* HWY_RESTRICT x,
                           const double* HWY_RESTRICT y, std::size_t n) {
  return PlainDotDispatch(x, y, n);
}
HWY_NOINLINE double DotWideF32(const float* HWY_RESTRICT x,
                               const float* HWY_RESTRICT y, std::size_t n) {
  return DotLoop<WideDot>(x, y, n);
}
HWY_NOINLINE double DotAccurateF64(const double* HWY_RESTRICT x,
                                   const double* HWY_RESTRICT y,
                                   std::size_t n) {
  return DotLoop<CompensatedDot>(x, y, n);
}

}  // namespace HWY_NAMESPACE
}  // namespace softdot
HWY_AFTER_NAMESPACE();

#endif  // SOFTDOT_KERNELS_DOT_INL_H_
