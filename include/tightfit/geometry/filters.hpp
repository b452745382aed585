// tightfit/geometry/filters.hpp: voxel-grid downsampling, statistical outlier removal and
// Euclidean clustering (kd-tree radius search), the cleaning steps of MEBB (ALGORITHMS.md 3,
// steps 0 and 1).
//
// Invariants: every function returns a new cloud (or index list) and leaves its input alone;
// results are deterministic (no dependence on hash order or thread count).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <utility>
#include <vector>

#include "tightfit/core/error.hpp"
#include "tightfit/geometry/kdtree.hpp"
#include "tightfit/geometry/point_cloud.hpp"

namespace tightfit::geometry {

/// One centroid per occupied cube of side `h`, so every unit of surface carries the same weight
/// whatever the range or viewing angle. Output order: by voxel key (deterministic).
/// With `voxel_of`, also returns for every input point the index of its output centroid.
inline points voxel_downsample(const points& in, double h,
                               std::vector<std::uint32_t>* voxel_of = nullptr) {
  check(h > 0 && std::isfinite(h), "voxel_downsample: voxel size is ", h, ", expected > 0");
  if (in.empty()) return {};
  point3 lo = in[0];
  for (const auto& p : in) lo = lo.cwiseMin(p);
  const double inv = 1.0 / h;
  std::vector<std::pair<std::uint64_t, std::uint32_t>> keys(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    const auto ix = static_cast<std::uint64_t>((in[i].x() - lo.x()) * inv);
    const auto iy = static_cast<std::uint64_t>((in[i].y() - lo.y()) * inv);
    const auto iz = static_cast<std::uint64_t>((in[i].z() - lo.z()) * inv);
    check(ix < (1u << 21) && iy < (1u << 21) && iz < (1u << 21),
          "voxel_downsample: the cloud spans ", (std::max({ix, iy, iz}) + 1), " voxels of ", h,
          ", expected at most 2^21 per axis");
    keys[i] = {(ix << 42) | (iy << 21) | iz, static_cast<std::uint32_t>(i)};
  }
  std::sort(keys.begin(), keys.end());
  points out;
  if (voxel_of) voxel_of->assign(in.size(), 0);
  std::size_t i = 0;
  while (i < keys.size()) {
    std::size_t j = i;
    point3 sum = point3::Zero();
    while (j < keys.size() && keys[j].first == keys[i].first) {
      if (voxel_of) (*voxel_of)[keys[j].second] = static_cast<std::uint32_t>(out.size());
      sum += in[keys[j++].second];
    }
    out.push_back(sum / static_cast<double>(j - i));
    i = j;
  }
  return out;
}

namespace detail {
// A uniform grid over a cloud: points sorted by cell, cells sorted by key, for fixed-radius
// neighbour queries (exact: every point within `cell` of a query lies in the 27 cells around it).
class cell_grid {
 public:
  cell_grid(const points& p, double cell) : cell_(cell) {
    lo_ = p.empty() ? point3::Zero() : p[0];
    for (const auto& q : p) lo_ = lo_.cwiseMin(q);
    lo_.array() -= cell;  // keeps every neighbour coordinate non-negative
    std::vector<std::pair<std::uint64_t, std::uint32_t>> keys(p.size());
    for (std::size_t i = 0; i < p.size(); ++i)
      keys[i] = {key_of(p[i]), static_cast<std::uint32_t>(i)};
    std::sort(keys.begin(), keys.end());
    order_.resize(p.size());
    for (std::size_t i = 0; i < keys.size(); ++i) {
      order_[i] = keys[i].second;
      if (i == 0 || keys[i].first != keys[i - 1].first) {
        cell_keys_.push_back(keys[i].first);
        cell_begin_.push_back(i);
      }
    }
    cell_begin_.push_back(keys.size());
  }
  std::uint64_t key_of(const point3& q) const {
    const point3 c = (q - lo_) / cell_;
    return pack(static_cast<std::uint64_t>(c.x()), static_cast<std::uint64_t>(c.y()),
                static_cast<std::uint64_t>(c.z()));
  }
  static std::uint64_t pack(std::uint64_t x, std::uint64_t y, std::uint64_t z) {
    return (x << 42) | (y << 21) | z;
  }
  std::size_t cells() const { return cell_keys_.size(); }
  // points of cell c: order_[cell_begin_[c] .. cell_begin_[c+1])
  const std::vector<std::uint32_t>& order() const { return order_; }
  std::size_t begin(std::size_t c) const { return cell_begin_[c]; }
  std::size_t end(std::size_t c) const { return cell_begin_[c + 1]; }
  // the indices of the (up to 27) occupied cells around cell c, into out
  void neighbours(std::size_t c, std::vector<std::size_t>& out) const {
    out.clear();
    const std::uint64_t k = cell_keys_[c], m = (1u << 21) - 1;
    const std::uint64_t x = k >> 42, y = (k >> 21) & m, z = k & m;
    for (std::uint64_t dx = 0; dx < 3; ++dx)
      for (std::uint64_t dy = 0; dy < 3; ++dy)
        for (std::uint64_t dz = 0; dz < 3; ++dz) {
          const std::uint64_t nk = pack(x + dx - 1, y + dy - 1, z + dz - 1);
          auto it = std::lower_bound(cell_keys_.begin(), cell_keys_.end(), nk);
          if (it != cell_keys_.end() && *it == nk)
            out.push_back(static_cast<std::size_t>(it - cell_keys_.begin()));
        }
  }

