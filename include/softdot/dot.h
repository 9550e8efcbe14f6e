// softdot: dot products.
#ifndef SOFTDOT_DOT_H_
#define SOFTDOT_DOT_H_

#include <span>

#include "softdot/matrix.h"

namespace softdot {

// Returns sum_i x[i] * y[i].
//
// Computation: 8 independent accumulators of one 64-byte block each (128
// float lanes, 64 double lanes) fed with fused multiply-adds; element i goes
// to lane i mod 128 (float) / 64 (double), and the lanes are added in a fixed
// pairwise tree. The order depends only on the index, so the result is the
// same bits for every alignment and every SIMD target that has FMA (AVX2,
// AVX-512, NEON); SSE4 and scalar targets round the product separately.
// Error bound: |dot(x, y) - x.y| <= gamma_n * sum |x_i y_i| with
// gamma_n = n u / (1 - n u), u = 2^-24 (float) or 2^-53 (double); in practice
// far smaller, since each lane only adds about n / 128 terms.
// Special values: follow IEEE arithmetic (a NaN or inf * 0 gives NaN).
// Sizes: x.size() must equal y.size(), else std::invalid_argument naming both
// sizes; n = 0 gives 0. Does not allocate; single-threaded; thread-safe.
float dot(std::span<const float> x, std::span<const float> y);
double dot(std::span<const double> x, std::span<const double> y);

// Returns x.y as if computed in twice the working precision and rounded
// once: |dot_accurate(x, y) - x.y| <= u |x.y| + gamma_n^2 sum |x_i y_i|
// (u = 2^-24 float, 2^-53 double), so the result is accurate to about
// u (1 + n^2 u cond) where cond = sum |x_i y_i| / |x.y|.
// float: the products are formed exactly in double and summed in double
// (n 2^-53 sum|x_i y_i|, below the bound above for every n), then rounded
// once; the same bits on every target. double: Ogita, Rump and Oishi's Dot2
// (TwoProduct by FMA, or Dekker's product without FMA, and TwoSum) per lane,
// lanes combined in double-double; the same bits on every FMA target.
// Order, sizes, errors, allocation and threads as for dot().
float dot_accurate(std::span<const float> x, std::span<const float> y);
double dot_accurate(std::span<const double> x, std::span<const double> y);

// Scores of one query against many keys: scores[r] = dot(query, keys.row(r))
// for every row r, bitwise equal to calling dot() per row.
// Requirements (std::invalid_argument otherwise): keys.cols ==
// query.size(), scores.size() == keys.rows, keys.stride >= keys.cols when
// keys.rows > 1, and a non-null keys.data when the matrix is not empty.
// Threads: splits the rows across OpenMP threads when the matrix holds at
// least 2^18 elements; results do not depend on the thread count.
// Aliasing: scores must not overlap query or keys. Does not allocate.
void dots(std::span<const float> query, MatrixView<const float> keys,
          std::span<float> scores);
void dots(std::span<const double> query, MatrixView<const double> keys,
          std::span<double> scores);

}  // namespace softdot

#endif  // SOFTDOT_DOT_H_
