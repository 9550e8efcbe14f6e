// softdot::mpi::ring_attention_backward (include/softdot/mpi.h): the
// gradients of ring_attention() by the ring, a client of the public
// attention_backward_partial() / attention_backward_finalize().
//
// Every rank keeps the double dQ sums of its own queries. The K/V shards
// travel the ring as in the forward (MPI_Isend / MPI_Irecv posted before
// the compute on the shard in hand, two buffers, P - 1 hops); beside each
// shard travel the double dK / dV sums of its keys: at step s a rank adds
// the contribution of its queries against the visiting shard into its dQ
// sums and into the visiting shard's dK / dV sums, then hands those sums on
// to rank + 1 (tag kAccTag; the size read with MPI_Probe, as a
// deterministic tree's message varies). After P steps every shard's sums
// have made P hops and are back on their owner, who rounds them once
// (attention_backward_finalize with the plan's float scale). Nothing is
// rounded to float before that.
//
// Not deterministic: each query chunk (cut in pieces of kPollRows rows, so
// the transfers progress between calls) calls attention_backward_partial
// against each key chunk of the visiting shard, adding in place into its
// dQ sums and the shard's dK / dV sums: the order is fixed for a given P
// (the same bits run to run), another P adds the same terms in another
// order.
//
// Deterministic: the contribution of every (query block, key block) pair of
// kRingBlock global positions each is computed alone, in a fresh zero
// partial (the call's rows and keys are the blocks' whole real rows, the
// same for every P, and the kernel's sums depend on nothing else), and the
// leaves are summed by binary trees whose shape depends on seq_len only:
//   dQ of query block qb:       a tree over the key blocks kb (local),
//   dK and dV of key block kb:  a tree over the query blocks qb; its pending
//                               subtrees travel with the shard.
// Each tree has ceil(seq_len / kRingBlock) real leaves padded to a power of
// two with empty ones; a node is the elementwise double sum of its
// children, made as soon as both are in. Double addition is commutative bit
// for bit and an empty node (a pair the causal mask or the window hides,
// or padding) is left out, so a tree's root has the same bits in whatever
// order its leaves arrive: the same for every P. Within a leaf the kernel
// sums GQA's query heads in head order (attention_backward). The sinks'
// gradient is summed per query block (b then row order, in double, the
// formula of attention_backward) and the blocks by the same tree, gathered
// on every rank; not deterministic, per rank and the ranks in rank order.
#include "mpi/ring_backward.h"

#include <mpi.h>

#include <algorithm>
#include <bit>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "attention_checks.h"
#include "mpi/comm.h"
#include "mpi/ring_core.h"
#include "softdot/attention.h"
#include "softdot/attention_request.h"
#include "softdot/mpi.h"

