// tightfit/nn/presets.hpp: named model configurations: the benchmark config of the StreamBP
// issue and the shapes of public Llama 3 / 3.1 / Qwen2.5 / Qwen3 / Gemma 3 checkpoints (for the
// planner; no weights).
#pragma once

#include <string>
#include <vector>

#include "tightfit/core/error.hpp"
#include "tightfit/nn/config.hpp"

namespace tightfit {

/// The names preset_config accepts.
inline std::vector<std::string> preset_names() {
  return {"qwen3-bench",  "small",      "qwen3-0.6b", "qwen3-4b",    "qwen3-8b",
          "qwen2.5-0.5b", "qwen2.5-7b", "llama3-8b",  "llama3.1-8b", "gemma3-4b"};
}

/// A named configuration; an unknown name is an error listing the known ones.
inline model_config preset_config(const std::string& name) {
  model_config c;  // qwen3-bench: Qwen3-proportioned, small enough for a 2-core CPU
  c.architecture = "Qwen3ForCausalLM";
  c.vocab_size = 32768;
  c.hidden_size = 512;
  c.intermediate_size = 1536;
  c.num_hidden_layers = 8;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 2;
  c.head_dim = 64;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 1e6;
  c.qk_norm = true;
  c.tie_word_embeddings = false;
  auto qwen3 = [&](index_t hidden, index_t inter, index_t layers, index_t heads, bool tied) {
    c.vocab_size = 151936;
    c.hidden_size = hidden;
    c.intermediate_size = inter;
    c.num_hidden_layers = layers;
    c.num_attention_heads = heads;
    c.num_key_value_heads = 8;
    c.head_dim = 128;
    c.tie_word_embeddings = tied;
  };
  if (name == "qwen3-bench") return c;
  if (name == "small") {
    c.num_hidden_layers = 4;
    c.vocab_size = 8192;
    return c;
  }
  if (name == "qwen3-0.6b") {
    qwen3(1024, 3072, 28, 16, true);
    return c;
  }
  if (name == "qwen3-4b") {
    qwen3(2560, 9728, 36, 32, true);
    return c;
  }
  if (name == "qwen3-8b") {
    qwen3(4096, 12288, 36, 32, false);
    return c;
  }
  auto qwen25 = [&](index_t vocab, index_t hidden, index_t inter, index_t layers, index_t heads,
                    index_t kv_heads, bool tied) {
    c.architecture = "Qwen2ForCausalLM";
    c.vocab_size = vocab;
    c.hidden_size = hidden;
    c.intermediate_size = inter;
    c.num_hidden_layers = layers;
    c.num_attention_heads = heads;
    c.num_key_value_heads = kv_heads;
    c.head_dim = hidden / heads;
    c.qk_norm = false;
    c.qkv_bias = true;
    c.tie_word_embeddings = tied;
  };
  if (name == "qwen2.5-0.5b") {
    qwen25(151936, 896, 4864, 24, 14, 2, true);
    return c;
  }
  if (name == "qwen2.5-7b") {
    qwen25(152064, 3584, 18944, 28, 28, 4, false);
    return c;
  }
  if (name == "llama3-8b" || name == "llama3.1-8b") {
    c.architecture = "LlamaForCausalLM";
    c.vocab_size = 128256;
    c.hidden_size = 4096;
    c.intermediate_size = 14336;
    c.num_hidden_layers = 32;
    c.num_attention_heads = 32;
    c.num_key_value_heads = 8;
    c.head_dim = 128;
    c.rms_norm_eps = 1e-5;
    c.rope_theta = 500000;
    c.qk_norm = false;
    c.max_position_embeddings = 8192;
    if (name == "llama3.1-8b") {  // 128K context through llama3 rope scaling
      c.max_position_embeddings = 131072;
      c.rope_scaling.rope_type = "llama3";
      c.rope_scaling.factor = 8;
      c.rope_scaling.low_freq_factor = 1;
      c.rope_scaling.high_freq_factor = 4;
      c.rope_scaling.original_max_position_embeddings = 8192;
    }
    return c;
  }
  if (name == "gemma3-4b") {  // google/gemma-3-4b-pt, its text_config
    c.architecture = "Gemma3ForCausalLM";
    c.vocab_size = 262208;
    c.hidden_size = 2560;
    c.intermediate_size = 10240;
    c.num_hidden_layers = 34;
    c.num_attention_heads = 8;
    c.num_key_value_heads = 4;
    c.head_dim = 256;
    c.rms_norm_eps = 1e-6;
    c.rope_theta = 1e6;
    c.rope_scaling.rope_type = "linear";
    c.rope_scaling.factor = 8;
    c.rope_local_base_freq = 1e4;
    c.query_pre_attn_scalar = 256;
    c.max_position_embeddings = 131072;
    c.sliding_window = 1024;
    c.sliding_layers.assign(34, false);
    for (index_t l = 0; l < 34; ++l)  // sliding_window_pattern 6: every 6th layer global
      c.sliding_layers[static_cast<std::size_t>(l)] = (l + 1) % 6 != 0;
    c.qk_norm = true;
    c.tie_word_embeddings = true;
    return c;
  }
  std::string known;
  for (const auto& n : preset_names()) known += (known.empty() ? "" : ", ") + n;
  fail("unknown preset '", name, "', expected one of ", known);
}

}  // namespace tightfit
