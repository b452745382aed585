// tightfit/nn/peft.hpp: LoRA adapters (nn/lora.hpp) saved and loaded in the layout of Hugging
// Face PEFT, so that `PeftModel.from_pretrained(base, dir)` reads what tightfit trained:
//   DIR/adapter_model.safetensors  base_model.model.model.layers.N.<module>.lora_A.weight (r, in)
//                                  and .lora_B.weight (out, r), in the dtype trained (F32 / F64)
//   DIR/adapter_config.json        LoraConfig's fields: peft_type "LORA", task_type "CAUSAL_LM",
//                                  r, lora_alpha, lora_dropout, target_modules, bias "none",
//                                  fan_in_fan_out false, use_rslora, init_lora_weights, ...
// and a merged model (W0 + s B A, nn/lora.hpp's merge) written as a model folder
// (nn/hf_save.hpp: model.safetensors or shards, config.json, the base's tokenizer files).
// Reading checks what tightfit can honour: peft_type LORA, lora_dropout in [0, 1) (applied in
// training, nn/lora_dropout.hpp), bias "none",
// fan_in_fan_out false, no DoRA, no per-module rank or alpha patterns, no layers_to_transform;
// errors name the field and the file.
#pragma once

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tightfit/core/error.hpp"
#include "tightfit/io/hf.hpp"
#include "tightfit/nn/hf_model.hpp"
#include "tightfit/nn/hf_save.hpp"
#include "tightfit/nn/lora.hpp"

