// softdot command: a dense row-major matrix that owns its values.
#ifndef SOFTDOT_CLI_MATRIX_DATA_H_
#define SOFTDOT_CLI_MATRIX_DATA_H_

#include <cstddef>
#include <variant>
#include <vector>

#include "softdot/matrix.h"

namespace softdot::cli {

template <class T>
struct Matrix {
  std::size_t rows = 0;
  std::size_t cols = 0;
  std::vector<T> values;  // rows * cols, row-major

  MatrixView<T> view() { return MatrixView<T>(values.data(), rows, cols); }
  MatrixView<const T> view() const {
    return MatrixView<const T>(values.data(), rows, cols);
  }
};

// A matrix read from a file: float32 .npy stays float32, everything else is
// float64.
using AnyMatrix = std::variant<Matrix<float>, Matrix<double>>;

}  // namespace softdot::cli

#endif  // SOFTDOT_CLI_MATRIX_DATA_H_
