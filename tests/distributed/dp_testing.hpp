// Helpers of the data-parallel / accumulation tests: pieces of one step (a rank's micro-batch),
// the union batch one process would run, and each objective set up for both, from seeds, so
// that every rank can build every piece and the union by itself.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "stream/stream_testing.hpp"
#include "support/testing.hpp"
#include "tightfit/loss/dpo.hpp"
#include "tightfit/loss/grpo.hpp"
#include "tightfit/loss/sft.hpp"
#include "tightfit/nn/decoder_layer.hpp"

namespace tightfit::testing {

/// One piece: B rows of T positions (random lengths, random ignored targets), per-row GRPO
/// advantages, per-position old/ref log-probs, DPO pairs (row p, row p + B/2) and their
/// reference sums.
struct piece {
  random_batch rows;
  std::vector<double> advantages, old_lp, ref_lp, ref_w, ref_l;
  std::vector<index_t> chosen, rejected;

  piece(index_t b, index_t t, index_t vocab, std::uint64_t seed)
      : rows(b, t, vocab, lengths_for(b, t, seed), seed, 0.25) {
    // The last valid position predicts nothing (as shift_labels leaves it), so that a row
    // means the same in its piece and padded in the union; every row predicts at least one
    // token (DPO refuses empty completions).
    for (index_t r = 0; r < b; ++r) {
      bool any = false;
      const index_t len = rows.lengths[static_cast<std::size_t>(r)];
      rows.targets[static_cast<std::size_t>(r * t + len - 1)] = ignore_index;
      for (index_t s = 0; s < len - 1; ++s)
        any = any || rows.targets[static_cast<std::size_t>(r * t + s)] != ignore_index;
      if (!any) rows.targets[static_cast<std::size_t>(r * t)] = static_cast<token_id>(seed % vocab);
    }
    std::mt19937_64 gen(seed * 7919 + 1);
    std::uniform_real_distribution<double> u(-1, 1);
    for (index_t i = 0; i < b; ++i) advantages.push_back(u(gen));
    for (index_t i = 0; i < b * t; ++i) {
      old_lp.push_back(-3.6 + 0.3 * u(gen));
      ref_lp.push_back(-3.6 + 0.3 * u(gen));
    }
    for (index_t p = 0; p < b / 2; ++p) {
      chosen.push_back(p);
      rejected.push_back(p + b / 2);
      ref_w.push_back(-20 + u(gen));
      ref_l.push_back(-20 + u(gen));
    }
  }
  static std::vector<index_t> lengths_for(index_t b, index_t t, std::uint64_t seed) {
    std::vector<index_t> lens;
    for (index_t i = 0; i < b; ++i)
      lens.push_back(std::max<index_t>(2, t - static_cast<index_t>((seed + 3 * i) % 3)));
    return lens;
  }
};

/// The union of pieces as one batch: rows concatenated, padded on the right to the longest T.
struct union_batch {
  random_batch rows{1, 1, 2, {}, 0};
  std::vector<double> advantages, old_lp, ref_lp, ref_w, ref_l;
  std::vector<index_t> chosen, rejected;

  explicit union_batch(const std::vector<const piece*>& pieces) {
    index_t b = 0, t = 0;
    for (const piece* p : pieces) {
      b += p->rows.batch;
      t = std::max(t, p->rows.seq_len);
    }
    rows.batch = b;
    rows.seq_len = t;
    rows.ids.assign(static_cast<std::size_t>(b * t), 0);
    rows.targets.assign(static_cast<std::size_t>(b * t), ignore_index);
    rows.lengths.clear();
    old_lp.assign(static_cast<std::size_t>(b * t), 0.0);
    ref_lp.assign(static_cast<std::size_t>(b * t), 0.0);
    index_t row0 = 0;
    for (const piece* p : pieces) {
      const index_t pt = p->rows.seq_len;
      for (index_t r = 0; r < p->rows.batch; ++r) {
        rows.lengths.push_back(p->rows.lengths[static_cast<std::size_t>(r)]);
        advantages.push_back(p->advantages[static_cast<std::size_t>(r)]);
        for (index_t s = 0; s < pt; ++s) {
          const auto from = static_cast<std::size_t>(r * pt + s);
          const auto to = static_cast<std::size_t>((row0 + r) * t + s);
          rows.ids[to] = p->rows.ids[from];
          rows.targets[to] = p->rows.targets[from];
          old_lp[to] = p->old_lp[from];
          ref_lp[to] = p->ref_lp[from];
        }
      }
      for (std::size_t k = 0; k < p->chosen.size(); ++k) {
        chosen.push_back(row0 + p->chosen[k]);
        rejected.push_back(row0 + p->rejected[k]);
        ref_w.push_back(p->ref_w[k]);
        ref_l.push_back(p->ref_l[k]);
      }
      row0 += p->rows.batch;
    }
  }
};

/// The objectives the tests run: "sft", "grpo", "bnpo", "dr_grpo", "dpo", "ipo".
struct objective_spec {
  std::string name;
  index_t max_completion_length = 0;  ///< dr_grpo's L_max (fixed: pieces have different T)
};

inline grpo_options grpo_opts(const objective_spec& s) {
  grpo_options o;
  o.beta = 0.04;
  o.epsilon_low = 0.2;
  o.epsilon_high = 0.28;
  o.aggregation = s.name == "bnpo"      ? grpo_aggregation::bnpo
                  : s.name == "dr_grpo" ? grpo_aggregation::dr_grpo
                                        : grpo_aggregation::grpo;
  o.max_completion_length = s.max_completion_length;
  return o;
}

inline dpo_options dpo_opts(const objective_spec& s) {
  dpo_options o;
  o.beta = 0.1;
  o.label_smoothing = s.name == "dpo" ? 0.1 : 0.0;
  o.loss = s.name == "ipo" ? dpo_loss_type::ipo : dpo_loss_type::sigmoid;
  return o;
}

/// SFT, GRPO or DPO behind one type (so that the pieces of a step can hold any of them).
struct test_objective {
  std::variant<sft_loss, grpo_loss, dpo_loss> v;

