// tightfit/loss/dpo.hpp: preference losses over pairs of sequences as one two-pass streaming
// objective (docs/objectives.md): DPO (Rafailov et al. 2023; TRL's DPOTrainer losses), IPO
// (Azar et al. 2023), hinge, RPO's added NLL term (Pang et al. 2024, TRL's rpo_alpha), and the
// reference-free SimPO (Meng et al. 2024; TRL's CPOTrainer loss_type="simpo") and ORPO (Hong et
// al. 2024; TRL's ORPOTrainer).
//
// Pairs p of a chosen sequence w and a rejected sequence l (rows of the batch, or documents of a
// packed batch in row-major order: token_layout::sequences; paired by index). With reference sums
// ref_w, ref_l given as constants (or computed beforehand from a reference model's own forward:
// sequence_logprob_sums in stream/forward.hpp, never from the policy's hidden states; `tightfit
// logprobs` writes them):
//   pi = sum over the completion's counted targets of lp   (no completion token is dropped)
//   a  = pi / n, n = the completion's counted targets      (average log-prob: SimPO, ORPO)
//   h  = (pi_w - ref_w) - (pi_l - ref_l),   u = beta h
//   sigmoid: -(1-eps) log sig(u) - eps log sig(-u)      (eps = label smoothing)
//   ipo:     (h - 1/(2 beta))^2
//   hinge:   max(0, 1 - u)
//   simpo:   u = beta (a_w - a_l) - gamma, then the sigmoid loss   (no reference)
//   orpo:    -beta log sig(log_odds),  log_odds = (a_w - a_l) - (log(1 - e^a_w) - log(1 - e^a_l))
//            plus the NLL term with weight 1                        (no reference)
// The pair loss is the mean over pairs and includes beta. NLL term (rpo_alpha > 0, and ORPO):
// alpha times the mean of -lp over the counted targets of all chosen completions. Means are
// over the step's pairs and chosen tokens when use_step_counts gave them.
// Pass 1 (statistics, no gradient) sums pi per sequence; then dL/dpi per sequence; pass 2 gives
// coeff = dL/dpi on every counted token of the sequence, plus the NLL's -alpha/N on chosen ones.
// A pair whose chosen or rejected completion has no counted token is an error naming it.
#pragma once

#include <cmath>
#include <span>
#include <string>
#include <vector>

#include "tightfit/core/error.hpp"
#include "tightfit/loss/objective.hpp"

