// tightfit/backend/detail/eigen_map.hpp: Eigen maps over tightfit's row-major views and spans,
// and the row-block parallel loop shared by the Eigen backend's kernels.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <span>
#include <type_traits>

#include "tightfit/core/parallel.hpp"
#include "tightfit/core/types.hpp"
#include "tightfit/core/view.hpp"

namespace tightfit::detail {

template <class T>
using eigen_row_matrix =
    Eigen::Matrix<std::remove_const_t<T>, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// Map of a row-major block with a row stride; const-correct (T may be const).
template <class T>
using eigen_matrix_map = Eigen::Map<
    std::conditional_t<std::is_const_v<T>, const eigen_row_matrix<T>, eigen_row_matrix<T>>,
    Eigen::Unaligned, Eigen::OuterStride<>>;

template <class T>
using eigen_array = Eigen::Array<std::remove_const_t<T>, Eigen::Dynamic, 1>;

/// Map of a contiguous vector as an Eigen array (vectorised element-wise work).
template <class T>
using eigen_array_map =
    Eigen::Map<std::conditional_t<std::is_const_v<T>, const eigen_array<T>, eigen_array<T>>>;

template <class T>
eigen_matrix_map<T> as_eigen(matrix_view<T> v) {
  return eigen_matrix_map<T>(v.data, v.rows, v.cols,
                             Eigen::OuterStride<>(std::max(v.stride, v.cols)));
}

/// A (rows, cols) block of v starting at (r0, c0), as an Eigen map.
template <class T>
eigen_matrix_map<T> as_eigen(matrix_view<T> v, index_t r0, index_t c0, index_t rows, index_t cols) {
  return eigen_matrix_map<T>(v.data + r0 * v.stride + c0, rows, cols,
                             Eigen::OuterStride<>(std::max(v.stride, cols)));
}

/// A contiguous (rows, cols) matrix over raw scratch memory.
template <class T>
eigen_matrix_map<T> as_eigen(T* data, index_t rows, index_t cols) {
  return eigen_matrix_map<T>(data, rows, cols, Eigen::OuterStride<>(cols));
}

template <class T>
eigen_array_map<T> as_array(std::span<T> s) {
  return eigen_array_map<T>(s.data(), static_cast<index_t>(s.size()));
}

/// Row `i` of a view as an Eigen array map of length v.cols.
template <class T>
eigen_array_map<T> row_array(matrix_view<T> v, index_t i) {
  return eigen_array_map<T>(v.row(i), v.cols);
}

/// Rows per parallel task so that each task touches about `work_per_task` elements.
inline index_t row_grain(index_t cols, index_t work_per_task = index_t{1} << 15) {
  return std::max<index_t>(1, work_per_task / std::max<index_t>(cols, 1));
}

/// Calls body(i) for every row i of an (rows, cols) operand, in parallel row blocks.
template <class Body>
void for_each_row(index_t rows, index_t cols, Body&& body) {
  parallel_for(0, rows, row_grain(cols), [&](index_t i0, index_t i1) {
    for (index_t i = i0; i < i1; ++i) body(i);
  });
}

}  // namespace tightfit::detail
