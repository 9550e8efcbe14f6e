// The ring core (ring_core.h): the checks and the visibility rule that
// ring_attention and ring_attention_backward share.
#include "mpi/ring_core.h"

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "attention_checks.h"
#include "mpi/comm.h"

namespace softdot::mpi::detail {

std::string check_ring_defaults(const std::string& fn,
                                const AttentionOptions& o) {
  if (o.kv_begin != 0 || o.kv_end != std::numeric_limits<std::size_t>::max() ||
      o.q_position != AttentionOptions::kAutoPosition || o.kv_position != 0 ||
      o.prefill_form || o.batch_invariant) {
    return fn +
           ": options.attention.kv_begin, kv_end, q_position, "
           "kv_position, prefill_form and batch_invariant must keep their "
           "defaults";
  }
  return "";
}

std::vector<SameField> ring_fields(const TensorView<const float>& q,
                                   std::size_t k_heads, std::size_t d_v,
                                   const RingOptions& ro) {
  auto i64 = [](auto x) { return static_cast<std::int64_t>(x); };
  std::vector<SameField> f = {
      {"q.batch", i64(q.batch)},
      {"q.heads", i64(q.heads)},
      {"k.heads", i64(k_heads)},
      {"q.cols", i64(q.cols)},
      {"v.cols", i64(d_v)},
      {"rows", i64(q.rows)},
      {"seq_len", i64(ro.seq_len)},
      {"layout", i64(ro.layout)},
      {"deterministic", i64(ro.deterministic)},
  };
  for (const OptionField& o : option_fingerprint(ro.attention))
    f.push_back({std::string("options.attention.") + o.name, o.value});
  return f;
}

std::string check_same(MPI_Comm comm, const char* fn,
                       const std::vector<SameField>& fields) {
  // One reduction: the minimum of x and of ~x (~ the maximum; unlike -x,
  // ~x never overflows, and the hashes span every int64).
  const std::size_t n = fields.size();
  std::vector<long long> both(2 * n), agg(2 * n);
  for (std::size_t i = 0; i < n; ++i) {
    const auto v = static_cast<long long>(fields[i].value);
    both[i] = v;
    both[n + i] = ~v;
  }
  check_mpi(MPI_Allreduce(both.data(), agg.data(), static_cast<int>(2 * n),
                          MPI_LONG_LONG, MPI_MIN, comm),
            "MPI_Allreduce");
  for (std::size_t i = 0; i < n; ++i) {
    if (agg[i] != ~agg[n + i]) {
      return std::string(fn) + ": " + fields[i].name +
             " differs between ranks (every rank must pass the same shapes "
             "and options)";
    }
  }
  return "";
}

bool hidden(const AttentionOptions& o, std::size_t q0, std::size_t q1,
            std::size_t k0, std::size_t k1) {
  std::ptrdiff_t wr = o.window_right, wl = o.window_left;
  if (o.causal) wr = 0;
  const auto sq0 = static_cast<long long>(q0), sq1 = static_cast<long long>(q1);
  const auto sk0 = static_cast<long long>(k0), sk1 = static_cast<long long>(k1);
  if (wr >= 0 && sk0 > sq1 + wr) return true;
  if (wl >= 0 && sk1 < sq0 - wl) return true;
  return false;
}

}  // namespace softdot::mpi::detail
