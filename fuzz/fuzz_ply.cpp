// libFuzzer target: the bytes are a PLY file read from memory by the same reader as files
// (tightfit/geometry/cloud_io.hpp), with its length known. A read either throws tightfit::error
// or yields finite points: any other exception, a sanitizer report, a leak, a timeout or an
// allocation beyond the -rss_limit_mb is a finding (sizes must be checked against the length).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <variant>

#include "tightfit/geometry/cloud_io.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  try {
    const auto p = tightfit::geometry::read_ply(in, "fuzz.ply", static_cast<long long>(size));
    for (const auto& q : p)
      if (!q.allFinite()) __builtin_trap();  // the reader promises finite coordinates
  } catch (const tightfit::error&) {
  }
  // the same bytes through the reader that keeps float coordinates (read_cloud_stored)
  std::istringstream in2(std::string(reinterpret_cast<const char*>(data), size));
  try {
    const auto c =
        tightfit::geometry::read_ply_stored(in2, "fuzz.ply", static_cast<long long>(size));
    if (const auto* f = std::get_if<tightfit::geometry::float_cloud>(&c)) {
      for (const float v : f->coords())
        if (!std::isfinite(v)) __builtin_trap();
    } else {
      for (const auto& q : std::get<tightfit::geometry::points>(c))
        if (!q.allFinite()) __builtin_trap();
    }
  } catch (const tightfit::error&) {
  }
  return 0;
}
