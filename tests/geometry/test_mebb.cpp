// MEBB on generated suitcases with appendages (MEBB within 5 mm where the PCA box is off by more
// than 30 mm), invariance to rigid motions of the input, degenerate inputs, batch measurement,
// point labels and option checks.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <random>

#include "geometry/support.hpp"
#include "scene.hpp"
#include "tightfit/geometry/geometry.hpp"

namespace tg = tightfit::geometry;

namespace {
using tg::test::max_error;

// A lying bag with every appendage (full camera resolution: thin parts vanish at lower ones).
tg::scene bag(std::uint64_t seed, bool full_3d = false, bool low_res = false) {
  tg::scene_options so;
  so.seed = seed;
  if (low_res) so.width = 160, so.height = 120, so.focal = 142.5;
  so.appendage_probability = 1.0;
  so.pose = tg::scene_pose::lying;
  so.full_3d = full_3d;
  so.dark_probability = 0;
  // the clean scan of these tests: the low-noise model, no strays, a fixed resolution, short
  // handles and straps (the hard cases are the benchmark's and test_robust.cpp's)
  so.legacy_noise = true, so.stray_probability = 0, so.vary_resolution = false;
  so.long_handle_probability = 0, so.long_strap_probability = 0, so.mixed_both_sides = false;
  return tg::make_scene(so);
}
}  // namespace

TEST_CASE("the scene generator is deterministic and carries its ground truth") {
  const auto a = bag(3, false, true), b = bag(3, false, true), c = bag(4, false, true);
  REQUIRE(a.cloud.size() == b.cloud.size());
  CHECK(a.cloud.front() == b.cloud.front());
  CHECK(a.cloud.back() == b.cloud.back());
  CHECK(a.cloud.size() != c.cloud.size());
  CHECK(a.appendages == tg::appendage_all);
  CHECK(a.dims[0] >= a.dims[1]);
  CHECK(a.dims[1] >= a.dims[2]);
  CHECK(a.dims[0] <= 0.8);
  CHECK(a.dims[2] >= 0.18);
  CHECK(a.envelope.volume() > a.body.volume());
  CHECK(a.body.centre.z() == doctest::Approx(a.body.extent[2] / 2));
}

// 5 mm: the largest error of these three is 4.6 mm (seed 11's length; the errors over 200 bags
// and the coverage of the 95 % intervals are measured in bench/geometry)
TEST_CASE("bags with appendages: MEBB within 5 mm where the PCA box is off by more than 30 mm") {
  for (std::uint64_t seed : {11u, 12u, 13u}) {
    CAPTURE(seed);
    const auto sc = bag(seed);
    const auto belt = tg::belt_choice::at_z(0.0);
    const auto m = tg::measure(sc.cloud, tg::box_method::mebb, belt);
    const auto p = tg::measure(sc.cloud, tg::box_method::pca, belt);
    CHECK(max_error(m.dims, sc.dims) < 0.005);
    CHECK(max_error(p.dims, sc.dims) > 0.030);
    REQUIRE(m.mebb.has_value());
    CHECK((m.mebb->flags & tg::mebb_appendage) != 0);
    // the envelope holds the appendages: larger than the body, close to the true envelope
    CHECK(m.envelope.volume() > m.box.volume());
    CHECK(m.envelope.sorted_dims()[0] > m.dims[0] + 0.02);
    // labels: the appendage points sit outside the body
    const auto labels = tg::label_points(sc.cloud, *m.mebb, true);
    std::size_t body = 0, app = 0, app_in_truth = 0;
    for (std::size_t i = 0; i < labels.size(); ++i) {
      body += labels[i] == tg::point_label::body;
      if (labels[i] == tg::point_label::appendage) {
        ++app;
        app_in_truth += sc.body.contains(sc.cloud[i], 0.004);
      }
    }
    CHECK(body > labels.size() / 10);
    CHECK(app > 50);
    CHECK(app_in_truth < app / 10);
  }
}

