// tightfit/optim/zero1.hpp: an optimizer whose state is sharded over the ranks (ZeRO stage 1,
// Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models",
// SC 2020).
//
// The owned parameters, in order, form one flat vector of n values, cut into N equal shards of
// s = ceil(n / N) (the last one padded). Rank r keeps the update rule's state (Adam's m and v)
// for shard r only: 1/N of the state of one process. One step:
//   1. pack every owned gradient (each rank's own sum, from step_gradients with
//      gradient_sync::none) into a flat (N*s) buffer and reduce_scatter_sum it: rank r receives
//      the summed gradient of its shard (s);
//   2. apply the rule to the parameter pieces of its shard (elementwise, with each parameter's
//      weight-decay flag, so the result equals the rule applied to whole parameters);
//      the staging buffers are counted by the backend's memory counter (host backends);
//   3. all_gather the updated shards (N*s) and unpack them into every parameter.
// Traffic per step and rank: a reduce-scatter and an all-gather of n values, the same as one
// all-reduce; memory: the state of s values plus one flat (N*s) staging buffer while stepping.
// Gradient clipping (max_grad_norm > 0) takes the global norm from the shards' sums of squares
// (one all-reduce of one double) and scales the shard before the rule, as clip_grad_norm does.
//
// save() / load(): each rank writes its own shard (and the step count, the rank, the rank count)
// through a TensorWriter (optim/checkpoint.hpp): a run of N ranks saves N files, one state file
// set, and resumes only on N ranks (load names both counts otherwise).
//
// zero1_full_optimizer<M, Rule, C> trains every parameter of a decoder model M (any
// TrainableModel) this way with the optimizer interface of block_optimizer (step(batch, objective,
// backward, gradients), lr factor, steps, state_bytes, save / load), so that train()
// (optim/train.hpp) drives it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "tightfit/core/error.hpp"
#include "tightfit/core/memory.hpp"
#include "tightfit/distributed/communicator.hpp"
#include "tightfit/distributed/data_parallel.hpp"
#include "tightfit/nn/layer.hpp"
#include "tightfit/nn/parameters.hpp"
#include "tightfit/optim/block_optimizer.hpp"
#include "tightfit/optim/update_rules.hpp"

namespace tightfit {

/// The update rule `Rule` over `ids` of a parameter set, with its state sharded over `comm`.
template <OptimizerBackend B, UpdateRule Rule, Communicator C>
class zero1_optimizer {
 public:
  using T = typename B::value_type;

  zero1_optimizer(parameter_set<B>& params, std::span<const std::size_t> ids, Rule rule, C& comm)
      : params_(&params), ids_(ids.begin(), ids.end()), rule_(rule), comm_(&comm) {
    rule_.validate();
    index_t n = 0;
    for (std::size_t id : ids_) n += params.numel(id);
    const index_t ranks = comm.size();
    shard_ = (n + ranks - 1) / ranks;
    total_ = n;
    // The pieces of parameters that fall into this rank's shard [lo, hi) of the flat vector.
    const index_t lo = std::min(n, shard_ * comm.rank()), hi = std::min(n, lo + shard_);
    index_t flat = 0;
    for (std::size_t id : ids_) {
      const index_t size = params.numel(id);
      const index_t a = std::max(lo, flat), b = std::min(hi, flat + size);
      if (a < b) {
        segment seg{id, a - flat, b - a, a - lo, decays(params.name(id), params.shape(id).size()),
                    {}};
        for (index_t k = 0; k < rule_.buffers(); ++k)
          seg.bufs.push_back(params.backend().template allocate<T>(b - a));
        segments_.push_back(std::move(seg));
      }
      flat += size;
    }
  }

  /// One step from the gradients each rank holds (summed over the ranks here). With
  /// max_grad_norm > 0 the summed gradient is clipped to that global norm first. Returns the
  /// norm before clipping (-1 when clipping is off).
  double step(double lr_factor = 1.0, double max_grad_norm = 0) {
    auto& params = *params_;
    const auto ranks = static_cast<std::size_t>(comm_->size());
    const auto s = static_cast<std::size_t>(shard_);
    memory_counter& memory = params.backend().memory();
    host_buffer<T> flat_buf(memory, static_cast<index_t>(ranks * s));  // (N*s) grads, then params
    host_buffer<T> mine_buf(memory, shard_);                           // (s) this rank's shard
    const std::span<T> flat = flat_buf.span(), mine = mine_buf.span();
    std::fill(flat.begin(), flat.end(), T(0));
    std::size_t at = 0;
    for (std::size_t id : ids_) {
      check(params.has_grad(id), "zero1_optimizer: parameter '", params.name(id),
            "' has no gradient");
      auto g = params.grad(id);
      std::copy(g.begin(), g.end(), flat.begin() + static_cast<std::ptrdiff_t>(at));
      at += g.size();
    }
    comm_->reduce_scatter_sum(std::span<const T>(flat), mine);
    double norm = -1;
    if (max_grad_norm > 0) {
      double squares = 0;  // the padding is zero
      for (T v : mine) squares += static_cast<double>(v) * static_cast<double>(v);
      comm_->all_reduce_sum(std::span<double>(&squares, 1)).wait();
      norm = std::sqrt(squares);
      const double factor = max_grad_norm / (norm + 1e-6);  // clip_grad_norm's
      if (factor < 1)
        for (T& v : mine) v *= static_cast<T>(factor);
    }
    ++step_;
    for (auto& seg : segments_) {
      auto p = params.value(seg.id).subspan(static_cast<std::size_t>(seg.offset),
                                            static_cast<std::size_t>(seg.length));
      const std::span<const T> g(mine.data() + seg.shard_offset,
                                 static_cast<std::size_t>(seg.length));
      rule_.apply(params.backend(), p, g, std::span<buffer_t<B>>(seg.bufs), step_, lr_factor,
                  seg.decay);
      std::copy(p.begin(), p.end(), mine.begin() + seg.shard_offset);
    }
    comm_->all_gather(std::span<const T>(mine), flat);
    at = 0;
    for (std::size_t id : ids_) {
      auto v = params.value(id);
      std::copy(flat.begin() + static_cast<std::ptrdiff_t>(at),
                flat.begin() + static_cast<std::ptrdiff_t>(at + v.size()), v.begin());
      at += v.size();
    }
    return norm;
  }

