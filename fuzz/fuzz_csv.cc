// Fuzz target: the CSV reader of the softdot command (cli/io_csv.cc). Every
// input is either rejected with CliError naming the file or read; a matrix
// that is read, written in the shortest form that reads back (kShortest)
// and read again gives the same values (NaN for NaN), and read_number_list
// agrees with it when the text has one row.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "error.h"
#include "format.h"
#include "fuzz_util.h"
#include "io_csv.h"

namespace {

bool same_value(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return softdot_fuzz::same_bits(a, b);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data,
                                      std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const softdot::cli::Matrix<double> m =
        softdot::cli::read_csv(text, "fuzz.csv");
    FUZZ_CHECK(m.rows >= 1 && m.cols >= 1);
    FUZZ_CHECK(m.values.size() == m.rows * m.cols);
    const std::string again =
        softdot::cli::write_rows(m, softdot::cli::kShortest, ",");
    const softdot::cli::Matrix<double> back =
        softdot::cli::read_csv(again, "again.csv");
    FUZZ_CHECK(back.rows == m.rows && back.cols == m.cols);
    for (std::size_t i = 0; i < m.values.size(); ++i) {
      FUZZ_CHECK(same_value(back.values[i], m.values[i]));
    }
    if (m.rows == 1) {
      const std::vector<double> list =
          softdot::cli::read_number_list(text, "fuzz.csv");
      FUZZ_CHECK(list.size() == m.cols);
      for (std::size_t i = 0; i < list.size(); ++i) {
        FUZZ_CHECK(same_value(list[i], m.values[i]));
      }
    }
  } catch (const softdot::cli::CliError& e) {
    FUZZ_CHECK(std::string_view(e.what()).substr(0, 8) == "fuzz.csv");
  }
  try {
    const std::vector<double> list =
        softdot::cli::read_number_list(text, "fuzz.txt");
    FUZZ_CHECK(!list.empty());
  } catch (const softdot::cli::CliError& e) {
    FUZZ_CHECK(std::string_view(e.what()).substr(0, 8) == "fuzz.txt");
  }
  return 0;
}
