// softdot::mpi: the exchange of the vocabulary-parallel functions
// (src/mpi/vocab_totals.h).
#include "mpi/vocab_totals.h"

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "check.h"
#include "cross_entropy_row.h"

namespace softdot::mpi::detail {
namespace {

using softdot::detail::count;
using softdot::detail::fail;
using L = long double;
using U128 = unsigned __int128;
using I128 = __int128;

constexpr double kInfD = std::numeric_limits<double>::infinity();
constexpr double kNaND = std::numeric_limits<double>::quiet_NaN();

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
      SoftmaxStateD s;  // {-inf, 0, 0}
      if (x.cols > 0 && !row_skipped<T>(job, i)) {
        s = widen_state(softdot::softmax_state(std::span<const T>(xr, x.cols)));
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
        t.state = softdot::merge(t.state, SoftmaxStateD{o[0], o[1], o[2]});
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
        const std::span<double> row(buf.data(), x.cols);
        softdot::softmax_apply(row, SoftmaxStateD{e.m, 1.0, 0.0}, row);
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

}  // namespace

// The ranks' ShardInfo, checked the same way on every rank (every rank sees
// the same data, so every rank throws the same error).
Global agree_shards(MPI_Comm comm, int size, const char* function,
                    const ShardInfo& mine, bool deterministic,
                    const char* rows_of, const char* same) {
  std::vector<ShardInfo> all(static_cast<std::size_t>(size));
  detail::check_mpi(
      MPI_Allgather(&mine, 4, MPI_UINT64_T, all.data(), 4, MPI_UINT64_T, comm),
      "MPI_Allgather");
  for (int r = 1; r < size; ++r) {
    const ShardInfo& a = all[static_cast<std::size_t>(r)];
    if (a.rows != all[0].rows) {
      fail(function, "rank " + std::to_string(r) + ": " + rows_of + " has " +
                         count(a.rows) + " rows but rank 0's has " +
                         count(all[0].rows));
    }
    if (a.fingerprint != all[0].fingerprint) {
      fail(function, "rank " + std::to_string(r) + ": " + same +
                         " differ from rank 0's (they must be the same on "
                         "every rank)");
    }
  }
  Global g;
  g.order.resize(all.size());
  std::iota(g.order.begin(), g.order.end(), 0);
  std::stable_sort(g.order.begin(), g.order.end(), [&](int a, int b) {
    const ShardInfo& x = all[static_cast<std::size_t>(a)];
    const ShardInfo& y = all[static_cast<std::size_t>(b)];
    return x.begin != y.begin ? x.begin < y.begin : x.cols < y.cols;
  });
  std::uint64_t end = 0;
  for (const int r : g.order) {
    const ShardInfo& a = all[static_cast<std::size_t>(r)];
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

template <class T>
void shard_rows(const Global& g, const Job& job,
                const std::vector<RowTotal>& tot, MatrixView<const T> x,
                std::size_t begin, double c, double eps, MatrixView<T> grad,
                long double* row_loss) {
  for (std::size_t i = 0; i < x.rows; ++i) {
    const std::int64_t t = job.targets[i];
    T* gr = grad.data == nullptr ? nullptr : grad.data + i * grad.stride;
    if (t == job.ignore_index) {
      row_loss[i] = 0.0L;
      if (gr != nullptr) std::fill(gr, gr + x.cols, T{0});
      continue;
    }
    row_loss[i] = softdot::detail::cross_entropy_row_loss(
        tot[i].state, tot[i].x_t, tot[i].sum_x, g.vocab, eps);
    if (gr != nullptr) {
      const std::ptrdiff_t t_local =
          owns_target(job, i, x.cols, begin)
              ? static_cast<std::ptrdiff_t>(static_cast<std::uint64_t>(t) -
                                            begin)
              : -1;
      softdot::detail::cross_entropy_row_grad(x.data + i * x.stride, x.cols,
                                              t_local, tot[i].state, c, eps,
                                              g.vocab, gr);
    }
  }
}

template void shard_rows<float>(const Global&, const Job&,
                                const std::vector<RowTotal>&,
                                MatrixView<const float>, std::size_t, double,
                                double, MatrixView<float>, long double*);
template void shard_rows<double>(const Global&, const Job&,
                                 const std::vector<RowTotal>&,
                                 MatrixView<const double>, std::size_t, double,
                                 double, MatrixView<double>, long double*);

template <class T>
std::vector<RowTotal> row_totals(MPI_Comm comm, int size, const Global& g,
                                 const Job& job, MatrixView<const T> x,
                                 std::size_t begin) {
  return job.deterministic
             ? totals_deterministic<T>(comm, size, g, job, x, begin)
             : totals_default<T>(comm, size, g, job, x, begin);
}

template std::vector<RowTotal> row_totals<float>(MPI_Comm, int, const Global&,
                                                 const Job&,
                                                 MatrixView<const float>,
                                                 std::size_t);
template std::vector<RowTotal> row_totals<double>(MPI_Comm, int, const Global&,
                                                  const Job&,
                                                  MatrixView<const double>,
                                                  std::size_t);

}  // namespace softdot::mpi::detail
