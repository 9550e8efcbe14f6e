// `softdot softmax --rows FILE`: CSV and .npy input, text/JSON/CSV/.npy
// output, compared bit for bit with the library's softmax_rows.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "npy_test_io.h"
#include "run_command.h"
#include "softdot/float16.h"
#include "softdot/softmax.h"

namespace softdot_test {
namespace {

// Deterministic scores with a spread of magnitudes and a few specials.
template <class T>
std::vector<T> test_scores(std::size_t n, std::uint32_t seed) {
  std::vector<T> v(n);
  std::uint32_t s = seed;
  for (std::size_t i = 0; i < n; ++i) {
    s = s * 1664525u + 1013904223u;
    v[i] = static_cast<T>((static_cast<double>(s >> 8) / (1u << 24) - 0.5) *
                          (i % 3 == 0 ? 40.0 : 3.0));
  }
  v[3] = -std::numeric_limits<T>::infinity();
  return v;
}

template <class T>
std::vector<T> library_rows(const std::vector<T>& x, std::size_t rows,
                            std::size_t cols, bool log,
                            const softdot::SoftmaxOptions& options = {}) {
  std::vector<T> y(x.size());
  softdot::MatrixView<const T> in(x.data(), rows, cols);
  softdot::MatrixView<T> out(y.data(), rows, cols);
  if (log)
    softdot::log_softmax_rows(in, out, options);
  else
    softdot::softmax_rows(in, out, options);
  return y;
}

template <class T>
void expect_same_bits(const std::vector<T>& got, const std::vector<T>& want) {
  using Bits = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(std::bit_cast<Bits>(got[i]), std::bit_cast<Bits>(want[i]))
        << "element " << i << ": got " << got[i] << ", want " << want[i];
  }
}

template <class T>
void npy_round_trip(const std::string& descr, int major, bool log,
                    const std::vector<std::string>& extra_args,
                    const softdot::SoftmaxOptions& options) {
  TempDir dir;
  const std::size_t rows = 5, cols = 7;
  const std::vector<T> x = test_scores<T>(rows * cols, 12345);
  write_whole_file(dir.path("in.npy"),
                   make_npy(descr, "(5, 7)", raw_bytes(x), major));
  std::vector<std::string> args = {"softmax", "--rows", dir.path("in.npy"),
                                   "-o", dir.path("out.npy")};
  if (log) args.push_back("--log");
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  const CommandResult r = run_softdot(args);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "");
  const ParsedNpy out = parse_npy(read_whole_file(dir.path("out.npy")));
  EXPECT_EQ(out.descr, sizeof(T) == 4 ? "<f4" : "<f8");
  EXPECT_EQ(out.shape, "(5, 7)");
  expect_same_bits(values_of<T>(out.data),
                   library_rows(x, rows, cols, log, options));
  EXPECT_EQ(dir.list(), (std::vector<std::string>{"in.npy", "out.npy"}));
}

// 16-bit .npy rows: float16 '<f2' and bfloat16 as ml_dtypes writes it
// ('<V2'); the output has the input's descr and the 16-bit functions' bits.
template <class H>
void npy16_round_trip(const std::string& descr, bool log,
                      const std::vector<std::string>& extra_args,
                      const softdot::SoftmaxOptions& options) {
  TempDir dir;
  const std::size_t rows = 5, cols = 7;
  const std::vector<float> xf = test_scores<float>(rows * cols, 777);
  std::vector<std::uint16_t> bits(xf.size());
  std::vector<H> x(xf.size());
  for (std::size_t i = 0; i < xf.size(); ++i) {
    if constexpr (std::is_same_v<H, softdot::BFloat16>) {
      x[i] = softdot::to_bfloat16(xf[i]);
    } else {
      x[i] = softdot::to_float16(xf[i]);
    }
    bits[i] = x[i].bits;
  }
  write_whole_file(dir.path("in.npy"),
                   make_npy(descr, "(5, 7)", raw_bytes(bits)));
  std::vector<std::string> args = {"softmax", "--rows", dir.path("in.npy"),
                                   "-o", dir.path("out.npy")};
  if (log) args.push_back("--log");
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  const CommandResult r = run_softdot(args);
  ASSERT_EQ(r.status, 0) << r.err;
  const ParsedNpy out = parse_npy(read_whole_file(dir.path("out.npy")));
  EXPECT_EQ(out.descr, descr);
  EXPECT_EQ(out.shape, "(5, 7)");
  std::vector<H> want(x.size());
  const softdot::MatrixView<const H> in(x.data(), rows, cols);
  const softdot::MatrixView<H> o(want.data(), rows, cols);
  if (log)
    softdot::log_softmax_rows(in, o, options);
  else
    softdot::softmax_rows(in, o, options);
  const std::vector<std::uint16_t> got = values_of<std::uint16_t>(out.data);
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i], want[i].bits) << "element " << i;
  }
}