TEST_CASE("full 3D (no belt): six elastic faces") {
  const auto sc = bag(5, true);
  const auto m = tg::measure(sc.cloud, tg::box_method::mebb, {tg::belt_choice::none, {}});
  const auto p = tg::measure(sc.cloud, tg::box_method::pca, {tg::belt_choice::none, {}});
  CHECK_FALSE(m.belt.has_value());
  CHECK(max_error(m.dims, sc.dims) < 0.005);
  CHECK(max_error(p.dims, sc.dims) > 0.030);
}

TEST_CASE("invariance to rotation and translation of the input") {
  const auto sc = bag(14);
  const auto ref = tg::measure(sc.cloud, tg::box_method::mebb, tg::belt_choice::at_z(0.0));
  std::mt19937_64 gen(77);
  for (int trial = 0; trial < 2; ++trial) {
    const Eigen::Matrix3d rot = tg::test::random_rotation(gen);
    const tg::point3 shift(1.5, -20, 3.25);
    tg::points moved(sc.cloud.size());
    for (std::size_t i = 0; i < moved.size(); ++i) moved[i] = rot * sc.cloud[i] + shift;
    const tg::plane belt{rot.col(2), rot.col(2).dot(shift)};
    const auto m = tg::measure(moved, tg::box_method::mebb, {tg::belt_choice::given, belt});
    // the voxel grid is axis-aligned in the belt frame: the result moves with its lattice, by
    // no more than the stated 95 % interval
    const double tol =
        std::max(0.003, *std::max_element(ref.uncertainty.begin(), ref.uncertainty.end()));
    CHECK(max_error(m.dims, ref.dims) < tol);
    CHECK((m.box.centre - (rot * ref.box.centre + shift)).norm() < tol);
    // and the belt is found by RANSAC on the raw scan
    const auto d = tg::measure(moved, tg::box_method::mebb);
    REQUIRE(d.belt.has_value());
    CHECK(d.belt->normal.dot(rot.col(2)) > 0.999);
    CHECK(max_error(d.dims, ref.dims) < tol);
  }
  // a yaw and a shift on the belt
  tg::points yawed(sc.cloud.size());
  const Eigen::Matrix3d rz = tg::rot_z(1.1);
  for (std::size_t i = 0; i < yawed.size(); ++i)
    yawed[i] = rz * sc.cloud[i] + tg::point3(0.3, -0.2, 0);
  const auto y = tg::measure(yawed, tg::box_method::mebb, tg::belt_choice::at_z(0.0));
  CHECK(max_error(y.dims, ref.dims) <
        std::max(0.003, *std::max_element(ref.uncertainty.begin(), ref.uncertainty.end())));
}

