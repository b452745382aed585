// tightfit/dist/zero1.hpp: an optimizer whose state is sharded over the ranks (ZeRO stage 1,
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
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "tightfit/core/error.hpp"
#include "tightfit/core/memory.hpp"
#include "tightfit/dist/communicator.hpp"
#include "tightfit/nn/parameters.hpp"
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

  /// One step from the gradients each rank holds (summed over the ranks here).
  void step(double lr_factor = 1.0) {
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

}  // namespace tightfit