  /// Writes this rank's shard of the state (see the top comment): metadata optim.format,
  /// optim.update, dist.ranks, dist.rank; optim.zero1.counters (step, ranks, rank, shard size,
  /// total size, buffers) and optim.zero1.state.K (shard size values each, zero padded).
  template <class W>
  void save(W& w) const {
    auto& params = *params_;
    w.set_metadata("optim.format", "tightfit-zero1-1");
    w.set_metadata("optim.update", Rule::name);
    w.set_metadata("dist.ranks", std::to_string(comm_->size()));
    w.set_metadata("dist.rank", std::to_string(comm_->rank()));
    const std::vector<std::int64_t> counters{step_,  comm_->size(), comm_->rank(),
                                             shard_, total_,        rule_.buffers()};
    w.add("optim.zero1.counters", {static_cast<index_t>(counters.size())},
          std::span<const std::int64_t>(counters));
    for (index_t k = 0; k < rule_.buffers(); ++k) {
      std::vector<T> h(static_cast<std::size_t>(shard_), T(0));
      for (const auto& seg : segments_) {
        const auto& buf = seg.bufs[static_cast<std::size_t>(k)];
        params.backend().download(
            std::span<const T>(buf.span()),
            std::span<T>(h.data() + seg.shard_offset, static_cast<std::size_t>(seg.length)));
      }
      w.add("optim.zero1.state." + std::to_string(k), {shard_}, std::span<const T>(h));
    }
  }

  /// Restores this rank's shard written by save() on the same rank of a run with as many ranks
  /// (an error names the source and what differs).
  template <class R>
  void load(const R& r) {
    auto& params = *params_;
    const auto& meta = r.metadata();
    auto get = [&](const std::string& key) -> std::string {
      auto it = meta.find(key);
      check(it != meta.end(), r.source(), ": no '", key, "' in the saved state");
      return it->second;
    };
    check(get("optim.format") == "tightfit-zero1-1", r.source(), ": the optimizer state is '",
          get("optim.format"), "', expected a ZeRO-1 shard (tightfit-zero1-1)");
    check(get("optim.update") == Rule::name, r.source(), ": saved update rule is '",
          get("optim.update"), "', this optimizer uses '", Rule::name, "'");
    const auto c = r.read_ints("optim.zero1.counters");
    check(c.size() == 6, r.source(), ": optim.zero1.counters has ", c.size(),
          " entries, expected 6");
    check(c[1] == comm_->size(), r.source(), ": the optimizer state was saved by a run of ", c[1],
          " ranks, this run has ", comm_->size(),
          " (ZeRO-1 shards resume on the same number of ranks)");
    check(c[2] == comm_->rank(), r.source(), ": holds the shard of rank ", c[2], ", this is rank ",
          comm_->rank());
    check(c[3] == shard_ && c[4] == total_ && c[5] == rule_.buffers(), r.source(),
          ": the saved shard has ", c[3], " of ", c[4], " values x ", c[5],
          " buffers, this optimizer ", shard_, " of ", total_, " x ", rule_.buffers());
    check(c[0] >= 0, r.source(), ": the saved step count is ", c[0], ", expected >= 0");
    std::vector<T> h(static_cast<std::size_t>(shard_));
    for (index_t k = 0; k < rule_.buffers(); ++k) {
      const std::string name = "optim.zero1.state." + std::to_string(k);
      r.template read<T>(name, std::span<T>(h));
      for (std::size_t e = 0; e < h.size(); ++e)
        check(std::isfinite(static_cast<double>(h[e])), r.source(), ": tensor '", name, "' holds ",
              h[e], " at index ", e, " (not finite)");
      for (auto& seg : segments_)
        params.backend().upload(
            std::span<const T>(h.data() + seg.shard_offset, static_cast<std::size_t>(seg.length)),
            seg.bufs[static_cast<std::size_t>(k)].span());
    }
    step_ = c[0];
  }

