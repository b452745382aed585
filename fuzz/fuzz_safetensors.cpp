// libFuzzer target: the bytes are a safetensors file, parsed from memory (safetensors_view) and
// opened as a file read by position (safetensors_file over a memfd). A parse either throws
// tightfit::error or yields tensors that are then read completely: any other exception, a
// sanitizer report or a leak is a finding.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "memory_file.hpp"
#include "tightfit/io/safetensors.hpp"

namespace {
// Reads every tensor of `st` (a view or a file), as floats or integers by its dtype.
template <class S>
void read_all(const S& st) {
  for (const tightfit::tensor_info& t : st.tensors()) {
    if (tightfit::is_floating(t.type)) {
      std::vector<double> out(static_cast<std::size_t>(t.numel()));
      st.template read<double>(t.name, std::span<double>(out));
    } else {
      try {
        (void)st.read_ints(t.name);
      } catch (const tightfit::error&) {  // U64 out of range, F8: refused by design
      }
    }
  }
  (void)st.metadata();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static tightfit::fuzzing::memory_file file(".safetensors");
  file.assign(data, size);
  try {
    read_all(tightfit::safetensors_file::open(file.path()));
  } catch (const tightfit::error&) {
  }
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  try {
    read_all(tightfit::safetensors_view::parse(bytes, "fuzz"));
  } catch (const tightfit::error&) {
  }
  return 0;
}
