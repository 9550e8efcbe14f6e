// softdot command: strict number parsing (see parse.h).
#include "parse.h"

#include <charconv>
#include <cmath>
#include <cstdint>
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

namespace {

// \x9f, \u00a0, \U000e0001: `value` in `digits` hex digits after `prefix`.
std::string hex_escape(const char* prefix, std::uint32_t value, int digits) {
  static const char kHex[] = "0123456789abcdef";
  std::string out = prefix;
  for (int shift = 4 * (digits - 1); shift >= 0; shift -= 4)
    out += kHex[(value >> shift) & 15];
  return out;
}

// The length of the UTF-8 sequence at the start of `s` and its code point,
// or 0 when it is not valid UTF-8 (overlong, a surrogate, past U+10FFFF,
// truncated).
std::size_t utf8_sequence(std::string_view s, std::uint32_t* code) {
  const auto byte = [&](std::size_t i) {
    return static_cast<unsigned char>(s[i]);
  };
  const unsigned char lead = byte(0);
  std::size_t n = 0;
  std::uint32_t min = 0;
  if (lead >= 0xc2 && lead <= 0xdf) {
    n = 2, min = 0x80, *code = lead & 0x1fu;
  } else if (lead >= 0xe0 && lead <= 0xef) {
    n = 3, min = 0x800, *code = lead & 0x0fu;
  } else if (lead >= 0xf0 && lead <= 0xf4) {
    n = 4, min = 0x10000, *code = lead & 0x07u;
  } else {
    return 0;
  }
  if (s.size() < n) return 0;
  for (std::size_t i = 1; i < n; ++i) {
    if ((byte(i) & 0xc0) != 0x80) return 0;
    *code = (*code << 6) | (byte(i) & 0x3fu);
  }
  if (*code < min || *code > 0x10ffff || (*code >= 0xd800 && *code <= 0xdfff))
    return 0;
  return n;
}

// Characters a terminal shows as nothing, as a space or not at all: C1
// controls, Unicode spaces, zero-width and format characters, variation
// selectors, the byte-order mark, tags, noncharacters.
bool invisible(std::uint32_t c) {
  static constexpr std::uint32_t kRanges[][2] = {
      {0x80, 0xa0},       {0xad, 0xad},       {0x34f, 0x34f},
      {0x61c, 0x61c},     {0x115f, 0x1160},   {0x1680, 0x1680},
      {0x180b, 0x180e},   {0x2000, 0x200f},   {0x2028, 0x202f},
      {0x205f, 0x206f},   {0x3000, 0x3000},   {0x3164, 0x3164},
      {0xfe00, 0xfe0f},   {0xfeff, 0xfeff},   {0xffa0, 0xffa0},
      {0xfff0, 0xfffb},   {0xfdd0, 0xfdef},   {0x1d173, 0x1d17a},
      {0xe0000, 0xe0fff}, {0xf0000, 0x10ffff}};
  if ((c & 0xfffe) == 0xfffe) return true;  // U+xxFFFE, U+xxFFFF
  for (const auto& r : kRanges)
    if (c >= r[0] && c <= r[1]) return true;
  return false;
}

}  // namespace

std::string quote(std::string_view token) {
  constexpr std::size_t kMax = 40;  // characters
  std::string out = "\"";
  std::size_t shown = 0, i = 0;
  for (; i < token.size() && shown < kMax; ++shown) {
    const auto c = static_cast<unsigned char>(token[i]);
    if (c < 0x80) {
      if (c == '"' || c == '\\') {
        out += '\\';
        out += static_cast<char>(c);
      } else if (c < 0x20 || c == 0x7f) {
        out += hex_escape("\\x", c, 2);
      } else {
        out += static_cast<char>(c);
      }
      ++i;
      continue;
    }
    std::uint32_t code = 0;
    const std::size_t n = utf8_sequence(token.substr(i), &code);
    if (n == 0) {
      out += hex_escape("\\x", c, 2);  // not UTF-8: the byte
      ++i;
    } else if (invisible(code)) {
      out += code > 0xffff ? hex_escape("\\U", code, 8)
                           : hex_escape("\\u", code, 4);
      i += n;
    } else {
      out += token.substr(i, n);
      i += n;
    }
  }
  if (i < token.size()) out += "...";
  out += '"';
  return out;
}

std::string number_error(std::string_view token, NumberStatus status) {
  if (status == NumberStatus::kOutOfRange) {
    return quote(token) + " is out of range for float64";
  }
  // A byte-order mark where it is not skipped (not at the start of a file,
  // or in an argument): name it, as it shows as nothing.
  if (token.find("\xef\xbb\xbf") != std::string_view::npos) {
    return quote(token) +
           " is not a number: it holds a byte-order mark (U+FEFF)";
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
