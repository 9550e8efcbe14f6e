// softdot: numerically stable softmax, log-softmax, logsumexp, and the online
// (chunked) softmax state.
#ifndef SOFTDOT_SOFTMAX_H_
#define SOFTDOT_SOFTMAX_H_

#include <limits>
#include <span>

#include "softdot/float16.h"
#include "softdot/matrix.h"

namespace softdot {

// How a softmax weight is rounded (softmax, softmax_rows, softmax_state,
// softmax_apply; log_softmax and logsumexp have one algorithm, already
// within 1 ulp). Measured errors and speeds are in docs/accuracy.md.
enum class Precision {
  // Each weight is rounded once from a value accurate to far more than the
  // element type: within 1 ulp of the exact weight (measured maximum, against
  // MPFR, docs/accuracy.md "Measured by the tests": float 0.59 ulp, 0.75 for
  // subnormal weights, and 0.503 on targets without FMA; double 0.53, 0.75
  // for subnormal weights). float carries exp as a float pair on AVX2 and
  // AVX-512 (double lanes elsewhere); double as a double-length pair. The
  // default. Costs about 1.3x to 1.9x kFast for float rows in cache, 2x to
  // 2.5x for double (docs/accuracy.md, docs/performance.md).
  kFaithful,
  // exp is rounded to the element type before it is divided by the sum, so
  // a weight carries two roundings and the exp polynomial's error: within
  // 2 ulp with FMA (measured 1.55), 2.5 ulp without (2.34). Faster where the
  // row is in cache (see docs/performance.md).
  kFast,
};

// Options shared by the softmax family.
struct SoftmaxOptions {
  // Scores are multiplied by s = 1 / temperature rounded to the element type
  // before the max is taken: the weights are within the stated bound of
  // softmax(x * s), the products taken exactly (docs/accuracy.md's
  // reference). That is softmax(x / temperature) only when 1 / temperature
  // is exact in the element type (a power of two); otherwise the rounding of
  // s, times the spread of the scores, can move a weight by many ulp
  // (double, T = 0.7, x = [100, 99, 0]: the last weight is 21 ulp from
  // softmax(x / 0.7), docs/cli.md). Must be finite and > 0, and its
  // reciprocal must be a finite, non-zero number of the element type; else
  // std::invalid_argument. A scaled score that overflows counts as +-inf.
  double temperature = 1.0;
  // Empty: no mask. Otherwise one flag per score: true keeps the score,
  // false masks it, which behaves exactly like a score of -inf (a masked NaN
  // is ignored). For the *_rows functions the mask has either `cols` flags
  // (the same mask for every row) or `rows * cols` flags (row-major, dense).
  std::span<const bool> mask;
  // Rounding of the weights; see Precision.
  Precision precision = Precision::kFaithful;
};

// ---------------------------------------------------------------------------
// Special values, the same for every function below (see docs/accuracy.md):
//   some scores -inf or masked -> weight exactly +0, log-weight -inf, and the
//                                 rest as if those entries were absent;
//   every score -inf / masked  -> all weights +0.0, log-weights -inf,
//                                 logsumexp -inf (never NaN);
//   k scores +inf              -> each +inf entry gets 1/k, the others 0
//                                 (the limit); log-weights -log(k) and -inf;
//                                 logsumexp +inf;
//   any unmasked NaN           -> the whole row NaN (NaN is never hidden);
//   empty row                  -> std::invalid_argument.
// Gradual underflow is kept: weights below 2^-126 are subnormal, not flushed.
// The floating-point environment of the caller is not changed.
// ---------------------------------------------------------------------------

// y = softmax(x * s), s = 1 / temperature rounded to the element type (see
// SoftmaxOptions::temperature; x / temperature when s is exact):
// y_i = exp(p_i - m) / sum_j exp(p_j - m), with p_i = x_i * s (taken
// exactly in the bound below) and m = max_j p_j.
// Accuracy: within 1 ulp of the exact weight in the default
// Precision::kFaithful (float: scores, exp, sum and quotient in double, then
// one rounding to float; double: the rounding error of x_i - m recovered
// with TwoSum, exp(x_i - m) as a double-length pair, a compensated sum and a
// double-length 1/sum, one rounding); within 2 ulp in Precision::kFast
// (measured maxima in docs/accuracy.md).
// Shift invariance: softmax(x + c) has the same bits as softmax(x) whenever
// x + c is exact, since only x_i - m enters the computation.
// Aliasing: y may be the same memory as x (in place); partial overlap is not
// allowed. Sizes: y.size() == x.size() >= 1, mask empty or x.size().
// Does not allocate; single-threaded; thread-safe.
void softmax(std::span<const float> x, std::span<float> y,
             const SoftmaxOptions& options = {});
void softmax(std::span<const double> x, std::span<double> y,
             const SoftmaxOptions& options = {});

// y_i = x_i - m - log(sum_j exp(x_j - m)), computed as (x_i - m) - L with the
// exact error of x_i - m and a double-length L, so the absolute error is
// about 2^-24 (float) plus the error of L. Same aliasing, sizes and special
// values as softmax. Does not allocate.
void log_softmax(std::span<const float> x, std::span<float> y,
                 const SoftmaxOptions& options = {});
void log_softmax(std::span<const double> x, std::span<double> y,
                 const SoftmaxOptions& options = {});

// log(sum_i exp(x_i)) = m + log(sum_i exp(x_i - m)), the sum compensated and
// the final addition done in higher precision. When the result cancels
// (m < 0 and |result| < |m|, e.g. the logsumexp of log-probabilities), the
// error of log(sum) would be amplified by |m| / |result|, so the sum is
// recomputed with a scalar exp in the next wider type (double for float, long
// double for double): within 2 ulp, plus about u_W |m| absolute, the
// rounding of m + log(sum) in the wider type (u_W = 2^-53 for float, 2^-64
// for double on x86). For float that term exceeds an ulp of the result only
// when |result| < about 2^-30 |m| (measured 2.31 ulp at |result| = 9.7e-10,
// |m| near 2). Special values as above. x must not be empty. Does not allocate.
float logsumexp(std::span<const float> x, const SoftmaxOptions& options = {});
double logsumexp(std::span<const double> x, const SoftmaxOptions& options = {});

// One softmax (or log-softmax) per row of a row-major matrix, each row
// bitwise equal to softmax() of that row. x and y must have the same rows and
// cols (>= 1 each, else std::invalid_argument); strides may differ; y may be x
// (in place) but must not otherwise overlap it. Threads: rows are split across
// OpenMP threads when the matrix holds at least 2^18 elements; results do not
// depend on the thread count. Does not allocate.
void softmax_rows(MatrixView<const float> x, MatrixView<float> y,
                  const SoftmaxOptions& options = {});
void softmax_rows(MatrixView<const double> x, MatrixView<double> y,
                  const SoftmaxOptions& options = {});
void log_softmax_rows(MatrixView<const float> x, MatrixView<float> y,
                      const SoftmaxOptions& options = {});
void log_softmax_rows(MatrixView<const double> x, MatrixView<double> y,
                      const SoftmaxOptions& options = {});

// Gradient of the softmax: given its output y and the gradient dy of a loss
// with respect to y, dx_i = y_i (dy_i - <dy, y>). The inner product is
// dot_accurate() (twice the working precision), and each dx_i is formed in
// double (float) or with the inner product's error folded in (double), so
// dx_i is within about 1 ulp of the exact value for the given y and dy, up
// to the conditioning of dy_i - <dy, y> (measured in docs/accuracy.md).
// Sizes: y, dy, dx equal and >= 1, else std::invalid_argument. Aliasing: dx
// may be y or dy (in place); no other overlap. Does not allocate;
// single-threaded.
//
// Special values (the gradient side of the forward's table; never a NaN
// made by 0 * inf or inf - inf):
//   y_i = 0 (a -inf or masked score)  -> dx_i = 0 exactly (+-0), whatever
//                                        dy_i is (if not NaN); a zero weight
//                                        times an infinite dy_i counts as 0
//                                        in <dy, y> too;
//   a fully masked row (y all +0)      -> dx all zeros;
//   k scores +inf (y = 1/k there)      -> finite, the limit's gradient;
//   any NaN in y or dy                 -> the whole dx row NaN (a NaN dy_i
//                                        at a weight-0 entry too);
//   dy_i infinite where y_i > 0        -> <dy, y> = +-inf and dx = -+inf at
//                                        the other entries of weight > 0; at
//                                        the infinite entries the
//                                        infinities count as equal (as the
//                                        forward's +inf scores): +-inf, or
//                                        -<dy, y> over the finite entries
//                                        when they hold all the weight;
//                                        infinities of both signs: NaN
//                                        where y_i > 0, 0 where y_i = 0.
// Rows with an infinite or NaN entry take a scalar path.
void softmax_backward(std::span<const float> y, std::span<const float> dy,
                      std::span<float> dx);
void softmax_backward(std::span<const double> y, std::span<const double> dy,
                      std::span<double> dx);

// ---------------------------------------------------------------------------
// 16-bit rows: bfloat16 and float16 (softdot/float16.h). The row is widened
// exactly, computed in float and double, and every result rounded ONCE to
// the 16-bit format (to nearest, ties to even; never through a rounded
// float): correctly rounded, except that a softmax weight whose exact value
// lies within 2^-29 relative of a midpoint between two 16-bit numbers may
// round to the other neighbour (the double value carries exp's 2^-31), and
// log_softmax / logsumexp / softmax_backward results within about 2^-51
// relative of one (the double functions' error). docs/accuracy.md, "16-bit
// softmax family", has the measured counts. The scale is 1 / temperature
// rounded to float (x * s taken exactly). options.precision: kFaithful
// (the default) as above; kFast (softmax and softmax_rows only; ignored by
// the others) rounds a float weight within 2.5 float ulps once to 16 bits:
// correctly rounded unless the exact weight lies within 2^-21 relative of
// a midpoint, always within 1 16-bit ulp, special rows the default's bits.
// Special values, sizes, aliasing and errors as the float
// functions. Allocation: a per-thread scratch row (n floats and n doubles,
// grown when a longer row comes, kept); logsumexp allocates n doubles.
// softmax_rows / log_softmax_rows split rows across OpenMP threads as the
// float forms, the same bits for any thread count.
void softmax(std::span<const BFloat16> x, std::span<BFloat16> y,
             const SoftmaxOptions& options = {});
void softmax(std::span<const Float16> x, std::span<Float16> y,
             const SoftmaxOptions& options = {});
void log_softmax(std::span<const BFloat16> x, std::span<BFloat16> y,
                 const SoftmaxOptions& options = {});
void log_softmax(std::span<const Float16> x, std::span<Float16> y,
                 const SoftmaxOptions& options = {});
// The 16-bit value nearest to the double logsumexp of the widened row.
BFloat16 logsumexp(std::span<const BFloat16> x,
                   const SoftmaxOptions& options = {});
Float16 logsumexp(std::span<const Float16> x,
                  const SoftmaxOptions& options = {});
void softmax_rows(MatrixView<const BFloat16> x, MatrixView<BFloat16> y,
                  const SoftmaxOptions& options = {});
void softmax_rows(MatrixView<const Float16> x, MatrixView<Float16> y,
                  const SoftmaxOptions& options = {});
void log_softmax_rows(MatrixView<const BFloat16> x, MatrixView<BFloat16> y,
                      const SoftmaxOptions& options = {});
void log_softmax_rows(MatrixView<const Float16> x, MatrixView<Float16> y,
                      const SoftmaxOptions& options = {});
// dx = y (dy - <dy, y>) of the widened y and dy, by the double function,
// each dx_i rounded once. Uses a per-thread scratch of 2n doubles.
void softmax_backward(std::span<const BFloat16> y, std::span<const BFloat16> dy,
                      std::span<BFloat16> dx);
void softmax_backward(std::span<const Float16> y, std::span<const Float16> dy,
                      std::span<Float16> dx);

// ---------------------------------------------------------------------------
// Online softmax over a row that arrives in chunks.
//
//   SoftmaxState s;                                  // identity {-inf, 0}
//   for (chunk : chunks) s = merge(s, softmax_state(chunk));
//   for (chunk : chunks) softmax_apply(chunk, s, out_chunk);
//
// A state is (max, sum): the max of the (scaled, masked) scores seen and
// sum exp(x_i - max) over them; a chunk whose max is +inf stores the count of
// +inf entries as its sum, and a NaN anywhere makes max and sum NaN. The sum
// is kept as an unevaluated double-double sum + sum_lo (merge() computes in
// that precision), so chunked results match the one-shot softmax within the
// same error bound however many chunks there are (tested).
// ---------------------------------------------------------------------------
template <class T>
struct BasicSoftmaxState {
  T max = -std::numeric_limits<T>::infinity();
  double sum = 0.0;
  double sum_lo = 0.0;  // low part of the sum; 0 for a hand-made state

