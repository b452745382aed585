// tightfit/loss/grpo.hpp: the GRPO policy-gradient objective (DeepSeekMath; TRL's
// GRPOTrainer loss) as a streaming token log-prob functor (ALGORITHMS.md, "Objectives").
//
// Per counted token t of sequence b, with advantage A_b, log-probs lp (current), lp_old
// (the rollout policy; equal to lp when not given: one inner iteration) and lp_ref:
//   r  = exp(lp - lp_old)
//   s  = min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)
//   kl = exp(lp_ref - lp) - (lp_ref - lp) - 1          (k3 estimator; only when beta != 0)
//   l  = -s + beta kl
// ds/dlp = r A where the unclipped term is the minimum (or r lies inside the clip range), and
// 0 where the clipped term is strictly smaller (r outside the range); dkl/dlp = 1 - exp(lp_ref-lp).
// Aggregations (m = counted-target mask, whole sequences, so chunk losses add up exactly):
//   grpo     (1/B) sum_b (sum_t m l) / (sum_t m)      a sequence with no counted token adds 0
//   bnpo     (sum m l) / (sum m)                      (token level, DAPO); 0 if nothing counts
//   dr_grpo  (sum m l) / (B * L_max)                  L_max: max_completion_length, default T
// Bad input (sizes, NaN/inf advantages or log-probs of counted tokens, eps < 0, beta != 0
// without lp_ref) throws tightfit::error naming the value.
#pragma once

#include <algorithm>
#include <cmath>
#include <span>
#include <string>
#include <vector>

#include "tightfit/core/error.hpp"
#include "tightfit/loss/objective.hpp"

namespace tightfit {

enum class grpo_aggregation { grpo, bnpo, dr_grpo };

/// "grpo", "bnpo" or "dr_grpo" (TRL's loss_type names).
inline grpo_aggregation parse_grpo_aggregation(const std::string& s) {
  if (s == "grpo") return grpo_aggregation::grpo;
  if (s == "bnpo") return grpo_aggregation::bnpo;
  if (s == "dr_grpo") return grpo_aggregation::dr_grpo;
  fail("unknown GRPO loss type '", s, "', expected grpo, bnpo or dr_grpo");
}

struct grpo_options {
  double epsilon_low = 0.2;
  double epsilon_high = 0.2;
  double beta = 0.0;  ///< KL weight
  grpo_aggregation aggregation = grpo_aggregation::grpo;
  index_t max_completion_length = 0;  ///< L_max of dr_grpo; 0: the batch's T
};

/// GRPO over B sequences. Spans are borrowed: they must outlive the objective.
class grpo_loss : public single_pass_objective {
 public:
  /// advantages (B); old_logprobs, ref_logprobs (B*T) aligned with the targets (may be empty).
  grpo_loss(std::span<const double> advantages, std::span<const double> old_logprobs,
            std::span<const double> ref_logprobs, grpo_options options = {})
      : adv_(advantages), old_(old_logprobs), ref_(ref_logprobs), opt_(options) {
    check(opt_.epsilon_low >= 0 && opt_.epsilon_low < 1, "grpo_loss: epsilon_low is ",
          opt_.epsilon_low, ", expected in [0, 1)");
    check(opt_.epsilon_high >= 0, "grpo_loss: epsilon_high is ", opt_.epsilon_high,
          ", expected >= 0");
    check(std::isfinite(opt_.beta), "grpo_loss: beta is ", opt_.beta, ", expected finite");
    check(opt_.beta == 0 || !ref_.empty(), "grpo_loss: beta is ", opt_.beta,
          " but no reference log-probs were given");
  }

  /// Sequences and counted completion tokens of `layout`.
  objective_counts local_counts(const token_layout& layout) const { return count_targets(layout); }
  /// Normalise by the sequences and completion tokens of the whole step (micro-batches, ranks):
  /// grpo divides by the step's B, bnpo by its tokens, dr_grpo by its B (times L_max, which
  /// must then be given as max_completion_length unless every piece has the same T).
  void use_step_counts(const objective_counts& step) {
    check(step.sequences >= 1, "grpo_loss: step sequence count is ", step.sequences,
          ", expected >= 1");
    step_ = step;
    has_step_ = true;
  }

