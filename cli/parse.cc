// softdot command: strict number parsing (see parse.h).
#include "parse.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <system_error>

#include "error.h"

namespace softdot::cli {
namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_blank(char c) {
  return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

bool equals_ignore_case(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    char c = a[i];
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    if (c != b[i]) return false;
  }
  return true;
}

// True when `s` (no sign) matches digits [. digits] [(e|E) [+|-] digits]
// with at least one mantissa digit.
bool is_decimal(std::string_view s) {
  std::size_t i = 0, mantissa_digits = 0;
  while (i < s.size() && is_digit(s[i])) ++i, ++mantissa_digits;
  if (i < s.size() && s[i] == '.') {
    ++i;
    while (i < s.size() && is_digit(s[i])) ++i, ++mantissa_digits;
  }
  if (mantissa_digits == 0) return false;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    std::size_t exponent_digits = 0;
    while (i < s.size() && is_digit(s[i])) ++i, ++exponent_digits;
    if (exponent_digits == 0) return false;
  }
  return i == s.size();
}

}  // namespace

ParsedNumber parse_number(std::string_view text) {
  ParsedNumber result;
  std::string_view body = text;
  bool negative = false;
  if (!body.empty() && (body[0] == '+' || body[0] == '-')) {
    negative = body[0] == '-';
    body.remove_prefix(1);
  }
  if (equals_ignore_case(body, "inf") || equals_ignore_case(body, "infinity")) {
    result.status = NumberStatus::kOk;
    result.value = negative ? -std::numeric_limits<double>::infinity()
                            : std::numeric_limits<double>::infinity();
    return result;
  }
  if (equals_ignore_case(body, "nan")) {
    result.status = NumberStatus::kOk;
    result.value = std::numeric_limits<double>::quiet_NaN();
    return result;
  }
  if (!is_decimal(body)) return result;  // kNotANumber
  double value = 0.0;
  auto [ptr, ec] = std::from_chars(body.data(), body.data() + body.size(),
                                   value, std::chars_format::general);
  if (ec == std::errc::result_out_of_range) {
    // from_chars reports underflow to zero as out of range too; strtod gives
    // the rounded result (0 or a subnormal) and +-HUGE_VAL for overflow. The
    // text is plain decimal here, so the locale's decimal point is not hit
    // (the command never calls setlocale).
    const std::string copy(body);
    value = std::strtod(copy.c_str(), nullptr);
    if (std::isinf(value)) {
      result.status = NumberStatus::kOutOfRange;
      return result;
    }
  } else if (ec != std::errc() || ptr != body.data() + body.size()) {
    return result;
  }
  result.status = NumberStatus::kOk;
  result.value = negative ? -value : value;
  return result;
}

bool looks_like_number_list(std::string_view text) {
  if (text.empty()) return false;
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = text.find(',', start);
    const std::string_view piece = text.substr(
        start, comma == std::string_view::npos ? std::string_view::npos
                                               : comma - start);
    if (parse_number(piece).status == NumberStatus::kNotANumber) return false;
    if (comma == std::string_view::npos) return true;
    start = comma + 1;
  }
}

bool split_fields(std::string_view line, std::vector<Field>* fields,
                  std::size_t* error_column) {
  fields->clear();
  std::size_t i = 0;
  // expecting_field: a comma was seen since the last field (or we are at the
  // start), so a second comma or the end of the line means an empty field.
  bool after_comma = false;
  bool any = false;
  while (true) {
    while (i < line.size() && is_blank(line[i])) ++i;
    if (i == line.size()) {
      if (after_comma) {
        *error_column = i + 1;
        return false;
      }
      return true;
    }
    if (line[i] == ',') {
      if (after_comma || !any) {
        *error_column = i + 1;
        return false;
      }
      after_comma = true;
      ++i;
      continue;
    }
    const std::size_t start = i;
    while (i < line.size() && line[i] != ',' && !is_blank(line[i])) ++i;
    fields->push_back(Field{line.substr(start, i - start), start + 1});
    any = true;
    after_comma = false;
  }
}

std::string quote(std::string_view token) {
  constexpr std::size_t kMax = 40;
  std::string out = "\"";
  const std::size_t n = token.size() > kMax ? kMax : token.size();
  static const char kHex[] = "0123456789abcdef";
  for (std::size_t i = 0; i < n; ++i) {
    const unsigned char c = static_cast<unsigned char>(token[i]);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7f) {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  if (token.size() > kMax) out += "...";
  out += '"';
  return out;
}

std::string number_error(std::string_view token, NumberStatus status) {
  if (status == NumberStatus::kOutOfRange) {
    return quote(token) + " is out of range for float64";
  }
  return quote(token) + " is not a number";
}

std::vector<double> parse_argument_numbers(std::string_view argument,
                                           std::size_t number) {
  const std::string where = "argument " + std::to_string(number) + ": ";
  std::vector<Field> fields;
  std::size_t error_column = 0;
  if (!split_fields(argument, &fields, &error_column)) {
    throw CliError(where + "column " + std::to_string(error_column) +
                   ": empty value in " + quote(argument));
  }
  if (fields.empty())
    throw CliError(where + "no numbers in " + quote(argument));
  std::vector<double> values;
  values.reserve(fields.size());
  for (const Field& field : fields) {
    const ParsedNumber parsed = parse_number(field.text);
    if (parsed.status != NumberStatus::kOk)
      throw CliError(where + number_error(field.text, parsed.status));
    values.push_back(parsed.value);
  }
  return values;
}

std::optional<int> parse_small_int(std::string_view text, int max) {
  if (text.empty() || text.size() > 9) return std::nullopt;
  int value = 0;
  for (char c : text) {
    if (!is_digit(c)) return std::nullopt;
    value = value * 10 + (c - '0');
  }
  if (value > max) return std::nullopt;
  return value;
}

}  // namespace softdot::cli
