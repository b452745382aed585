// tightfit/distributed/data_parallel.hpp: the gradients of one optimizer step whose batch is split
// into pieces: micro-batches run one after the other in this process (gradient accumulation)
// and ranks of a Communicator (data parallelism), in any combination.
//
// Exactness: the result on every rank equals the gradient of one process on the union of all
// pieces. Two things make it so:
//  1. Normalisers span the step. Every piece's objective reports its local_counts() (SFT's
//     counted tokens, GRPO's sequences and completion tokens, DPO's pairs); they are summed
//     over the micro-batches and all-reduced over the ranks (one message of three doubles) and
//     handed back with use_step_counts() before any gradient is computed. A per-piece mean
//     (the gradient-accumulation normalisation Hugging Face had to fix) cannot happen.
//  2. Gradients add. compute_gradients accumulates (+=) into the parameters' gradients, so
//     the micro-batches add up in place, and the ranks' sums are all-reduced once.
// Overlap: during the LAST micro-batch each group of gradients (the head, every layer, the
// embedding) is packed into a staging buffer and all-reduced without blocking as soon as it is
// final (compute_gradients' grads-ready event), while the backward goes on below. Exactly one
// gradient reduction per layer per step, whatever the chunk or micro-batch count. A group's
// request is completed (waited, unpacked) at the next group's event or at the end, and only
// then is the caller's own on_grads_ready called for it, so an in-backward update (BREAD-SGD,
// LOMO) sees the reduced gradient of the whole step (lazy layer gradients are allocated up
// front in the micro-batches before the last, so the last accumulates into them). Staging
// buffers are counted by the backend's memory counter.
// Before the first collective the ranks check that they run the same model and options
// (distributed/agreement.hpp). The loss returned is the step's, on every rank.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "tightfit/core/error.hpp"
#include "tightfit/core/memory.hpp"
#include "tightfit/distributed/agreement.hpp"
#include "tightfit/distributed/communicator.hpp"
#include "tightfit/loss/objective.hpp"
#include "tightfit/nn/layer.hpp"
#include "tightfit/stream/backward.hpp"

