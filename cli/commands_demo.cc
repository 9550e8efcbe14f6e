// softdot command: `softdot demo`, the worked examples of the seed text
// "Softmax and dot products", computed by the library.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "commands.h"
#include "explain.h"
#include "format.h"
#include "softdot/simd.h"
#include "softdot/softmax.h"
#include "softdot/version.h"

namespace softdot::cli {
namespace {

std::string list(std::span<const double> values, int digits) {
  // Appended piecewise: "[" + std::string&& trips GCC 12's -Wrestrict.
  std::string out = "[";
  out += join_numbers(values, digits, ", ");
  out += ']';
  return out;
}

std::vector<double> softmax_of(std::vector<double> scores) {
  std::vector<double> weights(scores.size());
  softdot::softmax(scores, weights);
  return weights;
}

std::string bits(double value) {
  std::uint64_t u = 0;
  std::memcpy(&u, &value, sizeof u);
  char buffer[19];
  static const char kHex[] = "0123456789abcdef";
  buffer[0] = '0';
  buffer[1] = 'x';
  for (int i = 0; i < 16; ++i) buffer[2 + i] = kHex[(u >> (60 - 4 * i)) & 15];
  return std::string(buffer, 18);
}

std::string bits_list(std::span<const double> values) {
  std::string s;
  for (std::size_t i = 0; i < values.size(); ++i)
    s += (i ? " " : "") + bits(values[i]);
  return s;
}

}  // namespace

int run_demo() {
  std::string out;
  out += "softdot " + std::string(softdot::version()) +
         ": the worked examples of \"Softmax and dot products\"\n";
  out += "SIMD target: " + softdot::simd_target() + "\n\n";

  // 1. Dot product.
  const std::vector<double> q = {1, 2, 0}, k = {2, 1, 3};
  out += "1. Dot products measure agreement: q = " + list(q, kShortest) +
         ", k = " + list(k, kShortest) + "\n\n";
  std::string dot = explain_dot(q, k, "q", "k");
  for (std::size_t pos = 0; pos < dot.size();) {  // indent every line
    const std::size_t end = dot.find('\n', pos);
    out += "   " + dot.substr(pos, end - pos + 1);
    pos = end + 1;
  }

  // 2. Softmax of [2.0, 1.0, 0.1].
  const std::vector<double> scores = {2.0, 1.0, 0.1};
  std::vector<double> exps(scores.size());
  double exp_sum = 0, rounded_sum = 0;
  for (std::size_t i = 0; i < scores.size(); ++i) {
    exps[i] = std::exp(scores[i]);
    exp_sum += exps[i];
    // The seed adds the rounded values, as one does by hand:
    // 7.389 + 2.718 + 1.105 = 11.212 (the unrounded sum is 11.21251).
    rounded_sum += std::stod(format_number(exps[i], 3));
  }
  const std::vector<double> weights = softmax_of(scores);
  double weight_sum = 0;
  for (double w : weights) weight_sum += w;
  out += "\n2. Softmax turns scores into weights: scores " +
         list(scores, kShortest) + "\n\n";
  out += "   weight_i = exp(score_i) / sum_j exp(score_j)\n\n";
  out += "   exp:    " + list(exps, 3) +
         "     sum = " + format_number(rounded_sum, 3) + " (unrounded " +
         format_number(exp_sum, 5) + ")\n";
  out += "   weight: " + list(weights, 3) + "    sums to " +
         format_number(weight_sum, 3) + "\n\n";
  for (std::size_t i = 0; i < weights.size(); ++i) {
    out += "   " + format_number(scores[i], 1) + "  " +
           format_number(weights[i], 3) + "  " + weight_bar(weights[i]) + "\n";
  }

  // 3. Overflow: the naive formula against softdot.
  const std::vector<double> big = {1002.0, 1000.0, 997.0};
  std::vector<double> naive_exp(big.size()), naive(big.size());
  double naive_sum = 0;
  for (std::size_t i = 0; i < big.size(); ++i) {
    naive_exp[i] = std::exp(big[i]);  // overflows to inf in float64
    naive_sum += naive_exp[i];
  }
  for (std::size_t i = 0; i < big.size(); ++i)
    naive[i] = naive_exp[i] / naive_sum;
  out += "\n3. Subtract the max before exponentiating: scores " +
         list(big, kShortest) + "\n\n";
  out += "   naive exp(score) / sum:   exp = " + list(naive_exp, 4) +
         ", sum = " + format_number(naive_sum, 4) + "\n";
  out += "                             weights " + list(naive, 4) +
         " (inf / inf = nan)\n";
  out +=
      "   softdot (max subtracted): weights " + list(softmax_of(big), 4) + "\n";

  // 4. Check yourself.
  const std::vector<double> equal4 = softmax_of({3, 3, 3, 3});
  bool all_quarter = true;
  for (double w : equal4) all_quarter = all_quarter && w == 0.25;
  out += "\n4. Check yourself\n\n";
  out +=
      "   All scores equal, n = 4: softmax([3, 3, 3, 3]) = " + list(equal4, 3) +
      ", each 1/n = 1/4" + (all_quarter ? " exactly" : " (NOT exactly 1/4)") +
      "\n";
  const std::vector<double> fives = softmax_of({5, 5});
  const std::vector<double> zeros = softmax_of({0, 0});
  const bool identical = bits_list(fives) == bits_list(zeros);
  out += "   softmax([5, 5]) = " + list(fives, kShortest) + "  bits " +
         bits_list(fives) + "\n";
  out += "   softmax([0, 0]) = " + list(zeros, kShortest) + "  bits " +
         bits_list(zeros) + "\n";
  out += std::string("   ") +
         (identical ? "identical: adding the same constant to every score "
                      "cancels out in the division\n"
                    : "DIFFERENT: the shift should have cancelled out\n");
  print(out);
  return identical && all_quarter ? 0 : 1;
}

}  // namespace softdot::cli
