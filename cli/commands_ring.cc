// softdot command: `mpirun -np P softdot attention ... --ring`, attention of
// one sequence over P processes with softdot::mpi::ring_attention. Rank 0
// reads the inputs (as `softdot attention` does), sends each rank the rows
// of its positions (q, k, v, int8 scales; the mask and bias rows of its
// queries over every key), every rank runs the ring, and rank 0 gathers the
// output rows and writes -o (and --lse). Built only with softdot::mpi.
#include "commands_ring.h"

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "attention_inputs.h"
#include "commands.h"
#include "error.h"
#include "io_npy.h"
#include "output_file.h"
#include "softdot/mpi.h"

namespace softdot::cli {
namespace {

using softdot::mpi::Layout;
using softdot::mpi::RingLayout;

// MPI_Init on entry (unless the program already did), MPI_Finalize on exit.
class MpiSession {
 public:
  MpiSession() {
    int done = 0;
    MPI_Initialized(&done);
    if (!done) {
      int provided = 0;
      if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) !=
          MPI_SUCCESS) {
        throw CliError("--ring: MPI_Init_thread failed");
      }
      owner_ = true;
    }
  }
  ~MpiSession() {
    if (owner_) MPI_Finalize();
  }
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

 private:
  bool owner_ = false;
};

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

