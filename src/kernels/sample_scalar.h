// softdot: the scalar model of the sampling kernels (sample-inl.h): the same
// operations in the same order, no fused multiply-add (the project builds
// with -ffp-contract=off), so every SIMD target and this code give the same
// bits. The kernels call it for their tails; tests call it as the model.
#ifndef SOFTDOT_SRC_KERNELS_SAMPLE_SCALAR_H_
#define SOFTDOT_SRC_KERNELS_SAMPLE_SCALAR_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace softdot::detail {

// Weights are summed in blocks of this many elements (the inverse-CDF walk
// skips whole blocks by their sums).
inline constexpr std::size_t kSampleBlock = 1024;

// exp(t) for t <= 0 in double, then rounded once to float. Range: t is
// clamped to >= -120 (exp(-120) < 2^-173 rounds to float 0, as does every
// smaller value). Error before the float rounding: Cody-Waite reduction
// with a 45-bit ln2 head (n * head exact for |n| <= 256), |r| <= 0.347, a
// degree-8 Taylor polynomial (truncation < 2.1e-10 relative), Horner in
// double: within 3e-10 relative, so the float weight is within 0.51 ulp.
inline constexpr double kSampleLog2e = 0x1.71547652b82fep0;
inline constexpr double kSampleLn2Hi = 0x1.62e42fefa3800p-1;
inline constexpr double kSampleLn2Lo = 0x1.ef35793c76730p-45;
inline constexpr double kSampleShifter = 0x1.8p52;
inline constexpr double kSampleMinT = -120.0;

inline double sample_exp_double(double t) {
  t = t < kSampleMinT ? kSampleMinT : t;
  const double k = t * kSampleLog2e + kSampleShifter;
  const double nd = k - kSampleShifter;
  const double r = (t - nd * kSampleLn2Hi) - nd * kSampleLn2Lo;
  double p = r * (1.0 / 40320) + (1.0 / 5040);
  p = p * r + (1.0 / 720);
  p = p * r + (1.0 / 120);
  p = p * r + (1.0 / 24);
  p = p * r + (1.0 / 6);
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  std::int64_t kb, sb;
  std::memcpy(&kb, &k, 8);
  std::memcpy(&sb, &kSampleShifter, 8);
  const std::uint64_t bits = static_cast<std::uint64_t>(kb - sb + 1023) << 52;
  double scale;
  std::memcpy(&scale, &bits, 8);
  return p * scale;
}

// The weight of logit x under max m and inverse temperature s.
inline float sample_weight(float x, float m, double s) {
  const double t = (static_cast<double>(x) - static_cast<double>(m)) * s;
  return static_cast<float>(sample_exp_double(t));
}

// The fixed summation order of a block: element i of the block goes to
// partial sum i % 8; the partials combine as ((0+1)+(2+3))+((4+5)+(6+7)).
inline double sample_combine8(const double* a) {
  return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

}  // namespace softdot::detail

#endif  // SOFTDOT_SRC_KERNELS_SAMPLE_SCALAR_H_
