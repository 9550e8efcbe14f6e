// softdot::mpi::ring_attention_backward against the one-process
// attention_backward() on the whole sequence. Every rank builds the same
// full inputs (a fixed seed), runs the one-process forward and backward,
// takes the rows of its own positions (padding rows hold NaN, which must
// never reach a real row), runs the ring backward twice and checks its rows:
//   - every mode: each gradient element within 40 u of its condition (the
//     sum of its terms' magnitudes, from the reference's exact weights) plus
//     one float rounding of attention_backward()'s: the ring computes the
//     same float terms (the scores, P, dP and dS of each pair are the same
//     bits) and only groups the 16-term float chains and the double sums
//     otherwise; dbias (one dS per element) bitwise attention_backward()'s;
//     the same bits on a second run; padding rows +0;
//   - not deterministic, P = 1, contiguous: bitwise attention_backward();
//   - deterministic: bitwise the one-process sum of the kRingBlock x
//     kRingBlock block pairs' partials by binary trees over the block
//     indices (computed here without MPI), which does not depend on P: so
//     the gradients are the same bits for every P.
#include <mpi.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "attention_reference.h"
#include "mpi_test_util.h"
#include "softdot/attention.h"
#include "softdot/mpi.h"

namespace {

using softdot::AttentionGradientPartial;
using softdot::AttentionGradients;
using softdot::AttentionOptions;
using softdot::TensorView;
using softdot::mpi::kRingBlock;
using softdot::mpi::Layout;
using softdot::mpi::RingLayout;
using softdot::mpi::RingOptions;
using softdot_test::world_rank;
using softdot_test::world_size;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr double kU = 1.0 / 16777216.0;  // 2^-24

struct Case {
  const char* name;
  std::size_t n = 37, B = 1, H = 2, Hkv = 2, d = 16, dv = 8;
  Layout layout = Layout::zigzag;
  bool causal = false;
  std::ptrdiff_t wl = -1, wr = -1;
  bool mask = false, bias = false, sinks = false, dlse = false;
  bool alibi = false;  // ALiBi slopes, one per query head
  double scale = std::numeric_limits<double>::quiet_NaN();
  float softcap = 0.0f;
  bool det = false;
  // Rows 3 and n - 9: queries 0 (uniform weights) and dout +-2^33 times one
  // vector, so that dK and dV cancel: the sums' order shows in the bits.
  bool cancel = false;
};

std::vector<float> random(std::size_t n, std::mt19937& g, float lo, float hi) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> x(n);
  for (float& e : x) e = u(g);
  return x;
}

