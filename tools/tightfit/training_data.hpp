// The data of `tightfit train` per objective, and the objective each step's batch gets.
//
//   sft:  a token table (io/token_file.hpp): input_ids, optional labels and position_ids (N, T).
//   grpo: input_ids, labels (N, T), optional attention_mask (N, T) or lengths (N); advantages (N)
//         or rewards (N) with --num-generations G (TRL's group advantages: rows [gG, gG + G)
//         are one prompt's completions, A = r - mean, divided by std + 1e-4 unless
//         --scale-rewards none); optional ref_logprobs (N, T) aligned with labels. The old
//         log-probs are the policy's own at each step (one inner iteration: the ratio is 1, as
//         TRL's default num_iterations = 1).
//   dpo:  chosen_input_ids, chosen_labels, rejected_input_ids, rejected_labels (P, T), optional
//         chosen_/rejected_attention_mask, optional ref_chosen_logps, ref_rejected_logps (P).
//         Pair i becomes data rows 2i (chosen) and 2i + 1 (rejected), a unit train() never
//         splits (row_order_options::unit 2).
// Reference log-probs a file does not hold (DPO's sums for sigmoid / ipo / hinge, GRPO's
// per-token ones when beta > 0) are computed once, by the model as loaded, before any step
// (compute_references): the frozen reference of TRL, and the base model for LoRA.
// Padding: labels outside the attention mask become -100; right padding comes after every valid
// position, so a causal model's log-probs of the valid positions do not see it, and the rows are
// trained without the mask. Packed rows (position_ids) train sft only.
// row_objective is the step's objective for grpo and dpo: it owns the values it reads (the
// advantages and reference log-probs of the batch's rows), so train() may keep it for the step.
#pragma once

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "args.hpp"
#include "batch_file.hpp"
#include "checks.hpp"
#include "objective_args.hpp"
#include "tightfit/core/error.hpp"
#include "tightfit/io/safetensors.hpp"
#include "tightfit/io/token_file.hpp"
#include "tightfit/loss/dpo.hpp"
#include "tightfit/loss/grpo.hpp"
#include "tightfit/optim/train.hpp"
#include "tightfit/stream/forward.hpp"

