// The consumer of softdot::mpi: compiles against <softdot/mpi.h> and links
// the installed library and MPI; runs the layout helper (no MPI_Init
// needed).
#include <softdot/mpi.h>

#include <cstdio>
#include <vector>

int main() {
  const softdot::mpi::RingLayout l =
      softdot::mpi::ring_layout(10, 2, softdot::mpi::Layout::zigzag);
  const std::vector<std::size_t> want = {0, 1, 2, 9, 10, 11};
  if (l.positions(0) != want) {
    std::fprintf(stderr, "softdot_consumer_mpi: wrong zigzag positions\n");
    return 1;
  }
  // The communicator-taking entry points link.
  auto* fn = static_cast<void (*)(
      MPI_Comm, softdot::TensorView<const float>,
      softdot::TensorView<const float>, softdot::TensorView<const float>,
      softdot::TensorView<float>, const softdot::mpi::RingOptions&, float*)>(
      &softdot::mpi::ring_attention);
  std::printf("softdot::mpi: zigzag layout OK, ring_attention at %p\n",
              reinterpret_cast<void*>(fn));
  return 0;
}
