// Attention tests: int8 K/V (Int8KV) and quantize_kv: the quantisation
// bound, and every attention function on int8 equal, bit for bit, to the same
// function on float K/V holding the dequantised values, on every target.
#include <limits>

#include "attention_checks.h"
#include "attention_sweeps.h"
#include "attention_test_util.h"

namespace softdot_test {
namespace {

using softdot::Int8KV;

// int8 values, scales, and the float tensor of the dequantised values
// (scale * q rounded once to float), computed here independently.
struct Quantized {
  Tensor<std::int8_t> q;
  Tensor<float> scales;  // [B, H, n, 1]
  Tensor<float> deq;
  Int8KV view() const { return {q.cview(), scales.cview()}; }
};

Quantized quantize(const Tensor<float>& x, std::size_t pad) {
  Quantized r{Tensor<std::int8_t>(x.B, x.H, x.R, x.C, pad, std::int8_t{99}),
              Tensor<float>(x.B, x.H, x.R, 1, pad, kNaNF),
              Tensor<float>(x.B, x.H, x.R, x.C, pad, kNaNF)};
  softdot::quantize_kv(x.cview(), r.q.view(), r.scales.view());
  for (std::size_t b = 0; b < x.B; ++b)
    for (std::size_t h = 0; h < x.H; ++h)
      for (std::size_t j = 0; j < x.R; ++j)
        for (std::size_t c = 0; c < x.C; ++c)
          r.deq.at(b, h, j, c) =
              float(r.q.at(b, h, j, c)) * r.scales.at(b, h, j, 0);
  return r;
}

// The bound of quantize_kv (attention.h): |scale q - x| <= (0.5 + 2^-15)
// scale, |q| <= 127, scale = max|x| / 127 rounded, the largest |x| maps to
// +-127, zero rows get scale 0.
TEST(AttentionInt8, QuantizeKvBound) {
  std::mt19937_64 rng(77);
  for (double range : {1.0, 1e-3, 1e6, 1e-38, 1e-41, 1e-43}) {
    std::uniform_real_distribution<double> u(-range, range);
    Tensor<float> x(2, 3, 40, 67, 1, kNaNF);
    x.for_each([&](float& v) { v = float(u(rng)); });
    for (std::size_t c = 0; c < 67; ++c) x.at(1, 2, 5, c) = 0.0f;  // zero row
    x.at(0, 1, 7, 3) = -float(range);  // an exact extreme
    const Quantized qz = quantize(x, 2);
    double worst = 0;
    for (std::size_t b = 0; b < 2; ++b)
      for (std::size_t h = 0; h < 3; ++h)
        for (std::size_t j = 0; j < 40; ++j) {
          const float s = qz.scales.at(b, h, j, 0);
          float amax = 0;
          int qmax = 0;
          for (std::size_t c = 0; c < 67; ++c) {
            amax = std::max(amax, std::fabs(x.at(b, h, j, c)));
            qmax = std::max(qmax, std::abs(int(qz.q.at(b, h, j, c))));
          }
          const float nearest = amax / 127.0f;
          if (amax == 0) {
            ASSERT_EQ(s, 0.0f);
            for (std::size_t c = 0; c < 67; ++c)
              ASSERT_EQ(qz.q.at(b, h, j, c), 0);
            continue;
          }
          if (nearest >= std::numeric_limits<float>::min()) {
            ASSERT_EQ(s, nearest) << b << h << j;
            ASSERT_EQ(qmax, 127) << "the largest |x| maps to 127";
          } else {
            // Subnormal: the smallest float with 127 s >= amax.
            ASSERT_GE(double(s) * 127.0, double(amax)) << b << h << j;
            ASSERT_LT(double(std::nextafter(s, 0.0f)) * 127.0, double(amax))
                << b << h << j;
            ASSERT_LE(qmax, 127);
          }
          for (std::size_t c = 0; c < 67; ++c) {
            const double err = std::fabs(double(qz.deq.at(b, h, j, c)) -
                                         double(x.at(b, h, j, c)));
            worst = std::max(worst, err / s);
            ASSERT_LE(err, (0.5 + 0x1p-15) * double(s))
                << "x " << x.at(b, h, j, c) << " q " << int(qz.q.at(b, h, j, c))
                << " scale " << s;
          }
        }
    std::printf("[ int8 ] range %g: max |scale q - x| / scale = %.6f\n", range,
                worst);
    // The scales' padding (NaN) is untouched.
    EXPECT_TRUE(padding_intact(qz.scales, kNaNF));
  }
}

// Rows whose scale is subnormal or would round to 0 (found by the Python
// tests): [3, 1] 2^-149 gave scale 0 and values [127, 127]; a row of
// maximum 10334 2^-149 gave an error of 0.58 scale.
TEST(AttentionInt8, QuantizeKvTinyRows) {
  const float t = 0x1p-149f;
  const float rows[3][2] = {{3 * t, t}, {10334 * t, -5000 * t}, {-t, 0.0f}};
  for (const auto& row : rows) {
    std::int8_t q[2] = {99, 99};
    float s = -1.0f;
    softdot::quantize_kv(TensorView<const float>(row, 1, 1, 1, 2),
                         TensorView<std::int8_t>(q, 1, 1, 1, 2),
                         TensorView<float>(&s, 1, 1, 1, 1));
    EXPECT_GT(s, 0.0f);
    for (int c = 0; c < 2; ++c) {
      const double err = std::fabs(double(float(q[c]) * s) - double(row[c]));
      EXPECT_LE(err, (0.5 + 0x1p-15) * double(s))
          << row[c] << " -> " << int(q[c]) << " x " << s;
    }
  }
  // The first: scale 2^-149 (3/127 rounds up to it), values exact.
  std::int8_t q[2];
  float s;
  softdot::quantize_kv(TensorView<const float>(rows[0], 1, 1, 1, 2),
                       TensorView<std::int8_t>(q, 1, 1, 1, 2),
                       TensorView<float>(&s, 1, 1, 1, 1));
  EXPECT_EQ(s, t);
  EXPECT_EQ(q[0], 3);
  EXPECT_EQ(q[1], 1);
}

TEST(AttentionInt8, QuantizeKvErrorsWriteNothing) {
  Tensor<float> x(1, 2, 3, 8, 0, 0.5f);
  x.at(0, 1, 2, 5) = kNaNF;
  Tensor<std::int8_t> q(1, 2, 3, 8, 0, std::int8_t{7});
  Tensor<float> s(1, 2, 3, 1, 0, 9.0f);
  try {
    softdot::quantize_kv(x.cview(), q.view(), s.view());
    ADD_FAILURE() << "NaN accepted";
  } catch (const std::invalid_argument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("quantize_kv"), std::string::npos) << m;
    EXPECT_NE(m.find("[0, 1, 2, 5]"), std::string::npos) << m;
  }
  for (auto v : q.dense()) EXPECT_EQ(v, 7);
  for (auto v : s.dense()) EXPECT_EQ(v, 9.0f);
  Tensor<float> s_bad(1, 2, 4, 1, 0, 9.0f);
  x.at(0, 1, 2, 5) = 1.0f;
  EXPECT_THROW(softdot::quantize_kv(x.cview(), q.view(), s_bad.view()),
               std::invalid_argument);
  Tensor<std::int8_t> q_bad(1, 2, 3, 9, 0, std::int8_t{7});
  EXPECT_THROW(softdot::quantize_kv(x.cview(), q_bad.view(), s.view()),
               std::invalid_argument);
}

// One problem with int8 K/V: q, the quantised k and v, and float tensors
// holding their dequantised values.
struct Int8Problem {
  Problem<float> f;  // q, and k / v replaced by the dequantised values
  Quantized k, v;
};

Int8Problem make_int8(const Shape& s) {
  Int8Problem p;
  p.f = make_problem<float>(s);
  p.k = quantize(p.f.k, s.pad);
  p.v = quantize(p.f.v, s.pad);
  p.f.k = p.k.deq;
  p.f.v = p.v.deq;
  p.f.rewiden();
  return p;
}

void expect_int8_equals_float(const std::string& label, const Int8Problem& p,
                              const AttentionOptions& o) {
  const Shape& s = p.f.s;
  const std::string what = label + " " + s.str();
  const Result want = run(p.f, o);
  Result got{Tensor<float>(s.B, s.H, s.nq, s.dv, s.pad + 1, kOutSentinel), {}};
  got.lse.assign(s.B * s.H * s.nq + kLseGuard, kLseSentinel);
  softdot::attention(p.f.q.cview(), p.k.view(), p.v.view(), got.o.view(), o,
                     got.lse.data());
  EXPECT_TRUE(got.guards_ok()) << what;
  EXPECT_TRUE(SameBits(got.all(), want.all())) << what << ": attention";
  // attention_partial.
  softdot::AttentionPartial pa, pf;
  softdot::attention_partial(p.f.q.cview(), p.k.view(), p.v.view(), pa, o);
  softdot::attention_partial(p.f.q.cview(), p.f.k.cview(), p.f.v.cview(), pf,
                             o);
  EXPECT_TRUE(SameBits(pa.out, pf.out) && SameBits(pa.sum, pf.sum) &&
              SameBits(pa.max, pf.max))
      << what << ": attention_partial";
  // attention_weights and attention_scores.
  if (s.nq * s.nkv <= 100000) {
    Tensor<float> wa(s.B, s.H, s.nq, s.nkv, 0, 0.0f), wf = wa;
    softdot::attention_weights(p.f.q.cview(), p.k.view(), wa.view(), o);
    softdot::attention_weights(p.f.q.cview(), p.f.k.cview(), wf.view(), o);
    EXPECT_TRUE(SameBits(wa.dense(), wf.dense()))
        << what << ": attention_weights";
    softdot::attention_scores(p.f.q.cview(), p.k.view(), wa.view(), o);
    softdot::attention_scores(p.f.q.cview(), p.f.k.cview(), wf.view(), o);
    EXPECT_TRUE(SameBits(wa.dense(), wf.dense()))
        << what << ": attention_scores";
  }
}

class Int8Targets : public PerTarget {};

// Every form, strided views, every option case; on every target (the
// widening is vector code with a scalar tail: d not a multiple of the
// lanes).
TEST_P(Int8Targets, EqualsFloatOnTheDequantisedValues) {
  for (const FormShape& f : form_shapes()) {
    const Int8Problem p = make_int8(f.shape);
    const SweepArrays x(f.shape);
    for (const OptionCase& c : option_sweep()) {
      expect_int8_equals_float(std::string(f.name) + ", " + c.name, p,
                               c.make(x));
    }
  }
}

SOFTDOT_INSTANTIATE_PER_TARGET(Int8Targets);

// Against the long-double reference on the dequantised values: the bound of
// attention.h, as for float K/V.
TEST(AttentionInt8, WithinTheBoundOfTheDequantisedValues) {
  Shape s{.B = 1,
          .H = 8,
          .Hkv = 2,
          .nq = 1,
          .nkv = 3000,
          .d = 128,
          .dv = 128,
          .seed = 510};
  const Int8Problem p = make_int8(s);
  const AttnRef ref = reference(p.f, {});
  Result got{Tensor<float>(s.B, s.H, s.nq, s.dv, 1, kOutSentinel), {}};
  got.lse.assign(s.B * s.H * s.nq + kLseGuard, kLseSentinel);
  softdot::attention(p.f.q.cview(), p.k.view(), p.v.view(), got.o.view(), {},
                     got.lse.data());
  Stats st;
  check_output(ref, got.o, got.lse.data(), "int8 decode", st);
  print_stats("int8 decode " + s.str(), st);
}

TEST(AttentionInt8, BadScalesAreErrors) {
  Shape s{.B = 1, .H = 2, .Hkv = 1, .nq = 3, .nkv = 10, .d = 8, .dv = 8};
  Int8Problem p = make_int8(s);
  Tensor<float> out(1, 2, 3, 8, 0, kOutSentinel);
  auto expect = [&](const std::string& what, const Int8KV& k, const Int8KV& v,
                    const std::vector<std::string>& needles) {
    expect_invalid(
        what, [&] { softdot::attention(p.f.q.cview(), k, v, out.view()); },
        needles);
    for (float x : out.dense()) EXPECT_EQ(bits(x), bits(kOutSentinel)) << what;
  };
  Quantized k2 = p.k;
  k2.scales.at(0, 0, 4, 0) = -1.0f;
  expect("negative scale", k2.view(), p.v.view(),
         {"attention", "k scales[0, 0, 4]", "-1"});
  Quantized v2 = p.v;
  v2.scales.at(0, 0, 9, 0) = kNaNF;
  expect("NaN scale", p.k.view(), v2.view(), {"v scales[0, 0, 9]"});
  Tensor<float> short_scales(1, 1, 9, 1, 0, 1.0f);
  expect("scales shape", {p.k.q.cview(), short_scales.cview()}, p.v.view(),
         {"k scales [1, 1, 9, 1]", "[1, 1, 10, 1]"});
}

}  // namespace
}  // namespace softdot_test
