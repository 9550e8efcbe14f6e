// softdot: naming and forcing the SIMD target that the kernels dispatch to.
#include "softdot/simd.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "hwy/targets.h"
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

}  // namespace softdot
