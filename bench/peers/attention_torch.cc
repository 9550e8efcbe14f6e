// libtorch (ATen, CPU) attention, written as a libtorch user would, into
// tensors that wrap the benchmark's buffers (from_blob; when the buffers
// move, only the storages' data pointers are swapped, as in torch_peer.cc):
//   libtorch       matmul + softmax + matmul: S = scale * Q K^T
//                  (at::addmm_out, beta 0, alpha = scale, into a
//                  preallocated n x n tensor), causal: S.masked_fill_ of
//                  -inf above the diagonal (a precomputed bool triu mask),
//                  P = at::_softmax_out(S) (a second n x n tensor),
//                  O = at::mm_out(P, V);
//   libtorch_sdpa  at::_scaled_dot_product_attention(q, k, v, {}, 0, false,
//                  is_causal) on [1, 1, n, d] views (libtorch 1.13's name of
//                  torch.nn.functional.scaled_dot_product_attention; on the
//                  CPU it allocates its own scores and output), copied into O;
//   decode         grouped-query decode as matmul + softmax + matmul with the
//                  8 query heads viewed as [2 KV heads x 4] (no copy of K or
//                  V, the result of expanding K and V to 8 heads):
//                  S = scale * Q_g K_g^T (at::baddbmm_out), P = softmax(S),
//                  O = at::bmm_out(P, V).
// Runs under c10::InferenceMode; at::set_num_threads sets the intra-op threads.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/_scaled_dot_product_attention.h>
#include <ATen/ops/_softmax.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/baddbmm.h>
#include <ATen/ops/bmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/triu.h>
#include <c10/core/InferenceMode.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <tuple>

#include "peers.h"

namespace softdot_peers {
namespace {

at::Tensor Wrap(at::IntArrayRef sizes, const float* data) {
  return at::from_blob(const_cast<float*>(data), sizes,
                       at::TensorOptions().dtype(at::kFloat));
}

// Points the tensor's storage (shared with its views) at `data`.
void Rebind(at::Tensor& t, const float* data) {
  t.storage().set_data_ptr_noswap(c10::DataPtr(
      const_cast<float*>(data), c10::Device(c10::DeviceType::CPU)));
}

float* Placeholder() {
  static float p[1];
  return p;
}

double Scale(std::size_t d) {
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
}

// Tensors over the four buffers of a call, rebound when a pointer changes.
class Bound {
 public:
  Bound(at::IntArrayRef q_sizes, at::IntArrayRef kv_sizes,
        at::IntArrayRef o_sizes)
      : q(Wrap(q_sizes, Placeholder())),
        k(Wrap(kv_sizes, Placeholder())),
        v(Wrap(kv_sizes, Placeholder())),
        o(Wrap(o_sizes, Placeholder())) {}
  void Bind(const float* qp, const float* kp, const float* vp, float* op) {
    if (qp != ptr_[0]) Rebind(q, ptr_[0] = qp);
    if (kp != ptr_[1]) Rebind(k, ptr_[1] = kp);
    if (vp != ptr_[2]) Rebind(v, ptr_[2] = vp);
    if (op != ptr_[3]) Rebind(o, ptr_[3] = op);
  }
  at::Tensor q, k, v, o;

 private:
  const float* ptr_[4] = {nullptr, nullptr, nullptr, nullptr};
};

class TorchMatmulSoftmax final : public AttentionRunner {
 public:
  TorchMatmulSoftmax(std::size_t n, std::size_t d, bool causal)
      : scale_(Scale(d)),
        causal_(causal),
        t_({N(n), N(d)}, {N(n), N(d)}, {N(n), N(d)}) {
    c10::InferenceMode guard;
    kt_ = t_.k.t();
    s_ = at::empty({N(n), N(n)}, at::kFloat);
    p_ = at::empty({N(n), N(n)}, at::kFloat);
    if (causal_) mask_ = at::ones({N(n), N(n)}, at::kBool).triu(1);
  }
  void Run(const float* q, const float* k, const float* v, float* o) override {
    c10::InferenceMode guard;
    t_.Bind(q, k, v, o);
    at::addmm_out(s_, s_, t_.q, kt_, /*beta=*/0, /*alpha=*/scale_);
    if (causal_)
      s_.masked_fill_(mask_, -std::numeric_limits<float>::infinity());
    at::_softmax_out(p_, s_, -1, /*half_to_float=*/false);
    at::mm_out(t_.o, p_, t_.v);
  }

