// Vocabulary-parallel softmax, log_softmax, logsumexp and cross_entropy
// (include/softdot/mpi_vocab.h) under mpirun: against the one-process
// functions (within their bounds; bitwise where the header says so), the
// deterministic mode bitwise the same for every rank count and split,
// special values over ranks, and bad arguments on one rank.
#include <mpi.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "mpi_test_util.h"
#include "softdot/mpi.h"
#include "softdot/softdot.h"

namespace {

using softdot::CrossEntropyOptions;
using softdot::MatrixView;
using softdot::Reduction;
using softdot::mpi::VocabOptions;
using softdot_test::world_rank;
using softdot_test::world_size;

template <class T>
constexpr T kInf = std::numeric_limits<T>::infinity();

// Column split of V over q ranks: uneven cut points; with q >= 3 the piece
// 1 is empty. Rank r of the communicator holds piece (r + 1) % q, so the
// vocabulary order is not the rank order.
struct Split {
  std::vector<std::size_t> cut;  // q + 1 cut points
  std::size_t piece_of(int r, int q) const {
    return static_cast<std::size_t>((r + 1) % q);
  }
};

Split make_split(std::size_t V, int q) {
  Split s;
  s.cut.push_back(0);
  for (int k = 1; k < q; ++k) {
    std::size_t c =
        V * static_cast<std::size_t>(k * k) / static_cast<std::size_t>(q * q);
    if (q >= 3 && k == 2) c = s.cut.back();  // piece 1 empty
    s.cut.push_back(std::max(c, s.cut.back()));
  }
  s.cut.push_back(V);
  return s;
}

template <class T>
std::vector<T> make_matrix(std::size_t rows, std::size_t V, double spread,
                           std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-spread / 2, spread / 2);
  std::vector<T> x(rows * V);
  for (auto& v : x) v = static_cast<T>(u(rng));
  return x;
}

template <class T>
double ulp_of(T v) {
  const T a = std::fabs(v);
  if (!std::isfinite(a)) return 0.0;
  return static_cast<double>(std::nextafter(a, kInf<T>) - a);
}

template <class T>
bool close(T got, T want, double ulps, double abs) {
  if (std::isnan(want)) return std::isnan(got);
  if (std::isinf(want)) return got == want;
  return std::fabs(static_cast<double>(got) - static_cast<double>(want)) <=
         ulps * ulp_of(want) + abs;
}

template <class T>
bool same_bits(T a, T b) {
  if constexpr (sizeof(T) == 4) {
    return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b);
  } else {
    return std::bit_cast<std::uint64_t>(a) == std::bit_cast<std::uint64_t>(b);
  }
}

// Every rank's outputs of the four functions on its columns.
template <class T>
struct Outputs {
  std::vector<T> softmax, log_softmax, lse, loss, grad;
  double total = 0;
};

template <class T>
Outputs<T> run_all(MPI_Comm comm, const std::vector<T>& full, std::size_t rows,
                   std::size_t V, std::size_t b, std::size_t e,
                   const std::vector<std::int64_t>& targets,
                   const CrossEntropyOptions& xo, bool det) {
  const std::size_t n = e - b;
  // The shard, in a strided buffer of its own (stride n + 2).
  const std::size_t stride = n + 2;
  std::vector<T> shard(rows * stride, T(99));
  for (std::size_t i = 0; i < rows; ++i) {
    for (std::size_t j = 0; j < n; ++j) {
      shard[i * stride + j] = full[i * V + b + j];
    }
  }
  const std::vector<T> before = shard;
  const MatrixView<const T> x(shard.data(), rows, n, stride);
  VocabOptions vo;
  vo.deterministic = det;
  Outputs<T> o;
  o.softmax.assign(rows * (n + 1), T(-7));
  o.log_softmax.assign(rows * (n + 1), T(-7));
  o.lse.assign(rows, T(-7));
  o.loss.assign(rows, T(-7));
  o.grad.assign(rows * (n + 1), T(-7));
  softdot::mpi::softmax(comm, x, b,
                        MatrixView<T>(o.softmax.data(), rows, n, n + 1), vo);
  softdot::mpi::log_softmax(
      comm, x, b, MatrixView<T>(o.log_softmax.data(), rows, n, n + 1), vo);
  softdot::mpi::logsumexp(comm, x, b, std::span<T>(o.lse), vo);
  o.total = softdot::mpi::cross_entropy(
      comm, x, b, targets, o.loss, MatrixView<T>(o.grad.data(), rows, n, n + 1),
      xo, vo);
  bool unchanged = true;
  for (std::size_t k = 0; k < shard.size(); ++k) {
    unchanged = unchanged && same_bits(shard[k], before[k]);
  }
  MPI_EXPECT_MSG(unchanged, "the caller's logits were modified");
  for (std::size_t i = 0; i < rows; ++i) {
    MPI_EXPECT_MSG(
        o.softmax[i * (n + 1) + n] == T(-7) && o.grad[i * (n + 1) + n] == T(-7),
        "wrote past a row");
  }
  return o;
}

