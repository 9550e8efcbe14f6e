// softdot::mpi::ring_attention (include/softdot/mpi.h; its layout is the
// core's, src/ring_layout.cc).
//
// Each rank keeps, for each of its query chunks (one contiguous range of
// global positions), an AttentionPartial over the keys seen so far. The K
// and V shards travel the ring in a byte buffer each (K, V and the int8
// scales packed densely), two buffers per rank: at step s the rank sends the
// shard in hand to rank + 1 and receives the next one from rank - 1 into
// the other buffer, both posted before the compute on the shard in hand.
//
// (Over 600 lines on purpose: the checks, the shard packing and the ring
// loop share one local state and its collective error agreement; the
// vocabulary-parallel half already lives in vocab.cc / vocab_totals.cc.)
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
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "attention_checks.h"
#include "attention_schedule.h"
#include "mpi/comm.h"
#include "mpi/ring_core.h"
#include "softdot/attention.h"
#include "softdot/attention_request.h"
#include "softdot/mpi.h"

namespace softdot::mpi {

namespace {

using detail::agree_or_throw;
using detail::agree_or_throw_runtime;
using detail::check_mpi;
using detail::DupComm;
using detail::hidden;
using detail::kPollRows;
using detail::row_range;
using detail::shape;

constexpr const char* kFn = "softdot::mpi::ring_attention";
constexpr float kInf = std::numeric_limits<float>::infinity();

std::size_t align64(std::size_t n) { return (n + 63) / 64 * 64; }

// The K/V shard of one rank, packed densely: K [B, H_kv, rows, d], V
// [B, H_kv, rows, d_v] (then, int8, the K and V scales [B, H_kv, rows]),
// each section starting at a multiple of 64 bytes.
template <class KT>
struct Packing {
  std::size_t B, Hkv, rows, d, dv;
  std::size_t k_off = 0, v_off, ks_off, vs_off, bytes;
  Packing(std::size_t b, std::size_t hkv, std::size_t n, std::size_t d_,
          std::size_t dv_)
      : B(b), Hkv(hkv), rows(n), d(d_), dv(dv_) {
    v_off = align64(B * Hkv * rows * d * sizeof(KT));
    ks_off = v_off + align64(B * Hkv * rows * dv * sizeof(KT));
    const std::size_t scales =
        std::is_same_v<KT, std::int8_t> ? align64(B * Hkv * rows * 4) : 0;
    vs_off = ks_off + scales;
    bytes = vs_off + scales;
  }
  TensorView<const KT> k(const unsigned char* buf) const {
    return {reinterpret_cast<const KT*>(buf + k_off), B, Hkv, rows, d};
  }
  TensorView<const KT> v(const unsigned char* buf) const {
    return {reinterpret_cast<const KT*>(buf + v_off), B, Hkv, rows, dv};
  }
  TensorView<const float> ks(const unsigned char* buf) const {
    return {reinterpret_cast<const float*>(buf + ks_off), B, Hkv, rows, 1};
  }
  TensorView<const float> vs(const unsigned char* buf) const {
    return {reinterpret_cast<const float*>(buf + vs_off), B, Hkv, rows, 1};
  }
};

template <class T>
void pack_view(const TensorView<const T>& t, unsigned char* dst) {
  T* out = reinterpret_cast<T*>(dst);
  for (std::size_t b = 0; b < t.batch; ++b) {
    for (std::size_t h = 0; h < t.heads; ++h) {
      for (std::size_t r = 0; r < t.rows; ++r) {
        std::memcpy(out, t.row(b, h, r), t.cols * sizeof(T));
        out += t.cols;
      }
    }
  }
}

// attention_partial on K and V of either storage.
template <class KT>
void partial_of(const TensorView<const float>& q, const TensorView<const KT>& k,
                const TensorView<const KT>& v,
                const TensorView<const float>& ks,
                const TensorView<const float>& vs, AttentionPartial& part,
                const AttentionOptions& o) {
  if constexpr (std::is_same_v<KT, std::int8_t>) {
    attention_partial(q, Int8KV{k, ks}, Int8KV{v, vs}, part, o);
  } else {
    (void)ks;
    (void)vs;
    attention_partial(q, k, v, part, o);
  }
}

template <class KT>
constexpr int kv_code() {
  if constexpr (std::is_same_v<KT, Float16>) return 1;
  if constexpr (std::is_same_v<KT, BFloat16>) return 2;
  if constexpr (std::is_same_v<KT, std::int8_t>) return 3;
  return 0;
}

// The local checks of one rank; the empty string when every argument is
// good.
template <class KT>
std::string check_local(const RingLayout& L, int rank,
                        const TensorView<const float>& q,
                        const TensorView<const KT>& k,
                        const TensorView<const KT>& v,
                        const TensorView<const float>* ks,
                        const TensorView<const float>* vs,
                        const TensorView<float>& out, const RingOptions& ro) {
  const std::string fn = kFn;
  const AttentionOptions& o = ro.attention;
  if (std::string e = detail::check_ring_defaults(fn, o); !e.empty()) return e;
  const std::size_t n = L.rows();
  if (q.rows != n || k.rows != n || v.rows != n) {
    return fn + ": " + shape("q", q) + ", " + shape("k", k) + " and " +
           shape("v", v) + " must have rows = " + std::to_string(n) +
           " (seq_len " + std::to_string(ro.seq_len) + " over " +
           std::to_string(L.ranks) + " ranks, " +
           (L.kind == Layout::zigzag ? "zigzag" : "contiguous") +
           (ro.deterministic ? ", deterministic" : "") + ")";
  }
  if (out.batch != q.batch || out.heads != q.heads || out.rows != n ||
      out.cols != v.cols) {
    return fn + ": " + shape("out", out) + " must be " +
           shape("out", q.batch, q.heads, n, v.cols) + " for " + shape("q", q) +
           " and " + shape("v", v);
  }
  if (out.data == nullptr) return fn + ": out has null data";
  if (out.rows > 1 && out.row_stride < out.cols) {
    return fn + ": " + shape("out", out) + " has row_stride " +
           std::to_string(out.row_stride) + " < cols";
  }
  auto check_extra = [&](const char* name, auto& t) -> std::string {
    if (t.data == nullptr) return "";
    if (t.rows != n || t.cols != ro.seq_len) {
      return fn + ": options.attention." + shape(name, t) + " must have rows " +
             std::to_string(n) + " (the local queries) and cols = seq_len " +
             std::to_string(ro.seq_len);
    }
    return "";
  };
  std::string e = check_extra("mask", o.mask);
  if (e.empty()) e = check_extra("bias", o.bias);
  if (!e.empty()) return e;
  // Everything else as attention_partial() checks it: an empty key range
  // (no work) over the whole local shard, positions as the ring's first
  // call.
  AttentionOptions c = o;
  c.q_position = L.chunk_start(rank, 0);
  c.kv_position = 0;
  c.kv_begin = 0;
  c.kv_end = 0;
  c.mask = {};
  c.bias = {};
  AttentionPartial tmp;
  AttentionRequest r;
  r.name = "mpi::ring_attention";
  r.q = q;
  if constexpr (std::is_same_v<KT, std::int8_t>) {
    r.kv = KVSource::contiguous(Int8KV{k, *ks}, Int8KV{v, *vs});
  } else {
    r.kv = KVSource::contiguous(k, v);
  }
  r.target = AttentionTarget::partial_result(tmp);
  r.options = c;
  try {
    (void)AttentionPlan::make(r);
  } catch (const std::invalid_argument& ex) {
    return ex.what();
  }
  return "";
}

// Every rank's shapes and options must agree: the first that differs, or
// "".
template <class KT>
std::string check_same(MPI_Comm comm, const TensorView<const float>& q,
                       const TensorView<const KT>& k,
                       const TensorView<const KT>& v, const RingOptions& ro,
                       bool lse) {
  std::vector<detail::SameField> f =
      detail::ring_fields(q, k.heads, v.cols, ro);
  f.push_back({"K/V type", kv_code<KT>()});
  f.push_back({"lse", lse ? 1 : 0});
  return detail::check_same(comm, kFn, f);
}

// The deterministic merge: a binary tree over the kRingBlock-key blocks of
// the sequence (leaves = the real blocks, ceil(seq_len / kRingBlock)), each
// node the merge of its two children. Merging is commutative bit for bit
// with the empty partial its identity, so the root has the same bits in
// whatever order the leaves arrive: the same for every P (ring_core.h).
struct MergePartials {
  void operator()(AttentionPartial& a, const AttentionPartial& b) const {
    attention_merge(a, b);
  }
};
using BlockTree = detail::LeafTree<AttentionPartial, MergePartials>;

// Query rows per compute call while a transfer is in flight: kPollRows
// (ring_core.h). The pieces run in the prefill form, which the whole chunk
// would take too (it has more than kDecodeMaxRows rows per KV head), and
// the prefill form computes each row alone: the bits are those of one call
// on the chunk.

// One piece of a query chunk of this rank (contiguous positions).
struct QueryChunk {
  std::size_t row0 = 0;  // first local row
  std::size_t pos = 0;   // its global position
  std::size_t real = 0;  // rows (all below seq_len)
  bool prefill = false;  // force the prefill form (a piece of a chunk)
  AttentionPartial acc;
  std::optional<BlockTree> tree;  // deterministic
};

// One ring forward on this rank: the checks and the agreement, the shard
// and the query pieces, the P steps and the finalisation.
template <class KT>
class RingForward {
 public:
  RingForward(MPI_Comm user_comm, const TensorView<const float>& q,
              const TensorView<const KT>& k, const TensorView<const KT>& v,
              const TensorView<const float>* ks,
              const TensorView<const float>* vs, const TensorView<float>& out,
              const RingOptions& ro, float* lse)
      : comm_(user_comm, kFn),
        P_(comm_.size()),
        rank_(comm_.rank()),
        q_(q),
        k_(k),
        v_(v),
        ks_(ks),
        vs_(vs),
        out_(out),
        ro_(ro),
        o_(ro.attention),
        lse_(lse) {}

