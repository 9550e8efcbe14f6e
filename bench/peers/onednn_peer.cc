// oneDNN softmax: a softmax_forward primitive (forward inference, axis 1) on
// a plain [rows, n] f32 tensor, created once per shape on a CPU engine.
// oneDNN's CPU runtime here is OpenMP: it uses omp_get_max_threads() threads,
// which peers_main.cc sets to 1 for the single-thread benchmarks.
#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <unordered_map>

#include "peers.h"

namespace softdot_peers {
namespace {

struct Engine {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
};
Engine& TheEngine() {
  static Engine e;
  return e;
}

class OnednnSoftmax final : public SoftmaxRunner {
 public:
  OnednnSoftmax(std::size_t rows, std::size_t n) {
    Engine& e = TheEngine();
    const dnnl::memory::desc md({static_cast<dnnl::memory::dim>(rows),
                                 static_cast<dnnl::memory::dim>(n)},
                                dnnl::memory::data_type::f32,
                                dnnl::memory::format_tag::ab);
    const dnnl::softmax_forward::desc desc(dnnl::prop_kind::forward_inference,
                                           md, 1);
    const dnnl::softmax_forward::primitive_desc pd(desc, e.engine);
    prim_ = dnnl::softmax_forward(pd);
    // Handles are bound in Run; memory objects are reference-counted handles,
    // so the argument map sees set_data_handle without being rebuilt.
    src_ = dnnl::memory(md, e.engine, DNNL_MEMORY_NONE);
    dst_ = dnnl::memory(md, e.engine, DNNL_MEMORY_NONE);
    args_ = {{DNNL_ARG_SRC, src_}, {DNNL_ARG_DST, dst_}};
  }

  void Run(const float* x, float* y) override {
    if (x != x_ || y != y_) {
      src_.set_data_handle(const_cast<float*>(x));
      dst_.set_data_handle(y);
      x_ = x;
      y_ = y;
    }
    Engine& e = TheEngine();
    prim_.execute(e.stream, args_);
    e.stream.wait();
  }

 private:
  dnnl::softmax_forward prim_;
  dnnl::memory src_, dst_;
  std::unordered_map<int, dnnl::memory> args_;
  const float* x_ = nullptr;
  float* y_ = nullptr;
};

}  // namespace

void RegisterOnednn(Registry& r) {
  r.softmax.emplace_back("onednn", [](std::size_t rows, std::size_t n) {
    return std::unique_ptr<SoftmaxRunner>(new OnednnSoftmax(rows, n));
  });
  const dnnl_version_t* v = dnnl_version();
  r.context.emplace_back("onednn_version", std::to_string(v->major) + "." +
                                               std::to_string(v->minor) + "." +
                                               std::to_string(v->patch));
  r.context.emplace_back("onednn_cpu_isa", [] {
    switch (dnnl::get_effective_cpu_isa()) {
      case dnnl::cpu_isa::avx512_core:
        return "avx512_core";
      case dnnl::cpu_isa::avx512_core_vnni:
        return "avx512_core_vnni";
      case dnnl::cpu_isa::avx512_core_bf16:
        return "avx512_core_bf16";
      case dnnl::cpu_isa::avx512_core_amx:
        return "avx512_core_amx";
      case dnnl::cpu_isa::avx2:
        return "avx2";
      case dnnl::cpu_isa::avx2_vnni:
        return "avx2_vnni";
      case dnnl::cpu_isa::avx:
        return "avx";
      case dnnl::cpu_isa::sse41:
        return "sse41";
      default:
        return "other";
    }
  }());
}

}  // namespace softdot_peers
