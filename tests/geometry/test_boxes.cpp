// Clean boxes without appendages, at random poses: every method within 2 mm (full 3D and on a
// belt), through measure() as a user calls it.
#include <doctest/doctest.h>

#include <array>
#include <random>
#include <string>

#include "geometry/support.hpp"
#include "tightfit/geometry/geometry.hpp"

namespace tg = tightfit::geometry;

namespace {
double max_dim_error(const std::array<double, 3>& got, const tg::oriented_box& truth) {
  const auto want = truth.sorted_dims();
  double e = 0;
  for (int k = 0; k < 3; ++k)
    e = std::max(e, std::abs(got[static_cast<std::size_t>(k)] - want[static_cast<std::size_t>(k)]));
  return e;
}
}  // namespace

TEST_CASE("clean boxes at random 3D poses: every method within 2 mm") {
  std::mt19937_64 gen(21);
  std::uniform_real_distribution<double> u(0, 1);
  for (int trial = 0; trial < 4; ++trial) {
    tg::oriented_box b;
    // well separated sides: PCA axes are well defined (near-square footprints are MEBB's job)
    b.extent = {0.60 + 0.20 * u(gen), 0.38 + 0.06 * u(gen), 0.18 + 0.08 * u(gen)};
    b.rotation = tg::test::random_rotation(gen);
    b.centre = {u(gen) - 0.5, u(gen) - 0.5, u(gen)};
    const auto p = tg::test::box_grid_surface(b, 0.003);
    for (auto m : {tg::box_method::mebb, tg::box_method::pca, tg::box_method::trimmed}) {
      const std::string method = tg::method_name(m);
      CAPTURE(method);
      const auto r = tg::measure(p, m, tg::belt_choice{tg::belt_choice::none, {}});
      CHECK(max_dim_error(r.dims, b) < 0.002);
      CHECK((r.box.centre - b.centre).norm() < 0.002);
    }
    // the axis-aligned box is exact only for an axis-aligned box
    tg::oriented_box aligned = b;
    aligned.rotation.setIdentity();
    const auto q = tg::test::box_grid_surface(aligned, 0.003);
    CHECK(max_dim_error(tg::measure(q, tg::box_method::aabb, {tg::belt_choice::none, {}}).dims,
                        aligned) < 0.002);
  }
}

TEST_CASE("clean boxes on a belt at random yaw: every method within 2 mm") {
  std::mt19937_64 gen(22);
  std::uniform_real_distribution<double> u(0, 1);
  for (int trial = 0; trial < 4; ++trial) {
    tg::oriented_box b;
    b.extent = {0.60 + 0.20 * u(gen), 0.38 + 0.06 * u(gen), 0.18 + 0.12 * u(gen)};
    b.rotation = tg::rot_z((u(gen) - 0.5) * 6.2);
    b.centre = {u(gen) - 0.5, u(gen) - 0.5, b.extent[2] / 2};
    auto p = tg::test::box_grid_surface(b, 0.003, true);
    const auto belt = tg::belt_choice::at_z(0.0);
    for (auto m : {tg::box_method::mebb, tg::box_method::pca, tg::box_method::trimmed,
                   tg::box_method::hull}) {
      const std::string method = tg::method_name(m);
      CAPTURE(method);
      const auto r = tg::measure(p, m, belt);
      CHECK(max_dim_error(r.dims, b) < 0.002);
    }
    tg::oriented_box aligned = b;
    aligned.rotation.setIdentity();
    const auto q = tg::test::box_grid_surface(aligned, 0.003, true);
    CHECK(max_dim_error(tg::measure(q, tg::box_method::aabb, belt).dims, aligned) < 0.002);
  }
}

TEST_CASE("oriented_box helpers") {
  tg::oriented_box b;
  b.extent = {0.2, 0.5, 0.1};
  b.rotation = tg::rot_z(0.4);
  b.centre = {1, 2, 3};
  const auto d = b.sorted_dims();
  CHECK(d[0] == 0.5);
  CHECK(d[2] == 0.1);
  CHECK(b.volume() == doctest::Approx(0.01));
  CHECK(b.contains(b.centre + b.rotation * tg::point3(0.09, -0.24, 0.04)));
  CHECK_FALSE(b.contains(b.centre + b.rotation * tg::point3(0.11, 0, 0)));
  CHECK(b.contains(b.centre + b.rotation * tg::point3(0.11, 0, 0), 0.02));
}
