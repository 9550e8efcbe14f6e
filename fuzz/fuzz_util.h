// libFuzzer targets: what they share. A target returns normally for input
// the code under test rejects with its documented error, and aborts (a
// crash libFuzzer reports and saves) when a documented property fails.
#ifndef SOFTDOT_FUZZ_FUZZ_UTIL_H_
#define SOFTDOT_FUZZ_FUZZ_UTIL_H_

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

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

// The same n bytes at a and b; n = 0 is true without a call (memcmp with a
// null pointer, as an empty vector's data() may be, is undefined even for
// 0 bytes: UBSan's nonnull check).
inline bool same_bytes(const void* a, const void* b, std::size_t n) {
  return n == 0 || std::memcmp(a, b, n) == 0;
}

// Two vectors of the same size and bits.
template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() &&
         same_bytes(a.data(), b.data(), a.size() * sizeof(T));
}

}  // namespace softdot_fuzz

#endif  // SOFTDOT_FUZZ_FUZZ_UTIL_H_
