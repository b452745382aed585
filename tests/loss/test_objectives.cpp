// Objectives: SFT variants, GRPO, DPO under every schedule against the dense formula
// (written here independently of loss/*.hpp) and finite differences; degenerate input.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "stream/stream_testing.hpp"
#include "support/testing.hpp"
#include "tightfit/loss/dpo.hpp"
#include "tightfit/loss/grpo.hpp"
#include "tightfit/nn/decoder_layer.hpp"
#include "tightfit/stream/forward.hpp"

using namespace tightfit;
using tightfit::testing::grads_of;
using tightfit::testing::random_batch;
using tightfit::testing::tiny_config;

namespace {

using ref = reference_backend<double>;

/// Label log-probs with the logits of the whole batch materialised at once.
std::vector<double> dense_logprobs(llama_model<ref>& model, const random_batch& batch,
                                   double tau = 1.0) {
  forward_options o;
  o.chunk = batch.seq_len;
  o.head_chunk_rows = batch.batch * batch.seq_len;
  o.temperature = tau;
  return model_logprobs(model, batch.view(), o);
}

bool counted(const random_batch& b, index_t r) {
  const index_t len =
      b.lengths.empty() ? b.seq_len : b.lengths[static_cast<std::size_t>(r / b.seq_len)];
  // a padded row's last valid position predicts a padding token: never counted
  const index_t last = len < b.seq_len ? len - 1 : len;
  return b.targets[static_cast<std::size_t>(r)] != ignore_index && r % b.seq_len < last;
}

/// GRPO written from the formula (docs/objectives.md), independently of loss/grpo.hpp: token or
/// sequence-level ratio, two-sided clipping (delta), every aggregation.
double dense_grpo(const random_batch& b, const std::vector<double>& lp,
                  const std::vector<double>& adv, const std::vector<double>& old,
                  const std::vector<double>& refp, const grpo_options& o) {
  const auto nb = static_cast<std::size_t>(b.batch);
  std::vector<double> seq_sum(nb, 0), seq_n(nb, 0), seq_log_ratio(nb, 0);
  auto old_of = [&](std::size_t k) { return old.empty() ? lp[k] : old[k]; };
  for (index_t r = 0; r < b.batch * b.seq_len; ++r)
    if (counted(b, r)) {
      const auto k = static_cast<std::size_t>(r);
      seq_log_ratio[static_cast<std::size_t>(r / b.seq_len)] += lp[k] - old_of(k);
      seq_n[static_cast<std::size_t>(r / b.seq_len)] += 1;
    }
  double total = 0, n_all = 0;
  for (index_t r = 0; r < b.batch * b.seq_len; ++r) {
    if (!counted(b, r)) continue;
    const auto k = static_cast<std::size_t>(r);
    const auto seq = static_cast<std::size_t>(r / b.seq_len);
    const double ratio = o.level == importance_sampling_level::token
                             ? std::exp(lp[k] - old_of(k))
                             : std::exp(seq_log_ratio[seq] / seq_n[seq]);
    const double a = adv[seq];
    const double lo = 1 - o.epsilon_low, hi = 1 + o.epsilon_high;
    const double clipped = ratio < lo ? lo : (ratio > hi ? hi : ratio);
    const double capped = o.delta > 0 && ratio > o.delta ? o.delta : ratio;
    double l = -std::min(capped * a, clipped * a);
    if (o.beta != 0) l += o.beta * (std::exp(refp[k] - lp[k]) - (refp[k] - lp[k]) - 1);
    seq_sum[seq] += l;
    total += l;
    n_all += 1;
  }
  switch (o.aggregation) {
    case grpo_aggregation::grpo: {
      double s = 0;
      for (std::size_t i = 0; i < nb; ++i)
        if (seq_n[i] > 0) s += seq_sum[i] / seq_n[i];
      return s / static_cast<double>(b.batch);
    }
    case grpo_aggregation::bnpo:
    case grpo_aggregation::dapo:
      return n_all > 0 ? total / n_all : 0.0;
    case grpo_aggregation::dr_grpo:
      return total / (static_cast<double>(b.batch) * static_cast<double>(b.seq_len));
  }
  return 0;
}

/// Preference losses written from the formulas, pairs (row p, row p + P): DPO, IPO, hinge
/// (with reference sums), SimPO and ORPO (average log-probs, no reference), plus the NLL term.
double dense_dpo(const random_batch& b, const std::vector<double>& lp,
                 const std::vector<double>& ref_w, const std::vector<double>& ref_l,
                 const dpo_options& o) {
  std::vector<double> pi(static_cast<std::size_t>(b.batch), 0), n(pi);
  for (index_t r = 0; r < b.batch * b.seq_len; ++r)
    if (counted(b, r)) {
      pi[static_cast<std::size_t>(r / b.seq_len)] += lp[static_cast<std::size_t>(r)];
      n[static_cast<std::size_t>(r / b.seq_len)] += 1;
    }
  const std::size_t pairs = static_cast<std::size_t>(b.batch) / 2;
  auto logsig = [](double x) { return -std::log1p(std::exp(-x)); };
  double loss = 0, nll = 0, chosen_tokens = 0;
  for (std::size_t p = 0; p < pairs; ++p) {
    const double e = o.label_smoothing;
    const double aw = pi[p] / n[p], al = pi[p + pairs] / n[p + pairs];
    if (o.loss == dpo_loss_type::simpo) {
      const double u = o.beta * (aw - al) - o.simpo_gamma;
      loss += -(1 - e) * logsig(u) - e * logsig(-u);
    } else if (o.loss == dpo_loss_type::orpo) {
      const double odds = (aw - al) - (std::log(1 - std::exp(aw)) - std::log(1 - std::exp(al)));
      loss += -o.beta * logsig(odds);
    } else {
      const double h = (pi[p] - ref_w[p]) - (pi[p + pairs] - ref_l[p]);
      const double u = o.beta * h;
      if (o.loss == dpo_loss_type::sigmoid) loss += -(1 - e) * logsig(u) - e * logsig(-u);
      if (o.loss == dpo_loss_type::ipo) loss += std::pow(h - 1 / (2 * o.beta), 2);
      if (o.loss == dpo_loss_type::hinge) loss += std::max(0.0, 1 - u);
    }
    nll -= pi[p];
    chosen_tokens += n[p];
  }
  const double alpha = o.loss == dpo_loss_type::orpo ? 1.0 : o.rpo_alpha;
  return loss / static_cast<double>(pairs) + alpha * nll / chosen_tokens;
}

struct scenario {
  model_config cfg = tiny_config(4, 2, true, false, 2);
  random_batch batch;
  explicit scenario(random_batch b) : batch(std::move(b)) {}
};

/// Checks, for one objective factory: loss == dense formula, stream == full == checkpoint
/// gradients at several chunk sizes, and stream gradients == finite differences of the dense
/// formula at sampled entries.
template <class Make>
void check_objective(const scenario& s, Make&& make,
                     const std::function<double(const std::vector<double>&)>& dense) {
  ref be;
  llama_model<ref> model(be, s.cfg);
  model.init_random(5, 0.3, 0.2);
  const double dense_loss = dense(dense_logprobs(model, s.batch));
  std::vector<std::vector<double>> full_grads;
  for (backward_schedule sched :
       {backward_schedule::full, backward_schedule::checkpoint, backward_schedule::stream}) {
    for (index_t chunk : {index_t{1}, index_t{3}, index_t{5}, s.batch.seq_len + 2}) {
      if (sched != backward_schedule::stream && chunk != 3) continue;
      CAPTURE(to_string(sched));
      CAPTURE(chunk);
      model.parameters().zero_grads();
      auto objective = make();
      backward_options o;
      o.sched = sched;
      o.chunk = chunk;
      o.head_chunk_rows = chunk;  // head chunks split completions too
      const double loss = compute_gradients(model, s.batch.view(), objective, o).loss;
      CHECK(std::abs(loss - dense_loss) <= 1e-10 * std::max(1.0, std::abs(dense_loss)));
      auto grads = grads_of(model.parameters());
      if (full_grads.empty()) {
        full_grads = grads;
        double norm = 0;
        for (const auto& g : grads)
          for (double x : g) norm += x * x;
        CHECK(norm > 0);
      } else {
        for (std::size_t i = 0; i < grads.size(); ++i)
          CHECK(tightfit::testing::max_rel_diff(grads[i], full_grads[i], 1e-12) < 1e-10);
      }
    }
  }
  // finite differences of the dense formula
  auto& params = model.parameters();
  const double h = 1e-5;
  for (std::size_t i = 0; i < params.size(); i += 3) {
    auto v = params.value(i);
    const std::size_t k = v.size() / 3;
    const double saved = v[k];
    v[k] = saved + h;
    const double up = dense(dense_logprobs(model, s.batch));
    v[k] = saved - h;
    const double down = dense(dense_logprobs(model, s.batch));
    v[k] = saved;
    const double fd = (up - down) / (2 * h);
    CAPTURE(params.name(i));
    CHECK(std::abs(fd - full_grads[i][k]) <= 1e-6 * std::max(1.0, std::abs(fd)));
  }
}

}  // namespace