  void run() {
    check();
    setup();
    if (ro_.deterministic && !o_.sinks.empty()) sink_partials();
    for (int step = 0; step < P_; ++step) run_step(step);
    finish();
  }

 private:
  // Local checks, then agreement: nothing moves before every rank is good.
  void check() {
    std::string err;
    try {
      L_ = ring_layout(ro_.seq_len == 0 ? 1 : ro_.seq_len, P_, ro_.layout,
                       ro_.deterministic);
      if (ro_.seq_len == 0) err = std::string(kFn) + ": seq_len must be >= 1";
      if (err.empty()) {
        err = check_local<KT>(L_, rank_, q_, k_, v_, ks_, vs_, out_, ro_);
      }
    } catch (const std::exception& e) {
      err = std::string(kFn) + ": " + e.what();
    }
    agree_or_throw(comm_.get(), err.empty(), err);
    err = check_same<KT>(comm_.get(), q_, k_, v_, ro_, lse_ != nullptr);
    if (!err.empty()) throw std::invalid_argument(err);
    pk_.emplace(q_.batch, k_.heads, L_.rows(), k_.cols, v_.cols);
    if (pk_->bytes > static_cast<std::size_t>(INT_MAX)) {
      throw std::invalid_argument(std::string(kFn) + ": a K/V shard of " +
                                  std::to_string(pk_->bytes) +
                                  " bytes is over one message's 2^31 - 1");
    }
  }

