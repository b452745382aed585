// tightfit/optim/block_optimizer.hpp: block coordinate descent over a decoder model's parameter
// blocks, in the ensmallen style (policies as template parameters): BAdam (Luo, Yu, Li, NeurIPS
// 2024) and, with an expansion policy, BREAD (Luo et al., NeurIPS 2025).
//
//   block_optimizer<M, Update = adam_update_rule, Order = random_reshuffle,
//                   Expansion = no_expansion>
//
// M is any TrainableModel (nn/layer.hpp: a DecoderModel on a Backend), e.g. llama_model<B>,
// gemma_model<B> or decoder_model<B, L> over a user's own layer; the optimizer reads only the
// model's parameters, its layers' parameter positions and its config.
//
// One block of the partition is active at a time. It is updated by exactly K = switch_every
// optimizer steps (the first block too), then the order policy names the next block. On each
// switch the old block's update-rule state (and gradients) is freed and a fresh one is created
// for the new block only, so the optimizer state is Update::buffers() x the active block's
// parameters (Adam: 2x) plus the expansion's own state. A "switch" to the same block (one
// block, or fixed order) keeps the state: block_partition::whole + fixed_order is plain
// full-parameter Adam / AdamW / SGD.
//
// Each step tells the backward (stream/backward.hpp) which layers need weight gradients: the
// active block's, plus the expansion's inactive layers; backprop stops below the lowest of
// them, frozen layers run no weight-gradient GEMM. Expanded layers get their gradients lazily
// and are updated inside the backward as each becomes ready (see expansion.hpp). Gradient
// clipping (max_grad_norm > 0) applies to the active block's gradient. Gradients computed for
// parameters outside the active block (a block with only part of a layer or of the head) are
// freed after the step.
//
// save()/load() write and read the whole state (counters, order position and permutation, the
// generator, the active block's moments, the expansion state) through a safetensors-like writer
// and reader (optim/checkpoint.hpp), so that a resumed run continues bit for bit.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "tightfit/backend/concept.hpp"
#include "tightfit/core/error.hpp"
#include "tightfit/nn/layer.hpp"
#include "tightfit/optim/expansion.hpp"
#include "tightfit/optim/order.hpp"
#include "tightfit/optim/partition.hpp"
#include "tightfit/optim/schedule.hpp"
#include "tightfit/optim/update_rules.hpp"
#include "tightfit/stream/backward.hpp"

namespace tightfit {

/// Options shared by every block optimizer.
struct block_options {
  index_t switch_every = 50;  ///< K: optimizer steps per block, >= 1
  double max_grad_norm = 0;   ///< clip the active block's gradient to this norm; 0: off
  std::uint64_t seed = 1234;  ///< generator of the random order
};

/// What one optimizer step did.
struct step_result {
  double loss = 0;
  backward_result backward;
  index_t block = -1;     ///< the block that was updated
  bool switched = false;  ///< a new block became active before this step
  double grad_norm = -1;  ///< before clipping (when clipping is on)
};

/// How an optimizer step computes its gradients: in this process, on this batch (the default).
/// distributed/data_parallel.hpp's data_parallel(comm) computes them over the ranks of a
/// communicator instead, so that the same optimizer trains data-parallel.
struct local_gradients {
  template <class M, class O>
  backward_result operator()(M& model, const token_batch& batch, O& objective,
                             const backward_options& opt) const {
    return compute_gradients(model, batch, objective, opt);
  }
};

/// Block coordinate optimizer (see the top comment).
template <TrainableModel M, UpdateRule Update = adam_update_rule,
          BlockOrder Order = random_reshuffle, class Expansion = no_expansion>
class block_optimizer {
 public:
  using model_type = M;
  using backend_type = typename M::backend_type;
  using T = typename backend_type::value_type;
  using expansion_runner = typename Expansion::template runner<M>;

  block_optimizer(M& model, block_partition partition, Update update = {}, Order order = {},
                  Expansion expansion = {}, const block_options& options = {})
      : model_(&model),
        partition_(std::move(partition)),
        update_(std::move(update)),
        order_(std::move(order)),
        expansion_(std::move(expansion)),
        options_(options),
        rng_(options.seed),
        runner_(expansion_, model) {
    auto& params = model.parameters();
    check(options_.switch_every >= 1, "block_optimizer: switch_every (K) is ",
          options_.switch_every, ", expected >= 1");
    check(partition_.param_count() == params.size(), "block_optimizer: the partition covers ",
          partition_.param_count(), " parameters, the model has ", params.size());
    update_.validate();
    order_.validate(static_cast<index_t>(partition_.size()));
    const index_t nl = model.config().num_hidden_layers;
    // Where each parameter sits: layer l, embedding (-1) or head (-2).
    std::vector<index_t> group(params.size(), -2);
    for (index_t l = 0; l < nl; ++l)
      for (std::size_t id : model.layer_param_ids(l)) group[id] = l;
    group[model.embed_id()] = -1;
    for (const auto& b : partition_.blocks()) {
      block_info info;
      info.layers.assign(static_cast<std::size_t>(nl), false);
      info.lowest = nl;
      for (std::size_t id : b.ids) {
        const index_t g = group[id];
        if (g >= 0) {
          info.layers[static_cast<std::size_t>(g)] = true;
          info.lowest = std::min(info.lowest, g);
        } else if (g == -1) {
          info.embedding = true;
          info.lowest = -1;
          if (model.config().tie_word_embeddings) info.head = true;
        } else {
          info.head = true;
        }
      }
      info_.push_back(std::move(info));
    }
  }

