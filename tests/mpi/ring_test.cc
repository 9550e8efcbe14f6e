// softdot::mpi::ring_attention against the one-process attention() on the
// whole sequence. Every rank builds the same full inputs (a fixed seed),
// takes the rows of its own positions (padding rows hold NaN, which must
// never reach a real row), runs the ring and checks its rows:
//   - not deterministic: within a tolerance of attention() (a few roundings
//     of float in the merges' order; both are within attention()'s bound),
//     bitwise the same on a second run, and bitwise attention() for P = 1
//     contiguous;
//   - deterministic: bitwise equal to the one-process merge of the
//     kRingBlock-key block partials (prefill form) by a binary tree over
//     the blocks (the sinks' partial first), which does not depend on P, so
//     the bits are the same for every P; and within the tolerance of
//     attention().
// (Over 600 lines on purpose: one mpirun executable per rank count, so every
// ring case shares the rank's set-up and the one-process references; split,
// each part would be another mpirun start on the 2-core machine.)
#include <mpi.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "attention_reference.h"
#include "mpi_test_util.h"
#include "softdot/attention.h"
#include "softdot/mpi.h"

namespace {

using softdot::AttentionOptions;
using softdot::AttentionPartial;
using softdot::TensorView;
using softdot::mpi::Layout;
using softdot::mpi::RingLayout;
using softdot::mpi::RingOptions;
using softdot_test::world_rank;
using softdot_test::world_size;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

enum KV { kF32, kF16, kBF16, kI8 };

struct Case {
  const char* name;
  std::size_t n = 37, B = 1, H = 2, Hkv = 2, d = 16, dv = 8;
  Layout layout = Layout::zigzag;
  bool causal = false;
  std::ptrdiff_t wl = -1, wr = -1;
  KV kv = kF32;
  bool mask = false, bias = false, sinks = false;
  bool alibi = false;  // ALiBi slopes, one per query head
  bool precise = false;
  double scale = kNaN;
  float softcap = 0.0f;
  bool det = false;
  long nan_key = -1;   // position of a NaN key, or -1
  float q_amp = 1.5f;  // queries uniform in [-q_amp, q_amp]
};

std::vector<float> random(std::size_t n, std::mt19937& g, float lo, float hi) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> x(n);
  for (float& e : x) e = u(g);
  return x;
}

// Rows at `pos` of a [B, H, n, cols] tensor; padding rows get `fill`.
template <class T>
std::vector<T> take_rows(const std::vector<T>& full, std::size_t B,
                         std::size_t H, std::size_t n, std::size_t cols,
                         const std::vector<std::size_t>& pos, T fill) {
  std::vector<T> out(B * H * pos.size() * cols, fill);
  for (std::size_t b = 0; b < B * H; ++b) {
    for (std::size_t i = 0; i < pos.size(); ++i) {
      if (pos[i] >= n) continue;
      std::memcpy(&out[(b * pos.size() + i) * cols],
                  &full[(b * n + pos[i]) * cols], cols * sizeof(T));
    }
  }
  return out;
}

bool same_bits(float a, float b) {
  return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b);
}

// K/V storage of a case: float inputs converted to the case's format.
struct KVData {
  std::vector<float> k32, v32;
  std::vector<softdot::Float16> k16, v16;
  std::vector<softdot::BFloat16> kb, vb;
  std::vector<std::int8_t> k8, v8;
  std::vector<float> ks, vs;
};

