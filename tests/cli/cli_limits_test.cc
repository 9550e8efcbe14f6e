// The command's limits (docs/limits.md): .npy headers that claim absurd
// shapes get a one-line error before anything is allocated, also inside a
// small address space; and a command killed by SIGINT, SIGTERM or SIGHUP
// while it writes leaves neither its outputs nor a temporary file behind.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "cli_attention_util.h"
#include "npy_test_io.h"
#include "run_command.h"

// AddressSanitizer reserves terabytes of address space for its shadow
// memory, so an RLIMIT_AS cap makes an ASan build abort at start-up. There
// the cap is left off: ASan's allocator itself fails loudly on an absurd
// allocation, which the test would see as a crash.
#if defined(__SANITIZE_ADDRESS__)
#define SOFTDOT_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SOFTDOT_TEST_ASAN 1
#endif
#endif
#ifndef SOFTDOT_TEST_ASAN
#define SOFTDOT_TEST_ASAN 0
#endif

namespace softdot_test {
namespace {

using cli_attention::f32_npy;
using cli_attention::make_array;

// True once `dir` holds an entry starting with `prefix` (a temporary file
// ".out.npy.XXXXXX"), polling for up to 20 seconds.
bool wait_for_entry(const TempDir& dir, const std::string& prefix) {
  for (int i = 0; i < 2000; ++i) {
    for (const std::string& name : dir.list()) {
      if (name.rfind(prefix, 0) == 0) return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

void write_attention_inputs(const TempDir& dir) {
  write_whole_file(dir.path("q.npy"), f32_npy(make_array({3, 4}, 1)));
  write_whole_file(dir.path("k.npy"), f32_npy(make_array({7, 4}, 2)));
  write_whole_file(dir.path("v.npy"), f32_npy(make_array({7, 2}, 3)));
}

std::vector<std::string> attention_args(const TempDir& dir) {
  return {"attention",         "--q",   dir.path("q.npy"),  "--k",
          dir.path("k.npy"),   "--v",   dir.path("v.npy"),  "-o",
          dir.path("out.npy"), "--lse", dir.path("lse.npy")};
}

class CliSignal : public ::testing::TestWithParam<int> {};

// Runs the attention command on dir's inputs with writes paused for
// `delay_ms` after each temporary file, waits until a temporary file
// starting with `temp_prefix` appears (and, if `also` is non-empty, one
// starting with `also` is there too: the first output is still a temporary
// file), sends `sig`, and checks that the command died of it.
void kill_while_writing(const TempDir& dir, const std::string& delay_ms,
                        const std::string& temp_prefix, int sig,
                        const std::string& also = "") {
  const pid_t pid = spawn_softdot(attention_args(dir),
                                  {"SOFTDOT_TEST_WRITE_DELAY_MS=" + delay_ms});
  ASSERT_GT(pid, 0);
  const bool seen = wait_for_entry(dir, temp_prefix);
  const bool also_seen = also.empty() || wait_for_entry(dir, also);
  ASSERT_EQ(::kill(pid, sig), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(seen) << "no temporary file " << temp_prefix;
  EXPECT_TRUE(also_seen) << "no temporary file " << also;
  ASSERT_TRUE(WIFSIGNALED(status)) << "status " << status;
  EXPECT_EQ(WTERMSIG(status), sig);
}

// Killed while the first output is a temporary file: nothing is left.
TEST_P(CliSignal, DuringTheFirstFileLeavesNothing) {
  TempDir dir;
  write_attention_inputs(dir);
  const std::vector<std::string> before = dir.list();
  kill_while_writing(dir, "30000", ".out.npy.", GetParam());
  EXPECT_EQ(dir.list(), before);
}

// Killed while the second output (the lse) is a temporary file: the first
// is one too (no output is renamed before all are written), and both go.
TEST_P(CliSignal, DuringTheSecondFileLeavesNothing) {
  TempDir dir;
  write_attention_inputs(dir);
  const std::vector<std::string> before = dir.list();
  kill_while_writing(dir, "1500", ".lse.npy.", GetParam(), ".out.npy.");
  EXPECT_EQ(dir.list(), before);
}

// Both outputs existed: killed while the second is written, both keep their
// old content (all or none, old files included).
TEST_P(CliSignal, ExistingOutputsBothKeepTheirContent) {
  TempDir dir;
  write_attention_inputs(dir);
  write_whole_file(dir.path("out.npy"), "precious out");
  write_whole_file(dir.path("lse.npy"), "precious lse");
  const std::vector<std::string> before = dir.list();
  kill_while_writing(dir, "1500", ".lse.npy.", GetParam(), ".out.npy.");
  EXPECT_EQ(dir.list(), before);
  EXPECT_EQ(read_whole_file(dir.path("out.npy")), "precious out");
  EXPECT_EQ(read_whole_file(dir.path("lse.npy")), "precious lse");
}

// An existing output keeps its old content when the command is killed
// before its new content is renamed over it.
TEST_P(CliSignal, ExistingOutputKeepsItsContent) {
  TempDir dir;
  write_attention_inputs(dir);
  write_whole_file(dir.path("out.npy"), "precious");
  const std::vector<std::string> before = dir.list();
  kill_while_writing(dir, "30000", ".out.npy.", GetParam());
  EXPECT_EQ(dir.list(), before);
  EXPECT_EQ(read_whole_file(dir.path("out.npy")), "precious");
}

INSTANTIATE_TEST_SUITE_P(Signals, CliSignal,
                         ::testing::Values(SIGINT, SIGTERM, SIGHUP),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::string(info.param == SIGINT ? "SIGINT"
                                              : info.param == SIGTERM
                                                  ? "SIGTERM"
                                                  : "SIGHUP");
                         });

// The same command with no delay finishes and writes both files (the
// handlers change nothing when no signal comes).
TEST(CliSignalFree, OutputsAreWrittenWithoutASignal) {
  TempDir dir;
  write_attention_inputs(dir);
  const CommandResult r = run_softdot(attention_args(dir));
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(file_exists(dir.path("out.npy")));
  EXPECT_TRUE(file_exists(dir.path("lse.npy")));
  EXPECT_EQ(dir.list().size(), 5u);
}

// .npy headers claiming absurd shapes, with a few bytes of data: a one-line
// error naming the file, status 2.
struct HugeNpy {
  const char* name;
  std::string shape;
  std::string expected;  // after "softdot: error: --q: DIR/q.npy: "
};

TEST(CliLimits, NpyHeadersClaimingPetabytesAreAClearError) {
  const std::vector<HugeNpy> cases = {
      {"petabyte", "(1000000000, 250000)",
       "truncated: shape (1000000000, 250000) needs 1000000000000000 bytes "
       "of data, the file has 16"},
      {"product wraps", "(4294967296, 4294967296)",
       "shape (4294967296, 4294967296) is too large"},
      {"dimension beyond 2^64", "(18446744073709551616, 1)", ""},
  };
  for (const HugeNpy& c : cases) {
    TempDir dir;
    write_attention_inputs(dir);
    write_whole_file(dir.path("q.npy"),
                     make_npy("<f4", c.shape, std::string(16, '\0')));
    std::vector<std::string> args = attention_args(dir);
    // Inside 256 MiB of address space: any attempt to allocate what the
    // header claims would fail with bad_alloc instead of this message.
    const std::string err_path = dir.path("stderr.txt");
    const rlim_t as_limit = SOFTDOT_TEST_ASAN ? 0 : rlim_t{256} << 20;
    const pid_t pid = spawn_softdot(args, {}, as_limit, err_path);
    ASSERT_GT(pid, 0);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status)) << c.name << ": status " << status;
    EXPECT_EQ(WEXITSTATUS(status), 2) << c.name;
    const std::string err = read_whole_file(err_path);
    const std::string head = "softdot: error: --q: " + dir.path("q.npy") + ": ";
    EXPECT_EQ(err.rfind(head, 0), 0u) << c.name << ": " << err;
    if (!c.expected.empty()) {
      EXPECT_NE(err.find(c.expected), std::string::npos)
          << c.name << ": " << err;
    }
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << c.name << err;
    EXPECT_FALSE(file_exists(dir.path("out.npy"))) << c.name;
    EXPECT_FALSE(file_exists(dir.path("lse.npy"))) << c.name;
  }
}

}  // namespace
}  // namespace softdot_test