namespace tightfit {

enum class dpo_loss_type { sigmoid, ipo, hinge, simpo, orpo };

/// "sigmoid", "ipo", "hinge", "simpo" or "orpo" (TRL's loss_type names; orpo: ORPOTrainer).
inline dpo_loss_type parse_dpo_loss_type(const std::string& s) {
  if (s == "sigmoid") return dpo_loss_type::sigmoid;
  if (s == "ipo") return dpo_loss_type::ipo;
  if (s == "hinge") return dpo_loss_type::hinge;
  if (s == "simpo") return dpo_loss_type::simpo;
  if (s == "orpo") return dpo_loss_type::orpo;
  fail("unknown DPO loss type '", s, "', expected sigmoid, ipo, hinge, simpo or orpo");
}

/// True for the losses that need reference log-prob sums.
inline bool needs_reference(dpo_loss_type t) {
  return t == dpo_loss_type::sigmoid || t == dpo_loss_type::ipo || t == dpo_loss_type::hinge;
}

struct dpo_options {
  double beta = 0.1;             ///< DPO/IPO/hinge/SimPO beta; ORPO's lambda
  double label_smoothing = 0.0;  ///< eps of the sigmoid and SimPO losses, in [0, 0.5]
  double rpo_alpha = 0.0;        ///< weight of the NLL term on chosen tokens (RPO; CPO's cpo_alpha)
  double simpo_gamma = 0.5;      ///< SimPO's target reward margin
  dpo_loss_type loss = dpo_loss_type::sigmoid;
};

/// Preference loss over pairs of batch rows. Spans are borrowed: they must outlive the objective.
class dpo_loss {
 public:
  /// chosen, rejected (P): the sequences of each pair (batch rows, or documents of a packed
  /// batch, token_layout::sequence); ref_chosen, ref_rejected (P): reference sums
  /// (may be empty for simpo and orpo).
  dpo_loss(std::span<const index_t> chosen, std::span<const index_t> rejected,
           std::span<const double> ref_chosen, std::span<const double> ref_rejected,
           const dpo_options& options = {})
      : chosen_(chosen),
        rejected_(rejected),
        ref_w_(ref_chosen),
        ref_l_(ref_rejected),
        opt_(options) {
    const auto p = static_cast<index_t>(chosen_.size());
    check(p >= 1, "dpo_loss: no pairs given");
    check_extent("dpo_loss", "rejected.size", static_cast<index_t>(rejected_.size()), p);
    if (needs_reference(opt_.loss) || !ref_w_.empty() || !ref_l_.empty()) {
      check_extent("dpo_loss", "ref_chosen.size", static_cast<index_t>(ref_w_.size()), p);
      check_extent("dpo_loss", "ref_rejected.size", static_cast<index_t>(ref_l_.size()), p);
    }
    check(opt_.beta > 0 && std::isfinite(opt_.beta), "dpo_loss: beta is ", opt_.beta,
          ", expected > 0");
    check(opt_.label_smoothing >= 0 && opt_.label_smoothing <= 0.5, "dpo_loss: label_smoothing is ",
          opt_.label_smoothing, ", expected in [0, 0.5]");
    check(opt_.rpo_alpha >= 0 && std::isfinite(opt_.rpo_alpha), "dpo_loss: rpo_alpha is ",
          opt_.rpo_alpha, ", expected >= 0");
    check(std::isfinite(opt_.simpo_gamma), "dpo_loss: simpo_gamma is ", opt_.simpo_gamma,
          ", expected finite");
    for (std::size_t k = 0; k < ref_w_.size(); ++k) {
      check(std::isfinite(ref_w_[k]) && std::isfinite(ref_l_[k]),
            "dpo_loss: reference sums of pair ", k, " are ", ref_w_[k], " and ", ref_l_[k],
            ", expected finite");
    }
  }

  static constexpr bool statistics_pass() { return true; }
  /// coefficients() writes coeff from the statistics pass alone (the chosen tokens' NLL term
  /// reads lp for its loss part only) and changes nothing: the head's gradient pass downloads
  /// the log-probs once, at its end (stream/head.hpp), not per chunk.
  static constexpr bool coefficients_use_logprobs() { return false; }

  /// Pairs of this batch, and its chosen completions' counted tokens (the NLL term's mean).
  objective_counts local_counts(const token_layout& layout) const {
    objective_counts c;
    c.pairs = static_cast<double>(pairs());
    std::vector<bool> chosen(static_cast<std::size_t>(layout.sequences()), false);
    for (index_t s : chosen_)
      if (s >= 0 && s < layout.sequences()) chosen[static_cast<std::size_t>(s)] = true;
    for (index_t r = 0; r < layout.rows(); ++r)
      if (layout.counts(r) && chosen[static_cast<std::size_t>(layout.sequence(r))]) c.tokens += 1;
    return c;
  }
  /// Means over the pairs and chosen tokens of the whole step (micro-batches, ranks).
  void use_step_counts(const objective_counts& step) {
    check(step.pairs >= static_cast<double>(pairs()), "dpo_loss: step pair count is ", step.pairs,
          ", expected at least this batch's ", pairs());
    step_pairs_ = step.pairs;
    step_chosen_tokens_ = step.tokens;
  }

