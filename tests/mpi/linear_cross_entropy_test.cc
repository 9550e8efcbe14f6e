// Vocabulary-parallel fused linear + cross-entropy
// (softdot::mpi::linear_cross_entropy, include/softdot/mpi_vocab.h) under
// mpirun: on one rank bitwise the one-process softdot::linear_cross_entropy;
// over P ranks with uneven splits (an empty shard, ranks not in vocabulary
// order) within the one-process call's bounds of a long double reference;
// deterministic mode bitwise the same loss and grad_weight for every rank
// count and split; special values across ranks; bad arguments on one rank.
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

using softdot::BFloat16;
using softdot::CrossEntropyOptions;
using softdot::MatrixView;
using softdot::Reduction;
using softdot::mpi::VocabOptions;
using softdot_test::world_rank;
using softdot_test::world_size;
using L = long double;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Cut points of V over q ranks: uneven, piece 1 empty when q >= 3; rank r
// holds piece (r + 1) % q, so the vocabulary order is not the rank order.
std::vector<std::size_t> make_cuts(std::size_t V, int q) {
  std::vector<std::size_t> cut{0};
  for (int k = 1; k < q; ++k) {
    std::size_t c =
        V * static_cast<std::size_t>(k * k) / static_cast<std::size_t>(q * q);
    if (q >= 3 && k == 2) c = cut.back();
    cut.push_back(std::max(c, cut.back()));
  }
  cut.push_back(V);
  return cut;
}
std::size_t piece_of(int r, int q) {
  return static_cast<std::size_t>((r + 1) % q);
}

std::vector<float> random_matrix(std::size_t n, double spread,
                                 std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-spread, spread);
  std::vector<float> x(n);
  for (float& v : x) v = static_cast<float>(u(rng));
  return x;
}

bool same_bits(float a, float b) {
  return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b);
}
bool same_bits(double a, double b) {
  return std::bit_cast<std::uint64_t>(a) == std::bit_cast<std::uint64_t>(b);
}

// The inputs, whole (every rank builds the same from fixed seeds).
struct Problem {
  std::size_t N, D, V;
  std::vector<float> hidden, weight;  // N x D, V x D
  std::vector<std::int64_t> targets;
  CrossEntropyOptions options;
};

Problem make_problem(std::size_t N, std::size_t D, std::size_t V,
                     std::uint64_t seed) {
  Problem p{
      N,
      D,
      V,
      random_matrix(N * D, 1.0, seed),
      random_matrix(V * D, 3.0 / std::sqrt(static_cast<double>(D)), seed + 1),
      {},
      {}};
  std::mt19937_64 rng(seed + 2);
  for (std::size_t i = 0; i < N; ++i) {
    p.targets.push_back(i % 7 == 3 ? -100
                                   : static_cast<std::int64_t>(rng() % V));
  }
  p.options.label_smoothing = 0.1;
  return p;
}

// One call's results on this rank: its rows of grad_weight.
struct Result {
  std::vector<float> loss, grad_hidden, grad_weight;
  double total = 0;
};

// Runs the vocabulary-parallel call on `comm` with this rank's rows
// [b, e) of the weight (in a strided buffer of its own), in T (float or
// BFloat16: the inputs rounded to bfloat16 first).
template <class T>
Result run_mpi(MPI_Comm comm, const Problem& p, std::size_t b, std::size_t e,
               bool det, bool grads = true) {
  const std::size_t n = e - b, D = p.D, ws = D + 3;
  std::vector<T> h(p.N * D), w(std::max<std::size_t>(n, 1) * ws);
  const auto conv = [](float v) {
    if constexpr (sizeof(T) == 2) {
      return softdot::to_bfloat16(v);
    } else {
      return v;
    }
  };
  for (std::size_t i = 0; i < p.N * D; ++i) h[i] = conv(p.hidden[i]);
  for (std::size_t j = 0; j < n; ++j) {
    for (std::size_t k = 0; k < D; ++k) {
      w[j * ws + k] = conv(p.weight[(b + j) * D + k]);
    }
  }
  Result r;
  r.loss.assign(p.N, -7.0f);
  r.grad_hidden.assign(p.N * D, -7.0f);
  r.grad_weight.assign(n * D, -7.0f);
  VocabOptions vo;
  vo.deterministic = det;
  CrossEntropyOptions o = p.options;
  o.reduction = Reduction::kNone;
  std::vector<float> none(p.N);
  softdot::mpi::linear_cross_entropy(comm,
                                     MatrixView<const T>(h.data(), p.N, D),
                                     MatrixView<const T>(w.data(), n, D, ws), b,
                                     p.targets, none, {}, {}, o, vo);
  r.total = softdot::mpi::linear_cross_entropy(
      comm, MatrixView<const T>(h.data(), p.N, D),
      MatrixView<const T>(w.data(), n, D, ws), b, p.targets, r.loss,
      grads ? MatrixView<float>(r.grad_hidden.data(), p.N, D)
            : MatrixView<float>{},
      grads ? MatrixView<float>(r.grad_weight.data(), n, D)
            : MatrixView<float>{},
      p.options, vo);
  // reduction = none gives the same row losses.
  for (std::size_t i = 0; i < p.N; ++i) {
    MPI_EXPECT_MSG(same_bits(none[i], r.loss[i]),
                   "row loss " + std::to_string(i) + " differs with kNone");
  }
  return r;
}