template <class T>
void against_one_process(bool det) {
  const int P = world_size(), r = world_rank();
  const std::size_t rows = 6, V = 1003;
  const std::vector<T> full = make_matrix<T>(rows, V, 30.0, 11);
  std::vector<std::int64_t> targets = {5, -100, 1002, 0, 517, 300};
  CrossEntropyOptions xo;
  xo.label_smoothing = 0.1;
  const Split s = make_split(V, P);
  const std::size_t piece = s.piece_of(r, P);
  const std::size_t b = s.cut[piece], e = s.cut[piece + 1], n = e - b;
  const Outputs<T> o =
      run_all<T>(MPI_COMM_WORLD, full, rows, V, b, e, targets, xo, det);

  // One process, whole rows.
  std::vector<T> sm(rows * V), lsm(rows * V), loss(rows), grad(rows * V);
  const MatrixView<const T> xv(full.data(), rows, V);
  softdot::softmax_rows(xv, MatrixView<T>(sm.data(), rows, V));
  softdot::log_softmax_rows(xv, MatrixView<T>(lsm.data(), rows, V));
  const double total = softdot::cross_entropy(
      xv, targets, loss, MatrixView<T>(grad.data(), rows, V), xo);
  const double lse_abs = sizeof(T) == 4 ? 0x1p-30 : 0x1p-48;
  for (std::size_t i = 0; i < rows; ++i) {
    const std::span<const T> row(full.data() + i * V, V);
    const T lse1 = softdot::logsumexp(row);
    MPI_EXPECT_MSG(close<T>(o.lse[i], lse1, 2, lse_abs),
                   "lse row " + std::to_string(i));
    MPI_EXPECT_MSG(close<T>(o.loss[i], loss[i], 2, lse_abs),
                   "loss row " + std::to_string(i));
    // Default mode: bitwise the one-process online chain, shards merged in
    // vocabulary order.
    if (!det) {
      softdot::BasicSoftmaxState<T> st{};
      for (int k = 0; k < P; ++k) {
        const std::span<const T> part(full.data() + i * V + s.cut[k],
                                      s.cut[k + 1] - s.cut[k]);
        st = k == 0 ? softdot::softmax_state(part)
                    : softdot::merge(st, softdot::softmax_state(part));
      }
      std::vector<T> want(n);
      softdot::softmax_apply(std::span<const T>(full.data() + i * V + b, n), st,
                             std::span<T>(want));
      for (std::size_t j = 0; j < n; ++j) {
        MPI_EXPECT_MSG(same_bits(o.softmax[i * (n + 1) + j], want[j]),
                       "softmax not the online chain's bits, row " +
                           std::to_string(i) + " col " + std::to_string(b + j));
      }
      MPI_EXPECT_MSG(same_bits(o.lse[i], softdot::logsumexp(st)),
                     "lse not logsumexp(merged state)");
    }
    for (std::size_t j = 0; j < n; ++j) {
      const std::size_t k = i * V + b + j, m = i * (n + 1) + j;
      MPI_EXPECT_MSG(
          close<T>(o.softmax[m], sm[k], 2, 0x1p-1000),
          "softmax row " + std::to_string(i) + " col " + std::to_string(b + j));
      MPI_EXPECT_MSG(close<T>(o.log_softmax[m], lsm[k], 2, lse_abs),
                     "log_softmax row " + std::to_string(i));
      MPI_EXPECT_MSG(
          close<T>(o.grad[m], grad[k], 3, 0x1p-1000),
          "grad row " + std::to_string(i) + " col " + std::to_string(b + j));
    }
  }
  MPI_EXPECT_MSG(std::fabs(o.total - total) <= 1e-6 * std::fabs(total),
                 "cross_entropy total " + std::to_string(o.total) + " vs " +
                     std::to_string(total));
}

