// tightfit/geometry/silhouette.hpp: what a camera above sees of a rounded box's side walls
// (docs/mebb.md, "The silhouette offset").
//
// A camera above the belt sees a side wall that faces away from it only through the rounded top
// edge, down to where its ray grazes that edge. With the ray tilted outward by alpha from the
// vertical and an edge of radius r, that silhouette lies r (1 - cos alpha) inside the wall. Both
// are measured on the scan itself, with no camera model:
// - tan alpha from the belt's shadow behind the face: the grazing ray meets the belt
//   (top - r) tan alpha past the face, and the belt between is hidden (shadow_tilt);
// - r from the top view of the four corners, which a camera above sees whole (corner_radius).
// Invariants: both depend on the points only through order-free statistics (minima per bin,
// medians, the third smallest value of a set without duplicates), so neither changes with the
// order of the points.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <optional>
#include <vector>

#include "tightfit/geometry/point_cloud.hpp"

namespace tightfit::geometry {

/// A top-view occupancy raster of the belt's points around an object (belt frame, belt z = 0).
struct belt_raster {
  double x0 = 0, y0 = 0, cell = 0;  ///< lower corner and cell size
  index_t nx = 0, ny = 0;
  std::vector<std::uint8_t> hit;  // (nx * ny), row-major in x: 1 where a belt point fell