// The one-process call on the whole problem.
template <class T>
Result run_one(const Problem& p) {
  std::vector<T> h(p.N * p.D), w(p.V * p.D);
  for (std::size_t i = 0; i < h.size(); ++i) {
    if constexpr (sizeof(T) == 2) {
      h[i] = softdot::to_bfloat16(p.hidden[i]);
    } else {
      h[i] = p.hidden[i];
    }
  }
  for (std::size_t i = 0; i < w.size(); ++i) {
    if constexpr (sizeof(T) == 2) {
      w[i] = softdot::to_bfloat16(p.weight[i]);
    } else {
      w[i] = p.weight[i];
    }
  }
  Result r;
  r.loss.assign(p.N, 0.0f);
  r.grad_hidden.assign(p.N * p.D, 0.0f);
  r.grad_weight.assign(p.V * p.D, 0.0f);
  r.total = softdot::linear_cross_entropy(
      MatrixView<const T>(h.data(), p.N, p.D),
      MatrixView<const T>(w.data(), p.V, p.D), p.targets, r.loss,
      MatrixView<float>(r.grad_hidden.data(), p.N, p.D),
      MatrixView<float>(r.grad_weight.data(), p.V, p.D), p.options);
  return r;
}

// The exact gradient of x = H W^T in long double (float inputs), and for
// each gradient element the scale sum |G| |operand| that bounds its error.
struct Reference {
  std::vector<L> gh, gw, gh_scale, gw_scale;
};

Reference reference(const Problem& p) {
  const std::size_t N = p.N, D = p.D, V = p.V;
  const double eps = p.options.label_smoothing;
  std::size_t counted = 0;
  for (const std::int64_t t : p.targets) counted += t != -100;
  const L c = 1.0L / static_cast<L>(counted);
  std::vector<L> g(N * V, 0.0L), x(V);
  for (std::size_t i = 0; i < N; ++i) {
    if (p.targets[i] == -100) continue;
    L m = -INFINITY;
    for (std::size_t j = 0; j < V; ++j) {
      L s = 0;
      for (std::size_t k = 0; k < D; ++k) {
        s += static_cast<L>(p.hidden[i * D + k]) * p.weight[j * D + k];
      }
      x[j] = s;
      m = std::max(m, s);
    }
    L sum = 0;
    for (std::size_t j = 0; j < V; ++j) sum += std::exp(x[j] - m);
    for (std::size_t j = 0; j < V; ++j) {
      const L onehot = static_cast<std::int64_t>(j) == p.targets[i] ? 1 : 0;
      g[i * V + j] = c * (std::exp(x[j] - m) / sum - (1 - eps) * onehot -
                          eps / static_cast<L>(V));
    }
  }
  Reference r;
  r.gh.assign(N * D, 0);
  r.gh_scale.assign(N * D, 0);
  r.gw.assign(V * D, 0);
  r.gw_scale.assign(V * D, 0);
  for (std::size_t i = 0; i < N; ++i) {
    for (std::size_t j = 0; j < V; ++j) {
      const L gij = g[i * V + j];
      for (std::size_t k = 0; k < D; ++k) {
        r.gh[i * D + k] += gij * p.weight[j * D + k];
        r.gh_scale[i * D + k] += std::fabs(gij * p.weight[j * D + k]);
        r.gw[j * D + k] += gij * p.hidden[i * D + k];
        r.gw_scale[j * D + k] += std::fabs(gij * p.hidden[i * D + k]);
      }
    }
  }
  return r;
}