TEST_CASE("degenerate inputs: a clear error or a documented degenerate result") {
  const tg::mebb_options o;
  const auto none = tg::belt_choice{tg::belt_choice::none, {}};
  CHECK_THROWS_WITH_AS(tg::measure({}, tg::box_method::mebb, none),
                       doctest::Contains("expected at least"), tightfit::error);
  tg::points tiny(10, tg::point3(0.1, 0.2, 0.3));
  CHECK_THROWS_AS(tg::measure(tiny, tg::box_method::mebb, none), tightfit::error);
  tg::points same(1000, tg::point3(0.1, 0.2, 0.3));
  CHECK_THROWS_WITH_AS(tg::measure(same, tg::box_method::mebb, none),
                       doctest::Contains("points left"), tightfit::error);
  tg::points with_nan(100, tg::point3(0, 0, 0));
  with_nan[42].y() = NAN;
  CHECK_THROWS_WITH_AS(tg::measure(with_nan, tg::box_method::mebb, none),
                       doctest::Contains("point 42"), tightfit::error);
  // collinear: a documented degenerate result (flag, zero thickness), not a crash
  tg::points line;
  for (int i = 0; i < 500; ++i) line.emplace_back(0.001 * i, 0.002 * i, -0.001 * i);
  const auto l = tg::measure(line, tg::box_method::mebb, none);
  REQUIRE(l.mebb.has_value());
  CHECK((l.mebb->flags & tg::mebb_line) != 0);
  CHECK(l.dims[0] <= std::sqrt(6.0) * 0.499 + 1e-9);  // the end faces are elastic too
  CHECK(l.dims[0] > 0.8 * std::sqrt(6.0) * 0.499);
  CHECK(l.status == tg::measure_status::failed);  // never an ok box
  CHECK(l.dims[1] < 1e-9);
  // coplanar: flagged flat, zero thickness
  tg::points flat;
  for (int i = 0; i < 60; ++i)
    for (int j = 0; j < 40; ++j) flat.emplace_back(0.005 * i, 0.005 * j, 0.0);
  const auto f = tg::measure(flat, tg::box_method::mebb, none);
  CHECK((f.mebb->flags & tg::mebb_flat) != 0);
  CHECK(f.dims[2] < 1e-9);
  CHECK(f.dims[0] == doctest::Approx(0.295).epsilon(0.05));
  // a flat sheet on the belt: nothing above the belt cut
  CHECK_THROWS_WITH_AS(tg::measure(flat, tg::box_method::mebb, tg::belt_choice::at_z(0.0)),
                       doctest::Contains("above the belt cut"), tightfit::error);
  // duplicated points change nothing
  const auto sc = bag(15);
  tg::points doubled = sc.cloud;
  doubled.insert(doubled.end(), sc.cloud.begin(), sc.cloud.end());
  const auto a = tg::measure(sc.cloud, tg::box_method::mebb, tg::belt_choice::at_z(0.0));
  const auto b = tg::measure(doubled, tg::box_method::mebb, tg::belt_choice::at_z(0.0));
  CHECK(max_error(a.dims, b.dims) < 1e-6);
  // bad options and a bad belt
  tg::mebb_options bad;
  bad.faces.kappa = 0;
  CHECK_THROWS_WITH_AS(tg::measure(sc.cloud, tg::box_method::mebb, tg::belt_choice::at_z(0.0), bad),
                       doctest::Contains("faces.kappa is 0"), tightfit::error);
  CHECK_THROWS_AS(tg::measure(sc.cloud, tg::box_method::mebb,
                              {tg::belt_choice::given, {tg::point3::Zero(), 0}}),
                  tightfit::error);
  CHECK_THROWS_AS(tg::parse_box_method("obb"), tightfit::error);
  CHECK_THROWS_AS(tg::measure(line, tg::box_method::hull, none), tightfit::error);
}

TEST_CASE("measure_many: parallel batch, a bad cloud reports its error") {
  std::vector<tg::points> clouds{bag(16).cloud, tg::points(3, tg::point3::Zero()), bag(17).cloud};
  const auto out = tg::measure_many(clouds, tg::box_method::mebb, tg::belt_choice::at_z(0.0));
  REQUIRE(out.size() == 3);
  CHECK(out[0].result.has_value());
  CHECK_FALSE(out[1].result.has_value());
  CHECK(out[1].error.find("expected at least") != std::string::npos);
  REQUIRE(out[2].result.has_value());
  const auto single = tg::measure(clouds[2], tg::box_method::mebb, tg::belt_choice::at_z(0.0));
  CHECK(out[2].result->dims == single.dims);
}

namespace {
// The top view of a box top in the box frame (x in [-0.25, 0.25], y in [-0.2, 0.2], top at
// z = 0.3) for the solid-edge check of the +x face: a 2.5 mm grid of points on the top with a
// rounded edge (radius `r`) down to the +x face at x = `edge`; `keep(depth, y)` drops points.
template <class Keep>
tg::points top_grid(double edge, Keep keep, double r = 0.02) {
  tg::points p;
  const double top = 0.3;
  for (double x = -0.25; x <= edge + 1e-12; x += 0.0025)
    for (double y = -0.2; y <= 0.2 + 1e-12; y += 0.0025) {
      const double depth = edge - x;  // from the face, inward
      if (!keep(depth, y)) continue;
      const double t = std::max(0.0, r - depth);  // the rounded edge falls off near the face
      p.emplace_back(x, y, top - (r - std::sqrt(r * r - t * t)));
    }
  return p;
}
}  // namespace