KVData make_kv(const Case& c, const std::vector<float>& k,
               const std::vector<float>& v, std::size_t rows) {
  KVData x;
  x.k32 = k;
  x.v32 = v;
  if (c.kv == kF16) {
    for (float e : k) x.k16.push_back(softdot::to_float16(e));
    for (float e : v) x.v16.push_back(softdot::to_float16(e));
  } else if (c.kv == kBF16) {
    for (float e : k) x.kb.push_back(softdot::to_bfloat16(e));
    for (float e : v) x.vb.push_back(softdot::to_bfloat16(e));
  } else if (c.kv == kI8) {
    // quantize_kv rejects NaN rows: quantise with NaN replaced by 0, then
    // mark NaN rows with a NaN scale is not allowed either; the NaN case
    // is run with float K/V only.
    x.k8.resize(k.size());
    x.v8.resize(v.size());
    x.ks.resize(c.B * c.Hkv * rows);
    x.vs.resize(c.B * c.Hkv * rows);
    std::vector<float> kk = k, vv = v;
    for (float& e : kk)
      if (std::isnan(e)) e = 0.0f;
    for (float& e : vv)
      if (std::isnan(e)) e = 0.0f;
    softdot::quantize_kv(
        TensorView<const float>(kk.data(), c.B, c.Hkv, rows, c.d),
        TensorView<std::int8_t>(x.k8.data(), c.B, c.Hkv, rows, c.d),
        TensorView<float>(x.ks.data(), c.B, c.Hkv, rows, 1));
    softdot::quantize_kv(
        TensorView<const float>(vv.data(), c.B, c.Hkv, rows, c.dv),
        TensorView<std::int8_t>(x.v8.data(), c.B, c.Hkv, rows, c.dv),
        TensorView<float>(x.vs.data(), c.B, c.Hkv, rows, 1));
  }
  return x;
}

// attention(), attention_partial() or ring_attention() on a case's K/V.
template <class F>
void with_kv(const Case& c, const KVData& x, std::size_t rows, F&& f) {
  const std::size_t hk = c.Hkv;
  switch (c.kv) {
    case kF32:
      f(TensorView<const float>(x.k32.data(), c.B, hk, rows, c.d),
        TensorView<const float>(x.v32.data(), c.B, hk, rows, c.dv));
      break;
    case kF16:
      f(TensorView<const softdot::Float16>(x.k16.data(), c.B, hk, rows, c.d),
        TensorView<const softdot::Float16>(x.v16.data(), c.B, hk, rows, c.dv));
      break;
    case kBF16:
      f(TensorView<const softdot::BFloat16>(x.kb.data(), c.B, hk, rows, c.d),
        TensorView<const softdot::BFloat16>(x.vb.data(), c.B, hk, rows, c.dv));
      break;
    case kI8:
      f(softdot::Int8KV{TensorView<const std::int8_t>(x.k8.data(), c.B, hk,
                                                      rows, c.d),
                        TensorView<const float>(x.ks.data(), c.B, hk, rows, 1)},
        softdot::Int8KV{
            TensorView<const std::int8_t>(x.v8.data(), c.B, hk, rows, c.dv),
            TensorView<const float>(x.vs.data(), c.B, hk, rows, 1)});
      break;
  }
}