  void begin(const token_layout& layout) {
    const index_t p = pairs();
    const index_t nseq = layout.sequences();  // rows, or documents of a packed batch
    std::vector<int> used(static_cast<std::size_t>(nseq), 0);
    for (index_t i = 0; i < p; ++i)
      for (index_t row :
           {chosen_[static_cast<std::size_t>(i)], rejected_[static_cast<std::size_t>(i)]}) {
        check(row >= 0 && row < nseq, "dpo_loss: pair ", i, " names sequence ", row,
              ", expected in [0, ", nseq, ")");
        check(used[static_cast<std::size_t>(row)]++ == 0, "dpo_loss: sequence ", row,
              " is used by more than one pair");
      }
    counted_.assign(static_cast<std::size_t>(nseq), 0.0);
    for (index_t r = 0; r < layout.rows(); ++r)
      if (layout.counts(r)) counted_[static_cast<std::size_t>(layout.sequence(r))] += 1;
    double chosen_tokens = 0;
    is_chosen_.assign(static_cast<std::size_t>(nseq), false);
    for (index_t i = 0; i < p; ++i) {
      const auto w = static_cast<std::size_t>(chosen_[static_cast<std::size_t>(i)]),
                 l = static_cast<std::size_t>(rejected_[static_cast<std::size_t>(i)]);
      check(counted_[w] > 0 && counted_[l] > 0, "dpo_loss: pair ", i,
            " has an empty completion (chosen row ", w, ": ", counted_[w], " tokens, rejected row ",
            l, ": ", counted_[l], " tokens)");
      chosen_tokens += counted_[w];
      is_chosen_[w] = true;
    }
    const double alpha = nll_weight();
    const double n_chosen = step_chosen_tokens_ > 0 ? step_chosen_tokens_ : chosen_tokens;
    nll_coeff_ = alpha > 0 ? -alpha / n_chosen : 0.0;
    sums_.assign(static_cast<std::size_t>(nseq), 0.0);
    seq_coeff_.assign(static_cast<std::size_t>(nseq), 0.0);
    loss_ = 0;
  }

  void statistics(const token_layout& layout, index_t r0, std::span<const double> lp) {
    for (std::size_t i = 0; i < lp.size(); ++i) {
      const index_t r = r0 + static_cast<index_t>(i);
      if (layout.counts(r)) sums_[static_cast<std::size_t>(layout.sequence(r))] += lp[i];
    }
  }

  void end_statistics(const token_layout&) {
    const index_t p = pairs();
    const double inv_p = 1.0 / (step_pairs_ > 0 ? step_pairs_ : static_cast<double>(p));
    margins_.assign(static_cast<std::size_t>(p), 0.0);
    for (index_t i = 0; i < p; ++i) {
      const auto k = static_cast<std::size_t>(i);
      const auto w = static_cast<std::size_t>(chosen_[k]),
                 l = static_cast<std::size_t>(rejected_[k]);
      const double pi_w = sums_[w], pi_l = sums_[l];
      const double beta = opt_.beta, eps = opt_.label_smoothing;
      double loss = 0, d_w = 0, d_l = 0;  // the pair's loss and its derivatives by pi_w, pi_l
      switch (opt_.loss) {
        case dpo_loss_type::sigmoid:
        case dpo_loss_type::ipo:
        case dpo_loss_type::hinge: {
          const double h = (pi_w - ref_w_[k]) - (pi_l - ref_l_[k]);
          check(std::isfinite(h), "dpo_loss: log-ratio margin of pair ", i, " is ", h);
          margins_[k] = h;
          const double u = beta * h;
          double dl_dh = 0;
          if (opt_.loss == dpo_loss_type::sigmoid) {
            // -log sig(u) = softplus(-u); d/du = -sig(-u)
            loss = (1 - eps) * softplus(-u) + eps * softplus(u);
            dl_dh = beta * (-(1 - eps) * sigmoid(-u) + eps * sigmoid(u));
          } else if (opt_.loss == dpo_loss_type::ipo) {
            const double e = h - 1.0 / (2 * beta);
            loss = e * e;
            dl_dh = 2 * e;
          } else {
            loss = std::max(0.0, 1 - u);
            dl_dh = 1 - u > 0 ? -beta : 0.0;
          }
          d_w = dl_dh;
          d_l = -dl_dh;
          break;
        }
        case dpo_loss_type::simpo: {
          const double a_w = pi_w / counted_[w], a_l = pi_l / counted_[l];
          const double u = beta * (a_w - a_l) - opt_.simpo_gamma;
          check(std::isfinite(u), "dpo_loss: SimPO margin of pair ", i, " is ", u);
          margins_[k] = a_w - a_l;
          loss = (1 - eps) * softplus(-u) + eps * softplus(u);
          const double dl_du = -(1 - eps) * sigmoid(-u) + eps * sigmoid(u);
          d_w = dl_du * beta / counted_[w];
          d_l = -dl_du * beta / counted_[l];
          break;
        }
        case dpo_loss_type::orpo: {
          const double a_w = pi_w / counted_[w], a_l = pi_l / counted_[l];
          // log(1 - e^a) for a < 0, accurate near 0 (log(-expm1(a)))
          const double odds =
              (a_w - a_l) - (std::log(-std::expm1(a_w)) - std::log(-std::expm1(a_l)));
          check(std::isfinite(odds), "dpo_loss: ORPO log-odds of pair ", i, " is ", odds,
                " (average log-probs ", a_w, ", ", a_l, ")");
          margins_[k] = odds;
          loss = beta * softplus(-odds);  // -beta log sig(odds)
          const double dl_dodds = -beta * sigmoid(-odds);
          // d odds / d a = 1 / (1 - e^a) for the chosen side, its negative for the rejected
          d_w = dl_dodds / (-std::expm1(a_w)) / counted_[w];
          d_l = -dl_dodds / (-std::expm1(a_l)) / counted_[l];
          break;
        }
      }
      loss_ += loss * inv_p;
      seq_coeff_[w] = d_w * inv_p;
      seq_coeff_[l] = d_l * inv_p;
    }
  }

