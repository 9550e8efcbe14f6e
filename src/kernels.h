// Forwarding header, to be removed once src/attention*.cc include
// "kernels/dispatch.h": the dispatch table moved there, beside the kernels
// it dispatches.
#ifndef SOFTDOT_SRC_KERNELS_H_
#define SOFTDOT_SRC_KERNELS_H_

#include "kernels/dispatch.h"  // IWYU pragma: export

#endif  // SOFTDOT_SRC_KERNELS_H_
