// Evaluation of a causal LM on a token data set, forward only (the streaming head: no (B, T, V)
// logits): the mean negative log-likelihood of the counted targets (labels != -100, shifted as
// for training) and its exponential, the per-token perplexity. Rows go through the model
// `rows_per_pass` at a time. Used by `tightfit eval` and by `tightfit train --eval-data`.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>

#include "tightfit/core/error.hpp"
#include "tightfit/optim/train.hpp"
#include "tightfit/stream/forward.hpp"

namespace tightfit::cli {

/// What evaluate() measured.
struct eval_result {
  double loss = 0;        ///< mean NLL per counted target token
  double perplexity = 0;  ///< exp(loss)
  double tokens = 0;      ///< counted target tokens
  double seconds = 0;
};

/// The mean NLL and perplexity of `model` on every row of `data` (see the top comment).
template <class M>
eval_result evaluate(M& model, const token_dataset& data, index_t rows_per_pass,
                     const forward_options& fo) {
  check(rows_per_pass >= 1, "evaluate: rows per pass is ", rows_per_pass, ", expected >= 1");
  const auto start = std::chrono::steady_clock::now();
  double nll = 0, tokens = 0;
  for (index_t first = 0; first < data.rows(); first += rows_per_pass) {
    const index_t b = std::min(rows_per_pass, data.rows() - first);
    const dataset_batch batch = make_batch(data, first, b);
    const auto lp = model_logprobs(model, batch.view(), fo);  // (b*T) target-aligned
    for (std::size_t i = 0; i < lp.size(); ++i)
      if (batch.targets[i] != ignore_index) {
        nll -= lp[i];
        tokens += 1;
      }
  }
  check(tokens > 0, "evaluate: the data set has no counted target (every label is -100)");
  eval_result r;
  r.loss = nll / tokens;
  r.perplexity = std::exp(r.loss);
  r.tokens = tokens;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

}  // namespace tightfit::cli
