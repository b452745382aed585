// Evaluation of a causal LM, forward only (the streaming head: no (B, T, V) logits), used by
// `tightfit eval` and by `tightfit train --eval-data`:
//   evaluate():     a token data set (SFT): the mean negative log-likelihood of the counted
//                   targets (labels != -100, shifted as for training) and its exponential, the
//                   per-token perplexity;
//   evaluate_dpo(): preference pairs: the DPO loss of the library's dpo_loss over every pair
//                   (normalised over the whole set, as one batch of all pairs would be) and, for
//                   the losses with a reference (sigmoid, ipo, hinge), TRL's reward metrics:
//                   rewards beta (log pi(y|x) - log ref(y|x)) of the chosen and rejected
//                   completions, the fraction of pairs whose chosen reward is larger, the margin.
// Rows go through the model `rows_per_pass` (DPO: pairs) at a time.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>

#include <string>
#include <utility>
#include <vector>

#include "tightfit/core/error.hpp"
#include "tightfit/optim/train.hpp"
#include "tightfit/stream/forward.hpp"
#include "training_data.hpp"

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

/// What evaluate_dpo() measured (the names of TRL's DPOTrainer metrics in the comments).
struct dpo_eval_result {
  double loss = 0;             ///< eval_loss
  bool rewards = false;        ///< the loss has a reference: the reward metrics below are set
  double chosen_reward = 0;    ///< rewards/chosen: mean beta (log pi - log ref) of the chosen
  double rejected_reward = 0;  ///< rewards/rejected
  double accuracy = 0;         ///< rewards/accuracies: pairs whose chosen reward is larger
  double margin = 0;           ///< rewards/margins: mean chosen - rejected reward
  index_t pairs = 0;
  double seconds = 0;
};

/// The DPO loss and reward metrics of `model` on every pair of `d` (see the top comment); the
/// reference sums are d's (read or computed before training).
template <class M>
dpo_eval_result evaluate_dpo(M& model, const training_data& d, index_t pairs_per_pass,
                             const forward_options& fo, const dpo_options& opt) {
  check(d.objective == "dpo" && d.rows.rows() % 2 == 0, "evaluate_dpo: not a DPO data set");
  check(pairs_per_pass >= 1, "evaluate_dpo: pairs per pass is ", pairs_per_pass, ", expected >= 1");
  const auto start = std::chrono::steady_clock::now();
  dpo_eval_result r;
  r.pairs = d.rows.rows() / 2;
  r.rewards = needs_reference(opt.loss);
  check(!r.rewards || static_cast<index_t>(d.ref_chosen.size()) == r.pairs,
        "evaluate_dpo: the data set holds no reference sums");
  // the set's counts first: every batch's loss is then its share of one batch of all pairs
  auto batch_of = [&](index_t first_pair) {
    return make_batch(d.rows, 2 * first_pair, 2 * std::min(pairs_per_pass, r.pairs - first_pair));
  };
  auto layout_of = [](const dataset_batch& b) {
    return token_layout{b.batch, b.seq_len, b.targets, {}};
  };
  objective_counts counts;
  for (index_t first = 0; first < r.pairs; first += pairs_per_pass) {
    const dataset_batch b = batch_of(first);
    counts += row_objective(d, b, {}, opt).local_counts(layout_of(b));
  }
  for (index_t first = 0; first < r.pairs; first += pairs_per_pass) {
    const dataset_batch b = batch_of(first);
    const token_layout layout = layout_of(b);
    const auto lp = model_logprobs(model, b.view(), fo);  // (b*T) target-aligned
    row_objective objective(d, b, {}, opt);
    objective.use_step_counts(counts);
    objective.begin(layout);
    if (objective.statistics_pass()) {
      objective.statistics(layout, 0, lp);
      objective.end_statistics(layout);
    }
    std::vector<double> coeff(lp.size());
    r.loss += objective.finish(objective.coefficients(layout, 0, lp, coeff));
    if (!r.rewards) continue;
    for (index_t k = 0; k < b.batch; k += 2) {  // rows k (chosen), k + 1 (rejected)
      double sums[2] = {0, 0};
      for (index_t j = 0; j < 2; ++j)
        for (index_t p = 0; p < b.seq_len; ++p) {
          const auto i = static_cast<std::size_t>((k + j) * b.seq_len + p);
          if (b.targets[i] != ignore_index) sums[j] += lp[i];
        }
      const auto pair = static_cast<std::size_t>(first + k / 2);
      const double chosen = opt.beta * (sums[0] - d.ref_chosen[pair]);
      const double rejected = opt.beta * (sums[1] - d.ref_rejected[pair]);
      r.chosen_reward += chosen;
      r.rejected_reward += rejected;
      r.accuracy += chosen > rejected ? 1 : 0;
    }
  }
  const auto n = static_cast<double>(r.pairs);
  r.chosen_reward /= n;
  r.rejected_reward /= n;
  r.accuracy /= n;
  r.margin = r.chosen_reward - r.rejected_reward;
  check(std::isfinite(r.loss), "evaluate_dpo: the loss is ", r.loss, " (not finite)");
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

/// The fields of a DPO evaluation as a JSON log or output line, each name after `prefix`.
inline std::vector<std::pair<std::string, double>> dpo_eval_fields(const dpo_eval_result& e,
                                                                   const std::string& prefix) {
  std::vector<std::pair<std::string, double>> out{{prefix + "loss", e.loss},
                                                  {prefix + "pairs", static_cast<double>(e.pairs)},
                                                  {prefix + "seconds", e.seconds}};
  if (e.rewards)
    for (const auto& [name, v] : {std::pair<std::string, double>{"rewards_chosen", e.chosen_reward},
                                  {"rewards_rejected", e.rejected_reward},
                                  {"rewards_accuracy", e.accuracy},
                                  {"rewards_margin", e.margin}})
      out.emplace_back(prefix + name, v);
  return out;
}

}  // namespace tightfit::cli
