// MEBB accuracy benchmark: generated suitcase scenes (tightfit/geometry/scene.hpp) measured by
// MEBB and the baselines on the same cleaned clouds; prints markdown tables (per dimension bias,
// MAE, P95, max, share within 5/10 mm, failure rate, yaw error, cabin accept/reject accuracy,
// time), breakdowns by appendage, pose and dark bags, an optional parameter sweep, a full-3D
// run, and the end-to-end time on a 1M-point raw cloud.
//
//   tightfit_mebb_bench [--bags N] [--noise 1,2] [--seed S] [--sweep N] [--ablation N]
//                       [--full3d N] [--raw1m] [--dump DIR] [--write-scene FILE.ply] [--brief]
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <numbers>
#include <string>
#include <vector>

#include "tightfit/core/parallel.hpp"
#include "tightfit/geometry/geometry.hpp"

namespace tg = tightfit::geometry;
using clock_type = std::chrono::steady_clock;

namespace {

double ms_since(clock_type::time_point t0) {
  return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
}

struct args_t {
  int bags = 200;
  std::vector<double> noise{1.0, 2.0};
  std::uint64_t seed = 1000;
  int sweep = 0;
  int full3d = 0;
  int ablation = 0;
  bool raw1m = false;
  std::string dump;
  std::string write_scene;
  bool brief = false;
};

const char* const methods[] = {"mebb", "pca", "trimmed", "aabb", "hull"};
constexpr int n_methods = 5;

struct record {
  std::array<double, 3> gt{};
  std::array<std::array<double, 3>, n_methods> dims{};
  std::array<double, n_methods> yaw_err{};
  unsigned appendages = 0;
  tg::scene_pose pose{};
  bool dark = false;
  double noise = 1;
  std::size_t raw_points = 0, bag_points = 0, used_points = 0;
  double clean_ms = 0, solve_ms = 0;
  unsigned flags = 0;
  bool ok = true;
};

// yaw (deg, mod 90) of the box axis most horizontal
double box_yaw_deg(const Eigen::Matrix3d& r) {
  int best = 0;
  for (int k = 1; k < 3; ++k)
    if (std::abs(r(2, k)) < std::abs(r(2, best))) best = k;
  double a = std::atan2(r(1, best), r(0, best)) * 180 / std::numbers::pi;
  a = std::fmod(a, 90.0);
  return a < 0 ? a + 90 : a;
}
double yaw_diff(double a, double b) {
  double d = std::fmod(std::abs(a - b), 90.0);
  return std::min(d, 90 - d);
}

bool cabin_ok(const std::array<double, 3>& d) {
  return d[0] <= 0.55 && d[1] <= 0.40 && d[2] <= 0.23;
}

// runs every method on one scene (belt setting: the belt is the calibrated plane z = 0)
record run_scene(const tg::scene& sc, const tg::mebb_options& o, double noise) {
  record r;
  r.gt = sc.dims;
  r.appendages = sc.appendages;
  r.pose = sc.pose;
  r.dark = sc.dark;
  r.noise = noise;
  r.raw_points = sc.cloud.size();
  for (const auto& p : sc.cloud) r.bag_points += p.z() >= o.belt_min_height;
  try {
    auto t0 = clock_type::now();
    const tg::points q = tg::mebb_clean(sc.cloud, true, o);
    r.clean_ms = ms_since(t0);
    r.used_points = q.size();
    t0 = clock_type::now();
    const tg::mebb_result m = tg::mebb_solve(q, true, o);
    r.solve_ms = ms_since(t0);
    r.flags = m.flags;
    tg::points raw;  // the baselines see the sensor points that survived the same cleaning
    tg::mebb_clean(sc.cloud, true, o, &raw);
    const tg::oriented_box boxes[n_methods] = {m.box, tg::pca_box_belt(raw),
                                               tg::trimmed_box_belt(raw), tg::aabb_belt(raw),
                                               tg::min_area_box_belt(raw)};
    const double gt_yaw = box_yaw_deg(sc.body.rotation);
    for (int k = 0; k < n_methods; ++k) {
      r.dims[static_cast<std::size_t>(k)] = boxes[k].sorted_dims();
      r.yaw_err[static_cast<std::size_t>(k)] = yaw_diff(box_yaw_deg(boxes[k].rotation), gt_yaw);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "scene failed: %s\n", e.what());
    r.ok = false;
  }
  return r;
}

std::vector<tg::scene> make_scenes(int n, std::uint64_t seed, double noise, bool full3d = false) {
  std::vector<tg::scene> out(static_cast<std::size_t>(n));
  tightfit::parallel_for(0, n, 1, [&](tightfit::index_t i0, tightfit::index_t i1) {
    for (auto i = i0; i < i1; ++i) {
      tg::scene_options so;
      so.seed = seed + static_cast<std::uint64_t>(i);
      so.noise_scale = noise;
      so.full_3d = full3d;
      out[static_cast<std::size_t>(i)] = tg::make_scene(so);
    }
  });
  return out;
}

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const double x = q * static_cast<double>(v.size() - 1);
  const auto k = static_cast<std::size_t>(x);
  const double f = x - static_cast<double>(k);
  return k + 1 < v.size() ? v[k] * (1 - f) + v[k + 1] * f : v[k];
}

