// tightfit/io/hf.hpp: the Hugging Face checkpoint formats, independent of any model type:
// hf_checkpoint (the tensors of model.safetensors or of the shards an index.json lists) and the
// config.json reading helpers (duplicate keys refused, typed fields with messages naming the field
// and the file). nn/hf_model.hpp builds on them: config.json <-> model_config, and parameter sets
// loaded from / saved to checkpoints by their Hugging Face names.
//
// Supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM (by
// "architectures"[0], or by "model_type" llama / mistral / qwen2 / qwen3), with rope_scaling
// default / linear / dynamic / yarn / llama3, sliding windows and mlp_bias (nn/hf_model.hpp
// reads them). Refused with a message naming the option: other architectures, other rope types,
// unknown rope_scaling keys, partial_rotary_factor other than 1, hidden_act other than silu.
// Attention biases: Qwen2 always has biases on q_proj / k_proj / v_proj (the config does not
// announce them; model_config::qkv_bias); Llama and Qwen3 with attention_bias: true have them on
// q/k/v and o_proj (qkv_bias and o_bias). A *.bias tensor the configuration does not call for is
// an error naming it.
//
// A checkpoint is a directory with model.safetensors, or with model.safetensors.index.json
// whose "weight_map" names the shard of each tensor (shards live beside the index). A tied
// model (tie_word_embeddings) has no lm_head.weight parameter; a checkpoint that stores one
// anyway loads fine.
#pragma once

#include <algorithm>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "tightfit/core/error.hpp"
#include "tightfit/core/limits.hpp"
#include "tightfit/core/types.hpp"
#include "tightfit/io/safetensors.hpp"

namespace tightfit {

namespace io::detail {

/// The largest JSON file (config.json, index.json) read: a declared maximum, so that a
/// device or a runaway file (/dev/zero) is refused instead of read into memory.
inline constexpr std::size_t max_json_bytes = std::size_t{64} << 20;

inline std::string read_text_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  check(static_cast<bool>(in), path.string(), ": cannot open");
  std::string text;
  char block[65536];
  while (in.read(block, sizeof block) || in.gcount() > 0) {
    text.append(block, static_cast<std::size_t>(in.gcount()));
    check(text.size() <= max_json_bytes, path.string(), ": more than ", max_json_bytes,
          " bytes (the declared maximum of a JSON file)");
  }
  return text;
}

/// Parses a JSON file; duplicate keys (which nlohmann would silently collapse) are errors.
inline nlohmann::json parse_json_text(std::string_view text, const std::string& src) {
  using nlohmann::json;
  std::vector<std::set<std::string>> keys;
  auto callback = [&](int, json::parse_event_t event, json& parsed) -> bool {
    if (event == json::parse_event_t::object_start) keys.emplace_back();
    if (event == json::parse_event_t::object_end) keys.pop_back();
    if (event == json::parse_event_t::key) {
      std::string key = parsed.get<std::string>();
      check(!keys.back().contains(key), src, ": duplicate key \"", key, "\"");
      keys.back().insert(std::move(key));
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), callback);
  } catch (const json::exception& e) {
    fail(src, ": not valid JSON: ", e.what());
  }
}
inline nlohmann::json read_json_file(const std::filesystem::path& path) {
  return parse_json_text(read_text_file(path), path.string());
}

/// is_directory / exists without throwing (an unreadable path then fails where it is opened).
inline bool is_dir(const std::filesystem::path& p) {
  std::error_code ec;
  return std::filesystem::is_directory(p, ec);
}
inline bool exists(const std::filesystem::path& p) {
  std::error_code ec;
  return std::filesystem::exists(p, ec);
}

inline bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

/// Typed access to the fields of one config.json, with messages naming the field and file.
class config_fields {
 public:
  config_fields(const nlohmann::json& j, std::string source) : j_(j), src_(std::move(source)) {}

  /// The field, or nullptr when absent or null.
  const nlohmann::json* find(const char* name) const {
    auto it = j_.find(name);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }
  index_t positive_int(const char* name, std::optional<index_t> fallback = std::nullopt) const {
    const nlohmann::json* v = find(name);
    if (v == nullptr) {
      check(fallback.has_value(), src_, ": missing field \"", name, "\"");
      return *fallback;
    }
    check(v->is_number_integer(), src_, ": field \"", name, "\" is ", v->dump(),
          ", expected a positive integer");
    check(v->is_number_unsigned() && v->get<std::uint64_t>() >= 1 &&
              v->get<std::uint64_t>() <= (std::uint64_t{1} << 40),
          src_, ": field \"", name, "\" is ", v->dump(), ", expected a positive integer");
    return static_cast<index_t>(v->get<std::uint64_t>());
  }
  double number(const char* name, double fallback) const {
    const nlohmann::json* v = find(name);
    if (v == nullptr) return fallback;
    check(v->is_number(), src_, ": field \"", name, "\" is ", v->dump(), ", expected a number");
    return v->get<double>();
  }
  bool boolean(const char* name, bool fallback) const {
    const nlohmann::json* v = find(name);
    if (v == nullptr) return fallback;
    check(v->is_boolean(), src_, ": field \"", name, "\" is ", v->dump(),
          ", expected true or false");
    return v->get<bool>();
  }
  std::optional<std::string> string(const char* name) const {
    const nlohmann::json* v = find(name);
    if (v == nullptr) return std::nullopt;
    check(v->is_string(), src_, ": field \"", name, "\" is ", v->dump(), ", expected a string");
    return v->get<std::string>();
  }
  const std::string& source() const { return src_; }

