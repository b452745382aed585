// tightfit/geometry/filters.hpp: voxel-grid downsampling, statistical outlier removal (exact
// k-NN: a uniform grid, the kd-tree for the queries the grid cannot settle) and Euclidean
// clustering (the components of the radius graph, through a uniform grid or a kd-tree radius
// search), the cleaning steps of MEBB (docs/mebb.md, steps 0 and 1).
//
// Invariants: every function returns a new cloud (or index list) and leaves its input alone;
// results are deterministic (no dependence on hash order or thread count), and the grid paths
// give the same results as the kd-tree paths (tests compare both with brute force).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <utility>
#include <vector>

#include "tightfit/core/error.hpp"
#include "tightfit/core/parallel.hpp"
#include "tightfit/geometry/kdtree.hpp"
#include "tightfit/geometry/point_cloud.hpp"

namespace tightfit::geometry {

namespace detail {
// Order-independent voxel accumulation. Cells are cubes of side h on the lattice through
// `origin` (cell k spans [origin + k h, origin + (k+1) h) on each axis); each point adds its offset
// inside its cell as a 32-bit fixed-point fraction to integer sums, so a cell's centroid is
// bit-identical for any order of the points, and duplicating every point leaves it unchanged (2S /
// 2n = S / n).
struct voxel_accumulator {
  struct cell {
    std::uint64_t key = empty_key;
    std::uint64_t sum[3] = {0, 0, 0};
    std::uint64_t n = 0;
  };
  static constexpr std::uint64_t empty_key = ~std::uint64_t{0};
  static constexpr std::int64_t bias = 1048576;  // 2^20: lattice indices in (-2^20, 2^20)
  double h, inv;
  point3 origin = point3::Zero();
  std::vector<cell> table;  // (capacity) open addressing, linear probing
  std::size_t used = 0;
  std::uint64_t last_key = empty_key;  // scans come in raster order: the same cell repeats
  std::size_t last_slot = 0;

