// tightfit/optim/lora_optimizer.hpp: LoRA fine-tuning (Hu et al., ICLR 2022, arXiv 2106.09685)
// as an optimizer of its own: an update rule (Adam / AdamW / SGD of update_rules.hpp) on the
// adapters of nn/lora.hpp, the base model frozen.
//
// Each step runs the backward (stream/backward.hpp) with every base parameter frozen
// (backward_options::frozen_params: no gradient buffer, no weight-gradient GEMM), no embedding
// or head gradient, and weight gradients asked of the layers that carry adapters, so the layers
// accumulate the adapters' gradients only, exactly
//     dB = s dW A^T,   dA = s B^T dW   (dW: the gradient of the merged weight W0 + s B A),
// computed without forming dW (nn/adapters.hpp). Backprop stops below the lowest adapted
// layer. The step's gradient computation is a training pass (lora_training_pass): with dropout,
// the adapters' inputs are dropped by masks keyed by the step count (the number of steps done
// before it) and the rows' place in the run (token_batch::first_row, set by train()), so a
// resumed run draws the masks the uninterrupted one drew. Memory: the adapters, their gradients and
// the rule's state (Adam: 2x) beside the frozen model; no gradient of the model is ever allocated.
//
// Interface of train() (optim/train.hpp): step, set_lr_factor, lr_factor, steps, state_bytes,
// save / load (optim/checkpoint.hpp: the adapters and the rule's moments). Gradient accumulation
// over micro-batches works (the adapters' gradients accumulate like any other); data parallelism
// over several ranks does not yet (the adapters' gradients are not reduced): an error.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "tightfit/backend/concept.hpp"
#include "tightfit/core/error.hpp"
#include "tightfit/nn/lora.hpp"
#include "tightfit/optim/block_optimizer.hpp"
#include "tightfit/optim/schedule.hpp"
#include "tightfit/optim/update_rules.hpp"
#include "tightfit/stream/backward.hpp"

namespace tightfit {

/// An update rule on the LoRA adapters of a frozen model (see the top comment). M: the model
/// (a TrainableModel whose layer takes adapters).
template <TrainableModel M, UpdateRule Update = adamw_update_rule>
class lora_optimizer {
 public:
  using model_type = M;
  using backend_type = typename M::backend_type;
  using T = typename backend_type::value_type;

  /// max_grad_norm > 0 clips the adapters' gradient to that global norm.
  lora_optimizer(lora_adapters<M>& adapters, Update update = {}, double max_grad_norm = 0)
      : adapters_(&adapters), update_(std::move(update)), max_grad_norm_(max_grad_norm) {
    check(max_grad_norm >= 0, "lora_optimizer: max_grad_norm is ", max_grad_norm,
          ", expected >= 0 (0: off)");
    update_.validate();
    auto& ap = adapters.parameters();
    for (std::size_t i = 0; i < ap.size(); ++i) ids_.push_back(i);
    state_ = rule_state<backend_type, Update>(ap, std::span<const std::size_t>(ids_), update_);
  }
  lora_optimizer(const lora_optimizer&) = delete;
  lora_optimizer& operator=(const lora_optimizer&) = delete;

  void set_lr_factor(double f) {
    check(f >= 0, "lora_optimizer: lr factor is ", f, ", expected >= 0");
    lr_factor_ = f;
  }
  double lr_factor() const { return lr_factor_; }
  std::int64_t steps() const { return state_.steps(); }
  /// Bytes of the rule's state (Adam: the two moments of every adapter).
  std::size_t state_bytes() const { return state_.bytes(); }
  lora_adapters<M>& adapters() const { return *adapters_; }

  /// The backward options of a LoRA step: `base` with the gradient control set (frozen base,
  /// no embedding or head gradient, weight gradients in the layers).
  backward_options lora_backward_options(const backward_options& base = {}) const {
    M& model = adapters_->model();
    backward_options opt = base;
    opt.layer_weight_grads.assign(static_cast<std::size_t>(model.config().num_hidden_layers), true);
    opt.embedding_grad = false;
    opt.head_grad = false;
    opt.lazy_layer_grads = false;
    opt.frozen_params = adapters_->frozen_base();
    return opt;
  }