  // The shard packed and this rank's query pieces; a failure (memory)
  // agreed on.
  void setup() {
    const std::size_t n = ro_.seq_len, c = L_.chunk;
    const std::size_t real_blocks = (n + kRingBlock - 1) / kRingBlock;
    std::string err;
    try {
      cur_.resize(pk_->bytes);
      nxt_.resize(pk_->bytes);
      pack_view(k_, cur_.data() + pk_->k_off);
      pack_view(v_, cur_.data() + pk_->v_off);
      if (ks_) {
        pack_view(*ks_, cur_.data() + pk_->ks_off);
        pack_view(*vs_, cur_.data() + pk_->vs_off);
      }
      const std::size_t g = q_.heads / k_.heads;
      for (std::size_t s = 0; s < L_.chunks_per_rank(); ++s) {
        const std::size_t pos = L_.chunk_start(rank_, s);
        const std::size_t real = pos < n ? std::min(c, n - pos) : 0;
        // Pieces only with transfers to overlap, and only where the whole
        // chunk runs the prefill form anyway (a piece of it computes each
        // row alone, as the whole chunk would: the same bits).
        const bool pieces = P_ > 1 && real > kPollRows &&
                            softdot::detail::attn::form_of(g * real, o_, 0) ==
                                AttentionForm::kPrefill;
        const std::size_t piece =
            pieces ? kPollRows : std::max<std::size_t>(real, 1);
        for (std::size_t r0 = 0; r0 < real; r0 += piece) {
          QueryChunk& x = qc_.emplace_back();
          x.row0 = s * c + r0;
          x.pos = pos + r0;
          x.real = std::min(piece, real - r0);
          x.prefill = pieces;
          x.acc = AttentionPartial::empty(q_.batch, q_.heads, x.real, v_.cols);
          if (ro_.deterministic) x.tree.emplace(real_blocks, true);
        }
      }
    } catch (const std::exception& e) {
      err = e.what();
    }
    agree_or_throw_runtime(comm_.get(), err.empty(),
                           std::string(kFn) + ": " + err);
  }

