// softdot command: reorders argv for CLI11 so that negative numbers and
// inf/nan tokens are read as numbers, never as options.
#ifndef SOFTDOT_CLI_ARRANGE_ARGS_H_
#define SOFTDOT_CLI_ARRANGE_ARGS_H_

#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace softdot::cli {

// Returns argv rearranged: the program name, the options (with every option
// value joined to its option as "--name=value", so that "--temperature -1"
// keeps "-1" as its value), and then "--" followed by the positional
// arguments in their original order. A token that starts with "-" is a
// positional argument when it is not an option of the subcommand and it is a
// number or comma list of numbers ("-1", "-inf", "-1,2", "-NaN") or starts
// like one ("-1.2.3", "-.5x", which then fail as numbers with a clear
// message). Everything after a "--" given by the user is positional. Throws
// CliError for an unknown command or an unknown option of the subcommand;
// options before the subcommand are passed on for CLI11 to check.
std::vector<std::string> arrange_arguments(CLI::App& app, int argc,
                                           const char* const* argv);

}  // namespace softdot::cli

#endif  // SOFTDOT_CLI_ARRANGE_ARGS_H_
