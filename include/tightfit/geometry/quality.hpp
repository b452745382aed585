// tightfit/geometry/quality.hpp: whether a measurement can be trusted: its status (ok,
// low_confidence, failed), the machine-readable reasons and the thresholds behind them.
//
// A measuring instrument must never return a wrong box silently: every check that can fail on a
// real scan (no belt where one was expected, a fragmented or too sparse cloud, a face held by too
// few points, faces that do not settle, a degenerate shape, an uncertainty wider than the scale
// interval, the top continuing past a face) adds a reason; docs/mebb.md lists them with their
// thresholds. Invariant: status is ok exactly when `reasons` is empty.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace tightfit::geometry {

/// Whether a measurement is trustworthy.
enum class measure_status { ok, low_confidence, failed };

inline const char* status_name(measure_status s) {
  return s == measure_status::ok               ? "ok"
         : s == measure_status::low_confidence ? "low_confidence"
                                               : "failed";
}

/// Thresholds of the checks (lengths in the cloud's units; defaults assume metres).
struct quality_options {
  /// any side's 95 % half-width above this: low_confidence, "high_uncertainty" (10 mm: twice the
  /// scale interval d = 5 mm of billing-certified dimensioners)
  double max_uncertainty = 0.010;
  /// belt setting: share of the top face's columns (g x g) holding a point below this: failed,
  /// "too_sparse" (the elastic faces need neighbouring columns)
  double min_top_occupancy = 0.6;
  /// a face supported by fewer columns (side faces) or points (the top) than this:
  /// low_confidence, "too_few_face_points"
  std::size_t min_face_support = 8;
  /// the largest cluster holds less than this share of the voxels above the belt: low_confidence,
  /// "fragmented" (several objects, or a cloud broken up by sparsity)
  double min_kept_share = 0.5;
  /// belt setting: the object's top continues past a side face (mebb_result::top_past, the share
  /// of the face's columns with points at the top height 10-250 mm outside it) over more than
  /// this share: low_confidence, "top_past_face" (a part of the body was cut off)
  double max_top_past_share = 0.5;
};

/// What a reason means in words (for the text output).
inline const char* reason_text(const std::string& r) {
  if (r == "no_belt") return "no belt plane found under the object (measured in full 3D)";
  if (r == "too_sparse") return "the scan is too sparse for the face fits";
  if (r == "fragmented") return "the object falls apart into several clusters";
  if (r == "too_few_face_points") return "a face is held by too few points";
  if (r == "not_converged") return "the faces did not settle";
  if (r == "degenerate_shape") return "the cloud is flat or a line, not a box";
  if (r == "high_uncertainty") return "a side's 95 % interval is wider than the limit";
  if (r == "top_past_face") return "the object's top continues past a face (part of it cut off)";
  if (r == "face_hidden") return "a face's top edge is hidden under something above the object";
  return "unknown reason";
}

/// The status implied by a set of reasons (failed when any is fatal).
inline measure_status status_of(const std::vector<std::string>& reasons) {
  if (reasons.empty()) return measure_status::ok;
  for (const auto& r : reasons)
    if (r == "degenerate_shape" || r == "too_sparse") return measure_status::failed;
  return measure_status::low_confidence;
}

}  // namespace tightfit::geometry
