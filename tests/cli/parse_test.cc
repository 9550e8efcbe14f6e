// The command's parsers and writers, tested directly: strict numbers, field
// splitting, CSV, .npy, number formatting and argv arrangement.
#include "parse.h"

#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <variant>
#include <vector>

#include "arrange_args.h"
#include "error.h"
#include "format.h"
#include "io_csv.h"
#include "io_npy.h"
#include "npy_test_io.h"

namespace softdot::cli {
namespace {

TEST(ParseNumber, AcceptsDecimalAndSpecialForms) {
  const std::vector<std::pair<const char*, double>> good = {
      {"4", 4},          {"-1", -1},    {"+2.5", 2.5},  {".5", 0.5},
      {"5.", 5},         {"1e3", 1000}, {"1E-3", 1e-3}, {"-0", -0.0},
      {"2.0", 2},        {"1e+2", 100}, {"0.1", 0.1},   {"1e-400", 0.0},
      {"4e-320", 4e-320}};
  for (const auto& [text, value] : good) {
    const ParsedNumber p = parse_number(text);
    EXPECT_EQ(p.status, NumberStatus::kOk) << text;
    EXPECT_EQ(p.value, value) << text;
    EXPECT_EQ(std::signbit(p.value), std::signbit(value)) << text;
  }
  for (const char* text : {"inf", "INF", "+inf", "Infinity", "+InFiNiTy"})
    EXPECT_EQ(parse_number(text).value, std::numeric_limits<double>::infinity())
        << text;
  for (const char* text : {"-inf", "-INF", "-infinity"})
    EXPECT_EQ(parse_number(text).value,
              -std::numeric_limits<double>::infinity())
        << text;
  for (const char* text : {"nan", "NaN", "-nan", "+NAN"})
    EXPECT_TRUE(std::isnan(parse_number(text).value)) << text;
}

TEST(ParseNumber, RejectsEverythingElse) {
  for (const char* text :
       {"",     " 1", "1 ",     "1.2.3", "1e",    "1e+", "e5", ".",
        "-",    "+",  "--1",    "+-1",   "0x10",  "1,5", "1f", "abc",
        "infx", "in", "nan(1)", "na",    "1_000", "١"}) {
    EXPECT_EQ(parse_number(text).status, NumberStatus::kNotANumber) << text;
  }
  EXPECT_EQ(parse_number("1e999").status, NumberStatus::kOutOfRange);
  EXPECT_EQ(parse_number("-1e309").status, NumberStatus::kOutOfRange);
}

TEST(ParseNumber, NumberListsForArgv) {
  EXPECT_TRUE(looks_like_number_list("-1"));
  EXPECT_TRUE(looks_like_number_list("-inf,2,-3"));
  EXPECT_FALSE(looks_like_number_list("-x"));
  EXPECT_FALSE(looks_like_number_list("--digits"));
  EXPECT_FALSE(looks_like_number_list("-1,"));
}

TEST(SplitFields, CommasSpacesAndEmptyFields) {
  std::vector<Field> f;
  std::size_t col = 0;
  ASSERT_TRUE(split_fields(" 1, 2  3,4\r", &f, &col));
  ASSERT_EQ(f.size(), 4u);
  EXPECT_EQ(f[0].text, "1");
  EXPECT_EQ(f[0].column, 2u);
  EXPECT_EQ(f[2].text, "3");
  EXPECT_EQ(f[2].column, 8u);
  ASSERT_TRUE(split_fields("   ", &f, &col));
  EXPECT_TRUE(f.empty());
  EXPECT_FALSE(split_fields("1,,2", &f, &col));
  EXPECT_EQ(col, 3u);
  EXPECT_FALSE(split_fields(",1", &f, &col));
  EXPECT_EQ(col, 1u);
  EXPECT_FALSE(split_fields("1, ", &f, &col));
  EXPECT_EQ(col, 4u);
}

TEST(ParseArgument, NamesTheArgument) {
  EXPECT_EQ(parse_argument_numbers("1,-2 3", 1),
            (std::vector<double>{1, -2, 3}));
  try {
    parse_argument_numbers("1,x", 4);
    FAIL();
  } catch (const CliError& e) {
    EXPECT_STREQ(e.what(), "argument 4: \"x\" is not a number");
  }
}

TEST(Quote, EscapesAndShortens) {
  EXPECT_EQ(quote("a\"b\\c\x01"), "\"a\\\"b\\\\c\\x01\"");
  EXPECT_EQ(quote(std::string(50, 'z')), "\"" + std::string(40, 'z') + "...\"");
  // Invisible characters escaped as code points, visible ones kept, bytes
  // that are not UTF-8 (a lone continuation byte, an overlong form, a
  // truncated sequence) escaped as bytes; the limit counts characters.
  EXPECT_EQ(quote("\xef\xbb\xbf"
                  "1"),
            "\"\\ufeff1\"");
  EXPECT_EQ(quote("1\xc2\xa0\xe2\x80\x8b\xc2\x85"),
            "\"1\\u00a0\\u200b\\u0085\"");
  EXPECT_EQ(quote("\xf3\xa0\x80\x81x"), "\"\\U000e0001x\"");
  EXPECT_EQ(quote("\xcf\x80=3.14 \xc3\xa9"), "\"\xcf\x80=3.14 \xc3\xa9\"");
  EXPECT_EQ(quote("\x80\xc0\xaf\xe2\x80"), "\"\\x80\\xc0\\xaf\\xe2\\x80\"");
  std::string pis;
  for (int i = 0; i < 41; ++i) pis += "\xcf\x80";
  EXPECT_EQ(quote(pis), "\"" + pis.substr(0, 80) + "...\"");
}

TEST(Csv, ReadsRowsAndReportsPlaces) {
  const Matrix<double> m = read_csv("1, 2\r\n-inf,nan\n\n \n", "f.csv");
  EXPECT_EQ(m.rows, 2u);
  EXPECT_EQ(m.cols, 2u);
  EXPECT_EQ(m.values[2], -std::numeric_limits<double>::infinity());
  EXPECT_TRUE(std::isnan(m.values[3]));
  try {
    read_csv("1,2\n3,4\n5,y\n", "f.csv");
    FAIL();
  } catch (const CliError& e) {
    EXPECT_STREQ(e.what(), "f.csv:3:3: \"y\" is not a number");
  }
  EXPECT_THROW(read_csv("1,2\n3\n", "f.csv"), CliError);
  EXPECT_THROW(read_csv("\n1,2\n", "f.csv"), CliError);
  EXPECT_EQ(read_number_list("1 2\n3,4\n", "<stdin>"),
            (std::vector<double>{1, 2, 3, 4}));
}

TEST(Npy, EncodeThenReadKeepsDtypeShapeAndBits) {
  Matrix<float> m;
  m.rows = 2;
  m.cols = 3;
  m.values = {1.5f,
              -0.0f,
              std::numeric_limits<float>::denorm_min(),
              -std::numeric_limits<float>::infinity(),
              3e38f,
              0.1f};
  const std::string bytes = encode_npy(m);
  EXPECT_EQ(bytes.size() % 64, 24u);  // header 128 bytes + 24 data
  const softdot_test::ParsedNpy p = softdot_test::parse_npy(bytes);
  EXPECT_EQ(p.descr, "<f4");
  EXPECT_EQ(p.shape, "(2, 3)");
  const AnyMatrix back = read_npy(bytes, "x.npy");
  ASSERT_TRUE(std::holds_alternative<Matrix<float>>(back));
  const auto& f = std::get<Matrix<float>>(back);
  EXPECT_EQ(f.rows, 2u);
  EXPECT_EQ(f.cols, 3u);
  ASSERT_EQ(f.values.size(), m.values.size());
  for (std::size_t i = 0; i < f.values.size(); ++i) {
    EXPECT_EQ(std::bit_cast<std::uint32_t>(f.values[i]),
              std::bit_cast<std::uint32_t>(m.values[i]))
        << "element " << i;
  }
}

TEST(Npy, AcceptsNumpyHeaderVariants) {
  const std::string data = softdot_test::raw_bytes(std::vector<double>{1, 2});
  // Key order and spacing differ between numpy versions; '=' is native.
  const std::string dict =
      "{'shape': (1,2), 'fortran_order': False, 'descr': '=f8'}";
  std::string bytes = "\x93NUMPY";
  bytes += '\x01';
  bytes += '\0';
  bytes += static_cast<char>(dict.size() + 1);
  bytes += '\0';
  bytes += dict + "\n" + data;
  const AnyMatrix m = read_npy(bytes, "v.npy");
  ASSERT_TRUE(std::holds_alternative<Matrix<double>>(m));
  EXPECT_EQ(std::get<Matrix<double>>(m).values, (std::vector<double>{1, 2}));
}

TEST(Format, ShortestAndFixed) {
  EXPECT_EQ(format_number(4.0, kShortest), "4");
  EXPECT_EQ(format_number(0.1, kShortest), "0.1");
  EXPECT_EQ(format_number(0.1f, kShortest), "0.1");
  EXPECT_EQ(format_number(0.65900113888, 3), "0.659");
  EXPECT_EQ(format_number(0.0058997504, 4), "0.0059");
  EXPECT_EQ(format_number(-std::numeric_limits<double>::infinity(), 3), "-inf");
  EXPECT_EQ(format_number(-std::numeric_limits<double>::quiet_NaN(), 3), "nan");
  EXPECT_EQ(json_number(std::numeric_limits<double>::quiet_NaN(), kShortest),
            "\"nan\"");
  EXPECT_EQ(json_number(0.5, 2), "0.50");
}

TEST(ArrangeArguments, NumbersGoAfterTheSeparatorInOrder) {
  CLI::App app;
  auto* sub = app.add_subcommand("softmax");
  std::string t;
  bool flag = false;
  sub->add_option("-t,--temperature", t);
  sub->add_flag("--log", flag);
  const char* argv[] = {"softdot", "softmax", "-1", "--log", "-t",
                        "-2",      "-inf",    "2",  "--",    "--log"};
  const std::vector<std::string> out = arrange_arguments(app, 10, argv);
  EXPECT_EQ(out, (std::vector<std::string>{"softdot", "softmax", "--log",
                                           "--temperature=-2", "--", "-1",
                                           "-inf", "2", "--log"}));
  const char* attached[] = {"softdot", "softmax", "-t0.5", "-1"};
  EXPECT_EQ(
      arrange_arguments(app, 4, attached),
      (std::vector<std::string>{"softdot", "softmax", "-t0.5", "--", "-1"}));
  const char* bad[] = {"softdot", "softmax", "-q"};
  EXPECT_THROW(arrange_arguments(app, 3, bad), CliError);
}

}  // namespace
}  // namespace softdot::cli
