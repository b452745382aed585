// bench/geometry/scene.hpp: a seeded generator of suitcase scenes for the tests and the benchmark
// (no public baggage data set exists). Test and bench support, not part of the installed library.
//
// A suitcase is a signed-distance shape: a rounded-box body (450-800 x 300-500 x 180-320 mm,
// corner radius 10-40 mm) with appendages (telescopic handle, carry handle, side handle, spinner
// wheels, hanging strap, tag), lying, on its side or standing, at a random yaw on a belt (z = 0).
// It is rendered by a pinhole depth camera 1.4-1.6 m above the belt (640x480, f = 570 px; sparse
// and dense scans scale the resolution) by sphere tracing, with axial noise growing with range
// (the structured-light model sigma = a + b (z - 0.4 m)^2 of Khoshelham and Elberink 2012, times
// noise_scale), mixed pixels at depth jumps on both sides of the jump (veils between bag and belt),
// random and grazing-angle dropout (more for dark bags), stray points far away, a belt that fills
// the frame or only a strip of it, and the whole scan optionally moved by a random rigid motion
// (the belt is then not z = 0 and the camera not vertical). Failure modes for the benchmark:
// telescopic handles extended up to 40 cm near the belt, straps hanging down to the belt. The
// full-3D variant samples the shape from six orthographic views (a tunnel scanner) at a random 3D
// rotation, with no belt. Every scene carries its ground truth: the main-body box and the
// envelope including appendages. The same seed gives the same scene on every platform that has
// the same std::mt19937_64 and libm.
#pragma once

#include <Eigen/Geometry>
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "tightfit/geometry/box.hpp"
#include "tightfit/geometry/point_cloud.hpp"

