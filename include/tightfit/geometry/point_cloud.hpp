// tightfit/geometry/point_cloud.hpp: the PointCloud concept and its adaptors.
//
// A point cloud is anything that satisfies nanoflann's dataset contract: a point count and a
// coordinate accessor. Eigen matrices (one point per row), std::vector of indexable points and a
// user's own type plug in with a few lines:
//   struct my_cloud { std::size_t kdtree_get_point_count() const; double kdtree_get_pt(
//                     std::size_t i, std::size_t d) const; };
// measure(), mebb() and detect_belt() read any PointCloud through `point_at` without copying it
// (they keep only the points they work on: those above the belt); `to_points` copies a cloud
// into `points` (double precision) for the lower-level functions, rejecting NaN and infinite
// coordinates with a tightfit::error naming the offending point. float_cloud holds float
// coordinates (a binary PLY's, read without widening).
#pragma once

#include <Eigen/Core>
#include <array>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "tightfit/core/error.hpp"
#include "tightfit/core/types.hpp"

namespace tightfit::geometry {

/// A 3D point (metres unless a caller says otherwise).
using point3 = Eigen::Vector3d;
/// The cloud representation every algorithm works on: (N, 3) as a vector of points.
using points = std::vector<point3>;

/// nanoflann's dataset contract: `kdtree_get_point_count()` and `kdtree_get_pt(i, d)`.
template <class C>
concept PointCloud = requires(const C& c, std::size_t i, std::size_t d) {
  { c.kdtree_get_point_count() } -> std::convertible_to<std::size_t>;
  { c.kdtree_get_pt(i, d) } -> std::convertible_to<double>;
};

/// Adapts an Eigen matrix with one point per row (N x 3, any scalar) to PointCloud.
template <class Matrix>
class matrix_cloud {
 public:
  /// Keeps a reference: `m` must outlive the adaptor.
  explicit matrix_cloud(const Matrix& m) : m_(m) {
    check(m.cols() == 3, "matrix_cloud: cols is ", m.cols(), ", expected 3 (x y z per row)");
  }
  std::size_t kdtree_get_point_count() const { return static_cast<std::size_t>(m_.rows()); }
  double kdtree_get_pt(std::size_t i, std::size_t d) const {
    return static_cast<double>(m_(static_cast<Eigen::Index>(i), static_cast<Eigen::Index>(d)));
  }

 private:
  const Matrix& m_;
};

/// Adapts a std::vector of points indexable as p[0], p[1], p[2] (std::array, Eigen vectors).
template <class Point>
class vector_cloud {
 public:
  /// Keeps a reference: `v` must outlive the adaptor.
  explicit vector_cloud(const std::vector<Point>& v) : v_(v) {}
  std::size_t kdtree_get_point_count() const { return v_.size(); }
  double kdtree_get_pt(std::size_t i, std::size_t d) const {
    return static_cast<double>(v_[i][static_cast<Eigen::Index>(d)]);
  }

 private:
  const std::vector<Point>& v_;
};

/// A cloud of float coordinates: what a binary PLY with float x, y, z stores, kept without
/// widening (half the memory of `points`). Either owned (x y z
/// interleaved in a vector) or a view of `n` records of `stride` bytes whose x, y, z floats lie at
/// byte offsets `offset` (any alignment: read with memcpy), kept alive by a shared owner (e.g. a
/// PLY held in memory, cloud_io.hpp). Coordinates come out in double precision times `scale` (1
/// unless set; multiplying by 1 is exact), so a measurement of it is the same as of its `points`
/// copy scaled the same way. Copies share the storage.
class float_cloud {
 public:
  float_cloud() = default;
  /// `xyz`: shape (N, 3) row-major, N = xyz.size() / 3.
  explicit float_cloud(std::vector<float> xyz, double scale = 1) {
    check(xyz.size() % 3 == 0, "float_cloud: ", xyz.size(),
          " coordinates, expected a multiple of 3 (x y z per point)");
    auto owned = std::make_shared<const std::vector<float>>(std::move(xyz));
    bytes_ = reinterpret_cast<const unsigned char*>(owned->data());
    n_ = owned->size() / 3;
    owner_ = std::move(owned);
    set_scale(scale);
  }
  /// A view: record i spans bytes [i * stride, (i + 1) * stride) of `bytes`, coordinate d is the
  /// float at byte offset[d] of it (offset[d] + 4 <= stride). `owner` keeps `bytes` alive.
  float_cloud(std::shared_ptr<const void> owner, const unsigned char* bytes, std::size_t n,
              std::size_t stride, const std::array<std::size_t, 3>& offset, double scale = 1)
      : owner_(std::move(owner)), bytes_(bytes), n_(n), stride_(stride), offset_(offset) {
    for (std::size_t d = 0; d < 3; ++d)
      check(offset[d] + 4 <= stride, "float_cloud: coordinate ", d, " at byte ", offset[d],
            " does not fit a record of ", stride, " bytes");
    check(n == 0 || bytes != nullptr, "float_cloud: no storage for ", n, " points");
    set_scale(scale);
  }
  std::size_t kdtree_get_point_count() const { return n_; }
  double kdtree_get_pt(std::size_t i, std::size_t d) const {
    return static_cast<double>(coord(i, d)) * scale_;
  }
  /// Coordinate d of point i as stored (before scaling).
  float coord(std::size_t i, std::size_t d) const {
    float f;
    std::memcpy(&f, bytes_ + i * stride_ + offset_[d], sizeof f);
    return f;
  }
  double scale() const { return scale_; }
  void set_scale(double s) {
    check(std::isfinite(s) && s > 0, "float_cloud: scale is ", s, ", expected a positive number");
    scale_ = s;
  }

 private:
  std::shared_ptr<const void> owner_;           // the storage (a vector<float> or a mapping)
  const unsigned char* bytes_ = nullptr;        // (n, stride) bytes
  std::size_t n_ = 0, stride_ = 12;             // points, bytes per record
  std::array<std::size_t, 3> offset_{0, 4, 8};  // byte offsets of x, y, z in a record
  double scale_ = 1;
};

/// A `points` vector is itself usable wherever a PointCloud is expected, through this view.
inline vector_cloud<point3> as_cloud(const points& p) {
  return vector_cloud<point3>(p);
}

/// Point i of any PointCloud, in double precision.
template <PointCloud C>
point3 point_at(const C& cloud, std::size_t i) {
  return point3(static_cast<double>(cloud.kdtree_get_pt(i, 0)),
                static_cast<double>(cloud.kdtree_get_pt(i, 1)),
                static_cast<double>(cloud.kdtree_get_pt(i, 2)));
}

/// Copies any PointCloud into `points`; throws tightfit::error on a NaN or infinite coordinate.
template <PointCloud C>
points to_points(const C& cloud) {
  const std::size_t n = cloud.kdtree_get_point_count();
  points out(n);
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t d = 0; d < 3; ++d) {
      const double v = static_cast<double>(cloud.kdtree_get_pt(i, d));
      if (!std::isfinite(v))
        fail("point cloud: coordinate ", d, " of point ", i, " is ", v,
             ", expected a finite value");
      out[i][static_cast<Eigen::Index>(d)] = v;
    }
  }
  return out;
}

}  // namespace tightfit::geometry
