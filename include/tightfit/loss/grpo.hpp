// tightfit/loss/grpo.hpp: the GRPO policy-gradient objective (DeepSeekMath, Shao et al. 2024,
// arXiv 2402.03300; TRL's GRPOTrainer loss and option names) as a streaming token log-prob
// functor (docs/objectives.md), with GSPO's sequence-level ratio (Zheng et al. 2025, arXiv
// 2507.18071), DAPO's token-level normalisation (Yu et al. 2025, arXiv 2503.14476) and
// two-sided clipping (TRL's `delta`).
//
// Per counted token t of sequence b, with advantage A_b, log-probs lp (current), lp_old
// (the rollout policy; equal to lp, detached, when not given: one inner iteration) and lp_ref:
//   importance_sampling_level token:    r_t = exp(lp_t - lp_old_t)
//   importance_sampling_level sequence: r_t = r_b = exp((1/n_b) sum_t m_t (lp_t - lp_old_t))
//   s  = min(min(r, delta) A, clip(r, 1 - eps_low, 1 + eps_high) A)   (delta: none by default)
//   kl = exp(lp_ref - lp) - (lp_ref - lp) - 1          (k3 estimator; only when beta != 0)
//   l  = -s + beta kl
// ds/dr: A on the unclipped side (0 above delta), A on the clipped side inside the clip range
// and 0 outside it, the mean of the two where both terms are equal (as torch.min splits ties);
// dr_t/dlp_t = r_t at token level, dr_b/dlp_t = r_b m_t / n_b at sequence level (which makes it
// a two-pass objective: the statistics pass sums lp - lp_old per sequence).
// Aggregations (m = counted-target mask, whole sequences, so chunk losses add up exactly; B,
// token counts: those of the whole step when use_step_counts gave them):
//   grpo     (1/B) sum_b (sum_t m l) / (sum_t m)      a sequence with no counted token adds 0
//   bnpo     (sum m l) / (sum m)                      token level; 0 if nothing counts
//   dapo     (sum m l) / (sum m)                      token level over the whole step (TRL's
//                                                     default: the same as bnpo here, since
//                                                     tightfit always normalises by the step)
//   dr_grpo  (sum m l) / (B * L_max)                  L_max: max_completion_length, default T
// mask_truncated_completions (DAPO's overlong filtering) is a batch transformation:
// mask_truncated_completions() below drops the targets of completions that did not end with a
// stop token, before the objective sees them.
// Packed batches (token_layout::documents): every document is one completion b (its advantage,
// its counted tokens, its sequence-level ratio); B above is then the number of documents.
// Bad input (sizes, NaN/inf advantages or log-probs of counted tokens, eps < 0, delta <= 1,
// beta != 0 without lp_ref) throws tightfit::error naming the value.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "tightfit/core/error.hpp"
#include "tightfit/loss/objective.hpp"

