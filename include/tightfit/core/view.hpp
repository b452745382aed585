// tightfit/core/view.hpp: non-owning row-major views with strides.
//
// matrix_view<T>: a (rows, cols) block; element (i, j) lives at data[i * stride + j], stride >=
// cols. tensor3_view<T>: a batch of matrices (B, T, C); element (b, t, c) at
//   data[b * batch_stride + t * row_stride + c].
// Views never own memory; a view of const T is made implicitly from a view of T.
#pragma once

#include <span>
#include <type_traits>

#include "tightfit/core/error.hpp"
#include "tightfit/core/types.hpp"

namespace tightfit {

template <class T>
struct matrix_view {
  T* data = nullptr;
  index_t rows = 0;
  index_t cols = 0;
  index_t stride = 0;  ///< elements between the starts of consecutive rows

  constexpr matrix_view() = default;
  constexpr matrix_view(T* d, index_t r, index_t c) : data(d), rows(r), cols(c), stride(c) {}
  constexpr matrix_view(T* d, index_t r, index_t c, index_t s)
      : data(d), rows(r), cols(c), stride(s) {}

  /// A view of const T from a view of T.
  template <class U>
  requires(std::is_same_v<const U, T> && !std::is_same_v<U, T>) constexpr matrix_view(
      const matrix_view<U>& other)  // NOLINT(google-explicit-constructor)
      : data(other.data), rows(other.rows), cols(other.cols), stride(other.stride) {}

  constexpr T& operator()(index_t i, index_t j) const { return data[i * stride + j]; }
  constexpr T* row(index_t i) const { return data + i * stride; }
  constexpr index_t size() const { return rows * cols; }
  constexpr bool empty() const { return rows == 0 || cols == 0; }
  constexpr bool contiguous() const { return stride == cols || rows <= 1; }

  /// Rows [r0, r1).
  constexpr matrix_view row_range(index_t r0, index_t r1) const {
    return {data + r0 * stride, r1 - r0, cols, stride};
  }
  /// Columns [c0, c1).
  constexpr matrix_view col_range(index_t c0, index_t c1) const {
    return {data + c0, rows, c1 - c0, stride};
  }
  /// The same elements seen as (new_rows, new_cols); the view must be contiguous.
  matrix_view reshape(index_t new_rows, index_t new_cols) const {
    check(contiguous(), "matrix_view::reshape: view with stride ", stride, " and cols ", cols,
          " is not contiguous");
    check(new_rows * new_cols == rows * cols, "matrix_view::reshape: ", rows, "x", cols,
          " cannot be seen as ", new_rows, "x", new_cols);
    return {data, new_rows, new_cols, new_cols};
  }
  /// The elements of a contiguous view as a span.
  std::span<T> flat() const {
    check(contiguous(), "matrix_view::flat: view with stride ", stride, " and cols ", cols,
          " is not contiguous");
    return {data, static_cast<std::size_t>(rows * cols)};
  }
};

/// A contiguous (rows, cols) view over a span.
template <class T>
matrix_view<T> as_matrix(std::span<T> s, index_t rows, index_t cols) {
  check(static_cast<index_t>(s.size()) == rows * cols, "as_matrix: span of ", s.size(),
        " elements cannot be seen as ", rows, "x", cols);
  return {s.data(), rows, cols, cols};
}

/// A one-row view of a span.
template <class T>
matrix_view<T> as_row(std::span<T> s) {
  return {s.data(), 1, static_cast<index_t>(s.size()), static_cast<index_t>(s.size())};
}

template <class T>
struct tensor3_view {
  T* data = nullptr;
  index_t batch = 0;
  index_t rows = 0;
  index_t cols = 0;
  index_t batch_stride = 0;
  index_t row_stride = 0;

  constexpr tensor3_view() = default;
  constexpr tensor3_view(T* d, index_t b, index_t r, index_t c)
      : data(d), batch(b), rows(r), cols(c), batch_stride(r * c), row_stride(c) {}
  constexpr tensor3_view(T* d, index_t b, index_t r, index_t c, index_t bs, index_t rs)
      : data(d), batch(b), rows(r), cols(c), batch_stride(bs), row_stride(rs) {}

  template <class U>
  requires(std::is_same_v<const U, T> && !std::is_same_v<U, T>) constexpr tensor3_view(
      const tensor3_view<U>& o)  // NOLINT(google-explicit-constructor)
      : data(o.data),
        batch(o.batch),
        rows(o.rows),
        cols(o.cols),
        batch_stride(o.batch_stride),
        row_stride(o.row_stride) {}

  constexpr T& operator()(index_t b, index_t t, index_t c) const {
    return data[b * batch_stride + t * row_stride + c];
  }
  /// Matrix b of the batch, (rows, cols).
  constexpr matrix_view<T> operator[](index_t b) const {
    return {data + b * batch_stride, rows, cols, row_stride};
  }
  constexpr index_t size() const { return batch * rows * cols; }
};

}  // namespace tightfit
