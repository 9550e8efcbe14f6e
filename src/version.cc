// softdot: the version string of the linked library.
#include "softdot/version.h"

namespace softdot {
const char* version() noexcept { return SOFTDOT_VERSION_STRING; }
}  // namespace softdot