struct summary {
  std::array<double, 3> bias{}, mae{}, p95{}, max{}, in5{}, in10{};
  double fail = 0, yaw_mean = 0, yaw_p95 = 0, accept = 0, mae_all = 0, p95_all = 0;
  int n = 0;
};

summary summarise(const std::vector<const record*>& rs, int method) {
  summary s;
  std::array<std::vector<double>, 3> err;
  std::vector<double> all, yaw;
  int fails = 0, agree = 0;
  for (const record* r : rs) {
    if (!r->ok) {
      ++fails;
      continue;
    }
    bool fail = false;
    for (int d = 0; d < 3; ++d) {
      const double e = (r->dims[static_cast<std::size_t>(method)][static_cast<std::size_t>(d)] -
                        r->gt[static_cast<std::size_t>(d)]) *
                       1000;
      err[static_cast<std::size_t>(d)].push_back(e);
      all.push_back(std::abs(e));
      fail = fail || std::abs(e) > 20;
    }
    fails += fail;
    yaw.push_back(r->yaw_err[static_cast<std::size_t>(method)]);
    agree += cabin_ok(r->dims[static_cast<std::size_t>(method)]) == cabin_ok(r->gt);
  }
  s.n = static_cast<int>(rs.size());
  for (int d = 0; d < 3; ++d) {
    auto& e = err[static_cast<std::size_t>(d)];
    std::vector<double> a;
    double sum = 0;
    int w5 = 0, w10 = 0;
    for (double x : e)
      sum += x, a.push_back(std::abs(x)), w5 += std::abs(x) <= 5, w10 += std::abs(x) <= 10;
    const auto n = std::max<std::size_t>(e.size(), 1);
    s.bias[static_cast<std::size_t>(d)] = sum / static_cast<double>(n);
    double am = 0;
    for (double x : a) am += x;
    s.mae[static_cast<std::size_t>(d)] = am / static_cast<double>(n);
    s.p95[static_cast<std::size_t>(d)] = quantile(a, 0.95);
    s.max[static_cast<std::size_t>(d)] = a.empty() ? NAN : *std::max_element(a.begin(), a.end());
    s.in5[static_cast<std::size_t>(d)] = 100.0 * w5 / static_cast<double>(n);
    s.in10[static_cast<std::size_t>(d)] = 100.0 * w10 / static_cast<double>(n);
  }
  double am = 0;
  for (double x : all) am += x;
  s.mae_all = all.empty() ? NAN : am / static_cast<double>(all.size());
  s.p95_all = quantile(all, 0.95);
  s.fail = 100.0 * fails / std::max(1, s.n);
  double ym = 0;
  for (double y : yaw) ym += y;
  s.yaw_mean = yaw.empty() ? NAN : ym / static_cast<double>(yaw.size());
  s.yaw_p95 = quantile(yaw, 0.95);
  s.accept = 100.0 * agree / static_cast<double>(std::max<std::size_t>(1, yaw.size()));
  return s;
}

