// softdot command: atomic file output and whole-file input (see
// output_file.h).
#include "output_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "error.h"

namespace softdot::cli {
namespace {

std::string errno_text(int err) { return std::strerror(err); }

// Writes all of `content` to fd; returns 0 or an errno value.
int write_all(int fd, std::string_view content) {
  while (!content.empty()) {
    const ssize_t n = ::write(fd, content.data(), content.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    content.remove_prefix(static_cast<std::size_t>(n));
  }
  return 0;
}

// Files to remove if SIGINT, SIGTERM or SIGHUP ends the command: the
// temporary files written so far (write_group). Slots are changed with those
// signals blocked; the handler only reads them and calls unlink, which is
// async-signal-safe.
constexpr int kPendingSlots = 64;
constexpr std::size_t kPendingPath = 4096;
char g_pending[kPendingSlots][kPendingPath];
volatile std::sig_atomic_t g_pending_used[kPendingSlots];
constexpr int kCleanupSignals[] = {SIGINT, SIGTERM, SIGHUP};

extern "C" void remove_pending_and_reraise(int sig) {
  for (int i = 0; i < kPendingSlots; ++i) {
    if (g_pending_used[i] != 0) ::unlink(g_pending[i]);
  }
  // The default action, so the parent sees the command killed by `sig`.
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

// Blocks the cleanup signals for its lifetime.
class CleanupSignalsBlocked {
 public:
  CleanupSignalsBlocked() {
    sigset_t set;
    sigemptyset(&set);
    for (int sig : kCleanupSignals) sigaddset(&set, sig);
    ::sigprocmask(SIG_BLOCK, &set, &old_);
  }
  ~CleanupSignalsBlocked() { ::sigprocmask(SIG_SETMASK, &old_, nullptr); }
  CleanupSignalsBlocked(const CleanupSignalsBlocked&) = delete;
  CleanupSignalsBlocked& operator=(const CleanupSignalsBlocked&) = delete;

 private:
  sigset_t old_;
};

// Installs the handler once, for each signal whose action is still the
// default (a signal the caller ignores, as nohup does with SIGHUP, stays
// ignored).
void install_cleanup_handlers() {
  static bool installed = false;
  if (installed) return;
  installed = true;
  for (int sig : kCleanupSignals) {
    struct sigaction old_action {};
    if (::sigaction(sig, nullptr, &old_action) != 0) continue;
    if (old_action.sa_handler != SIG_DFL) continue;
    struct sigaction action {};
    action.sa_handler = remove_pending_and_reraise;
    sigemptyset(&action.sa_mask);
    for (int other : kCleanupSignals) sigaddset(&action.sa_mask, other);
    ::sigaction(sig, &action, nullptr);
  }
}

// Records `path` for removal on a cleanup signal; returns its slot, or -1
// when the path is too long or every slot is taken (the file is then not
// removed by a signal, as before this existed).
int add_pending(const std::string& path) {
  if (path.size() >= kPendingPath) return -1;
  const CleanupSignalsBlocked blocked;
  install_cleanup_handlers();
  for (int i = 0; i < kPendingSlots; ++i) {
    if (g_pending_used[i] == 0) {
      std::memcpy(g_pending[i], path.c_str(), path.size() + 1);
      g_pending_used[i] = 1;
      return i;
    }
  }
  return -1;
}

void drop_pending(int slot) {
  if (slot < 0) return;
  const CleanupSignalsBlocked blocked;
  g_pending_used[slot] = 0;
}

// SOFTDOT_TEST_WRITE_DELAY_MS: a pause after each temporary file is written
// (before the next one, or the renames), so that tests can send a signal
// mid-write. Not for users.
void test_write_delay() {
  const char* ms = std::getenv("SOFTDOT_TEST_WRITE_DELAY_MS");
  if (ms == nullptr) return;
  const long n = std::strtol(ms, nullptr, 10);
  if (n > 0) ::usleep(static_cast<useconds_t>(n) * 1000);
}

// A finished temporary file beside its output: flushed, closed, and
// registered (slot) for removal by a cleanup signal.
struct Temporary {
  std::string path;  // the output
  std::string temp;  // the temporary file, ".NAME.XXXXXX" beside it
  int slot = -1;
};

void remove_temporaries(const std::vector<Temporary>& temps) {
  for (const Temporary& t : temps) {
    ::unlink(t.temp.c_str());
    drop_pending(t.slot);
  }
}

// Writes `content` into a new temporary file in `path`'s directory. On
// failure nothing is left and CliError names `path` and the reason.
Temporary write_temporary(const std::string& path, std::string_view content) {
  const std::size_t slash = path.rfind('/');
  const std::string dir =
      slash == std::string::npos ? std::string() : path.substr(0, slash + 1);
  const std::string base =
      slash == std::string::npos ? path : path.substr(slash + 1);
  if (base.empty()) throw CliError(path + ": not a file name");
  std::string temp = dir + "." + base + ".XXXXXX";
  std::vector<char> temp_buffer(temp.begin(), temp.end());
  temp_buffer.push_back('\0');
  int fd = -1, slot = -1, create_errno = 0;
  {
    // The temporary file and its slot appear together: a cleanup signal
    // between mkstemp and add_pending would leave the file behind (seen
    // once in CliSignal.ExistingOutputKeepsItsContent on a loaded machine).
    const CleanupSignalsBlocked blocked;
    fd = ::mkstemp(temp_buffer.data());
    create_errno = errno;
    if (fd >= 0) slot = add_pending(temp_buffer.data());
  }
  if (fd < 0) {
    throw CliError(path +
                   ": cannot create a file there: " + errno_text(create_errno));
  }
  Temporary t{path, std::string(temp_buffer.data()), slot};
  // mkstemp creates the file 0600; give it the mode a plain creat() would.
  const mode_t mask = ::umask(0);
  ::umask(mask);
  int err = 0;
  if (::fchmod(fd, 0666 & ~mask) != 0) err = errno;
  if (err == 0) err = write_all(fd, content);
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err != 0) {
    remove_temporaries({t});
    throw CliError(path + ": cannot write: " + errno_text(err));
  }
  test_write_delay();
  return t;
}

// The two phases of every write: each output's whole content into its
// temporary file first (a failure, or a cleanup signal, removes them all and
// leaves every output as it was), then every rename at once with the cleanup
// signals blocked, so a signal finds either no output changed or all of them
// in place. Only SIGKILL, which nothing can catch, can fall between two
// renames (microseconds), or leave the temporary files.
void write_group(
    const std::vector<std::pair<std::string, std::string_view>>& files) {
  std::vector<Temporary> temps;
  try {
    for (const auto& [path, content] : files) {
      temps.push_back(write_temporary(path, content));
    }
  } catch (const CliError&) {
    remove_temporaries(temps);
    throw;
  }
  const CleanupSignalsBlocked blocked;
  for (std::size_t i = 0; i < temps.size(); ++i) {
    if (std::rename(temps[i].temp.c_str(), temps[i].path.c_str()) != 0) {
      // Only a change of the directory since the temporary files were
      // made gets here (the output became a directory, say); the outputs
      // renamed before it keep their new content, and the error says so.
      const int err = errno;
      std::string replaced;
      for (std::size_t j = 0; j < i; ++j) {
        replaced += (j ? ", " : " (already written: ") + temps[j].path;
      }
      if (!replaced.empty()) replaced += ")";
      for (std::size_t j = i; j < temps.size(); ++j) {
        ::unlink(temps[j].temp.c_str());
      }
      for (const Temporary& t : temps) drop_pending(t.slot);
      throw CliError(temps[i].path + ": cannot write: " + errno_text(err) +
                     replaced);
    }
  }
  for (const Temporary& t : temps) drop_pending(t.slot);
}

}  // namespace

void write_file_atomically(const std::string& path, std::string_view content) {
  write_group({{path, content}});
}

std::string read_file(const std::string& path) {
  const bool is_stdin = path == "-";
  const int fd = is_stdin ? STDIN_FILENO : ::open(path.c_str(), O_RDONLY);
  const std::string name = is_stdin ? "<stdin>" : path;
  if (fd < 0) throw CliError(name + ": cannot open: " + errno_text(errno));
  std::string content;
  char buffer[65536];
  int err = 0;
  while (true) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0) {
      if (errno == EINTR) continue;
      err = errno;
      break;
    }
    if (n == 0) break;
    content.append(buffer, static_cast<std::size_t>(n));
  }
  if (!is_stdin) ::close(fd);
  if (err != 0) throw CliError(name + ": cannot read: " + errno_text(err));
  return content;
}

void write_files_all_or_none(
    const std::vector<std::pair<std::string, std::string>>& files) {
  std::vector<std::pair<std::string, std::string_view>> views;
  views.reserve(files.size());
  for (const auto& [path, content] : files) views.emplace_back(path, content);
  write_group(views);
}

}  // namespace softdot::cli
