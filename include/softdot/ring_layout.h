// softdot: how a ring (sequence / context parallelism) splits a sequence
// over its ranks. In the core library, not softdot::mpi, so that every ring
// reads the one layout: the MPI ring (softdot::mpi::ring_attention, which
// names these softdot::mpi::Layout, RingLayout and ring_layout) and the
// torch.distributed ring of the Python package (softdot/_gloo_ring.py,
// through the binding softdot._softdot.ring_layout), which needs no MPI.
#ifndef SOFTDOT_RING_LAYOUT_H_
#define SOFTDOT_RING_LAYOUT_H_

#include <cstddef>
#include <vector>

namespace softdot {

// How a sequence of seq_len positions is split over P ranks. Every rank
// holds the same number of rows, rows() (the queries, keys and values of
// those positions); lengths that do not fill them are padded at the end
// with padding positions >= seq_len, which are masked keys and give zero
// query rows.
//   contiguous: P chunks of `chunk` positions; rank r holds chunk r.
//   zigzag:     2P chunks; rank r holds chunk r then chunk 2P - 1 - r, so
//               that under a causal mask every rank has about the same work.
enum class Layout { contiguous, zigzag };

// The keys of the deterministic MPI ring's fixed blocks (RingOptions,
// softdot/mpi.h).
inline constexpr std::size_t kRingBlock = 64;

struct RingLayout {
  Layout kind = Layout::zigzag;
  std::size_t seq_len = 0;
  int ranks = 1;
  std::size_t chunk = 0;  // positions per chunk
  // Chunks per rank: 1 (contiguous) or 2 (zigzag).
  std::size_t chunks_per_rank() const noexcept {
    return kind == Layout::zigzag ? 2 : 1;
  }
  // Rows every rank holds: chunk * chunks_per_rank().
  std::size_t rows() const noexcept { return chunk * chunks_per_rank(); }
  // The global position of rank `rank`'s chunk c (c < chunks_per_rank()).
  std::size_t chunk_start(int rank, std::size_t c) const noexcept;
  // The global position of each of rank `rank`'s rows, in row order
  // (rows() entries; those >= seq_len are padding).
  std::vector<std::size_t> positions(int rank) const;
};

// The layout of seq_len positions over `ranks` ranks: chunk =
// ceil(seq_len / (ranks * chunks_per_rank)) rounded up to a multiple of
// kRingBlock when `deterministic` (what the MPI ring's deterministic mode
// needs), and at least 1. std::invalid_argument when ranks < 1 or seq_len
// is 0. Allocates nothing; positions() allocates its vector.
RingLayout ring_layout(std::size_t seq_len, int ranks, Layout kind,
                       bool deterministic = false);

}  // namespace softdot

#endif  // SOFTDOT_RING_LAYOUT_H_
