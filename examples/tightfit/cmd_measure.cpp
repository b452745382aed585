// tightfit measure: dimensions of an object in 3D point clouds (MEBB or a baseline box).
//
//   tightfit measure CLOUD [CLOUD ...] [--method mebb|aabb|pca|trimmed|hull]
//                    [--belt auto|none|Z] [--unit m|mm] [--json]
// Clouds are PLY (ASCII or binary little-endian) or XYZ/CSV text, in metres unless --unit mm.
// Several clouds are measured in parallel (oneTBB). Dimensions are printed in millimetres.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "commands.hpp"
#include "tightfit/geometry/cloud_io.hpp"
#include "tightfit/geometry/measure.hpp"

namespace tightfit::cli {

namespace {

namespace tg = tightfit::geometry;

void measure_usage(std::FILE* out) {
  std::fprintf(
      out,
      "usage: tightfit measure CLOUD [CLOUD ...] [--method mebb|aabb|pca|trimmed|hull]\n"
      "                        [--belt auto|none|Z] [--unit m|mm] [--json]\n"
      "  CLOUD     a PLY (ascii or binary little-endian, float/double x y z) or XYZ/CSV file\n"
      "  --method  mebb (default; excludes handles, wheels, straps) or a baseline box\n"
      "  --belt    auto: find the belt plane by RANSAC (default; none found: full 3D);\n"
      "            none: full-3D cloud, all six faces elastic; Z: the belt is the plane z = Z\n"
      "  --unit    coordinates in metres (default) or millimetres\n"
      "  --json    one JSON object per cloud (an array for several clouds)\n"
      "prints length x width x height in mm (L >= W >= H); exit 1 on bad input\n");
}

const char* flag_names[] = {"near_square", "soft_retry", "safeguard",    "appendage",
                            "flat",        "line",       "not_converged"};

std::string json_measurement(const std::string& file, const tg::measurement& m, double to_mm) {
  char buf[512];
  std::string s = "{\"file\": \"";
  for (char c : file) {
    if (c == '"' || c == '\\') s += '\\';
    s += c;
  }
  std::snprintf(buf, sizeof buf,
                "\", \"method\": \"%s\", \"length\": %.2f, \"width\": %.2f, \"height\": %.2f, "
                "\"unit\": \"mm\", "
                "\"centre\": [%.2f, %.2f, %.2f], \"rotation\": [",
                tg::method_name(m.method), m.dims[0] * 1000, m.dims[1] * 1000, m.dims[2] * 1000,
                m.box.centre.x() * to_mm, m.box.centre.y() * to_mm, m.box.centre.z() * to_mm);
  s += buf;
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 3; ++c) {
      std::snprintf(buf, sizeof buf, "%s%.9f", r + c ? ", " : "", m.box.rotation(r, c));
      s += buf;
    }
  std::snprintf(buf, sizeof buf, "], \"extent\": [%.2f, %.2f, %.2f]", m.box.extent[0] * 1000,
                m.box.extent[1] * 1000, m.box.extent[2] * 1000);
  s += buf;
  const auto env = m.envelope.sorted_dims();
  std::snprintf(buf, sizeof buf, ", \"envelope\": [%.2f, %.2f, %.2f]", env[0] * 1000, env[1] * 1000,
                env[2] * 1000);
  s += buf;
  if (m.belt) {
    std::snprintf(buf, sizeof buf, ", \"belt\": {\"normal\": [%.6f, %.6f, %.6f], \"offset\": %.2f}",
                  m.belt->normal.x(), m.belt->normal.y(), m.belt->normal.z(),
                  m.belt->offset * to_mm);
    s += buf;
  } else {
    s += ", \"belt\": null";
  }
  s += ", \"flags\": [";
  if (m.mebb) {
    bool first = true;
    for (int k = 0; k < 7; ++k)
      if (m.mebb->flags >> k & 1u) {
        s += first ? "\"" : ", \"";
        s += flag_names[k];
        s += "\"";
        first = false;
      }
    s += "], \"trim\": {";
    const char* faces[] = {"+x", "-x", "+y", "-y", "+z", "-z"};
    for (int f = 0; f < 6; ++f) {
      std::snprintf(buf, sizeof buf, "%s\"%s\": %.2f", f ? ", " : "", faces[f],
                    m.mebb->trim[static_cast<std::size_t>(f)] * 1000);
      s += buf;
    }
    s += "}";
  } else {
    s += "], \"trim\": null";
  }
  std::snprintf(buf, sizeof buf, ", \"points\": %zu, \"points_used\": %zu}", m.points_in,
                m.points_used);
  s += buf;
  return s;
}

void print_text(const std::string& file, const tg::measurement& m) {
  std::printf("%s: %.1f x %.1f x %.1f mm (%s", file.c_str(), m.dims[0] * 1000, m.dims[1] * 1000,
              m.dims[2] * 1000, tg::method_name(m.method));
  if (m.mebb) {
    const auto env = m.envelope.sorted_dims();
    std::printf("; envelope %.1f x %.1f x %.1f mm", env[0] * 1000, env[1] * 1000, env[2] * 1000);
    for (int k = 0; k < 7; ++k)
      if (m.mebb->flags >> k & 1u) std::printf("; %s", flag_names[k]);
  }
  std::printf("%s)\n", m.belt ? "" : "; no belt: full 3D");
}

}  // namespace

