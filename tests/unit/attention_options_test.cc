// Attention tests: Every option of AttentionOptions (causal, window, mask,
// bias, softcap, sinks) against the reference.
#include "attention_test_util.h"

namespace softdot_test {
namespace {

// ---- options ---------------------------------------------------------------

TEST(AttentionOptions, Causal) {
  AttentionOptions o;
  o.causal = true;
  const std::size_t shapes[][2] = {{7, 65}, {65, 65},  {130, 130},
                                   {65, 7}, {1, 1000}, {200, 1000}};
  for (const auto& sh : shapes) {
    Shape s{.B = 1,
            .H = 2,
            .Hkv = 1,
            .nq = sh[0],
            .nkv = sh[1],
            .d = 64,
            .dv = 64,
            .pad = 1,
            .seed = 30 + sh[0]};
    accuracy_case<float>("causal", make_problem<float>(s), o);
  }
  Shape s{.B = 2,
          .H = 4,
          .Hkv = 2,
          .nq = 100,
          .nkv = 70,
          .d = 32,
          .dv = 48,
          .seed = 31};
  accuracy_case<Float16>("causal", make_problem<Float16>(s), o);
  accuracy_case<BFloat16>("causal", make_problem<BFloat16>(s), o);
}

TEST(AttentionOptions, Window) {
  const std::ptrdiff_t windows[][3] = {// left, right, causal
                                       {5, -1, 0},      {-1, 3, 0}, {10, 4, 0},
                                       {20, -1, 1},     {0, 0, 0},  {70, 70, 0},
                                       {1000, 1000, 0}, {3, 50, 1}, {0, -1, 1}};
  std::uint64_t seed = 40;
  for (const auto& w : windows) {
    AttentionOptions o;
    o.window_left = w[0];
    o.window_right = w[1];
    o.causal = w[2] != 0;
    const std::string label = "window " + std::to_string(w[0]) + "/" +
                              std::to_string(w[1]) +
                              (o.causal ? " causal" : "");
    for (const auto& sh : {std::pair<std::size_t, std::size_t>{130, 130},
                           {30, 200},
                           {150, 40}}) {
      Shape s{.B = 1,
              .H = 2,
              .Hkv = 2,
              .nq = sh.first,
              .nkv = sh.second,
              .d = 32,
              .dv = 16,
              .seed = seed++};
      accuracy_case<float>(label, make_problem<float>(s), o);
    }
  }
  AttentionOptions o;
  o.window_left = 100;
  o.window_right = 0;
  Shape s{.B = 1,
          .H = 8,
          .Hkv = 2,
          .nq = 1,
          .nkv = 3000,
          .d = 64,
          .dv = 64,
          .seed = 49};
  accuracy_case<Float16>("window 100/0 decode", make_problem<Float16>(s), o);
}

TEST(AttentionOptions, MaskBroadcast) {
  const std::size_t B = 2, H = 4, Hkv = 2, nq = 33, nkv = 150;
  Shape s{.B = B,
          .H = H,
          .Hkv = Hkv,
          .nq = nq,
          .nkv = nkv,
          .d = 64,
          .dv = 64,
          .pad = 1,
          .seed = 50};
  const auto p = make_problem<float>(s);
  const auto pb = make_problem<BFloat16>(s);
  struct Variant {
    const char* name;
    std::size_t mb, mh, rows;
  };
  const Variant variants[] = {
      {"mask full", B, H, nq},
      {"mask batch 1", 1, H, nq},
      {"mask heads 1", B, 1, nq},
      {"mask batch 1 heads 1", 1, 1, nq},
      {"mask row stride 0", B, H, 1},
      {"mask batch stride 0, row stride 0", 1, 1, 1},
  };
  std::uint64_t seed = 51;
  for (const auto& v : variants) {
    Tensor<bool> m = random_mask(v.mb, v.mh, v.rows, nkv, seed++);
    AttentionOptions o;
    if (std::string(v.name) == "mask batch stride 0, row stride 0") {
      // batch = B and heads = H given, but with strides 0.
      o.mask = TensorView<const bool>(m.data(), B, H, nq, nkv, 0, 0, 0);
    } else if (v.rows == 1) {
      o.mask =
          TensorView<const bool>(m.data(), v.mb, v.mh, nq, nkv, m.bs, m.hs, 0);
    } else {
      o.mask = m.cview();
    }
    accuracy_case<float>(v.name, p, o);
    accuracy_case<BFloat16>(v.name, pb, o);
    o.causal = true;
    accuracy_case<float>(std::string(v.name) + " causal", p, o);
  }
}

TEST(AttentionOptions, Bias) {
  const std::size_t B = 2, H = 4, Hkv = 2, nq = 40, nkv = 100;
  Shape s{.B = B,
          .H = H,
          .Hkv = Hkv,
          .nq = nq,
          .nkv = nkv,
          .d = 64,
          .dv = 32,
          .pad = 2,
          .seed = 60};
  const auto p = make_problem<float>(s);
  const auto ph = make_problem<Float16>(s);
  std::mt19937_64 rng(61);
  std::uniform_real_distribution<double> u(-3, 3);
  // Full-shape bias with some -inf (which mask).
  Tensor<float> bias(B, H, nq, nkv, 1, kNaNF);
  bias.for_each([&](float& x) { x = rng() % 7 == 0 ? -kInfF : float(u(rng)); });
  AttentionOptions o;
  o.bias = bias.cview();
  accuracy_case<float>("bias with -inf", p, o);
  accuracy_case<Float16>("bias with -inf", ph, o);
  o.causal = true;
  accuracy_case<float>("bias with -inf, causal", p, o);
  // Broadcast: heads 1, one row for every query (ALiBi-like per key).
  Tensor<float> b1(B, 1, 1, nkv, 0, kNaNF);
  b1.for_each([&](float& x) { x = float(u(rng)); });
  AttentionOptions o2;
  o2.bias = TensorView<const float>(b1.data(), B, 1, nq, nkv, b1.bs, 0, 0);
  accuracy_case<float>("bias heads 1, row stride 0", p, o2);
  // Bias and mask together.
  Tensor<bool> m = random_mask(1, H, nq, nkv, 62);
  o2.mask = m.cview();
  accuracy_case<float>("bias and mask", p, o2);
}

TEST(AttentionOptions, Softcap) {
  Shape s{.B = 1,
          .H = 2,
          .Hkv = 1,
          .nq = 65,
          .nkv = 150,
          .d = 64,
          .dv = 64,
          .qk = 3.0,
          .seed = 70};
  const auto p = make_problem<float>(s);
  const auto pb = make_problem<BFloat16>(s);
  for (float cap : {5.0f, 30.0f, 50.0f}) {
    AttentionOptions o;
    o.softcap = cap;
    o.scale = 0.25;
    const std::string label = "softcap " + fmt(cap);
    accuracy_case<float>(label, p, o);
    accuracy_case<BFloat16>(label, pb, o);
    // The cap applies before the bias: a bias pushes past the cap.
    Tensor<float> bias(1, 2, s.nq, s.nkv, 0, kNaNF);
    std::mt19937_64 rng(71);
    std::uniform_real_distribution<double> u(-20, 20);
    bias.for_each([&](float& x) { x = float(u(rng)); });
    o.bias = bias.cview();
    o.causal = true;
    accuracy_case<float>(label + ", bias, causal", p, o);
  }
}

TEST(AttentionOptions, Sinks) {
  Shape s{.B = 2,
          .H = 4,
          .Hkv = 2,
          .nq = 33,
          .nkv = 130,
          .d = 64,
          .dv = 64,
          .pad = 1,
          .seed = 80};
  const auto p = make_problem<float>(s);
  const auto ph = make_problem<Float16>(s);
  // -inf (no effect), moderate ones, one that dominates (weights ~e^-20).
  const std::vector<float> sinks = {-kInfF, 0.5f, 3.0f, 20.0f};
  AttentionOptions o;
  o.sinks = sinks;
  accuracy_case<float>("sinks -inf/0.5/3/20", p, o);
  accuracy_case<Float16>("sinks -inf/0.5/3/20", ph, o);
  o.causal = true;
  accuracy_case<float>("sinks, causal", p, o);
  o.window_left = 10;
  accuracy_case<float>("sinks, causal, window 10", p, o);
  // A sink of -inf changes nothing: the same bits as no sink.
  const std::vector<float> none(4, -kInfF);
  AttentionOptions a, b;
  a.sinks = none;
  EXPECT_TRUE(SameBits(run(p, a).all(), run(p, b).all()))
      << "sinks of -inf differ from no sinks";
  // Decode split with sinks.
  Shape sd{.B = 1,
           .H = 4,
           .Hkv = 2,
           .nq = 1,
           .nkv = 3000,
           .d = 64,
           .dv = 64,
           .seed = 81};
  AttentionOptions od;
  od.sinks = sinks;
  accuracy_case<float>("sinks decode", make_problem<float>(sd), od);
}

// A sink far above every score: the weights are below e^-900, so the exact
// output is below 1e-390 (which float cannot hold), and lse is the sink.
// The bound of attention.h has no underflow term, so here the output is
// checked to be (nearly) zero: |O| <= 2^-126, the smallest normal float.
TEST(AttentionOptions, LargeSink) {
  Shape s{.B = 1,
          .H = 4,
          .Hkv = 2,
          .nq = 9,
          .nkv = 200,
          .d = 64,
          .dv = 64,
          .seed = 90};
  const auto p = make_problem<float>(s);
  const std::vector<float> sinks = {1000.0f, 0.0f, 1e4f, -kInfF};
  AttentionOptions o;
  o.sinks = sinks;
  const AttnRef ref = reference(p, o);
  for (const auto& t : all_targets()) {
    softdot::force_simd_target(t);
    const Result r = run(p, o);
    Stats st;
    check_output(ref, r.o, r.lse.data(), "large sink [" + t + "]", st,
                 [](std::size_t, std::size_t h, std::size_t) {
                   return h == 0 || h == 2;
                 });
    for (std::size_t h : {0, 2}) {
      for (std::size_t i = 0; i < s.nq; ++i) {
        for (std::size_t c = 0; c < s.dv; ++c) {
          const float got = r.o.at(0, h, i, c);
          EXPECT_TRUE(std::fabs(got) <= 0x1p-126f)
              << "large sink [" << t << "] h=" << h << " i=" << i << " c=" << c
              << ": " << fmt(got);
        }
        const std::size_t row = ref.li(0, h, i);
        std::string why;
        double ratio = 0;
        EXPECT_TRUE(
            check_lse(r.lse[row], ref.lse[row], ref.D[row], &why, &ratio))
            << "large sink [" << t << "] lse h=" << h << " i=" << i << ": "
            << fmt(r.lse[row]) << " want " << fmt(double(ref.lse[row])) << ": "
            << why;
      }
    }
    if (t == all_targets().front())
      print_stats("f32 large sinks 1000/0/1e4/-inf " + s.str(), st);
  }
  softdot::force_simd_target("");
}

// A row with no visible key but a sink: the output is +0, and lse is the
// log of its denominator exp(sink) (the lse definition of attention.h),
// which is what lets such a part merge correctly (see
// AttentionMerge.SinkOnAFullyMaskedPart), as the header's special-value
// paragraph states.
TEST(AttentionOptions, SinkOnFullyMaskedRow) {
  Shape s{.B = 1,
          .H = 2,
          .Hkv = 1,
          .nq = 20,
          .nkv = 8,
          .d = 16,
          .dv = 16,
          .seed = 95};
  const auto p = make_problem<float>(s);
  const std::vector<float> sinks = {1.5f, -kInfF};
  AttentionOptions o;
  o.sinks = sinks;
  o.causal = true;  // rows 0..11 see nothing
  const Result r = run(p, o);
  for (std::size_t h = 0; h < 2; ++h) {
    for (std::size_t i = 0; i < 12; ++i) {
      for (std::size_t c = 0; c < s.dv; ++c) {
        EXPECT_EQ(bits(r.o.at(0, h, i, c)), 0u) << "h=" << h << " i=" << i;
      }
      const float want = h == 0 ? 1.5f : -kInfF;
      EXPECT_EQ(r.lse[h * s.nq + i], want)
          << "lse of a fully masked row with sink " << fmt(sinks[h])
          << ", h=" << h << " i=" << i;
    }
  }
}

}  // namespace
}  // namespace softdot_test
