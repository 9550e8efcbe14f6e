// Eigen 3 kernels, written as an Eigen user would: the softmax as the usual
// array expression per row (max, exp(x - max), sum, divide), the dot as
// Map<VectorXf>.dot, the dots as a row-major matrix times a vector; Maps of
// the benchmark's buffers, no allocation.
//
// Eigen picks its SIMD width at compile time from the compiler's target
// macros, so this file is compiled once per ISA (baseline SSE2, AVX2+FMA,
// AVX-512) into namespaces eigen_<isa>, and eigen_dispatch.cc calls the best
// one this CPU supports (the same choice Highway makes for softdot). The
// -m flags stay in these objects; nothing else is built with them.
#ifndef SOFTDOT_EIGEN_NS
#error "SOFTDOT_EIGEN_NS (eigen_sse2, eigen_avx2, eigen_avx512) must be defined"
#endif
#define EIGEN_DONT_PARALLELIZE 1
#include <Eigen/Core>
#include <cstddef>

namespace softdot_peers {
namespace SOFTDOT_EIGEN_NS {

using RowMajorMatrix =
    Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

void Softmax(const float* x, float* y, std::size_t rows, std::size_t n) {
  const Eigen::Index r = static_cast<Eigen::Index>(rows),
                     c = static_cast<Eigen::Index>(n);
  const Eigen::Map<const RowMajorMatrix> in(x, r, c);
  Eigen::Map<RowMajorMatrix> out(y, r, c);
  for (Eigen::Index i = 0; i < r; ++i) {
    const float m = in.row(i).maxCoeff();
    out.row(i) = (in.row(i).array() - m).exp().matrix();
    out.row(i) /= out.row(i).sum();
  }
}

float Dot(const float* x, const float* y, std::size_t n) {
  const Eigen::Index c = static_cast<Eigen::Index>(n);
  return Eigen::Map<const Eigen::VectorXf>(x, c).dot(
      Eigen::Map<const Eigen::VectorXf>(y, c));
}

void Gemv(const float* query, const float* keys, float* scores,
          std::size_t n_keys, std::size_t d) {
  const Eigen::Index r = static_cast<Eigen::Index>(n_keys),
                     c = static_cast<Eigen::Index>(d);
  Eigen::Map<Eigen::VectorXf>(scores, r).noalias() =
      Eigen::Map<const RowMajorMatrix>(keys, r, c) *
      Eigen::Map<const Eigen::VectorXf>(query, c);
}

const char* SimdInstructionSets() { return Eigen::SimdInstructionSetsInUse(); }

#define SOFTDOT_EIGEN_STR2(x) #x
#define SOFTDOT_EIGEN_STR(x) SOFTDOT_EIGEN_STR2(x)
const char* Version() {
  return SOFTDOT_EIGEN_STR(EIGEN_WORLD_VERSION) "." SOFTDOT_EIGEN_STR(
      EIGEN_MAJOR_VERSION) "." SOFTDOT_EIGEN_STR(EIGEN_MINOR_VERSION);
}

}  // namespace SOFTDOT_EIGEN_NS
}  // namespace softdot_peers
