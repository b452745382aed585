// tightfit/nn/config.hpp: the configuration of a Llama / Mistral / Qwen2 / Qwen3 / Gemma 2 /
// Gemma 3 decoder-only model.
//
// Field names are the Hugging Face config.json names. Invariants (checked by validate()):
// every extent >= 1, num_attention_heads % num_key_value_heads == 0, eps > 0, theta > 0, a known
// rope_type with the parameters it needs, sliding_window >= 0 and one sliding_layers entry per
// layer (or none); the Gemma-only fields (soft-capping, query_pre_attn_scalar,
// rope_local_base_freq) are zero unless the architecture is a Gemma one (is_gemma()).
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include "tightfit/core/error.hpp"
#include "tightfit/core/types.hpp"

namespace tightfit {

/// Hugging Face rope_scaling (rope_parameters in transformers 5): how the inverse frequencies
/// of RoPE are scaled. nn/rope.hpp computes them exactly as transformers' ROPE_INIT_FUNCTIONS.
struct rope_scaling_config {
  std::string rope_type = "default";  ///< default, linear, dynamic, yarn or llama3
  double factor = 1;                  ///< linear, dynamic, yarn, llama3
  /// llama3 (required) and yarn (0: max_position_embeddings): the pre-training context.
  index_t original_max_position_embeddings = 0;
  double low_freq_factor = 1;   ///< llama3
  double high_freq_factor = 4;  ///< llama3
  double attention_factor = 0;  ///< yarn: the scaling of cos and sin; 0: derived from factor
  double beta_fast = 32;        ///< yarn
  double beta_slow = 1;         ///< yarn
  double mscale = 0;            ///< yarn (0: unset)
  double mscale_all_dim = 0;    ///< yarn (0: unset)
  bool truncate = true;         ///< yarn: round the correction range to whole dimensions
};

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
  /// Biases on gate_proj, up_proj and down_proj (Llama's mlp_bias).
  bool mlp_bias = false;
  /// max_position_embeddings of config.json (0: not given); dynamic and yarn rope need it.
  index_t max_position_embeddings = 0;
  rope_scaling_config rope_scaling;
  /// Sliding-window attention: a query at p sees keys j with p - j < sliding_window (0: none).
  index_t sliding_window = 0;
  /// Which layers slide (Qwen2's max_window_layers, layer_types); empty: all of them.
  std::vector<bool> sliding_layers;
  // Gemma 2 / Gemma 3 (nn/gemma_layer.hpp; 0 means "not used"):
  /// Attention scores are scaled by query_pre_attn_scalar^-1/2 instead of head_dim^-1/2.
  double query_pre_attn_scalar = 0;
  /// Gemma 2: attention scores s -> cap tanh(s / cap) before the softmax (0: none).
  double attn_logit_softcapping = 0;
  /// Gemma 2 (and Gemma 3 when set): LM-head logits z -> cap tanh(z / cap) (0: none).
  double final_logit_softcapping = 0;
  /// Gemma 3: RoPE base of the sliding layers (default rope, no scaling); 0: as global layers.
  double rope_local_base_freq = 0;

  // The architecture facts: what an architecture changes outside its decoder layer's own
  // structure, read by the layers, the model, the LM head and compute_gradients (which branch
  // on none of the names). The shipped layer of each architecture: nn/architectures.hpp.

  /// Gemma 2 / Gemma 3 (Hugging Face Gemma2ForCausalLM / Gemma3ForCausalLM): the facts below and
  /// the Gemma decoder layer (four norms, GELU-tanh gated MLP).
  bool is_gemma() const {
    return architecture == "Gemma2ForCausalLM" || architecture == "Gemma3ForCausalLM";
  }
  /// The RMSNorm scale is norm_offset() + w with w as stored: 1 for Gemma (a zero weight is the
  /// identity), else 0 (the scale is w). Every norm of the model: the layers' and the final one.
  double norm_offset() const { return is_gemma() ? 1.0 : 0.0; }
  /// The factor on the embedding rows: sqrt(hidden_size) for Gemma (Hugging Face computes it in
  /// the model dtype), else 1.
  double embedding_multiplier() const {
    return is_gemma() ? std::sqrt(static_cast<double>(hidden_size)) : 1.0;
  }
  /// The attention scale of query . key: query_pre_attn_scalar^-1/2 (Gemma), else head_dim^-1/2.
  double attention_scale() const {
    return 1.0 / std::sqrt(query_pre_attn_scalar > 0 ? query_pre_attn_scalar
                                                     : static_cast<double>(head_dim));
  }

