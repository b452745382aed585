// libFuzzer target: the bytes are a PLY file read by the readers of tightfit/geometry/cloud_io.hpp:
// as a stream of known length, in place from memory, and as a file read by position (a memfd
// reached by a .ply path: read_cloud_stored, read_ply). A
// read either throws tightfit::error or yields finite points: any other exception, a sanitizer
// report, a leak, a timeout or an allocation beyond the -rss_limit_mb is a finding (sizes must be
// checked against the length).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <sstream>
#include <string>
#include <variant>

#include "memory_file.hpp"
#include "tightfit/geometry/cloud_io.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  try {
    const auto p = tightfit::geometry::read_ply(in, "fuzz.ply", static_cast<long long>(size));
    for (const auto& q : p)
      if (!q.allFinite()) __builtin_trap();  // the reader promises finite coordinates
  } catch (const tightfit::error&) {
  }
  // the same bytes through the readers that keep float coordinates (read_cloud_stored): from a
  // stream, and in place from memory (as a mapped file is read)
  auto check_stored = [](const tightfit::geometry::stored_cloud& c) {
    if (const auto* f = std::get_if<tightfit::geometry::float_cloud>(&c)) {
      for (std::size_t i = 0; i < f->kdtree_get_point_count(); ++i)
        for (std::size_t d = 0; d < 3; ++d)
          if (!std::isfinite(f->coord(i, d))) __builtin_trap();
    } else {
      for (const auto& q : std::get<tightfit::geometry::points>(c))
        if (!q.allFinite()) __builtin_trap();
    }
  };
  std::istringstream in2(std::string(reinterpret_cast<const char*>(data), size));
  try {
    check_stored(
        tightfit::geometry::read_ply_stored(in2, "fuzz.ply", static_cast<long long>(size)));
  } catch (const tightfit::error&) {
  }
  try {
    check_stored(tightfit::geometry::read_ply_stored(
        std::span<const char>(reinterpret_cast<const char*>(data), size), nullptr, "fuzz.ply"));
  } catch (const tightfit::error&) {
  }
  // the file readers (by position), with a point limit that some inputs pass
  static tightfit::fuzzing::memory_file file(".ply");
  file.assign(data, size);
  try {
    check_stored(tightfit::geometry::read_cloud_stored(file.path(), 1000));
  } catch (const tightfit::error&) {
  }
  try {
    for (const auto& q : tightfit::geometry::read_ply(file.path()))
      if (!q.allFinite()) __builtin_trap();
  } catch (const tightfit::error&) {
  }
  return 0;
}