  block_optimizer(const block_optimizer&) = delete;
  block_optimizer& operator=(const block_optimizer&) = delete;

  /// The learning-rate factor of the next steps (set by a schedule).
  void set_lr_factor(double f) {
    check(f >= 0, "block_optimizer: lr factor is ", f, ", expected >= 0");
    lr_factor_ = f;
  }
  double lr_factor() const { return lr_factor_; }

  /// One optimizer step on `batch`: switches block when due, runs the backward with the active
  /// block's (and the expansion's) gradients only, updates. `base` gives the schedule, chunk,
  /// head mode and temperature; its gradient-control fields are set here (its on_grads_ready,
  /// if any, is still called). `gradients(model, batch, objective, options)` computes the
  /// gradients (local_gradients: compute_gradients here; data_parallel(comm): over the ranks,
  /// where only the active block's gradients are reduced, and an expanded layer is updated with
  /// its reduced gradient).
  template <Objective O, class Gradients = local_gradients>
  step_result step(const token_batch& batch, O& objective, const backward_options& base = {},
                   Gradients&& gradients = {}) {
    step_result res;
    if (!started_) {
      start();
      res.switched = true;
    } else if (steps_in_block_ >= options_.switch_every) {
      res.switched = advance();
    }
    auto& params = model_->parameters();
    const block_info& info = info_[static_cast<std::size_t>(active_)];
    const index_t nl = model_->config().num_hidden_layers;

    backward_options opt = base;
    opt.layer_weight_grads = info.layers;
    opt.embedding_grad = info.embedding;
    opt.head_grad = info.head;
    std::vector<bool> expanded(static_cast<std::size_t>(nl), false);
    if constexpr (Expansion::expands) {
      bool any = false;
      for (index_t l = 0; l < nl; ++l) {
        const auto k = static_cast<std::size_t>(l);
        if (info.layers[k]) continue;
        if (expansion_.scope == expansion_scope::all || l > info.lowest) {
          expanded[k] = true;
          opt.layer_weight_grads[k] = true;
          any = true;
        }
      }
      if (any) opt.lazy_layer_grads = true;
    }
    std::function<void(const grads_ready&)> user = std::move(opt.on_grads_ready);
    opt.on_grads_ready = [&](const grads_ready& g) {
      if (g.what == grads_ready::kind::layer && expanded[static_cast<std::size_t>(g.layer)])
        runner_.apply_layer(g.layer, lr_factor_);
      if (user) user(g);
    };

    const auto& ids = active_ids();
    for (std::size_t id : ids)
      if (params.has_grad(id)) params.backend().fill(as_row(params.grad(id)), T(0));
    res.backward = gradients(*model_, batch, objective, opt);
    res.loss = res.backward.loss;
    // Gradients the backward produced outside the active block (partial layer or head).
    std::vector<bool> mine(params.size(), false);
    for (std::size_t id : ids) mine[id] = true;
    for (std::size_t i = 0; i < params.size(); ++i)
      if (!mine[i] && params.has_grad(i)) params.release_grad(i);
    if (options_.max_grad_norm > 0)
      res.grad_norm =
          clip_grad_norm(params, std::span<const std::size_t>(ids), options_.max_grad_norm);
    state_.step(params, update_, lr_factor_);
    ++steps_in_block_;
    ++total_steps_;
    res.block = active_;
    return res;
  }

  /// The active block (-1 before the first step).
  index_t active_block() const { return started_ ? active_ : -1; }
  const std::string& active_block_name() const {
    return partition_[static_cast<std::size_t>(active_)].name;
  }
  /// Steps taken in the active block / in total.
  std::int64_t steps_in_block() const { return steps_in_block_; }
  std::int64_t steps() const { return total_steps_; }
  /// Bytes of optimizer state: the update rule's for the active block plus the expansion's.
  std::size_t state_bytes() const { return state_.bytes() + runner_.bytes(); }
  const block_partition& partition() const { return partition_; }
  const block_options& options() const { return options_; }
  expansion_runner& expansion() { return runner_; }
  /// Layers that need weight gradients when block b is active (without expansion).
  const std::vector<bool>& block_layers(index_t b) const {
    return info_[static_cast<std::size_t>(b)].layers;
  }

