// tightfit/geometry/measure.hpp: one entry point that measures an object in a cloud with MEBB or
// a baseline, in the belt setting (belt given, detected by RANSAC, or none: full 3D), and a
// batch version that measures many clouds in parallel (oneTBB through tightfit::parallel_for).
//
// Every method sees the same cleaning (belt removal, voxel grid, largest cluster, statistical
// outliers): MEBB works on the voxel centroids, the baselines on the sensor points whose voxels
// survived (PCL's and Open3D's boxes are defined on the points). Only MEBB excludes appendages.
// Boxes are returned in the input's coordinates.
#pragma once

#include <array>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "tightfit/core/error.hpp"
#include "tightfit/core/parallel.hpp"
#include "tightfit/geometry/box.hpp"
#include "tightfit/geometry/mebb.hpp"
#include "tightfit/geometry/plane.hpp"

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

/// Where the belt is: found by RANSAC (full 3D when none is found), absent (full 3D), or given.
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
  std::optional<mebb_result> mebb;  ///< MEBB details (box, envelope, trims, flags in belt frame)
  oriented_box envelope;            ///< MEBB: envelope incl. appendages (input coordinates)
  std::size_t points_in = 0, points_used = 0;
};

/// Measures the object in `input` with `method`. Throws tightfit::error for bad or too small
/// clouds (see mebb()).
inline measurement measure(const points& input, box_method method = box_method::mebb,
                           belt_choice belt = {}, mebb_options o = {}) {
  check_finite(input, "measure");
  check(input.size() >= o.min_points, "measure: the cloud has ", input.size(),
        " points, expected at least ", o.min_points);
  measurement m;
  m.method = method;
  m.points_in = input.size();
  if (belt.kind == belt_choice::given) {
    m.belt = belt.given_plane;
    check(m.belt->normal.allFinite() && m.belt->normal.norm() > 0,
          "measure: belt normal is not a direction");
    m.belt->normal.normalize();
  } else if (belt.kind == belt_choice::detect) {
    if (auto f = detect_belt(input)) {
      m.belt = f->fitted;
      o.belt_sigma = std::max(o.belt_sigma, f->rms);
    }
  }
  const rigid_transform to_frame = m.belt ? belt_frame(*m.belt) : rigid_transform{};
  const rigid_transform from_frame = to_frame.inverse();
  points p(input.size());
  for (std::size_t i = 0; i < p.size(); ++i) p[i] = to_frame.apply(input[i]);
  const bool on_belt = m.belt.has_value();
  auto back = [&](oriented_box b) {
    b.centre = from_frame.apply(b.centre);
    b.rotation = from_frame.rotation * b.rotation;
    return b;
  };
  if (method == box_method::mebb) {
    mebb_result r = mebb(p, on_belt, o);
    m.points_used = r.points_used;
    m.box = back(r.box);
    m.envelope = back(r.envelope);
    m.mebb = r;
  } else {
    points q;
    mebb_clean(p, on_belt, o, &q);
    check(q.size() >= o.min_points, "measure: ", q.size(),
          " points left after cleaning, expected at least ", o.min_points);
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
  return m;
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
                                            belt_choice belt = {}, const mebb_options& o = {}) {
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
