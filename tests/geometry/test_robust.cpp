// Robustness of measure() (issue 13): the independent fixtures (as shipped, shuffled, with every
// point duplicated, with a stray point 2 m away: within 5 mm, status ok, the same result for
// every order), belt detection that does not depend on the order of the points, the number of
// threads, stray points, tilted frames or the belt's extent, and inputs that must not give an ok
// box (sparse, identical points, collinear, no belt).
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "geometry/support.hpp"
#include "scene.hpp"
#include "tightfit/core/parallel.hpp"
#include "tightfit/geometry/geometry.hpp"

namespace tg = tightfit::geometry;

namespace {

struct fixture {
  std::string file;
  std::array<double, 3> dims_mm{};
};

// truth.jsonl: {"file": "bag_002.ply", "dims_mm": [545.94, 332.88, 283.01], ...}
std::vector<fixture> read_truth(const std::string& dir) {
  std::vector<fixture> out;
  std::ifstream in(dir + "/truth.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    fixture f;
    char file[256];
    if (std::sscanf(line.c_str(), "{\"file\": \"%255[^\"]\", \"dims_mm\": [%lf, %lf, %lf]", file,
                    &f.dims_mm[0], &f.dims_mm[1], &f.dims_mm[2]) == 4) {
      f.file = file;
      out.push_back(f);
    }
  }
  return out;
}

bool same_result(const tg::measurement& a, const tg::measurement& b) {
  return a.dims == b.dims && a.status == b.status && a.uncertainty == b.uncertainty &&
         a.box.centre == b.box.centre;
}

void check_fixture(const tg::measurement& m, const fixture& f, const char* variant) {
  CAPTURE(f.file);
  const std::string v = variant;
  CAPTURE(v);
  CHECK(m.status == tg::measure_status::ok);
  CHECK(m.belt.has_value());
  for (std::size_t k = 0; k < 3; ++k) {
    CAPTURE(k);
    CHECK(std::abs(m.dims[k] * 1000 - f.dims_mm[k]) <= 5.0);
  }
}

}  // namespace

TEST_CASE("independent fixtures: within 5 mm, status ok, the same for every order of the points") {
  const std::string dir = TIGHTFIT_MEBB_FIXTURES;
  const char* ci = std::getenv("CI");
  if (!std::filesystem::exists(dir + "/truth.jsonl")) {
    if (ci && std::string(ci) == "true") FAIL("MEBB fixtures not found in " << dir << " (CI=true)");
    MESSAGE("MEBB fixtures not found in " << dir << ": fixture test skipped");
    return;
  }
  const auto truth = read_truth(dir);
  REQUIRE(truth.size() == 6);
  std::mt19937_64 gen(13);
  for (const auto& f : truth) {
    const tg::points p = tg::read_ply(dir + "/" + f.file);  // read once, reused by every variant
    const tg::measurement ref = tg::measure(p);
    check_fixture(ref, f, "as shipped");
    tg::points q = p;
    std::shuffle(q.begin(), q.end(), gen);
    const tg::measurement shuffled = tg::measure(q);
    check_fixture(shuffled, f, "shuffled");
    CHECK(same_result(shuffled, ref));
    q.insert(q.end(), p.begin(), p.end());  // every point twice, in another order
    const tg::measurement doubled = tg::measure(q);
    check_fixture(doubled, f, "duplicated");
    CHECK(same_result(doubled, ref));
    q = p;
    q.push_back(p[p.size() / 2] + tg::point3(2.0, 0.0, 0.0));  // one stray point 2 m away
    check_fixture(tg::measure(q), f, "stray point 2 m away");
  }
}

namespace {
// a generated raw scan with the hard cases switched on by the caller
tg::scene hard_scan(std::uint64_t seed, double res = 0.5) {
  tg::scene_options so;
  so.seed = seed;
  so.width = static_cast<int>(640 * res), so.height = static_cast<int>(480 * res);
  so.focal = 570 * res;
  so.vary_resolution = false;
  so.random_frame = true;
  so.stray_probability = 1;
  return tg::make_scene(so);
}
}  // namespace

TEST_CASE(
    "belt detection: any order, any thread count, strays, tilted frames, strip or full belt") {
  for (std::uint64_t seed : {101u, 102u, 103u, 104u}) {
    CAPTURE(seed);
    const tg::scene sc = hard_scan(seed);
    const auto belt = tg::detect_belt(sc.cloud);
    REQUIRE(belt.has_value());
    const tg::point3 up = sc.frame_rotation.col(2);
    CHECK(belt->fitted.normal.dot(up) > std::cos(0.2 * 3.14159 / 180));
    CHECK(std::abs(belt->fitted.offset - up.dot(sc.frame_translation)) < 0.002);
    CHECK(belt->rms > 0);
    tg::points q = sc.cloud;
    std::reverse(q.begin(), q.end());
    const auto again = tg::detect_belt(q);
    REQUIRE(again.has_value());
    CHECK(again->fitted.normal == belt->fitted.normal);
    CHECK(again->fitted.offset == belt->fitted.offset);
  }
  // the same clouds measured in a batch on 1 and on several threads
  std::vector<tg::points> clouds;
  for (std::uint64_t seed : {105u, 106u, 107u}) clouds.push_back(hard_scan(seed).cloud);
  const auto many = tg::measure_many(clouds);
  for (std::size_t i = 0; i < clouds.size(); ++i) {
    REQUIRE(many[i].result.has_value());
    const auto one = tg::measure(clouds[i]);
    CHECK(same_result(*many[i].result, one));
  }
}

