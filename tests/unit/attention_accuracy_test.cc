// Attention tests: Accuracy over shapes, strides, GQA/MQA, wide scores and
// underflowing weights, against the long-double reference within the stated
// bound.
//
// Each accuracy case prints one line
//   [ attn-err ] <case>  err/(uW) max ...  err/bound max ...  lse err/u max ...
// with err = |O - O*| and W = sum_j w_j |V_jc| (u = 2^-24): the measured
// figure that docs/accuracy.md quotes.
#include "attention_checks.h"  // kDecodeChunk (src/)
#include "attention_test_util.h"
#include "kernels/attention_args.h"  // kKeyTile, kDecodeMaxRows, kMaxKernelRows

namespace softdot_test {
namespace {

// ---- accuracy over shapes --------------------------------------------------

// Sizes at the kernels' edges, from their constants, so that changing a
// constant moves the sweep with it: query rows around the decode form's
// limit (rows per KV head) and a prefill block of rows, keys around a key
// block and a decode chunk.
using softdot::detail::kDecodeMaxRows;
using softdot::detail::kKeyTile;
using softdot::detail::kMaxKernelRows;
using softdot::detail::attn::kDecodeChunk;

const std::pair<std::size_t, std::size_t> kDims[] = {
    {64, 64}, {7, 7},  {1, 1},    {65, 65}, {128, 128},
    {64, 7},  {7, 64}, {65, 128}, {128, 1}, {1, 65}};

template <class KV>
void shape_sweep(const std::vector<std::size_t>& nqs,
                 const std::vector<std::size_t>& nkvs, std::size_t dim0) {
  std::size_t idx = dim0;
  for (std::size_t nq : nqs) {
    for (std::size_t nkv : nkvs) {
      const auto [d, dv] = kDims[idx++ % std::size(kDims)];
      Shape s;
      s.nq = nq;
      s.nkv = nkv;
      s.d = d;
      s.dv = dv;
      s.seed = 1000 * nq + nkv + d;
      accuracy_case<KV>("plain", make_problem<KV>(s), {});
    }
  }
}

TEST(AttentionAccuracy, F32Shapes) {
  shape_sweep<float>({1, 7, kDecodeMaxRows, kDecodeMaxRows + 1,
                      kMaxKernelRows - 1, kMaxKernelRows + 1},
                     {1, 7, kKeyTile - 1, kKeyTile + 1}, 0);
  // The decode form's chunk edge (one query, so the decode form).
  shape_sweep<float>({1}, {kDecodeChunk - 1, kDecodeChunk, kDecodeChunk + 1},
                     4);
  // Long rows and many rows (not every pair at 1000).
  const std::size_t big[][4] = {{1, 1000, 128, 128}, {7, 1000, 64, 65},
                                {1000, 1, 64, 64},   {1000, 65, 7, 64},
                                {65, 1000, 65, 7},   {1000, 1000, 64, 64}};
  for (const auto& c : big) {
    Shape s;
    s.nq = c[0];
    s.nkv = c[1];
    s.d = c[2];
    s.dv = c[3];
    s.seed = c[0] + 7 * c[1];
    const bool huge = c[0] * c[1] >= 1000000;
    accuracy_case<float>("plain", make_problem<float>(s), {},
                         huge ? fma_targets() : all_targets());
  }
}

TEST(AttentionAccuracy, F16Shapes) {
  shape_sweep<Float16>({1, 7, kMaxKernelRows + 1}, {7, kKeyTile - 1, 1000}, 3);
}

TEST(AttentionAccuracy, BF16Shapes) {
  shape_sweep<BFloat16>({1, 7, kMaxKernelRows + 1}, {7, kKeyTile - 1, 1000}, 6);
}

// Batch and heads with padding between rows, heads and batches (and a
// misaligned start), GQA (H = 8, H_kv = 2) and MQA (H_kv = 1).
TEST(AttentionAccuracy, BatchHeadsStridedGqaMqa) {
  {
    Shape s{.B = 2,
            .H = 3,
            .Hkv = 3,
            .nq = 7,
            .nkv = 65,
            .d = 64,
            .dv = 65,
            .pad = 3,
            .off = 1,
            .seed = 11};
    accuracy_case<float>("batch/heads", make_problem<float>(s), {});
  }
  {
    Shape s{.B = 2,
            .H = 8,
            .Hkv = 2,
            .nq = 65,
            .nkv = 63,
            .d = 64,
            .dv = 64,
            .pad = 5,
            .off = 3,
            .seed = 12};
    accuracy_case<float>("GQA", make_problem<float>(s), {});
    accuracy_case<Float16>("GQA", make_problem<Float16>(s), {});
    accuracy_case<BFloat16>("GQA", make_problem<BFloat16>(s), {});
  }
  {
    Shape s{.B = 3,
            .H = 4,
            .Hkv = 1,
            .nq = 63,
            .nkv = 130,
            .d = 7,
            .dv = 128,
            .pad = 1,
            .off = 0,
            .seed = 13};
    accuracy_case<float>("MQA", make_problem<float>(s), {});
    accuracy_case<BFloat16>("MQA", make_problem<BFloat16>(s), {});
  }
  {
    // Decode over a GQA cache, split into 512-key chunks across threads.
    Shape s{.B = 1,
            .H = 8,
            .Hkv = 2,
            .nq = 1,
            .nkv = 5000,
            .d = 128,
            .dv = 128,
            .pad = 2,
            .off = 1,
            .seed = 14};
    accuracy_case<float>("GQA decode", make_problem<float>(s), {});
    accuracy_case<Float16>("GQA decode", make_problem<Float16>(s), {});
    Shape s2 = s;
    s2.nq = 2;
    s2.nkv = 1500;
    s2.H = 4;
    s2.Hkv = 1;
    accuracy_case<BFloat16>("MQA decode", make_problem<BFloat16>(s2), {});
  }
}

// batch_invariant (every row in the decode form, chunks at fixed key
// indices, the sink merged last): within the same bound on every target,
// for decode, verification and prefill shapes (groups of 16 rows), causal
// with a window, sinks and softcap, and non-causal with a key range.
TEST(AttentionAccuracy, BatchInvariantWithinBound) {
  const std::vector<float> sinks = {0.5f, -1.0f, 2.0f,  0.0f,
                                    1.5f, -0.5f, 0.25f, -kInfF};
  for (const std::size_t nq : {1, 4, 37}) {
    Shape s{.B = 2,
            .H = 8,
            .Hkv = 2,
            .nq = nq,
            .nkv = 1100,
            .d = 64,
            .dv = 48,
            .pad = 2,
            .off = 1,
            .seed = 40 + nq};
    AttentionOptions o;
    o.batch_invariant = true;
    o.causal = true;
    o.window_left = 700;
    o.sinks = sinks;
    o.softcap = 20.0f;
    accuracy_case<float>("invariant causal", make_problem<float>(s), o);
    accuracy_case<BFloat16>("invariant causal", make_problem<BFloat16>(s), o);
    AttentionOptions o2;
    o2.batch_invariant = true;
    o2.kv_begin = 100;
    o2.kv_end = 1050;
    s.d = 40;  // the untiled decode form
    accuracy_case<float>("invariant kv_range", make_problem<float>(s), o2);
    accuracy_case<Float16>("invariant kv_range", make_problem<Float16>(s), o2);
  }
}

// Larger scores (spread about 50: the score error term D dominates), an
// explicit scale, and values far from 0 (a well-conditioned sum) or of
// mixed magnitude.
TEST(AttentionAccuracy, WideScoresAndScales) {
  Shape s{.nq = 65, .nkv = 200, .d = 64, .dv = 64, .qk = 3.0, .seed = 21};
  AttentionOptions o;
  o.scale = 0.25;
  accuracy_case<float>("wide scores, scale 0.25", make_problem<float>(s), o);
  accuracy_case<Float16>("wide scores, scale 0.25", make_problem<Float16>(s),
                         o);
  Shape s2 = s;
  s2.d = 128;
  s2.nkv = 1000;
  s2.v_lo = 100;
  s2.v_hi = 101;
  o.scale = 1.0 / 3.0;  // rounded to float
  accuracy_case<float>("wide scores, scale 1/3, V in [100,101]",
                       make_problem<float>(s2), o);
  Shape s3{.nq = 7, .nkv = 300, .d = 65, .dv = 7, .seed = 23};
  auto p = make_problem<float>(s3);
  std::mt19937_64 rng(5);
  p.v.for_each([&](float& x) { x = std::ldexp(x, int(rng() % 40) - 20); });
  p.rewiden();
  accuracy_case<float>("V of mixed magnitude", p, {});
}

// Underflowing weights. A weight below 2^-126 (a score more than about 87
// below the max) is a subnormal float with an absolute, not relative,
// rounding error, and so is an output below 2^-126. With scores 0 and -g,
// V = [0, 1], the exact output is e^-g / (1 + e^-g); for g = 100 it is
// 3.72e-44, which float can only hold to within 2^-150 = 7e-46, far above
// (2 D + 70u) W + u|O*| = 2.4e-48. Hence attention.h's underflow term: each
// P_j = exp(s_j - m), each FMA of the value sum and the final output may
// round to the subnormal grid (absolute error 2^-150 each), so
//   |O - O*| <= (2 D + 70u) W + u|O*| + 2^-149 (n_kv + 1 + sum_j |V_jc|),
// which the reference's bound includes. It still fails if subnormals are
// flushed to zero (the error would then be |O*|, up to 2^-126). The test
// also prints whether the bound without the underflow term held.
TEST(AttentionAccuracy, UnderflowingWeights) {
  for (float g : {80.0f, 90.0f, 100.0f, 103.0f, 110.0f}) {
    Shape s{.nq = 1, .nkv = 2, .d = 1, .dv = 1, .seed = 1};
    auto p = make_problem<float>(s);
    p.q.at(0, 0, 0, 0) = 1.0f;
    p.k.at(0, 0, 0, 0) = 0.0f;
    p.k.at(0, 0, 1, 0) = -g;
    p.v.at(0, 0, 0, 0) = 0.0f;
    p.v.at(0, 0, 1, 0) = 1.0f;
    p.rewiden();
    AttentionOptions o;
    o.scale = 1.0;
    const AttnRef ref = reference(p, o);
    for (const auto& t : all_targets()) {
      softdot::force_simd_target(t);
      const Result r = run(p, o);
      const double err = double(std::fabs(LD(r.o.at(0, 0, 0, 0)) - ref.out[0]));
      const double bound = ref.bound[0];
      const double without = bound - 0x1p-149 * (2 + 1 + 1);
      EXPECT_LE(err, bound)
          << "gap " << g << " [" << t << "]: out " << fmt(r.o.at(0, 0, 0, 0))
          << ", exact " << fmt(double(ref.out[0]));
      if (t == all_targets().front()) {
        std::printf(
            "[ attn-err ] underflow: scores 0, -%-5g exact %.6g, got %.6g: "
            "err %.3g, bound without the underflow term %.3g (%s), "
            "attention.h bound %.3g\n",
            double(g), double(ref.out[0]), double(r.o.at(0, 0, 0, 0)), err,
            without, err <= without ? "holds" : "exceeded", bound);
      }
    }
    softdot::force_simd_target("");
  }
}

}  // namespace
}  // namespace softdot_test