// The solid-edge check (docs/mebb.md, "Uncertainty per side") on hand-made faces: its depth
// enters the face's sigma, so a wrong depth flags a right box or passes a wrong one.
TEST_CASE("solid-edge depth: the body's top strip before a gap, a grip below the top") {
  const tg::mebb_options o;  // g = 10 mm, slabs every 5 mm, solid at 75 % of the 40 columns
  const Eigen::Vector3d lo(-0.25, -0.2, 0.0), hi(0.25, 0.2, 0.3);
  SUBCASE("the first solid run is the body at the top: depth = its start") {
    // a standing bag's top end: a full-width strip 45 mm deep along the face, then 35 mm with
    // points in a fifth of the columns (the shadow of a handle grip above), then the rest of
    // the top, all at the top height
    const auto u = top_grid(
        0.25, [](double depth, double y) { return depth <= 0.045 || depth >= 0.08 || y < -0.12; });
    const auto se = tg::detail::solid_edge_depth(u, lo, hi, 0, 1.0, o);
    CHECK(se.top_run);
    CHECK(std::abs(se.run_height - 0.3) < 0.005);  // the rounded edge lowers the mean a little
    CHECK(se.depth == 0.0);
    // without the exceptions the gap rule reads the strip as a grip: the depth of the far side
    tg::mebb_options plain = o;
    plain.solid_edge.top_run = false, plain.solid_edge.shadow_gap = false;
    const auto gap = tg::detail::solid_edge_depth(u, lo, hi, 0, 1.0, plain);
    CHECK_FALSE(gap.top_run);
    CHECK(gap.depth >= 0.08 - o.faces.column);
    CHECK(gap.depth <= 0.08);
  }
  SUBCASE("a grip below the top followed by a gap: the depth counts to the body") {
    // the body's face at x = 0.198 (depth 52 mm from the box face at 0.25); a grip as wide as
    // 80 % of the face, 0-24 mm deep, `below` under the top; two rods between grip and body
    for (double below : {0.025, 0.015}) {
      CAPTURE(below);
      auto u = top_grid(0.198, [](double, double) { return true; });
      for (double x = 0.226; x <= 0.25 + 1e-12; x += 0.0025)
        for (double y = -0.16; y <= 0.16 + 1e-12; y += 0.0025) u.emplace_back(x, y, 0.3 - below);
      for (double x = 0.2; x < 0.226; x += 0.0025)
        for (double y : {-0.14, 0.14}) u.emplace_back(x, y, 0.3 - below);
      const auto se = tg::detail::solid_edge_depth(u, lo, hi, 0, 1.0, o);
      CHECK_FALSE(se.top_run);
      CHECK(std::abs(se.run_height - (0.3 - below)) < 0.001);
      CHECK(se.depth >= 0.052 - o.faces.column);
      CHECK(se.depth <= 0.052);
    }
  }
  SUBCASE("a clean face: depth 0, no run height") {
    const auto u = top_grid(0.25, [](double, double) { return true; });
    const auto se = tg::detail::solid_edge_depth(u, lo, hi, 0, 1.0, o);
    CHECK(se.depth == 0.0);
    CHECK_FALSE(se.top_run);
    CHECK(std::isnan(se.run_height));
  }
}