void run_case(const Case& c) {
  const int P = world_size(), rank = world_rank();
  std::mt19937 g(1234 + static_cast<unsigned>(c.n));
  const std::size_t n = c.n, H = c.H, B = c.B;
  std::vector<float> q = random(B * H * n * c.d, g, -c.q_amp, c.q_amp);
  std::vector<float> k = random(B * c.Hkv * n * c.d, g, -1.5f, 1.5f);
  std::vector<float> v = random(B * c.Hkv * n * c.dv, g, -1.0f, 1.0f);
  if (c.nan_key >= 0) {
    k[static_cast<std::size_t>(c.nan_key) * c.d + 3] = kNaN;  // b 0, head 0
  }
  // Global mask [1, H, n, n] (per head) and bias [B, 1, n, n].
  std::vector<char> mask_full;
  std::vector<float> bias_full;
  if (c.mask) {
    std::bernoulli_distribution keep(0.85);
    mask_full.resize(H * n * n);
    for (auto& e : mask_full) e = keep(g) ? 1 : 0;
    // Query position 5 sees no key in any head.
    for (std::size_t h = 0; h < H; ++h)
      for (std::size_t j = 0; j < n; ++j) mask_full[(h * n + 5) * n + j] = 0;
  }
  if (c.bias) bias_full = random(B * n * n, g, -2.0f, 2.0f);
  std::vector<float> sinks;
  if (c.sinks) sinks = random(H, g, -1.0f, 1.0f);
  std::vector<float> slopes;
  if (c.alibi) slopes = random(H, g, 0.05f, 0.6f);

  AttentionOptions ao;
  ao.alibi_slopes = slopes;
  ao.precise = c.precise;
  if (!std::isnan(c.scale)) ao.scale = c.scale;  // NaN: not set
  ao.causal = c.causal;
  ao.window_left = c.wl;
  ao.window_right = c.wr;
  ao.softcap = c.softcap;
  ao.sinks = sinks;
  static_assert(sizeof(bool) == sizeof(char));
  if (c.mask) {
    ao.mask = TensorView<const bool>(
        reinterpret_cast<const bool*>(mask_full.data()), 1, H, n, n);
  }
  if (c.bias) ao.bias = TensorView<const float>(bias_full.data(), B, 1, n, n);

  // One process, the whole sequence.
  const KVData full = make_kv(c, k, v, n);
  std::vector<float> ref(B * H * n * c.dv), ref_lse(B * H * n);
  with_kv(c, full, n, [&](auto kk, auto vv) {
    softdot::attention(TensorView<const float>(q.data(), B, H, n, c.d), kk, vv,
                       TensorView<float>(ref.data(), B, H, n, c.dv), ao,
                       ref_lse.data());
  });
  // The deterministic reference: block partials merged in key order.
  std::vector<float> det(B * H * n * c.dv), det_lse(B * H * n);
  if (c.det) {
    AttentionPartial acc = AttentionPartial::empty(B, H, n, c.dv), part;
    AttentionOptions po = ao;
    po.prefill_form = true;
    po.q_position = 0;  // same positions as ao: q i at i, key j at j
    with_kv(c, full, n, [&](auto kk, auto vv) {
      const TensorView<const float> qv(q.data(), B, H, n, c.d);
      if (c.sinks) {
        AttentionOptions so = po;
        so.kv_begin = so.kv_end = 0;
        softdot::attention_partial(qv, kk, vv, acc, so);
      }
      po.sinks = {};
      // Every block's partial (those the mask hides are empty rows), then
      // the binary tree over the blocks padded to a power of two, each
      // node merging its left child with its right one.
      std::vector<AttentionPartial> level;
      for (std::size_t j0 = 0; j0 < n; j0 += softdot::mpi::kRingBlock) {
        po.kv_begin = j0;
        po.kv_end = j0 + softdot::mpi::kRingBlock;
        softdot::attention_partial(qv, kk, vv, part, po);
        level.push_back(part);
      }
      std::size_t leaves = 1;
      while (leaves < level.size()) leaves *= 2;
      level.resize(leaves, AttentionPartial::empty(B, H, n, c.dv));
      while (level.size() > 1) {
        std::vector<AttentionPartial> up;
        for (std::size_t i = 0; i < level.size(); i += 2) {
          softdot::attention_merge(level[i], level[i + 1]);
          up.push_back(std::move(level[i]));
        }
        level = std::move(up);
      }
      softdot::attention_merge(acc, level[0]);
    });
    softdot::attention_finalize(
        acc, TensorView<float>(det.data(), B, H, n, c.dv), det_lse.data());
  }

  // This rank's rows.
  const RingLayout L = softdot::mpi::ring_layout(n, P, c.layout, c.det);
  const std::vector<std::size_t> pos = L.positions(rank);
  const std::size_t rows = L.rows();
  const std::vector<float> lq = take_rows(q, B, H, n, c.d, pos, kNaN);
  const std::vector<float> lk = take_rows(k, B, c.Hkv, n, c.d, pos, kNaN);
  const std::vector<float> lv = take_rows(v, B, c.Hkv, n, c.dv, pos, kNaN);
  const KVData local = make_kv(c, lk, lv, rows);
  std::vector<char> lmask;
  std::vector<float> lbias;
  RingOptions ro;
  ro.attention = ao;
  ro.seq_len = n;
  ro.layout = c.layout;
  ro.deterministic = c.det;
  if (c.mask) {
    lmask.assign(H * rows * n, 1);
    for (std::size_t h = 0; h < H; ++h)
      for (std::size_t i = 0; i < rows; ++i)
        if (pos[i] < n)
          std::memcpy(&lmask[(h * rows + i) * n],
                      &mask_full[(h * n + pos[i]) * n], n);
    ro.attention.mask = TensorView<const bool>(
        reinterpret_cast<const bool*>(lmask.data()), 1, H, rows, n);
  }
  if (c.bias) {
    lbias = take_rows(bias_full, B, 1, n, n, pos, kNaN);
    ro.attention.bias = TensorView<const float>(lbias.data(), B, 1, rows, n);
  }
  std::vector<float> out(B * H * rows * c.dv, 7.0f), lse(B * H * rows, 7.0f);
  std::vector<float> out2(out.size(), 5.0f), lse2(lse.size(), 5.0f);
  with_kv(c, local, rows, [&](auto kk, auto vv) {
    const TensorView<const float> qv(lq.data(), B, H, rows, c.d);
    softdot::mpi::ring_attention(
        MPI_COMM_WORLD, qv, kk, vv,
        TensorView<float>(out.data(), B, H, rows, c.dv), ro, lse.data());
    softdot::mpi::ring_attention(
        MPI_COMM_WORLD, qv, kk, vv,
        TensorView<float>(out2.data(), B, H, rows, c.dv), ro, lse2.data());
  });

  // The MPFR reference (long double out, the bound of attention.h) on the
  // K and V the kernels see (16-bit widened, int8 dequantised), computed on
  // rank 0 for small cases and sent to every rank.
  const bool with_exact = n * n * H * B * (c.d + c.dv) <= 3000000;
  std::vector<double> exact_out, exact_bound;
  if (with_exact) {
    exact_out.resize(B * H * n * c.dv);
    exact_bound.resize(exact_out.size());
    if (rank == 0) {
      std::vector<float> kw(k.size()), vw(v.size());
      for (std::size_t i = 0; i < k.size(); ++i) {
        const std::size_t row = i / c.d;
        kw[i] = c.kv == kF16    ? softdot::to_float(full.k16[i])
                : c.kv == kBF16 ? softdot::to_float(full.kb[i])
                : c.kv == kI8   ? full.ks[row] * static_cast<float>(full.k8[i])
                                : k[i];
      }
      for (std::size_t i = 0; i < v.size(); ++i) {
        const std::size_t row = i / c.dv;
        vw[i] = c.kv == kF16    ? softdot::to_float(full.v16[i])
                : c.kv == kBF16 ? softdot::to_float(full.vb[i])
                : c.kv == kI8   ? full.vs[row] * static_cast<float>(full.v8[i])
                                : v[i];
      }
      auto view = [&](const std::vector<float>& x, std::size_t h,
                      std::size_t cols) {
        return softdot_ref::AttnTensor<float>{
            x.data(), B, h, n, cols, h * n * cols, n * cols, cols};
      };
      softdot_ref::AttnRefOptions r;
      r.scale = c.scale;
      r.precise = c.precise;
      r.causal = c.causal;
      r.window_left = c.wl;
      r.window_right = c.wr;
      r.softcap = c.softcap;
      r.sinks = sinks;
      if (c.mask) {
        r.mask = {reinterpret_cast<const bool*>(mask_full.data()),
                  1,
                  H,
                  n,
                  n,
                  H * n * n,
                  n * n,
                  n};
      }
      if (c.bias) r.bias = {bias_full.data(), B, 1, n, n, n * n, n * n, n};
      // ALiBi is the bias slope_h (j - i), rounded once to float
      // (attention.h).
      std::vector<float> alibi_bias;
      if (c.alibi) {
        alibi_bias.resize(H * n * n);
        for (std::size_t h = 0; h < H; ++h)
          for (std::size_t i = 0; i < n; ++i)
            for (std::size_t j = 0; j < n; ++j)
              alibi_bias[(h * n + i) * n + j] = static_cast<float>(
                  static_cast<double>(slopes[h]) *
                  (static_cast<double>(j) - static_cast<double>(i)));
        r.bias = {alibi_bias.data(), 1, H, n, n, H * n * n, n * n, n};
      }
      const softdot_ref::AttnRef e = softdot_ref::attention_reference(
          view(q, H, c.d), view(kw, c.Hkv, c.d), view(vw, c.Hkv, c.dv), r);
      for (std::size_t i = 0; i < exact_out.size(); ++i) {
        exact_out[i] = static_cast<double>(e.out[i]);
        exact_bound[i] = e.bound[i];
      }
    }
    MPI_Bcast(exact_out.data(), static_cast<int>(exact_out.size()), MPI_DOUBLE,
              0, MPI_COMM_WORLD);
    MPI_Bcast(exact_bound.data(), static_cast<int>(exact_bound.size()),
              MPI_DOUBLE, 0, MPI_COMM_WORLD);
  }

  const bool exact_attention =
      !c.det && P == 1 && c.layout == Layout::contiguous;
  // Contiguous, not deterministic, chunks in the prefill form: the bits are
  // those of the one-process merge of the key chunks' partials in the order
  // they reach this rank (its own chunk, with the sinks, then rank - 1,
  // rank - 2, ...), whatever pieces the ring cuts the queries into.
  const std::size_t my_rows =
      std::min(n, (rank + 1) * L.chunk) - std::min(n, rank * L.chunk);
  const bool ring_bits =
      !c.det && c.layout == Layout::contiguous && (H / c.Hkv) * my_rows > 16;
  std::vector<float> rb(B * H * n * c.dv), rb_lse(B * H * n);
  if (ring_bits) {
    AttentionPartial acc = AttentionPartial::empty(B, H, n, c.dv), part;
    with_kv(c, full, n, [&](auto kk, auto vv) {
      for (int s = 0; s < P; ++s) {
        const int owner = (rank - s + P) % P;
        AttentionOptions po = ao;
        po.sinks = s == 0 ? ao.sinks : std::span<const float>{};
        po.kv_begin = std::min(n, owner * L.chunk);
        po.kv_end = std::min(n, (owner + 1) * L.chunk);
        softdot::attention_partial(
            TensorView<const float>(q.data(), B, H, n, c.d), kk, vv, part, po);
        softdot::attention_merge(acc, part);
      }
    });
    softdot::attention_finalize(
        acc, TensorView<float>(rb.data(), B, H, n, c.dv), rb_lse.data());
  }
  int bad = 0;
  auto report = [&](const std::string& what) {
    if (++bad <= 5)
      softdot_test::fail(__FILE__, __LINE__, std::string(c.name) + ": " + what);
  };
  for (std::size_t bh = 0; bh < B * H; ++bh) {
    for (std::size_t i = 0; i < rows; ++i) {
      const float* o = &out[(bh * rows + i) * c.dv];
      const float* o2 = &out2[(bh * rows + i) * c.dv];
      const float l = lse[bh * rows + i];
      const std::string where = "row (bh " + std::to_string(bh) + ", pos " +
                                std::to_string(pos[i]) + ")";
      if (!same_bits(l, lse2[bh * rows + i]))
        report(where + " lse differs run to run");
      for (std::size_t x = 0; x < c.dv; ++x)
        if (!same_bits(o[x], o2[x])) report(where + " out differs run to run");
      if (pos[i] >= n) {
        for (std::size_t x = 0; x < c.dv; ++x)
          if (!same_bits(o[x], 0.0f)) report(where + " padding row not +0");
        if (!(l == -std::numeric_limits<float>::infinity()))
          report(where + " padding lse not -inf");
        continue;
      }
      const float* r = &ref[(bh * n + pos[i]) * c.dv];
      const float rl = ref_lse[bh * n + pos[i]];
      if (c.det) {
        const float* dr = &det[(bh * n + pos[i]) * c.dv];
        if (!same_bits(l, det_lse[bh * n + pos[i]]))
          report(where + " lse not the deterministic bits");
        for (std::size_t x = 0; x < c.dv; ++x)
          if (!same_bits(o[x], dr[x]) &&
              !(std::isnan(o[x]) && std::isnan(dr[x])))
            report(where + " out not the deterministic bits: " +
                   std::to_string(o[x]) + " vs " + std::to_string(dr[x]));
      }
      if (ring_bits) {
        const float* br = &rb[(bh * n + pos[i]) * c.dv];
        if (!same_bits(l, rb_lse[bh * n + pos[i]]) &&
            !(std::isnan(l) && std::isnan(rb_lse[bh * n + pos[i]])))
          report(where + " lse not the bits of the merge in ring order");
        for (std::size_t x = 0; x < c.dv; ++x)
          if (!same_bits(o[x], br[x]) &&
              !(std::isnan(o[x]) && std::isnan(br[x])))
            report(where + " out not the bits of the merge in ring order");
      }
      if (exact_attention) {
        if (!same_bits(l, rl) && !(std::isnan(l) && std::isnan(rl)))
          report(where + " lse not attention()'s bits");
        for (std::size_t x = 0; x < c.dv; ++x)
          if (!same_bits(o[x], r[x]) && !(std::isnan(o[x]) && std::isnan(r[x])))
            report(where + " out not attention()'s bits");
      }
      // Against attention(): NaN where it has NaN, -inf lse where it has,
      // otherwise close.
      if (with_exact) {
        for (std::size_t x = 0; x < c.dv; ++x) {
          const double e = exact_out[(bh * n + pos[i]) * c.dv + x];
          const double bnd = exact_bound[(bh * n + pos[i]) * c.dv + x];
          if (std::isnan(e) != std::isnan(o[x])) {
            report(where + " NaN against the reference");
          } else if (!std::isnan(e) && !(std::fabs(o[x] - e) <= bnd)) {
            report(where + " out " + std::to_string(o[x]) + " vs exact " +
                   std::to_string(e) + " beyond the bound " +
                   std::to_string(bnd));
          }
        }
      }
      if (std::isnan(rl) != std::isnan(l)) report(where + " NaN lse mismatch");
      if (std::isinf(rl) != std::isinf(l) || (std::isinf(rl) && rl != l))
        report(where + " lse " + std::to_string(l) + " vs " +
               std::to_string(rl));
      if (std::isfinite(rl) &&
          std::fabs(l - rl) > 1e-5f * (1.0f + std::fabs(rl)))
        report(where + " lse " + std::to_string(l) + " vs " +
               std::to_string(rl));
      for (std::size_t x = 0; x < c.dv; ++x) {
        if (std::isnan(r[x]) != std::isnan(o[x])) {
          report(where + " NaN mismatch");
        } else if (!std::isnan(r[x]) && std::fabs(o[x] - r[x]) > 4e-6f) {
          report(where + " out " + std::to_string(o[x]) + " vs " +
                 std::to_string(r[x]));
        }
      }
    }
  }
}

