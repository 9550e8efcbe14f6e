// libtorch (ATen, CPU): at::_softmax_out over the last dim of a [rows, n]
// tensor, and at::mv_out for the dots, writing into preallocated outputs.
// The tensors wrap the benchmark's buffers (from_blob, made once per shape);
// when the buffers move (the `memory` case) only the storages' data pointers
// are swapped, so no tensor is allocated in the timed loop. Runs under
// c10::InferenceMode (no autograd bookkeeping), on one intra-op thread.
#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/_softmax.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/mv.h>
#include <c10/core/InferenceMode.h>
#include <torch/version.h>

#include <memory>
#include <sstream>
#include <string>

#include "peers.h"

namespace softdot_peers {
namespace {

// A contiguous float tensor of the given sizes over `data` (not owned).
at::Tensor Wrap(at::IntArrayRef sizes, float* data) {
  return at::from_blob(data, sizes, at::TensorOptions().dtype(at::kFloat));
}

// Points the tensor's storage at `data` (same size, no allocation).
void Rebind(at::Tensor& t, const float* data) {
  t.storage().set_data_ptr_noswap(c10::DataPtr(
      const_cast<float*>(data), c10::Device(c10::DeviceType::CPU)));
}

// A dummy buffer for tensors before the first Run binds them.
float* Placeholder() {
  static float p[1];
  return p;
}

class TorchSoftmax final : public SoftmaxRunner {
 public:
  TorchSoftmax(std::size_t rows, std::size_t n) {
    c10::InferenceMode guard;
    const std::int64_t sizes[] = {static_cast<std::int64_t>(rows),
                                  static_cast<std::int64_t>(n)};
    in_ = Wrap(sizes, Placeholder());
    out_ = Wrap(sizes, Placeholder());
  }
  void Run(const float* x, float* y) override {
    c10::InferenceMode guard;
    if (x != x_ || y != y_) {
      Rebind(in_, x);
      Rebind(out_, y);
      x_ = x;
      y_ = y;
    }
    at::_softmax_out(out_, in_, -1, /*half_to_float=*/false);
  }

 private:
  at::Tensor in_, out_;
  const float* x_ = nullptr;
  float* y_ = nullptr;
};

class TorchMv final : public DotsRunner {
 public:
  TorchMv(std::size_t n_keys, std::size_t d) {
    c10::InferenceMode guard;
    const std::int64_t keys_sizes[] = {static_cast<std::int64_t>(n_keys),
                                       static_cast<std::int64_t>(d)};
    const std::int64_t query_sizes[] = {static_cast<std::int64_t>(d)};
    const std::int64_t score_sizes[] = {static_cast<std::int64_t>(n_keys)};
    keys_ = Wrap(keys_sizes, Placeholder());
    query_ = Wrap(query_sizes, Placeholder());
    scores_ = Wrap(score_sizes, Placeholder());
  }
  void Run(const float* query, const float* keys, float* scores) override {
    c10::InferenceMode guard;
    if (query != q_ || keys != k_ || scores != s_) {
      Rebind(query_, query);
      Rebind(keys_, keys);
      Rebind(scores_, scores);
      q_ = query;
      k_ = keys;
      s_ = scores;
    }
    at::mv_out(scores_, keys_, query_);
  }

 private:
  at::Tensor keys_, query_, scores_;
  const float* q_ = nullptr;
  const float* k_ = nullptr;
  float* s_ = nullptr;
};

// "CPU capability usage: AVX512" from at::show_config(), or "?".
std::string CpuCapability() {
  std::istringstream lines(at::show_config());
  const std::string key = "CPU capability usage:";
  for (std::string line; std::getline(lines, line);) {
    const auto pos = line.find(key);
    if (pos != std::string::npos) {
      std::string v = line.substr(pos + key.size());
      v.erase(0, v.find_first_not_of(' '));
      return v;
    }
  }
  return "?";
}

}  // namespace

void RegisterTorch(Registry& r) {
  at::set_num_threads(1);
  r.softmax.emplace_back("libtorch", [](std::size_t rows, std::size_t n) {
    return std::unique_ptr<SoftmaxRunner>(new TorchSoftmax(rows, n));
  });
  r.dots.emplace_back("libtorch", [](std::size_t n_keys, std::size_t d) {
    return std::unique_ptr<DotsRunner>(new TorchMv(n_keys, d));
  });
  r.context.emplace_back("torch_version", TORCH_VERSION);
  r.context.emplace_back("torch_cpu_capability", CpuCapability());
  r.context.emplace_back("torch_threads",
                         std::to_string(at::get_num_threads()));
}

}  // namespace softdot_peers