namespace softdot::mpi {
namespace {

using detail::agree_or_throw_runtime;
using detail::check_mpi;
using detail::hidden;
using detail::kPollRows;
using detail::row_range;

using detail::Args;
using detail::check_local;
using detail::check_same;
using detail::first_cols;
using detail::kBackwardFn;

constexpr const char* kFn = kBackwardFn;
constexpr int kKvTag = 0, kAccTag = 1;

// A binary tree of elementwise double sums over `real` leaves
// (ring_core.h's LeafTree); see the file comment.
struct AddDoubles {
  void operator()(std::vector<double>& a, const std::vector<double>& b) const {
    double* x = a.data();
    const double* y = b.data();
    for (std::size_t i = 0; i < a.size(); ++i) x[i] += y[i];
  }
};
using SumTree = detail::LeafTree<std::vector<double>, AddDoubles>;

// Appends a tree's pending nodes: count, then (level, index, present,
// values).
void write_tree(const SumTree& t, std::vector<double>& buf) {
  buf.push_back(static_cast<double>(t.nodes().size()));
  for (const auto& [key, node] : t.nodes()) {
    buf.push_back(key.first);
    buf.push_back(static_cast<double>(key.second));
    buf.push_back(node ? 1.0 : 0.0);
    if (node) buf.insert(buf.end(), node->begin(), node->end());
  }
}

// Reads what write_tree() wrote (values of `size` doubles each) from
// buf[at, ...) into t, advancing at.
void read_tree(SumTree& t, const std::vector<double>& buf, std::size_t& at,
               std::size_t size) {
  auto next = [&]() -> double {
    if (at >= buf.size()) throw std::runtime_error("short message");
    return buf[at++];
  };
  const auto count = static_cast<std::size_t>(next());
  for (std::size_t e = 0; e < count; ++e) {
    const int level = static_cast<int>(next());
    const auto idx = static_cast<std::size_t>(next());
    SumTree::Node node;
    if (next() != 0.0) {
      if (buf.size() - at < size) throw std::runtime_error("short message");
      node.emplace(buf.begin() + static_cast<std::ptrdiff_t>(at),
                   buf.begin() + static_cast<std::ptrdiff_t>(at + size));
      at += size;
    }
    t.nodes().emplace(std::make_pair(level, idx), std::move(node));
  }
}

// A run of this rank's query rows of contiguous global positions: a piece
// of a query chunk (not deterministic) or a kRingBlock block
// (deterministic).
struct Queries {
  std::size_t row0 = 0;          // first local row
  std::size_t pos = 0;           // its global position
  std::size_t real = 0;          // rows (all below seq_len)
  std::vector<float> lse, dlse;  // [B, H, real]
  std::vector<double> dq;        // not deterministic: [B, H, real, d]
  SumTree tree;                  // deterministic: over the key blocks
};

// The dK / dV sums of one visiting key range (a key chunk, not
// deterministic; a kRingBlock block, deterministic).
struct Keys {
  std::size_t row0 = 0;        // first row of the shard
  std::size_t pos = 0;         // its global position
  std::size_t real = 0;        // keys
  std::vector<double> dk, dv;  // not deterministic
  SumTree tree;                // deterministic: over the query blocks
};

// The key ranges of a shard of the layout (owner's chunks, real keys only).
std::vector<Keys> key_ranges(const RingLayout& L, int owner, bool det) {
  std::vector<Keys> out;
  const std::size_t n = L.seq_len, c = L.chunk;
  for (std::size_t kc = 0; kc < L.chunks_per_rank(); ++kc) {
    const std::size_t pos = L.chunk_start(owner, kc);
    const std::size_t real = pos < n ? std::min(c, n - pos) : 0;
    const std::size_t step = det ? kRingBlock : std::max<std::size_t>(real, 1);
    for (std::size_t j = 0; j < real; j += step) {
      Keys& x = out.emplace_back();
      x.row0 = kc * c + j;
      x.pos = pos + j;
      x.real = std::min(step, real - j);
    }
  }
  return out;
}

// The double sum of -exp(sink_h - lse) Delta over rows [r0, r0 + cnt) of
// every batch of a local chunk, into s[h] (attention_backward's formula).
void sink_sums(const Args& a, std::size_t row0, std::size_t cnt,
               std::vector<double>& s) {
  const auto& o = a.ro.attention;
  const std::size_t B = a.q.batch, H = a.q.heads, n = a.q.rows, dv = a.v.cols;
  for (std::size_t h = 0; h < H; ++h) {
    const float sink = o.sinks[h];
    for (std::size_t b = 0; b < B; ++b) {
      for (std::size_t i = row0; i < row0 + cnt; ++i) {
        const std::size_t at = (b * H + h) * n + i;
        const float* out = a.out.row(b, h, i);
        const float* go = a.dout.row(b, h, i);
        double delta = 0.0;
        for (std::size_t c = 0; c < dv; ++c) {
          if (out[c] != 0.0f) {
            delta += static_cast<double>(out[c]) * static_cast<double>(go[c]);
          }
        }
        if (a.dlse != nullptr) delta -= static_cast<double>(a.dlse[at]);
        const double ps = sink == -std::numeric_limits<float>::infinity()
                              ? 0.0
                              : std::exp(static_cast<double>(sink) -
                                         static_cast<double>(a.lse[at]));
        if (ps != 0.0 || std::isnan(delta)) s[h] -= ps * delta;
      }
    }
  }
}

// Every element of a view set to +0.
void zero(const TensorView<float>& t) {
  for (std::size_t b = 0; b < t.batch; ++b)
    for (std::size_t h = 0; h < t.heads; ++h)
      for (std::size_t r = 0; r < t.rows; ++r)
        std::fill_n(t.row(b, h, r), t.cols, 0.0f);
}

// One ring backward on this rank: the checks and the agreement, the shard
// and the sums, the P steps, the sinks' gradient and the final rounding.
class RingBackward {
 public:
  RingBackward(MPI_Comm user_comm, const Args& a)
      : a_(a), comm_(user_comm, kFn), P_(comm_.size()), rank_(comm_.rank()) {}