// One rank passes a q of the wrong rows: every rank throws, naming the
// function, the argument and that rank; nothing hangs.
void bad_shape_on_one_rank() {
  const int P = world_size(), rank = world_rank();
  const std::size_t n = 40;
  const RingLayout L = softdot::mpi::ring_layout(n, P, Layout::zigzag);
  const std::size_t rows = L.rows() + (rank == P - 1 ? 1 : 0);
  std::vector<float> q(2 * rows * 8, 0.5f), kv(2 * L.rows() * 8, 0.25f);
  std::vector<float> out(2 * L.rows() * 8, 3.0f);
  RingOptions ro;
  ro.seq_len = n;
  bool threw = false;
  try {
    softdot::mpi::ring_attention(
        MPI_COMM_WORLD, TensorView<const float>(q.data(), 1, 2, rows, 8),
        TensorView<const float>(kv.data(), 1, 2, L.rows(), 8),
        TensorView<const float>(kv.data(), 1, 2, L.rows(), 8),
        TensorView<float>(out.data(), 1, 2, L.rows(), 8), ro);
  } catch (const std::invalid_argument& e) {
    const std::string m = e.what();
    threw =
        m.find("rank " + std::to_string(P - 1) + ":") == 0 &&
        m.find("ring_attention") != std::string::npos &&
        m.find("q [1, 2, " + std::to_string(L.rows() + 1)) != std::string::npos;
    MPI_EXPECT_MSG(threw, "message: " + m);
  }
  MPI_EXPECT(threw);
  for (float e : out) MPI_EXPECT(e == 3.0f);  // nothing written
}