void print_main_table(const std::vector<const record*>& rs, const char* title) {
  std::printf("\n#### %s (%zu bags)\n\n", title, rs.size());
  std::printf("| method | dim | bias mm | MAE mm | P95 mm | max mm | <=5 mm | <=10 mm |\n");
  std::printf("|---|---|---:|---:|---:|---:|---:|---:|\n");
  const char* dn[] = {"L", "W", "H"};
  for (int m = 0; m < n_methods; ++m) {
    const summary s = summarise(rs, m);
    for (int d = 0; d < 3; ++d)
      std::printf("| %s | %s | %+.1f | %.1f | %.1f | %.1f | %.0f%% | %.0f%% |\n", methods[m], dn[d],
                  s.bias[static_cast<std::size_t>(d)], s.mae[static_cast<std::size_t>(d)],
                  s.p95[static_cast<std::size_t>(d)], s.max[static_cast<std::size_t>(d)],
                  s.in5[static_cast<std::size_t>(d)], s.in10[static_cast<std::size_t>(d)]);
  }
  std::printf(
      "\n| method | failures (>20 mm) | yaw err mean / P95 deg | cabin 55x40x23 accept/reject "
      "accuracy |\n");
  std::printf("|---|---:|---:|---:|\n");
  for (int m = 0; m < n_methods; ++m) {
    const summary s = summarise(rs, m);
    std::printf("| %s | %.1f%% | %.2f / %.2f | %.1f%% |\n", methods[m], s.fail, s.yaw_mean,
                s.yaw_p95, s.accept);
  }
}

void print_breakdown(const std::vector<record>& all) {
  std::printf("\n#### Breakdown (all noise levels): MAE over the three dimensions, mm\n\n");
  std::printf(
      "| subset | bags | MEBB MAE | MEBB P95 | MEBB fail | PCA MAE | trimmed MAE "
      "|\n|---|---:|---:|---:|---:|---:|---:|\n");
  auto row = [&](const std::string& name, const std::function<bool(const record&)>& pick) {
    std::vector<const record*> rs;
    for (const auto& r : all)
      if (pick(r)) rs.push_back(&r);
    if (rs.empty()) return;
    const summary a = summarise(rs, 0), b = summarise(rs, 1), c = summarise(rs, 2);
    std::printf("| %s | %zu | %.1f | %.1f | %.1f%% | %.1f | %.1f |\n", name.c_str(), rs.size(),
                a.mae_all, a.p95_all, a.fail, b.mae_all, c.mae_all);
  };
  row("no appendage", [](const record& r) { return r.appendages == 0; });
  for (int k = 0; k < tg::appendage_kinds; ++k)
    row(std::string("with ") + tg::appendage_name(k),
        [k](const record& r) { return (r.appendages >> k & 1u) != 0; });
  for (auto p : {tg::scene_pose::lying, tg::scene_pose::on_side, tg::scene_pose::standing})
    row(std::string("pose ") + tg::pose_name(p), [p](const record& r) { return r.pose == p; });
  row("dark bags", [](const record& r) { return r.dark; });
  row("near-square (MEBB flag)",
      [](const record& r) { return (r.flags & tg::mebb_near_square) != 0; });
  row("soft retry (MEBB flag)",
      [](const record& r) { return (r.flags & tg::mebb_soft_retry) != 0; });
}

