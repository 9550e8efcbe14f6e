// softdot command: `softdot dot X Y`.
#include <cstdio>
#include <stdexcept>

#include "commands.h"
#include "error.h"
#include "explain.h"
#include "format.h"
#include "parse.h"
#include "softdot/dot.h"

namespace softdot::cli {

void print(const std::string& text) {
  if (std::fwrite(text.data(), 1, text.size(), stdout) != text.size()) {
    throw CliError("cannot write to standard output");
  }
}

int run_dot(const DotArgs& args) {
  if (args.vectors.size() != 2) {
    throw CliError("dot needs two vectors, got " +
                   std::to_string(args.vectors.size()) +
                   (args.vectors.size() == 1 ? " argument" : " arguments"));
  }
  const std::vector<double> x = parse_argument_numbers(args.vectors[0], 1);
  const std::vector<double> y = parse_argument_numbers(args.vectors[1], 2);
  if (x.size() != y.size()) {
    throw CliError("argument 1 has " + std::to_string(x.size()) +
                   (x.size() == 1 ? " value" : " values") +
                   ", argument 2 has " + std::to_string(y.size()) +
                   "; dot needs equal lengths");
  }
  if (args.explain) {
    print(explain_dot(x, y, "x", "y"));
    return 0;
  }
  const double result = softdot::dot(x, y);
  if (args.json) {
    print("{\"dot\":" + json_number(result, kShortest) + "}\n");
  } else {
    print(format_number(result, kShortest) + "\n");
  }
  return 0;
}

}  // namespace softdot::cli
