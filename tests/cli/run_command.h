// Test helpers: run the real softdot binary and capture what it does.
#ifndef SOFTDOT_TESTS_CLI_RUN_COMMAND_H_
#define SOFTDOT_TESTS_CLI_RUN_COMMAND_H_

#include <sys/resource.h>
#include <sys/types.h>

#include <string>
#include <vector>

namespace softdot_test {

struct CommandResult {
  int status = -1;  // exit status, or 128 + signal
  std::string out;  // standard output
  std::string err;  // standard error
};

// The command line that starts the softdot binary with `args`:
// SOFTDOT_CLI_PATH, preceded on a cross build by the emulator ctest runs the
// tests with (SOFTDOT_CLI_EMULATOR, e.g. qemu-aarch64; its words split on
// spaces), since nothing registers that emulator with the kernel.
std::vector<std::string> softdot_command_line(
    const std::vector<std::string>& args);

// Runs the softdot binary with `args`, feeding `input` on standard input.
CommandResult run_softdot(const std::vector<std::string>& args,
                          const std::string& input = "");

// Starts the softdot binary with `args` in a child process and returns its
// pid (the caller waits for it): `env` entries ("NAME=value") added to the
// environment, the address space capped at `as_limit` bytes (RLIMIT_AS; 0 for
// no cap), standard output to /dev/null, standard error to `stderr_path`.
pid_t spawn_softdot(const std::vector<std::string>& args,
                    const std::vector<std::string>& env = {},
                    rlim_t as_limit = 0,
                    const std::string& stderr_path = "/dev/null");

// A fresh directory under $TMPDIR (or /tmp), removed with its content.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  const std::string& root() const { return dir_; }
  // Names of the entries, sorted.
  std::vector<std::string> list() const;

 private:
  std::string dir_;
};

std::string read_whole_file(const std::string& path);
void write_whole_file(const std::string& path, const std::string& content);
bool file_exists(const std::string& path);

}  // namespace softdot_test

#endif  // SOFTDOT_TESTS_CLI_RUN_COMMAND_H_