namespace tightfit {

enum class grpo_aggregation { grpo, bnpo, dapo, dr_grpo };
enum class importance_sampling_level { token, sequence };

/// "grpo", "bnpo", "dapo" or "dr_grpo" (TRL's loss_type names).
inline grpo_aggregation parse_grpo_aggregation(const std::string& s) {
  if (s == "grpo") return grpo_aggregation::grpo;
  if (s == "bnpo") return grpo_aggregation::bnpo;
  if (s == "dapo") return grpo_aggregation::dapo;
  if (s == "dr_grpo") return grpo_aggregation::dr_grpo;
  fail("unknown GRPO loss type '", s, "', expected grpo, bnpo, dapo or dr_grpo");
}

/// "token" or "sequence" (TRL's importance_sampling_level).
inline importance_sampling_level parse_importance_sampling_level(const std::string& s) {
  if (s == "token") return importance_sampling_level::token;
  if (s == "sequence") return importance_sampling_level::sequence;
  fail("unknown importance sampling level '", s, "', expected token or sequence");
}

struct grpo_options {
  double epsilon_low = 0.2;
  double epsilon_high = 0.2;
  double beta = 0.0;   ///< KL weight
  double delta = 0.0;  ///< upper bound of the unclipped ratio (two-sided clipping); 0: none
  grpo_aggregation aggregation = grpo_aggregation::grpo;
  importance_sampling_level level = importance_sampling_level::token;
  index_t max_completion_length = 0;  ///< L_max of dr_grpo; 0: the batch's T
};

/// DAPO's overlong filtering (TRL's mask_truncated_completions): a completion whose last valid
/// input token is not one of `stop_ids` (EOS) was truncated, and none of its targets count.
/// targets, input_ids (B*T); lengths (B) or empty for all T; position_ids (B*T) or empty: with
/// them, every document of a packed row is a completion (its last token: the one before the
/// next document, or the row's last valid one). Returns the completions masked.
inline index_t mask_truncated_completions(std::span<token_id> targets,
                                          std::span<const token_id> input_ids, index_t batch,
                                          index_t seq_len, std::span<const index_t> lengths,
                                          std::span<const token_id> stop_ids,
                                          std::span<const index_t> position_ids = {}) {
  check(!stop_ids.empty(), "mask_truncated_completions: no stop token id given");
  check_extent("mask_truncated_completions", "targets.size", static_cast<index_t>(targets.size()),
               batch * seq_len);
  check_extent("mask_truncated_completions", "input_ids.size",
               static_cast<index_t>(input_ids.size()), batch * seq_len);
  if (!position_ids.empty())
    check_extent("mask_truncated_completions", "position_ids.size",
                 static_cast<index_t>(position_ids.size()), batch * seq_len);
  index_t masked = 0;
  for (index_t b = 0; b < batch; ++b) {
    const index_t len = lengths.empty() ? seq_len : lengths[static_cast<std::size_t>(b)];
    check(len >= 1 && len <= seq_len, "mask_truncated_completions: lengths[", b, "] is ", len);
    // documents [start, end) of the row's valid positions
    for (index_t start = 0; start < len;) {
      index_t end = start + 1;
      while (end < len && !position_ids.empty() &&
             position_ids[static_cast<std::size_t>(b * seq_len + end)] != 0)
        ++end;
      if (position_ids.empty()) end = len;
      const token_id last = input_ids[static_cast<std::size_t>(b * seq_len + end - 1)];
      if (std::find(stop_ids.begin(), stop_ids.end(), last) == stop_ids.end()) {
        // the document's targets, and the padding's after the row's last document
        const index_t stop = end == len ? seq_len : end;
        std::fill(targets.begin() + b * seq_len + start, targets.begin() + b * seq_len + stop,
                  ignore_index);
        ++masked;
      }
      start = end;
    }
  }
  return masked;
}

/// GRPO over B sequences. Spans are borrowed: they must outlive the objective.
class grpo_loss {
 public:
  /// advantages (one per sequence: B, or D documents of a packed batch in row-major order);
  /// old_logprobs, ref_logprobs (B*T) aligned with the targets (may be empty). The options go
  /// by reference: GCC 12.2 at -O2 with AVX-512 miscompiles this struct passed by value (the
  /// copy becomes epsilon_low broadcast over the four doubles, so delta reads 0.2).
  grpo_loss(std::span<const double> advantages, std::span<const double> old_logprobs,
            std::span<const double> ref_logprobs, const grpo_options& options = {})
      : adv_(advantages), old_(old_logprobs), ref_(ref_logprobs), opt_(options) {
    check(opt_.epsilon_low >= 0 && opt_.epsilon_low < 1, "grpo_loss: epsilon_low is ",
          opt_.epsilon_low, ", expected in [0, 1)");
    check(opt_.epsilon_high >= 0, "grpo_loss: epsilon_high is ", opt_.epsilon_high,
          ", expected >= 0");
    check(std::isfinite(opt_.beta), "grpo_loss: beta is ", opt_.beta, ", expected finite");
    check(opt_.delta == 0 || (opt_.delta > 1 && std::isfinite(opt_.delta)), "grpo_loss: delta is ",
          opt_.delta, ", expected > 1 (TRL recommends > 1 + epsilon_high) or 0 for none");
    check(opt_.beta == 0 || !ref_.empty(), "grpo_loss: beta is ", opt_.beta,
          " but no reference log-probs were given");
  }

  /// Two passes at sequence level (the ratio needs the whole sequence), one at token level.
  bool statistics_pass() const { return opt_.level == importance_sampling_level::sequence; }

  /// Sequences and counted completion tokens of `layout`.
  objective_counts local_counts(const token_layout& layout) const { return count_targets(layout); }
  /// Normalise by the sequences and completion tokens of the whole step (micro-batches, ranks):
  /// grpo divides by the step's B, bnpo/dapo by its tokens, dr_grpo by its B (times L_max,
  /// which must then be given as max_completion_length unless every piece has the same T).
  void use_step_counts(const objective_counts& step) {
    check(step.sequences >= 1, "grpo_loss: step sequence count is ", step.sequences,
          ", expected >= 1");
    step_ = step;
    has_step_ = true;
  }

