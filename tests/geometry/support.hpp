// Helpers for the geometry tests: sampled box surfaces, random rigid motions, temp files.
#pragma once

#include <Eigen/Geometry>
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <numbers>
#include <random>
#include <string>

#include "tightfit/geometry/box.hpp"
#include "tightfit/geometry/point_cloud.hpp"

namespace tightfit::geometry::test {

/// A uniformly random rotation from a seeded generator.
inline Eigen::Matrix3d random_rotation(std::mt19937_64& gen) {
  std::uniform_real_distribution<double> u(0, 1);
  const double u1 = u(gen), u2 = 2 * std::numbers::pi * u(gen), u3 = 2 * std::numbers::pi * u(gen);
  const Eigen::Quaterniond q(std::sqrt(u1) * std::cos(u3), std::sqrt(1 - u1) * std::sin(u2),
                             std::sqrt(1 - u1) * std::cos(u2), std::sqrt(u1) * std::sin(u3));
  return q.normalized().toRotationMatrix();
}

/// `n` points uniformly on the surface of a sharp box (area-weighted faces), with Gaussian noise
/// `sigma` along the face normal; `skip_bottom` leaves out the -z face (a box on a belt).
inline points box_surface(const oriented_box& b, std::size_t n, double sigma, std::uint64_t seed,
                          bool skip_bottom = false) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> u(-0.5, 0.5);
  std::normal_distribution<double> noise(0, sigma > 0 ? sigma : 1);
  const Eigen::Vector3d e = b.extent;
  const double areas[3] = {e[1] * e[2], e[0] * e[2], e[0] * e[1]};
  const double total = 2 * (areas[0] + areas[1] + areas[2]);
  std::uniform_real_distribution<double> pick(0, total);
  points out;
  while (out.size() < n) {
    double r = pick(gen);
    int face = 0;
    while (face < 5 && r >= areas[face / 2]) r -= areas[face / 2], ++face;
    const int a = face / 2;
    const double s = face % 2 ? -0.5 : 0.5;
    if (skip_bottom && a == 2 && s < 0) continue;
    Eigen::Vector3d q(u(gen) * e[0], u(gen) * e[1], u(gen) * e[2]);
    q[a] = s * e[a] + (sigma > 0 ? noise(gen) : 0.0);
    out.push_back(b.centre + b.rotation * q);
  }
  return out;
}

/// Stratified points over every face of a sharp box: one point jittered uniformly inside each
/// cell of a `spacing` grid (no moire against the voxel grid, far less sampling noise in the
/// PCA axes than i.i.d. points); `skip_bottom` leaves out the -z face.
inline points box_grid_surface(const oriented_box& b, double spacing, bool skip_bottom = false,
                               std::uint64_t seed = 1) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> jitter(0, 1);
  points out;
  const Eigen::Vector3d e = b.extent;
  for (int face = 0; face < 6; ++face) {
    const int a = face / 2, u = (a + 1) % 3, v = (a + 2) % 3;
    const double s = face % 2 ? -0.5 : 0.5;
    if (skip_bottom && a == 2 && s < 0) continue;
    const int nu = static_cast<int>(e[u] / spacing), nv = static_cast<int>(e[v] / spacing);
    for (int i = 0; i < nu; ++i)
      for (int j = 0; j < nv; ++j) {
        Eigen::Vector3d q;
        q[a] = s * e[a];
        q[u] = ((i + jitter(gen)) / nu - 0.5) * e[u];
        q[v] = ((j + jitter(gen)) / nv - 0.5) * e[v];
        out.push_back(b.centre + b.rotation * q);
      }
  }
  return out;
}

/// A fresh path in the temp directory.
inline std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("tightfit_geometry_" + name)).string();
}

/// The largest difference between two sorted L, W, H triples (a box's error against the truth).
inline double max_error(const std::array<double, 3>& got, const std::array<double, 3>& want) {
  double e = 0;
  for (std::size_t k = 0; k < 3; ++k) e = std::max(e, std::abs(got[k] - want[k]));
  return e;
}

}  // namespace tightfit::geometry::test
