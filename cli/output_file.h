// softdot command: writing an output file all at once or not at all.
#ifndef SOFTDOT_CLI_OUTPUT_FILE_H_
#define SOFTDOT_CLI_OUTPUT_FILE_H_

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace softdot::cli {

// Writes `content` to `path` atomically: into a new temporary file in the
// same directory (".NAME.XXXXXX"), flushed and closed, then renamed over
// `path`. On any failure the temporary file is removed, `path` is left as it
// was (absent, or its old content), and CliError names the path and the
// reason. The new file gets mode 0666 minus the umask, like a plain open().
// SIGINT, SIGTERM and SIGHUP (where their action is the default) remove the
// temporary file before the command dies of the signal, so no partial file
// is left behind (SOFTDOT_TEST_WRITE_DELAY_MS, for tests only, pauses after
// the temporary file is written).
void write_file_atomically(const std::string& path, std::string_view content);

// Writes several outputs together, all or none: every content into its
// temporary file first, then every rename, with SIGINT, SIGTERM and SIGHUP
// blocked for the renames. A failure while writing (a full disk, say), or
// one of those signals before the renames, removes the temporary files and
// leaves every path as it was, old content included. Only a rename that
// fails (the directory changed meanwhile) or SIGKILL between two renames can
// leave some outputs new and the rest old; the rename's error names the
// outputs already replaced.
void write_files_all_or_none(
    const std::vector<std::pair<std::string, std::string>>& files);

// Reads a whole file, or standard input for "-"; CliError "path: reason" when
// it cannot be read.
std::string read_file(const std::string& path);

}  // namespace softdot::cli

#endif  // SOFTDOT_CLI_OUTPUT_FILE_H_
