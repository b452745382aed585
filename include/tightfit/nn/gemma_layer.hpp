// tightfit/nn/gemma_layer.hpp: the Gemma 2 / Gemma 3 decoder layer (Hugging Face's
// Gemma2DecoderLayer / Gemma3DecoderLayer), a StreamBP layer next to the Llama / Qwen one
// (nn/streambp_layer.hpp holds the protocol, the attention half, LoRA and the sequence-parallel
// ring; StreamBP, Luo et al., NeurIPS 2025, arXiv 2506.03077; docs/streambp.md, docs/models.md).
// This file states what the layer is: its parameter table, its norms, its activation (GeGLU) and
// post-norms:
//
//   N(x; w) = RMSNorm(x) * (1 + w)   (every norm of the layer: config.norm_offset() is 1)
//   h  = N(X; input_layernorm)
//   Q  = h Wq^T, K = h Wk^T, V = h Wv^T; Gemma 3: per-head N(Q; q_norm), N(K; k_norm)
//   Q, K = RoPE(Q, K)      (Gemma 3 sliding layers: rope_local_base_freq, no scaling)
//   O  = causal GQA attention(Q, K, V), scale query_pre_attn_scalar^-1/2, scores soft-capped
//        (Gemma 2: attn_logit_softcapping), the layer's sliding window   (the skeleton)
//   X2 = X + N(O Wo^T; post_attention_layernorm)
//   h2 = N(X2; pre_feedforward_layernorm)
//   Y  = X2 + N((gelu_tanh(h2 Wg^T) * (h2 Wu^T)) Wd^T; post_feedforward_layernorm)
//
// Invariants: those of the skeleton (K/V once per layer, chunks last to first, gradients
// accumulated with beta = 1 GEMMs); the (1 + w) scales (config.norm_offset() is 1) are small
// copies (nn/norm_weight.hpp) whose gradient is w's.
#pragma once

#include <string>
#include <vector>

#include "tightfit/core/error.hpp"
#include "tightfit/nn/config.hpp"
#include "tightfit/nn/model.hpp"
#include "tightfit/nn/streambp_layer.hpp"

namespace tightfit {

/// One Gemma 2 / Gemma 3 decoder layer over parameters held in a parameter_set: a DecoderLayer,
/// LoraLayer and SequenceParallelLayer (tests/core/test_concepts.cpp).
template <GemmaBackend B>
class gemma_layer : public streambp_layer<gemma_layer<B>, B> {
 public:
  using streambp_layer<gemma_layer<B>, B>::streambp_layer;

  /// The parameter table of a Gemma layer (names under "model.layers.N.", shapes, slots):
  /// post_attention_layernorm norms the attention output (attn_out_norm),
  /// pre_feedforward_layernorm is the pre-MLP norm (mlp_norm), post_feedforward_layernorm norms
  /// the MLP output (mlp_out_norm).
  static std::vector<param_row<block_params>> table(const model_config& c) {
    using P = block_params;
    const index_t d = c.hidden_size;
    return P::table(c, {{{"post_attention_layernorm.weight", {d}}, &P::attn_out_norm},
                        {{"pre_feedforward_layernorm.weight", {d}}, &P::mlp_norm},
                        {{"post_feedforward_layernorm.weight", {d}}, &P::mlp_out_norm}});
  }
  static const char* name() { return "gemma_layer"; }
  /// The MLP's activation: GeGLU, gelu_tanh(gate) * up.
  static constexpr glu_activation activation = glu_activation::gelu_tanh;
  /// The attention and MLP outputs are normed before they join the residual.
  static constexpr bool post_norms = true;
  /// The config, unless it is not a Gemma one (or asks for biases, which Gemma has none of).
  static const model_config& accept(const model_config& c) {
    check(c.is_gemma(), "gemma_layer: architecture ", c.architecture,
          " is not Gemma2ForCausalLM or Gemma3ForCausalLM");
    check(!c.qkv_bias && !c.o_bias && !c.mlp_bias, "gemma_layer: ", c.architecture,
          " has no biases (qkv_bias, o_bias and mlp_bias must be false)");
    return c;
  }
};

/// The Gemma 2 / Gemma 3 model: decoder_model over gemma_layer.
template <GemmaBackend B>
using gemma_model = decoder_model<B, gemma_layer<B>>;

}  // namespace tightfit
