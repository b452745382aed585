// tightfit/nn/config.hpp: the configuration of a Llama / Qwen2 / Qwen3 decoder-only model.
//
// Field names are the Hugging Face config.json names. Invariants (checked by validate()):
// every extent >= 1, num_attention_heads % num_key_value_heads == 0, eps > 0, theta > 0.
#pragma once

#include <string>

#include "tightfit/core/error.hpp"
#include "tightfit/core/types.hpp"

namespace tightfit {

struct model_config {
  std::string architecture = "Qwen3ForCausalLM";  ///< Hugging Face "architectures"[0]
  index_t vocab_size = 32768;
  index_t hidden_size = 512;
  index_t intermediate_size = 1536;
  index_t num_hidden_layers = 8;
  index_t num_attention_heads = 8;
  index_t num_key_value_heads = 2;
  index_t head_dim = 64;  ///< may differ from hidden_size / num_attention_heads (Qwen3)
  double rms_norm_eps = 1e-6;
  double rope_theta = 1e6;
  bool tie_word_embeddings = false;
  bool qk_norm = true;  ///< Qwen3's per-head RMSNorm of q and k (q_norm / k_norm)
  /// Biases on q_proj, k_proj, v_proj (Qwen2 / Qwen2.5 always; Llama / Qwen3 with
  /// attention_bias: true). Added before the q/k norm, as in Hugging Face.
  bool qkv_bias = false;
  /// A bias on o_proj (Llama / Qwen3 with attention_bias: true; never in Qwen2).
  bool o_bias = false;

  index_t q_width() const { return num_attention_heads * head_dim; }   ///< H * hd
  index_t kv_width() const { return num_key_value_heads * head_dim; }  ///< Hkv * hd

  /// Throws tightfit::error naming the first invalid field.
  void validate() const {
    auto positive = [](const char* name, index_t v) {
      check(v >= 1, "model_config: ", name, " is ", v, ", expected >= 1");
    };
    positive("vocab_size", vocab_size);
    positive("hidden_size", hidden_size);
    positive("intermediate_size", intermediate_size);
    positive("num_hidden_layers", num_hidden_layers);
    positive("num_attention_heads", num_attention_heads);
    positive("num_key_value_heads", num_key_value_heads);
    positive("head_dim", head_dim);
    check(num_attention_heads % num_key_value_heads == 0, "model_config: num_attention_heads ",
          num_attention_heads, " is not a multiple of num_key_value_heads ", num_key_value_heads);
    check(head_dim % 2 == 0, "model_config: head_dim is ", head_dim, ", expected an even number");
    check(rms_norm_eps > 0, "model_config: rms_norm_eps is ", rms_norm_eps, ", expected > 0");
    check(rope_theta > 0, "model_config: rope_theta is ", rope_theta, ", expected > 0");
  }
};

}  // namespace tightfit