  /// Values per shard (s) and in all (n).
  index_t shard_size() const { return shard_; }
  index_t total_size() const { return total_; }
  /// Bytes of this rank's optimizer state.
  std::size_t state_bytes() const {
    std::size_t bytes = 0;
    for (const auto& seg : segments_)
      bytes += seg.bufs.size() * static_cast<std::size_t>(seg.length) * sizeof(T);
    return bytes;
  }
  std::int64_t steps() const { return step_; }

 private:
  struct segment {
    std::size_t id;
    index_t offset;        // first value of the piece within the parameter
    index_t length;        // values of the piece
    index_t shard_offset;  // where the piece starts within this rank's shard
    bool decay;
    std::vector<buffer_t<B>> bufs;  // the rule's state of the piece, each (length)
  };
  parameter_set<B>* params_;
  std::vector<std::size_t> ids_;
  Rule rule_;
  C* comm_;
  index_t shard_ = 0, total_ = 0;
  std::vector<segment> segments_;
  std::int64_t step_ = 0;
};

/// Full-parameter training with ZeRO-1 (see the top comment): every parameter of `model`, one
/// update rule, its state sharded over `comm`. Step by step it equals full_optimizer<B, Rule> of
/// one process on the union batch (optim/block_optimizer.hpp), clipping included.
template <TrainableModel M, UpdateRule Rule, Communicator C>
class zero1_full_optimizer {
 public:
  using model_type = M;
  using B = typename M::backend_type;
  using T = typename B::value_type;
  /// What train() (optim/train.hpp) asks of step_gradients: each rank's own sums.
  static constexpr gradient_sync gradients_sync = gradient_sync::none;

  zero1_full_optimizer(M& model, Rule rule, C& comm, double max_grad_norm = 0)
      : model_(&model),
        ids_(all_ids(model.parameters().size())),
        zero_(model.parameters(), ids_, std::move(rule), comm),
        comm_(&comm),
        max_grad_norm_(max_grad_norm) {
    check(max_grad_norm >= 0, "zero1_full_optimizer: max_grad_norm is ", max_grad_norm,
          ", expected >= 0 (0: off)");
  }
  zero1_full_optimizer(const zero1_full_optimizer&) = delete;
  zero1_full_optimizer& operator=(const zero1_full_optimizer&) = delete;

  void set_lr_factor(double f) {
    check(f >= 0, "zero1_full_optimizer: lr factor is ", f, ", expected >= 0");
    lr_factor_ = f;
  }
  double lr_factor() const { return lr_factor_; }
  std::int64_t steps() const { return zero_.steps(); }
  std::size_t state_bytes() const { return zero_.state_bytes(); }
  zero1_optimizer<B, Rule, C>& sharded() { return zero_; }

  /// One step: `gradients(model, batch, objective, options)` computes every parameter's
  /// gradient, each rank's own sum (a policy with gradient_sync::none), then the sharded update.
  template <Objective O, class Gradients>
  step_result step(const token_batch& batch, O& objective, const backward_options& base,
                   Gradients&& gradients) {
    if constexpr (requires { gradients.sync; })
      check(gradients.sync == gradient_sync::none,
            "zero1_full_optimizer: the gradient policy all-reduces the gradients, but the "
            "optimizer reduce-scatters them itself (use gradient_sync::none)");
    auto& params = model_->parameters();
    step_result res;
    res.switched = zero_.steps() == 0;
    for (std::size_t id : ids_)
      if (params.has_grad(id)) params.backend().fill(as_row(params.grad(id)), T(0));
    backward_options opt = base;
    opt.layer_weight_grads.clear();
    opt.embedding_grad = true;
    opt.head_grad = true;
    opt.lazy_layer_grads = false;
    res.backward = gradients(*model_, batch, objective, opt);
    res.loss = res.backward.loss;
    res.grad_norm = zero_.step(lr_factor_, max_grad_norm_);
    res.block = 0;
    return res;
  }
  /// One step on this rank's `batch`, data parallel over the communicator.
  template <StepNormalisedObjective O>
  step_result step(const token_batch& batch, O& objective, const backward_options& base = {}) {
    data_parallel<C> policy(*comm_);
    policy.sync = gradient_sync::none;
    return step(batch, objective, base, policy);
  }

  /// This rank's shard of the state (zero1_optimizer::save); the weights are the caller's
  /// (save_checkpoint on rank 0).
  template <class W>
  void save(W& w) const {
    zero_.save(w);
  }
  template <class R>
  void load(const R& r) {
    zero_.load(r);
  }

 private:
  static std::vector<std::size_t> all_ids(std::size_t n) {
    std::vector<std::size_t> ids(n);
    std::iota(ids.begin(), ids.end(), std::size_t{0});
    return ids;
  }
  M* model_;
  std::vector<std::size_t> ids_;
  zero1_optimizer<B, Rule, C> zero_;
  C* comm_;
  double max_grad_norm_ = 0;
  double lr_factor_ = 1.0;
};

}  // namespace tightfit
