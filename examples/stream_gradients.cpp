// stream_gradients.cpp: StreamBP gradients of a Hugging Face checkpoint (Llama / Qwen2 / Qwen3:
// a directory with config.json and model.safetensors or a sharded index) on one sequence.
//
//   ./stream_gradients MODEL_DIR [SEQ_LEN=256] [CHUNK=64] [GRADS_OUT.safetensors]
//
// Prints the loss, the peak activation bytes against the planner's prediction, and the global
// gradient norm; with GRADS_OUT, writes every gradient under its Hugging Face name.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "tightfit/backend/eigen.hpp"
#include "tightfit/loss/sft.hpp"
#include "tightfit/nn/decoder_layer.hpp"
#include "tightfit/nn/hf_model.hpp"
#include "tightfit/stream/backward.hpp"
#include "tightfit/stream/planner.hpp"

int main(int argc, char** argv) try {
  if (argc < 2 || argc > 5) {
    std::fprintf(stderr, "usage: %s MODEL_DIR [SEQ_LEN] [CHUNK] [GRADS_OUT]\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  const tightfit::index_t seq = argc > 2 ? std::atoll(argv[2]) : 256;
  const tightfit::index_t chunk = argc > 3 ? std::atoll(argv[3]) : 64;

  // The model: config.json, then the weights by their Hugging Face names.
  const tightfit::model_config cfg = tightfit::load_hf_config(dir);
  tightfit::eigen_backend<float> be;
  tightfit::llama_model<tightfit::eigen_backend<float>> model(be, cfg);
  tightfit::load_hf_weights(dir, model.parameters());

  // One sequence of tokens (a tokenizer's output in real use); labels are the inputs.
  std::vector<tightfit::token_id> ids;
  for (tightfit::index_t t = 0; t < seq; ++t) ids.push_back((31 * t + 7) % cfg.vocab_size);
  const auto targets = tightfit::shift_labels(ids, 1, seq);

  tightfit::sft_loss loss;
  tightfit::backward_options opt;
  opt.sched = tightfit::backward_schedule::stream;
  opt.chunk = chunk;
  const auto r = tightfit::compute_gradients(model, {1, seq, ids, targets, {}}, loss, opt);
  const auto predicted =
      tightfit::predict_peak_activation_bytes<float>(cfg, 1, seq, opt, tightfit::sft_loss{});

  double norm2 = 0;
  auto& params = model.parameters();
  for (std::size_t i = 0; i < params.size(); ++i)
    for (float g : params.grad(i)) norm2 += double(g) * double(g);
  std::printf("loss %.6f  peak activations %.2f MiB (planner: %.2f MiB)  |grad| %.6g  %.3f s\n",
              r.loss, double(r.peak_activation_bytes) / 1048576.0, double(predicted) / 1048576.0,
              std::sqrt(norm2), r.seconds);
  if (argc > 4) tightfit::save_gradients(argv[4], params);
  return std::isfinite(r.loss) && norm2 > 0 ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "stream_gradients: %s\n", e.what());
  return 1;
}
