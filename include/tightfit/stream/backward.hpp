// tightfit/stream/backward.hpp: one entry point for the gradients of a decoder model on a
// batch, under three schedules selectable at run time, all on the same kernels:
//   full        every activation of every layer kept from the forward (classic backprop);
//   checkpoint  only each layer's input kept; in backward the whole layer is recomputed over
//               all T, then backpropagated (gradient checkpointing, the paper's baseline);
//   stream      StreamBP (Luo et al., NeurIPS 2025): forward `chunk` positions at a time
//               (KV-cache style); backward per layer computes K/V once, then chunks last to
//               first, each recomputed and backpropagated, dK/dV accumulated.
// The LM head streams over row chunks by default for `stream` and materialises the (B*T, V)
// logits for the others, as frameworks do; head_mode selects it separately.
//
// Layer-input spacing (backward_options::keep_every = k, checkpoint and stream): only the
// inputs of every k-th layer, counted from the lowest backpropagated one, are kept from the
// forward; when the backward reaches a segment of k layers whose inputs were dropped, it
// recomputes them from the segment's kept input with the same chunked forward, once per segment
// (multi-level checkpointing, Chen et al. 2016, arXiv 1604.06174, composed with StreamBP's
// chunked recomputation). Stored inputs drop from L to ceil(L / k) + (k - 1) at the peak, for
// L - ceil(L / k) extra layer forwards (docs/streambp.md, "Past the memory floor").
//
// Offload (backward_options::offload_layer_inputs, checkpoint and stream, a backend with a host
// memory tier, backend/offload.hpp): the kept layer inputs but the top one go to the host tier
// while the next layer computes and come back one layer ahead of their backward, so backend
// memory holds at most three layer inputs in the forward and two in the backward
// (stream/layer_inputs.hpp); the host tier holds the kept ones.
//
// Invariants: every schedule gives the gradients of plain backprop (to rounding); every
// activation buffer is allocated through the backend and counted, and the call reports its
// peak; parameter gradients ACCUMULATE (call parameters().zero_grads() between steps);
// layers below the lowest one that needs anything are not backpropagated, and layers that
// need no weight gradient run no weight-gradient GEMM.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tightfit/backend/concept.hpp"
#include "tightfit/core/error.hpp"
#include "tightfit/loss/objective.hpp"
#include "tightfit/nn/layer.hpp"
#include "tightfit/stream/head.hpp"
#include "tightfit/stream/layer_inputs.hpp"

