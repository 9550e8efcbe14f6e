// softdot: a strided row-major matrix view (non-owning).
#ifndef SOFTDOT_MATRIX_H_
#define SOFTDOT_MATRIX_H_

#include <cstddef>
#include <span>
#include <type_traits>

namespace softdot {

// A row-major matrix of `rows` x `cols` elements; row i starts at
// data + i * stride. `stride` is in elements and must be >= cols when
// rows > 1. The view never owns or allocates.
template <class T>
struct MatrixView {
  T* data = nullptr;
  std::size_t rows = 0;
  std::size_t cols = 0;
  std::size_t stride = 0;

  constexpr MatrixView() = default;
  // Dense matrix: stride == cols.
  constexpr MatrixView(T* data_, std::size_t rows_, std::size_t cols_)
      : data(data_), rows(rows_), cols(cols_), stride(cols_) {}
  constexpr MatrixView(T* data_, std::size_t rows_, std::size_t cols_,
                       std::size_t stride_)
      : data(data_), rows(rows_), cols(cols_), stride(stride_) {}

  // A view of mutable data converts to a view of const data.
  template <class U, class = std::enable_if_t<std::is_same_v<const U, T> &&
                                              !std::is_same_v<U, T>>>
  constexpr MatrixView(const MatrixView<U>& other)  // NOLINT: implicit
      : data(other.data),
        rows(other.rows),
        cols(other.cols),
        stride(other.stride) {}

  constexpr std::span<T> row(std::size_t i) const {
    return std::span<T>(data + i * stride, cols);
  }
};

}  // namespace softdot

#endif  // SOFTDOT_MATRIX_H_
