// The ring core of softdot::mpi: what ring_attention (ring.cc) and
// ring_attention_backward (ring_backward.cc) share, defined once: the row
// ranges and shape strings of their messages, the checks every rank makes
// before the first exchange (the options the ring fixes itself, and one
// fingerprint of the shapes and every option compared across ranks), the
// visibility of a (query range, key range) pair, and the binary trees of the
// deterministic mode. Internal (src/mpi only).
#ifndef SOFTDOT_SRC_MPI_RING_CORE_H_
#define SOFTDOT_SRC_MPI_RING_CORE_H_

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "attention_checks.h"
#include "softdot/attention.h"
#include "softdot/mpi.h"

namespace softdot::mpi::detail {

// Query rows per compute call while a transfer is in flight (P > 1): the
// rank calls MPI_Testall between calls, and Open MPI moves a nonblocking
// transfer only inside MPI calls, so shorter calls let more of it overlap.
constexpr std::size_t kPollRows = 256;

// Rows [r0, r0 + n) of a view (an empty view stays empty).
template <class T>
TensorView<T> row_range(const TensorView<T>& t, std::size_t r0, std::size_t n) {
  TensorView<T> s = t;
  if (t.data != nullptr) s.data = t.data + r0 * t.row_stride;
  s.rows = n;
  return s;
}

using softdot::detail::attn::shape;

// The options the ring sets itself (positions, key ranges, the form) must
// keep their defaults: the message naming them, or "".
std::string check_ring_defaults(const std::string& fn,
                                const AttentionOptions& o);

// One field of what every rank must pass alike.
struct SameField {
  std::string name;
  std::int64_t value;
};

// The ring's fields: the shapes (q, k, v), the layout, and every option of
// AttentionOptions (softdot::option_fingerprint, attention.h: a new option
// joins every ring there, or the build fails).
std::vector<SameField> ring_fields(const TensorView<const float>& q,
                                   std::size_t k_heads, std::size_t d_v,
                                   const RingOptions& ro);

// Collective: the first field whose value differs between ranks, as the
// message "fn: NAME differs between ranks (...)", or "" on every rank. Every
// rank must pass the same names in the same order.
std::string check_same(MPI_Comm comm, const char* fn,
                       const std::vector<SameField>& fields);

// Whether no query of positions [q0, q1] can see a key of [k0, k1] under
// the causal mask and the window: such a pair adds nothing and is skipped.
// (The per-row rule is softdot::detail::attn::visible_keys; this is its
// test on a rectangle of positions.)
bool hidden(const AttentionOptions& o, std::size_t q0, std::size_t q1,
            std::size_t k0, std::size_t k1);

// A binary tree over `real` leaves padded to a power of two with empty
// ones (nullopt, the identity), each node Combine(arriving, pending
// sibling) of its children, made as soon as both are in: its shape depends
// on the leaf count alone, so with a commutative Combine the root has the
// same bits in whatever order the leaves arrive. A complete subtree is
// combined as soon as its leaves are in, so at most about log2(leaves)
// pending nodes per contiguous run of arrived leaves are kept. The pending
// nodes are kept by (level, index); the root is the node (top, 0).
template <class T, class Combine>
class LeafTree {
 public:
  using Node = std::optional<T>;
  using Nodes = std::map<std::pair<int, std::size_t>, Node>;

  LeafTree() = default;
  // pad: add the empty padding leaves now (false: a tree whose padding
  // leaves are already in, read from a message).
  LeafTree(std::size_t real, bool pad) {
    while (leaves_ < real) {
      leaves_ *= 2;
      ++top_;
    }
    if (pad) {
      for (std::size_t i = real; i < leaves_; ++i) add(i, std::nullopt);
    }
  }

  // Leaf i's value (nullopt: empty). Each leaf once.
  void add(std::size_t leaf, Node x) {
    int level = 0;
    std::size_t idx = leaf;
    while (level < top_) {
      const auto sib = nodes_.find({level, idx ^ 1});
      if (sib == nodes_.end()) {
        nodes_.emplace(std::make_pair(level, idx), std::move(x));
        return;
      }
      Node other = std::move(sib->second);
      nodes_.erase(sib);
      if (!x) {
        x = std::move(other);
      } else if (other) {
        Combine{}(*x, *other);
      }
      ++level;
      idx >>= 1;
    }
    nodes_.emplace(std::make_pair(top_, std::size_t{0}), std::move(x));
  }

  bool complete() const { return nodes_.count({top_, 0}) == 1; }
  // The root (complete() only): nullopt when every leaf was empty.
  Node& root() { return nodes_.at({top_, 0}); }
  // The pending nodes (for a tree that travels in a message).
  Nodes& nodes() { return nodes_; }
  const Nodes& nodes() const { return nodes_; }

 private:
  std::size_t leaves_ = 1;
  int top_ = 0;
  Nodes nodes_;
};

}  // namespace softdot::mpi::detail

#endif  // SOFTDOT_SRC_MPI_RING_CORE_H_
