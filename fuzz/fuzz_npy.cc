// Fuzz target: the .npy reader of the softdot command (cli/io_npy.cc).
// Every input is either rejected with CliError or read; what is read
// encodes and reads back to the same bits, and the typed accessors return
// exactly size() items.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "error.h"
#include "fuzz_util.h"
#include "io_npy.h"

namespace {

using softdot::cli::CliError;
using softdot::cli::NpyArray;
using softdot::cli::NpyDtype;

template <class T>
void round_trip_matrix(const softdot::cli::Matrix<T>& m) {
  FUZZ_CHECK(m.rows >= 1 && m.cols >= 1);
  FUZZ_CHECK(m.values.size() == m.rows * m.cols);
  const std::string bytes = softdot::cli::encode_npy(m);
  const softdot::cli::AnyMatrix back = softdot::cli::read_npy(bytes, "again");
  const auto* same = std::get_if<softdot::cli::Matrix<T>>(&back);
  FUZZ_CHECK(same != nullptr);
  FUZZ_CHECK(same->rows == m.rows && same->cols == m.cols);
  for (std::size_t i = 0; i < m.values.size(); ++i) {
    FUZZ_CHECK(softdot_fuzz::same_bits(same->values[i], m.values[i]));
  }
}

void check_array(const NpyArray& a) {
  const std::size_t n = a.size();
  switch (a.dtype) {
    case NpyDtype::kFloat16:
      FUZZ_CHECK(softdot::cli::halves_of(a).size() ==
                 std::max<std::size_t>(n, 1));
      [[fallthrough]];
    case NpyDtype::kFloat32: {
      const std::vector<float> f = softdot::cli::floats_of(a);
      FUZZ_CHECK(f.size() == std::max<std::size_t>(n, 1));
      if (a.dtype == NpyDtype::kFloat32 && n > 0) {
        // float32 arrays of any rank encode and read back bit for bit.
        const std::string bytes =
            softdot::cli::encode_npy(std::span<const float>(f.data(), n),
                                     std::span<const std::size_t>(a.shape));
        const NpyDtype f32[] = {NpyDtype::kFloat32};
        const NpyArray back = softdot::cli::read_npy_array(bytes, "again", f32);
        FUZZ_CHECK(back.shape == a.shape);
        FUZZ_CHECK(back.data == a.data);
      }
      break;
    }
    case NpyDtype::kInt32:
      FUZZ_CHECK(softdot::cli::int32s_of(a).size() ==
                 std::max<std::size_t>(n, 1));
      FUZZ_CHECK(softdot::cli::int64s_of(a).size() ==
                 std::max<std::size_t>(n, 1));
      break;
    case NpyDtype::kInt64:
      FUZZ_CHECK(softdot::cli::int64s_of(a).size() ==
                 std::max<std::size_t>(n, 1));
      break;
    case NpyDtype::kInt8:
      FUZZ_CHECK(softdot::cli::int8s_of(a).size() ==
                 std::max<std::size_t>(n, 1));
      break;
    case NpyDtype::kBool:
      (void)softdot::cli::bools_of(a);
      break;
    case NpyDtype::kFloat64:
      break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data,
                                      std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  (void)softdot::cli::looks_like_npy(bytes);
  try {
    const softdot::cli::AnyMatrix m = softdot::cli::read_npy(bytes, "fuzz.npy");
    std::visit([](const auto& x) { round_trip_matrix(x); }, m);
  } catch (const CliError& e) {
    FUZZ_CHECK(std::string_view(e.what()).substr(0, 10) == "fuzz.npy: ");
  }
  static const NpyDtype kAll[] = {NpyDtype::kBool,    NpyDtype::kFloat16,
                                  NpyDtype::kFloat32, NpyDtype::kFloat64,
                                  NpyDtype::kInt8,    NpyDtype::kInt32,
                                  NpyDtype::kInt64};
  try {
    const NpyArray a = softdot::cli::read_npy_array(bytes, "fuzz.npy", kAll);
    std::size_t item = 0;
    switch (a.dtype) {
      case NpyDtype::kBool:
      case NpyDtype::kInt8:
        item = 1;
        break;
      case NpyDtype::kFloat16:
        item = 2;
        break;
      case NpyDtype::kFloat32:
      case NpyDtype::kInt32:
        item = 4;
        break;
      case NpyDtype::kFloat64:
      case NpyDtype::kInt64:
        item = 8;
        break;
    }
    FUZZ_CHECK(a.data.size() == a.size() * item);
    check_array(a);
  } catch (const CliError& e) {
    FUZZ_CHECK(std::string_view(e.what()).substr(0, 10) == "fuzz.npy: ");
  }
  return 0;
}