namespace tightfit {

/// What one step_gradients call did on this rank.
struct data_parallel_stats {
  std::int64_t gradient_reductions = 0;  ///< all-reduces of gradient groups (L + 2 at most)
  std::int64_t gradient_bytes = 0;       ///< payload bytes of those reductions
  std::int64_t other_messages = 0;       ///< agreement, counts, loss
  double wait_seconds = 0;               ///< blocked completing reductions after the last backward
  objective_counts step_counts;          ///< the whole step's counts (all pieces, all ranks)
};

/// What step_gradients does with the gradients once they are final: all-reduce them (data
/// parallel), or leave each rank's own sum (an optimizer that reduce-scatters them itself, such
/// as zero1_optimizer).
enum class gradient_sync { all_reduce, none };

namespace detail {

/// Adds a piece's backward (one micro-batch's) to the step's: loss and times add, the peaks are
/// the largest, chunk and lowest layer are the piece's.
inline void add_piece(backward_result& total, const backward_result& r) {
  total.loss += r.loss;
  total.seconds += r.seconds;
  total.forward_seconds += r.forward_seconds;
  total.head_seconds += r.head_seconds;
  total.statistics_seconds += r.statistics_seconds;
  total.peak_activation_bytes = std::max(total.peak_activation_bytes, r.peak_activation_bytes);
  total.peak_bytes = std::max(total.peak_bytes, r.peak_bytes);
  total.chunk = r.chunk;
  total.lowest_layer = r.lowest_layer;
}

/// The description ranks must agree on: configuration, parameter shapes, options.
template <DecoderModel M>
std::string data_parallel_description(M& model, const backward_options& opt) {
  std::ostringstream out;
  const model_config& c = model.config();
  out << "V" << c.vocab_size << " d" << c.hidden_size << " f" << c.intermediate_size << " L"
      << c.num_hidden_layers << " H" << c.num_attention_heads << "/" << c.num_key_value_heads
      << " hd" << c.head_dim << " tied" << c.tie_word_embeddings << " qk" << c.qk_norm << ";";
  auto& params = model.parameters();
  for (std::size_t i = 0; i < params.size(); ++i) {
    out << params.name(i) << "(";
    for (index_t e : params.shape(i)) out << e << ",";
    out << ")";
  }
  out << "; head_grad " << opt.head_grad << " embedding_grad " << opt.embedding_grad << " layers ";
  for (bool b : opt.layer_weight_grads) out << b;
  return out.str();
}

}  // namespace detail

/// Gradients of one step over `micro_batches` on this rank and the same on every rank of
/// `comm` (see the top comment). objective_of(i) returns the objective (a reference) of
/// micro-batch i. Parameter gradients accumulate into the model's gradients as
/// compute_gradients does: zero them between steps.
template <DecoderModel M, class ObjectiveOf, Communicator C>
backward_result step_gradients(M& model, std::span<const token_batch> micro_batches,
                               ObjectiveOf&& objective_of, const backward_options& opt, C& comm,
                               data_parallel_stats* stats = nullptr,
                               gradient_sync sync = gradient_sync::all_reduce) {
  using T = storage_t<typename M::backend_type>;
  using clock = std::chrono::steady_clock;
  check(!micro_batches.empty(), "step_gradients: no micro-batch given");
  data_parallel_stats local_stats;
  data_parallel_stats& st = stats ? *stats : local_stats;
  st = data_parallel_stats{};
  const auto messages_before = comm.stats().messages();

  check_agreement(comm, detail::data_parallel_description(model, opt), "model and options");

  // 1. The step's counts.
  objective_counts counts;
  std::vector<std::vector<token_id>> targets(micro_batches.size());
  for (std::size_t i = 0; i < micro_batches.size(); ++i) {
    const token_batch& mb = micro_batches[i];
    detail::validate_batch(model, mb);
    targets[i] = detail::masked_targets(mb);
    const std::vector<index_t> documents = document_ids(mb.position_ids);  // packed rows
    const token_layout layout{mb.batch,   mb.seq_len, targets[i],
                              mb.lengths, documents,  documents.empty() ? 0 : documents.back() + 1};
    counts += objective_of(i).local_counts(layout);
  }
  double sums[3] = {counts.sequences, counts.tokens, counts.pairs};
  comm.all_reduce_sum(std::span<double>(sums)).wait();
  st.step_counts = {sums[0], sums[1], sums[2]};
  for (std::size_t i = 0; i < micro_batches.size(); ++i)
    objective_of(i).use_step_counts(st.step_counts);

  // 2. Every micro-batch but the last: plain accumulation (the caller's callback is not called:
  // no gradient is final before the last micro-batch). Lazy layer gradients (BREAD: allocated
  // right before a layer's backward, released by the update in on_grads_ready) are allocated
  // up front here instead, so that the last micro-batch accumulates into them and the update
  // sees the step's gradient (the expanded layers' gradients live between micro-batches).
  backward_result total;
  backward_options quiet = opt;
  quiet.on_grads_ready = nullptr;
  quiet.lazy_layer_grads = false;
  for (std::size_t i = 0; i + 1 < micro_batches.size(); ++i) {
    const backward_result r = compute_gradients(model, micro_batches[i], objective_of(i), quiet);
    detail::add_piece(total, r);
  }

  // 3. The last micro-batch, reducing each gradient group when it is final.
  auto& params = model.parameters();
  memory_counter& memory = model.backend().memory();
  struct pending {
    grads_ready event;
    std::vector<std::size_t> ids;
    host_buffer<T> staging;
    decltype(comm.all_reduce_sum(std::span<T>())) request;
  };
  std::deque<pending> in_flight;
  auto complete = [&](pending& p) {
    p.request.wait();
    const T* src = p.staging.data();
    for (std::size_t id : p.ids) {
      auto g = params.grad(id);
      std::copy(src, src + g.size(), g.begin());
      src += g.size();
    }
    if (opt.on_grads_ready) opt.on_grads_ready(p.event);
  };
  auto ids_of = [&](const grads_ready& e) {
    std::vector<std::size_t> ids;
    switch (e.what) {
      case grads_ready::kind::head:
        for (std::size_t id : model.head_param_ids())
          if (!(opt.embedding_grad && id == model.embed_id())) ids.push_back(id);  // tied
        break;
      case grads_ready::kind::layer:
        ids = model.layer_param_ids(e.layer);
        break;
      case grads_ready::kind::embedding:
        ids.push_back(model.embed_id());
        break;
    }
    std::vector<std::size_t> with_grad;
    for (std::size_t id : ids)
      if (params.has_grad(id)) with_grad.push_back(id);
    return with_grad;
  };
  backward_options last = opt;
  if (sync == gradient_sync::all_reduce)
    last.on_grads_ready = [&](const grads_ready& e) {
      pending p{e, ids_of(e), {}, {}};
      index_t n = 0;
      for (std::size_t id : p.ids) n += static_cast<index_t>(params.grad(id).size());
      p.staging = host_buffer<T>(memory, n);  // (n) the group's gradients, packed
      T* dst = p.staging.data();
      for (std::size_t id : p.ids) {
        auto g = params.grad(id);
        dst = std::copy(g.begin(), g.end(), dst);
      }
      p.request = comm.all_reduce_sum(p.staging.span());
      ++st.gradient_reductions;
      st.gradient_bytes += static_cast<std::int64_t>(n) * static_cast<std::int64_t>(sizeof(T));
      // The groups started before this one had a whole group's backward to travel.
      while (!in_flight.empty()) {
        complete(in_flight.front());
        in_flight.pop_front();
      }
      in_flight.push_back(std::move(p));
    };
  const std::size_t k = micro_batches.size() - 1;
  const backward_result r = compute_gradients(model, micro_batches[k], objective_of(k), last);
  const auto wait_start = clock::now();
  while (!in_flight.empty()) {
    complete(in_flight.front());
    in_flight.pop_front();
  }
  st.wait_seconds = std::chrono::duration<double>(clock::now() - wait_start).count();
  detail::add_piece(total, r);

  // 4. The step's loss: each piece's loss is its share of the step's.
  comm.all_reduce_sum(std::span<double>(&total.loss, 1)).wait();
  st.other_messages = comm.stats().messages() - messages_before - st.gradient_reductions;
  return total;
}

/// One micro-batch per rank: step_gradients over {batch}.
template <DecoderModel M, StepNormalisedObjective O, Communicator C>
backward_result data_parallel_gradients(M& model, const token_batch& batch, O& objective,
                                        const backward_options& opt, C& comm,
                                        data_parallel_stats* stats = nullptr,
                                        gradient_sync sync = gradient_sync::all_reduce) {
  return step_gradients(
      model, std::span<const token_batch>(&batch, 1), [&](std::size_t) -> O& { return objective; },
      opt, comm, stats, sync);
}

/// The gradient policy of a data-parallel optimizer step (block_optimizer::step's `gradients`
/// argument): data_parallel_gradients over `comm`. Only the gradients the step asks for exist,
/// so a block coordinate optimizer reduces its active block only.
template <Communicator C>
struct data_parallel {
  C* comm;
  data_parallel_stats* stats = nullptr;
  gradient_sync sync = gradient_sync::all_reduce;

