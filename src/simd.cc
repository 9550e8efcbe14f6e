// softdot: naming and forcing the SIMD target that the kernels dispatch to.
#include "softdot/simd.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "hwy/targets.h"
#include "kernels/attention_args.h"
#include "kernels/dispatch.h"

namespace softdot {
namespace {

// Targets this CPU supports (as currently restricted) that the kernels were
// compiled for, best first (Highway numbers better targets with lower bits).
std::vector<std::int64_t> usable_targets() {
  std::vector<std::int64_t> out;
  std::int64_t bits = hwy::SupportedTargets() & detail::compiled_targets();
  while (bits != 0) {
    const std::int64_t lowest = bits & -bits;
    out.push_back(lowest);
    bits &= bits - 1;
  }
  return out;
}

bool same_name(std::string_view a, std::string_view b) {
  return a.size() == b.size() &&
         std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

// The target that force_simd_target() restricted dispatch to; 0 for none.
std::int64_t g_forced = 0;

void choose(std::int64_t targets) {
  g_forced = targets;
  hwy::SetSupportedTargetsForTest(targets);
  hwy::GetChosenTarget().Update(hwy::SupportedTargets());
}

}  // namespace

std::string simd_target() {
  const auto targets = usable_targets();
  return targets.empty() ? std::string("SCALAR")
                         : std::string(hwy::TargetName(targets.front()));
}

std::vector<std::string> simd_targets() {
  // Every target of the CPU, not only the one a force_simd_target() call
  // allows: lift the restriction while reading, then put it back.
  hwy::SetSupportedTargetsForTest(0);
  std::vector<std::string> names;
  for (std::int64_t t : usable_targets())
    names.emplace_back(hwy::TargetName(t));
  hwy::SetSupportedTargetsForTest(g_forced);
  return names;
}

void force_simd_target(std::string_view name) {
  if (name.empty()) {
    choose(0);
    return;
  }
  hwy::SetSupportedTargetsForTest(0);
  for (std::int64_t t : usable_targets()) {
    if (same_name(name, hwy::TargetName(t))) {
      choose(t);
      return;
    }
  }
  hwy::SetSupportedTargetsForTest(g_forced);
  std::string known;
  for (const auto& n : simd_targets()) known += (known.empty() ? "" : ", ") + n;
  throw std::invalid_argument("force_simd_target: \"" + std::string(name) +
                              "\" is not a SIMD target of this build and CPU "
                              "(available: " +
                              known + ")");
}

namespace {

// The CPU's AVX512-BF16 flag (CPUID leaf 7, sub-leaf 1, EAX bit 5), read
// once: every attention request asks (request_units), and under a
// hypervisor CPUID traps (it took 15% of a 1536-key bfloat16 decode call on
// a KVM guest). The OS's AVX-512 state is Highway's check: the flag matters
// only on its AVX3 target.
bool cpu_has_avx512bf16() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool has = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (__get_cpuid_count(7, 1, &a, &b, &c, &d) == 0) return false;
    return ((a >> 5) & 1u) != 0;
  }();
  return has;
#else
  return false;
#endif
}

constexpr unsigned kNone = 0;
// A choice: kAuto, kNone or a detail::kUnits* bit; kUnset: none forced.
constexpr unsigned kAuto = ~0u;
constexpr unsigned kUnset = ~0u - 1;
// What force_matrix_unit() chose (written only there: not thread-safe with
// concurrent calls, as force_simd_target).
unsigned g_unit_forced = kUnset;

unsigned units_here() {
  unsigned u = detail::attention_units_compiled();
  if (!cpu_has_avx512bf16()) u &= ~detail::kUnitsAvx512Bf16;
  return u;
}

const char* unit_name(unsigned u) {
  return u == detail::kUnitsAvx512Bf16 ? "avx512bf16"
         : u == detail::kUnitsModel    ? "model"
                                       : "none";
}

// The choice a name stands for ("" is kAuto); `who` names the caller in
// the message for a name that is not in matrix_units().
unsigned parse_unit(std::string_view name, const char* who) {
  if (name.empty()) return kAuto;
  for (const auto& n : matrix_units()) {
    if (same_name(name, n)) {
      return n == "avx512bf16" ? detail::kUnitsAvx512Bf16
             : n == "model"    ? detail::kUnitsModel
                               : kNone;
    }
  }
  std::string known;
  for (const auto& n : matrix_units()) known += (known.empty() ? "" : ", ") + n;
  throw std::invalid_argument(std::string(who) + ": \"" + std::string(name) +
                              "\" is not a matrix unit of this build, CPU "
                              "and SIMD target (available: " +
                              known + ")");
}

// SOFTDOT_MATRIX_UNIT's choice, read once (a function-local static: safe
// when the first attention calls run on several threads at once; a bad
// value throws from every call, as its initialisation never completes).
unsigned env_unit() {
  static const unsigned u = [] {
    const char* e = std::getenv("SOFTDOT_MATRIX_UNIT");
    return e != nullptr ? parse_unit(e, "SOFTDOT_MATRIX_UNIT") : kAuto;
  }();
  return u;
}

}  // namespace

namespace detail {

unsigned attention_units() {
  const unsigned choice = g_unit_forced != kUnset ? g_unit_forced : env_unit();
  const unsigned here = units_here();
  if (choice == kAuto) return here & kUnitsAvx512Bf16;
  if (choice == kNone) return 0;
  if ((here & choice) != 0) return choice;
  return here & kUnitsModel;  // the same bits
}

}  // namespace detail

std::vector<std::string> matrix_units() {
  const unsigned here = units_here();
  std::vector<std::string> names;
  if (here & detail::kUnitsAvx512Bf16) names.emplace_back("avx512bf16");
  if (here & detail::kUnitsModel) names.emplace_back("model");
  names.emplace_back("none");
  return names;
}

std::string matrix_unit() { return unit_name(detail::attention_units()); }

void force_matrix_unit(std::string_view name) {
  // An explicit choice outranks the environment; "" goes back to it.
  g_unit_forced = name.empty() ? kUnset : parse_unit(name, "force_matrix_unit");
}

}  // namespace softdot