  bool empty() const { return hit.empty(); }
  /// whether a belt point fell in the cell holding (x, y) (false outside the raster)
  bool at(double x, double y) const {
    const double fx = std::floor((x - x0) / cell), fy = std::floor((y - y0) / cell);
    if (!(fx >= 0 && fy >= 0 && fx < static_cast<double>(nx) && fy < static_cast<double>(ny)))
      return false;
    return hit[static_cast<std::size_t>(static_cast<index_t>(fx) * ny +
                                        static_cast<index_t>(fy))] != 0;
  }
};

/// The belt raster (cell `cell`) of the points of `cloud` mapped by `to_frame` into the belt frame
/// that lie within `cut` of the belt plane and within reach_tan x the object's height + `margin`
/// of the top-view bounds of `object` (belt frame). Empty when `object` is, or when the raster
/// would exceed max_cells (an object tens of metres across: no silhouette offset then).
template <PointCloud C, class Map>
belt_raster belt_raster_near(const C& cloud, const Map& to_frame, const points& object, double cut,
                             double reach_tan, double margin, double cell,
                             double max_cells = 16.0 * 1024 * 1024) {
  belt_raster r;
  if (object.empty()) return r;
  Eigen::Vector3d lo = object.front(), hi = lo;
  for (const auto& x : object) lo = lo.cwiseMin(x), hi = hi.cwiseMax(x);
  const double reach = reach_tan * std::max(hi.z(), 0.0) + margin;
  const double cells_x = std::ceil((hi.x() - lo.x() + 2 * reach) / cell) + 1;
  const double cells_y = std::ceil((hi.y() - lo.y() + 2 * reach) / cell) + 1;
  if (!(cells_x * cells_y <= max_cells)) return r;
  r.cell = cell;
  r.x0 = lo.x() - reach, r.y0 = lo.y() - reach;
  r.nx = static_cast<index_t>(cells_x), r.ny = static_cast<index_t>(cells_y);
  r.hit.assign(static_cast<std::size_t>(r.nx * r.ny), 0);
  const std::size_t n = cloud.kdtree_get_point_count();
  for (std::size_t i = 0; i < n; ++i) {
    const point3 u = to_frame(point_at(cloud, i));
    if (std::abs(u.z()) >= cut) continue;
    const double fx = std::floor((u.x() - r.x0) / cell), fy = std::floor((u.y() - r.y0) / cell);
    if (fx >= 0 && fy >= 0 && fx < static_cast<double>(r.nx) && fy < static_cast<double>(r.ny))
      r.hit[static_cast<std::size_t>(static_cast<index_t>(fx) * r.ny + static_cast<index_t>(fy))] =
          1;
  }
  return r;
}

/// tan of the camera ray's outward tilt at the side face (a, s) of a box on the belt (a: 0 or 1,
/// the face at s u_a = d; box frame u = axes^T (x - origin), box [lo, hi] with the belt at
/// u_z = 0 and the top at hi.z()), from the belt's shadow behind it: in g-bins over the middle
/// 70 % of the face, the gap between the face and the first belt cell past it (walked in steps of
/// half a cell, on lines one cell apart, up to `reach_tan` x the edge height); the median gap
/// over the bins that find one, over the height of the grazed edge (top - radius). Nothing when
/// fewer than 3 bins or a third of them find the belt (it ends there, or the frame does).
inline std::optional<double> shadow_tilt(const belt_raster& belt, const Eigen::Matrix3d& axes,
                                         const point3& origin, const Eigen::Vector3d& lo,
                                         const Eigen::Vector3d& hi, int a, double s, double radius,
                                         double g, double reach_tan) {
  if (belt.empty()) return std::nullopt;
  const int b = 1 - a;
  const double d = s > 0 ? hi[a] : -lo[a], span = hi[b] - lo[b];
  const double b0 = lo[b] + 0.15 * span, b1 = hi[b] - 0.15 * span;
  const double height = std::max(hi.z() - radius, hi.z() / 2);
  if (b1 <= b0 || height <= 0) return std::nullopt;
  const double reach = reach_tan * height, step = belt.cell / 2;
  const auto nb = std::clamp<index_t>(static_cast<index_t>((b1 - b0) / g), 1, 4000);
  const auto lines = std::max<index_t>(1, static_cast<index_t>(std::ceil(g / belt.cell)));
  const point3 out = s * axes.col(a), along = axes.col(b);
  const point3 base = origin + d * out;  // the face's foot at u_b = 0
  std::vector<double> gaps;
  for (index_t k = 0; k < nb; ++k) {
    double best = INFINITY;
    for (index_t l = 0; l < lines; ++l) {
      const double ub = b0 + (static_cast<double>(k) +
                              (static_cast<double>(l) + 0.5) / static_cast<double>(lines)) *
                                 (b1 - b0) / static_cast<double>(nb);
      const point3 foot = base + ub * along;
      for (double t = 0; t <= std::min(reach, best); t += step)
        if (belt.at(foot.x() + t * out.x(), foot.y() + t * out.y())) {
          best = t;
          break;
        }
    }
    if (best < INFINITY) gaps.push_back(best);
  }
  if (gaps.size() < 3 || 3 * static_cast<index_t>(gaps.size()) < nb) return std::nullopt;
  const auto mid = gaps.begin() + static_cast<std::ptrdiff_t>(gaps.size() / 2);
  std::nth_element(gaps.begin(), mid, gaps.end());
  return *mid / height;
}

/// The edge radius of a box on the belt from the top view of its four corners (box frame, box
/// [lo, hi]; `u` the sensor points, without duplicates; within `reach` of the top and at most
/// `reach`). Each corner's two face lines are measured locally, on the straight runs next to it
/// (the median over g-bins of the outermost point, at reach to 2 reach from the corner), so that a
/// face held out elsewhere does not enter. A corner rounded with radius r crosses the diagonal
/// (sqrt(2) - 1) r inside the corner of those lines: r = w / (sqrt(2) - 1), with w the third
/// smallest diagonal depth (t_a + t_b) / sqrt(2) of the points within 2 pitches of the diagonal
/// (t: the depth inside each line). The median over the corners measured (at least 5 points on
/// the diagonal and 3 bins on each run), or nothing when fewer than two are. `eps`: how far
/// above the top a point may lie.
inline std::optional<double> corner_radius(const points& u, const Eigen::Vector3d& lo,
                                           const Eigen::Vector3d& hi, double pitch, double g,
                                           double eps, double reach) {
  const double strip = 2 * pitch;
  auto in_top = [&](const point3& p) { return p.z() >= hi.z() - reach && p.z() <= hi.z() + eps; };
  // the line of face (a, s) next to the corner on side sb of axis b: the median over g-bins at
  // [reach, 2 reach] (at most half the face's span) from face (b, sb) of the outermost point
  auto local_line = [&](int a, double s, double sb) -> std::optional<double> {
    const int b = 1 - a;
    const double edge = sb > 0 ? hi[b] : -lo[b];
    const double t0 = reach, t1 = std::min(2 * reach, (hi[b] - lo[b]) / 2);
    if (t1 - t0 < 3 * g) return std::nullopt;
    const auto nb = static_cast<index_t>((t1 - t0) / g);
    std::vector<double> env(static_cast<std::size_t>(nb), -INFINITY);
    for (const auto& p : u) {
      const double t = edge - sb * p[b];
      if (t < t0 || t >= t1 || s * p[a] < s * (lo[a] + hi[a]) / 2 || !in_top(p)) continue;
      double& e = env[static_cast<std::size_t>(
          std::min<index_t>(static_cast<index_t>((t - t0) / g), nb - 1))];
      e = std::max(e, s * p[a]);
    }
    std::vector<double> seen;
    for (double e : env)
      if (e > -INFINITY) seen.push_back(e);
    if (seen.size() < 3) return std::nullopt;
    const auto mid = seen.begin() + static_cast<std::ptrdiff_t>(seen.size() / 2);
    std::nth_element(seen.begin(), mid, seen.end());
    return *mid;
  };
  std::vector<double> radii, w;
  for (double sx : {1.0, -1.0})
    for (double sy : {1.0, -1.0}) {
      const auto lx = local_line(0, sx, sy), ly = local_line(1, sy, sx);
      if (!lx || !ly) continue;
      w.clear();
      for (const auto& p : u) {
        const double tx = *lx - sx * p.x(), ty = *ly - sy * p.y();
        if (tx < -strip || ty < -strip || tx > reach || ty > reach || std::abs(tx - ty) > strip ||
            !in_top(p))
          continue;
        w.push_back((tx + ty) / std::numbers::sqrt2);
      }
      if (w.size() < 5) continue;
      std::nth_element(w.begin(), w.begin() + 2, w.end());
      radii.push_back(std::clamp(w[2] / (std::numbers::sqrt2 - 1), 0.0, reach));
    }
  if (radii.size() < 2) return std::nullopt;
  std::sort(radii.begin(), radii.end());
  const std::size_t m = radii.size();
  return m % 2 ? radii[m / 2] : (radii[m / 2 - 1] + radii[m / 2]) / 2;
}

}  // namespace tightfit::geometry