template <class KV>
int ring_compute(const AttentionArgs& args, const AttentionInputs* in,
                 AttentionOptions options, MPI_Comm comm, int rank, int P) {
  AttentionTensors<KV> t;
  Header h;
  std::string error;
  // The whole mask and bias, [mb, mh, n, n] (rank 0 fills them).
  std::vector<char> mask_all;
  std::vector<float> bias_all;
  // Options read from files reach rank 0 only: each goes to every rank
  // below (the ring compares every option across ranks and refuses a
  // difference).
  std::vector<float> alibi;
  if (rank == 0) {
    try {
      assemble_tensors(*in, &t, &options);
      if (in->q.rows() != in->k.rows()) {
        throw CliError(
            "--ring computes attention over one sequence: q and k need the "
            "same number of rows (n_q = n_kv) " +
            both(in->q, in->k));
      }
      h.B = static_cast<std::int64_t>(t.q.batch);
      h.H = static_cast<std::int64_t>(t.q.heads);
      h.Hkv = static_cast<std::int64_t>(t.k.heads);
      h.n = static_cast<std::int64_t>(t.q.rows);
      h.d = static_cast<std::int64_t>(t.q.cols);
      h.dv = static_cast<std::int64_t>(t.v.cols);
      h.four_d = in->q.rank() == 4;
      alibi.assign(options.alibi_slopes.begin(), options.alibi_slopes.end());
      h.alibi = static_cast<std::int64_t>(alibi.size());
      const std::size_t n = t.q.rows;
      if (!options.mask.empty()) {
        const auto& m = options.mask;
        h.mask_b = static_cast<std::int64_t>(m.batch);
        h.mask_h = static_cast<std::int64_t>(m.heads);
        TensorView<const bool> full = m;
        full.rows = n;
        for (std::size_t b = 0; b < m.batch; ++b)
          for (std::size_t hh = 0; hh < m.heads; ++hh)
            for (std::size_t i = 0; i < n; ++i) {
              const bool* r = full.row(b, hh, i);
              for (std::size_t j = 0; j < n; ++j)
                mask_all.push_back(r[j] ? 1 : 0);
            }
      }
      if (!options.bias.empty()) {
        const auto& bv = options.bias;
        h.bias_b = static_cast<std::int64_t>(bv.batch);
        h.bias_h = static_cast<std::int64_t>(bv.heads);
        for (std::size_t b = 0; b < bv.batch; ++b)
          for (std::size_t hh = 0; hh < bv.heads; ++hh)
            for (std::size_t i = 0; i < n; ++i)
              bias_all.insert(bias_all.end(), bv.row(b, hh, i),
                              bv.row(b, hh, i) + n);
      }
      h.ok = 1;
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  check(MPI_Bcast(&h, sizeof(Header), MPI_BYTE, 0, comm), "MPI_Bcast");
  if (!h.ok) {
    if (rank == 0) throw CliError(error);
    throw CliQuietError();
  }
  const auto B = static_cast<std::size_t>(h.B),
             H = static_cast<std::size_t>(h.H),
             Hkv = static_cast<std::size_t>(h.Hkv),
             n = static_cast<std::size_t>(h.n),
             d = static_cast<std::size_t>(h.d),
             dv = static_cast<std::size_t>(h.dv);
  const Layout kind = args.layout && *args.layout == "contiguous"
                          ? Layout::contiguous
                          : Layout::zigzag;
  const RingLayout L =
      softdot::mpi::ring_layout(n, P, kind, args.deterministic);
  const std::size_t rows = L.rows();
  constexpr bool kInt8 = std::is_same_v<KV, std::int8_t>;

  if (h.alibi) {
    alibi.resize(static_cast<std::size_t>(h.alibi));
    bcast_vec(alibi, comm);
  }
  // The mask and bias go to every rank whole; each takes its rows.
  if (h.mask_b) {
    mask_all.resize(static_cast<std::size_t>(h.mask_b * h.mask_h) * n * n);
    bcast_vec(mask_all, comm);
  }
  if (h.bias_b) {
    bias_all.resize(static_cast<std::size_t>(h.bias_b * h.bias_h) * n * n);
    bcast_vec(bias_all, comm);
  }

  // Rank 0 sends each rank its rows; its own it keeps.
  std::vector<float> q, ks, vs;
  std::vector<KV> k, v;
  for (int r = P - 1; r >= 0; --r) {
    if (rank != 0 && r != rank) continue;
    if (rank == 0) {
      const auto pos = L.positions(r);
      q = take_rows(t.q, pos, 0.0f);
      k = take_rows(t.k, pos, KV{});
      v = take_rows(t.v, pos, KV{});
      if constexpr (kInt8) {
        ks = take_rows(t.k_scales, pos, 0.0f);
        vs = take_rows(t.v_scales, pos, 0.0f);
      }
      if (r == 0) break;
      send_vec(q, r, comm);
      send_vec(k, r, comm);
      send_vec(v, r, comm);
      if constexpr (kInt8) {
        send_vec(ks, r, comm);
        send_vec(vs, r, comm);
      }
    } else {
      q.resize(B * H * rows * d);
      k.resize(B * Hkv * rows * d);
      v.resize(B * Hkv * rows * dv);
      recv_vec(q, 0, comm);
      recv_vec(k, 0, comm);
      recv_vec(v, 0, comm);
      if constexpr (kInt8) {
        ks.resize(B * Hkv * rows);
        vs.resize(B * Hkv * rows);
        recv_vec(ks, 0, comm);
        recv_vec(vs, 0, comm);
      }
    }
  }

  const auto pos = L.positions(rank);
  softdot::mpi::RingOptions ro;
  ro.attention = options;
  ro.attention.mask = {};
  ro.attention.bias = {};
  ro.attention.alibi_slopes = alibi;
  ro.seq_len = n;
  ro.layout = kind;
  ro.deterministic = args.deterministic;
  std::unique_ptr<bool[]> local_mask;
  std::vector<float> local_bias;
  if (h.mask_b) {
    const auto mb = static_cast<std::size_t>(h.mask_b),
               mh = static_cast<std::size_t>(h.mask_h);
    const std::vector<char> m = take_rows(
        TensorView<const char>(mask_all.data(), mb, mh, n, n), pos, char{1});
    local_mask.reset(new bool[m.size()]);
    for (std::size_t i = 0; i < m.size(); ++i) local_mask[i] = m[i] != 0;
    ro.attention.mask =
        TensorView<const bool>(local_mask.get(), mb, mh, rows, n);
  }
  if (h.bias_b) {
    const auto bb = static_cast<std::size_t>(h.bias_b),
               bh = static_cast<std::size_t>(h.bias_h);
    local_bias = take_rows(
        TensorView<const float>(bias_all.data(), bb, bh, n, n), pos, 0.0f);
    ro.attention.bias =
        TensorView<const float>(local_bias.data(), bb, bh, rows, n);
  }

  std::vector<float> out(B * H * rows * dv), lse(B * H * rows);
  const TensorView<const float> qv(q.data(), B, H, rows, d);
  const TensorView<const KV> kv(k.data(), B, Hkv, rows, d),
      vv(v.data(), B, Hkv, rows, dv);
  try {
    if constexpr (kInt8) {
      softdot::mpi::ring_attention(
          comm, qv,
          Int8KV{kv, TensorView<const float>(ks.data(), B, Hkv, rows, 1)},
          Int8KV{vv, TensorView<const float>(vs.data(), B, Hkv, rows, 1)},
          TensorView<float>(out.data(), B, H, rows, dv), ro, lse.data());
    } else {
      softdot::mpi::ring_attention(
          comm, qv, kv, vv, TensorView<float>(out.data(), B, H, rows, dv), ro,
          lse.data());
    }
  } catch (const std::exception& e) {
    // Every rank throws the same error: rank 0 reports it.
    if (rank == 0) throw CliError(e.what());
    throw CliQuietError();
  }

  // Gather: rank 0 puts each rank's rows at their positions.
  if (rank != 0) {
    send_vec(out, 0, comm);
    send_vec(lse, 0, comm);
    return 0;
  }
  std::vector<float> all_out(B * H * n * dv), all_lse(B * H * n);
  for (int r = 0; r < P; ++r) {
    if (r != 0) {
      recv_vec(out, r, comm);
      recv_vec(lse, r, comm);
    }
    const auto rp = L.positions(r);
    for (std::size_t bh = 0; bh < B * H; ++bh) {
      for (std::size_t i = 0; i < rows; ++i) {
        if (rp[i] >= n) continue;
        std::copy_n(&out[(bh * rows + i) * dv], dv,
                    &all_out[(bh * n + rp[i]) * dv]);
        all_lse[bh * n + rp[i]] = lse[bh * rows + i];
      }
    }
  }
  std::vector<std::pair<std::string, std::string>> files;
  if (h.four_d) {
    const std::size_t out_shape[] = {B, H, n, dv};
    const std::size_t lse_shape[] = {B, H, n};
    if (args.output)
      files.emplace_back(*args.output, encode_npy(all_out, out_shape));
    if (args.lse) files.emplace_back(*args.lse, encode_npy(all_lse, lse_shape));
  } else {
    const std::size_t out_shape[] = {n, dv};
    const std::size_t lse_shape[] = {n};
    if (args.output)
      files.emplace_back(*args.output, encode_npy(all_out, out_shape));
    if (args.lse) files.emplace_back(*args.lse, encode_npy(all_lse, lse_shape));
  }
  write_files_all_or_none(files);
  return 0;
}

}  // namespace

namespace {

int run_ring(const AttentionArgs& args, const AttentionOptions& options,
             const ReadInputs& read, int rank, int P) {
  // Rank 0 reads; the K/V storage it finds is told to every rank.
  AttentionInputs in;
  int kind = -1;  // 0 float, 1 float16, 2 int8; -1 error
  std::string error;
  if (rank == 0) {
    try {
      in = read();
      if (in.k.is_int8() || in.quantize) {
        kind = 2;
      } else if (in.k.array.dtype == NpyDtype::kFloat16 &&
                 in.v.array.dtype == NpyDtype::kFloat16) {
        kind = 1;
      } else {
        kind = 0;
      }
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
  if (kind == 2)
    return ring_compute<std::int8_t>(args, ip, options, MPI_COMM_WORLD, rank,
                                     P);
  if (kind == 1)
    return ring_compute<Float16>(args, ip, options, MPI_COMM_WORLD, rank, P);
  return ring_compute<float>(args, ip, options, MPI_COMM_WORLD, rank, P);
}

}  // namespace

int run_attention_ring(const AttentionArgs& args,
                       const AttentionOptions& options,
                       const ReadInputs& read) {
  MpiSession session;
  int rank = 0, P = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  int status = 0;
  try {
    status = run_ring(args, options, read, rank, P);
  } catch (const CliQuietError&) {
    status = kExitError;
  } catch (const std::exception& e) {
    // Rank 0 reports (every rank sees the same error); it prints before
    // the barrier below, so that mpirun, which stops the job when the
    // first rank exits with an error, cannot stop it before the message.
    std::string line = std::string("softdot: error: ") + e.what();
    for (char& c : line)
      if (c == '\n' || c == '\r') c = ' ';
    std::fflush(stdout);
    std::fprintf(stderr, "%s\n", line.c_str());
    std::fflush(stderr);
    status = kExitError;
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (status != 0) throw CliQuietError();
  return status;
}

}  // namespace softdot::cli
