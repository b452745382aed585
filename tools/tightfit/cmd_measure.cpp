// tightfit measure: dimensions of an object in 3D point clouds (MEBB or a baseline box).
//
//   tightfit measure CLOUD [CLOUD ...] [--method mebb|aabb|pca|trimmed|hull]
//                    [--belt auto|none|Z] [--unit m|mm] [--json]
// Clouds are PLY (ASCII or binary little-endian) or XYZ/CSV text, in metres unless --unit mm.
// Several clouds are measured one at a time (one in memory). Dimensions are printed in
// millimetres with their 95 % intervals. Exit codes: 0 every measurement ok, 1 a cloud could not
// be read or measured, 2 bad arguments, 3 a measurement is not trustworthy (status
// low_confidence or failed, reasons in the output).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#if defined(__GLIBC__)
#include <malloc.h>
#endif
#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

#include "args.hpp"
#include "commands.hpp"
#include "tightfit/core/limits.hpp"
#include "tightfit/geometry/cloud_io.hpp"
#include "tightfit/geometry/measure.hpp"

namespace tightfit::cli {

namespace {

namespace tg = tightfit::geometry;

/// The memory measure() needs per point of a cloud, at most (the cloud as read, its filtered
/// copies, the kd-trees and the voxel tables; measured: docs/tool.md).
constexpr std::uint64_t measure_bytes_per_point = 256;

nlohmann::ordered_json json_measurement(const std::string& file, const tg::measurement& m,
                                        double to_mm) {
  using nlohmann::ordered_json;
  auto mm3 = [](const Eigen::Vector3d& v, double f) {
    return ordered_json::array({v.x() * f, v.y() * f, v.z() * f});
  };
  ordered_json j;
  j["file"] = file;  // escaped by the JSON library (quotes, newlines, control characters)
  j["method"] = tg::method_name(m.method);
  j["status"] = tg::status_name(m.status);
  j["reasons"] = m.reasons;
  j["length"] = m.dims[0] * 1000;
  j["width"] = m.dims[1] * 1000;
  j["height"] = m.dims[2] * 1000;
  j["unit"] = "mm";
  if (m.mebb)
    j["uncertainty_95"] = {m.uncertainty[0] * 1000, m.uncertainty[1] * 1000,
                           m.uncertainty[2] * 1000};
  else
    j["uncertainty_95"] = nullptr;
  j["centre"] = mm3(m.box.centre, to_mm);
  ordered_json rot = ordered_json::array();
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 3; ++c) rot.push_back(m.box.rotation(r, c));
  j["rotation"] = rot;
  j["extent"] = mm3(m.box.extent, 1000);
  const auto env = m.envelope.sorted_dims();
  j["envelope"] = {env[0] * 1000, env[1] * 1000, env[2] * 1000};
  if (m.belt)
    j["belt"] = {{"normal", mm3(m.belt->normal, 1)},
                 {"offset", m.belt->offset * to_mm},
                 {"sigma", m.belt_sigma * 1000}};
  else
    j["belt"] = nullptr;
  ordered_json flags = ordered_json::array();
  if (m.mebb) {
    for (int k = 0; k < 7; ++k)
      if (m.mebb->flags >> k & 1u) flags.push_back(tg::mebb_flag_names[k]);
    const char* faces[] = {"+x", "-x", "+y", "-y", "+z", "-z"};
    ordered_json trim;
    for (std::size_t f = 0; f < 6; ++f) trim[faces[f]] = m.mebb->trim[f] * 1000;
    j["flags"] = flags;
    j["trim"] = trim;
  } else {
    j["flags"] = flags;
    j["trim"] = nullptr;
  }
  j["points"] = m.points_in;
  j["points_used"] = m.points_used;
  return j;
}

/// `text` for a terminal: control bytes (and DEL) as \xNN, so that a file name cannot move the
/// cursor, clear the screen or forge a line of output.
std::string printable(const std::string& text) {
  std::string out;
  for (const char ch : text) {
    const auto u = static_cast<unsigned char>(ch);
    if (u < 0x20 || u == 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", u);
      out += hex;
    } else {
      out += ch;
    }
  }
  return out;
}

void print_text(const std::string& file, const tg::measurement& m) {
  std::printf("%s: %.1f x %.1f x %.1f mm", printable(file).c_str(), m.dims[0] * 1000,
              m.dims[1] * 1000, m.dims[2] * 1000);
  if (m.mebb)
    std::printf(" (+- %.1f, %.1f, %.1f mm at 95 %%)", m.uncertainty[0] * 1000,
                m.uncertainty[1] * 1000, m.uncertainty[2] * 1000);
  std::printf(" (%s", tg::method_name(m.method));
  if (m.mebb) {
    const auto env = m.envelope.sorted_dims();
    std::printf("; envelope %.1f x %.1f x %.1f mm", env[0] * 1000, env[1] * 1000, env[2] * 1000);
    for (int k = 0; k < 7; ++k)
      if (m.mebb->flags >> k & 1u) std::printf("; %s", tg::mebb_flag_names[k]);
  }
  std::printf("%s)\n", m.belt ? "" : "; no belt: full 3D");
  if (m.status != tg::measure_status::ok) {
    std::printf("  %s: not a trustworthy measurement:",
                m.status == tg::measure_status::failed ? "FAILED" : "LOW CONFIDENCE");
    for (std::size_t k = 0; k < m.reasons.size(); ++k)
      std::printf("%s %s (%s)", k ? ";" : "", tg::reason_text(m.reasons[k]), m.reasons[k].c_str());
    std::printf("\n");
  }
}

// A hint when the coordinates look like millimetres read as metres.
template <tg::PointCloud C>
void unit_hint(const C& cloud, const std::string& unit) {
  const std::size_t n = cloud.kdtree_get_point_count();
  if (unit != "m" || n == 0) return;
  Eigen::Vector3d lo = tg::point_at(cloud, 0), hi = lo;
  for (std::size_t i = 0; i < n; ++i) {
    const Eigen::Vector3d q = tg::point_at(cloud, i);
    lo = lo.cwiseMin(q), hi = hi.cwiseMax(q);
  }
  const double span = (hi - lo).maxCoeff();
  if (span > 50)
    std::fprintf(stderr,
                 "tightfit measure: hint: the cloud spans %.0f m; if its coordinates are in "
                 "millimetres, pass --unit mm\n",
                 span);
}

// The tool's allocator setting (a library must not set one for its process): glibc hands every
// block above its mmap threshold (128 KiB at first) back to the kernel when it is freed and trims
// the heap's free top, so each of measure()'s big buffers faults its pages in afresh (about
// 1,400 of a fixture scan's 4,700 page faults). Keeping freed blocks in the heap lets the next
// buffer reuse those pages (a fixture scan's peak memory: 18.5 MiB instead of 17.6).
// On Linux the heap is also grown by 64 MiB at once and advised to use transparent huge pages
// (what glibc's glibc.malloc.hugetlb=1 tunable does): a 2 MiB page is faulted in once instead of
// 512 small ones, which halves a fixture scan's page faults (see docs/benchmarks.md). Where the
// system does not allow huge pages for advised memory (transparent_hugepage=never), the advice
// is ignored and nothing changes.
void keep_freed_memory() {
#if defined(__GLIBC__)
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's largest on 64-bit targets
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  mallopt(M_TOP_PAD, 64 << 20);
  void* grow = std::malloc(1 << 20);  // extends the heap by 1 MiB and the 64 MiB pad
  if (grow) {
    constexpr std::uintptr_t huge = std::uintptr_t{2} << 20;
    const std::uintptr_t lo = (reinterpret_cast<std::uintptr_t>(grow) + huge - 1) & ~(huge - 1);
    const std::uintptr_t hi = reinterpret_cast<std::uintptr_t>(sbrk(0)) & ~(huge - 1);
    if (hi > lo) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_HUGEPAGE);  // advice only
    std::free(grow);
  }
#endif
#endif
}

}  // namespace

