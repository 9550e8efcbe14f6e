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
// is left behind (SOFTDOT_TEST_WRITE_DELAY_MS, for tests only, pauses before
// the rename).
void write_file_atomically(const std::string& path, std::string_view content);

// Writes each (path, content) in order with write_file_atomically; when one
// fails, the files this call created are removed again (files that existed
// before keep their new content) and the CliError is rethrown; a cleanup
// signal before the last file is in place removes them too.
void write_files_all_or_none(
    const std::vector<std::pair<std::string, std::string>>& files);

// Reads a whole file, or standard input for "-"; CliError "path: reason" when
// it cannot be read.
std::string read_file(const std::string& path);

}  // namespace softdot::cli

#endif  // SOFTDOT_CLI_OUTPUT_FILE_H_
