// tightfit/nn/hf_save.hpp: a trained model written as a Hugging Face model folder that loads as
// it is (save_hf_model):
//  - the weights in the dtypes the source checkpoint stored them in, tensor by tensor (BF16 stays
//    BF16, F16 F16, F32 F32), or in one dtype given;
//  - one model.safetensors up to a size limit (transformers' max_shard_size "5GB", 5e9 bytes of
//    tensor data), above it shards model-00001-of-0000N.safetensors and
//    model.safetensors.index.json {"metadata": {"total_size": ...}, "weight_map": {...}}, split
//    as transformers (huggingface_hub) splits them;
//  - config.json: the source's, every field kept with its value and in its order, only
//    torch_dtype (and dtype, transformers 5) set to the weights' dtype; without a source,
//    hf_config_json of the model's configuration with torch_dtype;
//  - generation_config.json and the tokenizer files the source folder has, copied byte for byte.
// The source is never written: an output folder that is the source folder is an error.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include <nlohmann/json.hpp>

#include "tightfit/core/error.hpp"
#include "tightfit/io/hf.hpp"
#include "tightfit/io/safetensors.hpp"
#include "tightfit/nn/config.hpp"
#include "tightfit/nn/hf_model.hpp"
#include "tightfit/nn/parameters.hpp"

namespace tightfit {

/// transformers' default max_shard_size ("5GB"): the most bytes of tensor data in one file.
inline constexpr std::uint64_t hf_default_max_shard_bytes = 5'000'000'000;

/// The files beside the weights and config.json that save_hf_model copies from the source folder
/// when it has them: the generation defaults and the tokenizer.
inline constexpr std::array<const char*, 10> hf_side_files = {"generation_config.json",
                                                              "tokenizer.json",
                                                              "tokenizer_config.json",
                                                              "special_tokens_map.json",
                                                              "tokenizer.model",
                                                              "vocab.json",
                                                              "merges.txt",
                                                              "added_tokens.json",
                                                              "chat_template.jinja",
                                                              "chat_template.json"};

/// Options of save_hf_model.
struct hf_save_options {
  /// The checkpoint folder the model was loaded from (its config.json, its tensors' dtypes, its
  /// generation and tokenizer files); empty: none (a model built from a preset).
  std::filesystem::path source;
  /// Every tensor in this dtype (F64, F32, BF16 or F16) instead of the source's dtype of the
  /// tensor (without a source: the set's value type, F32 or F64).
  std::optional<dtype> as;
  /// The most bytes of tensor data in one file; a model above it is sharded. A tensor larger
  /// than the limit gets a shard of its own.
  std::uint64_t max_shard_bytes = hf_default_max_shard_bytes;
};

/// The names of the files save_hf_model may write in its folder for a model from `source` (empty:
/// none): model.safetensors, model.safetensors.index.json, the shards (the pattern
/// "model-*-of-*.safetensors", '*' any characters), config.json and the side files `source` has.
inline std::vector<std::string> hf_model_files(const std::filesystem::path& source) {
  std::vector<std::string> files{"model.safetensors", "model.safetensors.index.json",
                                 "model-*-of-*.safetensors", "config.json"};
  std::error_code ec;
  if (!source.empty())
    for (const char* name : hf_side_files)
      if (std::filesystem::is_regular_file(source / name, ec)) files.emplace_back(name);
  return files;
}

namespace io::detail {

/// torch's name of a floating dtype ("bfloat16", ...), as config.json's torch_dtype holds it.
inline const char* torch_dtype_name(dtype t) {
  switch (t) {
    case dtype::f64:
      return "float64";
    case dtype::f32:
      return "float32";
    case dtype::bf16:
      return "bfloat16";
    case dtype::f16:
      return "float16";
    default:
      fail("torch_dtype_name: ", dtype_name(t), " is not a floating dtype");
  }
}

/// The file name of shard i (from 0) of n, as transformers names it.
inline std::string hf_shard_name(std::size_t i, std::size_t n) {
  char name[64];
  std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return name;
}

/// Whether `name` is a shard name of the form model-NNNNN-of-NNNNN.safetensors.
inline bool is_hf_shard_name(const std::string& name) {
  std::size_t at = 0;
  auto literal = [&](const char* text) {
    const std::string s = text;
    if (name.compare(at, s.size(), s) != 0) return false;
    at += s.size();
    return true;
  };
  auto digits = [&] {  // five or more
    const std::size_t from = at;
    while (at < name.size() && name[at] >= '0' && name[at] <= '9') ++at;
    return at - from >= 5;
  };
  return literal("model-") && digits() && literal("-of-") && digits() && literal(".safetensors") &&
         at == name.size();
}

/// The shards of tensors of `bytes` (in order), as huggingface_hub's split_state_dict_into_shards
/// makes them: a tensor above the limit alone, else a new shard when the tensor would take the
/// current one over the limit. Each shard: the positions of its tensors.
inline std::vector<std::vector<std::size_t>> hf_shards(std::span<const std::uint64_t> bytes,
                                                       std::uint64_t limit) {
  std::vector<std::vector<std::size_t>> shards;
  std::vector<std::size_t> current;
  std::uint64_t size = 0;
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    if (bytes[i] > limit) {
      shards.push_back({i});
      continue;
    }
    if (size + bytes[i] > limit) {
      shards.push_back(std::move(current));
      current.clear();
      size = 0;
    }
    current.push_back(i);
    size += bytes[i];
  }
  if (!current.empty()) shards.push_back(std::move(current));
  return shards;
}

/// Sets `key` of `config` (when `always` or when present) to the torch name of the weights'
/// dtype: its value when it already names one of the dtypes written, else `most` (the dtype of
/// most values).
inline void set_torch_dtype(nlohmann::ordered_json& config, const char* key, bool always,
                            const std::set<std::string>& written, const std::string& most) {
  const auto it = config.find(key);
  if (it == config.end() && !always) return;
  if (it != config.end() && it->is_string() && written.contains(it->get<std::string>())) return;
  config[key] = most;
}

/// Writes `text` to `file` (replaced); errors name the file.
inline void write_text(const std::filesystem::path& file, const std::string& text) {
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  check(static_cast<bool>(out), file.string(), ": cannot open for writing");
  out << text;
  out.close();
  check(static_cast<bool>(out), file.string(), ": write failed");
}

}  // namespace io::detail

