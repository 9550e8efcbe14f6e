// The softmax subcommand's options through the real binary: negative and
// special tokens, --log, --mask, --temperature, --json, standard input.
#include <gtest/gtest.h>

#include <charconv>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "run_command.h"
#include "softdot/dot.h"
#include "softdot/softmax.h"

namespace softdot_test {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

std::string shortest(double v) {
  char b[64];
  return std::string(b, std::to_chars(b, b + sizeof b, v).ptr);
}
std::string fixed(double v, int digits) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  char b[400];
  return std::string(
      b,
      std::to_chars(b, b + sizeof b, v, std::chars_format::fixed, digits).ptr);
}

// The library's softmax of `x` (double), written as the command should.
std::string expected_text(const std::vector<double>& x, int digits = 3,
                          bool log = false,
                          const softdot::SoftmaxOptions& o = {}) {
  std::vector<double> y(x.size());
  if (log)
    softdot::log_softmax(x, y, o);
  else
    softdot::softmax(x, y, o);
  std::string s;
  for (std::size_t i = 0; i < y.size(); ++i) {
    if (i) s += ' ';
    s += fixed(y[i], digits);
  }
  return s + "\n";
}

TEST(CliSoftmax, NegativeNumbersAndInfinitiesAreScoresNotOptions) {
  const std::string want = expected_text({-1, -kInf, 2});
  EXPECT_EQ(want, "0.047 0.000 0.953\n");
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{
           {"softmax", "-1", "-inf", "2"},
           {"softmax", "-1,-inf,2"},
           {"softmax", "-1", "-INF", "+2"},
           {"softmax", "-1", "-Infinity", "2.0"},
           {"softmax", "--", "-1", "-inf", "2"},
           {"softmax", "-1", "-inf", "2", "--digits", "3"},
           {"softmax", "-1e0", "-inf", "2e0"}}) {
    const CommandResult r = run_softdot(args);
    EXPECT_EQ(r.status, 0) << args[1] << ": " << r.err;
    EXPECT_EQ(r.out, want) << args[1];
    EXPECT_EQ(r.err, "");
  }
}

TEST(CliSoftmax, OptionValuesMayBeNegativeLookingTokens) {
  // "-1" after --temperature is its value (an error: T must be > 0), and
  // "-.5" right after the subcommand is a score.
  CommandResult r = run_softdot({"softmax", "--temperature", "-1", "1", "2"});
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(
      r.err,
      "softdot: error: --temperature: \"-1\" must be a finite number > 0\n");
  r = run_softdot({"softmax", "-.5", "-t", "2", "-1.5"});
  EXPECT_EQ(r.status, 0) << r.err;
  softdot::SoftmaxOptions o;
  o.temperature = 2;
  EXPECT_EQ(r.out, expected_text({-0.5, -1.5}, 3, false, o));
}

TEST(CliSoftmax, SpecialValuesFollowTheContract) {
  EXPECT_EQ(run_softdot({"softmax", "1", "nan", "2"}).out, "nan nan nan\n");
  EXPECT_EQ(run_softdot({"softmax", "-inf", "-inf", "-inf"}).out,
            "0.000 0.000 0.000\n");
  EXPECT_EQ(run_softdot({"softmax", "inf", "3", "inf"}).out,
            "0.500 0.000 0.500\n");
  EXPECT_EQ(run_softdot({"softmax", "--log", "-inf", "-inf"}).out,
            "-inf -inf\n");
  EXPECT_EQ(run_softdot({"softmax", "--json", "NaN", "0"}).out,
            "{\"weights\":[\"nan\",\"nan\"]}\n");
}

TEST(CliSoftmax, LogSoftmax) {
  const CommandResult r =
      run_softdot({"softmax", "--log", "2.0", "1.0", "0.1"});
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.out, expected_text({2.0, 1.0, 0.1}, 3, /*log=*/true));
  EXPECT_EQ(r.out, "-0.417 -1.417 -2.317\n");
  EXPECT_EQ(run_softdot({"softmax", "--log", "--mask", "0,1", "5", "7"}).out,
            "-inf 0.000\n");
}

