// A PointCloud (geometry/point_cloud.hpp) over a strided (N, 3) view of float or double
// coordinates: a numpy array, a slice of one or a torch tensor, read in place. Coordinates come
// out in double precision times `scale` (1: exact), as float_cloud hands out a float PLY's, so a
// float32 array measures exactly like `tightfit measure` measures the same float PLY.
// contiguous_cloud is the same for a C-contiguous array, with its strides known at compile time
// (the library's passes over the points then run as over an Eigen matrix: the overhead bench).
// Invariant: the memory outlives the cloud (the caller holds the array_view).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "tightfit/geometry/point_cloud.hpp"

namespace tightfit::python {

template <class T>
class strided_cloud {
 public:
  strided_cloud(const unsigned char* data, std::size_t n, std::int64_t row_stride,
                std::int64_t column_stride, double scale)
      : data_(data), n_(n), row_(row_stride), column_(column_stride), scale_(scale) {}

  std::size_t kdtree_get_point_count() const { return n_; }
  double kdtree_get_pt(std::size_t i, std::size_t d) const {
    T x;  // memcpy: a view may be unaligned (a field of a record array)
    std::memcpy(
        &x, data_ + static_cast<std::int64_t>(i) * row_ + static_cast<std::int64_t>(d) * column_,
        sizeof x);
    return static_cast<double>(x) * scale_;
  }

 private:
  const unsigned char* data_;
  std::size_t n_;
  std::int64_t row_, column_;  // bytes between points, between coordinates (may be negative)
  double scale_;
};

/// strided_cloud of a C-contiguous (N, 3) array: point i's coordinates at data + 3 i.
template <class T>
class contiguous_cloud {
 public:
  contiguous_cloud(const unsigned char* data, std::size_t n, double scale)
      : data_(data), n_(n), scale_(scale) {}

  std::size_t kdtree_get_point_count() const { return n_; }
  double kdtree_get_pt(std::size_t i, std::size_t d) const {
    T x;
    std::memcpy(&x, data_ + (3 * i + d) * sizeof(T), sizeof x);
    return static_cast<double>(x) * scale_;
  }
  /// The 3 N coordinates as T, or null when the memory is not aligned for T.
  const T* coordinates() const {
    if (reinterpret_cast<std::uintptr_t>(data_) % alignof(T) != 0) return nullptr;
    return reinterpret_cast<const T*>(data_);
  }

 private:
  const unsigned char* data_;
  std::size_t n_;
  double scale_;
};

static_assert(geometry::PointCloud<contiguous_cloud<double>>);
static_assert(geometry::PointCloud<strided_cloud<float>>);
static_assert(geometry::PointCloud<strided_cloud<double>>);

}  // namespace tightfit::python
