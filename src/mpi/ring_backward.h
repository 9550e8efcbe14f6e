// The MPI ring backward's arguments and its checks (ring_backward_checks.cc),
// shared with its runner (ring_backward.cc). Internal (src/mpi only).
#ifndef SOFTDOT_SRC_MPI_RING_BACKWARD_H_
#define SOFTDOT_SRC_MPI_RING_BACKWARD_H_

#include <mpi.h>

#include <cstddef>
#include <string>

#include "softdot/attention.h"
#include "softdot/mpi.h"

namespace softdot::mpi::detail {

inline constexpr const char* kBackwardFn =
    "softdot::mpi::ring_attention_backward";

// The first cols columns of a view.
template <class T>
TensorView<T> first_cols(const TensorView<T>& t, std::size_t cols) {
  TensorView<T> s = t;
  s.cols = cols;
  return s;
}

// One rank's arguments of ring_attention_backward().
struct Args {
  TensorView<const float> q, k, v, out, dout;
  const float* lse;
  const float* dlse;
  const AttentionGradients& g;
  const RingOptions& ro;
};

// The local checks of one rank; the empty string when every argument is
// good (then *scale is the plan's float scale).
std::string check_local(const RingLayout& L, int rank, const Args& a,
                        float* scale);

// Every rank's shapes and options must agree (collective): the first that
// differs, or "".
std::string check_same(MPI_Comm comm, const Args& a);

}  // namespace softdot::mpi::detail

#endif  // SOFTDOT_SRC_MPI_RING_BACKWARD_H_
