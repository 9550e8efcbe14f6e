// softdot: sampling from logits without sorting the vocabulary (see
// include/softdot/sample.h and docs/design.md "Sampling without sorting").
//
// One row: (1) the bitmask and a 16-bit widening write a float copy with
// disallowed tokens at -inf; (2) one pass takes the max and the NaN flag;
// (3a) with top-k: a cutoff from a strided sample, one vector gather of the
// indices at or above it and nth_element on those (a three-level radix
// select on the logits' monotone bit keys when too few pass); only the kept
// candidates get weights; (3b) without top-k, one pass writes the float
// weights and their block sums, and top-p finds its threshold the same way
// on the weights' bits, counting mass instead of tokens; (4) min-p is the
// threshold w >= min_p (the largest weight is exactly 1); (5) one
// inverse-CDF walk in index order, skipping whole blocks by their sums,
// draws the token with a 53-bit uniform from Philox4x32-10.
// Rows of at most kSmallRow tokens take nth_element and a sort of the
// weights instead of the radix selects. The pieces shared with
// speculative_accept and sample_probs (sample_speculative.cc) are declared
// in sample_row.h.
#include "softdot/sample.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <new>
#include <string>
#include <type_traits>
#include <vector>

#include "check.h"
#include "kernels/dispatch.h"
#include "kernels/sample_scalar.h"
#include "parallel.h"
#include "sample_row.h"

