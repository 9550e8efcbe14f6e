// softdot command: reading and writing rows of numbers as text (CSV).
#ifndef SOFTDOT_CLI_IO_CSV_H_
#define SOFTDOT_CLI_IO_CSV_H_

#include <string>
#include <string_view>
#include <vector>

#include "matrix_data.h"

namespace softdot::cli {

// Reads a matrix: one row per line, values separated by commas and/or spaces
// (split_fields in parse.h), "\n" or "\r\n" line ends. Blank lines at the end
// are ignored; a blank line before the last row is an empty row (an error).
// A UTF-8 byte-order mark at the very start is skipped (spreadsheets write
// one); anywhere else it is a character of a field (an error naming it).
// `name` is the file name used in messages. Throws CliError naming the place:
//   "name:3:7: \"x\" is not a number", "name: line 4 has 3 values, line 1 has
//   4", "name:2: empty row", "name:3:5: empty value", "name: no rows".
Matrix<double> read_csv(std::string_view text, std::string_view name);

// Reads every number in `text` (any number of lines) as one row, for the
// single-row form reading standard input. A byte-order mark at the start is
// skipped and errors are as for read_csv; no numbers
// at all is "name: no numbers".
std::vector<double> read_number_list(std::string_view text,
                                     std::string_view name);

// One line per row, values joined by `separator`, each line ending in "\n".
template <class T>
std::string write_rows(const Matrix<T>& matrix, int digits,
                       const char* separator);

}  // namespace softdot::cli

#endif  // SOFTDOT_CLI_IO_CSV_H_