// Rows at `pos` of a [B, H, n, cols] tensor; padding rows get `fill`.
template <class T>
std::vector<T> take_rows(const std::vector<T>& full, std::size_t BH,
                         std::size_t n, std::size_t cols,
                         const std::vector<std::size_t>& pos, T fill) {
  std::vector<T> out(BH * pos.size() * cols, fill);
  for (std::size_t b = 0; b < BH; ++b) {
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

bool hidden(const Case& c, std::size_t q0, std::size_t q1, std::size_t k0,
            std::size_t k1) {
  const long long wr = c.causal ? 0 : c.wr, wl = c.wl;
  if (wr >= 0 && static_cast<long long>(k0) > static_cast<long long>(q1) + wr)
    return true;
  if (wl >= 0 && static_cast<long long>(k1) < static_cast<long long>(q0) - wl)
    return true;
  return false;
}

using Node = std::optional<std::vector<double>>;

// The tree of the deterministic mode over leaves (padded to a power of
// two with empty ones), each node the elementwise sum of its children.
Node tree_sum(std::vector<Node> level) {
  std::size_t leaves = 1;
  while (leaves < level.size()) leaves *= 2;
  level.resize(leaves);
  while (level.size() > 1) {
    std::vector<Node> up;
    for (std::size_t i = 0; i < level.size(); i += 2) {
      Node a = std::move(level[i]), b = std::move(level[i + 1]);
      if (!a) {
        up.push_back(std::move(b));
      } else {
        if (b)
          for (std::size_t x = 0; x < a->size(); ++x) (*a)[x] += (*b)[x];
        up.push_back(std::move(a));
      }
    }
    level = std::move(up);
  }
  return std::move(level[0]);
}

struct Full {
  std::vector<float> dq, dk, dv, dbias, dsinks;
};

void run_case(const Case& c) {
  const int P = world_size(), rank = world_rank();
  std::mt19937 g(4321 + static_cast<unsigned>(c.n));
  const std::size_t n = c.n, H = c.H, B = c.B, Hkv = c.Hkv, d = c.d, dv = c.dv;
  std::vector<float> q = random(B * H * n * d, g, -1.5f, 1.5f);
  const std::vector<float> k = random(B * Hkv * n * d, g, -1.5f, 1.5f);
  const std::vector<float> v = random(B * Hkv * n * dv, g, -1.0f, 1.0f);
  std::vector<float> dout = random(B * H * n * dv, g, -1.0f, 1.0f);
  if (c.cancel) {
    const std::vector<float> w = random(dv, g, 0.5f, 1.0f);
    for (std::size_t bh = 0; bh < B * H; ++bh) {
      for (std::size_t x = 0; x < d; ++x) {
        q[(bh * n + 3) * d + x] = 0.0f;
        q[(bh * n + n - 9) * d + x] = 0.0f;
      }
      for (std::size_t x = 0; x < dv; ++x) {
        dout[(bh * n + 3) * dv + x] = std::ldexp(w[x], 33);
        dout[(bh * n + n - 9) * dv + x] = -std::ldexp(w[x], 33);
      }
    }
  }
  std::vector<float> dlse;
  if (c.dlse) dlse = random(B * H * n, g, -0.5f, 0.5f);
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
  const bool want_dbias = c.bias;

  // One process: the forward and the backward of the whole sequence.
  const TensorView<const float> qv(q.data(), B, H, n, d);
  const TensorView<const float> kv(k.data(), B, Hkv, n, d);
  const TensorView<const float> vv(v.data(), B, Hkv, n, dv);
  const TensorView<const float> dov(dout.data(), B, H, n, dv);
  std::vector<float> out(B * H * n * dv), lse(B * H * n);
  softdot::attention(qv, kv, vv, TensorView<float>(out.data(), B, H, n, dv), ao,
                     lse.data());
  const TensorView<const float> ov(out.data(), B, H, n, dv);
  Full one;
  one.dq.resize(B * H * n * d);
  one.dk.resize(B * Hkv * n * d);
  one.dv.resize(B * Hkv * n * dv);
  AttentionGradients og;
  og.dq = TensorView<float>(one.dq.data(), B, H, n, d);
  og.dk = TensorView<float>(one.dk.data(), B, Hkv, n, d);
  og.dv = TensorView<float>(one.dv.data(), B, Hkv, n, dv);
  if (want_dbias) {
    one.dbias.resize(B * H * n * n);
    og.dbias = TensorView<float>(one.dbias.data(), B, H, n, n);
  }
  if (c.sinks) {
    one.dsinks.resize(H);
    og.dsinks = one.dsinks;
  }
  softdot::attention_backward(qv, kv, vv, ov, lse.data(), dov, og, ao,
                              c.dlse ? dlse.data() : nullptr);
  const float scale = softdot_ref::attention_scale(ao.scale, d);

  // Delta_i = sum dO O (terms with O = 0 skipped) - dlse, as the library.
  std::vector<double> delta(B * H * n, 0.0);
  for (std::size_t r = 0; r < B * H * n; ++r) {
    for (std::size_t x = 0; x < dv; ++x)
      if (out[r * dv + x] != 0.0f)
        delta[r] += double(out[r * dv + x]) * double(dout[r * dv + x]);
    if (c.dlse) delta[r] -= double(dlse[r]);
  }

  // The deterministic reference: the block pairs alone, summed by trees.
  Full det;
  if (c.det) {
    const std::size_t nb = (n + kRingBlock - 1) / kRingBlock;
    std::vector<std::vector<Node>> dq_leaves(nb, std::vector<Node>(nb)),
        dkv_leaves(nb, std::vector<Node>(nb));
    for (std::size_t qb = 0; qb < nb; ++qb) {
      const std::size_t q0 = qb * kRingBlock, qr = std::min(kRingBlock, n - q0);
      std::vector<float> lse_b(B * H * qr), dlse_b;
      for (std::size_t bh = 0; bh < B * H; ++bh)
        std::memcpy(&lse_b[bh * qr], &lse[bh * n + q0], qr * sizeof(float));
      if (c.dlse) {
        dlse_b.resize(B * H * qr);
        for (std::size_t bh = 0; bh < B * H; ++bh)
          std::memcpy(&dlse_b[bh * qr], &dlse[bh * n + q0], qr * sizeof(float));
      }
      auto rows = [&](const TensorView<const float>& t, std::size_t r0,
                      std::size_t cnt) {
        TensorView<const float> s = t;
        s.data += r0 * t.row_stride;
        s.rows = cnt;
        return s;
      };
      for (std::size_t kb = 0; kb < nb; ++kb) {
        const std::size_t k0 = kb * kRingBlock,
                          kr = std::min(kRingBlock, n - k0);
        if (hidden(c, q0, q0 + qr - 1, k0, k0 + kr - 1)) continue;
        auto part = AttentionGradientPartial::zeros(B, H, Hkv, qr, kr, d, dv);
        AttentionOptions po = ao;
        po.sinks = {};
        po.q_position = q0;
        po.kv_position = k0;
        if (c.mask) {
          po.mask.data += q0 * po.mask.row_stride;
          po.mask.rows = qr;
        }
        if (c.bias) {
          po.bias.data += q0 * po.bias.row_stride;
          po.bias.rows = qr;
        }
        softdot::attention_backward_partial(
            rows(qv, q0, qr), rows(kv, k0, kr), rows(vv, k0, kr),
            rows(ov, q0, qr), lse_b.data(), rows(dov, q0, qr), part, po, {},
            c.dlse ? dlse_b.data() : nullptr);
        dq_leaves[qb][kb] = std::move(part.dq);
        std::vector<double> kvs = std::move(part.dk);
        kvs.insert(kvs.end(), part.dv_sum.begin(), part.dv_sum.end());
        dkv_leaves[kb][qb] = std::move(kvs);
      }
    }
    det.dq.assign(B * H * n * d, 0.0f);
    det.dk.assign(B * Hkv * n * d, 0.0f);
    det.dv.assign(B * Hkv * n * dv, 0.0f);
    for (std::size_t qb = 0; qb < nb; ++qb) {
      const std::size_t q0 = qb * kRingBlock, qr = std::min(kRingBlock, n - q0);
      const Node root = tree_sum(dq_leaves[qb]);
      if (!root) continue;
      for (std::size_t bh = 0; bh < B * H; ++bh)
        for (std::size_t i = 0; i < qr; ++i)
          for (std::size_t x = 0; x < d; ++x)
            det.dq[(bh * n + q0 + i) * d + x] =
                float(double(scale) * (*root)[(bh * qr + i) * d + x]);
    }
    for (std::size_t kb = 0; kb < nb; ++kb) {
      const std::size_t k0 = kb * kRingBlock, kr = std::min(kRingBlock, n - k0);
      const Node root = tree_sum(dkv_leaves[kb]);
      if (!root) continue;
      const std::size_t nk = B * Hkv * kr * d;
      for (std::size_t bh = 0; bh < B * Hkv; ++bh)
        for (std::size_t j = 0; j < kr; ++j) {
          for (std::size_t x = 0; x < d; ++x)
            det.dk[(bh * n + k0 + j) * d + x] =
                float(double(scale) * (*root)[(bh * kr + j) * d + x]);
          for (std::size_t x = 0; x < dv; ++x)
            det.dv[(bh * n + k0 + j) * dv + x] =
                float((*root)[nk + (bh * kr + j) * dv + x]);
        }
    }
    if (c.sinks) {
      std::vector<Node> leaves(nb);
      for (std::size_t qb = 0; qb < nb; ++qb) {
        const std::size_t q0 = qb * kRingBlock,
                          qr = std::min(kRingBlock, n - q0);
        std::vector<double> s(H, 0.0);
        for (std::size_t h = 0; h < H; ++h)
          for (std::size_t b = 0; b < B; ++b)
            for (std::size_t i = q0; i < q0 + qr; ++i) {
              const std::size_t r = (b * H + h) * n + i;
              const double ps = std::exp(double(sinks[h]) - double(lse[r]));
              if (ps != 0.0 || std::isnan(delta[r])) s[h] -= ps * delta[r];
            }
        leaves[qb] = std::move(s);
      }
      const Node root = tree_sum(std::move(leaves));
      det.dsinks.assign(H, 0.0f);
      for (std::size_t h = 0; h < H; ++h) det.dsinks[h] = float((*root)[h]);
    }
  }

  // The condition of each element: the sum of its terms' magnitudes, with
  // the exact weights P and |dS_ij| <= P_ij (|dP_ij| + |Delta_i|).
  std::vector<double> cq(one.dq.size(), 0.0), ck(one.dk.size(), 0.0),
      cv(one.dv.size(), 0.0), cs(H, 0.0);
  {
    auto view = [&](const std::vector<float>& x, std::size_t h,
                    std::size_t cols) {
      return softdot_ref::AttnTensor<float>{
          x.data(), B, h, n, cols, h * n * cols, n * cols, cols};
    };
    softdot_ref::AttnRefOptions r;
    r.scale = c.scale;
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
    // ALiBi is the bias slope_h (j - i), rounded once to float.
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
        view(q, H, d), view(k, Hkv, d), view(v, Hkv, dv), r, true);
    const std::size_t grp = H / Hkv;
    for (std::size_t b = 0; b < B; ++b)
      for (std::size_t h = 0; h < H; ++h)
        for (std::size_t i = 0; i < n; ++i) {
          const std::size_t row = (b * H + h) * n + i, kh = h / grp;
          const double ad = std::fabs(delta[row]) +
                            (c.dlse ? std::fabs(double(dlse[row])) : 0.0);
          if (c.sinks && std::isfinite(double(lse[row])))
            cs[h] += std::exp(double(sinks[h]) - double(lse[row])) * ad;
          for (std::size_t j = 0; j < n; ++j) {
            const double p = double(e.weights[e.wi(b, h, i, j)]);
            if (p == 0.0) continue;
            double dp = 0.0;
            for (std::size_t x = 0; x < dv; ++x)
              dp += double(dout[row * dv + x]) *
                    double(v[((b * Hkv + kh) * n + j) * dv + x]);
            const double ds = p * (std::fabs(dp) + ad);
            const std::size_t key = (b * Hkv + kh) * n + j;
            for (std::size_t x = 0; x < d; ++x) {
              cq[row * d + x] += double(scale) * ds * std::fabs(k[key * d + x]);
              ck[key * d + x] += double(scale) * ds * std::fabs(q[row * d + x]);
            }
            for (std::size_t x = 0; x < dv; ++x)
              cv[key * dv + x] += p * std::fabs(dout[row * dv + x]);
          }
        }
  }

  // This rank's rows, and the ring backward (twice).
  const RingLayout L = softdot::mpi::ring_layout(n, P, c.layout, c.det);
  const std::vector<std::size_t> pos = L.positions(rank);
  const std::size_t rows = L.rows();
  const std::vector<float> lq = take_rows(q, B * H, n, d, pos, kNaN);
  const std::vector<float> lk = take_rows(k, B * Hkv, n, d, pos, kNaN);
  const std::vector<float> lv = take_rows(v, B * Hkv, n, dv, pos, kNaN);
  const std::vector<float> lo = take_rows(out, B * H, n, dv, pos, kNaN);
  const std::vector<float> ldo = take_rows(dout, B * H, n, dv, pos, kNaN);
  const std::vector<float> llse = take_rows(lse, B * H, n, 1, pos, kNaN);
  std::vector<float> ldlse;
  if (c.dlse) ldlse = take_rows(dlse, B * H, n, 1, pos, kNaN);
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
    lbias = take_rows(bias_full, B, n, n, pos, kNaN);
    ro.attention.bias = TensorView<const float>(lbias.data(), B, 1, rows, n);
  }
  Full got[2];
  for (int run = 0; run < 2; ++run) {
    Full& r = got[run];
    r.dq.assign(B * H * rows * d, 7.0f);
    r.dk.assign(B * Hkv * rows * d, 7.0f);
    r.dv.assign(B * Hkv * rows * dv, 7.0f);
    AttentionGradients rg;
    rg.dq = TensorView<float>(r.dq.data(), B, H, rows, d);
    rg.dk = TensorView<float>(r.dk.data(), B, Hkv, rows, d);
    rg.dv = TensorView<float>(r.dv.data(), B, Hkv, rows, dv);
    if (want_dbias) {
      r.dbias.assign(B * H * rows * n, 7.0f);
      rg.dbias = TensorView<float>(r.dbias.data(), B, H, rows, n);
    }
    if (c.sinks) {
      r.dsinks.assign(H, 7.0f);
      rg.dsinks = r.dsinks;
    }
    softdot::mpi::ring_attention_backward(
        MPI_COMM_WORLD, TensorView<const float>(lq.data(), B, H, rows, d),
        TensorView<const float>(lk.data(), B, Hkv, rows, d),
        TensorView<const float>(lv.data(), B, Hkv, rows, dv),
        TensorView<const float>(lo.data(), B, H, rows, dv), llse.data(),
        TensorView<const float>(ldo.data(), B, H, rows, dv), rg, ro,
        c.dlse ? ldlse.data() : nullptr);
  }

  int bad = 0;
  auto report = [&](const std::string& what) {
    if (++bad <= 6)
      softdot_test::fail(__FILE__, __LINE__, std::string(c.name) + ": " + what);
  };
  const bool exact = !c.det && P == 1 && c.layout == Layout::contiguous;
  // One gradient: rows of heads `heads` ([BH, rows, cols] locally, [BH, n,
  // cols] whole).
  auto check =
      [&](const char* name, const std::vector<float>& mine,
          const std::vector<float>& mine2, const std::vector<float>& whole,
          const std::vector<float>& detw, const std::vector<double>& cond,
          std::size_t BH, std::size_t cols) {
        for (std::size_t bh = 0; bh < BH; ++bh) {
          for (std::size_t i = 0; i < rows; ++i) {
            for (std::size_t x = 0; x < cols; ++x) {
              const std::size_t at = (bh * rows + i) * cols + x;
              const float gv = mine[at];
              const std::string where =
                  std::string(name) + " (bh " + std::to_string(bh) + ", pos " +
                  std::to_string(pos[i]) + ", " + std::to_string(x) + ")";
              if (!same_bits(gv, mine2[at]))
                report(where + " differs run to run");
              if (pos[i] >= n) {
                if (!same_bits(gv, 0.0f)) report(where + " padding row not +0");
                continue;
              }
              const std::size_t w = (bh * n + pos[i]) * cols + x;
              const float want = whole[w];
              if (exact && !same_bits(gv, want))
                report(where + " not attention_backward()'s bits: " +
                       std::to_string(gv) + " vs " + std::to_string(want));
              if (c.det && !same_bits(gv, detw[w]))
                report(where + " not the deterministic bits: " +
                       std::to_string(gv) + " vs " + std::to_string(detw[w]));
              const double lim = 40 * kU * cond[w] +
                                 std::ldexp(1.0, -23) * std::fabs(want) + 1e-37;
              if (!(std::fabs(double(gv) - double(want)) <= lim))
                report(where + " " + std::to_string(gv) + " vs " +
                       std::to_string(want) + " beyond " + std::to_string(lim));
            }
          }
        }
      };
  check("dq", got[0].dq, got[1].dq, one.dq, det.dq, cq, B * H, d);
  check("dk", got[0].dk, got[1].dk, one.dk, det.dk, ck, B * Hkv, d);
  check("dv", got[0].dv, got[1].dv, one.dv, det.dv, cv, B * Hkv, dv);
  if (want_dbias) {
    // One dS per element: attention_backward()'s bits in every mode.
    for (std::size_t bh = 0; bh < B * H; ++bh)
      for (std::size_t i = 0; i < rows; ++i)
        for (std::size_t j = 0; j < n; ++j) {
          const float gv = got[0].dbias[(bh * rows + i) * n + j];
          const float want =
              pos[i] < n ? one.dbias[(bh * n + pos[i]) * n + j] : 0.0f;
          if (!same_bits(gv, want) && !(std::isnan(gv) && std::isnan(want)))
            report("dbias (bh " + std::to_string(bh) + ", pos " +
                   std::to_string(pos[i]) + ", key " + std::to_string(j) +
                   ") " + std::to_string(gv) + " vs " + std::to_string(want));
        }
  }
  for (std::size_t h = 0; h < got[0].dsinks.size(); ++h) {
    const float gv = got[0].dsinks[h], want = one.dsinks[h];
    if (!same_bits(gv, got[1].dsinks[h])) report("dsinks differ run to run");
    if (c.det && !same_bits(gv, det.dsinks[h]))
      report("dsinks[" + std::to_string(h) + "] not the deterministic bits");
    const double lim = 1e-12 * cs[h] + std::ldexp(1.0, -23) * std::fabs(want);
    if (!(std::fabs(double(gv) - double(want)) <= lim))
      report("dsinks[" + std::to_string(h) + "] " + std::to_string(gv) +
             " vs " + std::to_string(want));
  }
}

