// Uses an installed softdot through its umbrella header and checks two values
// from the seed lesson. Exit status 0 when both match, 1 otherwise.
#include <softdot/softdot.h>

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  int failures = 0;

  // q . k = 1*2 + 2*1 + 0*3 = 4, exact in float.
  const std::vector<float> q = {1.0f, 2.0f, 0.0f};
  const std::vector<float> k = {2.0f, 1.0f, 3.0f};
  const float d = softdot::dot(q, k);
  std::printf("dot([1,2,0], [2,1,3]) = %g\n", static_cast<double>(d));
  if (d != 4.0f) {
    std::fprintf(stderr, "dot: expected 4, got %.9g\n", static_cast<double>(d));
    ++failures;
  }

  // softmax([2, 1, 0.1]) = [0.659, 0.242, 0.099]; the reference is computed
  // here in double and the library promises a few ulp, so 1e-6 relative is
  // generous while still catching a wrong formula.
  const std::vector<float> scores = {2.0f, 1.0f, 0.1f};
  std::vector<float> weights(scores.size());
  softdot::softmax(scores, weights);
  double sum_exp = 0.0;
  for (float s : scores) sum_exp += std::exp(static_cast<double>(s) - 2.0);
  std::printf("softmax([2, 1, 0.1]) =");
  for (std::size_t i = 0; i < scores.size(); ++i) {
    const double want =
        std::exp(static_cast<double>(scores[i]) - 2.0) / sum_exp;
    const double got = weights[i];
    std::printf(" %.3f", got);
    if (!(std::fabs(got - want) <= 1e-6 * want)) {
      std::fprintf(stderr, "\nsoftmax[%zu]: expected %.9g, got %.9g\n", i, want,
                   got);
      ++failures;
    }
  }
  std::printf("\n");

  std::printf("softdot %s, simd_target %s\n", softdot::version(),
              softdot::simd_target().c_str());
  if (failures != 0) {
    std::fprintf(stderr, "consumer: %d check(s) failed\n", failures);
    return 1;
  }
  std::printf("consumer: OK\n");
  return 0;
}
