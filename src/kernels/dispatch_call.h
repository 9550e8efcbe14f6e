// softdot: what the dispatch files (src/kernels/dispatch_*.cc) share in their
// HWY_ONCE part: SOFTDOT_DISPATCH, the fast form of HWY_DYNAMIC_DISPATCH, and
// the entry points one file calls in another (the three forms of the attention
// kernel: attention_kernel, in dispatch_attention.cc, picks one). Each kernel
// family is compiled for every SIMD target in its own file, so that the files
// compile in parallel; include this only after hwy/highway.h, in HWY_ONCE.
#ifndef SOFTDOT_SRC_KERNELS_DISPATCH_CALL_H_
#define SOFTDOT_SRC_KERNELS_DISPATCH_CALL_H_

#include "hwy/highway.h"
#include "kernels/attention_args.h"

namespace softdot::detail {

// HWY_DYNAMIC_DISPATCH for the calls short enough that the dispatch shows:
// the same table and index, but the chosen-target object is looked up once
// (HWY_DYNAMIC_DISPATCH calls hwy::GetChosenTarget(), in libhwy, through
// the PLT on every call). Its mask is still read on every call, so
// force_simd_target() keeps working. One object for every file (an inline
// function's static).
#if HWY_IDE || ((HWY_TARGETS & (HWY_TARGETS - 1)) == 0)
#define SOFTDOT_DISPATCH(FUNC_NAME) HWY_DYNAMIC_DISPATCH(FUNC_NAME)
#else
inline hwy::ChosenTarget& chosen_target() {
  static hwy::ChosenTarget& chosen = hwy::GetChosenTarget();
  return chosen;
}
#define SOFTDOT_DISPATCH(FUNC_NAME) \
  (*(HWY_DISPATCH_TABLE(FUNC_NAME)[chosen_target().GetIndex()]))
#endif

// The forms of attention_kernel (dispatch.h): the decode form
// (dispatch_attention_decode.cc) and the prefill form on the units args.units
// names (dispatch_attention_units.cc); dispatch_attention.cc holds the float
// prefill form.
void attention_decode_kernel(const AttnArgs& args) noexcept;
void attention_units_kernel(const AttnArgs& args) noexcept;
// The decode form on the units (args.decode, args.units != 0).
void attention_decode_units_kernel(const AttnArgs& args) noexcept;

}  // namespace softdot::detail

#endif  // SOFTDOT_SRC_KERNELS_DISPATCH_CALL_H_
