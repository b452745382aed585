// tightfit/geometry/mebb.hpp: MEBB, the minimum elastic bounding box (docs/mebb.md).
//
// Measures the main body of an object (a suitcase) in a point cloud while ignoring sparse
// appendages (handles, wheels, straps, tags): each face of the box is an elastic membrane split
// into columns; a face stops only where at least kappa of its occupied membrane presses on it
// (force F(D) = sum_j k_j clamp((e_j - D)/eps, 0, 1) >= T = kappa sum_j k_j, bisection for the
// outermost such D), then snaps to the main-body edge; faces are solved one at a time until they
// settle, the yaw is re-estimated from the points inside the box and the whole is repeated.
//
// Two settings: a belt (z = 0 in the belt frame, up = +z, top-down camera; the bottom face rests
// on the belt) and full 3D (no belt; all six faces elastic). Every parameter lives in
// mebb_options (mebb_options.hpp, grouped by step) with the defaults of the published method;
// departures from it are documented in docs/mebb.md. Invariants: the result's box lies inside the
// cleaned cloud's envelope, except that on a belt the side faces of unseen walls move out by the
// offsets for what the camera cannot see (offsets.side_pitch, offsets.silhouette: a few mm); the
// result does not depend on the order of the input points beyond rounding.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <optional>
#include <utility>
#include <vector>

#include "tightfit/core/error.hpp"
#include "tightfit/geometry/box.hpp"
#include "tightfit/geometry/filters.hpp"
#include "tightfit/geometry/mebb_options.hpp"
#include "tightfit/geometry/pca.hpp"
#include "tightfit/geometry/plane.hpp"
#include "tightfit/geometry/point_cloud.hpp"
#include "tightfit/geometry/silhouette.hpp"