void print_timing(const std::vector<record>& all) {
  std::vector<double> raw, bag, used, clean, solve;
  for (const auto& r : all) {
    raw.push_back(static_cast<double>(r.raw_points));
    bag.push_back(static_cast<double>(r.bag_points));
    used.push_back(static_cast<double>(r.used_points));
    clean.push_back(r.clean_ms);
    solve.push_back(r.solve_ms);
  }
  std::printf(
      "\n#### Time per bag (one core)\n\n| quantity | median | P95 | max "
      "|\n|---|---:|---:|---:|\n");
  auto row = [](const char* n, const std::vector<double>& v, const char* fmt) {
    std::printf("| %s | ", n);
    std::printf(fmt, quantile(v, 0.5));
    std::printf(" | ");
    std::printf(fmt, quantile(v, 0.95));
    std::printf(" | ");
    std::printf(fmt, *std::max_element(v.begin(), v.end()));
    std::printf(" |\n");
  };
  row("raw points (bag + belt)", raw, "%.0f");
  row("bag points above the belt cut", bag, "%.0f");
  row("points after voxel grid + cleaning", used, "%.0f");
  row("cleaning ms (belt cut, voxel, cluster, SOR)", clean, "%.1f");
  row("MEBB solve ms (after voxelisation)", solve, "%.2f");
}

void sweep(const std::vector<tg::scene>& scenes) {
  std::printf(
      "\n#### Parameter sweep (%zu bags, noise x1; one parameter varied, others at defaults)\n\n",
      scenes.size());
  std::printf(
      "| parameter | value | MAE mm | P95 mm | fail | solve ms "
      "|\n|---|---:|---:|---:|---:|---:|\n");
  auto run = [&](const char* name, double value, const tg::mebb_options& o) {
    std::vector<record> rs;
    for (const auto& sc : scenes) rs.push_back(run_scene(sc, o, 1));
    std::vector<const record*> ptr;
    double t = 0;
    for (const auto& r : rs) ptr.push_back(&r), t += r.solve_ms;
    const summary s = summarise(ptr, 0);
    std::printf("| %s | %g | %.2f | %.1f | %.1f%% | %.2f |\n", name, value, s.mae_all, s.p95_all,
                s.fail, t / static_cast<double>(rs.size()));
    std::fflush(stdout);
  };
  for (double k : {0.2, 0.3, 0.4, 0.5, 0.6}) {
    tg::mebb_options o;
    o.kappa = k;
    run("kappa", k, o);
  }
  for (double g : {5.0, 10.0, 15.0, 20.0}) {
    tg::mebb_options o;
    o.column = g / 1000;
    run("column g (mm)", g, o);
  }
  for (double e : {3.0, 6.0, 9.0, 12.0}) {
    tg::mebb_options o;
    o.eps = e / 1000;
    run("eps (mm)", e, o);
  }
  for (double h : {3.0, 5.0, 8.0}) {
    tg::mebb_options o;
    o.voxel = h / 1000;
    run("voxel h (mm)", h, o);
  }
  {
    tg::mebb_options o;
    o.adaptive = false;
    run("adaptive (0 = off)", 0, o);
  }
  {
    tg::mebb_options o;
    o.tau = 0.01;
    run("tau (mm, neighbour stiffness)", 10, o);
  }
}

