// softdot command: how numbers are written (text, CSV, JSON).
#ifndef SOFTDOT_CLI_FORMAT_H_
#define SOFTDOT_CLI_FORMAT_H_

#include <span>
#include <string>

namespace softdot::cli {

// digits < 0 means "shortest": the shortest decimal that reads back as the
// same float/double (std::to_chars without precision): 4, 0.5, 1e-300.
// digits >= 0: fixed notation with that many decimals, correctly rounded
// from the binary value (like printf("%.*f")): 0.659.
// Non-finite values are written inf, -inf and nan (never -nan).
inline constexpr int kShortest = -1;

std::string format_number(double value, int digits);
std::string format_number(float value, int digits);

// A JSON value: the number as format_number writes it, or, for values JSON
// cannot hold, the strings "inf", "-inf" and "nan".
std::string json_number(double value, int digits);
std::string json_number(float value, int digits);

// Values joined by `separator` (" " for text, "," for CSV and JSON arrays).
template <class T>
std::string join_numbers(std::span<const T> values, int digits,
                         const char* separator, bool json = false);

}  // namespace softdot::cli

#endif  // SOFTDOT_CLI_FORMAT_H_
