// softdot command: the one error type every part of the command throws.
#ifndef SOFTDOT_CLI_ERROR_H_
#define SOFTDOT_CLI_ERROR_H_

#include <stdexcept>
#include <string>

namespace softdot::cli {

// A problem with the user's input or files. main() prints
// "softdot: error: <what()>" on one line of stderr and exits with kExitError.
// The message must name the place (argument number, file:line:column, ...).
class CliError : public std::runtime_error {
 public:
  explicit CliError(const std::string& what) : std::runtime_error(what) {}
};

// An error another process of the same run reports (the ranks of
// `softdot attention --ring` other than 0): main() exits with kExitError
// without printing.
class CliQuietError : public CliError {
 public:
  CliQuietError() : CliError("") {}
};

// Exit status for every error (bad input, unreadable file, failed write).
inline constexpr int kExitError = 2;

}  // namespace softdot::cli

#endif  // SOFTDOT_CLI_ERROR_H_
