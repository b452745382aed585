// tightfit/distributed/sequence_step.hpp: the gradients of one optimizer step split into
// micro-batches (gradient accumulation), each computed sequence parallel
// (distributed/sequence_parallel.hpp): every rank passes the same micro-batches, the positions of
// each are split over the ranks, and every rank ends with the gradient one process computes on the
// union of the micro-batches (docs/distributed.md).
//
//  1. Normalisers span the step: every rank sees every micro-batch whole, so the sum of the
//     objectives' local_counts() over the micro-batches is the step's (no message); each
//     objective gets it through use_step_counts() before any gradient is computed.
//  2. Gradients add exactly: sequence_parallel_gradients all-reduces whole gradient buffers,
//     which after micro-batch m hold the step's sum so far on every rank. Before micro-batch
//     m > 0 the ranks other than 0 zero their buffers (rank 0 keeps the sum), so the all-reduce
//     adds the micro-batch's contributions to the sum once. The caller's on_grads_ready runs
//     during the last micro-batch only (no gradient is final before).
//  3. gradient_sync::none (an optimizer that reduce-scatters the ranks' own sums itself:
//     ZeRO-1, optim/zero1.hpp): at the end the ranks other than 0 zero their buffers, so the
//     ranks' sums add up to the step's gradient once.
// Parameter gradients must be zero before the call (as sequence_parallel_gradients).
#pragma once

#include <span>
#include <vector>

#include "tightfit/core/error.hpp"
#include "tightfit/distributed/communicator.hpp"
#include "tightfit/distributed/data_parallel.hpp"
#include "tightfit/distributed/sequence_parallel.hpp"
#include "tightfit/loss/objective.hpp"
#include "tightfit/stream/backward.hpp"

namespace tightfit {

/// Gradients of one step over `micro_batches` (the same on every rank of `comm`), each sequence
/// parallel (see the top comment). objective_of(i) returns the objective (a reference) of
/// micro-batch i, built for the whole micro-batch. The loss is the step's, on every rank.
template <DecoderModel M, class ObjectiveOf, Communicator C>
requires SequenceParallelLayer<typename M::layer_type, typename M::backend_type> backward_result
sequence_step_gradients(M& model, std::span<const token_batch> micro_batches,
                        ObjectiveOf&& objective_of, const backward_options& opt, C& comm,
                        const sequence_parallel_options& sp = {},
                        gradient_sync sync = gradient_sync::all_reduce) {
  using T = storage_t<typename M::backend_type>;
  check(!micro_batches.empty(), "sequence_step_gradients: no micro-batch given");
  // 1. The step's counts (every rank sees every micro-batch whole).
  objective_counts counts;
  for (std::size_t i = 0; i < micro_batches.size(); ++i) {
    const token_batch& mb = micro_batches[i];
    detail::validate_batch(model, mb);
    const std::vector<token_id> targets = detail::masked_targets(mb);
    const std::vector<index_t> documents = document_ids(mb.position_ids);  // packed rows
    const token_layout layout{mb.batch,   mb.seq_len, targets,
                              mb.lengths, documents,  documents.empty() ? 0 : documents.back() + 1};
    counts += objective_of(i).local_counts(layout);
  }
  for (std::size_t i = 0; i < micro_batches.size(); ++i) objective_of(i).use_step_counts(counts);

  auto& params = model.parameters();
  auto zero_unless_rank_0 = [&] {
    if (comm.rank() == 0) return;
    for (std::size_t id = 0; id < params.size(); ++id)
      if (params.has_grad(id)) params.backend().fill(as_row(params.grad(id)), T(0));
  };
  // 2. The micro-batches, the ranks' sum added to the step's sum once each.
  backward_result total;
  backward_options quiet = opt;
  quiet.on_grads_ready = nullptr;
  for (std::size_t i = 0; i < micro_batches.size(); ++i) {
    if (i > 0) zero_unless_rank_0();
    const bool last = i + 1 == micro_batches.size();
    const backward_result r = sequence_parallel_gradients(model, micro_batches[i], objective_of(i),
                                                          last ? opt : quiet, comm, sp);
    detail::add_piece(total, r);  // each micro-batch's loss: the ranks' sum, its share
  }
  // 3. An optimizer that reduces the ranks' own sums itself gets the step's sum once.
  if (sync == gradient_sync::none) zero_unless_rank_0();
  return total;
}

/// The gradient policy of a sequence-parallel optimizer step over several micro-batches
/// (block_optimizer::step's or zero1_full_optimizer::step's `gradients` argument):
/// sequence_step_gradients over `batches`, micro-batch i with (*objectives)[i]. The batch and
/// the objective the optimizer passes are the first micro-batch's and are not used on their own.
template <class Obj, Communicator C>
struct sequence_parallel_steps {
  std::span<const token_batch> batches;
  std::vector<Obj>* objectives = nullptr;
  C* comm = nullptr;
  sequence_parallel_options options{};
  gradient_sync sync = gradient_sync::all_reduce;

  template <DecoderModel M, class O>
  backward_result operator()(M& model, const token_batch&, O&, const backward_options& opt) const {
    return sequence_step_gradients(
        model, batches, [this](std::size_t i) -> Obj& { return (*objectives)[i]; }, opt, *comm,
        options, sync);
  }
};

/// train()'s gradients (optim/train.hpp, TrainingGradients) sequence parallel over the ranks of
/// comm: every rank passes the step's rows, each computing its shard of their positions (the
/// assignment: options); the model's layer must be a SequenceParallelLayer.
template <Communicator C>
struct sequence_parallel_training {
  C* comm = nullptr;
  sequence_parallel_options options{};

  index_t ranks() const { return comm->size(); }
  index_t row_ranks() const { return 1; }
  index_t row_rank() const { return 0; }
  template <class M>
  static constexpr bool accepts =
      SequenceParallelLayer<typename M::layer_type, typename M::backend_type>;
  template <class Obj>
  sequence_parallel_steps<Obj, C> pieces(std::span<const token_batch> batches,
                                         std::vector<Obj>& objectives, gradient_sync sync) const {
    return {batches, &objectives, comm, options, sync};
  }
};

}  // namespace tightfit