  double coefficients(const token_layout& layout, index_t r0, std::span<const double> lp,
                      std::span<double> coeff) const {
    double nll = 0;
    for (std::size_t i = 0; i < lp.size(); ++i) {
      const index_t r = r0 + static_cast<index_t>(i);
      const auto b = static_cast<std::size_t>(layout.sequence(r));
      coeff[i] = 0;
      if (!layout.counts(r)) continue;
      coeff[i] = seq_coeff_[b];
      if (is_chosen_[b] && nll_coeff_ != 0) {
        coeff[i] += nll_coeff_;
        nll += nll_coeff_ * lp[i];  // alpha * (-lp) / N
      }
    }
    return nll;
  }

  double finish(double nll) const { return loss_ + nll; }

  index_t pairs() const { return static_cast<index_t>(chosen_.size()); }
  /// Per-sequence log-prob sums of the last statistics pass (B).
  const std::vector<double>& sequence_sums() const { return sums_; }
  /// Per pair of the last batch: h = (pi_w - ref_w) - (pi_l - ref_l) (DPO, IPO, hinge),
  /// a_w - a_l (SimPO), the log-odds (ORPO).
  const std::vector<double>& margins() const { return margins_; }

 private:
  double nll_weight() const { return opt_.loss == dpo_loss_type::orpo ? 1.0 : opt_.rpo_alpha; }
  static double softplus(double x) {
    return x > 0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x));
  }
  static double sigmoid(double x) {
    return x >= 0 ? 1 / (1 + std::exp(-x)) : std::exp(x) / (1 + std::exp(x));
  }

  std::span<const index_t> chosen_, rejected_;
  std::span<const double> ref_w_, ref_l_;
  dpo_options opt_;
  std::vector<double> sums_, seq_coeff_, margins_, counted_;  // (S), (S), (P), (S)
  std::vector<bool> is_chosen_;                               // (S)
  double nll_coeff_ = 0;  // -alpha / chosen tokens: every chosen token's NLL coefficient
  double loss_ = 0;
  double step_pairs_ = 0;          // 0: this batch is the whole step
  double step_chosen_tokens_ = 0;  // 0: this batch's chosen tokens
};

static_assert(StepNormalisedObjective<dpo_loss>);

}  // namespace tightfit