TEST(CliRows, Float16NpyRoundTripIsBitExact) {
  npy16_round_trip<softdot::Float16>("<f2", false, {}, {});
  softdot::SoftmaxOptions o;
  o.temperature = 0.75;
  npy16_round_trip<softdot::Float16>("<f2", true, {"-t", "0.75"}, o);
}
TEST(CliRows, BFloat16NpyAsMlDtypesWritesItIsBitExact) {
  npy16_round_trip<softdot::BFloat16>("<V2", false, {}, {});
  npy16_round_trip<softdot::BFloat16>("|V2", true, {}, {});
}
TEST(CliRows, Float16NpyToJsonPrintsTheWidenedValues) {
  TempDir dir;
  // float16 bits of 0, 0, -inf: weights 0.5, 0.5, 0.
  const std::vector<std::uint16_t> bits = {0x0000, 0x0000, 0xfc00};
  write_whole_file(dir.path("in.npy"),
                   make_npy("<f2", "(1, 3)", raw_bytes(bits)));
  const CommandResult r =
      run_softdot({"softmax", "--rows", dir.path("in.npy"), "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "{\"weights\":[[0.5,0.5,0]]}\n");
}

TEST(CliRows, Float32NpyRoundTripIsBitExact) {
  npy_round_trip<float>("<f4", 1, false, {}, {});
}
TEST(CliRows, Float64NpyRoundTripIsBitExact) {
  npy_round_trip<double>("<f8", 1, false, {}, {});
}
TEST(CliRows, NpyFormatVersions2And3) {
  npy_round_trip<float>("<f4", 2, false, {}, {});
  npy_round_trip<double>("<f8", 3, true, {}, {});
}
TEST(CliRows, NpyLogSoftmaxWithTemperature) {
  softdot::SoftmaxOptions o;
  o.temperature = 0.75;
  npy_round_trip<float>("<f4", 1, true, {"--temperature", "0.75"}, o);
}
TEST(CliRows, NpyWithOneMaskForEveryRow) {
  std::unique_ptr<bool[]> flags(
      new bool[7]{true, false, true, true, false, true, true});
  softdot::SoftmaxOptions o;
  o.mask = std::span<const bool>(flags.get(), 7);
  npy_round_trip<double>("<f8", 1, false, {"--mask", "1,0,1,1,0,1,1"}, o);
}
TEST(CliRows, NpyWithAMaskPerValue) {
  std::string text;
  std::unique_ptr<bool[]> flags(new bool[35]);
  for (int i = 0; i < 35; ++i) {
    flags[i] = i % 4 != 1;
    if (i) text += ',';
    text += flags[i] ? '1' : '0';
  }
  softdot::SoftmaxOptions o;
  o.mask = std::span<const bool>(flags.get(), 35);
  npy_round_trip<float>("<f4", 1, false, {"--mask", text}, o);
}

TEST(CliRows, CsvRowsToText) {
  TempDir dir;
  write_whole_file(dir.path("s.csv"), "2,1,0.1\n1002, 1000, 997\n\n");
  const CommandResult r = run_softdot({"softmax", "--rows", dir.path("s.csv")});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "0.659 0.242 0.099\n0.876 0.118 0.006\n");
  EXPECT_EQ(run_softdot({"softmax", "--digits", "4", "--rows", "-"},
                        "2 1 0.1\r\n1002 1000 997\r\n")
                .out,
            "0.6590 0.2424 0.0986\n0.8756 0.1185 0.0059\n");
}

// A UTF-8 byte-order mark at the start of a CSV file or of standard input
// (spreadsheets write one) is skipped: the same output as without it.
TEST(CliRows, ByteOrderMarkAtTheStartIsSkipped) {
  TempDir dir;
  const std::string bom = "\xef\xbb\xbf";
  write_whole_file(dir.path("s.csv"), bom + "2,1,0.1\n1002, 1000, 997\n");
  const CommandResult r = run_softdot({"softmax", "--rows", dir.path("s.csv")});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(r.out, "0.659 0.242 0.099\n0.876 0.118 0.006\n");
  const CommandResult in =
      run_softdot({"softmax", "--digits", "4", "--rows", "-"},
                  bom + "2 1 0.1\r\n1002 1000 997\r\n");
  EXPECT_EQ(in.status, 0) << in.err;
  EXPECT_EQ(in.out, "0.6590 0.2424 0.0986\n0.8756 0.1185 0.0059\n");
  const CommandResult scores = run_softdot({"softmax"}, bom + "2 1 0.1\n");
  EXPECT_EQ(scores.status, 0) << scores.err;
  EXPECT_EQ(scores.out, "0.659 0.242 0.099\n");
  // The columns of line 1 count from after the mark.
  write_whole_file(dir.path("bad.csv"), bom + "1,x\n");
  const CommandResult bad =
      run_softdot({"softmax", "--rows", dir.path("bad.csv")});
  EXPECT_EQ(bad.status, 2);
  EXPECT_EQ(bad.err, "softdot: error: " + dir.path("bad.csv") +
                         ":1:3: \"x\" is not a number\n");
}

TEST(CliRows, CsvRowsToJson) {
  TempDir dir;
  write_whole_file(dir.path("s.csv"), "0,0\n-inf,1\nnan,1\n");
  const CommandResult r = run_softdot(
      {"softmax", "--json", "--digits", "2", "--rows", dir.path("s.csv")});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out,
            "{\"weights\":[[0.50,0.50],[0.00,1.00],[\"nan\",\"nan\"]]}\n");
}

