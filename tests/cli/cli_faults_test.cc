// The command under faults (issue 29, "Concurrency and faults"):
//  - concurrent `softdot` processes writing the same output path: the end
//    state is the whole output of one of them, byte for byte, and no
//    temporary file is left;
//  - a full disk (a 64 KiB tmpfs) and a read-only directory (a read-only
//    tmpfs: as root, file modes do not stop writes): status 2, one error
//    line naming the path and the system's reason, no partial or temporary
//    file, an existing output intact.
// Mounting needs CAP_SYS_ADMIN: where mount(2) is refused the two fault
// tests are skipped with the reason (GTEST_SKIP), never failed.
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cli_attention_util.h"
#include "npy_test_io.h"
#include "run_command.h"

namespace softdot_test {
namespace {

using cli_attention::f32_npy;
using cli_attention::make_array;

// 8 processes, each with its own input (so each writes different bytes),
// all writing -o DIR/same.npy at once; over a few rounds. Each process's
// output alone is computed first, to name the bytes a winner writes.
TEST(CliFaults, ConcurrentWritersLeaveOneWholeOutput) {
  constexpr int kProcs = 8, kRounds = 4;
  TempDir dir;
  std::vector<std::string> alone(kProcs);
  for (int i = 0; i < kProcs; ++i) {
    const std::string in = dir.path("in" + std::to_string(i) + ".npy");
    // 64 x 2048 floats: 512 KiB of output, long enough for the writes to
    // overlap.
    write_whole_file(in, f32_npy(make_array({64, 2048}, 100 + i)));
    const std::string ref = dir.path("ref" + std::to_string(i) + ".npy");
    const CommandResult r = run_softdot({"softmax", "--rows", in, "-o", ref});
    ASSERT_EQ(r.status, 0) << r.err;
    alone[i] = read_whole_file(ref);
    ASSERT_GT(alone[i].size(), 512u * 1024u);
    for (int j = 0; j < i; ++j) ASSERT_NE(alone[i], alone[j]);
  }
  const std::vector<std::string> before = dir.list();
  const std::string same = dir.path("same.npy");
  for (int round = 0; round < kRounds; ++round) {
    std::vector<pid_t> pids;
    for (int i = 0; i < kProcs; ++i) {
      pids.push_back(spawn_softdot({"softmax", "--rows",
                                    dir.path("in" + std::to_string(i) + ".npy"),
                                    "-o", same}));
      ASSERT_GT(pids.back(), 0);
    }
    for (pid_t pid : pids) {
      int status = 0;
      ASSERT_EQ(::waitpid(pid, &status, 0), pid);
      ASSERT_TRUE(WIFEXITED(status)) << "status " << status;
      EXPECT_EQ(WEXITSTATUS(status), 0) << "round " << round;
    }
    const std::string got = read_whole_file(same);
    int matches = 0;
    for (const std::string& a : alone) matches += got == a ? 1 : 0;
    EXPECT_EQ(matches, 1) << "round " << round << ": same.npy (" << got.size()
                          << " bytes) is no process's whole output";
    std::vector<std::string> want = before;
    want.push_back("same.npy");
    std::sort(want.begin(), want.end());
    EXPECT_EQ(dir.list(), want) << "round " << round << ": a file left";
  }
}

// A tmpfs mounted on a fresh directory for the test's lifetime (lazily
// unmounted at the end). ok() false, with why(), when mount(2) is refused.
class TmpfsMount {
 public:
  explicit TmpfsMount(const std::string& dir, const char* options) : dir_(dir) {
    if (::mount("tmpfs", dir_.c_str(), "tmpfs", MS_NOSUID | MS_NODEV,
                options) != 0) {
      why_ = std::string("mount -t tmpfs -o ") + options + " " + dir_ +
             " refused: " + std::strerror(errno) +
             " (needs root with CAP_SYS_ADMIN)";
      return;
    }
    mounted_ = true;
  }
  ~TmpfsMount() {
    if (mounted_) ::umount2(dir_.c_str(), MNT_DETACH);
  }
  TmpfsMount(const TmpfsMount&) = delete;
  TmpfsMount& operator=(const TmpfsMount&) = delete;
  bool ok() const { return mounted_; }
  const std::string& why() const { return why_; }
  // Remounts read-only; false (with why()) when refused.
  bool make_read_only() {
    if (::mount("tmpfs", dir_.c_str(), "tmpfs",
                MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, nullptr) != 0) {
      why_ =
          "remounting " + dir_ + " read-only refused: " + std::strerror(errno);
      return false;
    }
    return true;
  }

