// libFuzzer target: the bytes are XYZ/CSV text read from memory by the same reader as files
// (tightfit/geometry/cloud_io.hpp). A read either throws tightfit::error or yields finite
// points: any other exception, a sanitizer report, a leak or a timeout is a finding.
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>

#include "tightfit/geometry/cloud_io.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  try {
    const auto p = tightfit::geometry::read_xyz(in, "fuzz.xyz");
    for (const auto& q : p)
      if (!q.allFinite()) __builtin_trap();
  } catch (const tightfit::error&) {
  }
  return 0;
}