  // The options of one call: query chunk x against keys at kpos.
  AttentionOptions call_options(const QueryChunk& x, std::size_t kpos) const {
    AttentionOptions c2 = o_;
    c2.q_position = x.pos;
    c2.kv_position = kpos;
    c2.sinks = {};
    c2.prefill_form = ro_.deterministic || x.prefill;
    c2.mask = row_range(o_.mask, x.row0, x.real);
    c2.bias = row_range(o_.bias, x.row0, x.real);
    return c2;
  }

  // Deterministic: the sinks as a partial of their own (no keys), first in
  // the global order.
  void sink_partials() {
    std::string err;
    try {
      for (QueryChunk& x : qc_) {
        if (x.real == 0) continue;
        AttentionOptions c2 = call_options(x, 0);
        c2.sinks = o_.sinks;
        c2.mask = {};
        c2.bias = {};
        partial_of<KT>(row_range(q_, x.row0, x.real), row_range(k_, 0, 0),
                       row_range(v_, 0, 0),
                       ks_ ? row_range(*ks_, 0, 0) : TensorView<const float>{},
                       vs_ ? row_range(*vs_, 0, 0) : TensorView<const float>{},
                       x.acc, c2);
      }
    } catch (const std::exception& e) {
      err = e.what();
    }
    agree_or_throw_runtime(comm_.get(), err.empty(),
                           std::string(kFn) + ": " + err);
  }

  // The rows [krow, krow + kr) of the shard in hand (K, V and the int8
  // scales), one call's partial against query chunk x into p.
  void partial_on(const QueryChunk& x, std::size_t krow, std::size_t kr,
                  AttentionPartial& p, const AttentionOptions& c2) const {
    const unsigned char* buf = cur_.data();
    partial_of<KT>(
        row_range(q_, x.row0, x.real), row_range(pk_->k(buf), krow, kr),
        row_range(pk_->v(buf), krow, kr),
        ks_ ? row_range(pk_->ks(buf), krow, kr) : TensorView<const float>{},
        vs_ ? row_range(pk_->vs(buf), krow, kr) : TensorView<const float>{}, p,
        c2);
  }

