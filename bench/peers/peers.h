// softdot_peers: softdot next to other libraries' softmax and dot products,
// in one process, on the same buffers. Each peer lives in its own .cc file
// (its headers and flags stay there) and fills a Registry; peers_main.cc
// builds the benchmarks from it. A peer whose library CMake did not find is
// simply not compiled, and its Register* function is not called
// (SOFTDOT_PEER_* definitions, bench/peers/CMakeLists.txt).
#ifndef SOFTDOT_BENCH_PEERS_PEERS_H_
#define SOFTDOT_BENCH_PEERS_PEERS_H_

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace softdot_peers {

// A softmax over the rows of a dense row-major [rows x n] float matrix,
// bound to one shape. Everything that can be prepared without the data
// (operators, primitives, descriptors) is made by the factory, outside the
// timed loop. Run may be handed the same pointers every call (the `cache`
// case) or new ones every call (the `memory` case); a runner rebinds its
// buffers only when the pointers change, and that rebinding is timed.
class SoftmaxRunner {
 public:
  virtual ~SoftmaxRunner() = default;
  virtual void Run(const float* x, float* y) = 0;
};
using SoftmaxFactory =
    std::function<std::unique_ptr<SoftmaxRunner>(std::size_t rows, std::size_t n)>;

// sum_i x[i] * y[i], single thread.
using DotFn = float (*)(const float* x, const float* y, std::size_t n);

// Scores of one query against keys: scores[r] = keys[r, :] . query for a dense
// row-major [n_keys x d] matrix (a matrix-vector product).
class DotsRunner {
 public:
  virtual ~DotsRunner() = default;
  virtual void Run(const float* query, const float* keys, float* scores) = 0;
};
using DotsFactory =
    std::function<std::unique_ptr<DotsRunner>(std::size_t n_keys, std::size_t d)>;

// What the peers provide; the order of each list is the column order of the
// report. Names are short, lower case, without '/'.
struct Registry {
  std::vector<std::pair<std::string, SoftmaxFactory>> softmax;
  std::vector<std::pair<std::string, DotFn>> dot;
  std::vector<std::pair<std::string, DotsFactory>> dots;
  // benchmark::AddCustomContext entries (library versions, settings).
  std::vector<std::pair<std::string, std::string>> context;
};

// One per peer file. Each also sets its library to one thread.
void RegisterXnnpack(Registry& r);   // xnnpack_peer.cc
void RegisterOnednn(Registry& r);    // onednn_peer.cc
void RegisterEigen(Registry& r);     // eigen_dispatch.cc (+ eigen_peer.cc per ISA)
void RegisterTorch(Registry& r);     // torch_peer.cc
void RegisterOpenblas(Registry& r);  // openblas_peer.cc
void RegisterHwyDot(Registry& r);    // hwydot_peer.cc

}  // namespace softdot_peers

#endif  // SOFTDOT_BENCH_PEERS_PEERS_H_