namespace tightfit::cli {

/// A data set of `tightfit train` (see the top comment).
struct training_data {
  std::string objective = "sft";
  token_dataset rows;                            ///< dpo: pair i is rows 2i, 2i + 1
  std::vector<double> advantages;                ///< grpo (N)
  std::vector<double> ref_logprobs;              ///< grpo (N*T) target-aligned, or empty
  std::vector<double> ref_chosen, ref_rejected;  ///< dpo (P), or empty
  /// Rows train() keeps together: a DPO pair.
  index_t unit() const { return objective == "dpo" ? 2 : 1; }
};

/// The tensors train reads for `objective` (grpo and dpo: an unknown tensor is an error).
inline std::vector<std::string> training_keys(const std::string& objective) {
  if (objective == "grpo")
    return {"input_ids",  "labels",  "attention_mask", "lengths",
            "advantages", "rewards", "ref_logprobs"};
  auto keys = batch_keys("dpo");
  std::erase_if(keys, [](const std::string& k) { return k.find("position_ids") != k.npos; });
  return keys;
}

/// TRL's group advantages of `rewards` (N) in groups of `group` consecutive rows: r - mean, over
/// the group's unbiased standard deviation + 1e-4 when `scale`.
inline std::vector<double> group_advantages(const std::vector<double>& rewards, index_t group,
                                            bool scale) {
  const auto n = static_cast<index_t>(rewards.size());
  check(group >= 2 && n % group == 0, "--num-generations is ", group, ", expected >= 2 and a ",
        "divisor of the ", n, " rows (each group: one prompt's completions, consecutive rows)");
  std::vector<double> adv(rewards.size());
  for (index_t g = 0; g < n; g += group) {
    double mean = 0, var = 0;
    for (index_t i = g; i < g + group; ++i) mean += rewards[static_cast<std::size_t>(i)];
    mean /= static_cast<double>(group);
    for (index_t i = g; i < g + group; ++i) {
      const double d = rewards[static_cast<std::size_t>(i)] - mean;
      var += d * d;
    }
    const double sd = std::sqrt(var / static_cast<double>(group - 1));
    for (index_t i = g; i < g + group; ++i) {
      const double d = rewards[static_cast<std::size_t>(i)] - mean;
      adv[static_cast<std::size_t>(i)] = scale ? d / (sd + 1e-4) : d;
    }
  }
  return adv;
}

/// What decides GRPO's advantages when the file holds rewards.
struct reward_options {
  index_t num_generations = 0;  ///< 0: not given
  bool scale = true;            ///< --scale-rewards group (true) or none
};

/// Reads the data of `objective` from `path` (see the top comment); objective options `oa`
/// (--mask-truncated-completions, --eos-token-id).
inline training_data read_training_data(const std::string& path, const std::string& objective,
                                        const arguments& oa, const reward_options& rewards) {
  training_data d;
  d.objective = objective;
  if (objective == "sft") {
    check_token_table_fits(path);
    auto table = read_token_table(path);
    d.rows = token_dataset(table.rows, table.seq_len, std::move(table.input_ids),
                           std::move(table.labels), std::move(table.position_ids));
    return d;
  }
  const auto f = safetensors_file::open(path);
  check_known_tensors(f, training_keys(objective), "train --objective " + objective);
  const auto [b, t] = batch_extents(f, objective);
  if (b > 0 && t > 0) {
    const auto bytes = checked_product(
        {static_cast<std::uint64_t>(b), static_cast<std::uint64_t>(t), data_host_bytes_per_token});
    check(bytes.has_value(), path, ": (", b, ", ", t, ") holds more tokens than 64-bit counts");
    check_memory(path + ": " + std::to_string(b) + " rows of " + std::to_string(t) + " tokens",
                 *bytes);
  }
  loaded_batch lb = read_batch(f, objective);
  if (objective == "grpo") {
    check(f.contains("advantages") != f.contains("rewards"), f.source(),
          ": give advantages (N) or rewards (N) with --num-generations, not ",
          f.contains("advantages") ? "both" : "neither");
    if (f.contains("rewards")) {
      check(rewards.num_generations > 0, f.source(),
            ": the file holds rewards; --num-generations G says how many consecutive rows are "
            "one prompt's completions");
      d.advantages =
          group_advantages(read_floats(f, "rewards", lb.b), rewards.num_generations, rewards.scale);
    } else {
      check(rewards.num_generations == 0, f.source(),
            ": --num-generations groups rewards, and the file holds advantages");
      d.advantages = read_floats(f, "advantages", lb.b);
    }
    if (f.contains("ref_logprobs"))
      d.ref_logprobs = shift_values(read_floats(f, "ref_logprobs", lb.b * lb.t), lb.b, lb.t);
    if (oa.has("--mask-truncated-completions")) {
      const auto stop = parse_token_ids("--eos-token-id", oa.get("--eos-token-id"));
      mask_truncated_completions(lb.targets, lb.ids, lb.b, lb.t, lb.lengths, stop);
      for (index_t r = 0; r < lb.b; ++r)  // the labels the masked targets came from
        for (index_t p = 0; p + 1 < lb.t; ++p)
          lb.labels[static_cast<std::size_t>(r * lb.t + p + 1)] =
              lb.targets[static_cast<std::size_t>(r * lb.t + p)];
    }
    d.rows = token_dataset(lb.b, lb.t, std::move(lb.ids), std::move(lb.labels));
    return d;
  }
  // dpo: chosen rows [0, P), rejected rows [P, 2P) interleaved into pairs
  const index_t p = lb.pairs();
  check(lb.chosen_rows == p && lb.b == 2 * p, f.source(), ": ", lb.chosen_rows, " chosen rows and ",
        lb.b - lb.chosen_rows, " rejected ones; pair i is row i of each");
  std::vector<token_id> ids, labels;
  const auto t_ = static_cast<std::size_t>(lb.t);
  for (index_t i = 0; i < p; ++i)
    for (const index_t r : {i, p + i}) {
      const auto from = static_cast<std::ptrdiff_t>(static_cast<std::size_t>(r) * t_);
      const auto to = from + static_cast<std::ptrdiff_t>(t_);
      ids.insert(ids.end(), lb.ids.begin() + from, lb.ids.begin() + to);
      labels.insert(labels.end(), lb.labels.begin() + from, lb.labels.begin() + to);
    }
  if (f.contains("ref_chosen_logps") || f.contains("ref_rejected_logps")) {
    d.ref_chosen = read_floats(f, "ref_chosen_logps", p);
    d.ref_rejected = read_floats(f, "ref_rejected_logps", p);
  }
  d.rows = token_dataset(2 * p, lb.t, std::move(ids), std::move(labels));
  return d;
}

/// Whether the reference log-probs must be computed (the file has none and the objective reads
/// them).
inline bool needs_references(const training_data& d, const arguments& oa) {
  if (d.objective == "dpo")
    return d.ref_chosen.empty() && needs_reference(dpo_options_from(oa).loss);
  if (d.objective == "grpo") return d.ref_logprobs.empty() && grpo_options_from(oa).beta != 0;
  return false;
}

/// The reference log-probs of every row by `model` (the model as loaded, before any step),
/// forward only, `rows_per_pass` rows at a time (even: whole DPO pairs).
template <class M>
void compute_references(M& model, training_data& d, index_t rows_per_pass,
                        const forward_options& fo) {
  const index_t n = d.rows.rows(), t = d.rows.seq_len();
  rows_per_pass = std::max<index_t>(d.unit(), rows_per_pass - rows_per_pass % d.unit());
  for (index_t first = 0; first < n; first += rows_per_pass) {
    const index_t b = std::min(rows_per_pass, n - first);
    const dataset_batch batch = make_batch(d.rows, first, b);
    if (d.objective == "grpo") {
      const auto lp = model_logprobs(model, batch.view(), fo);  // (b*T) target-aligned
      d.ref_logprobs.insert(d.ref_logprobs.end(), lp.begin(), lp.end());
    } else {
      const auto sums = sequence_logprob_sums(model, batch.view(), fo);  // (b) per row
      for (index_t r = 0; r < b; r += 2) {
        d.ref_chosen.push_back(sums[static_cast<std::size_t>(r)]);
        d.ref_rejected.push_back(sums[static_cast<std::size_t>(r + 1)]);
      }
    }
  }
  for (std::size_t i = 0; i < d.ref_logprobs.size(); ++i)
    check(std::isfinite(d.ref_logprobs[i]), "the reference log-prob of row ",
          static_cast<index_t>(i) / t, ", position ", static_cast<index_t>(i) % t, " is ",
          d.ref_logprobs[i], " (not finite)");
  for (std::size_t i = 0; i < d.ref_chosen.size(); ++i)
    check(std::isfinite(d.ref_chosen[i]) && std::isfinite(d.ref_rejected[i]),
          "the reference sums of pair ", i, " are ", d.ref_chosen[i], " and ", d.ref_rejected[i],
          " (not finite)");
}

/// The objective of one batch of GRPO or DPO rows: the library's grpo_loss or dpo_loss over the
/// values of the batch's rows, which it owns (the loss borrows them; moving keeps the buffers,
/// copying is refused).
class row_objective {
  // the loss that is set (defined first: the members below deduce their types from it)
  template <class F>
  decltype(auto) on_loss(F&& f) {
    return grpo_ ? f(*grpo_) : f(*dpo_);
  }
  template <class F>
  decltype(auto) on_loss(F&& f) const {
    return grpo_ ? f(*grpo_) : f(*dpo_);
  }

