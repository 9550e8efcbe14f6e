// softdot command: atomic file output and whole-file input (see
// output_file.h).
#include "output_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
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

}  // namespace

void write_file_atomically(const std::string& path, std::string_view content) {
  const std::size_t slash = path.rfind('/');
  const std::string dir =
      slash == std::string::npos ? std::string() : path.substr(0, slash + 1);
  const std::string base =
      slash == std::string::npos ? path : path.substr(slash + 1);
  if (base.empty()) throw CliError(path + ": not a file name");
  std::string temp = dir + "." + base + ".XXXXXX";
  std::vector<char> temp_buffer(temp.begin(), temp.end());
  temp_buffer.push_back('\0');
  const int fd = ::mkstemp(temp_buffer.data());
  if (fd < 0) {
    throw CliError(path + ": cannot create a file there: " + errno_text(errno));
  }
  temp.assign(temp_buffer.data());
  // mkstemp creates the file 0600; give it the mode a plain creat() would.
  const mode_t mask = ::umask(0);
  ::umask(mask);
  int err = 0;
  if (::fchmod(fd, 0666 & ~mask) != 0) err = errno;
  if (err == 0) err = write_all(fd, content);
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err == 0 && std::rename(temp.c_str(), path.c_str()) != 0) err = errno;
  if (err != 0) {
    ::unlink(temp.c_str());
    throw CliError(path + ": cannot write: " + errno_text(err));
  }
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
  std::vector<std::string> created;
  try {
    for (const auto& [path, content] : files) {
      struct stat st;
      const bool existed = ::stat(path.c_str(), &st) == 0;
      write_file_atomically(path, content);
      if (!existed) created.push_back(path);
    }
  } catch (const CliError&) {
    for (const std::string& path : created) ::unlink(path.c_str());
    throw;
  }
}

}  // namespace softdot::cli