 private:
  double cell_;
  point3 lo_;
  std::vector<std::uint32_t> order_;
  std::vector<std::uint64_t> cell_keys_;
  std::vector<std::size_t> cell_begin_;
};

inline bool grid_fits(const points& p, double cell) {
  if (p.empty()) return true;
  point3 lo = p[0], hi = p[0];
  for (const auto& q : p) lo = lo.cwiseMin(q), hi = hi.cwiseMax(q);
  return ((hi - lo) / cell).maxCoeff() < static_cast<double>((1u << 21) - 4);
}
}  // namespace detail

/// Statistical outlier removal: drops the points whose mean distance to their k nearest
/// neighbours exceeds mu + n_sigma * sigma of that mean over the cloud (PCL's filter).
/// The keep mask of remove_statistical_outliers (1: kept).
inline std::vector<char> statistical_inliers(const points& in, int k = 8, double n_sigma = 2.0) {
  check(k >= 1, "statistical_inliers: k is ", k, ", expected >= 1");
  if (in.size() <= static_cast<std::size_t>(k)) return std::vector<char>(in.size(), 1);
  points_tree tree(in);
  const auto kk = static_cast<std::size_t>(k) + 1;  // the point itself comes first
  std::vector<std::size_t> idx(kk);
  std::vector<double> d2(kk);
  std::vector<double> mean(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    const std::size_t n = tree.knn(in[i], kk, idx.data(), d2.data());
    double s = 0;
    for (std::size_t j = 1; j < n; ++j) s += std::sqrt(d2[j]);
    mean[i] = n > 1 ? s / static_cast<double>(n - 1) : 0.0;
  }
  double mu = 0, var = 0;
  for (double m : mean) mu += m;
  mu /= static_cast<double>(mean.size());
  for (double m : mean) var += (m - mu) * (m - mu);
  const double limit = mu + n_sigma * std::sqrt(var / static_cast<double>(mean.size()));
  std::vector<char> keep(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) keep[i] = mean[i] <= limit;
  return keep;
}

/// Statistical outlier removal (see statistical_inliers).
inline points remove_statistical_outliers(const points& in, int k = 8, double n_sigma = 2.0) {
  const auto keep = statistical_inliers(in, k, n_sigma);
  points out;
  out.reserve(in.size());
  for (std::size_t i = 0; i < in.size(); ++i)
    if (keep[i]) out.push_back(in[i]);
  return out;
}

/// Euclidean clusters: connected components of the graph linking points closer than `radius`
/// (kd-tree radius search; above 1000 points the same graph is built through a uniform grid of
/// cell `radius`, which is faster for one fixed radius). Returns one index list per cluster,
/// largest first; within a cluster, indices ascend (grid) or follow the search (kd-tree).
inline std::vector<std::vector<std::size_t>> euclidean_clusters(const points& in, double radius) {
  check(radius > 0, "euclidean_clusters: radius is ", radius, ", expected > 0");
  std::vector<std::vector<std::size_t>> clusters;
  if (in.empty()) return clusters;
  if (in.size() > 1000 && detail::grid_fits(in, radius)) {
    // the same graph through a grid of cell = radius (all neighbours lie in the 27 cells around)
    const detail::cell_grid grid(in, radius);
    const auto& order = grid.order();
    std::vector<std::size_t> parent(in.size());
    std::iota(parent.begin(), parent.end(), std::size_t{0});
    auto find = [&](std::size_t x) {
      while (parent[x] != x) x = parent[x] = parent[parent[x]];
      return x;
    };
    const double r2 = radius * radius;
    std::vector<std::size_t> nb;
    for (std::size_t c = 0; c < grid.cells(); ++c) {
      grid.neighbours(c, nb);
      for (std::size_t n : nb) {
        if (n < c) continue;  // each pair of cells once
        for (std::size_t a = grid.begin(c); a < grid.end(c); ++a)
          for (std::size_t b = (n == c ? a + 1 : grid.begin(n)); b < grid.end(n); ++b) {
            const std::size_t i = order[a], j = order[b];
            std::size_t ri = find(i), rj = find(j);
            if (ri == rj || (in[i] - in[j]).squaredNorm() >= r2) continue;
            parent[std::max(ri, rj)] = std::min(ri, rj);
          }
      }
    }
    std::vector<std::size_t> label(in.size(), in.size());
    for (std::size_t i = 0; i < in.size(); ++i) {
      const std::size_t root = find(i);
      if (label[root] == in.size()) {
        label[root] = clusters.size();
        clusters.emplace_back();
      }
      clusters[label[root]].push_back(i);
    }
    std::stable_sort(clusters.begin(), clusters.end(),
                     [](const auto& a, const auto& b) { return a.size() > b.size(); });
    return clusters;
  }
  points_tree tree(in);
  std::vector<char> seen(in.size(), 0);
  std::vector<std::size_t> nb;
  for (std::size_t s = 0; s < in.size(); ++s) {
    if (seen[s]) continue;
    std::vector<std::size_t> c{s};
    seen[s] = 1;
    for (std::size_t q = 0; q < c.size(); ++q) {
      tree.radius(in[c[q]], radius, nb);
      for (std::size_t j : nb)
        if (!seen[j]) {
          seen[j] = 1;
          c.push_back(j);
        }
    }
    clusters.push_back(std::move(c));
  }
  std::stable_sort(clusters.begin(), clusters.end(),
                   [](const auto& a, const auto& b) { return a.size() > b.size(); });
  return clusters;
}

/// The points of the largest Euclidean cluster (see euclidean_clusters).
inline points largest_cluster(const points& in, double radius) {
  auto clusters = euclidean_clusters(in, radius);
  points out;
  if (clusters.empty()) return out;
  std::sort(clusters[0].begin(), clusters[0].end());
  out.reserve(clusters[0].size());
  for (std::size_t i : clusters[0]) out.push_back(in[i]);
  return out;
}

}  // namespace tightfit::geometry
