// libFuzzer target: the bytes are a safetensors file parsed from memory (the same parser the
// memory-mapped reader uses). A parse either throws tightfit::error or yields tensors that are
// then read completely: any other exception, a sanitizer report or a leak is a finding.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "tightfit/io/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  try {
    const auto st = tightfit::safetensors_view::parse(bytes, "fuzz");
    for (const tightfit::tensor_info& t : st.tensors()) {
      if (tightfit::is_floating(t.type)) {
        std::vector<double> out(static_cast<std::size_t>(t.numel()));
        st.read<double>(t.name, std::span<double>(out));
      } else {
        try {
          (void)st.read_ints(t.name);
        } catch (const tightfit::error&) {  // U64 out of range, F8: refused by design
        }
      }
    }
    (void)st.metadata();
  } catch (const tightfit::error&) {
  }
  return 0;
}
