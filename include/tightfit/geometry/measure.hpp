// tightfit/geometry/measure.hpp: one entry point that measures an object in a cloud with MEBB or
// a baseline, in the belt setting (belt given, detected by RANSAC, or none: full 3D), and a
// batch version that measures many clouds in parallel (oneTBB through tightfit::parallel_for).
//
// Every method sees the same cleaning (belt removal, voxel grid, largest cluster, statistical
// outliers): MEBB works on the voxel centroids, the baselines on the sensor points whose voxels
// survived (PCL's and Open3D's boxes are defined on the points). Only MEBB excludes appendages.
// Boxes are returned in the input's coordinates.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <exception>
#include <iterator>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tightfit/core/error.hpp"
#include "tightfit/core/parallel.hpp"
#include "tightfit/geometry/box.hpp"
#include "tightfit/geometry/mebb.hpp"
#include "tightfit/geometry/plane.hpp"
#include "tightfit/geometry/quality.hpp"

namespace tightfit::geometry {

/// The box fits measure() offers.
enum class box_method { mebb, aabb, pca, trimmed, hull };

/// Parses "mebb", "aabb", "pca", "trimmed" or "hull".
inline box_method parse_box_method(const std::string& s) {
  if (s == "mebb") return box_method::mebb;
  if (s == "aabb") return box_method::aabb;
  if (s == "pca") return box_method::pca;
  if (s == "trimmed") return box_method::trimmed;
  if (s == "hull") return box_method::hull;
  fail("method is '", s, "', expected mebb, aabb, pca, trimmed or hull");
}
inline const char* method_name(box_method m) {
  switch (m) {
    case box_method::mebb:
      return "mebb";
    case box_method::aabb:
      return "aabb";
    case box_method::pca:
      return "pca";
    case box_method::trimmed:
      return "trimmed";
    case box_method::hull:
      return "hull";
  }
  return "?";
}

/// Where the belt is: detected (detect_belt; none found: full 3D, status low_confidence with
/// reason "no_belt"), absent (full 3D), or given.
struct belt_choice {
  enum kind_t { detect, none, given } kind = detect;
  plane given_plane;  ///< for `given`
  static belt_choice at_z(double z) { return {given, plane{point3::UnitZ(), z}}; }
};

/// One measurement.
struct measurement {
  box_method method = box_method::mebb;
  oriented_box box;                 ///< in input coordinates
  std::array<double, 3> dims{};     ///< sorted L >= W >= H
  std::optional<plane> belt;        ///< the belt used (none: full 3D)
  double belt_sigma = 0;            ///< the belt's noise sigma (robust, from the points on it)
  std::optional<mebb_result> mebb;  ///< MEBB details (box, envelope, trims, flags in belt frame)
  oriented_box envelope;            ///< MEBB: envelope incl. appendages (input coordinates)
  std::size_t points_in = 0, points_used = 0;
  /// MEBB: 95 % half-width of each of `dims` (same order), from the face fits (see quality.hpp)
  std::array<double, 3> uncertainty{};
  measure_status status = measure_status::ok;  ///< ok, low_confidence or failed
  std::vector<std::string> reasons;            ///< machine-readable, see quality.hpp
};

/// Intermediate clouds of measure(), for benchmarks and pictures: the belt frame, the sensor
/// points that survived the cleaning and the cleaned voxel centroids MEBB solved on (both in the
/// belt frame; the input frame when there is no belt).
struct measure_trace {
  rigid_transform to_frame;  ///< input -> belt frame
  points raw;                ///< sensor points kept by the cleaning (what the baselines box)
  points voxels;             ///< cleaned voxel centroids (MEBB's input)
  belt_raster belt_floor;    ///< the belt around the object (the silhouette offset)
};

/// Sets m.status, m.reasons and m.uncertainty from the MEBB fit (when there is one), the cleaning
/// and the checks of quality_options; `reasons` holds those found before (e.g. "no_belt").
inline void assess(measurement& m, const clean_stats& cs, bool on_belt, const quality_options& q,
                   std::vector<std::string> reasons) {
  auto add = [&](const char* r) {
    for (const auto& x : reasons)
      if (x == r) return;
    reasons.emplace_back(r);
  };
  if (cs.voxels > 0 &&
      static_cast<double>(cs.kept) < q.min_kept_share * static_cast<double>(cs.voxels))
    add("fragmented");
  if (m.dims[0] <= 0 || m.dims[1] < 1e-6 * m.dims[0] || m.dims[2] < 1e-6 * m.dims[0])
    add("degenerate_shape");
  if (m.mebb) {
    const mebb_result& r = *m.mebb;
    if (r.flags & (mebb_line | mebb_flat)) add("degenerate_shape");
    if (r.flags & mebb_not_converged) add("not_converged");
    if (r.flags & mebb_face_hidden) add("face_hidden");
    if (on_belt && r.top_occupancy < q.min_top_occupancy) add("too_sparse");
    if (on_belt && r.top_past > q.max_top_past_share) add("top_past_face");
    for (int f = 0; f < 6; ++f) {
      if (on_belt && f == 5) continue;
      if (r.face_support[static_cast<std::size_t>(f)] < q.min_face_support)
        add("too_few_face_points");
    }
    // the 95 % half-widths in the order of dims (sorted extents)
    std::array<int, 3> order{0, 1, 2};
    std::sort(order.begin(), order.end(),
              [&](int a, int b) { return r.box.extent[a] > r.box.extent[b]; });
    for (std::size_t k = 0; k < 3; ++k)
      m.uncertainty[k] = 1.96 * r.sigma[static_cast<std::size_t>(order[k])];
    for (double u : m.uncertainty)
      if (!(u <= q.max_uncertainty)) add("high_uncertainty");
  }
  m.status = status_of(reasons);
  m.reasons = std::move(reasons);
}

namespace detail {
// Combines MEBB on two voxel lattices: each extent of `r` (box axes) becomes the mean of the two
// runs' matching extents (sorted order) and its sigma grows by half their difference.
inline void merge_phase(mebb_result& r, const mebb_result& r2) {
  std::array<int, 3> order{0, 1, 2};
  std::sort(order.begin(), order.end(),
            [&](int a, int b) { return r.box.extent[a] > r.box.extent[b]; });
  for (std::size_t k = 0; k < 3; ++k) {
    const auto a = static_cast<std::size_t>(order[k]);
    const double e1 = r.box.extent[order[k]], e2 = r2.dims[k];
    const double mean = (e1 + e2) / 2, half = std::abs(e1 - e2) / 2;
    r.box.extent[order[k]] = mean;
    r.sigma[a] = std::hypot(r.sigma[a], half);
  }
  r.dims = r.box.sorted_dims();
  r.flags |= r2.flags & (mebb_not_converged | mebb_line | mebb_flat);
}

// The grip cut (docs/mebb.md): a side face of `r` held out by a grip below the top (r.face_cut[f]
// > 0, the depth from the face) that nothing above the top overhangs (grip_overhangs over `above`,
// every point above the belt cut) loses the points within that depth, in `q` (the cleaned points)
// and `raw`, and the faces are solved again. Afterwards r.face_cut holds the cuts applied: zero
// where none was (no candidate, an overhang, or fewer than o.cleaning.min_points left).
inline void cut_grips(mebb_result& r, points& q, points& raw, const points& above,
                      const belt_raster& belt_floor, const mebb_options& o) {
  std::array<double, 6> cuts{};
  bool any = false;
  for (std::size_t f = 0; f < 4; ++f)
    if (r.face_cut[f] > 0 && !grip_overhangs(above, r.box, static_cast<int>(f), r.face_cut[f], o))
      cuts[f] = r.face_cut[f], any = true;
  r.face_cut = {};
  if (!any) return;
  const oriented_box b0 = r.box;
  auto kept = [&](const point3& x) {  // not within the cut of a trimmed face
    const point3 u = b0.rotation.transpose() * (x - b0.centre);
    for (std::size_t f = 0; f < 4; ++f) {
      const auto a = static_cast<int>(f / 2), b = 1 - a;
      const double s = f % 2 ? -1.0 : 1.0;
      const double inward = b0.extent[a] / 2 - s * u[a];
      if (cuts[f] > 0 && inward < cuts[f] && std::abs(u[b]) <= b0.extent[b] / 2) return false;
    }
    return true;
  };
  points q2, raw2;
  std::copy_if(q.begin(), q.end(), std::back_inserter(q2), kept);
  std::copy_if(raw.begin(), raw.end(), std::back_inserter(raw2), kept);
  if (q2.size() < o.cleaning.min_points) return;
  r = mebb_solve(q2, true, o, &raw2, &above, &belt_floor);
  r.face_cut = cuts;
  q = std::move(q2), raw = std::move(raw2);
}

// The points of `cloud` in the frame `t` at height >= cut (all points when cut is -inf).
template <PointCloud C>
points transformed_above(const C& cloud, const rigid_transform& t, double cut) {
  const std::size_t n = cloud.kdtree_get_point_count();
  points out;
  out.reserve(cut == -INFINITY ? n : n / 4);
  for (std::size_t i = 0; i < n; ++i) {
    const point3 u = t.apply(point_at(cloud, i));
    if (u.z() >= cut) out.push_back(u);
  }
  return out;
}
template <PointCloud C>
void check_cloud_finite(const C& cloud, const char* where) {
  const std::size_t n = cloud.kdtree_get_point_count();
  for (std::size_t i = 0; i < n; ++i) {
    const point3 p = point_at(cloud, i);
    if (!p.allFinite())
      fail(where, ": point ", i, " is (", p.x(), ", ", p.y(), ", ", p.z(),
           "), expected finite coordinates");
  }
}
}  // namespace detail

/// Measures the object in any PointCloud `cloud` with `method`, without copying the cloud (only
/// the points above the belt are kept, in the belt frame). Throws tightfit::error for bad or too
/// small clouds (see mebb()); a measurement that is not trustworthy comes back with a status
/// other than ok and its reasons (quality.hpp), never silently.
template <PointCloud C>
measurement measure(const C& cloud, box_method method = box_method::mebb,
                    const belt_choice& belt = {}, const mebb_options& options = {},
                    const belt_options& bo = {}, const quality_options& qo = {},
                    measure_trace* trace = nullptr) {
  mebb_options o = options;  // a copy: the belt's noise sigma is set below
  const std::size_t n = cloud.kdtree_get_point_count();
  check(n >= o.cleaning.min_points, "measure: the cloud has ", n, " points, expected at least ",
        o.cleaning.min_points);
  measurement m;
  m.method = method;
  m.points_in = n;
  std::vector<std::string> reasons;
  if (belt.kind == belt_choice::detect) {
    if (auto f = detect_belt(cloud, bo)) {  // checks every coordinate too
      m.belt = f->fitted;
      m.belt_sigma = f->rms;
    } else {
      reasons.emplace_back("no_belt");
    }
  } else {
    detail::check_cloud_finite(cloud, "measure");
    if (belt.kind == belt_choice::given) {
      m.belt = belt.given_plane;
      check(
          m.belt->normal.allFinite() && m.belt->normal.norm() > 0 && std::isfinite(m.belt->offset),
          "measure: belt normal is not a direction");
      m.belt->offset /= m.belt->normal.norm();
      m.belt->normal.normalize();
      m.belt_sigma = measure_belt_noise(cloud, *m.belt, 2 * bo.threshold).sigma;
    }
  }
  o.belt.sigma = std::max(o.belt.sigma, m.belt_sigma);
  const bool on_belt = m.belt.has_value();
  const rigid_transform to_frame = on_belt ? belt_frame(*m.belt) : rigid_transform{};
  const rigid_transform from_frame = to_frame.inverse();
  const double cut = on_belt ? detail::belt_cut(o.belt) : -INFINITY;
  const points p = detail::transformed_above(cloud, to_frame, cut);
  auto back = [&](oriented_box b) {
    b.centre = from_frame.apply(b.centre);
    b.rotation = from_frame.rotation * b.rotation;
    return b;
  };
  clean_stats cs;
  if (method == box_method::mebb) {
    check(p.size() >= o.cleaning.min_points, "measure: ", p.size(), " points above the belt cut (",
          cut * 1000, " mm), expected at least ", o.cleaning.min_points);
    points raw;
    points q = mebb_clean(p, on_belt, o, &raw, &cs);
    check(q.size() >= o.cleaning.min_points, "measure: ", q.size(), " points left after cleaning (",
          on_belt ? "belt removal, " : "", "voxel grid ", o.cleaning.voxel,
          ", clustering, outlier removal), expected at least ", o.cleaning.min_points);
    belt_raster belt_floor;  // the belt around the object (the silhouette offset)
    if (on_belt && o.offsets.silhouette)
      belt_floor = belt_raster_near(
          cloud, [&](const point3& x) { return to_frame.apply(x); }, q, cut, o.offsets.shadow_reach,
          o.offsets.radius_max, o.cleaning.voxel / 2);
    mebb_result r = mebb_solve(q, on_belt, o, &raw, on_belt ? &p : nullptr, &belt_floor);
    if (on_belt && o.solid_edge.grip_trim) detail::cut_grips(r, q, raw, p, belt_floor, o);
    if (on_belt)
      r.top_past = top_past_face_share(p, r.box, o, r.face_cut);  // before the phase check's merge
    if (o.uncertainty.phase_check) {
      // the same cleaned points on a voxel lattice shifted by half a voxel: MEBB's faces snap to
      // voxel centroids, so a face that depends on the lattice is uncertain by that much
      const points q2 = voxel_downsample(raw, o.cleaning.voxel, nullptr, 0.5);
      if (q2.size() >= o.cleaning.min_points) {
        const mebb_result r2 =
            mebb_solve(q2, on_belt, o, &raw, on_belt ? &p : nullptr, &belt_floor);
        detail::merge_phase(r, r2);
      }
    }
    if (trace) trace->raw = std::move(raw);
    m.points_used = r.points_used;
    m.box = back(r.box);
    m.envelope = back(r.envelope);
    m.mebb = r;
    if (trace) trace->voxels = std::move(q), trace->belt_floor = std::move(belt_floor);
  } else {
    points q;
    mebb_clean(p, on_belt, o, &q, &cs);
    if (trace) trace->raw = q;
    check(q.size() >= o.cleaning.min_points, "measure: ", q.size(),
          " points left after cleaning, expected at least ", o.cleaning.min_points);
    m.points_used = q.size();
    oriented_box b;
    switch (method) {
      case box_method::aabb:
        b = on_belt ? aabb_belt(q) : aabb(q);
        break;
      case box_method::pca:
        b = on_belt ? pca_box_belt(q) : pca_box(q);
        break;
      case box_method::trimmed:
        b = on_belt ? trimmed_box_belt(q) : trimmed_box(q);
        break;
      case box_method::hull:
        check(on_belt, "measure: the hull method needs a belt (it boxes the top-view hull)");
        b = min_area_box_belt(q);
        break;
      case box_method::mebb:
        break;
    }
    m.box = back(b);
    m.envelope = m.box;
  }
  m.dims = m.box.sorted_dims();
  if (trace) trace->to_frame = to_frame;
  assess(m, cs, on_belt, qo, reasons);
  return m;
}

/// measure() on a `points` vector.
inline measurement measure(const points& input, box_method method = box_method::mebb,
                           const belt_choice& belt = {}, const mebb_options& o = {},
                           const belt_options& bo = {}, const quality_options& qo = {},
                           measure_trace* trace = nullptr) {
  return measure(as_cloud(input), method, belt, o, bo, qo, trace);
}

/// The outcome of one cloud of a batch: a measurement or the error message.
struct batch_item {
  std::optional<measurement> result;
  std::string error;
};

/// Measures every cloud of `clouds` in parallel (oneTBB when enabled); a bad cloud yields its
/// error message instead of stopping the batch.
inline std::vector<batch_item> measure_many(const std::vector<points>& clouds,
                                            box_method method = box_method::mebb,
                                            const belt_choice& belt = {},
                                            const mebb_options& o = {}) {
  std::vector<batch_item> out(clouds.size());
  parallel_for(0, static_cast<index_t>(clouds.size()), 1, [&](index_t i0, index_t i1) {
    for (index_t i = i0; i < i1; ++i) {
      auto& item = out[static_cast<std::size_t>(i)];
      try {
        item.result = measure(clouds[static_cast<std::size_t>(i)], method, belt, o);
      } catch (const std::exception& e) {
        item.error = e.what();
      }
    }
  });
  return out;
}

}  // namespace tightfit::geometry
