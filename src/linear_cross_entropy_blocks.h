// softdot: the pieces of the fused linear + cross-entropy
// (include/softdot/linear_cross_entropy.h) that the one-process call
// (src/linear_cross_entropy.cc) and the vocabulary-parallel one
// (src/mpi/linear_cross_entropy.cc) share: the operand checks, the block
// size and the block's three matrix products. Each product is bitwise the
// same for any thread count and on every FMA target (kernels/gemm_args.h),
// and an element's bits depend only on its own row and column of the
// operands, not on where a block or a vocabulary shard begins.
#ifndef SOFTDOT_SRC_LINEAR_CROSS_ENTROPY_BLOCKS_H_
#define SOFTDOT_SRC_LINEAR_CROSS_ENTROPY_BLOCKS_H_

#include <cstddef>
#include <cstdint>
#include <span>

#include "softdot/cross_entropy.h"
#include "softdot/float16.h"
#include "softdot/matrix.h"

namespace softdot::detail::lce {

// Rows per block: a B x V block of logits of about 2^22 floats (16 MiB),
// B in [64, 256]; from the (whole) vocabulary V alone, so that
// grad_weight's block sums depend on nothing else.
std::size_t block_rows(std::size_t vocab);

// The checks of linear_cross_entropy (its header lists them), naming
// `function`. shard: weight is one rank's rows of the vocabulary (it may
// have 0 rows; the targets' range is checked by the caller once the whole
// V is known).
template <class T>
void check_operands(const char* function, MatrixView<const T> hidden,
                    MatrixView<const T> weight,
                    std::span<const std::int64_t> targets,
                    std::span<float> loss, MatrixView<float> grad_hidden,
                    MatrixView<float> grad_weight,
                    const CrossEntropyOptions& options, bool shard);

// logits (m x V, row stride V) = hidden rows [i0, i0 + m) @ weight^T.
// V = weight.rows >= 1.
template <class T>
void logits(MatrixView<const T> hidden, std::size_t i0, std::size_t m,
            MatrixView<const T> weight, float* out);

// out (m x D, row stride ldo) = g (m x V, row stride V) @ weight.
template <class T>
void grad_hidden(const float* g, std::size_t m, MatrixView<const T> weight,
                 float* out, std::size_t ldo);

// grad_weight (V x D) = g^T (V x m) @ hidden rows [i0, i0 + m), plus
// grad_weight's old value (each element rounded to float) if accumulate.
template <class T>
void grad_weight(const float* g, MatrixView<const T> hidden, std::size_t i0,
                 std::size_t m, MatrixView<float> grad_weight, bool accumulate);

}  // namespace softdot::detail::lce

#endif  // SOFTDOT_SRC_LINEAR_CROSS_ENTROPY_BLOCKS_H_