// One rank passes a dq of the wrong rows: every rank throws, naming the
// function, the argument and that rank; nothing is written.
void bad_shape_on_one_rank() {
  const int P = world_size(), rank = world_rank();
  const std::size_t n = 40;
  const RingLayout L = softdot::mpi::ring_layout(n, P, Layout::zigzag);
  const std::size_t rows = L.rows();
  const std::size_t dq_rows = rows + (rank == P - 1 ? 1 : 0);
  std::vector<float> x(2 * rows * 8, 0.5f), lse(2 * rows, 1.0f);
  std::vector<float> dq(2 * dq_rows * 8, 3.0f), dk(2 * rows * 8, 3.0f),
      dv(2 * rows * 8, 3.0f);
  RingOptions ro;
  ro.seq_len = n;
  AttentionGradients gr;
  gr.dq = TensorView<float>(dq.data(), 1, 2, dq_rows, 8);
  gr.dk = TensorView<float>(dk.data(), 1, 2, rows, 8);
  gr.dv = TensorView<float>(dv.data(), 1, 2, rows, 8);
  const TensorView<const float> t(x.data(), 1, 2, rows, 8);
  bool threw = false;
  try {
    softdot::mpi::ring_attention_backward(MPI_COMM_WORLD, t, t, t, t,
                                          lse.data(), t, gr, ro);
  } catch (const std::invalid_argument& e) {
    const std::string m = e.what();
    threw = m.find("rank " + std::to_string(P - 1) + ":") == 0 &&
            m.find("ring_attention_backward") != std::string::npos &&
            m.find("grads.dq [1, 2, " + std::to_string(rows + 1)) !=
                std::string::npos;
    MPI_EXPECT_MSG(threw, "message: " + m);
  }
  MPI_EXPECT(threw);
  for (float e : dq) MPI_EXPECT(e == 3.0f);  // nothing written
  for (float e : dk) MPI_EXPECT(e == 3.0f);
}

