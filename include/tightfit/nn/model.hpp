// tightfit/nn/model.hpp: a decoder-only transformer of the Llama / Qwen2 / Qwen3 family.
//
// Parameters live in one parameter_set under their Hugging Face names:
//   model.embed_tokens.weight (V, d), model.layers.N.* (see decoder_layer.hpp),
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
#include "tightfit/nn/decoder_layer.hpp"
#include "tightfit/nn/parameters.hpp"

namespace tightfit {

/// The model: configuration, parameters and the layers that read them.
template <Backend B>
class decoder_model {
 public:
  using T = typename B::value_type;

  decoder_model(B& backend, const model_config& config) : cfg_(config), params_(backend) {
    cfg_.validate();
    embed_ = params_.add("model.embed_tokens.weight", {cfg_.vocab_size, cfg_.hidden_size});
    for (index_t l = 0; l < cfg_.num_hidden_layers; ++l)
      decoder_layer<B>::declare(params_, cfg_, l);
    final_norm_ = params_.add("model.norm.weight", {cfg_.hidden_size});
    lm_head_ = cfg_.tie_word_embeddings
                   ? embed_
                   : params_.add("lm_head.weight", {cfg_.vocab_size, cfg_.hidden_size});
    layers_.reserve(static_cast<std::size_t>(cfg_.num_hidden_layers));
    for (index_t l = 0; l < cfg_.num_hidden_layers; ++l) layers_.emplace_back(params_, cfg_, l);
    set_norms_to_one();
  }

  decoder_model(const decoder_model&) = delete;
  decoder_model& operator=(const decoder_model&) = delete;

  /// Random initialisation: matrices and biases ~ N(0, std^2), norm weights
  /// 1 + N(0, norm_jitter^2) (norm_jitter > 0 makes tests exercise the norm-weight gradients).
  void init_random(std::uint64_t seed, double std = 0.02, double norm_jitter = 0.0) {
    std::mt19937_64 gen(seed);
    std::normal_distribution<double> dist(0.0, 1.0);
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const bool is_norm = is_norm_weight(i);
      std::vector<T> host(static_cast<std::size_t>(params_.numel(i)));
      for (auto& v : host)
        v = static_cast<T>(is_norm ? 1.0 + norm_jitter * dist(gen) : std * dist(gen));
      params_.backend().upload(std::span<const T>(host), params_.value(i));
    }
  }

  const model_config& config() const { return cfg_; }
  parameter_set<B>& parameters() { return params_; }
  const parameter_set<B>& parameters() const { return params_; }
  B& backend() const { return params_.backend(); }
  std::vector<decoder_layer<B>>& layers() { return layers_; }

  std::size_t embed_id() const { return embed_; }
  std::size_t final_norm_id() const { return final_norm_; }
  std::size_t lm_head_id() const { return lm_head_; }

  /// Positions in parameters() of layer l's parameters.
  std::vector<std::size_t> layer_param_ids(index_t l) const {
    const auto& p = layers_[static_cast<std::size_t>(l)].param_ids();
    std::vector<std::size_t> ids{p.input_norm, p.q_proj,    p.k_proj,  p.v_proj,   p.o_proj,
                                 p.post_norm,  p.gate_proj, p.up_proj, p.down_proj};
    if (cfg_.qk_norm) {
      ids.push_back(p.q_norm);
      ids.push_back(p.k_norm);
    }
    if (cfg_.qkv_bias) {
      ids.push_back(p.q_bias);
      ids.push_back(p.k_bias);
      ids.push_back(p.v_bias);
    }
    if (cfg_.o_bias) ids.push_back(p.o_bias);
    return ids;
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

  void set_norms_to_one() {
    for (std::size_t i = 0; i < params_.size(); ++i)
      if (is_norm_weight(i)) params_.backend().fill(as_row(params_.value(i)), T(1));
  }

  model_config cfg_;
  parameter_set<B> params_;
  std::size_t embed_ = 0, final_norm_ = 0, lm_head_ = 0;
  std::vector<decoder_layer<B>> layers_;
};

}  // namespace tightfit