// Each option differing on rank 1 only (every field of the ranks'
// fingerprint that a caller can set): every rank throws, naming it.
void options_differ() {
  const int P = world_size(), rank = world_rank();
  if (P == 1) return;
  const std::size_t n = 16;
  const RingLayout L = softdot::mpi::ring_layout(n, P, Layout::contiguous);
  std::vector<float> x(2 * L.rows() * 4, 0.5f), out(2 * L.rows() * 4);
  const bool odd = rank == 1;
  const std::vector<float> s2 = {0.25f, odd ? 0.75f : 0.5f};
  struct Opt {
    const char* name;
    void (*set)(AttentionOptions&, bool odd, std::span<const float> s2);
  };
  const Opt opts[] = {
      {"causal", [](AttentionOptions& o, bool b, auto) { o.causal = b; }},
      {"window_left",
       [](AttentionOptions& o, bool b, auto) { o.window_left = b ? 3 : 4; }},
      {"window_right",
       [](AttentionOptions& o, bool b, auto) { o.window_right = b ? 3 : -1; }},
      {"scale",
       [](AttentionOptions& o, bool b, auto) {
         o.scale = b ? std::optional<double>(0.5) : std::nullopt;
       }},
      {"softcap",
       [](AttentionOptions& o, bool b, auto) { o.softcap = b ? 2.0f : 3.0f; }},
      {"precise", [](AttentionOptions& o, bool b, auto) { o.precise = b; }},
      {"alibi_slopes values",
       [](AttentionOptions& o, bool, auto s) { o.alibi_slopes = s; }},
      {"sinks values", [](AttentionOptions& o, bool, auto s) { o.sinks = s; }},
      {"alibi_slopes",
       [](AttentionOptions& o, bool b, auto s) {
         if (b) o.alibi_slopes = s;
       }},
  };
  for (const Opt& op : opts) {
    RingOptions ro;
    ro.seq_len = n;
    ro.layout = Layout::contiguous;
    op.set(ro.attention, odd, s2);
    bool threw = false;
    std::string m;
    try {
      const TensorView<const float> t(x.data(), 1, 2, L.rows(), 4);
      softdot::mpi::ring_attention(
          MPI_COMM_WORLD, t, t, t,
          TensorView<float>(out.data(), 1, 2, L.rows(), 4), ro);
    } catch (const std::invalid_argument& e) {
      m = e.what();
      threw = m.find(std::string("options.attention.") + op.name +
                     " differs") != std::string::npos;
    }
    MPI_EXPECT_MSG(threw, std::string(op.name) + ": " + m);
  }
}