  /// Writes the whole optimizer state (see the top comment) to a safetensors_writer.
  template <class W>
  void save(W& w) const {
    auto& params = model_->parameters();
    w.set_metadata("optim.format", "tightfit-block-optimizer-1");
    w.set_metadata("optim.update", Update::name);
    w.set_metadata("optim.expansion", Expansion::name);
    w.set_metadata("optim.blocks", std::to_string(partition_.size()));
    std::string names;
    for (const auto& b : partition_.blocks()) names += b.name + "\n";
    w.set_metadata("optim.block_names", names);
    std::ostringstream rng;
    rng << rng_;
    w.set_metadata("optim.rng", rng.str());
    const std::vector<std::int64_t> counters{
        started_ ? 1 : 0, active_,        steps_in_block_,      total_steps_, pass_,
        position_,        state_.steps(), options_.switch_every};
    w.add("optim.counters", {static_cast<index_t>(counters.size())},
          std::span<const std::int64_t>(counters));
    std::vector<std::int64_t> seq(sequence_.begin(), sequence_.end());
    w.add("optim.sequence", {static_cast<index_t>(seq.size())}, std::span<const std::int64_t>(seq));
    const auto& st = state_;
    for (std::size_t i = 0; i < st.size(); ++i) {
      const std::size_t id = st.param_id(i);
      auto bufs = st.buffers(i);
      for (std::size_t k = 0; k < bufs.size(); ++k) {
        std::vector<T> h(static_cast<std::size_t>(bufs[k].size()));
        params.backend().download(std::span<const T>(bufs[k].span()), std::span<T>(h));
        w.add("optim.state." + params.name(id) + "." + std::to_string(k),
              {static_cast<index_t>(h.size())}, std::span<const T>(h));
      }
    }
    runner_.save(w);
  }

  /// Restores the state written by save(); the partition, update rule and expansion must be
  /// those of the saved run (an error names the difference).
  template <class R>
  void load(const R& r) {
    auto& params = model_->parameters();
    const auto& meta = r.metadata();
    auto get = [&](const std::string& key) -> const std::string& {
      auto it = meta.find(key);
      check(it != meta.end(), "block_optimizer::load: no '", key, "' in the saved state");
      return it->second;
    };
    check(get("optim.format") == "tightfit-block-optimizer-1",
          "block_optimizer::load: unknown format '", get("optim.format"), "'");
    check(get("optim.update") == Update::name, "block_optimizer::load: saved update rule is '",
          get("optim.update"), "', this optimizer uses '", Update::name, "'");
    check(get("optim.expansion") == Expansion::name, "block_optimizer::load: saved expansion is '",
          get("optim.expansion"), "', this optimizer uses '", Expansion::name, "'");
    std::string names;
    for (const auto& b : partition_.blocks()) names += b.name + "\n";
    check(get("optim.block_names") == names,
          "block_optimizer::load: the saved partition has other blocks (", get("optim.blocks"),
          " saved, ", partition_.size(), " here)");
    const auto c = r.read_ints("optim.counters");
    check(c.size() == 8, "block_optimizer::load: optim.counters has ", c.size(),
          " entries, expected 8");
    const auto seq = r.read_ints("optim.sequence");
    const auto nb = static_cast<std::int64_t>(partition_.size());
    for (auto b : seq)
      check(b >= 0 && b < nb, "block_optimizer::load: saved block ", b, " outside [0, ", nb, ")");
    check(c[1] >= 0 && c[1] < nb, "block_optimizer::load: saved active block ", c[1],
          " outside [0, ", nb, ")");
    // Every counter in range before any is used (a negative position or step count would
    // index outside the block sequence or the data set).
    const char* field[] = {"started", "active block", "steps in block", "total steps",
                           "pass",    "position",     "update steps",   "switch_every"};
    for (std::size_t k = 0; k < c.size(); ++k)
      check(c[k] >= 0, "block_optimizer::load: optim.counters[", k, "] (", field[k], ") is ", c[k],
            ", expected >= 0");
    check(c[0] <= 1, "block_optimizer::load: optim.counters[0] (started) is ", c[0],
          ", expected 0 or 1");
    check(c[7] >= 1, "block_optimizer::load: optim.counters[7] (switch_every) is ", c[7],
          ", expected >= 1");
    check(static_cast<std::int64_t>(seq.size()) <= nb, "block_optimizer::load: optim.sequence has ",
          seq.size(), " entries, more than the ", nb, " blocks");
    if (c[0] != 0) {
      check(c[5] < static_cast<std::int64_t>(seq.size()),
            "block_optimizer::load: optim.counters[5] (position) is ", c[5],
            ", outside the saved sequence of ", seq.size(), " blocks");
      check(seq[static_cast<std::size_t>(c[5])] == c[1],
            "block_optimizer::load: optim.counters[1] (active block) is ", c[1],
            ", but the saved sequence has block ", seq[static_cast<std::size_t>(c[5])],
            " at position ", c[5]);
    }
    std::istringstream in(get("optim.rng"));
    in >> rng_;
    check(!in.fail(), "block_optimizer::load: bad saved generator state");
    started_ = c[0] != 0;
    steps_in_block_ = c[2];
    total_steps_ = c[3];
    pass_ = c[4];
    position_ = c[5];
    sequence_.assign(seq.begin(), seq.end());
    if (started_) {
      activate(static_cast<index_t>(c[1]));
      steps_in_block_ = c[2];
      state_.set_steps(c[6]);
      for (std::size_t i = 0; i < state_.size(); ++i) {
        auto bufs = state_.buffers(i);
        for (std::size_t k = 0; k < bufs.size(); ++k) {
          std::vector<T> h(static_cast<std::size_t>(bufs[k].size()));
          const std::string name =
              "optim.state." + params.name(state_.param_id(i)) + "." + std::to_string(k);
          r.template read<T>(name, std::span<T>(h));
          for (std::size_t e = 0; e < h.size(); ++e)
            check(std::isfinite(static_cast<double>(h[e])), "block_optimizer::load: tensor '", name,
                  "' holds ", h[e], " at index ", e, " (not finite)");
          params.backend().upload(std::span<const T>(h), bufs[k].span());
        }
      }
    }
    runner_.load(r);
  }

