// PointCloud concept and adaptors, kd-tree against brute force, voxel grid, outlier removal,
// Euclidean clustering, RANSAC plane and belt detection, PCA and the edge-direction yaw.
#include <doctest/doctest.h>

#include <Eigen/Core>
#include <algorithm>
#include <array>
#include <cmath>
#include <numbers>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "geometry/support.hpp"
#include "tightfit/geometry/geometry.hpp"

namespace tg = tightfit::geometry;

namespace {
struct my_cloud {  // a user's own type: five lines
  std::vector<float> xyz;
  std::size_t kdtree_get_point_count() const { return xyz.size() / 3; }
  float kdtree_get_pt(std::size_t i, std::size_t d) const { return xyz[3 * i + d]; }
};

tg::points random_points(std::size_t n, std::uint64_t seed, double scale = 1.0) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> u(-scale, scale);
  tg::points p(n);
  for (auto& q : p) q = tg::point3(u(gen), u(gen), u(gen));
  return p;
}
}  // namespace

static_assert(tg::PointCloud<tg::matrix_cloud<Eigen::MatrixXd>>);
static_assert(tg::PointCloud<tg::matrix_cloud<Eigen::Matrix<float, Eigen::Dynamic, 3>>>);
static_assert(tg::PointCloud<tg::vector_cloud<std::array<double, 3>>>);
static_assert(tg::PointCloud<tg::vector_cloud<tg::point3>>);
static_assert(tg::PointCloud<my_cloud>);
static_assert(!tg::PointCloud<std::vector<double>>);

TEST_CASE("adaptors copy the same points; non-finite coordinates are rejected") {
  Eigen::MatrixXd m(3, 3);
  m << 1, 2, 3, 4, 5, 6, 7, 8, 9;
  std::vector<std::array<double, 3>> v{{1, 2, 3}, {4, 5, 6}, {7, 8, 9}};
  my_cloud c{{1, 2, 3, 4, 5, 6, 7, 8, 9}};
  const auto a = tg::to_points(tg::matrix_cloud(m));
  const auto b = tg::to_points(tg::vector_cloud(v));
  const auto d = tg::to_points(c);
  REQUIRE(a.size() == 3);
  for (std::size_t i = 0; i < 3; ++i) {
    CHECK(a[i] == b[i]);
    CHECK(a[i] == d[i]);
    CHECK(a[i].x() == m(static_cast<Eigen::Index>(i), 0));
  }
  m(1, 2) = NAN;
  CHECK_THROWS_AS(tg::to_points(tg::matrix_cloud(m)), tightfit::error);
  CHECK_THROWS_AS(tg::matrix_cloud(Eigen::MatrixXd(4, 2)), tightfit::error);
  c.xyz[4] = INFINITY;
  CHECK_THROWS_WITH_AS(tg::to_points(c), doctest::Contains("point 1"), tightfit::error);
}

TEST_CASE("kd-tree radius and knn searches match brute force") {
  const auto p = random_points(2000, 7);
  const tg::points_tree tree(p);
  const auto queries = random_points(50, 8);
  std::vector<std::size_t> got;
  for (const auto& q : queries) {
    tree.radius(q, 0.3, got);
    std::set<std::size_t> want;
    for (std::size_t i = 0; i < p.size(); ++i)
      if ((p[i] - q).squaredNorm() < 0.09) want.insert(i);
    CHECK(std::set<std::size_t>(got.begin(), got.end()) == want);
    std::size_t idx[5];
    double d2[5];
    REQUIRE(tree.knn(q, 5, idx, d2) == 5);
    std::vector<double> all(p.size());
    for (std::size_t i = 0; i < p.size(); ++i) all[i] = (p[i] - q).squaredNorm();
    std::sort(all.begin(), all.end());
    for (int k = 0; k < 5; ++k) CHECK(d2[k] == doctest::Approx(all[static_cast<std::size_t>(k)]));
  }
  // a user's type indexed directly
  my_cloud c;
  for (const auto& q : p)
    for (int d = 0; d < 3; ++d) c.xyz.push_back(static_cast<float>(q[d]));
  const tg::kd_tree<my_cloud> t2(c);
  std::size_t i1;
  double d1;
  REQUIRE(t2.knn(p[17], 1, &i1, &d1) == 1);
  CHECK(i1 == 17);
}

TEST_CASE("voxel grid: one centroid per occupied voxel") {
  tg::points p{
      {0.001, 0.001, 0.001}, {0.003, 0.003, 0.003}, {0.0151, 0.0, 0.0}, {0.0171, 0.0, 0.0}};
  const auto v = tg::voxel_downsample(p, 0.01);
  REQUIRE(v.size() == 2);
  CHECK(v[0].x() == doctest::Approx(0.002));
  CHECK(v[1].x() == doctest::Approx((0.0151 + 0.0171) / 2));
  CHECK_THROWS_AS(tg::voxel_downsample(p, 0.0), tightfit::error);
  CHECK(tg::voxel_downsample({}, 0.01).empty());
}