 public:
  row_objective(const training_data& d, const dataset_batch& b, const grpo_options& go,
                const dpo_options& dopt) {
    const auto t = static_cast<std::size_t>(b.seq_len);
    if (d.objective == "grpo") {
      for (const index_t r : b.rows) {
        adv_.push_back(d.advantages[static_cast<std::size_t>(r)]);
        if (!d.ref_logprobs.empty()) {
          const auto from = d.ref_logprobs.begin() + static_cast<std::ptrdiff_t>(r * t);
          ref_.insert(ref_.end(), from, from + static_cast<std::ptrdiff_t>(t));
        }
      }
      grpo_.emplace(adv_, std::span<const double>{}, ref_, go);
      return;
    }
    for (std::size_t k = 0; k + 1 < b.rows.size(); k += 2) {
      const index_t pair = b.rows[k] / 2;
      check(b.rows[k] == 2 * pair && b.rows[k + 1] == 2 * pair + 1, "row_objective: batch rows ",
            b.rows[k], ", ", b.rows[k + 1], " are not a pair");
      chosen_.push_back(static_cast<index_t>(k));
      rejected_.push_back(static_cast<index_t>(k + 1));
      if (!d.ref_chosen.empty()) {
        ref_.push_back(d.ref_chosen[static_cast<std::size_t>(pair)]);
        adv_.push_back(d.ref_rejected[static_cast<std::size_t>(pair)]);  // the rejected sums
      }
    }
    dpo_.emplace(chosen_, rejected_, ref_, adv_, dopt);
  }
  row_objective(row_objective&&) noexcept = default;
  row_objective& operator=(row_objective&&) noexcept = default;
  row_objective(const row_objective&) = delete;
  row_objective& operator=(const row_objective&) = delete;

