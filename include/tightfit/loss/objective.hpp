// tightfit/loss/objective.hpp: the Objective seam: losses that are functions of per-token
// label log-probs lp_t = log softmax(z_t / tau)[y_t] (ALGORITHMS.md, "Objectives").
//
// The LM head streams over row chunks of the (B*T) flattened positions and never holds the
// (B, T, V) logits; an objective only ever sees log-probs:
//  1. begin(layout): validates its inputs against the batch and computes exact normalisers
//     from whole-sequence masks (so chunk losses add up to the exact loss).
//  2. Two-pass objectives (statistics_pass() == true, e.g. DPO): the head first runs a pass
//     without gradient, calling statistics(layout, r0, lp) for each chunk of rows [r0, r0+n),
//     then end_statistics(layout).
//  3. The gradient pass calls coefficients(layout, r0, lp, coeff) per chunk: it writes
//     coeff_t = dL/dlp_t (0 for rows that do not count) and returns the chunk's loss part.
//     The head turns coeff into dz_t = coeff_t (onehot(y_t) - softmax(z_t)) / tau.
//  4. finish(sum of the returned parts) gives the loss.
// Rows whose target is ignore_index have lp = 0 and must get coeff = 0.
#pragma once

#include <concepts>
#include <span>

#include "tightfit/core/error.hpp"
#include "tightfit/core/types.hpp"

namespace tightfit {

/// Targets of a batch as the head sees them: (B*T) flattened, already shifted (targets[b*T+t]
/// is the token predicted at position t; ignore_index where nothing is predicted), and the
/// per-sequence valid lengths (right padding).
struct token_layout {
  index_t batch = 1;
  index_t seq_len = 0;
  std::span<const token_id> targets;  ///< (B*T)
  std::span<const index_t> lengths;   ///< (B), empty: all T

  index_t rows() const { return batch * seq_len; }
  bool counts(index_t row) const { return targets[static_cast<std::size_t>(row)] != ignore_index; }
};

/// A token log-prob objective (see the top comment for the protocol).
template <class O>
concept Objective = requires(O& o, const token_layout& layout, index_t r0,
                             std::span<const double> lp, std::span<double> coeff, double sum) {
  { o.statistics_pass() } -> std::convertible_to<bool>;
  o.begin(layout);
  o.statistics(layout, r0, lp);
  o.end_statistics(layout);
  { o.coefficients(layout, r0, lp, coeff) } -> std::convertible_to<double>;
  { o.finish(sum) } -> std::convertible_to<double>;
};

/// Base for one-pass objectives: no statistics pass.
struct single_pass_objective {
  static constexpr bool statistics_pass() { return false; }
  void statistics(const token_layout&, index_t, std::span<const double>) {}
  void end_statistics(const token_layout&) {}
};

}  // namespace tightfit
