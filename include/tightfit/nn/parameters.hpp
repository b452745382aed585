// tightfit/nn/parameters.hpp: named parameters with gradients (the ParameterSet seam).
//
// Parameters carry their Hugging Face names ("model.layers.3.mlp.up_proj.weight") and shapes
// (HF layout: a Linear weight is (out_features, in_features)). Values and gradients live in
// backend buffers, so they are counted by the backend's memory_counter. A gradient buffer
// exists only while it is needed (allocate_grad / release_grad): frozen parameters hold none.
#pragma once

#include <concepts>
#include <cstddef>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "tightfit/backend/concept.hpp"
#include "tightfit/core/error.hpp"

namespace tightfit {

/// The Hugging Face names a decoder model's parameters live under, spelled here only: the model
/// declares and loads them, optim/partition.hpp groups them by layer.
namespace hf_names {
inline constexpr const char* embedding = "model.embed_tokens.weight";  ///< (V, d)
inline constexpr const char* final_norm = "model.norm.weight";         ///< (d)
inline constexpr const char* lm_head = "lm_head.weight";               ///< (V, d) unless tied
inline constexpr const char* layer_prefix_stem = "model.layers.";      ///< + N + "."
/// The name prefix of decoder layer l: "model.layers.<l>.".
inline std::string layer_prefix(index_t l) {
  return layer_prefix_stem + std::to_string(l) + ".";
}
}  // namespace hf_names

/// One row of a layer's parameter table (as llm.c's ParameterTensors): the name under the
/// layer's prefix ("mlp.up_proj.weight") and the shape (a Linear weight is (out, in)).
struct param_spec {
  std::string name;
  std::vector<index_t> shape;
};

/// Named tensors with optional gradients, addressed by position or by name.
template <class P>
concept ParameterSet = requires(P& p, const P& cp, std::size_t i, const std::string& name) {
  typename P::value_type;
  { cp.size() } -> std::convertible_to<std::size_t>;
  { cp.name(i) } -> std::convertible_to<const std::string&>;
  { cp.shape(i) } -> std::convertible_to<std::span<const index_t>>;
  { p.value(i) } -> std::same_as<std::span<typename P::value_type>>;
  { p.grad(i) } -> std::same_as<std::span<typename P::value_type>>;  // empty: no gradient
  { cp.find(name) } -> std::same_as<std::ptrdiff_t>;                 // -1 when absent
};

/// The parameter set of a model on backend B (values and gradients stored as storage_t<B>).
template <StorageBackend B>
class parameter_set {
 public:
  using value_type = storage_t<B>;

  explicit parameter_set(B& backend) : backend_(&backend) {}

  /// Adds a zero-initialised parameter; names must be unique. Returns its position.
  std::size_t add(std::string name, std::vector<index_t> shape) {
    check(!index_.contains(name), "parameter_set: duplicate parameter name '", name, "'");
    index_t count = 1;
    for (index_t e : shape) {
      check(e >= 1, "parameter_set: parameter '", name, "' has extent ", e, ", expected >= 1");
      count *= e;
    }
    index_.emplace(name, entries_.size());
    entries_.push_back(entry{
        std::move(name), std::move(shape), backend_->template allocate<value_type>(count), {}});
    return entries_.size() - 1;
  }

  std::size_t size() const { return entries_.size(); }
  const std::string& name(std::size_t i) const { return entries_[i].name; }
  std::span<const index_t> shape(std::size_t i) const { return entries_[i].shape; }
  index_t numel(std::size_t i) const { return entries_[i].value.size(); }
  std::span<value_type> value(std::size_t i) { return entries_[i].value.span(); }
  std::span<const value_type> value(std::size_t i) const { return entries_[i].value.span(); }
  std::span<value_type> grad(std::size_t i) { return entries_[i].grad.span(); }
  bool has_grad(std::size_t i) const { return !entries_[i].grad.empty(); }

  std::ptrdiff_t find(const std::string& name) const {
    auto it = index_.find(name);
    return it == index_.end() ? -1 : static_cast<std::ptrdiff_t>(it->second);
  }
  /// Position of `name`; throws tightfit::error naming it when absent.
  std::size_t at(const std::string& name) const {
    const std::ptrdiff_t i = find(name);
    check(i >= 0, "parameter_set: no parameter named '", name, "'");
    return static_cast<std::size_t>(i);
  }

  /// Gives parameter i a zeroed gradient buffer (kept if it exists).
  void allocate_grad(std::size_t i) {
    if (entries_[i].grad.empty())
      entries_[i].grad = backend_->template allocate<value_type>(numel(i));
  }
  /// Frees the gradient buffer of parameter i.
  void release_grad(std::size_t i) { entries_[i].grad = buffer_t<B>{}; }
  /// Sets every existing gradient to zero.
  void zero_grads() requires DenseBackend<B> {
    for (auto& e : entries_)
      if (!e.grad.empty()) backend_->fill(as_row(e.grad.span()), accum_t<B>(0));
  }
  /// Total number of scalars.
  index_t total_numel() const {
    index_t n = 0;
    for (const auto& e : entries_) n += e.value.size();
    return n;
  }

  B& backend() const { return *backend_; }

 private:
  struct entry {
    std::string name;
    std::vector<index_t> shape;
    buffer_t<B> value;
    buffer_t<B> grad;
  };
  B* backend_;
  std::vector<entry> entries_;
  std::unordered_map<std::string, std::size_t> index_;
};

}  // namespace tightfit
