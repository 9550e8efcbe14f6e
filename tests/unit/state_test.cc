// Online (chunked) softmax: softmax_state, merge, softmax_apply and
// logsumexp(state), on every SIMD target.
#include <random>
#include <vector>

#include "test_util.h"

namespace softdot_test {
namespace {

template <class T>
using State = softdot::BasicSoftmaxState<T>;

class SoftmaxStateTest : public PerTarget {};

template <class T>
bool same_state(const State<T>& a, const State<T>& b) {
  return same_value(a.max, b.max) && same_value(a.sum, b.sum);
}

template <class T>
std::string show(const State<T>& s) {
  return "{max " + fmt(s.max) + ", sum " + fmt(s.sum) + "}";
}

// Chunk boundaries 0 = b0 <= b1 <= ... <= bk = n.
using Bounds = std::vector<std::size_t>;

Bounds fixed_chunks(std::size_t n, std::size_t size) {
  Bounds b = {0};
  for (std::size_t i = size; i < n; i += size) b.push_back(i);
  b.push_back(n);
  return b;
}

// Random boundaries, with repeated ones (empty chunks).
Bounds random_chunks(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  Bounds b = {0, 0};
  for (int i = 0; i < 8; ++i) b.push_back(rng() % (n + 1));
  b.push_back(n);
  b.push_back(n);
  std::sort(b.begin(), b.end());
  return b;
}

enum class Order { kLeftToRight, kRightToLeft, kTree };

template <class T>
State<T> merge_all(const std::vector<State<T>>& s, std::size_t lo,
                   std::size_t hi, Order order) {
  if (hi - lo == 0) return State<T>::identity();
  if (hi - lo == 1) return s[lo];
  if (order == Order::kTree) {
    const std::size_t mid = lo + (hi - lo) / 2;
    return softdot::merge(merge_all(s, lo, mid, order),
                          merge_all(s, mid, hi, order));
  }
  State<T> total = State<T>::identity();
  if (order == Order::kLeftToRight) {
    for (std::size_t i = lo; i < hi; ++i) total = softdot::merge(total, s[i]);
  } else {
    for (std::size_t i = hi; i-- > lo;) total = softdot::merge(s[i], total);
  }
  return total;
}

// Chunked softmax of x (with an optional full-row mask), checked against the
// exact reference with the one-shot bounds.
template <class T>
void check_chunked(std::span<const T> x, const Mask& mask, const Bounds& b,
                   Order order, const std::string& what) {
  const std::size_t n = x.size();
  std::vector<State<T>> states;
  for (std::size_t k = 0; k + 1 < b.size(); ++k) {
    const std::size_t len = b[k + 1] - b[k];
    softdot::SoftmaxOptions o;
    if (mask.size()) o.mask = mask.span().subspan(b[k], len);
    states.push_back(softdot::softmax_state(x.subspan(b[k], len), o));
  }
  const State<T> total = merge_all(states, 0, states.size(), order);
  Guarded<T> y(n, 5);
  for (std::size_t k = 0; k + 1 < b.size(); ++k) {
    const std::size_t len = b[k + 1] - b[k];
    softdot::SoftmaxOptions o;
    if (mask.size()) o.mask = mask.span().subspan(b[k], len);
    softdot::softmax_apply(x.subspan(b[k], len), total,
                           y.span().subspan(b[k], len), o);
  }
  ASSERT_TRUE(y.guards_intact()) << what;
  const auto ref = softdot_ref::softmax_reference(x, {1.0, mask.span()});
  double worst = 0;
  std::size_t worst_i = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const auto& w = ref.softmax[i];
    if (w.ulp == 0) {
      ASSERT_TRUE(same_value(y[i], w.rounded))
          << what << " i=" << i << " got " << fmt(y[i]) << " want "
          << fmt(w.rounded);
    } else {
      const double e = softdot_ref::ulp_error(y[i], w);
      if (e > worst) {
        worst = e;
        worst_i = i;
      }
    }
  }
  EXPECT_LE(worst, kSoftmaxMaxUlp<T>)
      << what << " worst i=" << worst_i << " got " << fmt(y[worst_i])
      << " want " << fmt(ref.softmax[worst_i].hi) << " total " << show(total);
  const T lse = softdot::logsumexp(total);
  if (ref.logsumexp.ulp == 0) {
    EXPECT_TRUE(same_value(lse, ref.logsumexp.rounded))
        << what << " lse " << fmt(lse);
  } else {
    EXPECT_TRUE(softdot_ref::ulp_error(lse, ref.logsumexp) <= kLseMaxUlp ||
                softdot_ref::abs_error(lse, ref.logsumexp) <= kLogSoftmaxAbs<T>)
        << what << " logsumexp(state) " << fmt(lse) << " want "
        << fmt(ref.logsumexp.hi);
  }
}

template <class T>
void CheckChunkings(std::size_t n, std::uint64_t seed) {
  for (Dist d : kAllDists) {
    const std::vector<T> x = make_logits<T>(n, d, seed++);
    const std::string base = std::string(type_name<T>()) +
                             " n=" + std::to_string(n) + " " + dist_name(d);
    std::vector<Bounds> chunkings;
    for (std::size_t size : {1, 7, 64, 100, 333}) {
      if (size <= n) chunkings.push_back(fixed_chunks(n, size));
    }
    chunkings.push_back({0, n});
    chunkings.push_back(random_chunks(n, seed++));
    chunkings.push_back(random_chunks(n, seed++));
    for (const Bounds& b : chunkings) {
      for (Order order :
           {Order::kLeftToRight, Order::kRightToLeft, Order::kTree}) {
        check_chunked<T>(x, Mask(), b, order,
                         base + " chunks=" + std::to_string(b.size() - 1) +
                             " order=" + std::to_string(int(order)));
      }
    }
    // A fully masked chunk (-inf) and a chunk masked by the mask.
    const Bounds b = fixed_chunks(n, std::max<std::size_t>(1, n / 5));
    std::vector<T> xm = x;
    Mask mask(n);
    if (b.size() > 3) {
      for (std::size_t i = b[1]; i < b[2]; ++i) xm[i] = -kInf<T>;
      for (std::size_t i = b[2]; i < b[3]; ++i) {
        mask[i] = false;
        xm[i] = (i % 2) ? kNaN<T> : kInf<T>;  // ignored: masked
      }
    }
    check_chunked<T>(xm, mask, b, Order::kLeftToRight, base + " masked chunks");
    check_chunked<T>(xm, mask, b, Order::kTree, base + " masked chunks tree");
  }
}

TEST_P(SoftmaxStateTest, ChunkedFloatEqualsOneShotWithinBound) {
  std::uint64_t seed = 1;
  for (std::size_t n : {1, 2, 5, 37, 257, 1000}) {
    CheckChunkings<float>(n, seed);
    seed += 100;
  }
}

TEST_P(SoftmaxStateTest, ChunkedDoubleEqualsOneShotWithinBound) {
  std::uint64_t seed = 1;
  for (std::size_t n : {1, 2, 5, 37, 257, 1000}) {
    CheckChunkings<double>(n, seed);
    seed += 100;
  }
}

template <class T>
void CheckSpecialChunks() {
  const std::string what = type_name<T>();
  // +inf in two chunks: each +inf entry gets 1/3.
  std::vector<T> x = make_logits<T>(30, Dist::kNormal1, 7);
  x[3] = kInf<T>;
  x[4] = kInf<T>;
  x[25] = kInf<T>;
  x[12] = -kInf<T>;
  check_chunked<T>(x, Mask(), {0, 10, 20, 30}, Order::kLeftToRight,
                   what + " +inf chunks");
  check_chunked<T>(x, Mask(), {0, 10, 20, 30}, Order::kTree,
                   what + " +inf chunks tree");
  const auto s = softdot::softmax_state(std::span<const T>(x).subspan(0, 10));
  EXPECT_EQ(s.max, kInf<T>) << what;
  EXPECT_EQ(s.sum, 2.0) << what << ": the sum of a +inf chunk counts its +infs";
  // A NaN in one chunk: every chunk's weights NaN.
  std::vector<T> xn = make_logits<T>(30, Dist::kNormal1, 8);
  xn[17] = kNaN<T>;
  check_chunked<T>(xn, Mask(), {0, 10, 20, 30}, Order::kLeftToRight,
                   what + " NaN chunk");
  const auto sn =
      softdot::softmax_state(std::span<const T>(xn).subspan(10, 10));
  EXPECT_TRUE(std::isnan(sn.max) && std::isnan(sn.sum)) << show(sn);
  // Every chunk fully masked: weights +0, lse -inf.
  std::vector<T> xi(30, -kInf<T>);
  check_chunked<T>(xi, Mask(), {0, 10, 20, 30}, Order::kLeftToRight,
                   what + " all -inf");
  const auto si = softdot::softmax_state(std::span<const T>(xi));
  EXPECT_TRUE(same_state(si, State<T>::identity())) << show(si);
  EXPECT_EQ(softdot::logsumexp(si), -kInf<T>);
}

TEST_P(SoftmaxStateTest, SpecialValueChunks) {
  CheckSpecialChunks<float>();
  CheckSpecialChunks<double>();
}

template <class T>
void CheckStateFields() {
  // Empty chunk, fully masked chunk, masked-by-mask chunk: the identity.
  EXPECT_TRUE(same_state(softdot::softmax_state(std::span<const T>()),
                         State<T>::identity()));
  const std::vector<T> x = {T(1), kNaN<T>, kInf<T>};
  Mask none(3, false);
  EXPECT_TRUE(same_state(
      softdot::softmax_state(std::span<const T>(x), {1.0, none.span()}),
      State<T>::identity()));
  EXPECT_EQ(State<T>::identity().max, -kInf<T>);
  EXPECT_EQ(State<T>::identity().sum, 0.0);
  // max is the exact max; sum = sum exp(x - max) to float/double accuracy.
  for (std::size_t n : {1, 3, 16, 100, 1000}) {
    const auto v = make_logits<T>(n, Dist::kNormal5, n);
    const auto s = softdot::softmax_state(std::span<const T>(v));
    EXPECT_EQ(s.max, *std::max_element(v.begin(), v.end()));
    // Exact sum: exp(lse - max).
    const auto ref = softdot_ref::softmax_reference(std::span<const T>(v));
    const double exact =
        std::exp((ref.logsumexp.hi - double(s.max)) + ref.logsumexp.lo);
    EXPECT_NEAR(s.sum / exact, 1.0, 8 * softdot_ref::unit_roundoff<T>())
        << type_name<T>() << " n=" << n;
  }
}

TEST_P(SoftmaxStateTest, StateOfAChunk) {
  CheckStateFields<float>();
  CheckStateFields<double>();
}

template <class T>
std::vector<State<T>> sample_states() {
  std::vector<State<T>> s;
  for (std::size_t n : {1, 2, 9, 40, 300}) {
    for (Dist d : kAllDists) {
      const auto v = make_logits<T>(n, d, n * 7 + int(d));
      s.push_back(softdot::softmax_state(std::span<const T>(v)));
    }
  }
  s.push_back(State<T>::identity());
  s.push_back({kInf<T>, 2.0});
  s.push_back({kInf<T>, 1.0});
  s.push_back({kNaN<T>, std::numeric_limits<double>::quiet_NaN()});
  s.push_back({T(3), 1.0});
  s.push_back({T(3), 2.5});  // same max as the previous one
  return s;
}

template <class T>
void CheckAlgebra() {
  const auto states = sample_states<T>();
  const State<T> id = State<T>::identity();
  for (const auto& a : states) {
    EXPECT_TRUE(same_state(softdot::merge(id, a), a)) << show(a);
    EXPECT_TRUE(same_state(softdot::merge(a, id), a)) << show(a);
    for (const auto& b : states) {
      const auto ab = softdot::merge(a, b), ba = softdot::merge(b, a);
      EXPECT_TRUE(same_state(ab, ba)) << show(a) << " " << show(b) << ": "
                                      << show(ab) << " vs " << show(ba);
      for (const auto& c : states) {
        const auto l = softdot::merge(softdot::merge(a, b), c);
        const auto r = softdot::merge(a, softdot::merge(b, c));
        ASSERT_TRUE(same_value(l.max, r.max)) << show(l) << " " << show(r);
        if (std::isnan(l.sum) || std::isnan(r.sum) || l.sum == r.sum) {
          ASSERT_TRUE(same_value(l.sum, r.sum)) << show(l) << " " << show(r);
        } else {
          ASSERT_LE(std::fabs(l.sum - r.sum) / std::fabs(r.sum), 1e-15)
              << show(a) << " " << show(b) << " " << show(c);
        }
      }
    }
  }
  // Specific values.
  const auto m = softdot::merge(State<T>{T(3), 1.0}, State<T>{T(3), 2.5});
  EXPECT_EQ(m.max, T(3));
  EXPECT_EQ(m.sum, 3.5);
  const auto inf =
      softdot::merge(State<T>{kInf<T>, 2.0}, State<T>{kInf<T>, 1.0});
  EXPECT_EQ(inf.max, kInf<T>);
  EXPECT_EQ(inf.sum, 3.0);
  const auto fin = softdot::merge(State<T>{kInf<T>, 2.0}, State<T>{T(5), 1.5});
  EXPECT_EQ(fin.max, kInf<T>);
  EXPECT_EQ(fin.sum, 2.0);
  const auto nan =
      softdot::merge(State<T>{T(1), 1.0}, State<T>{kNaN<T>, kNaN<double>});
  EXPECT_TRUE(std::isnan(nan.max) && std::isnan(nan.sum)) << show(nan);
  EXPECT_TRUE(same_state(softdot::merge(id, id), id));
  EXPECT_EQ(softdot::logsumexp(State<T>{kInf<T>, 2.0}), kInf<T>);
  EXPECT_TRUE(std::isnan(softdot::logsumexp(State<T>{kNaN<T>, kNaN<double>})));
  EXPECT_EQ(softdot::logsumexp(id), -kInf<T>);
}

TEST_P(SoftmaxStateTest, MergeIsCommutativeAssociativeWithIdentity) {
  CheckAlgebra<float>();
  CheckAlgebra<double>();
}

SOFTDOT_INSTANTIATE_PER_TARGET(SoftmaxStateTest);

}  // namespace
}  // namespace softdot_test