TEST_CASE("no silent wrong box: sparse, identical, collinear and belt-less clouds") {
  // 3000 points of a 600 x 400 x 250 mm box on a belt (the camera's view: no bottom)
  tg::oriented_box b;
  b.extent = {0.6, 0.4, 0.25};
  b.centre = {0, 0, 0.125};
  const tg::points sparse = tg::test::box_surface(b, 3000, 0.001, 3, true);
  try {
    const auto m = tg::measure(sparse, tg::box_method::mebb, tg::belt_choice::at_z(0));
    CHECK(m.status != tg::measure_status::ok);
    CHECK_FALSE(m.reasons.empty());
  } catch (const tightfit::error&) {  // a clear error is fine too
  }
  // identical points: an error, never a 0 x 0 x 0 box
  const tg::points same(500, tg::point3(0.1, 0.2, 0.3));
  for (auto method : {tg::box_method::mebb, tg::box_method::pca, tg::box_method::aabb}) {
    CAPTURE(tg::method_name(method));
    bool ok_box = false;
    try {
      ok_box = tg::measure(same, method).status == tg::measure_status::ok;
    } catch (const tightfit::error&) {
    }
    CHECK_FALSE(ok_box);
  }
  // a collinear cloud: failed (degenerate_shape) with or without belt detection
  tg::points line;
  for (int i = 0; i < 2000; ++i) line.emplace_back(0.0003 * i, 0.0002 * i, 0.5);
  for (auto belt : {tg::belt_choice{}, tg::belt_choice{tg::belt_choice::none, {}}}) {
    bool ok_box = false;
    try {
      const auto m = tg::measure(line, tg::box_method::mebb, belt);
      ok_box = m.status == tg::measure_status::ok;
      CHECK(std::find(m.reasons.begin(), m.reasons.end(), "degenerate_shape") != m.reasons.end());
    } catch (const tightfit::error&) {
    }
    CHECK_FALSE(ok_box);
  }
  // a bag seen from above with the belt cut away: no belt found, low confidence
  tg::scene_options so;
  so.seed = 5, so.width = 320, so.height = 240, so.focal = 285, so.include_belt = false;
  so.vary_resolution = false, so.stray_probability = 0;
  const auto m = tg::measure(tg::make_scene(so).cloud);
  CHECK_FALSE(m.belt.has_value());
  CHECK(m.status != tg::measure_status::ok);
  CHECK(std::find(m.reasons.begin(), m.reasons.end(), "no_belt") != m.reasons.end());
}

TEST_CASE("no silent wrong box: a standing bag's handles do not lift its top") {
  // a standing bag of the benchmark's ablation set (bench/geometry, seed 401052 at noise x1) whose
  // telescopic and carry handles hold more than a quarter of the top's points: with the safeguard
  // on the top face, the top went up onto the handles, the side faces followed into their
  // footprint, and the box came out 50-150 mm off with status ok
  tg::scene_options so = tg::with_scenario({}, tg::scene_scenario::standard);
  so.seed = 401052;
  so.random_frame = true;
  const auto sc = tg::make_scene(so);
  REQUIRE(sc.pose == tg::scene_pose::standing);
  const auto m = tg::measure(sc.cloud);
  CHECK(m.status == tg::measure_status::ok);
  CHECK(tg::test::max_error(m.dims, sc.dims) < 0.005);
  tg::mebb_options guarded;
  guarded.faces.belt_top_safeguard = true;
  const auto before = tg::measure(sc.cloud, tg::box_method::mebb, {}, guarded);
  CHECK(tg::test::max_error(before.dims, sc.dims) > 0.04);
}

TEST_CASE("status and reasons are consistent") {
  CHECK(tg::status_of({}) == tg::measure_status::ok);
  CHECK(tg::status_of({"no_belt"}) == tg::measure_status::low_confidence);
  CHECK(tg::status_of({"high_uncertainty", "degenerate_shape"}) == tg::measure_status::failed);
  CHECK(std::string(tg::status_name(tg::measure_status::low_confidence)) == "low_confidence");
  CHECK(std::string(tg::reason_text("too_sparse")).find("sparse") != std::string::npos);
}
