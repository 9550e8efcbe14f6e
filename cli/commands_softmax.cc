// softdot command: `softdot softmax [options] [SCORES...]`, one row from the
// arguments or standard input, or many rows with --rows FILE.
#include <algorithm>
#include <cmath>
#include <memory>
#include <span>
#include <stdexcept>
#include <variant>

#include "commands.h"
#include "error.h"
#include "explain.h"
#include "format.h"
#include "io_csv.h"
#include "io_npy.h"
#include "output_file.h"
#include "parse.h"
#include "softdot/float16.h"
#include "softdot/softmax.h"

namespace softdot::cli {
namespace {

constexpr int kDefaultTextDigits = 3;
constexpr int kMaxDigits = 20;

enum class OutputKind { kNone, kNpy, kCsv };

// A mask in the contiguous bool storage SoftmaxOptions::mask needs
// (std::vector<bool> has none).
struct Mask {
  std::unique_ptr<bool[]> flags;
  std::size_t size = 0;
  std::span<const bool> span() const { return {flags.get(), size}; }
};

bool ends_with_ignore_case(const std::string& s, std::string_view suffix) {
  if (s.size() < suffix.size()) return false;
  return std::equal(suffix.begin(), suffix.end(),
                    s.end() - static_cast<std::ptrdiff_t>(suffix.size()),
                    [](char a, char b) {
                      return a == (b >= 'A' && b <= 'Z' ? b - 'A' + 'a' : b);
                    });
}

OutputKind output_kind(const std::optional<std::string>& output) {
  if (!output) return OutputKind::kNone;
  if (ends_with_ignore_case(*output, ".npy")) return OutputKind::kNpy;
  if (ends_with_ignore_case(*output, ".csv")) return OutputKind::kCsv;
  throw CliError("--output " + quote(*output) +
                 ": unknown file type; the name must end in .npy or .csv");
}

double parse_temperature(const std::optional<std::string>& text) {
  if (!text) return 1.0;
  const ParsedNumber t = parse_number(*text);
  if (t.status != NumberStatus::kOk) {
    throw CliError("--temperature: " + number_error(*text, t.status));
  }
  if (!std::isfinite(t.value) || !(t.value > 0)) {
    throw CliError("--temperature: " + quote(*text) +
                   " must be a finite number > 0");
  }
  return t.value;
}

Mask parse_mask(const std::string& text) {
  std::vector<Field> fields;
  std::size_t error_column = 0;
  if (!split_fields(text, &fields, &error_column)) {
    throw CliError("--mask: column " + std::to_string(error_column) +
                   ": empty value in " + quote(text));
  }
  if (fields.empty()) throw CliError("--mask: no flags in " + quote(text));
  Mask mask;
  mask.size = fields.size();
  mask.flags = std::make_unique<bool[]>(mask.size);
  for (std::size_t i = 0; i < fields.size(); ++i) {
    if (fields[i].text != "0" && fields[i].text != "1") {
      throw CliError("--mask: flag " + std::to_string(i + 1) + " " +
                     quote(fields[i].text) + " is not 0 or 1");
    }
    mask.flags[i] = fields[i].text == "1";
  }
  return mask;
}

// The single row: from the arguments, or else all of standard input.
std::vector<double> read_single_row(const std::vector<std::string>& scores) {
  if (scores.empty()) return read_number_list(read_file("-"), "<stdin>");
  std::vector<double> row;
  for (std::size_t i = 0; i < scores.size(); ++i) {
    const std::vector<double> part = parse_argument_numbers(scores[i], i + 1);
    row.insert(row.end(), part.begin(), part.end());
  }
  return row;
}

template <class T>
Matrix<T> compute(const Matrix<T>& x, const SoftmaxOptions& options, bool log) {
  Matrix<T> y;
  y.rows = x.rows;
  y.cols = x.cols;
  y.values.resize(x.values.size());
  try {
    if (log) {
      softdot::log_softmax_rows(x.view(), y.view(), options);
    } else {
      softdot::softmax_rows(x.view(), y.view(), options);
    }
  } catch (const std::invalid_argument& e) {
    throw CliError(e.what());
  }
  return y;
}

template <class T>
std::string to_json(const Matrix<T>& y, bool log, bool single_row, int digits) {
  std::string out = log ? "{\"log_weights\":" : "{\"weights\":";
  if (!single_row) out += "[";
  for (std::size_t r = 0; r < y.rows; ++r) {
    if (r != 0) out += ",";
    out += '[';
    out +=
        join_numbers(std::span<const T>(y.values.data() + r * y.cols, y.cols),
                     digits, ",", /*json=*/true);
    out += ']';
  }
  if (!single_row) out += "]";
  return out + "}\n";
}

// The weights as text: -o FILE.csv, --json, or columns on standard output
// (with --digits, else the shortest round-trip form for CSV and JSON and
// kDefaultTextDigits decimals for the columns).
template <class T>
void write_text(const Matrix<T>& y, const SoftmaxArgs& args, OutputKind output,
                bool single_row, std::optional<int> digits) {
  if (output == OutputKind::kCsv) {
    write_file_atomically(*args.output,
                          write_rows(y, digits.value_or(kShortest), ","));
  } else if (args.json) {
    print(to_json(y, args.log, single_row, digits.value_or(kShortest)));
  } else {
    print(write_rows(y, digits.value_or(kDefaultTextDigits), " "));
  }
}

void check_mask_size(const Mask& mask, bool given, std::size_t rows,
                     std::size_t cols) {
  if (given && mask.size != cols && mask.size != rows * cols) {
    std::string need = std::to_string(cols);
    if (rows > 1)
      need += " (one per column) or " + std::to_string(rows * cols) +
              " (one per value)";
    throw CliError("--mask has " + std::to_string(mask.size) +
                   (mask.size == 1 ? " flag" : " flags") + ", need " + need);
  }
}

template <class H>
void softmax16_rows(const Matrix16& x, Matrix16& y,
                    const SoftmaxOptions& options, bool log) {
  const MatrixView<const H> xv(reinterpret_cast<const H*>(x.bits.data()),
                               x.rows, x.cols);
  const MatrixView<H> yv(reinterpret_cast<H*>(y.bits.data()), y.rows, y.cols);
  if (log) {
    softdot::log_softmax_rows(xv, yv, options);
  } else {
    softdot::softmax_rows(xv, yv, options);
  }
}

// --rows with a float16 or bfloat16 .npy file: the 16-bit functions (each
// result rounded once to the file's format; --fast has no effect). A .npy
// output has the input's dtype; text, CSV and JSON print the 16-bit values
// (exactly, as floats).
int run_softmax16(const SoftmaxArgs& args, const Matrix16& x, const Mask& mask,
                  double temperature, OutputKind output,
                  std::optional<int> digits) {
  check_mask_size(mask, args.mask.has_value(), x.rows, x.cols);
  SoftmaxOptions options;
  options.temperature = temperature;
  options.mask = mask.span();
  Matrix16 y = x;
  try {
    if (x.bf16) {
      softmax16_rows<BFloat16>(x, y, options, args.log);
    } else {
      softmax16_rows<Float16>(x, y, options, args.log);
    }
  } catch (const std::invalid_argument& e) {
    throw CliError(e.what());
  }
  if (output == OutputKind::kNpy) {
    write_file_atomically(*args.output, encode_npy16(y));
    return 0;
  }
  Matrix<float> f;
  f.rows = y.rows;
  f.cols = y.cols;
  f.values.resize(y.bits.size());
  for (std::size_t i = 0; i < y.bits.size(); ++i) {
    f.values[i] =
        y.bf16 ? to_float(BFloat16{y.bits[i]}) : to_float(Float16{y.bits[i]});
  }
  write_text(f, args, output, /*single_row=*/false, digits);
  return 0;
}

}  // namespace

int run_softmax(const SoftmaxArgs& args) {
  // Check every option before reading any input.
  std::optional<int> digits;
  if (args.digits) {
    digits = parse_small_int(*args.digits, kMaxDigits);
    if (!digits) {
      throw CliError("--digits: " + quote(*args.digits) +
                     " must be a whole number from 0 to " +
                     std::to_string(kMaxDigits));
    }
  }
  const double temperature = parse_temperature(args.temperature);
  const OutputKind output = output_kind(args.output);
  if (args.rows && !args.scores.empty()) {
    throw CliError(
        "argument 1: scores on the command line cannot be "
        "combined with --rows");
  }
  if (args.explain && (args.rows || args.json || args.output)) {
    throw CliError(
        "--explain works on one row printed as text; it cannot be "
        "combined with --rows, --json or --output");
  }
  if (args.json && args.output) {
    throw CliError(
        "--json and --output cannot be combined; --json writes "
        "to standard output");
  }
  Mask mask;
  if (args.mask) mask = parse_mask(*args.mask);

  const bool single_row = !args.rows;
  AnyMatrix input;
  if (single_row) {
    Matrix<double> m;
    m.values = read_single_row(args.scores);
    m.rows = 1;
    m.cols = m.values.size();
    input = std::move(m);
  } else {
    const std::string name = *args.rows == "-" ? "<stdin>" : *args.rows;
    const std::string bytes = read_file(*args.rows);
    if (!looks_like_npy(bytes)) {
      input = read_csv(bytes, name);
    } else if (auto m16 = read_npy16(bytes, name)) {
      return run_softmax16(args, *m16, mask, temperature, output, digits);
    } else {
      input = read_npy(bytes, name);
    }
  }
  const std::size_t rows =
      std::visit([](const auto& m) { return m.rows; }, input);
  const std::size_t cols =
      std::visit([](const auto& m) { return m.cols; }, input);
  check_mask_size(mask, args.mask.has_value(), rows, cols);

  SoftmaxOptions options;
  options.temperature = temperature;
  options.mask = mask.span();
  if (args.fast) options.precision = softdot::Precision::kFast;

  if (args.explain) {
    const auto& x = std::get<Matrix<double>>(input);
    try {
      print(explain_softmax(x.values, mask.span(), temperature, args.log,
                            digits.value_or(kDefaultTextDigits)));
    } catch (const std::invalid_argument& e) {
      throw CliError(e.what());
    }
    return 0;
  }

  std::visit(
      [&](const auto& x) {
        const auto y = compute(x, options, args.log);
        if (output == OutputKind::kNpy) {
          write_file_atomically(*args.output, encode_npy(y));
        } else {
          write_text(y, args, output, single_row, digits);
        }
      },
      input);
  return 0;
}

}  // namespace softdot::cli
