// tightfit/geometry/plane.hpp: the belt plane (RANSAC fit or given) and the belt frame.
//
// The belt frame has its origin on the plane, +z along the plane's normal (up, towards the
// object) and +x along the input's x axis projected onto the plane, so a yaw in the belt frame
// reads like a yaw in the input. RANSAC is seeded: the same cloud gives the same plane.
#pragma once

#include <Eigen/Geometry>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <random>
#include <vector>

#include "tightfit/core/error.hpp"
#include "tightfit/geometry/pca.hpp"
#include "tightfit/geometry/point_cloud.hpp"

namespace tightfit::geometry {

/// The plane {p : normal . p = offset}; |normal| = 1 and normal points up (towards the object).
struct plane {
  point3 normal = point3::UnitZ();
  double offset = 0;
  double distance(const point3& p) const { return normal.dot(p) - offset; }
};

/// A rigid transform p -> rotation * p + translation.
struct rigid_transform {
  Eigen::Matrix3d rotation = Eigen::Matrix3d::Identity();
  point3 translation = point3::Zero();
  point3 apply(const point3& p) const { return rotation * p + translation; }
  rigid_transform inverse() const {
    return {rotation.transpose(), -(rotation.transpose() * translation)};
  }
};

/// The transform from input coordinates to the belt frame of `belt` (z = height above it).
inline rigid_transform belt_frame(const plane& belt) {
  const point3 n = belt.normal.normalized();
  point3 ex = point3::UnitX() - point3::UnitX().dot(n) * n;
  if (ex.norm() < 1e-6) ex = point3::UnitY() - point3::UnitY().dot(n) * n;
  ex.normalize();
  const point3 ey = n.cross(ex);
  rigid_transform t;
  t.rotation.row(0) = ex.transpose();
  t.rotation.row(1) = ey.transpose();
  t.rotation.row(2) = n.transpose();
  t.translation = -(t.rotation * (belt.offset * n));
  return t;
}

/// A RANSAC plane fit: the plane, its inlier share and the RMS distance of its inliers.
struct plane_fit {
  plane fitted;
  double inlier_share = 0;
  double rms = 0;
};

/// RANSAC plane (threshold in the cloud's units), refined by least squares on its inliers; the
/// normal is oriented towards the side holding more of the other points. Scoring, refinement,
/// inlier share and RMS use a fixed random subsample of at most 20000 points.
inline plane_fit fit_plane_ransac(const points& p, double threshold = 0.005, int iterations = 300,
                                  std::uint64_t seed = 1) {
  check(p.size() >= 3, "fit_plane_ransac: the cloud has ", p.size(), " points, expected >= 3");
  check(threshold > 0, "fit_plane_ransac: threshold is ", threshold, ", expected > 0");
  std::mt19937_64 gen(seed);
  // score on a fixed subsample (at most 20000 points) for speed
  std::vector<std::size_t> sub(p.size());
  for (std::size_t i = 0; i < sub.size(); ++i) sub[i] = i;
  if (sub.size() > 20000) {
    std::shuffle(sub.begin(), sub.end(), gen);
    sub.resize(20000);
  }
  std::uniform_int_distribution<std::size_t> pick(0, p.size() - 1);
  plane best;
  std::size_t best_count = 0;
  for (int it = 0; it < iterations; ++it) {
    const point3 a = p[pick(gen)], b = p[pick(gen)], c = p[pick(gen)];
    point3 n = (b - a).cross(c - a);
    if (n.norm() < 1e-12) continue;
    n.normalize();
    const double off = n.dot(a);
    std::size_t count = 0;
    for (auto i : sub) count += std::abs(n.dot(p[i]) - off) < threshold;
    if (count > best_count) best_count = count, best = {n, off};
  }
  check(best_count > 0, "fit_plane_ransac: all ", p.size(),
        " points are collinear, expected a plane");
  points in;  // refine and score on the subsample (at most 20000 points: plenty for 4 numbers)
  for (auto i : sub)
    if (std::abs(best.distance(p[i])) < threshold) in.push_back(p[i]);
  if (in.size() >= 3) {
    const pca_frame f = pca(in);
    best.normal = f.axes.col(2).normalized();
    best.offset = best.normal.dot(f.mean);
  }
  std::size_t above = 0, below = 0;
  double ss = 0;
  std::size_t nin = 0;
  for (auto i : sub) {
    const double d = best.distance(p[i]);
    if (std::abs(d) < threshold) {
      ss += d * d, ++nin;
    } else {
      (d > 0 ? above : below) += 1;
    }
  }
  if (below > above) best.normal = -best.normal, best.offset = -best.offset;
  plane_fit out;
  out.fitted = best;
  out.inlier_share = static_cast<double>(nin) / static_cast<double>(sub.size());
  out.rms = nin ? std::sqrt(ss / static_cast<double>(nin)) : 0.0;
  return out;
}

/// Looks for a belt under the object: the dominant RANSAC plane is accepted as the belt when it
/// holds >= `min_share` of the points, almost all other points lie above it, and at least half of
/// its inliers lie outside the top-view bounding box of the points above it (a belt shows around
/// the object; an object's own flat top does not extend beyond the object).
inline std::optional<plane_fit> detect_belt(const points& p, double threshold = 0.005,
                                            double min_share = 0.1) {
  if (p.size() < 50) return std::nullopt;
  plane_fit f = fit_plane_ransac(p, threshold);
  if (f.inlier_share < min_share) return std::nullopt;
  const rigid_transform t = belt_frame(f.fitted);
  const std::size_t stride = std::max<std::size_t>(1, p.size() / 50000);  // statistics on <= 50k
  Eigen::Vector2d olo = Eigen::Vector2d::Constant(INFINITY), ohi = -olo;
  std::size_t above = 0, below = 0;
  for (std::size_t i = 0; i < p.size(); i += stride) {
    const point3 u = t.apply(p[i]);
    if (u.z() > 3 * threshold) {
      ++above;
      olo = olo.cwiseMin(u.head<2>()), ohi = ohi.cwiseMax(u.head<2>());
    } else if (u.z() < -3 * threshold) {
      ++below;
    }
  }
  if (above == 0 || static_cast<double>(below) > 0.05 * static_cast<double>(above))
    return std::nullopt;
  const double margin = 4 * threshold;
  std::size_t inliers = 0, outside = 0;
  for (std::size_t i = 0; i < p.size(); i += stride) {
    const point3 u = t.apply(p[i]);
    if (std::abs(u.z()) >= threshold) continue;
    ++inliers;
    outside += (u.head<2>().array() < olo.array() - margin).any() ||
               (u.head<2>().array() > ohi.array() + margin).any();
  }
  if (2 * outside < inliers) return std::nullopt;
  return f;
}

}  // namespace tightfit::geometry
