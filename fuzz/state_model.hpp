// The model and optimizer of fuzz_state and its seed generator: a one-layer Llama model small
// enough for a state file to be a few kilobytes, and BAdam over three one-tensor blocks (the
// norms; everything else frozen), so the state holds counters, the block sequence, the
// generator and the active block's Adam moments.
#pragma once

#include "tightfit/backend/reference.hpp"
#include "tightfit/nn/decoder_layer.hpp"
#include "tightfit/optim/block_optimizer.hpp"
#include "tightfit/optim/order.hpp"
#include "tightfit/optim/partition.hpp"
#include "tightfit/optim/train.hpp"

namespace tightfit::fuzzing {

using state_backend = reference_backend<float>;
using state_optimizer =
    block_optimizer<llama_model<state_backend>, adam_update_rule, runtime_order>;

inline model_config state_config() {
  model_config c;
  c.architecture = "LlamaForCausalLM";
  c.vocab_size = 5;
  c.hidden_size = 4;
  c.intermediate_size = 4;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 2;
  c.qk_norm = false;
  c.tie_word_embeddings = true;
  return c;
}

inline block_partition state_partition(const parameter_set<state_backend>& params) {
  return block_partition::by_regex(params,
                                   {{"head_norm", {"^model\\.norm\\."}},
                                    {"input_norm", {"input_layernorm"}},
                                    {"post_norm", {"post_attention_layernorm"}}},
                                   {"embed_tokens", "self_attn", "mlp"});
}

inline block_options state_options() {
  block_options o;
  o.switch_every = 2;
  o.seed = 7;
  return o;
}

/// Two rows of 4 tokens: the data set a resumed step reads from.
inline token_dataset state_data() {
  return token_dataset(2, 4, {1, 2, 3, 4, 0, 1, 2, 3});
}

}  // namespace tightfit::fuzzing
