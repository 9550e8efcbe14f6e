// The attention request (attention_request.h): every public entry point is
// a request, so a request gives the entry point's bits; the plan's derived
// values (scale, visible keys, form); and each option's bad value gives one
// message, the same from every entry point (after the "<name>: " prefix).
#include "softdot/attention_request.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "softdot/attention.h"

namespace softdot {
namespace {

// Bitwise equality of two float vectors (NaN compared by its bits).
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::bit_cast<std::uint32_t>(a[i]) !=
        std::bit_cast<std::uint32_t>(b[i])) {
      return false;
    }
  }
  return true;
}

constexpr std::size_t kB = 1, kH = 2, kHkv = 1, kNq = 3, kNkv = 5, kD = 4;

std::vector<float> ramp(std::size_t n, float step) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    v[i] = std::sin(static_cast<float>(i) * step) * 2.0f;
  }
  return v;
}

struct Inputs {
  std::vector<float> q = ramp(kB * kH * kNq * kD, 0.37f);
  std::vector<float> k = ramp(kB * kHkv * kNkv * kD, 0.53f);
  std::vector<float> v = ramp(kB * kHkv * kNkv * kD, 0.71f);
  // The same keys and values as one sequence in pages of 2 tokens, pages
  // in reverse order: [pages, H_kv, page_size, d].
  std::vector<float> kp, vp;
  std::vector<std::int32_t> table = {2, 1, 0};
  std::vector<std::int32_t> lens = {static_cast<std::int32_t>(kNkv)};
  Inputs() {
    kp.assign(3 * kHkv * 2 * kD, 0.0f);
    vp.assign(3 * kHkv * 2 * kD, 0.0f);
    for (std::size_t j = 0; j < kNkv; ++j) {
      const std::size_t page = static_cast<std::size_t>(table[j / 2]);
      std::memcpy(&kp[(page * 2 + j % 2) * kD], &k[j * kD], kD * sizeof(float));
      std::memcpy(&vp[(page * 2 + j % 2) * kD], &v[j * kD], kD * sizeof(float));
    }
  }
  TensorView<const float> qv() const { return {q.data(), kB, kH, kNq, kD}; }
  TensorView<const float> kv() const { return {k.data(), kB, kHkv, kNkv, kD}; }
  TensorView<const float> vv() const { return {v.data(), kB, kHkv, kNkv, kD}; }
  TensorView<const float> kpv() const { return {kp.data(), 3, kHkv, 2, kD}; }
  TensorView<const float> vpv() const { return {vp.data(), 3, kHkv, 2, kD}; }
  PagedKVTable paged() const { return {table, 3, lens}; }
};

TEST(AttentionRequest, RequestsGiveTheEntryPointsBits) {
  const Inputs in;
  AttentionOptions o;
  o.causal = true;
  o.softcap = 5.0f;
  const std::size_t n = kB * kH * kNq * kD;
  std::vector<float> want(n), want_lse(kB * kH * kNq);
  attention(in.qv(), in.kv(), in.vv(), {want.data(), kB, kH, kNq, kD}, o,
            want_lse.data());

  std::vector<float> got(n), got_lse(kB * kH * kNq);
  AttentionRequest r;
  r.q = in.qv();
  r.kv = KVSource::contiguous(in.kv(), in.vv());
  r.target =
      AttentionTarget::output({got.data(), kB, kH, kNq, kD}, got_lse.data());
  r.options = o;
  run_attention(r);
  EXPECT_TRUE(same_bits(want, got));
  EXPECT_TRUE(same_bits(want_lse, got_lse));

  // Paged, through the same request type.
  std::fill(got.begin(), got.end(), -1.0f);
  r.kv = KVSource::pages(in.kpv(), in.vpv(), in.paged());
  run_attention(r);
  EXPECT_TRUE(same_bits(want, got));

  // Partial, then finalised.
  AttentionPartial part;
  r.kv = KVSource::contiguous(in.kv(), in.vv());
  r.target = AttentionTarget::partial_result(part);
  run_attention(r);
  std::fill(got.begin(), got.end(), -1.0f);
  attention_finalize(part, {got.data(), kB, kH, kNq, kD}, got_lse.data());
  EXPECT_TRUE(same_bits(want, got));

  // Scores: the request's equal attention_scores'.
  std::vector<float> s1(kB * kH * kNq * kNkv), s2(s1.size());
  attention_scores(in.qv(), in.kv(), {s1.data(), kB, kH, kNq, kNkv}, o);
  r.kv = KVSource::keys(in.kv());
  r.target = AttentionTarget::scores({s2.data(), kB, kH, kNq, kNkv});
  run_attention(r);
  EXPECT_TRUE(same_bits(s1, s2));
}