  void run() {
    check();
    setup();
    // Nothing can fail any more on bad arguments: the outputs may be
    // written. dbias: each call writes its columns; hidden pairs and
    // padding rows stay 0.
    if (!a_.g.dbias.empty()) zero(a_.g.dbias);
    for (int step = 0; step < P_; ++step) run_step(step);
    const std::vector<double> sink_total = sinks();
    finalize(sink_total);
  }

 private:
  // Local checks, then agreement: nothing moves before every rank is good.
  void check() {
    const RingOptions& ro = a_.ro;
    std::string err;
    try {
      L_ = ring_layout(ro.seq_len == 0 ? 1 : ro.seq_len, P_, ro.layout,
                       ro.deterministic);
      if (ro.seq_len == 0) err = std::string(kFn) + ": seq_len must be >= 1";
      if (err.empty()) err = check_local(L_, rank_, a_, &scale_);
    } catch (const std::exception& e) {
      err = std::string(kFn) + ": " + e.what();
    }
    detail::agree_or_throw(comm_.get(), err.empty(), err);
    err = check_same(comm_.get(), a_);
    if (!err.empty()) throw std::invalid_argument(err);
    det_ = ro.deterministic;
    B_ = a_.q.batch, H_ = a_.q.heads, Hkv_ = a_.k.heads;
    d_ = a_.q.cols, dv_ = a_.v.cols;
    n_ = ro.seq_len, c_ = L_.chunk, rows_ = L_.rows();
    real_blocks_ = (n_ + kRingBlock - 1) / kRingBlock;
    // The K/V shard: K [B, Hkv, rows, d] then V [B, Hkv, rows, dv], dense.
    k_floats_ = B_ * Hkv_ * rows_ * d_;
    kv_floats_ = k_floats_ + B_ * Hkv_ * rows_ * dv_;
    if (kv_floats_ * sizeof(float) > static_cast<std::size_t>(INT_MAX)) {
      throw std::invalid_argument(std::string(kFn) + ": a K/V shard of " +
                                  std::to_string(kv_floats_ * sizeof(float)) +
                                  " bytes is over one message's 2^31 - 1");
    }
  }

  // The shard packed, this rank's query pieces (with their lse and dlse)
  // and its own key ranges' sums; a failure (memory) agreed on.
  void setup() {
    std::string err;
    try {
      cur_.resize(kv_floats_);
      nxt_.resize(kv_floats_);
      float* p = cur_.data();
      for (const TensorView<const float>* t : {&a_.k, &a_.v}) {
        for (std::size_t b = 0; b < B_; ++b) {
          for (std::size_t h = 0; h < Hkv_; ++h) {
            for (std::size_t r = 0; r < rows_; ++r) {
              std::memcpy(p, t->row(b, h, r), t->cols * sizeof(float));
              p += t->cols;
            }
          }
        }
      }
      query_pieces();
      ks_ = key_ranges(L_, rank_, det_);
      for (Keys& x : ks_) {
        if (det_) {
          x.tree = SumTree(real_blocks_, true);
        } else {
          x.dk.assign(B_ * Hkv_ * x.real * d_, 0.0);
          x.dv.assign(B_ * Hkv_ * x.real * dv_, 0.0);
        }
      }
    } catch (const std::exception& e) {
      err = e.what();
    }
    agree_or_throw_runtime(comm_.get(), err.empty(),
                           std::string(kFn) + ": " + err);
  }