namespace tightfit::geometry {

/// Appendage kinds (bits of scene::appendages and scene_options::appendage_mask).
enum appendage_kind : unsigned {
  appendage_telescopic = 1u << 0,
  appendage_carry = 1u << 1,
  appendage_side = 1u << 2,
  appendage_wheels = 1u << 3,
  appendage_strap = 1u << 4,
  appendage_tag = 1u << 5,
  appendage_all = (1u << 6) - 1,
};
inline constexpr int appendage_kinds = 6;
inline const char* appendage_name(int bit) {
  static const char* names[] = {"telescopic", "carry", "side", "wheels", "strap", "tag"};
  return bit >= 0 && bit < appendage_kinds ? names[bit] : "?";
}

/// How the bag rests: lying on its back (thickness up), on its side (width up) or standing on
/// its end (length up; standing bags have no protruding wheels under them).
enum class scene_pose { lying, on_side, standing };
inline const char* pose_name(scene_pose p) {
  return p == scene_pose::lying ? "lying" : p == scene_pose::on_side ? "on_side" : "standing";
}

/// Generator parameters; each scene draws its body, pose and appendages from `seed`.
struct scene_options {
  std::uint64_t seed = 1;
  double noise_scale = 1.0;                 ///< multiplies the axial noise sigma
  bool full_3d = false;                     ///< tunnel-scanner variant (six views, no belt)
  unsigned appendage_mask = appendage_all;  ///< kinds that may appear
  double appendage_probability = 0.5;       ///< each allowed kind appears with this probability
  std::optional<scene_pose> pose;  ///< fixed pose (default: lying 60%, on_side 25%, standing 15%)
  int width = 640, height = 480;   ///< image size (pixels)
  double focal = 570;              ///< focal length (pixels)
  double sigma_a = 0.0012;         ///< axial noise: sigma = a + b (depth - 0.4 m)^2 (metres)
  double sigma_b = 0.0019;         ///< axial noise growth (m per m^2)
  bool legacy_noise = false;       ///< the old model: 1.2 mm x (depth / 1.5 m)^2
  double sigma0 = 0.0012;          ///< legacy model: sigma at 1.5 m
  double stray_probability = 0.3;  ///< a scan holds 1-3 stray points 0.5-2.5 m away
  double full_belt_probability = 0.5;    ///< the belt fills the frame (else a strip)
  double long_strap_probability = 0.5;   ///< a strap hangs down to the belt
  double long_handle_probability = 0.3;  ///< the telescopic handle is extended 10-40 cm
  /// resolution scale of the camera drawn from {sparse_scale, 1, dense_scale} (20/60/20 %)
  double sparse_scale = 0.6, dense_scale = 1.4;
  bool vary_resolution = true;
  std::optional<double> corner_radius;  ///< body edge radius, metres (default: drawn, 10-40 mm)
  bool random_frame = false;            ///< move the scan by a random rigid motion (tilted camera)
  double dropout = 0.01;                ///< random dropout (dark bags: dark_dropout)
  double dark_probability = 0.2;        ///< share of dark bags
  double dark_dropout = 0.15;
  double mixed_probability = 0.5;  ///< a pixel at a depth jump becomes a mixed pixel
  bool mixed_both_sides = true;    ///< the far side of a jump mixes too (at half the rate)
  bool include_belt = true;        ///< render the belt too (a raw scan)
  double belt_half_width = 0.5;    ///< belt extent across (|y| below it), metres
  double spacing_3d = 0.003;       ///< full 3D: ray spacing of each orthographic view
};

/// Named scenarios: scene_options that make every bag of one kind (the benchmark's stress rows).
/// `standard` leaves the options as they are; `standing_handles` makes every bag stand on its end
/// with a telescopic handle (and no other appendage) extended 10-40 cm above its top end, the
/// case where the grip's shadow and veils hide a strip of the top end from the camera.
enum class scene_scenario { standard, standing_handles };
inline const char* scenario_name(scene_scenario s) {
  return s == scene_scenario::standard ? "standard" : "standing-handles";
}
/// "standard" or "standing-handles"; anything else: nullopt.
inline std::optional<scene_scenario> parse_scenario(const std::string& s) {
  if (s == "standard") return scene_scenario::standard;
  if (s == "standing-handles") return scene_scenario::standing_handles;
  return std::nullopt;
}
inline scene_options with_scenario(const scene_options& base, scene_scenario s) {
  scene_options so = base;
  if (s == scene_scenario::standing_handles) {
    so.pose = scene_pose::standing;
    so.appendage_mask = appendage_telescopic;
    so.appendage_probability = 1;
    so.long_handle_probability = 1;
  }
  return so;
}

/// A generated scene: its cloud and its ground truth.
struct scene {
  points cloud;                  ///< camera points in the belt frame (z up), or full-3D points
  oriented_box body;             ///< ground-truth main body
  oriented_box envelope;         ///< ground-truth envelope including appendages (body axes)
  std::array<double, 3> dims{};  ///< body side lengths sorted L >= W >= H
  unsigned appendages = 0;       ///< appendage_kind bits present
  int strays = 0;                ///< stray points added
  bool full_belt = false;        ///< the belt fills the frame
  double resolution = 1;         ///< camera resolution scale
  bool long_strap = false, long_handle = false;
  /// the rigid motion applied to the scan (identity unless random_frame): the belt plane is
  /// {p : (R e_z) . p = (R e_z) . t}
  Eigen::Matrix3d frame_rotation = Eigen::Matrix3d::Identity();
  point3 frame_translation = point3::Zero();
  scene_pose pose = scene_pose::lying;
  double yaw = 0;  ///< body yaw about +z (belt scenes)
  bool dark = false;
  double corner_radius = 0;        ///< the body's edge radius
  point3 camera = point3::Zero();  ///< the camera centre, belt frame (before frame_rotation)
};

namespace detail {

// A primitive in the body's local frame (x length, y width, z thickness).
struct sdf_prim {
  enum kind_t { rbox, capsule, cylinder } kind = rbox;
  Eigen::Matrix3d rot = Eigen::Matrix3d::Identity();  // local axes of a box / cylinder
  point3 c = point3::Zero();                          // centre (box, cylinder) or end a (capsule)
  point3 b = point3::Zero();                          // end b (capsule)
  Eigen::Vector3d half = Eigen::Vector3d::Zero();     // box half extents / cylinder (r, h/2, -)
  double r = 0;                                       // rounding / capsule radius
  bool body = false;

