// softdot_reference: the long-double attention reference (see the header).
#include "attention_reference.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

namespace softdot_ref {
namespace {

using LD = long double;
constexpr double kU = 0x1p-24;

// The underflow term of attention.h's bound: weights, partial sums and the
// output below 2^-126 are subnormal floats, spaced 2^-149 apart, so each may
// be off by an absolute 2^-150: 2^-149 (n_kv + 1 + sum_j |V_jc|).
double underflow_term(std::size_t n_kv, LD abs_v_sum) {
  return 0x1p-149 * double(LD(n_kv) + 1 + abs_v_sum);
}
constexpr LD kNaNL = std::numeric_limits<LD>::quiet_NaN();
constexpr LD kInfL = std::numeric_limits<LD>::infinity();

// A compensated (TwoSum) long-double sum, in the order of the additions.
struct Sum {
  LD s = 0, c = 0;
  void add(LD x) {
    const LD t = s + x;
    const LD bp = t - s;
    const LD e = (s - (t - bp)) + (x - bp);
    s = t;
    c += e;
  }
  LD value() const {
    // Inf / NaN terms make the compensation NaN; the plain sum is right then.
    if (!std::isfinite(s)) return s;
    return s + c;
  }
};

}  // namespace

float attention_scale(double scale, std::size_t d) {
  if (std::isnan(scale)) {
    return static_cast<float>(1.0L / std::sqrt(static_cast<LD>(d)));
  }
  return static_cast<float>(scale);
}

std::size_t attention_dot_roundings(std::size_t d) {
  constexpr std::size_t kBlock = 16;
  return std::min(d, kBlock) + (d + kBlock - 1) / kBlock - 1;
}

bool attention_position_visible(const AttnRefOptions& o, std::size_t n_q,
                                std::size_t n_kv, std::size_t i,
                                std::size_t j) {
  const std::size_t end = std::min(o.kv_end, n_kv);
  if (j < o.kv_begin || j >= end) return false;
  const std::ptrdiff_t p = static_cast<std::ptrdiff_t>(i) +
                           static_cast<std::ptrdiff_t>(n_kv) -
                           static_cast<std::ptrdiff_t>(n_q);
  const std::ptrdiff_t jj = static_cast<std::ptrdiff_t>(j);
  if (o.causal && jj > p) return false;
  if (o.window_left >= 0 && jj < p - o.window_left) return false;
  if (o.window_right >= 0 && jj > p + o.window_right) return false;
  return true;
}

AttnRef attention_reference(const AttnTensor<float>& q,
                            const AttnTensor<float>& k,
                            const AttnTensor<float>& v, const AttnRefOptions& o,
                            bool want_weights) {
  const std::size_t B = q.batch, H = q.heads, n_q = q.rows, d = q.cols;
  const std::size_t H_kv = k.heads, n_kv = k.rows, d_v = v.cols;
  assert(k.batch == B && v.batch == B && v.heads == H_kv && v.rows == n_kv &&
         k.cols == d && H_kv > 0 && H % H_kv == 0);
  const std::size_t group = H / H_kv;

  AttnRef r;
  r.batch = B;
  r.heads = H;
  r.n_q = n_q;
  r.n_kv = n_kv;
  r.d_v = d_v;
  r.scale = attention_scale(o.scale, d);
  const LD scale = r.scale;
  const double n_d = double(attention_dot_roundings(d));
  const double gamma_d = n_d * kU / (1.0 - n_d * kU);
  // The precise scores' double chain and scale multiply: d + 1 roundings of
  // 2^-53.
  const double gamma_p =
      double(d + 1) * 0x1p-53 / (1.0 - double(d + 1) * 0x1p-53);
  r.out.assign(B * H * n_q * d_v, 0);
  r.W.assign(B * H * n_q * d_v, 0);
  r.bound.assign(B * H * n_q * d_v, 0);
  r.lse.assign(B * H * n_q, -kInfL);
  r.D.assign(B * H * n_q, 0);
  r.visible.assign(B * H * n_q, 0);
  r.inf_scores.assign(B * H * n_q, 0);
  if (want_weights) r.weights.assign(B * H * n_q * n_kv, 0);

  std::vector<std::size_t> js;
  std::vector<LD> s, e;
  std::vector<Sum> acc, absacc;
  std::vector<LD> absv;
  for (std::size_t b = 0; b < B; ++b) {
    for (std::size_t h = 0; h < H; ++h) {
      const std::size_t hk = h / group;
      const bool has_sink = !o.sinks.empty();
      const LD sink = has_sink ? LD(o.sinks[h]) : -kInfL;
      for (std::size_t i = 0; i < n_q; ++i) {
        const std::size_t row = r.li(b, h, i);
        js.clear();
        s.clear();
        double D = 0;
        bool any_nan = false;
        std::size_t n_inf = 0;
        for (std::size_t j = 0; j < n_kv; ++j) {
          if (!attention_position_visible(o, n_q, n_kv, i, j)) continue;
          if (o.mask.data != nullptr && !o.mask.at_bcast(b, h, i, j)) continue;
          Sum dot;
          Sum abs;
          for (std::size_t c = 0; c < d; ++c) {
            const LD prod = LD(q.at(b, h, i, c)) * LD(k.at(b, hk, j, c));
            dot.add(prod);
            abs.add(std::fabs(prod));
          }
          const LD sp = dot.value() * scale;  // s'
          LD sc = sp;
          if (o.softcap > 0) {
            sc = LD(o.softcap) * std::tanh(sp / LD(o.softcap));
          }
          LD sf = sc;
          if (o.bias.data) sf += LD(o.bias.at_bcast(b, h, i, j));
          if (sf == -kInfL) continue;  // masked by the bias (or the score)
          if (std::isnan(sf)) any_nan = true;
          if (sf == kInfL) ++n_inf;
          js.push_back(j);
          s.push_back(sf);
          double dj = double(scale * gamma_d * abs.value()) +
                      2 * kU * double(std::fabs(sp) + std::fabs(sf));
          if (o.precise) {
            const double big =
                std::max({double(std::fabs(sp)), double(std::fabs(sf)),
                          has_sink ? double(std::fabs(sink)) : 0.0});
            dj = double(scale * gamma_p * abs.value()) + 12 * kU * kU * big;
            if (o.softcap > 0) {
              dj += 2 * kU * double(std::fabs(sp) + std::fabs(sf));
            }
          }
          if (!(dj <= D)) D = dj;  // NaN propagates
        }
        if (o.softcap > 0) D += 4 * kU * double(o.softcap);
        r.visible[row] = js.size();
        r.inf_scores[row] = n_inf;
        if (std::isnan(sink)) any_nan = true;

        auto set_row = [&](auto f) {
          for (std::size_t c = 0; c < d_v; ++c) {
            r.out[r.oi(b, h, i, c)] = f(c);
          }
        };
        if (any_nan) {
          set_row([](std::size_t) { return kNaNL; });
          r.lse[row] = kNaNL;
          r.D[row] = std::numeric_limits<double>::quiet_NaN();
          if (want_weights) {
            for (std::size_t j = 0; j < n_kv; ++j) {
              r.weights[r.wi(b, h, i, j)] = kNaNL;
            }
          }
          for (std::size_t c = 0; c < d_v; ++c) {
            r.W[r.oi(b, h, i, c)] = std::numeric_limits<double>::quiet_NaN();
            r.bound[r.oi(b, h, i, c)] =
                std::numeric_limits<double>::quiet_NaN();
          }
          continue;
        }
        if (js.empty() && !(sink > -kInfL)) {
          // Fully masked: zeros, lse -inf (already set).
          continue;
        }
        if (n_inf > 0 || sink == kInfL) {
          // The limit: the +inf scores share the weight equally (a +inf
          // sink takes it all: zeros).
          const LD w = sink == kInfL ? LD(0) : LD(1) / LD(n_inf);
          r.lse[row] = kInfL;
          r.D[row] = 0;
          for (std::size_t c = 0; c < d_v; ++c) {
            Sum mean, absmean;
            LD absv = 0;
            for (std::size_t t = 0; t < js.size(); ++t) {
              absv += std::fabs(LD(v.at(b, hk, js[t], c)));
              if (s[t] != kInfL || w == 0) continue;
              const LD x = v.at(b, hk, js[t], c);
              mean.add(w * x);
              absmean.add(w * std::fabs(x));
            }
            const std::size_t oi = r.oi(b, h, i, c);
            r.out[oi] = mean.value();
            r.W[oi] = double(absmean.value());
            r.bound[oi] = 70 * kU * r.W[oi] +
                          kU * double(std::fabs(r.out[oi])) +
                          underflow_term(n_kv, absv);
          }
          if (want_weights) {
            for (std::size_t t = 0; t < js.size(); ++t) {
              r.weights[r.wi(b, h, i, js[t])] = s[t] == kInfL ? w : LD(0);
            }
          }
          continue;
        }
        LD m = sink;
        for (LD x : s) m = std::max(m, x);
        e.resize(s.size());
        Sum S;
        for (std::size_t t = 0; t < s.size(); ++t) {
          e[t] = std::exp(s[t] - m);
          S.add(e[t]);
        }
        if (has_sink && sink > -kInfL) S.add(std::exp(sink - m));
        const LD sum = S.value();
        r.lse[row] = m + std::log(sum);
        r.D[row] = D;
        // Key-major, so that V is read by rows.
        acc.assign(d_v, Sum{});
        absacc.assign(d_v, Sum{});
        absv.assign(d_v, LD(0));
        for (std::size_t t = 0; t < js.size(); ++t) {
          const float* vr = &v.at(b, hk, js[t], 0);
          for (std::size_t c = 0; c < d_v; ++c) {
            const LD x = vr[c];
            acc[c].add(e[t] * x);
            absacc[c].add(e[t] * std::fabs(x));
            absv[c] += std::fabs(x);
          }
        }
        for (std::size_t c = 0; c < d_v; ++c) {
          const std::size_t oi = r.oi(b, h, i, c);
          r.out[oi] = acc[c].value() / sum;
          r.W[oi] = double(absacc[c].value() / sum);
          r.bound[oi] = (2 * D + 70 * kU) * r.W[oi] +
                        kU * double(std::fabs(r.out[oi])) +
                        underflow_term(n_kv, absv[c]);
        }
        if (want_weights) {
          for (std::size_t t = 0; t < js.size(); ++t) {
            r.weights[r.wi(b, h, i, js[t])] = e[t] / sum;
          }
        }
      }
    }
  }
  return r;
}

}  // namespace softdot_ref