  void begin(const token_layout& layout) {
    const index_t rows = layout.rows();
    check_extent("grpo_loss", "advantages.size", static_cast<index_t>(adv_.size()), layout.batch);
    if (!old_.empty())
      check_extent("grpo_loss", "old_logprobs.size", static_cast<index_t>(old_.size()), rows);
    if (!ref_.empty())
      check_extent("grpo_loss", "ref_logprobs.size", static_cast<index_t>(ref_.size()), rows);
    for (index_t b = 0; b < layout.batch; ++b)
      check(std::isfinite(adv_[static_cast<std::size_t>(b)]), "grpo_loss: advantages[", b, "] is ",
            adv_[static_cast<std::size_t>(b)], ", expected a finite number");
    weight_.assign(static_cast<std::size_t>(layout.batch), 0.0);
    std::vector<double> count(static_cast<std::size_t>(layout.batch), 0.0);
    double total = 0;
    for (index_t r = 0; r < rows; ++r) {
      if (!layout.counts(r)) continue;
      count[static_cast<std::size_t>(r / layout.seq_len)] += 1;
      total += 1;
      auto finite = [&](std::span<const double> v, const char* name) {
        if (v.empty()) return;
        const double x = v[static_cast<std::size_t>(r)];
        check(std::isfinite(x), "grpo_loss: ", name, "[", r / layout.seq_len, "][",
              r % layout.seq_len, "] is ", x, ", expected a finite log-prob");
      };
      finite(old_, "old_logprobs");
      finite(ref_, "ref_logprobs");
    }
    const double bsz = has_step_ ? step_.sequences : static_cast<double>(layout.batch);
    if (has_step_) total = step_.tokens;
    const double lmax = static_cast<double>(
        opt_.max_completion_length > 0 ? opt_.max_completion_length : layout.seq_len);
    for (std::size_t b = 0; b < weight_.size(); ++b) {
      switch (opt_.aggregation) {
        case grpo_aggregation::grpo:
          weight_[b] = count[b] > 0 ? 1.0 / (bsz * count[b]) : 0.0;
          break;
        case grpo_aggregation::bnpo:
          weight_[b] = total > 0 ? 1.0 / total : 0.0;
          break;
        case grpo_aggregation::dr_grpo:
          weight_[b] = 1.0 / (bsz * lmax);
          break;
      }
    }
  }

  double coefficients(const token_layout& layout, index_t r0, std::span<const double> lp,
                      std::span<double> coeff) const {
    double part = 0;
    for (std::size_t i = 0; i < lp.size(); ++i) {
      const index_t r = r0 + static_cast<index_t>(i);
      coeff[i] = 0;
      if (!layout.counts(r)) continue;
      const double w = weight_[static_cast<std::size_t>(r / layout.seq_len)];
      const double a = adv_[static_cast<std::size_t>(r / layout.seq_len)];
      const double x = lp[i];
      check(std::isfinite(x), "grpo_loss: log-prob of row ", r, " is ", x);
      const double old = old_.empty() ? x : old_[static_cast<std::size_t>(r)];
      const double ratio = std::exp(x - old);
      const double clipped = std::clamp(ratio, 1.0 - opt_.epsilon_low, 1.0 + opt_.epsilon_high);
      const double unclipped_term = ratio * a, clipped_term = clipped * a;
      const double s = std::min(unclipped_term, clipped_term);
      const double ds = clipped_term < unclipped_term ? 0.0 : ratio * a;
      double l = -s, dl = -ds;
      if (opt_.beta != 0) {
        const double delta = ref_[static_cast<std::size_t>(r)] - x;
        l += opt_.beta * (std::exp(delta) - delta - 1);
        dl += opt_.beta * (1 - std::exp(delta));
      }
      part += w * l;
      coeff[i] = w * dl;
    }
    return part;
  }

  double finish(double sum) const { return sum; }

 private:
  std::span<const double> adv_, old_, ref_;
  grpo_options opt_;
  std::vector<double> weight_;  // (B) per-token weight of each sequence
  objective_counts step_;
  bool has_step_ = false;
};

static_assert(StepNormalisedObjective<grpo_loss>);

}  // namespace tightfit
