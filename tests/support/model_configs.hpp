// Model configurations shared by the tests that compare backends or the tool on one small model
// (tests/cuda, tests/cli/test_cli_cuda.cpp): host-only, includable from nvcc translation units.
#pragma once

#include "tightfit/core/types.hpp"
#include "tightfit/nn/config.hpp"

namespace tightfit::testing {

/// A small Qwen3-style model: hidden 64, intermediate 96, 2 layers, GQA 8 / 2 heads of 16,
/// q/k-norm, RMSNorm eps 1e-6, RoPE theta 1e4, untied (Qwen3ForCausalLM); `vocab` tokens.
inline model_config small_gqa_config(index_t vocab) {
  model_config cfg;
  cfg.vocab_size = vocab;
  cfg.hidden_size = 64;
  cfg.intermediate_size = 96;
  cfg.num_hidden_layers = 2;
  cfg.num_attention_heads = 8;
  cfg.num_key_value_heads = 2;
  cfg.head_dim = 16;
  cfg.rms_norm_eps = 1e-6;
  cfg.rope_theta = 10000;
  cfg.qk_norm = true;
  return cfg;
}

}  // namespace tightfit::testing
