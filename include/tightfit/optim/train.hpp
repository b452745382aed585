// tightfit/optim/train.hpp: a training loop for any model, any optimizer of optim/ (block
// coordinate or full), any learning-rate schedule, any objective, any way of computing a step's
// gradients, and callbacks in the manner of ensmallen's: detected, not required.
//
// Data: token_dataset, N rows of T tokens: input_ids (N, T) and labels (N, T) in the Hugging
// Face convention (unshifted; -100 ignored; labels absent: the inputs themselves), in memory
// (io/token_file.hpp reads them from a safetensors file). train_options::order says which data
// row the run's k-th row is (optim/data_order.hpp): in order, wrapping around (the default), or
// a seeded shuffle per epoch that keeps units of rows (a DPO pair) together.
//
// How a step's gradients are computed is a parameter of train(), a TrainingGradients policy:
//  - data_parallel_training<C>{&comm} (distributed/data_parallel.hpp; also what train(comm, ...)
//  and
//    the one-process train(...) use): each of the R ranks of a Communicator its own rows;
//  - sequence_parallel_training<C>{&comm, options} (distributed/sequence_step.hpp): every rank the
//    step's rows, each computing its shard of their positions (the layer must be a
//    SequenceParallelLayer).
// A step takes G = R' x A x B rows: B rows per micro-batch (train_options::batch), A micro-batches
// per step and rank (train_options::grad_accum, gradient accumulation), R' ranks that split the
// rows (the policy's row_ranks(): R for data parallelism, 1 for sequence parallelism). Step s
// trains on the run's rows [s*G, s*G + G), row rank r's micro-batch m on the B rows from
// s*G + (r*A + m)*B (each mapped to a data row by the order): the union of a step's pieces is the
// batch of one process run with
// --batch G. With A > 1 or more than one rank the optimizer's step gets the policy's gradients
// over the step's pieces, whose normalisers span the whole step, so the update equals the
// one-process update on the union batch (to rounding).
//
// Each step sets the optimizer's learning-rate factor from the schedule, builds each piece's
// objective (a copy of the Objective given, or objective(batch) when a factory is given: it
// reads dataset_batch::rows for per-row data such as advantages or reference log-probs), steps,
// stops at a non-finite loss or gradient norm (nothing further is reported), then calls each
// callback. The loss reported is the step's (all pieces, all ranks). A callback may define any of
//   on_begin(const train_begin&)   on_step(const train_step&)   on_end(const train_summary&)
// or be callable as f(step, step_result); optim/callbacks.hpp has a progress line and a JSON log.
// Saving a checkpoint at the end is the caller's (optim/checkpoint.hpp).
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "tightfit/core/error.hpp"
#include "tightfit/distributed/communicator.hpp"
#include "tightfit/distributed/data_parallel.hpp"
#include "tightfit/distributed/self_communicator.hpp"
#include "tightfit/loss/objective.hpp"
#include "tightfit/nn/layer.hpp"
#include "tightfit/optim/block_optimizer.hpp"
#include "tightfit/optim/data_order.hpp"
#include "tightfit/optim/schedule.hpp"
#include "tightfit/stream/backward.hpp"

namespace tightfit {

/// A tokenized SFT data set: N rows of T tokens with Hugging Face labels, optionally packed
/// (position_ids restarting at 0 at each document: a document attends only to itself).
class token_dataset {
 public:
  token_dataset() = default;
  /// In-memory rows; labels empty: the inputs (language modelling); position_ids (N*T) empty:
  /// one document per row.
  token_dataset(index_t rows, index_t seq_len, std::vector<token_id> input_ids,
                std::vector<token_id> labels = {}, std::vector<index_t> position_ids = {})
      : rows_(rows),
        seq_len_(seq_len),
        ids_(std::move(input_ids)),
        labels_(std::move(labels)),
        pos_(std::move(position_ids)) {
    check(rows >= 1 && seq_len >= 2, "token_dataset: shape is (", rows, ", ", seq_len,
          "), expected at least one row of at least 2 tokens");
    check_extent("token_dataset", "input_ids.size", static_cast<index_t>(ids_.size()),
                 rows * seq_len);
    if (labels_.empty()) labels_ = ids_;
    check_extent("token_dataset", "labels.size", static_cast<index_t>(labels_.size()),
                 rows * seq_len);
    if (!pos_.empty()) {
      // names the data set's row, position and value
      sequence_batch{rows, seq_len, {}, pos_}.validate();
    }
  }

  index_t rows() const { return rows_; }
  index_t seq_len() const { return seq_len_; }
  const std::vector<token_id>& input_ids() const { return ids_; }
  const std::vector<token_id>& labels() const { return labels_; }
  const std::vector<index_t>& position_ids() const { return pos_; }  ///< (N*T) or empty