  /// One step: zeroed adapter gradients, the backward (gradients(model, batch, objective,
  /// options), local by default), clipping when asked, the rule's update of the adapters.
  template <Objective O, class Gradients = local_gradients>
  step_result step(const token_batch& batch, O& objective, const backward_options& base = {},
                   Gradients&& gradients = {}) {
    if constexpr (requires { gradients.comm->size(); })
      check(gradients.comm->size() == 1, "lora_optimizer: data parallelism over ",
            gradients.comm->size(),
            " ranks is not supported (the adapters' gradients are not reduced)");
    check(adapters_->bound(), "lora_optimizer: the adapters were merged into the model");
    auto& ap = adapters_->parameters();
    for (std::size_t id : ids_) {
      ap.allocate_grad(id);
      ap.backend().fill(as_row(ap.grad(id)), T(0));
    }
    step_result res;
    {  // dropout (nn/lora_dropout.hpp) in this step's passes only, masks keyed by the step count
      lora_training_pass<lora_adapters<M>> pass(*adapters_,
                                                static_cast<std::uint64_t>(state_.steps()));
      res.backward = gradients(adapters_->model(), batch, objective, lora_backward_options(base));
    }
    res.loss = res.backward.loss;
    res.block = 0;
    if (max_grad_norm_ > 0)
      res.grad_norm = clip_grad_norm(ap, std::span<const std::size_t>(ids_), max_grad_norm_);
    state_.step(ap, update_, lr_factor_);
    return res;
  }

  /// Writes the adapters (lora.<PEFT name>) and the rule's state (optim.state.<name>.<k>,
  /// optim.lora_steps) to a safetensors-like writer (optim/checkpoint.hpp).
  template <class W>
  void save(W& w) const {
    auto& ap = adapters_->parameters();
    w.set_metadata("optim.format", "tightfit-lora-optimizer-1");
    w.set_metadata("optim.update", Update::name);
    w.set_metadata("optim.lora_rank", std::to_string(adapters_->config().rank));
    const std::vector<std::int64_t> steps{state_.steps()};
    w.add("optim.lora_steps", {1}, std::span<const std::int64_t>(steps));
    for (std::size_t i = 0; i < ap.size(); ++i) {
      const auto shape = ap.shape(i);
      w.add("lora." + ap.name(i), std::vector<index_t>(shape.begin(), shape.end()),
            std::span<const T>(host(ap.value(i))));
    }
    for (std::size_t i = 0; i < state_.size(); ++i) {
      auto bufs = state_.buffers(i);
      for (std::size_t k = 0; k < bufs.size(); ++k)
        w.add("optim.state." + ap.name(state_.param_id(i)) + "." + std::to_string(k),
              {bufs[k].size()}, std::span<const T>(host(bufs[k].span())));
    }
  }

  /// Restores what save() wrote; the rule and the rank must be those of the saved run.
  template <class R>
  void load(const R& r) {
    const auto& meta = r.metadata();
    auto get = [&](const std::string& key) -> std::string {
      auto it = meta.find(key);
      check(it != meta.end(), "lora_optimizer::load: no '", key, "' in the saved state");
      return it->second;
    };
    check(get("optim.format") == "tightfit-lora-optimizer-1",
          "lora_optimizer::load: the saved state is '", get("optim.format"),
          "', not a LoRA optimizer's");
    check(get("optim.update") == Update::name, "lora_optimizer::load: saved update rule is '",
          get("optim.update"), "', this optimizer uses '", Update::name, "'");
    check(get("optim.lora_rank") == std::to_string(adapters_->config().rank),
          "lora_optimizer::load: saved rank is ", get("optim.lora_rank"), ", this run has ",
          adapters_->config().rank);
    const auto steps = r.read_ints("optim.lora_steps");
    check(steps.size() == 1 && steps[0] >= 0, "lora_optimizer::load: bad optim.lora_steps");
    auto& ap = adapters_->parameters();
    for (std::size_t i = 0; i < ap.size(); ++i) read(r, "lora." + ap.name(i), ap.value(i));
    for (std::size_t i = 0; i < state_.size(); ++i) {
      auto bufs = state_.buffers(i);
      for (std::size_t k = 0; k < bufs.size(); ++k)
        read(r, "optim.state." + ap.name(state_.param_id(i)) + "." + std::to_string(k),
             bufs[k].span());
    }
    state_.set_steps(steps[0]);
  }

 private:
  std::vector<T> host(std::span<const T> s) const {
    std::vector<T> h(s.size());
    adapters_->parameters().backend().download(s, std::span<T>(h));
    return h;
  }
  template <class R>
  void read(const R& r, const std::string& name, std::span<T> dst) const {
    std::vector<T> h(dst.size());
    r.template read<T>(name, std::span<T>(h));
    for (std::size_t e = 0; e < h.size(); ++e)
      check(std::isfinite(static_cast<double>(h[e])), "lora_optimizer::load: tensor '", name,
            "' holds ", h[e], " at index ", e, " (not finite)");
    adapters_->parameters().backend().upload(std::span<const T>(h), dst);
  }

  lora_adapters<M>* adapters_;
  Update update_;
  double max_grad_norm_ = 0;
  std::vector<std::size_t> ids_;
  rule_state<backend_type, Update> state_;
  double lr_factor_ = 1.0;
};

}  // namespace tightfit
