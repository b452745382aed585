// tightfit/geometry/plane.hpp: the belt plane (RANSAC fit or given) and the belt frame.
//
// The belt frame has its origin on the plane, +z along the plane's normal (up, towards the
// object) and +x along the input's x axis projected onto the plane, so a yaw in the belt frame
// reads like a yaw in the input. detect_belt is deterministic and independent of the order of the
// points (no random sampling: a vote over local planes of a coarse voxel grid); fit_plane_ransac
// (seeded) remains for fitting a single plane.
#pragma once

#include <Eigen/Eigenvalues>
#include <Eigen/Geometry>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <random>
#include <vector>

#include "tightfit/core/error.hpp"
#include "tightfit/geometry/filters.hpp"
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

/// Parameters of detect_belt (lengths in the cloud's units; defaults assume metres).
struct belt_options {
  double cell = 0.02;          ///< coarse voxel for the candidate planes
  double threshold = 0.008;    ///< a cell centroid within this of a plane lies on it
  int candidates = 160;        ///< seed cells, evenly spaced over the key-sorted cells
  double min_share = 0.05;     ///< the belt holds at least this share of the points
  double max_below = 0.01;     ///< at most this share of the off-plane points lies below it
  double min_outside = 0.15;   ///< share of belt cells outside the object's top-view footprint
  std::size_t min_object = 8;  ///< cells above the belt needed to call it a belt under an object
};

namespace detail {
// The coarse cells of a cloud: centroids and point counts in key order (order-independent).
struct coarse_cells {
  std::vector<std::uint64_t> key;  // (m) ascending
  points c;                        // (m) centroids
  std::vector<double> w;           // (m) points per cell
  std::size_t n = 0;               // input points
};

template <PointCloud C>
coarse_cells make_coarse_cells(const C& cloud, double cell, const char* where) {
  const std::size_t n = cloud.kdtree_get_point_count();
  voxel_accumulator acc(cell, std::min<std::size_t>(n / 16, 1u << 14));
  for (std::size_t i = 0; i < n; ++i) {
    const point3 p = point_at(cloud, i);
    if (!p.allFinite())
      fail(where, ": point ", i, " is (", p.x(), ", ", p.y(), ", ", p.z(),
           "), expected finite coordinates");
    acc.add(p);
  }
  coarse_cells out;
  out.n = n;
  for (std::size_t s : acc.sorted_slots()) {
    out.key.push_back(acc.table[s].key);
    out.c.push_back(acc.centroid(acc.table[s]));
    out.w.push_back(static_cast<double>(acc.table[s].n));
  }
  return out;
}

// Weighted least-squares plane through the cells within `thr` of `pl` (normal sign kept).
inline bool refit_plane(const coarse_cells& g, plane& pl, double thr) {
  double sw = 0;
  point3 mean = point3::Zero();
  for (std::size_t j = 0; j < g.c.size(); ++j)
    if (std::abs(pl.distance(g.c[j])) < thr) sw += g.w[j], mean += g.w[j] * g.c[j];
  if (sw <= 0) return false;
  mean /= sw;
  Eigen::Matrix3d cov = Eigen::Matrix3d::Zero();
  for (std::size_t j = 0; j < g.c.size(); ++j)
    if (std::abs(pl.distance(g.c[j])) < thr) {
      const point3 d = g.c[j] - mean;
      cov.noalias() += g.w[j] * d * d.transpose();
    }
  Eigen::SelfAdjointEigenSolver<Eigen::Matrix3d> es(cov);
  point3 nrm = es.eigenvectors().col(0).normalized();
  if (nrm.dot(pl.normal) < 0) nrm = -nrm;
  pl = {nrm, nrm.dot(mean)};
  return true;
}

// Makes the largest-magnitude component of a normal positive (a deterministic sign).
inline plane canonical_sign(plane pl) {
  Eigen::Index k = 0;
  pl.normal.cwiseAbs().maxCoeff(&k);
  if (pl.normal[k] < 0) pl.normal = -pl.normal, pl.offset = -pl.offset;
  return pl;
}

// Whether `pl` (normal towards the object) is a belt under an object: almost nothing below it,
// something above it, and its cells reach outside the object's robust top-view footprint.
inline bool belt_test(const coarse_cells& g, const plane& pl, const belt_options& o) {
  const rigid_transform t = belt_frame(pl);
  double above = 0, below = 0;
  std::vector<double> ox, oy;
  for (std::size_t j = 0; j < g.c.size(); ++j) {
    const double d = pl.distance(g.c[j]);
    if (d > 3 * o.threshold) {
      above += g.w[j];
      const point3 u = t.apply(g.c[j]);
      ox.push_back(u.x()), oy.push_back(u.y());
    } else if (d < -3 * o.threshold) {
      below += g.w[j];
    }
  }
  if (ox.size() < o.min_object || below > o.max_below * (above + below)) return false;
  auto q = [](std::vector<double>& v, double f) {
    const auto k = static_cast<std::ptrdiff_t>(f * static_cast<double>(v.size() - 1));
    std::nth_element(v.begin(), v.begin() + k, v.end());
    return v[static_cast<std::size_t>(k)];
  };
  const double m = 2 * o.cell;
  const double x0 = q(ox, 0.01) - m, x1 = q(ox, 0.99) + m, y0 = q(oy, 0.01) - m,
               y1 = q(oy, 0.99) + m;
  double on = 0, outside = 0;
  for (std::size_t j = 0; j < g.c.size(); ++j) {
    if (std::abs(pl.distance(g.c[j])) >= o.threshold) continue;
    const point3 u = t.apply(g.c[j]);
    on += 1;
    outside += u.x() < x0 || u.x() > x1 || u.y() < y0 || u.y() > y1;
  }
  return on > 0 && outside >= o.min_outside * on;
}
}  // namespace detail