  /// Checks every token against a vocabulary size (named row and position on error).
  void validate(index_t vocab) const {
    for (std::size_t i = 0; i < ids_.size(); ++i) {
      const auto r = static_cast<index_t>(i) / seq_len_, c = static_cast<index_t>(i) % seq_len_;
      check(ids_[i] >= 0 && ids_[i] < vocab, "token_dataset: input_ids[", r, "][", c, "] is ",
            ids_[i], ", outside the vocabulary [0, ", vocab, ")");
      check(labels_[i] == ignore_index || (labels_[i] >= 0 && labels_[i] < vocab),
            "token_dataset: labels[", r, "][", c, "] is ", labels_[i], ", expected ", ignore_index,
            " or a token in [0, ", vocab, ")");
    }
  }

 private:
  index_t rows_ = 0, seq_len_ = 0;
  std::vector<token_id> ids_, labels_;  // (N, T)
  std::vector<index_t> pos_;            // (N, T) or empty
};

/// One batch of B rows of a data set with shifted targets.
struct dataset_batch {
  std::vector<token_id> ids, targets;  // (B*T)
  std::vector<index_t> positions;      // (B*T) packed rows, or empty
  std::vector<index_t> rows;           // (B) the data set's row of each batch row
  index_t batch = 1, seq_len = 0;
  std::int64_t first = 0;  ///< the run's index of row 0 (token_batch::first_row)
  token_batch view() const { return {batch, seq_len, ids, targets, {}, positions, first}; }
};

/// The run's rows [first, first + B), each mapped to a data row by `order`.
inline dataset_batch make_batch(const token_dataset& data, std::int64_t first, index_t batch,
                                row_order& order) {
  dataset_batch b;
  b.batch = batch;
  b.seq_len = data.seq_len();
  b.first = first;
  std::vector<token_id> labels;
  const auto t = static_cast<std::size_t>(data.seq_len());
  for (index_t k = 0; k < batch; ++k) {
    const index_t row = order(first + k);
    const auto r = static_cast<std::size_t>(row);
    b.rows.push_back(row);
    b.ids.insert(b.ids.end(), data.input_ids().begin() + static_cast<std::ptrdiff_t>(r * t),
                 data.input_ids().begin() + static_cast<std::ptrdiff_t>((r + 1) * t));
    labels.insert(labels.end(), data.labels().begin() + static_cast<std::ptrdiff_t>(r * t),
                  data.labels().begin() + static_cast<std::ptrdiff_t>((r + 1) * t));
    if (!data.position_ids().empty())
      b.positions.insert(b.positions.end(),
                         data.position_ids().begin() + static_cast<std::ptrdiff_t>(r * t),
                         data.position_ids().begin() + static_cast<std::ptrdiff_t>((r + 1) * t));
  }
  b.targets = shift_labels(labels, batch, data.seq_len());
  return b;
}

/// Rows [first, first + B) modulo N, in order.
inline dataset_batch make_batch(const token_dataset& data, std::int64_t first, index_t batch) {
  row_order in_order(data.rows(), {});
  return make_batch(data, first, batch, in_order);
}

/// Options of train().
struct train_options {
  std::int64_t steps = 100;
  index_t batch = 1;          ///< rows per micro-batch (and rank, with data parallelism)
  index_t grad_accum = 1;     ///< micro-batches per optimizer step (and rank)
  backward_options backward;  ///< schedule, chunk, ... (gradient control: the optimizer's)
  row_order_options order;    ///< in order, or shuffled per epoch (optim/data_order.hpp)
};

/// How train() computes a step's gradients (see the top comment): ranks() in all, row_ranks()
/// of them splitting the step's rows with this rank at row_rank(), accepts<M> (whether it runs
/// models M), and pieces(batches, objectives, sync): the gradient policy (block_optimizer::step's
/// `gradients`) of a step split into this rank's micro-batches `batches`, micro-batch i with
/// objectives[i], the gradients all-reduced or (sync none) left as each rank's own sums.
template <class P>
concept TrainingGradients = requires(const P& p) {
  { p.ranks() } -> std::convertible_to<index_t>;
  { p.row_ranks() } -> std::convertible_to<index_t>;
  { p.row_rank() } -> std::convertible_to<index_t>;
};

/// What callbacks see when the run begins.
struct train_begin {
  std::int64_t first_step = 0;  ///< optimizer steps done before (a resumed run)
  std::int64_t steps = 0;       ///< steps this run will take
};

/// What callbacks see after each step.
struct train_step {
  std::int64_t step = 0;   ///< global step index, 0-based (counts on across a resume)
  std::int64_t index = 0;  ///< step index within this run, 0-based
  std::int64_t steps = 0;  ///< steps this run takes
  const step_result* result = nullptr;
  double lr_factor = 1;
  double tokens = 0;            ///< tokens (positions) trained on in this run so far, all ranks
  double seconds = 0;           ///< wall time of this run so far
  std::size_t state_bytes = 0;  ///< optimizer state after the step
};

/// What train() did.
struct train_summary {
  std::vector<double> losses;
  double seconds = 0;
  double tokens_per_second = 0;
  std::size_t peak_bytes = 0;   ///< highest backward peak (all counted bytes)
  std::size_t state_bytes = 0;  ///< optimizer state at the end
};

namespace detail {

template <class C>
constexpr bool is_train_callback = requires(C& c, const train_begin& b, const train_step& s,
                                            const train_summary& e) {
  c.on_begin(b);
}
|| requires(C& c, const train_step& s) {
  c.on_step(s);
}
|| requires(C& c, const train_summary& e) {
  c.on_end(e);
}
|| std::is_invocable_v<C&, std::int64_t, const step_result&>;

template <class C>
void callback_begin(C& c, const train_begin& b) {
  if constexpr (requires { c.on_begin(b); }) c.on_begin(b);
}
template <class C>
void callback_step(C& c, const train_step& s) {
  if constexpr (requires { c.on_step(s); })
    c.on_step(s);
  else if constexpr (std::is_invocable_v<C&, std::int64_t, const step_result&>)
    c(s.step, *s.result);
}
template <class C>
void callback_end(C& c, const train_summary& e) {
  if constexpr (requires { c.on_end(e); }) c.on_end(e);
}

/// The step's objective: a copy of an Objective, or what a factory makes of the batch.
template <class Source>
auto make_objective(Source& source, const dataset_batch& batch) {
  if constexpr (Objective<std::remove_cvref_t<Source>>)
    return std::remove_cvref_t<Source>(source);
  else
    return source(batch);
}

/// What an optimizer wants step_gradients to do with the gradients: its static member
/// `gradients_sync` (zero1_full_optimizer reduce-scatters them itself), else all-reduce them.
template <class Optimizer>
constexpr gradient_sync gradient_sync_of() {
  if constexpr (requires { Optimizer::gradients_sync; })
    return Optimizer::gradients_sync;
  else
    return gradient_sync::all_reduce;
}

}  // namespace detail

/// Trains `model` for options.steps steps on `objective` (an Objective, copied for each piece of
/// a step, or a factory objective(const dataset_batch&) returning one), calling `callbacks` (see
/// the top comment), the gradients computed by `gradients` (see the top comment): every rank
/// must call it alike, with the same data, model, options and optimizer. The optimizer's
/// step(batch, objective, backward, gradients) receives the policy's gradients over the step's
/// pieces when grad_accum > 1 or the policy has more than one rank.
template <TrainingGradients P, DecoderModel M, class Optimizer, LrSchedule Schedule,
          class ObjectiveSource, class... Callbacks>
train_summary train(const P& gradients, M& model, const token_dataset& data, Optimizer& optimizer,
                    const Schedule& schedule, const train_options& options,
                    ObjectiveSource&& objective, Callbacks&&... callbacks) {
  static_assert((detail::is_train_callback<std::remove_cvref_t<Callbacks>> && ...),
                "a train() callback needs on_begin, on_step or on_end, or to be callable as "
                "f(std::int64_t step, const step_result&)");
  static_assert(P::template accepts<M>,
                "train: this gradient policy cannot run this model (sequence parallelism needs a "
                "layer with the sequence-parallel extension, SequenceParallelLayer)");
  using clock = std::chrono::steady_clock;
  using objective_type = decltype(detail::make_objective(objective, std::declval<dataset_batch>()));
  check(options.steps >= 0, "train: steps is ", options.steps, ", expected >= 0");
  check(options.batch >= 1, "train: batch is ", options.batch, ", expected >= 1");
  check(options.grad_accum >= 1, "train: grad_accum is ", options.grad_accum, ", expected >= 1");
  const index_t ranks = gradients.ranks();
  // ranks sharing rows (data parallelism) and this rank's place among them
  const index_t row_ranks = gradients.row_ranks(), row_rank = gradients.row_rank();
  constexpr index_t most = std::numeric_limits<index_t>::max();
  check(options.batch <= most / options.grad_accum / ranks, "train: batch ", options.batch,
        " x grad_accum ", options.grad_accum, " x ranks ", ranks, " does not fit in 64 bits");
  const index_t rows_per_step = options.batch * options.grad_accum * row_ranks;  // G
  const bool pieces = options.grad_accum > 1 || ranks > 1;
  if constexpr (!StepNormalisedObjective<objective_type>)
    check(!pieces,
          "train: gradient accumulation and data parallelism need an objective whose "
          "normalisers span the step (StepNormalisedObjective)");
  check(options.batch % options.order.unit == 0, "train: batch is ", options.batch,
        " rows, not whole units of ", options.order.unit, " rows (a unit is never split)");
  data.validate(model.config().vocab_size);
  row_order order(data.rows(), options.order);
  train_summary sum;
  const auto start = clock::now();
  double tokens = 0;
  const std::int64_t first_step = optimizer.steps();
  check(
      first_step >= 0 &&
          first_step <= (std::numeric_limits<std::int64_t>::max() / rows_per_step) - options.steps,
      "train: the run would end at step ", first_step, " + ", options.steps,
      ", whose first row (step x ", rows_per_step, " rows) does not fit in 64 bits");
  [[maybe_unused]] const train_begin begin{first_step, options.steps};
  (detail::callback_begin(callbacks, begin), ...);
  std::vector<dataset_batch> batches;
  std::vector<token_batch> views;
  std::vector<objective_type> objectives;
  for (std::int64_t s = 0; s < options.steps; ++s) {
    const std::int64_t global = first_step + s;
    optimizer.set_lr_factor(schedule(global));
    step_result r;
    if (!pieces) {
      const auto b = make_batch(data, global * options.batch, options.batch, order);
      auto loss = detail::make_objective(objective, b);
      r = optimizer.step(b.view(), loss, options.backward);
    } else if constexpr (StepNormalisedObjective<objective_type>) {
      batches.clear();
      views.clear();
      objectives.clear();
      for (index_t m = 0; m < options.grad_accum; ++m)
        batches.push_back(make_batch(
            data, global * rows_per_step + (row_rank * options.grad_accum + m) * options.batch,
            options.batch, order));
      for (const auto& b : batches) {
        views.push_back(b.view());
        objectives.push_back(detail::make_objective(objective, b));
      }
      r = optimizer.step(views.front(), objectives.front(), options.backward,
                         gradients.pieces(std::span<const token_batch>(views), objectives,
                                          detail::gradient_sync_of<Optimizer>()));
    }
    // Non-finite policy: stop before anything non-finite is logged or saved.
    check(std::isfinite(r.loss), "train: step ", global + 1, ": the loss is ", r.loss,
          " (not finite); stopped, nothing saved");
    check(r.grad_norm < 0 || std::isfinite(r.grad_norm), "train: step ", global + 1,
          ": the gradient norm is ", r.grad_norm, " (not finite); stopped, nothing saved");
    tokens += static_cast<double>(rows_per_step * data.seq_len());
    const double secs = std::chrono::duration<double>(clock::now() - start).count();
    sum.losses.push_back(r.loss);
    sum.peak_bytes = std::max(sum.peak_bytes, r.backward.peak_bytes);
    [[maybe_unused]] const train_step info{
        global, s, options.steps, &r, optimizer.lr_factor(), tokens, secs, optimizer.state_bytes()};
    (detail::callback_step(callbacks, info), ...);
  }
  sum.seconds = std::chrono::duration<double>(clock::now() - start).count();
  sum.tokens_per_second = sum.seconds > 0 ? tokens / sum.seconds : 0;
  sum.state_bytes = optimizer.state_bytes();
  (detail::callback_end(callbacks, sum), ...);
  return sum;
}

/// train() data parallel over the ranks of `comm` (data_parallel_training).
template <Communicator C, DecoderModel M, class Optimizer, LrSchedule Schedule,
          class ObjectiveSource, class... Callbacks>
train_summary train(C& comm, M& model, const token_dataset& data, Optimizer& optimizer,
                    const Schedule& schedule, const train_options& options,
                    ObjectiveSource&& objective, Callbacks&&... callbacks) {
  return train(data_parallel_training<C>{&comm}, model, data, optimizer, schedule, options,
               std::forward<ObjectiveSource>(objective), std::forward<Callbacks>(callbacks)...);
}

/// train() in one process (a self_communicator): gradient accumulation when
/// options.grad_accum > 1.
template <DecoderModel M, class Optimizer, LrSchedule Schedule, class ObjectiveSource,
          class... Callbacks>
train_summary train(M& model, const token_dataset& data, Optimizer& optimizer,
                    const Schedule& schedule, const train_options& options,
                    ObjectiveSource&& objective, Callbacks&&... callbacks) {
  self_communicator self;
  return train(self, model, data, optimizer, schedule, options,
               std::forward<ObjectiveSource>(objective), std::forward<Callbacks>(callbacks)...);
}

}  // namespace tightfit