  explicit voxel_accumulator(double size, std::size_t expect = 1024,
                             const point3& at = point3::Zero())
      : h(size), inv(1.0 / size), origin(at) {
    check(size > 0 && std::isfinite(size), "voxel grid: voxel size is ", size, ", expected > 0");
    std::size_t cap = 64;
    while (cap < 2 * expect) cap *= 2;
    table.resize(cap);
  }
  // the lattice index of a coordinate; |index| < 2^20 so that three fit a 63-bit key
  std::int64_t index(double x) const {
    const double f = std::floor(x * inv);
    if (!(std::abs(f) < 1048575.0))
      fail("voxel grid: coordinate ", x, " lies ", f, " voxels of ", h,
           " from the origin, expected fewer than 2^20 (is the cloud in metres?)");
    return static_cast<std::int64_t>(f);
  }
  static std::int64_t unpack(std::uint64_t key, int a) {
    return static_cast<std::int64_t>((key >> (42 - 21 * a)) & ((1u << 21) - 1)) - bias;
  }
  // adds p; returns its slot in `table` (valid until the next rehash)
  std::size_t add(const point3& p) {
    std::int64_t k[3];
    std::uint64_t frac[3];
    for (int a = 0; a < 3; ++a) {
      const double x = p[a] - origin[a];
      k[a] = index(x);
      double f = (x - static_cast<double>(k[a]) * h) * inv;  // in [0, 1) up to rounding
      f = std::clamp(f, 0.0, 1.0);
      frac[a] = static_cast<std::uint64_t>(f * 4294967295.0);
    }
    const std::uint64_t key = (static_cast<std::uint64_t>(k[0] + bias) << 42) |
                              (static_cast<std::uint64_t>(k[1] + bias) << 21) |
                              static_cast<std::uint64_t>(k[2] + bias);
    std::size_t s = last_slot;
    if (key != last_key) {
      if (2 * (used + 1) > table.size()) grow();
      s = find_slot(key);
      if (table[s].key == empty_key) table[s].key = key, ++used;
      last_key = key, last_slot = s;
    }
    cell& c = table[s];
    for (int a = 0; a < 3; ++a) c.sum[a] += frac[a];
    ++c.n;
    return s;
  }
  std::size_t find_slot(std::uint64_t key) const {
    const std::size_t mask = table.size() - 1;
    // Fibonacci hashing: the top bits of the product depend on every bit of the key
    std::size_t s =
        static_cast<std::size_t>(((key ^ (key >> 29)) * 0x9E3779B97F4A7C15ull) >> 32) & mask;
    while (table[s].key != empty_key && table[s].key != key) s = (s + 1) & mask;
    return s;
  }
  void grow() {
    std::vector<cell> old(table.size() * 2);
    old.swap(table);
    last_key = empty_key;
    for (const cell& c : old)
      if (c.key != empty_key) table[find_slot(c.key)] = c;
  }
  point3 centroid(const cell& c) const {
    point3 out;
    const double n = static_cast<double>(c.n) * 4294967295.0;
    for (int a = 0; a < 3; ++a)
      out[a] = origin[a] +
               (static_cast<double>(unpack(c.key, a)) + static_cast<double>(c.sum[a]) / n) * h;
    return out;
  }
  // the occupied slots sorted by key (the canonical, order-independent cell order)
  std::vector<std::size_t> sorted_slots() const {
    // (key, slot) pairs sorted by key (keys are distinct): no indirection in the comparisons
    std::vector<std::pair<std::uint64_t, std::size_t>> ks;
    ks.reserve(used);
    for (std::size_t i = 0; i < table.size(); ++i)
      if (table[i].key != empty_key) ks.emplace_back(table[i].key, i);
    std::sort(ks.begin(), ks.end());
    std::vector<std::size_t> s(ks.size());
    for (std::size_t r = 0; r < ks.size(); ++r) s[r] = ks[r].second;
    return s;
  }
};
}  // namespace detail

/// One centroid per occupied cube of side `h` (the lattice starts at the cloud's minimum corner),
/// so every unit of surface carries the same weight whatever the range or viewing angle. Output
/// order: by voxel key. The centroids are bit-identical for any order of the input points and
/// with every point duplicated (integer fixed-point sums; the minimum corner does not depend on
/// the order either). With `voxel_of`, also returns for every input point the index of its
/// output centroid.
/// With `phase`, the lattice starts at the minimum corner minus phase x h on every axis.
inline points voxel_downsample(const points& in, double h,
                               std::vector<std::uint32_t>* voxel_of = nullptr, double phase = 0) {
  check(h > 0 && std::isfinite(h), "voxel_downsample: voxel size is ", h, ", expected > 0");
  if (in.empty()) return {};
  point3 lo = in[0];
  for (const auto& p : in) lo = lo.cwiseMin(p);
  lo.array() -= phase * h;
  detail::voxel_accumulator acc(h, in.size() / 8 + 16, lo);
  std::vector<std::uint64_t> key_of;
  if (voxel_of) key_of.resize(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    const std::size_t s = acc.add(in[i]);
    if (voxel_of) key_of[i] = acc.table[s].key;
  }
  const auto slots = acc.sorted_slots();
  points out(slots.size());
  for (std::size_t r = 0; r < slots.size(); ++r) out[r] = acc.centroid(acc.table[slots[r]]);
  if (voxel_of) {  // the rank of each point's cell: its slot (a hash look-up), then the slot's rank
    voxel_of->resize(in.size());
    std::vector<std::uint32_t> rank(acc.table.size());
    for (std::size_t r = 0; r < slots.size(); ++r) rank[slots[r]] = static_cast<std::uint32_t>(r);
    for (std::size_t i = 0; i < in.size(); ++i) (*voxel_of)[i] = rank[acc.find_slot(key_of[i])];
  }
  return out;
}

/// Mixed-pixel ("veil") filter for a cloud seen from above (belt frame, z up): keeps the points
/// whose top-view neighbourhood (the (2 radius + 1)^2 columns of side `cell` around theirs)
/// holds at least `share` times the median neighbourhood count. A depth camera sees every surface
/// as a dense sheet of pixels in the top view (a few per column), while mixed pixels at a depth
/// jump (interpolated between the edge of an object and the belt behind it) form sparse veils
/// along the camera rays: one point per image row, spread over the depth of the jump, so a
/// column holding a veil point holds just that one. Returns the keep mask (1: kept).
/// Independent of the order of the points.
inline std::vector<char> top_view_dense(const points& p, double cell, double share,
                                        int radius = 0) {
  std::vector<char> keep(p.size(), 1);
  if (p.empty() || share <= 0) return keep;
  // columns: flat index of (floor(x / cell), floor(y / cell)), counted in a sorted key list
  const double inv = 1.0 / cell;
  std::vector<std::uint64_t> key(p.size());
  for (std::size_t i = 0; i < p.size(); ++i) {
    const double fx = std::floor(p[i].x() * inv), fy = std::floor(p[i].y() * inv);
    if (!(std::abs(fx) < 1e9 && std::abs(fy) < 1e9)) return keep;  // absurd extent: no filter
    key[i] = (static_cast<std::uint64_t>(static_cast<std::int64_t>(fx) + (1ll << 31)) << 32) |
             static_cast<std::uint64_t>(static_cast<std::int64_t>(fy) + (1ll << 31));
  }
  std::vector<std::uint64_t> sorted = key;
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::uint64_t> cols;   // (m) distinct keys
  std::vector<std::uint32_t> count;  // (m) points per column
  for (std::size_t i = 0; i < sorted.size(); ++i) {
    if (cols.empty() || cols.back() != sorted[i]) cols.push_back(sorted[i]), count.push_back(0);
    ++count.back();
  }
  auto at = [&](std::uint64_t k) -> std::uint32_t {
    auto it = std::lower_bound(cols.begin(), cols.end(), k);
    return it != cols.end() && *it == k ? count[static_cast<std::size_t>(it - cols.begin())] : 0;
  };
  std::vector<double> window(cols.size());  // (m) 3 x 3 neighbourhood counts
  for (std::size_t c = 0; c < cols.size(); ++c) {
    double w = 0;
    const auto r = static_cast<std::uint64_t>(std::max(radius, 0));
    for (std::uint64_t dx = 0; dx <= 2 * r; ++dx)
      for (std::uint64_t dy = 0; dy <= 2 * r; ++dy)
        w += at(cols[c] + (dx << 32) + dy - (r << 32) - r);
    window[c] = w;
  }
  std::vector<double> per_point;  // the median over points (dense areas weigh by their points)
  per_point.reserve(cols.size());
  for (std::size_t c = 0; c < cols.size(); ++c)
    for (std::uint32_t k = 0; k < std::min<std::uint32_t>(count[c], 64); ++k)
      per_point.push_back(window[c]);
  const auto mid = static_cast<std::ptrdiff_t>(per_point.size() / 2);
  std::nth_element(per_point.begin(), per_point.begin() + mid, per_point.end());
  const double limit = share * per_point[static_cast<std::size_t>(mid)];
  for (std::size_t i = 0; i < p.size(); ++i) {
    const auto it = std::lower_bound(cols.begin(), cols.end(), key[i]);
    keep[i] = window[static_cast<std::size_t>(it - cols.begin())] >= limit;
  }
  return keep;
}

namespace detail {
// A uniform grid over a cloud: points sorted by cell, cells sorted by key, for fixed-radius
// neighbour queries (exact: every point within `cell` of a query lies in the 27 cells around it).
class cell_grid {
 public:
  // `margin`: how many cells around a cell neighbour lookups may reach (keeps every neighbour
  // coordinate non-negative)
  cell_grid(const points& p, double cell, int margin = 1) : cell_(cell) {
    lo_ = p.empty() ? point3::Zero() : p[0];
    for (const auto& q : p) lo_ = lo_.cwiseMin(q);
    lo_.array() -= margin * cell;
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
    // a hash of the cell keys (open addressing, at most half full) for find()
    std::size_t cap = 16;
    while (cap < 2 * cell_keys_.size()) cap *= 2;
    slot_.assign(cap, 0);
    for (std::size_t c = 0; c < cell_keys_.size(); ++c) {
      std::size_t h = hash(cell_keys_[c]) & (cap - 1);
      while (slot_[h] != 0) h = (h + 1) & (cap - 1);
      slot_[h] = static_cast<std::uint32_t>(c + 1);
    }
  }
  static std::size_t hash(std::uint64_t k) {
    return static_cast<std::size_t>(((k ^ (k >> 29)) * 0x9E3779B97F4A7C15ull) >> 32);
  }
  // the cell of key k, or cells() when no point lies in it
  std::size_t find(std::uint64_t k) const {
    const std::size_t mask = slot_.size() - 1;
    for (std::size_t h = hash(k) & mask;; h = (h + 1) & mask) {
      const std::uint32_t v = slot_[h];
      if (v == 0) return cells();
      if (cell_keys_[v - 1] == k) return v - 1;
    }
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
  std::uint64_t key(std::size_t c) const { return cell_keys_[c]; }
  // the first cell at or after `from` whose key is >= k (cells() when none)
  std::size_t lower_bound(std::uint64_t k, std::size_t from = 0) const {
    return static_cast<std::size_t>(
        std::lower_bound(cell_keys_.begin() + static_cast<std::ptrdiff_t>(from), cell_keys_.end(),
                         k) -
        cell_keys_.begin());
  }
  // points of cell c: order_[cell_begin_[c] .. cell_begin_[c+1])
  const std::vector<std::uint32_t>& order() const { return order_; }
  std::size_t begin(std::size_t c) const { return cell_begin_[c]; }
  std::size_t end(std::size_t c) const { return cell_begin_[c + 1]; }

 private:
  double cell_;
  point3 lo_;
  std::vector<std::uint32_t> order_;
  std::vector<std::uint64_t> cell_keys_;
  std::vector<std::size_t> cell_begin_;
  std::vector<std::uint32_t> slot_;  // (power of two) cell index + 1 per slot, 0: empty
};

// Whether a cell_grid of `cell` with `margin` fits the cloud (21-bit cell coordinates).
inline bool grid_fits(const points& p, double cell, int margin = 1) {
  if (p.empty()) return true;
  point3 lo = p[0], hi = p[0];
  for (const auto& q : p) lo = lo.cwiseMin(q), hi = hi.cwiseMax(q);
  return ((hi - lo) / cell).maxCoeff() < static_cast<double>((1u << 21) - 2 * margin - 2);
}
}  // namespace detail

/// Statistical outlier removal: drops the points whose mean distance to their k nearest
/// neighbours exceeds mu + n_sigma * sigma of that mean over the cloud (PCL's filter).
/// The keep mask of remove_statistical_outliers (1: kept).
///
/// The k-NN are exact. Most queries are answered by a uniform grid (cell: 1.25 x the median k-th
/// neighbour distance of 64 points spread over the cloud, from the kd-tree): the candidates of
/// the 27 cells around a cell are gathered once for all its points, and a query whose k-th
/// distance is below the cell size is done (no point outside those cells can be nearer); the
/// others go to the kd-tree. Distances are computed and summed as the kd-tree does (nearest
/// first), so the means are the same numbers either way.
inline std::vector<char> statistical_inliers(const points& in, int k = 8, double n_sigma = 2.0) {
  check(k >= 1, "statistical_inliers: k is ", k, ", expected >= 1");
  if (in.size() <= static_cast<std::size_t>(k)) return std::vector<char>(in.size(), 1);
  points_tree tree(in);
  const auto kk = static_cast<std::size_t>(k) + 1;  // the point itself comes first
  std::vector<double> mean(in.size());              // (n) mean distance to the k neighbours
  auto mean_of = [](const double* d2, std::size_t n) {
    double s = 0;
    for (std::size_t j = 1; j < n; ++j) s += std::sqrt(d2[j]);
    return n > 1 ? s / static_cast<double>(n - 1) : 0.0;
  };
  double cell = 0;
  {
    std::vector<std::size_t> idx(kk);
    std::vector<double> d2(kk), kth;
    const std::size_t step = std::max<std::size_t>(1, in.size() / 64);
    for (std::size_t i = 0; i < in.size(); i += step) {
      const std::size_t n = tree.knn(in[i], kk, idx.data(), d2.data());
      kth.push_back(std::sqrt(d2[n - 1]));
    }
    const auto mid = static_cast<std::ptrdiff_t>(kth.size() / 2);
    std::nth_element(kth.begin(), kth.begin() + mid, kth.end());
    cell = 1.25 * kth[static_cast<std::size_t>(mid)];
  }
  if (!(cell > 0 && std::isfinite(cell) && detail::grid_fits(in, cell))) {
    // independent queries: the same means for any number of threads
    parallel_for(0, static_cast<index_t>(in.size()), 512, [&](index_t i0, index_t i1) {
      std::vector<std::size_t> idx(kk);
      std::vector<double> d2(kk);
      for (auto i = static_cast<std::size_t>(i0); i < static_cast<std::size_t>(i1); ++i) {
        const std::size_t n = tree.knn(in[i], kk, idx.data(), d2.data());
        mean[i] = mean_of(d2.data(), n);
      }
    });
  } else {
    const detail::cell_grid grid(in, cell);
    const auto& order = grid.order();
    const double bound2 = (cell * (1 - 1e-6)) * (cell * (1 - 1e-6));
    const std::uint64_t m = (1u << 21) - 1;
    parallel_for(0, static_cast<index_t>(grid.cells()), 64, [&](index_t c0, index_t c1) {
      std::vector<double> cx, cy, cz;  // (candidates) coordinates, gathered once per cell
      std::vector<std::size_t> idx(kk);
      std::vector<double> d2(kk), near;
      for (auto c = static_cast<std::size_t>(c0); c < static_cast<std::size_t>(c1); ++c) {
        const std::uint64_t key = grid.key(c);
        const std::uint64_t x = key >> 42, y = (key >> 21) & m, z = key & m;
        std::size_t around[27], na = 0, total = 0;  // the occupied cells around c
        for (std::uint64_t dx = 0; dx < 3; ++dx)
          for (std::uint64_t dy = 0; dy < 3; ++dy)
            for (std::uint64_t dz = 0; dz < 3; ++dz) {
              const std::size_t n =
                  grid.find(detail::cell_grid::pack(x + dx - 1, y + dy - 1, z + dz - 1));
              if (n == grid.cells()) continue;
              around[na++] = n;
              total += grid.end(n) - grid.begin(n);
            }
        cx.resize(total), cy.resize(total), cz.resize(total);
        std::size_t w = 0;
        for (std::size_t t = 0; t < na; ++t)
          for (std::size_t b = grid.begin(around[t]); b < grid.end(around[t]); ++b, ++w) {
            const point3& p = in[order[b]];
            cx[w] = p.x(), cy[w] = p.y(), cz[w] = p.z();
          }
        near.resize(cx.size());
        for (std::size_t a = grid.begin(c); a < grid.end(c); ++a) {
          const std::size_t i = order[a];
          const double q[3] = {in[i].x(), in[i].y(), in[i].z()};
          std::size_t cnt = 0;  // near[0 .. cnt): the squared distances below bound2
          for (std::size_t j = 0; j < cx.size(); ++j) {
            const double p[3] = {cx[j], cy[j], cz[j]};
            double r = 0;  // as the kd-tree's metric computes it
            for (int e = 0; e < 3; ++e) {
              const double diff = q[e] - p[e];
              r += diff * diff;
            }
            near[cnt] = r;
            cnt += r < bound2;
          }
          if (cnt >= kk) {  // the k nearest lie within bound: sorted, nearest first
            for (std::size_t j = 1; j < cnt; ++j) {  // insertion sort: a dozen values
              const double v = near[j];
              std::size_t t = j;
              for (; t > 0 && near[t - 1] > v; --t) near[t] = near[t - 1];
              near[t] = v;
            }
            mean[i] = mean_of(near.data(), kk);
          } else {  // the k-th neighbour may lie outside the 27 cells
            const std::size_t n = tree.knn(in[i], kk, idx.data(), d2.data());
            mean[i] = mean_of(d2.data(), n);
          }
        }
      }
    });
  }
  double mu = 0, var = 0;
  for (double v : mean) mu += v;
  mu /= static_cast<double>(mean.size());
  for (double v : mean) var += (v - mu) * (v - mu);
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
/// (kd-tree radius search; above 1000 points the same components through a uniform grid, see
/// below). Returns one index list per cluster, largest first (ties: the cluster whose smallest
/// index is smaller first on the grid path); within a cluster, indices ascend (grid) or follow
/// the search (kd-tree).
inline std::vector<std::vector<std::size_t>> euclidean_clusters(const points& in, double radius) {
  check(radius > 0, "euclidean_clusters: radius is ", radius, ", expected > 0");
  std::vector<std::vector<std::size_t>> clusters;
  if (in.empty()) return clusters;
  // Grid path: cells of side slightly below radius / sqrt(3), so any two points of one cell
  // are closer than radius (each cell lies inside one component) and a linked pair lies at most
  // two cells apart on each axis. Two cells are joined by the first pair of their points closer
  // than radius, and a pair of cells already in one component is not looked at again: the
  // components of the full graph, at a fraction of the pair tests.
  const double side = radius / std::sqrt(3.0) * 0.999;
  if (in.size() > 1000 && detail::grid_fits(in, side, 2)) {
    const detail::cell_grid grid(in, side, 2);
    const auto& order = grid.order();
    const std::size_t nc = grid.cells();
    std::vector<std::size_t> parent(nc);  // (cells) union-find over cells
    std::iota(parent.begin(), parent.end(), std::size_t{0});
    auto find = [&](std::size_t x) {
      while (parent[x] != x) x = parent[x] = parent[parent[x]];
      return x;
    };
    const double r2 = radius * radius;
    const std::uint64_t m = (1u << 21) - 1;
    auto linked = [&](std::size_t c, std::size_t n) {
      for (std::size_t a = grid.begin(c); a < grid.end(c); ++a)
        for (std::size_t b = grid.begin(n); b < grid.end(n); ++b)
          if ((in[order[a]] - in[order[b]]).squaredNorm() < r2) return true;
      return false;
    };
    for (std::size_t c = 0; c < nc; ++c) {
      const std::uint64_t k = grid.key(c);
      const std::uint64_t x = k >> 42, y = (k >> 21) & m, z = k & m;
      // the neighbour cells after c in key order: (dx, dy) > (0, 0), or dx = dy = 0 and dz > 0;
      // each (dx, dy) column of cells z - 2 .. z + 2 is contiguous in key order
      for (std::uint64_t dx = 0; dx <= 2; ++dx)
        for (std::uint64_t dy = (dx == 0 ? 2 : 0); dy <= 4; ++dy) {
          const std::uint64_t cx = x + dx, cy = y + dy - 2;
          const std::uint64_t z0 = (dx == 0 && dy == 2) ? z + 1 : z - 2;
          const std::uint64_t last = detail::cell_grid::pack(cx, cy, z + 2);
          for (std::size_t n = grid.lower_bound(detail::cell_grid::pack(cx, cy, z0), c + 1);
               n < nc && grid.key(n) <= last; ++n) {
            const std::size_t rc = find(c), rn = find(n);
            if (rc == rn || !linked(c, n)) continue;
            parent[std::max(rc, rn)] = std::min(rc, rn);
          }
        }
    }
    std::vector<std::size_t> cell_of(in.size());
    for (std::size_t c = 0; c < nc; ++c)
      for (std::size_t a = grid.begin(c); a < grid.end(c); ++a) cell_of[order[a]] = c;
    std::vector<std::size_t> label(nc, nc);
    for (std::size_t i = 0; i < in.size(); ++i) {
      const std::size_t root = find(cell_of[i]);
      if (label[root] == nc) {
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

}  // namespace tightfit::geometry