/// The belt's noise: the median signed distance of the points within `window` of `pl`, their
/// robust sigma (1.4826 x the median absolute deviation) and their count. Independent of the
/// order of the points (medians by selection).
struct belt_noise {
  double median = 0, sigma = 0;
  std::size_t count = 0;
};
namespace detail {
// The k-th smallest value of `v` (0-based, k < v.size()), every value in [lo, hi): the same value
// std::nth_element finds, at about the cost of two passes: a histogram of the values picks the
// bin holding the k-th one (the bin index is monotonic in the value), and only that bin's values
// are selected from. `v` is left alone; `scratch` is reused.
inline double select_kth(const std::vector<double>& v, std::size_t k, double lo, double hi,
                         std::vector<double>& scratch) {
  constexpr std::size_t bins = 4096;
  const double scale = static_cast<double>(bins) / (hi - lo);
  auto bin = [&](double x) {
    const double f = (x - lo) * scale;
    return f <= 0 ? std::size_t{0}
                  : std::min(static_cast<std::size_t>(f), bins - 1);  // f > 0 and finite
  };
  std::vector<std::size_t> count(bins, 0);
  for (double x : v) ++count[bin(x)];
  std::size_t b = 0, below = 0;
  while (below + count[b] <= k) below += count[b++];
  scratch.clear();
  scratch.reserve(count[b]);
  for (double x : v)
    if (bin(x) == b) scratch.push_back(x);
  const auto kk = static_cast<std::ptrdiff_t>(k - below);
  std::nth_element(scratch.begin(), scratch.begin() + kk, scratch.end());
  return scratch[static_cast<std::size_t>(kk)];
}
}  // namespace detail

template <PointCloud C>
belt_noise measure_belt_noise(const C& cloud, const plane& pl, double window) {
  std::vector<double> d;  // (count) signed distances within the window
  const std::size_t n = cloud.kdtree_get_point_count();
  d.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    const double v = pl.distance(point_at(cloud, i));
    if (std::abs(v) < window) d.push_back(v);
  }
  belt_noise out;
  out.count = d.size();
  if (d.size() < 3) return out;
  // medians by histogram selection (every value lies in (-window, window), every deviation in
  // [0, 2 window)): the values std::nth_element gives, without partitioning the whole vector
  const std::size_t mid = d.size() / 2;
  std::vector<double> scratch;
  out.median = detail::select_kth(d, mid, -window, window, scratch);
  for (auto& v : d) v = std::abs(v - out.median);
  out.sigma = 1.4826 * detail::select_kth(d, mid, 0, 2 * window, scratch);
  return out;
}

