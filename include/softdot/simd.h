// softdot: which SIMD target runs.
#ifndef SOFTDOT_SIMD_H_
#define SOFTDOT_SIMD_H_

#include <string>
#include <string_view>
#include <vector>

namespace softdot {

// Name of the SIMD target that the library dispatches to now, as Highway
// names it ("AVX3" is AVX-512, then "AVX2", "SSE4", "SSSE3", "NEON",
// "SCALAR", ...). Chosen at run time from the targets compiled into the
// library and supported by this CPU; never built with -march=native.
std::string simd_target();

// Every target compiled into the library that this CPU supports, best first.
std::vector<std::string> simd_targets();

// Restricts dispatch to one target, by name (case-insensitive), for tests and
// benchmarks; an empty name restores the automatic choice. Throws
// std::invalid_argument for a name that is not in simd_targets(). Not
// thread-safe with concurrent softdot calls: call it between them.
void force_simd_target(std::string_view name);

}  // namespace softdot

#endif  // SOFTDOT_SIMD_H_