namespace softdot {

void philox4x32_10(const std::uint32_t counter[4], const std::uint32_t key[2],
                   std::uint32_t out[4]) noexcept {
  std::uint32_t c0 = counter[0], c1 = counter[1], c2 = counter[2],
                c3 = counter[3];
  std::uint32_t k0 = key[0], k1 = key[1];
  for (int round = 0; round < 10; ++round) {
    const std::uint64_t p0 = std::uint64_t{0xD2511F53} * c0;
    const std::uint64_t p1 = std::uint64_t{0xCD9E8D57} * c2;
    const std::uint32_t hi0 = static_cast<std::uint32_t>(p0 >> 32);
    const std::uint32_t lo0 = static_cast<std::uint32_t>(p0);
    const std::uint32_t hi1 = static_cast<std::uint32_t>(p1 >> 32);
    const std::uint32_t lo1 = static_cast<std::uint32_t>(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

namespace detail::sampling {

using detail::fail;

// Monotone key of a float: larger float, larger key (NaN excluded).
// -0 counts as +0 (they compare equal, so ties).
inline std::uint32_t key_of(float x) {
  const std::uint32_t b = std::bit_cast<std::uint32_t>(x + 0.0f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// The largest key K among keys[0..n) with mass(keys >= K) >= target, given
// `above` = the mass of the keys above this set; keys share their top 11
// bits. mass(k) = 1 (count) or the float whose bits are k (top-p keys are
// raw bits of positive floats). Levels: bits 10..20, then bits 0..9.
std::uint32_t refine(std::vector<std::uint32_t>& keys, bool count, double above,
                     double target, std::vector<double>& hist) {
  const auto mass = [count](std::uint32_t k) {
    return count ? 1.0 : static_cast<double>(std::bit_cast<float>(k));
  };
  std::uint32_t prefix = keys[0] & 0xFFE00000u;
  const int shifts[2] = {10, 0};
  const std::uint32_t widths[2] = {2048, 1024};
  for (int level = 0; level < 2; ++level) {
    const int sh = shifts[level];
    const std::uint32_t nb = widths[level];
    hist.assign(nb, 0.0);
    for (const std::uint32_t k : keys) hist[(k >> sh) & (nb - 1)] += mass(k);
    std::uint32_t pick = nb;
    std::uint32_t lowest = nb;
    double cum = above;
    for (std::uint32_t b = nb; b-- > 0;) {
      if (hist[b] == 0.0) continue;
      lowest = b;
      const double next = cum + hist[b];
      if (next >= target) {
        pick = b;
        break;
      }
      cum = next;
    }
    if (pick == nb) {  // rounding: the target is the whole mass
      pick = lowest;
      cum = above;  // unused below: every key in `pick` is kept
      for (std::uint32_t b = nb; b-- > pick + 1;) cum += hist[b];
    }
    above = cum;
    prefix |= pick << sh;
    std::size_t out = 0;
    for (const std::uint32_t k : keys)
      if (((k >> sh) & (nb - 1)) == pick) keys[out++] = k;
    keys.resize(out);
  }
  return prefix;
}

// Level 1 of the radix select over n items: histogram of key >> 21 with
// mass; returns the bucket holding the threshold and the mass above it, or
// bucket 2048 when the whole mass is below the target.
struct Level1 {
  std::uint32_t bucket;
  double above;
};
Level1 pick_level1(const std::vector<double>& hist, double target) {
  double cum = 0;
  std::uint32_t lowest = 2048;
  for (std::uint32_t b = 2048; b-- > 0;) {
    if (hist[b] == 0.0) continue;
    lowest = b;
    const double next = cum + hist[b];
    if (next >= target) return {b, cum};
    cum = next;
  }
  return {lowest, cum};  // rounding: keep from the lowest bucket down
}

inline float min_p_threshold(double min_p) {
  if (min_p <= 0) return 0.0f;
  float f = static_cast<float>(min_p);
  if (static_cast<double>(f) < min_p) f = std::nextafter(f, 2.0f);
  return f;
}

// Top-p threshold over sorted-descending weights (small sets).
float top_p_small(std::vector<float>& sorted, double target) {
  std::sort(sorted.begin(), sorted.end(), std::greater<float>());
  double cum = 0;
  for (const float v : sorted) {
    cum += v;
    if (cum >= target) return v;
  }
  return sorted.empty() ? 0.0f : sorted.back();
}

// The smallest float whose key is `key` (key > 0x7FFFFF: not -inf/NaN).
inline float float_of_key(std::uint32_t key) {
  return std::bit_cast<float>((key & 0x80000000u) ? (key & 0x7FFFFFFFu) : ~key);
}

// Interleaved copies of the level-1 histogram: consecutive elements go to
// different copies, so a run of one bucket (the usual case: most logits
// share a few exponents) is 8 independent chains of increments, not one
// chain through store-to-load forwarding.
constexpr std::size_t kCopies = 8;
// Copy c starts c * (buckets + kPad) entries in: copies a multiple of 4 KiB
// apart made every increment wait on the previous copy's store (4K
// aliasing: 410 us for a 128k row instead of 130 us, measured).
constexpr std::size_t kPad = 16;

// Strided sample size for the cutoff guesses below.
constexpr std::size_t kSample = 1024;

// Rows up to this many tokens take std::nth_element (top-k) and a sort of
// the weights (top-p) instead of the radix select, whose histograms cost
// more to clear than such a row costs to select.
constexpr std::size_t kSmallRow = 2048;

// Top-k candidates: sc.idx = the indices (ascending) of the finite logits
// >= the k-th largest. False when k >= the number of finite logits (no
// top-k then).
bool select_top_k(const float* x, std::size_t n, std::size_t k, Scratch& sc) {
  std::uint32_t kth;
  if (n <= kSmallRow) {
    sc.keys.clear();
    for (std::size_t i = 0; i < n; ++i)
      if (x[i] != -INFINITY) sc.keys.push_back(key_of(x[i]));
    if (sc.keys.size() <= k) return false;
    std::nth_element(sc.keys.begin(),
                     sc.keys.begin() + static_cast<std::ptrdiff_t>(k - 1),
                     sc.keys.end(), std::greater<std::uint32_t>());
    kth = sc.keys[k - 1];
    sc.idx.clear();
    for (std::size_t i = 0; i < n; ++i)
      if (x[i] != -INFINITY && key_of(x[i]) >= kth)
        sc.idx.push_back(static_cast<std::uint32_t>(i));
    return true;
  }
  // First a guess: a cutoff from a strided sample (the sample's element of
  // rank 2 k S / n + 16, so that about twice the needed tokens, and at
  // least 16 S / n... pass it), one vector pass for the indices at or above
  // it, and an exact selection among those. Falls back to the radix select
  // when fewer than k pass (never wrong, only slower).
  const std::size_t rank = 2 * k * kSample / n + 16;
  if (rank < kSample / 2) {
    sc.keys.resize(kSample);
    for (std::size_t j = 0; j < kSample; ++j)
      sc.keys[j] = key_of(x[j * n / kSample]);
    std::nth_element(sc.keys.begin(),
                     sc.keys.begin() + static_cast<std::ptrdiff_t>(rank),
                     sc.keys.end(), std::greater<std::uint32_t>());
    const std::uint32_t cut = sc.keys[rank];
    if (cut > 0x007FFFFFu) {  // a finite cutoff
      sc.idx.resize(n + 64);
      sc.idx.resize(detail::sample_select_ge_kernel(x, n, float_of_key(cut),
                                                    sc.idx.data(), nullptr));
      if (sc.idx.size() > k) {
        sc.keys.resize(sc.idx.size());
        for (std::size_t j = 0; j < sc.idx.size(); ++j)
          sc.keys[j] = key_of(x[sc.idx[j]]);
        std::nth_element(sc.keys.begin(),
                         sc.keys.begin() + static_cast<std::ptrdiff_t>(k - 1),
                         sc.keys.end(), std::greater<std::uint32_t>());
        kth = sc.keys[k - 1];
        std::size_t out = 0;
        for (const std::uint32_t j : sc.idx)
          if (key_of(x[j]) >= kth) sc.idx[out++] = j;
        sc.idx.resize(out);
        return true;
      }
    }
  }
  // Level 1 over the logits' keys (counts). -inf has keys < 2^23, buckets
  // 0..3, which no finite logit shares: counted, then dropped.
  constexpr std::size_t kStride = 2048 + kPad;
  thread_local std::vector<std::uint32_t> counts;
  counts.assign(kCopies * kStride, 0);
  std::uint32_t* h = counts.data();
  std::size_t i = 0;
  for (; i + kCopies <= n; i += kCopies)
    for (std::size_t c = 0; c < kCopies; ++c)
      ++h[c * kStride + (key_of(x[i + c]) >> 21)];
  for (; i < n; ++i) ++h[key_of(x[i]) >> 21];
  std::vector<double>& h1 = sc.h1;
  h1.assign(2048, 0.0);
  double finite = 0;
  for (std::size_t b = 4; b < 2048; ++b) {
    std::uint32_t t = 0;
    for (std::size_t c = 0; c < kCopies; ++c) t += h[c * kStride + b];
    h1[b] = t;
    finite += t;
  }
  const double kd = static_cast<double>(k);
  if (finite <= kd) return false;
  const Level1 l1 = pick_level1(h1, kd);
  // Every index at or above the boundary bucket, by one vector pass.
  sc.idx.resize(n + 64);
  sc.idx.resize(detail::sample_select_ge_kernel(
      x, n, float_of_key(l1.bucket << 21), sc.idx.data(), nullptr));
  sc.keys.clear();
  for (const std::uint32_t j : sc.idx) {
    const std::uint32_t key = key_of(x[j]);
    if ((key >> 21) == l1.bucket) sc.keys.push_back(key);
  }
  kth = refine(sc.keys, true, l1.above, kd, sc.hist);
  std::size_t out = 0;
  for (const std::uint32_t j : sc.idx)
    if (key_of(x[j]) >= kth) sc.idx[out++] = j;
  sc.idx.resize(out);
  return true;
}

// The largest weight v among w[idx[0..count)] (all of w when idx is null)
// with mass(w >= v) >= target, where the candidates hold every weight that
// large: a radix select on the weights' bits (positive floats: the bits are
// monotone; w <= 1 has bits >> 21 <= 508, so level 1 has 512 buckets).
float top_p_radix(const float* w, const std::uint32_t* idx, std::size_t count,
                  double target, Scratch& sc) {
  constexpr std::size_t kB = 512, kStride = kB + kPad;
  sc.hist.assign(kCopies * kStride, 0.0);
  double* h = sc.hist.data();
  const auto at = [&](std::size_t j) { return idx ? w[idx[j]] : w[j]; };
  std::size_t i = 0;
  for (; i + kCopies <= count; i += kCopies)
    for (std::size_t c = 0; c < kCopies; ++c) {
      const float v = at(i + c);
      h[c * kStride + (std::bit_cast<std::uint32_t>(v) >> 21)] +=
          static_cast<double>(v);
    }
  for (; i < count; ++i) {
    const float v = at(i);
    h[std::bit_cast<std::uint32_t>(v) >> 21] += static_cast<double>(v);
  }
  std::vector<double>& h1 = sc.h1;
  h1.assign(2048, 0.0);
  for (std::size_t b = 0; b < kB; ++b)
    for (std::size_t c = 0; c < kCopies; ++c) h1[b] += h[c * kStride + b];
  const Level1 l1 = pick_level1(h1, target);
  sc.keys.clear();
  for (std::size_t j = 0; j < count; ++j) {
    const std::uint32_t bits = std::bit_cast<std::uint32_t>(at(j));
    if ((bits >> 21) == l1.bucket && bits != 0) sc.keys.push_back(bits);
  }
  if (sc.keys.empty()) return 0.0f;
  return std::bit_cast<float>(
      refine(sc.keys, false, l1.above, target, sc.hist));
}

// The top-p threshold over the dense weights (n > kSmallRow). First a guess:
// in a strided sample, the rank r where the sample's own cumulative mass
// reaches top_p of its total (a sample misses the few largest weights of a
// heavy tail, which moves r down the list: the safe side), and the sample's
// weight at rank 1.25 r + 16 (then 4 r + 64) as a cutoff; one vector pass
// gathers the weights at or above it, and when their exact mass reaches the
// target the radix select runs on them alone. Otherwise (never wrong, only
// slower) on the whole row.
float top_p_threshold(const float* w, std::size_t n, double top_p,
                      double target, Scratch& sc) {
  sc.ncand = 0;
  sc.sorted.resize(kSample);
  for (std::size_t j = 0; j < kSample; ++j) sc.sorted[j] = w[j * n / kSample];
  std::sort(sc.sorted.begin(), sc.sorted.end(), std::greater<float>());
  double sample_total = 0;
  for (const float v : sc.sorted) sample_total += static_cast<double>(v);
  double cum = 0;
  std::size_t rank = kSample - 1;
  for (std::size_t j = 0; j < kSample; ++j) {
    cum += static_cast<double>(sc.sorted[j]);
    if (cum >= top_p * sample_total) {
      rank = j;
      break;
    }
  }
  for (const std::size_t guess : {rank + rank / 4 + 16, 4 * rank + 64}) {
    const float cut = sc.sorted[std::min(kSample - 1, guess)];
    if (cut <= 0) break;
    std::vector<std::uint32_t>& cand = sc.bidx;
    cand.resize(n + 64);
    sc.wc.resize(n + 64);
    const std::size_t count =
        detail::sample_select_ge_kernel(w, n, cut, cand.data(), sc.wc.data());
    sc.csums.resize((count + detail::kSampleBlock - 1) / detail::kSampleBlock);
    detail::sample_kept_sums_kernel(sc.wc.data(), count, 0.0f, sc.csums.data());
    double mass = 0;
    for (const double b : sc.csums) mass += b;
    if (mass >= target) {
      sc.ncand = count;
      return top_p_radix(sc.wc.data(), nullptr, count, target, sc);
    }
    if (guess >= kSample - 1) break;
  }
  return top_p_radix(w, nullptr, n, target, sc);
}

// Decides the kept set of row x (disallowed entries already -inf). Fills
// sc.w / sc.sums (dense) or sc.idx / sc.wc (sparse).
int decide(const float* x, std::size_t n, const SampleOptions& o, Scratch& sc,
           Kept& kept) {
  bool nan = false;
  const float m = detail::sample_max_kernel(x, n, &nan);
  if (nan) return kNaN;
  if (m == -INFINITY) return kNone;
  kept.m = m;
  if (o.temperature == 0) {
    kept.form = Kept::kGreedy;
    std::size_t i = 0;
    while (x[i] != m) ++i;
    kept.argmax = static_cast<std::int64_t>(i);
    return kOk;
  }
  if (m == INFINITY) {
    kept.form = Kept::kInf;
    kept.count = std::count(x, x + n, INFINITY);
    return kOk;
  }
  const double s = 1.0 / o.temperature;
  kept.s = s;
  const float tau_min = min_p_threshold(o.min_p);
  if (o.top_k > 0 && static_cast<std::size_t>(o.top_k) < n &&
      select_top_k(x, n, static_cast<std::size_t>(o.top_k), sc)) {
    sc.wc.resize(sc.idx.size());
    double total = 0;
    for (std::size_t j = 0; j < sc.idx.size(); ++j) {
      sc.wc[j] = detail::sample_weight(x[sc.idx[j]], m, s);
      total += sc.wc[j];
    }
    float tau = tau_min;
    if (o.top_p < 1) {
      sc.sorted.assign(sc.wc.begin(), sc.wc.end());
      tau = std::max(tau, top_p_small(sc.sorted, o.top_p * total));
    }
    double kept_total = 0;
    for (const float v : sc.wc)
      if (v >= tau) kept_total += v;
    kept.form = Kept::kSparse;
    kept.tau = tau;
    kept.total = kept_total;
    return kOk;
  }
  // Dense: every weight, with block sums.
  kept.form = Kept::kDense;
  const std::size_t blocks =
      (n + detail::kSampleBlock - 1) / detail::kSampleBlock;
  sc.w.resize(n);
  sc.sums.resize(blocks);
  // top-p reads the whole mass (before min-p, Hugging Face's order); min-p
  // alone is applied in the same pass.
  const float exp_tau = o.top_p < 1 ? 0.0f : tau_min;
  detail::sample_exp_kernel(x, n, m, s, exp_tau, sc.w.data(), sc.sums.data());
  float tau = tau_min;
  if (o.top_p < 1) {
    double all = 0;
    for (std::size_t b = 0; b < blocks; ++b) all += sc.sums[b];
    const double target = o.top_p * all;
    if (n <= kSmallRow) {
      sc.sorted.assign(sc.w.begin(), sc.w.end());
      tau = std::max(tau, top_p_small(sc.sorted, target));
    } else {
      tau = std::max(tau, top_p_threshold(sc.w.data(), n, o.top_p, target, sc));
    }
  }
  kept.tau = tau;
  if (o.top_p < 1 && sc.ncand > 0 && n > kSmallRow) {
    // tau >= the top-p threshold >= the candidates' cutoff.
    kept.form = Kept::kCand;
    detail::sample_kept_sums_kernel(sc.wc.data(), sc.ncand, tau,
                                    sc.csums.data());
    double total = 0;
    for (const double b : sc.csums) total += b;
    kept.total = total;
    return kOk;
  }
  if (tau != exp_tau)  // a threshold the pass did not apply: sums again
    detail::sample_kept_sums_kernel(sc.w.data(), n, tau, sc.sums.data());
  double total = 0;
  for (std::size_t b = 0; b < blocks; ++b) total += sc.sums[b];
  kept.total = total;
  return kOk;
}

// The inverse CDF over v[0..count) (token idx[j], or j when idx is null)
// with block sums `sums` of the kept values: whole blocks skipped by their
// sums, then one block walked in order.
std::int64_t draw_blocks(const float* v, const std::uint32_t* idx,
                         std::size_t count, const std::vector<double>& sums,
                         const Kept& kept, double u) {
  const auto token = [idx](std::size_t j) {
    return static_cast<std::int64_t>(idx ? idx[j] : j);
  };
  const double target = u * kept.total;
  double cum = 0;
  const std::size_t blocks = sums.size();
  for (std::size_t b = 0; b < blocks; ++b) {
    if (cum + sums[b] <= target && b + 1 < blocks) {
      cum += sums[b];
      continue;
    }
    const std::size_t lo = b * detail::kSampleBlock;
    const std::size_t hi = std::min(count, lo + detail::kSampleBlock);
    std::int64_t last = -1;
    for (std::size_t j = lo; j < hi; ++j) {
      if (!is_kept(v[j], kept.tau)) continue;
      last = token(j);
      cum += v[j];
      if (cum > target) return last;
    }
    if (last >= 0) return last;
    // A block of no kept weight reached through rounding: go on.
  }
  for (std::size_t j = count; j-- > 0;)
    if (is_kept(v[j], kept.tau)) return token(j);
  return -1;  // unreachable: the max has weight 1
}

// Draws from the kept set with uniform u; returns the index.
std::int64_t draw(const float* x, std::size_t n, const Kept& kept,
                  const Scratch& sc, double u) {
  switch (kept.form) {
    case Kept::kGreedy:
      return kept.argmax;
    case Kept::kInf: {
      std::int64_t j =
          static_cast<std::int64_t>(u * static_cast<double>(kept.count));
      j = std::min(j, kept.count - 1);
      for (std::size_t i = 0; i < n; ++i)
        if (x[i] == INFINITY && j-- == 0) return static_cast<std::int64_t>(i);
      return -1;  // unreachable
    }
    case Kept::kSparse: {
      const double target = u * kept.total;
      double cum = 0;
      std::int64_t last = -1;
      for (std::size_t j = 0; j < sc.idx.size(); ++j) {
        if (!is_kept(sc.wc[j], kept.tau)) continue;
        last = sc.idx[j];
        cum += sc.wc[j];
        if (cum > target) return last;
      }
      return last;
    }
    case Kept::kDense:
      return draw_blocks(sc.w.data(), nullptr, n, sc.sums, kept, u);
    case Kept::kCand:
      return draw_blocks(sc.wc.data(), sc.bidx.data(), sc.ncand, sc.csums, kept,
                         u);
  }
  return -1;
}

double logprob_of(const float* x, const Kept& kept, std::int64_t token) {
  switch (kept.form) {
    case Kept::kGreedy:
      return 0.0;
    case Kept::kInf:
      return -std::log(static_cast<double>(kept.count));
    default: {
      const double t =
          (static_cast<double>(x[token]) - static_cast<double>(kept.m)) *
          kept.s;
      return t - std::log(kept.total);
    }
  }
}

void check_options(const char* fn, const SampleOptions& o) {
  if (!(std::isfinite(o.temperature) && o.temperature >= 0))
    fail(fn, "temperature must be finite and >= 0, got " +
                 detail::number(o.temperature));
  if (o.temperature > 0 && !std::isfinite(1.0 / o.temperature))
    fail(fn, "temperature " + detail::number(o.temperature) +
                 " is too small (1 / temperature overflows)");
  if (o.top_k < 0)
    fail(fn, "top_k must be >= 0 (0 = off), got " + std::to_string(o.top_k));
  if (!(o.top_p > 0 && o.top_p <= 1))
    fail(fn, "top_p must be in (0, 1], got " + detail::number(o.top_p));
  if (!(o.min_p >= 0 && o.min_p <= 1))
    fail(fn, "min_p must be in [0, 1], got " + detail::number(o.min_p));
}

[[noreturn]] void row_error(const char* fn, const char* what, std::size_t row,
                            int status) {
  if (status == kNaN)
    fail(fn, std::string(what) + " row " + std::to_string(row) +
                 " has a NaN logit that the bitmask allows");
  if (status == kNone)
    fail(fn, std::string(what) + " row " + std::to_string(row) +
                 " has no allowed token (every logit -inf or masked)");
  throw std::bad_alloc();
}

template <class T>
void sample_impl(MatrixView<const T> logits,
                 std::span<const std::uint64_t> seeds,
                 std::span<std::int64_t> tokens, std::span<float> logprobs,
                 const SampleOptions& o,
                 std::span<const std::int32_t> bitmask) {
  const char* fn = "sample";
  const std::size_t rows = logits.rows, n = logits.cols;
  if (n == 0) fail(fn, "logits have 0 columns (an empty vocabulary)");
  if (n > 0xFFFFFFFFu) fail(fn, "vocabulary over 2^32 - 1 tokens");
  if (rows > 1 && logits.stride < n && logits.stride != 0)
    fail(fn, "logits stride " + detail::count(logits.stride) + " < cols " +
                 detail::count(n) + " (and not 0)");
  if (seeds.size() != rows)
    fail(fn, "seeds has " + detail::count(seeds.size()) +
                 " entries; expected one per row (" + detail::count(rows) +
                 ")");
  if (tokens.size() != rows)
    fail(fn, "tokens has " + detail::count(tokens.size()) +
                 " entries; expected " + detail::count(rows));
  if (!logprobs.empty() && logprobs.size() != rows)
    fail(fn, "logprobs has " + detail::count(logprobs.size()) +
                 " entries; expected 0 or " + detail::count(rows));
  const std::size_t words = (n + 31) / 32;
  if (!bitmask.empty() && bitmask.size() != words &&
      bitmask.size() != rows * words)
    fail(fn,
         "bitmask has " + detail::count(bitmask.size()) +
             " int32 words; expected ceil(V / 32) = " + detail::count(words) +
             " (one row for all) or rows * " + detail::count(words));
  check_options(fn, o);
  std::vector<RowResult> out(rows);
  // A 64k-token row already takes ~100 us: threads pay off at fewer
  // elements than the softmax family's threshold.
  const bool parallel = rows > 1 && rows * n >= detail::kParallelElements / 4;
  detail::for_each_index(rows, parallel, [&](std::size_t r) {
    try {
      Scratch& sc = scratch();
      const std::int32_t* mask =
          bitmask.empty()
              ? nullptr
              : bitmask.data() + (bitmask.size() == words ? 0 : r * words);
      const float* x = prepare(logits.data + r * logits.stride, n, mask, sc);
      Kept kept;
      out[r].status = decide(x, n, o, sc, kept);
      if (out[r].status != kOk) return;
      const std::int64_t t = draw(x, n, kept, sc, uniforms(seeds[r], 0).a);
      out[r].token = t;
      out[r].logprob = logprob_of(x, kept, t);
    } catch (...) {
      out[r].status = kNoMemory;
    }
  });
  for (std::size_t r = 0; r < rows; ++r)
    if (out[r].status != kOk) row_error(fn, "logits", r, out[r].status);
  for (std::size_t r = 0; r < rows; ++r) {
    tokens[r] = out[r].token;
    if (!logprobs.empty()) logprobs[r] = static_cast<float>(out[r].logprob);
  }
}

}  // namespace detail::sampling

using detail::sampling::sample_impl;

// The public overloads, one per logits format.
#define SOFTDOT_SAMPLE_OVERLOAD(T)                                           \
  void sample(                                                               \
      MatrixView<const T> logits, std::span<const std::uint64_t> seeds,      \
      std::span<std::int64_t> tokens, std::span<float> logprobs,             \
      const SampleOptions& options, std::span<const std::int32_t> bitmask) { \
    sample_impl(logits, seeds, tokens, logprobs, options, bitmask);          \
  }
SOFTDOT_SAMPLE_OVERLOAD(float)
SOFTDOT_SAMPLE_OVERLOAD(BFloat16)
SOFTDOT_SAMPLE_OVERLOAD(Float16)
#undef SOFTDOT_SAMPLE_OVERLOAD

}  // namespace softdot
