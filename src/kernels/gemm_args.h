// softdot: the arguments of one call of the packed matrix-product kernel
// (kernels/gemm-inl.h), which the fused linear cross-entropy
// (src/linear_cross_entropy.cc) drives.
#ifndef SOFTDOT_SRC_KERNELS_GEMM_ARGS_H_
#define SOFTDOT_SRC_KERNELS_GEMM_ARGS_H_

#include <cstddef>

namespace softdot::detail {

// Every product element is a sum over k < kc in increasing k: float FMA
// chains of kGemmChain consecutive k's (each chain starts from 0), each
// chain's float result added to a double accumulator in chain order. The
// same on every SIMD target with FMA (the tile shape does not enter).
inline constexpr std::size_t kGemmChain = 64;

// One packed B panel against `mtiles` packed A panels:
//   tile(r, c) = sum_k a[i][k * mr + r] * b[k * nr + c]   (as above)
// for the rows r < m and columns c < n of the block (m <= mtiles * mr,
// n <= nr), then per element, in this order (double, rounded once at c):
//   v = tile (+ acc(r, c) unless first, when acc is given)
//   acc given and c null: acc(r, c) = v
//   c given:              c(r, c) = float(v (+ c(r, c) if accumulate))
struct GemmArgs {
  const float* a = nullptr;  // mtiles panels of kc x mr floats, k-major
  std::size_t mtiles = 0;
  std::size_t m = 0;
  const float* b = nullptr;  // one panel of kc x nr floats, k-major
  std::size_t n = 0;
  std::size_t kc = 0;
  double* acc = nullptr;  // row r at acc + r * ldacc (columns of the panel)
  std::size_t ldacc = 0;
  float* c = nullptr;  // row r at c + r * ldc
  std::size_t ldc = 0;
  bool first = true;
  bool accumulate = false;
  // Operands read in place instead of packed (a or b then unused): A's row
  // i (i < m) at a_rows + i * lda, B's row k at b_rows + k * ldb (nr
  // elements are read, so a partial panel must be packed); float, or
  // bfloat16 bits where a_bf16 / b_bf16. k runs from 0 at these pointers.
  const void* a_rows = nullptr;
  std::size_t lda = 0;
  bool a_bf16 = false;
  const void* b_rows = nullptr;
  std::size_t ldb = 0;
  bool b_bf16 = false;
  // The output transposed: c(r, col) at c + col * ldc + r (no acc).
  bool c_transposed = false;
};

}  // namespace softdot::detail

#endif  // SOFTDOT_SRC_KERNELS_GEMM_ARGS_H_