TEST_CASE("SFT mean, sum and caller normaliser") {
  scenario s(random_batch(3, 8, 37, {8, 5, 7}, 21, 0.3));
  auto dense = [&](double norm) {
    return [&s, norm](const std::vector<double>& lp) {
      double sum = 0, n = 0;
      for (index_t r = 0; r < s.batch.batch * s.batch.seq_len; ++r)
        if (counted(s.batch, r)) {
          sum -= lp[static_cast<std::size_t>(r)];
          n += 1;
        }
      return sum / (norm > 0 ? norm : n);
    };
  };
  check_objective(
      s, [] { return sft_loss(); }, dense(0));
  check_objective(
      s, [] { return sft_loss(sft_loss::reduction::sum); }, dense(1));
  check_objective(
      s, [] { return sft_loss::with_normaliser(40); }, dense(40));
}

TEST_CASE("GRPO: every aggregation, clipping branches, KL, old log-probs") {
  scenario s(random_batch(3, 9, 37, {9, 6, 8}, 31, 0.25));
  ref be;
  llama_model<ref> model(be, s.cfg);
  model.init_random(5, 0.3, 0.2);
  const auto lp = dense_logprobs(model, s.batch);
  // old log-probs put r = exp(lp - old) inside, above and below [1 - 0.2, 1 + 0.28]
  std::vector<double> old(lp.size()), refp(lp.size());
  const double offsets[] = {0.05, -0.6, 0.5, -0.1, 0.9, -0.4};
  int inside = 0, above = 0, below = 0;
  for (std::size_t r = 0; r < lp.size(); ++r) {
    old[r] = lp[r] + offsets[r % 6];
    refp[r] = lp[r] + 0.3 * offsets[(r + 2) % 6];
    const double ratio = std::exp(-offsets[r % 6]);
    if (!counted(s.batch, static_cast<index_t>(r))) continue;
    (ratio < 0.8 ? below : ratio > 1.28 ? above : inside)++;
  }
  CHECK(inside > 0);
  CHECK(above > 0);
  CHECK(below > 0);
  const std::vector<double> adv = {1.5, -0.7, 0.4};  // both signs
  for (auto agg : {grpo_aggregation::grpo, grpo_aggregation::bnpo, grpo_aggregation::dapo,
                   grpo_aggregation::dr_grpo}) {
    for (double beta : {0.0, 0.04}) {
      CAPTURE(static_cast<int>(agg));
      CAPTURE(beta);
      grpo_options o;
      o.epsilon_low = 0.2;
      o.epsilon_high = 0.28;
      o.beta = beta;
      o.aggregation = agg;
      check_objective(
          s, [&] { return grpo_loss(adv, old, refp, o); },
          [&](const std::vector<double>& l) { return dense_grpo(s.batch, l, adv, old, refp, o); });
    }
  }
  // GSPO's sequence-level ratio and two-sided clipping (delta caps the ratio of the
  // negative-advantage sequence 1, whose tokens reach r = 1.82 > 1.6)
  for (auto level : {importance_sampling_level::token, importance_sampling_level::sequence}) {
    for (double delta : {0.0, 1.6}) {
      for (auto agg : {grpo_aggregation::grpo, grpo_aggregation::dapo}) {
        CAPTURE(static_cast<int>(level));
        CAPTURE(delta);
        CAPTURE(static_cast<int>(agg));
        grpo_options o;
        o.epsilon_low = 0.2;
        o.epsilon_high = 0.28;
        o.beta = 0.04;
        o.delta = delta;
        o.level = level;
        o.aggregation = agg;
        check_objective(
            s, [&] { return grpo_loss(adv, old, refp, o); },
            [&](const std::vector<double>& l) {
              return dense_grpo(s.batch, l, adv, old, refp, o);
            });
      }
    }
  }
  {
    // delta changes the loss (a check of the test: the capped branch is reached)
    grpo_options with_delta, without;
    with_delta.delta = 1.6;
    CHECK(dense_grpo(s.batch, lp, adv, old, refp, with_delta) !=
          dense_grpo(s.batch, lp, adv, old, refp, without));
    grpo_options seq;
    seq.level = importance_sampling_level::sequence;
    CHECK(dense_grpo(s.batch, lp, adv, old, refp, seq) !=
          dense_grpo(s.batch, lp, adv, old, refp, without));
  }
  // without old log-probs they equal the current ones, detached: the dense formula holds
  // them at the unperturbed values
  for (auto level : {importance_sampling_level::token, importance_sampling_level::sequence}) {
    grpo_options o;
    o.level = level;
    check_objective(
        s, [&] { return grpo_loss(adv, {}, {}, o); },
        [&](const std::vector<double>& l) { return dense_grpo(s.batch, l, adv, lp, {}, o); });
  }
  grpo_options o;
  check_objective(
      s, [&] { return grpo_loss(adv, {}, {}, o); },
      [&](const std::vector<double>& l) { return dense_grpo(s.batch, l, adv, lp, {}, o); });
}

