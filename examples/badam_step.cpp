// badam_step.cpp: BAdam (block coordinate Adam, Luo, Yu, Li, NeurIPS 2024) over the decoder
// layers of a small model: one layer is trained at a time for K steps, and only that layer
// holds Adam moments and gradients; StreamBP stops the backward below it.
//
//   ./badam_step            prints per step the loss, the active block, the optimizer state
//                           and the lowest layer backpropagated; exits 1 unless the loss falls
#include <cstdio>
#include <vector>

#include "tightfit/backend/reference.hpp"
#include "tightfit/loss/sft.hpp"
#include "tightfit/nn/decoder_layer.hpp"
#include "tightfit/optim/optim.hpp"

using backend = tightfit::reference_backend<float>;

int main() {
  tightfit::model_config cfg;
  cfg.vocab_size = 40;
  cfg.hidden_size = 32;
  cfg.intermediate_size = 64;
  cfg.num_hidden_layers = 4;
  cfg.num_attention_heads = 4;
  cfg.num_key_value_heads = 2;
  cfg.head_dim = 8;
  backend be;
  tightfit::llama_model<backend> model(be, cfg);
  model.init_random(3, 0.05);

  // One block per decoder layer (embedding and head frozen), a fresh random order per pass,
  // K = 3 steps per block.
  auto blocks = tightfit::block_partition::by_layer(model.parameters());
  tightfit::adam_update_rule adam;
  adam.lr = 3e-3;
  tightfit::block_options options;
  options.switch_every = 3;
  tightfit::block_optimizer<tightfit::llama_model<backend>> badam(model, blocks, adam, {}, {},
                                                                  options);

  const tightfit::index_t batch = 2, seq = 24;
  std::vector<tightfit::token_id> ids;
  for (tightfit::index_t i = 0; i < batch * seq; ++i) ids.push_back((5 * i + i / 7) % 40);
  const auto targets = tightfit::shift_labels(ids, batch, seq);
  const tightfit::token_batch data{batch, seq, ids, targets, {}};

  tightfit::backward_options backward;  // StreamBP, 8 positions per chunk
  backward.chunk = 8;
  std::vector<double> losses;
  for (int step = 0; step < 12; ++step) {
    tightfit::sft_loss loss;
    const auto r = badam.step(data, loss, backward);
    losses.push_back(r.loss);
    std::printf("step %2d  loss %.4f  block %-8s  state %6zu bytes  backprop from layer %lld\n",
                step + 1, r.loss, blocks[static_cast<std::size_t>(r.block)].name.c_str(),
                badam.state_bytes(), static_cast<long long>(r.backward.lowest_layer));
  }
  return losses.back() < losses.front() ? 0 : 1;
}