// A gradient that overlaps an input (dk over k on rank 0), and dsinks
// without sinks: refused on every rank.
void overlaps_and_dsinks() {
  const int rank = world_rank();
  const std::size_t n = 24;
  const RingLayout L =
      softdot::mpi::ring_layout(n, world_size(), Layout::contiguous);
  const std::size_t rows = L.rows();
  std::vector<float> x(rows * 4, 0.5f), k(rows * 4, 0.25f), lse(rows, 1.0f);
  std::vector<float> dq(rows * 4), dk(rows * 4), dv(rows * 4), ds(1);
  RingOptions ro;
  ro.seq_len = n;
  ro.layout = Layout::contiguous;
  const TensorView<const float> t(x.data(), 1, 1, rows, 4);
  AttentionGradients gr;
  gr.dq = TensorView<float>(dq.data(), 1, 1, rows, 4);
  gr.dk = TensorView<float>(rank == 0 ? k.data() : dk.data(), 1, 1, rows, 4);
  gr.dv = TensorView<float>(dv.data(), 1, 1, rows, 4);
  std::string m;
  try {
    softdot::mpi::ring_attention_backward(
        MPI_COMM_WORLD, t, TensorView<const float>(k.data(), 1, 1, rows, 4), t,
        t, lse.data(), t, gr, ro);
  } catch (const std::invalid_argument& e) {
    m = e.what();
  }
  MPI_EXPECT_MSG(m.find("rank 0: ") == 0 &&
                     m.find("grads.dk overlaps k") != std::string::npos,
                 "message: " + m);
  gr.dk = TensorView<float>(dk.data(), 1, 1, rows, 4);
  gr.dsinks = ds;
  m.clear();
  try {
    softdot::mpi::ring_attention_backward(MPI_COMM_WORLD, t, t, t, t,
                                          lse.data(), t, gr, ro);
  } catch (const std::invalid_argument& e) {
    m = e.what();
  }
  MPI_EXPECT_MSG(m.find("dsinks given but options.attention.sinks is "
                        "empty") != std::string::npos,
                 "message: " + m);
}