  double sdf(const point3& p) const {
    switch (kind) {
      case rbox: {
        const Eigen::Vector3d q =
            (rot.transpose() * (p - c)).cwiseAbs() - (half.array() - r).matrix();
        return q.cwiseMax(0.0).norm() + std::min(q.maxCoeff(), 0.0) - r;
      }
      case capsule: {
        const point3 ab = b - c, ap = p - c;
        const double t = std::clamp(ap.dot(ab) / ab.squaredNorm(), 0.0, 1.0);
        return (ap - t * ab).norm() - r;
      }
      case cylinder: {  // axis = rot.col(1), radius half[0], half height half[1]
        const point3 d = p - c;
        const double h = d.dot(rot.col(1));
        const double rad = (d - h * rot.col(1)).norm();
        const double dx = rad - half[0], dy = std::abs(h) - half[1];
        return std::min(std::max(dx, dy), 0.0) +
               Eigen::Vector2d(std::max(dx, 0.0), std::max(dy, 0.0)).norm();
      }
    }
    return INFINITY;
  }
  void bounds(Eigen::Vector3d& lo, Eigen::Vector3d& hi) const {
    auto add = [&](const point3& p) { lo = lo.cwiseMin(p), hi = hi.cwiseMax(p); };
    if (kind == capsule) {
      add(c - point3::Constant(r)), add(c + point3::Constant(r));
      add(b - point3::Constant(r)), add(b + point3::Constant(r));
      return;
    }
    const Eigen::Vector3d h = kind == rbox ? half : Eigen::Vector3d(half[0], half[1], half[0]);
    for (int k = 0; k < 8; ++k)
      add(c +
          rot * Eigen::Vector3d(k & 1 ? h[0] : -h[0], k & 2 ? h[1] : -h[1], k & 4 ? h[2] : -h[2]));
  }
};

struct sdf_shape {
  std::vector<sdf_prim> prims;
  double sdf(const point3& p) const {
    double d = INFINITY;
    for (const auto& q : prims) d = std::min(d, q.sdf(p));
    return d;
  }
};

inline sdf_prim make_capsule(point3 a, point3 b, double r) {
  sdf_prim p;
  p.kind = sdf_prim::capsule, p.c = a, p.b = b, p.r = r;
  return p;
}
inline sdf_prim make_box(point3 c, Eigen::Vector3d half, double r,
                         Eigen::Matrix3d rot = Eigen::Matrix3d::Identity()) {
  sdf_prim p;
  p.kind = sdf_prim::rbox, p.c = c, p.half = half, p.r = r, p.rot = rot;
  return p;
}
inline sdf_prim make_cylinder(point3 c, point3 axis, double radius, double half_h) {
  sdf_prim p;
  p.kind = sdf_prim::cylinder, p.c = c, p.half = Eigen::Vector3d(radius, half_h, 0);
  const point3 y = axis.normalized();
  point3 x = y.unitOrthogonal();
  p.rot.col(0) = x, p.rot.col(1) = y, p.rot.col(2) = x.cross(y);
  return p;
}

// Sphere tracing from o along unit d over [t0, t1]; returns the hit distance.
inline std::optional<double> trace(const sdf_shape& s, const point3& o, const point3& d, double t0,
                                   double t1) {
  double t = t0;
  for (int it = 0; it < 256 && t < t1; ++it) {
    const double dist = s.sdf(o + t * d);
    if (dist < 1e-4) return t;
    t += dist;
  }
  return std::nullopt;
}

inline point3 sdf_normal(const sdf_shape& s, const point3& p) {
  const double e = 1e-4;
  point3 n(s.sdf(p + point3(e, 0, 0)) - s.sdf(p - point3(e, 0, 0)),
           s.sdf(p + point3(0, e, 0)) - s.sdf(p - point3(0, e, 0)),
           s.sdf(p + point3(0, 0, e)) - s.sdf(p - point3(0, 0, e)));
  const double len = n.norm();
  return len > 0 ? point3(n / len) : point3::UnitZ();
}

// Slab test of a ray against an axis-aligned box; [t0, t1] of the overlap.
inline bool ray_box(const point3& o, const point3& d, const Eigen::Vector3d& lo,
                    const Eigen::Vector3d& hi, double& t0, double& t1) {
  t0 = 0, t1 = INFINITY;
  for (int a = 0; a < 3; ++a) {
    if (std::abs(d[a]) < 1e-15) {
      if (o[a] < lo[a] || o[a] > hi[a]) return false;
      continue;
    }
    double ta = (lo[a] - o[a]) / d[a], tb = (hi[a] - o[a]) / d[a];
    if (ta > tb) std::swap(ta, tb);
    t0 = std::max(t0, ta), t1 = std::min(t1, tb);
  }
  return t0 <= t1;
}

}  // namespace detail

/// Generates one scene from `opt` (deterministic in opt.seed).
inline scene make_scene(const scene_options& opt) {
  std::mt19937_64 gen(opt.seed * 0x9E3779B97F4A7C15ull + 12345);
  auto U = [&](double a, double b) { return std::uniform_real_distribution<double>(a, b)(gen); };
  auto coin = [&](double p) { return U(0, 1) < p; };
  // the failure modes of the benchmark draw from their own stream: with them off, a seed gives
  // the same scene as the generator without them
  std::mt19937_64 gen2(opt.seed * 0xD1B54A32D192ED03ull + 777);
  auto U2 = [&](double a, double b) { return std::uniform_real_distribution<double>(a, b)(gen2); };
  auto coin2 = [&](double p) { return U2(0, 1) < p; };
  scene sc;
  // body (local frame: x length, y width, z thickness; +x is the handle end, -x the wheel end)
  const double L = U(0.45, 0.80), W = U(0.30, 0.50), H = U(0.18, 0.32);
  const double rc_drawn = U(0.010, std::min(0.040, H / 4));  // drawn always: keeps the stream
  const double rc = opt.corner_radius.value_or(rc_drawn);
  sc.corner_radius = rc;
  detail::sdf_shape shape;
  shape.prims.push_back(detail::make_box(point3::Zero(), Eigen::Vector3d(L / 2, W / 2, H / 2), rc));
  shape.prims.back().body = true;
  if (opt.pose) {
    sc.pose = *opt.pose;
  } else {
    const double u = U(0, 1);
    sc.pose = u < 0.6 ? scene_pose::lying : u < 0.85 ? scene_pose::on_side : scene_pose::standing;
  }
  double strap_x = 0;
  unsigned present = 0;
  for (int k = 0; k < appendage_kinds; ++k) {
    const bool draw = coin(opt.appendage_probability);  // always drawn: keeps the stream aligned
    if ((opt.appendage_mask >> k & 1u) && draw) present |= 1u << k;
  }
  if (sc.pose == scene_pose::standing && !opt.full_3d)
    present &= ~static_cast<unsigned>(appendage_wheels);
  const double xe = L / 2, ye = W / 2, ze = H / 2;
  if (present & appendage_telescopic) {  // two rod stubs and a grip out of the +x end
    double out = U(0.025, 0.06);
    const double wt = U(0.18, std::min(0.30, W - 0.08)) / 2, z = -ze + U(0.03, 0.06);
    if (coin2(opt.long_handle_probability)) out = U2(0.10, 0.40), sc.long_handle = true;
    shape.prims.push_back(detail::make_capsule({xe - 0.01, -wt, z}, {xe + out, -wt, z}, 0.007));
    shape.prims.push_back(detail::make_capsule({xe - 0.01, wt, z}, {xe + out, wt, z}, 0.007));
    shape.prims.push_back(detail::make_capsule({xe + out, -wt, z}, {xe + out, wt, z}, 0.013));
  }
  if (present & appendage_carry) {  // arc handle on the +x end
    const double hw = U(0.05, 0.075), out = U(0.025, 0.04), z = U(-0.3, 0.3) * ze;
    shape.prims.push_back(detail::make_capsule({xe - 0.005, -hw, z}, {xe + out, -hw, z}, 0.009));
    shape.prims.push_back(detail::make_capsule({xe - 0.005, hw, z}, {xe + out, hw, z}, 0.009));
    shape.prims.push_back(detail::make_capsule({xe + out, -hw, z}, {xe + out, hw, z}, 0.011));
  }
  if (present & appendage_side) {  // arc handle on the +y side
    const double hw = U(0.05, 0.075), out = U(0.025, 0.04), x = U(-0.3, 0.3) * xe;
    shape.prims.push_back(
        detail::make_capsule({x - hw, ye - 0.005, 0}, {x - hw, ye + out, 0}, 0.009));
    shape.prims.push_back(
        detail::make_capsule({x + hw, ye - 0.005, 0}, {x + hw, ye + out, 0}, 0.009));
    shape.prims.push_back(
        detail::make_capsule({x - hw, ye + out, 0}, {x + hw, ye + out, 0}, 0.011));
  }
  if (present & appendage_wheels) {  // four spinner wheels out of the -x end
    const double rw = U(0.022, 0.032), gap = U(0.01, 0.02);
    for (int k = 0; k < 4; ++k) {
      const double y = (k & 1 ? 1 : -1) * (ye - 0.045), z = (k & 2 ? 1 : -1) * (ze - 0.045);
      shape.prims.push_back(detail::make_capsule({-xe + 0.005, y, z}, {-xe - gap, y, z}, 0.012));
      shape.prims.push_back(
          detail::make_cylinder({-xe - gap - rw, y, z}, point3::UnitY(), rw, 0.011));
    }
  }
  if (present & appendage_strap) {  // a strap hanging over the +y top edge
    const double len = U(0.15, 0.30), phi = U(0.5, 1.2), x = U(-0.5, 0.5) * xe;
    sc.long_strap = coin2(opt.long_strap_probability) && sc.pose == scene_pose::lying;
    if (sc.long_strap) strap_x = x;  // hangs down to the belt: built once the flip is known
    const Eigen::Matrix3d rot = Eigen::AngleAxisd(-phi, point3::UnitX()).toRotationMatrix();
    const point3 start(x, ye - 0.03, ze + 0.002);
    const point3 dir = rot * point3::UnitY();
    if (!sc.long_strap)
      shape.prims.push_back(detail::make_box(start + dir * len / 2,
                                             Eigen::Vector3d(0.02, len / 2, 0.002), 0.001, rot));
  }
  if (present & appendage_tag) {  // a tag hanging on a short loop from the +x end, top corner
    const double y = U(-0.5, 0.5) * ye, z = ze - 0.02;
    const point3 a(xe, y, z), b(xe + 0.05, y, z - 0.02);
    shape.prims.push_back(detail::make_capsule(a, b, 0.002));
    const Eigen::Matrix3d rot = Eigen::AngleAxisd(U(-0.5, 0.5), point3::UnitX()).toRotationMatrix();
    shape.prims.push_back(detail::make_box(b + point3(0.003, 0, -0.045),
                                           Eigen::Vector3d(0.002, 0.035, 0.045), 0.001, rot));
  }
  sc.appendages = present;
  // pose: local -> world rotation and translation
  Eigen::Matrix3d pose_rot = Eigen::Matrix3d::Identity();
  double lift = ze;
  if (opt.full_3d) {
    // a uniformly random rotation (Shoemake), from the seeded generator
    const double u1 = U(0, 1), u2 = U(0, 2 * std::numbers::pi), u3 = U(0, 2 * std::numbers::pi);
    const Eigen::Quaterniond q(std::sqrt(u1) * std::cos(u3), std::sqrt(1 - u1) * std::sin(u2),
                               std::sqrt(1 - u1) * std::cos(u2), std::sqrt(u1) * std::sin(u3));
    pose_rot = q.normalized().toRotationMatrix();
  } else {
    Eigen::Matrix3d base = Eigen::Matrix3d::Identity();
    if (sc.pose == scene_pose::lying) {
      const bool flip = coin(0.5);
      if (flip) base = Eigen::AngleAxisd(std::numbers::pi, point3::UnitX()).toRotationMatrix();
      if (sc.long_strap) {  // over the +y edge of the face on top, down the side to the belt
        const double up = flip ? -1.0 : 1.0, phi = U2(1.35, 1.5);
        const double len = (2 * ze + 0.005) / std::sin(phi) + 0.03;
        const Eigen::Matrix3d rot =
            Eigen::AngleAxisd(-up * phi, point3::UnitX()).toRotationMatrix();
        const point3 start(strap_x, ye - 0.03, up * (ze + 0.002));
        const point3 dir = rot * point3::UnitY();
        shape.prims.push_back(detail::make_box(start + dir * len / 2,
                                               Eigen::Vector3d(0.02, len / 2, 0.002), 0.001, rot));
      }
      lift = ze;
    } else if (sc.pose == scene_pose::on_side) {  // +y up (the side handle on top)
      base = Eigen::AngleAxisd(-std::numbers::pi / 2, point3::UnitX()).toRotationMatrix();
      lift = ye;
    } else {  // standing on the -x end, +x (handles) up
      base = Eigen::AngleAxisd(-std::numbers::pi / 2, point3::UnitY()).toRotationMatrix();
      lift = xe;
    }
    sc.yaw = U(-std::numbers::pi, std::numbers::pi);
    pose_rot = Eigen::AngleAxisd(sc.yaw, point3::UnitZ()).toRotationMatrix() * base;
  }
  Eigen::Vector3d elo = Eigen::Vector3d::Constant(INFINITY), ehi = -elo;
  for (const auto& p : shape.prims) p.bounds(elo, ehi);
  const point3 centre = opt.full_3d ? point3(U(-0.1, 0.1), U(-0.1, 0.1), U(-0.1, 0.1))
                                    : point3(U(-0.12, 0.12), U(-0.08, 0.08), lift);
  sc.body.rotation = pose_rot;
  sc.body.extent = Eigen::Vector3d(L, W, H);
  sc.body.centre = centre;
  sc.envelope.rotation = pose_rot;
  sc.envelope.extent = ehi - elo;
  sc.envelope.centre = centre + pose_rot * ((elo + ehi) / 2);
  sc.dims = sc.body.sorted_dims();
  sc.dark = coin(opt.dark_probability);
  const double drop = sc.dark ? opt.dark_dropout : opt.dropout;
  // world shape: transform every primitive
  detail::sdf_shape world = shape;
  for (auto& p : world.prims) {
    p.c = centre + pose_rot * p.c;
    p.b = centre + pose_rot * p.b;
    p.rot = pose_rot * p.rot;
  }
  Eigen::Vector3d wlo = Eigen::Vector3d::Constant(INFINITY), whi = -wlo;
  for (const auto& p : world.prims) p.bounds(wlo, whi);
  wlo.array() -= 0.01, whi.array() += 0.01;
  std::normal_distribution<double> normal(0.0, 1.0);

  if (opt.full_3d) {  // six orthographic views along the world axes
    const double sp = opt.spacing_3d;
    for (int v = 0; v < 6; ++v) {
      const int a = v / 2, b = (a + 1) % 3, c = (a + 2) % 3;
      point3 d = point3::Zero();
      d[a] = v % 2 ? 1.0 : -1.0;
      for (double ub = wlo[b]; ub <= whi[b]; ub += sp)
        for (double uc = wlo[c]; uc <= whi[c]; uc += sp) {
          point3 o;
          o[a] = v % 2 ? wlo[a] - 0.05 : whi[a] + 0.05;
          o[b] = ub + U(-0.3, 0.3) * sp, o[c] = uc + U(-0.3, 0.3) * sp;
          const auto t = detail::trace(world, o, d, 0.0, (whi[a] - wlo[a]) + 0.1);
          if (!t || coin(drop)) continue;
          const point3 hit = o + *t * d;
          const double cosi = std::abs(detail::sdf_normal(world, hit).dot(d));
          if (cosi < 0.08) continue;
          const double sigma = opt.noise_scale * opt.sigma0 / std::sqrt(std::max(cosi, 0.1));
          sc.cloud.push_back(hit + d * (sigma * normal(gen)));
        }
    }
    return sc;
  }

  // pinhole camera above the belt looking down
  const point3 cam(U(-0.05, 0.05), U(-0.05, 0.05), U(1.4, 1.6));
  sc.camera = cam;
  {
    const double u = U2(0, 1);
    sc.resolution = !opt.vary_resolution ? 1.0
                    : u < 0.2            ? opt.sparse_scale
                    : u < 0.8            ? 1.0
                                         : opt.dense_scale;
  }
  sc.full_belt = coin2(opt.full_belt_probability);
  const double belt_half = sc.full_belt ? INFINITY : opt.belt_half_width * U2(0.6, 1.0);
  const int w = static_cast<int>(std::lround(opt.width * sc.resolution));
  const int h = static_cast<int>(std::lround(opt.height * sc.resolution));
  const double f = opt.focal * sc.resolution, cx = (w - 1) / 2.0, cy = (h - 1) / 2.0;
  std::vector<double> depth(static_cast<std::size_t>(w * h), -1);  // camera z-depth, -1: none
  std::vector<double> cosv(static_cast<std::size_t>(w * h), 1);
  std::vector<char> object(static_cast<std::size_t>(w * h), 0);
  for (int j = 0; j < h; ++j)
    for (int i = 0; i < w; ++i) {
      const point3 ray((i - cx) / f, (j - cy) / f, -1.0);  // per unit of depth
      const point3 d = ray.normalized();
      const auto k = static_cast<std::size_t>(j * w + i);
      double t0, t1;
      if (detail::ray_box(cam, d, wlo, whi, t0, t1)) {
        if (auto t = detail::trace(world, cam, d, t0, t1)) {
          const point3 hit = cam + *t * d;
          depth[k] = cam.z() - hit.z();
          cosv[k] = std::abs(detail::sdf_normal(world, hit).dot(d));
          object[k] = 1;
          continue;
        }
      }
      if (!opt.include_belt) continue;
      const double z = cam.z();  // belt at z = 0
      const point3 hit = cam + ray * z;
      if (std::abs(hit.y()) > belt_half) continue;
      depth[k] = z;
      cosv[k] = 1 / ray.norm();
    }
  // mixed pixels: a pixel at a depth jump takes a depth between its own and its neighbour's
  std::vector<double> mixed = depth;
  for (int j = 1; j + 1 < h; ++j)
    for (int i = 1; i + 1 < w; ++i) {
      const auto k = static_cast<std::size_t>(j * w + i);
      if (depth[k] < 0) continue;
      const std::size_t nbs[4] = {k - 1, k + 1, k - static_cast<std::size_t>(w),
                                  k + static_cast<std::size_t>(w)};
      for (auto n : nbs) {  // either side of the jump takes a depth between the two
        if (depth[n] < 0 || std::abs(depth[n] - depth[k]) < 0.03) continue;
        if ((depth[n] > depth[k] || opt.mixed_both_sides) &&
            coin(opt.mixed_probability / (depth[n] > depth[k] ? 1 : 2)))
          mixed[k] = depth[k] + U(0, 1) * (depth[n] - depth[k]);
        break;
      }
    }
  for (int j = 0; j < h; ++j)
    for (int i = 0; i < w; ++i) {
      const auto k = static_cast<std::size_t>(j * w + i);
      double z = mixed[k];
      if (z <= 0) continue;
      if (cosv[k] < 0.08 || coin(object[k] ? drop : opt.dropout)) continue;
      const double base = opt.legacy_noise ? opt.sigma0 * (z / 1.5) * (z / 1.5)
                                           : opt.sigma_a + opt.sigma_b * (z - 0.4) * (z - 0.4);
      const double sigma = opt.noise_scale * base / std::sqrt(std::max(cosv[k], 0.1));
      z += sigma * normal(gen);
      sc.cloud.push_back(cam + point3((i - cx) / f, (j - cy) / f, -1.0) * z);
    }
  if (coin2(opt.stray_probability)) {  // stray points (reflections, dust) far from the bag
    sc.strays = 1 + static_cast<int>(U2(0, 3));
    for (int k = 0; k < sc.strays; ++k) {
      const double r = U2(0.5, 2.5), az = U2(0, 2 * std::numbers::pi), el = U2(-0.3, 1.2);
      sc.cloud.push_back(centre + r * point3(std::cos(az) * std::cos(el),
                                             std::sin(az) * std::cos(el), std::sin(el)));
    }
  }
  if (opt.random_frame) {  // a tilted camera: the scan in another frame
    const Eigen::Matrix3d rot =
        (Eigen::AngleAxisd(U2(-std::numbers::pi, std::numbers::pi), point3::UnitZ()) *
         Eigen::AngleAxisd(U2(0.1, 0.6), point3(U2(-1, 1), U2(-1, 1), 0).normalized()))
            .toRotationMatrix();
    const point3 t(U2(-1, 1), U2(-1, 1), U2(-1, 1));
    for (auto& p : sc.cloud) p = rot * p + t;
    sc.body.rotation = rot * sc.body.rotation, sc.body.centre = rot * sc.body.centre + t;
    sc.envelope.rotation = rot * sc.envelope.rotation;
    sc.envelope.centre = rot * sc.envelope.centre + t;
    sc.frame_rotation = rot, sc.frame_translation = t;
  }
  return sc;
}

}  // namespace tightfit::geometry
