// tightfit/optim/partition.hpp: partitions of a named parameter set into blocks (BAdam, Luo et
// al., NeurIPS 2024).
//
// A block_partition lists blocks (a name and parameter positions) and the frozen parameters
// (trained by no block). Invariant, checked when a partition is built: every parameter is in
// exactly one block or frozen, and no block is empty; a violation is an error naming the
// parameter (and both blocks for a parameter claimed twice).
//
// Builders, all over Hugging Face names (nn/parameters.hpp's hf_names, the names decoder_model
// declares from its layers' parameter tables):
//  - by_layer: one block "layer.N" per decoder layer ("model.layers.N."); the embedding
//    ("embedding": model.embed_tokens.*) and the head ("head": model.norm.*, lm_head.*) are
//    blocks only when asked, frozen otherwise;
//  - by_prefixes: each block given by name prefixes matched on WHOLE dot-separated components,
//    at the start of the name or right after a leading "model." ("layers.1" and "layers.1."
//    match "model.layers.1.mlp.up_proj.weight" but never "model.layers.10.mlp...");
//  - by_regex: each block given by ECMAScript regular expressions searched in the name;
//  - whole: one block holding everything (full-parameter training).
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <vector>

// GCC 12 at -O1 with sanitizers reports a false -Wmaybe-uninitialized inside <regex>.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <regex>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#include "tightfit/core/error.hpp"
#include "tightfit/nn/parameters.hpp"

namespace tightfit {

/// A named block of parameters.
struct param_block {
  std::string name;
  std::vector<std::size_t> ids;  ///< positions in the parameter set, ascending
};

/// A block specification for by_prefixes / by_regex: the block's name and its patterns.
struct block_spec {
  std::string name;
  std::vector<std::string> patterns;
};

/// Blocks and frozen parameters of one parameter set (see the top comment).
class block_partition {
 public:
  block_partition() = default;

  std::size_t size() const { return blocks_.size(); }
  const param_block& operator[](std::size_t b) const { return blocks_[b]; }
  const std::vector<param_block>& blocks() const { return blocks_; }
  const std::vector<std::size_t>& frozen() const { return frozen_; }
  std::size_t param_count() const { return param_count_; }

  /// Position of the block named `name`; an error listing the names when there is none.
  std::size_t index_of(const std::string& name) const {
    for (std::size_t b = 0; b < blocks_.size(); ++b)
      if (blocks_[b].name == name) return b;
    std::string names;
    for (const auto& b : blocks_) names += (names.empty() ? "" : ", ") + b.name;
    fail("block_partition: unknown block name '", name, "', expected one of: ", names);
  }

  /// One block per decoder layer; embedding and head blocks only when asked.
  template <ParameterSet P>
  static block_partition by_layer(const P& params, bool embedding_block = false,
                                  bool head_block = false) {
    std::map<long long, param_block> layers;
    param_block embed{"embedding", {}}, head{"head", {}};
    std::vector<std::size_t> frozen;
    for (std::size_t i = 0; i < params.size(); ++i) {
      const std::string& n = params.name(i);
      if (auto l = layer_of(n)) {
        auto& b = layers[*l];
        b.name = "layer." + std::to_string(*l);
        b.ids.push_back(i);
      } else if (in_module(n, hf_names::embedding)) {
        (embedding_block ? embed.ids : frozen).push_back(i);
      } else if (in_module(n, hf_names::final_norm) || in_module(n, hf_names::lm_head)) {
        (head_block ? head.ids : frozen).push_back(i);
      } else {
        fail("block_partition::by_layer: parameter '", n,
             "' is neither in a decoder layer (model.layers.N.), the embedding nor the head");
      }
    }
    block_partition p;
    if (!embed.ids.empty()) p.blocks_.push_back(std::move(embed));
    for (auto& [l, b] : layers) p.blocks_.push_back(std::move(b));
    if (!head.ids.empty()) p.blocks_.push_back(std::move(head));
    p.frozen_ = std::move(frozen);
    p.finish(params.size(), "by_layer");
    return p;
  }

  /// Blocks by name prefixes (whole components); parameters matching `frozen` train in none.
  template <ParameterSet P>
  static block_partition by_prefixes(const P& params, const std::vector<block_spec>& specs,
                                     const std::vector<std::string>& frozen = {}) {
    return by_matcher(params, specs, frozen, "by_prefixes", [](const std::string& pattern) {
      return [parts = components(pattern)](const std::string& name) {
        return prefix_match(parts, components(name));
      };
    });
  }

  /// Blocks by regular expressions (std::regex_search on the name).
  template <ParameterSet P>
  static block_partition by_regex(const P& params, const std::vector<block_spec>& specs,
                                  const std::vector<std::string>& frozen = {}) {
    return by_matcher(params, specs, frozen, "by_regex", [](const std::string& pattern) {
      std::regex re;
      try {
        re = std::regex(pattern);
      } catch (const std::regex_error& e) {
        fail("block_partition::by_regex: bad regular expression '", pattern, "': ", e.what());
      }
      return [re](const std::string& name) { return std::regex_search(name, re); };
    });
  }

  /// One block ("all") holding every parameter.
  template <ParameterSet P>
  static block_partition whole(const P& params) {
    block_partition p;
    p.blocks_.push_back({"all", {}});
    for (std::size_t i = 0; i < params.size(); ++i) p.blocks_[0].ids.push_back(i);
    p.finish(params.size(), "whole");
    return p;
  }

