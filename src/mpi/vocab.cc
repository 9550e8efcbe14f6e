// softdot::mpi: softmax, log_softmax, logsumexp and cross_entropy of rows
// whose vocabulary is split across ranks (include/softdot/mpi_vocab.h).
//
// Every call goes: local checks -> agree_or_throw (collective) -> one
// Allgather of each rank's layout (rows, cols, vocab_begin, a fingerprint
// of the targets and options) checked identically on every rank -> the
// local reduction of each shard row -> Allgather of the per-row partials
// (two rounds in deterministic mode) -> the merged state of each row ->
// this rank's outputs. No rank reaches an exchange that another skips: the
// verdicts are collective, and a local failure inside the compute is agreed
// on before the next exchange.
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "check.h"
#include "cross_entropy_checks.h"
#include "cross_entropy_row.h"
#include "kernels.h"
#include "kernels/state_merge.h"
#include "mpi/comm.h"
#include "softdot/mpi.h"

namespace softdot::mpi {
namespace {

using softdot::detail::count;
using softdot::detail::fail;
using softdot::detail::RowOp;
using softdot::detail::RowState;
using L = long double;
using U128 = unsigned __int128;
using I128 = __int128;

constexpr double kInfD = std::numeric_limits<double>::infinity();
constexpr double kNaND = std::numeric_limits<double>::quiet_NaN();

enum class Op { kSoftmax, kLogSoftmax, kLse, kCrossEntropy };

// What one rank announces about its arguments.
struct Layout {
  std::uint64_t rows, cols, begin, fingerprint;
};

struct Global {
  std::size_t vocab = 0;
  std::vector<int> order;  // ranks in vocabulary order
};

// FNV-1a over bytes, for comparing the ranks' targets and options.
std::uint64_t fnv(std::uint64_t h, const void* p, std::size_t n) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i) {
    h ^= b[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

// Runs the local checks in `check` on this rank, then agrees on the verdict
// (every rank throws the lowest failing rank's message).
template <class F>
void agree_local(MPI_Comm comm, F&& check) {
  bool ok = true;
  std::string what;
  try {
    check();
  } catch (const std::invalid_argument& e) {
    ok = false;
    what = e.what();
  }
  detail::agree_or_throw(comm, ok, what);
}

// The ranks' layouts, checked the same way on every rank (every rank sees
// the same data, so every rank throws the same error).
Global agree_layout(MPI_Comm comm, int size, const char* function,
                    const Layout& mine, bool deterministic) {
  std::vector<Layout> all(static_cast<std::size_t>(size));
  detail::check_mpi(
      MPI_Allgather(&mine, 4, MPI_UINT64_T, all.data(), 4, MPI_UINT64_T, comm),
      "MPI_Allgather");
  for (int r = 1; r < size; ++r) {
    const Layout& a = all[static_cast<std::size_t>(r)];
    if (a.rows != all[0].rows) {
      fail(function, "rank " + std::to_string(r) + ": x has " + count(a.rows) +
                         " rows but rank 0's has " + count(all[0].rows));
    }
    if (a.fingerprint != all[0].fingerprint) {
      fail(function, "rank " + std::to_string(r) +
                         ": targets or options differ from rank 0's (they "
                         "must be the same on every rank)");
    }
  }
  Global g;
  g.order.resize(all.size());
  std::iota(g.order.begin(), g.order.end(), 0);
  std::stable_sort(g.order.begin(), g.order.end(), [&](int a, int b) {
    const Layout& x = all[static_cast<std::size_t>(a)];
    const Layout& y = all[static_cast<std::size_t>(b)];
    return x.begin != y.begin ? x.begin < y.begin : x.cols < y.cols;
  });
  std::uint64_t end = 0;
  for (const int r : g.order) {
    const Layout& a = all[static_cast<std::size_t>(r)];
    if (a.begin != end) {
      fail(function, "rank " + std::to_string(r) +
                         ": vocab_begin = " + count(a.begin) +
                         " but the columns before it end at " + count(end) +
                         " (the ranks' column ranges must tile [0, V))");
    }
    end += a.cols;
  }
  if (end == 0)
    fail(function, "the vocabulary is empty (every rank has 0 cols)");
  if (deterministic && end >= (std::uint64_t{1} << 26)) {
    fail(function,
         "deterministic mode takes V < 2^26 columns, got " + count(end));
  }
  g.vocab = end;
  return g;
}

void allgather(MPI_Comm comm, const std::vector<double>& mine,
               std::vector<double>& all, int size) {
  all.resize(mine.size() * static_cast<std::size_t>(size));
  detail::check_mpi(
      MPI_Allgather(mine.data(), static_cast<int>(mine.size()), MPI_DOUBLE,
                    all.data(), static_cast<int>(mine.size()), MPI_DOUBLE,
                    comm),
      "MPI_Allgather");
}

// Agrees on a failure inside local compute before the next exchange.
template <class F>
void agree_compute(MPI_Comm comm, F&& work) {
  bool ok = true;
  std::string what;
  try {
    work();
  } catch (const std::exception& e) {
    ok = false;
    what = e.what();
  }
  detail::agree_or_throw_runtime(comm, ok, what);
}

// |v| * 2^shift truncated toward zero, with v's sign, as a 128-bit integer
// (|v| 2^shift < 2^126). Exact but for the truncation, and a function of v
// and shift only.
I128 to_fixed(double v, int shift) {
  const double a = std::ldexp(std::fabs(v), shift);
  const double hi = std::floor(std::ldexp(a, -64));
  const double lo = a - std::ldexp(hi, 64);  // exact: a's low bits
  const I128 f = (static_cast<I128>(static_cast<std::uint64_t>(hi)) << 64) +
                 static_cast<I128>(static_cast<std::uint64_t>(lo));
  return v < 0 ? -f : f;
}

void split128(I128 v, double* out) {  // bits into two doubles' storage
  const U128 u = static_cast<U128>(v);
  const std::uint64_t lo = static_cast<std::uint64_t>(u);
  const std::uint64_t hi = static_cast<std::uint64_t>(u >> 64);
  std::memcpy(out, &lo, 8);
  std::memcpy(out + 1, &hi, 8);
}

I128 join128(const double* in) {
  std::uint64_t lo, hi;
  std::memcpy(&lo, in, 8);
  std::memcpy(&hi, in + 1, 8);
  return static_cast<I128>((static_cast<U128>(hi) << 64) | lo);
}

// The per-row results every rank ends with.
struct RowTotal {
  RowState state;
  L x_t = 0;    // the target's logit (cross_entropy)
  L sum_x = 0;  // the sum of the row's logits (label smoothing)
};

// What the vocabulary-parallel reduction needs to know about a call.
struct Job {
  Op op;
  bool deterministic;
  bool need_sum_x;                        // label smoothing
  const std::int64_t* targets = nullptr;  // cross_entropy
  std::int64_t ignore_index = 0;
};

template <class T>
bool row_skipped(const Job& job, std::size_t i) {
  return job.targets != nullptr && job.targets[i] == job.ignore_index;
}

// The logit of the row's target if this rank holds it, else 0 (exactly one
// rank holds it).
template <class T>
double local_target(const Job& job, const T* x, std::size_t i, std::size_t cols,
                    std::size_t begin) {
  if (job.targets == nullptr) return 0.0;
  const std::int64_t t = job.targets[i];
  if (t == job.ignore_index) return 0.0;
  const std::uint64_t tu = static_cast<std::uint64_t>(t);
  return tu >= begin && tu < begin + cols ? static_cast<double>(x[tu - begin])
                                          : 0.0;
}

template <class T>
bool owns_target(const Job& job, std::size_t i, std::size_t cols,
                 std::size_t begin) {
  if (job.targets == nullptr || job.targets[i] == job.ignore_index) {
    return false;
  }
  const std::uint64_t tu = static_cast<std::uint64_t>(job.targets[i]);
  return tu >= begin && tu < begin + cols;
}

// Default mode: each shard's state (softmax_state), the partial sum of the
// logits and the target's logit; merged left to right in vocabulary order.
template <class T>
std::vector<RowTotal> totals_default(MPI_Comm comm, int size, const Global& g,
                                     const Job& job, MatrixView<const T> x,
                                     std::size_t begin) {
  constexpr std::size_t K = 6;
  const std::size_t rows = x.rows;
  std::vector<double> mine(rows * K), all;
  agree_compute(comm, [&] {
    for (std::size_t i = 0; i < rows; ++i) {
      double* o = mine.data() + i * K;
      const T* xr = x.data + i * x.stride;
      RowState s{-kInfD, 0.0, 0.0};
      if (x.cols > 0 && !row_skipped<T>(job, i)) {
        softdot::detail::softmax_row_kernel(xr, nullptr, T{1}, x.cols,
                                            RowOp::kState, true, nullptr, &s);
      }
      const L sx = job.need_sum_x && !row_skipped<T>(job, i)
                       ? softdot::detail::sum_in_long_double(xr, x.cols)
                       : 0.0L;
      const double sx_hi = static_cast<double>(sx);
      o[0] = s.max;
      o[1] = s.sum;
      o[2] = s.sum_lo;
      o[3] = sx_hi;
      o[4] = std::isfinite(sx_hi) ? static_cast<double>(sx - sx_hi) : 0.0;
      o[5] = local_target<T>(job, xr, i, x.cols, begin);
    }
  });
  allgather(comm, mine, all, size);
  std::vector<RowTotal> out(rows);
  for (std::size_t i = 0; i < rows; ++i) {
    RowTotal& t = out[i];
    bool first = true;
    for (const int r : g.order) {
      const double* o =
          all.data() + (static_cast<std::size_t>(r) * rows + i) * K;
      if (first) {
        t.state = {o[0], o[1], o[2]};
        first = false;
      } else {
        softdot::detail::merge_softmax_state(t.state.max, t.state.sum,
                                             t.state.sum_lo, o[0], o[1], o[2]);
      }
      t.sum_x += static_cast<L>(o[3]) + static_cast<L>(o[4]);
    }
    if (job.targets != nullptr && job.targets[i] != job.ignore_index) {
      // The owner's entry; the others hold 0, so the sum is exact.
      for (const int r : g.order) {
        t.x_t += static_cast<L>(
            all[(static_cast<std::size_t>(r) * rows + i) * K + 5]);
      }
    }
  }
  return out;
}

// Deterministic mode, round 1: per shard row the max, the largest finite
// |x|, and flags (NaN, +inf count, any -inf); all exact, so their global
// values do not depend on the split.
template <class T>
void shard_extremes(const T* x, std::size_t n, double* o) {
  double m = -kInfD, amax = 0.0, nan = 0.0, pinf = 0.0, ninf = 0.0;
  for (std::size_t j = 0; j < n; ++j) {
    const double v = static_cast<double>(x[j]);
    if (std::isnan(v)) {
      nan = 1.0;
    } else if (v == kInfD) {
      pinf += 1.0;
      m = kInfD;
    } else if (v == -kInfD) {
      ninf = 1.0;
    } else {
      m = std::max(m, v);
      amax = std::max(amax, std::fabs(v));
    }
  }
  o[0] = m;
  o[1] = amax;
  o[2] = nan;
  o[3] = pinf;
  o[4] = ninf;
}

template <class T>
std::vector<RowTotal> totals_deterministic(MPI_Comm comm, int size,
                                           const Global& g, const Job& job,
                                           MatrixView<const T> x,
                                           std::size_t begin) {
  (void)g;
  constexpr std::size_t K1 = 5, K2 = 5;
  const std::size_t rows = x.rows;
  std::vector<double> mine(rows * K1), all;
  agree_compute(comm, [&] {
    for (std::size_t i = 0; i < rows; ++i) {
      shard_extremes(x.data + i * x.stride, row_skipped<T>(job, i) ? 0 : x.cols,
                     mine.data() + i * K1);
    }
  });
  allgather(comm, mine, all, size);
  // Global extremes (order-free: max, or, and integer sums).
  struct Ext {
    double m = -kInfD, amax = 0.0, pinf = 0.0;
    bool nan = false, ninf = false;
  };
  std::vector<Ext> ext(rows);
  for (std::size_t i = 0; i < rows; ++i) {
    for (int r = 0; r < size; ++r) {
      const double* o =
          all.data() + (static_cast<std::size_t>(r) * rows + i) * K1;
      ext[i].m = std::max(ext[i].m, o[0]);
      ext[i].amax = std::max(ext[i].amax, o[1]);
      ext[i].nan = ext[i].nan || o[2] != 0.0;
      ext[i].pinf += o[3];
      ext[i].ninf = ext[i].ninf || o[4] != 0.0;
    }
  }
  // Round 2: S = sum exp(x - M) and sum x in fixed point; the target.
  std::vector<double> mine2(rows * K2), all2;
  agree_compute(comm, [&] {
    std::vector<double> buf(x.cols);
    for (std::size_t i = 0; i < rows; ++i) {
      double* o = mine2.data() + i * K2;
      const T* xr = x.data + i * x.stride;
      const Ext& e = ext[i];
      I128 fs = 0, fx = 0;
      const bool finite_row = !e.nan && std::isfinite(e.m);
      if (finite_row && x.cols > 0 && !row_skipped<T>(job, i)) {
        // exp(x_j - M) rounded to double by the faithful double kernel
        // (elementwise: the same bits wherever the column sits).
        for (std::size_t j = 0; j < x.cols; ++j) {
          buf[j] = static_cast<double>(xr[j]);
        }
        RowState unit{e.m, 1.0, 0.0};
        softdot::detail::softmax_row_kernel(buf.data(), nullptr, 1.0, x.cols,
                                            RowOp::kApply, true, buf.data(),
                                            &unit);
        for (std::size_t j = 0; j < x.cols; ++j) fs += to_fixed(buf[j], 100);
        if (job.need_sum_x && !e.ninf && e.amax > 0.0) {
          int ex;
          std::frexp(e.amax, &ex);  // amax < 2^ex
          for (std::size_t j = 0; j < x.cols; ++j) {
            fx += to_fixed(static_cast<double>(xr[j]), 100 - ex);
          }
        }
      }
      split128(fs, o);
      split128(fx, o + 2);
      o[4] = local_target<T>(job, xr, i, x.cols, begin);
    }
  });
  allgather(comm, mine2, all2, size);
  std::vector<RowTotal> out(rows);
  for (std::size_t i = 0; i < rows; ++i) {
    const Ext& e = ext[i];
    RowTotal& t = out[i];
    U128 fs = 0;
    I128 fx = 0;
    for (int r = 0; r < size; ++r) {
      const double* o =
          all2.data() + (static_cast<std::size_t>(r) * rows + i) * K2;
      fs += static_cast<U128>(join128(o));
      fx += join128(o + 2);
      t.x_t += static_cast<L>(o[4]);  // exact: one non-zero term
    }
    if (e.nan) {
      t.state = {kNaND, kNaND, 0.0};
    } else if (e.m == -kInfD) {
      t.state = {-kInfD, 0.0, 0.0};
    } else if (e.m == kInfD) {
      t.state = {kInfD, e.pinf, 0.0};
    } else {
      const double a = static_cast<double>(fs);
      const U128 ua = static_cast<U128>(a);
      const double b = ua >= fs ? -static_cast<double>(ua - fs)
                                : static_cast<double>(fs - ua);
      t.state = {e.m, std::ldexp(a, -100), std::ldexp(b, -100)};
    }
    if (job.need_sum_x) {
      if (e.ninf) {
        t.sum_x = -std::numeric_limits<L>::infinity();
      } else if (e.amax > 0.0) {
        int ex;
        std::frexp(e.amax, &ex);
        t.sum_x = std::ldexp(static_cast<L>(fx), ex - 100);
      }
    }
  }
  return out;
}

template <class T>
std::vector<RowTotal> row_totals(MPI_Comm comm, int size, const Global& g,
                                 const Job& job, MatrixView<const T> x,
                                 std::size_t begin) {
  return job.deterministic
             ? totals_deterministic<T>(comm, size, g, job, x, begin)
             : totals_default<T>(comm, size, g, job, x, begin);
}

// log_softmax of one shard row from the row's state, in long double.
template <class T>
void log_softmax_row(const T* x, std::size_t n, const RowState& s, T* y) {
  constexpr T kNaN = std::numeric_limits<T>::quiet_NaN();
  constexpr T kInf = std::numeric_limits<T>::infinity();
  if (std::isnan(s.max) || std::isnan(s.sum)) {
    std::fill(y, y + n, kNaN);
  } else if (s.max == -kInfD) {
    std::fill(y, y + n, -kInf);
  } else if (s.max == kInfD) {
    const T minus_log_k = static_cast<T>(-std::log(static_cast<L>(s.sum)));
    for (std::size_t j = 0; j < n; ++j) {
      y[j] = x[j] == kInf ? minus_log_k : -kInf;
    }
  } else {
    const L log_s = softdot::detail::log_state_sum(s);
    const L m = static_cast<L>(s.max);
    for (std::size_t j = 0; j < n; ++j) {
      y[j] = x[j] == -kInf ? -kInf
                           : static_cast<T>((static_cast<L>(x[j]) - m) - log_s);
    }
  }
}

template <class T>
void check_xy(const char* function, MatrixView<const T> x, MatrixView<T> y) {
  softdot::detail::check_matrix(function, "x", x);
  softdot::detail::check_matrix(function, "y", y);
  if (x.rows == 0) fail(function, "x has 0 rows (rows must be >= 1)");
  if (x.rows != y.rows || x.cols != y.cols) {
    fail(function, "x is " + count(x.rows) + " x " + count(x.cols) +
                       " but y is " + count(y.rows) + " x " + count(y.cols));
  }
  const bool in_place = x.data == y.data && x.stride == y.stride;
  if (!in_place && softdot::detail::bytes_overlap(
                       x.data, softdot::detail::matrix_bytes(x), y.data,
                       softdot::detail::matrix_bytes(MatrixView<const T>(y)))) {
    fail(function, "y overlaps x (only the same matrix, in place, is allowed)");
  }
}

template <class T>
void rows_op(const char* function, Op op, MPI_Comm comm, MatrixView<const T> x,
             std::size_t begin, MatrixView<T> y, std::span<T> lse,
             const VocabOptions& options) {
  detail::DupComm dc(comm, function);
  agree_local(dc.get(), [&] {
    if (op == Op::kLse) {
      softdot::detail::check_matrix(function, "x", x);
      if (x.rows == 0) fail(function, "x has 0 rows (rows must be >= 1)");
      if (lse.size() != x.rows) {
        fail(function, "x has " + count(x.rows) + " rows but lse has " +
                           count(lse.size()) + " elements");
      }
    } else {
      check_xy<T>(function, x, y);
    }
  });
  const Layout mine{x.rows, x.cols, begin,
                    fnv(0xcbf29ce484222325ull, &options.deterministic, 1)};
  const Global g =
      agree_layout(dc.get(), dc.size(), function, mine, options.deterministic);
  Job job{op, options.deterministic, false};
  const std::vector<RowTotal> tot =
      row_totals<T>(dc.get(), dc.size(), g, job, x, begin);
  for (std::size_t i = 0; i < x.rows; ++i) {
    const RowState& s = tot[i].state;
    if (op == Op::kLse) {
      lse[i] = softdot::detail::logsumexp_of_state<T>(s);
      continue;
    }
    if (x.cols == 0) continue;
    const T* xr = x.data + i * x.stride;
    T* yr = y.data + i * y.stride;
    if (op == Op::kSoftmax) {
      RowState st = s;
      softdot::detail::softmax_row_kernel(xr, nullptr, T{1}, x.cols,
                                          RowOp::kApply, true, yr, &st);
    } else {
      log_softmax_row<T>(xr, x.cols, s, yr);
    }
  }
}

template <class T>
double cross_entropy_op(MPI_Comm comm, MatrixView<const T> logits,
                        std::size_t begin,
                        std::span<const std::int64_t> targets,
                        std::span<T> loss, MatrixView<T> grad,
                        const CrossEntropyOptions& options,
                        const VocabOptions& vopt) {
  const char* function = "mpi::cross_entropy";
  detail::DupComm dc(comm, function);
  agree_local(dc.get(), [&] {
    // The target range is checked against V once V is known.
    softdot::detail::check_cross_entropy<T>(function, logits, 1, targets, loss,
                                            grad, options, false);
  });
  std::uint64_t h = 0xcbf29ce484222325ull;
  h = fnv(h, targets.data(), targets.size() * sizeof(std::int64_t));
  h = fnv(h, &options.ignore_index, sizeof(options.ignore_index));
  h = fnv(h, &options.label_smoothing, sizeof(options.label_smoothing));
  const int red = static_cast<int>(options.reduction);
  h = fnv(h, &red, sizeof(red));
  h = fnv(h, &vopt.deterministic, 1);
  const Layout mine{logits.rows, logits.cols, begin, h};
  const Global g =
      agree_layout(dc.get(), dc.size(), function, mine, vopt.deterministic);
  // The targets are the same everywhere, so every rank reaches the same
  // verdict here without another exchange.
  for (std::size_t i = 0; i < targets.size(); ++i) {
    const std::int64_t t = targets[i];
    if (t != options.ignore_index && static_cast<std::uint64_t>(t) >= g.vocab) {
      fail(function, "targets[" + count(i) + "] = " + std::to_string(t) +
                         " is not a class in [0, " + count(g.vocab) +
                         ") nor ignore_index " +
                         std::to_string(options.ignore_index));
    }
  }
  const double eps = options.label_smoothing;
  std::size_t counted = 0;
  for (const std::int64_t t : targets) counted += t != options.ignore_index;
  const double c = softdot::detail::gradient_scale(options.reduction, counted);
  Job job{Op::kCrossEntropy, vopt.deterministic, eps > 0.0, targets.data(),
          options.ignore_index};
  const std::vector<RowTotal> tot =
      row_totals<T>(dc.get(), dc.size(), g, job, logits, begin);
  std::vector<L> row_loss(logits.rows, 0.0L);
  for (std::size_t i = 0; i < logits.rows; ++i) {
    const std::int64_t t = targets[i];
    T* gr = grad.data == nullptr ? nullptr : grad.data + i * grad.stride;
    if (t == options.ignore_index) {
      if (gr != nullptr) std::fill(gr, gr + logits.cols, T{0});
      continue;
    }
    row_loss[i] = softdot::detail::cross_entropy_row_loss(
        tot[i].state, tot[i].x_t, tot[i].sum_x, g.vocab, eps);
    if (gr != nullptr) {
      const std::ptrdiff_t t_local =
          owns_target<T>(job, i, logits.cols, begin)
              ? static_cast<std::ptrdiff_t>(static_cast<std::uint64_t>(t) -
                                            begin)
              : -1;
      softdot::detail::cross_entropy_row_grad(
          logits.data + i * logits.stride, logits.cols, t_local, tot[i].state,
          c, eps, g.vocab, gr);
    }
  }
  if (!loss.empty()) {
    for (std::size_t i = 0; i < logits.rows; ++i) {
      loss[i] = static_cast<T>(row_loss[i]);
    }
  }
  return softdot::detail::reduce_row_losses(row_loss.data(), logits.rows,
                                            options.reduction, counted);
}

}  // namespace

void softmax(MPI_Comm comm, MatrixView<const float> x, std::size_t vocab_begin,
             MatrixView<float> y, const VocabOptions& options) {
  rows_op<float>("mpi::softmax", Op::kSoftmax, comm, x, vocab_begin, y, {},
                 options);
}
void softmax(MPI_Comm comm, MatrixView<const double> x, std::size_t vocab_begin,
             MatrixView<double> y, const VocabOptions& options) {
  rows_op<double>("mpi::softmax", Op::kSoftmax, comm, x, vocab_begin, y, {},
                  options);
}
void log_softmax(MPI_Comm comm, MatrixView<const float> x,
                 std::size_t vocab_begin, MatrixView<float> y,
                 const VocabOptions& options) {
  rows_op<float>("mpi::log_softmax", Op::kLogSoftmax, comm, x, vocab_begin, y,
                 {}, options);
}
void log_softmax(MPI_Comm comm, MatrixView<const double> x,
                 std::size_t vocab_begin, MatrixView<double> y,
                 const VocabOptions& options) {
  rows_op<double>("mpi::log_softmax", Op::kLogSoftmax, comm, x, vocab_begin, y,
                  {}, options);
}
void logsumexp(MPI_Comm comm, MatrixView<const float> x,
               std::size_t vocab_begin, std::span<float> lse,
               const VocabOptions& options) {
  rows_op<float>("mpi::logsumexp", Op::kLse, comm, x, vocab_begin, {}, lse,
                 options);
}
void logsumexp(MPI_Comm comm, MatrixView<const double> x,
               std::size_t vocab_begin, std::span<double> lse,
               const VocabOptions& options) {
  rows_op<double>("mpi::logsumexp", Op::kLse, comm, x, vocab_begin, {}, lse,
                  options);
}

double cross_entropy(MPI_Comm comm, MatrixView<const float> logits,
                     std::size_t vocab_begin,
                     std::span<const std::int64_t> targets,
                     std::span<float> loss, MatrixView<float> grad,
                     const CrossEntropyOptions& options,
                     const VocabOptions& vocab_options) {
  return cross_entropy_op<float>(comm, logits, vocab_begin, targets, loss, grad,
                                 options, vocab_options);
}
double cross_entropy(MPI_Comm comm, MatrixView<const double> logits,
                     std::size_t vocab_begin,
                     std::span<const std::int64_t> targets,
                     std::span<double> loss, MatrixView<double> grad,
                     const CrossEntropyOptions& options,
                     const VocabOptions& vocab_options) {
  return cross_entropy_op<double>(comm, logits, vocab_begin, targets, loss,
                                  grad, options, vocab_options);
}

}  // namespace softdot::mpi
