// tightfit/nn/layer.hpp: the Layer seam the StreamBP scheduler drives, and the batch layout.
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
#include <span>

#include "tightfit/backend/concept.hpp"
#include "tightfit/core/error.hpp"
#include "tightfit/core/view.hpp"

namespace tightfit {

/// B sequences of T positions with right padding: sequence b has `length(b)` valid positions.
struct sequence_batch {
  index_t batch = 1;                 ///< B
  index_t seq_len = 0;               ///< T
  std::span<const index_t> lengths;  ///< (B) valid lengths in [1, T]; empty: all T

  index_t length(index_t b) const {
    return lengths.empty() ? seq_len : lengths[static_cast<std::size_t>(b)];
  }
  index_t rows() const { return batch * seq_len; }

  /// Throws tightfit::error naming the first invalid extent or length.
  void validate() const {
    check(batch >= 1, "sequence_batch: batch is ", batch, ", expected >= 1");
    check(seq_len >= 1, "sequence_batch: sequence length T is ", seq_len, ", expected >= 1");
    if (lengths.empty()) return;
    check_extent("sequence_batch", "lengths.size", static_cast<index_t>(lengths.size()), batch);
    for (index_t b = 0; b < batch; ++b) {
      const index_t len = length(b);
      check(len >= 1 && len <= seq_len, "sequence_batch: lengths[", b, "] is ", len,
            ", expected in [1, ", seq_len, "]");
    }
  }
};

/// What a layer's backward must produce.
struct layer_grad_mode {
  bool weight_grads = true;  ///< accumulate this layer's parameter gradients
  bool input_grad = true;    ///< write dx (needed by layers below or the embedding)
};

/// A layer the StreamBP scheduler can drive (see the top comment for the contract).
template <class L, class B>
concept Layer = Backend<B> &&
    requires(L& layer, B& be, const sequence_batch& seq,
             matrix_view<const typename B::value_type> x, matrix_view<typename B::value_type> y,
             index_t n, bool keep, layer_grad_mode mode) {
  layer.forward(be, seq, x, y, n, keep);
  layer.begin_backward(be, seq, x, n, mode);
  layer.backward_chunk(be, seq, x, x, n, n, y, mode);
  layer.end_backward(be);
};

}  // namespace tightfit