// |got - want| <= 2^-16 scale: the logits' float rounding (relative 2^-24
// of |x| up to ~10 here, through exp) and the products' float chains.
bool within(float got, L want, L scale) {
  return std::fabs(static_cast<L>(got) - want) <= 0x1p-16L * scale + 1e-30L;
}

// On one rank: bitwise the one-process call (float and bfloat16).
template <class T>
void one_rank_bitwise() {
  // V = 40000: blocks of 104 rows, so N = 150 is two blocks.
  const Problem p = make_problem(150, 12, 40000, 11);
  const Result one = run_one<T>(p);
  for (const bool det : {false}) {
    const Result r = run_mpi<T>(MPI_COMM_SELF, p, 0, p.V, det);
    MPI_EXPECT(same_bits(r.total, one.total));
    for (std::size_t i = 0; i < p.N; ++i) {
      MPI_EXPECT_MSG(same_bits(r.loss[i], one.loss[i]),
                     "loss row " + std::to_string(i));
    }
    std::size_t bad_h = 0, bad_w = 0;
    for (std::size_t i = 0; i < r.grad_hidden.size(); ++i) {
      bad_h += !same_bits(r.grad_hidden[i], one.grad_hidden[i]);
    }
    for (std::size_t i = 0; i < r.grad_weight.size(); ++i) {
      bad_w += !same_bits(r.grad_weight[i], one.grad_weight[i]);
    }
    MPI_EXPECT_MSG(bad_h == 0, std::to_string(bad_h) + " grad_hidden differ");
    MPI_EXPECT_MSG(bad_w == 0, std::to_string(bad_w) + " grad_weight differ");
  }
}

// Over all P ranks with an uneven split: within the bounds of the long
// double reference (as the one-process call is) and close to it.
void against_reference(bool det) {
  const int P = world_size(), r = world_rank();
  const Problem p = make_problem(70, 40, 300, 21);
  const std::vector<std::size_t> cut = make_cuts(p.V, P);
  const std::size_t piece = piece_of(r, P);
  const std::size_t b = cut[piece], e = cut[piece + 1];
  const Result got = run_mpi<float>(MPI_COMM_WORLD, p, b, e, det);
  const Result one = run_one<float>(p);
  const Reference ref = reference(p);
  MPI_EXPECT_MSG(
      std::fabs(got.total - one.total) <= 1e-6 * std::fabs(one.total),
      "total " + std::to_string(got.total) + " vs one-process " +
          std::to_string(one.total));
  for (std::size_t i = 0; i < p.N; ++i) {
    const float a = got.loss[i], w = one.loss[i];
    MPI_EXPECT_MSG(
        std::fabs(a - w) <= std::fabs(std::nextafter(w, INFINITY) - w),
        "loss row " + std::to_string(i));
  }
  std::size_t bad = 0;
  for (std::size_t i = 0; i < p.N * p.D; ++i) {
    bad += !within(got.grad_hidden[i], ref.gh[i], ref.gh_scale[i]);
    bad += !within(one.grad_hidden[i], ref.gh[i], ref.gh_scale[i]);
  }
  for (std::size_t j = b; j < e; ++j) {
    for (std::size_t k = 0; k < p.D; ++k) {
      const std::size_t i = j * p.D + k;
      bad += !within(got.grad_weight[(j - b) * p.D + k], ref.gw[i],
                     ref.gw_scale[i]);
    }
  }
  MPI_EXPECT_MSG(bad == 0, std::to_string(bad) +
                               " gradient elements outside "
                               "2^-16 of their scale");
  // grad_hidden is the same on every rank.
  std::vector<float> first = got.grad_hidden;
  MPI_Bcast(first.data(), static_cast<int>(first.size()), MPI_FLOAT, 0,
            MPI_COMM_WORLD);
  bool same = true;
  for (std::size_t i = 0; i < first.size(); ++i) {
    same = same && same_bits(first[i], got.grad_hidden[i]);
  }
  MPI_EXPECT_MSG(same, "grad_hidden differs from rank 0's");
}