  // The identity of merge(): the state of an empty (or fully masked) chunk.
  static constexpr BasicSoftmaxState identity() { return {}; }
};
using SoftmaxState = BasicSoftmaxState<float>;
using SoftmaxStateD = BasicSoftmaxState<double>;

// State of one chunk (which may be empty). Options as for softmax (the mask
// covers this chunk only). Does not allocate.
SoftmaxState softmax_state(std::span<const float> chunk,
                           const SoftmaxOptions& options = {});
SoftmaxStateD softmax_state(std::span<const double> chunk,
                            const SoftmaxOptions& options = {});

// Combines two states: m = max(m1, m2), s = s1 exp(m1 - m) + s2 exp(m2 - m),
// where a term whose max equals m contributes its sum unscaled (so +inf maxima
// and -inf identities never produce inf - inf). The sum is computed in
// double-double arithmetic with exp(m_i - m) in long double. Commutative, bit
// for bit; associative up to about 1e-19 relative in the sum; identity() is a
// two-sided identity, bit for bit. noexcept, no allocation.
SoftmaxState merge(const SoftmaxState& a, const SoftmaxState& b) noexcept;
SoftmaxStateD merge(const SoftmaxStateD& a, const SoftmaxStateD& b) noexcept;

// Writes the final weights of one chunk, y_i = exp(x_i - total.max) /
// total.sum, given the state `total` of the whole row (which must include
// this chunk: every score of the chunk <= total.max). Same options as
// softmax_state; y may alias chunk. A NaN in the chunk or in `total` gives NaN
// weights. Does not allocate.
void softmax_apply(std::span<const float> chunk, const SoftmaxState& total,
                   std::span<float> y, const SoftmaxOptions& options = {});
void softmax_apply(std::span<const double> chunk, const SoftmaxStateD& total,
                   std::span<double> y, const SoftmaxOptions& options = {});

// log(sum exp) of everything the state has seen: max + log(sum + sum_lo).
float logsumexp(const SoftmaxState& state) noexcept;
double logsumexp(const SoftmaxStateD& state) noexcept;

}  // namespace softdot

#endif  // SOFTDOT_SOFTMAX_H_
