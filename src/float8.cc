// softdot: fp8 e4m3fn and e5m2 to and from float, bit by bit (the same
// bits on every target; the kernels' vector widening in attention_kv-inl.h
// is tested against these).
#include "softdot/float8.h"

#include <cmath>
#include <cstdint>

namespace softdot {

namespace {

// A format of kE exponent and kM mantissa bits with bias 2^(kE-1) - 1.
// kFN: e4m3fn's encoding (no infinity, NaN at all-ones), else IEEE-like.
template <int kE, int kM, bool kFN>
struct Format {
  static constexpr int kBias = (1 << (kE - 1)) - 1;
  static constexpr int kMinExp = 1 - kBias;  // of the smallest normal
  // The largest finite magnitude's code, and NaN's and infinity's.
  static constexpr unsigned kMaxCode =
      kFN ? 0x7eu : ((((1u << kE) - 2u) << kM) | ((1u << kM) - 1u));
  static constexpr unsigned kNaN = kFN ? 0x7fu : (((1u << kE) - 1u) << kM) | 2u;
  static constexpr unsigned kInf = kFN ? 0x7fu : ((1u << kE) - 1u) << kM;

  static float decode(std::uint8_t b) {
    const bool neg = (b & 0x80u) != 0;
    const unsigned mag = b & 0x7fu;
    const unsigned exp = mag >> kM;
    const unsigned man = mag & ((1u << kM) - 1u);
    float v;
    if (kFN && mag == 0x7fu) {
      v = std::nanf("");
    } else if (!kFN && exp == (1u << kE) - 1u) {
      v = man == 0 ? INFINITY : std::nanf("");
    } else if (exp == 0) {
      v = std::ldexp(static_cast<float>(man), kMinExp - kM);
    } else {
      v = std::ldexp(static_cast<float>((1u << kM) + man),
                     static_cast<int>(exp) - kBias - kM);
    }
    return neg ? -v : v;
  }

  static std::uint8_t encode(double x) {
    const unsigned sign = std::signbit(x) ? 0x80u : 0u;
    if (std::isnan(x)) return static_cast<std::uint8_t>(sign | kNaN);
    if (std::isinf(x)) return static_cast<std::uint8_t>(sign | kInf);
    const double a = std::fabs(x);
    if (a == 0.0) return static_cast<std::uint8_t>(sign);
    int k = 0;
    (void)std::frexp(a, &k);  // a in [2^(k-1), 2^k)
    int e = std::max(k - 1, kMinExp);
    // a / 2^(e - kM) is exact (a power of two); rounded to an integer q in
    // [0, 2^(kM+1)], ties to even (the default rounding mode).
    double q = std::nearbyint(std::ldexp(a, kM - e));
    if (q >= static_cast<double>(1u << (kM + 1))) {
      q /= 2.0;  // 2^(kM+1): the next binade's 1.0
      ++e;
    }
    const auto qi = static_cast<unsigned>(q);
    unsigned code;
    if (qi < (1u << kM)) {
      code = qi;  // subnormal (e == kMinExp) or zero
    } else {
      const long field = static_cast<long>(e) + kBias;
      code = field > static_cast<long>(kMaxCode >> kM)
                 ? kMaxCode + 1u
                 : (static_cast<unsigned>(field) << kM) | (qi - (1u << kM));
    }
    if (code > kMaxCode) code = kMaxCode;  // saturate finite overflow
    return static_cast<std::uint8_t>(sign | code);
  }
};

using E4M3 = Format<4, 3, true>;
using E5M2 = Format<5, 2, false>;

}  // namespace

float to_float(Float8E4M3 x) noexcept { return E4M3::decode(x.bits); }
float to_float(Float8E5M2 x) noexcept { return E5M2::decode(x.bits); }
Float8E4M3 to_float8_e4m3(double x) noexcept { return {E4M3::encode(x)}; }
Float8E5M2 to_float8_e5m2(double x) noexcept { return {E5M2::encode(x)}; }

}  // namespace softdot