void layouts() {
  // zigzag: rank r holds chunks r and 2P - 1 - r; padded at the end.
  const RingLayout z = softdot::mpi::ring_layout(10, 2, Layout::zigzag);
  MPI_EXPECT(z.chunk == 3 && z.rows() == 6);
  MPI_EXPECT((z.positions(0) == std::vector<std::size_t>{0, 1, 2, 9, 10, 11}));
  MPI_EXPECT((z.positions(1) == std::vector<std::size_t>{3, 4, 5, 6, 7, 8}));
  const RingLayout c = softdot::mpi::ring_layout(10, 3, Layout::contiguous);
  MPI_EXPECT(c.chunk == 4 && c.rows() == 4);
  MPI_EXPECT((c.positions(2) == std::vector<std::size_t>{8, 9, 10, 11}));
  const RingLayout d = softdot::mpi::ring_layout(100, 2, Layout::zigzag, true);
  MPI_EXPECT(d.chunk == 64);
  bool threw = false;
  try {
    (void)softdot::mpi::ring_layout(0, 2, Layout::zigzag);
  } catch (const std::invalid_argument&) {
    threw = true;
  }
  MPI_EXPECT(threw);
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  std::vector<softdot_test::TestCase> cases = {{"layouts", layouts}};
  std::vector<Case> cs;
  for (bool det : {false, true}) {
    for (Layout lay : {Layout::zigzag, Layout::contiguous}) {
      for (bool causal : {false, true}) {
        Case c{.name = "plain"};
        c.layout = lay;
        c.causal = causal;
        c.det = det;
        c.n = det ? 150 : 37;
        cs.push_back(c);
      }
    }
    // Many blocks and spread scores: the merges' rounding shows in the
    // float results, so the order of the merges is visible in the bits.
    Case lng{.name = "long_n700_d64"};
    lng.n = 700, lng.d = 64, lng.dv = 32, lng.q_amp = 4.0f, lng.det = det;
    cs.push_back(lng);
    // Chunks of more than 256 rows: the ring cuts them into pieces.
    Case pc{.name = "long_pieces_n1100"};
    pc.n = 1100, pc.d = 32, pc.dv = 16, pc.H = 2, pc.Hkv = 1, pc.det = det;
    pc.layout = Layout::contiguous, pc.causal = true, pc.sinks = true;
    pc.mask = pc.bias = true;
    cs.push_back(pc);
    Case gqa{.name = "gqa_causal_n101"};
    gqa.n = 101, gqa.H = 4, gqa.Hkv = 1, gqa.B = 2, gqa.causal = true,
    gqa.det = det;
    cs.push_back(gqa);
    Case m{.name = "mask_bias_masked_row"};
    m.mask = m.bias = true, m.causal = true, m.det = det, m.n = 45;
    cs.push_back(m);
    Case w{.name = "window_softcap_sinks"};
    w.wl = 7, w.wr = 2, w.softcap = 5.0f, w.sinks = true, w.det = det, w.n = 90;
    cs.push_back(w);
    for (KV kv : {kF16, kBF16, kI8}) {
      Case t{.name = kv == kF16 ? "f16" : kv == kBF16 ? "bf16" : "int8"};
      t.kv = kv, t.causal = true, t.n = 70, t.det = det, t.H = 4, t.Hkv = 2;
      cs.push_back(t);
    }
    // ALiBi: the slopes times global positions on every step of the ring.
    Case al{.name = "alibi_causal_n301"};
    al.alibi = true, al.causal = true, al.n = 301, al.d = 32, al.det = det;
    cs.push_back(al);
    Case alw{.name = "alibi_window_softcap_scale_mask_gqa"};
    alw.alibi = true, alw.wl = 20, alw.wr = 5, alw.softcap = 3.0f;
    alw.scale = 0.2, alw.mask = true, alw.H = 4, alw.Hkv = 2, alw.n = 77;
    alw.det = det, alw.layout = Layout::contiguous;
    cs.push_back(alw);
    if (!det) {
      Case pr{.name = "precise_scale_sinks"};
      pr.precise = true, pr.scale = 0.7, pr.sinks = true, pr.causal = true;
      pr.n = 60, pr.q_amp = 3.0f;
      cs.push_back(pr);
    }
    Case nan{.name = "nan_key"};
    nan.nan_key = 29, nan.causal = true, nan.n = 41, nan.det = det;
    cs.push_back(nan);
    Case nanp{.name = "nan_key_not_causal"};
    nanp.nan_key = 3, nanp.n = 33, nanp.det = det,
    nanp.layout = Layout::contiguous;
    cs.push_back(nanp);
  }
  static std::vector<std::string> names;
  names.reserve(cs.size());
  for (const Case& c : cs) {
    names.push_back(std::string(c.name) + (c.det ? " det" : "") +
                    (c.layout == Layout::zigzag ? " zigzag" : " contiguous") +
                    (c.causal ? " causal" : ""));
    Case cc = c;
    cases.push_back({names.back().c_str(), [cc] { run_case(cc); }});
  }
  cases.push_back({"bad_shape_on_one_rank", bad_shape_on_one_rank});
  cases.push_back({"options_differ", options_differ});
  const int rc = softdot_test::run_cases(cases);
  MPI_Finalize();
  return rc;
}
