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
static_assert(tg::PointCloud<tg::float_cloud>);
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

TEST_CASE("Euclidean clusters on the grid path: the radius is a strict bound, chains link") {
  // a lattice of pitch exactly r (r = 0.5 and the coordinates i * r are exact in binary, so no
  // two points are closer than r: every point its own cluster), then the same lattice at a pitch
  // a hair below r (one cluster), then two such sheets 1.5 r apart with one bridge point between
  // them (one cluster) and without it (two)
  const double r = 0.5;
  auto sheet = [&](double pitch, double z, tg::points& p) {
    for (int i = 0; i < 40; ++i)
      for (int j = 0; j < 40; ++j) p.emplace_back(i * pitch, j * pitch, z);
  };
  auto components = [&](const tg::points& p) {  // brute force: union-find over all pairs
    std::vector<std::size_t> parent(p.size());
    std::iota(parent.begin(), parent.end(), std::size_t{0});
    auto find = [&](std::size_t x) {
      while (parent[x] != x) x = parent[x];
      return x;
    };
    std::size_t n = p.size();
    for (std::size_t i = 0; i < p.size(); ++i)
      for (std::size_t j = i + 1; j < p.size(); ++j)
        if ((p[i] - p[j]).squaredNorm() < r * r && find(i) != find(j))
          parent[find(i)] = find(j), --n;
    return n;
  };
  tg::points exact;
  sheet(r, 0, exact);
  CHECK(components(exact) == exact.size());
  CHECK(tg::euclidean_clusters(exact, r).size() == exact.size());
  tg::points tight;
  sheet(r * (1 - 1e-9), 0, tight);
  CHECK(tg::euclidean_clusters(tight, r).size() == 1);
  tg::points two;
  sheet(0.8 * r, 0, two);
  sheet(0.8 * r, 1.5 * r, two);
  const auto apart = tg::euclidean_clusters(two, r);
  REQUIRE(apart.size() == 2);
  CHECK(apart[0].size() == 1600);
  CHECK(apart[0][0] == 0);  // equal sizes: the cluster of the smaller index first
  two.emplace_back(0.1 * r, 0.2 * r, 0.75 * r);
  CHECK(tg::euclidean_clusters(two, r).size() == 1);
}

TEST_CASE("statistical outlier removal keeps exactly the points a brute-force k-NN keeps") {
  // a noisy wavy sheet with a denser patch and scattered outliers: the grid answers most k-NN
  // queries, the kd-tree the others (sparse or far points); the mask must equal the one from
  // exact brute-force means (distances summed nearest first, as the filter documents)
  std::mt19937_64 gen(17);
  std::uniform_real_distribution<double> u(0, 1);
  std::normal_distribution<double> noise(0, 0.002);
  tg::points p;
  for (int i = 0; i < 2500; ++i) {
    const double x = u(gen) * 0.4, y = u(gen) * 0.3;
    p.emplace_back(x, y, 0.01 * std::sin(20 * x) + noise(gen));
  }
  for (int i = 0; i < 600; ++i)
    p.emplace_back(0.1 + 0.05 * u(gen), 0.1 + 0.05 * u(gen), noise(gen));
  for (int i = 0; i < 40; ++i) p.emplace_back(u(gen) * 0.4, u(gen) * 0.3, 0.05 + 0.2 * u(gen));
  for (int k : {4, 8}) {
    const auto kk = static_cast<std::size_t>(k) + 1;
    std::vector<double> mean(p.size());
    for (std::size_t i = 0; i < p.size(); ++i) {
      std::vector<double> d2(p.size());
      for (std::size_t j = 0; j < p.size(); ++j) {
        double r = 0;
        for (int e = 0; e < 3; ++e) {
          const double diff = p[i][e] - p[j][e];
          r += diff * diff;
        }
        d2[j] = r;
      }
      std::partial_sort(d2.begin(), d2.begin() + static_cast<std::ptrdiff_t>(kk), d2.end());
      double s = 0;
      for (std::size_t j = 1; j < kk; ++j) s += std::sqrt(d2[j]);
      mean[i] = s / static_cast<double>(kk - 1);
    }
    double mu = 0, var = 0;
    for (double v : mean) mu += v;
    mu /= static_cast<double>(mean.size());
    for (double v : mean) var += (v - mu) * (v - mu);
    const double limit = mu + 2.0 * std::sqrt(var / static_cast<double>(mean.size()));
    const auto keep = tg::statistical_inliers(p, k, 2.0);
    std::size_t same = 0, dropped = 0;
    for (std::size_t i = 0; i < p.size(); ++i) {
      same += keep[i] == (mean[i] <= limit ? 1 : 0);
      dropped += keep[i] == 0;
    }
    CHECK(same == p.size());
    CHECK(dropped >= 30);  // the outliers go
  }
}

TEST_CASE("belt noise: the medians by histogram selection equal std::nth_element's") {
  std::mt19937_64 gen(5);
  std::normal_distribution<double> noise(0.0005, 0.002);
  std::uniform_real_distribution<double> u(-1, 1);
  for (std::size_t n : {4u, 5u, 1001u, 20000u}) {
    tg::points p;
    for (std::size_t i = 0; i < n; ++i) p.emplace_back(u(gen), u(gen), noise(gen));
    if (n > 10) p[1].z() = p[2].z() = p[3].z();  // ties
    const tg::plane pl{tg::point3::UnitZ(), 0};
    const double window = 0.004;
    std::vector<double> d;
    for (const auto& x : p)
      if (std::abs(x.z()) < window) d.push_back(x.z());
    const auto mid = static_cast<std::ptrdiff_t>(d.size() / 2);
    std::nth_element(d.begin(), d.begin() + mid, d.end());
    const double med = d[static_cast<std::size_t>(mid)];
    for (auto& v : d) v = std::abs(v - med);
    std::nth_element(d.begin(), d.begin() + mid, d.end());
    const tg::belt_noise bn = tg::measure_belt_noise(tg::as_cloud(p), pl, window);
    CHECK(bn.count == d.size());
    REQUIRE(d.size() >= 3);
    CHECK(bn.median == med);
    CHECK(bn.sigma == 1.4826 * d[static_cast<std::size_t>(mid)]);
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