namespace tightfit {

/// How the backward keeps or recomputes activations (the CLI's --schedule); not to be confused
/// with the learning-rate schedules of optim/schedule.hpp.
enum class backward_schedule { full, checkpoint, stream };
enum class head_mode { automatic, materialized, streaming };

inline const char* to_string(backward_schedule s) {
  switch (s) {
    case backward_schedule::full:
      return "full";
    case backward_schedule::checkpoint:
      return "checkpoint";
    case backward_schedule::stream:
      return "stream";
  }
  return "?";
}

/// "full", "checkpoint" or "stream"; anything else is an error naming it.
inline backward_schedule parse_backward_schedule(const std::string& name) {
  if (name == "full") return backward_schedule::full;
  if (name == "checkpoint") return backward_schedule::checkpoint;
  if (name == "stream") return backward_schedule::stream;
  fail("unknown schedule '", name, "', expected full, checkpoint or stream");
}

/// A group of parameters whose gradients just became final.
struct grads_ready {
  enum class kind { head, layer, embedding };
  kind what = kind::layer;
  index_t layer = -1;  ///< for kind::layer
};

struct backward_options {
  backward_schedule sched = backward_schedule::stream;
  index_t chunk = 512;                    ///< positions per chunk (stream); >= 1
  head_mode head = head_mode::automatic;  ///< automatic: streaming for stream, else materialized
  index_t head_chunk_rows = 0;            ///< rows per streaming-head chunk; 0: chunk * B
  double temperature = 1.0;               ///< tau of the token log-probs
  std::vector<bool> layer_weight_grads;   ///< per layer; empty: every layer
  bool embedding_grad = true;             ///< gradient of model.embed_tokens.weight
  bool head_grad = true;                  ///< gradients of model.norm and lm_head
  /// Per parameter position (empty: none): a frozen layer parameter gets no gradient buffer (one it
  /// holds is released) and its weight-gradient GEMM does not run, even in a layer that needs
  /// weight gradients (LoRA: the base weights of layers whose adapters train, nn/lora.hpp).
  std::vector<bool> frozen_params;
  /// Allocate a layer's gradient buffers right before its backward instead of up front (they
  /// then count as activation bytes). With on_grads_ready releasing them (BREAD-SGD, LOMO,
  /// low-rank projections), only one layer's gradients exist at a time.
  bool lazy_layer_grads = false;
  /// Keep the input of every k-th layer only and recompute the others a segment at a time
  /// (checkpoint and stream; see the top comment). 1: keep every layer's input.
  index_t keep_every = 1;
  /// Keep the retained layer inputs in the backend's host memory tier (checkpoint and stream;
  /// needs an OffloadBackend, e.g. a device backend with pinned host memory): see the top
  /// comment. The gradients do not change; device bytes drop, host-tier bytes are reported.
  bool offload_layer_inputs = false;
  std::function<void(const grads_ready&)> on_grads_ready;  ///< optimizers, communicators
  /// Called after each layer's forward and after each layer's backward; an exception it throws
  /// ends the call (buffers are released; gradients are partial). The Python module stops a
  /// call on Ctrl-C this way.
  std::function<void()> between_layers;
};

/// A batch of token ids with targets already shifted (see token_layout).
struct token_batch {
  index_t batch = 1;                    ///< B
  index_t seq_len = 0;                  ///< T
  std::span<const token_id> input_ids;  ///< (B*T)
  std::span<const token_id> targets;    ///< (B*T) ignore_index where nothing is predicted
  std::span<const index_t> lengths;     ///< (B) valid lengths; empty: all T
  /// (B*T) packed (padding-free) positions, restarting at 0 at each document (Hugging Face
  /// layout, see sequence_batch); empty: one document per row. A document attends only to
  /// itself, and the target of its last position (the next document's first token) never counts.
  std::span<const index_t> position_ids{};
  /// The run's index of row 0 (sequence_batch::first_row: LoRA dropout's masks); train() sets it.
  std::int64_t first_row = 0;
};

/// Hugging Face labels (unshifted: labels[t] is the token at t, predicted from t-1) to targets
/// (targets[t] = labels[t+1], the last position of each row gets ignore_index).
inline std::vector<token_id> shift_labels(std::span<const token_id> labels, index_t batch,
                                          index_t seq_len) {
  check_extent("shift_labels", "labels.size", static_cast<index_t>(labels.size()), batch * seq_len);
  std::vector<token_id> targets(labels.size(), ignore_index);
  for (index_t b = 0; b < batch; ++b)
    for (index_t t = 0; t + 1 < seq_len; ++t)
      targets[static_cast<std::size_t>(b * seq_len + t)] =
          labels[static_cast<std::size_t>(b * seq_len + t + 1)];
  return targets;
}

struct backward_result {
  double loss = 0;
  std::size_t peak_activation_bytes = 0;  ///< peak bytes allocated inside the call
  std::size_t peak_bytes = 0;             ///< peak of all counted bytes (params, grads too)
  double seconds = 0;                     ///< wall time of forward + backward
  double forward_seconds = 0;             ///< of which the layers' forward
  double head_seconds = 0;                ///< of which the head (all its passes)
  double statistics_seconds = 0;          ///< of which a two-pass objective's statistics pass
  double recompute_seconds = 0;           ///< of which re-running dropped layer inputs
  std::size_t peak_host_bytes = 0;        ///< offload: peak host-tier bytes inside the call
  std::size_t offload_bytes = 0;          ///< offload: bytes copied between the tiers
  index_t recomputed_layers = 0;          ///< layer forwards re-run for dropped inputs
  index_t chunk = 0;                      ///< positions per chunk actually used
  index_t lowest_layer = 0;               ///< lowest layer backpropagated (L: none)
};

/// Rows per streaming-head chunk such that a (rows, V) logits chunk is about the size of one
/// layer chunk's MLP activations (B*chunk rows of 3 * intermediate_size), at least 64 rows.
inline index_t default_head_chunk_rows(const model_config& cfg, index_t batch, index_t chunk) {
  const index_t rows = batch * chunk * 3 * cfg.intermediate_size / cfg.vocab_size;
  return std::max<index_t>(64, std::min(rows, batch * chunk));
}

namespace detail {

template <DecoderModel M>
void validate_batch(const M& model, const token_batch& batch) {
  const sequence_batch seq{batch.batch, batch.seq_len, batch.lengths, batch.position_ids,
                           batch.first_row};
  seq.validate();
  const index_t rows = seq.rows(), v = model.config().vocab_size;
  check_extent("compute_gradients", "input_ids.size", static_cast<index_t>(batch.input_ids.size()),
               rows);
  check_extent("compute_gradients", "targets.size", static_cast<index_t>(batch.targets.size()),
               rows);
  for (index_t r = 0; r < rows; ++r) {
    const token_id id = batch.input_ids[static_cast<std::size_t>(r)];
    check(id >= 0 && id < v, "input_ids[", r / batch.seq_len, "][", r % batch.seq_len, "] is ", id,
          ", outside the vocabulary [0, ", v, ")");
    const token_id y = batch.targets[static_cast<std::size_t>(r)];
    check(y == ignore_index || (y >= 0 && y < v), "targets[", r / batch.seq_len, "][",
          r % batch.seq_len, "] is ", y, ", expected ", ignore_index, " or a token in [0, ", v,
          ")");
  }
}

/// The targets with every target in the padding dropped: positions t >= length(b), and the
/// last valid position when the row is padded (its target is the token at position length(b),
/// which is padding whatever its label says). An unpadded row keeps its last target (the next
/// token of a longer text, when the caller knows it). In a packed batch the last position of
/// every document but the row's last is dropped too (its target starts another document).
inline std::vector<token_id> masked_targets(const token_batch& batch) {
  std::vector<token_id> targets(batch.targets.begin(), batch.targets.end());
  if (!batch.position_ids.empty())
    for (index_t r = 0; r + 1 < batch.batch * batch.seq_len; ++r)
      if ((r + 1) % batch.seq_len != 0 && batch.position_ids[static_cast<std::size_t>(r + 1)] == 0)
        targets[static_cast<std::size_t>(r)] = ignore_index;
  for (index_t b = 0; b < batch.batch; ++b) {
    const index_t len =
        batch.lengths.empty() ? batch.seq_len : batch.lengths[static_cast<std::size_t>(b)];
    for (index_t p = len < batch.seq_len ? len - 1 : len; p < batch.seq_len; ++p)
      targets[static_cast<std::size_t>(b * batch.seq_len + p)] = ignore_index;
  }
  return targets;
}

}  // namespace detail

namespace detail {

/// The gradient driver shared by compute_gradients and sequence_parallel_gradients
/// (distributed/sequence_parallel.hpp), which differ only in where the rows are and how a layer
/// runs, given as a Pass:
///   rows()                     activation rows this process holds (B*T, or B*Tl of a shard)
///   input_ids()                (rows) the ids of those rows (embedding forward and backward)
///   head_chunk                 positions per chunk the default head chunk is sized from
///   forward(layer, seq, x, y, chunk, keep)          one layer's forward over the rows
///   backward(layer, seq, x, dy, dx, chunk, mode)    one layer's whole backward (dy, dx alias)
///   head(hidden, hopt, dhidden, weight_grads, &statistics_seconds) -> the loss
///   grads_ready(event)         a group's gradients are final (head, each layer, embedding)
///   finish()                   before the peak is read (wait for what grads_ready started)
/// The driver: which layers need what, gradient buffers, the embedding (times the config's
/// embedding_multiplier), the layers' forward keeping every keep_every-th input (with offload to
/// a host tier), the head, the layers' backward top to bottom (recomputing dropped inputs a
/// segment at a time, fetching offloaded ones a layer ahead), the embedding's backward. The
/// caller has validated the batch (validate_batch).
template <DecoderModel M, class Pass>
backward_result run_backward(M& model, const token_batch& batch, const backward_options& opt,
                             Pass& pass) {
  using B = typename M::backend_type;
  using T = storage_t<B>;
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  B& be = model.backend();
  const model_config& cfg = model.config();
  const index_t nl = cfg.num_hidden_layers, d = cfg.hidden_size;
  check(opt.chunk >= 1, "compute_gradients: chunk is ", opt.chunk, ", expected >= 1");
  check(opt.keep_every >= 1 && opt.keep_every <= std::max<index_t>(1, nl),
        "compute_gradients: keep_every is ", opt.keep_every, ", expected in [1, ", nl,
        "] (layers)");
  check(opt.keep_every == 1 || opt.sched != backward_schedule::full,
        "compute_gradients: keep_every is ", opt.keep_every,
        ", but the full schedule keeps every activation (use checkpoint or stream)");
  check(!opt.offload_layer_inputs || opt.sched != backward_schedule::full,
        "compute_gradients: offload_layer_inputs needs the checkpoint or stream schedule (the full "
        "schedule keeps every activation in backend memory)");
  check(opt.layer_weight_grads.empty() || static_cast<index_t>(opt.layer_weight_grads.size()) == nl,
        "compute_gradients: layer_weight_grads has ", opt.layer_weight_grads.size(),
        " entries, expected ", nl, " (one per layer) or none");
  const sequence_batch seq{batch.batch, batch.seq_len, batch.lengths, batch.position_ids,
                           batch.first_row};
  const index_t t = seq.seq_len, rows = pass.rows();

  // Which layers need weight gradients, and how far down backprop must go.
  auto needs = [&](index_t l) {
    return opt.layer_weight_grads.empty() || opt.layer_weight_grads[static_cast<std::size_t>(l)];
  };
  index_t lowest = nl;  // lowest layer to backpropagate
  for (index_t l = 0; l < nl; ++l)
    if (needs(l)) {
      lowest = l;
      break;
    }
  if (opt.embedding_grad) lowest = 0;

  // Gradient buffers exist before the measured region (they are not activations).
  auto& params = model.parameters();
  check(opt.frozen_params.empty() || opt.frozen_params.size() == params.size(),
        "compute_gradients: frozen_params has ", opt.frozen_params.size(), " entries, expected ",
        params.size(), " (one per parameter) or none");
  auto frozen = [&](std::size_t id) { return !opt.frozen_params.empty() && opt.frozen_params[id]; };
  for (std::size_t id = 0; id < opt.frozen_params.size(); ++id)
    if (frozen(id)) params.release_grad(id);
  if (opt.head_grad)
    for (auto id : model.head_param_ids()) params.allocate_grad(id);
  if (opt.embedding_grad) params.allocate_grad(model.embed_id());
  auto allocate_layer_grads = [&](index_t l) {
    for (auto id : model.layer_param_ids(l))
      if (!frozen(id)) params.allocate_grad(id);
  };
  if (!opt.lazy_layer_grads)
    for (index_t l = 0; l < nl; ++l)
      if (needs(l)) allocate_layer_grads(l);

  backward_result result;
  result.lowest_layer = lowest;
  peak_scope scope(be.memory());
  const index_t fwd_chunk = opt.sched == backward_schedule::stream ? opt.chunk : t;
  const index_t bwd_chunk = opt.sched == backward_schedule::stream ? std::min(opt.chunk, t) : t;
  result.chunk = bwd_chunk;

  // Which layer inputs the forward keeps: every keep_every-th from the lowest backpropagated.
  const index_t k = opt.keep_every;
  auto kept = [&](index_t l) { return l >= lowest && (l - lowest) % k == 0; };

  // Forward: input l of layer l (kept for backward), input nl the final hidden state, each
  // (rows, d). With offload the kept inputs but the top one move to the host tier, each copy
  // overlapping the next layer's forward; the top one is the first the backward needs.
  std::optional<peak_scope> host_scope;
  if constexpr (OffloadBackend<B>) host_scope.emplace(be.host_memory());
  detail::layer_input_store<B> inputs(be, nl, rows * d, opt.offload_layer_inputs);
  index_t top_kept = -1;
  for (index_t l = 0; l < nl; ++l)
    if (kept(l)) top_kept = l;
  be.embedding_forward(
      as_matrix(std::span<const T>(params.value(model.embed_id())), cfg.vocab_size, d),
      pass.input_ids(), inputs.allocate(0).view(rows, d));
  const double embedding_multiplier = cfg.embedding_multiplier();  // Gemma: sqrt(d), else 1
  if (embedding_multiplier != 1.0)
    be.scale(accum_t<B>(embedding_multiplier), inputs.device(0).view(rows, d));
  for (index_t l = 0; l < nl; ++l) {
    inputs.allocate(l + 1);
    pass.forward(model.layer(l), seq, matrix_view<const T>(inputs.device(l).view(rows, d)),
                 inputs.device(l + 1).view(rows, d), fwd_chunk,
                 opt.sched == backward_schedule::full && l >= lowest);
    inputs.settle();  // the input of layer l - 1 has reached the host tier
    if (!kept(l))
      inputs.release(l);  // below the lowest layer, or recomputed when needed
    else if (inputs.offload() && l != top_kept)
      inputs.move_to_host(l);
    if (opt.between_layers) opt.between_layers();
  }
  inputs.settle();
  result.forward_seconds = std::chrono::duration<double>(clock::now() - start).count();

  // Head: loss, head gradients, dH.
  const bool streaming =
      opt.head == head_mode::streaming ||
      (opt.head == head_mode::automatic && opt.sched == backward_schedule::stream);
  head_options hopt;
  hopt.temperature = opt.temperature;
  hopt.chunk_rows = !streaming ? rows
                    : opt.head_chunk_rows > 0
                        ? opt.head_chunk_rows
                        : default_head_chunk_rows(cfg, seq.batch, pass.head_chunk);
  buffer_t<B> dy;
  if (lowest < nl) dy = be.template allocate<T>(rows * d);  // (rows, d)
  {
    const auto head_start = clock::now();
    auto hidden = inputs.device(nl).view(rows, d);
    result.loss = pass.head(matrix_view<const T>(hidden), hopt,
                            lowest < nl ? dy.view(rows, d) : matrix_view<T>{}, opt.head_grad,
                            &result.statistics_seconds);
    result.head_seconds = std::chrono::duration<double>(clock::now() - head_start).count();
    inputs.release(nl);
  }
  if (opt.head_grad) pass.grads_ready({grads_ready::kind::head, -1});

  // Layers, top to bottom. dx aliases dy: a chunk reads its dy rows before writing its dx
  // rows, and chunks are disjoint, so one (rows, d) buffer carries the gradient down.
  auto segment_base = [&](index_t l) { return lowest + (l - lowest) / k * k; };
  // Input l on the device now (it was not fetched ahead).
  auto fetch_now = [&](index_t l) {
    if (inputs.on_device(l)) return;
    inputs.fetch(l);
    inputs.settle();
  };
  for (index_t l = nl - 1; l >= lowest; --l) {
    if (kept(l)) {
      fetch_now(l);
    } else if (!inputs.on_device(l)) {
      // The top of a segment whose inputs were dropped: recompute them from its kept input.
      const auto recompute_start = clock::now();
      const index_t base = segment_base(l);
      fetch_now(base);
      for (index_t m = base; m < l; ++m) {
        pass.forward(model.layer(m), seq, matrix_view<const T>(inputs.device(m).view(rows, d)),
                     inputs.allocate(m + 1).view(rows, d), fwd_chunk, false);
        ++result.recomputed_layers;
      }
      result.recompute_seconds +=
          std::chrono::duration<double>(clock::now() - recompute_start).count();
    }
    // Fetch the next input the backward needs from the host tier while this layer runs: the
    // input of layer l - 1, or the kept input its segment is recomputed from.
    if (l > lowest) {
      const index_t next = kept(l - 1) ? l - 1 : segment_base(l - 1);
      if (!inputs.on_device(next) && inputs.on_host(next)) inputs.fetch(next);
    }
    const layer_grad_mode mode{needs(l), l > lowest || opt.embedding_grad};
    if (mode.weight_grads && opt.lazy_layer_grads) allocate_layer_grads(l);
    pass.backward(model.layer(l), seq, matrix_view<const T>(inputs.device(l).view(rows, d)),
                  matrix_view<const T>(dy.view(rows, d)),
                  mode.input_grad ? dy.view(rows, d) : matrix_view<T>{}, bwd_chunk, mode);
    inputs.settle();  // the fetched input has arrived
    inputs.release(l);
    if (mode.weight_grads) pass.grads_ready({grads_ready::kind::layer, l});
    if (opt.between_layers) opt.between_layers();
  }
  if (opt.embedding_grad) {
    if (embedding_multiplier != 1.0) be.scale(accum_t<B>(embedding_multiplier), dy.view(rows, d));
    be.embedding_backward(matrix_view<const T>(dy.view(rows, d)), pass.input_ids(),
                          as_matrix(params.grad(model.embed_id()), cfg.vocab_size, d));
    pass.grads_ready({grads_ready::kind::embedding, -1});
  }
  pass.finish();
  result.peak_activation_bytes = scope.peak_above_entry();
  if (host_scope) result.peak_host_bytes = host_scope->peak_above_entry();
  result.offload_bytes = inputs.moved_bytes();
  result.peak_bytes = scope.peak_bytes();
  result.seconds = std::chrono::duration<double>(clock::now() - start).count();
  return result;
}

/// compute_gradients' pass: the whole batch in this process, the Layer protocol.
template <DecoderModel M, Objective O>
struct local_pass {
  using B = typename M::backend_type;
  using T = storage_t<B>;
  M& model;
  const token_batch& batch;
  O& objective;
  const backward_options& opt;
  token_layout layout;
  index_t head_chunk = opt.chunk;

