// tightfit/optim/update_rules.hpp: the inner update rules of every optimizer (Adam, AdamW, SGD)
// and the per-run state they own.
//
// A rule is a small value type holding hyper-parameters (ensmallen style); rule_state<B, Rule>
// is the state created for EXACTLY the parameters it owns (the active block of a block
// coordinate optimizer, or every parameter for full training): `Rule::buffers()` buffers of
// each owned parameter's size, allocated through the backend so that they are counted, and one
// step count. Formulas are PyTorch's (torch.optim.Adam / AdamW / SGD), computed by the backend's
// adam_update / sgd_update kernels.
//
// AdamW decays only matrices: parameters with one dimension (norm weights), names containing
// "norm" and names ending in ".bias" get no weight decay (BAdam's reference code meant to do
// this but its name test never matches).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "tightfit/backend/concept.hpp"
#include "tightfit/core/error.hpp"
#include "tightfit/nn/parameters.hpp"

namespace tightfit {

/// True when weight decay applies to a parameter: a matrix that is neither a norm nor a bias.
inline bool decays(const std::string& name, std::size_t dims) {
  if (dims < 2) return false;
  if (name.find("norm") != std::string::npos) return false;
  return !(name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0);
}

/// Adam and AdamW: the same moments and kernel; they differ in how weight decay enters.
template <bool Decoupled>
struct adam_family_rule {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = Decoupled ? 0.01 : 0.0;
  static constexpr const char* name = Decoupled ? "adamw" : "adam";
  static constexpr bool decoupled = Decoupled;
  /// State buffers per parameter: m and v.
  index_t buffers() const { return 2; }
  /// Checks the hyper-parameters; errors start with the rule's name.
  void validate() const {
    check(lr >= 0, name, ": lr is ", lr, ", expected >= 0");
    check(beta1 >= 0 && beta1 < 1, name, ": beta1 is ", beta1, ", expected in [0, 1)");
    check(beta2 >= 0 && beta2 < 1, name, ": beta2 is ", beta2, ", expected in [0, 1)");
    check(eps > 0, name, ": eps is ", eps, ", expected > 0");
    check(weight_decay >= 0, name, ": weight_decay is ", weight_decay, ", expected >= 0");
  }
  /// One step of parameter `p` (bufs: m, v); `step` is 1 for the first update.
  template <OptimizerBackend B>
  void apply(B& be, std::span<typename B::value_type> p, std::span<const typename B::value_type> g,
             std::span<buffer_t<B>> bufs, std::int64_t step, double lr_factor, bool decay) const {
    using T = typename B::value_type;
    adam_hyper<T> h;
    h.lr = static_cast<T>(lr * lr_factor);
    h.beta1 = static_cast<T>(beta1);
    h.beta2 = static_cast<T>(beta2);
    h.eps = static_cast<T>(eps);
    h.weight_decay = static_cast<T>(decay ? weight_decay : 0.0);
    h.decoupled = decoupled;
    h.step = step;
    be.adam_update(p, g, bufs[0].span(), bufs[1].span(), h);
  }
};

/// Adam (torch.optim.Adam): L2 weight decay added to the gradient (default none).
using adam_update_rule = adam_family_rule<false>;
/// AdamW (torch.optim.AdamW): decoupled weight decay (default 0.01), none on norms and biases.
using adamw_update_rule = adam_family_rule<true>;

/// SGD (torch.optim.SGD without dampening or Nesterov), optional momentum and sign (signSGD).
struct sgd_update_rule {
  double lr = 1e-2;
  double momentum = 0;
  double weight_decay = 0;
  bool use_sign = false;
  static constexpr const char* name = "sgd";
  /// State buffers per parameter: the momentum buffer when momentum != 0, else none.
  index_t buffers() const { return momentum != 0 ? 1 : 0; }
  void validate() const {
    check(lr >= 0, name, ": lr is ", lr, ", expected >= 0");
    check(momentum >= 0 && momentum < 1, name, ": momentum is ", momentum, ", expected in [0, 1)");
    check(weight_decay >= 0, name, ": weight_decay is ", weight_decay, ", expected >= 0");
  }
  template <OptimizerBackend B>
  void apply(B& be, std::span<typename B::value_type> p, std::span<const typename B::value_type> g,
             std::span<buffer_t<B>> bufs, std::int64_t /*step*/, double lr_factor,
             bool decay) const {
    using T = typename B::value_type;
    sgd_hyper<T> h;
    h.lr = static_cast<T>(lr * lr_factor);
    h.momentum = static_cast<T>(momentum);
    h.weight_decay = static_cast<T>(decay ? weight_decay : 0.0);
    h.use_sign = use_sign;
    be.sgd_update(p, g, bufs.empty() ? std::span<T>{} : bufs[0].span(), h);
  }
};

/// An inner update rule: hyper-parameters, a state size and an apply step.
template <class R>
concept UpdateRule = requires(const R& r) {
  { r.buffers() } -> std::convertible_to<index_t>;
  { R::name } -> std::convertible_to<const char*>;
  r.validate();
};

/// The per-run state of `Rule` for exactly the parameters it owns (see the top comment).
template <StorageBackend B, UpdateRule Rule>
class rule_state {
 public:
  using T = typename B::value_type;

  rule_state() = default;
  /// Allocates `rule.buffers()` zeroed buffers for each parameter in `ids`.
  rule_state(parameter_set<B>& params, std::span<const std::size_t> ids, const Rule& rule) {
    const index_t nb = rule.buffers();
    for (std::size_t id : ids) {
      entry e{id, {}, decays(params.name(id), params.shape(id).size())};
      for (index_t k = 0; k < nb; ++k)
        e.bufs.push_back(params.backend().template allocate<T>(params.numel(id)));
      entries_.push_back(std::move(e));
    }
  }

  /// Applies one step to every owned parameter from its gradient (which must exist).
  void step(parameter_set<B>& params, const Rule& rule, double lr_factor) {
    ++step_;
    for (auto& e : entries_) {
      check(params.has_grad(e.id), "rule_state: parameter '", params.name(e.id),
            "' has no gradient");
      rule.apply(params.backend(), params.value(e.id), std::span<const T>(params.grad(e.id)),
                 std::span<buffer_t<B>>(e.bufs), step_, lr_factor, e.decay);
    }
  }

  /// Steps taken since the state was created.
  std::int64_t steps() const { return step_; }
  void set_steps(std::int64_t s) { step_ = s; }
  /// Bytes of every state buffer.
  std::size_t bytes() const {
    std::size_t n = 0;
    for (const auto& e : entries_)
      for (const auto& b : e.bufs) n += static_cast<std::size_t>(b.size()) * sizeof(T);
    return n;
  }
  std::size_t size() const { return entries_.size(); }
  std::size_t param_id(std::size_t i) const { return entries_[i].id; }
  std::span<buffer_t<B>> buffers(std::size_t i) { return entries_[i].bufs; }
  std::span<const buffer_t<B>> buffers(std::size_t i) const { return entries_[i].bufs; }

 private:
  struct entry {
    std::size_t id;
    std::vector<buffer_t<B>> bufs;  // each (numel of the parameter)
    bool decay;
  };
  std::vector<entry> entries_;
  std::int64_t step_ = 0;
};

}  // namespace tightfit
