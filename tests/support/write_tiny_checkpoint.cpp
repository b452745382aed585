// Writes a tiny random Hugging Face checkpoint (config.json, model.safetensors; Qwen3 layout)
// into the directory argv[1], for the example programs' tests (examples/stream_gradients.cpp).
#include <cstdio>
#include <exception>
#include <filesystem>

#include "tightfit/backend/reference.hpp"
#include "tightfit/nn/decoder_layer.hpp"
#include "tightfit/nn/hf_model.hpp"
#include "tightfit/nn/model.hpp"

int main(int argc, char** argv) try {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  tightfit::model_config cfg;
  cfg.vocab_size = 96;
  cfg.hidden_size = 32;
  cfg.intermediate_size = 64;
  cfg.num_hidden_layers = 2;
  cfg.num_attention_heads = 4;
  cfg.num_key_value_heads = 2;
  cfg.head_dim = 8;
  cfg.tie_word_embeddings = true;
  tightfit::reference_backend<float> be;
  tightfit::llama_model<tightfit::reference_backend<float>> model(be, cfg);
  model.init_random(2024, 0.05, 0.1);
  std::filesystem::create_directories(argv[1]);
  tightfit::save_hf_config(cfg, argv[1]);
  tightfit::save_hf_weights(argv[1], model.parameters());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "write_tiny_checkpoint: %s\n", e.what());
  return 1;
}