  template <class F>
  decltype(auto) visit(F&& f) {
    return std::visit(std::forward<F>(f), v);
  }
  template <class F>
  decltype(auto) visit(F&& f) const {
    return std::visit(std::forward<F>(f), v);
  }
  bool statistics_pass() const {
    return visit([](const auto& o) { return static_cast<bool>(o.statistics_pass()); });
  }
  void begin(const token_layout& l) {
    visit([&](auto& o) { o.begin(l); });
  }
  void statistics(const token_layout& l, index_t r0, std::span<const double> lp) {
    visit([&](auto& o) { o.statistics(l, r0, lp); });
  }
  void end_statistics(const token_layout& l) {
    visit([&](auto& o) { o.end_statistics(l); });
  }
  double coefficients(const token_layout& l, index_t r0, std::span<const double> lp,
                      std::span<double> coeff) const {
    return visit([&](const auto& o) { return o.coefficients(l, r0, lp, coeff); });
  }
  double finish(double sum) const {
    return visit([&](const auto& o) { return o.finish(sum); });
  }
  objective_counts local_counts(const token_layout& l) const {
    return visit([&](const auto& o) { return o.local_counts(l); });
  }
  void use_step_counts(const objective_counts& c) {
    visit([&](auto& o) { o.use_step_counts(c); });
  }
};
static_assert(StepNormalisedObjective<test_objective>);

/// The objective of `spec` over data `d` (a piece or the union; d must outlive it).
template <class Data>
test_objective make_objective(const objective_spec& spec, const Data& d) {
  if (spec.name == "sft") return {sft_loss{}};
  if (spec.name == "dpo" || spec.name == "ipo")
    return {dpo_loss(d.chosen, d.rejected, d.ref_w, d.ref_l, dpo_opts(spec))};
  return {grpo_loss(d.advantages, d.old_lp, d.ref_lp, grpo_opts(spec))};
}

/// Every gradient of a model, flattened per parameter.
template <class M>
std::vector<std::vector<double>> model_grads(M& model) {
  return grads_of(model.parameters());
}

/// The largest relative difference over every parameter's gradient (infinite on a shape
/// mismatch).
inline double max_grads_rel_diff(const std::vector<std::vector<double>>& a,
                                 const std::vector<std::vector<double>>& b) {
  if (a.size() != b.size()) return INFINITY;
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, max_rel_diff(a[i], b[i]));
  return worst;
}

/// The weights every rank draws from the same seed.
inline void seed_weights(llama_model<reference_backend<double>>& model) {
  model.init_random(7, 0.3, 0.2);
}

/// Loss and gradients of one process on the union of `pieces`.
struct union_result {
  double loss = 0;
  std::vector<std::vector<double>> grads;
  objective_counts counts;
};
inline union_result run_union(const model_config& cfg, const std::vector<const piece*>& pieces,
                              const objective_spec& spec, const backward_options& opt) {
  reference_backend<double> be;
  llama_model<reference_backend<double>> model(be, cfg);
  seed_weights(model);
  const union_batch u(pieces);
  test_objective objective = make_objective(spec, u);
  union_result out;
  const std::vector<token_id> targets = detail::masked_targets(u.rows.view());
  out.counts =
      objective.local_counts(token_layout{u.rows.batch, u.rows.seq_len, targets, u.rows.lengths});
  out.loss = compute_gradients(model, u.rows.view(), objective, opt).loss;
  out.grads = model_grads(model);
  return out;
}

}  // namespace tightfit::testing