namespace tightfit {

/// What save_peft_adapter writes beside the adapters.
struct peft_save_options {
  std::string base_model_name_or_path;  ///< the base model (a hub id or a directory); may be empty
  bool inference_mode = true;           ///< PEFT's default when saving
};

/// adapter_config.json's object for `cfg` (target_modules: the resolved module names, as PEFT
/// writes them after resolving "all-linear").
inline nlohmann::json peft_adapter_config(const lora_config& cfg, const peft_save_options& o = {}) {
  cfg.validate();
  // lora_alpha as PEFT writes it: an integer when it is one
  const nlohmann::json alpha = cfg.alpha == std::floor(cfg.alpha) && cfg.alpha < 9007199254740992.0
                                   ? nlohmann::json(static_cast<std::int64_t>(cfg.alpha))
                                   : nlohmann::json(cfg.alpha);
  nlohmann::json targets = nlohmann::json::array();
  for (projection p : cfg.projections()) targets.push_back(projection_name(p));
  return nlohmann::json{
      {"peft_type", "LORA"},
      {"task_type", "CAUSAL_LM"},
      {"auto_mapping", nullptr},
      {"base_model_name_or_path", o.base_model_name_or_path.empty()
                                      ? nlohmann::json(nullptr)
                                      : nlohmann::json(o.base_model_name_or_path)},
      {"revision", nullptr},
      {"inference_mode", o.inference_mode},
      {"r", cfg.rank},
      {"lora_alpha", alpha},
      {"lora_dropout", cfg.dropout},
      {"target_modules", targets},
      {"fan_in_fan_out", false},
      {"bias", "none"},
      {"use_rslora", cfg.use_rslora},
      {"use_dora", false},
      {"init_lora_weights", true},
      {"modules_to_save", nullptr},
      {"layers_to_transform", nullptr},
      {"layers_pattern", nullptr},
      {"rank_pattern", nlohmann::json::object()},
      {"alpha_pattern", nlohmann::json::object()},
  };
}

/// Writes DIR/adapter_model.safetensors (the adapters in their value type) and
/// DIR/adapter_config.json; creates DIR.
template <class M>
void save_peft_adapter(const std::filesystem::path& dir, lora_adapters<M>& adapters,
                       const peft_save_options& o = {}) {
  std::filesystem::create_directories(dir);
  save_hf_weights(dir / "adapter_model.safetensors", adapters.parameters());
  const std::filesystem::path json = dir / "adapter_config.json";
  std::ofstream out(json);
  out << peft_adapter_config(adapters.config(), o).dump(2) << "\n";
  out.close();
  check(static_cast<bool>(out), json.string(), ": could not be written");
}

/// The lora_config of DIR/adapter_config.json (seed 0). Errors name the field and the file.
inline lora_config read_peft_config(const std::filesystem::path& dir) {
  const std::filesystem::path path = dir / "adapter_config.json";
  const nlohmann::json j = io::detail::read_json_file(path);
  const std::string src = path.string();
  check(j.is_object(), src, ": is a JSON ", j.type_name(), ", expected an object");
  const io::detail::config_fields f(j, src);
  const auto type = f.string("peft_type");
  check(type == "LORA", src, ": field \"peft_type\" is ", type ? "\"" + *type + "\"" : "absent",
        ", expected \"LORA\"");
  lora_config c;
  c.rank = f.positive_int("r");
  c.alpha = f.number("lora_alpha", 8);
  c.dropout = f.number("lora_dropout", 0);
  check(c.dropout >= 0 && c.dropout < 1, src, ": field \"lora_dropout\" is ", c.dropout,
        ", expected a probability in [0, 1)");
  c.use_rslora = f.boolean("use_rslora", false);
  check(!f.boolean("use_dora", false), src, ": field \"use_dora\" is true (DoRA is not supported)");
  check(!f.boolean("fan_in_fan_out", false), src,
        ": field \"fan_in_fan_out\" is true, expected false (Linear layout)");
  const auto bias = f.string("bias");
  check(!bias || *bias == "none", src, ": field \"bias\" is \"", bias.value_or(""),
        "\", expected \"none\"");
  for (const char* unsupported : {"layers_to_transform", "modules_to_save"})
    check(f.find(unsupported) == nullptr, src, ": field \"", unsupported, "\" is ",
          f.find(unsupported) ? f.find(unsupported)->dump() : "",
          ", not supported (expected null)");
  for (const char* pattern : {"rank_pattern", "alpha_pattern"}) {
    const nlohmann::json* p = f.find(pattern);
    check(p == nullptr || (p->is_object() && p->empty()), src, ": field \"", pattern, "\" is ",
          p ? p->dump() : "", ", not supported (expected {})");
  }
  const nlohmann::json* t = f.find("target_modules");
  check(t != nullptr, src, ": missing field \"target_modules\"");
  c.target_modules.clear();
  if (t->is_string()) {
    c.target_modules = split_target_modules(t->get<std::string>());
  } else {
    check(t->is_array(), src, ": field \"target_modules\" is ", t->dump(),
          ", expected a list of module names or \"all-linear\"");
    for (const auto& m : *t) {
      check(m.is_string(), src, ": field \"target_modules\" holds ", m.dump(),
            ", expected module names");
      c.target_modules.push_back(m.get<std::string>());
    }
  }
  try {
    c.validate();
  } catch (const error& e) {
    fail(src, ": ", e.what());
  }
  return c;
}

/// Checks DIR/adapter_model.safetensors against `cfg` (its adapter_config.json's) on a model of
/// `num_layers` layers whose parameter table is `layer_table` (L::parameter_table(config)) from
/// the file's header alone, before any adapter is allocated: every lora_A (r, in) and lora_B
/// (out, r) of the targets is there with its shape. Errors name the file and the tensor.
inline void check_peft_adapter_shapes(const std::filesystem::path& dir,
                                      std::span<const param_spec> layer_table, index_t num_layers,
                                      const lora_config& cfg) {
  const std::filesystem::path path = dir / "adapter_model.safetensors";
  const auto file = safetensors_file::open(path);
  for (index_t l = 0; l < num_layers; ++l)
    for (projection p : cfg.projections()) {
      const auto [out, in] = projection_extents(layer_table, p);
      for (char which : {'A', 'B'}) {
        const std::string name = peft_lora_name(l, p, which);
        check(file.contains(name), path.string(), ": tensor '", name, "' is missing");
        const std::vector<index_t> want =
            which == 'A' ? std::vector<index_t>{cfg.rank, in} : std::vector<index_t>{out, cfg.rank};
        const auto& have = file.info(name).shape;
        check(have == want, path.string(), ": tensor '", name, "' has shape ",
              io::detail::shape_string(have), ", expected ", io::detail::shape_string(want),
              " (r = ", cfg.rank, ")");
      }
    }
}

/// Loads DIR's adapters into `adapters`, whose configuration must be DIR's (rank, alpha,
/// rsLoRA, targets: an error names the difference); every tensor must be there with its shape.
template <class M>
void load_peft_adapter(const std::filesystem::path& dir, lora_adapters<M>& adapters) {
  const lora_config saved = read_peft_config(dir);
  const lora_config& have = adapters.config();
  const std::string src = (dir / "adapter_config.json").string();
  check(saved.rank == have.rank, src, ": r is ", saved.rank, ", the adapters have ", have.rank);
  check(saved.alpha == have.alpha, src, ": lora_alpha is ", saved.alpha, ", the adapters have ",
        have.alpha);
  check(saved.use_rslora == have.use_rslora, src, ": use_rslora is ", saved.use_rslora,
        ", the adapters have ", have.use_rslora);
  check(saved.projections() == have.projections(), src,
        ": target_modules differ from the adapters'");
  load_hf_weights(dir / "adapter_model.safetensors", adapters.parameters());
}

/// Writes the merged model (call adapters.merge() first) as save_hf_model writes a model folder:
/// DIR/model.safetensors (or shards) + config.json; with options.source (the base model's
/// folder), in the base checkpoint's dtypes, its config.json kept and its generation and
/// tokenizer files copied.
template <class M>
void save_merged_model(const std::filesystem::path& dir, lora_adapters<M>& adapters,
                       const hf_save_options& options = {}) {
  check(!adapters.bound(), "save_merged_model: merge the adapters first (lora_adapters::merge)");
  save_hf_model(dir, adapters.model().parameters(), adapters.model().config(), options);
}

}  // namespace tightfit
