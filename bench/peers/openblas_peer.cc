// OpenBLAS: cblas_sdot for the dot products, cblas_sgemv (row-major, no
// transpose: keys [n_keys x d] times the query) for the dots. One thread.
#include <cblas.h>

#include <memory>
#include <string>

#include "peers.h"

namespace softdot_peers {
namespace {

float Sdot(const float* x, const float* y, std::size_t n) {
  return cblas_sdot(static_cast<blasint>(n), x, 1, y, 1);
}

class Sgemv final : public DotsRunner {
 public:
  Sgemv(std::size_t n_keys, std::size_t d)
      : rows_(static_cast<blasint>(n_keys)), cols_(static_cast<blasint>(d)) {}
  void Run(const float* query, const float* keys, float* scores) override {
    cblas_sgemv(CblasRowMajor, CblasNoTrans, rows_, cols_, 1.0f, keys, cols_,
                query, 1, 0.0f, scores, 1);
  }

 private:
  blasint rows_, cols_;
};

}  // namespace

void RegisterOpenblas(Registry& r) {
  openblas_set_num_threads(1);
  r.dot.emplace_back("openblas", &Sdot);
  r.dots.emplace_back("openblas_sgemv", [](std::size_t n_keys, std::size_t d) {
    return std::unique_ptr<DotsRunner>(new Sgemv(n_keys, d));
  });
  const char* config = openblas_get_config();
  r.context.emplace_back("openblas_config", config != nullptr ? config : "?");
  r.context.emplace_back("openblas_threads",
                         std::to_string(openblas_get_num_threads()));
}

}  // namespace softdot_peers