  void query_pieces() {
    for (std::size_t s = 0; s < L_.chunks_per_rank(); ++s) {
      const std::size_t pos = L_.chunk_start(rank_, s);
      const std::size_t real = pos < n_ ? std::min(c_, n_ - pos) : 0;
      const std::size_t piece = det_ ? kRingBlock
                                : P_ > 1 && real > kPollRows
                                    ? kPollRows
                                    : std::max<std::size_t>(real, 1);
      for (std::size_t r0 = 0; r0 < real; r0 += piece) {
        Queries& x = qs_.emplace_back();
        x.row0 = s * c_ + r0;
        x.pos = pos + r0;
        x.real = std::min(piece, real - r0);
        x.lse.resize(B_ * H_ * x.real);
        if (a_.dlse) x.dlse.resize(B_ * H_ * x.real);
        for (std::size_t bh = 0; bh < B_ * H_; ++bh) {
          std::copy_n(a_.lse + bh * rows_ + x.row0, x.real,
                      x.lse.data() + bh * x.real);
          if (a_.dlse) {
            std::copy_n(a_.dlse + bh * rows_ + x.row0, x.real,
                        x.dlse.data() + bh * x.real);
          }
        }
        if (det_) {
          x.tree = SumTree(real_blocks_, true);
        } else {
          x.dq.assign(B_ * H_ * x.real * d_, 0.0);
        }
      }
    }
  }

  // One attention_backward_partial call: queries x against keys y of the
  // shard in hand, adding into `part` (its shapes x.real x y.real).
  void call(const Queries& x, const Keys& y,
            AttentionGradientPartial& part) const {
    const AttentionOptions& o = a_.ro.attention;
    const TensorView<const float> kk(cur_.data(), B_, Hkv_, rows_, d_);
    const TensorView<const float> vv(cur_.data() + k_floats_, B_, Hkv_, rows_,
                                     dv_);
    AttentionGradients extras;
    if (!a_.g.dbias.empty()) {
      extras.dbias =
          first_cols(row_range(a_.g.dbias, x.row0, x.real), y.pos + y.real);
    }
    AttentionOptions c2 = o;
    c2.q_position = x.pos;
    c2.kv_position = y.pos;
    c2.sinks = {};
    c2.mask = row_range(o.mask, x.row0, x.real);
    c2.bias = row_range(o.bias, x.row0, x.real);
    attention_backward_partial(
        row_range(a_.q, x.row0, x.real), row_range(kk, y.row0, y.real),
        row_range(vv, y.row0, y.real), row_range(a_.out, x.row0, x.real),
        x.lse.data(), row_range(a_.dout, x.row0, x.real), part, c2, extras,
        a_.dlse ? x.dlse.data() : nullptr);
  }

  // Deterministic: the pair of blocks alone, into a fresh partial, its dQ
  // a leaf of x's tree and its dK / dV one of y's (empty when hidden).
  // Returns whether it computed.
  bool pair_blocks(Queries& x, Keys& y) const {
    const std::size_t qb = x.pos / kRingBlock, kb = y.pos / kRingBlock;
    if (hidden(a_.ro.attention, x.pos, x.pos + x.real - 1, y.pos,
               y.pos + y.real - 1)) {
      x.tree.add(kb, std::nullopt);
      y.tree.add(qb, std::nullopt);
      return false;
    }
    AttentionGradientPartial part =
        AttentionGradientPartial::zeros(B_, H_, Hkv_, x.real, y.real, d_, dv_);
    call(x, y, part);
    x.tree.add(kb, std::move(part.dq));
    std::vector<double> kv = std::move(part.dk);
    kv.insert(kv.end(), part.dv_sum.begin(), part.dv_sum.end());
    y.tree.add(qb, std::move(kv));
    return true;
  }

