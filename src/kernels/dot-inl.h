// softdot kernels: dot product with a fixed, index-defined reduction order.
//
// Lane types: float, double. Accumulators: 8 blocks of 64 bytes (128 float
// or 64 double logical lanes); element i is added by FMA into block
// (i / kLanes) % 8, lane i % kLanes, in increasing i. Why 8: FMA latency 4
// cycles x 2 ports = 8 independent chains keep both AVX-512 FMA units busy.
// The 8 blocks' lanes are then added in the pairwise tree of reduce.h (the
// blocks first, then the lanes of block 0), so the result depends only on n
// and the data, not on the vector width, alignment or thread split (on
// targets with FMA). Error: |result - x.y| <= gamma_n sum |x_i y_i|.

#if defined(SOFTDOT_KERNELS_DOT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SOFTDOT_KERNELS_DOT_INL_H_
#undef SOFTDOT_KERNELS_DOT_INL_H_
#else
#define SOFTDOT_KERNELS_DOT_INL_H_
#endif

#include <cstddef>
#include <cstring>
#include <utility>

#include "hwy/highway.h"
#include "kernels/block-inl.h"
#include "kernels/eft-inl.h"
#include "kernels/reduce-inl.h"
#include "kernels/two_sum.h"

HWY_BEFORE_NAMESPACE();
namespace softdot {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

inline constexpr std::size_t kDotAccumulators = 8;

// Whether DotLoop unrolls two steps: where the accumulators take 16 vector
// registers or more (8 blocks of two AVX2 or four SSE4 vectors), which
// leaves none for the loads on x86 (16 registers below AVX-512).
template <class Policy>
inline constexpr bool kDotTwoSteps = kDotAccumulators *
                                         sizeof(typename Policy::State) >=
                                     16 * sizeof(typename Policy::V);

// One block of a short dot: whole blocks load plainly, the one partial
// block with a mask, and blocks wholly past n (count 0) not at all.
template <class Policy, class TIn>
HWY_INLINE typename Policy::State DotTailBlock(const TIn* HWY_RESTRICT x,
                                               const TIn* HWY_RESTRICT y,
                                               std::size_t count,
                                               typename Policy::State st) {
  if (count == Policy::kLanes) {
    Policy::template Add<false>(x, y, st, Policy::kLanes);
  } else if (count != 0) {
    Policy::template Add<true>(x, y, st, count);
  }
  return st;
}

// The loop shared by every dot product: blocks of Policy::kLanes input
// elements go, in index order, to accumulator (block index) % 8; the last,
// partial step reads zeros past n (a zero product leaves an accumulator
// unchanged: it is never -0). Every accumulator is named by a constant
// (the kB pack), never by a loop index: with a running index GCC kept the
// 8 accumulators on the stack and cleared them with rep stos, ~19 ns per
// dot for any n >= 16.
template <class Policy, class TIn, std::size_t... kB>
HWY_INLINE auto DotLoopImpl(const TIn* HWY_RESTRICT x,
                            const TIn* HWY_RESTRICT y, std::size_t n,
                            std::index_sequence<kB...>) {
  constexpr std::size_t kLanes = Policy::kLanes;
  constexpr std::size_t kStep = kDotAccumulators * kLanes;
  typename Policy::State state[kDotAccumulators];
  (Policy::Init(state[kB]), ...);
  std::size_t i = 0;
  if constexpr (kDotTwoSteps<Policy>) {
    // Two steps per iteration: the same additions in the same order per
    // accumulator. The 8 accumulators of a float dot on AVX2 are 16 of its
    // 16 vector registers; the loads need one more, so GCC keeps two
    // accumulators on the stack, each chain of one step then being load +
    // FMA + store (about 10 cycles, against 8 for the step's 16 FMAs on two
    // ports). With two steps, such a chain takes two FMAs per 16 cycles.
    for (; i + 2 * kStep <= n; i += 2 * kStep) {
      (Policy::template Add<false>(x + i + kB * kLanes, y + i + kB * kLanes,
                                   state[kB], kLanes),
       ...);
      (Policy::template Add<false>(x + i + kStep + kB * kLanes,
                                   y + i + kStep + kB * kLanes, state[kB],
                                   kLanes),
       ...);
    }
  }
  for (; i + kStep <= n; i += kStep) {
    (Policy::template Add<false>(x + i + kB * kLanes, y + i + kB * kLanes,
                                 state[kB], kLanes),
     ...);
  }
  if (i < n) {
    // Whole blocks load plainly, the one partial block with a mask, and
    // blocks wholly past n not at all. Masked loads from memory not yet in
    // cache are slow here (AMD Zen 5): with every block of this step masked
    // (the empty ones pointed at x), a 64-element dot took 9.5 ns in cache
    // but 86 ns from cold memory, against 18 ns for the peers and for this
    // form (which takes 16 ns in cache).
    const auto add = [&](std::size_t b, typename Policy::State& st) {
      const std::size_t c = CountInVec<kLanes>(n - i, b);
      if (c == kLanes) {
        Policy::template Add<false>(x + i + b * kLanes, y + i + b * kLanes, st,
                                    kLanes);
      } else if (c != 0) {
        Policy::template Add<true>(x + i + b * kLanes, y + i + b * kLanes, st,
                                   c);
      }
    };
    (add(kB, state[kB]), ...);
  }
  return Policy::Reduce(state);
}

template <class Policy, class TIn>
HWY_INLINE auto DotLoop(const TIn* HWY_RESTRICT x, const TIn* HWY_RESTRICT y,
                        std::size_t n) {
  static_assert(kDotAccumulators == 8, "DotLoopImpl and Reduce spell out 8");
  return DotLoopImpl<Policy>(x, y, n, std::make_index_sequence<8>());
}

// Plain dot: one FMA per element into T lanes.
template <class T>
struct PlainDot {
  using B = Block<T>;
  using V = typename B::V;
  static constexpr std::size_t kLanes = B::kLanes;
  struct State {
    V acc[B::kVecs];
    // Declared with the target's attributes: the implicit constructor is
    // not, and GCC for aarch64 refuses to inline the vector constructors
    // (always_inline, target "+...") into it.
    HWY_ATTR State() {}
  };
  static HWY_INLINE void Init(State& s) {
    for (auto& v : s.acc) v = hn::Zero(typename B::D());
  }
  // kPartial: only the first `count` elements are data (the rest read as
  // zeros, and are not touched).
  template <bool kPartial>
  static HWY_INLINE void Add(const T* x, const T* y, State& s,
                             std::size_t count) {
    const typename B::D d;
    for (std::size_t v = 0; v < B::kVecs; ++v) {
      const T* xv = x + v * B::kVecLanes;
      const T* yv = y + v * B::kVecLanes;
      if constexpr (kPartial) {
        const std::size_t k = CountInVec<B::kVecLanes>(count, v);
        s.acc[v] =
            hn::MulAdd(LoadFirstN(d, xv, k), LoadFirstN(d, yv, k), s.acc[v]);
      } else {
        s.acc[v] = hn::MulAdd(hn::LoadU(d, xv), hn::LoadU(d, yv), s.acc[v]);
      }
    }
  }
  // The 8 x kLanes logical lanes in one pairwise tree (reduce.h), lane j of
  // accumulator b being leaf b * kLanes + j: its first 3 levels add whole
  // accumulators (b + 4, then b + 2, then b + 1 into b), vector by vector,
  // and the rest is the tree of accumulator 0's lanes. Accumulator b is
  // named by a constant (the LeafIndex b; see DotLoopImpl).
  static HWY_INLINE T Reduce(const State (&s)[kDotAccumulators]) {
    V acc[B::kVecs];
    for (std::size_t v = 0; v < B::kVecs; ++v) {
      acc[v] = PairwiseReduce<kDotAccumulators>(
          [&s, v](auto b) HWY_ATTR { return s[b].acc[v]; }, AddVecs());
    }
    return ReduceBlockTree<T>(acc);
  }
};

// Float inputs accumulated in double. A product of two floats is exact in
// double, so each lane only rounds its sum: error <= n 2^-53 sum |x_i y_i|,
// which is below the Dot2 bound gamma_n^2 sum |x_i y_i| (gamma_n for float)
// for every n, at 2 conversions per 8 products. The same bits on every
// target, FMA or not (the product is exact either way). Only the loads
// differ from PlainDot<double>.
struct DoubleSumDot : PlainDot<double> {
  template <bool kPartial>
  static HWY_INLINE void Add(const float* x, const float* y, State& s,
                             std::size_t count) {
    const typename B::D d;
    const hn::Rebind<float, typename B::D> df;
    for (std::size_t v = 0; v < B::kVecs; ++v) {
      const float* xp = x + v * B::kVecLanes;
      const float* yp = y + v * B::kVecLanes;
      const std::size_t k = CountInVec<B::kVecLanes>(count, v);
      const V xv = hn::PromoteTo(
          d, kPartial ? LoadFirstN(df, xp, k) : hn::LoadU(df, xp));
      const V yv = hn::PromoteTo(
          d, kPartial ? LoadFirstN(df, yp, k) : hn::LoadU(df, yp));
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
    HWY_ATTR State() {}  // as PlainDot::State's
  };
  static HWY_INLINE void Init(State& st) {
    for (std::size_t v = 0; v < B::kVecs; ++v) {
      st.s[v] = st.c[v] = hn::Zero(typename B::D());
    }
  }
  template <bool kPartial>
  static HWY_INLINE void Add(const double* x, const double* y, State& st,
                             std::size_t count) {
    const typename B::D d;
    for (std::size_t v = 0; v < B::kVecs; ++v) {
      const double* xp = x + v * B::kVecLanes;
      const double* yp = y + v * B::kVecLanes;
      const std::size_t k = CountInVec<B::kVecLanes>(count, v);
      const V xv = kPartial ? LoadFirstN(d, xp, k) : hn::LoadU(d, xp);
      const V yv = kPartial ? LoadFirstN(d, yp, k) : hn::LoadU(d, yp);
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
        detail::add_compensated(hi, lo, s[j]);
        lo += c[j];
      }
    }
    return hi + lo;
  }
};

// A dot of n < 8 blocks (no whole step of DotLoop) over the first kBlocks
// accumulators only (kBlocks a power of 2 with n <= kBlocks * kLanes), with
// the same bits as DotLoop. There, accumulator b holds the FMAs of block b
// into +0 (fma(x, y, +0): the products, a -0 one turned into +0), and the
// accumulators past kBlocks stay +0. The tree's first levels add
// accumulator b + 4 into b, then b + 2, then b + 1; an accumulator is never
// -0 (DotLoopImpl), so adding one that is +0 changes no bit, and the tree
// over 8 accumulators gives what the tree over the first kBlocks gives.
// Skips the set-up of 8 accumulators on the stack, the tail's walk over 8
// blocks and the levels that add zeros: a 64-element float dot took 11.8
// ns on AVX-512, against 6.8 for Highway's Dot (peers benchmark, Xeon VM);
// with this and the dispatch of kernels.cc, 0.77 of Highway's speed there
// (AVX2: 0.48 -> 1.0).
template <class T, std::size_t... kB>
HWY_INLINE T ShortDotImpl(const T* HWY_RESTRICT x, const T* HWY_RESTRICT y,
                          std::size_t n, std::index_sequence<kB...>) {
  using P = PlainDot<T>;
  using B = typename P::B;
  constexpr std::size_t kLanes = B::kLanes;
  typename P::State state[sizeof...(kB)];
  (P::Init(state[kB]), ...);
  ((state[kB] = DotTailBlock<P>(x + kB * kLanes, y + kB * kLanes,
                                CountInVec<kLanes>(n, kB), state[kB])),
   ...);
  typename B::V acc[B::kVecs];
  for (std::size_t v = 0; v < B::kVecs; ++v) {
    acc[v] = PairwiseReduce<sizeof...(kB)>(
        [&state, v](auto b) HWY_ATTR { return state[b].acc[v]; }, AddVecs());
  }
  return ReduceBlockTree<T>(acc);
}

template <std::size_t kBlocks, class T>
HWY_INLINE T ShortDot(const T* HWY_RESTRICT x, const T* HWY_RESTRICT y,
                      std::size_t n) {
  return ShortDotImpl(x, y, n, std::make_index_sequence<kBlocks>());
}

template <class T>
HWY_INLINE T PlainDotDispatch(const T* HWY_RESTRICT x, const T* HWY_RESTRICT y,
                              std::size_t n) {
  constexpr std::size_t kLanes = Block<T>::kLanes;
  static_assert(kDotAccumulators == 8, "the short dots go up to 8 blocks");
  if (n <= kLanes) return ShortDot<1>(x, y, n);
  if (n <= 2 * kLanes) return ShortDot<2>(x, y, n);
  if (n <= 4 * kLanes) return ShortDot<4>(x, y, n);
  if (n < 8 * kLanes) return ShortDot<8>(x, y, n);
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
HWY_NOINLINE double DotInDoubleF32(const float* HWY_RESTRICT x,
                                   const float* HWY_RESTRICT y, std::size_t n) {
  return DotLoop<DoubleSumDot>(x, y, n);
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