 private:
  static std::int64_t N(std::size_t x) { return static_cast<std::int64_t>(x); }
  double scale_;
  bool causal_;
  Bound t_;
  at::Tensor kt_, s_, p_, mask_;
};

class TorchSdpa final : public AttentionRunner {
 public:
  TorchSdpa(std::size_t n, std::size_t d, bool causal)
      : causal_(causal),
        t_({1, 1, N(n), N(d)}, {1, 1, N(n), N(d)}, {1, 1, N(n), N(d)}) {}
  void Run(const float* q, const float* k, const float* v, float* o) override {
    c10::InferenceMode guard;
    t_.Bind(q, k, v, o);
    const auto result = at::_scaled_dot_product_attention(
        t_.q, t_.k, t_.v, /*attn_mask=*/c10::nullopt, /*dropout_p=*/0.0,
        /*need_attn_weights=*/false, /*is_causal=*/causal_);
    t_.o.copy_(std::get<0>(result));
  }

 private:
  static std::int64_t N(std::size_t x) { return static_cast<std::int64_t>(x); }
  bool causal_;
  Bound t_;
};

class TorchDecode final : public DecodeRunner {
 public:
  TorchDecode(std::size_t heads, std::size_t kv_heads, std::size_t n_kv,
              std::size_t d)
      : scale_(Scale(d)),
        t_({N(kv_heads), N(heads / kv_heads), N(d)},
           {N(kv_heads), N(n_kv), N(d)},
           {N(kv_heads), N(heads / kv_heads), N(d)}) {
    c10::InferenceMode guard;
    kt_ = t_.k.transpose(1, 2);
    s_ = at::empty({N(kv_heads), N(heads / kv_heads), N(n_kv)}, at::kFloat);
    p_ = at::empty_like(s_);
  }
  void Run(const float* q, const float* k, const float* v, float* o) override {
    c10::InferenceMode guard;
    t_.Bind(q, k, v, o);
    at::baddbmm_out(s_, s_, t_.q, kt_, /*beta=*/0, /*alpha=*/scale_);
    at::_softmax_out(p_, s_, -1, /*half_to_float=*/false);
    at::bmm_out(t_.o, p_, t_.v);
  }

 private:
  static std::int64_t N(std::size_t x) { return static_cast<std::int64_t>(x); }
  double scale_;
  Bound t_;
  at::Tensor kt_, s_, p_;
};

}  // namespace

void RegisterTorchAttention(Registry& r) {
  r.attention.emplace_back("libtorch",
                           [](std::size_t n, std::size_t d, bool causal) {
                             return std::unique_ptr<AttentionRunner>(
                                 new TorchMatmulSoftmax(n, d, causal));
                           });
  r.attention.emplace_back(
      "libtorch_sdpa", [](std::size_t n, std::size_t d, bool causal) {
        return std::unique_ptr<AttentionRunner>(new TorchSdpa(n, d, causal));
      });
  r.decode.emplace_back("libtorch", [](std::size_t heads, std::size_t kv_heads,
                                       std::size_t n_kv, std::size_t d) {
    return std::unique_ptr<DecodeRunner>(
        new TorchDecode(heads, kv_heads, n_kv, d));
  });
  r.set_threads.emplace_back([](int t) { at::set_num_threads(t); });
}

}  // namespace softdot_peers
