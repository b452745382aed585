// tightfit/loss/sft.hpp: supervised fine-tuning cross-entropy over counted tokens.
//
//   L = (1/N) sum_t m_t * (-lp_t),   m_t = 1 when target_t != ignore_index.
// N is the exact number of counted targets in the batch (not estimated per chunk, the
// reference StreamBP code's defect), or a normaliser given by the caller (gradient
// accumulation over micro-batches: the count of the whole accumulation window), or 1 for the
// "sum" reduction. A batch with no counted target has loss 0 and zero gradients (documented).
#pragma once

#include <span>

#include "tightfit/core/error.hpp"
#include "tightfit/loss/objective.hpp"

namespace tightfit {

/// SFT cross-entropy: mean over counted tokens (default) or sum.
class sft_loss : public single_pass_objective {
 public:
  enum class reduction { mean, sum };

  sft_loss() = default;
  explicit sft_loss(reduction r) : reduction_(r) {}
  /// Mean with a caller-given normaliser (e.g. the counted tokens of all micro-batches).
  static sft_loss with_normaliser(double n) {
    check(n > 0, "sft_loss: normaliser is ", n, ", expected > 0");
    sft_loss l;
    l.given_normaliser_ = n;
    return l;
  }

  /// The counts of `layout` (objective_counts: only tokens matter here).
  objective_counts local_counts(const token_layout& layout) const { return count_targets(layout); }
  /// Normalise by the counted tokens of the whole step (all micro-batches, all ranks).
  void use_step_counts(const objective_counts& step) {
    check(step.tokens >= 0, "sft_loss: step token count is ", step.tokens, ", expected >= 0");
    step_tokens_ = step.tokens;
  }

  void begin(const token_layout& layout) {
    counted_ = static_cast<index_t>(count_targets(layout).tokens);
    if (reduction_ == reduction::sum)
      normaliser_ = 1.0;
    else if (given_normaliser_ > 0)
      normaliser_ = given_normaliser_;
    else if (step_tokens_ >= 0)
      normaliser_ = step_tokens_ > 0 ? step_tokens_ : 1.0;
    else
      normaliser_ = counted_ > 0 ? static_cast<double>(counted_) : 1.0;
  }

  /// coefficients() writes coeff from the layout alone (lp enters only the returned loss part)
  /// and changes nothing: the streaming head may call it before the log-probs reach the host
  /// and again once they have (stream/head.hpp: one download per pass).
  static constexpr bool coefficients_use_logprobs() { return false; }

  double coefficients(const token_layout& layout, index_t r0, std::span<const double> lp,
                      std::span<double> coeff) const {
    double part = 0;
    for (std::size_t i = 0; i < lp.size(); ++i) {
      const bool counted = layout.counts(r0 + static_cast<index_t>(i));
      coeff[i] = counted ? -1.0 / normaliser_ : 0.0;
      if (counted) part -= lp[i];
    }
    return part / normaliser_;
  }

  double finish(double sum) const { return sum; }

  /// Counted targets of the last batch.
  index_t counted_tokens() const { return counted_; }
  double normaliser() const { return normaliser_; }

 private:
  reduction reduction_ = reduction::mean;
  double given_normaliser_ = 0;
  double step_tokens_ = -1;  // < 0: this batch is the whole step
  double normaliser_ = 1;
  index_t counted_ = 0;
};

static_assert(StepNormalisedObjective<sft_loss>);

}  // namespace tightfit
