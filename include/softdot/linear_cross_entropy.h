// softdot: the fused linear + cross-entropy of a language model's last
// layer, cross_entropy(hidden @ weight^T, targets), its loss and the
// gradients of hidden and weight, without the N x V logits in memory.
#ifndef SOFTDOT_LINEAR_CROSS_ENTROPY_H_
#define SOFTDOT_LINEAR_CROSS_ENTROPY_H_

#include <cstdint>
#include <span>

#include "softdot/cross_entropy.h"
#include "softdot/float16.h"
#include "softdot/matrix.h"

namespace softdot {

// hidden: N x D, weight: V x D (the vocabulary's rows), targets: N. With
// the logits x = hidden @ weight^T (N x V, float32, never held whole),
// returns cross_entropy(x, targets, loss, grad, options)'s value
// (include/softdot/cross_entropy.h: the same ignore_index, label smoothing
// over all V, reductions, special values and row losses), and, where given
// (data != nullptr),
//   grad_hidden (N x D) = G @ weight,   grad_weight (V x D) = G^T @ hidden,
// with G = cross_entropy's gradient of x (c (softmax - (1 - eps) one_hot -
// eps / V)); both are overwritten, not accumulated into.
//
// How: the rows go in blocks of B (B from V alone: about 2^22 / V, in
// [64, 256]); a block's logits (B x V floats) are formed once, their rows'
// softmax states, losses and G (in place) follow, then the block's
// grad_hidden rows and its term of grad_weight: three matrix products in
// all (docs/design.md says why not a second sweep of recomputed logits).
// Products: softdot's register-blocked tiles (kernels/gemm-inl.h); each
// element a sum in index order of float FMA chains of 64 products, the
// chains added in double (in chunks of 4096 k's, themselves added in
// double), rounded once to float: a logit is within 0.5 ulp + 64 u sum_k
// |h_k w_k| (u = 2^-24; docs/accuracy.md has the measured errors).
// grad_weight adds the blocks' terms in block order, each rounded to
// float.
//
// bfloat16 inputs are widened exactly to float (the products are exact in
// float) and run the same float path; the gradients stay float32 (a
// bfloat16 grad_weight would need a float V x D accumulator beside it).
//
// Bitwise: results do not depend on the thread count or the SIMD target
// (any target with FMA: AVX2, AVX-512, NEON; SSE4 and the emulated targets
// round products separately). loss and grad_hidden do not depend on B
// either; grad_weight's block sums do.
//
// Errors (std::invalid_argument, nothing written): N, D or V of 0; weight
// columns != D; targets.size() != N; a target not in [0, V) and not
// ignore_index (naming the row and value); loss not 0 or N elements;
// grad_hidden not N x D, grad_weight not V x D; label_smoothing outside
// [0, 1]; a stride below the columns; an output overlapping an input or
// another output.
//
// Memory besides the outputs: the B x V block of logits (16 MiB up to
// V = 64k, 64 V floats above), D x B packed hidden rows, per thread a
// packed panel of up to 4096 x 96 floats (1.5 MiB) and B x NR doubles
// (grad_hidden's sums over chunks of 4096 classes), and N long doubles.
// Threads: each product's panels are split across OpenMP threads.
double linear_cross_entropy(MatrixView<const float> hidden,
                            MatrixView<const float> weight,
                            std::span<const std::int64_t> targets,
                            std::span<float> loss,
                            MatrixView<float> grad_hidden = {},
                            MatrixView<float> grad_weight = {},
                            const CrossEntropyOptions& options = {});
double linear_cross_entropy(MatrixView<const BFloat16> hidden,
                            MatrixView<const BFloat16> weight,
                            std::span<const std::int64_t> targets,
                            std::span<float> loss,
                            MatrixView<float> grad_hidden = {},
                            MatrixView<float> grad_weight = {},
                            const CrossEntropyOptions& options = {});

}  // namespace softdot

#endif  // SOFTDOT_LINEAR_CROSS_ENTROPY_H_