// MEBB as ALGORITHMS.md states it against the additions of tightfit (docs/mebb.md)
void ablation(const std::vector<tg::scene>& scenes) {
  std::printf(
      "\n#### Ablation (%zu bags, noise x1): the additions to ALGORITHMS.md switched off one at a "
      "time\n\n",
      scenes.size());
  std::printf(
      "| variant | MAE L / W / H mm | P95 mm | failures (>20 mm) |\n|---|---:|---:|---:|\n");
  auto run = [&](const char* name, const tg::mebb_options& o) {
    std::vector<record> rs;
    for (const auto& sc : scenes) rs.push_back(run_scene(sc, o, 1));
    std::vector<const record*> ptr;
    for (const auto& r : rs) ptr.push_back(&r);
    const summary s = summarise(ptr, 0);
    std::printf("| %s | %.1f / %.1f / %.1f | %.1f | %.1f%% |\n", name, s.mae[0], s.mae[1], s.mae[2],
                s.p95_all, s.fail);
    std::fflush(stdout);
  };
  tg::mebb_options o;
  run("tightfit defaults", o);
  o.side_band = 0;
  run("side faces over the whole face (side_band = 0)", o);
  o = {};
  o.edge_profile = false;
  run("no rounded-edge profile fit (edge_profile = false)", o);
  o = {};
  o.wall_yaw = false;
  run("yaw re-estimated by PCA of the inside points (wall_yaw = false)", o);
  o = {};
  o.edge_yaw_always = false;
  run("edge-direction yaw only when near square (edge_yaw_always = false)", o);
  o.side_band = 0, o.edge_profile = false, o.wall_yaw = false;
  run("all four off (the method as ALGORITHMS.md states it)", o);
}

void full3d(int n, std::uint64_t seed) {
  const auto scenes = make_scenes(n, seed, 1.0, true);
  std::vector<record> rs;
  for (const auto& sc : scenes) {
    record r;
    r.gt = sc.dims;
    r.appendages = sc.appendages;
    try {
      tg::mebb_options o;
      auto t0 = clock_type::now();
      const tg::points q = tg::mebb_clean(sc.cloud, false, o);
      r.clean_ms = ms_since(t0);
      t0 = clock_type::now();
      const auto m = tg::mebb_solve(q, false, o);
      r.solve_ms = ms_since(t0);
      tg::points raw;
      tg::mebb_clean(sc.cloud, false, o, &raw);
      const tg::oriented_box boxes[n_methods] = {m.box, tg::pca_box(raw), tg::trimmed_box(raw),
                                                 tg::aabb(raw), tg::pca_box(raw)};
      for (int k = 0; k < n_methods; ++k)
        r.dims[static_cast<std::size_t>(k)] = boxes[k].sorted_dims();
      r.used_points = q.size();
      r.raw_points = sc.cloud.size();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "3D scene failed: %s\n", e.what());
      r.ok = false;
    }
    rs.push_back(r);
  }
  std::vector<const record*> ptr;
  for (const auto& r : rs) ptr.push_back(&r);
  std::printf(
      "\n#### Full 3D (tunnel scanner: six views, no belt, all six faces elastic; %d bags, noise "
      "x1)\n\n",
      n);
  std::printf("| method | MAE mm | P95 mm | max mm | failures |\n|---|---:|---:|---:|---:|\n");
  const char* names[] = {"mebb", "pca (3D)", "trimmed (3D)", "aabb"};
  for (int m = 0; m < 4; ++m) {
    const summary s = summarise(ptr, m);
    std::printf("| %s | %.1f | %.1f | %.1f | %.1f%% |\n", names[m], s.mae_all, s.p95_all,
                std::max({s.max[0], s.max[1], s.max[2]}), s.fail);
  }
  std::vector<double> solve;
  for (const auto& r : rs) solve.push_back(r.solve_ms);
  std::printf("\nmedian MEBB solve time %.1f ms, median %.0f points after cleaning\n",
              quantile(solve, 0.5), [&] {
                std::vector<double> u;
                for (const auto& r : rs) u.push_back(static_cast<double>(r.used_points));
                return quantile(u, 0.5);
              }());
}

