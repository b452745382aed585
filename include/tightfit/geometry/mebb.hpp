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
// mebb_options with the defaults of the published method; departures from it are documented in
// docs/mebb.md. Invariants: the result's box lies inside the cleaned cloud's envelope, except
// that on a belt the side faces of unseen walls move out by the offsets for what the camera cannot
// see (side_offset_pitch, silhouette_offset: a few mm); the result does not depend on the order of
// the input points beyond rounding.
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
  mebb_appendage = 1u << 3,      ///< some face trimmed more than options.appendage_flag
  mebb_flat = 1u << 4,           ///< degenerate: the cleaned cloud is (nearly) coplanar
  mebb_line = 1u << 5,           ///< degenerate: the cleaned cloud is (nearly) collinear
  mebb_not_converged = 1u << 6,  ///< the face passes hit max_passes before settling
  /// belt: a side face's top edge lies under something above the top over at least
  /// hidden_flag_share of its span and the top continues past it there (hidden_top_points):
  /// the face is the edge of the overhang's shadow, the body's edge is not observed
  mebb_face_hidden = 1u << 7,
};

/// Every parameter of MEBB (lengths in the cloud's units; defaults assume metres).
struct mebb_options {
  // step 0: cleaning
  bool clean = true;               ///< run belt removal, clustering and outlier removal
  double belt_min_height = 0.008;  ///< belt setting: drop points below max(this, 4 belt sigma)
  double belt_sigma = 0;           ///< belt noise sigma (0: unknown; RANSAC sets it in measure())
  /// belt setting: mixed-pixel (veil) filter, see top_view_dense: a point is dropped when its
  /// top-view column (side `voxel`) holds fewer than this share of the median column (0: off)
  double veil_share = 0;
  double cluster_radius = 0.015;  ///< Euclidean clustering radius; the largest cluster is kept
  int sor_k = 8;                  ///< statistical outlier removal: neighbours
  double sor_sigma = 2.0;         ///< statistical outlier removal: drop mean dist > mu + n sigma
  // step 1: isotropic density
  double voxel = 0.005;  ///< h: voxel-grid size (one centroid per voxel)
  // step 2: main direction
  double square_ratio = 1.5;  ///< lambda1/lambda2 below which the edge-direction yaw is used
  /// Use the edge-direction yaw for every footprint, not only near-square ones (PCA remains the
  /// fallback when no silhouette cell votes): appendages skew the PCA yaw by several degrees on
  /// elongated bags too. An addition to the published method; false gives the paper's rule.
  bool edge_yaw_always = true;
  double edge_radius = 0.025;    ///< neighbourhood of a silhouette cell for its direction
  double edge_elongation = 8.0;  ///< eigenvalue ratio for a silhouette cell to vote
  /// Belt setting: re-estimate the yaw between outer iterations from line fits to the top-edge
  /// points of the four side faces (instead of PCA of the points inside the box, which the
  /// near-square case and the limb geometry bias by 1-3 degrees). An addition to the published
  /// method.
  bool wall_yaw = true;
  // step 3: elastic faces
  double column = 0.010;             ///< g: column size on the face plane
  double eps = 0.006;                ///< elastic softness (about 2 sigma of sensor noise)
  double kappa = 0.4;                ///< share of the occupied membrane that must hold a face
  double safeguard_quantile = 0.75;  ///< a face never moves inward past this quantile
  /// Belt setting: the safeguard for the top face too. Off: seen from above, a standing bag's
  /// handles can hold more than a quarter of the top's points, and the safeguard then lifted the
  /// top onto them, the side faces followed into the handles' footprint (their band hangs from
  /// the top) and the box came out 50-150 mm off with status ok (bench/geometry, seed 401052).
  /// The top's membrane is the whole footprint, seen head-on; its D* needs no guard.
  bool belt_top_safeguard = false;
  double tau = 0;  ///< >0: columns far from their 8-neighbour median get less
                   ///< stiffness k_j = 1/(1 + (|e_j - med|/tau)^2); 0: k_j = 1
  // step 4: snap to the main-body edge
  double snap_inner = 2.0;     ///< band starts snap_inner * eps inside D*
  double snap_outer = 0.015;   ///< band ends snap_outer outside D*
  double side_quantile = 0.9;  ///< side faces snap to this quantile of the band envelopes
  /// Belt setting: a camera above sees a side face only through the rounded top edge, so the
  /// side faces' membranes are built from the layer [top - side_band, top + eps] only (wide
  /// handles and wheels lower down would otherwise outweigh that thin band). <= 0: whole face.
  double side_band = 0.02;
  /// Belt setting: a camera above the belt does not see a side wall below its rounded top edge,
  /// so the last visible points stop a few mm inside the wall. With this on, each side face is
  /// moved out to the wall of a circular edge profile fitted to the points under the top edge
  /// (radius by least median deviation, at most `profile_max_shift` outward, never inward).
  /// An addition to the published method (see docs/mebb.md for the numbers with and without).
  bool edge_profile = false;
  double profile_depth = 0.05;       ///< use points up to this far below the top face
  double profile_max_shift = 0.012;  ///< largest outward correction
  // step 5: iteration and adaptive elasticity
  int max_passes = 6;        ///< face-by-face passes per outer iteration
  int outer_iterations = 2;  ///< yaw re-estimations + 1
  /// belt, wall_yaw: one more yaw re-estimation (up to max_outer_iterations in all) while the
  /// last one turned the axes by more than this (radians): the top-edge line fits see only
  /// [-15, +3] mm about each face, so a yaw error of 1.5-2 degrees over a 700 mm face is only
  /// partly corrected by one step (bench/geometry: the bags whose W came out 9-13 mm too large)
  double yaw_settle = 0.3 * std::numbers::pi / 180;
  int max_outer_iterations = 4;
  bool adaptive = true;          ///< retry with kappa/2 when a face moves too far
  double retry_fraction = 0.25;  ///< "too far": more than this share of the face's extent
  // uncertainty model (mebb_result::face_sigma; calibrated on the scene generator of bench/)
  double sigma_floor_top = 0.0010;   ///< 1-sigma floor of a face seen head-on
  double sigma_floor_side = 0.0015;  ///< 1-sigma floor of a side face
  double sigma_spread = 1.25;        ///< x sd / sqrt(n) of the values the face snapped to
  double sigma_profile = 0.3;        ///< x the edge-profile shift (an extrapolation)
  /// x the belt's noise sigma. 0.1: a least-squares fit of the squared face errors (floor +
  /// standard error + belt sigma, 400 generated bags at noise x1 and x2, faces without a solid-edge
  /// depth) gave 0.07 for the side faces and 0.15 for the top; the face errors hardly grow with
  /// the noise (RMS 1.53 mm at x1, 1.59 mm at x2). 0.3 made every side's interval at x2 ~10 mm.
  double sigma_noise = 0.1;
  double sigma_stability = 0.0;  ///< x how far the face moves at kappa x sigma_kappa_probe
  double sigma_kappa_probe = 0.6;
  /// every face sigma times this: calibrated so that the 95 % intervals cover 95 % of the errors
  /// of the generated scans (bench/geometry, noise x1 and x2)
  double sigma_scale = 1.25;
  /// measure(): solve again on a voxel lattice shifted by half a voxel, report the mean of the
  /// two boxes and add half their difference to each side's sigma
  bool phase_check = false;
  /// mebb_solve with sensor points (`fine`): after the faces settled on the voxel centroids, the
  /// faces are solved again on the sensor points themselves (same frame, same elastic rule), and
  /// the edge profile and the solid-edge check read those points: the final faces then do not
  /// depend on the voxel lattice (the centroids of the voxels cut by a face move with it)
  bool fine_faces = true;
  int fine_passes = 3;  ///< face passes on the sensor points (until none moves more than h/2)
  /// belt: a side face whose outermost g-slab is solid (points above half the height) over
  /// less than solid_share of its width adds the depth to the solid slab (up to solid_depth) to
  /// its uncertainty: a handle or strap holding the face out
  double solid_share = 0.75, solid_depth = 0.08;
  /// the solid-edge check also looks past the first solid slab: a slab holding points in less
  /// than half its columns followed by a solid one is a gap between an appendage as wide as the
  /// face (a handle grip) and the body, and the depth counts to the body
  bool solid_gap = true;
  /// the gap rule's exception for the body's own top strip: when the first solid run ends in a
  /// gap and the mean height of that run's points lies within one column g of the box top, the
  /// run is the body (a top end partly hidden, e.g. under a standing bag's handle grip), not an
  /// appendage, and the depth is its start. A grip that holds a face out sits below the top (a
  /// telescopic handle's grip 17-47 mm on the generated bags).
  bool solid_top_run = true;
  /// and when the gap's own points (its sparse slabs' middle) lie within g of the box top on
  /// average, the gap is a shadow on the body's top (cast by something above it, e.g. a standing
  /// bag's extended handle), not the space between a grip and the body: the depth is the first
  /// run's start. The gap behind a grip holds only the grip's rods, at the grip's height.
  bool solid_shadow_gap = true;
  /// measure(), belt: a side face held out by a grip (the first solid run and the points in the
  /// gap behind it both more than g below the box top, a solid slab after the gap:
  /// mebb_result::face_cut) is solved again without the points outward of the gap's middle,
  /// unless something above the top overhangs that face (grip_overhangs, on every point above
  /// the belt: a standing bag's handle, whose shadow and veils can give the same pattern)
  bool solid_grip_trim = true;
  /// belt: how far past each side face top_past_face_share looks for the object's top
  double past_reach = 0.25;
  /// belt, with `overhead` points (mebb_solve; measure() and mebb() pass every point above the
  /// belt cut, before the cleaning): the hidden-edge check. A side face's span is hidden where
  /// at least two of those points stand more than `hidden_height` above the top, on the face's
  /// half of the box or up to past_reach outside it (g-bins, widened by `hidden_margin` bins on
  /// each side; mebb_result::face_hidden: the hidden share). A face hidden over at least
  /// `hidden_flag_share` of its span with at least `hidden_top_points` points at the top height
  /// (within g) in the first g past it, within its span, sets mebb_face_hidden (reason
  /// "face_hidden"): the camera above cannot see that edge under the overhang (a standing bag's
  /// raised handle), and the top going on past the face says the face is the near edge of the
  /// overhang's shadow, not the body's.
  bool hidden_check = true;
  double hidden_height = 0.02;
  int hidden_margin = 1;
  double hidden_flag_share = 0.5;
  std::size_t hidden_top_points = 8;
  /// belt setting: faces moved out by this x the belt's noise sigma (their inward bias on the
  /// generated scans grows with the noise; 0: no correction)
  double bias_side = 0.0, bias_top = 0.0;
  /// belt setting, with sensor points: each side face whose wall is not seen below its top edge
  /// is moved out by side_offset + side_offset_pitch x the point pitch on the top face
  /// (sqrt(top area / its points)), plus the silhouette below: the outermost point of a column
  /// lies inside the silhouette. A least-squares fit through zero of the per-face error against
  /// the pitch, with the silhouette offset on and this one off (bench/geometry, 400 bags at noise
  /// x1 and x2), gave 0.81 x pitch (1.09 before the silhouette term, which it then carried). A
  /// face whose wall is seen (wall_seen_share) gets that share less.
  double side_offset = 0.0;
  double side_offset_pitch = 0.8;
  /// belt setting, with sensor points and the belt's own points around the object (`belt_floor` of
  /// mebb_solve, silhouette.hpp; measure() and mebb() pass them): each side face whose wall is not
  /// seen moves out by r (1 - cos alpha) more. A camera above sees a rounded top edge of radius r
  /// only down to where its ray grazes it, and with the ray tilted outward by alpha that silhouette
  /// lies r (1 - cos alpha) inside the wall (docs/mebb.md). tan alpha comes from the belt's shadow
  /// behind the face: the median gap, over the face's span, between the face and the first belt
  /// cell past it, over the height of the edge (top - r; shadow_tilt). r comes from the top view
  /// of the four corners (corner_radius). No correction where either is not measured.
  bool silhouette_offset = true;
  double shadow_reach = 1.0;  ///< tan of the largest tilt looked for (45 degrees)
  double radius_max = 0.06;   ///< the largest edge radius looked for
  // output
  double appendage_flag = 0.010;  ///< a face trimmed more than this sets mebb_appendage
  std::size_t min_points = 30;    ///< fewer cleaned points than this is an error
};

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
  /// (hidden_check; 0 without `overhead` points)
  std::array<double, 6> face_hidden{};
  /// and the points at the top height within g past the face, within its span (hidden_top_points;
  /// distinct 1 mm cells: the same with duplicated points)
  std::array<std::size_t, 6> face_hidden_top{};
  /// belt, with sensor points: their pitch on the top face, sqrt(top area / points in its band)
  double pitch = 0;
  /// belt, silhouette_offset: the body's edge radius from its corners (0: not measured), each
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
                                          bool head_on, bool use_guard, const mebb_options& o,
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
  const auto ang = edge_direction_yaw(proj, o.voxel, o.edge_radius, o.edge_elongation);
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
    if ((y.ratio < o.square_ratio || o.edge_yaw_always) && refine_near_square(p, axes, 0, 1, o) &&
        y.ratio < o.square_ratio)
      flags |= mebb_near_square;
    return axes;
  }
  const pca_frame f = pca(p);
  Eigen::Matrix3d axes = f.axes;
  const auto& v = f.variance;
  if (v[1] > 0 && v[0] / v[1] < o.square_ratio * o.square_ratio) {
    if (refine_near_square(p, axes, 0, 1, o)) flags |= mebb_near_square;
  } else if (v[2] > 0 && v[1] / v[2] < o.square_ratio * o.square_ratio) {
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
    if (p[b] < b0 || p[b] > b1 || x < d - 0.03 || x > d + o.profile_max_shift) continue;
    if (dz < o.eps / 2 || dz > o.profile_depth) continue;
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
  return std::min(best_wall, d + o.profile_max_shift);
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
      if (o.side_band > 0 && (p.z() < hi.z() - o.side_band || p.z() > hi.z() + o.eps)) continue;
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
// depth t (steps of g/2, up to solid_depth) at which the top view of the slab [D - t - g, D - t]
// holds points above half the height in at least solid_share of its g-columns along the face.
// A face held out by a handle or a strap sees a sparse slab first; a body edge a solid one.
// With solid_gap, a first solid run followed by a slab holding points in less than half its
// columns is an appendage as wide as the face (a handle grip) and the depth counts to the next
// solid slab, unless (solid_top_run) the run's points lie at the box top (within g): then the
// run is the body's own top strip and the depth is its start.
// `noise` is the face's own scatter, 1.4826 x the median absolute deviation of the columns'
// outermost depths (a diagnostic: mebb_result::face_noise).
struct solid_edge {
  double depth = 0;         // the first solid slab's depth (or past a gap)
  double noise = 0;         // the face's envelope scatter sigma
  double run_height = NAN;  // a first solid run that ends in a gap: its points' mean height
  double gap_height = NAN;  // and the mean height of the points in that gap
  bool top_run = false;     // that run was taken as the body's top strip (solid_top_run)
  bool shadow_gap = false;  // the gap was taken as a shadow on the top (solid_shadow_gap)
  double grip = 0;          // run and gap below the top, a solid slab after: the gap's middle
};
inline solid_edge solid_edge_depth(const points& u, const Eigen::Vector3d& lo,
                                   const Eigen::Vector3d& hi, int a, double s,
                                   const mebb_options& o) {
  const int b = 1 - a;
  const double g = o.column, d = s > 0 ? hi[a] : -lo[a], step = g / 2;
  const auto nb = std::clamp<index_t>(static_cast<index_t>((hi[b] - lo[b]) / g), 1, 4000);
  const auto steps = static_cast<index_t>(o.solid_depth / step);
  std::vector<std::uint64_t> occ(static_cast<std::size_t>(nb), 0);  // bit k: slab step k
  std::vector<double> env(static_cast<std::size_t>(nb), INFINITY);  // outermost depth
  for (const auto& p : u) {
    if (p.z() < hi.z() / 2 || p[b] < lo[b] || p[b] > hi[b]) continue;
    const double depth = d - s * p[a];
    if (depth < 0 || depth > o.solid_depth + g) continue;
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
  double first = o.solid_depth;
  for (index_t k = 0; k <= last; ++k) {
    const auto n = cnt[static_cast<std::size_t>(k)];
    const bool solid = static_cast<double>(n) >= o.solid_share * static_cast<double>(nb);
    if (state == 0 && solid) state = 1, first = static_cast<double>(k) * step;
    if (!o.solid_gap && state == 1) break;
    if (state == 1 && !solid && sparse(k)) {  // less than half the columns: a gap
      state = 2;
      const double t0 = static_cast<double>(k) * step;
      // the run's points (depth [first, start of this slab]) at the box top: the body's own
      // top strip (a grip that holds a face out sits lower)
      r.run_height = mean_height(first, t0);
      if (o.solid_top_run && std::abs(hi.z() - r.run_height) <= g) {
        r.top_run = true;
        break;
      }
      // the points in the gap (the middle of its consecutive sparse slabs) at the box top: a
      // shadow on the body's top, with the body visible beside it
      index_t k2 = k;
      while (k2 < last && sparse(k2 + 1)) ++k2;
      r.gap_height = mean_height(t0 + g / 2, static_cast<double>(k2) * step + g / 2);
      if (o.solid_shadow_gap && std::abs(hi.z() - r.gap_height) <= g) {
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
  const double g = o.column, d = s > 0 ? hi[a] : -lo[a], span = hi[b] - lo[b];
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
// o.hidden_height above the top, box frame) lie, on the face's half of the box or up to
// o.past_reach outside it, widened by o.hidden_margin bins on each side: where the camera above
// cannot see the face's top edge. `share` returns the hidden share of the span.
inline std::vector<char> hidden_span(const points& over, const Eigen::Vector3d& lo,
                                     const Eigen::Vector3d& hi, int a, double s,
                                     const mebb_options& o, double& share) {
  const int h = 1 - a;
  const double g = o.column, d = s > 0 ? hi[a] : -lo[a], half = (hi[a] - lo[a]) / 2;
  const auto n = std::clamp<index_t>(static_cast<index_t>(std::ceil((hi[h] - lo[h]) / g)), 1, 4000);
  std::vector<std::pair<index_t, point3>> in_bins;
  for (const auto& q : over) {
    if (q.z() <= hi.z() + o.hidden_height || q[h] < lo[h] || q[h] > hi[h]) continue;
    const double in = d - s * q[a];  // depth inside the face
    if (in < -o.past_reach || in > half) continue;
    in_bins.emplace_back(std::min<index_t>(static_cast<index_t>((q[h] - lo[h]) / g), n - 1), q);
  }
  const std::vector<int> cnt = distinct_cells(in_bins, n);  // distinct points, in effect
  std::vector<char> mask(static_cast<std::size_t>(n), 0);
  index_t k = 0;
  for (index_t i = 0; i < n; ++i) {
    if (cnt[static_cast<std::size_t>(i)] < 2) continue;
    for (index_t j = std::max<index_t>(0, i - o.hidden_margin);
         j <= std::min<index_t>(n - 1, i + o.hidden_margin); ++j)
      mask[static_cast<std::size_t>(j)] = 1;
  }
  for (char c : mask) k += c != 0;
  share = static_cast<double>(k) / static_cast<double>(n);
  return mask;
}

inline void check_options(const mebb_options& o) {
  check(o.voxel > 0, "mebb: voxel is ", o.voxel, ", expected > 0");
  check(o.column > 0, "mebb: column is ", o.column, ", expected > 0");
  check(o.eps > 0, "mebb: eps is ", o.eps, ", expected > 0");
  check(o.kappa > 0 && o.kappa <= 1, "mebb: kappa is ", o.kappa, ", expected in (0, 1]");
  check(o.safeguard_quantile >= 0 && o.safeguard_quantile <= 1, "mebb: safeguard_quantile is ",
        o.safeguard_quantile, ", expected in [0, 1]");
  check(o.side_quantile >= 0 && o.side_quantile <= 1, "mebb: side_quantile is ", o.side_quantile,
        ", expected in [0, 1]");
  check(o.cluster_radius > 0, "mebb: cluster_radius is ", o.cluster_radius, ", expected > 0");
  check(o.max_passes >= 1, "mebb: max_passes is ", o.max_passes, ", expected >= 1");
  check(o.outer_iterations >= 1, "mebb: outer_iterations is ", o.outer_iterations,
        ", expected >= 1");
  check(o.min_points >= 4, "mebb: min_points is ", o.min_points, ", expected >= 4");
  check(o.yaw_settle >= 0, "mebb: yaw_settle is ", o.yaw_settle, ", expected >= 0");
  check(o.shadow_reach > 0, "mebb: shadow_reach is ", o.shadow_reach, ", expected > 0");
  check(o.radius_max > 0, "mebb: radius_max is ", o.radius_max, ", expected > 0");
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
    const double cut = std::max(o.belt_min_height, 4 * o.belt_sigma);
    q.reserve(p.size());
    for (const auto& x : p)
      if (x.z() >= cut) q.push_back(x);
    if (o.veil_share > 0) {
      const auto dense = top_view_dense(q, o.voxel, o.veil_share);
      std::size_t k = 0;
      for (std::size_t i = 0; i < q.size(); ++i)
        if (dense[i]) q[k++] = q[i];
      q.resize(k);
    }
  } else {
    q = p;
  }
  std::vector<std::uint32_t> voxel_of;
  points v = voxel_downsample(q, o.voxel, raw ? &voxel_of : nullptr);
  std::vector<char> keep(v.size(), 1);
  if (o.clean && !v.empty()) {
    auto clusters = euclidean_clusters(v, o.cluster_radius);
    std::sort(clusters[0].begin(), clusters[0].end());
    points c;
    c.reserve(clusters[0].size());
    for (std::size_t i : clusters[0]) c.push_back(v[i]);
    const auto inl = statistical_inliers(c, o.sor_k, o.sor_sigma);
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

/// MEBB on an already cleaned and voxelised cloud `p`. With `belt`, `p` is in the belt frame
/// (belt z = 0, up +z) and the bottom face rests on the belt; without, all six faces are elastic.
/// `fine`: the sensor points whose voxels survived the cleaning (fine_faces); `overhead`: every
/// point above the belt cut, before the cleaning (belt frame), for the hidden-edge check
/// (hidden_check); `belt_floor`: the belt's points around the object (belt_raster_near), for the
/// silhouette offset (silhouette_offset).
inline mebb_result mebb_solve(const points& p, bool belt, const mebb_options& o = {},
                              const points* fine = nullptr, const points* overhead = nullptr,
                              const belt_raster* belt_floor = nullptr) {
  detail::check_options(o);
  check(p.size() >= o.min_points, "mebb: ", p.size(), " points after cleaning, expected at least ",
        o.min_points);
  mebb_result r;
  r.points_used = p.size();
  {
    const pca_frame f = pca(p);
    const double scale = std::sqrt(f.variance[0]);
    check(scale > 0, "mebb: all ", p.size(), " points coincide, expected an object");
    if (std::sqrt(f.variance[1]) < 1e-6 * scale)
      r.flags |= mebb_line;
    else if (std::sqrt(f.variance[2]) < 1e-6 * scale)
      r.flags |= mebb_flat;
  }
  Eigen::Matrix3d axes = detail::estimate_axes(p, belt, o, r.flags);
  point3 origin = point3::Zero();
  for (const auto& x : p) origin += x;
  origin /= static_cast<double>(p.size());
  if (belt) origin.z() = 0;
  points u(p.size());
  Eigen::Vector3d lo, hi;
  detail::face_scratch w;
  const bool use_fine = fine != nullptr && o.fine_faces && fine->size() >= o.min_points;
  points uf;  // the sensor points in the box frame (last outer iteration)
  std::array<std::size_t, 6> snap_n{};
  std::array<double, 6> snap_sd{}, shift{}, stab{};
  // the hidden-edge check (belt): the overhead points in the box frame (upper two thirds)
  const bool use_hidden = belt && o.hidden_check && overhead != nullptr;
  points over_all;
  // belt, wall_yaw: the yaw steps go on (up to max_outer_iterations) while the last one turned the
  // axes by more than yaw_settle
  int outer_runs = o.outer_iterations;
  // the faces the safeguard applies to: all but the top on a belt (belt_top_safeguard)
  auto guarded = [&](int f) { return !belt || f != 4 || o.belt_top_safeguard; };
  for (int outer = 0; outer < outer_runs; ++outer) {
    const bool last = outer + 1 == outer_runs;
    r.outer_runs = outer + 1;
    for (std::size_t i = 0; i < p.size(); ++i) u[i] = axes.transpose() * (p[i] - origin);
    lo = Eigen::Vector3d::Constant(INFINITY), hi = -lo;
    for (const auto& x : u) lo = lo.cwiseMin(x), hi = hi.cwiseMax(x);
    if (belt) lo.z() = 0;
    if (use_hidden && last) {  // the last frame
      over_all.clear();
      for (const auto& x : *overhead)
        if (x.z() > hi.z() / 3) over_all.push_back(axes.transpose() * (x - origin));
    }
    const Eigen::Vector3d lo0 = lo, hi0 = hi;
    bool settled = false;
    for (int pass = 0; pass < o.max_passes && !settled; ++pass) {
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
        double zmin = -INFINITY, zmax = INFINITY;
        if (belt && a < 2 && o.side_band > 0) zmin = hi.z() - o.side_band, zmax = hi.z() + o.eps;
        auto d = detail::elastic_face(u, lo, hi, a, s, o.kappa, head_on, guarded(f), o, w, guard,
                                      zmin, zmax);
        if (!d) continue;
        if (o.adaptive && (guard || extreme - *d > o.retry_fraction * (hi0[a] - lo0[a]))) {
          bool guard2 = false;
          auto d2 = detail::elastic_face(u, lo, hi, a, s, o.kappa / 2, head_on, guarded(f), o, w,
                                         guard2, zmin, zmax);
          if (d2) d = d2, guard = guard2;
          r.flags |= mebb_soft_retry;
        }
        if (guard) r.flags |= mebb_safeguard;
        snap_n[static_cast<std::size_t>(f)] = w.snap_n;
        snap_sd[static_cast<std::size_t>(f)] = w.snap_sd;
        const double nd = std::min(*d, extreme);
        (s > 0 ? hi[a] : lo[a]) = s * nd;
        moved = std::max(moved, std::abs(nd - old));
      }
      settled = moved <= o.voxel / 2;
    }
    if (!settled) r.flags |= mebb_not_converged;
    if (last && use_fine) {  // the faces again on the sensor points (lattice-free)
      uf.resize(fine->size());
      for (std::size_t i = 0; i < fine->size(); ++i)
        uf[i] = axes.transpose() * ((*fine)[i] - origin);
      for (int pass = 0; pass < o.fine_passes; ++pass) {
        double moved = 0;
        for (int f : {4, 0, 1, 2, 3, 5}) {
          const int a = f / 2;
          const double s = f % 2 ? -1.0 : 1.0;
          if (belt && f == 5) continue;
          const bool head_on = !belt || f == 4;
          double zmin = -INFINITY, zmax = INFINITY;
          if (belt && a < 2 && o.side_band > 0) zmin = hi.z() - o.side_band, zmax = hi.z() + o.eps;
          bool guard = false;
          const double old = s > 0 ? hi[a] : -lo[a];
          auto d = detail::elastic_face(uf, lo, hi, a, s, o.kappa, head_on, guarded(f), o, w, guard,
                                        zmin, zmax);
          if (!d) continue;
          snap_n[static_cast<std::size_t>(f)] = w.snap_n;
          snap_sd[static_cast<std::size_t>(f)] = w.snap_sd;
          (s > 0 ? hi[a] : lo[a]) = s * *d;
          moved = std::max(moved, std::abs(*d - old));
        }
        if (moved <= o.voxel / 2) break;
      }
    }
    const points& ue = last && use_fine ? uf : u;  // what the edge checks read
    if (last && o.sigma_stability > 0) {           // stability: the faces again at a softer kappa
      for (int f = 0; f < 6; ++f) {
        const int a = f / 2;
        const double s = f % 2 ? -1.0 : 1.0;
        if (belt && f == 5) continue;
        double zmin = -INFINITY, zmax = INFINITY;
        if (belt && a < 2 && o.side_band > 0) zmin = hi.z() - o.side_band, zmax = hi.z() + o.eps;
        bool guard = false;
        const auto d = detail::elastic_face(u, lo, hi, a, s, o.kappa * o.sigma_kappa_probe,
                                            !belt || f == 4, guarded(f), o, w, guard, zmin, zmax);
        const double now = s > 0 ? hi[a] : -lo[a];
        stab[static_cast<std::size_t>(f)] = d ? std::abs(*d - now) : o.eps;
      }
    }
    if (belt && o.edge_profile) {
      std::vector<double> b1, b2, b3;
      for (int f = 0; f < 4; ++f) {
        const int a = f / 2;
        const double s = f % 2 ? -1.0 : 1.0;
        const double d = s > 0 ? hi[a] : -lo[a];
        shift[static_cast<std::size_t>(f)] = 0;
        if (auto wpos = detail::edge_profile_wall(ue, lo, hi, a, s, d, o, b1, b2, b3)) {
          (s > 0 ? hi[a] : lo[a]) = s * *wpos;
          shift[static_cast<std::size_t>(f)] = *wpos - d;
        }
      }
    }
    if (!last) {  // re-estimate the axes from the points inside
      points inside;
      point3 centre = axes * ((lo + hi) / 2) + origin;
      for (std::size_t i = 0; i < p.size(); ++i)
        if ((u[i].array() >= lo.array() - o.eps).all() &&
            (u[i].array() <= hi.array() + o.eps).all())
          inside.push_back(p[i]);
      if (belt && o.wall_yaw) {  // straighten the walls (top-edge line fits)
        const double turn = detail::wall_yaw_correction(u, lo, hi, o);
        axes = axes * rot_z(turn);
        origin = centre;
        origin.z() = 0;
        if (outer + 2 == outer_runs && std::abs(turn) > o.yaw_settle &&
            outer_runs < o.max_outer_iterations)
          ++outer_runs;
      } else if (inside.size() >= o.min_points) {
        unsigned fl = 0;
        axes = detail::estimate_axes(inside, belt, o, fl);
        r.flags = (r.flags & ~static_cast<unsigned>(mebb_near_square)) | fl;
        origin = centre;
        if (belt) origin.z() = 0;
      }
    }
  }
  std::array<double, 6> reach{};  // belt: how far inside each side face the body's edge is solid
  if (belt) {
    for (int f = 0; f < 4; ++f) {
      const auto se =
          detail::solid_edge_depth(use_fine ? uf : u, lo, hi, f / 2, f % 2 ? -1.0 : 1.0, o);
      const auto ff = static_cast<std::size_t>(f);
      reach[ff] = r.face_reach[ff] = se.depth, r.face_noise[ff] = se.noise;
      r.face_cut[ff] = se.grip;
    }
  }
  if (belt) {  // the inward bias of the faces grows with the sensor noise (calibrated, see o)
    hi.x() += o.bias_side * o.belt_sigma, lo.x() -= o.bias_side * o.belt_sigma;
    hi.y() += o.bias_side * o.belt_sigma, lo.y() -= o.bias_side * o.belt_sigma;
    hi.z() += o.bias_top * o.belt_sigma;
    if (use_fine && snap_n[4] > 0)
      r.pitch = std::sqrt((hi.x() - lo.x()) * (hi.y() - lo.y()) / static_cast<double>(snap_n[4]));
    const double out = o.side_offset + o.side_offset_pitch * r.pitch;
    std::array<double, 4> silhouette{};  // r (1 - cos alpha) per face (silhouette_offset)
    if (use_fine && belt_floor != nullptr && o.silhouette_offset) {
      const double pitch = std::max(r.pitch, o.voxel / 2);
      if (const auto radius = corner_radius(uf, lo, hi, pitch, o.column, o.eps, o.radius_max)) {
        r.edge_radius = *radius;
        for (int f = 0; f < 4; ++f)
          if (const auto t = shadow_tilt(*belt_floor, axes, origin, lo, hi, f / 2,
                                         f % 2 ? -1.0 : 1.0, *radius, o.column, o.shadow_reach)) {
            r.face_tilt[static_cast<std::size_t>(f)] = *t;
            silhouette[static_cast<std::size_t>(f)] = *radius * (1 - 1 / std::hypot(1.0, *t));
          }
      }
    }
    for (int f = 0; f < 4; ++f) {  // a wall seen below its top edge needs no offset
      const double seen = use_fine ? detail::wall_seen_share(uf, lo, hi, f / 2, f % 2 ? -1.0 : 1.0,
                                                             std::max(r.pitch, o.voxel / 2), o)
                                   : 0.0;
      const auto ff = static_cast<std::size_t>(f);
      r.face_silhouette[ff] = silhouette[ff] * (1 - seen);
      (f % 2 ? lo[f / 2] : hi[f / 2]) += (f % 2 ? -1.0 : 1.0) * (out + silhouette[ff]) * (1 - seen);
    }
    // a face whose top edge lies under something above the top over most of its span, with the
    // top continuing (points at the top height) within g past it: the edge is the near side of
    // the overhang's shadow (the strip beside it shows the top going on), not the body's
    if (use_hidden) {
      const double g = o.column;
      for (int f = 0; f < 4; ++f) {
        const int a = f / 2, h = 1 - a;
        const double s = f % 2 ? -1.0 : 1.0, d = s > 0 ? hi[a] : -lo[a];
        double share = 0;
        (void)detail::hidden_span(over_all, lo, hi, a, s, o, share);
        r.face_hidden[static_cast<std::size_t>(f)] = share;
        if (share < o.hidden_flag_share) continue;
        std::vector<std::pair<index_t, point3>> past_top;
        for (const auto& q : over_all) {
          if (std::abs(q.z() - hi.z()) > g || q[h] < lo[h] || q[h] > hi[h]) continue;
          const double past = s * q[a] - d;
          if (past >= 0 && past <= g) past_top.emplace_back(0, q);
        }
        const auto k = static_cast<std::size_t>(detail::distinct_cells(past_top, 1)[0]);
        r.face_hidden_top[static_cast<std::size_t>(f)] = k;
        if (k >= o.hidden_top_points) r.flags |= mebb_face_hidden;
      }
    }
  }
  // output: box, envelope and per-face trim in the last frame
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
    if (t > o.appendage_flag) r.flags |= mebb_appendage;
  auto make = [&](const Eigen::Vector3d& l, const Eigen::Vector3d& h) {
    oriented_box b;
    b.rotation = axes;
    b.extent = (h - l).cwiseMax(0.0);
    b.centre = axes * ((l + h) / 2) + origin;
    return b;
  };
  r.box = make(lo, hi);
  r.envelope = make(elo, ehi);
  // uncertainty: per face, a floor plus the standard error of the values it snapped to (the
  // 90th percentile of the side faces' band is a less efficient estimate: sigma_spread) plus a
  // share of the edge-profile extrapolation; a face that did not snap gets half an eps more
  for (std::size_t f = 0; f < 6; ++f) {
    const bool head_on = !belt || f == 4;
    if (belt && f == 5) {  // the belt: its noise averaged over the footprint
      r.face_sigma[f] = o.belt_sigma / 10;
      r.face_support[f] = snap_n[4];
      continue;
    }
    const double n = static_cast<double>(std::max<std::size_t>(snap_n[f], 1));
    const double floor = head_on ? o.sigma_floor_top : o.sigma_floor_side;
    const double stat = o.sigma_spread * snap_sd[f] / std::sqrt(n);
    const double prof = o.sigma_profile * shift[f];
    const double noise = o.sigma_noise * o.belt_sigma;
    const double st = o.sigma_stability * stab[f] + reach[f];
    r.face_sigma[f] =
        std::sqrt(floor * floor + stat * stat + prof * prof + noise * noise + st * st) +
        (snap_n[f] == 0 ? o.eps / 2 : 0.0);
    r.face_support[f] = snap_n[f];
  }
  for (auto& f : r.face_sigma) f *= o.sigma_scale;
  for (std::size_t a = 0; a < 3; ++a)
    r.sigma[a] = std::hypot(r.face_sigma[2 * a], r.face_sigma[2 * a + 1]);
  if (belt) {  // occupancy of the top view over the inner 80 % of the top face, upper half only
    const double g = o.column;
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
    r.top_occupancy = static_cast<double>(k) / static_cast<double>(occ.size());
  }
  r.dims = r.box.sorted_dims();
  return r;
}

/// Belt setting: the largest share, over the four side faces of `box` (belt frame, upright), of
/// the face's g-columns along its width that hold a point of `p` at the box's top height (within
/// g) between g and o.past_reach outside the face. A body's top does not continue past its faces
/// (appendages at the top height are narrow: straps, tags); a large share means that part of the
/// body was cut off, e.g. a strip of a standing bag's top end that the shadow of its extended
/// handle separated from the rest and the cleaning dropped as another cluster. Faces with
/// `cut[f] > 0` (a grip cut off them by measure(), mebb_result::face_cut: its noisy points reach
/// the top height) are left out.
inline double top_past_face_share(const points& p, const oriented_box& box, const mebb_options& o,
                                  const std::array<double, 6>& cut = {}) {
  const double g = o.column, top = box.extent.z() / 2;
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
      if (out < g || out > o.past_reach || q[b] < -half_b || q[b] > half_b) continue;
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
/// o.past_reach outside the face to `depth` + g inside it, in at least a tenth of the face's
/// g-columns. A standing bag's raised handle does; a grip sticking out of a lying bag does not.
inline bool grip_overhangs(const points& p, const oriented_box& box, int f, double depth,
                           const mebb_options& o) {
  const double g = o.column, top = box.extent.z() / 2;
  const int a = f / 2, b = 1 - a;
  const double s = f % 2 ? -1.0 : 1.0, half_b = box.extent[b] / 2;
  const auto nb = std::clamp<index_t>(static_cast<index_t>(box.extent[b] / g), 1, 4000);
  std::vector<char> hit(static_cast<std::size_t>(nb), 0);
  for (const auto& x : p) {
    const point3 q = box.rotation.transpose() * (x - box.centre);
    if (q.z() <= top + g || q[b] < -half_b || q[b] > half_b) continue;
    const double in = box.extent[a] / 2 - s * q[a];  // depth inside the face
    if (in < -o.past_reach || in > depth + g) continue;
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
  check(n >= o.min_points, "mebb: the cloud has ", n, " points, expected at least ", o.min_points);
  const double cut = belt ? std::max(o.belt_min_height, 4 * o.belt_sigma) : -INFINITY;
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
  const points q = mebb_clean(p, belt, o, o.fine_faces ? &raw : nullptr);
  check(q.size() >= o.min_points, "mebb: ", q.size(), " points left after cleaning (",
        belt ? "belt removal, " : "", "voxel grid ", o.voxel,
        ", clustering, outlier removal), expected at least ", o.min_points);
  const belt_raster belt_floor = belt && o.silhouette_offset
                                     ? belt_raster_near(
                                           cloud, [](const point3& x) { return x; }, q, cut,
                                           o.shadow_reach, o.radius_max, o.voxel / 2)
                                     : belt_raster{};
  mebb_result r =
      mebb_solve(q, belt, o, o.fine_faces ? &raw : nullptr, belt ? &p : nullptr, &belt_floor);
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
  const double cut = std::max(o.belt_min_height, 4 * o.belt_sigma);
  for (std::size_t i = 0; i < p.size(); ++i) {
    if (belt && p[i].z() < cut)
      out[i] = point_label::belt;
    else if (r.box.contains(p[i], o.eps))
      out[i] = point_label::body;
    else if (r.envelope.contains(p[i], o.eps))
      out[i] = point_label::appendage;
    else
      out[i] = point_label::outlier;
  }
  return out;
}

}  // namespace tightfit::geometry