namespace detail {
template <PointCloud C>
std::optional<plane_fit> detect_belt_once(const coarse_cells& g, const C& cloud,
                                          const belt_options& o) {
  if (g.n < 50 || g.c.size() < 8) return std::nullopt;
  const std::size_t m = g.c.size();
  // 2. local planes at evenly spaced seed cells
  auto find = [&](std::uint64_t key) -> std::ptrdiff_t {
    auto it = std::lower_bound(g.key.begin(), g.key.end(), key);
    return it != g.key.end() && *it == key ? it - g.key.begin() : -1;
  };
  struct cand {
    plane pl;
    double score = 0;
  };
  std::vector<cand> cands;
  const std::size_t stride = std::max<std::size_t>(1, m / static_cast<std::size_t>(o.candidates));
  const std::uint64_t mask = (1u << 21) - 1;
  points nb;
  for (std::size_t s = stride / 2; s < m; s += stride) {
    nb.clear();
    const std::uint64_t k = g.key[s];
    const std::uint64_t x = k >> 42, y = (k >> 21) & mask, z = k & mask;
    for (std::uint64_t dx = 0; dx < 3; ++dx)
      for (std::uint64_t dy = 0; dy < 3; ++dy)
        for (std::uint64_t dz = 0; dz < 3; ++dz) {
          const auto j = find(((x + dx - 1) << 42) | ((y + dy - 1) << 21) | (z + dz - 1));
          if (j >= 0) nb.push_back(g.c[static_cast<std::size_t>(j)]);
        }
    if (nb.size() < 5) continue;
    const pca_frame f = pca(nb);
    if (std::sqrt(f.variance[2]) > o.threshold / 2 || f.variance[1] < o.cell * o.cell / 16)
      continue;
    cands.push_back({detail::canonical_sign({f.axes.col(2), f.axes.col(2).dot(f.mean)}), 0});
  }
  auto score = [&](const plane& pl) {
    double w = 0;
    for (std::size_t j = 0; j < m; ++j)
      if (std::abs(pl.distance(g.c[j])) < o.threshold) w += g.w[j];
    return w;
  };
  for (auto& c : cands) c.score = score(c.pl);
  auto better = [](const cand& a, const cand& b) {
    if (a.score != b.score) return a.score > b.score;
    for (int k = 0; k < 3; ++k)
      if (a.pl.normal[k] != b.pl.normal[k]) return a.pl.normal[k] < b.pl.normal[k];
    return a.pl.offset < b.pl.offset;
  };
  std::sort(cands.begin(), cands.end(), better);
  // 3. refine the best distinct planes and try them in order of score
  std::vector<cand> refined;
  for (const auto& c : cands) {
    if (refined.size() >= 8) break;
    bool dup = false;
    for (const auto& r : refined)
      dup = dup || (std::abs(r.pl.normal.dot(c.pl.normal)) > std::cos(0.1) &&
                    std::abs(r.pl.distance(c.pl.offset * c.pl.normal)) < 3 * o.threshold);
    if (dup) continue;
    cand r = c;
    for (int it = 0; it < 3; ++it)
      if (!detail::refit_plane(g, r.pl, 2 * o.threshold)) break;
    r.pl = detail::canonical_sign(r.pl);
    r.score = score(r.pl);
    refined.push_back(r);
  }
  std::sort(refined.begin(), refined.end(), better);
  const double total = static_cast<double>(g.n);
  for (const auto& r : refined) {
    if (r.score < o.min_share * total) break;
    for (double sgn : {1.0, -1.0}) {
      const plane pl{sgn * r.pl.normal, sgn * r.pl.offset};
      if (!detail::belt_test(g, pl, o)) continue;
      // 4. re-centre on the points and measure the belt's noise
      const belt_noise bn = measure_belt_noise(cloud, pl, 2 * o.threshold);
      plane_fit out;
      out.fitted = pl;
      out.fitted.offset += bn.median;
      out.rms = bn.sigma;
      out.inlier_share = static_cast<double>(bn.count) / total;
      return out;
    }
  }
  return std::nullopt;
}

}  // namespace detail

/// Looks for a belt under the object, deterministically and independently of the order of the
/// points (a Hough-style vote over local planes of a coarse voxel grid, no random sampling):
///  1. coarse cells (`cell`, 2 cm) with order-independent integer centroids;
///  2. a local plane (PCA of the 3x3x3 neighbouring centroids) at `candidates` seed cells evenly
///     spaced over the key-sorted cells; each scored over all cells (points within `threshold`);
///  3. the best-scoring distinct planes, refined by weighted least squares on their cells, are
///     tried in order of score (ties broken by the plane's parameters): the belt is the first
///     that holds >= `min_share` of the points, has (almost) nothing below it (its normal is
///     oriented towards the object), and extends outside the object's robust (1-99 %) top-view
///     footprint, which an object's own flat top never does;
///  4. the offset is re-centred on the median signed distance of the points near it, and `rms`
///     is the belt's noise sigma (1.4826 x the median absolute deviation of those distances).
/// No assumption is made about where the plane lies or which way the camera looks. A stray point
/// far away or a few flying pixels do not change the result (robust footprint, scores over the
/// whole cloud). Empty when no plane qualifies.
/// A noisy sensor (axial sigma of several mm) spreads the belt over several coarse cells along its
/// normal, so the search is repeated with 2 and 3 times `threshold` when nothing qualifies.
template <PointCloud C>
std::optional<plane_fit> detect_belt(const C& cloud, const belt_options& o = {}) {
  check(o.cell > 0 && o.threshold > 0, "detect_belt: cell is ", o.cell, " and threshold ",
        o.threshold, ", expected > 0");
  const detail::coarse_cells g = detail::make_coarse_cells(cloud, o.cell, "detect_belt");
  for (int k = 1; k <= 3; ++k) {
    belt_options ok = o;
    ok.threshold = o.threshold * k;
    if (auto f = detail::detect_belt_once(g, cloud, ok)) return f;
  }
  return std::nullopt;
}

/// detect_belt on a `points` vector.
inline std::optional<plane_fit> detect_belt(const points& p, const belt_options& o = {}) {
  return detect_belt(as_cloud(p), o);
}

}  // namespace tightfit::geometry