TEST_CASE("Euclidean clusters equal the connected components of the radius graph") {
  for (std::size_t n : {300u, 3000u}) {  // the kd-tree path and the grid path
    auto p = random_points(n, 11 + n, 0.5);
    const double r = n < 1000 ? 0.12 : 0.05;
    // brute-force components
    std::vector<std::size_t> comp(p.size(), p.size());
    std::size_t nc = 0;
    for (std::size_t s = 0; s < p.size(); ++s) {
      if (comp[s] != p.size()) continue;
      std::vector<std::size_t> stack{s};
      comp[s] = nc;
      while (!stack.empty()) {
        const std::size_t i = stack.back();
        stack.pop_back();
        for (std::size_t j = 0; j < p.size(); ++j)
          if (comp[j] == p.size() && (p[i] - p[j]).squaredNorm() < r * r)
            comp[j] = nc, stack.push_back(j);
      }
      ++nc;
    }
    const auto clusters = tg::euclidean_clusters(p, r);
    CHECK(clusters.size() == nc);
    std::size_t total = 0;
    for (std::size_t c = 0; c < clusters.size(); ++c) {
      total += clusters[c].size();
      if (c > 0) CHECK(clusters[c].size() <= clusters[c - 1].size());
      for (std::size_t i : clusters[c]) CHECK(comp[i] == comp[clusters[c][0]]);
    }
    CHECK(total == p.size());
  }
}

TEST_CASE("statistical outlier removal drops isolated points and keeps the surface") {
  tg::points p;
  for (int i = 0; i < 40; ++i)
    for (int j = 0; j < 40; ++j) p.emplace_back(i * 0.005, j * 0.005, 0.0);
  const std::size_t surface = p.size();
  p.emplace_back(0.1, 0.1, 0.3);
  p.emplace_back(-0.3, 0.1, 0.1);
  const auto q = tg::remove_statistical_outliers(p, 8, 2.0);
  CHECK(q.size() >= surface * 9 / 10);
  CHECK(q.size() <= surface);
  for (const auto& x : q) CHECK(x.z() == 0.0);
}

TEST_CASE("RANSAC recovers a tilted plane; the belt is detected under a box, not on its top") {
  std::mt19937_64 gen(3);
  const Eigen::Matrix3d rot = tg::test::random_rotation(gen);
  std::normal_distribution<double> noise(0, 0.001);
  std::uniform_real_distribution<double> u(-0.6, 0.6);
  tg::points p;
  for (int i = 0; i < 4000; ++i)
    p.push_back(rot * tg::point3(u(gen), u(gen), noise(gen)) + tg::point3(1, 2, 3));
  const auto fit = tg::fit_plane_ransac(p, 0.004);
  CHECK(std::abs(std::abs(fit.fitted.normal.dot(rot.col(2))) - 1) < 1e-4);
  CHECK(fit.inlier_share > 0.9);
  CHECK(fit.rms < 0.002);
  // a box standing on that plane: the belt is found, with the normal towards the box
  tg::oriented_box b;
  b.rotation = rot;
  b.extent = {0.5, 0.4, 0.3};
  b.centre = rot * tg::point3(0, 0, 0.15) + tg::point3(1, 2, 3);
  auto box = tg::test::box_surface(b, 6000, 0.0005, 5, true);
  tg::points scene = p;
  for (const auto& q : box)
    if (rot.col(2).dot(q - tg::point3(1, 2, 3)) > 0.004) scene.push_back(q);
  const auto belt = tg::detect_belt(scene);
  REQUIRE(belt.has_value());
  CHECK(belt->fitted.normal.dot(rot.col(2)) > 0.9999);
  CHECK(std::abs(belt->fitted.distance(tg::point3(1, 2, 3))) < 0.002);
  // the box alone (its top is the dominant plane): not a belt
  tg::points top_only;
  for (const auto& q : box)
    if (rot.col(2).dot(q - tg::point3(1, 2, 3)) > 0.004) top_only.push_back(q);
  CHECK_FALSE(tg::detect_belt(top_only).has_value());
  // the belt frame maps the plane to z = 0 with +z up
  const auto t = tg::belt_frame(belt->fitted);
  CHECK(std::abs(t.apply(tg::point3(1, 2, 3)).z()) < 0.002);
  CHECK(t.apply(b.centre).z() == doctest::Approx(0.15).epsilon(0.02));
  CHECK_THROWS_AS(tg::fit_plane_ransac(tg::points(2, tg::point3::Zero())), tightfit::error);
}

TEST_CASE("PCA axes and the edge-direction yaw of a square footprint") {
  for (double yaw_deg : {7.0, 31.0, 58.0, 84.0}) {
    tg::oriented_box b;
    b.rotation = tg::rot_z(yaw_deg * std::numbers::pi / 180);
    b.extent = {0.4, 0.4, 0.2};
    b.centre = {0.1, -0.2, 0.1};
    const auto p = tg::test::box_surface(b, 20000, 0.0005, 9, true);
    const auto yaw = tg::edge_direction_yaw(p, 0.005, 0.025, 8.0);
    REQUIRE(yaw.has_value());
    double diff = std::fmod(std::abs(*yaw * 180 / std::numbers::pi - yaw_deg), 90.0);
    diff = std::min(diff, 90 - diff);
    CHECK(diff < 2.0);  // 1-degree bins on a 5 mm raster; MEBB refines the yaw afterwards
    const auto pe = tg::pca_yaw(p);
    CHECK(pe.ratio < 1.5);  // near square: PCA yaw is unreliable here
  }
  tg::oriented_box b;
  b.rotation = tg::rot_z(0.3);
  b.extent = {0.8, 0.3, 0.2};
  const auto f = tg::pca(tg::test::box_surface(b, 5000, 0.0, 2));
  CHECK(std::abs(f.axes.col(0).dot(b.rotation.col(0))) > 0.999);
  CHECK(f.axes.determinant() == doctest::Approx(1.0));
}