namespace tightfit::geometry {

/// Bits of mebb_result::flags.
enum mebb_flag : unsigned {
  mebb_near_square = 1u << 0,    ///< footprint near square: edge-direction yaw was used
  mebb_soft_retry = 1u << 1,     ///< a face moved too far or hit the safeguard: kappa/2 retry
  mebb_safeguard = 1u << 2,      ///< a face stopped at the safeguard quantile
  mebb_appendage = 1u << 3,      ///< some face trimmed more than checks.appendage_flag
  mebb_flat = 1u << 4,           ///< degenerate: the cleaned cloud is (nearly) coplanar
  mebb_line = 1u << 5,           ///< degenerate: the cleaned cloud is (nearly) collinear
  mebb_not_converged = 1u << 6,  ///< the face passes hit faces.max_passes before settling
  /// belt: a side face's top edge lies under something above the top over at least
  /// checks.hidden_flag_share of its span and the top continues past it there (hidden_top_points):
  /// the face is the edge of the overhang's shadow, the body's edge is not observed
  mebb_face_hidden = 1u << 7,
};

/// The names of the mebb_flag bits, bit k at index k (the tool's JSON "flags").
inline constexpr std::array<const char*, 8> mebb_flag_names = {
    "near_square", "soft_retry", "safeguard",     "appendage",
    "flat",        "line",       "not_converged", "face_hidden"};

/// The MEBB measurement. Faces are indexed 2a + (s < 0): +x, -x, +y, -y, +z, -z of the box frame.
struct mebb_result {
  oriented_box box;              ///< the main body, in input coordinates
  oriented_box envelope;         ///< the same frame, every cleaned point (appendages too)
  std::array<double, 3> dims{};  ///< box side lengths sorted L >= W >= H
  std::array<double, 6> trim{};  ///< per face: how far the cloud protrudes past it
  unsigned flags = 0;            ///< mebb_flag bits
  int passes = 0;                ///< face passes run in total
  int outer_runs = 0;            ///< outer iterations run (yaw re-estimations + 1)
  std::size_t points_used = 0;   ///< points after cleaning and voxelisation
  /// per face: its 1-sigma position uncertainty (see mebb_solve) and its support (columns in the
  /// snap band for side faces, points for a face seen head-on)
  std::array<double, 6> face_sigma{};
  std::array<std::size_t, 6> face_support{};
  /// belt, side faces: the solid-edge depth that entered face_sigma and the scatter sigma of the
  /// face's column envelopes (detail::solid_edge_depth; diagnostics); 0 elsewhere
  std::array<double, 6> face_reach{}, face_noise{};
  /// belt, side faces: a grip that seemed to hold the face out (solid_edge::grip: the depth from
  /// the face where measure() cuts it off); after measure()'s second solve, the cut applied
  std::array<double, 6> face_cut{};
  std::array<double, 3> sigma{};  ///< 1-sigma of each box extent (box axes, not sorted)
  double top_occupancy = 1;       ///< belt: share of the top's g x g columns holding a point
  /// belt: the largest share of a side face's columns where the object's top continues past the
  /// face (top_past_face_share over every point above the belt cut, before cleaning)
  double top_past = 0;
  /// belt, side faces: the share of the face's span hidden under something above the top
  /// (checks.hidden; 0 without `overhead` points)
  std::array<double, 6> face_hidden{};
  /// and the points at the top height within g past the face, within its span
  /// (checks.hidden_top_points; distinct 1 mm cells: the same with duplicated points)
  std::array<std::size_t, 6> face_hidden_top{};
  /// belt, with sensor points: their pitch on the top face, sqrt(top area / points in its band)
  double pitch = 0;
  /// belt, offsets.silhouette: the body's edge radius from its corners (0: not measured), each
  /// side face's ray tilt tan alpha from the belt's shadow (-1: not measured) and the offset
  /// r (1 - cos alpha) x (1 - wall seen share) the face moved out by
  double edge_radius = 0;
  std::array<double, 4> face_tilt{-1, -1, -1, -1};
  std::array<double, 4> face_silhouette{};
};

/// What the cleaning kept: voxels above the belt cut, and those left after clustering and
/// outlier removal.
struct clean_stats {
  std::size_t voxels = 0, kept = 0;
};

namespace detail {

struct face_scratch {
  std::vector<double> env;   // (nb * nc) column envelopes, -inf when empty
  std::vector<double> occ;   // occupied envelopes
  std::vector<double> kst;   // their stiffness
  std::vector<double> vals;  // s*u_a of the points in the face's region
  std::vector<double> band;
  std::size_t snap_n = 0;  // values the last snap used
  double snap_sd = 0;      // their standard deviation
};

inline double quantile_inplace(std::vector<double>& v, double q) {
  const auto k = static_cast<std::ptrdiff_t>(std::llround(q * static_cast<double>(v.size() - 1)));
  std::nth_element(v.begin(), v.begin() + k, v.end());
  return v[static_cast<std::size_t>(k)];
}

// One elastic face (axis a, side s) over the points u in the box frame; returns the new face
// position D in s*u_a units. `safeguard` is set when the face stopped at the safeguard quantile.
inline std::optional<double> elastic_face(const points& u, const Eigen::Vector3d& lo,
                                          const Eigen::Vector3d& hi, int a, double s, double kappa,
                                          bool head_on, bool use_guard, const mebb_face_options& o,
                                          face_scratch& w, bool& safeguard, double zmin = -INFINITY,
                                          double zmax = INFINITY) {
  const int b = (a + 1) % 3, c = (a + 2) % 3;
  const double g = o.column;
  const auto nb =
      std::clamp<index_t>(static_cast<index_t>(std::ceil((hi[b] - lo[b]) / g)), 1, 4000);
  const auto nc =
      std::clamp<index_t>(static_cast<index_t>(std::ceil((hi[c] - lo[c]) / g)), 1, 4000);
  const double mid = s * (lo[a] + hi[a]) / 2;
  w.env.assign(static_cast<std::size_t>(nb * nc), -INFINITY);
  w.vals.clear();
  for (const auto& p : u) {
    const double pb = p[b], pc = p[c];
    if (pb < lo[b] || pb > hi[b] || pc < lo[c] || pc > hi[c]) continue;
    if (p.z() < zmin || p.z() > zmax) continue;
    const double v = s * p[a];
    w.vals.push_back(v);
    if (v <= mid) continue;  // a column counts for the face on its own half only
    const index_t ib = std::min<index_t>(static_cast<index_t>((pb - lo[b]) / g), nb - 1);
    const index_t ic = std::min<index_t>(static_cast<index_t>((pc - lo[c]) / g), nc - 1);
    double& e = w.env[static_cast<std::size_t>(ib * nc + ic)];
    e = std::max(e, v);
  }
  w.occ.clear();
  w.kst.clear();
  for (index_t ib = 0; ib < nb; ++ib)
    for (index_t ic = 0; ic < nc; ++ic) {
      const double e = w.env[static_cast<std::size_t>(ib * nc + ic)];
      if (e == -INFINITY) continue;
      double k = 1;
      if (o.tau > 0) {
        double nbv[8];
        int n = 0;
        for (index_t db = -1; db <= 1; ++db)
          for (index_t dc = -1; dc <= 1; ++dc) {
            const index_t jb = ib + db, jc = ic + dc;
            if ((db || dc) && jb >= 0 && jb < nb && jc >= 0 && jc < nc) {
              const double f = w.env[static_cast<std::size_t>(jb * nc + jc)];
              if (f != -INFINITY) nbv[n++] = f;
            }
          }
        if (n > 0) {
          for (int x = 1; x < n; ++x)  // insertion sort (n <= 8)
            for (int y = x; y > 0 && nbv[y - 1] > nbv[y]; --y) std::swap(nbv[y - 1], nbv[y]);
          const double med = n % 2 ? nbv[n / 2] : (nbv[n / 2 - 1] + nbv[n / 2]) / 2;
          const double r = (e - med) / o.tau;
          k = 1 / (1 + r * r);
        }
      }
      w.occ.push_back(e);
      w.kst.push_back(k);
    }
  if (w.occ.empty()) return std::nullopt;
  double total = 0, emin = INFINITY, emax = -INFINITY;
  for (std::size_t j = 0; j < w.occ.size(); ++j) {
    total += w.kst[j];
    emin = std::min(emin, w.occ[j]), emax = std::max(emax, w.occ[j]);
  }
  const double threshold = kappa * total;
  const double eps = o.eps;
  auto force = [&](double d) {
    double f = 0;
    for (std::size_t j = 0; j < w.occ.size(); ++j)
      f += w.kst[j] * std::clamp((w.occ[j] - d) / eps, 0.0, 1.0);
    return f;
  };
  // F is non-increasing; F(emin - eps) = total >= threshold, F(emax) = 0: bisection
  double dl = emin - eps, dh = emax;
  for (int it = 0; it < 60 && dh - dl > 1e-7; ++it) {
    const double dm = (dl + dh) / 2;
    (force(dm) >= threshold ? dl : dh) = dm;
  }
  double d = dl;
  safeguard = false;
  if (use_guard && !w.vals.empty()) {
    const double q = quantile_inplace(w.vals, o.safeguard_quantile);
    if (d < q - eps) d = q, safeguard = true;  // D* sits ~kappa*eps inside a clean face: slack eps
  }
#ifdef TIGHTFIT_MEBB_DEBUG
  {
    std::vector<double> so = w.occ;
    std::sort(so.begin(), so.end());
    std::fprintf(stderr,
                 "face a%d s%+.0f n=%zu D*=%.4f q(.5,.75,.9,.95,1)=%.4f %.4f %.4f %.4f %.4f\n", a,
                 s, so.size(), d, so[so.size() / 2], so[so.size() * 3 / 4], so[so.size() * 9 / 10],
                 so[so.size() * 19 / 20], so.back());
  }
#endif
  // snap to the main-body edge
  const double b0 = d - o.snap_inner * eps, b1 = d + o.snap_outer;
  w.band.clear();
  if (head_on) {
    for (double v : w.vals)
      if (v >= b0 && v <= b1 && v > mid) w.band.push_back(v);
  } else {
    for (double e : w.occ)
      if (e >= b0 && e <= b1) w.band.push_back(e);
  }
  w.snap_n = w.band.size();
  w.snap_sd = 0;
  if (!w.band.empty()) {
    double sum = 0, ss = 0;
    for (double v : w.band) sum += v;
    const double mean = sum / static_cast<double>(w.band.size());
    for (double v : w.band) ss += (v - mean) * (v - mean);
    w.snap_sd = std::sqrt(ss / static_cast<double>(w.band.size()));
    d = head_on ? mean : quantile_inplace(w.band, o.side_quantile);
  }
  return d;
}

// Rotates axes i and j of `axes` (columns) about the third by the edge-direction angle of the
// cloud seen along the third axis.
inline bool refine_near_square(const points& p, Eigen::Matrix3d& axes, int i, int j,
                               const mebb_options& o) {
  points proj(p.size());
  for (std::size_t k = 0; k < p.size(); ++k)
    proj[k] = point3(axes.col(i).dot(p[k]), axes.col(j).dot(p[k]), 0.0);
  const auto ang =
      edge_direction_yaw(proj, o.cleaning.voxel, o.yaw.edge_radius, o.yaw.edge_elongation);
  if (!ang) return false;
  const double c = std::cos(*ang), s = std::sin(*ang);
  const point3 ai = axes.col(i), aj = axes.col(j);
  axes.col(i) = c * ai + s * aj;
  axes.col(j) = -s * ai + c * aj;
  return true;
}

// The box frame (axes as columns) of the cloud `p`: top-view yaw on a belt, 3D PCA otherwise.
inline Eigen::Matrix3d estimate_axes(const points& p, bool belt, const mebb_options& o,
                                     unsigned& flags) {
  if (belt) {
    const yaw_estimate y = pca_yaw(p);
    Eigen::Matrix3d axes = rot_z(y.yaw);
    // the silhouette is rasterised in the PCA frame, where the edges run close to the grid
    if ((y.ratio < o.yaw.square_ratio || o.yaw.edge_always) &&
        refine_near_square(p, axes, 0, 1, o) && y.ratio < o.yaw.square_ratio)
      flags |= mebb_near_square;
    return axes;
  }
  const pca_frame f = pca(p);
  Eigen::Matrix3d axes = f.axes;
  const auto& v = f.variance;
  if (v[1] > 0 && v[0] / v[1] < o.yaw.square_ratio * o.yaw.square_ratio) {
    if (refine_near_square(p, axes, 0, 1, o)) flags |= mebb_near_square;
  } else if (v[2] > 0 && v[1] / v[2] < o.yaw.square_ratio * o.yaw.square_ratio) {
    if (refine_near_square(p, axes, 1, 2, o)) flags |= mebb_near_square;
  }
  return axes;
}

// Belt setting, side face (a, s) at D (s*u_a units) under a top face at `top`: fits the
// rounded-edge profile offset(depth) = r - sqrt(r^2 - (r - min(depth, r))^2) to the points below
// the top edge and returns the wall position it implies (or nothing when the fit is not usable).
inline std::optional<double> edge_profile_wall(const points& u, const Eigen::Vector3d& lo,
                                               const Eigen::Vector3d& hi, int a, double s, double d,
                                               const mebb_options& o, std::vector<double>& depth,
                                               std::vector<double>& pos,
                                               std::vector<double>& wall) {
  const int b = a == 0 ? 1 : 0;
  const double top = hi.z(), span = hi[b] - lo[b];
  const double b0 = lo[b] + 0.15 * span, b1 = hi[b] - 0.15 * span;  // away from the corners
  depth.clear(), pos.clear();
  for (const auto& p : u) {
    const double x = s * p[a], dz = top - p.z();
    if (p[b] < b0 || p[b] > b1 || x < d - 0.03 || x > d + o.offsets.profile_max_shift) continue;
    if (dz < o.faces.eps / 2 || dz > o.offsets.profile_depth) continue;
    depth.push_back(dz), pos.push_back(x);
  }
  if (depth.size() < 20) return std::nullopt;
  double best_dev = INFINITY, best_wall = d;
  for (double r = 0.002; r <= 0.0605; r += 0.001) {
    wall.resize(depth.size());
    for (std::size_t i = 0; i < depth.size(); ++i) {
      const double t = r - std::min(depth[i], r);
      wall[i] = pos[i] + r - std::sqrt(std::max(0.0, r * r - t * t));
    }
    const double med = quantile_inplace(wall, 0.5);
    for (auto& w : wall) w = std::abs(w - med);
    const double dev = quantile_inplace(wall, 0.5);
    if (dev < best_dev) best_dev = dev, best_wall = med;
  }
  if (best_wall <= d) return std::nullopt;
  return std::min(best_wall, d + o.offsets.profile_max_shift);
}

// Belt setting: the yaw correction (radians) that straightens the four side walls: a line fit
// (top view) of the top-edge points near each side face, combined over the faces.
inline double wall_yaw_correction(const points& u, const Eigen::Vector3d& lo,
                                  const Eigen::Vector3d& hi, const mebb_options& o) {
  double num = 0, den = 0;
  for (int f = 0; f < 4; ++f) {
    const int a = f / 2, b = 1 - a;
    const double s = f % 2 ? -1.0 : 1.0;
    const double d = s > 0 ? hi[a] : -lo[a], span = hi[b] - lo[b];
    const double b0 = lo[b] + 0.15 * span, b1 = hi[b] - 0.15 * span;
    double n = 0, mb = 0, mv = 0, sbb = 0, sbv = 0;
    for (const auto& p : u) {
      const double v = s * p[a];
      if (p[b] < b0 || p[b] > b1 || v < d - 0.015 || v > d + 0.003) continue;
      if (o.faces.side_band > 0 &&
          (p.z() < hi.z() - o.faces.side_band || p.z() > hi.z() + o.faces.eps))
        continue;
      n += 1, mb += p[b], mv += v, sbb += p[b] * p[b], sbv += p[b] * v;
    }
    if (n < 10) continue;
    const double var = sbb / n - (mb / n) * (mb / n), cov = sbv / n - (mb / n) * (mv / n);
    if (var <= 0) continue;
    const double slope = cov / var;
    const double delta = a == 0 ? -s * std::atan(slope) : s * std::atan(slope);
    num += n * var * delta, den += n * var;
  }
  return den > 0 ? num / den : 0.0;
}

// Belt setting: how far inside the side face (a, s) the body's outline is solid: the smallest
// depth t (steps of g/2, up to solid_edge.depth) at which the top view of the slab [D - t - g, D -
// t] holds points above half the height in at least solid_edge.share of its g-columns along the
// face. A face held out by a handle or a strap sees a sparse slab first; a body edge a solid one.
// With solid_edge.gap, a first solid run followed by a slab holding points in less than half its
// columns is an appendage as wide as the face (a handle grip) and the depth counts to the next
// solid slab, unless (solid_edge.top_run) the run's points lie at the box top (within g): then the
// run is the body's own top strip and the depth is its start.
// `noise` is the face's own scatter, 1.4826 x the median absolute deviation of the columns'
// outermost depths (a diagnostic: mebb_result::face_noise).
struct solid_edge {
  double depth = 0;         // the first solid slab's depth (or past a gap)
  double noise = 0;         // the face's envelope scatter sigma
  double run_height = NAN;  // a first solid run that ends in a gap: its points' mean height
  double gap_height = NAN;  // and the mean height of the points in that gap
  bool top_run = false;     // that run was taken as the body's top strip (solid_edge.top_run)
  bool shadow_gap = false;  // the gap was taken as a shadow on the top (solid_edge.shadow_gap)
  double grip = 0;          // run and gap below the top, a solid slab after: the gap's middle
};
inline solid_edge solid_edge_depth(const points& u, const Eigen::Vector3d& lo,
                                   const Eigen::Vector3d& hi, int a, double s,
                                   const mebb_options& o) {
  const int b = 1 - a;
  const double g = o.faces.column, d = s > 0 ? hi[a] : -lo[a], step = g / 2;
  const auto nb = std::clamp<index_t>(static_cast<index_t>((hi[b] - lo[b]) / g), 1, 4000);
  const auto steps = static_cast<index_t>(o.solid_edge.depth / step);
  std::vector<std::uint64_t> occ(static_cast<std::size_t>(nb), 0);  // bit k: slab step k
  std::vector<double> env(static_cast<std::size_t>(nb), INFINITY);  // outermost depth
  for (const auto& p : u) {
    if (p.z() < hi.z() / 2 || p[b] < lo[b] || p[b] > hi[b]) continue;
    const double depth = d - s * p[a];
    if (depth < 0 || depth > o.solid_edge.depth + g) continue;
    const index_t ib = std::min<index_t>(static_cast<index_t>((p[b] - lo[b]) / g), nb - 1);
    auto& e = env[static_cast<std::size_t>(ib)];
    e = std::min(e, depth);
    // the slabs [t, t + g] (t = k g/2) that hold this depth
    for (index_t k = 0; k <= steps && k < 64; ++k) {
      const double t = static_cast<double>(k) * step;
      if (depth >= t && depth <= t + g) occ[static_cast<std::size_t>(ib)] |= 1ull << k;
    }
  }
  solid_edge r;
  {  // the face's envelope scatter (median absolute deviation: robust to strap columns)
    std::vector<double> e;
    for (double x : env)
      if (std::isfinite(x)) e.push_back(x);
    if (e.size() >= 3) {
      const double med = quantile_inplace(e, 0.5);
      for (double& x : e) x = std::abs(x - med);
      r.noise = 1.4826 * quantile_inplace(e, 0.5);
    }
  }
  // the first solid slab; then, past a sparse slab (a gap between an appendage as wide as the
  // face, e.g. a handle grip, and the body), the next solid one
  const index_t last = std::min<index_t>(steps, 63);
  std::vector<index_t> cnt(static_cast<std::size_t>(last + 1), 0);  // columns holding slab k
  for (index_t k = 0; k <= last; ++k)
    for (auto m : occ) cnt[static_cast<std::size_t>(k)] += (m >> k) & 1u;
  auto sparse = [&](index_t k) { return cnt[static_cast<std::size_t>(k)] * 2 < nb; };
  auto mean_height = [&](double t0, double t1) {  // of the points at depth [t0, t1]
    double zs = 0, zn = 0;
    for (const auto& p : u) {
      if (p.z() < hi.z() / 2 || p[b] < lo[b] || p[b] > hi[b]) continue;
      const double depth = d - s * p[a];
      if (depth >= t0 && depth <= t1) zs += p.z(), zn += 1;
    }
    return zn > 0 ? zs / zn : NAN;
  };
  int state = 0;  // 0: before the first solid slab, 1: in it, 2: in a gap after it
  double first = o.solid_edge.depth;
  for (index_t k = 0; k <= last; ++k) {
    const auto n = cnt[static_cast<std::size_t>(k)];
    const bool solid = static_cast<double>(n) >= o.solid_edge.share * static_cast<double>(nb);
    if (state == 0 && solid) state = 1, first = static_cast<double>(k) * step;
    if (!o.solid_edge.gap && state == 1) break;
    if (state == 1 && !solid && sparse(k)) {  // less than half the columns: a gap
      state = 2;
      const double t0 = static_cast<double>(k) * step;
      // the run's points (depth [first, start of this slab]) at the box top: the body's own
      // top strip (a grip that holds a face out sits lower)
      r.run_height = mean_height(first, t0);
      if (o.solid_edge.top_run && std::abs(hi.z() - r.run_height) <= g) {
        r.top_run = true;
        break;
      }
      // the points in the gap (the middle of its consecutive sparse slabs) at the box top: a
      // shadow on the body's top, with the body visible beside it
      index_t k2 = k;
      while (k2 < last && sparse(k2 + 1)) ++k2;
      r.gap_height = mean_height(t0 + g / 2, static_cast<double>(k2) * step + g / 2);
      if (o.solid_edge.shadow_gap && std::abs(hi.z() - r.gap_height) <= g) {
        r.shadow_gap = true;
        break;
      }
      if (hi.z() - r.run_height > g && hi.z() - r.gap_height > g)  // a grip and its rods?
        r.grip = (t0 + static_cast<double>(k2) * step + g) / 2;
    }
    if (state == 2 && solid) {
      first = static_cast<double>(k) * step;
      state = 3;
      break;
    }
  }
  if (state != 3) r.grip = 0;  // no body past the gap
  r.depth = first;
  return r;
}

// Belt setting: the share of the side face (a, s)'s g-columns (middle 70 % of the face) that hold
// a point within `tol` of the face at least 40 mm below the top and 20 mm above the belt: a wall
// the camera sees below the rounded top edge.
inline double wall_seen_share(const points& u, const Eigen::Vector3d& lo, const Eigen::Vector3d& hi,
                              int a, double s, double tol, const mebb_options& o) {
  const int b = 1 - a;
  const double g = o.faces.column, d = s > 0 ? hi[a] : -lo[a], span = hi[b] - lo[b];
  const double b0 = lo[b] + 0.15 * span, b1 = hi[b] - 0.15 * span;
  const double z0 = 0.02, z1 = hi.z() - 0.04;
  if (z1 <= z0 || b1 <= b0) return 0;
  const auto nb = std::clamp<index_t>(static_cast<index_t>((b1 - b0) / g), 1, 4000);
  std::vector<char> hit(static_cast<std::size_t>(nb), 0);
  for (const auto& p : u) {
    if (p[b] < b0 || p[b] >= b1 || p.z() < z0 || p.z() > z1) continue;
    if (std::abs(s * p[a] - d) > tol) continue;
    hit[static_cast<std::size_t>(
        std::min<index_t>(static_cast<index_t>((p[b] - b0) / g), nb - 1))] = 1;
  }
  std::size_t k = 0;
  for (char c : hit) k += c != 0;
  return static_cast<double>(k) / static_cast<double>(nb);
}

// The number of distinct 1 mm cells (of the cloud's unit x 1e-3) that hold `pts`, by group
// (pairs of group and point): counts that do not change with the order of the points or with
// duplicates.
inline std::vector<int> distinct_cells(std::vector<std::pair<index_t, point3>>& pts,
                                       index_t groups) {
  std::vector<std::array<std::int64_t, 4>> keys;
  keys.reserve(pts.size());
  for (const auto& [grp, q] : pts)
    keys.push_back(
        {grp, std::llround(q.x() * 1e3), std::llround(q.y() * 1e3), std::llround(q.z() * 1e3)});
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  std::vector<int> cnt(static_cast<std::size_t>(groups), 0);
  for (const auto& k : keys) ++cnt[static_cast<std::size_t>(k[0])];
  return cnt;
}

// Belt setting, side face (a, s) of the box [lo, hi] (box frame): the g-bins of its span
// (coordinate 1 - a, from lo) over which at least two of `over` (points more than
// o.checks.hidden_height above the top, box frame) lie, on the face's half of the box or up to
// o.checks.past_reach outside it, widened by o.checks.hidden_margin bins on each side: where the
// camera above cannot see the face's top edge. `share` returns the hidden share of the span.
inline std::vector<char> hidden_span(const points& over, const Eigen::Vector3d& lo,
                                     const Eigen::Vector3d& hi, int a, double s,
                                     const mebb_options& o, double& share) {
  const int h = 1 - a;
  const double g = o.faces.column, d = s > 0 ? hi[a] : -lo[a], half = (hi[a] - lo[a]) / 2;
  const auto n = std::clamp<index_t>(static_cast<index_t>(std::ceil((hi[h] - lo[h]) / g)), 1, 4000);
  std::vector<std::pair<index_t, point3>> in_bins;
  for (const auto& q : over) {
    if (q.z() <= hi.z() + o.checks.hidden_height || q[h] < lo[h] || q[h] > hi[h]) continue;
    const double in = d - s * q[a];  // depth inside the face
    if (in < -o.checks.past_reach || in > half) continue;
    in_bins.emplace_back(std::min<index_t>(static_cast<index_t>((q[h] - lo[h]) / g), n - 1), q);
  }
  const std::vector<int> cnt = distinct_cells(in_bins, n);  // distinct points, in effect
  std::vector<char> mask(static_cast<std::size_t>(n), 0);
  index_t k = 0;
  for (index_t i = 0; i < n; ++i) {
    if (cnt[static_cast<std::size_t>(i)] < 2) continue;
    for (index_t j = std::max<index_t>(0, i - o.checks.hidden_margin);
         j <= std::min<index_t>(n - 1, i + o.checks.hidden_margin); ++j)
      mask[static_cast<std::size_t>(j)] = 1;
  }
  for (char c : mask) k += c != 0;
  share = static_cast<double>(k) / static_cast<double>(n);
  return mask;
}

}  // namespace detail

/// Cleaning and isotropic density (steps 0 and 1): on a belt (points in the belt frame) drops
/// the belt, then voxelises, keeps the largest Euclidean cluster and removes statistical
/// outliers. Voxelising first is a departure from the published method (which cleans first): the
/// same structure at a fraction of the cost, since clustering and k-NN run on voxel centroids. With
/// `raw`, also returns the input points (above the belt cut) whose voxels survived the cleaning:
/// what the baselines and MEBB's final face fits see (defined on the sensor's points, not on
/// centroids), in a canonical order (by voxel, then coordinates) without exact duplicates. With
/// `stats`, also returns how many voxels the clustering and outlier removal kept.
inline points mebb_clean(const points& p, bool belt, const mebb_options& o, points* raw = nullptr,
                         clean_stats* stats = nullptr) {
  points q;
  if (belt) {
    const double cut = detail::belt_cut(o.belt);
    q.reserve(p.size());
    for (const auto& x : p)
      if (x.z() >= cut) q.push_back(x);
    if (o.belt.veil_share > 0) {
      const auto dense = top_view_dense(q, o.cleaning.voxel, o.belt.veil_share);
      std::size_t k = 0;
      for (std::size_t i = 0; i < q.size(); ++i)
        if (dense[i]) q[k++] = q[i];
      q.resize(k);
    }
  } else {
    q = p;
  }
  std::vector<std::uint32_t> voxel_of;
  points v = voxel_downsample(q, o.cleaning.voxel, raw ? &voxel_of : nullptr);
  std::vector<char> keep(v.size(), 1);
  if (o.cleaning.enabled && !v.empty()) {
    auto clusters = euclidean_clusters(v, o.cleaning.cluster_radius);
    std::sort(clusters[0].begin(), clusters[0].end());
    points c;
    c.reserve(clusters[0].size());
    for (std::size_t i : clusters[0]) c.push_back(v[i]);
    const auto inl = statistical_inliers(c, o.cleaning.sor_k, o.cleaning.sor_sigma);
    std::fill(keep.begin(), keep.end(), 0);
    for (std::size_t j = 0; j < c.size(); ++j) keep[clusters[0][j]] = inl[j];
  }
  points out;
  out.reserve(v.size());
  for (std::size_t i = 0; i < v.size(); ++i)
    if (keep[i]) out.push_back(v[i]);
  if (stats) stats->voxels = v.size(), stats->kept = out.size();
  if (raw) {
    // in a canonical order (by voxel, then coordinates) without exact duplicates, so that what
    // is computed from these points (sums, quantiles) is the same for any order of the input and
    // with every point duplicated: a counting sort by voxel, then a small sort within each
    std::vector<std::uint32_t> start(v.size() + 1, 0);
    for (std::size_t i = 0; i < q.size(); ++i)
      if (keep[voxel_of[i]]) ++start[voxel_of[i] + 1];
    for (std::size_t k = 0; k < v.size(); ++k) start[k + 1] += start[k];
    points sorted(start[v.size()]);
    {
      std::vector<std::uint32_t> next(start.begin(), start.end() - 1);
      for (std::size_t i = 0; i < q.size(); ++i)
        if (keep[voxel_of[i]]) sorted[next[voxel_of[i]]++] = q[i];
    }
    auto less = [](const point3& x, const point3& y) {
      return x.x() != y.x() ? x.x() < y.x() : x.y() != y.y() ? x.y() < y.y() : x.z() < y.z();
    };
    raw->clear();
    raw->reserve(sorted.size());
    for (std::size_t k = 0; k < v.size(); ++k) {
      const auto b = sorted.begin() + start[k], e = sorted.begin() + start[k + 1];
      std::sort(b, e, less);
      for (auto it = b; it != e; ++it)
        if (it == b || *it != *(it - 1)) raw->push_back(*it);
    }
  }
  return out;
}

namespace detail {

// mebb_solve's steps. The box lives in a frame: u = axes^T (x - origin), where it is the box
// [lo, hi]; faces are indexed 2a + (s < 0) (+x, -x, +y, -y, +z, -z), face f on axis a = f / 2 at
// s * u_a = D. On a belt the frame's origin lies on the belt (z = 0) and face 5 rests on it.

// The box frame: its axes (columns, in input coordinates) and its origin.
struct box_frame {
  Eigen::Matrix3d axes;
  point3 origin;
};

// Per face: what its last snap used (the values in the band and their standard deviation).
struct face_snaps {
  std::array<std::size_t, 6> n{};
  std::array<double, 6> sd{};
  void keep(int f, const face_scratch& w) {
    n[static_cast<std::size_t>(f)] = w.snap_n;
    sd[static_cast<std::size_t>(f)] = w.snap_sd;
  }
};

// The mebb_line / mebb_flat flags of the cloud `p` (its PCA spread along the second and third
// axes); throws when every point coincides.
inline unsigned shape_flags(const points& p) {
  const pca_frame f = pca(p);
  const double scale = std::sqrt(f.variance[0]);
  check(scale > 0, "mebb: all ", p.size(), " points coincide, expected an object");
  if (std::sqrt(f.variance[1]) < 1e-6 * scale) return mebb_line;
  if (std::sqrt(f.variance[2]) < 1e-6 * scale) return mebb_flat;
  return 0;
}

// The first frame: the estimated axes (estimate_axes; mebb_near_square into `flags`) about the
// centroid of `p`, dropped onto the belt.
inline box_frame initial_frame(const points& p, bool belt, const mebb_options& o, unsigned& flags) {
  box_frame f;
  f.axes = estimate_axes(p, belt, o, flags);
  f.origin = point3::Zero();
  for (const auto& x : p) f.origin += x;
  f.origin /= static_cast<double>(p.size());
  if (belt) f.origin.z() = 0;
  return f;
}

// `in` in the frame `f`, into `out`.
inline void to_frame(const points& in, const box_frame& f, points& out) {
  out.resize(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) out[i] = f.axes.transpose() * (in[i] - f.origin);
}

// The bounds [lo, hi] of `u`; on a belt the bottom is the belt (lo.z = 0).
inline void bounds(const points& u, bool belt, Eigen::Vector3d& lo, Eigen::Vector3d& hi) {
  lo = Eigen::Vector3d::Constant(INFINITY), hi = -lo;
  for (const auto& x : u) lo = lo.cwiseMin(x), hi = hi.cwiseMax(x);
  if (belt) lo.z() = 0;
}

// Whether the safeguard applies to face f: every face but the top on a belt
// (faces.belt_top_safeguard).
inline bool guarded(int f, bool belt, const mebb_face_options& fo) {
  return !belt || f != 4 || fo.belt_top_safeguard;
}

// The heights [zmin, zmax] of the points that build face f's membrane: on a belt, a side face's
// is the layer [top - side_band, top + eps] under the top `hi.z()` (faces.side_band); all
// heights otherwise.
inline std::pair<double, double> face_layer(int f, bool belt, const Eigen::Vector3d& hi,
                                            const mebb_face_options& fo) {
  if (belt && f / 2 < 2 && fo.side_band > 0) return {hi.z() - fo.side_band, hi.z() + fo.eps};
  return {-INFINITY, INFINITY};
}

// Steps 3-5 on the voxel centroids `u`: the faces one at a time, the top first (on a belt the
// side faces' layer hangs from it), until none moves more than h/2 (at most faces.max_passes
// passes; mebb_not_converged otherwise). A face never moves outward past the bounds it started
// from; with faces.adaptive, a face that moved more than faces.retry_fraction of the extent or
// stopped at the safeguard is solved again at kappa/2 (mebb_soft_retry). Moves [lo, hi], keeps each
// face's snap in `snaps`, counts r.passes and sets r.flags.
inline void solve_faces(const points& u, bool belt, const mebb_options& o, Eigen::Vector3d& lo,
                        Eigen::Vector3d& hi, face_snaps& snaps, face_scratch& w, mebb_result& r) {
  const mebb_face_options& fo = o.faces;
  const Eigen::Vector3d lo0 = lo, hi0 = hi;
  bool settled = false;
  for (int pass = 0; pass < fo.max_passes && !settled; ++pass) {
    ++r.passes;
    double moved = 0;
    for (int f : {4, 0, 1, 2, 3, 5}) {  // the top first: side faces on a belt depend on it
      const int a = f / 2;
      const double s = f % 2 ? -1.0 : 1.0;
      if (belt && f == 5) continue;  // the bottom rests on the belt
      const bool head_on = !belt || f == 4;
      const double extreme = s > 0 ? hi0[a] : -lo0[a];
      const double old = s > 0 ? hi[a] : -lo[a];
      bool guard = false;
      const auto [zmin, zmax] = face_layer(f, belt, hi, fo);
      auto d = elastic_face(u, lo, hi, a, s, fo.kappa, head_on, guarded(f, belt, fo), fo, w, guard,
                            zmin, zmax);
      if (!d) continue;
      if (fo.adaptive && (guard || extreme - *d > fo.retry_fraction * (hi0[a] - lo0[a]))) {
        bool guard2 = false;
        auto d2 = elastic_face(u, lo, hi, a, s, fo.kappa / 2, head_on, guarded(f, belt, fo), fo, w,
                               guard2, zmin, zmax);
        if (d2) d = d2, guard = guard2;
        r.flags |= mebb_soft_retry;
      }
      if (guard) r.flags |= mebb_safeguard;
      snaps.keep(f, w);
      const double nd = std::min(*d, extreme);
      (s > 0 ? hi[a] : lo[a]) = s * nd;
      moved = std::max(moved, std::abs(nd - old));
    }
    settled = moved <= o.cleaning.voxel / 2;
  }
  if (!settled) r.flags |= mebb_not_converged;
}

// Step 4+ (faces.fine): the faces solved again, the same way, on the sensor points `uf` (in the
// same frame) for at most faces.fine_passes passes, until none moves more than h/2: the final
// faces do not depend on the voxel lattice. Moves [lo, hi] and keeps each face's snap in `snaps`.
inline void solve_faces_fine(const points& uf, bool belt, const mebb_options& o,
                             Eigen::Vector3d& lo, Eigen::Vector3d& hi, face_snaps& snaps,
                             face_scratch& w) {
  const mebb_face_options& fo = o.faces;
  for (int pass = 0; pass < fo.fine_passes; ++pass) {
    double moved = 0;
    for (int f : {4, 0, 1, 2, 3, 5}) {
      const int a = f / 2;
      const double s = f % 2 ? -1.0 : 1.0;
      if (belt && f == 5) continue;
      const bool head_on = !belt || f == 4;
      const auto [zmin, zmax] = face_layer(f, belt, hi, fo);
      bool guard = false;
      const double old = s > 0 ? hi[a] : -lo[a];
      auto d = elastic_face(uf, lo, hi, a, s, fo.kappa, head_on, guarded(f, belt, fo), fo, w, guard,
                            zmin, zmax);
      if (!d) continue;
      snaps.keep(f, w);
      (s > 0 ? hi[a] : lo[a]) = s * *d;
      moved = std::max(moved, std::abs(*d - old));
    }
    if (moved <= o.cleaning.voxel / 2) break;
  }
}

// uncertainty.stability: per face, how far it would move at the softer kappa x kappa_probe (the
// voxel centroids `u`, the box [lo, hi]; eps where it finds no face).
inline std::array<double, 6> face_stability(const points& u, bool belt, const mebb_options& o,
                                            const Eigen::Vector3d& lo, const Eigen::Vector3d& hi,
                                            face_scratch& w) {
  const mebb_face_options& fo = o.faces;
  std::array<double, 6> stab{};
  for (int f = 0; f < 6; ++f) {
    const int a = f / 2;
    const double s = f % 2 ? -1.0 : 1.0;
    if (belt && f == 5) continue;
    const auto [zmin, zmax] = face_layer(f, belt, hi, fo);
    bool guard = false;
    const auto d = elastic_face(u, lo, hi, a, s, fo.kappa * o.uncertainty.kappa_probe,
                                !belt || f == 4, guarded(f, belt, fo), fo, w, guard, zmin, zmax);
    const double now = s > 0 ? hi[a] : -lo[a];
    stab[static_cast<std::size_t>(f)] = d ? std::abs(*d - now) : fo.eps;
  }
  return stab;
}

// Belt, offsets.edge_profile: each side face moved out to the wall of the rounded-edge profile
// fitted to the points `ue` under its top edge (edge_profile_wall); returns each face's shift.
inline std::array<double, 6> fit_edge_profiles(const points& ue, const mebb_options& o,
                                               Eigen::Vector3d& lo, Eigen::Vector3d& hi) {
  std::array<double, 6> shift{};
  std::vector<double> b1, b2, b3;
  for (int f = 0; f < 4; ++f) {
    const int a = f / 2;
    const double s = f % 2 ? -1.0 : 1.0;
    const double d = s > 0 ? hi[a] : -lo[a];
    if (auto wpos = edge_profile_wall(ue, lo, hi, a, s, d, o, b1, b2, b3)) {
      (s > 0 ? hi[a] : lo[a]) = s * *wpos;
      shift[static_cast<std::size_t>(f)] = *wpos - d;
    }
  }
  return shift;
}

// Between outer iterations: the next frame, centred on the box [lo, hi] of frame `f`. On a belt
// with yaw.from_walls the axes turn by the walls' line fits (wall_yaw_correction over the voxel
// centroids `u`), and the turn is returned; otherwise the axes are estimated again from the points
// of `p` inside the box grown by eps (when at least cleaning.min_points; mebb_near_square in
// `flags` follows) and nothing is returned.
inline std::optional<double> next_frame(const points& p, const points& u, const Eigen::Vector3d& lo,
                                        const Eigen::Vector3d& hi, bool belt, const mebb_options& o,
                                        box_frame& f, unsigned& flags) {
  point3 centre = f.axes * ((lo + hi) / 2) + f.origin;
  if (belt && o.yaw.from_walls) {  // straighten the walls (top-edge line fits)
    const double turn = wall_yaw_correction(u, lo, hi, o);
    f.axes = f.axes * rot_z(turn);
    f.origin = centre;
    f.origin.z() = 0;
    return turn;
  }
  points inside;
  for (std::size_t i = 0; i < p.size(); ++i)
    if ((u[i].array() >= lo.array() - o.faces.eps).all() &&
        (u[i].array() <= hi.array() + o.faces.eps).all())
      inside.push_back(p[i]);
  if (inside.size() >= o.cleaning.min_points) {
    unsigned fl = 0;
    f.axes = estimate_axes(inside, belt, o, fl);
    flags = (flags & ~static_cast<unsigned>(mebb_near_square)) | fl;
    f.origin = centre;
    if (belt) f.origin.z() = 0;
  }
  return std::nullopt;
}

// Belt: how far inside each side face of [lo, hi] the body's edge is solid (solid_edge_depth
// over `ue`, the points the edge checks read); sets r.face_reach, r.face_noise and r.face_cut and
// returns the depths.
inline std::array<double, 6> solid_edges(const points& ue, const Eigen::Vector3d& lo,
                                         const Eigen::Vector3d& hi, const mebb_options& o,
                                         mebb_result& r) {
  std::array<double, 6> reach{};
  for (int f = 0; f < 4; ++f) {
    const auto se = solid_edge_depth(ue, lo, hi, f / 2, f % 2 ? -1.0 : 1.0, o);
    const auto ff = static_cast<std::size_t>(f);
    reach[ff] = r.face_reach[ff] = se.depth, r.face_noise[ff] = se.noise;
    r.face_cut[ff] = se.grip;
  }
  return reach;
}

// Belt: the faces moved out for what the camera does not see (offsets): by offsets.bias_side and
// offsets.bias_top x the belt's sigma, and each side face whose wall is not seen below its top edge
// (wall_seen_share over the sensor points `uf`, when there are any) by offsets.side + side_pitch x
// the top's point pitch (r.pitch, from `top_snap` points in the top's band) plus the silhouette
// r (1 - cos alpha) (corner_radius over `uf` and shadow_tilt over `belt_floor`), each times the
// share of the wall not seen. Sets r.pitch, r.edge_radius, r.face_tilt and r.face_silhouette.
inline void offset_faces(const points* uf, const belt_raster* belt_floor, const box_frame& frame,
                         std::size_t top_snap, const mebb_options& o, Eigen::Vector3d& lo,
                         Eigen::Vector3d& hi, mebb_result& r) {
  const mebb_offset_options& oo = o.offsets;
  const double sigma = o.belt.sigma;
  // the inward bias of the faces grows with the sensor noise (calibrated, see offsets)
  hi.x() += oo.bias_side * sigma, lo.x() -= oo.bias_side * sigma;
  hi.y() += oo.bias_side * sigma, lo.y() -= oo.bias_side * sigma;
  hi.z() += oo.bias_top * sigma;
  if (uf && top_snap > 0)
    r.pitch = std::sqrt((hi.x() - lo.x()) * (hi.y() - lo.y()) / static_cast<double>(top_snap));
  const double out = oo.side + oo.side_pitch * r.pitch;
  std::array<double, 4> silhouette{};  // r (1 - cos alpha) per face (offsets.silhouette)
  if (uf && belt_floor != nullptr && oo.silhouette) {
    const double pitch = std::max(r.pitch, o.cleaning.voxel / 2);
    if (const auto radius =
            corner_radius(*uf, lo, hi, pitch, o.faces.column, o.faces.eps, oo.radius_max)) {
      r.edge_radius = *radius;
      for (int f = 0; f < 4; ++f)
        if (const auto t =
                shadow_tilt(*belt_floor, frame.axes, frame.origin, lo, hi, f / 2,
                            f % 2 ? -1.0 : 1.0, *radius, o.faces.column, oo.shadow_reach)) {
          r.face_tilt[static_cast<std::size_t>(f)] = *t;
          silhouette[static_cast<std::size_t>(f)] = *radius * (1 - 1 / std::hypot(1.0, *t));
        }
    }
  }
  for (int f = 0; f < 4; ++f) {  // a wall seen below its top edge needs no offset
    const double seen = uf ? wall_seen_share(*uf, lo, hi, f / 2, f % 2 ? -1.0 : 1.0,
                                             std::max(r.pitch, o.cleaning.voxel / 2), o)
                           : 0.0;
    const auto ff = static_cast<std::size_t>(f);
    r.face_silhouette[ff] = silhouette[ff] * (1 - seen);
    (f % 2 ? lo[f / 2] : hi[f / 2]) += (f % 2 ? -1.0 : 1.0) * (out + silhouette[ff]) * (1 - seen);
  }
}

// Belt, checks.hidden: a side face whose top edge lies under something above the top (`over`,
// the points above the belt cut in the box frame) over at least checks.hidden_flag_share of its
// span, with the top continuing (at least checks.hidden_top_points distinct points at the top
// height) within g past it: the edge is the near side of the overhang's shadow (the strip beside it
// shows the top going on), not the body's (mebb_face_hidden). Sets r.face_hidden and
// r.face_hidden_top.
inline void check_hidden_faces(const points& over, const Eigen::Vector3d& lo,
                               const Eigen::Vector3d& hi, const mebb_options& o, mebb_result& r) {
  const double g = o.faces.column;
  for (int f = 0; f < 4; ++f) {
    const int a = f / 2, h = 1 - a;
    const double s = f % 2 ? -1.0 : 1.0, d = s > 0 ? hi[a] : -lo[a];
    double share = 0;
    (void)hidden_span(over, lo, hi, a, s, o, share);
    r.face_hidden[static_cast<std::size_t>(f)] = share;
    if (share < o.checks.hidden_flag_share) continue;
    std::vector<std::pair<index_t, point3>> past_top;
    for (const auto& q : over) {
      if (std::abs(q.z() - hi.z()) > g || q[h] < lo[h] || q[h] > hi[h]) continue;
      const double past = s * q[a] - d;
      if (past >= 0 && past <= g) past_top.emplace_back(0, q);
    }
    const auto k = static_cast<std::size_t>(distinct_cells(past_top, 1)[0]);
    r.face_hidden_top[static_cast<std::size_t>(f)] = k;
    if (k >= o.checks.hidden_top_points) r.flags |= mebb_face_hidden;
  }
}

// The output in input coordinates: r.box from [lo, hi], r.envelope from every point of `u` (on a
// belt down to the belt), r.trim (how far `u` protrudes past each face, within the other two
// axes' extent; none below a belt) and mebb_appendage for a trim above checks.appendage_flag.
inline void box_and_envelope(const points& u, bool belt, const box_frame& frame,
                             const Eigen::Vector3d& lo, const Eigen::Vector3d& hi,
                             const mebb_options& o, mebb_result& r) {
  Eigen::Vector3d elo = Eigen::Vector3d::Constant(INFINITY), ehi = -elo;
  for (int f = 0; f < 6; ++f) r.trim[static_cast<std::size_t>(f)] = 0;
  for (const auto& x : u) {
    elo = elo.cwiseMin(x), ehi = ehi.cwiseMax(x);
    for (int a = 0; a < 3; ++a) {
      const int b = (a + 1) % 3, c = (a + 2) % 3;
      if (x[b] < lo[b] || x[b] > hi[b] || x[c] < lo[c] || x[c] > hi[c]) continue;
      auto& tp = r.trim[static_cast<std::size_t>(2 * a)];
      auto& tm = r.trim[static_cast<std::size_t>(2 * a + 1)];
      tp = std::max(tp, x[a] - hi[a]);
      tm = std::max(tm, lo[a] - x[a]);
    }
  }
  if (belt) elo.z() = 0, r.trim[5] = 0;
  for (double t : r.trim)
    if (t > o.checks.appendage_flag) r.flags |= mebb_appendage;
  auto make = [&](const Eigen::Vector3d& l, const Eigen::Vector3d& h) {
    oriented_box b;
    b.rotation = frame.axes;
    b.extent = (h - l).cwiseMax(0.0);
    b.centre = frame.axes * ((l + h) / 2) + frame.origin;
    return b;
  };
  r.box = make(lo, hi);
  r.envelope = make(elo, ehi);
}

// The uncertainty model (uncertainty): per face, a floor plus the standard error of the values it
// snapped to (`snaps`; the 90th percentile of the side faces' band is a less efficient estimate:
// spread), a share of the edge-profile extrapolation (`shift`) and of the belt's noise, the
// stability probe (`stab`) and the solid-edge depth (`reach`); a face that did not snap gets half
// an eps more; on a belt the bottom face gets a tenth of the belt's sigma. All times
// uncertainty.scale. Sets r.face_sigma, r.face_support and r.sigma (per axis).
inline void face_uncertainty(bool belt, const face_snaps& snaps, const std::array<double, 6>& shift,
                             const std::array<double, 6>& stab, const std::array<double, 6>& reach,
                             const mebb_options& o, mebb_result& r) {
  const mebb_uncertainty_options& uo = o.uncertainty;
  for (std::size_t f = 0; f < 6; ++f) {
    const bool head_on = !belt || f == 4;
    if (belt && f == 5) {  // the belt: its noise averaged over the footprint
      r.face_sigma[f] = o.belt.sigma / 10;
      r.face_support[f] = snaps.n[4];
      continue;
    }
    const double n = static_cast<double>(std::max<std::size_t>(snaps.n[f], 1));
    const double floor = head_on ? uo.floor_top : uo.floor_side;
    const double stat = uo.spread * snaps.sd[f] / std::sqrt(n);
    const double prof = uo.profile * shift[f];
    const double noise = uo.noise * o.belt.sigma;
    const double st = uo.stability * stab[f] + reach[f];
    r.face_sigma[f] =
        std::sqrt(floor * floor + stat * stat + prof * prof + noise * noise + st * st) +
        (snaps.n[f] == 0 ? o.faces.eps / 2 : 0.0);
    r.face_support[f] = snaps.n[f];
  }
  for (auto& f : r.face_sigma) f *= uo.scale;
  for (std::size_t a = 0; a < 3; ++a)
    r.sigma[a] = std::hypot(r.face_sigma[2 * a], r.face_sigma[2 * a + 1]);
}

// Belt: the share of the top view's g x g columns over the inner 80 % of the top face of [lo, hi]
// that hold a point of `u` in the upper half of the box (mebb_result::top_occupancy).
inline double top_occupancy(const points& u, const Eigen::Vector3d& lo, const Eigen::Vector3d& hi,
                            const mebb_options& o) {
  const double g = o.faces.column;
  const double x0 = lo.x() + 0.1 * (hi.x() - lo.x()), x1 = hi.x() - 0.1 * (hi.x() - lo.x());
  const double y0 = lo.y() + 0.1 * (hi.y() - lo.y()), y1 = hi.y() - 0.1 * (hi.y() - lo.y());
  const auto nx = std::clamp<index_t>(static_cast<index_t>((x1 - x0) / g), 1, 4000);
  const auto ny = std::clamp<index_t>(static_cast<index_t>((y1 - y0) / g), 1, 4000);
  std::vector<char> occ(static_cast<std::size_t>(nx * ny), 0);
  for (const auto& x : u) {
    if (x.z() < hi.z() / 2 || x.x() < x0 || x.x() >= x1 || x.y() < y0 || x.y() >= y1) continue;
    const index_t i = std::min<index_t>(static_cast<index_t>((x.x() - x0) / g), nx - 1);
    const index_t j = std::min<index_t>(static_cast<index_t>((x.y() - y0) / g), ny - 1);
    occ[static_cast<std::size_t>(i * ny + j)] = 1;
  }
  std::size_t k = 0;
  for (char c : occ) k += c != 0;
  return static_cast<double>(k) / static_cast<double>(occ.size());
}

}  // namespace detail

/// MEBB on an already cleaned and voxelised cloud `p`. With `belt`, `p` is in the belt frame
/// (belt z = 0, up +z) and the bottom face rests on the belt; without, all six faces are elastic.
/// `fine`: the sensor points whose voxels survived the cleaning (faces.fine); `overhead`: every
/// point above the belt cut, before the cleaning (belt frame), for the hidden-edge check
/// (checks.hidden); `belt_floor`: the belt's points around the object (belt_raster_near), for the
/// silhouette offset (offsets.silhouette).
///
/// The steps: the frame (PCA / edge-direction yaw about the centroid); then per outer iteration
/// the faces on the voxel centroids, in the last one again on the sensor points, and between
/// iterations a new yaw (on a belt from the walls, with more iterations while it still turns by
/// more than yaw.settle); then, on a belt, the solid-edge depths, the offsets for unseen walls and
/// the hidden-face check; the box, envelope and trims; the uncertainty; the top's occupancy.
inline mebb_result mebb_solve(const points& p, bool belt, const mebb_options& o = {},
                              const points* fine = nullptr, const points* overhead = nullptr,
                              const belt_raster* belt_floor = nullptr) {
  detail::check_options(o);
  check(p.size() >= o.cleaning.min_points, "mebb: ", p.size(),
        " points after cleaning, expected at least ", o.cleaning.min_points);
  mebb_result r;
  r.points_used = p.size();
  r.flags = detail::shape_flags(p);
  detail::box_frame frame = detail::initial_frame(p, belt, o, r.flags);
  const bool use_fine = fine != nullptr && o.faces.fine && fine->size() >= o.cleaning.min_points;
  const bool use_hidden = belt && o.checks.hidden && overhead != nullptr;
  points u;     // the voxel centroids in the box frame
  points uf;    // the sensor points in the box frame (last outer iteration)
  points over;  // hidden-edge check: the overhead points in the last frame (upper two thirds)
  Eigen::Vector3d lo, hi;
  detail::face_scratch w;
  detail::face_snaps snaps;
  std::array<double, 6> shift{}, stab{};
  // belt, yaw.from_walls: the yaw steps go on (up to yaw.max_outer_iterations) while the last one
  // turned the axes by more than yaw.settle
  int outer_runs = o.yaw.outer_iterations;
  for (int outer = 0; outer < outer_runs; ++outer) {
    const bool last = outer + 1 == outer_runs;
    r.outer_runs = outer + 1;
    detail::to_frame(p, frame, u);
    detail::bounds(u, belt, lo, hi);
    if (use_hidden && last) {
      over.clear();
      for (const auto& x : *overhead)
        if (x.z() > hi.z() / 3) over.push_back(frame.axes.transpose() * (x - frame.origin));
    }
    detail::solve_faces(u, belt, o, lo, hi, snaps, w, r);
    if (last && use_fine) {  // the faces again on the sensor points (lattice-free)
      detail::to_frame(*fine, frame, uf);
      detail::solve_faces_fine(uf, belt, o, lo, hi, snaps, w);
    }
    if (last && o.uncertainty.stability > 0) stab = detail::face_stability(u, belt, o, lo, hi, w);
    if (belt && o.offsets.edge_profile)
      shift = detail::fit_edge_profiles(last && use_fine ? uf : u, o, lo, hi);
    if (!last) {
      const auto turn = detail::next_frame(p, u, lo, hi, belt, o, frame, r.flags);
      if (turn && outer + 2 == outer_runs && std::abs(*turn) > o.yaw.settle &&
          outer_runs < o.yaw.max_outer_iterations)
        ++outer_runs;
    }
  }
  std::array<double, 6> reach{};  // belt: how far inside each side face the body's edge is solid
  if (belt) {
    reach = detail::solid_edges(use_fine ? uf : u, lo, hi, o, r);
    detail::offset_faces(use_fine ? &uf : nullptr, belt_floor, frame, snaps.n[4], o, lo, hi, r);
    if (use_hidden) detail::check_hidden_faces(over, lo, hi, o, r);
  }
  detail::box_and_envelope(u, belt, frame, lo, hi, o, r);
  detail::face_uncertainty(belt, snaps, shift, stab, reach, o, r);
  if (belt) r.top_occupancy = detail::top_occupancy(u, lo, hi, o);
  r.dims = r.box.sorted_dims();
  return r;
}

/// Belt setting: the largest share, over the four side faces of `box` (belt frame, upright), of
/// the face's g-columns along its width that hold a point of `p` at the box's top height (within
/// g) between g and o.checks.past_reach outside the face. A body's top does not continue past its
/// faces (appendages at the top height are narrow: straps, tags); a large share means that part of
/// the body was cut off, e.g. a strip of a standing bag's top end that the shadow of its extended
/// handle separated from the rest and the cleaning dropped as another cluster. Faces with
/// `cut[f] > 0` (a grip cut off them by measure(), mebb_result::face_cut: its noisy points reach
/// the top height) are left out.
inline double top_past_face_share(const points& p, const oriented_box& box, const mebb_options& o,
                                  const std::array<double, 6>& cut = {}) {
  const double g = o.faces.column, top = box.extent.z() / 2;
  std::array<std::vector<char>, 4> hit;
  for (int f = 0; f < 4; ++f) {
    const auto nb = std::clamp<index_t>(static_cast<index_t>(box.extent[1 - f / 2] / g), 1, 4000);
    hit[static_cast<std::size_t>(f)].assign(static_cast<std::size_t>(nb), 0);
  }
  for (const auto& x : p) {
    const point3 q = box.rotation.transpose() * (x - box.centre);
    if (std::abs(q.z() - top) > g) continue;
    for (int f = 0; f < 4; ++f) {
      const int a = f / 2, b = 1 - a;
      const double s = f % 2 ? -1.0 : 1.0, half_b = box.extent[b] / 2;
      const double out = s * q[a] - box.extent[a] / 2;
      if (out < g || out > o.checks.past_reach || q[b] < -half_b || q[b] > half_b) continue;
      auto& h = hit[static_cast<std::size_t>(f)];
      const auto nb = static_cast<index_t>(h.size());
      h[static_cast<std::size_t>(
          std::min<index_t>(static_cast<index_t>((q[b] + half_b) / g), nb - 1))] = 1;
    }
  }
  double share = 0;
  for (std::size_t f = 0; f < 4; ++f) {
    if (cut[f] > 0) continue;
    std::size_t k = 0;
    for (char c : hit[f]) k += c != 0;
    share = std::max(share, static_cast<double>(k) / static_cast<double>(hit[f].size()));
  }
  return share;
}

/// Belt setting: whether something above the top of `box` (belt frame, upright) overhangs its
/// side face f: points of `p` more than g above the top, within the face's span, from
/// o.checks.past_reach outside the face to `depth` + g inside it, in at least a tenth of the face's
/// g-columns. A standing bag's raised handle does; a grip sticking out of a lying bag does not.
inline bool grip_overhangs(const points& p, const oriented_box& box, int f, double depth,
                           const mebb_options& o) {
  const double g = o.faces.column, top = box.extent.z() / 2;
  const int a = f / 2, b = 1 - a;
  const double s = f % 2 ? -1.0 : 1.0, half_b = box.extent[b] / 2;
  const auto nb = std::clamp<index_t>(static_cast<index_t>(box.extent[b] / g), 1, 4000);
  std::vector<char> hit(static_cast<std::size_t>(nb), 0);
  for (const auto& x : p) {
    const point3 q = box.rotation.transpose() * (x - box.centre);
    if (q.z() <= top + g || q[b] < -half_b || q[b] > half_b) continue;
    const double in = box.extent[a] / 2 - s * q[a];  // depth inside the face
    if (in < -o.checks.past_reach || in > depth + g) continue;
    hit[static_cast<std::size_t>(
        std::min<index_t>(static_cast<index_t>((q[b] + half_b) / g), nb - 1))] = 1;
  }
  index_t k = 0;
  for (char c : hit) k += c != 0;
  return k * 10 >= nb;
}

/// MEBB end to end on any PointCloud in the belt frame (belt z = 0, up +z) or, with belt =
/// false, a full-3D cloud: cleaning, voxelisation, then mebb_solve. The cloud is read in place;
/// only the points above the belt cut are kept.
template <PointCloud C>
mebb_result mebb(const C& cloud, bool belt, const mebb_options& o = {}) {
  detail::check_options(o);
  const std::size_t n = cloud.kdtree_get_point_count();
  check(n >= o.cleaning.min_points, "mebb: the cloud has ", n, " points, expected at least ",
        o.cleaning.min_points);
  const double cut = belt ? detail::belt_cut(o.belt) : -INFINITY;
  points p;
  p.reserve(belt ? n / 2 : n);
  for (std::size_t i = 0; i < n; ++i) {
    const point3 x = point_at(cloud, i);
    if (!x.allFinite())
      fail("mebb: point ", i, " is (", x.x(), ", ", x.y(), ", ", x.z(),
           "), expected finite coordinates");
    if (x.z() >= cut) p.push_back(x);
  }
  points raw;
  const points q = mebb_clean(p, belt, o, o.faces.fine ? &raw : nullptr);
  check(q.size() >= o.cleaning.min_points, "mebb: ", q.size(), " points left after cleaning (",
        belt ? "belt removal, " : "", "voxel grid ", o.cleaning.voxel,
        ", clustering, outlier removal), expected at least ", o.cleaning.min_points);
  const belt_raster belt_floor =
      belt && o.offsets.silhouette
          ? belt_raster_near(
                cloud, [](const point3& x) { return x; }, q, cut, o.offsets.shadow_reach,
                o.offsets.radius_max, o.cleaning.voxel / 2)
          : belt_raster{};
  mebb_result r =
      mebb_solve(q, belt, o, o.faces.fine ? &raw : nullptr, belt ? &p : nullptr, &belt_floor);
  if (belt) r.top_past = top_past_face_share(p, r.box, o);
  r.face_cut = {};  // measure() applies the grip cuts; here they are not applied
  return r;
}

/// mebb() on a `points` vector.
inline mebb_result mebb(const points& p, bool belt, const mebb_options& o = {}) {
  return mebb(as_cloud(p), belt, o);
}

/// Per-point labels of a measured cloud (see label_points).
enum class point_label : std::uint8_t { body = 0, appendage = 1, belt = 2, outlier = 3 };

/// Labels each point of `p` (same frame as the measurement): belt (below the belt cut, belt
/// setting only), body (inside the main box grown by eps), appendage (outside it, inside the
/// envelope grown by eps) or outlier (removed by cleaning, outside the envelope).
inline std::vector<point_label> label_points(const points& p, const mebb_result& r, bool belt,
                                             const mebb_options& o = {}) {
  std::vector<point_label> out(p.size());
  const double cut = detail::belt_cut(o.belt);
  for (std::size_t i = 0; i < p.size(); ++i) {
    if (belt && p[i].z() < cut)
      out[i] = point_label::belt;
    else if (r.box.contains(p[i], o.faces.eps))
      out[i] = point_label::body;
    else if (r.envelope.contains(p[i], o.faces.eps))
      out[i] = point_label::appendage;
    else
      out[i] = point_label::outlier;
  }
  return out;
}

}  // namespace tightfit::geometry
