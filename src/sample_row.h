// softdot: the pieces of one sampled row (sample.cc) that speculative
// decoding and sample_probs (sample_speculative.cc) share: the Philox
// uniforms, the per-thread scratch, the kept set of a row and the steps
// that decide it, draw from it and read its log-probability. Internal
// (src/ only).
#ifndef SOFTDOT_SRC_SAMPLE_ROW_H_
#define SOFTDOT_SRC_SAMPLE_ROW_H_

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/dispatch.h"
#include "softdot/float16.h"
#include "softdot/sample.h"

namespace softdot::detail::sampling {

// The two uniforms in [0, 1) of counter `position` under `seed`: words 0, 1
// and words 2, 3, 53 bits each.
struct Uniforms {
  double a, b;
};
inline Uniforms uniforms(std::uint64_t seed, std::uint32_t position) {
  const std::uint32_t c[4] = {position, 0, 0, 0};
  const std::uint32_t k[2] = {static_cast<std::uint32_t>(seed),
                              static_cast<std::uint32_t>(seed >> 32)};
  std::uint32_t o[4];
  philox4x32_10(c, k, o);
  const auto u53 = [](std::uint32_t hi, std::uint32_t lo) {
    return static_cast<double>(((std::uint64_t{hi} << 32) | lo) >> 11) *
           0x1p-53;
  };
  return {u53(o[0], o[1]), u53(o[2], o[3])};
}

struct Scratch {
  std::vector<float> row;    // masked / widened copy
  std::vector<float> w;      // dense weights
  std::vector<double> sums;  // block sums
  std::vector<double> hist;  // radix histograms
  std::vector<std::uint32_t> idx, bidx;
  std::vector<std::uint32_t> keys;
  std::vector<float> wc, sorted;
  std::vector<double> h1;
  std::vector<double> csums;  // block sums of top-p candidates
  std::size_t ncand = 0;      // top-p candidates in bidx / wc (0: none)
};
inline Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

enum Status : int { kOk = 0, kNaN = 1, kNone = 2, kNoMemory = 3 };

// The result of one row.
struct RowResult {
  std::int64_t token = -1;
  double logprob = 0;
  int status = kOk;
};

// The kept set of a row in one of two forms.
struct Kept {
  // kCand: the top-p candidates (sc.bidx / sc.wc, sc.ncand of them, block
  // sums sc.csums) hold every kept token: the dense row is not walked again.
  enum Form { kGreedy, kInf, kSparse, kDense, kCand } form = kDense;
  float m = 0;              // the largest logit
  double s = 1;             // 1 / temperature
  float tau = 0;            // kept: weight >= tau (and > 0)
  double total = 0;         // sum of the kept weights
  std::int64_t count = 0;   // kInf: number of +inf entries
  std::int64_t argmax = 0;  // kGreedy
};

// The row's kept weights: w > 0 and w >= tau.
inline bool is_kept(float w, float tau) { return w > 0 && w >= tau; }

// Decides the kept set of row x (disallowed entries already -inf). Fills
// sc.w / sc.sums (dense) or sc.idx / sc.wc (sparse). Returns a Status.
int decide(const float* x, std::size_t n, const SampleOptions& o, Scratch& sc,
           Kept& kept);

// Draws from the kept set with uniform u; returns the index.
std::int64_t draw(const float* x, std::size_t n, const Kept& kept,
                  const Scratch& sc, double u);

// The log-probability of `token` under the kept set.
double logprob_of(const float* x, const Kept& kept, std::int64_t token);

// The row as float with disallowed tokens at -inf: x itself when there is
// nothing to do.
template <class T>
inline const float* prepare(const T* x, std::size_t n, const std::int32_t* mask,
                            Scratch& sc) {
  const float* src;
  if constexpr (std::is_same_v<T, float>) {
    if (mask == nullptr) return x;
    sc.row.resize(n);
    std::memcpy(sc.row.data(), x, n * sizeof(float));
    src = sc.row.data();
  } else {
    sc.row.resize(n);
    detail::widen16(reinterpret_cast<const std::uint16_t*>(x), n, sc.row.data(),
                    std::is_same_v<T, BFloat16>);
    src = sc.row.data();
  }
  if (mask != nullptr) {
    float* r = sc.row.data();
    for (std::size_t wd = 0; wd * 32 < n; ++wd) {
      const std::uint32_t bits = static_cast<std::uint32_t>(mask[wd]);
      if (bits == 0xFFFFFFFFu) continue;
      const std::size_t end = std::min(n, wd * 32 + 32);
      for (std::size_t i = wd * 32; i < end; ++i)
        if (((bits >> (i & 31)) & 1u) == 0) r[i] = -INFINITY;
    }
  }
  return src;
}

// The options' values (temperature, top_k, top_p, min_p), named fn.
void check_options(const char* fn, const SampleOptions& o);

// A row's status as the caller's error: NaN, no allowed token, or memory.
[[noreturn]] void row_error(const char* fn, const char* what, std::size_t row,
                            int status);

}  // namespace softdot::detail::sampling

#endif  // SOFTDOT_SRC_SAMPLE_ROW_H_