// bfloat16 inputs over all ranks: close to the one-process bfloat16 call.
void bfloat16_against_one_process() {
  const int P = world_size(), r = world_rank();
  const Problem p = make_problem(33, 24, 130, 31);
  const std::vector<std::size_t> cut = make_cuts(p.V, P);
  const std::size_t piece = piece_of(r, P);
  const std::size_t b = cut[piece], e = cut[piece + 1];
  const Result got = run_mpi<BFloat16>(MPI_COMM_WORLD, p, b, e, false);
  const Result one = run_one<BFloat16>(p);
  MPI_EXPECT(std::fabs(got.total - one.total) <= 1e-6 * std::fabs(one.total));
  float gmax = 0;
  for (const float v : one.grad_hidden) gmax = std::max(gmax, std::fabs(v));
  for (const float v : one.grad_weight) gmax = std::max(gmax, std::fabs(v));
  std::size_t bad = 0;
  for (std::size_t i = 0; i < got.grad_hidden.size(); ++i) {
    bad += std::fabs(got.grad_hidden[i] - one.grad_hidden[i]) > 1e-6f * gmax;
  }
  for (std::size_t j = 0; j < e - b; ++j) {
    for (std::size_t k = 0; k < p.D; ++k) {
      bad += std::fabs(got.grad_weight[j * p.D + k] -
                       one.grad_weight[(b + j) * p.D + k]) > 1e-6f * gmax;
    }
  }
  MPI_EXPECT_MSG(bad == 0, std::to_string(bad) + " gradient elements differ");
}

// Deterministic: loss and grad_weight bitwise the same for q = 1 .. P ranks
// (the first q, each its own uneven split) as on MPI_COMM_SELF.
void deterministic_for_every_p() {
  const int P = world_size(), r = world_rank();
  Problem p = make_problem(40, 20, 333, 41);
  p.options.reduction = Reduction::kSum;
  const Result ref = run_mpi<float>(MPI_COMM_SELF, p, 0, p.V, true);
  for (int q = 1; q <= P; ++q) {
    MPI_Comm sub;
    MPI_Comm_split(MPI_COMM_WORLD, r < q ? 0 : MPI_UNDEFINED, r, &sub);
    if (sub == MPI_COMM_NULL) continue;
    const std::vector<std::size_t> cut = make_cuts(p.V, q);
    const std::size_t piece = piece_of(r, q);
    const std::size_t b = cut[piece], e = cut[piece + 1];
    const Result o = run_mpi<float>(sub, p, b, e, true);
    MPI_Comm_free(&sub);
    const std::string tag = " (q = " + std::to_string(q) + ")";
    MPI_EXPECT_MSG(same_bits(o.total, ref.total), "total bits" + tag);
    for (std::size_t i = 0; i < p.N; ++i) {
      MPI_EXPECT_MSG(same_bits(o.loss[i], ref.loss[i]), "loss bits" + tag);
    }
    std::size_t bad = 0;
    for (std::size_t j = 0; j < (e - b) * p.D; ++j) {
      bad += !same_bits(o.grad_weight[j], ref.grad_weight[b * p.D + j]);
    }
    MPI_EXPECT_MSG(bad == 0, std::to_string(bad) + " grad_weight bits" + tag);
  }
}

// A NaN in one weight row of the last piece: every row's loss NaN on every
// rank (NaN never hidden), grad_hidden NaN; an all-ignored call: loss 0
// per row, zero gradients, the mean NaN (as torch).
void special_values() {
  const int P = world_size(), r = world_rank();
  Problem p = make_problem(9, 8, 60, 51);
  p.weight[(p.V - 1) * p.D + 3] = kNaN;
  const std::vector<std::size_t> cut = make_cuts(p.V, P);
  const std::size_t piece = piece_of(r, P);
  const std::size_t b = cut[piece], e = cut[piece + 1];
  const Result o = run_mpi<float>(MPI_COMM_WORLD, p, b, e, false);
  for (std::size_t i = 0; i < p.N; ++i) {
    if (p.targets[i] == -100) {
      MPI_EXPECT(o.loss[i] == 0.0f);
    } else {
      MPI_EXPECT_MSG(std::isnan(o.loss[i]), "row " + std::to_string(i));
    }
  }
  MPI_EXPECT(std::isnan(o.total));
  MPI_EXPECT(std::isnan(o.grad_hidden[0]));
  Problem q = make_problem(5, 8, 60, 52);
  std::fill(q.targets.begin(), q.targets.end(), -100);
  const Result z = run_mpi<float>(MPI_COMM_WORLD, q, b, e, true);
  MPI_EXPECT(std::isnan(z.total));
  for (const float v : z.loss) MPI_EXPECT(v == 0.0f);
  for (const float v : z.grad_hidden) MPI_EXPECT(v == 0.0f);
  for (const float v : z.grad_weight) MPI_EXPECT(v == 0.0f);
}

