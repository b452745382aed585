// tightfit/nn/layer.hpp: the Layer and DecoderModel seams the StreamBP scheduler drives, and the
// batch layout. A user's own layer (e.g. parallel attention + MLP) satisfying DecoderLayer plugs
// into decoder_model<B, L> and runs under every backward schedule (examples/custom_layer.cpp).
//
// StreamBP (Luo et al., NeurIPS 2025, arXiv 2506.03077) splits a layer's backward along the
// sequence: backprop is linear in dY and causal, so chunks of query rows, processed last to
// first, give exact gradients while holding one chunk's activations at a time.
//
// Activations are (B*T, d) row-major: the row of sequence b, position t is b*T + t. A layer:
//  - forward(be, seq, x, y, chunk, keep): y = layer(x) over all rows, working `chunk`
//    positions at a time; keep == true asks it to keep every activation for a backward over
//    the whole sequence without recomputation (the "full" schedule); otherwise it keeps nothing.
//  - begin_backward(be, seq, x, chunk, mode): per-layer backward state (StreamBP: K and V of all
//    rows once, computed `chunk` positions at a time, and the dK/dV accumulators).
//  - backward_chunk(be, seq, x, dy, c0, c1, dx, mode): backward of positions [c0, c1) of every
//    sequence; called for chunks from last to first. Writes dx rows of those positions (when
//    mode.input_grad) and accumulates parameter gradients (when mode.weight_grads). dx may
//    alias dy: a chunk reads its dy rows before it writes its dx rows.
//  - end_backward(be): frees the backward state.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include "tightfit/backend/concept.hpp"
#include "tightfit/core/error.hpp"
#include "tightfit/core/view.hpp"
#include "tightfit/nn/config.hpp"
#include "tightfit/nn/parameters.hpp"

namespace tightfit {

/// B sequences of T positions with right padding: sequence b has `length(b)` valid positions.
/// Packed (padding-free) sequences carry position_ids in the Hugging Face layout: each row holds
/// several documents, positions restart at 0 at each one (0 1 2 0 1 0 1 2 3 ...); a document
/// attends only to itself and RoPE rotates by the position within it.
struct sequence_batch {
  index_t batch = 1;                        ///< B
  index_t seq_len = 0;                      ///< T
  std::span<const index_t> lengths{};       ///< (B) valid lengths in [1, T]; empty: all T
  std::span<const index_t> position_ids{};  ///< (B*T) packed positions; empty: t
  /// The run's index of sequence 0 (sequence b is the run's row first_row + b): the rows' name in
  /// LoRA dropout's masks (nn/lora_dropout.hpp); train() sets it, 0 otherwise.
  std::int64_t first_row = 0;

  index_t length(index_t b) const {
    return lengths.empty() ? seq_len : lengths[static_cast<std::size_t>(b)];
  }
  index_t rows() const { return batch * seq_len; }
  /// The RoPE position of row b, position t.
  index_t position(index_t b, index_t t) const {
    return position_ids.empty() ? t : position_ids[static_cast<std::size_t>(b * seq_len + t)];
  }