  // Query chunk x against key chunk kc (at kpos, kr real keys, local row
  // krow) of the shard in hand; poke() after each computed call.
  template <class Poke>
  void chunk_pair(QueryChunk& x, int step, std::size_t kc, std::size_t kpos,
                  std::size_t kr, Poke poke) {
    const std::size_t krow = kc * L_.chunk;
    if (ro_.deterministic) {
      // Every real block of this key chunk enters the tree once: computed,
      // or empty when hidden.
      for (std::size_t j0 = 0; j0 < kr; j0 += kRingBlock) {
        const std::size_t j1 = std::min(kr, j0 + kRingBlock);
        const std::size_t blk = (kpos + j0) / kRingBlock;
        if (hidden(o_, x.pos, x.pos + x.real - 1, kpos + j0, kpos + j1 - 1)) {
          x.tree->add(blk, std::nullopt);
          continue;
        }
        AttentionOptions c2 = call_options(x, kpos);
        c2.kv_begin = j0;
        c2.kv_end = j1;
        AttentionPartial p;
        partial_on(x, krow, kr, p, c2);
        x.tree->add(blk, std::move(p));
        poke();
      }
      return;
    }
    // The sinks (not deterministic) go with this rank's own first key
    // chunk, once per query chunk, whatever that key chunk holds.
    const bool sink_call = !o_.sinks.empty() && step == 0 && kc == 0;
    if (!sink_call && (kr == 0 || hidden(o_, x.pos, x.pos + x.real - 1, kpos,
                                         kpos + kr - 1))) {
      return;
    }
    AttentionOptions c2 = call_options(x, kpos);
    if (sink_call) c2.sinks = o_.sinks;
    partial_on(x, krow, kr, part_, c2);
    attention_merge(x.acc, part_);
    poke();
  }

