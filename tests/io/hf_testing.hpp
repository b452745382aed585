// Helpers of the Hugging Face tests (test_hf.cpp, test_hf_save.cpp): a host-memory parameter set
// under Hugging Face names, a tiny configuration of each architecture, and value comparison.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "support/testing.hpp"
#include "tightfit/nn/config.hpp"
#include "tightfit/nn/parameters.hpp"

namespace tightfit::testing {

/// A host-memory ParameterSet (no backend): the seam load/save work against.
template <class T>
struct host_params {
  using value_type = T;
  struct entry {
    std::string name;
    std::vector<index_t> shape;
    std::vector<T> value, grad;
  };
  std::vector<entry> entries;

  void add(std::string name, std::vector<index_t> shape) {
    index_t n = 1;
    for (index_t e : shape) n *= e;
    entries.push_back(
        {std::move(name), std::move(shape), std::vector<T>(static_cast<std::size_t>(n)), {}});
  }
  std::size_t size() const { return entries.size(); }
  const std::string& name(std::size_t i) const { return entries[i].name; }
  std::span<const index_t> shape(std::size_t i) const { return entries[i].shape; }
  std::span<T> value(std::size_t i) { return entries[i].value; }
  std::span<T> grad(std::size_t i) { return entries[i].grad; }
  std::ptrdiff_t find(const std::string& name) const {
    for (std::size_t i = 0; i < entries.size(); ++i)
      if (entries[i].name == name) return static_cast<std::ptrdiff_t>(i);
    return -1;
  }
};
static_assert(ParameterSet<host_params<double>>);
static_assert(ParameterSet<host_params<float>>);

inline model_config tiny(const std::string& arch = "Qwen3ForCausalLM", bool tied = false) {
  model_config c;
  c.architecture = arch;
  c.vocab_size = 11;
  c.hidden_size = 8;
  c.intermediate_size = 12;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 6;  // != hidden / heads, as Qwen3 allows
  c.tie_word_embeddings = tied;
  c.qk_norm = arch == "Qwen3ForCausalLM";
  c.qkv_bias = arch == "Qwen2ForCausalLM";
  return c;
}

/// The parameters of a Llama / Qwen decoder under their Hugging Face names and shapes.
template <class T>
host_params<T> model_params(const model_config& c, std::uint64_t seed) {
  host_params<T> p;
  const index_t d = c.hidden_size, f = c.intermediate_size, hd = c.head_dim;
  p.add("model.embed_tokens.weight", {c.vocab_size, d});
  for (index_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string pre = "model.layers." + std::to_string(l) + ".";
    p.add(pre + "input_layernorm.weight", {d});
    p.add(pre + "self_attn.q_proj.weight", {c.q_width(), d});
    p.add(pre + "self_attn.k_proj.weight", {c.kv_width(), d});
    p.add(pre + "self_attn.v_proj.weight", {c.kv_width(), d});
    p.add(pre + "self_attn.o_proj.weight", {d, c.q_width()});
    if (c.qkv_bias) {
      p.add(pre + "self_attn.q_proj.bias", {c.q_width()});
      p.add(pre + "self_attn.k_proj.bias", {c.kv_width()});
      p.add(pre + "self_attn.v_proj.bias", {c.kv_width()});
    }
    if (c.o_bias) p.add(pre + "self_attn.o_proj.bias", {d});
    if (c.qk_norm) {
      p.add(pre + "self_attn.q_norm.weight", {hd});
      p.add(pre + "self_attn.k_norm.weight", {hd});
    }
    p.add(pre + "post_attention_layernorm.weight", {d});
    p.add(pre + "mlp.gate_proj.weight", {f, d});
    p.add(pre + "mlp.up_proj.weight", {f, d});
    p.add(pre + "mlp.down_proj.weight", {d, f});
  }
  p.add("model.norm.weight", {d});
  if (!c.tie_word_embeddings) p.add("lm_head.weight", {c.vocab_size, d});
  for (std::size_t i = 0; i < p.size(); ++i)
    tightfit::testing::fill_uniform<T>(p.value(i), seed + i);
  return p;
}

template <class A, class B>
bool same_values(A& a, B& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a.name(i) != b.name(i)) return false;
    const auto x = a.value(i);
    const auto y = b.value(i);
    if (!std::equal(x.begin(), x.end(), y.begin(), y.end())) return false;
  }
  return true;
}

}  // namespace tightfit::testing
