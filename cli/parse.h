// softdot command: strict parsing of numbers and of comma/space separated
// lists of numbers.
#ifndef SOFTDOT_CLI_PARSE_H_
#define SOFTDOT_CLI_PARSE_H_

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace softdot::cli {

enum class NumberStatus { kOk, kNotANumber, kOutOfRange };

struct ParsedNumber {
  NumberStatus status = NumberStatus::kNotANumber;
  double value = 0.0;
};

// Parses one decimal floating-point number, the whole of `text`:
//   [+|-] digits [. digits] [(e|E) [+|-] digits]   (at least one digit
//   before or after the point), or [+|-] inf / infinity / nan, in any case.
// Rejects empty text, surrounding spaces, "1.2.3", "1e", "0x10", "1,5" and any
// trailing junk. A value beyond the float64 range ("1e999") is kOutOfRange; a
// value that underflows gives the correctly rounded subnormal or zero.
ParsedNumber parse_number(std::string_view text);

// True when `text` is a number for parse_number or a comma separated list of
// them ("-1,-inf,2"); used to tell negative numbers from options in argv.
bool looks_like_number_list(std::string_view text);

// One field of a line: its text and 1-based column (in bytes).
struct Field {
  std::string_view text;
  std::size_t column = 0;
};

// Splits a line into fields. Fields are separated by a comma, by spaces or
// tabs, or by a comma with spaces around it. An empty field (a leading or
// trailing comma, or two commas in a row) is an error: returns false and sets
// *error_column to the column of the empty field. A line of only spaces
// gives no fields.
bool split_fields(std::string_view line, std::vector<Field>* fields,
                  std::size_t* error_column);

// Quotes a token for an error message: "abc", with " and \ escaped, control
// bytes and bytes that are not UTF-8 as \xNN, invisible characters (no-break
// and other Unicode spaces, zero-width and format characters such as the
// byte-order mark U+FEFF, C1 controls) as \uXXXX or \UXXXXXXXX, and tokens
// over 40 characters shortened.
std::string quote(std::string_view token);

// The error message for a token that parse_number rejected, e.g.
// "\"abc\" is not a number" or "\"1e999\" is out of range for float64".
std::string number_error(std::string_view token, NumberStatus status);

// The numbers of one command-line argument (a number, or several separated by
// commas and/or spaces). `number` is the 1-based position of the argument
// among the command's positional arguments. Throws CliError
// "argument 2: \"abc\" is not a number", "argument 1: column 3: empty
// value" or "argument 1: no numbers".
std::vector<double> parse_argument_numbers(std::string_view argument,
                                           std::size_t number);

// Parses a non-negative integer (for --digits): digits only, no sign.
std::optional<int> parse_small_int(std::string_view text, int max);

}  // namespace softdot::cli

#endif  // SOFTDOT_CLI_PARSE_H_