// Deterministic mode: the same bits with q = 1 .. P ranks (sub-communicators
// of the first q ranks, each with its own uneven split) as on MPI_COMM_SELF
// with the whole rows.
template <class T>
void deterministic_for_every_p() {
  const int P = world_size(), r = world_rank();
  const std::size_t rows = 4, V = 777;
  std::vector<T> full = make_matrix<T>(rows, V, 40.0, 5);
  full[2 * V + 400] = -kInf<T>;  // a -inf logit (smoothing mean -inf)
  const std::vector<std::int64_t> targets = {3, 776, -100, 400};
  CrossEntropyOptions xo;
  xo.label_smoothing = 0.05;
  xo.reduction = Reduction::kSum;
  const Outputs<T> ref =
      run_all<T>(MPI_COMM_SELF, full, rows, V, 0, V, targets, xo, true);
  for (int q = 1; q <= P; ++q) {
    MPI_Comm sub;
    MPI_Comm_split(MPI_COMM_WORLD, r < q ? 0 : MPI_UNDEFINED, r, &sub);
    if (sub == MPI_COMM_NULL) continue;
    const Split s = make_split(V, q);
    const std::size_t piece = s.piece_of(r, q);
    const std::size_t b = s.cut[piece], e = s.cut[piece + 1], n = e - b;
    const Outputs<T> o =
        run_all<T>(sub, full, rows, V, b, e, targets, xo, true);
    MPI_Comm_free(&sub);
    const std::string tag = " (q = " + std::to_string(q) + ")";
    for (std::size_t i = 0; i < rows; ++i) {
      MPI_EXPECT_MSG(same_bits(o.lse[i], ref.lse[i]), "lse bits" + tag);
      MPI_EXPECT_MSG(same_bits(o.loss[i], ref.loss[i]), "loss bits" + tag);
      for (std::size_t j = 0; j < n; ++j) {
        const std::size_t m = i * (n + 1) + j, k = i * (V + 1) + b + j;
        MPI_EXPECT_MSG(same_bits(o.softmax[m], ref.softmax[k]),
                       "softmax bits" + tag);
        MPI_EXPECT_MSG(same_bits(o.log_softmax[m], ref.log_softmax[k]),
                       "log_softmax bits" + tag);
        MPI_EXPECT_MSG(same_bits(o.grad[m], ref.grad[k]), "grad bits" + tag);
      }
    }
    MPI_EXPECT_MSG(same_bits(o.total, ref.total), "total bits" + tag);
  }
}

// Special values over ranks: row 0 -inf everywhere; row 1 -inf on the
// whole of one shard; row 2 a NaN in the last piece; row 3 two +inf logits
// in different pieces, the target one of them.
template <class T>
void special_values(bool det) {
  const int P = world_size(), r = world_rank();
  const std::size_t rows = 4, V = 50;
  std::vector<T> full = make_matrix<T>(rows, V, 10.0, 3);
  const Split s = make_split(V, P);
  for (std::size_t j = 0; j < V; ++j) full[j] = -kInf<T>;
  for (std::size_t j = s.cut[0]; j < s.cut[1]; ++j) full[V + j] = -kInf<T>;
  full[2 * V + V - 1] = std::numeric_limits<T>::quiet_NaN();
  full[3 * V + 0] = kInf<T>;
  full[3 * V + V - 1] = kInf<T>;
  const std::vector<std::int64_t> targets = {1, 45, 2, 49};
  CrossEntropyOptions xo;
  xo.reduction = Reduction::kNone;
  const std::size_t piece = s.piece_of(r, P);
  const std::size_t b = s.cut[piece], e = s.cut[piece + 1], n = e - b;
  const Outputs<T> o =
      run_all<T>(MPI_COMM_WORLD, full, rows, V, b, e, targets, xo, det);
  // Row 0: zeros, -inf, lse -inf, loss +inf.
  MPI_EXPECT(o.lse[0] == -kInf<T>);
  MPI_EXPECT(o.loss[0] == kInf<T>);
  // Row 1: as the one-process row without the masked shard.
  const T lse1 = softdot::logsumexp(std::span<const T>(full.data() + V, V));
  MPI_EXPECT(close<T>(o.lse[1], lse1, 2, 0.0));
  // Row 2: NaN everywhere, on every rank.
  MPI_EXPECT(std::isnan(o.lse[2]) && std::isnan(o.loss[2]));
  // Row 3: weight 1/2 at the two +inf, loss log 2.
  MPI_EXPECT(o.lse[3] == kInf<T>);
  MPI_EXPECT(o.loss[3] == static_cast<T>(std::log(2.0L)));
  for (std::size_t j = 0; j < n; ++j) {
    const std::size_t c = b + j;
    MPI_EXPECT(o.softmax[j] == T(0) && o.log_softmax[j] == -kInf<T>);
    if (c < s.cut[1]) {
      MPI_EXPECT(o.softmax[(n + 1) + j] == T(0));
    }
    MPI_EXPECT(std::isnan(o.softmax[2 * (n + 1) + j]) &&
               std::isnan(o.log_softmax[2 * (n + 1) + j]) &&
               std::isnan(o.grad[2 * (n + 1) + j]));
    const bool inf_col = c == 0 || c == V - 1;
    MPI_EXPECT(o.softmax[3 * (n + 1) + j] == (inf_col ? T(0.5) : T(0)));
    MPI_EXPECT(o.log_softmax[3 * (n + 1) + j] ==
               (inf_col ? static_cast<T>(-std::log(2.0L)) : -kInf<T>));
    MPI_EXPECT(o.grad[3 * (n + 1) + j] == (c == V - 1 ? T(-0.5)
                                           : inf_col  ? T(0.5)
                                                      : T(0)));
  }
}