void raw_1m(std::uint64_t seed) {
  tg::scene_options so;
  so.seed = seed;
  so.width = 1280, so.height = 800, so.focal = 1140;  // ~1M pixels over the same field of view
  so.pose = tg::scene_pose::lying;
  so.appendage_probability = 1.0;
  const tg::scene sc = tg::make_scene(so);
  tg::mebb_options o;
  double best = INFINITY, best_detect = INFINITY;
  tg::measurement m;
  for (int rep = 0; rep < 3; ++rep) {
    auto t0 = clock_type::now();
    m = tg::measure(sc.cloud, tg::box_method::mebb, tg::belt_choice::at_z(0), o);
    best = std::min(best, ms_since(t0));
    t0 = clock_type::now();
    const auto m2 = tg::measure(sc.cloud, tg::box_method::mebb, tg::belt_choice{}, o);
    if (!m2.belt) std::fprintf(stderr, "raw 1M: no belt detected\n");
    best_detect = std::min(best_detect, ms_since(t0));
  }
  std::printf("\n#### End to end on a raw cloud (bag + belt, %zu points, one core)\n\n",
              sc.cloud.size());
  std::printf("| belt | time ms (best of 3) | L x W x H mm (truth) |\n|---|---:|---|\n");
  std::printf("| given (z = 0) | %.0f | %.1f x %.1f x %.1f (%.1f x %.1f x %.1f) |\n", best,
              m.dims[0] * 1000, m.dims[1] * 1000, m.dims[2] * 1000, sc.dims[0] * 1000,
              sc.dims[1] * 1000, sc.dims[2] * 1000);
  std::printf("| detected (RANSAC) | %.0f | |\n", best_detect);
}

}  // namespace

