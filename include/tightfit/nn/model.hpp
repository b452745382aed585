// tightfit/nn/model.hpp: a decoder-only transformer over any DecoderLayer L: the embedding, L's
// layers, the final norm and the LM head (nn/layer.hpp's DecoderModel). The shipped layers:
// decoder_layer (Llama / Mistral / Qwen2 / Qwen3, nn/decoder_layer.hpp: llama_model<B>) and
// gemma_layer (Gemma 2 / Gemma 3, nn/gemma_layer.hpp: gemma_model<B>); the one a config names:
// nn/architectures.hpp. The model-level architecture facts (the embedding multiplier, the
// norms' offset, the final logit soft-capping) are model_config's and are read where they act
// (stream/).
//
// Parameters live in one parameter_set under their Hugging Face names (nn/parameters.hpp's
// hf_names; each layer's rows come from L::parameter_table):
//   model.embed_tokens.weight (V, d), model.layers.N.* (the layer's table),
//   model.norm.weight (d), lm_head.weight (V, d) unless tie_word_embeddings (then the head
//   reads model.embed_tokens.weight and its gradient accumulates there).
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "tightfit/backend/concept.hpp"
#include "tightfit/nn/config.hpp"
#include "tightfit/nn/layer.hpp"
#include "tightfit/nn/parameters.hpp"

namespace tightfit {

/// The model: configuration, parameters and the layers that read them. L is the layer type
/// (any DecoderLayer: a shipped one or a user's own).
template <TransformerBackend B, class L>
requires DecoderLayer<L, B>
class decoder_model {
 public:
  using T = storage_t<B>;
  using A = accum_t<B>;
  using backend_type = B;
  using layer_type = L;

  decoder_model(B& backend, const model_config& config) : cfg_(config), params_(backend) {
    cfg_.validate();
    embed_ = params_.add(hf_names::embedding, {cfg_.vocab_size, cfg_.hidden_size});
    const auto table = L::parameter_table(cfg_);
    for (index_t l = 0; l < cfg_.num_hidden_layers; ++l) {
      const std::string prefix = hf_names::layer_prefix(l);
      std::vector<std::size_t> ids;
      for (const auto& row : table) ids.push_back(params_.add(prefix + row.name, row.shape));
      layer_ids_.push_back(std::move(ids));
    }
    final_norm_ = params_.add(hf_names::final_norm, {cfg_.hidden_size});
    lm_head_ = cfg_.tie_word_embeddings
                   ? embed_
                   : params_.add(hf_names::lm_head, {cfg_.vocab_size, cfg_.hidden_size});
    layers_.reserve(static_cast<std::size_t>(cfg_.num_hidden_layers));
    for (index_t l = 0; l < cfg_.num_hidden_layers; ++l) layers_.emplace_back(params_, cfg_, l);
    set_norms_to_one();
  }

  decoder_model(const decoder_model&) = delete;
  decoder_model& operator=(const decoder_model&) = delete;

  /// Random initialisation: matrices and biases ~ N(0, std^2), norm weights whose scale is
  /// 1 + N(0, norm_jitter^2) (w = 1 - norm_offset + N(0, norm_jitter^2): Gemma's (1 + w) norms
  /// get N(0, norm_jitter^2); norm_jitter > 0 makes tests exercise the norm-weight gradients).
  void init_random(std::uint64_t seed, double std = 0.02, double norm_jitter = 0.0) {
    std::mt19937_64 gen(seed);
    std::normal_distribution<double> dist(0.0, 1.0);
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const bool is_norm = is_norm_weight(i);
      std::vector<T> host(static_cast<std::size_t>(params_.numel(i)));
      for (auto& v : host)
        v = static_cast<T>(is_norm ? norm_one() + norm_jitter * dist(gen) : std * dist(gen));
      params_.backend().upload(std::span<const T>(host), params_.value(i));
    }
  }

  const model_config& config() const { return cfg_; }
  parameter_set<B>& parameters() { return params_; }
  const parameter_set<B>& parameters() const { return params_; }
  B& backend() const { return params_.backend(); }
  std::vector<L>& layers() { return layers_; }
  L& layer(index_t l) { return layers_[static_cast<std::size_t>(l)]; }

  std::size_t embed_id() const { return embed_; }
  std::size_t final_norm_id() const { return final_norm_; }
  std::size_t lm_head_id() const { return lm_head_; }

  /// Positions in parameters() of layer l's parameters, in the order of its parameter table.
  std::vector<std::size_t> layer_param_ids(index_t l) const {
    return layer_ids_[static_cast<std::size_t>(l)];
  }
  /// Positions of the head's parameters: final norm and lm_head (the embedding when tied).
  std::vector<std::size_t> head_param_ids() const { return {final_norm_, lm_head_}; }

 private:
  /// Norm weights are the vectors that are not biases.
  bool is_norm_weight(std::size_t i) const {
    const std::string& name = params_.name(i);
    const bool bias = name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
    return params_.shape(i).size() == 1 && !bias;
  }

  /// The stored norm weight whose scale is 1: 1 - norm_offset (0 for Gemma's (1 + w)).
  double norm_one() const { return 1.0 - cfg_.norm_offset(); }

  void set_norms_to_one() {
    for (std::size_t i = 0; i < params_.size(); ++i)
      if (is_norm_weight(i)) params_.backend().fill(as_row(params_.value(i)), A(norm_one()));
  }

  model_config cfg_;
  parameter_set<B> params_;
  std::size_t embed_ = 0, final_norm_ = 0, lm_head_ = 0;
  std::vector<std::vector<std::size_t>> layer_ids_;  // per layer, in table order
  std::vector<L> layers_;
};

}  // namespace tightfit