TEST(CliRows, CsvOutputReadsBackToTheSameDoubles) {
  TempDir dir;
  const std::vector<double> x = test_scores<double>(12, 99);
  std::string csv;
  for (std::size_t i = 0; i < x.size(); ++i) {
    char b[64];
    std::snprintf(b, sizeof b, "%.17g", x[i]);
    csv += b;
    csv += (i % 4 == 3) ? "\n" : ", ";
  }
  write_whole_file(dir.path("in.csv"), csv);
  const CommandResult r = run_softdot(
      {"softmax", "--rows", dir.path("in.csv"), "-o", dir.path("out.csv")});
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string text = read_whole_file(dir.path("out.csv"));
  std::vector<double> got;
  const char* p = text.c_str();
  std::size_t lines = 0;
  while (*p) {
    char* end = nullptr;
    got.push_back(std::strtod(p, &end));
    ASSERT_NE(end, p) << text;
    p = end;
    if (*p == '\n') ++lines;
    if (*p == ',' || *p == '\n') ++p;
  }
  EXPECT_EQ(lines, 3u);
  expect_same_bits(got, library_rows(x, 3, 4, false));
}

TEST(CliRows, CsvInputToNpyOutputIsFloat64) {
  TempDir dir;
  write_whole_file(dir.path("in.csv"), "1,2,3\n4,5,6\n");
  ASSERT_EQ(run_softdot({"softmax", "--rows", dir.path("in.csv"), "-o",
                         dir.path("out.NPY")})
                .status,
            0);
  const ParsedNpy out = parse_npy(read_whole_file(dir.path("out.NPY")));
  EXPECT_EQ(out.descr, "<f8");
  EXPECT_EQ(out.shape, "(2, 3)");
  expect_same_bits(values_of<double>(out.data),
                   library_rows<double>({1, 2, 3, 4, 5, 6}, 2, 3, false));
}

TEST(CliRows, NpyFromStandardInputAndTextOutput) {
  const std::vector<float> x = {2.0f, 1.0f, 0.1f, 1002.0f, 1000.0f, 997.0f};
  const CommandResult r =
      run_softdot({"softmax", "--rows", "-", "--digits", "4"},
                  make_npy("<f4", "(2, 3)", raw_bytes(x)));
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "0.6590 0.2424 0.0986\n0.8756 0.1185 0.0059\n");
}

TEST(CliRows, ExistingOutputFileIsReplacedOnSuccess) {
  TempDir dir;
  write_whole_file(dir.path("in.csv"), "0,0\n");
  write_whole_file(dir.path("out.csv"), "old content\n");
  ASSERT_EQ(run_softdot({"softmax", "--rows", dir.path("in.csv"), "-o",
                         dir.path("out.csv")})
                .status,
            0);
  EXPECT_EQ(read_whole_file(dir.path("out.csv")), "0.5,0.5\n");
  EXPECT_EQ(dir.list(), (std::vector<std::string>{"in.csv", "out.csv"}));
}

}  // namespace
}  // namespace softdot_test
