// softdot: speculative decoding's acceptance (speculative_accept) and the
// kept distribution of a row as dense probabilities (sample_probs), on the
// row steps of sample.cc (sample_row.h).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <new>
#include <string>
#include <vector>

#include "check.h"
#include "parallel.h"
#include "sample_row.h"
#include "softdot/sample.h"

namespace softdot {

namespace detail::sampling {
namespace {

// The kept set of a target row as dense weights q (0 outside the kept set)
// and their sum.
double dense_target(const float* x, std::size_t n, const Kept& kept,
                    const Scratch& sc, std::vector<double>& q) {
  q.assign(n, 0.0);
  switch (kept.form) {
    case Kept::kGreedy:
      q[static_cast<std::size_t>(kept.argmax)] = 1.0;
      return 1.0;
    case Kept::kInf:
      for (std::size_t i = 0; i < n; ++i)
        if (x[i] == INFINITY) q[i] = 1.0;
      return static_cast<double>(kept.count);
    case Kept::kSparse:
      for (std::size_t j = 0; j < sc.idx.size(); ++j)
        if (is_kept(sc.wc[j], kept.tau)) q[sc.idx[j]] = sc.wc[j];
      return kept.total;
    case Kept::kDense:
      for (std::size_t i = 0; i < n; ++i)
        if (is_kept(sc.w[i], kept.tau)) q[i] = sc.w[i];
      return kept.total;
    case Kept::kCand:
      for (std::size_t j = 0; j < sc.ncand; ++j)
        if (is_kept(sc.wc[j], kept.tau)) q[sc.bidx[j]] = sc.wc[j];
      return kept.total;
  }
  return 0;
}

// Index-order inverse CDF over nonnegative doubles r with sum `total`.
std::int64_t draw_dense(const std::vector<double>& r, double total, double u) {
  const double target = u * total;
  double cum = 0;
  std::int64_t last = -1;
  for (std::size_t i = 0; i < r.size(); ++i) {
    if (r[i] <= 0) continue;
    last = static_cast<std::int64_t>(i);
    cum += r[i];
    if (cum > target) return last;
  }
  return last;
}

}  // namespace
}  // namespace detail::sampling

using namespace detail::sampling;
using detail::fail;

void sample_probs(std::span<const float> logits, std::span<double> probs,
                  const SampleOptions& options,
                  std::span<const std::int32_t> bitmask) {
  const char* fn = "sample_probs";
  const std::size_t n = logits.size();
  if (n == 0) fail(fn, "logits are empty (an empty vocabulary)");
  if (probs.size() != n)
    fail(fn, "probs has " + detail::count(probs.size()) +
                 " entries; expected " + detail::count(n));
  if (!bitmask.empty() && bitmask.size() != (n + 31) / 32)
    fail(fn, "bitmask has " + detail::count(bitmask.size()) +
                 " int32 words; expected ceil(V / 32) = " +
                 detail::count((n + 31) / 32));
  check_options(fn, options);
  Scratch& sc = scratch();
  const float* x =
      prepare(logits.data(), n, bitmask.empty() ? nullptr : bitmask.data(), sc);
  Kept kept;
  const int st = decide(x, n, options, sc, kept);
  if (st != kOk) row_error(fn, "logits", 0, st);
  std::vector<double> q;
  const double total = dense_target(x, n, kept, sc, q);
  for (std::size_t i = 0; i < n; ++i) probs[i] = q[i] / total;
}

void speculative_accept(MatrixView<const std::int64_t> draft_tokens,
                        MatrixView<const float> draft_probs,
                        MatrixView<const float> target_logits,
                        std::span<const std::uint64_t> seeds,
                        std::span<std::int64_t> accepted,
                        MatrixView<std::int64_t> tokens,
                        const SampleOptions& o) {
  const char* fn = "speculative_accept";
  const std::size_t rows = draft_tokens.rows, k = draft_tokens.cols;
  const std::size_t n = target_logits.cols;
  if (n == 0) fail(fn, "target_logits have 0 columns (an empty vocabulary)");
  if (target_logits.rows != rows * (k + 1))
    fail(fn, "target_logits has " + detail::count(target_logits.rows) +
                 " rows; expected rows * (K + 1) = " +
                 detail::count(rows * (k + 1)));
  if (target_logits.rows > 1 && target_logits.stride < n)
    fail(fn, "target_logits stride < cols");
  const bool has_probs = draft_probs.data != nullptr || draft_probs.rows != 0;
  if (has_probs) {
    if (draft_probs.rows != rows * k || draft_probs.cols != n)
      fail(fn, "draft_probs is " + detail::count(draft_probs.rows) + " x " +
                   detail::count(draft_probs.cols) + "; expected " +
                   detail::count(rows * k) + " x " + detail::count(n));
    if (draft_probs.rows > 1 && draft_probs.stride < n)
      fail(fn, "draft_probs stride < cols");
  }
  if (k > 0 && rows > 1 && draft_tokens.stride < k)
    fail(fn, "draft_tokens stride < cols");
  if (seeds.size() != rows)
    fail(fn, "seeds has " + detail::count(seeds.size()) +
                 " entries; expected " + detail::count(rows));
  if (accepted.size() != rows)
    fail(fn, "accepted has " + detail::count(accepted.size()) +
                 " entries; expected " + detail::count(rows));
  if (tokens.rows != rows || tokens.cols != k + 1)
    fail(fn, "tokens is " + detail::count(tokens.rows) + " x " +
                 detail::count(tokens.cols) + "; expected " +
                 detail::count(rows) + " x " + detail::count(k + 1));
  check_options(fn, o);
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t j = 0; j < k; ++j) {
      const std::int64_t t = draft_tokens.data[r * draft_tokens.stride + j];
      if (t < 0 || static_cast<std::uint64_t>(t) >= n)
        fail(fn, "draft token " + std::to_string(t) + " at row " +
                     std::to_string(r) + ", position " + std::to_string(j) +
                     " is outside [0, " + detail::count(n) + ")");
      if (!has_probs) continue;
      const float* p = draft_probs.data + (r * k + j) * draft_probs.stride;
      for (std::size_t i = 0; i < n; ++i)
        if (!(p[i] >= 0))
          fail(fn, "draft_probs row " + detail::count(r * k + j) +
                       " has a negative or NaN entry at " + detail::count(i));
    }
  }
  std::vector<std::int64_t> out(rows * (k + 1), -1);
  std::vector<std::int64_t> acc(rows, 0);
  std::vector<int> status(rows, kOk);
  std::vector<std::size_t> bad_row(rows, 0);
  const bool parallel =
      rows > 1 && rows * n * (k + 1) >= detail::kParallelElements / 4;
  detail::for_each_index(rows, parallel, [&](std::size_t r) {
    try {
      Scratch& sc = scratch();
      std::vector<double> q;
      for (std::size_t j = 0; j <= k; ++j) {
        const std::size_t trow = r * (k + 1) + j;
        const float* x = target_logits.data + trow * target_logits.stride;
        Kept kept;
        const int st = decide(x, n, o, sc, kept);
        if (st != kOk) {
          status[r] = st;
          bad_row[r] = trow;
          return;
        }
        const Uniforms u = uniforms(seeds[r], static_cast<std::uint32_t>(j));
        if (j == k) {  // every draft accepted: the bonus token
          out[r * (k + 1) + j] = draw(x, n, kept, sc, u.b);
          acc[r] = static_cast<std::int64_t>(k);
          return;
        }
        const std::int64_t d = draft_tokens.data[r * draft_tokens.stride + j];
        const double total = dense_target(x, n, kept, sc, q);
        const double qd = q[static_cast<std::size_t>(d)] / total;
        const float* p =
            has_probs ? draft_probs.data + (r * k + j) * draft_probs.stride
                      : nullptr;
        const double pd = p ? static_cast<double>(p[d]) : 1.0;
        if (u.a * pd < qd) {
          out[r * (k + 1) + j] = d;
          continue;
        }
        // Rejected: draw from norm(max(0, q - p)).
        double rsum = 0;
        for (std::size_t i = 0; i < n; ++i) {
          const double pi = p ? static_cast<double>(p[i])
                              : (i == static_cast<std::size_t>(d) ? 1.0 : 0.0);
          const double v = q[i] / total - pi;
          q[i] = v > 0 ? v : 0.0;
          rsum += q[i];
        }
        std::int64_t t;
        if (rsum > 0) {
          t = draw_dense(q, rsum, u.b);
        } else {
          t = draw(x, n, kept, sc, u.b);
        }
        out[r * (k + 1) + j] = t;
        acc[r] = static_cast<std::int64_t>(j);
        return;
      }
    } catch (...) {
      status[r] = kNoMemory;
    }
  });
  for (std::size_t r = 0; r < rows; ++r)
    if (status[r] != kOk) row_error(fn, "target_logits", bad_row[r], status[r]);
  for (std::size_t r = 0; r < rows; ++r) {
    accepted[r] = acc[r];
    for (std::size_t j = 0; j <= k; ++j)
      tokens.data[r * tokens.stride + j] = out[r * (k + 1) + j];
  }
}

}  // namespace softdot
