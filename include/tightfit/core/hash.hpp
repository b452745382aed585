// tightfit/core/hash.hpp: FNV-1a, 64 bits: a hash of bytes that is the same in every process and
// on every host (descriptions the ranks compare, fingerprints of chat templates). Not for
// security: anyone can make two texts with one hash.
#pragma once

#include <cstdint>
#include <string_view>

namespace tightfit {

/// FNV-1a (64 bits) of the bytes of `text`.
inline std::uint64_t fnv1a_64(std::string_view text) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (const char c : text) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ULL;
  }
  return h;
}

}  // namespace tightfit
