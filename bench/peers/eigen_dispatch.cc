// Chooses which compilation of eigen_peer.cc runs: the widest one this CPU
// and OS support, by Highway's detection (hwy::SupportedTargets), so Eigen
// runs at the same vector width as softdot. SOFTDOT_PEERS_EIGEN_ISA=sse2,
// avx2 or avx512 forces one (if it was built and the CPU supports it).
#include <hwy/targets.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>

#include "peers.h"

#define SOFTDOT_DECLARE_EIGEN(ns)                                          \
  namespace ns {                                                           \
  void Softmax(const float* x, float* y, std::size_t rows, std::size_t n); \
  float Dot(const float* x, const float* y, std::size_t n);                \
  void Gemv(const float* query, const float* keys, float* scores,          \
            std::size_t n_keys, std::size_t d);                            \
  const char* SimdInstructionSets();                                       \
  const char* Version();                                                   \
  }

namespace softdot_peers {
SOFTDOT_DECLARE_EIGEN(eigen_sse2)
#ifdef SOFTDOT_EIGEN_AVX2
SOFTDOT_DECLARE_EIGEN(eigen_avx2)
#endif
#ifdef SOFTDOT_EIGEN_AVX512
SOFTDOT_DECLARE_EIGEN(eigen_avx512)
#endif

namespace {

struct EigenKernels {
  const char* isa;
  void (*softmax)(const float*, float*, std::size_t, std::size_t);
  float (*dot)(const float*, const float*, std::size_t);
  void (*gemv)(const float*, const float*, float*, std::size_t, std::size_t);
  const char* (*simd)();
};

#define SOFTDOT_EIGEN_KERNELS(name, ns)                               \
  EigenKernels {                                                      \
    name, &ns::Softmax, &ns::Dot, &ns::Gemv, &ns::SimdInstructionSets \
  }

EigenKernels Choose() {
  const char* forced = std::getenv("SOFTDOT_PEERS_EIGEN_ISA");
  const std::string want = forced != nullptr ? forced : "";
  [[maybe_unused]] const std::int64_t targets = hwy::SupportedTargets();
#ifdef SOFTDOT_EIGEN_AVX512
  if ((want.empty() || want == "avx512") && (targets & HWY_AVX3) != 0) {
    return SOFTDOT_EIGEN_KERNELS("avx512", eigen_avx512);
  }
#endif
#ifdef SOFTDOT_EIGEN_AVX2
  if ((want.empty() || want == "avx2") && (targets & HWY_AVX2) != 0) {
    return SOFTDOT_EIGEN_KERNELS("avx2", eigen_avx2);
  }
#endif
  if (!want.empty() && want != "sse2") {
    throw std::runtime_error("SOFTDOT_PEERS_EIGEN_ISA=" + want +
                             ": not built or not supported by this CPU");
  }
  return SOFTDOT_EIGEN_KERNELS("sse2", eigen_sse2);
}

const EigenKernels& Kernels() {
  static const EigenKernels k = Choose();
  return k;
}

class EigenSoftmax final : public SoftmaxRunner {
 public:
  EigenSoftmax(std::size_t rows, std::size_t n) : rows_(rows), n_(n) {}
  void Run(const float* x, float* y) override {
    Kernels().softmax(x, y, rows_, n_);
  }

 private:
  std::size_t rows_, n_;
};

class EigenGemv final : public DotsRunner {
 public:
  EigenGemv(std::size_t n_keys, std::size_t d) : n_keys_(n_keys), d_(d) {}
  void Run(const float* query, const float* keys, float* scores) override {
    Kernels().gemv(query, keys, scores, n_keys_, d_);
  }

 private:
  std::size_t n_keys_, d_;
};

float Dot(const float* x, const float* y, std::size_t n) {
  return Kernels().dot(x, y, n);
}

}  // namespace

void RegisterEigen(Registry& r) {
  const EigenKernels& k = Kernels();
  r.softmax.emplace_back("eigen", [](std::size_t rows, std::size_t n) {
    return std::unique_ptr<SoftmaxRunner>(new EigenSoftmax(rows, n));
  });
  r.dot.emplace_back("eigen", &Dot);
  r.dots.emplace_back("eigen", [](std::size_t n_keys, std::size_t d) {
    return std::unique_ptr<DotsRunner>(new EigenGemv(n_keys, d));
  });
  r.context.emplace_back("eigen_version", eigen_sse2::Version());
  r.context.emplace_back("eigen_isa",
                         std::string(k.isa) + " (" + k.simd() + ")");
}

}  // namespace softdot_peers
