// softdot: attention_merge() of two partial results over disjoint key
// ranges (the float (out, lse) form and AttentionPartial), and
// attention_finalize(). The arithmetic is the merge rule of
// kernels/state_merge.h.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "attention_checks.h"
#include "kernels/state_merge.h"
#include "softdot/attention.h"

namespace softdot {

using namespace detail::attn;

void attention_merge(TensorView<const float> o_a, const float* lse_a,
                     TensorView<const float> o_b, const float* lse_b,
                     TensorView<float> out, float* lse) {
  const char* fn = "attention_merge";
  check_tensor(fn, "o_a", o_a);
  check_tensor(fn, "o_b", o_b);
  check_tensor(fn, "out", out);
  auto same = [](const auto& x, const auto& y) {
    return x.batch == y.batch && x.heads == y.heads && x.rows == y.rows &&
           x.cols == y.cols;
  };
  if (!same(o_a, o_b) || !same(o_a, out)) {
    fail(fn, shape("o_a", o_a) + ", " + shape("o_b", o_b) + " and " +
                 shape("out", out) + " must have the same shape");
  }
  if (lse_a == nullptr || lse_b == nullptr || lse == nullptr) {
    fail(fn, "lse_a, lse_b and lse must not be null");
  }
  const std::size_t dv = o_a.cols;
  for (std::size_t b = 0; b < o_a.batch; ++b) {
    for (std::size_t h = 0; h < o_a.heads; ++h) {
      for (std::size_t i = 0; i < o_a.rows; ++i) {
        const std::size_t r = (b * o_a.heads + h) * o_a.rows + i;
        detail::merge_normalized(lse_a[r], o_a.row(b, h, i), lse_b[r],
                                 o_b.row(b, h, i), dv, out.row(b, h, i),
                                 lse + r);
      }
    }
  }
}

namespace {

std::string partial_shape(const char* name, const AttentionPartial& p) {
  return std::string(name) + " [" + count(p.batch) + ", " + count(p.heads) +
         ", " + count(p.rows) + "] with d_v " + count(p.dv);
}

// The vectors hold what batch, heads, rows and dv say.
// rows = batch x heads x rows and outputs = rows x dv, or a failure naming
// the partial when either product wraps.
void partial_counts(const char* fn, const char* name, std::size_t batch,
                    std::size_t heads, std::size_t rows, std::size_t dv,
                    std::size_t* n, std::size_t* outputs) {
  if (__builtin_mul_overflow(batch, heads, n) ||
      __builtin_mul_overflow(*n, rows, n) ||
      __builtin_mul_overflow(*n, dv, outputs) ||
      *outputs > static_cast<std::size_t>(PTRDIFF_MAX) / sizeof(double)) {
    fail(fn, std::string(name) + " [" + count(batch) + ", " + count(heads) +
                 ", " + count(rows) + "] with d_v " + count(dv) +
                 " has more outputs than fit in memory");
  }
}

void check_partial(const char* fn, const char* name,
                   const AttentionPartial& p) {
  std::size_t n = 0, outputs = 0;
  partial_counts(fn, name, p.batch, p.heads, p.rows, p.dv, &n, &outputs);
  if (p.max.size() != n || p.sum.size() != n || p.out.size() != outputs) {
    fail(fn, partial_shape(name, p) + " holds " + count(p.max.size()) +
                 " maxima, " + count(p.sum.size()) + " sums and " +
                 count(p.out.size()) + " outputs; expected " + count(n) + ", " +
                 count(n) + " and " + count(outputs));
  }
}

}  // namespace

AttentionPartial AttentionPartial::empty(std::size_t batch, std::size_t heads,
                                         std::size_t rows, std::size_t dv) {
  AttentionPartial p;
  p.batch = batch;
  p.heads = heads;
  p.rows = rows;
  p.dv = dv;
  std::size_t n = 0, outputs = 0;
  partial_counts("AttentionPartial::empty", "the partial", batch, heads, rows,
                 dv, &n, &outputs);
  p.max.assign(n, -std::numeric_limits<float>::infinity());
  p.sum.assign(n, 0.0);
  p.out.assign(outputs, 0.0);
  return p;
}

void attention_merge(AttentionPartial& a, const AttentionPartial& b) {
  const char* fn = "attention_merge";
  check_partial(fn, "a", a);
  check_partial(fn, "b", b);
  if (a.batch != b.batch || a.heads != b.heads || a.rows != b.rows ||
      a.dv != b.dv) {
    fail(fn, partial_shape("a", a) + " and " + partial_shape("b", b) +
                 " must have the same shape");
  }
  const std::size_t dv = a.dv;
  for (std::size_t r = 0; r < a.row_count(); ++r) {
    detail::merge_row_state(a.max[r], a.sum[r], a.out.data() + r * dv, b.max[r],
                            b.sum[r], b.out.data() + r * dv, dv);
  }
}

void attention_finalize(const AttentionPartial& partial, TensorView<float> out,
                        float* lse) {
  const char* fn = "attention_finalize";
  check_partial(fn, "partial", partial);
  check_tensor(fn, "out", out);
  if (out.batch != partial.batch || out.heads != partial.heads ||
      out.rows != partial.rows || out.cols != partial.dv) {
    fail(fn, shape("out", out) + " must be " +
                 shape("out", partial.batch, partial.heads, partial.rows,
                       partial.dv) +
                 " for " + partial_shape("partial", partial));
  }
  const std::size_t dv = partial.dv;
  for (std::size_t b = 0; b < partial.batch; ++b) {
    for (std::size_t h = 0; h < partial.heads; ++h) {
      for (std::size_t i = 0; i < partial.rows; ++i) {
        const std::size_t r = (b * partial.heads + h) * partial.rows + i;
        detail::finalize_row_state(partial.max[r], partial.sum[r],
                                   partial.out.data() + r * dv, dv,
                                   out.row(b, h, i), lse ? lse + r : nullptr);
      }
    }
  }
}

}  // namespace softdot