/// Writes the model folder `dir` (created when missing) of a parameter set named by Hugging Face
/// names: the weights (model.safetensors, or shards and model.safetensors.index.json above
/// options.max_shard_bytes), config.json and the side files of options.source, as the header
/// comment describes. `c` is the model's configuration (its config.json without a source). With
/// a source, every parameter must be a tensor of the source checkpoint with the same shape (an
/// error names it). Weight files of an earlier save in `dir` that this one does not write
/// (model.safetensors, model.safetensors.index.json, model-*-of-*.safetensors) are removed, so
/// that the folder loads as written.
template <ParameterSet P>
void save_hf_model(const std::filesystem::path& dir, P& params, const model_config& c,
                   const hf_save_options& options = {}) {
  namespace fs = std::filesystem;
  using T = typename P::value_type;
  const fs::path& source = options.source;
  const bool from_source = !source.empty();
  check(options.max_shard_bytes >= 1, "save_hf_model: max_shard_bytes is 0, expected >= 1");
  check(!options.as || is_floating(*options.as), "save_hf_model: dtype ",
        options.as ? dtype_name(*options.as) : "", " is not F64, F32, BF16 or F16");
  if (from_source)
    check(io::detail::is_dir(source), "save_hf_model: the source '", source.string(),
          "' is not a checkpoint folder");

  // The dtype of every tensor: given, else the source's, else the set's value type.
  std::vector<dtype> types(params.size(),
                           options.as.value_or(sizeof(T) == 8 ? dtype::f64 : dtype::f32));
  if (from_source) {
    const hf_checkpoint ck = hf_checkpoint::open(source);
    for (std::size_t i = 0; i < params.size(); ++i) {
      const std::string& name = params.name(i);
      check(ck.contains(name), ck.description(), ": has no tensor '", name,
            "' (save_hf_model: is it the checkpoint the model was loaded from?)");
      const tensor_info& t = ck.info(name);
      const std::span<const index_t> shape = params.shape(i);
      check(std::equal(t.shape.begin(), t.shape.end(), shape.begin(), shape.end()),
            ck.description(), ": tensor '", name, "' has shape ", io::detail::shape_string(t.shape),
            ", the model's is ", io::detail::shape_string(shape),
            " (save_hf_model: not the model's source)");
      check(is_floating(t.type), ck.description(), ": tensor '", name, "' has dtype ",
            dtype_name(t.type), ", expected F64, F32, BF16 or F16");
      if (!options.as) types[i] = t.type;
    }
  }

  std::error_code ec;
  fs::create_directories(dir, ec);
  check(io::detail::is_dir(dir), dir.string(), ": cannot create the folder",
        ec ? " (" + ec.message() + ")" : std::string());
  if (from_source)
    check(!fs::equivalent(dir, source, ec), "save_hf_model: the output folder '", dir.string(),
          "' is the source '", source.string(), "' (the source is never written)");

  // The shards.
  std::vector<std::uint64_t> bytes(params.size());
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < params.size(); ++i) {
    bytes[i] = static_cast<std::uint64_t>(params.value(i).size()) * dtype_size(types[i]);
    total += bytes[i];
  }
  const auto shards = io::detail::hf_shards(bytes, options.max_shard_bytes);
  const std::size_t n = shards.size();
  std::set<std::string> files;
  for (std::size_t s = 0; s < n; ++s)
    files.insert(n == 1 ? std::string("model.safetensors") : io::detail::hf_shard_name(s, n));

  // Weight files of an earlier save that this one does not write.
  std::vector<fs::path> stale;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (files.contains(name)) continue;
    if (name == "model.safetensors" || (name == "model.safetensors.index.json" && n == 1) ||
        io::detail::is_hf_shard_name(name))
      stale.push_back(e.path());
  }
  for (const fs::path& p : stale) {
    fs::remove(p, ec);
    check(!ec, p.string(), ": cannot remove the weight file of an earlier save (", ec.message(),
          ")");
  }

  nlohmann::json weight_map = nlohmann::json::object();
  for (std::size_t s = 0; s < n; ++s) {
    const std::string file = n == 1 ? "model.safetensors" : io::detail::hf_shard_name(s, n);
    safetensors_writer w;
    for (std::size_t i : shards[s]) {
      const std::span<const index_t> shape = params.shape(i);
      const std::vector<T> host = io::detail::fetch_span(params, params.value(i));
      w.add(params.name(i), std::vector<index_t>(shape.begin(), shape.end()),
            std::span<const T>(host), types[i]);
      weight_map[params.name(i)] = file;
    }
    w.set_metadata("format", "pt");  // transformers checks it
    w.write(dir / file);
  }
  if (n > 1) {
    const nlohmann::json index = {{"metadata", {{"total_size", total}}},
                                  {"weight_map", weight_map}};
    io::detail::write_text(dir / "model.safetensors.index.json", index.dump(2) + "\n");
  }

  // config.json: the source's (its order kept), else the configuration's; torch_dtype set to the
  // dtype of most values written (kept when it names one of the dtypes written).
  std::map<dtype, std::uint64_t> values_of;
  for (std::size_t i = 0; i < params.size(); ++i) values_of[types[i]] += params.value(i).size();
  std::set<std::string> written;
  dtype most = types.empty() ? dtype::f32 : types.front();
  for (const auto& [t, count] : values_of) {
    written.insert(io::detail::torch_dtype_name(t));
    if (count > values_of.at(most)) most = t;
  }
  const std::string most_name = io::detail::torch_dtype_name(most);
  nlohmann::ordered_json config;
  const fs::path source_config = source / "config.json";
  if (from_source && io::detail::exists(source_config)) {
    const std::string text = io::detail::read_text_file(source_config);
    (void)io::detail::parse_json_text(text, source_config.string());  // duplicate keys refused
    config = nlohmann::ordered_json::parse(text);
    check(config.is_object(), source_config.string(), ": is a JSON ", config.type_name(),
          ", expected an object");
    const bool has_dtype = config.contains("dtype");
    io::detail::set_torch_dtype(config, "torch_dtype", !has_dtype, written, most_name);
    io::detail::set_torch_dtype(config, "dtype", false, written, most_name);
    if (auto text_config = config.find("text_config");
        text_config != config.end() && text_config->is_object()) {
      io::detail::set_torch_dtype(*text_config, "torch_dtype", false, written, most_name);
      io::detail::set_torch_dtype(*text_config, "dtype", false, written, most_name);
    }
  } else {
    config = nlohmann::ordered_json::parse(hf_config_json(c).dump());
    config["torch_dtype"] = most_name;
  }
  io::detail::write_text(dir / "config.json", config.dump(2) + "\n");

  // The generation and tokenizer files, copied (never moved).
  if (from_source)
    for (const char* name : hf_side_files) {
      const fs::path from = source / name;
      if (!fs::is_regular_file(from, ec)) continue;
      const fs::path to = dir / name;
      check(!fs::exists(to, ec) || !fs::equivalent(from, to, ec), "save_hf_model: '", to.string(),
            "' is the source's file '", from.string(), "'");
      fs::copy_file(from, to, fs::copy_options::overwrite_existing, ec);
      check(!ec, from.string(), ": cannot copy to ", to.string(), " (", ec.message(), ")");
    }
}

}  // namespace tightfit
