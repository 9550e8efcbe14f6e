// softdot command: `mpirun -np P softdot attention ... --ring`, attention of
// one sequence over P processes with softdot::mpi::ring_attention. Rank 0
// reads the inputs (as `softdot attention` does), sends each rank the rows
// of its positions (q, k, v, int8 scales; the mask and bias rows of its
// queries over every key), every rank runs the ring, and rank 0 gathers the
// output rows and writes -o (and --lse). Built only with softdot::mpi.
#include "commands_ring.h"

#include <mpi.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "attention_inputs.h"
#include "commands.h"
#include "error.h"
#include "io_npy.h"
#include "mpi_session.h"
#include "output_file.h"
#include "softdot/mpi.h"

namespace softdot::cli {
namespace {

using softdot::mpi::Layout;
using softdot::mpi::RingLayout;

void check(int rc, const char* call) {
  if (rc != MPI_SUCCESS)
    throw CliError(std::string("--ring: ") + call + " failed");
}

// Sends or receives a vector's bytes (in pieces below 2^31 bytes).
template <class T>
void send_vec(const std::vector<T>& x, int to, MPI_Comm c) {
  const auto* p = reinterpret_cast<const unsigned char*>(x.data());
  std::size_t left = x.size() * sizeof(T);
  do {
    const std::size_t n = std::min<std::size_t>(left, 1u << 30);
    check(MPI_Send(p, static_cast<int>(n), MPI_BYTE, to, 1, c), "MPI_Send");
    p += n;
    left -= n;
  } while (left > 0);
}
template <class T>
void recv_vec(std::vector<T>& x, int from, MPI_Comm c) {
  auto* p = reinterpret_cast<unsigned char*>(x.data());
  std::size_t left = x.size() * sizeof(T);
  do {
    const std::size_t n = std::min<std::size_t>(left, 1u << 30);
    check(MPI_Recv(p, static_cast<int>(n), MPI_BYTE, from, 1, c,
                   MPI_STATUS_IGNORE),
          "MPI_Recv");
    p += n;
    left -= n;
  } while (left > 0);
}
template <class T>
void bcast_vec(std::vector<T>& x, MPI_Comm c) {
  auto* p = reinterpret_cast<unsigned char*>(x.data());
  std::size_t left = x.size() * sizeof(T);
  while (left > 0) {
    const std::size_t n = std::min<std::size_t>(left, 1u << 30);
    check(MPI_Bcast(p, static_cast<int>(n), MPI_BYTE, 0, c), "MPI_Bcast");
    p += n;
    left -= n;
  }
}

// Rows `pos` of a view [B, H, n, cols] (dense result [B, H, pos.size(),
// cols]); padding positions (>= n) get `fill`.
template <class T>
std::vector<std::remove_const_t<T>> take_rows(
    const TensorView<T>& t, const std::vector<std::size_t>& pos,
    std::remove_const_t<T> fill) {
  std::vector<std::remove_const_t<T>> out(
      t.batch * t.heads * pos.size() * t.cols, fill);
  auto* o = out.data();
  for (std::size_t b = 0; b < t.batch; ++b) {
    for (std::size_t h = 0; h < t.heads; ++h) {
      for (std::size_t i = 0; i < pos.size(); ++i, o += t.cols) {
        if (pos[i] < t.rows) std::copy_n(t.row(b, h, pos[i]), t.cols, o);
      }
    }
  }
  return out;
}

// What every rank needs to know of the inputs before they arrive.
struct Header {
  std::int64_t ok = 0;
  std::int64_t B = 0, H = 0, Hkv = 0, n = 0, d = 0, dv = 0;
  std::int64_t mask_b = 0, mask_h = 0;  // 0: no mask
  std::int64_t bias_b = 0, bias_h = 0;  // 0: no bias
  std::int64_t four_d = 0;
  std::int64_t alibi = 0;  // ALiBi slopes (one per query head), 0: none
};

// The header's sizes, as every rank indexes with them.
struct Sizes {
  std::size_t B, H, Hkv, n, d, dv;
  explicit Sizes(const Header& h)
      : B(static_cast<std::size_t>(h.B)),
        H(static_cast<std::size_t>(h.H)),
        Hkv(static_cast<std::size_t>(h.Hkv)),
        n(static_cast<std::size_t>(h.n)),
        d(static_cast<std::size_t>(h.d)),
        dv(static_cast<std::size_t>(h.dv)) {}
};

// The options read from files, which reach rank 0 only: the whole mask and
// bias, [mb, mh, n, n], and the ALiBi slopes. Each goes to every rank (the
// ring compares every option across ranks and refuses a difference).
struct SharedOptions {
  std::vector<char> mask;
  std::vector<float> bias;
  std::vector<float> alibi;
};

// Rank 0: the tensors of the inputs, the header that describes them and the
// options from files, the mask and bias each as a whole [b, h, n, n] (the
// mask's broadcast rows written out). Throws for q and k of different
// lengths, and whatever assemble_tensors throws.
template <class KV>
Header assemble_on_rank0(const AttentionInputs& in, AttentionTensors<KV>* t,
                         AttentionOptions* options, SharedOptions* shared) {
  assemble_tensors(in, t, options);
  if (in.q.rows() != in.k.rows()) {
    throw CliError(
        "--ring computes attention over one sequence: q and k need the "
        "same number of rows (n_q = n_kv) " +
        both(in.q, in.k));
  }
  Header h;
  h.B = static_cast<std::int64_t>(t->q.batch);
  h.H = static_cast<std::int64_t>(t->q.heads);
  h.Hkv = static_cast<std::int64_t>(t->k.heads);
  h.n = static_cast<std::int64_t>(t->q.rows);
  h.d = static_cast<std::int64_t>(t->q.cols);
  h.dv = static_cast<std::int64_t>(t->v.cols);
  h.four_d = in.q.rank() == 4;
  shared->alibi.assign(options->alibi_slopes.begin(),
                       options->alibi_slopes.end());
  h.alibi = static_cast<std::int64_t>(shared->alibi.size());
  const std::size_t n = t->q.rows;
  if (!options->mask.empty()) {
    const auto& m = options->mask;
    h.mask_b = static_cast<std::int64_t>(m.batch);
    h.mask_h = static_cast<std::int64_t>(m.heads);
    TensorView<const bool> full = m;
    full.rows = n;
    for (std::size_t b = 0; b < m.batch; ++b)
      for (std::size_t hh = 0; hh < m.heads; ++hh)
        for (std::size_t i = 0; i < n; ++i) {
          const bool* r = full.row(b, hh, i);
          for (std::size_t j = 0; j < n; ++j)
            shared->mask.push_back(r[j] ? 1 : 0);
        }
  }
  if (!options->bias.empty()) {
    const auto& bv = options->bias;
    h.bias_b = static_cast<std::int64_t>(bv.batch);
    h.bias_h = static_cast<std::int64_t>(bv.heads);
    for (std::size_t b = 0; b < bv.batch; ++b)
      for (std::size_t hh = 0; hh < bv.heads; ++hh)
        for (std::size_t i = 0; i < n; ++i)
          shared->bias.insert(shared->bias.end(), bv.row(b, hh, i),
                              bv.row(b, hh, i) + n);
  }
  h.ok = 1;
  return h;
}

// Every rank: the options from files, broadcast whole from rank 0 (each rank
// takes its rows of the mask and bias afterwards).
void share_options(const Header& h, std::size_t n, SharedOptions* shared,
                   MPI_Comm comm) {
  if (h.alibi) {
    shared->alibi.resize(static_cast<std::size_t>(h.alibi));
    bcast_vec(shared->alibi, comm);
  }
  if (h.mask_b) {
    shared->mask.resize(static_cast<std::size_t>(h.mask_b * h.mask_h) * n * n);
    bcast_vec(shared->mask, comm);
  }
  if (h.bias_b) {
    shared->bias.resize(static_cast<std::size_t>(h.bias_b * h.bias_h) * n * n);
    bcast_vec(shared->bias, comm);
  }
}

// One rank's rows of q, k and v (and of the int8 scales), dense [B, heads,
// rows, cols].
template <class KV>
struct LocalRows {
  std::vector<float> q, ks, vs;
  std::vector<KV> k, v;
};

template <class KV>
inline constexpr bool kIsInt8 = std::is_same_v<KV, std::int8_t>;

// Rank 0: the rows of positions `pos` of the whole tensors.
template <class KV>
LocalRows<KV> take_local_rows(const AttentionTensors<KV>& t,
                              const std::vector<std::size_t>& pos) {
  LocalRows<KV> x;
  x.q = take_rows(t.q, pos, 0.0f);
  x.k = take_rows(t.k, pos, KV{});
  x.v = take_rows(t.v, pos, KV{});
  if constexpr (kIsInt8<KV>) {
    x.ks = take_rows(t.k_scales, pos, 0.0f);
    x.vs = take_rows(t.v_scales, pos, 0.0f);
  }
  return x;
}

// Rank 0 sends each rank its rows (rank P - 1 first); its own it keeps. The
// others receive theirs, `rows` per (batch, head).
template <class KV>
LocalRows<KV> distribute_rows(const AttentionTensors<KV>& t, const Sizes& s,
                              const RingLayout& L, int rank, int P,
                              MPI_Comm comm) {
  LocalRows<KV> x;
  if (rank != 0) {
    const std::size_t rows = L.rows();
    x.q.resize(s.B * s.H * rows * s.d);
    x.k.resize(s.B * s.Hkv * rows * s.d);
    x.v.resize(s.B * s.Hkv * rows * s.dv);
    recv_vec(x.q, 0, comm);
    recv_vec(x.k, 0, comm);
    recv_vec(x.v, 0, comm);
    if constexpr (kIsInt8<KV>) {
      x.ks.resize(s.B * s.Hkv * rows);
      x.vs.resize(s.B * s.Hkv * rows);
      recv_vec(x.ks, 0, comm);
      recv_vec(x.vs, 0, comm);
    }
    return x;
  }
  for (int r = P - 1; r > 0; --r) {
    x = take_local_rows(t, L.positions(r));
    send_vec(x.q, r, comm);
    send_vec(x.k, r, comm);
    send_vec(x.v, r, comm);
    if constexpr (kIsInt8<KV>) {
      send_vec(x.ks, r, comm);
      send_vec(x.vs, r, comm);
    }
  }
  return take_local_rows(t, L.positions(0));
}

// This rank's rows of the mask and bias (those of its queries, over every
// key); the ring's options point into them.
struct LocalScores {
  std::unique_ptr<bool[]> mask;
  std::vector<float> bias;
};

// The ring's options on every rank: the command's, with the ALiBi slopes
// from rank 0 and this rank's rows of the mask and bias (kept in `local`).
softdot::mpi::RingOptions ring_options(const AttentionArgs& args,
                                       const AttentionOptions& options,
                                       const Header& h,
                                       const SharedOptions& shared,
                                       const RingLayout& L, int rank,
                                       Layout kind, LocalScores* local) {
  const std::size_t n = static_cast<std::size_t>(h.n), rows = L.rows();
  const auto pos = L.positions(rank);
  softdot::mpi::RingOptions ro;
  ro.attention = options;
  ro.attention.mask = {};
  ro.attention.bias = {};
  ro.attention.alibi_slopes = shared.alibi;
  ro.seq_len = n;
  ro.layout = kind;
  ro.deterministic = args.deterministic;
  if (h.mask_b) {
    const auto mb = static_cast<std::size_t>(h.mask_b),
               mh = static_cast<std::size_t>(h.mask_h);
    const std::vector<char> m = take_rows(
        TensorView<const char>(shared.mask.data(), mb, mh, n, n), pos, char{1});
    local->mask.reset(new bool[m.size()]);
    for (std::size_t i = 0; i < m.size(); ++i) local->mask[i] = m[i] != 0;
    ro.attention.mask =
        TensorView<const bool>(local->mask.get(), mb, mh, rows, n);
  }
  if (h.bias_b) {
    const auto bb = static_cast<std::size_t>(h.bias_b),
               bh = static_cast<std::size_t>(h.bias_h);
    local->bias = take_rows(
        TensorView<const float>(shared.bias.data(), bb, bh, n, n), pos, 0.0f);
    ro.attention.bias =
        TensorView<const float>(local->bias.data(), bb, bh, rows, n);
  }
  return ro;
}

// Every rank's part of the ring: its output rows `out` [B, H, rows, dv] and
// their log-sum-exps `lse`. The library's error is the same on every rank:
// rank 0 reports it.
template <class KV>
void run_local_ring(const LocalRows<KV>& x, const Sizes& s, std::size_t rows,
                    const softdot::mpi::RingOptions& ro, int rank,
                    MPI_Comm comm, std::vector<float>* out,
                    std::vector<float>* lse) {
  const TensorView<const float> qv(x.q.data(), s.B, s.H, rows, s.d);
  const TensorView<const KV> kv(x.k.data(), s.B, s.Hkv, rows, s.d),
      vv(x.v.data(), s.B, s.Hkv, rows, s.dv);
  const TensorView<float> ov(out->data(), s.B, s.H, rows, s.dv);
  try {
    if constexpr (kIsInt8<KV>) {
      softdot::mpi::ring_attention(
          comm, qv,
          Int8KV{kv, TensorView<const float>(x.ks.data(), s.B, s.Hkv, rows, 1)},
          Int8KV{vv, TensorView<const float>(x.vs.data(), s.B, s.Hkv, rows, 1)},
          ov, ro, lse->data());
    } else {
      softdot::mpi::ring_attention(comm, qv, kv, vv, ov, ro, lse->data());
    }
  } catch (const std::exception& e) {
    if (rank == 0) throw CliError(e.what());
    throw CliQuietError();
  }
}

// Rank 0: each rank's output rows and log-sum-exps (its own `out` and `lse`,
// the others' received into them) put at their positions, then written to
// -o and --lse, shaped as q was.
void gather_and_write(const AttentionArgs& args, const Header& h,
                      const RingLayout& L, int P, MPI_Comm comm,
                      std::vector<float>* out, std::vector<float>* lse) {
  const Sizes s(h);
  const std::size_t n = s.n, dv = s.dv, rows = L.rows();
  std::vector<float> all_out(s.B * s.H * n * dv), all_lse(s.B * s.H * n);
  for (int r = 0; r < P; ++r) {
    if (r != 0) {
      recv_vec(*out, r, comm);
      recv_vec(*lse, r, comm);
    }
    const auto rp = L.positions(r);
    for (std::size_t bh = 0; bh < s.B * s.H; ++bh) {
      for (std::size_t i = 0; i < rows; ++i) {
        if (rp[i] >= n) continue;
        std::copy_n(&(*out)[(bh * rows + i) * dv], dv,
                    &all_out[(bh * n + rp[i]) * dv]);
        all_lse[bh * n + rp[i]] = (*lse)[bh * rows + i];
      }
    }
  }
  std::vector<std::size_t> out_shape = {n, dv}, lse_shape = {n};
  if (h.four_d) {
    out_shape = {s.B, s.H, n, dv};
    lse_shape = {s.B, s.H, n};
  }
  std::vector<std::pair<std::string, std::string>> files;
  if (args.output)
    files.emplace_back(*args.output, encode_npy(all_out, out_shape));
  if (args.lse) files.emplace_back(*args.lse, encode_npy(all_lse, lse_shape));
  write_files_all_or_none(files);
}

// Every rank: the ring attention of the inputs that rank 0 read (`in`, null
// on the other ranks), with keys and values stored as KV.
template <class KV>
int ring_compute(const AttentionArgs& args, const AttentionInputs* in,
                 AttentionOptions options, MPI_Comm comm, int rank, int P) {
  AttentionTensors<KV> t;
  Header h;
  SharedOptions shared;
  std::string error;
  if (rank == 0) {
    try {
      h = assemble_on_rank0(*in, &t, &options, &shared);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  check(MPI_Bcast(&h, sizeof(Header), MPI_BYTE, 0, comm), "MPI_Bcast");
  if (!h.ok) {
    if (rank == 0) throw CliError(error);
    throw CliQuietError();
  }
  const Sizes s(h);
  const Layout kind = args.layout && *args.layout == "contiguous"
                          ? Layout::contiguous
                          : Layout::zigzag;
  const RingLayout L =
      softdot::mpi::ring_layout(s.n, P, kind, args.deterministic);
  const std::size_t rows = L.rows();
  share_options(h, s.n, &shared, comm);
  const LocalRows<KV> x = distribute_rows(t, s, L, rank, P, comm);
  LocalScores local;
  const softdot::mpi::RingOptions ro =
      ring_options(args, options, h, shared, L, rank, kind, &local);

  std::vector<float> out(s.B * s.H * rows * s.dv), lse(s.B * s.H * rows);
  run_local_ring(x, s, rows, ro, rank, comm, &out, &lse);
  // Gather: rank 0 puts each rank's rows at their positions.
  if (rank != 0) {
    send_vec(out, 0, comm);
    send_vec(lse, 0, comm);
    return 0;
  }
  gather_and_write(args, h, L, P, comm, &out, &lse);
  return 0;
}

}  // namespace

namespace {

int run_ring(const AttentionArgs& args, const AttentionOptions& options,
             const ReadInputs& read, int rank, int P) {
  // Rank 0 reads; the K/V storage it finds is told to every rank.
  AttentionInputs in;
  int kind = -1;  // a KvStorage; -1 error
  std::string error;
  if (rank == 0) {
    try {
      in = read();
      kind = static_cast<int>(kv_storage(in));
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  check(MPI_Bcast(&kind, 1, MPI_INT, 0, MPI_COMM_WORLD), "MPI_Bcast");
  if (kind < 0) {
    if (rank == 0) throw CliError(error);
    throw CliQuietError();
  }
  const AttentionInputs* ip = rank == 0 ? &in : nullptr;
  switch (static_cast<KvStorage>(kind)) {
    case KvStorage::kInt8:
      return ring_compute<std::int8_t>(args, ip, options, MPI_COMM_WORLD, rank,
                                       P);
    case KvStorage::kFloat16:
      return ring_compute<Float16>(args, ip, options, MPI_COMM_WORLD, rank, P);
    case KvStorage::kFloat8E4M3:
    case KvStorage::kFloat8E5M2:
      // The ring has no fp8 form (the library's rings take float32, 16-bit
      // or int8 shards).
      if (rank == 0) {
        throw CliError(
            "--ring takes float32, float16 or int8 keys and "
            "values; --kv float8_e4m3fn / float8_e5m2 is not "
            "available with --ring");
      }
      throw CliQuietError();
    case KvStorage::kFloat:
      break;
  }
  return ring_compute<float>(args, ip, options, MPI_COMM_WORLD, rank, P);
}

}  // namespace

int run_attention_ring(const AttentionArgs& args,
                       const AttentionOptions& options,
                       const ReadInputs& read) {
  const MpiSession session;
  int status = 0;
  try {
    status = run_ring(args, options, read, session.rank(), session.size());
  } catch (const CliQuietError&) {
    status = kExitError;
  } catch (const std::exception& e) {
    // Rank 0 reports (every rank sees the same error), before the barrier
    // below.
    print_ring_error(e.what());
    status = kExitError;
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (status != 0) throw CliQuietError();
  return status;
}

}  // namespace softdot::cli
