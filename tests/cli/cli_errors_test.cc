// Bad input through the real binary: exit status 2, exactly one line on
// stderr naming the problem and the place, nothing on stdout, and no output
// file created or changed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "npy_test_io.h"
#include "run_command.h"

namespace softdot_test {
namespace {

struct ErrorCase {
  const char* name;
  std::vector<std::string> args;  // "$D" is replaced by the temp directory
  std::string expected;           // the whole stderr line, "$D" replaced
  std::string input{};            // standard input ({}: cases may leave it out)
  bool softmax = true;            // also run with -o (softmax only)
};

std::string substitute(std::string s, const std::string& dir) {
  for (std::size_t p = s.find("$D"); p != std::string::npos;
       p = s.find("$D", p + dir.size()))
    s.replace(p, 2, dir);
  return s;
}

// Input files every case can name.
std::map<std::string, std::string> input_files() {
  const std::string f4 = raw_bytes(std::vector<float>{1, 2, 3, 4, 5, 6});
  const std::string f8 = raw_bytes(std::vector<double>{1, 2, 3, 4, 5, 6});
  const std::string good = make_npy("<f4", "(2, 3)", f4);
  std::string bad_version = good;
  bad_version[6] = 4;
  std::string bad_magic = good;
  bad_magic[5] = 'X';
  return {
      {"good.csv", "1,2,3\n4,5,6\n"},
      {"ragged.csv", "1,2,3\n4,5,6\n7,8\n"},
      {"ragged2.csv", "1,2,3\n4,5,6,7\n"},
      {"blank.csv", "1,2\n\n3,4\n"},
      {"bad.csv", "1,2,3\n4,5,6\n1, 2, x\n"},
      {"emptyfield.csv", "1,,2\n"},
      // A byte-order mark where it is not skipped (line 2), a no-break
      // space, a zero-width space, a byte that is not UTF-8 (Latin-1 NBSP).
      {"bom2.csv",
       "1,2\n\xef\xbb\xbf"
       "4,5\n"},
      {"nbsp.csv", "1,2\xc2\xa0\n"},
      {"zwsp.csv",
       "1,\xe2\x80\x8b"
       "2\n"},
      {"latin1.csv", "1\xa0,2\n"},
      {"empty.csv", ""},
      {"spaces.csv", "  \n\n"},
      {"int32.npy",
       make_npy("<i4", "(2, 3)",
                raw_bytes(std::vector<std::int32_t>{1, 2, 3, 4, 5, 6}))},
      {"3d.npy", make_npy("<f4", "(1, 2, 3)", f4)},
      {"1d.npy", make_npy("<f4", "(6,)", f4)},
      {"fortran.npy", make_npy("<f8", "(2, 3)", f8, 1, true)},
      {"bigendian.npy", make_npy(">f8", "(2, 3)", f8)},
      {"truncated.npy", good.substr(0, good.size() - 5)},
      {"shortheader.npy", good.substr(0, 30)},
      {"tiny.npy", good.substr(0, 5)},
      {"extra.npy", good + "xy"},
      {"norows.npy", make_npy("<f4", "(0, 3)", "")},
      {"nocols.npy", make_npy("<f4", "(2, 0)", "")},
      {"version4.npy", bad_version},
      {"magic.npy", bad_magic},
      {"header.npy", make_npy("<f4", "[2, 3]", f4)},
  };
}

std::vector<ErrorCase> cases() {
  return {
      {"dot_lengths",
       {"dot", "1,2,0", "2,1"},
       "argument 1 has 3 values, argument 2 has 2; dot needs equal lengths",
       "",
       false},
      {"dot_not_number",
       {"dot", "1,2", "2,abc"},
       "argument 2: \"abc\" is not a number",
       "",
       false},
      {"dot_one_vector",
       {"dot", "1,2"},
       "dot needs two vectors, got 1 argument",
       "",
       false},
      {"dot_three_vectors",
       {"dot", "1", "2", "3"},
       "dot needs two vectors, got 3 arguments",
       "",
       false},
      {"not_number",
       {"softmax", "1", "abc"},
       "argument 2: \"abc\" is not a number"},
      {"two_points",
       {"softmax", "1.2.3"},
       "argument 1: \"1.2.3\" is not a number"},
      {"bare_exponent",
       {"softmax", "2", "1e"},
       "argument 2: \"1e\" is not a number"},
      {"hex", {"softmax", "0x10"}, "argument 1: \"0x10\" is not a number"},
      {"trailing_junk",
       {"softmax", "1", "2,3x"},
       "argument 2: \"3x\" is not a number"},
      {"negative_junk",
       {"softmax", "-1.5.2"},
       "argument 1: \"-1.5.2\" is not a number"},
      {"infinity_typo",
       {"softmax", "-infx"},
       "unknown option \"-infx\" (see softdot softmax --help)"},
      {"overflow",
       {"softmax", "1e999"},
       "argument 1: \"1e999\" is out of range for float64"},
      {"empty_value",
       {"softmax", "1,,2"},
       "argument 1: column 3: empty value in \"1,,2\""},
      {"empty_argument",
       {"softmax", "1", ""},
       "argument 2: no numbers in \"\""},
      {"temperature_zero",
       {"softmax", "--temperature", "0", "1"},
       "--temperature: \"0\" must be a finite number > 0"},
      {"temperature_negative",
       {"softmax", "-t", "-2", "1"},
       "--temperature: \"-2\" must be a finite number > 0"},
      {"temperature_inf",
       {"softmax", "--temperature=inf", "1"},
       "--temperature: \"inf\" must be a finite number > 0"},
      {"temperature_nan",
       {"softmax", "--temperature", "nan", "1"},
       "--temperature: \"nan\" must be a finite number > 0"},
      {"temperature_text",
       {"softmax", "--temperature", "hot", "1"},
       "--temperature: \"hot\" is not a number"},
      {"mask_length",
       {"softmax", "--mask", "1,0", "1", "2", "3"},
       "--mask has 2 flags, need 3"},
      {"mask_rows_length",
       {"softmax", "--mask", "1,0", "--rows", "$D/good.csv"},
       "--mask has 2 flags, need 3 (one per column) or 6 (one per value)"},
      {"mask_value",
       {"softmax", "--mask", "1,2,0", "1", "2", "3"},
       "--mask: flag 2 \"2\" is not 0 or 1"},
      {"digits_range",
       {"softmax", "--digits", "21", "1"},
       "--digits: \"21\" must be a whole number from 0 to 20"},
      {"digits_text",
       {"softmax", "--digits", "-1", "1"},
       "--digits: \"-1\" must be a whole number from 0 to 20"},
      {"stdin_not_number",
       {"softmax"},
       "<stdin>:2:4: \"x\" is not a number",
       "1 2\n3, x 4\n"},
      {"stdin_empty", {"softmax"}, "<stdin>: no numbers", " \n"},
      {"ragged_csv",
       {"softmax", "--rows", "$D/ragged.csv"},
       "$D/ragged.csv: line 3 has 2 values, line 1 has 3"},
      {"ragged_csv_longer",
       {"softmax", "--rows", "$D/ragged2.csv"},
       "$D/ragged2.csv: line 2 has 4 values, line 1 has 3"},
      {"csv_blank_line",
       {"softmax", "--rows", "$D/blank.csv"},
       "$D/blank.csv:2: empty row"},
      {"csv_not_number",
       {"softmax", "--rows", "$D/bad.csv"},
       "$D/bad.csv:3:7: \"x\" is not a number"},
      {"csv_empty_field",
       {"softmax", "--rows", "$D/emptyfield.csv"},
       "$D/emptyfield.csv:1:3: empty value"},
      {"csv_empty_file",
       {"softmax", "--rows", "$D/empty.csv"},
       "$D/empty.csv: no rows"},
      {"csv_only_blank",
       {"softmax", "--rows", "$D/spaces.csv"},
       "$D/spaces.csv: no rows"},
      {"csv_stdin_ragged",
       {"softmax", "--rows", "-"},
       "<stdin>: line 2 has 1 value, line 1 has 2",
       "1 2\n3\n"},
      {"missing_file",
       {"softmax", "--rows", "$D/nope.csv"},
       "$D/nope.csv: cannot open: No such file or directory"},
      {"directory",
       {"softmax", "--rows", "$D"},
       "$D: cannot read: Is a directory"},
      {"npy_int32",
       {"softmax", "--rows", "$D/int32.npy"},
       "$D/int32.npy: dtype '<i4' (int32) is not supported; need float32 "
       "'<f4' or float64 '<f8'"},
      {"npy_3d",
       {"softmax", "--rows", "$D/3d.npy"},
       "$D/3d.npy: shape (1, 2, 3) has 3 dimensions; need a 2-D array "
       "(rows, cols)"},
      {"npy_1d",
       {"softmax", "--rows", "$D/1d.npy"},
       "$D/1d.npy: shape (6,) has 1 dimension; need a 2-D array (rows, cols)"},
      {"npy_fortran",
       {"softmax", "--rows", "$D/fortran.npy"},
       "$D/fortran.npy: Fortran-order arrays are not supported; need C order "
       "(fortran_order False)"},
      {"npy_big_endian",
       {"softmax", "--rows", "$D/bigendian.npy"},
       "$D/bigendian.npy: big-endian dtype '>f8' is not supported; need "
       "little-endian '<f4' or '<f8'"},
      {"npy_truncated",
       {"softmax", "--rows", "$D/truncated.npy"},
       "$D/truncated.npy: truncated: shape (2, 3) needs 24 bytes of data, "
       "the file has 19"},
      {"npy_short_header",
       {"softmax", "--rows", "$D/shortheader.npy"},
       "$D/shortheader.npy: truncated .npy header (118 bytes announced, 20 "
       "present)"},
      {"npy_tiny",
       {"softmax", "--rows", "$D/tiny.npy"},
       "$D/tiny.npy: not a .npy file (no \\x93NUMPY magic), or truncated"},
      {"npy_extra",
       {"softmax", "--rows", "$D/extra.npy"},
       "$D/extra.npy: 2 unexpected bytes after the data of shape (2, 3)"},
      {"npy_no_rows",
       {"softmax", "--rows", "$D/norows.npy"},
       "$D/norows.npy: shape (0, 3) has no rows"},
      {"npy_no_cols",
       {"softmax", "--rows", "$D/nocols.npy"},
       "$D/nocols.npy: shape (2, 0): the rows are empty"},
      {"npy_version",
       {"softmax", "--rows", "$D/version4.npy"},
       "$D/version4.npy: unsupported .npy format version 4.0 (need 1.0, 2.0 "
       "or 3.0)"},
      {"npy_magic",
       {"softmax", "--rows", "$D/magic.npy"},
       "$D/magic.npy: not a .npy file (no \\x93NUMPY magic)"},
      {"npy_header",
       {"softmax", "--rows", "$D/header.npy"},
       "$D/header.npy: bad .npy header: expected '('"},
      {"rows_and_scores",
       {"softmax", "--rows", "$D/ragged.csv", "1", "2"},
       "argument 1: scores on the command line cannot be combined with "
       "--rows"},
      {"unknown_option",
       {"softmax", "--bogus", "1"},
       "unknown option \"--bogus\" (see softdot softmax --help)"},
      {"unknown_command",
       {"frobnicate", "1"},
       "unknown command \"frobnicate\"; the commands are dot, softmax, "
       "attention, cross-entropy and demo (see softdot --help)",
       "",
       false},
      // An empty option value is named (CLI11 would take the next token).
      {"empty_option_value",
       {"softmax", "--temperature", "", "1", "2"},
       "--temperature: the value is empty (see softdot softmax --help)"},
      {"empty_option_value_after_equals",
       {"softmax", "--digits=", "1", "2"},
       "--digits: the value is empty (see softdot softmax --help)"},
      {"empty_short_option_value",
       {"softmax", "-t", "", "1"},
       "-t: the value is empty (see softdot softmax --help)"},
      // Invisible characters are shown escaped; a byte-order mark is named.
      {"bom_not_at_start",
       {"softmax", "--rows", "$D/bom2.csv"},
       "$D/bom2.csv:2:1: \"\\ufeff4\" is not a number: it holds a "
       "byte-order mark (U+FEFF)"},
      {"bom_in_argument",
       {"softmax",
        "\xef\xbb\xbf"
        "1",
        "2"},
       "argument 1: \"\\ufeff1\" is not a number: it holds a byte-order "
       "mark (U+FEFF)"},
      {"no_break_space",
       {"softmax", "--rows", "$D/nbsp.csv"},
       "$D/nbsp.csv:1:3: \"2\\u00a0\" is not a number"},
      {"zero_width_space",
       {"softmax", "--rows", "$D/zwsp.csv"},
       "$D/zwsp.csv:1:3: \"\\u200b2\" is not a number"},
      {"not_utf8",
       {"softmax", "--rows", "$D/latin1.csv"},
       "$D/latin1.csv:1:1: \"1\\xa0\" is not a number"},
      {"stdin_bom_not_at_start",
       {"softmax"},
       "<stdin>:1:3: \"\\ufeff2\" is not a number: it holds a byte-order "
       "mark (U+FEFF)",
       "1 \xef\xbb\xbf"
       "2\n"},
  };
}

void expect_one_error_line(const CommandResult& r, const std::string& want,
                           const char* name) {
  EXPECT_EQ(r.status, 2) << name;
  EXPECT_EQ(r.out, "") << name;
  EXPECT_EQ(r.err, "softdot: error: " + want + "\n") << name;
}

TEST(CliErrors, EveryBadInputIsOneLineAndStatus2) {
  for (const ErrorCase& c : cases()) {
    TempDir dir;
    for (const auto& [name, content] : input_files())
      write_whole_file(dir.path(name), content);
    const std::string& d = dir.root();
    std::vector<std::string> args;
    for (const std::string& a : c.args) args.push_back(substitute(a, d));
    const std::vector<std::string> before = dir.list();
    expect_one_error_line(run_softdot(args, c.input), substitute(c.expected, d),
                          c.name);
    if (!c.softmax) continue;

    // With an output file that already exists: it stays as it was.
    write_whole_file(dir.path("out.npy"), "precious");
    std::vector<std::string> with_output = args;
    with_output.insert(with_output.begin() + 1, {"-o", dir.path("out.npy")});
    expect_one_error_line(run_softdot(with_output, c.input),
                          substitute(c.expected, d), c.name);
    EXPECT_EQ(read_whole_file(dir.path("out.npy")), "precious") << c.name;

    // With a new output file: none is left behind, nor any temporary file.
    with_output[2] = dir.path("new.csv");
    expect_one_error_line(run_softdot(with_output, c.input),
                          substitute(c.expected, d), c.name);
    std::vector<std::string> after = before;
    after.push_back("out.npy");
    std::sort(after.begin(), after.end());
    EXPECT_EQ(dir.list(), after) << c.name;
  }
}

TEST(CliErrors, UnwritableOutputLeavesNothing) {
  TempDir dir;
  const CommandResult r =
      run_softdot({"softmax", "-o", dir.path("no/such/dir/out.npy"), "1", "2"});
  expect_one_error_line(
      r,
      dir.path("no/such/dir/out.npy") +
          ": cannot create a file there: No such file or directory",
      "unwritable");
  EXPECT_TRUE(dir.list().empty());
}

TEST(CliErrors, OutputNeedsAKnownExtension) {
  TempDir dir;
  write_whole_file(dir.path("out.txt"), "keep");
  const CommandResult r =
      run_softdot({"softmax", "-o", dir.path("out.txt"), "1", "2"});
  expect_one_error_line(r,
                        "--output \"" + dir.path("out.txt") +
                            "\": unknown file type; the name must end in "
                            ".npy or .csv",
                        "extension");
  EXPECT_EQ(read_whole_file(dir.path("out.txt")), "keep");
}

TEST(CliErrors, ConflictingOptions) {
  expect_one_error_line(
      run_softdot({"softmax", "--explain", "--json", "1", "2"}),
      "--explain works on one row printed as text; it cannot be combined "
      "with --rows, --json or --output",
      "explain_json");
  expect_one_error_line(
      run_softdot({"softmax", "--json", "-o", "x.npy", "1", "2"}),
      "--json and --output cannot be combined; --json writes to standard "
      "output",
      "json_output");
  EXPECT_FALSE(file_exists("x.npy"));
}

}  // namespace
}  // namespace softdot_test
