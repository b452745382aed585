// tightfit/nn/hf_model.hpp: Hugging Face models in and out: config.json <-> model_config, and
// weights / gradients of a parameter set by their Hugging Face names, over the formats of
// io/hf.hpp and io/safetensors.hpp.
//
// Supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM (by
// "architectures"[0], or by "model_type" llama / mistral / qwen2 / qwen3), with
//  - rope_scaling (or transformers 5's rope_parameters) of rope_type default, linear, dynamic,
//    yarn or llama3 and their parameters (nn/rope.hpp computes the frequencies);
//  - sliding windows: Mistral's sliding_window (every layer), Qwen2 / Qwen3's use_sliding_window
//    with sliding_window and max_window_layers (layers l >= max_window_layers slide), or an
//    explicit layer_types list of "sliding_attention" / "full_attention";
//  - Llama's mlp_bias (biases on gate_proj, up_proj, down_proj).
// Gemma2ForCausalLM (model_type gemma2) and Gemma3ForCausalLM (gemma3_text; or the text_config
// of a Gemma3ForConditionalGeneration config.json) run on nn/gemma_layer.hpp: hidden_activation
// gelu_pytorch_tanh, query_pre_attn_scalar, attn_logit_softcapping / final_logit_softcapping
// (a missing key takes transformers' default: 50 / 30 for Gemma 2, none for Gemma 3; null: none),
// sliding_window with layer_types, else sliding_window_pattern (Gemma 3, default 6: every 6th
// layer global) or alternating layers (Gemma 2: even layers slide), rope_local_base_freq
// (Gemma 3, default 10000), tie_word_embeddings (default true); attention_bias: true and
// use_bidirectional_attention: true are refused by name.
// Refused with a message naming the option: other architectures, other rope types, a
// rope_scaling key tightfit does not know, partial_rotary_factor other than 1, a yarn
// original_max_position_embeddings whose ratio to max_position_embeddings is not the factor
// (transformers versions disagree on which one wins), hidden_act other than silu. Attention
// biases: Qwen2 always has biases on
// q_proj / k_proj / v_proj (the config does not announce them; model_config::qkv_bias);
// Llama and Qwen3 with attention_bias: true have them on q/k/v and o_proj (qkv_bias and
// o_bias). A *.bias tensor the configuration does not call for is an error naming it.
//
// A checkpoint is a directory with model.safetensors, or with model.safetensors.index.json
// whose "weight_map" names the shard of each tensor (shards live beside the index). A tied
// model (tie_word_embeddings) has no lm_head.weight parameter; a checkpoint that stores one
// anyway loads fine.
#pragma once

#include <algorithm>
#include <cmath>
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
#include "tightfit/io/hf.hpp"
#include "tightfit/io/safetensors.hpp"
#include "tightfit/nn/architectures.hpp"
#include "tightfit/nn/config.hpp"
#include "tightfit/nn/parameters.hpp"

