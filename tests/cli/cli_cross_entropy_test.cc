// `softdot cross-entropy`: the printed loss, the per-row losses and the
// gradient files equal the library's softdot::cross_entropy bit for bit;
// int32 targets; errors (bad targets, shapes, options) exit 2 and write no
// file.
#include <gtest/gtest.h>

#include <charconv>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "npy_test_io.h"
#include "run_command.h"
#include "softdot/cross_entropy.h"
#include "softdot/float16.h"

namespace {

using softdot_test::make_npy;
using softdot_test::parse_npy;
using softdot_test::raw_bytes;
using softdot_test::run_softdot;
using softdot_test::TempDir;
using softdot_test::values_of;
using softdot_test::write_whole_file;

TEST(CliCrossEntropy, MatchesLibrary) {
  TempDir dir;
  const std::vector<double> x = {0.5, -1.0, 2.0, 0.25, 3.0, -2.0,
                                 1.0, 1.0,  1.0, -4.0, 0.0, 7.5};
  const std::vector<std::int32_t> t = {2, -100, 1, 3};
  write_whole_file(dir.path("l.npy"), make_npy("<f8", "(3, 4)", raw_bytes(x)));
  write_whole_file(
      dir.path("t.npy"),
      make_npy("<i4", "(3,)",
               raw_bytes(std::vector<std::int32_t>(t.begin() + 1, t.end()))));
  // Rows 0..2 with targets -100, 1, 3 and label smoothing 0.2.
  const auto r =
      run_softdot({"cross-entropy", "--logits", dir.path("l.npy"), "--targets",
                   dir.path("t.npy"), "--label-smoothing", "0.2", "-o",
                   dir.path("loss.npy"), "--grad", dir.path("g.npy")});
  ASSERT_EQ(r.status, 0) << r.err;
  softdot::CrossEntropyOptions o;
  o.label_smoothing = 0.2;
  const std::vector<std::int64_t> t64 = {-100, 1, 3};
  std::vector<double> loss(3), g(12);
  const double mean = softdot::cross_entropy(
      softdot::MatrixView<const double>(x.data(), 3, 4), t64, loss,
      softdot::MatrixView<double>(g.data(), 3, 4), o);
  // The shortest decimal that reads back as the same double.
  char want[64];
  const auto end = std::to_chars(want, want + sizeof(want), mean).ptr;
  EXPECT_EQ(r.out, std::string(want, end) + "\n");
  const auto lf =
      parse_npy(softdot_test::read_whole_file(dir.path("loss.npy")));
  EXPECT_EQ(lf.descr, "<f8");
  EXPECT_EQ(lf.shape, "(3,)");
  EXPECT_EQ(values_of<double>(lf.data), loss);
  const auto gf = parse_npy(softdot_test::read_whole_file(dir.path("g.npy")));
  EXPECT_EQ(gf.shape, "(3, 4)");
  EXPECT_EQ(values_of<double>(gf.data), g);
  EXPECT_EQ(loss[0], 0.0);
}

// 16-bit logits: bfloat16 as ml_dtypes writes it ('<V2') and float16
// ('<f2'); losses and gradient in the logits' dtype, the library's bits.
template <class H>
void sixteen_bit(const std::string& descr) {
  TempDir dir;
  const std::vector<double> x = {0.5, -1.0, 2.0, 0.25, 3.0, -2.0,
                                 1.0, 1.0,  1.0, -4.0, 0.0, 7.5};
  std::vector<H> h(x.size());
  std::vector<std::uint16_t> bits(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    if constexpr (std::is_same_v<H, softdot::BFloat16>) {
      h[i] = softdot::to_bfloat16(x[i]);
    } else {
      h[i] = softdot::to_float16(x[i]);
    }
    bits[i] = h[i].bits;
  }
  write_whole_file(dir.path("l.npy"),
                   make_npy(descr, "(3, 4)", raw_bytes(bits)));
  write_whole_file(
      dir.path("t.npy"),
      make_npy("<i4", "(3,)", raw_bytes(std::vector<std::int32_t>{0, 1, 3})));
  const auto r =
      run_softdot({"cross-entropy", "--logits", dir.path("l.npy"), "--targets",
                   dir.path("t.npy"), "--reduction", "sum", "-o",
                   dir.path("loss.npy"), "--grad", dir.path("g.npy")});
  ASSERT_EQ(r.status, 0) << r.err;
  softdot::CrossEntropyOptions o;
  o.reduction = softdot::Reduction::kSum;
  const std::vector<std::int64_t> t64 = {0, 1, 3};
  std::vector<H> loss(3), g(12);
  const double sum = softdot::cross_entropy(
      softdot::MatrixView<const H>(h.data(), 3, 4), t64, std::span<H>(loss),
      softdot::MatrixView<H>(g.data(), 3, 4), o);
  char want[64];
  const auto end = std::to_chars(want, want + sizeof(want), sum).ptr;
  EXPECT_EQ(r.out, std::string(want, end) + "\n");
  const auto lf =
      parse_npy(softdot_test::read_whole_file(dir.path("loss.npy")));
  EXPECT_EQ(lf.descr, descr);
  EXPECT_EQ(lf.shape, "(3,)");
  const auto lb = values_of<std::uint16_t>(lf.data);
  for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(lb[i], loss[i].bits);
  const auto gf = parse_npy(softdot_test::read_whole_file(dir.path("g.npy")));
  EXPECT_EQ(gf.descr, descr);
  const auto gb = values_of<std::uint16_t>(gf.data);
  for (std::size_t i = 0; i < 12; ++i) EXPECT_EQ(gb[i], g[i].bits);
}

TEST(CliCrossEntropy, SixteenBitLogits) {
  sixteen_bit<softdot::BFloat16>("<V2");
  sixteen_bit<softdot::Float16>("<f2");
}

TEST(CliCrossEntropy, ErrorsWriteNothing) {
  TempDir dir;
  const std::vector<float> x = {0.5f, -1.0f, 2.0f, 0.25f};
  write_whole_file(dir.path("l.npy"), make_npy("<f4", "(2, 2)", raw_bytes(x)));
  write_whole_file(
      dir.path("bad.npy"),
      make_npy("<i8", "(2,)", raw_bytes(std::vector<std::int64_t>{0, 2})));
  write_whole_file(
      dir.path("short.npy"),
      make_npy("<i8", "(1,)", raw_bytes(std::vector<std::int64_t>{0})));
  write_whole_file(
      dir.path("ok.npy"),
      make_npy("<i8", "(2,)", raw_bytes(std::vector<std::int64_t>{0, 1})));
  const auto run = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = {"cross-entropy", "--logits",
                                     dir.path("l.npy"), "-o",
                                     dir.path("out.npy")};
    args.insert(args.end(), extra.begin(), extra.end());
    return run_softdot(args);
  };
  auto r = run({"--targets", dir.path("bad.npy")});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("targets[1] = 2"), std::string::npos) << r.err;
  r = run({"--targets", dir.path("short.npy")});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("expected (2,)"), std::string::npos) << r.err;
  r = run({"--targets", dir.path("ok.npy"), "--label-smoothing", "2"});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("--label-smoothing"), std::string::npos) << r.err;
  r = run({"--targets", dir.path("ok.npy"), "--reduction", "avg"});
  EXPECT_EQ(r.status, 2);
  r = run({"--targets", dir.path("ok.npy"), "--ignore-index", "1.5"});
  EXPECT_EQ(r.status, 2);
  EXPECT_FALSE(softdot_test::file_exists(dir.path("out.npy")));
  r = run({"--targets", dir.path("ok.npy"), "--reduction", "none"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(softdot_test::file_exists(dir.path("out.npy")));
}

}  // namespace
