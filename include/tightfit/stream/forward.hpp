// tightfit/stream/forward.hpp: forward-only passes with the streaming memory bound: the final
// hidden states and per-token label log-probs of a model (for lp_old / lp_ref of GRPO, the
// reference sums of DPO, evaluation). Layers run `chunk` positions at a time and keep nothing;
// only the current layer's input and output (B*T, d) exist; the head streams over row chunks.
#pragma once

#include <functional>
#include <vector>

#include "tightfit/stream/backward.hpp"
#include "tightfit/stream/head.hpp"

namespace tightfit {

struct forward_options {
  index_t chunk = 512;          ///< positions per layer chunk
  index_t head_chunk_rows = 0;  ///< rows per head chunk; 0: default_head_chunk_rows
  double temperature = 1.0;
  /// Called after each layer; an exception it throws ends the call (backward_options has the
  /// same hook).
  std::function<void()> between_layers;
};

/// Per-token label log-probs (B*T): log softmax(z_t / tau)[target_t], 0 where the target is
/// ignored or the position is padding.
template <DecoderModel M>
std::vector<double> model_logprobs(M& model, const token_batch& batch,
                                   const forward_options& opt = {}) {
  using B = typename M::backend_type;
  using T = storage_t<B>;
  detail::validate_batch(model, batch);
  check(opt.chunk >= 1, "model_logprobs: chunk is ", opt.chunk, ", expected >= 1");
  B& be = model.backend();
  const auto& cfg = model.config();
  const sequence_batch seq{batch.batch, batch.seq_len, batch.lengths, batch.position_ids,
                           batch.first_row};
  const index_t rows = seq.rows(), d = cfg.hidden_size;
  auto x = be.template allocate<T>(rows * d);  // (B*T, d)
  be.embedding_forward(
      as_matrix(std::span<const T>(model.parameters().value(model.embed_id())), cfg.vocab_size, d),
      batch.input_ids, x.view(rows, d));
  if (const double m = cfg.embedding_multiplier(); m != 1.0)  // Gemma: sqrt(d)
    be.scale(accum_t<B>(m), x.view(rows, d));
  for (index_t l = 0; l < cfg.num_hidden_layers; ++l) {
    auto y = be.template allocate<T>(rows * d);  // (B*T, d)
    model.layer(l).forward(be, seq, matrix_view<const T>(x.view(rows, d)), y.view(rows, d),
                           opt.chunk, false);
    x = std::move(y);
    if (opt.between_layers) opt.between_layers();
  }
  const auto targets = detail::masked_targets(batch);
  const std::vector<index_t> documents = document_ids(batch.position_ids);  // (B*T) or empty
  const token_layout layout{seq.batch, seq.seq_len,
                            targets,   batch.lengths,
                            documents, documents.empty() ? 0 : documents.back() + 1};
  head_options hopt;
  hopt.temperature = opt.temperature;
  hopt.chunk_rows = opt.head_chunk_rows > 0
                        ? opt.head_chunk_rows
                        : default_head_chunk_rows(cfg, seq.batch, std::min(opt.chunk, seq.seq_len));
  return token_logprobs(model, matrix_view<const T>(x.view(rows, d)), layout, hopt);
}

/// Per-sequence sums of the counted label log-probs: sum_t lp_t over non-ignored targets, one
/// per row (B), or one per document (D, row-major order) of a packed batch.
template <DecoderModel M>
std::vector<double> sequence_logprob_sums(M& model, const token_batch& batch,
                                          const forward_options& opt = {}) {
  const auto lp = model_logprobs(model, batch, opt);
  const std::vector<index_t> documents = document_ids(batch.position_ids);  // (B*T) or empty
  std::vector<double> sums(
      static_cast<std::size_t>(documents.empty() ? batch.batch : documents.back() + 1), 0.0);
  for (index_t r = 0; r < batch.batch * batch.seq_len; ++r) {
    const index_t s =
        documents.empty() ? r / batch.seq_len : documents[static_cast<std::size_t>(r)];
    sums[static_cast<std::size_t>(s)] += lp[static_cast<std::size_t>(r)];
  }
  return sums;
}

}  // namespace tightfit