  // Not deterministic: the sums in place, this chunk's dQ and the shard's
  // dK and dV (given back even when the call throws). Returns whether it
  // computed.
  bool pair_sums(Queries& x, Keys& y) const {
    if (hidden(a_.ro.attention, x.pos, x.pos + x.real - 1, y.pos,
               y.pos + y.real - 1)) {
      return false;
    }
    AttentionGradientPartial part;
    part.batch = B_, part.heads = H_, part.kv_heads = Hkv_;
    part.rows = x.real, part.keys = y.real, part.d = d_, part.dv = dv_;
    part.dq = std::move(x.dq);
    part.dk = std::move(y.dk);
    part.dv_sum = std::move(y.dv);
    std::exception_ptr failed;
    try {
      call(x, y, part);
    } catch (...) {
      failed = std::current_exception();
    }
    x.dq = std::move(part.dq);
    y.dk = std::move(part.dk);
    y.dv = std::move(part.dv_sum);
    if (failed) std::rethrow_exception(failed);
    return true;
  }

  // Step s: the shard in hand goes to rank + 1 while this rank's queries
  // meet its keys; then the sums travel.
  void run_step(int step) {
    const int owner = (rank_ - step + P_) % P_;
    const int next = (rank_ + 1) % P_, prev = (rank_ + P_ - 1) % P_;
    const int kv_bytes = static_cast<int>(kv_floats_ * sizeof(float));
    MPI_Request req[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    if (step + 1 < P_) {
      check_mpi(MPI_Irecv(nxt_.data(), kv_bytes, MPI_BYTE, prev, kKvTag,
                          comm_.get(), &req[0]),
                "MPI_Irecv");
      check_mpi(MPI_Isend(cur_.data(), kv_bytes, MPI_BYTE, next, kKvTag,
                          comm_.get(), &req[1]),
                "MPI_Isend");
    }
    std::string err;
    try {
      for (Keys& y : ks_) {
        for (Queries& x : qs_) {
          const bool ran = det_ ? pair_blocks(x, y) : pair_sums(x, y);
          // Lets the transfers progress between the compute calls (Open
          // MPI moves nonblocking transfers only inside MPI calls).
          int done = 0;
          if (ran && step + 1 < P_) {
            MPI_Testall(2, req, &done, MPI_STATUSES_IGNORE);
          }
        }
      }
    } catch (const std::exception& e) {
      err = std::string(kFn) + ": " + e.what();
    }
    if (step + 1 < P_) {
      check_mpi(MPI_Waitall(2, req, MPI_STATUSES_IGNORE), "MPI_Waitall");
    }
    agree_or_throw_runtime(comm_.get(), err.empty(), err);
    if (P_ > 1) {
      exchange_sums(owner);
      std::swap(cur_, nxt_);
    }
  }

  // Serialises the visiting shard's dK / dV sums (the message to rank + 1).
  void write_acc(std::vector<double>& buf) const {
    buf.clear();
    for (const Keys& y : ks_) {
      if (det_) {
        write_tree(y.tree, buf);
      } else {
        buf.insert(buf.end(), y.dk.begin(), y.dk.end());
        buf.insert(buf.end(), y.dv.begin(), y.dv.end());
      }
    }
  }

  // The next shard's key ranges with the sums read from `buf`.
  std::vector<Keys> read_acc(int owner, const std::vector<double>& buf) const {
    std::vector<Keys> next = key_ranges(L_, owner, det_);
    std::size_t at = 0;
    for (Keys& y : next) {
      const std::size_t nk = B_ * Hkv_ * y.real * d_,
                        nv = B_ * Hkv_ * y.real * dv_;
      if (det_) {
        y.tree = SumTree(real_blocks_, false);
        read_tree(y.tree, buf, at, nk + nv);
      } else {
        if (buf.size() - at < nk + nv)
          throw std::runtime_error("short message");
        y.dk.assign(buf.begin() + static_cast<std::ptrdiff_t>(at),
                    buf.begin() + static_cast<std::ptrdiff_t>(at + nk));
        at += nk;
        y.dv.assign(buf.begin() + static_cast<std::ptrdiff_t>(at),
                    buf.begin() + static_cast<std::ptrdiff_t>(at + nv));
        at += nv;
      }
    }
    if (at != buf.size()) throw std::runtime_error("long message");
    return next;
  }

  // The visiting shard's sums go on to rank + 1 (after the last step: home
  // to their owner); those of the next shard come from rank - 1.
  void exchange_sums(int owner) {
    const int next = (rank_ + 1) % P_, prev = (rank_ + P_ - 1) % P_;
    std::string err;
    write_acc(acc_out_);
    if (acc_out_.size() > static_cast<std::size_t>(INT_MAX)) {
      err = std::string(kFn) + ": the dK / dV sums of a shard (" +
            std::to_string(acc_out_.size()) +
            " doubles) are over one message's 2^31 - 1";
    }
    agree_or_throw_runtime(comm_.get(), err.empty(), err);
    MPI_Request sreq = MPI_REQUEST_NULL;
    check_mpi(MPI_Isend(acc_out_.data(), static_cast<int>(acc_out_.size()),
                        MPI_DOUBLE, next, kAccTag, comm_.get(), &sreq),
              "MPI_Isend");
    MPI_Status st;
    check_mpi(MPI_Probe(prev, kAccTag, comm_.get(), &st), "MPI_Probe");
    int count = 0;
    check_mpi(MPI_Get_count(&st, MPI_DOUBLE, &count), "MPI_Get_count");
    acc_in_.resize(static_cast<std::size_t>(count));
    check_mpi(MPI_Recv(acc_in_.data(), count, MPI_DOUBLE, prev, kAccTag,
                       comm_.get(), MPI_STATUS_IGNORE),
              "MPI_Recv");
    check_mpi(MPI_Wait(&sreq, MPI_STATUS_IGNORE), "MPI_Wait");
    try {
      ks_ = read_acc((owner + P_ - 1) % P_, acc_in_);
    } catch (const std::exception& e) {
      err = std::string(kFn) +
            ": internal error: the dK / dV message from "
            "rank " +
            std::to_string(prev) + ": " + e.what();
    }
    agree_or_throw_runtime(comm_.get(), err.empty(), err);
  }

  // The sinks' gradient: per rank (not deterministic) or per query block
  // (deterministic), gathered on every rank and summed in a fixed order.
  std::vector<double> sinks() const {
    std::vector<double> total;
    if (a_.g.dsinks.empty()) return total;
    const std::size_t units = det_ ? rows_ / kRingBlock : 1;
    std::vector<double> mine(units * H_, 0.0), all(units * H_ * P_);
    if (det_) {
      for (const Queries& x : qs_) {
        std::vector<double> s(H_, 0.0);
        sink_sums(a_, x.row0, x.real, s);
        std::copy(s.begin(), s.end(),
                  mine.begin() + (x.row0 / kRingBlock) * H_);
      }
    } else {
      for (const Queries& x : qs_) sink_sums(a_, x.row0, x.real, mine);
    }
    check_mpi(
        MPI_Allgather(mine.data(), static_cast<int>(mine.size()), MPI_DOUBLE,
                      all.data(), static_cast<int>(mine.size()), MPI_DOUBLE,
                      comm_.get()),
        "MPI_Allgather");
    total.assign(H_, 0.0);
    if (!det_) {
      for (int r = 0; r < P_; ++r) {
        for (std::size_t h = 0; h < H_; ++h) {
          total[h] += all[static_cast<std::size_t>(r) * H_ + h];
        }
      }
      return total;
    }
    SumTree t(real_blocks_, true);
    for (int r = 0; r < P_; ++r) {
      for (std::size_t u = 0; u < units; ++u) {
        const std::size_t pos =
            L_.chunk_start(r, u * kRingBlock / c_) + u * kRingBlock % c_;
        if (pos >= n_) continue;
        const double* s =
            all.data() + (static_cast<std::size_t>(r) * units + u) * H_;
        t.add(pos / kRingBlock, std::vector<double>(s, s + H_));
      }
    }
    if (!t.complete()) {
      throw std::logic_error(std::string(kFn) +
                             ": internal error: the sinks' tree is "
                             "incomplete");
    }
    if (t.root()) total = *t.root();
    return total;
  }

  // Round once: dQ of this rank's queries, dK and dV of its own shard;
  // padding rows +0.
  void finalize(const std::vector<double>& sink_total) {
    zero(a_.g.dq);
    zero(a_.g.dk);
    zero(a_.g.dv);
    for (Queries& x : qs_) {
      AttentionGradientPartial part;
      part.batch = B_, part.heads = H_, part.kv_heads = Hkv_;
      part.rows = x.real, part.keys = 0, part.d = d_, part.dv = dv_;
      if (det_) {
        if (!x.tree.complete()) {
          throw std::logic_error(std::string(kFn) +
                                 ": internal error: a key block never arrived");
        }
        if (!x.tree.root()) continue;
        part.dq = std::move(*x.tree.root());
      } else {
        part.dq = std::move(x.dq);
      }
      attention_backward_finalize(part, scale_,
                                  row_range(a_.g.dq, x.row0, x.real), {}, {});
    }
    for (Keys& y : ks_) finalize_keys(y);
    for (std::size_t h = 0; h < sink_total.size(); ++h) {
      a_.g.dsinks[h] = static_cast<float>(sink_total[h]);
    }
  }

  void finalize_keys(Keys& y) {
    AttentionGradientPartial part;
    part.batch = B_, part.heads = H_, part.kv_heads = Hkv_;
    part.rows = 0, part.keys = y.real, part.d = d_, part.dv = dv_;
    const std::size_t nk = B_ * Hkv_ * y.real * d_;
    if (det_) {
      if (!y.tree.complete()) {
        throw std::logic_error(std::string(kFn) +
                               ": internal error: a query block never "
                               "added its keys' sums");
      }
      if (!y.tree.root()) return;
      std::vector<double>& s = *y.tree.root();
      part.dv_sum.assign(s.begin() + static_cast<std::ptrdiff_t>(nk), s.end());
      s.resize(nk);
      part.dk = std::move(s);
    } else {
      part.dk = std::move(y.dk);
      part.dv_sum = std::move(y.dv);
    }
    attention_backward_finalize(part, scale_, {},
                                row_range(a_.g.dk, y.row0, y.real),
                                row_range(a_.g.dv, y.row0, y.real));
  }

  const Args& a_;
  detail::DupComm comm_;
  const int P_, rank_;
  RingLayout L_;
  float scale_ = 0.0f;
  bool det_ = false;
  std::size_t B_ = 0, H_ = 0, Hkv_ = 0, d_ = 0, dv_ = 0, n_ = 0, c_ = 0,
              rows_ = 0, real_blocks_ = 0, k_floats_ = 0, kv_floats_ = 0;
  std::vector<Queries> qs_;
  std::vector<Keys> ks_;
  std::vector<float> cur_, nxt_;
  std::vector<double> acc_out_, acc_in_;
};

}  // namespace

void ring_attention_backward(MPI_Comm comm, TensorView<const float> q,
                             TensorView<const float> k,
                             TensorView<const float> v,
                             TensorView<const float> out, const float* lse,
                             TensorView<const float> dout,
                             const AttentionGradients& grads,
                             const RingOptions& options, const float* dlse) {
  RingBackward(comm, Args{q, k, v, out, dout, lse, dlse, grads, options}).run();
}

}  // namespace softdot::mpi