TEST_CASE("solid-edge depth: a shadow on the top after the rounded edge is not a grip's gap") {
  // a standing bag's top end under an extended handle: the rounded edge (40 mm radius, its
  // points 11-40 mm below the top) is the first solid run, then 25 mm where only a fifth of the
  // columns hold points, near the top height (the body beside the shadow of the grip above),
  // then the top
  const tg::mebb_options o;
  const Eigen::Vector3d lo(-0.25, -0.2, 0.0), hi(0.25, 0.2, 0.3);
  const auto u = top_grid(
      0.25, [](double depth, double y) { return depth <= 0.012 || depth >= 0.037 || y < -0.12; },
      0.04);
  const auto se = tg::detail::solid_edge_depth(u, lo, hi, 0, 1.0, o);
  CHECK_FALSE(se.top_run);                                // the run itself lies below the top ...
  CHECK(0.3 - se.run_height > o.faces.column);            // ... by more than g
  CHECK(std::abs(se.gap_height - 0.3) < o.faces.column);  // but the gap's points are at the top
  CHECK(se.shadow_gap);
  CHECK(se.depth == 0.0);
  tg::mebb_options plain = o;
  plain.solid_edge.shadow_gap = false;  // without the rule: the depth of the far side of the shadow
  const auto gap = tg::detail::solid_edge_depth(u, lo, hi, 0, 1.0, plain);
  CHECK_FALSE(gap.shadow_gap);
  CHECK(gap.depth >= 0.037 - o.faces.column);
  CHECK(gap.depth <= 0.037);
}

TEST_CASE("top_past_face_share: the object's top continuing past a face") {
  const tg::mebb_options o;
  tg::oriented_box box;  // 500 x 400 x 300 mm on the belt, rotated about z
  box.extent = {0.5, 0.4, 0.3};
  box.centre = {0.1, -0.2, 0.15};
  box.rotation = tg::rot_z(0.4);
  auto at = [&](double x, double y, double z) {
    return tg::point3(box.rotation * tg::point3(x, y, z - 0.15) + box.centre);
  };
  tg::points p;
  for (double x = -0.25; x <= 0.25; x += 0.005)  // the top itself: inside, never counted
    for (double y = -0.2; y <= 0.2; y += 0.005) p.push_back(at(x, y, 0.3));
  CHECK(tg::top_past_face_share(p, box, o) == 0.0);
  tg::points strip = p, low = p, strap = p;
  for (double x = 0.31; x <= 0.35; x += 0.005)  // 60-100 mm past the +x face
    for (double y = -0.2; y <= 0.2; y += 0.005) {
      strip.push_back(at(x, y, 0.302));  // at the top height: a cut-off part of the top
      low.push_back(at(x, y, 0.27));     // 30 mm lower: an appendage below the top
    }
  for (double x = 0.26; x <= 0.35; x += 0.005)  // a 40 mm strap over the edge, at the top
    for (double y = 0.0; y <= 0.04; y += 0.005) strap.push_back(at(x, y, 0.3));
  CHECK(tg::top_past_face_share(strip, box, o) > 0.95);
  CHECK(tg::top_past_face_share(low, box, o) == 0.0);
  CHECK(tg::top_past_face_share(strap, box, o) < 0.2);  // 40 of 400 mm: 4-5 of 40 columns
}

// Standing bags with the telescopic handle extended 10-40 cm above the top end: the grip's
// shadow can cut a strip of the top end off the rest, which the cleaning then drops as another
// cluster. Each of these (generated) scans gave a silent wrong box (the thickness 42-105 mm too
// small, status ok) before the top_past_face check; now each is ok within 10 mm or not ok.
TEST_CASE("standing bags with an extended handle: measured right or flagged") {
  // (5009: a right box with the grip and its veils dropped by the cleaning, which a grip cut
  // without the overhang check moved 42 mm inward, status ok)
  for (std::uint64_t seed : {5009u, 5014u, 5025u, 5027u, 5029u}) {
    CAPTURE(seed);
    tg::scene_options so;
    so.seed = seed, so.random_frame = true;
    so.pose = tg::scene_pose::standing;
    so.appendage_mask = tg::appendage_telescopic, so.appendage_probability = 1;
    so.long_handle_probability = 1;
    const auto sc = tg::make_scene(so);
    REQUIRE(sc.long_handle);
    const auto m = tg::measure(sc.cloud);
    CAPTURE(m.dims[2]);
    CAPTURE(sc.dims[2]);
    if (m.status == tg::measure_status::ok) {
      CHECK(max_error(m.dims, sc.dims) < 0.010);
    } else {
      CHECK_FALSE(m.reasons.empty());
    }
  }
}