namespace tightfit {

/// The largest model load_hf_config accepts, in parameters (2^40, about 1.1 trillion): a
/// declared maximum that turns absurd sizes into an error before anything is allocated.
inline constexpr std::uint64_t max_hf_parameters = std::uint64_t{1} << 40;

/// Number of parameters of the model `c` describes (every tensor decoder_model declares: the
/// embedding, L times the table of the config's layer (nn/architectures.hpp), the final norm and
/// an untied head), or nullopt when it does not fit in 64 bits.
inline std::optional<std::uint64_t> hf_parameter_count(const model_config& c) {
  const auto u = [](index_t v) { return static_cast<std::uint64_t>(v < 0 ? 0 : v); };
  const std::uint64_t d = u(c.hidden_size);
  // The table's widths (H * hd, Hkv * hd) are index_t products: refuse what overflows them.
  constexpr auto most = static_cast<std::uint64_t>(std::numeric_limits<index_t>::max());
  const auto q = checked_product({u(c.num_attention_heads), u(c.head_dim)});
  const auto kv = checked_product({u(c.num_key_value_heads), u(c.head_dim)});
  if (!q || !kv || *q > most || *kv > most) return std::nullopt;
  const auto add = [](std::optional<std::uint64_t> a, std::optional<std::uint64_t> b) {
    return a && b ? checked_sum(*a, *b) : std::nullopt;
  };
  std::optional<std::uint64_t> layer = std::uint64_t{0};
  for (const param_spec& row : config_layer_table(c)) {
    std::optional<std::uint64_t> n = std::uint64_t{1};
    for (index_t e : row.shape) n = n ? checked_product({*n, u(e)}) : std::nullopt;
    layer = add(layer, n);
  }
  auto total = add(checked_product({c.tie_word_embeddings ? 1u : 2u, u(c.vocab_size), d}), d);
  if (!layer) return std::nullopt;
  return add(total, checked_product({u(c.num_hidden_layers), *layer}));
}

namespace detail {

/// rope_scaling, or transformers 5's rope_parameters (which also holds rope_theta), into
/// c.rope_scaling; a type or key tightfit does not know is an error naming it.
inline void parse_rope_scaling(const io::detail::config_fields& f, model_config& c) {
  const std::string& src = f.source();
  for (const char* field : {"rope_scaling", "rope_parameters"}) {
    const nlohmann::json* v = f.find(field);
    if (v == nullptr) continue;
    check(v->is_object(), src, ": field \"", field, "\" is ", v->dump(),
          ", expected an object or null");
    rope_scaling_config r;
    for (const char* key : {"rope_type", "type"}) {
      auto it = v->find(key);
      if (it == v->end()) continue;
      check(it->is_string(), src, ": ", field, ".", key, " is ", it->dump(), ", expected a name");
      r.rope_type = it->get<std::string>();
    }
    const std::string& t = r.rope_type;
    check(t == "default" || t == "linear" || t == "dynamic" || t == "yarn" || t == "llama3", src,
          ": ", field, " of type \"", t,
          "\" is not supported (supported: default, linear, dynamic, yarn, llama3)");
    // the keys each type reads (transformers' _validate_*_rope_parameters), plus rope_theta
    std::set<std::string> known{"rope_type", "type", "rope_theta"};
    if (t != "default") known.insert("factor");
    if (t == "dynamic") known.insert("original_max_position_embeddings");
    if (t == "yarn")
      known.insert({"original_max_position_embeddings", "attention_factor", "beta_fast",
                    "beta_slow", "mscale", "mscale_all_dim", "truncate"});
    if (t == "llama3")
      known.insert({"original_max_position_embeddings", "low_freq_factor", "high_freq_factor"});
    for (auto it = v->begin(); it != v->end(); ++it)
      check(known.contains(it.key()), src, ": ", field, " key \"", it.key(),
            "\" is not supported for rope_type \"", t, "\"");
    auto number = [&](const char* key, double fallback, bool required = false) {
      auto it = v->find(key);
      if (it == v->end() || it->is_null()) {
        check(!required, src, ": ", field, " of type \"", t, "\" needs \"", key, "\"");
        return fallback;
      }
      check(it->is_number(), src, ": ", field, ".", key, " is ", it->dump(), ", expected a number");
      return it->get<double>();
    };
    if (t != "default") r.factor = number("factor", 1.0, true);
    if (t == "llama3") {
      r.low_freq_factor = number("low_freq_factor", 1.0, true);
      r.high_freq_factor = number("high_freq_factor", 4.0, true);
    }
    if (t == "llama3" || t == "yarn") {
      const double o = number("original_max_position_embeddings", 0.0, t == "llama3");
      check(o >= 0 && o <= 1099511627776.0 && o == std::floor(o), src, ": ", field,
            ".original_max_position_embeddings is ", o, ", expected a positive integer");
      r.original_max_position_embeddings = static_cast<index_t>(o);
    }
    if (t == "yarn") {
      r.attention_factor = number("attention_factor", 0.0);
      r.beta_fast = number("beta_fast", 32.0);
      r.beta_slow = number("beta_slow", 1.0);
      r.mscale = number("mscale", 0.0);
      r.mscale_all_dim = number("mscale_all_dim", 0.0);
      if (auto it = v->find("truncate"); it != v->end() && !it->is_null()) {
        check(it->is_boolean(), src, ": ", field, ".truncate is ", it->dump(),
              ", expected true or false");
        r.truncate = it->get<bool>();
      }
      const index_t o = r.original_max_position_embeddings, m = c.max_position_embeddings;
      check(o == 0 || m == 0 || static_cast<double>(m) == r.factor * static_cast<double>(o), src,
            ": yarn factor ", r.factor, " is not max_position_embeddings ", m,
            " / original_max_position_embeddings ", o,
            " (transformers versions differ on which one wins; not supported)");
    }
    if (std::string(field) == "rope_parameters" && t == "default" &&
        c.rope_scaling.rope_type != "default")
      continue;  // rope_scaling already said more
    c.rope_scaling = r;
  }
}

/// The sliding window of the layers (Mistral: sliding_window on every layer; Qwen2 / Qwen3:
/// use_sliding_window, sliding_window, max_window_layers; any: layer_types).
inline void parse_sliding_window(const io::detail::config_fields& f, model_config& c, bool mistral,
                                 bool qwen) {
  const std::string& src = f.source();
  const index_t window = f.find("sliding_window") != nullptr ? f.positive_int("sliding_window") : 0;
  if (mistral) c.sliding_window = window;
  if (qwen && f.boolean("use_sliding_window", false)) {
    check(window >= 1, src, ": use_sliding_window is true but sliding_window is not given");
    c.sliding_window = window;
    const index_t first = f.find("max_window_layers") != nullptr
                              ? f.positive_int("max_window_layers")
                              : index_t{28};  // transformers' default
    c.sliding_layers.assign(static_cast<std::size_t>(c.num_hidden_layers), false);
    for (index_t l = first; l < c.num_hidden_layers; ++l)
      c.sliding_layers[static_cast<std::size_t>(l)] = true;
  }
  if (const nlohmann::json* lt = f.find("layer_types")) {
    check(lt->is_array() && static_cast<index_t>(lt->size()) == c.num_hidden_layers, src,
          ": field \"layer_types\" is ", lt->dump(), ", expected a list of ", c.num_hidden_layers,
          " names (one per layer)");
    c.sliding_layers.clear();
    for (const auto& t : *lt) {
      check(t == "full_attention" || t == "sliding_attention", src, ": layer_types holds ",
            t.dump(), ", expected \"full_attention\" or \"sliding_attention\"");
      c.sliding_layers.push_back(t == "sliding_attention");
    }
  }
}

/// The Gemma 2 / Gemma 3 fields (transformers' Gemma2Config / Gemma3TextConfig defaults for the
/// keys a config.json omits).
inline void parse_gemma(const nlohmann::json& j, const io::detail::config_fields& f,
                        model_config& c) {
  const std::string& src = f.source();
  const bool gemma2 = c.architecture == "Gemma2ForCausalLM";
  for (const char* key : {"hidden_activation", "hidden_act"}) {
    const auto act = f.string(key);
    check(!act || *act == "gelu_pytorch_tanh", src, ": ", key, " \"", act.value_or(""),
          "\" is not supported (Gemma: expected \"gelu_pytorch_tanh\")");
  }
  check(!f.boolean("use_bidirectional_attention", false), src,
        ": use_bidirectional_attention true is not supported (causal decoders only)");
  c.query_pre_attn_scalar = f.number("query_pre_attn_scalar", 256.0);
  check(c.query_pre_attn_scalar > 0, src, ": query_pre_attn_scalar is ", c.query_pre_attn_scalar,
        ", expected > 0");
  // soft-capping: a missing key takes the class default, null means none
  auto cap = [&](const char* key, double fallback) {
    if (!j.contains(key)) return fallback;
    const double v = f.number(key, 0.0);
    check(v >= 0, src, ": ", key, " is ", v, ", expected > 0 or null");
    return v;
  };
  c.attn_logit_softcapping = cap("attn_logit_softcapping", gemma2 ? 50.0 : 0.0);
  c.final_logit_softcapping = cap("final_logit_softcapping", gemma2 ? 30.0 : 0.0);
  if (!gemma2) c.rope_local_base_freq = f.number("rope_local_base_freq", 10000.0);
  c.sliding_window =
      f.find("sliding_window") != nullptr ? f.positive_int("sliding_window") : index_t{4096};
  c.sliding_layers.assign(static_cast<std::size_t>(c.num_hidden_layers), false);
  if (const nlohmann::json* lt = f.find("layer_types")) {
    check(lt->is_array() && static_cast<index_t>(lt->size()) == c.num_hidden_layers, src,
          ": field \"layer_types\" is ", lt->dump(), ", expected a list of ", c.num_hidden_layers,
          " names (one per layer)");
    for (std::size_t l = 0; l < lt->size(); ++l) {
      const auto& t = (*lt)[l];
      check(t == "full_attention" || t == "sliding_attention", src, ": layer_types holds ",
            t.dump(), ", expected \"full_attention\" or \"sliding_attention\"");
      c.sliding_layers[l] = t == "sliding_attention";
    }
    return;
  }
  index_t pattern = 2;  // Gemma 2: layers 0, 2, 4, ... slide
  if (!gemma2)
    pattern = f.find("sliding_window_pattern") != nullptr
                  ? f.positive_int("sliding_window_pattern")
                  : f.positive_int("_sliding_window_pattern", index_t{6});
  for (index_t l = 0; l < c.num_hidden_layers; ++l)
    c.sliding_layers[static_cast<std::size_t>(l)] = (l + 1) % pattern != 0;
}

}  // namespace detail

/// Reads a Hugging Face config.json (a file, or a directory holding config.json) of a
/// LlamaForCausalLM, Qwen2ForCausalLM or Qwen3ForCausalLM model. Throws tightfit::error naming
/// the file and the field for malformed input and for options tightfit does not support.
inline model_config parse_hf_config(std::string_view text, const std::string& src);
inline model_config load_hf_config(const std::filesystem::path& path) {
  const std::filesystem::path file = io::detail::is_dir(path) ? path / "config.json" : path;
  return parse_hf_config(io::detail::read_text_file(file), file.string());
}

/// load_hf_config on the text of a config.json (`src` names it in messages).
inline model_config parse_hf_config(std::string_view text, const std::string& src) {
  nlohmann::json j = io::detail::parse_json_text(text, src);
  check(j.is_object(), src, ": is a JSON ", j.type_name(), ", expected an object");
  const auto type_field = j.find("model_type");  // any JSON type: checked where it is read
  if (const auto a = j.find("architectures");
      (a != j.end() && a->is_array() && !a->empty() &&
       (*a)[0] == "Gemma3ForConditionalGeneration") ||
      (a == j.end() && type_field != j.end() && type_field->is_string() &&
       *type_field == "gemma3")) {
    // the text part of a Gemma 3 vision-language checkpoint: its text_config
    const auto t = j.find("text_config");
    check(t != j.end() && t->is_object(), src,
          ": Gemma3ForConditionalGeneration without a \"text_config\" object (only the text "
          "part is supported)");
    nlohmann::json text_cfg = *t;
    text_cfg["architectures"] = nlohmann::json::array({"Gemma3ForCausalLM"});
    text_cfg["model_type"] = "gemma3_text";
    if (!text_cfg.contains("tie_word_embeddings") && j.contains("tie_word_embeddings"))
      text_cfg["tie_word_embeddings"] = j["tie_word_embeddings"];
    j = std::move(text_cfg);
  }
  const io::detail::config_fields f(j, src);

  // Architecture: "architectures"[0], else "model_type".
  std::string arch;
  const auto model_type = f.string("model_type");
  if (const nlohmann::json* a = f.find("architectures")) {
    check(a->is_array() && !a->empty() && (*a)[0].is_string(), src, ": field \"architectures\" is ",
          a->dump(), ", expected a list of names");
    arch = (*a)[0].get<std::string>();
  } else {
    check(model_type.has_value(), src,
          ": neither \"architectures\" nor \"model_type\" names the architecture");
    for (const auto& known : io::detail::hf_architectures)
      if (*model_type == known.model_type) arch = known.architecture;
    check(!arch.empty(), src, ": model_type \"", *model_type,
          "\" is not supported (supported: llama, mistral, qwen2, qwen3, gemma2, gemma3_text, "
          "gemma3)");
  }
  const io::detail::hf_architecture* kind = nullptr;
  for (const auto& known : io::detail::hf_architectures)
    if (arch == known.architecture) kind = &known;
  check(kind != nullptr, src, ": architecture \"", arch,
        "\" is not supported (supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, "
        "Qwen3ForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3ForConditionalGeneration "
        "(text part))");
  check(!model_type || *model_type == kind->model_type, src, ": model_type \"",
        model_type.value_or(""), "\" does not match architecture \"", arch, "\" (expected \"",
        kind->model_type, "\")");
  const bool qwen2 = arch == "Qwen2ForCausalLM";

  model_config c;
  c.architecture = arch;
  c.vocab_size = f.positive_int("vocab_size");
  c.hidden_size = f.positive_int("hidden_size");
  c.intermediate_size = f.positive_int("intermediate_size");
  c.num_hidden_layers = f.positive_int("num_hidden_layers");
  c.num_attention_heads = f.positive_int("num_attention_heads");
  c.num_key_value_heads = f.positive_int("num_key_value_heads", c.num_attention_heads);
  if (f.find("head_dim") != nullptr) {
    c.head_dim = f.positive_int("head_dim");
  } else {
    check(c.hidden_size % c.num_attention_heads == 0, src, ": hidden_size ", c.hidden_size,
          " is not a multiple of num_attention_heads ", c.num_attention_heads,
          " and head_dim is not given");
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  c.rms_norm_eps = f.number("rms_norm_eps", 1e-6);
  c.rope_theta = f.number("rope_theta", 10000.0);
  if (const nlohmann::json* rp = f.find("rope_parameters"); rp != nullptr && rp->is_object()) {
    // transformers >= 5 moves rope_theta into rope_parameters
    auto it = rp->find("rope_theta");
    if (f.find("rope_theta") == nullptr && it != rp->end()) {
      check(it->is_number(), src, ": field \"rope_parameters.rope_theta\" is ", it->dump(),
            ", expected a number");
      c.rope_theta = it->get<double>();
    }
  }
  const bool gemma2 = arch == "Gemma2ForCausalLM", gemma3 = arch == "Gemma3ForCausalLM";
  const bool gemma = gemma2 || gemma3;
  c.tie_word_embeddings = f.boolean("tie_word_embeddings", gemma);  // Gemma: tied by default
  c.qk_norm = arch == "Qwen3ForCausalLM" || gemma3;
  // Attention biases as the transformers modules create them: Qwen2 q/k/v always (its
  // attention_bias field, when present, is ignored by transformers), Llama / Qwen3 q/k/v/o
  // when attention_bias is true.
  // (Mistral's modules have no biases whatever the config says.)
  const bool attention_bias =
      !qwen2 && arch != "MistralForCausalLM" && f.boolean("attention_bias", false);
  check(!gemma || !attention_bias, src, ": attention_bias true is not supported for ", arch);
  c.qkv_bias = qwen2 || attention_bias;
  c.o_bias = attention_bias;

  if (f.find("max_position_embeddings") != nullptr)
    c.max_position_embeddings = f.positive_int("max_position_embeddings");
  const bool llama = arch == "LlamaForCausalLM", mistral = arch == "MistralForCausalLM";
  c.mlp_bias = llama && f.boolean("mlp_bias", false);
  detail::parse_rope_scaling(f, c);
  if (gemma)
    detail::parse_gemma(j, f, c);
  else
    detail::parse_sliding_window(f, c, mistral,
                                 arch == "Qwen2ForCausalLM" || arch == "Qwen3ForCausalLM");

  // Unsupported options.
  if (!gemma) {
    const std::string act = f.string("hidden_act").value_or("silu");
    check(act == "silu", src, ": hidden_act \"", act, "\" is not supported (expected \"silu\")");
  }
  const double partial = f.number("partial_rotary_factor", 1.0);
  check(partial == 1.0, src, ": partial_rotary_factor ", partial,
        " is not supported (RoPE rotates the whole head)");

  try {
    c.validate();
  } catch (const error& e) {
    fail(src, ": ", e.what());
  }
  // Sizes before anything is allocated: the whole model against a declared maximum.
  const auto count = hf_parameter_count(c);
  check(count && *count <= max_hf_parameters, src, ": the model has ",
        count ? std::to_string(*count) : std::string("more than 2^64"), " parameters (vocab_size ",
        c.vocab_size, ", hidden_size ", c.hidden_size, ", intermediate_size ", c.intermediate_size,
        ", num_hidden_layers ", c.num_hidden_layers, "), more than the declared maximum ",
        max_hf_parameters);
  return c;
}

/// The Hugging Face config.json object of `c` (what save_hf_config writes).
inline nlohmann::json hf_config_json(const model_config& c) {
  c.validate();
  const io::detail::hf_architecture* kind = nullptr;
  for (const auto& known : io::detail::hf_architectures)
    if (c.architecture == known.architecture) kind = &known;
  check(kind != nullptr, "save_hf_config: architecture \"", c.architecture,
        "\" is not supported (supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, "
        "Qwen3ForCausalLM)");
  const bool qwen3 = c.architecture == "Qwen3ForCausalLM";
  const bool qwen2 = c.architecture == "Qwen2ForCausalLM";
  const bool gemma3 = c.architecture == "Gemma3ForCausalLM";
  check(c.qk_norm == (qwen3 || gemma3), "save_hf_config: qk_norm is ", c.qk_norm, ", but ",
        c.architecture, qwen3 || gemma3 ? " always has" : " never has", " q_norm / k_norm");
  if (qwen2)
    check(c.qkv_bias && !c.o_bias, "save_hf_config: qkv_bias is ", c.qkv_bias, " and o_bias is ",
          c.o_bias, ", but Qwen2ForCausalLM always has q/k/v biases and never an o_proj bias");
  else
    check(c.qkv_bias == c.o_bias, "save_hf_config: qkv_bias is ", c.qkv_bias, " and o_bias is ",
          c.o_bias, ", but ", c.architecture, " has either both (attention_bias: true) or neither");
  nlohmann::json j = {
      {"architectures", nlohmann::json::array({c.architecture})},
      {"model_type", kind->model_type},
      {"vocab_size", c.vocab_size},
      {"hidden_size", c.hidden_size},
      {"intermediate_size", c.intermediate_size},
      {"num_hidden_layers", c.num_hidden_layers},
      {"num_attention_heads", c.num_attention_heads},
      {"num_key_value_heads", c.num_key_value_heads},
      {"head_dim", c.head_dim},
      {"rms_norm_eps", c.rms_norm_eps},
      {"rope_theta", c.rope_theta},
      {"rope_scaling", nullptr},
      {"tie_word_embeddings", c.tie_word_embeddings},
      {"hidden_act", "silu"},
  };
  const bool llama = c.architecture == "LlamaForCausalLM";
  const bool mistral = c.architecture == "MistralForCausalLM";
  check(llama || !c.mlp_bias, "save_hf_config: mlp_bias is true, but only LlamaForCausalLM has it");
  check(!mistral || (!c.qkv_bias && !c.o_bias),
        "save_hf_config: MistralForCausalLM has no attention biases");
  check(!llama || c.sliding_window == 0, "save_hf_config: sliding_window is ", c.sliding_window,
        ", but LlamaForCausalLM has no sliding window");
  if (c.max_position_embeddings > 0) j["max_position_embeddings"] = c.max_position_embeddings;
  if (c.rope_scaling.rope_type != "default") {
    const rope_scaling_config& r = c.rope_scaling;
    nlohmann::json rs = {{"rope_type", r.rope_type}, {"factor", r.factor}};
    if (r.original_max_position_embeddings > 0 && r.rope_type != "linear")
      rs["original_max_position_embeddings"] = r.original_max_position_embeddings;
    if (r.rope_type == "llama3") {
      rs["low_freq_factor"] = r.low_freq_factor;
      rs["high_freq_factor"] = r.high_freq_factor;
    }
    if (r.rope_type == "yarn") {
      rs["beta_fast"] = r.beta_fast;
      rs["beta_slow"] = r.beta_slow;
      rs["truncate"] = r.truncate;
      if (r.attention_factor > 0) rs["attention_factor"] = r.attention_factor;
      if (r.mscale > 0) rs["mscale"] = r.mscale;
      if (r.mscale_all_dim > 0) rs["mscale_all_dim"] = r.mscale_all_dim;
    }
    j["rope_scaling"] = rs;
  }
  if (c.sliding_window > 0 && !c.sliding_layers.empty()) {
    auto types = nlohmann::json::array();
    for (bool slides : c.sliding_layers)
      types.push_back(slides ? "sliding_attention" : "full_attention");
    j["layer_types"] = types;
  }
  if (c.is_gemma()) {
    check(!c.qkv_bias && !c.o_bias && !c.mlp_bias, "save_hf_config: ", c.architecture,
          " has no biases");
    j["hidden_act"] = "gelu_pytorch_tanh";
    j["hidden_activation"] = "gelu_pytorch_tanh";
    j["attention_bias"] = false;
    j["query_pre_attn_scalar"] =
        c.query_pre_attn_scalar > 0 ? c.query_pre_attn_scalar : static_cast<double>(c.head_dim);
    auto cap = [](double v) { return v > 0 ? nlohmann::json(v) : nlohmann::json(nullptr); };
    j["attn_logit_softcapping"] = cap(c.attn_logit_softcapping);
    j["final_logit_softcapping"] = cap(c.final_logit_softcapping);
    if (gemma3) j["rope_local_base_freq"] = c.rope_local_base_freq;
    j["sliding_window"] = c.sliding_window > 0 ? c.sliding_window : c.num_hidden_layers + 1;
    auto types = nlohmann::json::array();
    for (index_t l = 0; l < c.num_hidden_layers; ++l)
      types.push_back(c.layer_window(l) > 0 ? "sliding_attention" : "full_attention");
    j["layer_types"] = types;
  } else if (llama) {
    j["attention_bias"] = c.o_bias;
    j["mlp_bias"] = c.mlp_bias;
  } else if (mistral) {
    j["sliding_window"] = c.sliding_window > 0 ? nlohmann::json(c.sliding_window) : nullptr;
  } else {
    j["use_sliding_window"] = c.sliding_window > 0;
    if (c.sliding_window > 0) {
      j["sliding_window"] = c.sliding_window;
      j["max_window_layers"] = c.num_hidden_layers;  // layer_types says which layers slide
      if (c.sliding_layers.empty())
        j["layer_types"] = std::vector<std::string>(static_cast<std::size_t>(c.num_hidden_layers),
                                                    "sliding_attention");
    }
    if (qwen3) j["attention_bias"] = c.o_bias;
  }
  return j;
}

/// Writes `c` as a Hugging Face config.json to `path` (a file, or an existing directory that
/// receives config.json). transformers reads it with AutoConfig.
inline void save_hf_config(const model_config& c, const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  const nlohmann::json j = hf_config_json(c);
  const fs::path file = io::detail::is_dir(path) ? path / "config.json" : path;
  std::ofstream out(file, std::ios::trunc);
  check(static_cast<bool>(out), file.string(), ": cannot open for writing");
  out << j.dump(2) << '\n';
  out.close();
  check(static_cast<bool>(out), file.string(), ": write failed");
}

/// Checks, before a model is allocated, that the checkpoint at `path` (as load_hf_weights
/// takes it) can hold the model `c` describes: its tensors together must have at least the
/// model's parameter count, and model.embed_tokens.weight must be (vocab_size, hidden_size).
/// A config.json that does not match its weights (an 8B config beside tiny weights) is then
/// an error naming both sizes instead of an allocation of the config's size.
inline void check_hf_checkpoint_size(const model_config& c, const std::filesystem::path& path) {
  const hf_checkpoint ck = hf_checkpoint::open(path);
  const std::string& src = ck.description();
  if (ck.contains("model.embed_tokens.weight")) {
    const tensor_info& e = ck.info("model.embed_tokens.weight");
    check(e.shape.size() == 2 && e.shape[0] == c.vocab_size && e.shape[1] == c.hidden_size, src,
          ": tensor 'model.embed_tokens.weight' has shape ", io::detail::shape_string(e.shape),
          ", config.json says vocab_size ", c.vocab_size, " x hidden_size ", c.hidden_size);
  }
  std::uint64_t held = 0;
  for (const std::string& name : ck.names()) {
    const tensor_info& t = ck.info(name);
    std::uint64_t n = 1;
    for (index_t e : t.shape) n = checked_product({n, static_cast<std::uint64_t>(e)}).value_or(0);
    held = checked_sum(held, n).value_or(std::numeric_limits<std::uint64_t>::max());
  }
  const auto count = hf_parameter_count(c);
  check(count && *count <= held, src, ": config.json describes a model of ",
        count ? std::to_string(*count) : std::string("more than 2^64"),
        " parameters, more than the ", held,
        " values the checkpoint holds (does config.json match the weights?)");
}

/// Options of load_hf_weights.
struct hf_load_options {
  /// Ignore checkpoint tensors the parameter set does not have (default: an error, which
  /// catches a config that does not match the checkpoint). lm_head.weight of a tied model and
  /// rotary_emb.inv_freq buffers are always ignored; a *.bias tensor the set lacks is always
  /// an error (the configuration does not match the checkpoint).
  bool ignore_unused = false;
};

namespace io::detail {

/// Copies host values into parameter i: through the backend's upload when the set exposes a
/// backend (a device backend's buffers are not host memory), else directly into value(i).
template <ParameterSet P>
void store_parameter(P& params, std::size_t i, std::span<const typename P::value_type> host) {
  auto dst = params.value(i);
  if constexpr (requires { params.backend().upload(host, dst); }) {
    params.backend().upload(host, dst);
  } else {
    std::copy(host.begin(), host.end(), dst.begin());
  }
}

/// Host copy of a span held by the parameter set (download through the backend when any).
template <ParameterSet P>
std::vector<typename P::value_type> fetch_span(P& params, std::span<typename P::value_type> src) {
  using T = typename P::value_type;
  std::vector<T> host(src.size());
  if constexpr (requires {
                  params.backend().download(std::span<const T>(src), std::span<T>(host));
                }) {
    params.backend().download(std::span<const T>(src), std::span<T>(host));
  } else {
    std::copy(src.begin(), src.end(), host.begin());
  }
  return host;
}

inline bool always_ignored(const std::string& name) {
  return name == "lm_head.weight" || ends_with(name, ".rotary_emb.inv_freq");
}

template <ParameterSet P>
void save_spans(const std::filesystem::path& path, P& params, std::optional<dtype> as,
                bool gradients) {
  namespace fs = std::filesystem;
  using T = typename P::value_type;
  const fs::path file = io::detail::is_dir(path) ? path / "model.safetensors" : path;
  safetensors_writer w;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const std::span<T> src = gradients ? params.grad(i) : params.value(i);
    if (gradients && src.empty()) continue;  // no gradient: skipped
    const std::span<const index_t> shape = params.shape(i);
    const std::vector<T> host = fetch_span(params, src);
    w.add(params.name(i), std::vector<index_t>(shape.begin(), shape.end()),
          std::span<const T>(host), as);
  }
  w.set_metadata("format", "pt");  // transformers checks it
  w.write(file);
}

}  // namespace io::detail

/// Loads every parameter of `params` from the checkpoint at `path` (directory, .safetensors
/// file or index.json) by its Hugging Face name, converting F64 / F32 / BF16 / F16 to the set's
/// value type. Errors name the tensor: a parameter missing from the checkpoint, a shape that
/// differs (both shapes given), a dtype that is not floating, a *.bias tensor the set lacks
/// (e.g. attention_bias missing from config.json), and (unless options.ignore_unused) any
/// other tensor the set lacks.
template <ParameterSet P>
void load_hf_weights(const std::filesystem::path& path, P& params,
                     const hf_load_options& options = {}) {
  using T = typename P::value_type;
  const hf_checkpoint ck = hf_checkpoint::open(path);
  const std::string& src = ck.description();
  std::vector<std::string> unused;
  for (const std::string& name : ck.names()) {
    if (params.find(name) >= 0) continue;
    check(!io::detail::ends_with(name, ".bias"), src, ": tensor '", name,
          "' is a bias the model does not have (config.json calls for no such bias: "
          "attention_bias? mlp_bias is not supported)");
    if (!io::detail::always_ignored(name)) unused.push_back(name);
  }
  check(unused.empty() || options.ignore_unused, src, ": ", unused.size(),
        " tensor(s) the model does not have, e.g. '", unused.empty() ? "" : unused.front(),
        "' (does config.json match the checkpoint? set ignore_unused to skip them)");
  for (std::size_t i = 0; i < params.size(); ++i) {
    const std::string& name = params.name(i);
    check(ck.contains(name), src, ": parameter '", name, "' is not in the checkpoint");
    const safetensors_file& file = ck.file_of(name);
    const tensor_info& t = file.info(name);
    const std::span<const index_t> want = params.shape(i);
    check(std::equal(t.shape.begin(), t.shape.end(), want.begin(), want.end()), file.source(),
          ": tensor '", name, "' has shape ", io::detail::shape_string(t.shape),
          ", the model expects ", io::detail::shape_string(want));
    check(is_floating(t.type), file.source(), ": tensor '", name, "' has dtype ",
          dtype_name(t.type), ", expected F64, F32, BF16 or F16");
    // Staged on the host, then handed to the backend (an upload for a device backend).
    const std::vector<T> host = file.template read<T>(name);
    io::detail::store_parameter(params, i, std::span<const T>(host));
  }
}

/// Writes every parameter value of `params` under its Hugging Face name to `path` (a
/// .safetensors file, or a directory that receives model.safetensors) as `as` (default: the
/// set's value type, F32 or F64; BF16 / F16 round to nearest even).
template <ParameterSet P>
void save_hf_weights(const std::filesystem::path& path, P& params,
                     std::optional<dtype> as = std::nullopt) {
  io::detail::save_spans(path, params, as, false);
}

/// Writes every parameter gradient under the parameter's Hugging Face name (parameters
/// without a gradient are skipped), as save_hf_weights does for values.
template <ParameterSet P>
void save_gradients(const std::filesystem::path& path, P& params,
                    std::optional<dtype> as = std::nullopt) {
  io::detail::save_spans(path, params, as, true);
}

}  // namespace tightfit
