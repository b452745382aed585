// custom_layer.cpp: a decoder layer of your own (parallel_layer.hpp: parallel attention + MLP,
// written from backend kernels) in decoder_model<B, L>, trained under all three backward
// schedules; StreamBP's gradients equal plain backprop's.
//
//   ./custom_layer          prints each schedule's loss, peak activation bytes and the largest
//                           gradient difference from `full`; exits 1 if it exceeds 1e-10
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "parallel_layer.hpp"
#include "tightfit/backend/reference.hpp"
#include "tightfit/loss/sft.hpp"
#include "tightfit/nn/model.hpp"
#include "tightfit/stream/backward.hpp"

using backend = tightfit::reference_backend<double>;
using model_t = tightfit::decoder_model<backend, parallel_layer<backend>>;
static_assert(tightfit::DecoderLayer<parallel_layer<backend>, backend>);
static_assert(tightfit::DecoderModel<model_t>);

int main() {
  tightfit::model_config cfg;
  cfg.vocab_size = 50;
  cfg.hidden_size = 24;
  cfg.intermediate_size = 40;
  cfg.num_hidden_layers = 2;
  cfg.num_attention_heads = 4;
  cfg.num_key_value_heads = 2;
  cfg.head_dim = 6;
  cfg.qk_norm = false;  // parallel_layer has no q/k norm

  const tightfit::index_t batch = 2, seq = 20;
  std::vector<tightfit::token_id> ids;
  for (tightfit::index_t i = 0; i < batch * seq; ++i) ids.push_back((11 * i + 5) % cfg.vocab_size);
  const auto targets = tightfit::shift_labels(ids, batch, seq);
  const std::vector<tightfit::index_t> lengths{seq, seq - 6};  // right padding in row 1

  std::vector<double> reference;  // the full schedule's gradients, flattened
  double worst = 0;
  for (auto s : {tightfit::backward_schedule::full, tightfit::backward_schedule::checkpoint,
                 tightfit::backward_schedule::stream}) {
    backend be;
    model_t model(be, cfg);
    model.init_random(42, 0.2);
    tightfit::sft_loss loss;
    tightfit::backward_options opt;
    opt.sched = s;
    opt.chunk = 4;
    const auto r =
        tightfit::compute_gradients(model, {batch, seq, ids, targets, lengths}, loss, opt);
    std::vector<double> grads;
    auto& params = model.parameters();
    for (std::size_t i = 0; i < params.size(); ++i)
      grads.insert(grads.end(), params.grad(i).begin(), params.grad(i).end());
    double diff = 0;
    if (reference.empty()) reference = grads;
    for (std::size_t k = 0; k < grads.size(); ++k)
      diff = std::max(diff,
                      std::abs(grads[k] - reference[k]) / std::max(1e-12, std::abs(reference[k])));
    worst = std::max(worst, diff);
    std::printf("%-10s loss %.10f  peak activations %7zu bytes  max rel. grad diff %.2e\n",
                tightfit::to_string(s), r.loss, r.peak_activation_bytes, diff);
  }
  return worst <= 1e-10 ? 0 : 1;
}
