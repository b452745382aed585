// tightfit/geometry/box.hpp: oriented boxes and the baseline box fits MEBB is compared with:
// axis-aligned box, PCA oriented box (extremes in the PCA frame, PCL's and Open3D's default),
// percentile-trimmed box and the minimum-area footprint box (rotating calipers on the top-view
// convex hull). None of them excludes appendages.
//
// Invariants: `rotation` is orthonormal and right-handed; `extent` holds full side lengths along
// its columns; all boxes are in the coordinates of the input points.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <vector>

#include "tightfit/core/error.hpp"
#include "tightfit/geometry/pca.hpp"
#include "tightfit/geometry/point_cloud.hpp"

namespace tightfit::geometry {

/// A box: centre, axes (columns of `rotation`) and full side lengths along them.
struct oriented_box {
  point3 centre = point3::Zero();
  Eigen::Matrix3d rotation = Eigen::Matrix3d::Identity();
  Eigen::Vector3d extent = Eigen::Vector3d::Zero();

  /// Side lengths sorted L >= W >= H.
  std::array<double, 3> sorted_dims() const {
    std::array<double, 3> d{extent[0], extent[1], extent[2]};
    std::sort(d.begin(), d.end(), std::greater<>());
    return d;
  }
  double volume() const { return extent.prod(); }
  /// Whether `p` lies inside the box grown by `tol` on every side.
  bool contains(const point3& p, double tol = 0) const {
    const Eigen::Vector3d u = rotation.transpose() * (p - centre);
    return (u.cwiseAbs().array() <= (extent / 2).array() + tol).all();
  }
};

/// The box with axes `rotation` holding every point (extremes along each axis).
inline oriented_box extremes_box(const points& p, const Eigen::Matrix3d& rotation) {
  check(!p.empty(), "extremes_box: the cloud is empty, expected at least 1 point");
  Eigen::Vector3d lo = Eigen::Vector3d::Constant(INFINITY), hi = -lo;
  for (const auto& q : p) {
    const Eigen::Vector3d u = rotation.transpose() * q;
    lo = lo.cwiseMin(u), hi = hi.cwiseMax(u);
  }
  oriented_box b;
  b.rotation = rotation;
  b.extent = hi - lo;
  b.centre = rotation * ((lo + hi) / 2);
  return b;
}

/// Per-axis [q, 1-q] quantile box with axes `rotation` (q in [0, 0.5)).
inline oriented_box quantile_box(const points& p, const Eigen::Matrix3d& rotation, double q) {
  check(!p.empty(), "quantile_box: the cloud is empty, expected at least 1 point");
  check(q >= 0 && q < 0.5, "quantile_box: quantile is ", q, ", expected in [0, 0.5)");
  Eigen::Vector3d lo, hi;
  std::vector<double> v(p.size());
  for (int a = 0; a < 3; ++a) {
    for (std::size_t i = 0; i < p.size(); ++i) v[i] = rotation.col(a).dot(p[i]);
    const auto n = static_cast<double>(v.size() - 1);
    auto k0 = static_cast<std::ptrdiff_t>(std::floor(q * n));
    auto k1 = static_cast<std::ptrdiff_t>(std::ceil((1 - q) * n));
    std::nth_element(v.begin(), v.begin() + k0, v.end());
    lo[a] = v[static_cast<std::size_t>(k0)];
    std::nth_element(v.begin(), v.begin() + k1, v.end());
    hi[a] = v[static_cast<std::size_t>(k1)];
  }
  oriented_box b;
  b.rotation = rotation;
  b.extent = hi - lo;
  b.centre = rotation * ((lo + hi) / 2);
  return b;
}

/// Axis-aligned bounding box.
inline oriented_box aabb(const points& p) {
  return extremes_box(p, Eigen::Matrix3d::Identity());
}

/// PCA oriented box: extremes in the frame of the principal axes (full 3D).
inline oriented_box pca_box(const points& p) {
  return extremes_box(p, pca(p).axes);
}

/// Percentile-trimmed box in the PCA frame: per axis the [q, 1-q] quantiles (q = 0.02: 2/98).
inline oriented_box trimmed_box(const points& p, double q = 0.02) {
  return quantile_box(p, pca(p).axes, q);
}

/// Belt setting (z up, belt at z = 0): yaw from the top-view PCA, bottom on the belt.
inline oriented_box pca_box_belt(const points& p) {
  oriented_box b = extremes_box(p, rot_z(pca_yaw(p).yaw));
  const double top = b.centre.z() + b.extent[2] / 2;
  b.extent[2] = std::max(top, 0.0);
  b.centre.z() = b.extent[2] / 2;
  return b;
}

/// Belt setting: percentile-trimmed box in the top-view PCA frame, bottom on the belt.
inline oriented_box trimmed_box_belt(const points& p, double q = 0.02) {
  oriented_box b = quantile_box(p, rot_z(pca_yaw(p).yaw), q);
  const double top = b.centre.z() + b.extent[2] / 2;
  b.extent[2] = std::max(top, 0.0);
  b.centre.z() = b.extent[2] / 2;
  return b;
}

/// Belt setting: axis-aligned box with the bottom on the belt.
inline oriented_box aabb_belt(const points& p) {
  oriented_box b = aabb(p);
  const double top = b.centre.z() + b.extent[2] / 2;
  b.extent[2] = std::max(top, 0.0);
  b.centre.z() = b.extent[2] / 2;
  return b;
}

/// Belt setting: the minimum-area rectangle around the top-view convex hull (rotating calipers),
/// bottom on the belt: the minimum-volume box among boxes standing on the belt.
inline oriented_box min_area_box_belt(const points& p) {
  check(!p.empty(), "min_area_box_belt: the cloud is empty, expected at least 1 point");
  std::vector<Eigen::Vector2d> v(p.size());
  for (std::size_t i = 0; i < p.size(); ++i) v[i] = p[i].head<2>();
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) {
    return a.x() < b.x() || (a.x() == b.x() && a.y() < b.y());
  });
  auto cross = [](const Eigen::Vector2d& o, const Eigen::Vector2d& a, const Eigen::Vector2d& b) {
    return (a - o).x() * (b - o).y() - (a - o).y() * (b - o).x();
  };
  std::vector<Eigen::Vector2d> h(2 * v.size());
  std::size_t k = 0;
  for (std::size_t i = 0; i < v.size(); ++i) {  // Andrew's monotone chain
    while (k >= 2 && cross(h[k - 2], h[k - 1], v[i]) <= 0) --k;
    h[k++] = v[i];
  }
  for (std::size_t i = v.size() - 1, t = k + 1; i-- > 0;) {
    while (k >= t && cross(h[k - 2], h[k - 1], v[i]) <= 0) --k;
    h[k++] = v[i];
  }
  h.resize(k > 1 ? k - 1 : k);
  double best_area = INFINITY, best_yaw = 0;
  for (std::size_t i = 0; i < h.size(); ++i) {
    const Eigen::Vector2d e = h[(i + 1) % h.size()] - h[i];
    if (e.norm() == 0) continue;
    const double yaw = std::atan2(e.y(), e.x());
    const double c = std::cos(yaw), s = std::sin(yaw);
    double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
    for (const auto& q : h) {
      const double u = c * q.x() + s * q.y(), w = -s * q.x() + c * q.y();
      x0 = std::min(x0, u), x1 = std::max(x1, u), y0 = std::min(y0, w), y1 = std::max(y1, w);
    }
    if ((x1 - x0) * (y1 - y0) < best_area) best_area = (x1 - x0) * (y1 - y0), best_yaw = yaw;
  }
  oriented_box b = extremes_box(p, rot_z(best_yaw));
  const double top = b.centre.z() + b.extent[2] / 2;
  b.extent[2] = std::max(top, 0.0);
  b.centre.z() = b.extent[2] / 2;
  return b;
}

}  // namespace tightfit::geometry