// Bad arguments on one rank: every rank throws the same message; nothing
// hangs; a good call afterwards works.
void bad_arguments() {
  const int P = world_size(), r = world_rank(), bad = P - 1;
  const std::size_t N = 3, D = 4, V = 40;
  const std::vector<std::size_t> cut = make_cuts(V, P);
  const std::size_t piece = piece_of(r, P);
  const std::size_t b = cut[piece], n = cut[piece + 1] - b;
  std::vector<float> h = random_matrix(N * D, 1.0, 61);
  std::vector<float> w =
      random_matrix(std::max<std::size_t>(n, 1) * D, 1.0, 62);
  std::vector<float> gh(N * D, 5.0f), loss(N, 5.0f);
  const MatrixView<const float> hv(h.data(), N, D), wv(w.data(), n, D);
  std::vector<std::int64_t> t = {1, 2, 3};
  const auto expect_throw = [&](const char* what, const std::string& needle,
                                auto&& call) {
    bool threw = false;
    try {
      call();
    } catch (const std::invalid_argument& e) {
      threw = true;
      const std::string msg = e.what();
      MPI_EXPECT_MSG(
          msg.find(needle) != std::string::npos,
          std::string(what) + ": '" + msg + "' lacks '" + needle + "'");
    }
    MPI_EXPECT_MSG(threw, std::string(what) + ": no exception");
    for (const float v : gh)
      MPI_EXPECT_MSG(v == 5.0f, std::string(what) + ": wrote grad_hidden");
  };
  // weight with the wrong D on one rank.
  expect_throw(
      "dim",
      "rank " + std::to_string(bad) + ": softdot::mpi::linear_cross_entropy",
      [&] {
        softdot::mpi::linear_cross_entropy(
            MPI_COMM_WORLD, hv,
            MatrixView<const float>(w.data(), r == bad ? 1 : n,
                                    r == bad ? D - 1 : D),
            b, t, loss);
      });
  if (P > 1) {
    // hidden differing on one rank.
    std::vector<float> h2 = h;
    if (r == bad) h2[5] += 1.0f;
    expect_throw("hidden", "differ", [&] {
      softdot::mpi::linear_cross_entropy(
          MPI_COMM_WORLD, MatrixView<const float>(h2.data(), N, D), wv, b, t,
          loss);
    });
    // grad_hidden asked for on one rank only.
    std::vector<float> gh2(N * D);
    expect_throw("grad_hidden", "presence of grad_hidden", [&] {
      softdot::mpi::linear_cross_entropy(
          MPI_COMM_WORLD, hv, wv, b, t, loss,
          r == bad ? MatrixView<float>(gh2.data(), N, D) : MatrixView<float>{});
    });
  }
  // The ranges do not tile.
  expect_throw("tiling", "vocab_begin", [&] {
    softdot::mpi::linear_cross_entropy(MPI_COMM_WORLD, hv, wv,
                                       r == bad ? b + 1 : b, t, loss);
  });
  // A target outside the whole vocabulary.
  std::vector<std::int64_t> t40 = {1, 40, 3};
  expect_throw("range", "targets[1] = 40 is not a class in [0, 40)", [&] {
    softdot::mpi::linear_cross_entropy(MPI_COMM_WORLD, hv, wv, b, t40, loss);
  });
  // Afterwards a good call works and agrees with one process.
  std::vector<float> full_w = random_matrix(V * D, 1.0, 63);
  const double got = softdot::mpi::linear_cross_entropy(
      MPI_COMM_WORLD, hv, MatrixView<const float>(full_w.data() + b * D, n, D),
      b, t, loss, MatrixView<float>(gh.data(), N, D));
  const double want = softdot::linear_cross_entropy(
      hv, MatrixView<const float>(full_w.data(), V, D), t, {});
  MPI_EXPECT(std::fabs(got - want) <= 1e-6 * std::fabs(want));
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  const int rc = softdot_test::run_cases({
      {"one_rank_bitwise float", [] { one_rank_bitwise<float>(); }},
      {"one_rank_bitwise bfloat16", [] { one_rank_bitwise<BFloat16>(); }},
      {"against_reference", [] { against_reference(false); }},
      {"against_reference det", [] { against_reference(true); }},
      {"bfloat16_against_one_process", [] { bfloat16_against_one_process(); }},
      {"deterministic_for_every_p", [] { deterministic_for_every_p(); }},
      {"special_values", [] { special_values(); }},
      {"bad_arguments", [] { bad_arguments(); }},
  });
  MPI_Finalize();
  return rc;
}