 private:
  std::string dir_;
  std::string why_;
  bool mounted_ = false;
};

// Names in `dir` (a mounted directory, not a TempDir), sorted.
std::vector<std::string> names_in(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (const dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (n != "." && n != "..") names.push_back(n);
    }
    ::closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

void expect_one_error_line(const CommandResult& r, const std::string& want,
                           const std::string& name) {
  EXPECT_EQ(r.status, 2) << name;
  EXPECT_EQ(r.out, "") << name;
  EXPECT_EQ(r.err, "softdot: error: " + want + "\n") << name;
}

// A 64 KiB tmpfs: a 512 KiB output does not fit. The error names the path
// and ENOSPC; an existing output keeps its content, a new one is not
// created, and no temporary file remains (the space is free again: a
// small file still fits afterwards).
TEST(CliFaults, FullDiskIsAClearErrorAndKeepsTheOldFile) {
  TempDir dir;
  const std::string mnt = dir.path("small");
  ASSERT_EQ(::mkdir(mnt.c_str(), 0755), 0);
  TmpfsMount m(mnt, "size=64k");
  if (!m.ok()) GTEST_SKIP() << m.why();
  write_whole_file(dir.path("in.npy"), f32_npy(make_array({64, 2048}, 7)));
  write_whole_file(mnt + "/old.npy", "precious");
  for (const char* name : {"old.npy", "new.npy"}) {
    const std::string out = mnt + "/" + name;
    const CommandResult r =
        run_softdot({"softmax", "--rows", dir.path("in.npy"), "-o", out});
    expect_one_error_line(r, out + ": cannot write: No space left on device",
                          name);
    EXPECT_EQ(names_in(mnt), std::vector<std::string>{"old.npy"}) << name;
    EXPECT_EQ(read_whole_file(mnt + "/old.npy"), "precious") << name;
  }
  // The temporary file's blocks were given back: a small output fits.
  write_whole_file(dir.path("tiny.npy"), f32_npy(make_array({2, 3}, 8)));
  const CommandResult r = run_softdot(
      {"softmax", "--rows", dir.path("tiny.npy"), "-o", mnt + "/old.npy"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(names_in(mnt), std::vector<std::string>{"old.npy"});
  EXPECT_NE(read_whole_file(mnt + "/old.npy"), "precious");
}

// A read-only tmpfs (chmod would not stop root): the error names the path
// and EROFS, the old file is intact, nothing is created. The attention
// command's two outputs (-o and --lse) likewise: none is written.
TEST(CliFaults, ReadOnlyDirectoryIsAClearErrorAndKeepsTheOldFile) {
  TempDir dir;
  const std::string mnt = dir.path("ro");
  ASSERT_EQ(::mkdir(mnt.c_str(), 0755), 0);
  TmpfsMount m(mnt, "size=1m");
  if (!m.ok()) GTEST_SKIP() << m.why();
  write_whole_file(mnt + "/old.npy", "precious");
  if (!m.make_read_only()) GTEST_SKIP() << m.why();
  write_whole_file(dir.path("in.npy"), f32_npy(make_array({4, 16}, 7)));
  for (const char* name : {"old.npy", "new.npy"}) {
    const std::string out = mnt + "/" + name;
    const CommandResult r =
        run_softdot({"softmax", "--rows", dir.path("in.npy"), "-o", out});
    expect_one_error_line(
        r, out + ": cannot create a file there: Read-only file system", name);
  }
  write_whole_file(dir.path("q.npy"), f32_npy(make_array({3, 4}, 1)));
  write_whole_file(dir.path("k.npy"), f32_npy(make_array({7, 4}, 2)));
  write_whole_file(dir.path("v.npy"), f32_npy(make_array({7, 2}, 3)));
  // -o writable, --lse on the read-only mount: all or none, so -o is not
  // left behind either.
  const CommandResult r =
      run_softdot({"attention", "--q", dir.path("q.npy"), "--k",
                   dir.path("k.npy"), "--v", dir.path("v.npy"), "-o",
                   dir.path("out.npy"), "--lse", mnt + "/lse.npy"});
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_NE(r.err.find(mnt + "/lse.npy: cannot create a file there: "
                             "Read-only file system"),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(file_exists(dir.path("out.npy")));
  EXPECT_EQ(names_in(mnt), std::vector<std::string>{"old.npy"});
  EXPECT_EQ(read_whole_file(mnt + "/old.npy"), "precious");
}

}  // namespace
}  // namespace softdot_test