  /// The config whose RoPE fields layer l uses: sliding layers of a config with
  /// rope_local_base_freq (Gemma 3) rotate with that base and default rope, the others with
  /// rope_theta and rope_scaling (this config).
  model_config layer_rope_config(index_t l) const {
    model_config r = *this;
    if (rope_local_base_freq > 0 && layer_window(l) > 0) {
      r.rope_theta = rope_local_base_freq;
      r.rope_scaling = rope_scaling_config{};
    }
    return r;
  }

  index_t q_width() const { return num_attention_heads * head_dim; }   ///< H * hd
  index_t kv_width() const { return num_key_value_heads * head_dim; }  ///< Hkv * hd
  /// The attention window of layer l: sliding_window when the layer slides, else 0 (none).
  index_t layer_window(index_t l) const {
    if (sliding_window <= 0) return 0;
    if (sliding_layers.empty()) return sliding_window;
    return sliding_layers[static_cast<std::size_t>(l)] ? sliding_window : 0;
  }

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
    check(max_position_embeddings >= 0, "model_config: max_position_embeddings is ",
          max_position_embeddings, ", expected >= 0 (0: not given)");
    check(sliding_window >= 0, "model_config: sliding_window is ", sliding_window,
          ", expected >= 0 (0: none)");
    check(
        sliding_layers.empty() || static_cast<index_t>(sliding_layers.size()) == num_hidden_layers,
        "model_config: sliding_layers has ", sliding_layers.size(), " entries, expected ",
        num_hidden_layers, " (one per layer) or none");
    auto non_negative = [](const char* name, double v) {
      check(v >= 0 && std::isfinite(v), "model_config: ", name, " is ", v,
            ", expected a finite value >= 0 (0: not used)");
    };
    non_negative("query_pre_attn_scalar", query_pre_attn_scalar);
    non_negative("attn_logit_softcapping", attn_logit_softcapping);
    non_negative("final_logit_softcapping", final_logit_softcapping);
    non_negative("rope_local_base_freq", rope_local_base_freq);
    if (!is_gemma()) {
      const char* set = query_pre_attn_scalar > 0     ? "query_pre_attn_scalar"
                        : attn_logit_softcapping > 0  ? "attn_logit_softcapping"
                        : final_logit_softcapping > 0 ? "final_logit_softcapping"
                        : rope_local_base_freq > 0    ? "rope_local_base_freq"
                                                      : nullptr;
      check(set == nullptr, "model_config: ", set == nullptr ? "" : set, " is set, but ",
            architecture, " has no such option (Gemma2ForCausalLM / Gemma3ForCausalLM only)");
    }
    const rope_scaling_config& r = rope_scaling;
    const std::string& t = r.rope_type;
    check(t == "default" || t == "linear" || t == "dynamic" || t == "yarn" || t == "llama3",
          "model_config: rope_type \"", t,
          "\" is not supported (supported: default, linear, dynamic, yarn, llama3)");
    if (t == "default") return;
    check(r.factor > 0 && std::isfinite(r.factor), "model_config: rope_scaling factor is ",
          r.factor, ", expected a finite value > 0");
    if (t == "dynamic" || (t == "yarn" && r.original_max_position_embeddings == 0))
      check(max_position_embeddings >= 1, "model_config: rope_type \"", t,
            "\" needs max_position_embeddings");
    if (t == "llama3") {
      check(r.original_max_position_embeddings >= 1,
            "model_config: rope_type \"llama3\" needs original_max_position_embeddings");
      check(r.low_freq_factor > 0 && r.high_freq_factor > r.low_freq_factor,
            "model_config: llama3 low_freq_factor ", r.low_freq_factor, " and high_freq_factor ",
            r.high_freq_factor, ", expected 0 < low < high");
    }
    if (t == "yarn") {
      check(r.original_max_position_embeddings >= 0,
            "model_config: rope_scaling original_max_position_embeddings is ",
            r.original_max_position_embeddings, ", expected >= 0");
      check(r.attention_factor >= 0 && std::isfinite(r.attention_factor),
            "model_config: yarn attention_factor is ", r.attention_factor,
            ", expected >= 0 (0: derived)");
      check(r.beta_fast > 0 && r.beta_slow > 0, "model_config: yarn beta_fast ", r.beta_fast,
            " and beta_slow ", r.beta_slow, ", expected > 0");
    }
  }
};

}  // namespace tightfit