/// measure's options (args.hpp).
const command_spec& measure_command() {
  static const command_spec spec = [] {
    command_spec c;
    c.name = "measure";
    c.synopsis = "CLOUD [CLOUD ...] [options]";
    c.positional =
        "CLOUD: a PLY (ascii or binary little-endian, float/double x y z) or XYZ/CSV file";
    c.options = {
        {"--method", "NAME",
         "mebb (excludes handles, wheels, straps) or a baseline box: aabb, pca, trimmed, hull",
         "mebb"},
        {"--belt", "auto|none|Z",
         "auto: find the belt plane (none found: full 3D, low confidence); none: a full-3D cloud, "
         "all six faces elastic; Z: the belt is the plane z = Z",
         "auto"},
        {"--unit", "NAME", "coordinates in metres (m) or millimetres (mm)", "m"},
        {"--json", "", "one JSON object per cloud (an array for several clouds)"},
        {"--max-points", "N",
         "refuse a cloud of more than N points, and one larger than the memory this process may "
         "use holds (256 bytes per point)",
         "100000000"},
    };
    c.notes =
        "CLOUD: a PLY (ascii or binary little-endian, float/double x y z) or XYZ/CSV file.\n"
        "Prints length x width x height in mm (L >= W >= H) with 95 % intervals and a status.\n"
        "Exit 0 ok, 1 bad input, 2 bad arguments, 3 a measurement is not trustworthy.\n";
    return c;
  }();
  return spec;
}

