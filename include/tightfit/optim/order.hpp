// tightfit/optim/order.hpp: the order in which a block coordinate optimizer visits its blocks
// (BAdam, Luo et al., NeurIPS 2024).
//
// An order policy fills the block sequence of one pass over D blocks (pass 0, 1, ...):
//  - ascending_order:  s, s+1, ..., D-1, 0, ..., s-1   (start s, default 0), every pass;
//  - descending_order: s, s-1, ..., 0, D-1, ..., s+1   (start s, default D-1), every pass;
//  - random_reshuffle: a fresh seeded permutation per pass; with a start block, pass 0 begins
//    with it (the rest of that pass stays a random permutation);
//  - fixed_order: the start block only, forever; without a start block validate() fails with a
//    clear error (BAdam's reference code crashes instead).
// The random policy draws from the generator the optimizer passes in, which the optimizer
// saves and restores, so a resumed run visits the same blocks.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "tightfit/core/error.hpp"
#include "tightfit/core/types.hpp"

namespace tightfit {

namespace detail {
inline void check_start(const char* who, const std::optional<index_t>& start, index_t blocks) {
  check(!start || (*start >= 0 && *start < blocks), who, ": start block is ", start.value_or(0),
        ", expected a block in [0, ", blocks, ")");
}
}  // namespace detail

/// Blocks in ascending order, cyclically from the start block.
struct ascending_order {
  std::optional<index_t> start;
  static constexpr const char* name = "ascending";
  void validate(index_t blocks) const { detail::check_start(name, start, blocks); }
  void fill_pass(std::vector<index_t>& seq, index_t blocks, std::int64_t /*pass*/,
                 std::mt19937_64& /*rng*/) const {
    seq.clear();
    const index_t s = start.value_or(0);
    for (index_t k = 0; k < blocks; ++k) seq.push_back((s + k) % blocks);
  }
};

/// Blocks in descending order, cyclically from the start block (default the last).
struct descending_order {
  std::optional<index_t> start;
  static constexpr const char* name = "descending";
  void validate(index_t blocks) const { detail::check_start(name, start, blocks); }
  void fill_pass(std::vector<index_t>& seq, index_t blocks, std::int64_t /*pass*/,
                 std::mt19937_64& /*rng*/) const {
    seq.clear();
    const index_t s = start.value_or(blocks - 1);
    for (index_t k = 0; k < blocks; ++k) seq.push_back(((s - k) % blocks + blocks) % blocks);
  }
};

/// A fresh random permutation of the blocks for every pass (random reshuffling).
struct random_reshuffle {
  std::optional<index_t> start;
  static constexpr const char* name = "random";
  void validate(index_t blocks) const { detail::check_start(name, start, blocks); }
  void fill_pass(std::vector<index_t>& seq, index_t blocks, std::int64_t pass,
                 std::mt19937_64& rng) const {
    seq.clear();
    for (index_t k = 0; k < blocks; ++k) seq.push_back(k);
    // Fisher-Yates with an explicit draw: std::shuffle's use of the engine is unspecified.
    for (index_t k = blocks - 1; k > 0; --k) {
      const auto j = static_cast<index_t>(rng() % static_cast<std::uint64_t>(k + 1));
      std::swap(seq[static_cast<std::size_t>(k)], seq[static_cast<std::size_t>(j)]);
    }
    if (pass == 0 && start) {
      auto it = std::find(seq.begin(), seq.end(), *start);
      std::rotate(seq.begin(), it, it + 1);
    }
  }
};

/// Always the start block (which must be given).
struct fixed_order {
  std::optional<index_t> start;
  static constexpr const char* name = "fixed";
  void validate(index_t blocks) const {
    check(start.has_value(), "fixed order: no start block given (fixed trains one block, name it)");
    detail::check_start(name, start, blocks);
  }
  void fill_pass(std::vector<index_t>& seq, index_t /*blocks*/, std::int64_t /*pass*/,
                 std::mt19937_64& /*rng*/) const {
    seq.assign(1, *start);
  }
};

/// Any of the four, chosen at run time (the command-line tool).
struct runtime_order {
  enum class kind { ascending, descending, random, fixed } what = kind::random;
  std::optional<index_t> start;
  static constexpr const char* name = "runtime";

  /// "ascending", "descending", "random" or "fixed".
  static kind parse(const std::string& s) {
    if (s == "ascending") return kind::ascending;
    if (s == "descending") return kind::descending;
    if (s == "random") return kind::random;
    if (s == "fixed") return kind::fixed;
    fail("unknown block order '", s, "', expected ascending, descending, random or fixed");
  }
  template <class F>
  decltype(auto) visit(F&& f) const {
    switch (what) {
      case kind::ascending:
        return f(ascending_order{start});
      case kind::descending:
        return f(descending_order{start});
      case kind::fixed:
        return f(fixed_order{start});
      default:
        return f(random_reshuffle{start});
    }
  }
  void validate(index_t blocks) const {
    visit([&](const auto& o) { o.validate(blocks); });
  }
  void fill_pass(std::vector<index_t>& seq, index_t blocks, std::int64_t pass,
                 std::mt19937_64& rng) const {
    visit([&](const auto& o) { o.fill_pass(seq, blocks, pass, rng); });
  }
};

/// An order policy: validates against a block count and fills one pass.
template <class O>
concept BlockOrder = requires(const O& o, std::vector<index_t>& seq, std::mt19937_64& rng) {
  o.validate(index_t{1});
  o.fill_pass(seq, index_t{1}, std::int64_t{0}, rng);
};

}  // namespace tightfit
