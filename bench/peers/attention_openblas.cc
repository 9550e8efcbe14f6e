// OpenBLAS + Eigen attention ("openblas_eigen"), the unfused textbook way
// with the usual libraries:
//   S = scale * Q K^T    cblas_sgemm (row-major, K transposed, alpha = scale)
//                        into an n x n buffer made by the factory;
//   P = softmax_rows(S)  in place, attention_eigen.cc (Eigen, vectorized,
//                        max-subtracted; causal: -inf above the diagonal),
//                        rows split over OpenMP threads;
//   O = P V              cblas_sgemm.
// The Eigen build is chosen like eigen_dispatch.cc chooses it (the widest
// this CPU supports by Highway's detection, SOFTDOT_PEERS_EIGEN_ISA forces
// one). openblas_set_num_threads sets OpenBLAS's threads.
#include <cblas.h>
#include <hwy/targets.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "peers.h"

#define SOFTDOT_DECLARE_EIGEN_ATTENTION(ns)                                 \
  namespace ns {                                                            \
  void AttentionSoftmaxRows(float* s, std::size_t n, std::size_t row_begin, \
                            std::size_t row_end, bool causal);              \
  }

namespace softdot_peers {
SOFTDOT_DECLARE_EIGEN_ATTENTION(eigen_sse2)
#ifdef SOFTDOT_EIGEN_AVX2
SOFTDOT_DECLARE_EIGEN_ATTENTION(eigen_avx2)
#endif
#ifdef SOFTDOT_EIGEN_AVX512
SOFTDOT_DECLARE_EIGEN_ATTENTION(eigen_avx512)
#endif

namespace {

using SoftmaxRowsFn = void (*)(float*, std::size_t, std::size_t, std::size_t,
                               bool);

SoftmaxRowsFn Choose() {
  const char* forced = std::getenv("SOFTDOT_PEERS_EIGEN_ISA");
  const std::string want = forced != nullptr ? forced : "";
  [[maybe_unused]] const std::int64_t targets = hwy::SupportedTargets();
#ifdef SOFTDOT_EIGEN_AVX512
  if ((want.empty() || want == "avx512") && (targets & HWY_AVX3) != 0) {
    return &eigen_avx512::AttentionSoftmaxRows;
  }
#endif
#ifdef SOFTDOT_EIGEN_AVX2
  if ((want.empty() || want == "avx2") && (targets & HWY_AVX2) != 0) {
    return &eigen_avx2::AttentionSoftmaxRows;
  }
#endif
  if (!want.empty() && want != "sse2") {
    throw std::runtime_error("SOFTDOT_PEERS_EIGEN_ISA=" + want +
                             ": not built or not supported by this CPU");
  }
  return &eigen_sse2::AttentionSoftmaxRows;
}

class BlasEigenAttention final : public AttentionRunner {
 public:
  BlasEigenAttention(std::size_t n, std::size_t d, bool causal,
                     SoftmaxRowsFn softmax)
      : n_(n),
        d_(d),
        causal_(causal),
        scale_(static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)))),
        softmax_(softmax),
        s_(n * n) {}
  void Run(const float* q, const float* k, const float* v, float* o) override {
    const auto n = static_cast<blasint>(n_), d = static_cast<blasint>(d_);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, d, scale_, q, d,
                k, d, 0.0f, s_.data(), n);
    // Blocks of 16 rows; causal rows grow, so they are dealt out round robin.
    const std::int64_t blocks = static_cast<std::int64_t>((n_ + 15) / 16);
#pragma omp parallel for schedule(static, 1)
    for (std::int64_t b = 0; b < blocks; ++b) {
      const std::size_t begin = static_cast<std::size_t>(b) * 16;
      softmax_(s_.data(), n_, begin, std::min(n_, begin + 16), causal_);
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, d, n, 1.0f,
                s_.data(), n, v, d, 0.0f, o, d);
  }

 private:
  std::size_t n_, d_;
  bool causal_;
  float scale_;
  SoftmaxRowsFn softmax_;
  std::vector<float> s_;
};

}  // namespace

void RegisterBlasAttention(Registry& r) {
  const SoftmaxRowsFn softmax = Choose();
  r.attention.emplace_back(
      "openblas_eigen", [softmax](std::size_t n, std::size_t d, bool causal) {
        return std::unique_ptr<AttentionRunner>(
            new BlasEigenAttention(n, d, causal, softmax));
      });
  r.set_threads.emplace_back([](int t) { openblas_set_num_threads(t); });
}

}  // namespace softdot_peers