  /// Throws tightfit::error naming the first invalid extent or length.
  void validate() const {
    check(batch >= 1, "sequence_batch: batch is ", batch, ", expected >= 1");
    check(seq_len >= 1, "sequence_batch: sequence length T is ", seq_len, ", expected >= 1");
    if (!position_ids.empty()) {
      check_extent("sequence_batch", "position_ids.size", static_cast<index_t>(position_ids.size()),
                   rows());
      for (index_t b = 0; b < batch; ++b)
        for (index_t t = 0; t < seq_len; ++t) {
          const index_t p = position(b, t), prev = t == 0 ? -1 : position(b, t - 1);
          check(p == prev + 1 || (t > 0 && p == 0), "sequence_batch: position_ids[", b, "][", t,
                "] is ", p,
                t == 0 ? ", expected 0 (a row starts a document)"
                       : detail::concat(", expected ", prev + 1,
                                        " (next position) or 0 (a new document)"));
        }
    }
    if (lengths.empty()) return;
    check_extent("sequence_batch", "lengths.size", static_cast<index_t>(lengths.size()), batch);
    for (index_t b = 0; b < batch; ++b) {
      const index_t len = length(b);
      check(len >= 1 && len <= seq_len, "sequence_batch: lengths[", b, "] is ", len,
            ", expected in [1, ", seq_len, "]");
    }
  }
};

/// Copies rows [c0, c1) of every sequence of src (B*T, w) into dst (B*c, w), c = c1 - c0. U:
/// storage_t, or accum_t for the statistics (the backend copies both).
template <DenseBackend B, class U = storage_t<B>>
void gather_rows(B& be, const sequence_batch& seq, index_t c0, index_t c1,
                 std::type_identity_t<matrix_view<const U>> src, matrix_view<U> dst) {
  const index_t c = c1 - c0, t = seq.seq_len;
  for (index_t b = 0; b < seq.batch; ++b)
    be.copy(src.row_range(b * t + c0, b * t + c1), dst.row_range(b * c, (b + 1) * c));
}

/// The inverse of gather_rows: src (B*c, w) into rows [c0, c1) of every sequence of dst.
template <DenseBackend B, class U = storage_t<B>>
void scatter_rows(B& be, const sequence_batch& seq, index_t c0, index_t c1,
                  std::type_identity_t<matrix_view<const U>> src, matrix_view<U> dst) {
  const index_t c = c1 - c0, t = seq.seq_len;
  for (index_t b = 0; b < seq.batch; ++b)
    be.copy(src.row_range(b * c, (b + 1) * c), dst.row_range(b * t + c0, b * t + c1));
}

/// What a layer's backward must produce.
struct layer_grad_mode {
  bool weight_grads = true;  ///< accumulate this layer's parameter gradients
  bool input_grad = true;    ///< write dx (needed by layers below or the embedding)
};

/// A layer the StreamBP scheduler can drive (see the top comment for the contract).
template <class L, class B>
concept Layer = StorageBackend<B> &&
    requires(L& layer, B& be, const sequence_batch& seq, matrix_view<const storage_t<B>> x,
             matrix_view<storage_t<B>> y, index_t n, bool keep, layer_grad_mode mode) {
  layer.forward(be, seq, x, y, n, keep);
  layer.begin_backward(be, seq, x, n, mode);
  layer.backward_chunk(be, seq, x, x, n, n, y, mode);
  layer.end_backward(be);
};

/// A layer decoder_model<B, L> can hold: a Layer that lists its parameters (a table of names
/// under "model.layers.N." and shapes) and is built over a parameter_set that holds them.
template <class L, class B>
concept DecoderLayer = Layer<L, B> && std::move_constructible<L> && std::constructible_from < L,
        parameter_set<B>
&, const model_config&, index_t > &&requires(const model_config& c) {
  { L::parameter_table(c) } -> std::convertible_to<std::vector<param_spec>>;
};

/// What compute_gradients, the forward-only log-probs and the planner need of a model: a
/// backend, a config, one parameter_set, the positions of the embedding, final norm and LM head,
/// and `layers()` layers, each a Layer with its parameter positions.
template <class M>
concept DecoderModel = requires {
  typename M::backend_type;
}
&&TransformerBackend<typename M::backend_type>&& requires(M& m, const M& cm, index_t l) {
  typename M::layer_type;
  requires Layer<typename M::layer_type, typename M::backend_type>;
  { cm.backend() } -> std::same_as<typename M::backend_type&>;
  { cm.config() } -> std::convertible_to<const model_config&>;
  { m.parameters() } -> std::same_as<parameter_set<typename M::backend_type>&>;
  { cm.embed_id() } -> std::convertible_to<std::size_t>;
  { cm.final_norm_id() } -> std::convertible_to<std::size_t>;
  { cm.lm_head_id() } -> std::convertible_to<std::size_t>;
  { cm.head_param_ids() } -> std::convertible_to<std::vector<std::size_t>>;
  { cm.layer_param_ids(l) } -> std::convertible_to<std::vector<std::size_t>>;
  { m.layer(l) } -> std::same_as<typename M::layer_type&>;
};

/// A DecoderModel whose backend also runs the optimizer kernels (Backend: TransformerBackend
/// and OptimizerBackend): what the optimizers of optim/ train.
template <class M>
concept TrainableModel = DecoderModel<M> && Backend<typename M::backend_type>;

}  // namespace tightfit
