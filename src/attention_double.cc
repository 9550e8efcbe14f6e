// softdot: attention() and attention_backward() on float64 tensors: the
// same functions in double arithmetic, as plain loops (gradient checks,
// float64 pipelines; not tuned for speed). The arguments are checked in
// double by the rules every request follows (plan_contiguous), and no
// output may share a byte with an input.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "attention_checks.h"
#include "kernels/attention_args.h"
#include "parallel.h"
#include "softdot/attention.h"
#include "softdot/attention_request.h"

namespace softdot {
namespace {

using namespace detail::attn;
constexpr double kInf = std::numeric_limits<double>::infinity();

// The plan of attention() for these shapes and options: each view checked
// in double (check_tensor), then the shapes and options by the same rules
// as every other request (plan_contiguous), and no output sharing a byte
// with an input (spans in bytes of double).
Plan plan_of(const char* fn, const TensorView<const double>& q,
             const TensorView<const double>& k,
             const TensorView<const double>& v, const TensorView<double>& out,
             const AttentionOptions& o, const char* out_name = "out") {
  check_tensor(fn, "q", q);
  check_tensor(fn, "k", k);
  check_tensor(fn, "v", v);
  if (out_name != nullptr) check_tensor(fn, out_name, out);
  return plan_contiguous(fn, q, k, &v, out, out_name, 0, o);
}

void fail_on_overlap(const char* fn, const std::vector<NamedSpan>& outs,
                     const std::vector<NamedSpan>& ins) {
  const std::string clash = first_overlap(outs, ins);
  if (!clash.empty()) fail(fn, clash + " (no aliasing)");
}

// One row's scores in double: s[j] for the visible keys (-inf elsewhere),
// and the soft-cap's derivative at each.
struct RowScores {
  std::vector<double> s, capd;
  double m = -kInf;  // the largest score (or the sink)
  std::size_t infs = 0;
  bool nan = false;
};

void row_scores(const Plan& p, const AttentionOptions& o, double scale,
                const TensorView<const double>& q,
                const TensorView<const double>& k, std::size_t b, std::size_t h,
                std::size_t i, RowScores& r) {
  const std::size_t n = p.n_kv, kh = h / p.g;
  r.s.assign(n, -kInf);
  r.capd.assign(n, 1.0);
  r.infs = 0;
  r.nan = false;
  r.m = -kInf;
  if (!o.sinks.empty()) {
    const double sk = o.sinks[h];
    if (std::isnan(sk)) r.nan = true;
    r.m = std::max(r.m, sk);
  }
  std::int32_t first = 0, last = -1;
  visible_keys(p, i, first, last);
  const double* qr = q.row(b, h, i);
  for (std::int64_t jj = first; jj <= last; ++jj) {
    const auto j = static_cast<std::size_t>(jj);
    const std::size_t col = p.mask_col0 + j;
    if (!o.mask.empty() && o.mask.cols != 0) {
      const std::size_t mb = o.mask.batch == 1 ? 0 : b;
      const std::size_t mh = o.mask.heads == 1 ? 0 : h;
      if (!o.mask.row(mb, mh, i)[col]) continue;
    }
    double add = 0.0;
    if (!o.bias.empty() && o.bias.cols != 0) {
      const std::size_t bb = o.bias.batch == 1 ? 0 : b;
      const std::size_t bh = o.bias.heads == 1 ? 0 : h;
      add = o.bias.row(bb, bh, i)[col];
      if (add == -kInf) continue;
    }
    if (!o.alibi_slopes.empty()) {
      add = static_cast<double>(o.alibi_slopes[h]) *
            (static_cast<double>(j) * static_cast<double>(p.kv_stride) +
             static_cast<double>(alibi_base(p, i)));
    }
    const double* kr = k.row(b, kh, j);
    double t = 0.0;
    for (std::size_t c = 0; c < p.d; ++c) t += qr[c] * kr[c];
    t *= scale;
    if (p.softcap > 0.0f) {
      const double cap = p.softcap;
      const double th = std::tanh(t / cap);
      t = cap * th;
      r.capd[j] = 1.0 - th * th;
    }
    const double x = t + add;
    r.s[j] = x;
    if (std::isnan(x)) r.nan = true;
    if (x == kInf) ++r.infs;
    r.m = std::max(r.m, x);
  }
}

// The weight of key j in a row whose log-denominator is lse (and the +inf
// limit: 1/k at the k scores of +inf).
double weight(const RowScores& r, std::size_t j, double lse) {
  const double x = r.s[j];
  if (x == -kInf) return 0.0;
  if (lse == kInf) return x == kInf ? 1.0 / static_cast<double>(r.infs) : 0.0;
  return std::exp(x - lse);
}

double scale_of(const AttentionOptions& o, std::size_t d) {
  return o.scale.value_or(1.0 / std::sqrt(static_cast<double>(d)));
}

}  // namespace

void attention(TensorView<const double> q, TensorView<const double> k,
               TensorView<const double> v, TensorView<double> out,
               const AttentionOptions& options, double* lse) {
  const char* fn = "attention";
  const Plan p = plan_of(fn, q, k, v, out, options);
  const std::size_t rows = p.B * p.H * p.n_q;
  std::vector<NamedSpan> ins = {named_span("q", q), named_span("k", k),
                                named_span("v", v)};
  add_option_spans(options, [&](const NamedSpan& x) { ins.push_back(x); });
  fail_on_overlap(
      fn,
      {named_span("out", out), named_span("lse", lse, rows * sizeof(double))},
      ins);
  const double scale = scale_of(options, p.d);
  detail::for_each_index(
      rows, rows >= 16 && omp_get_max_threads() > 1, [&](std::size_t r) {
        const std::size_t i = r % p.n_q, h = (r / p.n_q) % p.H,
                          b = r / (p.n_q * p.H);
        thread_local RowScores sc;
        row_scores(p, options, scale, q, k, b, h, i, sc);
        double* o = out.row(b, h, i);
        std::fill(o, o + p.dv, 0.0);
        double l = 0.0;
        if (sc.m == kInf) {
          l = static_cast<double>(sc.infs);
        } else if (sc.m != -kInf) {
          for (double x : sc.s) l += std::exp(x - sc.m);
          if (!options.sinks.empty()) l += std::exp(options.sinks[h] - sc.m);
        }
        double row_lse = sc.m == -kInf ? -kInf : sc.m + std::log(l);
        if (sc.m == kInf) row_lse = kInf;
        if (sc.nan) row_lse = std::numeric_limits<double>::quiet_NaN();
        const std::size_t kh = h / p.g;
        for (std::size_t j = 0; j < p.n_kv && sc.m != -kInf; ++j) {
          const double w =
              sc.nan ? (sc.s[j] == -kInf ? 0.0 : NAN) : weight(sc, j, row_lse);
          if (w == 0.0) continue;
          const double* vr = v.row(b, kh, j);
          for (std::size_t c = 0; c < p.dv; ++c) o[c] += w * vr[c];
        }
        if (lse != nullptr) lse[r] = row_lse;
      });
}

void attention_backward(TensorView<const double> q, TensorView<const double> k,
                        TensorView<const double> v,
                        TensorView<const double> out, const double* lse,
                        TensorView<const double> dout,
                        const AttentionGradients64& grads,
                        const AttentionOptions& options, const double* dlse) {
  const char* fn = "attention_backward";
  // out is the forward's, read here: checked as an input of its shape.
  const Plan p = plan_of(fn, q, k, v, TensorView<double>(), options, nullptr);
  check_tensor(fn, "out", out);
  if (out.batch != p.B || out.heads != p.H || out.rows != p.n_q ||
      out.cols != p.dv) {
    fail(fn,
         shape("out", out) + " must be " + shape("out", p.B, p.H, p.n_q, p.dv));
  }
  if (lse == nullptr) fail(fn, "lse is null (the forward's lse is needed)");
  auto dims = [&](const char* name, const auto& t, std::size_t B, std::size_t H,
                  std::size_t R, std::size_t C) {
    check_tensor(fn, name, t);
    if (t.batch != B || t.heads != H || t.rows != R || t.cols != C) {
      fail(fn, shape(name, t) + " must be " + shape(name, B, H, R, C));
    }
  };
  dims("dout", dout, p.B, p.H, p.n_q, p.dv);
  dims("dq", grads.dq, p.B, p.H, p.n_q, p.d);
  dims("dk", grads.dk, p.B, p.Hkv, p.n_kv, p.d);
  dims("dv", grads.dv, p.B, p.Hkv, p.n_kv, p.dv);
  const bool want_dbias = !grads.dbias.empty();
  if (want_dbias) {
    dims("dbias", grads.dbias, p.B, p.H, p.n_q, p.mask_col0 + p.n_kv);
  }
  if (!grads.dsinks.empty() &&
      (options.sinks.empty() || grads.dsinks.size() != p.H)) {
    fail(fn, "dsinks has " + count(grads.dsinks.size()) +
                 " values; expected one per query head (" + count(p.H) +
                 ") and options.sinks");
  }
  const std::size_t rows = p.B * p.H * p.n_q;
  std::vector<NamedSpan> ins = {
      named_span("q", q),
      named_span("k", k),
      named_span("v", v),
      named_span("out", out),
      named_span("dout", dout),
      named_span("lse", lse, rows * sizeof(double)),
      named_span("dlse", dlse, rows * sizeof(double))};
  add_option_spans(options, [&](const NamedSpan& x) { ins.push_back(x); });
  fail_on_overlap(fn,
                  {named_span("dq", grads.dq), named_span("dk", grads.dk),
                   named_span("dv", grads.dv), named_span("dbias", grads.dbias),
                   named_span("dsinks", grads.dsinks.data(),
                              grads.dsinks.size() * sizeof(double))},
                  ins);
  const double scale = scale_of(options, p.d);
  std::vector<double> delta(rows);
  for (std::size_t r = 0; r < rows; ++r) {
    const std::size_t i = r % p.n_q, h = (r / p.n_q) % p.H,
                      b = r / (p.n_q * p.H);
    const double* o = out.row(b, h, i);
    const double* g = dout.row(b, h, i);
    double s = 0.0;
    for (std::size_t c = 0; c < p.dv; ++c) {
      if (o[c] != 0.0) s += o[c] * g[c];
    }
    delta[r] = s - (dlse != nullptr ? dlse[r] : 0.0);
  }
  // Per batch and KV head: its keys' dK and dV summed over the rows of its
  // query heads in order; each row's dQ.
  detail::for_each_index(
      p.B * p.Hkv, p.B * p.Hkv > 1 && omp_get_max_threads() > 1,
      [&](std::size_t t) {
        const std::size_t kh = t % p.Hkv, b = t / p.Hkv;
        for (std::size_t j = 0; j < p.n_kv; ++j) {
          std::fill_n(grads.dk.row(b, kh, j), p.d, 0.0);
          std::fill_n(grads.dv.row(b, kh, j), p.dv, 0.0);
        }
        RowScores sc;
        for (std::size_t h = kh * p.g; h < (kh + 1) * p.g; ++h) {
          for (std::size_t i = 0; i < p.n_q; ++i) {
            const std::size_t r = (b * p.H + h) * p.n_q + i;
            row_scores(p, options, scale, q, k, b, h, i, sc);
            double* gq = grads.dq.row(b, h, i);
            std::fill(gq, gq + p.d, 0.0);
            double* gb = want_dbias ? grads.dbias.row(b, h, i) : nullptr;
            if (gb != nullptr) std::fill_n(gb, p.mask_col0 + p.n_kv, 0.0);
            const double* qr = q.row(b, h, i);
            const double* go = dout.row(b, h, i);
            for (std::size_t j = 0; j < p.n_kv; ++j) {
              if (sc.s[j] == -kInf) continue;
              const double w = weight(sc, j, lse[r]);
              const double* vr = v.row(b, kh, j);
              const double* kr = k.row(b, kh, j);
              double dp = 0.0;
              for (std::size_t c = 0; c < p.dv; ++c) dp += go[c] * vr[c];
              const double ds = w * (dp - delta[r]);
              if (gb != nullptr) gb[p.mask_col0 + j] = ds;
              const double dt = ds * sc.capd[j];
              double* gk = grads.dk.row(b, kh, j);
              double* gv = grads.dv.row(b, kh, j);
              for (std::size_t c = 0; c < p.d; ++c) {
                gq[c] += scale * dt * kr[c];
                gk[c] += scale * dt * qr[c];
              }
              for (std::size_t c = 0; c < p.dv; ++c) gv[c] += w * go[c];
            }
          }
        }
      });
  if (!grads.dsinks.empty()) {
    for (std::size_t h = 0; h < p.H; ++h) {
      double s = 0.0;
      const double sk = options.sinks[h];
      for (std::size_t b = 0; b < p.B; ++b) {
        for (std::size_t i = 0; i < p.n_q; ++i) {
          const std::size_t r = (b * p.H + h) * p.n_q + i;
          const double ps = sk == -kInf ? 0.0 : std::exp(sk - lse[r]);
          if (ps != 0.0 || std::isnan(delta[r])) s -= ps * delta[r];
        }
      }
      grads.dsinks[h] = s;
    }
  }
}

}  // namespace softdot
