// libFuzzer target: the bytes are a PLY file read from memory by the same reader as files
// (tightfit/geometry/cloud_io.hpp), with its length known. A read either throws tightfit::error
// or yields finite points: any other exception, a sanitizer report, a leak, a timeout or an
// allocation beyond the -rss_limit_mb is a finding (sizes must be checked against the length).
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>

#include "tightfit/geometry/cloud_io.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  try {
    const auto p = tightfit::geometry::read_ply(in, "fuzz.ply", static_cast<long long>(size));
    for (const auto& q : p)
      if (!q.allFinite()) __builtin_trap();  // the reader promises finite coordinates
  } catch (const tightfit::error&) {
  }
  return 0;
}