TEST_CASE("DPO: sigmoid with label smoothing 0 and 0.1, IPO, hinge") {
  // pairs (0, 2) and (1, 3): chosen rows first, completions of different lengths, prompts
  // ignored, padding
  random_batch b(4, 8, 37, {8, 7, 6, 8}, 41, 0.0);
  for (index_t row = 0; row < 4; ++row)
    for (index_t t = 0; t < 3 + row % 2; ++t)
      b.targets[static_cast<std::size_t>(row * 8 + t)] = ignore_index;
  scenario s(b);
  const std::vector<index_t> chosen = {0, 1}, rejected = {2, 3};
  const std::vector<double> ref_w = {-20.0, -18.5}, ref_l = {-19.0, -21.0};
  for (auto type : {dpo_loss_type::sigmoid, dpo_loss_type::ipo, dpo_loss_type::hinge}) {
    for (double eps : {0.0, 0.1}) {
      if (type != dpo_loss_type::sigmoid && eps > 0) continue;
      CAPTURE(static_cast<int>(type));
      CAPTURE(eps);
      dpo_options o;
      o.beta = type == dpo_loss_type::hinge ? 0.05 : 0.3;
      o.label_smoothing = eps;
      o.loss = type;
      check_objective(
          s, [&] { return dpo_loss(chosen, rejected, ref_w, ref_l, o); },
          [&](const std::vector<double>& l) { return dense_dpo(s.batch, l, ref_w, ref_l, o); });
    }
  }
}