  bool statistics_pass() const {
    return on_loss([](const auto& l) { return l.statistics_pass(); });
  }
  void begin(const token_layout& layout) {
    on_loss([&](auto& l) { l.begin(layout); });
  }
  void statistics(const token_layout& layout, index_t r0, std::span<const double> lp) {
    on_loss([&](auto& l) { l.statistics(layout, r0, lp); });
  }
  void end_statistics(const token_layout& layout) {
    on_loss([&](auto& l) { l.end_statistics(layout); });
  }
  double coefficients(const token_layout& layout, index_t r0, std::span<const double> lp,
                      std::span<double> coeff) {
    return on_loss([&](auto& l) { return l.coefficients(layout, r0, lp, coeff); });
  }
  double finish(double sum) {
    return on_loss([&](auto& l) { return l.finish(sum); });
  }
  objective_counts local_counts(const token_layout& layout) const {
    return on_loss([&](const auto& l) { return l.local_counts(layout); });
  }
  void use_step_counts(const objective_counts& c) {
    on_loss([&](auto& l) { l.use_step_counts(c); });
  }

 private:
  // grpo: the rows' advantages (B) and reference log-probs (B*T); dpo: the pairs' sequences,
  // reference chosen sums in ref_ and rejected sums in adv_ (P)
  std::vector<double> adv_, ref_;
  std::vector<index_t> chosen_, rejected_;
  std::optional<grpo_loss> grpo_;  // one of the two is set
  std::optional<dpo_loss> dpo_;
};

static_assert(StepNormalisedObjective<row_objective>);

/// train()'s objective factory for grpo and dpo: a row_objective per batch.
struct row_objective_factory {
  const training_data* data = nullptr;
  grpo_options grpo;
  dpo_options dpo;
  row_objective operator()(const dataset_batch& b) const { return {*data, b, grpo, dpo}; }
};

}  // namespace tightfit::cli
