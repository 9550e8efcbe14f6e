// softdot command: argv rearrangement (see arrange_args.h). CLI11 classifies
// "-inf" as the short option -i with the value "nf", and "-1" as a number only
// when no option "-1" exists; rather than depend on those rules, the command
// decides what is a number itself and hands CLI11 the numbers after "--".
#include "arrange_args.h"

#include <CLI/CLI.hpp>

#include "error.h"
#include "parse.h"

namespace softdot::cli {
namespace {

CLI::App* find_subcommand(CLI::App& app, const std::string& name) {
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    if (sub->check_name(name)) return sub;
  }
  return nullptr;
}

// "dot, softmax, attention, cross-entropy and demo": the subcommands as
// defined, so the list cannot miss one.
std::string command_names(CLI::App& app) {
  const std::vector<CLI::App*> subs =
      app.get_subcommands([](CLI::App*) { return true; });
  std::string names;
  for (std::size_t i = 0; i < subs.size(); ++i) {
    if (i != 0) names += i + 1 == subs.size() ? " and " : ", ";
    names += subs[i]->get_name();
  }
  return names;
}

bool starts_like_number(const std::string& token) {
  // token[0] is '-'.
  return token.size() > 1 && ((token[1] >= '0' && token[1] <= '9') ||
                              token[1] == '.' || looks_like_number_list(token));
}

}  // namespace

std::vector<std::string> arrange_arguments(CLI::App& app, int argc,
                                           const char* const* argv) {
  std::vector<std::string> options;
  std::vector<std::string> positionals;
  options.emplace_back(argc > 0 ? argv[0] : "softdot");
  CLI::App* context = nullptr;  // the subcommand, once seen
  int i = 1;
  for (; i < argc; ++i) {
    const std::string token = argv[i];
    if (token == "--") {
      for (++i; i < argc; ++i) positionals.emplace_back(argv[i]);
      break;
    }
    if (context == nullptr) {
      // Before the subcommand: top-level flags (--help, --version) or the
      // subcommand's name; anything else is left for CLI11 to reject.
      if (token.size() > 1 && token[0] == '-') {
        options.push_back(token);
        continue;
      }
      context = find_subcommand(app, token);
      if (context == nullptr) {
        throw CliError("unknown command " + quote(token) +
                       "; the commands are " + command_names(app) +
                       " (see softdot --help)");
      }
      options.push_back(token);
      continue;
    }
    if (token.size() > 1 && token[0] == '-') {
      const std::size_t eq = token.find('=');
      const std::string name = token.substr(0, eq);
      CLI::Option* option = context->get_option_no_throw(name);
      if (option != nullptr) {
        // Flags expect 0 values; options that take a value expect >= 1.
        const bool takes_value = option->get_items_expected_max() > 0;
        // CLI11 reads "--name=" as no value and takes the next token (the
        // "--" before the scores) instead; no option takes an empty value.
        const bool empty_value = eq == std::string::npos
                                     ? i + 1 < argc && argv[i + 1][0] == '\0'
                                     : eq + 1 == token.size();
        if (takes_value && empty_value) {
          throw CliError(name + ": the value is empty (see softdot " +
                         context->get_name() + " --help)");
        }
        if (takes_value && eq == std::string::npos && i + 1 < argc &&
            !option->get_lnames().empty()) {
          options.push_back("--" + option->get_lnames().front() + "=" +
                            argv[i + 1]);
          ++i;
        } else {
          options.push_back(token);
        }
        continue;
      }
      // "-t2": a short option with its value attached.
      if (token[1] != '-' && token.size() > 2) {
        CLI::Option* short_option =
            context->get_option_no_throw(token.substr(0, 2));
        if (short_option != nullptr &&
            short_option->get_items_expected_max() > 0) {
          options.push_back(token);
          continue;
        }
      }
      if (!starts_like_number(token)) {
        throw CliError("unknown option " + quote(token) + " (see softdot " +
                       context->get_name() + " --help)");
      }
      positionals.push_back(token);
      continue;
    }
    positionals.push_back(token);
  }
  if (!positionals.empty()) {
    options.emplace_back("--");
    options.insert(options.end(), positionals.begin(), positionals.end());
  }
  return options;
}

}  // namespace softdot::cli
