// tightfit/nn/block_params.hpp: the parameters of a pre-norm decoder block (the block
// nn/streambp_layer.hpp runs): their positions in a parameter_set (block_params) and a layer's
// parameter table, one param_row per parameter: its Hugging Face name under "model.layers.N.",
// its shape (a Linear weight is (out, in)) and the slot of block_params that receives its
// position. Declaration (decoder_model), loading, layer_param_ids and the optimizers all read
// this one table; the rows every block shares (the attention half, the gated MLP) are written
// here once, in Hugging Face's order.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <utility>
#include <vector>

#include "tightfit/core/types.hpp"
#include "tightfit/nn/config.hpp"
#include "tightfit/nn/parameters.hpp"

namespace tightfit {

/// One row of a layer's parameter table: name, shape, and the field of the layer's parameter
/// struct P that receives its position. Declaration, loading, layer_param_ids and the
/// optimizers all read this one table.
template <class P>
struct param_row {
  param_spec spec;
  std::size_t P::*slot;
};

/// The activation of the block's gated MLP: SwiGLU silu(gate) * up (Llama / Qwen), GeGLU
/// gelu_tanh(gate) * up (Gemma; the backend's geglu kernels, GemmaBackend).
enum class glu_activation { silu, gelu_tanh };

/// Positions of a decoder block's parameters in a parameter_set; a layer's table fills the
/// slots it has. q_norm, k_norm only with
/// config.qk_norm; q/k/v biases with config.qkv_bias, the o bias with config.o_bias, the MLP's
/// with config.mlp_bias; attn_out_norm and mlp_out_norm only in a layer with post-norms.
struct block_params {
  std::size_t input_norm = 0, q_proj = 0, k_proj = 0, v_proj = 0, o_proj = 0;
  std::size_t q_norm = 0, k_norm = 0;
  std::size_t q_bias = 0, k_bias = 0, v_bias = 0, o_bias = 0;
  std::size_t gate_proj = 0, up_proj = 0, down_proj = 0;
  std::size_t gate_bias = 0, up_bias = 0, down_bias = 0;
  std::size_t mlp_norm = 0;       ///< before the MLP
  std::size_t attn_out_norm = 0;  ///< on the attention output (post-norms)
  std::size_t mlp_out_norm = 0;   ///< on the MLP output (post-norms)

  /// The attention half's rows of a layer's parameter table: input_layernorm, the q/k/v/o
  /// projections, their biases (config) and the q/k-norms (config), in Hugging Face's order.
  static std::vector<param_row<block_params>> attention_rows(const model_config& c);
  /// The gated MLP's rows: gate_proj, up_proj, down_proj and their biases (config.mlp_bias).
  static std::vector<param_row<block_params>> mlp_rows(const model_config& c);
  /// A layer's whole table: attention_rows, then the layer's own norms `norms` (those between
  /// the attention half and the MLP, in Hugging Face's order), then mlp_rows.
  static std::vector<param_row<block_params>> table(
      const model_config& c, std::initializer_list<param_row<block_params>> norms);
};

inline std::vector<param_row<block_params>> block_params::attention_rows(const model_config& c) {
  using P = block_params;
  const index_t d = c.hidden_size, q = c.q_width(), kv = c.kv_width();
  std::vector<param_row<P>> t{{{"input_layernorm.weight", {d}}, &P::input_norm},
                              {{"self_attn.q_proj.weight", {q, d}}, &P::q_proj},
                              {{"self_attn.k_proj.weight", {kv, d}}, &P::k_proj},
                              {{"self_attn.v_proj.weight", {kv, d}}, &P::v_proj},
                              {{"self_attn.o_proj.weight", {d, q}}, &P::o_proj}};
  if (c.qkv_bias) {
    t.push_back({{"self_attn.q_proj.bias", {q}}, &P::q_bias});
    t.push_back({{"self_attn.k_proj.bias", {kv}}, &P::k_bias});
    t.push_back({{"self_attn.v_proj.bias", {kv}}, &P::v_bias});
  }
  if (c.o_bias) t.push_back({{"self_attn.o_proj.bias", {d}}, &P::o_bias});
  if (c.qk_norm) {
    t.push_back({{"self_attn.q_norm.weight", {c.head_dim}}, &P::q_norm});
    t.push_back({{"self_attn.k_norm.weight", {c.head_dim}}, &P::k_norm});
  }
  return t;
}

inline std::vector<param_row<block_params>> block_params::mlp_rows(const model_config& c) {
  using P = block_params;
  const index_t d = c.hidden_size, f = c.intermediate_size;
  std::vector<param_row<P>> t{{{"mlp.gate_proj.weight", {f, d}}, &P::gate_proj},
                              {{"mlp.up_proj.weight", {f, d}}, &P::up_proj},
                              {{"mlp.down_proj.weight", {d, f}}, &P::down_proj}};
  if (c.mlp_bias) {
    t.push_back({{"mlp.gate_proj.bias", {f}}, &P::gate_bias});
    t.push_back({{"mlp.up_proj.bias", {f}}, &P::up_bias});
    t.push_back({{"mlp.down_proj.bias", {d}}, &P::down_bias});
  }
  return t;
}

inline std::vector<param_row<block_params>> block_params::table(
    const model_config& c, std::initializer_list<param_row<block_params>> norms) {
  auto t = attention_rows(c);
  t.insert(t.end(), norms.begin(), norms.end());
  for (auto& row : mlp_rows(c)) t.push_back(std::move(row));
  return t;
}

}  // namespace tightfit
