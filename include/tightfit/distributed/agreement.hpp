// tightfit/distributed/agreement.hpp: ranks that are about to run collectives together must agree
// on what they run (model configuration, parameter shapes, options). A mismatch would otherwise
// surface as a hang or as silently wrong sums; here every rank hashes its own description, the
// hashes are gathered, and every rank throws the same tightfit::error naming the ranks that
// differ from rank 0.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tightfit/core/error.hpp"
#include "tightfit/core/hash.hpp"
#include "tightfit/distributed/communicator.hpp"

namespace tightfit {

/// FNV-1a 64-bit hash of a description (stable across processes and hosts).
inline std::uint64_t description_hash(std::string_view text) {
  return fnv1a_64(text);
}

/// Throws on every rank unless all ranks passed the same `description` (`what` names it).
template <Communicator C>
void check_agreement(C& comm, std::string_view description, const char* what) {
  const auto mine = static_cast<std::int64_t>(description_hash(description));
  std::vector<std::int64_t> all(static_cast<std::size_t>(comm.size()));
  comm.all_gather(std::span<const std::int64_t>(&mine, 1), std::span<std::int64_t>(all));
  std::string differing;
  for (std::size_t r = 1; r < all.size(); ++r) {
    if (all[r] != all[0]) differing += (differing.empty() ? "" : ", ") + std::to_string(r);
  }
  check(differing.empty(), "ranks disagree on the ", what, ": rank(s) ", differing,
        " differ from rank 0 (every rank must run the same configuration)");
}

}  // namespace tightfit