  void run_step(int step) {
    const int owner = (rank_ - step + P_) % P_;
    const int next = (rank_ + 1) % P_, prev = (rank_ + P_ - 1) % P_;
    const int bytes = static_cast<int>(pk_->bytes);
    const std::size_t n = ro_.seq_len, c = L_.chunk;
    MPI_Request req[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    if (step + 1 < P_) {
      check_mpi(MPI_Irecv(nxt_.data(), bytes, MPI_BYTE, prev, step, comm_.get(),
                          &req[0]),
                "MPI_Irecv");
      check_mpi(MPI_Isend(cur_.data(), bytes, MPI_BYTE, next, step, comm_.get(),
                          &req[1]),
                "MPI_Isend");
    }
    // Lets the transfers progress between the compute calls (Open MPI moves
    // nonblocking transfers only inside MPI calls).
    auto poke = [&] {
      int done = 0;
      if (step + 1 < P_) MPI_Testall(2, req, &done, MPI_STATUSES_IGNORE);
    };
    std::string err;
    try {
      for (std::size_t kc = 0; kc < L_.chunks_per_rank(); ++kc) {
        const std::size_t kpos = L_.chunk_start(owner, kc);
        const std::size_t kr = kpos < n ? std::min(c, n - kpos) : 0;
        for (QueryChunk& x : qc_) {
          if (x.real != 0) chunk_pair(x, step, kc, kpos, kr, poke);
        }
      }
    } catch (const std::exception& e) {
      err = std::string(kFn) + ": " + e.what();
    }
    if (step + 1 < P_) {
      check_mpi(MPI_Waitall(2, req, MPI_STATUSES_IGNORE), "MPI_Waitall");
    }
    agree_or_throw_runtime(comm_.get(), err.empty(), err);
    std::swap(cur_, nxt_);
  }

  // Deterministic: the sinks' partial (or the empty one), then the root of
  // the block tree. Padding rows get +0 and lse -inf; each piece's rows are
  // finalised.
  void finish() {
    const std::size_t B = q_.batch, H = q_.heads, dv = v_.cols;
    if (ro_.deterministic) {
      for (QueryChunk& x : qc_) {
        if (x.real == 0) continue;
        if (!x.tree->complete()) {
          throw std::logic_error(std::string(kFn) +
                                 ": internal error: a key block never arrived");
        }
        if (x.tree->root()) attention_merge(x.acc, *x.tree->root());
      }
    }
    for (std::size_t b = 0; b < B; ++b) {
      for (std::size_t h = 0; h < H; ++h) {
        for (std::size_t row = 0; row < L_.rows(); ++row) {
          std::fill_n(out_.row(b, h, row), dv, 0.0f);
          if (lse_) lse_[(b * H + h) * L_.rows() + row] = -kInf;
        }
      }
    }
    std::vector<float> lse_tmp(B * H * L_.chunk);
    for (const QueryChunk& x : qc_) {
      attention_finalize(x.acc, row_range(out_, x.row0, x.real),
                         lse_ ? lse_tmp.data() : nullptr);
      if (!lse_) continue;
      for (std::size_t bh = 0; bh < B * H; ++bh) {
        std::copy_n(lse_tmp.data() + bh * x.real, x.real,
                    lse_ + bh * L_.rows() + x.row0);
      }
    }
  }

  DupComm comm_;
  const int P_, rank_;
  const TensorView<const float>& q_;
  const TensorView<const KT>& k_;
  const TensorView<const KT>& v_;
  const TensorView<const float>* ks_;
  const TensorView<const float>* vs_;
  const TensorView<float>& out_;
  const RingOptions& ro_;
  const AttentionOptions& o_;
  float* lse_;
  RingLayout L_;
  std::optional<Packing<KT>> pk_;
  std::vector<QueryChunk> qc_;
  std::vector<unsigned char> cur_, nxt_;
  AttentionPartial part_;
};

template <class KT>
void run_ring(MPI_Comm comm, const TensorView<const float>& q,
              const TensorView<const KT>& k, const TensorView<const KT>& v,
              const TensorView<const float>* ks,
              const TensorView<const float>* vs, const TensorView<float>& out,
              const RingOptions& ro, float* lse) {
  RingForward<KT>(comm, q, k, v, ks, vs, out, ro, lse).run();
}

}  // namespace

void ring_attention(MPI_Comm comm, TensorView<const float> q,
                    TensorView<const float> k, TensorView<const float> v,
                    TensorView<float> out, const RingOptions& options,
                    float* lse) {
  run_ring<float>(comm, q, k, v, nullptr, nullptr, out, options, lse);
}
void ring_attention(MPI_Comm comm, TensorView<const float> q,
                    TensorView<const Float16> k, TensorView<const Float16> v,
                    TensorView<float> out, const RingOptions& options,
                    float* lse) {
  run_ring<Float16>(comm, q, k, v, nullptr, nullptr, out, options, lse);
}
void ring_attention(MPI_Comm comm, TensorView<const float> q,
                    TensorView<const BFloat16> k, TensorView<const BFloat16> v,
                    TensorView<float> out, const RingOptions& options,
                    float* lse) {
  run_ring<BFloat16>(comm, q, k, v, nullptr, nullptr, out, options, lse);
}
void ring_attention(MPI_Comm comm, TensorView<const float> q, const Int8KV& k,
                    const Int8KV& v, TensorView<float> out,
                    const RingOptions& options, float* lse) {
  run_ring<std::int8_t>(comm, q, k.values, v.values, &k.scales, &v.scales, out,
                        options, lse);
}

}  // namespace softdot::mpi
