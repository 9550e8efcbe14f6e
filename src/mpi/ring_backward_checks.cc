// The checks of softdot::mpi::ring_attention_backward (ring_backward.h):
// one rank's arguments as attention_backward_partial() checks them, and the
// agreement of every rank's shapes and options.
#include <mpi.h>

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "attention_checks.h"
#include "mpi/ring_backward.h"
#include "mpi/ring_core.h"
#include "softdot/attention.h"
#include "softdot/attention_request.h"
#include "softdot/mpi.h"

namespace softdot::mpi::detail {

std::string check_local(const RingLayout& L, int rank, const Args& a,
                        float* scale) {
  const std::string fn = kBackwardFn;
  const AttentionOptions& o = a.ro.attention;
  if (std::string e = check_ring_defaults(fn, o); !e.empty()) return e;
  const std::size_t n = L.rows(), seq = a.ro.seq_len;
  const auto& q = a.q;
  const auto& k = a.k;
  const auto& v = a.v;
  if (q.rows != n || k.rows != n || v.rows != n) {
    return fn + ": " + shape("q", q) + ", " + shape("k", k) + " and " +
           shape("v", v) + " must have rows = " + std::to_string(n) +
           " (seq_len " + std::to_string(seq) + " over " +
           std::to_string(L.ranks) + " ranks, " +
           (L.kind == Layout::zigzag ? "zigzag" : "contiguous") +
           (a.ro.deterministic ? ", deterministic" : "") + ")";
  }
  auto shaped = [&](const char* name, const auto& t, std::size_t b,
                    std::size_t h, std::size_t r,
                    std::size_t c) -> std::string {
    if (t.batch != b || t.heads != h || t.rows != r || t.cols != c) {
      return fn + ": " + shape(name, t) + " must be " +
             shape(name, b, h, r, c) + " for " + shape("q", q) + ", " +
             shape("k", k) + " and " + shape("v", v);
    }
    if (t.data == nullptr) return fn + ": " + name + " has null data";
    return "";
  };
  std::string e = shaped("out", a.out, q.batch, q.heads, n, v.cols);
  if (e.empty()) e = shaped("dout", a.dout, q.batch, q.heads, n, v.cols);
  if (e.empty()) e = shaped("grads.dq", a.g.dq, q.batch, q.heads, n, q.cols);
  if (e.empty()) e = shaped("grads.dk", a.g.dk, k.batch, k.heads, n, k.cols);
  if (e.empty()) e = shaped("grads.dv", a.g.dv, v.batch, v.heads, n, v.cols);
  if (e.empty() && !a.g.dbias.empty()) {
    e = shaped("grads.dbias", a.g.dbias, q.batch, q.heads, n, seq);
  }
  if (!e.empty()) return e;
  for (const TensorView<float>* t : {&a.g.dq, &a.g.dk, &a.g.dv, &a.g.dbias}) {
    if (!t->empty() && t->rows > 1 && t->row_stride < t->cols) {
      return fn + ": a gradient has row_stride " +
             std::to_string(t->row_stride) + " < cols " +
             std::to_string(t->cols);
    }
  }
  if (a.lse == nullptr) return fn + ": lse is null (the forward's lse)";
  if (!a.g.dsinks.empty()) {
    if (o.sinks.empty()) {
      return fn + ": grads.dsinks given but options.attention.sinks is empty";
    }
    if (a.g.dsinks.size() != q.heads) {
      return fn + ": grads.dsinks has " + std::to_string(a.g.dsinks.size()) +
             " floats; expected one per query head (" +
             std::to_string(q.heads) + ")";
    }
  }
  auto check_extra = [&](const char* name, auto& t) -> std::string {
    if (t.data == nullptr) return "";
    if (t.rows != n || t.cols != seq) {
      return fn + ": options.attention." + shape(name, t) + " must have rows " +
             std::to_string(n) + " (the local queries) and cols = seq_len " +
             std::to_string(seq);
    }
    return "";
  };
  e = check_extra("mask", o.mask);
  if (e.empty()) e = check_extra("bias", o.bias);
  if (!e.empty()) return e;
  // No gradient may overlap an input or another gradient.
  {
    using softdot::detail::attn::named_span;
    const std::size_t rows = q.batch * q.heads * n;
    const std::string clash = softdot::detail::attn::first_overlap(
        {named_span("grads.dq", a.g.dq), named_span("grads.dk", a.g.dk),
         named_span("grads.dv", a.g.dv), named_span("grads.dbias", a.g.dbias),
         named_span("grads.dsinks", a.g.dsinks.data(),
                    a.g.dsinks.size() * sizeof(float))},
        {named_span("q", q), named_span("k", k), named_span("v", v),
         named_span("out", a.out), named_span("dout", a.dout),
         named_span("mask", o.mask), named_span("bias", o.bias),
         named_span("lse", a.lse, rows * sizeof(float)),
         named_span("dlse", a.dlse, rows * sizeof(float)),
         named_span("sinks", o.sinks.data(), o.sinks.size() * sizeof(float))});
    if (!clash.empty()) return fn + ": " + clash;
  }
  // Everything else as attention_backward_partial() checks it: an empty
  // key range (no work) over the local shard, positions as the ring's
  // first call, the mask and bias with their local rows.
  try {
    const std::size_t m = std::min(n, seq);
    AttentionOptions c = o;
    c.q_position = L.chunk_start(rank, 0);
    c.kv_position = 0;
    c.kv_begin = 0;
    c.kv_end = 0;
    AttentionRequest r;
    r.name = "mpi::ring_attention_backward";
    r.q = q;
    r.kv = KVSource::contiguous(row_range(k, 0, m), row_range(v, 0, m));
    AttentionPartial tmp;
    r.target = AttentionTarget::partial_result(tmp);
    r.options = c;
    *scale = AttentionPlan::make(r).scale();
    AttentionGradientPartial part = AttentionGradientPartial::zeros(
        q.batch, q.heads, k.heads, n, m, q.cols, v.cols);
    AttentionGradients extras;
    if (!a.g.dbias.empty()) extras.dbias = first_cols(a.g.dbias, m);
    attention_backward_partial(q, row_range(k, 0, m), row_range(v, 0, m), a.out,
                               a.lse, a.dout, part, c, extras, a.dlse);
  } catch (const std::invalid_argument& ex) {
    return fn + ": " + ex.what();
  }
  return "";
}

std::string check_same(MPI_Comm comm, const Args& a) {
  std::vector<SameField> f = ring_fields(a.q, a.k.heads, a.v.cols, a.ro);
  f.push_back({"grads.dbias", a.g.dbias.empty() ? 0 : 1});
  f.push_back({"grads.dsinks", a.g.dsinks.empty() ? 0 : 1});
  f.push_back({"dlse", a.dlse == nullptr ? 0 : 1});
  return check_same(comm, kBackwardFn, f);
}

}  // namespace softdot::mpi::detail
