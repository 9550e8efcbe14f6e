// softdot command: CSV rows (see io_csv.h).
#include "io_csv.h"

#include <span>

#include "error.h"
#include "format.h"
#include "parse.h"

namespace softdot::cli {
namespace {

// Calls fn(line_number, line) for every line; the last line may lack "\n".
template <class Fn>
void for_each_line(std::string_view text, Fn&& fn) {
  std::size_t line_number = 1;
  while (!text.empty()) {
    const std::size_t end = text.find('\n');
    fn(line_number, text.substr(0, end));
    if (end == std::string_view::npos) break;
    text.remove_prefix(end + 1);
    ++line_number;
  }
}

// A UTF-8 byte-order mark at the start of the text (as spreadsheet exports
// write it) is not data; columns count from after it.
std::string_view skip_bom(std::string_view text) {
  constexpr std::string_view kBom = "\xef\xbb\xbf";
  if (text.substr(0, kBom.size()) == kBom) text.remove_prefix(kBom.size());
  return text;
}

std::string place(std::string_view name, std::size_t line, std::size_t col) {
  return std::string(name) + ":" + std::to_string(line) + ":" +
         std::to_string(col) + ": ";
}

// Parses the fields of one line and appends them to `out`.
void parse_line(std::string_view line, std::size_t line_number,
                std::string_view name, std::vector<Field>* fields,
                std::vector<double>* out) {
  std::size_t error_column = 0;
  if (!split_fields(line, fields, &error_column)) {
    throw CliError(place(name, line_number, error_column) + "empty value");
  }
  for (const Field& field : *fields) {
    const ParsedNumber number = parse_number(field.text);
    if (number.status != NumberStatus::kOk) {
      throw CliError(place(name, line_number, field.column) +
                     number_error(field.text, number.status));
    }
    out->push_back(number.value);
  }
}

}  // namespace

Matrix<double> read_csv(std::string_view text, std::string_view name) {
  Matrix<double> matrix;
  std::vector<Field> fields;
  std::vector<double> row;
  std::size_t first_blank_line = 0;  // a blank line not yet followed by data
  std::size_t first_line = 0;        // the line of the first row
  for_each_line(skip_bom(text), [&](std::size_t line_number,
                                    std::string_view line) {
    row.clear();
    parse_line(line, line_number, name, &fields, &row);
    if (row.empty()) {
      if (first_blank_line == 0) first_blank_line = line_number;
      return;
    }
    if (first_blank_line != 0) {
      throw CliError(std::string(name) + ":" +
                     std::to_string(first_blank_line) + ": empty row");
    }
    if (matrix.rows == 0) {
      matrix.cols = row.size();
      first_line = line_number;
    } else if (row.size() != matrix.cols) {
      throw CliError(
          std::string(name) + ": line " + std::to_string(line_number) +
          " has " + std::to_string(row.size()) +
          (row.size() == 1 ? " value" : " values") + ", line " +
          std::to_string(first_line) + " has " + std::to_string(matrix.cols));
    }
    matrix.values.insert(matrix.values.end(), row.begin(), row.end());
    ++matrix.rows;
  });
  if (matrix.rows == 0) throw CliError(std::string(name) + ": no rows");
  return matrix;
}

std::vector<double> read_number_list(std::string_view text,
                                     std::string_view name) {
  std::vector<double> values;
  std::vector<Field> fields;
  for_each_line(skip_bom(text),
                [&](std::size_t line_number, std::string_view line) {
                  parse_line(line, line_number, name, &fields, &values);
                });
  if (values.empty()) throw CliError(std::string(name) + ": no numbers");
  return values;
}

template <class T>
std::string write_rows(const Matrix<T>& matrix, int digits,
                       const char* separator) {
  std::string out;
  for (std::size_t r = 0; r < matrix.rows; ++r) {
    out += join_numbers(
        std::span<const T>(matrix.values.data() + r * matrix.cols, matrix.cols),
        digits, separator);
    out += '\n';
  }
  return out;
}

template std::string write_rows<float>(const Matrix<float>&, int, const char*);
template std::string write_rows<double>(const Matrix<double>&, int,
                                        const char*);

}  // namespace softdot::cli
