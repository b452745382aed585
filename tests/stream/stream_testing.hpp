// Helpers for the StreamBP tests: random small models and batches, gradient snapshots.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "tightfit/backend/reference.hpp"
#include "tightfit/loss/sft.hpp"
#include "tightfit/nn/model.hpp"
#include "tightfit/stream/backward.hpp"

namespace tightfit::testing {

/// A small random configuration.
inline model_config tiny_config(index_t heads, index_t kv_heads, bool qk_norm, bool tied,
                                index_t layers = 2) {
  model_config c;
  c.vocab_size = 37;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = layers;
  c.num_attention_heads = heads;
  c.num_key_value_heads = kv_heads;
  c.head_dim = 6;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 10000;
  c.qk_norm = qk_norm;
  c.tie_word_embeddings = tied;
  return c;
}

/// Random ids and targets for B sequences of length T; lengths given (may be empty).
struct random_batch {
  index_t batch = 1, seq_len = 1;
  std::vector<token_id> ids, targets;
  std::vector<index_t> lengths;

  random_batch(index_t b, index_t t, index_t vocab, std::vector<index_t> lens, std::uint64_t seed,
               double ignore_share = 0.2)
      : batch(b), seq_len(t), lengths(std::move(lens)) {
    std::mt19937_64 gen(seed);
    std::uniform_int_distribution<token_id> tok(0, vocab - 1);
    std::bernoulli_distribution ignore(ignore_share);
    for (index_t i = 0; i < b * t; ++i) {
      ids.push_back(tok(gen));
      targets.push_back(ignore(gen) ? ignore_index : tok(gen));
    }
  }
  token_batch view() const { return {batch, seq_len, ids, targets, lengths}; }
};

/// Every gradient of a parameter set, by parameter (empty when it has none).
template <class B>
std::vector<std::vector<double>> grads_of(parameter_set<B>& p) {
  std::vector<std::vector<double>> out;
  for (std::size_t i = 0; i < p.size(); ++i) {
    auto g = p.grad(i);
    out.emplace_back(g.begin(), g.end());
  }
  return out;
}

}  // namespace tightfit::testing
