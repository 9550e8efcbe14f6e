// softdot: attention_backward() and attention_backward_partial() (requests
// with the gradients target, run by attention_gradients.cc), the partial's
// zeros and finalize, and the 16-bit overloads (inputs widened exactly, the
// float32 backward, each gradient rounded once to the inputs' format).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "attention_checks.h"
#include "attention_rows.h"
#include "kernels/attention_args.h"
#include "kernels/dispatch.h"
#include "parallel.h"
#include "softdot/attention.h"
#include "softdot/attention_request.h"

namespace softdot {
namespace {

using namespace detail::attn;

// Each element of t, in dense (b, h, r, c) order in x, set to f x[i]
// rounded once to T (float, bfloat16 or float16).
template <class T>
void round_sums_into(const TensorView<T>& t, const std::vector<double>& x,
                     double f) {
  if (t.batch == 0 || t.heads == 0 || t.rows == 0 || t.cols == 0) return;
  std::size_t at = 0;
  for (std::size_t b = 0; b < t.batch; ++b) {
    for (std::size_t h = 0; h < t.heads; ++h) {
      for (std::size_t r = 0; r < t.rows; ++r) {
        T* o = t.row(b, h, r);
        for (std::size_t c = 0; c < t.cols; ++c) {
          const double y = f * x[at++];
          if constexpr (std::is_same_v<T, BFloat16>) {
            o[c] = to_bfloat16(y);
          } else if constexpr (std::is_same_v<T, Float16>) {
            o[c] = to_float16(y);
          } else {
            o[c] = static_cast<float>(y);
          }
        }
      }
    }
  }
}

}  // namespace

namespace {

// The request of a public backward entry point, checked and run; returns
// the plan's float scale.
float backward_request(const char* fn, TensorView<const float> q,
                       TensorView<const float> k, TensorView<const float> v,
                       const AttentionBackwardIO& io,
                       const AttentionOptions& options,
                       bool zero_whole_dbias = false) {
  AttentionRequest r;
  r.name = fn;
  r.q = q;
  r.kv = KVSource::contiguous(k, v);
  r.target = AttentionTarget::gradients(io);
  r.options = options;
  const AttentionPlan plan = AttentionPlan::make(r);
  // A partial that stands for the whole call (the 16-bit overloads): every
  // column of dbias, not only the key range's (checked: nothing written
  // before).
  if (zero_whole_dbias) zero_view(io.grads.dbias);
  plan.run();
  return plan.scale();
}

}  // namespace

void attention_backward(TensorView<const float> q, TensorView<const float> k,
                        TensorView<const float> v, TensorView<const float> out,
                        const float* lse, TensorView<const float> dout,
                        const AttentionGradients& grads,
                        const AttentionOptions& options, const float* dlse) {
  backward_request("attention_backward", q, k, v,
                   {out, lse, dout, dlse, grads, nullptr}, options);
}

void attention_backward_partial(
    TensorView<const float> q, TensorView<const float> k,
    TensorView<const float> v, TensorView<const float> out, const float* lse,
    TensorView<const float> dout, AttentionGradientPartial& partial,
    const AttentionOptions& options, const AttentionGradients& extras,
    const float* dlse) {
  backward_request("attention_backward_partial", q, k, v,
                   {out, lse, dout, dlse, extras, &partial}, options);
}

AttentionGradientPartial AttentionGradientPartial::zeros(
    std::size_t batch, std::size_t heads, std::size_t kv_heads,
    std::size_t rows, std::size_t keys, std::size_t d, std::size_t dv) {
  AttentionGradientPartial p;
  p.batch = batch;
  p.heads = heads;
  p.kv_heads = kv_heads;
  p.rows = rows;
  p.keys = keys;
  p.d = d;
  p.dv = dv;
  p.dq.assign(batch * heads * rows * d, 0.0);
  p.dk.assign(batch * kv_heads * keys * d, 0.0);
  p.dv_sum.assign(batch * kv_heads * keys * dv, 0.0);
  return p;
}

void attention_backward_finalize(const AttentionGradientPartial& partial,
                                 float scale, TensorView<float> dq,
                                 TensorView<float> dk, TensorView<float> dv) {
  const char* fn = "attention_backward_finalize";
  const AttentionGradientPartial& a = partial;
  if (!dq.empty())
    check_dims(fn, "dq", dq, "the partial's dq", a.batch, a.heads, a.rows, a.d);
  if (!dk.empty())
    check_dims(fn, "dk", dk, "the partial's dk", a.batch, a.kv_heads, a.keys,
               a.d);
  if (!dv.empty())
    check_dims(fn, "dv", dv, "the partial's dv", a.batch, a.kv_heads, a.keys,
               a.dv);
  const double sc = static_cast<double>(scale);
  if (!dq.empty()) round_sums_into(dq, a.dq, sc);
  if (!dk.empty()) round_sums_into(dk, a.dk, sc);
  if (!dv.empty()) round_sums_into(dv, a.dv_sum, 1.0);
}

namespace {

// A 16-bit view widened (exactly) into a dense float32 copy.
template <class T>
std::vector<float> widened(const TensorView<const T>& t) {
  std::vector<float> x;
  if (t.batch == 0 || t.heads == 0 || t.rows == 0 || t.cols == 0) return x;
  x.reserve(t.batch * t.heads * t.rows * t.cols);
  for (std::size_t b = 0; b < t.batch; ++b) {
    for (std::size_t h = 0; h < t.heads; ++h) {
      for (std::size_t r = 0; r < t.rows; ++r) {
        const T* row = t.row(b, h, r);
        for (std::size_t c = 0; c < t.cols; ++c) x.push_back(to_float(row[c]));
      }
    }
  }
  return x;
}

template <class T>
TensorView<const float> dense(const std::vector<float>& x,
                              const TensorView<const T>& like) {
  return TensorView<const float>(x.data(), like.batch, like.heads, like.rows,
                                 like.cols);
}

template <class T>
void backward16(TensorView<const T> q, TensorView<const T> k,
                TensorView<const T> v, TensorView<const float> out,
                const float* lse, TensorView<const T> dout,
                const AttentionGradients16<T>& grads,
                const AttentionOptions& options, const float* dlse) {
  const char* fn = "attention_backward";
  check_tensor(fn, "q", q);
  check_tensor(fn, "k", k);
  check_tensor(fn, "v", v);
  check_tensor(fn, "dout", dout);
  check_dims(fn, "dq", grads.dq, "q", q.batch, q.heads, q.rows, q.cols);
  check_dims(fn, "dk", grads.dk, "k", k.batch, k.heads, k.rows, k.cols);
  check_dims(fn, "dv", grads.dv, "v", v.batch, v.heads, v.rows, v.cols);
  // The widening's loops follow the views' shapes: the forward's checks
  // (shapes against each other, strides, options) and dout's shape come
  // first (found by fuzz_backward: a q of [2^62, 2^62, 2, 0] with invalid
  // options looped for ever, 0 columns passing check_tensor).
  {
    AttentionRequest req;
    req.name = fn;
    req.q = q;
    req.kv = KVSource::contiguous(k, v);
    AttentionPartial shapes_only;
    req.target = AttentionTarget::partial_result(shapes_only);
    req.options = options;
    const AttentionPlan plan = AttentionPlan::make(req);
    check_dims(fn, "dout", dout, "out", plan.batch(), plan.heads(),
               plan.query_rows(), plan.value_dim());
  }
  const std::vector<float> qf = widened(q), kf = widened(k), vf = widened(v),
                           gf = widened(dout);
  auto part = AttentionGradientPartial::zeros(q.batch, q.heads, k.heads, q.rows,
                                              k.rows, q.cols, v.cols);
  AttentionGradients extras;
  extras.dbias = grads.dbias;
  extras.dsinks = grads.dsinks;
  const double scale = backward_request(
      fn, dense(qf, q), dense(kf, k), dense(vf, v),
      {out, lse, dense(gf, dout), dlse, extras, &part}, options,
      /*zero_whole_dbias=*/true);

  round_sums_into(grads.dq, part.dq, scale);
  round_sums_into(grads.dk, part.dk, scale);
  round_sums_into(grads.dv, part.dv_sum, 1.0);
}

}  // namespace

// The 16-bit overloads: q, k, v, dout and the gradients of one format.
#define SOFTDOT_BACKWARD16(T)                                                  \
  void attention_backward(                                                     \
      TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,     \
      TensorView<const float> out, const float* lse, TensorView<const T> dout, \
      const AttentionGradients16<T>& grads, const AttentionOptions& options,   \
      const float* dlse) {                                                     \
    backward16(q, k, v, out, lse, dout, grads, options, dlse);                 \
  }
SOFTDOT_BACKWARD16(BFloat16)
SOFTDOT_BACKWARD16(Float16)
#undef SOFTDOT_BACKWARD16

}  // namespace softdot
