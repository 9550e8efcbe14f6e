// Shared helpers for the softdot unit tests: per-SIMD-target fixtures, guarded
// (misaligned) buffers, masks, deterministic logit generators and bitwise
// comparisons.
#ifndef SOFTDOT_TESTS_UNIT_TEST_UTIL_H_
#define SOFTDOT_TESTS_UNIT_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "reference.h"
#include "softdot/softdot.h"

namespace softdot_test {

template <class T>
constexpr T kInf = std::numeric_limits<T>::infinity();
template <class T>
constexpr T kNaN = std::numeric_limits<T>::quiet_NaN();

template <class T>
const char* type_name() {
  return sizeof(T) == 4 ? "float" : "double";
}

// ---- SIMD targets ----------------------------------------------------------

// Fixture for tests that run once per SIMD target the machine supports.
class PerTarget : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    softdot::force_simd_target(GetParam());
    ASSERT_EQ(softdot::simd_target(), GetParam());
  }
  void TearDown() override { softdot::force_simd_target(""); }
  const std::string& target() const { return GetParam(); }
};

inline std::string TargetParamName(
    const ::testing::TestParamInfo<std::string>& info) {
  std::string name = info.param;
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name;
}

#define SOFTDOT_INSTANTIATE_PER_TARGET(Suite)                            \
  INSTANTIATE_TEST_SUITE_P(Targets, Suite,                               \
                           ::testing::ValuesIn(softdot::simd_targets()), \
                           ::softdot_test::TargetParamName)

// Targets with fused multiply-add, whose results must be bitwise identical.
inline bool is_fma_target(const std::string& name) {
  return name.rfind("AVX2", 0) == 0 || name.rfind("AVX3", 0) == 0 ||
         name == "NEON";
}

// The bits of a float (as std::uint32_t) or a double (as std::uint64_t).
template <class T>
auto bits(T v) {
  if constexpr (sizeof(T) == 4) {
    return std::bit_cast<std::uint32_t>(v);
  } else {
    return std::bit_cast<std::uint64_t>(v);
  }
}

// ---- buffers ---------------------------------------------------------------

// n elements starting `offset` elements after a 64-byte aligned block, with
// guard elements before and after that must never be written.
template <class T>
class Guarded {
 public:
  static constexpr std::size_t kGuard = 16;
  Guarded(std::size_t n, std::size_t offset) : n_(n), offset_(offset) {
    total_ = offset_ + n_ + kGuard;
    data_.reset(static_cast<T*>(
        ::operator new[](total_ * sizeof(T), std::align_val_t{64})));
    for (std::size_t i = 0; i < total_; ++i) data_[i] = sentinel();
  }
  Guarded(std::span<const T> values, std::size_t offset)
      : Guarded(values.size(), offset) {
    std::copy(values.begin(), values.end(), span().begin());
  }
  std::span<T> span() { return std::span<T>(data_.get() + offset_, n_); }
  std::span<const T> span() const {
    return std::span<const T>(data_.get() + offset_, n_);
  }
  std::span<const T> cspan() const { return span(); }
  std::vector<T> vec() const { return {span().begin(), span().end()}; }
  T& operator[](std::size_t i) { return data_[offset_ + i]; }
  std::size_t size() const { return n_; }
  // True when nothing outside [offset, offset + n) changed.
  bool guards_intact() const {
    for (std::size_t i = 0; i < total_; ++i) {
      if (i >= offset_ && i < offset_ + n_) continue;
      if (bits(data_[i]) != bits(kSentinelStorage)) return false;
    }
    return true;
  }
  static T sentinel() { return kSentinelStorage; }

 private:
  struct Free {
    void operator()(T* p) const {
      ::operator delete[](p, std::align_val_t{64});
    }
  };
  static constexpr T kSentinelStorage = T(-12345.6789);
  std::unique_ptr<T[], Free> data_;
  std::size_t n_, offset_, total_;
};

// A mask (std::vector<bool> is not contiguous, so it cannot give a span).
class Mask {
 public:
  Mask() = default;
  explicit Mask(std::size_t n, bool value = true)
      : n_(checked(n)), p_(new bool[n ? n : 1]) {
    for (std::size_t i = 0; i < n; ++i) p_[i] = value;
  }
  bool& operator[](std::size_t i) { return p_[i]; }
  std::span<const bool> span() const {
    return n_ ? std::span<const bool>(p_.get(), n_) : std::span<const bool>();
  }
  std::size_t size() const { return n_; }

 private:
  // Bounds n for GCC 12, which otherwise warns (-Walloc-size-larger-than)
  // about sizes like rows * (n + 3) that it cannot prove small.
  static std::size_t checked(std::size_t n) {
    if (n > (std::size_t{1} << 40)) throw std::length_error("Mask too large");
    return n;
  }
  std::size_t n_ = 0;
  std::unique_ptr<bool[]> p_;
};