TEST_CASE("preference losses: RPO's NLL term, SimPO and ORPO (reference-free)") {
  random_batch b(4, 8, 37, {8, 7, 6, 8}, 43, 0.0);
  for (index_t row = 0; row < 4; ++row)
    for (index_t t = 0; t < 2 + row % 2; ++t)
      b.targets[static_cast<std::size_t>(row * 8 + t)] = ignore_index;
  scenario s(b);
  const std::vector<index_t> chosen = {0, 1}, rejected = {2, 3};
  const std::vector<double> ref_w = {-20.0, -18.5}, ref_l = {-19.0, -21.0};
  {
    dpo_options o;
    o.beta = 0.3;
    o.rpo_alpha = 0.7;
    check_objective(
        s, [&] { return dpo_loss(chosen, rejected, ref_w, ref_l, o); },
        [&](const std::vector<double>& l) { return dense_dpo(s.batch, l, ref_w, ref_l, o); });
  }
  for (double eps : {0.0, 0.1}) {
    CAPTURE(eps);
    dpo_options o;
    o.loss = dpo_loss_type::simpo;
    o.beta = 2.0;
    o.simpo_gamma = 0.4;
    o.label_smoothing = eps;
    check_objective(
        s, [&] { return dpo_loss(chosen, rejected, {}, {}, o); },
        [&](const std::vector<double>& l) { return dense_dpo(s.batch, l, {}, {}, o); });
  }
  {
    dpo_options o;
    o.loss = dpo_loss_type::orpo;
    o.beta = 0.25;
    check_objective(
        s, [&] { return dpo_loss(chosen, rejected, {}, {}, o); },
        [&](const std::vector<double>& l) { return dense_dpo(s.batch, l, {}, {}, o); });
  }
  dpo_options needs_ref;
  CHECK_THROWS_WITH_AS(dpo_loss(chosen, rejected, {}, {}, needs_ref),
                       doctest::Contains("ref_chosen.size is 0, expected 2"), error);
  CHECK(parse_dpo_loss_type("simpo") == dpo_loss_type::simpo);
  CHECK(parse_dpo_loss_type("orpo") == dpo_loss_type::orpo);
}

