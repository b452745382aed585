// tightfit/nn/decoder_layer.hpp: the Llama / Mistral / Qwen2 / Qwen3 decoder layer, a StreamBP
// layer (nn/streambp_layer.hpp: the Layer protocol, the attention half, LoRA and the
// sequence-parallel ring come from the skeleton; StreamBP, Luo et al., NeurIPS 2025, arXiv
// 2506.03077; docs/streambp.md). This file states what the layer is: its parameter table, its
// norms, its activation (SwiGLU) and no post-norms:
//
//   h  = RMSNorm(X; g1)
//   Q  = h Wq^T + bq (H*hd), K = h Wk^T + bk, V = h Wv^T + bv (Hkv*hd); optional per-head
//        RMSNorm of Q and K; the biases are optional (config.qkv_bias: Qwen2)
//   Q, K = RoPE(Q, K)            O = causal GQA attention(Q, K, V)        (the skeleton)
//   X2 = X + O Wo^T + bo         h2 = RMSNorm(X2; g2)        (bo optional: config.o_bias)
//   Y  = X2 + (silu(h2 Wg^T + bg) * (h2 Wu^T + bu)) Wd^T + bd  (MLP biases: config.mlp_bias)
//
// RoPE uses the frequencies of nn/rope.hpp (Hugging Face rope_scaling) at each row's position:
// t, or position_ids[t] for packed sequences (sequence_batch). Attention is causal, limited to
// the layer's sliding window (config.layer_window) and, for packed sequences, to the query's
// own document (attention_mask::doc_start = t - position_ids[t]).
//
// Invariants: those of the skeleton (K/V once per layer, chunks last to first, gradients
// accumulated with beta = 1 GEMMs, frozen parameters run no weight-gradient GEMM, a recomputed
// chunk never holds its output rows).
#pragma once

#include <string>
#include <vector>

#include "tightfit/core/error.hpp"
#include "tightfit/nn/config.hpp"
#include "tightfit/nn/model.hpp"
#include "tightfit/nn/streambp_layer.hpp"

namespace tightfit {

/// One decoder layer over parameters held in a parameter_set: a DecoderLayer, LoraLayer and
/// SequenceParallelLayer (tests/core/test_concepts.cpp).
template <TransformerBackend B>
class decoder_layer : public streambp_layer<decoder_layer<B>, B> {
 public:
  using streambp_layer<decoder_layer<B>, B>::streambp_layer;

  /// The parameter table of a decoder layer: each row's name, shape and slot (Hugging Face's
  /// post_attention_layernorm is the block's pre-MLP norm, mlp_norm).
  static std::vector<param_row<block_params>> table(const model_config& c) {
    return block_params::table(
        c, {{{"post_attention_layernorm.weight", {c.hidden_size}}, &block_params::mlp_norm}});
  }
  static const char* name() { return "decoder_layer"; }
  /// The MLP's activation: SwiGLU, silu(gate) * up.
  static constexpr glu_activation activation = glu_activation::silu;
  /// The sublayers' outputs join the residual as they are.
  static constexpr bool post_norms = false;
  /// The config, unless its architecture needs another layer (Gemma).
  static const model_config& accept(const model_config& c) {
    check(!c.is_gemma(), "decoder_layer: ", c.architecture,
          " needs the Gemma layer: gemma_model<B> (nn/gemma_layer.hpp)");
    return c;
  }
};

/// The Llama / Mistral / Qwen2 / Qwen3 model: decoder_model over decoder_layer.
template <TransformerBackend B>
using llama_model = decoder_model<B, decoder_layer<B>>;

}  // namespace tightfit