  /// The dot-separated components of a name; a trailing dot adds nothing.
  static std::vector<std::string> components(const std::string& s) {
    std::vector<std::string> out;
    std::size_t start = 0;
    for (;;) {
      const std::size_t dot = s.find('.', start);
      if (dot == std::string::npos) {
        out.push_back(s.substr(start));
        break;
      }
      out.push_back(s.substr(start, dot - start));
      start = dot + 1;
    }
    if (out.size() > 1 && out.back().empty()) out.pop_back();
    return out;
  }

  /// Whether `prefix` matches whole leading components of `name`, or those after "model.".
  static bool prefix_match(const std::vector<std::string>& prefix,
                           const std::vector<std::string>& name) {
    auto at = [&](std::size_t off) {
      if (prefix.empty() || off + prefix.size() > name.size()) return false;
      for (std::size_t k = 0; k < prefix.size(); ++k)
        if (prefix[k] != name[off + k]) return false;
      return true;
    };
    return at(0) || (!name.empty() && name[0] == "model" && at(1));
  }

 private:
  /// Whether `name` belongs to the module of parameter `of` ("model.norm.weight": "model.norm.*").
  static bool in_module(const std::string& name, const std::string& of) {
    return name.rfind(of.substr(0, of.rfind('.') + 1), 0) == 0;
  }
  /// N for names "model.layers.N.*".
  static std::optional<long long> layer_of(const std::string& n) {
    static const std::string pre = hf_names::layer_prefix_stem;
    if (n.rfind(pre, 0) != 0) return std::nullopt;
    const std::size_t dot = n.find('.', pre.size());
    if (dot == std::string::npos || dot == pre.size()) return std::nullopt;
    long long l = 0;
    for (std::size_t k = pre.size(); k < dot; ++k) {
      if (n[k] < '0' || n[k] > '9') return std::nullopt;
      l = l * 10 + (n[k] - '0');
    }
    return l;
  }

  template <ParameterSet P, class MakeMatcher>
  static block_partition by_matcher(const P& params, const std::vector<block_spec>& specs,
                                    const std::vector<std::string>& frozen, const char* how,
                                    MakeMatcher make) {
    check(!specs.empty(), "block_partition::", how, ": no blocks given");
    using matcher = decltype(make(std::string{}));
    std::vector<std::vector<matcher>> block_matchers;
    for (const auto& s : specs) {
      check(!s.name.empty(), "block_partition::", how, ": a block has an empty name");
      check(!s.patterns.empty(), "block_partition::", how, ": block '", s.name,
            "' has no patterns");
      std::vector<matcher> ms;
      for (const auto& pat : s.patterns) ms.push_back(make(pat));
      block_matchers.push_back(std::move(ms));
    }
    std::vector<matcher> frozen_matchers;
    for (const auto& pat : frozen) frozen_matchers.push_back(make(pat));

    block_partition p;
    for (const auto& s : specs) p.blocks_.push_back({s.name, {}});
    std::vector<std::size_t> pattern_hits;
    for (std::size_t i = 0; i < params.size(); ++i) {
      const std::string& n = params.name(i);
      std::optional<std::size_t> owner;
      for (std::size_t b = 0; b < specs.size(); ++b) {
        bool hit = false;
        for (auto& m : block_matchers[b]) hit = hit || m(n);
        if (!hit) continue;
        check(!owner.has_value(), "block_partition::", how, ": parameter '", n,
              "' is in two blocks, '", specs[owner.value_or(0)].name, "' and '", specs[b].name,
              "'");
        owner = b;
      }
      bool is_frozen = false;
      for (auto& m : frozen_matchers) is_frozen = is_frozen || m(n);
      check(!(owner && is_frozen), "block_partition::", how, ": parameter '", n,
            "' is both in block '", specs[owner.value_or(0)].name, "' and frozen");
      if (owner)
        p.blocks_[*owner].ids.push_back(i);
      else if (is_frozen)
        p.frozen_.push_back(i);
      else
        fail("block_partition::", how, ": parameter '", n,
             "' is in no block (add it to a block or to the frozen patterns)");
    }
    for (const auto& b : p.blocks_)
      check(!b.ids.empty(), "block_partition::", how, ": block '", b.name,
            "' matches no parameter (unknown name?)");
    p.finish(params.size(), how);
    return p;
  }

  void finish(std::size_t count, const char* how) {
    param_count_ = count;
    check(!blocks_.empty(), "block_partition::", how, ": no block (nothing to train)");
    std::vector<int> seen(count, 0);
    for (const auto& b : blocks_)
      for (std::size_t id : b.ids) ++seen[id];
    for (std::size_t id : frozen_) ++seen[id];
    for (std::size_t i = 0; i < count; ++i)
      check(seen[i] == 1, "block_partition::", how, ": parameter #", i, " is claimed ", seen[i],
            " times, expected once");
    for (std::size_t b = 0; b < blocks_.size(); ++b)
      for (std::size_t c = b + 1; c < blocks_.size(); ++c)
        check(blocks_[b].name != blocks_[c].name, "block_partition::", how,
              ": two blocks are named '", blocks_[b].name, "'");
  }

  std::vector<param_block> blocks_;
  std::vector<std::size_t> frozen_;
  std::size_t param_count_ = 0;
};

}  // namespace tightfit