TEST_CASE("mask_truncated_completions drops every target of rows without a stop token") {
  random_batch b(3, 5, 37, {5, 3, 5}, 9, 0.0);
  const token_id eos = 36;
  b.ids[4] = eos;      // row 0 ends with EOS: kept
  b.ids[5 + 2] = 35;   // row 1 (length 3) ends with 35: truncated
  b.ids[10 + 4] = 12;  // row 2 ends with 12: truncated
  const std::vector<token_id> stops = {eos, 35};
  std::vector<token_id> targets = b.targets;
  const index_t masked =
      mask_truncated_completions(targets, b.ids, b.batch, b.seq_len, b.lengths, stops);
  CHECK(masked == 1);
  for (index_t t = 0; t < 5; ++t) {
    CHECK(targets[static_cast<std::size_t>(t)] == b.targets[static_cast<std::size_t>(t)]);
    CHECK(targets[static_cast<std::size_t>(5 + t)] == b.targets[static_cast<std::size_t>(5 + t)]);
    CHECK(targets[static_cast<std::size_t>(10 + t)] == ignore_index);
  }
  CHECK_THROWS_WITH_AS(
      mask_truncated_completions(targets, b.ids, b.batch, b.seq_len, b.lengths, {}),
      doctest::Contains("no stop token"), error);
}

TEST_CASE("DPO reference sums from a reference model's own forward") {
  const auto cfg = tiny_config(2, 1, false, false);
  ref be;
  llama_model<ref> policy(be, cfg), reference(be, cfg);
  policy.init_random(1, 0.3);
  reference.init_random(2, 0.3);
  const random_batch b(4, 6, cfg.vocab_size, {}, 3, 0.0);
  const auto ref_sums = sequence_logprob_sums(reference, b.view());
  const auto pol_sums = sequence_logprob_sums(policy, b.view());
  const std::vector<double> ref_w = {ref_sums[0], ref_sums[1]}, ref_l = {ref_sums[2], ref_sums[3]};
  const std::vector<index_t> chosen = {0, 1}, rejected = {2, 3};
  dpo_loss loss(chosen, rejected, ref_w, ref_l);
  backward_options o;
  o.chunk = 4;
  compute_gradients(policy, b.view(), loss, o);
  // the policy's own sums, not the reference's, enter the margin
  CHECK(std::abs(loss.sequence_sums()[0] - pol_sums[0]) < 1e-10 * std::abs(pol_sums[0]));
  const double margin = (pol_sums[0] - ref_sums[0]) - (pol_sums[2] - ref_sums[2]);
  CHECK(std::abs(loss.margins()[0] - margin) < 1e-9);
  // a model compared with itself has zero margins: loss log 2
  const std::vector<double> pw = {pol_sums[0], pol_sums[1]}, pl = {pol_sums[2], pol_sums[3]};
  dpo_loss same(chosen, rejected, pw, pl);
  const double l = compute_gradients(policy, b.view(), same, o).loss;
  CHECK(std::abs(l - std::log(2.0)) < 1e-10);
}

