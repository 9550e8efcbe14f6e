// softdot command: number formatting (see format.h).
#include "format.h"

#include <charconv>
#include <cmath>

namespace softdot::cli {
namespace {

template <class T>
std::string format_impl(T value, int digits) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value < 0 ? "-inf" : "inf";
  // Fixed notation of a double needs at most 309 integer digits plus the
  // decimals; --digits is limited to 20 (main.cc).
  char buffer[400];
  const auto result = digits < 0
                          ? std::to_chars(buffer, buffer + sizeof buffer, value)
                          : std::to_chars(buffer, buffer + sizeof buffer, value,
                                          std::chars_format::fixed, digits);
  return std::string(buffer, result.ptr);
}

template <class T>
std::string json_impl(T value, int digits) {
  if (!std::isfinite(value)) {
    std::string out = "\"";
    out += format_impl(value, digits);
    out += '"';
    return out;
  }
  return format_impl(value, digits);
}

}  // namespace

std::string format_number(double value, int digits) {
  return format_impl(value, digits);
}
std::string format_number(float value, int digits) {
  return format_impl(value, digits);
}
std::string json_number(double value, int digits) {
  return json_impl(value, digits);
}
std::string json_number(float value, int digits) {
  return json_impl(value, digits);
}

template <class T>
std::string join_numbers(std::span<const T> values, int digits,
                         const char* separator, bool json) {
  std::string out;
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (i != 0) out += separator;
    out += json ? json_impl(values[i], digits) : format_impl(values[i], digits);
  }
  return out;
}

template std::string join_numbers<float>(std::span<const float>, int,
                                         const char*, bool);
template std::string join_numbers<double>(std::span<const double>, int,
                                          const char*, bool);

}  // namespace softdot::cli
