// Measuring a box in your own point cloud type, without copying it into tightfit's types.
//
// Any type with the two members of the PointCloud concept (nanoflann's dataset contract) plugs
// into tightfit::geometry::measure(), mebb() and detect_belt(): here a depth camera's frame kept
// as three float arrays (structure of arrays), as a driver would hand it over. The example makes
// a synthetic frame (a 600 x 400 x 250 mm box on a belt, seen from 1.5 m above, 2 mm noise),
// measures it and checks the result against the truth.
//
//   custom_point_cloud            prints the box, its 95 % intervals and the status; exit 0 when
//                                 the status is ok and every side lies within its interval
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <random>
#include <vector>

#include "tightfit/geometry/measure.hpp"

namespace tg = tightfit::geometry;

// Your type: the points of one frame as three float arrays.
struct depth_frame {
  std::vector<float> x, y, z;  // (N) each, metres

  // the PointCloud concept: a point count and a coordinate accessor
  std::size_t kdtree_get_point_count() const { return x.size(); }
  float kdtree_get_pt(std::size_t i, std::size_t d) const {
    return d == 0 ? x[i] : d == 1 ? y[i] : z[i];
  }
};
static_assert(tg::PointCloud<depth_frame>);

// A camera 1.5 m above a belt (z = 0) looking down at an axis-aligned box of side lengths
// (l, w, h) centred at the origin: one ray per pixel, the first surface it meets, 2 mm noise.
depth_frame synthetic_frame(double l, double w, double h) {
  depth_frame f;
  std::mt19937 gen(7);
  std::normal_distribution<double> noise(0.0, 0.002);
  const double cam = 1.5, focal = 570;
  for (int j = 0; j < 480; ++j)
    for (int i = 0; i < 640; ++i) {
      const double rx = (i - 319.5) / focal, ry = (j - 239.5) / focal;  // ray per unit depth
      double depth = cam;                                               // the belt
      const double top = cam - h;  // the box top, if the ray meets it there
      if (std::abs(rx * top) <= l / 2 && std::abs(ry * top) <= w / 2) depth = top;
      depth += noise(gen);
      f.x.push_back(static_cast<float>(rx * depth));
      f.y.push_back(static_cast<float>(ry * depth));
      f.z.push_back(static_cast<float>(cam - depth));
    }
  return f;
}

int main() {
  const double l = 0.60, w = 0.40, h = 0.25;
  const depth_frame frame = synthetic_frame(l, w, h);

  // measure() reads the frame in place: it finds the belt, keeps the points above it and fits
  // the elastic box; nothing converts the whole frame to tightfit's point type first
  const tg::measurement m = tg::measure(frame);

  std::printf("%.1f x %.1f x %.1f mm (+- %.1f, %.1f, %.1f mm at 95 %%), status %s",
              m.dims[0] * 1000, m.dims[1] * 1000, m.dims[2] * 1000, m.uncertainty[0] * 1000,
              m.uncertainty[1] * 1000, m.uncertainty[2] * 1000, tg::status_name(m.status));
  for (const auto& r : m.reasons) std::printf(" %s", r.c_str());
  std::printf("\nbelt %s, %zu points in, %zu used\n", m.belt ? "found" : "not found", m.points_in,
              m.points_used);

  // the camera sees only the top face and the belt: the box's walls are hidden, so the footprint
  // comes from the top face's edges, the height from the belt to the top
  const double want[3] = {l, w, h};
  bool ok = m.status == tg::measure_status::ok && m.belt.has_value();
  for (std::size_t k = 0; k < 3; ++k) ok = ok && std::abs(m.dims[k] - want[k]) <= m.uncertainty[k];
  std::printf("%s\n", ok ? "status ok, every side within its interval" : "NOT as expected");
  return ok ? 0 : 1;
}
