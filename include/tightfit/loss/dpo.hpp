// tightfit/loss/dpo.hpp: Direct Preference Optimization (Rafailov et al. 2023; TRL's
// DPOTrainer losses) as a two-pass streaming objective (ALGORITHMS.md, "Objectives").
//
// Pairs p of a chosen sequence w and a rejected sequence l (rows of the batch, paired by
// index), with reference sums ref_w, ref_l given as constants (or computed beforehand from a
// reference model's own forward: sequence_logprob_sums in stream/forward.hpp, never from the
// policy's hidden states):
//   pi = sum over the completion's counted targets of lp   (no completion token is dropped)
//   h  = (pi_w - ref_w) - (pi_l - ref_l),   u = beta h
//   sigmoid: -(1-eps) log sig(u) - eps log sig(-u)      (eps = label smoothing)
//   ipo:     (h - 1/(2 beta))^2
//   hinge:   max(0, 1 - u)
// The loss is the mean over pairs and includes beta. Pass 1 (statistics, no gradient) sums
// pi per sequence; then dL/dh per pair; pass 2 gives coeff = +dL/dh on chosen tokens and
// -dL/dh on rejected ones (divided by the number of pairs).
// A pair whose chosen or rejected completion has no counted token is an error naming it.
#pragma once

#include <cmath>
#include <span>
#include <string>
#include <vector>

#include "tightfit/core/error.hpp"
#include "tightfit/loss/objective.hpp"

namespace tightfit {

enum class dpo_loss_type { sigmoid, ipo, hinge };

/// "sigmoid", "ipo" or "hinge" (TRL's loss_type names).
inline dpo_loss_type parse_dpo_loss_type(const std::string& s) {
  if (s == "sigmoid") return dpo_loss_type::sigmoid;
  if (s == "ipo") return dpo_loss_type::ipo;
  if (s == "hinge") return dpo_loss_type::hinge;
  fail("unknown DPO loss type '", s, "', expected sigmoid, ipo or hinge");
}

struct dpo_options {
  double beta = 0.1;
  double label_smoothing = 0.0;  ///< eps of the sigmoid loss, in [0, 0.5]
  dpo_loss_type loss = dpo_loss_type::sigmoid;
};

/// DPO over pairs of batch rows. Spans are borrowed: they must outlive the objective.
class dpo_loss {
 public:
  /// chosen, rejected (P): batch rows of each pair; ref_chosen, ref_rejected (P): reference sums.
  dpo_loss(std::span<const index_t> chosen, std::span<const index_t> rejected,
           std::span<const double> ref_chosen, std::span<const double> ref_rejected,
           dpo_options options = {})
      : chosen_(chosen),
        rejected_(rejected),
        ref_w_(ref_chosen),
        ref_l_(ref_rejected),
        opt_(options) {
    const auto p = static_cast<index_t>(chosen_.size());
    check(p >= 1, "dpo_loss: no pairs given");
    check_extent("dpo_loss", "rejected.size", static_cast<index_t>(rejected_.size()), p);
    check_extent("dpo_loss", "ref_chosen.size", static_cast<index_t>(ref_w_.size()), p);
    check_extent("dpo_loss", "ref_rejected.size", static_cast<index_t>(ref_l_.size()), p);
    check(opt_.beta > 0 && std::isfinite(opt_.beta), "dpo_loss: beta is ", opt_.beta,
          ", expected > 0");
    check(opt_.label_smoothing >= 0 && opt_.label_smoothing <= 0.5, "dpo_loss: label_smoothing is ",
          opt_.label_smoothing, ", expected in [0, 0.5]");
    for (index_t i = 0; i < p; ++i) {
      const auto k = static_cast<std::size_t>(i);
      check(std::isfinite(ref_w_[k]) && std::isfinite(ref_l_[k]),
            "dpo_loss: reference sums of pair ", i, " are ", ref_w_[k], " and ", ref_l_[k],
            ", expected finite");
    }
  }

  static constexpr bool statistics_pass() { return true; }

  /// Pairs of this batch.
  objective_counts local_counts(const token_layout&) const {
    objective_counts c;
    c.pairs = static_cast<double>(pairs());
    return c;
  }
  /// The loss is the mean over the pairs of the whole step (micro-batches, ranks).
  void use_step_counts(const objective_counts& step) {
    check(step.pairs >= static_cast<double>(pairs()), "dpo_loss: step pair count is ", step.pairs,
          ", expected at least this batch's ", pairs());
    step_pairs_ = step.pairs;
  }