namespace {

int run_measure(const arguments& a) {
  const std::vector<std::string>& files = a.positional();
  if (files.empty()) throw usage_error{"no cloud given"};
  const std::string unit = a.choice("--unit", {"m", "mm"});
  const std::string method = a.choice("--method", {"mebb", "aabb", "pca", "trimmed", "hull"});
  const bool json = a.has("--json");
  const double scale = unit == "mm" ? 0.001 : 1.0;  // to metres
  tg::belt_choice choice;
  if (const std::string belt = a.get("--belt"); belt == "none") {
    choice.kind = tg::belt_choice::none;
  } else if (belt != "auto") {
    double z = 0;
    try {
      z = parse_real("--belt", belt, -1e12, 1e12);
    } catch (const usage_error&) {
      throw usage_error{"--belt is '" + belt + "', expected auto, none or a height Z"};
    }
    choice = tg::belt_choice::at_z(z * scale);
  }
  const long long max_points = a.integer("--max-points", 1, 1LL << 40);
  // Sizes before allocation: the points a cloud may have, from --max-points and from the memory
  // this process may use at measure_bytes_per_point (the reader checks the file's count first).
  const std::uint64_t memory = memory_limit_bytes();
  const std::uint64_t by_memory = memory / measure_bytes_per_point;
  const auto limit = static_cast<std::size_t>(
      std::min<std::uint64_t>(static_cast<std::uint64_t>(max_points), by_memory));
  const std::string limit_why =
      by_memory < static_cast<std::uint64_t>(max_points)
          ? " (what the " + byte_string(memory) + " this process may use holds at " +
                std::to_string(measure_bytes_per_point) + " bytes per point; --max-points " +
                std::to_string(max_points) + ")"
          : " (--max-points)";
  const tg::box_method m = tg::parse_box_method(method);

  keep_freed_memory();
  // one cloud at a time (never all in memory): a bad one is reported and the others go on
  int errors = 0, untrusted = 0;
  nlohmann::ordered_json all = nlohmann::ordered_json::array();
  for (const auto& file : files) {
    try {
      // a binary float PLY stays float (no widened copy); scaled as it is read by measure()
      tg::stored_cloud cloud;
      try {
        cloud = tg::read_cloud_stored(file, limit);
      } catch (const error& e) {
        const std::string what = e.what();
        if (what.find("than the limit of " + std::to_string(limit)) == std::string::npos) throw;
        fail(what, limit_why);
      }
      const tg::measurement r = std::visit(
          [&](auto& c) {
            if constexpr (std::is_same_v<std::decay_t<decltype(c)>, tg::float_cloud>) {
              c.set_scale(scale);
              unit_hint(c, unit);
              return tg::measure(c, m, choice);
            } else {
              for (auto& q : c) q *= scale;
              unit_hint(tg::as_cloud(c), unit);
              return tg::measure(c, m, choice);
            }
          },
          cloud);
      untrusted += r.status != tg::measure_status::ok;
      // invalid UTF-8 in a file name becomes U+FFFD (nlohmann would throw)
      constexpr auto replace = nlohmann::ordered_json::error_handler_t::replace;
      if (json && files.size() == 1)
        std::printf("%s\n", json_measurement(file, r, 1000).dump(2, ' ', false, replace).c_str());
      else if (json)
        all.push_back(json_measurement(file, r, 1000));
      else
        print_text(file, r);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "tightfit measure: %s: %s\n", printable(file).c_str(),
                   printable(e.what()).c_str());
      ++errors;
    }
  }
  if (json && files.size() > 1)
    std::printf("%s\n",
                all.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace).c_str());
  // exit 1: a cloud could not be measured; 3: a measurement is not trustworthy (status)
  return errors ? 1 : untrusted ? 3 : 0;
}

}  // namespace

int measure(int argc, char** argv) {
  return with_arguments(measure_command(), argc, argv,
                        [](const arguments& a) { return run_measure(a); });
}

}  // namespace tightfit::cli