TEST_CASE("degenerate objective input: documented zeros or clear errors, never NaN") {
  const auto cfg = tiny_config(2, 1, false, false);
  ref be;
  llama_model<ref> model(be, cfg);
  model.init_random(1, 0.3);
  random_batch all_ignored(2, 5, cfg.vocab_size, {}, 1, 1.0);
  backward_options o;
  o.chunk = 2;
  auto finite_grads = [&] {
    for (const auto& g : grads_of(model.parameters()))
      for (double x : g)
        if (!std::isfinite(x) || x != 0) return false;
    return true;
  };
  {
    sft_loss loss;  // no counted target: loss 0, zero gradients
    model.parameters().zero_grads();
    CHECK(compute_gradients(model, all_ignored.view(), loss, o).loss == 0);
    CHECK(finite_grads());
  }
  const std::vector<double> adv = {1.0, -1.0};
  for (auto agg : {grpo_aggregation::grpo, grpo_aggregation::bnpo, grpo_aggregation::dapo,
                   grpo_aggregation::dr_grpo}) {
    grpo_options go;
    go.aggregation = agg;
    grpo_loss loss(adv, {}, {}, go);
    model.parameters().zero_grads();
    CHECK(compute_gradients(model, all_ignored.view(), loss, o).loss == 0);
    CHECK(finite_grads());
  }
  random_batch b(2, 5, cfg.vocab_size, {}, 2, 0.0);
  const std::vector<double> nan_adv = {1.0, std::numeric_limits<double>::quiet_NaN()};
  grpo_loss nan_loss(nan_adv, {}, {});
  CHECK_THROWS_WITH_AS(compute_gradients(model, b.view(), nan_loss, o),
                       doctest::Contains("advantages[1] is nan"), error);
  const std::vector<double> short_adv = {1.0};
  grpo_loss short_loss(short_adv, {}, {});
  CHECK_THROWS_WITH_AS(compute_gradients(model, b.view(), short_loss, o),
                       doctest::Contains("advantages.size is 1, expected 2"), error);
  grpo_options kl;
  kl.beta = 0.1;
  CHECK_THROWS_WITH_AS(grpo_loss(adv, {}, {}, kl), doctest::Contains("no reference log-probs"),
                       error);
  // DPO: an empty completion is an error naming the pair
  random_batch empty_completion = b;
  for (index_t t = 0; t < 5; ++t)
    empty_completion.targets[static_cast<std::size_t>(5 + t)] = ignore_index;
  const std::vector<index_t> chosen = {0}, rejected = {1};
  const std::vector<double> rw = {-5.0}, rl = {-6.0};
  dpo_loss dpo(chosen, rejected, rw, rl);
  CHECK_THROWS_WITH_AS(compute_gradients(model, empty_completion.view(), dpo, o),
                       doctest::Contains("pair 0 has an empty completion"), error);
  const std::vector<index_t> bad_row = {3};
  dpo_loss out_of_range(bad_row, rejected, rw, rl);
  CHECK_THROWS_WITH_AS(compute_gradients(model, b.view(), out_of_range, o),
                       doctest::Contains("names sequence 3"), error);
  dpo_options bad;
  bad.label_smoothing = 0.7;
  CHECK_THROWS_AS(dpo_loss(chosen, rejected, rw, rl, bad), error);
  CHECK_THROWS_WITH_AS(parse_grpo_aggregation("ppo"), doctest::Contains("unknown GRPO loss type"),
                       error);
  CHECK_THROWS_WITH_AS(parse_dpo_loss_type("kto"), doctest::Contains("unknown DPO loss type"),
                       error);
}

TEST_CASE(
    "a target in the padding never counts, whatever its label (the last valid position too)") {
  const auto cfg = tiny_config(2, 1, false, false);
  ref be;
  llama_model<ref> model(be, cfg);
  model.init_random(3, 0.3);
  random_batch clean(2, 7, cfg.vocab_size, {5, 7}, 8, 0.0);
  // Row 0 is padded: its targets from position 4 on (position 4 predicts padding position 5)
  // are ignore_index in `clean` and garbage in `dirty`.
  for (index_t t = 4; t < 7; ++t) clean.targets[static_cast<std::size_t>(t)] = ignore_index;
  random_batch dirty = clean;
  for (index_t t = 4; t < 7; ++t) dirty.targets[static_cast<std::size_t>(t)] = 11;
  backward_options o;
  o.chunk = 3;
  sft_loss a, b;
  const double want = compute_gradients(model, clean.view(), a, o).loss;
  const auto want_grads = grads_of(model.parameters());
  model.parameters().zero_grads();
  const double got = compute_gradients(model, dirty.view(), b, o).loss;
  CHECK(got == want);
  CHECK(a.counted_tokens() == b.counted_tokens());
  CHECK(grads_of(model.parameters()) == want_grads);
  // The unpadded row keeps its last target: a caller may know the next token of a longer text.
  random_batch next = clean;
  next.targets[static_cast<std::size_t>(7 + 6)] = 5;
  sft_loss c;
  model.parameters().zero_grads();
  compute_gradients(model, next.view(), c, o);
  CHECK(c.counted_tokens() == a.counted_tokens() + (clean.targets[13] == ignore_index ? 1 : 0));
}