TEST(CliSoftmax, MaskZeroMeansMinusInfinity) {
  const CommandResult r =
      run_softdot({"softmax", "--mask", "1,0,1", "2.0", "1.0", "0.1"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, run_softdot({"softmax", "2.0", "-inf", "0.1"}).out);
  EXPECT_EQ(r.out, "0.870 0.000 0.130\n");
  // A masked NaN is ignored; a mask of all zeros gives zeros.
  EXPECT_EQ(run_softdot({"softmax", "--mask", "1 0", "3", "nan"}).out,
            "1.000 0.000\n");
  EXPECT_EQ(run_softdot({"softmax", "--mask", "0,0", "3", "4"}).out,
            "0.000 0.000\n");
}

TEST(CliSoftmax, TemperatureDividesTheScores) {
  softdot::SoftmaxOptions o;
  o.temperature = 0.5;
  const CommandResult r = run_softdot(
      {"softmax", "--temperature", "0.5", "--digits", "6", "2", "1", "0.1"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, expected_text({2, 1, 0.1}, 6, false, o));
  // T = 2 on [2, 1, 0.1] is softmax([1, 0.5, 0.05]).
  EXPECT_EQ(run_softdot({"softmax", "-t", "2", "2", "1", "0.1"}).out,
            run_softdot({"softmax", "1", "0.5", "0.05"}).out);
  EXPECT_EQ(run_softdot({"softmax", "-t2", "2", "1", "0.1"}).out,
            run_softdot({"softmax", "--temperature=2", "2", "1", "0.1"}).out);
  EXPECT_NE(run_softdot({"softmax", "-t", "2", "2", "1", "0.1"}).out,
            run_softdot({"softmax", "2", "1", "0.1"}).out);
}

// --fast selects Precision::kFast; on some rows its last bits differ from
// the default (faithful) weights, and the command prints the library's.
TEST(CliSoftmax, FastSelectsTheFastPrecision) {
  softdot::SoftmaxOptions fast;
  fast.precision = softdot::Precision::kFast;
  bool differs = false;
  for (int k = 1; k <= 40 && !differs; ++k) {
    const std::vector<double> x = {0.1 * k, -0.37 * k, 1.3, 0.05 * k * k};
    std::vector<std::string> argv = {"softmax", "--fast", "--digits", "20"};
    for (double v : x) argv.push_back(shortest(v));
    const CommandResult r = run_softdot(argv);
    ASSERT_EQ(r.status, 0) << r.err;
    ASSERT_EQ(r.out, expected_text(x, 20, false, fast)) << "k=" << k;
    differs = r.out != expected_text(x, 20);
  }
  EXPECT_TRUE(differs) << "no row where --fast changed a weight";
}

TEST(CliSoftmax, DigitsChangesTheDecimals) {
  EXPECT_EQ(run_softdot({"softmax", "--digits", "0", "1", "1"}).out, "0 0\n");
  EXPECT_EQ(run_softdot({"softmax", "--digits", "1", "1", "1"}).out,
            "0.5 0.5\n");
  EXPECT_EQ(run_softdot({"softmax", "--digits", "17", "0", "0"}).out,
            "0.50000000000000000 0.50000000000000000\n");
}

TEST(CliSoftmax, ScoresFromStandardInput) {
  for (const char* input : {"2.0 1.0 0.1\n", "2.0,1.0,0.1", "2.0\n1.0\n0.1\n",
                            " 2.0 , 1.0\r\n0.1\r\n\n"}) {
    const CommandResult r = run_softdot({"softmax"}, input);
    EXPECT_EQ(r.status, 0) << input << r.err;
    EXPECT_EQ(r.out, "0.659 0.242 0.099\n") << input;
  }
  EXPECT_EQ(run_softdot({"softmax", "--digits", "4"}, "1002 -inf 997").out,
            expected_text({1002, -kInf, 997}, 4));
}

TEST(CliSoftmax, JsonSingleRowIsAnObjectWithShortestNumbers) {
  std::vector<double> y(3);
  const std::vector<double> x = {2.0, 1.0, 0.1};
  softdot::softmax(x, y);
  CommandResult r = run_softdot({"softmax", "--json", "2.0", "1.0", "0.1"});
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.out, "{\"weights\":[" + shortest(y[0]) + "," + shortest(y[1]) +
                       "," + shortest(y[2]) + "]}\n");
  r = run_softdot({"softmax", "--json", "--digits", "3", "2.0", "1.0", "0.1"});
  EXPECT_EQ(r.out, "{\"weights\":[0.659,0.242,0.099]}\n");
  r = run_softdot({"softmax", "--json", "--log", "--digits", "1", "0", "-inf"});
  EXPECT_EQ(r.out, "{\"log_weights\":[0.0,\"-inf\"]}\n");
}

TEST(CliSoftmax, SingleRowToAFile) {
  TempDir dir;
  const CommandResult r =
      run_softdot({"softmax", "-o", dir.path("w.csv"), "2.0", "1.0", "0.1"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "");
  std::vector<double> y(3);
  const std::vector<double> x = {2.0, 1.0, 0.1};
  softdot::softmax(x, y);
  EXPECT_EQ(
      read_whole_file(dir.path("w.csv")),
      shortest(y[0]) + "," + shortest(y[1]) + "," + shortest(y[2]) + "\n");
  EXPECT_EQ(dir.list(), std::vector<std::string>{"w.csv"});
}

TEST(CliDot, NegativeNumbersJsonAndIeeeSpecials) {
  EXPECT_EQ(run_softdot({"dot", "-1,2", "3,-4"}).out, "-11\n");
  EXPECT_EQ(run_softdot({"dot", "--json", "1,2,0", "2,1,3"}).out,
            "{\"dot\":4}\n");
  EXPECT_EQ(run_softdot({"dot", "0.1", "0.1"}).out,
            shortest(softdot::dot(std::vector<double>{0.1},
                                  std::vector<double>{0.1})) +
                "\n");
  EXPECT_EQ(run_softdot({"dot", "inf,1", "0,1"}).out, "nan\n");
  EXPECT_EQ(run_softdot({"dot", "-inf", "2"}).out, "-inf\n");
  EXPECT_EQ(run_softdot({"dot", "--json", "inf", "1"}).out,
            "{\"dot\":\"inf\"}\n");
}

}  // namespace
}  // namespace softdot_test
