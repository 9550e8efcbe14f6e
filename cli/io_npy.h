// softdot command: reading and writing NumPy .npy files (2-D, float32 or
// float64, C order, little-endian; format versions 1.0, 2.0 and 3.0).
#ifndef SOFTDOT_CLI_IO_NPY_H_
#define SOFTDOT_CLI_IO_NPY_H_

#include <string>
#include <string_view>

#include "matrix_data.h"

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

}  // namespace softdot::cli

#endif  // SOFTDOT_CLI_IO_NPY_H_