int main(int argc, char** argv) {
  args_t a;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", s.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (s == "--bags")
      a.bags = std::stoi(next());
    else if (s == "--seed")
      a.seed = std::stoull(next());
    else if (s == "--sweep")
      a.sweep = std::stoi(next());
    else if (s == "--full3d")
      a.full3d = std::stoi(next());
    else if (s == "--ablation")
      a.ablation = std::stoi(next());
    else if (s == "--raw1m")
      a.raw1m = true;
    else if (s == "--dump")
      a.dump = next();
    else if (s == "--write-scene")
      a.write_scene = next();
    else if (s == "--brief")
      a.brief = true;
    else if (s == "--noise") {
      a.noise.clear();
      std::string v = next();
      std::size_t pos = 0;
      while (pos < v.size()) {
        auto c = v.find(',', pos);
        a.noise.push_back(std::stod(v.substr(pos, c - pos)));
        pos = c == std::string::npos ? v.size() : c + 1;
      }
    } else {
      std::fprintf(stderr,
                   "usage: tightfit_mebb_bench [--bags N] [--noise 1,2] [--seed S] [--sweep N] "
                   "[--ablation N] [--full3d N] "
                   "[--raw1m] [--dump DIR] [--write-scene FILE.ply] [--brief]\n");
      return 2;
    }
  }
  if (!a.write_scene.empty()) {  // one raw scan (bag + belt) as PLY, its truth on stdout
    tg::scene_options so;
    so.seed = a.seed;
    so.appendage_probability = 1.0;
    so.pose = tg::scene_pose::lying;
    const tg::scene sc = tg::make_scene(so);
    tg::write_ply(a.write_scene, sc.cloud);
    const auto env = sc.envelope.sorted_dims();
    std::printf(
        "wrote %s: %zu points; true body %.1f x %.1f x %.1f mm, envelope with appendages "
        "%.1f x %.1f x %.1f mm\n",
        a.write_scene.c_str(), sc.cloud.size(), sc.dims[0] * 1000, sc.dims[1] * 1000,
        sc.dims[2] * 1000, env[0] * 1000, env[1] * 1000, env[2] * 1000);
  }
  std::vector<record> all;
  if (a.bags > 0 && a.brief) {  // the demo table
    const double nz = a.noise.front();
    const auto scenes = make_scenes(a.bags, a.seed, nz);
    std::vector<record> rs;
    for (const auto& sc : scenes) rs.push_back(run_scene(sc, tg::mebb_options{}, nz));
    std::vector<const record*> ptr;
    for (const auto& r : rs) ptr.push_back(&r);
    std::printf("%d generated bags (noise x%g), error of L, W, H against the true main body:\n\n",
                a.bags, nz);
    std::printf(
        "| method | MAE mm | P95 mm | max mm | failures (>20 mm) | cabin accept/reject ok |\n");
    std::printf("|---|---:|---:|---:|---:|---:|\n");
    for (int m = 0; m < n_methods; ++m) {
      const summary s = summarise(ptr, m);
      std::printf("| %s | %.1f | %.1f | %.1f | %.0f%% | %.0f%% |\n", methods[m], s.mae_all,
                  s.p95_all, std::max({s.max[0], s.max[1], s.max[2]}), s.fail, s.accept);
    }
    return 0;
  }
  if (a.bags > 0) {
    for (double nz : a.noise) {
      const auto t0 = clock_type::now();
      const auto scenes = make_scenes(a.bags, a.seed, nz);
      std::fprintf(stderr, "generated %d scenes (noise x%g) in %.1f s\n", a.bags, nz,
                   ms_since(t0) / 1000);
      tg::mebb_options o;
      std::vector<record> rs;
      for (const auto& sc : scenes) rs.push_back(run_scene(sc, o, nz));
      std::vector<const record*> ptr;
      for (const auto& r : rs) ptr.push_back(&r);
      char title[128];
      std::snprintf(title, sizeof title, "Noise x%g (axial sigma %.1f mm at 1.5 m)", nz, 1.2 * nz);
      print_main_table(ptr, title);
      std::fflush(stdout);
      all.insert(all.end(), rs.begin(), rs.end());
      if (!a.dump.empty() && nz == a.noise.front()) {  // one bag with appendages, for the picture
        for (std::size_t i = 0; i < scenes.size(); ++i) {
          const auto& sc = scenes[i];
          double pca_err = 0, mebb_err = 0;  // the first lying bag where PCA is far off
          for (std::size_t d = 0; d < 3; ++d) {
            pca_err = std::max(pca_err, std::abs(rs[i].dims[1][d] - rs[i].gt[d]));
            mebb_err = std::max(mebb_err, std::abs(rs[i].dims[0][d] - rs[i].gt[d]));
          }
          if (rs[i].ok && sc.pose == tg::scene_pose::lying && pca_err > 0.04 && mebb_err < 0.004) {
            const tg::points q = tg::mebb_clean(sc.cloud, true, o);
            tg::write_xyz(a.dump + "/bag_points.xyz", q);
            const auto m = tg::mebb_solve(q, true, o);
            const tg::oriented_box pb = tg::pca_box_belt(q);
            std::FILE* f = std::fopen((a.dump + "/bag_boxes.txt").c_str(), "w");
            if (!f) break;
            auto put = [&](const char* name, const tg::oriented_box& b) {
              std::fprintf(f, "%s %.6f %.6f %.6f", name, b.centre.x(), b.centre.y(), b.centre.z());
              for (int r = 0; r < 3; ++r)
                for (int c = 0; c < 3; ++c) std::fprintf(f, " %.9f", b.rotation(r, c));
              std::fprintf(f, " %.6f %.6f %.6f\n", b.extent[0], b.extent[1], b.extent[2]);
            };
            put("truth", sc.body);
            put("pca", pb);
            put("mebb", m.box);
            std::fclose(f);
            std::fprintf(stderr, "dumped scene %zu to %s\n", i, a.dump.c_str());
            break;
          }
        }
      }
    }
    if (a.noise.size() > 1) {
      std::vector<const record*> ptr;
      for (const auto& r : all) ptr.push_back(&r);
      print_main_table(ptr, "All noise levels");
    }
    print_breakdown(all);
    print_timing(all);
  }
  if (a.sweep > 0) sweep(make_scenes(a.sweep, a.seed + 100000, 1.0));
  if (a.ablation > 0) ablation(make_scenes(a.ablation, a.seed + 400000, 1.0));
  if (a.full3d > 0) full3d(a.full3d, a.seed + 200000);
  if (a.raw1m) raw_1m(a.seed + 300000);
  return 0;
}
