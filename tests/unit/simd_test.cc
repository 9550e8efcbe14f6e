// SIMD dispatch: the target list, forcing a target, bitwise agreement of the
// FMA targets, and the caller's floating-point environment.
#include <cfenv>
#include <stdexcept>
#include <string>
#include <vector>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "test_util.h"

namespace softdot_test {
namespace {

using softdot::MatrixView;

TEST(Simd, TargetListAndDefault) {
  const auto targets = softdot::simd_targets();
  ASSERT_FALSE(targets.empty());
  EXPECT_EQ(softdot::simd_target(), targets.front())
      << "best target by default";
#if defined(__x86_64__)
  auto has = [&](const char* name) {
    return std::find(targets.begin(), targets.end(), name) != targets.end();
  };
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    EXPECT_TRUE(has("AVX2"));
  }
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vl")) {
    EXPECT_TRUE(has("AVX3"));
  }
#endif
  std::printf("[ targets  ]");
  for (const auto& t : targets) std::printf(" %s", t.c_str());
  std::printf("\n");
}

#if defined(__aarch64__)
// softdot leaves Highway's SVE targets out (fixed-width blocks fix its
// reduction orders), so an Arm CPU with SVE, of any vector length, runs
// NEON: scripts/test_arm64.sh runs this under qemu with SVE of 128, 256 and
// 512 bits.
TEST(Simd, ArmPicksNeon) {
  EXPECT_EQ(softdot::simd_target(), "NEON");
  for (const std::string& t : softdot::simd_targets()) {
    EXPECT_EQ(t.find("SVE"), std::string::npos) << t;
  }
}
#endif

TEST(Simd, ForceEachTargetAndRestore) {
  const auto targets = softdot::simd_targets();
  for (const auto& t : targets) {
    softdot::force_simd_target(t);
    EXPECT_EQ(softdot::simd_target(), t);
    std::string lower = t;
    for (char& c : lower) c = char(std::tolower(static_cast<unsigned char>(c)));
    softdot::force_simd_target(targets.back());
    softdot::force_simd_target(lower);  // case-insensitive
    EXPECT_EQ(softdot::simd_target(), t);
  }
  softdot::force_simd_target("");
  EXPECT_EQ(softdot::simd_target(), targets.front());
  EXPECT_THROW(softdot::force_simd_target("NOT_A_TARGET"),
               std::invalid_argument);
  EXPECT_EQ(softdot::simd_target(), targets.front());
}

// Dot, softmax and softmax_rows results of one target.
template <class T>
std::vector<T> outputs() {
  std::vector<T> out;
  for (std::size_t n : {1, 3, 8, 17, 64, 100, 255, 1000, 4097, 70000}) {
    const auto a = make_logits<T>(n, Dist::kNormal5, n);
    const auto b = make_logits<T>(n, Dist::kUniform10, n + 1);
    Guarded<T> x(std::span<const T>(a), n % 9);
    out.push_back(softdot::dot(x.cspan(), std::span<const T>(b)));
    std::vector<T> y(n);
    softdot::softmax(x.cspan(), std::span<T>(y));
    out.insert(out.end(), y.begin(), y.end());
    softdot::log_softmax(x.cspan(), std::span<T>(y), {0.7, {}});
    out.insert(out.end(), y.begin(), y.end());
    out.push_back(softdot::logsumexp(x.cspan()));
  }
  const std::size_t rows = 7, cols = 300;
  const auto m = make_logits<T>(rows * cols, Dist::kNormal1, 99);
  std::vector<T> y(rows * cols), s(rows);
  softdot::softmax_rows(MatrixView<const T>(m.data(), rows, cols),
                        MatrixView<T>(y.data(), rows, cols));
  out.insert(out.end(), y.begin(), y.end());
  softdot::dots(std::span<const T>(m).first(cols),
                MatrixView<const T>(m.data(), rows, cols), std::span<T>(s));
  out.insert(out.end(), s.begin(), s.end());
  return out;
}

template <class T>
void CheckFmaTargetsAgree() {
  std::vector<std::string> fma;
  for (const auto& t : softdot::simd_targets()) {
    if (is_fma_target(t)) fma.push_back(t);
  }
  if (fma.size() < 2) GTEST_SKIP() << "fewer than two FMA targets here";
  softdot::force_simd_target(fma.front());
  const auto want = outputs<T>();
  for (std::size_t i = 1; i < fma.size(); ++i) {
    softdot::force_simd_target(fma[i]);
    EXPECT_TRUE(SameBits(outputs<T>(), want))
        << type_name<T>() << " " << fma[i] << " vs " << fma.front();
  }
  softdot::force_simd_target("");
}

TEST(Simd, FmaTargetsGiveIdenticalBits) {
  CheckFmaTargetsAgree<float>();
  CheckFmaTargetsAgree<double>();
}

// The library never changes the caller's floating-point environment (no FTZ
// or DAZ left behind, rounding mode and flags masks untouched).
TEST(Simd, FloatingPointEnvironmentIsUnchanged) {
  for (const auto& t : softdot::simd_targets()) {
    softdot::force_simd_target(t);
    const int round = std::fegetround();
#if defined(__x86_64__)
    const unsigned csr = _mm_getcsr() & ~0x3Fu;  // ignore the sticky flags
#endif
    (void)outputs<float>();
    (void)outputs<double>();
    EXPECT_EQ(std::fegetround(), round) << t;
#if defined(__x86_64__)
    EXPECT_EQ(_mm_getcsr() & ~0x3Fu, csr) << t;
#endif
  }
  softdot::force_simd_target("");
}

}  // namespace
}  // namespace softdot_test