// ---- logits ----------------------------------------------------------------

enum class Dist { kUniform10, kNormal1, kNormal5, kUniform10Plus1000 };
constexpr Dist kAllDists[] = {Dist::kUniform10, Dist::kNormal1, Dist::kNormal5,
                              Dist::kUniform10Plus1000};

inline const char* dist_name(Dist d) {
  switch (d) {
    case Dist::kUniform10:
      return "U[-10,10]";
    case Dist::kNormal1:
      return "N(0,1)";
    case Dist::kNormal5:
      return "N(0,5)";
    case Dist::kUniform10Plus1000:
      return "1000+U[-10,10]";
  }
  return "?";
}

template <class T>
std::vector<T> make_logits(std::size_t n, Dist d, std::uint64_t seed) {
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + 12345);
  std::uniform_real_distribution<double> u(-10.0, 10.0);
  std::normal_distribution<double> g(0.0, 1.0);
  std::vector<T> x(n);
  for (auto& v : x) {
    switch (d) {
      case Dist::kUniform10:
        v = T(u(rng));
        break;
      case Dist::kNormal1:
        v = T(g(rng));
        break;
      case Dist::kNormal5:
        v = T(5.0 * g(rng));
        break;
      case Dist::kUniform10Plus1000:
        v = T(1000.0 + u(rng));
        break;
    }
  }
  return x;
}

template <class T>
std::vector<T> make_uniform(std::size_t n, double lo, double hi,
                            std::uint64_t seed) {
  std::mt19937_64 rng(seed * 0xD1B54A32D192ED03ull + 777);
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<T> x(n);
  for (auto& v : x) v = T(u(rng));
  return x;
}

// ---- bounds ----------------------------------------------------------------

// softmax (Precision::kFaithful, the default): each weight within 1 ulp of
// the exact value, as softmax.h states (measured: 0.503 float, 0.53 double).
template <class T>
constexpr double kSoftmaxMaxUlp = 1.0;
// Precision::kFast: measured at most 1.55 ulp on FMA targets and 2.34
// without FMA; softmax.h states 2 and 2.5.
constexpr double kFastSoftmaxMaxUlp = 2.5;
// logsumexp: within 1 ulp.
constexpr double kLseMaxUlp = 1.0;
// log_softmax: within 1 ulp where |exact| >= 1, within kLogSoftmaxAbs
// (2^-23 float, 2^-52 double) absolute below.
template <class T>
constexpr double kLogSoftmaxAbs = sizeof(T) == 4 ? 0x1p-23 : 0x1p-52;

// Error of a log-softmax value relative to its allowance: <= 1 passes.
// Special values: 0 or +inf.
template <class T>
double log_softmax_score(T got, const softdot_ref::Ref<T>& ref) {
  if (ref.ulp == 0 && ref.hi == 0) {  // exactly 0 (one entry left): absolute
    return std::fabs(double(got)) / kLogSoftmaxAbs<T>;
  }
  if (ref.ulp == 0) return softdot_ref::abs_error(got, ref);
  if (std::fabs(ref.hi) >= 1.0) return softdot_ref::ulp_error(got, ref);
  return softdot_ref::abs_error(got, ref) / kLogSoftmaxAbs<T>;
}

// ---- comparisons -----------------------------------------------------------

// Bitwise equality, except that any NaN equals any NaN.
template <class T>
bool same_value(T a, T b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return bits(a) == bits(b);
}

template <class T>
::testing::AssertionResult SameBits(std::span<const T> a,
                                    std::span<const T> b) {
  if (a.size() != b.size()) {
    return ::testing::AssertionFailure()
           << "sizes differ: " << a.size() << " vs " << b.size();
  }
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!same_value(a[i], b[i])) {
      char buf[200];
      std::snprintf(buf, sizeof buf,
                    "first difference at %zu of %zu: %.17g vs %.17g", i,
                    a.size(), double(a[i]), double(b[i]));
      return ::testing::AssertionFailure() << buf;
    }
  }
  return ::testing::AssertionSuccess();
}
template <class T>
::testing::AssertionResult SameBits(const std::vector<T>& a,
                                    const std::vector<T>& b) {
  return SameBits(std::span<const T>(a), std::span<const T>(b));
}

inline std::string fmt(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

// Prints one line of measured figures (visible with ctest -V or when running
// the test binary directly).
inline void report(const std::string& what, const softdot_ref::UlpStats& s) {
  std::printf("[ ulp      ] %-55s %s\n", what.c_str(), s.str().c_str());
  std::fflush(stdout);
}

}  // namespace softdot_test

#endif  // SOFTDOT_TESTS_UNIT_TEST_UTIL_H_