// One rank's bad arguments make every rank throw, naming that rank; the
// next call works.
template <class T>
void bad_arguments() {
  const int P = world_size(), r = world_rank();
  const std::size_t rows = 3, V = 40;
  const std::vector<T> full = make_matrix<T>(rows, V, 10.0, 9);
  const Split s = make_split(V, P);
  const std::size_t piece = s.piece_of(r, P);
  const std::size_t b = s.cut[piece], n = s.cut[piece + 1] - b;
  std::vector<T> shard(rows * n + 1);
  for (std::size_t i = 0; i < rows; ++i) {
    for (std::size_t j = 0; j < n; ++j) shard[i * n + j] = full[i * V + b + j];
  }
  const MatrixView<const T> x(shard.data(), rows, n);
  std::vector<T> y(rows * (n + 1), T(5));
  const int bad = P - 1;
  const auto expect_throw = [&](const char* what, const std::string& needle,
                                auto&& call) {
    bool threw = false;
    try {
      call();
    } catch (const std::invalid_argument& e) {
      threw = true;
      MPI_EXPECT_MSG(std::string(e.what()).find(needle) != std::string::npos,
                     std::string(what) + ": message '" + e.what() +
                         "' lacks '" + needle + "'");
    }
    MPI_EXPECT_MSG(threw, std::string(what) + ": no exception");
    for (const T v : y)
      MPI_EXPECT_MSG(v == T(5), std::string(what) + ": wrote y");
  };
  // y of the wrong width on one rank.
  expect_throw("shape",
               "rank " + std::to_string(bad) + ": softdot::mpi::softmax", [&] {
                 softdot::mpi::softmax(
                     MPI_COMM_WORLD, x, b,
                     MatrixView<T>(y.data(), rows, r == bad ? n + 1 : n));
               });
  // vocab_begin off by one on one rank (the ranges no longer tile).
  expect_throw("tiling", "vocab_begin", [&] {
    softdot::mpi::logsumexp(MPI_COMM_WORLD, x, r == bad ? b + 1 : b,
                            std::span<T>(y.data(), rows));
  });
  // Targets differing on one rank (only meaningful with P > 1).
  if (P > 1) {
    std::vector<std::int64_t> t = {1, 2, r == bad ? 4 : 3};
    expect_throw("targets", "differ", [&] {
      softdot::mpi::cross_entropy(MPI_COMM_WORLD, x, b, t, std::span<T>());
    });
  }
  // A target out of range (the same on every rank).
  std::vector<std::int64_t> t = {1, 40, 3};
  expect_throw("range", "targets[1] = 40", [&] {
    softdot::mpi::cross_entropy(MPI_COMM_WORLD, x, b, t, std::span<T>());
  });
  // A negative target: named with the vocabulary's global size.
  std::vector<std::int64_t> tn = {1, 2, -5};
  expect_throw("negative", "targets[2] = -5 is not a class in [0, 40)", [&] {
    softdot::mpi::cross_entropy(MPI_COMM_WORLD, x, b, tn, std::span<T>());
  });
  // Deterministic on one rank only: caught, not a hang.
  VocabOptions det;
  det.deterministic = r == bad;
  if (P > 1) {
    expect_throw("mixed modes", "differ", [&] {
      softdot::mpi::softmax(MPI_COMM_WORLD, x, b,
                            MatrixView<T>(y.data(), rows, n, n + 1), det);
    });
  }
  // Afterwards a good call works on every rank.
  std::vector<T> lse(rows);
  softdot::mpi::logsumexp(MPI_COMM_WORLD, x, b, std::span<T>(lse));
  for (std::size_t i = 0; i < rows; ++i) {
    const T want =
        softdot::logsumexp(std::span<const T>(full.data() + i * V, V));
    MPI_EXPECT(close<T>(lse[i], want, 2, 0.0));
  }
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  const int rc = softdot_test::run_cases({
      {"against_one_process float", [] { against_one_process<float>(false); }},
      {"against_one_process double",
       [] { against_one_process<double>(false); }},
      {"against_one_process float det",
       [] { against_one_process<float>(true); }},
      {"against_one_process double det",
       [] { against_one_process<double>(true); }},
      {"deterministic_for_every_p float",
       [] { deterministic_for_every_p<float>(); }},
      {"deterministic_for_every_p double",
       [] { deterministic_for_every_p<double>(); }},
      {"special_values float", [] { special_values<float>(false); }},
      {"special_values double det", [] { special_values<double>(true); }},
      {"bad_arguments float", [] { bad_arguments<float>(); }},
      {"bad_arguments double", [] { bad_arguments<double>(); }},
  });
  MPI_Finalize();
  return rc;
}
