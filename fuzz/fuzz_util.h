// libFuzzer targets: what they share. A target returns normally for input
// the code under test rejects with its documented error, and aborts (a
// crash libFuzzer reports and saves) when a documented property fails.
#ifndef SOFTDOT_FUZZ_FUZZ_UTIL_H_
#define SOFTDOT_FUZZ_FUZZ_UTIL_H_

#include <cstdio>
#include <cstdlib>
#include <cstring>

// Aborts with a message when `cond` is false (active in every build type).
#define FUZZ_CHECK(cond)                                                    \
  do {                                                                      \
    if (!(cond)) {                                                          \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, \
                   #cond);                                                  \
      std::abort();                                                         \
    }                                                                       \
  } while (false)

namespace softdot_fuzz {

// Same bits (NaN payloads included).
template <class T>
bool same_bits(T a, T b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

}  // namespace softdot_fuzz

#endif  // SOFTDOT_FUZZ_FUZZ_UTIL_H_