  index_t rows() const { return batch.batch * batch.seq_len; }
  std::span<const token_id> input_ids() const { return batch.input_ids; }
  template <class L>
  void forward(L& layer, const sequence_batch& seq, matrix_view<const T> x, matrix_view<T> y,
               index_t chunk, bool keep) {
    layer.forward(model.backend(), seq, x, y, chunk, keep);
  }
  template <class L>
  void backward(L& layer, const sequence_batch& seq, matrix_view<const T> x,
                matrix_view<const T> dy, matrix_view<T> dx, index_t chunk, layer_grad_mode mode) {
    B& be = model.backend();
    const index_t t = seq.seq_len;
    layer.begin_backward(be, seq, x, chunk, mode);
    const index_t chunks = (t + chunk - 1) / chunk;
    for (index_t j = chunks - 1; j >= 0; --j) {  // last chunk first
      const index_t c0 = j * chunk, c1 = std::min(t, c0 + chunk);
      layer.backward_chunk(be, seq, x, dy, c0, c1, dx, mode);
    }
    layer.end_backward(be);
  }
  double head(matrix_view<const T> hidden, const head_options& hopt, matrix_view<T> dhidden,
              bool weight_grads, double* statistics_seconds) {
    return lm_head_backward(model, hidden, layout, objective, hopt, dhidden, weight_grads,
                            statistics_seconds);
  }
  void grads_ready(const tightfit::grads_ready& e) {
    if (opt.on_grads_ready) opt.on_grads_ready(e);
  }
  void finish() {}
};

}  // namespace detail

/// Loss and parameter gradients of `model` on `batch` under `objective` (see the top comment).
template <DecoderModel M, Objective O>
backward_result compute_gradients(M& model, const token_batch& batch, O& objective,
                                  const backward_options& opt) {
  detail::validate_batch(model, batch);
  // Targets at padded positions never count.
  const std::vector<token_id> targets = detail::masked_targets(batch);
  // Packed rows: the objective's sequences are the documents (row-major order).
  const std::vector<index_t> documents = document_ids(batch.position_ids);  // (B*T) or empty
  detail::local_pass<M, O> pass{model,
                                batch,
                                objective,
                                opt,
                                {batch.batch, batch.seq_len, targets, batch.lengths, documents,
                                 documents.empty() ? 0 : documents.back() + 1}};
  return detail::run_backward(model, batch, opt, pass);
}

}  // namespace tightfit
