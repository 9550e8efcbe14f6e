// Test helpers (see run_command.h): posix_spawn with stdin, stdout and
// stderr redirected to files in a private temporary directory.
#include "run_command.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>  // also declares environ (_GNU_SOURCE, set by g++)

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace softdot_test {

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string templ =
      std::string(base && *base ? base : "/tmp") + "/softdot_cli_test.XXXXXX";
  if (::mkdtemp(templ.data()) == nullptr) {
    throw std::runtime_error("mkdtemp failed");
  }
  dir_ = templ;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

std::vector<std::string> TempDir::list() const {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir_))
    names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

std::string read_whole_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_whole_file(const std::string& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(content.data(), static_cast<std::streamsize>(content.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

bool file_exists(const std::string& path) {
  return std::filesystem::exists(path);
}

std::vector<std::string> softdot_command_line(
    const std::vector<std::string>& args) {
  std::vector<std::string> line;
  std::istringstream emulator(SOFTDOT_CLI_EMULATOR);
  for (std::string word; emulator >> word;) line.push_back(word);
  line.emplace_back(SOFTDOT_CLI_PATH);
  line.insert(line.end(), args.begin(), args.end());
  return line;
}

pid_t spawn_softdot(const std::vector<std::string>& args,
                    const std::vector<std::string>& env, rlim_t as_limit,
                    const std::string& stderr_path) {
  // Everything the child needs is built before fork(): after it, only
  // async-signal-safe calls (and the standard streams' reopening).
  std::vector<std::string> line = softdot_command_line(args);
  std::vector<char*> argv;
  for (std::string& s : line) argv.push_back(s.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_copy = env;
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  for (std::string& e : env_copy) ::putenv(e.data());
  if (as_limit != 0) {
    const rlimit lim{as_limit, as_limit};
    ::setrlimit(RLIMIT_AS, &lim);
  }
  if (std::freopen("/dev/null", "w", stdout) == nullptr) ::_exit(126);
  if (std::freopen(stderr_path.c_str(), "w", stderr) == nullptr) ::_exit(126);
  ::execv(argv[0], argv.data());
  ::_exit(127);
}

CommandResult run_softdot(const std::vector<std::string>& args,
                          const std::string& input) {
  TempDir io;
  const std::string in_path = io.path("stdin");
  const std::string out_path = io.path("stdout");
  const std::string err_path = io.path("stderr");
  write_whole_file(in_path, input);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, in_path.c_str(), O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, out_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_addopen(&actions, 2, err_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0600);
  std::vector<std::string> argv_strings = softdot_command_line(args);
  std::vector<char*> argv;
  for (std::string& s : argv_strings) argv.push_back(s.data());
  argv.push_back(nullptr);

  pid_t pid = 0;
  const int rc =
      posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) throw std::runtime_error("posix_spawn failed");
  int wstatus = 0;
  while (::waitpid(pid, &wstatus, 0) < 0) {
    if (errno != EINTR) throw std::runtime_error("waitpid failed");
  }
  CommandResult result;
  result.status =
      WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus);
  result.out = read_whole_file(out_path);
  result.err = read_whole_file(err_path);
  return result;
}

}  // namespace softdot_test
