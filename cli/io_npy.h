// softdot command: reading and writing NumPy .npy files (C order,
// little-endian; format versions 1.0, 2.0 and 3.0): 2-D float32 or float64
// matrices, and arrays of any rank of bool, int8, float16, float32,
// float64 or int32.
#ifndef SOFTDOT_CLI_IO_NPY_H_
#define SOFTDOT_CLI_IO_NPY_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "matrix_data.h"
#include "softdot/float16.h"

namespace softdot::cli {

// True when `bytes` starts like a .npy file: its first byte is 0x93 (the
// first byte of the magic "\x93NUMPY"); read_npy then checks the rest, so a
// truncated file gets a .npy error rather than a CSV one.
bool looks_like_npy(std::string_view bytes);

// Parses a whole .npy file. Accepts descr '<f4' / '<f8' (and '=f4'/'=f8'),
// fortran_order False, a 2-D shape with rows >= 1 and cols >= 1, and exactly
// rows * cols values after the header. Throws CliError "name: ..." for
// anything else (bad magic, version, header, dtype, order, shape, truncated
// data, bytes after the data).
AnyMatrix read_npy(std::string_view bytes, std::string_view name);

// Encodes a matrix as a format 1.0 .npy file (header padded to a multiple of
// 64 bytes): '<f4' for float, '<f8' for double, shape (rows, cols).
std::string encode_npy(const Matrix<float>& matrix);
std::string encode_npy(const Matrix<double>& matrix);

// A 2-D matrix of 16-bit values from a .npy file: float16 ('<f2') or
// bfloat16, which ml_dtypes' np.save writes as 2-byte void ('<V2' or
// '|V2': numpy has no bfloat16 code, and np.load gives such a file back as
// void '|V2'); a '<V2' file is read as bfloat16 (docs/cli.md). bits holds
// rows * cols values, row-major; descr is the file's, written back by
// encode_npy16 so that the output has the input's dtype.
struct Matrix16 {
  bool bf16 = false;
  std::size_t rows = 0;
  std::size_t cols = 0;
  std::vector<std::uint16_t> bits;
  std::string descr;
};
// The matrix when `bytes` is a .npy file of one of those dtypes; nullopt for
// any other dtype (read_npy then reads or rejects it). Throws CliError as
// read_npy for a bad header, order, shape or size.
std::optional<Matrix16> read_npy16(std::string_view bytes,
                                   std::string_view name);
std::string encode_npy16(const Matrix16& m);
// 16-bit values of any shape with the given descr ('<f2', '<V2', ...).
std::string encode_npy16(std::span<const std::uint16_t> bits,
                         std::span<const std::size_t> shape,
                         std::string_view descr);

// The dtypes read_npy_array knows: '|b1', '|i1', '<f2', '<f4', '<f8', '<i4',
// '<i8'
// (and '=' for '<'; any byte order for the one-byte bool and int8).
enum class NpyDtype {
  kBool,
  kFloat16,
  kFloat32,
  kFloat64,
  kInt8,
  kInt32,
  kInt64
};

// "float32 '<f4'" and so on, for messages.
std::string_view npy_dtype_name(NpyDtype dtype);

// An array of any rank (dimensions of 0 allowed), its data as in the file:
// C order, little-endian, size() items of the dtype's size.
struct NpyArray {
  NpyDtype dtype = NpyDtype::kFloat32;
  std::vector<std::size_t> shape;
  std::string data;
  std::size_t size() const;  // the product of the shape (1 for a scalar)
};

// Parses a whole .npy file of one of the `allowed` dtypes, any shape. Throws
// CliError "name: ..." for a bad file as read_npy does, and for a dtype not
// in `allowed` ("name: dtype '<i4' (int32) is not supported; need float32
// '<f4' or float16 '<f2'"). The caller checks the shape.
NpyArray read_npy_array(std::string_view bytes, std::string_view name,
                        std::span<const NpyDtype> allowed);

// Encodes float32 values of any shape (size = product of the shape) as a
// format 1.0 .npy file, '<f4', C order, header padded as encode_npy's.
std::string encode_npy(std::span<const float> values,
                       std::span<const std::size_t> shape);
// The same for float64 values ('<f8').
std::string encode_npy(std::span<const double> values,
                       std::span<const std::size_t> shape);

// The values of an array read by read_npy_array, decoded from its
// little-endian bytes; each vector has at least one element, so that data()
// is never null (an array may have no element). floats_of takes float32 or
// float16 (widened exactly), halves_of float16 bits, bools_of bool,
// int8s_of int8.
// int32s_of int32.
std::vector<float> floats_of(const NpyArray& a);
std::vector<std::int32_t> int32s_of(const NpyArray& a);
// int64 ('<i8'), or int32 widened.
std::vector<std::int64_t> int64s_of(const NpyArray& a);
std::vector<Float16> halves_of(const NpyArray& a);
std::unique_ptr<bool[]> bools_of(const NpyArray& a);
std::vector<std::int8_t> int8s_of(const NpyArray& a);

}  // namespace softdot::cli

#endif  // SOFTDOT_CLI_IO_NPY_H_