TEST(AttentionRequest, PlanDerivedValues) {
  const Inputs in;
  std::vector<float> out(kB * kH * kNq * kD);
  AttentionRequest r;
  r.q = in.qv();
  r.kv = KVSource::contiguous(in.kv(), in.vv());
  r.target = AttentionTarget::output({out.data(), kB, kH, kNq, kD});
  {
    const AttentionPlan p = AttentionPlan::make(r);
    EXPECT_EQ(p.scale(), static_cast<float>(1.0 / std::sqrt(4.0)));
    EXPECT_EQ(p.batch(), kB);
    EXPECT_EQ(p.heads(), kH);
    EXPECT_EQ(p.kv_heads(), kHkv);
    EXPECT_EQ(p.query_rows(), kNq);
    EXPECT_EQ(p.keys(0), kNkv);
    EXPECT_EQ(p.form(), AttentionForm::kDecode);  // 2 x 3 rows per KV head
    for (std::size_t i = 0; i < kNq; ++i) {
      EXPECT_EQ(p.visible_keys(0, i).begin, 0u);
      EXPECT_EQ(p.visible_keys(0, i).end, kNkv);
    }
  }
  // Causal (bottom-right: query i at position i + 2), a left window of 1
  // and keys [1, 4): query 0 sees keys 1..2, query 1 keys 2..3, query 2
  // key 3 (4 is out of the range).
  r.options.scale = 0.3;
  r.options.causal = true;
  r.options.window_left = 1;
  r.options.kv_begin = 1;
  r.options.kv_end = 4;
  {
    const AttentionPlan p = AttentionPlan::make(r);
    EXPECT_EQ(p.scale(), 0.3f);
    const KeyRange k0 = p.visible_keys(0, 0), k1 = p.visible_keys(0, 1),
                   k2 = p.visible_keys(0, 2);
    EXPECT_EQ(k0.begin, 1u);
    EXPECT_EQ(k0.end, 3u);
    EXPECT_EQ(k1.begin, 2u);
    EXPECT_EQ(k1.end, 4u);
    EXPECT_EQ(k2.begin, 3u);
    EXPECT_EQ(k2.end, 4u);
  }
  // Paged: each sequence its own length.
  r.options = {};
  r.kv = KVSource::pages(in.kpv(), in.vpv(), in.paged());
  r.options.causal = true;
  const AttentionPlan p = AttentionPlan::make(r);
  EXPECT_EQ(p.keys(0), kNkv);
  EXPECT_EQ(p.visible_keys(0, 0).end, 3u);  // query 0 at position 2
  EXPECT_EQ(p.visible_keys(0, 2).end, 5u);
  EXPECT_TRUE(p.request().kv.paged);
}

TEST(AttentionRequest, MismatchedFormatsAndTargets) {
  const Inputs in;
  std::vector<Float16> v16(in.v.size());
  std::vector<float> out(kB * kH * kNq * kD);
  AttentionRequest r;
  r.name = "my_entry";
  r.q = in.qv();
  r.kv = KVSource::contiguous(
      in.kv(), TensorView<const Float16>(v16.data(), kB, kHkv, kNkv, kD));
  r.target = AttentionTarget::output({out.data(), kB, kH, kNq, kD});
  try {
    run_attention(r);
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(
        e.what(),
        "softdot::my_entry: k is float32 but v is float16; they must have the "
        "same format");
  }
  r.kv = KVSource::keys(in.kv());
  try {
    run_attention(r);
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "softdot::my_entry: the request has no values (v)");
  }
}

// One bad value of one option.
struct BadOption {
  const char* what;
  std::function<void(AttentionOptions&)> set;
  std::string message;  // after "<entry point>: "
};

