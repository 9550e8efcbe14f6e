// softdot: the fused linear + cross-entropy
// (include/softdot/linear_cross_entropy.h): blocks of rows, each block's
// logits formed once by the packed product kernel (kernels/gemm-inl.h),
// the cross-entropy rows of src/cross_entropy_row.h, then the block's terms
// of the two gradients.
#include "softdot/linear_cross_entropy.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "attention_checks.h"
#include "check.h"
#include "cross_entropy_checks.h"
#include "cross_entropy_row.h"
#include "hwy/aligned_allocator.h"
#include "kernels/dispatch.h"
#include "linear_cross_entropy_blocks.h"
#include "parallel.h"

namespace softdot {
namespace {

inline float widen(float x) { return x; }
inline float widen(BFloat16 b) {
  const std::uint32_t u = static_cast<std::uint32_t>(b.bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// Element (i, k) of an operand at p[i * rs + k * cs]. direct: the kernel
// reads it in place (cs must be 1: A's rows, or B's rows k, contiguous)
// instead of a packed copy.
template <class T>
struct Operand {
  const T* p;
  std::size_t rs, cs;
  bool direct = false;
};

template <class T>
constexpr bool kBf16 = sizeof(T) == 2;

// Points g's A or B at an operand read in place, from k0 on.
template <class T>
void set_a_rows(detail::GemmArgs& g, Operand<T> a, std::size_t i0,
                std::size_t k0) {
  g.a_rows = a.p + i0 * a.rs + k0;
  g.lda = a.rs;
  g.a_bf16 = kBf16<T>;
}
template <class T>
void set_b_rows(detail::GemmArgs& g, Operand<T> b, std::size_t j0,
                std::size_t k0) {
  g.b_rows = b.p + k0 * b.rs + j0;
  g.ldb = b.rs;
  g.b_bf16 = kBf16<T>;
}

// Longest k range one packed panel holds; longer sums go in chunks of it,
// added in double (fixed, so the bits do not depend on the target).
constexpr std::size_t kKc = 4096;
// Rows of A a thread packs at once when B is packed whole (a multiple of
// every target's MR: 12 and 6).
constexpr std::size_t kMc = 96;
// Products with fewer multiply-adds than this run on one thread.
constexpr double kParallelFlops = 1 << 21;

// B panels a thread packs and runs at once when A is whole (see
// pack_b_group).
constexpr std::size_t kGroup = 4;
// k's a packing step transposes at once (see pack_a).
constexpr std::size_t kStep = 16;

struct Shape {
  std::size_t mr, nr;
};

Shape gemm_tile_shape() {
  Shape s{};
  detail::gemm_shape(&s.mr, &s.nr);
  return s;
}

// Packs rows [i0, i0 + m) and k's [k0, k0 + kc) of A as panels of mr rows,
// k-major (rows past m zero): dst[(i / mr) * kc * mr + k * mr + i % mr].
template <class T>
void pack_a(Operand<T> a, std::size_t i0, std::size_t m, std::size_t k0,
            std::size_t kc, std::size_t mr, float* dst) {
  const std::size_t tiles = (m + mr - 1) / mr;
  for (std::size_t t = 0; t < tiles; ++t) {
    float* d = dst + t * kc * mr;
    const std::size_t rows = std::min(mr, m - t * mr);
    if (rows < mr) std::fill(d, d + kc * mr, 0.0f);
    // In steps of kStep k's, so that the writes stay in a few cache lines.
    for (std::size_t kb = 0; kb < kc; kb += kStep) {
      const std::size_t ke = std::min(kc, kb + kStep);
      for (std::size_t r = 0; r < rows; ++r) {
        const T* src = a.p + (i0 + t * mr + r) * a.rs + k0 * a.cs;
        for (std::size_t k = kb; k < ke; ++k) {
          d[k * mr + r] = widen(src[k * a.cs]);
        }
      }
    }
  }
}

// Packs columns [j0, j0 + nr) (those < n) and k's [k0, k0 + kc) of B,
// element (k, j) at b.p[k * b.rs + j * b.cs]: dst[k * nr + j - j0].
template <class T>
void pack_b(Operand<T> b, std::size_t j0, std::size_t n, std::size_t k0,
            std::size_t kc, std::size_t nr, float* dst) {
  const std::size_t cols = std::min(nr, n - j0);
  if (b.cs == 1) {
    for (std::size_t k = 0; k < kc; ++k) {
      const T* src = b.p + (k0 + k) * b.rs + j0;
      float* d = dst + k * nr;
      for (std::size_t j = 0; j < cols; ++j) d[j] = widen(src[j]);
      for (std::size_t j = cols; j < nr; ++j) d[j] = 0.0f;
    }
    return;
  }
  if (cols < nr) std::fill(dst, dst + kc * nr, 0.0f);
  for (std::size_t kb = 0; kb < kc; kb += kStep) {
    const std::size_t ke = std::min(kc, kb + kStep);
    for (std::size_t j = 0; j < cols; ++j) {
      const T* src = b.p + (j0 + j) * b.cs + k0 * b.rs;
      for (std::size_t k = kb; k < ke; ++k) {
        dst[k * nr + j] = widen(src[k * b.rs]);
      }
    }
  }
}

// Panels [j_begin, j_end) of B (those not read in place), packed one after
// the other (panel j at dst + (j - j_begin) kc nr). Rows of B that are
// contiguous are copied k by k across the group's panels: one pass over
// B's rows for kGroup panels (each row k is a new page of W; walking them
// once per panel cost a third of grad_hidden's time).
template <class T>
void pack_b_group(Operand<T> b, std::size_t j_begin, std::size_t j_end,
                  std::size_t n, std::size_t k0, std::size_t kc, std::size_t nr,
                  float* dst) {
  const auto in_place = [&](std::size_t j) {
    return b.direct && n - j * nr >= nr;
  };
  if (b.cs != 1) {
    for (std::size_t j = j_begin; j < j_end; ++j) {
      if (!in_place(j)) {
        pack_b(b, j * nr, n, k0, kc, nr, dst + (j - j_begin) * kc * nr);
      }
    }
    return;
  }
  for (std::size_t k = 0; k < kc; ++k) {
    const T* src = b.p + (k0 + k) * b.rs;
    for (std::size_t j = j_begin; j < j_end; ++j) {
      if (in_place(j)) continue;
      float* d = dst + (j - j_begin) * kc * nr + k * nr;
      const std::size_t cols = std::min(nr, n - j * nr);
      for (std::size_t c = 0; c < cols; ++c) d[c] = widen(src[j * nr + c]);
      for (std::size_t c = cols; c < nr; ++c) d[c] = 0.0f;
    }
  }
}

// C (m x n, row stride ldc; c_transposed: C^T, c(i, j) at c + j * ldc + i)
// = A (m x kk) B (kk x n) (+ C if accumulate), each element as
// kernels/gemm_args.h says, k in fixed chunks of kKc whose sums are added
// in double. One OpenMP region; the same bits for any thread count: every
// element is one thread's, computed in a fixed order.
template <class TA, class TB>
void gemm(std::size_t m, std::size_t n, std::size_t kk, Operand<TA> a,
          Operand<TB> b, float* c, std::size_t ldc, bool accumulate,
          bool c_transposed = false) {
  const Shape s = gemm_tile_shape();
  const std::size_t chunks = (kk + kKc - 1) / kKc;
  const bool parallel = static_cast<double>(m) * static_cast<double>(n) *
                            static_cast<double>(kk) >=
                        kParallelFlops;
  const std::size_t mtiles = (m + s.mr - 1) / s.mr;
  const std::size_t npanels = (n + s.nr - 1) / s.nr;
  // The operand not split across the threads is packed whole (all k) up
  // front unless read in place: A when m <= n, else B.
  const bool a_whole = m <= n;
  hwy::AlignedFreeUniquePtr<float[]> whole;
  // Offset of chunk q's packed data in `whole`.
  const auto chunk_offset = [&](std::size_t q) {
    return q * kKc * (a_whole ? mtiles * s.mr : npanels * s.nr);
  };
  if (a_whole && !a.direct) {
    whole = hwy::AllocateAligned<float>(mtiles * s.mr * kk);
    for (std::size_t q = 0; q < chunks; ++q) {
      const std::size_t k0 = q * kKc, kc = std::min(kKc, kk - k0);
      pack_a(a, 0, m, k0, kc, s.mr, whole.get() + chunk_offset(q));
    }
  }
  const auto b_in_place = [&](std::size_t j) {
    return b.direct && n - j * s.nr >= s.nr;
  };
  if (!a_whole) {
    whole = hwy::AllocateAligned<float>(npanels * s.nr * kk);
    for (std::size_t q = 0; q < chunks; ++q) {
      const std::size_t k0 = q * kKc, kc = std::min(kKc, kk - k0);
      for (std::size_t j = 0; j < npanels; ++j) {
        if (b_in_place(j)) continue;
        pack_b(b, j * s.nr, n, k0, kc, s.nr,
               whole.get() + chunk_offset(q) + j * kc * s.nr);
      }
    }
  }
  // One unit of work: B panel j against all of A (a_whole), or A's rows
  // [u kMc, ...) against all of B; k in chunks, added in double in `acc`
  // (rows x n_unit) when there is more than one.
  const std::size_t units =
      a_whole ? (npanels + kGroup - 1) / kGroup : (m + kMc - 1) / kMc;
  const std::size_t tile_doubles = mtiles * s.mr * s.nr;
  const auto run = [&](std::size_t u, float* pack, double* acc) {
    const std::size_t i0 = a_whole ? 0 : u * kMc;
    const std::size_t rows = a_whole ? m : std::min(kMc, m - i0);
    const std::size_t j_begin = a_whole ? u * kGroup : 0;
    const std::size_t j_end =
        a_whole ? std::min(npanels, j_begin + kGroup) : npanels;
    for (std::size_t q = 0; q < chunks; ++q) {
      const std::size_t k0 = q * kKc, kc = std::min(kKc, kk - k0);
      if (a_whole) {
        pack_b_group(b, j_begin, j_end, n, k0, kc, s.nr, pack);
      }
      const float* apack = nullptr;
      if (a.direct) {
      } else if (a_whole) {
        apack = whole.get() + chunk_offset(q);
      } else {
        pack_a(a, i0, rows, k0, kc, s.mr, pack);
        apack = pack;
      }
      for (std::size_t j = j_begin; j < j_end; ++j) {
        detail::GemmArgs g;
        g.kc = kc;
        g.first = q == 0;
        g.accumulate = accumulate;
        g.c_transposed = c_transposed;
        g.mtiles = (rows + s.mr - 1) / s.mr;
        g.m = rows;
        g.n = std::min(s.nr, n - j * s.nr);
        if (a.direct) {
          set_a_rows(g, a, i0, k0);
        } else {
          g.a = apack;
        }
        if (b_in_place(j)) {
          set_b_rows(g, b, j * s.nr, k0);
        } else if (a_whole) {
          g.b = pack + (j - j_begin) * kc * s.nr;
        } else {
          g.b = whole.get() + chunk_offset(q) + j * kc * s.nr;
        }
        if (chunks > 1) {
          g.ldacc = a_whole ? s.nr : npanels * s.nr;
          g.acc = acc + (a_whole ? (j - j_begin) * tile_doubles : j * s.nr);
        }
        if (q + 1 == chunks) {
          g.c = c + (c_transposed ? j * s.nr * ldc + i0 : i0 * ldc + j * s.nr);
          g.ldc = ldc;
        }
        detail::gemm_panel_kernel(g);
      }
    }
  };
  // Per thread: a panel to pack into and the chunks' double sums.
  const std::size_t pack_floats = kKc * (a_whole ? kGroup * s.nr : kMc);
  const std::size_t acc_doubles =
      chunks > 1 ? (a_whole ? kGroup * tile_doubles : kMc * npanels * s.nr) : 0;
  const auto work = [&](bool in_parallel) {
    auto pack = hwy::AllocateAligned<float>(pack_floats);
    std::vector<double> acc(acc_doubles);
    if (!in_parallel) {
      for (std::size_t u = 0; u < units; ++u) run(u, pack.get(), acc.data());
      return;
    }
#pragma omp for schedule(dynamic, 1)
    for (std::size_t u = 0; u < units; ++u) run(u, pack.get(), acc.data());
  };
  if (!parallel) {
    work(false);
  } else {
#pragma omp parallel
    work(true);
  }
}

}  // namespace

namespace detail::lce {

std::size_t block_rows(std::size_t vocab) {
  return std::clamp<std::size_t>((std::size_t{1} << 22) / vocab, 64, 256);
}

template <class T>
void check_operands(const char* function, MatrixView<const T> hidden,
                    MatrixView<const T> weight,
                    std::span<const std::int64_t> targets,
                    std::span<float> loss, MatrixView<float> grad_hidden,
                    MatrixView<float> grad_weight,
                    const CrossEntropyOptions& options, bool shard) {
  using detail::count;
  using detail::fail;
  using detail::matrix_bytes;
  using detail::attn::first_overlap;
  using detail::attn::named_span;
  detail::check_matrix(function, "hidden", hidden);
  detail::check_matrix(function, "weight", weight);
  if (hidden.rows == 0 || hidden.cols == 0 || (weight.rows == 0 && !shard)) {
    fail(function, "hidden is " + count(hidden.rows) + " x " +
                       count(hidden.cols) + " and weight " +
                       count(weight.rows) + " x " + count(weight.cols) +
                       " (N, D and V must be >= 1)");
  }
  if (weight.cols != hidden.cols) {
    fail(function, "hidden is " + count(hidden.rows) + " x " +
                       count(hidden.cols) + " but weight is " +
                       count(weight.rows) + " x " + count(weight.cols) +
                       " (weight must be V x D)");
  }
  if (targets.size() != hidden.rows) {
    fail(function, "hidden has " + count(hidden.rows) + " rows but targets " +
                       count(targets.size()) + " elements");
  }
  detail::check_loss_options(function, options);
  if (!loss.empty() && loss.size() != hidden.rows) {
    fail(function, "loss has " + count(loss.size()) +
                       " elements; expected 0 or N = " + count(hidden.rows));
  }
  if (grad_hidden.data != nullptr) {
    detail::check_matrix(function, "grad_hidden", grad_hidden);
    if (grad_hidden.rows != hidden.rows || grad_hidden.cols != hidden.cols) {
      fail(function, "grad_hidden is " + count(grad_hidden.rows) + " x " +
                         count(grad_hidden.cols) + "; expected N x D = " +
                         count(hidden.rows) + " x " + count(hidden.cols));
    }
  }
  if (grad_weight.data != nullptr) {
    detail::check_matrix(function, "grad_weight", grad_weight);
    if (grad_weight.rows != weight.rows || grad_weight.cols != weight.cols) {
      fail(function, "grad_weight is " + count(grad_weight.rows) + " x " +
                         count(grad_weight.cols) + "; expected V x D = " +
                         count(weight.rows) + " x " + count(weight.cols));
    }
  }
  if (!shard) {
    detail::check_target_classes(function, targets, weight.rows,
                                 options.ignore_index);
  }
  const auto bytes_of = [](MatrixView<float> g) {
    return g.data == nullptr ? 0 : matrix_bytes(MatrixView<const float>(g));
  };
  const std::string overlap = first_overlap(
      {named_span("loss", loss.data(), loss.size() * sizeof(float)),
       named_span("grad_hidden", grad_hidden.data, bytes_of(grad_hidden)),
       named_span("grad_weight", grad_weight.data, bytes_of(grad_weight))},
      {named_span("hidden", hidden.data, matrix_bytes(hidden)),
       named_span("weight", weight.data, matrix_bytes(weight)),
       named_span("targets", targets.data(),
                  targets.size() * sizeof(std::int64_t))});
  if (!overlap.empty()) fail(function, overlap + " (no aliasing)");
}

// W read in place as A for the logits (transposed: W H_b^T, V x m,
// written as their transpose), and packed panel by panel as B for
// grad_hidden (G W): read in place there, its rows' panels are D floats
// apart and every tile of the block would walk them again (3 times slower,
// measured).
template <class T>
void logits(MatrixView<const T> hidden, std::size_t i0, std::size_t m,
            MatrixView<const T> weight, float* out) {
  const Operand<T> w_rows{weight.data, weight.stride, 1, true};
  // H_b^T as B: (k, j) = hidden[i0 + j][k].
  const Operand<T> h_t{hidden.data + i0 * hidden.stride, 1, hidden.stride};
  gemm(weight.rows, m, hidden.cols, w_rows, h_t, out, weight.rows, false, true);
}

template <class T>
void grad_hidden(const float* g, std::size_t m, MatrixView<const T> weight,
                 float* out, std::size_t ldo) {
  const std::size_t vocab = weight.rows;
  const Operand<float> ga{g, vocab, 1, true};
  const Operand<T> w_panels{weight.data, weight.stride, 1, false};
  gemm(m, weight.cols, vocab, ga, w_panels, out, ldo, false);
}

template <class T>
void grad_weight(const float* g, MatrixView<const T> hidden, std::size_t i0,
                 std::size_t m, MatrixView<float> grad_weight,
                 bool accumulate) {
  const std::size_t vocab = grad_weight.rows;
  const Operand<float> gt{g, 1, vocab};
  const Operand<T> hb{hidden.data + i0 * hidden.stride, hidden.stride, 1, true};
  gemm(vocab, hidden.cols, m, gt, hb, grad_weight.data, grad_weight.stride,
       accumulate);
}

#define SOFTDOT_LCE_INSTANTIATE(T)                                             \
  template void check_operands<T>(                                             \
      const char*, MatrixView<const T>, MatrixView<const T>,                   \
      std::span<const std::int64_t>, std::span<float>, MatrixView<float>,      \
      MatrixView<float>, const CrossEntropyOptions&, bool);                    \
  template void logits<T>(MatrixView<const T>, std::size_t, std::size_t,       \
                          MatrixView<const T>, float*);                        \
  template void grad_hidden<T>(const float*, std::size_t, MatrixView<const T>, \
                               float*, std::size_t);                           \
  template void grad_weight<T>(const float*, MatrixView<const T>, std::size_t, \
                               std::size_t, MatrixView<float>, bool);
SOFTDOT_LCE_INSTANTIATE(float)
SOFTDOT_LCE_INSTANTIATE(BFloat16)
#undef SOFTDOT_LCE_INSTANTIATE

}  // namespace detail::lce

namespace {

template <class T>
double linear_cross_entropy_checked(MatrixView<const T> hidden,
                                    MatrixView<const T> weight,
                                    std::span<const std::int64_t> targets,
                                    std::span<float> loss,
                                    MatrixView<float> grad_hidden,
                                    MatrixView<float> grad_weight,
                                    const CrossEntropyOptions& options) {
  detail::lce::check_operands<T>("linear_cross_entropy", hidden, weight,
                                 targets, loss, grad_hidden, grad_weight,
                                 options, false);
  const std::size_t rows = hidden.rows, vocab = weight.rows;
  const std::size_t counted =
      detail::counted_targets(targets, options.ignore_index);
  const double c = detail::gradient_scale(options.reduction, counted);
  const bool want_grad =
      grad_hidden.data != nullptr || grad_weight.data != nullptr;

  const std::size_t block = std::min(rows, detail::lce::block_rows(vocab));
  std::vector<float> logits(block * vocab);
  std::vector<long double> row_loss(rows);
  for (std::size_t i0 = 0; i0 < rows; i0 += block) {
    const std::size_t m = std::min(block, rows - i0);
    detail::lce::logits(hidden, i0, m, weight, logits.data());
    const bool parallel = m > 1 && m * vocab >= detail::kParallelElements;
    detail::for_each_index(m, parallel, [&](std::size_t r) {
      // G in place of the logits.
      float* x = logits.data() + r * vocab;
      row_loss[i0 + r] = detail::cross_entropy_whole_row(
          x, vocab, targets[i0 + r], options.ignore_index, c,
          options.label_smoothing, want_grad ? x : nullptr);
    });
    if (grad_hidden.data != nullptr) {
      // grad_hidden rows of the block: G W (m x D, k over V).
      detail::lce::grad_hidden(logits.data(), m, weight,
                               grad_hidden.data + i0 * grad_hidden.stride,
                               grad_hidden.stride);
    }
    if (grad_weight.data != nullptr) {
      // grad_weight (+)= G^T H_b (V x D, k over the block's rows).
      detail::lce::grad_weight(logits.data(), hidden, i0, m, grad_weight,
                               i0 != 0);
    }
  }
  return detail::finish_losses(row_loss, loss, options.reduction, counted);
}

}  // namespace

// The public overloads, one per operand format.
#define SOFTDOT_LCE_OVERLOAD(T)                                                \
  double linear_cross_entropy(                                                 \
      MatrixView<const T> hidden, MatrixView<const T> weight,                  \
      std::span<const std::int64_t> targets, std::span<float> loss,            \
      MatrixView<float> grad_hidden, MatrixView<float> grad_weight,            \
      const CrossEntropyOptions& options) {                                    \
    return linear_cross_entropy_checked<T>(hidden, weight, targets, loss,      \
                                           grad_hidden, grad_weight, options); \
  }
SOFTDOT_LCE_OVERLOAD(float)
SOFTDOT_LCE_OVERLOAD(BFloat16)
#undef SOFTDOT_LCE_OVERLOAD

}  // namespace softdot
