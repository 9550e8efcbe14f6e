// The row softmax of the OpenBLAS + Eigen attention peer
// (attention_openblas.cc): Eigen array expressions over rows of the score
// matrix, in place, max-subtracted, as an Eigen user writes it. Causal:
// the scores above the diagonal are -inf, so their weights are 0: row i
// takes the softmax of its first i + 1 entries and the rest are set to 0
// (what exp(-inf - max) gives, without computing it).
//
// Compiled into each per-ISA object of eigen_peer.cc (SSE2, AVX2+FMA,
// AVX-512: bench/peers/CMakeLists.txt adds this file to
// softdot_peer_eigen_<isa>), in the same namespace eigen_<isa>;
// attention_openblas.cc calls the best one this CPU supports.
#ifndef SOFTDOT_EIGEN_NS
#error "SOFTDOT_EIGEN_NS (eigen_sse2, eigen_avx2, eigen_avx512) must be defined"
#endif
#define EIGEN_DONT_PARALLELIZE 1
#include <Eigen/Core>
#include <cstddef>

namespace softdot_peers {
namespace SOFTDOT_EIGEN_NS {

// Rows [row_begin, row_end) of the row-major n x n scores s (already scaled).
void AttentionSoftmaxRows(float* s, std::size_t n, std::size_t row_begin,
                          std::size_t row_end, bool causal) {
  using Row = Eigen::Map<Eigen::ArrayXf>;
  for (std::size_t i = row_begin; i < row_end; ++i) {
    const std::size_t visible = causal ? i + 1 : n;
    Row row(s + i * n, static_cast<Eigen::Index>(visible));
    const float m = row.maxCoeff();
    row = (row - m).exp();
    row /= row.sum();
    if (visible < n)
      Row(s + i * n + visible, static_cast<Eigen::Index>(n - visible))
          .setZero();
  }
}

}  // namespace SOFTDOT_EIGEN_NS
}  // namespace softdot_peers