 private:
  const nlohmann::json& j_;
  std::string src_;
};

struct hf_architecture {
  const char* architecture;
  const char* model_type;
};
inline constexpr hf_architecture hf_architectures[] = {
    {"LlamaForCausalLM", "llama"},   {"MistralForCausalLM", "mistral"},
    {"Qwen2ForCausalLM", "qwen2"},   {"Qwen3ForCausalLM", "qwen3"},
    {"Gemma2ForCausalLM", "gemma2"}, {"Gemma3ForCausalLM", "gemma3_text"},
};

}  // namespace io::detail

/// The tensors of a Hugging Face checkpoint: model.safetensors, or the shards listed by
/// model.safetensors.index.json. Files stay open (read by position) while the object lives.
class hf_checkpoint {
 public:
  /// `path`: a checkpoint directory, a .safetensors file or a *.index.json file.
  static hf_checkpoint open(const std::filesystem::path& path) {
    namespace fs = std::filesystem;
    hf_checkpoint ck;
    fs::path single, index;
    if (io::detail::is_dir(path)) {
      if (io::detail::exists(path / "model.safetensors"))
        single = path / "model.safetensors";
      else if (io::detail::exists(path / "model.safetensors.index.json"))
        index = path / "model.safetensors.index.json";
      else
        fail(path.string(), ": no model.safetensors or model.safetensors.index.json");
    } else if (io::detail::ends_with(path.string(), ".json")) {
      index = path;
    } else {
      single = path;
    }
    if (!single.empty()) {
      ck.description_ = single.string();
      ck.files_.push_back(std::make_unique<safetensors_file>(safetensors_file::open(single)));
      for (const auto& t : ck.files_.back()->tensors()) ck.where_.emplace(t.name, 0);
      return ck;
    }
    ck.description_ = index.string();
    const nlohmann::json j = io::detail::read_json_file(index);
    const std::string src = index.string();
    check(j.is_object(), src, ": is a JSON ", j.type_name(), ", expected an object");
    auto map = j.find("weight_map");
    check(map != j.end(), src, ": missing field \"weight_map\"");
    check(map->is_object(), src, ": field \"weight_map\" is a JSON ", map->type_name(),
          ", expected an object");
    std::unordered_map<std::string, std::size_t> shard_of_file;
    for (auto& [name, shard] : map->items()) {
      check(shard.is_string(), src, ": weight_map[\"", name, "\"] is ", shard.dump(),
            ", expected a file name");
      const std::string file = shard.get<std::string>();
      check(!file.empty() && file != "." && file != ".." &&
                file.find_first_of("/\\") == std::string::npos,
            src, ": weight_map[\"", name, "\"] is \"", file,
            "\", expected a file name beside the index (no directories)");
      auto [it, added] = shard_of_file.emplace(file, ck.files_.size());
      if (added)
        ck.files_.push_back(
            std::make_unique<safetensors_file>(safetensors_file::open(index.parent_path() / file)));
      check(ck.files_[it->second]->contains(name), src, ": weight_map puts tensor '", name, "' in ",
            file, ", which has no tensor of that name");
      ck.where_.emplace(name, it->second);
    }
    return ck;
  }

  /// Tensor names (sorted).
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& [name, file] : where_) out.push_back(name);
    return out;
  }
  bool contains(const std::string& name) const { return where_.contains(name); }
  /// The file holding `name`; throws tightfit::error naming it when absent.
  const safetensors_file& file_of(const std::string& name) const {
    auto it = where_.find(name);
    check(it != where_.end(), description_, ": no tensor named '", name, "'");
    return *files_[it->second];
  }
  const tensor_info& info(const std::string& name) const { return file_of(name).info(name); }
  /// The file or index the checkpoint was opened from (for messages).
  const std::string& description() const { return description_; }

 private:
  std::string description_;
  std::vector<std::unique_ptr<safetensors_file>> files_;
  std::map<std::string, std::size_t> where_;  // tensor name -> position in files_
};

}  // namespace tightfit
