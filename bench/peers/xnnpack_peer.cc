// XNNPACK softmax: the f32 NC softmax operator (channels = n, batch = rows),
// created once per shape; no thread pool (runs on the calling thread).
// XNNPACK may read up to XNN_EXTRA_BYTES past the end of the input; the
// arenas of peers_main.cc leave that much room after every buffer.
#include <xnnpack.h>

#include <memory>
#include <stdexcept>
#include <string>

#include "peers.h"

#ifndef SOFTDOT_XNNPACK_VERSION
#define SOFTDOT_XNNPACK_VERSION "unknown"
#endif

namespace softdot_peers {
namespace {

void Check(xnn_status status, const char* what) {
  if (status != xnn_status_success) {
    throw std::runtime_error(std::string("XNNPACK: ") + what +
                             " failed, status " +
                             std::to_string(static_cast<int>(status)));
  }
}

class XnnpackSoftmax final : public SoftmaxRunner {
 public:
  XnnpackSoftmax(std::size_t rows, std::size_t n) : rows_(rows) {
    Check(xnn_create_softmax_nc_f32(n, n, n, 0, &op_),
          "xnn_create_softmax_nc_f32");
  }
  ~XnnpackSoftmax() override { xnn_delete_operator(op_); }
  XnnpackSoftmax(const XnnpackSoftmax&) = delete;
  XnnpackSoftmax& operator=(const XnnpackSoftmax&) = delete;

  void Run(const float* x, float* y) override {
    // setup binds the buffers; needed again only when they move.
    if (x != x_ || y != y_) {
      Check(xnn_setup_softmax_nc_f32(op_, rows_, x, y, nullptr),
            "xnn_setup_softmax_nc_f32");
      x_ = x;
      y_ = y;
    }
    Check(xnn_run_operator(op_, nullptr), "xnn_run_operator");
  }

 private:
  std::size_t rows_;
  xnn_operator_t op_ = nullptr;
  const float* x_ = nullptr;
  float* y_ = nullptr;
};

}  // namespace

void RegisterXnnpack(Registry& r) {
  Check(xnn_initialize(nullptr), "xnn_initialize");
  r.softmax.emplace_back("xnnpack", [](std::size_t rows, std::size_t n) {
    return std::unique_ptr<SoftmaxRunner>(new XnnpackSoftmax(rows, n));
  });
  // No version call in XNNPACK: the Debian package version, read by CMake.
  r.context.emplace_back("xnnpack_version", SOFTDOT_XNNPACK_VERSION);
}

}  // namespace softdot_peers