// The benchmark's standing-handles scenario (scene_scenario::standing_handles: every bag stands on
// its end with the telescopic handle raised 10-40 cm): scans whose grip and veils hid the strip
// of the top end along the back panel. They gave boxes 11-30 mm too thin with status ok before
// the hidden-edge check (mebb_options::checks.hidden); now each must be within 5 mm per side with
// status ok, or not ok: never ok and wrong.
TEST_CASE("standing bags with a raised handle: within 5 mm and ok, or not ok") {
  struct scan {
    std::uint64_t seed;
    double noise;
  };
  for (const scan sc0 :
       {scan{5006, 1}, scan{5006, 2}, scan{5015, 1}, scan{5015, 2}, scan{5026, 2}, scan{5009, 1}}) {
    CAPTURE(sc0.seed);
    CAPTURE(sc0.noise);
    tg::scene_options so = tg::with_scenario({}, tg::scene_scenario::standing_handles);
    so.seed = sc0.seed, so.noise_scale = sc0.noise, so.random_frame = true;  // as the bench
    const auto sc = tg::make_scene(so);
    REQUIRE(sc.long_handle);
    REQUIRE(sc.pose == tg::scene_pose::standing);
    const auto m = tg::measure(sc.cloud);
    CAPTURE(tg::status_name(m.status));
    CAPTURE(max_error(m.dims, sc.dims));
    if (m.status == tg::measure_status::ok)
      CHECK(max_error(m.dims, sc.dims) <= 0.005);
    else
      CHECK_FALSE(m.reasons.empty());
  }
}

// A lying bag (bench scene 1015, noise x1) whose +x face a telescopic grip 20 mm below the top
// holds out by 53 mm: measure() cuts the grip off and solves again (solid_grip_trim).
TEST_CASE("a face held out by a grip below the top: the grip is cut off, the box is right") {
  tg::scene_options so;
  so.seed = 1015, so.random_frame = true;  // the benchmark's scene options
  const auto sc = tg::make_scene(so);
  const auto m = tg::measure(sc.cloud);
  REQUIRE(m.mebb.has_value());
  CHECK(*std::max_element(m.mebb->face_cut.begin(), m.mebb->face_cut.end()) > 0);
  CHECK(m.status == tg::measure_status::ok);
  CHECK(max_error(m.dims, sc.dims) < 0.005);
  tg::mebb_options plain;
  plain.solid_edge.grip_trim = false;  // without the cut: the grip holds the face out, flagged
  const auto f = tg::measure(sc.cloud, tg::box_method::mebb, {}, plain);
  CHECK(f.status != tg::measure_status::ok);
  CHECK(max_error(f.dims, sc.dims) > 0.04);
}

TEST_CASE("grip_overhangs: something above the top over a side face") {
  const tg::mebb_options o;
  tg::oriented_box box;  // 500 x 400 x 300 mm on the belt
  box.extent = {0.5, 0.4, 0.3};
  box.centre = {0.0, 0.0, 0.15};
  tg::points p;
  for (double x = -0.25; x <= 0.25; x += 0.005)  // the top: never overhangs
    for (double y = -0.2; y <= 0.2; y += 0.005) p.emplace_back(x, y, 0.3);
  CHECK_FALSE(tg::grip_overhangs(p, box, 0, 0.04, o));
  tg::points grip = p, far = p;
  for (double y = -0.15; y <= 0.15; y += 0.005) {
    grip.emplace_back(0.21, y, 0.45);  // a raised handle's grip 40 mm inside the +x face
    far.emplace_back(-0.1, y, 0.45);   // the same 350 mm inside it: not over that face
  }
  CHECK(tg::grip_overhangs(grip, box, 0, 0.04, o));
  CHECK_FALSE(tg::grip_overhangs(far, box, 0, 0.04, o));
  CHECK_FALSE(tg::grip_overhangs(grip, box, 1, 0.04, o));  // the -x face
}
