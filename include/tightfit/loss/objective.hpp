// tightfit/loss/objective.hpp: the Objective seam: losses that are functions of per-token
// label log-probs lp_t = log softmax(z_t / tau)[y_t] (docs/objectives.md).
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
// Optional: an objective whose coefficients() writes coeff without reading lp and changes
// nothing declares `static constexpr bool coefficients_use_logprobs() { return false; }` (SFT,
// DPO);
// the head then writes coeff before the chunk's log-probs reach the host and calls
// coefficients() again, in the same chunk order, once they have (one download per pass).
// Rows whose target is ignore_index have lp = 0 and must get coeff = 0.
#pragma once

#include <concepts>
#include <span>
#include <vector>

#include "tightfit/core/error.hpp"
#include "tightfit/core/types.hpp"

namespace tightfit {

/// Targets of a batch as the head sees them: (B*T) flattened, already shifted (targets[b*T+t]
/// is the token predicted at position t; ignore_index where nothing is predicted), and the
/// per-sequence valid lengths (right padding).
///
/// Sequences: the units of per-sequence statistics (a GRPO completion, a DPO chosen or
/// rejected sequence). Without `documents` they are the B rows; in a packed batch (several
/// documents per row, position_ids) they are the documents, numbered in row-major order, and
/// `documents` gives each row's document (document_ids builds it).
struct token_layout {
  index_t batch = 1;
  index_t seq_len = 0;
  std::span<const token_id> targets;     ///< (B*T)
  std::span<const index_t> lengths;      ///< (B), empty: all T
  std::span<const index_t> documents{};  ///< (B*T) document of each row; empty: one per row
  index_t document_count = 0;            ///< D when documents is given

  index_t rows() const { return batch * seq_len; }
  bool counts(index_t row) const { return targets[static_cast<std::size_t>(row)] != ignore_index; }
  /// Number of sequences: D for a packed batch, else B.
  index_t sequences() const { return documents.empty() ? batch : document_count; }
  /// The sequence of flattened row `row` (its document, or its batch row).
  index_t sequence(index_t row) const {
    return documents.empty() ? row / seq_len : documents[static_cast<std::size_t>(row)];
  }
};

/// The document of every position (B*T) of a packed batch from its position_ids (restarting
/// at 0 at each document): documents numbered 0, 1, ... in row-major order. Empty for empty
/// position_ids (one document per row).
inline std::vector<index_t> document_ids(std::span<const index_t> position_ids) {
  std::vector<index_t> doc(position_ids.size());
  index_t d = -1;
  for (std::size_t i = 0; i < position_ids.size(); ++i) {
    if (position_ids[i] == 0) ++d;
    check(d >= 0, "document_ids: position_ids[0] is ", position_ids[i],
          ", expected 0 (a row starts a document)");
    doc[i] = d;
  }
  return doc;
}

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

/// The counts an objective's normalisers are computed from (SFT's counted tokens, GRPO's
/// sequences and completion tokens, DPO's pairs). begin() computes them over the batch it is
/// given. When one optimizer step is split into pieces (micro-batches of gradient accumulation,
/// the ranks of data-parallel training), the caller sums each piece's local_counts() over the
/// whole step and passes the sums to use_step_counts() before begin(): each piece's loss and
/// gradients are then its exact share of the union batch's, and the shares add up to the
/// union's (the normalisation that must not be per piece).
struct objective_counts {
  double sequences = 0;  ///< sequences of the batch (rows, or documents when packed)
  double tokens = 0;     ///< counted targets (target != ignore_index)
  double pairs = 0;      ///< preference pairs (DPO)

  objective_counts& operator+=(const objective_counts& o) {
    sequences += o.sequences;
    tokens += o.tokens;
    pairs += o.pairs;
    return *this;
  }
};

/// Counted targets and sequences of a layout.
inline objective_counts count_targets(const token_layout& layout) {
  objective_counts c;
  c.sequences = static_cast<double>(layout.sequences());
  for (index_t r = 0; r < layout.rows(); ++r) c.tokens += layout.counts(r) ? 1 : 0;
  return c;
}

/// An objective whose normalisers can span a whole step split into pieces (see
/// objective_counts). All shipped objectives are.
template <class O>
concept StepNormalisedObjective = Objective<O> &&
    requires(O& o, const O& co, const token_layout& layout, objective_counts c) {
  { co.local_counts(layout) } -> std::same_as<objective_counts>;
  o.use_step_counts(c);
};

/// Base for one-pass objectives: no statistics pass.
struct single_pass_objective {
  static constexpr bool statistics_pass() { return false; }
  void statistics(const token_layout&, index_t, std::span<const double>) {}
  void end_statistics(const token_layout&) {}
};

}  // namespace tightfit
