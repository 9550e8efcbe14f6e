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
using SoftmaxFactory = std::function<std::unique_ptr<SoftmaxRunner>(
    std::size_t rows, std::size_t n)>;

// sum_i x[i] * y[i], single thread.
using DotFn = float (*)(const float* x, const float* y, std::size_t n);

// Scores of one query against keys: scores[r] = keys[r, :] . query for a dense
// row-major [n_keys x d] matrix (a matrix-vector product).
class DotsRunner {
 public:
  virtual ~DotsRunner() = default;
  virtual void Run(const float* query, const float* keys, float* scores) = 0;
};
using DotsFactory = std::function<std::unique_ptr<DotsRunner>(
    std::size_t n_keys, std::size_t d)>;

// Attention over one head (prefill): O = softmax(scale Q K^T) V for dense
// row-major q, k, v, o of [n x d] floats, scale = 1/sqrt(d); causal: query i
// sees keys j <= i only. Made once per shape (buffers for the scores are
// allocated by the factory, outside the timed loop).
class AttentionRunner {
 public:
  virtual ~AttentionRunner() = default;
  virtual void Run(const float* q, const float* k, const float* v,
                   float* o) = 0;
};
using AttentionFactory = std::function<std::unique_ptr<AttentionRunner>(
    std::size_t n, std::size_t d, bool causal)>;

// One decode step: a single query token, `heads` query heads on `kv_heads`
// KV heads (grouped-query: query head h reads KV head h / (heads /
// kv_heads)); q and o dense [heads x d], k and v dense [kv_heads x n_kv x d],
// scale 1/sqrt(d). k and v move to the next copy of an arena every call.
class DecodeRunner {
 public:
  virtual ~DecodeRunner() = default;
  virtual void Run(const float* q, const float* k, const float* v,
                   float* o) = 0;
};
using DecodeFactory = std::function<std::unique_ptr<DecodeRunner>(
    std::size_t heads, std::size_t kv_heads, std::size_t n_kv, std::size_t d)>;

// What the peers provide; the order of each list is the column order of the
// report. Names are short, lower case, without '/'.
struct Registry {
  std::vector<std::pair<std::string, SoftmaxFactory>> softmax;
  std::vector<std::pair<std::string, DotFn>> dot;
  std::vector<std::pair<std::string, DotsFactory>> dots;
  std::vector<std::pair<std::string, AttentionFactory>> attention;
  std::vector<std::pair<std::string, DecodeFactory>> decode;
  // Thread-count setters of the libraries behind `attention` and `decode`
  // (libtorch, OpenBLAS): the attention benchmarks at t threads call each
  // with t before the loop and with 1 after it (OpenMP is set as well).
  std::vector<std::function<void(int)>> set_threads;
  // benchmark::AddCustomContext entries (library versions, settings).
  std::vector<std::pair<std::string, std::string>> context;
};

// One per peer file. Each also sets its library to one thread.
void RegisterXnnpack(Registry& r);  // xnnpack_peer.cc
void RegisterOnednn(Registry& r);   // onednn_peer.cc
void RegisterEigen(Registry& r);  // eigen_dispatch.cc (+ eigen_peer.cc per ISA)
void RegisterTorch(Registry& r);  // torch_peer.cc
void RegisterOpenblas(Registry& r);  // openblas_peer.cc
void RegisterHwyDot(Registry& r);    // hwydot_peer.cc
// Attention peers: libtorch matmul + softmax + matmul and its
// _scaled_dot_product_attention, and the grouped-query decode step
// (attention_torch.cc); OpenBLAS sgemm + an Eigen row softmax + sgemm
// (attention_openblas.cc, with attention_eigen.cc compiled per ISA).
void RegisterTorchAttention(Registry& r);  // attention_torch.cc
void RegisterBlasAttention(Registry& r);   // attention_openblas.cc

// The attention benchmarks (attention_cases.cc): softdot::attention, the
// peers above and a naive loop, prefill and decode. set is
// SOFTDOT_PEERS_SET: "single" registers the 1-thread ones, "threads" the
// 2-thread ones, "all" both.
void RegisterAttentionBenchmarks(const Registry& peers, const std::string& set);

}  // namespace softdot_peers

#endif  // SOFTDOT_BENCH_PEERS_PEERS_H_
