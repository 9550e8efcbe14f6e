// Attention tests: The float16 / bfloat16 conversions: exhaustive widening,
// round trips and rounding at every midpoint.
#include "attention_test_util.h"

namespace softdot_test {
namespace {

// ---- Float16 / BFloat16 ----------------------------------------------------

// Independent decoding of binary16.
float decode_f16(std::uint16_t h) {
  const int e = (h >> 10) & 0x1f;
  const int m = h & 0x3ff;
  float v;
  if (e == 0) {
    v = std::ldexp(float(m), -24);
  } else if (e == 31) {
    v = m ? kNaNF : kInfF;
  } else {
    v = std::ldexp(float(m + 1024), e - 25);
  }
  return (h & 0x8000) ? -v : v;
}

TEST(AttentionConvert, Float16Exhaustive) {
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const float want = decode_f16(std::uint16_t(h));
    const float got = softdot::to_float(Float16{std::uint16_t(h)});
    ASSERT_TRUE(same_value(got, want)) << "to_float(Float16 " << h << ")";
    if (!std::isnan(want)) {
      ASSERT_EQ(softdot::to_float16(want).bits, h) << "round trip " << h;
    } else {
      ASSERT_TRUE(std::isnan(softdot::to_float(softdot::to_float16(want))));
    }
  }
  // Ties to even, just below and just above every midpoint between adjacent
  // positive finite values (the last one rounds up to inf on a tie: 0x7BFF
  // is odd), also negated.
  for (std::uint32_t h = 0; h < 0x7C00; ++h) {
    const double a = decode_f16(std::uint16_t(h));
    const double b =
        h + 1 < 0x7C00 ? decode_f16(std::uint16_t(h + 1)) : 65536.0;
    const float mid = float((a + b) / 2);  // exact: 12 significant bits
    ASSERT_EQ(double(mid), (a + b) / 2);
    const std::uint16_t even =
        (h & 1) ? std::uint16_t(h + 1) : std::uint16_t(h);
    for (float sign : {1.0f, -1.0f}) {
      const std::uint16_t sb = sign < 0 ? 0x8000 : 0;
      ASSERT_EQ(softdot::to_float16(sign * mid).bits, even | sb) << h;
      ASSERT_EQ(softdot::to_float16(sign * std::nextafter(mid, 0.0f)).bits,
                h | sb)
          << h;
      ASSERT_EQ(softdot::to_float16(sign * std::nextafter(mid, kInfF)).bits,
                (h + 1) | sb)
          << h;
    }
  }
  EXPECT_EQ(softdot::to_float16(1e10f).bits, 0x7C00);
  EXPECT_EQ(softdot::to_float16(-kInfF).bits, 0xFC00);
  EXPECT_EQ(softdot::to_float16(65519.99f).bits, 0x7BFF);
  EXPECT_EQ(softdot::to_float16(0x1p-25f).bits, 0);  // tie to even: 0
  EXPECT_EQ(softdot::to_float16(0x1.8p-25f).bits, 1);
  EXPECT_EQ(softdot::to_float16(-0.0f).bits, 0x8000);
  EXPECT_TRUE(std::isnan(softdot::to_float(softdot::to_float16(kNaNF))));
}

TEST(AttentionConvert, BFloat16Exhaustive) {
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const float want = std::bit_cast<float>(h << 16);
    const float got = softdot::to_float(BFloat16{std::uint16_t(h)});
    ASSERT_TRUE(same_value(got, want)) << "to_float(BFloat16 " << h << ")";
    if (!std::isnan(want)) {
      ASSERT_EQ(softdot::to_bfloat16(want).bits, h) << "round trip " << h;
    }
  }
  for (std::uint32_t h = 0; h < 0x7F80; ++h) {
    const std::uint32_t mid = (h << 16) | 0x8000;
    const std::uint16_t even =
        (h & 1) ? std::uint16_t(h + 1) : std::uint16_t(h);
    for (std::uint32_t sb : {0u, 0x80000000u}) {
      const std::uint16_t s16 = sb ? 0x8000 : 0;
      ASSERT_EQ(softdot::to_bfloat16(std::bit_cast<float>(mid | sb)).bits,
                even | s16)
          << h;
      ASSERT_EQ(softdot::to_bfloat16(std::bit_cast<float>((mid - 1) | sb)).bits,
                h | s16)
          << h;
      ASSERT_EQ(softdot::to_bfloat16(std::bit_cast<float>((mid + 1) | sb)).bits,
                (h + 1) | s16)
          << h;
    }
  }
  // NaN stays NaN, even a signalling NaN whose payload is only in the low
  // half (truncating or rounding the bits would give inf).
  for (std::uint32_t nan :
       {0x7F800001u, 0xFF800001u, 0x7FC00000u, 0x7F80FFFFu, 0x7FFFFFFFu}) {
    const BFloat16 b = softdot::to_bfloat16(std::bit_cast<float>(nan));
    EXPECT_TRUE(std::isnan(softdot::to_float(b))) << std::hex << nan;
  }
  EXPECT_EQ(softdot::to_bfloat16(std::numeric_limits<float>::max()).bits,
            0x7F80);
  EXPECT_EQ(softdot::to_bfloat16(-kInfF).bits, 0xFF80);
}

}  // namespace
}  // namespace softdot_test