// Options that differ between ranks (deterministic on rank 1 only).
void options_differ() {
  const int P = world_size(), rank = world_rank();
  if (P == 1) return;
  const std::size_t n = 128;
  // Both layouts have chunk 64 here for P = 2 (deterministic or not), so
  // the shapes agree and only the option differs.
  if (P != 2) return;
  const RingLayout L = softdot::mpi::ring_layout(n, P, Layout::contiguous);
  const std::size_t rows = L.rows();
  std::vector<float> x(rows * 4, 0.5f), lse(rows, 1.0f);
  std::vector<float> dq(rows * 4), dk(rows * 4), dv(rows * 4);
  RingOptions ro;
  ro.seq_len = n;
  ro.layout = Layout::contiguous;
  ro.deterministic = rank == 1;
  const TensorView<const float> t(x.data(), 1, 1, rows, 4);
  AttentionGradients gr;
  gr.dq = TensorView<float>(dq.data(), 1, 1, rows, 4);
  gr.dk = TensorView<float>(dk.data(), 1, 1, rows, 4);
  gr.dv = TensorView<float>(dv.data(), 1, 1, rows, 4);
  bool threw = false;
  try {
    softdot::mpi::ring_attention_backward(MPI_COMM_WORLD, t, t, t, t,
                                          lse.data(), t, gr, ro);
  } catch (const std::invalid_argument& e) {
    threw = std::string(e.what()).find("deterministic differs") !=
            std::string::npos;
  }
  MPI_EXPECT(threw);
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  std::vector<softdot_test::TestCase> cases;
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
    Case gqa{.name = "gqa_causal"};
    gqa.n = det ? 200 : 101, gqa.H = 4, gqa.Hkv = 1, gqa.B = 2,
    gqa.causal = true, gqa.det = det, gqa.d = 24, gqa.dv = 12;
    cs.push_back(gqa);
    Case gz{.name = "gqa_contiguous"};
    gz.n = 130, gz.H = 4, gz.Hkv = 2, gz.det = det,
    gz.layout = Layout::contiguous;
    cs.push_back(gz);
    Case m{.name = "mask_bias_dbias_masked_row"};
    m.mask = m.bias = true, m.causal = true, m.det = det, m.n = det ? 140 : 45;
    cs.push_back(m);
    Case w{.name = "window_softcap_sinks_dlse"};
    w.wl = 70, w.wr = 5, w.softcap = 5.0f, w.sinks = true, w.dlse = true,
    w.det = det, w.n = det ? 230 : 90;
    cs.push_back(w);
    Case s{.name = "sinks_causal_contiguous"};
    s.sinks = true, s.causal = true, s.det = det, s.n = 170,
    s.layout = Layout::contiguous, s.H = 2, s.Hkv = 1;
    cs.push_back(s);
    // ALiBi: the slopes times global positions on every step of the ring.
    Case al{.name = "alibi_causal_gqa"};
    al.alibi = true, al.causal = true, al.H = 4, al.Hkv = 2, al.det = det;
    al.n = det ? 160 : 101;
    cs.push_back(al);
    Case alw{.name = "alibi_window_softcap_scale_mask_dlse"};
    alw.alibi = true, alw.wl = 40, alw.wr = 3, alw.softcap = 4.0f;
    alw.scale = 0.3, alw.mask = true, alw.dlse = true, alw.det = det;
    alw.n = det ? 150 : 77, alw.layout = Layout::contiguous;
    cs.push_back(alw);
    Case cn{.name = "cancelling_rows"};
    cn.cancel = true, cn.det = det, cn.n = 300, cn.H = 2, cn.Hkv = 1;
    cs.push_back(cn);
    Case cz = cn;
    cz.layout = Layout::contiguous;
    cs.push_back(cz);
  }
  // Chunks of more than 256 rows (P = 2, 3): the queries run in pieces.
  Case pc{.name = "long_pieces_n700"};
  pc.n = 700, pc.d = 32, pc.dv = 16, pc.H = 2, pc.Hkv = 1;
  pc.layout = Layout::contiguous, pc.causal = true, pc.sinks = true;
  cs.push_back(pc);
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
  cases.push_back({"overlaps_and_dsinks", overlaps_and_dsinks});
  cases.push_back({"options_differ", options_differ});
  const int rc = softdot_test::run_cases(cases);
  MPI_Finalize();
  return rc;
}
