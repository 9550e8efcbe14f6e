// The seed text's worked examples through the real `softdot` binary: exact
// outputs of dot, softmax, --explain, demo, --version and --help.
#include <gtest/gtest.h>

#include <string>

#include "run_command.h"
#include "softdot/simd.h"
#include "softdot/version.h"

namespace softdot_test {
namespace {

TEST(CliSeed, DotOfTheSeedVectorsIsFour) {
  const CommandResult r = run_softdot({"dot", "1,2,0", "2,1,3"});
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.out, "4\n");
  EXPECT_EQ(r.err, "");
}

TEST(CliSeed, SoftmaxOfTheSeedScores) {
  const CommandResult r = run_softdot({"softmax", "2.0", "1.0", "0.1"});
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.out, "0.659 0.242 0.099\n");
  EXPECT_EQ(r.err, "");
}

TEST(CliSeed, SoftmaxOfLargeScoresDoesNotOverflow) {
  const CommandResult r =
      run_softdot({"softmax", "--digits", "4", "1002", "1000", "997"});
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.out, "0.8756 0.1185 0.0059\n");
}

TEST(CliSeed, CommaSeparatedScoresGiveTheSameWeights) {
  EXPECT_EQ(run_softdot({"softmax", "2.0,1.0,0.1"}).out, "0.659 0.242 0.099\n");
  EXPECT_EQ(run_softdot({"softmax", "2.0, 1.0", "0.1"}).out,
            "0.659 0.242 0.099\n");
  EXPECT_EQ(run_softdot({"softmax", "--digits=4", "1002,1000,997"}).out,
            "0.8756 0.1185 0.0059\n");
}

TEST(CliSeed, ExplainShowsTheWorkedExample) {
  const CommandResult r =
      run_softdot({"softmax", "--explain", "2.0", "1.0", "0.1"});
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(r.out,
            "softmax of 3 scores: [2, 1, 0.1]\n"
            "\n"
            "weight_i = exp(score_i) / sum_j exp(score_j)\n"
            "\n"
            "exp:    [7.389, 2.718, 1.105]    sum = 11.212 (adding the "
            "rounded values; unrounded 11.21251)\n"
            "weight: [0.659, 0.242, 0.099]    sums to 1.000\n"
            "\n"
            "Subtract the max before exponentiating: m = 2.\n"
            "exp() of a large score overflows (exp(710) is already inf in "
            "float64), but\n"
            "exp(score - m) is at most 1. The weights do not change, because "
            "the same\n"
            "factor exp(-m) appears on top and bottom. This is what softdot "
            "computes:\n"
            "\n"
            "  i  score  score - m  exp(score - m)  weight\n"
            "  1      2      0.000           1.000   0.659  "
            "##########################\n"
            "  2      1     -1.000           0.368   0.242  ##########\n"
            "  3    0.1     -1.900           0.150   0.099  ####\n"
            "sum                             1.517   1.000\n"
            "\n"
            "weight_i = exp(score_i - m) / 1.517\n");
}

TEST(CliSeed, ExplainShowsTheNaiveFormulaOverflowing) {
  const CommandResult r = run_softdot(
      {"softmax", "--explain", "--digits", "4", "1002", "1000", "997"});
  EXPECT_EQ(r.status, 0);
  EXPECT_NE(r.out.find("exp:    [inf, inf, inf]    sum = inf\n"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("weight: [nan, nan, nan]    wrong: exp() overflowed "
                       "to inf for 3 of 3, and inf / inf = nan\n"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("m = 1002."), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  i  score  score - m  exp(score - m)  weight\n"
                       "  1   1002     0.0000          1.0000  0.8756  "
                       "###################################\n"
                       "  2   1000    -2.0000          0.1353  0.1185  "
                       "#####\n"
                       "  3    997    -5.0000          0.0067  0.0059\n"
                       "sum                            1.1421  1.0000\n"),
            std::string::npos)
      << r.out;
}

TEST(CliSeed, DemoRunsEveryWorkedExample) {
  const CommandResult r = run_softdot({"demo"});
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.err, "");
  const std::string expected =
      std::string("softdot ") + softdot::version() +
      ": the worked examples of \"Softmax and dot products\"\n"
      "SIMD target: " +
      softdot::simd_target() +
      "\n"
      "\n"
      "1. Dot products measure agreement: q = [1, 2, 0], k = [2, 1, 3]\n"
      "\n"
      "   q · k = 1·2 + 2·1 + 0·3\n"
      "         = 2 + 2 + 0\n"
      "         = 4\n"
      "\n"
      "2. Softmax turns scores into weights: scores [2, 1, 0.1]\n"
      "\n"
      "   weight_i = exp(score_i) / sum_j exp(score_j)\n"
      "\n"
      "   exp:    [7.389, 2.718, 1.105]     sum = 11.212 (unrounded "
      "11.21251)\n"
      "   weight: [0.659, 0.242, 0.099]    sums to 1.000\n"
      "\n"
      "   2.0  0.659  ##########################\n"
      "   1.0  0.242  ##########\n"
      "   0.1  0.099  ####\n"
      "\n"
      "3. Subtract the max before exponentiating: scores [1002, 1000, 997]\n"
      "\n"
      "   naive exp(score) / sum:   exp = [inf, inf, inf], sum = inf\n"
      "                             weights [nan, nan, nan] (inf / inf = "
      "nan)\n"
      "   softdot (max subtracted): weights [0.8756, 0.1185, 0.0059]\n"
      "\n"
      "4. Check yourself\n"
      "\n"
      "   All scores equal, n = 4: softmax([3, 3, 3, 3]) = [0.250, 0.250, "
      "0.250, 0.250], each 1/n = 1/4 exactly\n"
      "   softmax([5, 5]) = [0.5, 0.5]  bits 0x3fe0000000000000 "
      "0x3fe0000000000000\n"
      "   softmax([0, 0]) = [0.5, 0.5]  bits 0x3fe0000000000000 "
      "0x3fe0000000000000\n"
      "   identical: adding the same constant to every score cancels out in "
      "the division\n";
  EXPECT_EQ(r.out, expected);
}