 private:
  struct block_info {
    std::vector<bool> layers;  // per decoder layer: holds a parameter of the block
    bool embedding = false, head = false;
    index_t lowest = 0;  // lowest layer of the block; -1 embedding; L: head only
  };

  const std::vector<std::size_t>& active_ids() const {
    return partition_[static_cast<std::size_t>(active_)].ids;
  }

  void start() {
    started_ = true;
    pass_ = 0;
    position_ = 0;
    order_.fill_pass(sequence_, static_cast<index_t>(partition_.size()), pass_, rng_);
    activate(sequence_.front());
  }

  /// Moves to the next block in the order; true when it differs from the active one.
  bool advance() {
    ++position_;
    if (position_ >= static_cast<std::int64_t>(sequence_.size())) {
      ++pass_;
      position_ = 0;
      order_.fill_pass(sequence_, static_cast<index_t>(partition_.size()), pass_, rng_);
    }
    const index_t next = sequence_[static_cast<std::size_t>(position_)];
    steps_in_block_ = 0;
    if (next == active_) return false;  // same block: keep its state
    activate(next);
    return true;
  }

  /// Frees the old block's state and gradients, creates a fresh state for block b.
  void activate(index_t b) {
    auto& params = model_->parameters();
    state_ = rule_state<backend_type, Update>{};  // freed before the new one is allocated
    for (std::size_t i = 0; i < params.size(); ++i)
      if (params.has_grad(i)) params.release_grad(i);
    active_ = b;
    steps_in_block_ = 0;
    const auto& ids = active_ids();
    state_ = rule_state<backend_type, Update>(params, std::span<const std::size_t>(ids), update_);
  }

  M* model_;
  block_partition partition_;
  Update update_;
  Order order_;
  Expansion expansion_;
  block_options options_;
  std::mt19937_64 rng_;
  expansion_runner runner_;
  std::vector<block_info> info_;
  rule_state<backend_type, Update> state_;
  std::vector<index_t> sequence_;  // the current pass
  bool started_ = false;
  index_t active_ = 0;
  std::int64_t steps_in_block_ = 0, total_steps_ = 0, pass_ = 0, position_ = 0;
  double lr_factor_ = 1.0;
};

/// Full-parameter training with one update rule (Adam, AdamW, SGD): one block, never switched.
template <TrainableModel M, UpdateRule Update = adam_update_rule>
using full_optimizer = block_optimizer<M, Update, fixed_order, no_expansion>;

/// A full optimizer over every parameter of `model`.
template <UpdateRule Update, TrainableModel M>
full_optimizer<M, Update> make_full_optimizer(M& model, Update update = {},
                                              double max_grad_norm = 0) {
  block_options o;
  o.switch_every = 1;
  o.max_grad_norm = max_grad_norm;
  return full_optimizer<M, Update>(model, block_partition::whole(model.parameters()),
                                   std::move(update), fixed_order{0}, no_expansion{}, o);
}

}  // namespace tightfit
