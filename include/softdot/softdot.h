// softdot: dot products, softmax and the attention built from them.
// Umbrella header: include this one.
#ifndef SOFTDOT_SOFTDOT_H_
#define SOFTDOT_SOFTDOT_H_

#include "softdot/attention.h"
#include "softdot/attention_request.h"
#include "softdot/cross_entropy.h"
#include "softdot/dot.h"
#include "softdot/float16.h"
#include "softdot/float8.h"
#include "softdot/kv_cache.h"
#include "softdot/linear_cross_entropy.h"
#include "softdot/matrix.h"
#include "softdot/ring_layout.h"
#include "softdot/sample.h"
#include "softdot/simd.h"
#include "softdot/softmax.h"
#include "softdot/version.h"

#endif  // SOFTDOT_SOFTDOT_H_
