// softdot::ring_layout (include/softdot/ring_layout.h): the ring's layout,
// shared by the MPI ring and the Python package's torch.distributed ring.
#include "softdot/ring_layout.h"

#include <algorithm>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

namespace softdot {

std::size_t RingLayout::chunk_start(int rank, std::size_t c) const noexcept {
  const auto r = static_cast<std::size_t>(rank);
  if (kind == Layout::contiguous) return r * chunk;
  const auto p = static_cast<std::size_t>(ranks);
  return (c == 0 ? r : 2 * p - 1 - r) * chunk;
}

std::vector<std::size_t> RingLayout::positions(int rank) const {
  std::vector<std::size_t> pos;
  pos.reserve(rows());
  for (std::size_t c = 0; c < chunks_per_rank(); ++c) {
    const std::size_t s = chunk_start(rank, c);
    for (std::size_t i = 0; i < chunk; ++i) pos.push_back(s + i);
  }
  return pos;
}

RingLayout ring_layout(std::size_t seq_len, int ranks, Layout kind,
                       bool deterministic) {
  // The messages keep the name the MPI ring's users have always read.
  if (ranks < 1) {
    throw std::invalid_argument(
        "softdot::mpi::ring_layout: ranks must be >= 1, got " +
        std::to_string(ranks));
  }
  if (seq_len == 0) {
    throw std::invalid_argument(
        "softdot::mpi::ring_layout: seq_len must be >= 1");
  }
  RingLayout l;
  l.kind = kind;
  l.seq_len = seq_len;
  l.ranks = ranks;
  const std::size_t parts =
      static_cast<std::size_t>(ranks) * l.chunks_per_rank();
  std::size_t chunk = (seq_len + parts - 1) / parts;
  if (deterministic) chunk = (chunk + kRingBlock - 1) / kRingBlock * kRingBlock;
  l.chunk = std::max<std::size_t>(chunk, 1);
  return l;
}

}  // namespace softdot
