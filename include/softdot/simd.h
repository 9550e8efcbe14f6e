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

// The units attention's bfloat16 products can run on (queries, keys and
// values in bfloat16; attention.h, "16-bit attention"):
//   "avx512bf16"  VDPBF16PS (x86 with AVX512-BF16, on the AVX3 target);
//   "model"       that instruction's arithmetic in plain vector operations:
//                 the same bits on every FMA target, several times slower
//                 (for tests: the units' results where the CPU lacks them);
//   "none"        float32 FMAs, the reference path (the bfloat16 products
//                 widened exactly; P kept in float).
// matrix_units() lists what this build, CPU and current SIMD target offer,
// best first: the hardware units, then "model" (FMA targets), then "none".
std::vector<std::string> matrix_units();

// The unit bfloat16 attention runs on now: the forced one (or, for a forced
// unit the current SIMD target lacks, "model", which gives its bits, else
// "none"), otherwise the first hardware unit of matrix_units(), else "none".
std::string matrix_unit();

// Forces a unit by name (case-insensitive); an empty name restores the
// default choice. Throws std::invalid_argument for a name not in
// matrix_units(). The default is the environment variable
// SOFTDOT_MATRIX_UNIT's unit when it is set (read once, the first time a
// unit is chosen; a bad name makes every bfloat16 attention call throw,
// naming the variable), else the automatic choice. Not thread-safe with
// concurrent softdot calls: call it between them.
void force_matrix_unit(std::string_view name);

}  // namespace softdot

#endif  // SOFTDOT_SIMD_H_
