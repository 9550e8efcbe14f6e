// softdot kernels: per-target feature switches, redefined for every Highway
// target this file is compiled for (no include guard on purpose: the macros
// are #undef'd and set again each time foreach_target.h re-includes a
// kernel file).
//
// SOFTDOT_MASKED_TAIL: masked loads and stores of float/double lanes never
//   touch (or fault on) the lanes outside the mask: vmaskmov on AVX2, masked
//   moves on AVX-512.
// SOFTDOT_FLOAT_PAIR_EXP: the faithful float softmax evaluates exp in float
//   lanes as a pair (exp_faithful-inl.h): the targets with FMA, AVX2,
//   AVX-512 and NEON on aarch64 (its 8-entry table is one permute, or two
//   and a select with 4 lanes), so that all of them give the same bits; the
//   others keep the double-lane exp.
// SOFTDOT_AVX512: the AVX-512 instructions Highway 1.0.3 does not wrap
//   (vscalefps/pd, byte-masked loads) may be used on full 512-bit vectors.

#include "hwy/highway.h"

#undef SOFTDOT_MASKED_TAIL
#undef SOFTDOT_AVX512
#undef SOFTDOT_FLOAT_PAIR_EXP
#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3 || \
    HWY_TARGET == HWY_AVX3_DL
#define SOFTDOT_MASKED_TAIL 1
#define SOFTDOT_FLOAT_PAIR_EXP 1
#elif HWY_TARGET == HWY_NEON && HWY_ARCH_ARM_A64
#define SOFTDOT_MASKED_TAIL 0
#define SOFTDOT_FLOAT_PAIR_EXP 1
#else
#define SOFTDOT_FLOAT_PAIR_EXP 0
#define SOFTDOT_MASKED_TAIL 0
#endif
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
#define SOFTDOT_AVX512 1
#else
#define SOFTDOT_AVX512 0
#endif
