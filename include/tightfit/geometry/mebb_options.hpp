// tightfit/geometry/mebb_options.hpp: every parameter of MEBB (docs/mebb.md), grouped by the step
// it configures, each group with its own defaults: the belt under the object, the cleaning, the
// box frame's yaw, the elastic faces, the offsets for what the camera does not see, the solid-edge
// check, the checks behind the status flags and the uncertainty model.
//
// Lengths are in the cloud's units (the defaults assume metres), angles in radians. The defaults
// are those of the published method except where docs/mebb.md lists a departure (each an option
// here). Options are taken by const reference everywhere (scripts/check-options): GCC 12.2 at -O2
// with AVX-512 miscompiled a small options struct passed by value.
#pragma once

#include <algorithm>
#include <cstddef>
#include <numbers>

#include "tightfit/core/error.hpp"

namespace tightfit::geometry {

/// Belt setting: the belt under the object (step 0). detect_belt's own search is belt_options.
struct mebb_belt_options {
  double min_height = 0.008;  ///< drop points below max(this, 4 sigma) above the belt
  double sigma = 0;           ///< the belt's noise sigma (0: unknown; measure() sets it)
  /// mixed-pixel (veil) filter, see top_view_dense: a point is dropped when its top-view column
  /// (side cleaning.voxel) holds fewer than this share of the median column (0: off)
  double veil_share = 0;
};

/// Steps 0 and 1 (mebb_clean): the voxel grid, the largest Euclidean cluster, the statistical
/// outlier removal, and the least that must be left.
struct mebb_cleaning_options {
  /// keep only the largest Euclidean cluster and drop statistical outliers (false: the belt cut
  /// and the voxel grid only)
  bool enabled = true;
  double voxel = 0.005;           ///< h: voxel-grid size (one centroid per voxel)
  double cluster_radius = 0.015;  ///< Euclidean clustering radius; the largest cluster is kept
  int sor_k = 8;                  ///< statistical outlier removal: neighbours
  double sor_sigma = 2.0;         ///< statistical outlier removal: drop mean dist > mu + n sigma
  std::size_t min_points = 30;    ///< fewer cleaned points than this is an error
};

/// Step 2 and the outer iterations: the box frame's yaw (its main direction) and how often it is
/// re-estimated.
struct mebb_yaw_options {
  double square_ratio = 1.5;  ///< lambda1/lambda2 below which the edge-direction yaw is used
  /// Use the edge-direction yaw for every footprint, not only near-square ones (PCA remains the
  /// fallback when no silhouette cell votes): appendages skew the PCA yaw by several degrees on
  /// elongated bags too. An addition to the published method; false gives the paper's rule.
  bool edge_always = true;
  double edge_radius = 0.025;    ///< neighbourhood of a silhouette cell for its direction
  double edge_elongation = 8.0;  ///< eigenvalue ratio for a silhouette cell to vote
  /// Belt setting: re-estimate the yaw between outer iterations from line fits to the top-edge
  /// points of the four side faces (instead of PCA of the points inside the box, which the
  /// near-square case and the limb geometry bias by 1-3 degrees). An addition to the published
  /// method.
  bool from_walls = true;
  int outer_iterations = 2;  ///< yaw re-estimations + 1
  /// belt, from_walls: one more yaw re-estimation (up to max_outer_iterations in all) while the
  /// last one turned the axes by more than this (radians): the top-edge line fits see only
  /// [-15, +3] mm about each face, so a yaw error of 1.5-2 degrees over a 700 mm face is only
  /// partly corrected by one step (bench/geometry: the bags whose W came out 9-13 mm too large)
  double settle = 0.3 * std::numbers::pi / 180;
  int max_outer_iterations = 4;
};

/// Steps 3 to 5: the elastic faces (membrane, force, safeguard), their snap to the main-body edge
/// and the face passes, on the voxel centroids and then on the sensor points.
struct mebb_face_options {
  double column = 0.010;             ///< g: column size on the face plane
  double eps = 0.006;                ///< elastic softness (about 2 sigma of sensor noise)
  double kappa = 0.4;                ///< share of the occupied membrane that must hold a face
  double tau = 0;                    ///< >0: columns far from their 8-neighbour median get less
                                     ///< stiffness k_j = 1/(1 + (|e_j - med|/tau)^2); 0: k_j = 1
  double safeguard_quantile = 0.75;  ///< a face never moves inward past this quantile
  /// Belt setting: the safeguard for the top face too. Off: seen from above, a standing bag's
  /// handles can hold more than a quarter of the top's points, and the safeguard then lifted the
  /// top onto them, the side faces followed into the handles' footprint (their band hangs from
  /// the top) and the box came out 50-150 mm off with status ok (bench/geometry, seed 401052).
  /// The top's membrane is the whole footprint, seen head-on; its D* needs no guard.
  bool belt_top_safeguard = false;
  /// Belt setting: a camera above sees a side face only through the rounded top edge, so the
  /// side faces' membranes are built from the layer [top - side_band, top + eps] only (wide
  /// handles and wheels lower down would otherwise outweigh that thin band). <= 0: whole face.
  double side_band = 0.02;
  // step 4: snap to the main-body edge
  double snap_inner = 2.0;     ///< band starts snap_inner * eps inside D*
  double snap_outer = 0.015;   ///< band ends snap_outer outside D*
  double side_quantile = 0.9;  ///< side faces snap to this quantile of the band envelopes
  // step 5: passes and adaptive elasticity
  int max_passes = 6;            ///< face-by-face passes per outer iteration
  bool adaptive = true;          ///< retry with kappa/2 when a face moves too far
  double retry_fraction = 0.25;  ///< "too far": more than this share of the face's extent
  /// mebb_solve with sensor points (`fine`): after the faces settled on the voxel centroids, the
  /// faces are solved again on the sensor points themselves (same frame, same elastic rule), and
  /// the edge checks read those points: the final faces then do not depend on the voxel lattice
  /// (the centroids of the voxels cut by a face move with it)
  bool fine = true;
  int fine_passes = 3;  ///< face passes on the sensor points (until none moves more than h/2)
};

/// Belt setting: how far the solved faces move out for what the sensor misses: a camera above
/// does not see a side wall below its rounded top edge, so the last visible points stop a few mm
/// inside the wall.
struct mebb_offset_options {
  /// With sensor points: each side face whose wall is not seen below its top edge is moved out
  /// by `side` + `side_pitch` x the point pitch on the top face (sqrt(top area / its points)),
  /// plus the silhouette below: the outermost point of a column lies inside the silhouette. A
  /// least-squares fit through zero of the per-face error against the pitch, with the silhouette
  /// offset on and this one off (bench/geometry, 400 bags at noise x1 and x2), gave 0.81 x pitch
  /// (1.09 before the silhouette term, which it then carried). A face whose wall is seen
  /// (wall_seen_share) gets that share less.
  double side = 0.0;
  double side_pitch = 0.8;
  /// With sensor points and the belt's own points around the object (`belt_floor` of mebb_solve,
  /// silhouette.hpp; measure() and mebb() pass them): each side face whose wall is not seen moves
  /// out by r (1 - cos alpha) more. A camera above sees a rounded top edge of radius r only down to
  /// where its ray grazes it, and with the ray tilted outward by alpha that silhouette lies
  /// r (1 - cos alpha) inside the wall (docs/mebb.md). tan alpha comes from the belt's shadow
  /// behind the face: the median gap, over the face's span, between the face and the first belt
  /// cell past it, over the height of the edge (top - r; shadow_tilt). r comes from the top view
  /// of the four corners (corner_radius). No correction where either is not measured.
  bool silhouette = true;
  double shadow_reach = 1.0;  ///< tan of the largest tilt looked for (45 degrees)
  double radius_max = 0.06;   ///< the largest edge radius looked for
  /// Each side face moved out to the wall of a circular edge profile fitted to the points under
  /// the top edge (radius by least median deviation, at most `profile_max_shift` outward, never
  /// inward). An addition to the published method, off: at the sensor noise of the generator and
  /// the fixtures the fit has no information (docs/mebb.md).
  bool edge_profile = false;
  double profile_depth = 0.05;       ///< use points up to this far below the top face
  double profile_max_shift = 0.012;  ///< largest outward correction
  /// faces moved out by this x the belt's noise sigma (their inward bias on the generated scans
  /// grows with the noise; 0: no correction)
  double bias_side = 0.0, bias_top = 0.0;
};

/// Belt setting: how far inside each side face the body's outline is solid (detail::
/// solid_edge_depth): the depth enters the face's uncertainty, and a grip that holds a face out
/// is cut off by measure().
struct mebb_solid_edge_options {
  /// a side face whose outermost g-slab is solid (points above half the height) over less than
  /// `share` of its width adds the depth to the solid slab (up to `depth`) to its uncertainty: a
  /// handle or strap holding the face out
  double share = 0.75, depth = 0.08;
  /// the check also looks past the first solid slab: a slab holding points in less than half its
  /// columns followed by a solid one is a gap between an appendage as wide as the face (a handle
  /// grip) and the body, and the depth counts to the body
  bool gap = true;
  /// the gap rule's exception for the body's own top strip: when the first solid run ends in a
  /// gap and the mean height of that run's points lies within one column g of the box top, the
  /// run is the body (a top end partly hidden, e.g. under a standing bag's handle grip), not an
  /// appendage, and the depth is its start. A grip that holds a face out sits below the top (a
  /// telescopic handle's grip 17-47 mm on the generated bags).
  bool top_run = true;
  /// and when the gap's own points (its sparse slabs' middle) lie within g of the box top on
  /// average, the gap is a shadow on the body's top (cast by something above it, e.g. a standing
  /// bag's extended handle), not the space between a grip and the body: the depth is the first
  /// run's start. The gap behind a grip holds only the grip's rods, at the grip's height.
  bool shadow_gap = true;
  /// measure(): a side face held out by a grip (the first solid run and the points in the gap
  /// behind it both more than g below the box top, a solid slab after the gap:
  /// mebb_result::face_cut) is solved again without the points outward of the gap's middle,
  /// unless something above the top overhangs that face (grip_overhangs, on every point above
  /// the belt: a standing bag's handle, whose shadow and veils can give the same pattern)
  bool grip_trim = true;
};

/// The checks behind the result's flags that the status reads (quality.hpp): the body cut off
/// (the top continues past a face), a face edge hidden under an overhang, appendages trimmed.
struct mebb_check_options {
  /// belt: how far past each side face top_past_face_share (and the hidden-edge check) look for
  /// the object's top
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
  bool hidden = true;
  double hidden_height = 0.02;
  int hidden_margin = 1;
  double hidden_flag_share = 0.5;
  std::size_t hidden_top_points = 8;
  double appendage_flag = 0.010;  ///< a face trimmed more than this sets mebb_appendage
};

/// The uncertainty model (mebb_result::face_sigma; calibrated on the scene generator of bench/).
struct mebb_uncertainty_options {
  double floor_top = 0.0010;   ///< 1-sigma floor of a face seen head-on
  double floor_side = 0.0015;  ///< 1-sigma floor of a side face
  double spread = 1.25;        ///< x sd / sqrt(n) of the values the face snapped to
  double profile = 0.3;        ///< x the edge-profile shift (an extrapolation)
  /// x the belt's noise sigma. 0.1: a least-squares fit of the squared face errors (floor +
  /// standard error + belt sigma, 400 generated bags at noise x1 and x2, faces without a solid-edge
  /// depth) gave 0.07 for the side faces and 0.15 for the top; the face errors hardly grow with
  /// the noise (RMS 1.53 mm at x1, 1.59 mm at x2). 0.3 made every side's interval at x2 ~10 mm.
  double noise = 0.1;
  double stability = 0.0;  ///< x how far the face moves at kappa x kappa_probe
  double kappa_probe = 0.6;
  /// every face sigma times this: calibrated so that the 95 % intervals cover 95 % of the errors
  /// of the generated scans (bench/geometry, noise x1 and x2)
  double scale = 1.25;
  /// measure(): solve again on a voxel lattice shifted by half a voxel, report the mean of the
  /// two boxes and add half their difference to each side's sigma
  bool phase_check = false;
};

/// Every parameter of MEBB, by step (docs/mebb.md, "The method, step by step").
struct mebb_options {
  mebb_belt_options belt;                ///< step 0, belt setting: the belt cut and its noise
  mebb_cleaning_options cleaning;        ///< steps 0-1: voxel grid, cluster, outliers
  mebb_yaw_options yaw;                  ///< step 2 and the outer iterations: the box frame
  mebb_face_options faces;               ///< steps 3-5: elastic faces, snap, passes
  mebb_offset_options offsets;           ///< belt setting: the faces moved out for unseen walls
  mebb_solid_edge_options solid_edge;    ///< belt setting: solid-edge depth and the grip cut
  mebb_check_options checks;             ///< top past a face, hidden face, appendage flags
  mebb_uncertainty_options uncertainty;  ///< the per-face sigma model
};

namespace detail {

/// The belt cut of the belt setting: points below it belong to the belt.
inline double belt_cut(const mebb_belt_options& b) {
  return std::max(b.min_height, 4 * b.sigma);
}

/// Throws tightfit::error naming the first parameter out of its range.
inline void check_options(const mebb_options& o) {
  check(o.cleaning.voxel > 0, "mebb: cleaning.voxel is ", o.cleaning.voxel, ", expected > 0");
  check(o.faces.column > 0, "mebb: faces.column is ", o.faces.column, ", expected > 0");
  check(o.faces.eps > 0, "mebb: faces.eps is ", o.faces.eps, ", expected > 0");
  check(o.faces.kappa > 0 && o.faces.kappa <= 1, "mebb: faces.kappa is ", o.faces.kappa,
        ", expected in (0, 1]");
  check(o.faces.safeguard_quantile >= 0 && o.faces.safeguard_quantile <= 1,
        "mebb: faces.safeguard_quantile is ", o.faces.safeguard_quantile, ", expected in [0, 1]");
  check(o.faces.side_quantile >= 0 && o.faces.side_quantile <= 1, "mebb: faces.side_quantile is ",
        o.faces.side_quantile, ", expected in [0, 1]");
  check(o.cleaning.cluster_radius > 0, "mebb: cleaning.cluster_radius is ",
        o.cleaning.cluster_radius, ", expected > 0");
  check(o.faces.max_passes >= 1, "mebb: faces.max_passes is ", o.faces.max_passes,
        ", expected >= 1");
  check(o.yaw.outer_iterations >= 1, "mebb: yaw.outer_iterations is ", o.yaw.outer_iterations,
        ", expected >= 1");
  check(o.cleaning.min_points >= 4, "mebb: cleaning.min_points is ", o.cleaning.min_points,
        ", expected >= 4");
  check(o.yaw.settle >= 0, "mebb: yaw.settle is ", o.yaw.settle, ", expected >= 0");
  check(o.offsets.shadow_reach > 0, "mebb: offsets.shadow_reach is ", o.offsets.shadow_reach,
        ", expected > 0");
  check(o.offsets.radius_max > 0, "mebb: offsets.radius_max is ", o.offsets.radius_max,
        ", expected > 0");
}

}  // namespace detail

}  // namespace tightfit::geometry
