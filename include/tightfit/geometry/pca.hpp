// tightfit/geometry/pca.hpp: principal axes of a cloud (3D and top view) and the edge-direction
// yaw of a near-square footprint (docs/mebb.md, step 2).
//
// PCA yaw is unreliable when the footprint is near square (lambda1/lambda2 < 1.5); then the yaw is
// the peak of a histogram of straight-edge directions (mod 90 degrees) along the rasterised
// silhouette: silhouette cells whose neighbours within `radius` have a strongly elongated
// covariance vote for their direction.
#pragma once

#include <Eigen/Eigenvalues>
#include <Eigen/Geometry>
#include <algorithm>
#include <cmath>
#include <numbers>
#include <optional>
#include <vector>

#include "tightfit/core/error.hpp"
#include "tightfit/geometry/kdtree.hpp"
#include "tightfit/geometry/point_cloud.hpp"

namespace tightfit::geometry {

/// Principal axes: `axes` columns sorted by decreasing variance, right-handed.
struct pca_frame {
  point3 mean = point3::Zero();
  Eigen::Matrix3d axes = Eigen::Matrix3d::Identity();
  Eigen::Vector3d variance = Eigen::Vector3d::Zero();  // eigenvalues, decreasing
};

/// PCA of a non-empty cloud.
inline pca_frame pca(const points& p) {
  check(!p.empty(), "pca: the cloud is empty, expected at least 1 point");
  pca_frame f;
  for (const auto& q : p) f.mean += q;
  f.mean /= static_cast<double>(p.size());
  Eigen::Matrix3d cov = Eigen::Matrix3d::Zero();
  for (const auto& q : p) {
    const point3 d = q - f.mean;
    cov.noalias() += d * d.transpose();
  }
  cov /= static_cast<double>(p.size());
  Eigen::SelfAdjointEigenSolver<Eigen::Matrix3d> es(cov);
  for (int k = 0; k < 3; ++k) {  // Eigen sorts increasing
    f.axes.col(k) = es.eigenvectors().col(2 - k);
    f.variance[k] = std::max(0.0, es.eigenvalues()[2 - k]);
  }
  if (f.axes.determinant() < 0) f.axes.col(2) = -f.axes.col(2);
  return f;
}

/// Top-view principal direction: yaw (radians, in (-pi/2, pi/2]) of the main horizontal axis and
/// the ratio lambda1/lambda2 of the horizontal covariance (infinity for a line).
struct yaw_estimate {
  double yaw = 0;
  double ratio = 1;
};

inline yaw_estimate pca_yaw(const points& p) {
  check(!p.empty(), "pca_yaw: the cloud is empty, expected at least 1 point");
  double mx = 0, my = 0;
  for (const auto& q : p) mx += q.x(), my += q.y();
  mx /= static_cast<double>(p.size());
  my /= static_cast<double>(p.size());
  double sxx = 0, syy = 0, sxy = 0;
  for (const auto& q : p) {
    const double dx = q.x() - mx, dy = q.y() - my;
    sxx += dx * dx, syy += dy * dy, sxy += dx * dy;
  }
  const double tr = sxx + syy, det = sxx * syy - sxy * sxy;
  const double disc = std::sqrt(std::max(0.0, tr * tr / 4 - det));
  const double l1 = tr / 2 + disc, l2 = std::max(0.0, tr / 2 - disc);
  yaw_estimate e;
  e.yaw = 0.5 * std::atan2(2 * sxy, sxx - syy);
  e.ratio = l2 > 0 ? l1 / l2 : (l1 > 0 ? INFINITY : 1.0);
  return e;
}

/// Edge-direction yaw in [0, pi/2) of the top-view (x, y) silhouette of `p`, rasterised in cells
/// of `cell`; silhouette cells vote when the covariance of their silhouette neighbours within
/// `radius` has eigenvalue ratio >= `elongation`. Empty when no cell votes.
inline std::optional<double> edge_direction_yaw(const points& p, double cell = 0.005,
                                                double radius = 0.025, double elongation = 8.0) {
  check(cell > 0 && radius > cell, "edge_direction_yaw: cell is ", cell, " and radius ", radius,
        ", expected 0 < cell < radius");
  if (p.size() < 3) return std::nullopt;
  double x0 = p[0].x(), y0 = p[0].y(), x1 = x0, y1 = y0;
  for (const auto& q : p) {
    x0 = std::min(x0, q.x()), x1 = std::max(x1, q.x());
    y0 = std::min(y0, q.y()), y1 = std::max(y1, q.y());
  }
  const auto nx = static_cast<index_t>((x1 - x0) / cell) + 3;
  const auto ny = static_cast<index_t>((y1 - y0) / cell) + 3;
  if (nx * ny > 64 * 1024 * 1024) return std::nullopt;
  std::vector<char> occ(static_cast<std::size_t>(nx * ny), 0);
  auto at = [&](index_t i, index_t j) -> char& {
    return occ[static_cast<std::size_t>(j * nx + i)];
  };
  for (const auto& q : p)
    at(static_cast<index_t>((q.x() - x0) / cell) + 1,
       static_cast<index_t>((q.y() - y0) / cell) + 1) = 1;
  // close one-cell holes (dropout) so that they do not vote as edges
  std::vector<char> filled = occ;
  for (index_t j = 1; j + 1 < ny; ++j)
    for (index_t i = 1; i + 1 < nx; ++i)
      if (!at(i, j) && at(i - 1, j) + at(i + 1, j) + at(i, j - 1) + at(i, j + 1) >= 3)
        filled[static_cast<std::size_t>(j * nx + i)] = 1;
  occ.swap(filled);
  points edge;
  for (index_t j = 1; j + 1 < ny; ++j)
    for (index_t i = 1; i + 1 < nx; ++i)
      if (at(i, j) && !(at(i - 1, j) && at(i + 1, j) && at(i, j - 1) && at(i, j + 1)))
        edge.emplace_back(static_cast<double>(i) * cell, static_cast<double>(j) * cell, 0.0);
  if (edge.size() < 3) return std::nullopt;
  points_tree tree(edge);
  constexpr int bins = 90;
  std::vector<double> hist(bins, 0.0);
  std::vector<std::size_t> nb;
  const double quarter = std::numbers::pi / 2;
  for (const auto& e : edge) {
    tree.radius(e, radius, nb);
    if (nb.size() < 4) continue;
    double mx = 0, my = 0;
    for (auto k : nb) mx += edge[k].x(), my += edge[k].y();
    mx /= static_cast<double>(nb.size()), my /= static_cast<double>(nb.size());
    double sxx = 0, syy = 0, sxy = 0;
    for (auto k : nb) {
      const double dx = edge[k].x() - mx, dy = edge[k].y() - my;
      sxx += dx * dx, syy += dy * dy, sxy += dx * dy;
    }
    const double tr = sxx + syy, det = sxx * syy - sxy * sxy;
    const double disc = std::sqrt(std::max(0.0, tr * tr / 4 - det));
    const double l1 = tr / 2 + disc, l2 = std::max(1e-30, tr / 2 - disc);
    if (l1 / l2 < elongation) continue;
    double a = std::fmod(0.5 * std::atan2(2 * sxy, sxx - syy), quarter);
    if (a < 0) a += quarter;
    const auto b = static_cast<int>(a / quarter * bins) % bins;
    hist[static_cast<std::size_t>(b)] += 1;
  }
  int best = -1;
  double best_v = 0;
  for (int b = 0; b < bins; ++b) {  // smoothed circularly over +-2 bins
    double v = 0;
    for (int d = -2; d <= 2; ++d)
      v += hist[static_cast<std::size_t>((b + d + bins) % bins)] * (3 - std::abs(d));
    if (v > best_v) best_v = v, best = b;
  }
  if (best < 0) return std::nullopt;
  // refine: circular weighted mean of the peak bins (angle * 4 is 2 pi periodic)
  double c = 0, s = 0;
  for (int d = -2; d <= 2; ++d) {
    const int b = (best + d + bins) % bins;
    const double ang = (b + 0.5) / bins * quarter * 4;
    c += hist[static_cast<std::size_t>(b)] * std::cos(ang);
    s += hist[static_cast<std::size_t>(b)] * std::sin(ang);
  }
  double a = std::atan2(s, c) / 4;
  if (a < 0) a += quarter;
  return a;
}

/// Rotation about +z by `yaw` radians.
inline Eigen::Matrix3d rot_z(double yaw) {
  return Eigen::AngleAxisd(yaw, Eigen::Vector3d::UnitZ()).toRotationMatrix();
}

}  // namespace tightfit::geometry