std::vector<BadOption> bad_options() {
  return {
      {"scale 0", [](AttentionOptions& o) { o.scale = 0.0; },
       "scale must be finite and > 0 (also as a float), got 0"},
      {"scale -inf",
       [](AttentionOptions& o) {
         o.scale = -std::numeric_limits<double>::infinity();
       },
       "scale must be finite and > 0 (also as a float), got -inf"},
      {"scale underflowing float", [](AttentionOptions& o) { o.scale = 1e-50; },
       "scale must be finite and > 0 (also as a float), got 1e-50"},
      {"softcap -1", [](AttentionOptions& o) { o.softcap = -1.0f; },
       "softcap must be finite and >= 0, got -1"},
      {"softcap inf",
       [](AttentionOptions& o) {
         o.softcap = std::numeric_limits<float>::infinity();
       },
       "softcap must be finite and >= 0, got inf"},
      {"window_left -2", [](AttentionOptions& o) { o.window_left = -2; },
       "window_left and window_right must be >= -1, got -2 and -1"},
      {"window_right -3", [](AttentionOptions& o) { o.window_right = -3; },
       "window_left and window_right must be >= -1, got -1 and -3"},
      {"kv_begin past kv_end",
       [](AttentionOptions& o) {
         o.kv_begin = 4;
         o.kv_end = 3;
       },
       "kv_begin 4 is past kv_end 3"},
      {"sinks of the wrong size",
       [](AttentionOptions& o) {
         static const float s[3] = {0, 0, 0};
         o.sinks = std::span<const float>(s, 3);
       },
       "sinks has 3 values but q [1, 2, 3, 4] has 2 heads"},
  };
}

// Every entry point with options o; returns the message of its
// std::invalid_argument after "softdot::<name>: " (checked), or "no error".
std::vector<std::pair<std::string, std::string>> messages(
    const Inputs& in, const AttentionOptions& o) {
  std::vector<float> out(kB * kH * kNq * kD), sc(kB * kH * kNq * kNkv);
  const TensorView<float> ov(out.data(), kB, kH, kNq, kD);
  const TensorView<float> sv(sc.data(), kB, kH, kNq, kNkv);
  AttentionPartial part;
  const std::vector<std::pair<std::string, std::function<void()>>> calls = {
      {"attention", [&] { attention(in.qv(), in.kv(), in.vv(), ov, o); }},
      {"attention_partial",
       [&] { attention_partial(in.qv(), in.kv(), in.vv(), part, o); }},
      {"paged_attention",
       [&] {
         paged_attention(in.qv(), in.kpv(), in.vpv(), in.paged(), ov, o);
       }},
      {"paged_attention_partial",
       [&] {
         paged_attention_partial(in.qv(), in.kpv(), in.vpv(), in.paged(), part,
                                 o);
       }},
      {"attention_weights",
       [&] { attention_weights(in.qv(), in.kv(), sv, o); }},
      {"attention_scores", [&] { attention_scores(in.qv(), in.kv(), sv, o); }},
      {"my_request",
       [&] {
         AttentionRequest r;
         r.name = "my_request";
         r.q = in.qv();
         r.kv = KVSource::contiguous(in.kv(), in.vv());
         r.target = AttentionTarget::output(ov);
         r.options = o;
         (void)AttentionPlan::make(r);
       }},
  };
  std::vector<std::pair<std::string, std::string>> got;
  for (const auto& [name, call] : calls) {
    std::string m = "no error";
    try {
      call();
    } catch (const std::invalid_argument& e) {
      m = e.what();
      const std::string prefix = "softdot::" + name + ": ";
      if (m.rfind(prefix, 0) == 0) {
        m = m.substr(prefix.size());
      } else {
        m = "without the prefix '" + prefix + "': " + m;
      }
    }
    got.emplace_back(name, m);
  }
  return got;
}

TEST(AttentionRequest, EachBadOptionGivesOneMessageFromEveryEntryPoint) {
  const Inputs in;
  for (const BadOption& b : bad_options()) {
    AttentionOptions o;
    b.set(o);
    for (const auto& [name, m] : messages(in, o)) {
      EXPECT_EQ(m, b.message) << b.what << " through " << name;
    }
  }
}

TEST(AttentionRequest, KvBeginPastTheKeysNamesTheCallersRange) {
  const Inputs in;
  std::vector<float> out(kB * kH * kNq * kD);
  AttentionOptions o;
  o.kv_begin = 12;
  o.kv_end = 20;
  try {
    attention(in.qv(), in.kv(), in.vv(), {out.data(), kB, kH, kNq, kD}, o);
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(
        e.what(),
        "softdot::attention: kv_begin 12 is past n_kv = 5 (kv_end 20)");
  }
  o.kv_end = std::numeric_limits<std::size_t>::max();
  try {
    attention(in.qv(), in.kv(), in.vv(), {out.data(), kB, kH, kNq, kD}, o);
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "softdot::attention: kv_begin 12 is past n_kv = 5");
  }
}

}  // namespace
}  // namespace softdot