int measure(int argc, char** argv) {
  std::vector<std::string> files;
  std::string method = "mebb", belt = "auto", unit = "m";
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](std::string& out) {
      if (i + 1 >= argc) return false;
      out = argv[++i];
      return true;
    };
    if (a == "--help" || a == "-h") {
      measure_usage(stdout);
      return 0;
    } else if (a == "--json") {
      json = true;
    } else if (a == "--method" || a == "--belt" || a == "--unit") {
      std::string& target = a == "--method" ? method : a == "--belt" ? belt : unit;
      if (!value(target)) {
        std::fprintf(stderr, "tightfit measure: %s needs a value\n", a.c_str());
        measure_usage(stderr);
        return 2;
      }
    } else if (a.size() > 1 && a[0] == '-' && !(a[1] >= '0' && a[1] <= '9') && a[1] != '.') {
      std::fprintf(stderr, "tightfit measure: unknown option '%s'\n", a.c_str());
      measure_usage(stderr);
      return 2;
    } else {
      files.push_back(a);
    }
  }
  if (files.empty()) {
    std::fprintf(stderr, "tightfit measure: no cloud given\n");
    measure_usage(stderr);
    return 2;
  }
  if (unit != "m" && unit != "mm") {
    std::fprintf(stderr, "tightfit measure: --unit is '%s', expected m or mm\n", unit.c_str());
    return 2;
  }
  if (method != "mebb" && method != "aabb" && method != "pca" && method != "trimmed" &&
      method != "hull") {
    std::fprintf(stderr,
                 "tightfit measure: --method is '%s', expected mebb, aabb, pca, trimmed or hull\n",
                 method.c_str());
    return 2;
  }
  const double scale = unit == "mm" ? 0.001 : 1.0;  // to metres
  tg::belt_choice choice;
  if (belt == "none") {
    choice.kind = tg::belt_choice::none;
  } else if (belt != "auto") {
    char* end = nullptr;
    const double z = std::strtod(belt.c_str(), &end);
    if (belt.empty() || !end || *end != '\0' || !std::isfinite(z)) {
      std::fprintf(stderr, "tightfit measure: --belt is '%s', expected auto, none or a height Z\n",
                   belt.c_str());
      return 2;
    }
    choice = tg::belt_choice::at_z(z * scale);
  }
  const tg::box_method m = tg::parse_box_method(method);

  if (files.size() == 1) {  // errors propagate: "tightfit measure: <what>", exit 1
    tg::points p = tg::read_cloud(files[0]);
    for (auto& q : p) q *= scale;
    const tg::measurement r = tg::measure(p, m, choice);
    if (json)
      std::printf("%s\n", json_measurement(files[0], r, 1000).c_str());
    else
      print_text(files[0], r);
    return 0;
  }
  // several clouds: read, then measure in parallel; a bad cloud is reported and skipped
  std::vector<tg::points> clouds(files.size());
  std::vector<std::string> read_error(files.size());
  for (std::size_t i = 0; i < files.size(); ++i) {
    try {
      clouds[i] = tg::read_cloud(files[i]);
      for (auto& q : clouds[i]) q *= scale;
    } catch (const std::exception& e) {
      read_error[i] = e.what();
    }
  }
  const auto results = tg::measure_many(clouds, m, choice);
  int status = 0;
  if (json) std::printf("[\n");
  bool first = true;
  for (std::size_t i = 0; i < files.size(); ++i) {
    const std::string err = !read_error[i].empty() ? read_error[i] : results[i].error;
    if (!err.empty() || !results[i].result) {
      std::fprintf(stderr, "tightfit measure: %s: %s\n", files[i].c_str(), err.c_str());
      status = 1;
      continue;
    }
    if (json) {
      std::printf("%s  %s", first ? "" : ",\n",
                  json_measurement(files[i], *results[i].result, 1000).c_str());
      first = false;
    } else {
      print_text(files[i], *results[i].result);
    }
  }
  if (json) std::printf("\n]\n");
  return status;
}

}  // namespace tightfit::cli
