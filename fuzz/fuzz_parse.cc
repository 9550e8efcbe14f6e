// Fuzz target: the command's number and list parsing (cli/parse.cc).
// parse_number accepts only its documented decimal grammar, and what it
// accepts is the correctly rounded value (glibc's strtod, which rounds
// correctly, on the same text); split_fields returns fields that lie in the
// line at their columns; the other parsers either succeed or throw CliError.
#include <cerrno>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "error.h"
#include "fuzz_util.h"
#include "parse.h"

namespace {

using softdot::cli::NumberStatus;

bool decimal_char(char c) {
  return (c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E' ||
         c == '+' || c == '-';
}

void check_number(std::string_view text) {
  const softdot::cli::ParsedNumber p = softdot::cli::parse_number(text);
  if (p.status == NumberStatus::kNotANumber) return;
  FUZZ_CHECK(!text.empty());
  FUZZ_CHECK(softdot::cli::looks_like_number_list(text));
  bool decimal = true;
  for (char c : text) decimal = decimal && decimal_char(c);
  if (!decimal) {
    // inf, infinity or nan, with a sign and in any case.
    FUZZ_CHECK(p.status == NumberStatus::kOk);
    FUZZ_CHECK(std::isinf(p.value) || std::isnan(p.value));
    return;
  }
  const std::string copy(text);
  char* end = nullptr;
  errno = 0;
  const double want = std::strtod(copy.c_str(), &end);
  FUZZ_CHECK(end == copy.c_str() + copy.size());
  if (p.status == NumberStatus::kOutOfRange) {
    FUZZ_CHECK(errno == ERANGE && std::isinf(want));
    return;
  }
  FUZZ_CHECK(std::isfinite(p.value));
  FUZZ_CHECK(softdot_fuzz::same_bits(p.value, want));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data,
                                      std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  check_number(text);
  // Each line on its own, and each of its fields.
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t nl = text.find('\n', start);
    if (nl == std::string_view::npos) nl = text.size();
    const std::string_view line = text.substr(start, nl - start);
    std::vector<softdot::cli::Field> fields;
    std::size_t error_column = 0;
    if (softdot::cli::split_fields(line, &fields, &error_column)) {
      for (const softdot::cli::Field& f : fields) {
        FUZZ_CHECK(!f.text.empty());
        FUZZ_CHECK(f.column >= 1 &&
                   f.column - 1 + f.text.size() <= line.size());
        FUZZ_CHECK(line.substr(f.column - 1, f.text.size()) == f.text);
        check_number(f.text);
      }
    } else {
      FUZZ_CHECK(error_column >= 1 && error_column <= line.size() + 1);
    }
    try {
      const std::vector<double> v =
          softdot::cli::parse_argument_numbers(line, 2);
      FUZZ_CHECK(!v.empty());
    } catch (const softdot::cli::CliError& e) {
      FUZZ_CHECK(std::string_view(e.what()).substr(0, 11) == "argument 2:");
    }
    const std::optional<int> small = softdot::cli::parse_small_int(line, 40);
    if (small) FUZZ_CHECK(*small >= 0 && *small <= 40);
    const std::string q = softdot::cli::quote(line);
    FUZZ_CHECK(q.size() >= 2 && q.front() == '"');
    if (nl == text.size()) break;
    start = nl + 1;
  }
  return 0;
}