  void begin(const token_layout& layout) {
    const index_t rows = layout.rows();
    const index_t nseq = layout.sequences();  // rows, or documents of a packed batch
    check_extent("grpo_loss", "advantages.size", static_cast<index_t>(adv_.size()), nseq);
    if (!old_.empty())
      check_extent("grpo_loss", "old_logprobs.size", static_cast<index_t>(old_.size()), rows);
    if (!ref_.empty())
      check_extent("grpo_loss", "ref_logprobs.size", static_cast<index_t>(ref_.size()), rows);
    for (index_t b = 0; b < nseq; ++b)
      check(std::isfinite(adv_[static_cast<std::size_t>(b)]), "grpo_loss: advantages[", b, "] is ",
            adv_[static_cast<std::size_t>(b)], ", expected a finite number");
    const auto nb = static_cast<std::size_t>(nseq);
    weight_.assign(nb, 0.0);
    count_.assign(nb, 0.0);
    double total = 0;
    for (index_t r = 0; r < rows; ++r) {
      if (!layout.counts(r)) continue;
      count_[static_cast<std::size_t>(layout.sequence(r))] += 1;
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
    const double bsz = has_step_ ? step_.sequences : static_cast<double>(nseq);
    if (has_step_) total = step_.tokens;
    const double lmax = static_cast<double>(
        opt_.max_completion_length > 0 ? opt_.max_completion_length : layout.seq_len);
    for (std::size_t b = 0; b < nb; ++b) {
      switch (opt_.aggregation) {
        case grpo_aggregation::grpo:
          weight_[b] = count_[b] > 0 ? 1.0 / (bsz * count_[b]) : 0.0;
          break;
        case grpo_aggregation::bnpo:
        case grpo_aggregation::dapo:
          weight_[b] = total > 0 ? 1.0 / total : 0.0;
          break;
        case grpo_aggregation::dr_grpo:
          weight_[b] = 1.0 / (bsz * lmax);
          break;
      }
    }
    log_ratio_sum_.assign(nb, 0.0);
    seq_ratio_.assign(nb, 1.0);
    seq_ds_.assign(nb, 0.0);
    seq_s_.assign(nb, 0.0);
  }

  /// Sequence level, pass 1: sums m (lp - lp_old) per sequence.
  void statistics(const token_layout& layout, index_t r0, std::span<const double> lp) {
    for (std::size_t i = 0; i < lp.size(); ++i) {
      const index_t r = r0 + static_cast<index_t>(i);
      if (!layout.counts(r)) continue;
      check(std::isfinite(lp[i]), "grpo_loss: log-prob of row ", r, " is ", lp[i]);
      const double old = old_.empty() ? lp[i] : old_[static_cast<std::size_t>(r)];
      log_ratio_sum_[static_cast<std::size_t>(layout.sequence(r))] += lp[i] - old;
    }
  }
  /// Sequence level: the ratio r_b, the clipped objective s_b and ds_b/dr_b of every sequence.
  void end_statistics(const token_layout& layout) {
    for (index_t b = 0; b < layout.sequences(); ++b) {
      const auto k = static_cast<std::size_t>(b);
      const double ratio = std::exp(log_ratio_sum_[k] / std::max(1.0, count_[k]));
      const auto [s, ds] = surrogate(ratio, adv_[k]);
      seq_ratio_[k] = ratio;
      seq_s_[k] = s;
      seq_ds_[k] = ds;
    }
  }

  double coefficients(const token_layout& layout, index_t r0, std::span<const double> lp,
                      std::span<double> coeff) const {
    const bool sequence = opt_.level == importance_sampling_level::sequence;
    double part = 0;
    for (std::size_t i = 0; i < lp.size(); ++i) {
      const index_t r = r0 + static_cast<index_t>(i);
      coeff[i] = 0;
      if (!layout.counts(r)) continue;
      const auto b = static_cast<std::size_t>(layout.sequence(r));
      const double w = weight_[b];
      const double x = lp[i];
      check(std::isfinite(x), "grpo_loss: log-prob of row ", r, " is ", x);
      double l = 0, dl = 0;
      if (sequence) {
        // s_b enters every counted token of b; dr_b/dlp_t = r_b / n_b, and the n_b tokens'
        // weights add up to w n_b, so each token carries -ds_b r_b (times w).
        l = -seq_s_[b];
        dl = -seq_ds_[b] * seq_ratio_[b];
      } else {
        const double old = old_.empty() ? x : old_[static_cast<std::size_t>(r)];
        const double ratio = std::exp(x - old);
        const auto [s, ds] = surrogate(ratio, adv_[b]);
        l = -s;
        dl = -ds * ratio;
      }
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
  /// s = min(min(r, delta) A, clip(r) A) and ds/dr (ties: the mean, as torch.min splits them).
  std::pair<double, double> surrogate(double ratio, double a) const {
    const double cap = opt_.delta > 0 ? opt_.delta : std::numeric_limits<double>::infinity();
    const double lo = 1.0 - opt_.epsilon_low, hi = 1.0 + opt_.epsilon_high;
    const double t1 = std::min(ratio, cap) * a, d1 = ratio < cap ? a : 0.0;
    const double t2 = std::clamp(ratio, lo, hi) * a, d2 = ratio >= lo && ratio <= hi ? a : 0.0;
    if (t1 < t2) return {t1, d1};
    if (t2 < t1) return {t2, d2};
    return {t1, 0.5 * (d1 + d2)};
  }

  std::span<const double> adv_, old_, ref_;
  grpo_options opt_;
  std::vector<double> weight_;  // (S) sequences: per-token weight of each sequence
  std::vector<double> count_;   // (S) counted tokens of each sequence
  std::vector<double> log_ratio_sum_, seq_ratio_, seq_s_, seq_ds_;  // (S) sequence level
  objective_counts step_;
  bool has_step_ = false;
};

static_assert(StepNormalisedObjective<grpo_loss>);

}  // namespace tightfit
