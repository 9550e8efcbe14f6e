// Test helpers: run the real softdot binary and capture what it does.
#ifndef SOFTDOT_TESTS_CLI_RUN_COMMAND_H_
#define SOFTDOT_TESTS_CLI_RUN_COMMAND_H_

#include <string>
#include <vector>

namespace softdot_test {

struct CommandResult {
  int status = -1;  // exit status, or 128 + signal
  std::string out;  // standard output
  std::string err;  // standard error
};

// Runs SOFTDOT_CLI_PATH with `args`, feeding `input` on standard input.
CommandResult run_softdot(const std::vector<std::string>& args,
                          const std::string& input = "");

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