TEST(CliSeed, DotExplainShowsProductsAndTerms) {
  const CommandResult r = run_softdot({"dot", "--explain", "1,2,0", "2,1,3"});
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.out,
            "x · y = 1·2 + 2·1 + 0·3\n"
            "      = 2 + 2 + 0\n"
            "      = 4\n");
}

TEST(CliSeed, VersionNamesTheLibraryVersionAndSimdTarget) {
  const CommandResult r = run_softdot({"--version"});
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.out, std::string("softdot ") + softdot::version() +
                       " (SIMD target: " + softdot::simd_target() + ")\n");
}

TEST(CliSeed, EverySubcommandHasHelp) {
  for (const char* sub :
       {"dot", "softmax", "attention", "cross-entropy", "demo"}) {
    const CommandResult r = run_softdot({sub, "--help"});
    EXPECT_EQ(r.status, 0) << sub;
    EXPECT_NE(r.out.find(std::string("Usage: softdot ") + sub),
              std::string::npos)
        << r.out;
    EXPECT_EQ(r.err, "") << sub;
  }
  const CommandResult top = run_softdot({"--help"});
  EXPECT_EQ(top.status, 0);
  for (const char* sub :
       {"dot", "softmax", "attention", "cross-entropy", "demo"})
    EXPECT_NE(top.out.find(sub), std::string::npos) << top.out;
  // The options of each command are in its own --help; the top one says so.
  EXPECT_NE(top.out.find("Each command's options: softdot COMMAND --help"),
            std::string::npos)
      << top.out;
  const CommandResult sm = run_softdot({"softmax", "-h"});
  for (const char* option : {"--digits", "--temperature", "--mask", "--rows",
                             "--output", "--log", "--json", "--explain"})
    EXPECT_NE(sm.out.find(option), std::string::npos) << option;
}

// Each error that points to a --help points to the one listing the option:
// the subcommand's for a missing or unknown option of a subcommand.
TEST(CliSeed, ErrorsPointToTheHelpThatListsTheOption) {
  struct Case {
    std::vector<std::string> args;
    std::string error;  // the whole stderr
    std::string help;   // the --help command the error names
    std::string option;
  };
  const std::vector<Case> cases = {
      {{"attention", "--k", "k.npy", "--v", "v.npy"},
       "softdot: error: --q is required (see softdot attention --help)\n",
       "attention",
       "--q"},
      {{"cross-entropy", "--targets", "t.npy"},
       "softdot: error: --logits is required (see softdot cross-entropy "
       "--help)\n",
       "cross-entropy",
       "--logits"},
      {{"softmax", "--digits"},
       "softdot: error: --digits: 1 required N missing (see softdot softmax "
       "--help)\n",
       "softmax",
       "--digits"},
      {{"attention", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy",
        "--dropout", "0.1"},
       "softdot: error: unknown option \"--dropout\" (see softdot attention "
       "--help)\n",
       "attention",
       "--scale"},
  };
  for (const Case& c : cases) {
    const CommandResult r = run_softdot(c.args);
    EXPECT_EQ(r.status, 2) << c.error;
    EXPECT_EQ(r.err, c.error);
    const CommandResult help = run_softdot({c.help, "--help"});
    EXPECT_EQ(help.status, 0);
    EXPECT_NE(help.out.find(c.option), std::string::npos)
        << "softdot " << c.help << " --help does not list " << c.option;
  }
  const CommandResult none = run_softdot({});
  EXPECT_EQ(none.status, 2);
  EXPECT_EQ(none.err.find("(see softdot --help)"),
            none.err.size() - std::string("(see softdot --help)\n").size())
      << none.err;
}

}  // namespace
}  // namespace softdot_test