  explicit data_parallel(C& c, data_parallel_stats* s = nullptr) : comm(&c), stats(s) {}
  template <DecoderModel M, StepNormalisedObjective O>
  backward_result operator()(M& model, const token_batch& batch, O& objective,
                             const backward_options& opt) const {
    return data_parallel_gradients(model, batch, objective, opt, *comm, stats, sync);
  }
};

/// The gradient policy of a data-parallel step over several micro-batches of this rank
/// (block_optimizer::step's or zero1_full_optimizer::step's `gradients` argument):
/// step_gradients over `batches`, micro-batch i with (*objectives)[i]. The batch and the
/// objective the optimizer passes are the first micro-batch's and are not used on their own.
template <class Obj, Communicator C>
struct data_parallel_steps {
  std::span<const token_batch> batches;
  std::vector<Obj>* objectives = nullptr;
  C* comm = nullptr;
  gradient_sync sync = gradient_sync::all_reduce;

  template <DecoderModel M, class O>
  backward_result operator()(M& model, const token_batch&, O&, const backward_options& opt) const {
    return step_gradients(
        model, batches, [this](std::size_t i) -> Obj& { return (*objectives)[i]; }, opt, *comm,
        nullptr, sync);
  }
};

/// train()'s gradients (optim/train.hpp, TrainingGradients) data parallel over the ranks of
/// comm: each rank its own rows of every step (self_communicator: one process, gradient
/// accumulation over micro-batches).
template <Communicator C>
struct data_parallel_training {
  C* comm = nullptr;

  index_t ranks() const { return comm->size(); }
  index_t row_ranks() const { return comm->size(); }
  index_t row_rank() const { return comm->rank(); }
  template <class M>
  static constexpr bool accepts = true;
  template <class Obj>
  data_parallel_steps<Obj, C> pieces(std::span<const token_batch> batches,
                                     std::vector<Obj>& objectives, gradient_sync sync) const {
    return {batches, &objectives, comm, sync};
  }
};

}  // namespace tightfit