  void begin(const token_layout& layout) {
    const index_t p = pairs();
    std::vector<int> used(static_cast<std::size_t>(layout.batch), 0);
    for (index_t i = 0; i < p; ++i)
      for (index_t row :
           {chosen_[static_cast<std::size_t>(i)], rejected_[static_cast<std::size_t>(i)]}) {
        check(row >= 0 && row < layout.batch, "dpo_loss: pair ", i, " names batch row ", row,
              ", expected in [0, ", layout.batch, ")");
        check(used[static_cast<std::size_t>(row)]++ == 0, "dpo_loss: batch row ", row,
              " is used by more than one pair");
      }
    std::vector<index_t> counted(static_cast<std::size_t>(layout.batch), 0);
    for (index_t r = 0; r < layout.rows(); ++r)
      if (layout.counts(r)) ++counted[static_cast<std::size_t>(r / layout.seq_len)];
    for (index_t i = 0; i < p; ++i) {
      const index_t w = chosen_[static_cast<std::size_t>(i)],
                    l = rejected_[static_cast<std::size_t>(i)];
      check(counted[static_cast<std::size_t>(w)] > 0 && counted[static_cast<std::size_t>(l)] > 0,
            "dpo_loss: pair ", i, " has an empty completion (chosen row ", w, ": ",
            counted[static_cast<std::size_t>(w)], " tokens, rejected row ", l, ": ",
            counted[static_cast<std::size_t>(l)], " tokens)");
    }
    sums_.assign(static_cast<std::size_t>(layout.batch), 0.0);
    seq_coeff_.assign(static_cast<std::size_t>(layout.batch), 0.0);
    loss_ = 0;
  }

  void statistics(const token_layout& layout, index_t r0, std::span<const double> lp) {
    for (std::size_t i = 0; i < lp.size(); ++i) {
      const index_t r = r0 + static_cast<index_t>(i);
      if (layout.counts(r)) sums_[static_cast<std::size_t>(r / layout.seq_len)] += lp[i];
    }
  }

  void end_statistics(const token_layout&) {
    const index_t p = pairs();
    const double inv_p = 1.0 / (step_pairs_ > 0 ? step_pairs_ : static_cast<double>(p));
    margins_.assign(static_cast<std::size_t>(p), 0.0);
    for (index_t i = 0; i < p; ++i) {
      const auto k = static_cast<std::size_t>(i);
      const double pi_w = sums_[static_cast<std::size_t>(chosen_[k])];
      const double pi_l = sums_[static_cast<std::size_t>(rejected_[k])];
      const double h = (pi_w - ref_w_[k]) - (pi_l - ref_l_[k]);
      check(std::isfinite(h), "dpo_loss: log-ratio margin of pair ", i, " is ", h);
      margins_[k] = h;
      const double u = opt_.beta * h, eps = opt_.label_smoothing;
      double l = 0, dl_dh = 0;
      switch (opt_.loss) {
        case dpo_loss_type::sigmoid:
          // -log sig(u) = softplus(-u); d/du = -sig(-u)
          l = (1 - eps) * softplus(-u) + eps * softplus(u);
          dl_dh = opt_.beta * (-(1 - eps) * sigmoid(-u) + eps * sigmoid(u));
          break;
        case dpo_loss_type::ipo: {
          const double e = h - 1.0 / (2 * opt_.beta);
          l = e * e;
          dl_dh = 2 * e;
          break;
        }
        case dpo_loss_type::hinge:
          l = std::max(0.0, 1 - u);
          dl_dh = 1 - u > 0 ? -opt_.beta : 0.0;
          break;
      }
      loss_ += l * inv_p;
      seq_coeff_[static_cast<std::size_t>(chosen_[k])] = dl_dh * inv_p;
      seq_coeff_[static_cast<std::size_t>(rejected_[k])] = -dl_dh * inv_p;
    }
  }

  double coefficients(const token_layout& layout, index_t r0, std::span<const double> lp,
                      std::span<double> coeff) const {
    for (std::size_t i = 0; i < lp.size(); ++i) {
      const index_t r = r0 + static_cast<index_t>(i);
      coeff[i] = layout.counts(r) ? seq_coeff_[static_cast<std::size_t>(r / layout.seq_len)] : 0.0;
    }
    return 0.0;
  }

  double finish(double) const { return loss_; }

  index_t pairs() const { return static_cast<index_t>(chosen_.size()); }
  /// Per-sequence log-prob sums of the last statistics pass (B).
  const std::vector<double>& sequence_sums() const { return sums_; }
  /// h = (pi_w - ref_w) - (pi_l - ref_l) per pair of the last batch.
  const std::vector<double>& margins() const { return margins_; }

 private:
  static double softplus(double x) {
    return x > 0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x));
  }
  static double sigmoid(double x) {
    return x >= 0 ? 1 / (1 + std::exp(-x)) : std::exp(x) / (1 + std::exp(x));
  }

  std::span<const index_t> chosen_, rejected_;
  std::span<const double> ref_w_, ref_l_;
  dpo_options opt_;
  std::vector<double> sums_, seq_coeff_, margins_;
  double loss_ = 0;
  double step_pairs_ = 0;  // 0: this batch is the whole step
};

static_assert(StepNormalisedObjective<dpo_loss>);

}  // namespace tightfit
