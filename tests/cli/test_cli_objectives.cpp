// `tightfit train --objective dpo|grpo` end to end, and the trainer's options: the first step's
// gradients equal `tightfit grad`'s on the same batch (recovered from one SGD step in f64), the
// reference log-probs the tool computes equal those `tightfit logprobs` writes, DPO's loss falls,
// GRPO raises the log-probs of the completions with a positive advantage and lowers the others,
// --epochs / --shuffle take every row once per epoch, the log has the learning rate and the
// gradient norm, and the objective's options are checked as arguments.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_model.hpp"
#include "cli_testing.hpp"
#include "tightfit/io/safetensors.hpp"
#include "tightfit/nn/decoder_layer.hpp"
#include "tightfit/nn/hf_model.hpp"

using namespace tightfit;
namespace fs = std::filesystem;
using cli_testing::q;
using cli_testing::run;

namespace {

constexpr index_t seq = 8;

/// P preference pairs of T tokens: the chosen rows count up (token k + 1 follows k), the
/// rejected ones count down; the first 3 positions (the prompt) are not supervised.
struct objectives_fixture : cli_testing::model_fixture {
  objectives_fixture() : model_fixture("objectives") {}

  static std::vector<std::int64_t> prompt_masked(std::vector<std::int64_t> ids, index_t rows) {
    for (index_t r = 0; r < rows; ++r)
      for (index_t k = 0; k < 3; ++k) ids[static_cast<std::size_t>(r * seq + k)] = ignore_index;
    return ids;
  }
  fs::path dpo(index_t pairs, const std::string& name) const {
    std::vector<std::int64_t> up, down;
    for (index_t r = 0; r < pairs; ++r)
      for (index_t k = 0; k < seq; ++k) {
        up.push_back((r + k) % 8);
        down.push_back((r + 3 * seq - k) % 8);
      }
    safetensors_writer w;
    w.add("chosen_input_ids", {pairs, seq}, std::span<const std::int64_t>(up));
    w.add("chosen_labels", {pairs, seq}, std::span<const std::int64_t>(prompt_masked(up, pairs)));
    w.add("rejected_input_ids", {pairs, seq}, std::span<const std::int64_t>(down));
    w.add("rejected_labels", {pairs, seq},
          std::span<const std::int64_t>(prompt_masked(down, pairs)));
    const auto path = dir / name;
    w.write(path);
    return path;
  }
  /// Two prompts x 2 completions; `key` rewards or advantages.
  fs::path grpo(const std::string& key, const std::vector<double>& values,
                const std::string& name) const {
    const index_t n = 4;
    std::vector<std::int64_t> ids;
    for (index_t r = 0; r < n; ++r)
      for (index_t k = 0; k < seq; ++k) ids.push_back(k < 3 ? r / 2 : (r % 2 == 0 ? k : 7 - k));
    safetensors_writer w;
    w.add("input_ids", {n, seq}, std::span<const std::int64_t>(ids));
    w.add("labels", {n, seq}, std::span<const std::int64_t>(prompt_masked(ids, n)));
    w.add(key, {n}, std::span<const double>(values));
    const auto path = dir / name;
    w.write(path);
    return path;
  }
  /// `batch` with the fixture's model's reference log-probs (tightfit logprobs, f64) as `name`.
  fs::path with_references(const fs::path& batch, const std::string& name) const {
    const auto out = dir / name;
    const auto r = run("logprobs --model " + q(model) + " --batch " + q(batch) + " --out " +
                       q(out) + " --dtype f64 --chunk 4");
    REQUIRE_MESSAGE(r.code == 0, r.err);
    return out;
  }
  /// The parameter names of the fixture's model, in parameter order.
  std::vector<std::string> names() const {
    reference_backend<double> be;
    llama_model<reference_backend<double>> m(be, cfg);
    std::vector<std::string> out;
    for (std::size_t i = 0; i < m.parameters().size(); ++i) out.push_back(m.parameters().name(i));
    return out;
  }
  /// Checks that one SGD step of learning rate `lr` from the fixture's model to `trained` moved
  /// every weight by -lr times the gradient `grad --out` wrote to `grads`.
  void check_step_is_gradient(const fs::path& trained, const fs::path& grads, double lr) const {
    const auto before = weights(model), after = weights(trained);
    const auto g = safetensors_file::open(grads);
    const auto n = names();
    REQUIRE(before.size() == n.size());
    double largest = 0;
    for (std::size_t i = 0; i < n.size(); ++i) {
      const auto expected = g.read<double>(n[i]);
      REQUIRE(expected.size() == before[i].size());
      for (std::size_t k = 0; k < expected.size(); ++k) {
        const double step = (before[i][k] - after[i][k]) / lr;
        CHECK(std::abs(step - expected[k]) <= 1e-9 * std::max(1.0, std::abs(expected[k])));
        largest = std::max(largest, std::abs(expected[k]));
      }
    }
    CHECK(largest > 1e-6);  // the gradients are not all zero
  }
  /// `tightfit train ARGS` for one SGD step (lr 0.01, f64) saved as `name`, checked against
  /// `grad`'s gradients `grads` and loss `grad_loss`; returns the step's logged loss.
  double check_first_step(const std::string& args, const std::string& name, const fs::path& grads,
                          double grad_loss) const;
};

std::vector<nlohmann::json> log_lines(const fs::path& log) {
  std::ifstream in(log);
  std::vector<nlohmann::json> out;
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

double objectives_fixture::check_first_step(const std::string& args, const std::string& name,
                                            const fs::path& grads, double grad_loss) const {
  const auto out = dir / name, log = dir / (name + ".jsonl");
  const auto r = run("train --model " + q(model) + " " + args +
                     " --optimizer sgd --lr 0.01 --max-grad-norm 0 --steps 1 --dtype f64 --chunk 4 "
                     "--quiet --log " +
                     q(log) + " --save-model " + q(out));
  REQUIRE_MESSAGE(r.code == 0, r.err);
  const auto lines = log_lines(log);
  REQUIRE(lines.size() == 1);
  const double loss = lines[0]["loss"].get<double>();
  CHECK(std::abs(loss - grad_loss) < 1e-12);
  check_step_is_gradient(out, grads, 0.01);
  return loss;
}

/// Per-row sums of the label-aligned log-probs `tightfit logprobs --as ref` wrote.
std::vector<double> row_sums(const fs::path& file, index_t rows) {
  const auto lp = safetensors_file::open(file).read<double>("ref_logprobs");
  std::vector<double> sums(static_cast<std::size_t>(rows), 0.0);
  for (std::size_t i = 0; i < lp.size(); ++i) sums[i / static_cast<std::size_t>(seq)] += lp[i];
  return sums;
}

}  // namespace

TEST_CASE("train --objective dpo: step one is grad's, the references are logprobs', loss falls") {
  objectives_fixture f;
  const auto data = f.dpo(3, "dpo.safetensors");
  const auto with_ref = f.with_references(data, "dpo_ref.safetensors");
  const auto grads = f.dir / "dpo_grads.safetensors";
  auto r = run("grad --model " + q(f.model) + " --batch " + q(with_ref) +
               " --objective dpo --beta 0.2 --dtype f64 --chunk 4 --out " + q(grads));
  REQUIRE_MESSAGE(r.code == 0, r.err);
  const double grad_loss = nlohmann::json::parse(r.out)["loss"].get<double>();

  // one SGD step on all 3 pairs: from the file's references, and from references the tool
  // computes itself (the model as loaded): the same step
  for (const auto& [file, name] : {std::pair{with_ref, "given"}, std::pair{data, "computed"}}) {
    CAPTURE(name);
    const double loss =
        f.check_first_step("--data " + q(file) + " --objective dpo --beta 0.2 --batch 3",
                           std::string("dpo-step-") + name, grads, grad_loss);
    CHECK(std::abs(loss - std::log(2.0)) < 1e-12);  // policy = ref
  }

  // training: one pair per step, two epochs, shuffled; the loss falls
  const auto log = f.dir / "dpo.jsonl";
  r = run("train --model " + q(f.model) + " --data " + q(data) +
          " --objective dpo --optimizer adamw --lr 0.02 --epochs 8 --shuffle --batch 1 "
          "--dtype f64 --chunk 4 --quiet --log " +
          q(log));
  REQUIRE_MESSAGE(r.code == 0, r.err);
  const auto lines = log_lines(log);
  REQUIRE(lines.size() == 24);  // 8 epochs x 3 pairs, one pair a step
  double first = 0, last = 0;
  for (int i = 0; i < 3; ++i) {
    first += lines[static_cast<std::size_t>(i)]["loss"].get<double>() / 3;
    last += lines[static_cast<std::size_t>(21 + i)]["loss"].get<double>() / 3;
  }
  CHECK(last < first - 0.1);
}

TEST_CASE("eval --objective dpo and train --eval-data: grad's loss, TRL's reward metrics") {
  objectives_fixture f;
  const auto data = f.dpo(3, "dpo.safetensors");
  const auto with_ref = f.with_references(data, "dpo_ref.safetensors");
  cli_testing::outcome r;
  // train a little, evaluating the pairs every 2 steps: references from the file and computed by
  // the tool (the model as loaded) give the same evaluations
  const auto trained = f.dir / "dpo-evaluated";
  std::vector<std::vector<nlohmann::json>> evals;
  for (const auto& [eval_file, name] :
       {std::pair{with_ref, "given"}, std::pair{data, "computed"}}) {
    const auto log = f.dir / (std::string("dpo-eval-") + name + ".jsonl");
    r = run("train --model " + q(f.model) + " --data " + q(data) + " --eval-data " + q(eval_file) +
            " --eval-steps 2 --objective dpo --beta 0.2 --optimizer adamw --lr 0.02 "
            "--steps 4 --batch 1 --dtype f64 --chunk 4 --quiet --log " +
            q(log) + " --save-model " + q(trained));
    REQUIRE_MESSAGE(r.code == 0, r.err);
    std::vector<nlohmann::json> lines;
    for (const auto& j : log_lines(log))
      if (j.contains("eval_loss")) lines.push_back(j);
    REQUIRE(lines.size() == 2);  // steps 2 and 4
    CHECK(lines[0]["step"] == 2);
    CHECK(lines[1]["step"] == 4);
    evals.push_back(lines);
  }
  for (std::size_t k = 0; k < 2; ++k)
    for (const char* key : {"eval_loss", "eval_rewards_chosen", "eval_rewards_accuracy"})
      CHECK(std::abs(evals[0][k][key].get<double>() - evals[1][k][key].get<double>()) < 1e-12);
  // eval of the trained model: the loss is grad's on the same pairs (--batch 2: passes of 2 and 1
  // pairs, each its share of the whole set), for losses with and without a per-token term
  for (const std::string extra : {"", " --loss-type ipo", " --rpo-alpha 0.5"}) {
    CAPTURE(extra);
    const auto g = run("grad --model " + q(trained) + " --batch " + q(with_ref) +
                       " --objective dpo --beta 0.2 --dtype f64 --chunk 4" + extra);
    REQUIRE_MESSAGE(g.code == 0, g.err);
    const auto e = run("eval --model " + q(trained) + " --data " + q(with_ref) +
                       " --objective dpo --beta 0.2 --dtype f64 --chunk 4 --batch 2" + extra);
    REQUIRE_MESSAGE(e.code == 0, e.err);
    const auto ej = nlohmann::json::parse(e.out);
    const double expected = nlohmann::json::parse(g.out)["loss"].get<double>();
    CHECK(std::abs(ej["loss"].get<double>() - expected) < 1e-12);
    CHECK(ej["pairs"] == 3);
    if (extra.empty())  // train's last evaluation is eval's on the saved model
      CHECK(std::abs(evals[0][1]["eval_loss"].get<double>() - expected) < 1e-12);
  }
  // the rewards: beta (policy sum - reference sum), the policy's sums written by logprobs
  const auto policy = f.dir / "dpo_policy.safetensors";
  REQUIRE(run("logprobs --model " + q(trained) + " --batch " + q(data) + " --out " + q(policy) +
              " --dtype f64 --chunk 4")
              .code == 0);
  const auto pf = safetensors_file::open(policy), rf = safetensors_file::open(with_ref);
  const auto pc = pf.read<double>("ref_chosen_logps"), pr = pf.read<double>("ref_rejected_logps");
  const auto rc = rf.read<double>("ref_chosen_logps"), rr = rf.read<double>("ref_rejected_logps");
  double chosen = 0, rejected = 0, accuracy = 0;
  for (std::size_t i = 0; i < 3; ++i) {
    chosen += 0.2 * (pc[i] - rc[i]) / 3;
    rejected += 0.2 * (pr[i] - rr[i]) / 3;
    accuracy += (pc[i] - rc[i] > pr[i] - rr[i] ? 1.0 : 0.0) / 3;
  }
  const auto e = nlohmann::json::parse(run("eval --model " + q(trained) + " --data " + q(with_ref) +
                                           " --objective dpo --beta 0.2 --dtype "
                                           "f64 --chunk 4")
                                           .out);
  CHECK(std::abs(e["rewards_chosen"].get<double>() - chosen) < 1e-12);
  CHECK(std::abs(e["rewards_rejected"].get<double>() - rejected) < 1e-12);
  CHECK(std::abs(e["rewards_margin"].get<double>() - (chosen - rejected)) < 1e-12);
  CHECK(e["rewards_accuracy"].get<double>() == accuracy);
  CHECK(chosen - rejected > 0);  // training on these pairs separated them
  // the model evaluated against itself: rewards 0, the loss log 2
  const auto self = nlohmann::json::parse(
      run("eval --model " + q(f.model) + " --data " + q(with_ref) + " --objective dpo --dtype f64")
          .out);
  CHECK(std::abs(self["loss"].get<double>() - std::log(2.0)) < 1e-12);
  CHECK(std::abs(self["rewards_margin"].get<double>()) < 1e-12);
  // reference-free losses need no reference sums; the others name what is missing; grpo has no
  // offline evaluation
  r = run("eval --model " + q(f.model) + " --data " + q(data) +
          " --objective dpo --loss-type simpo");
  CHECK_MESSAGE(r.code == 0, r.err);
  CHECK(nlohmann::json::parse(r.out).contains("rewards_accuracy") == false);
  r = run("eval --model " + q(f.model) + " --data " + q(data) + " --objective dpo");
  CHECK(r.code == 1);
  CHECK(r.err.find("ref_chosen_logps") != std::string::npos);
  r = run("eval --model " + q(f.model) + " --data " + q(data) + " --objective grpo");
  CHECK(r.code == 2);
  r = run("eval --model " + q(f.model) + " --data " + q(data) + " --epsilon-low 0.1");
  CHECK(r.code == 2);
  CHECK(r.err.find("--epsilon-low applies to --objective grpo") != std::string::npos);
}

TEST_CASE("train --objective grpo: group advantages, step one is grad's, A > 0 completions rise") {
  objectives_fixture f;
  const std::vector<double> rewards{1.0, 0.0, 0.25, 0.75};
  const auto data = f.grpo("rewards", rewards, "grpo_rewards.safetensors");
  // TRL's group advantages, by hand: groups (1, 0) and (0.25, 0.75), std unbiased + 1e-4
  const double s1 = std::sqrt(0.5), s2 = std::sqrt(0.125);
  const std::vector<double> adv{0.5 / (s1 + 1e-4), -0.5 / (s1 + 1e-4), -0.25 / (s2 + 1e-4),
                                0.25 / (s2 + 1e-4)};
  const auto given = f.grpo("advantages", adv, "grpo_adv.safetensors");
  const auto grads = f.dir / "grpo_grads.safetensors";
  auto r = run("grad --model " + q(f.model) + " --batch " + q(given) +
               " --objective grpo --dtype f64 --chunk 4 --out " + q(grads));
  REQUIRE_MESSAGE(r.code == 0, r.err);
  const double grad_loss = nlohmann::json::parse(r.out)["loss"].get<double>();
  f.check_first_step("--data " + q(data) + " --objective grpo --num-generations 2 --batch 4",
                     "grpo-step", grads, grad_loss);

  // a few steps with a KL term (its references computed by the tool): the completions with a
  // positive advantage gain log-probability, the others lose it
  const auto trained = f.dir / "grpo-trained";
  r = run("train --model " + q(f.model) + " --data " + q(data) +
          " --objective grpo --num-generations 2 --beta 0.04 --loss-type dr_grpo "
          "--optimizer adamw --lr 0.01 --steps 6 --batch 2 --grad-accum 2 --dtype f64 --chunk 4 "
          "--quiet --save-model " +
          q(trained));
  REQUIRE_MESSAGE(r.code == 0, r.err);
  const auto before = f.dir / "lp_before.safetensors", after = f.dir / "lp_after.safetensors";
  REQUIRE(run("logprobs --model " + q(f.model) + " --batch " + q(given) + " --out " + q(before) +
              " --dtype f64")
              .code == 0);
  REQUIRE(run("logprobs --model " + q(trained) + " --batch " + q(given) + " --out " + q(after) +
              " --dtype f64")
              .code == 0);
  const auto b = row_sums(before, 4), a = row_sums(after, 4);
  for (std::size_t i = 0; i < 4; ++i) {
    CAPTURE(i);
    if (adv[i] > 0)
      CHECK(a[i] > b[i]);
    else
      CHECK(a[i] < b[i]);
  }
}

TEST_CASE("train: --epochs, --shuffle, the log's lr and grad_norm, Adam's hyperparameters") {
  objectives_fixture f;
  const std::vector<double> adv{0.5, -0.5, 0.25, -0.25};
  const auto data = f.grpo("advantages", adv, "grpo_adv.safetensors");
  const std::string base = "train --model " + q(f.model) + " --data " + q(data) +
                           " --objective grpo --dtype f64 --chunk 4 --quiet ";
  // --epochs 1.5 over 4 rows, 2 a step: 3 steps; the lr of a linear warmup; clipping logs norms
  auto log = f.dir / "epochs.jsonl";
  auto r = run(base +
               "--optimizer adamw --lr 0.5 --max-grad-norm 1e-3 --batch 2 --epochs 1.5 "
               "--schedule warmup:4 --log " +
               q(log));
  REQUIRE_MESSAGE(r.code == 0, r.err);
  auto lines = log_lines(log);
  REQUIRE(lines.size() == 3);
  for (std::size_t i = 0; i < lines.size(); ++i) {
    CHECK(std::abs(lines[i]["lr"].get<double>() - 0.5 * static_cast<double>(i + 1) / 4) < 1e-15);
    REQUIRE(lines[i].contains("grad_norm"));
    CHECK(lines[i]["grad_norm"].get<double>() > 1e-3);  // clipped: the norm before clipping
  }
  // shuffled rows: another order than rows in order, the same order for the same seed
  auto losses = [&](const std::string& extra) {
    const auto l = f.dir / "order.jsonl";
    REQUIRE(
        run(base + "--optimizer sgd --lr 0 --batch 1 --steps 8 --log " + q(l) + " " + extra).code ==
        0);
    std::vector<double> out;
    for (const auto& j : log_lines(l)) out.push_back(j["loss"].get<double>());
    return out;
  };
  const auto in_order = losses(""), shuffled = losses("--shuffle --seed 3"),
             again = losses("--shuffle --seed 3");
  CHECK(shuffled == again);
  CHECK(shuffled != in_order);
  // lr 0: every step's loss is one row's (-A); each epoch of 4 steps takes every row once
  for (std::size_t e = 0; e < 2; ++e) {
    std::vector<double> epoch(shuffled.begin() + static_cast<std::ptrdiff_t>(4 * e),
                              shuffled.begin() + static_cast<std::ptrdiff_t>(4 * e + 4));
    std::vector<double> expected;
    for (double x : adv) expected.push_back(-x);
    std::sort(epoch.begin(), epoch.end());
    std::sort(expected.begin(), expected.end());
    for (std::size_t i = 0; i < 4; ++i) CHECK(std::abs(epoch[i] - expected[i]) < 1e-12);
  }
  // AdamW with --weight-decay 0 is Adam; the betas and epsilon reach the rule (other weights).
  // GRPO's loss with the ratio 1 is -mean(A) whatever the weights: compare the weights.
  auto trained = [&](const std::string& name, const std::string& extra) {
    const auto out = f.dir / name;
    const auto res =
        run(base + "--lr 0.01 --batch 2 --steps 4 --save-model " + q(out) + " " + extra);
    REQUIRE_MESSAGE(res.code == 0, res.err);
    return f.weights(out);
  };
  const auto adam = trained("adam", "--optimizer adam"),
             adamw = trained("adamw", "--optimizer adamw --weight-decay 0"),
             adamw_default = trained("adamw-default", "--optimizer adamw"),
             decayed = trained("decayed", "--optimizer adamw --weight-decay 0.01"),
             betas = trained(
                 "betas", "--optimizer adam --adam-beta1 0.5 --adam-beta2 0.9 --adam-epsilon 1e-3");
  CHECK(adam == adamw);
  CHECK(adamw_default == adam);  // TRL's default decay, 0
  CHECK(decayed != adam);
  CHECK(betas != adam);
  CHECK(adam != f.weights(f.model));
}

TEST_CASE("train: the objective's options and data are checked, naming the value") {
  objectives_fixture f;
  const auto dpo = f.dpo(2, "dpo.safetensors");
  const auto rewards = f.grpo("rewards", {1, 0, 0, 1}, "rewards.safetensors");
  const std::string m = "train --model " + q(f.model) + " --optimizer sgd --steps 1 --data ";
  struct refusal {
    std::string args;
    int code;
    std::string says;
  };
  const refusal cases[] = {
      {m + q(dpo) + " --objective kto", 2, "--objective expects sft, grpo or dpo, got 'kto'"},
      {m + q(dpo) + " --beta 0.1", 2, "--beta applies to --objective grpo or dpo, not sft"},
      {m + q(dpo) + " --objective dpo --epsilon-low 0.1", 2,
       "--epsilon-low applies to --objective grpo, not dpo"},
      {m + q(dpo) + " --objective dpo --beta 0", 2, "--beta is 0, expected > 0"},
      {m + q(dpo) + " --objective dpo --num-generations 2", 2,
       "--num-generations and --scale-rewards apply to --objective grpo"},
      {m + q(rewards) + " --objective grpo --scale-rewards batch", 2,
       "--scale-rewards is 'batch', expected group or none"},
      {m + q(dpo) + " --objective dpo --epochs 1 --steps 2", 2, "give --steps or --epochs"},
      {m + q(rewards) + " --objective grpo", 1, "--num-generations G says how many"},
      {m + q(rewards) + " --objective grpo --num-generations 3", 1, "--num-generations is 3"},
      {m + q(dpo) + " --objective grpo", 1, "tensor 'chosen_input_ids' is not used by train"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.args);
    const auto r = run(c.args);
    CHECK(r.code == c.code);
    CHECK(r.err.find(c.says) != std::string::npos);
  }
}

TEST_CASE("train --config: TRL's names give the run of the same options on the command line") {
  objectives_fixture f;
  const auto data = f.dpo(2, "dpo.safetensors");
  const std::string base = "train --model " + q(f.model) + " --data " + q(data) +
                           " --objective dpo --dtype f64 --chunk 4 --quiet --batch 1 ";
  auto outcome = [&](const std::string& name, const std::string& options) {
    const auto log = f.dir / (name + ".jsonl");
    const auto out = f.dir / name;
    const auto r = run(base + options + " --log " + q(log) + " --save-model " + q(out));
    REQUIRE_MESSAGE(r.code == 0, r.err);
    std::vector<double> values;
    for (const auto& j : log_lines(log)) {
      values.push_back(j["loss"].get<double>());
      values.push_back(j["lr"].get<double>());
    }
    return std::pair{values, f.weights(out)};
  };
  const auto expected = outcome(
      "cli",
      "--optimizer adamw --lr 0.02 --grad-accum 2 --steps 3 --schedule cosine:1 "
      "--weight-decay 0.05 --adam-beta2 0.99 --beta 0.3 --loss-type ipo --seed 5 --shuffle");
  const auto json = f.dir / "run.json", yaml = f.dir / "run.yaml";
  {
    std::ofstream(json) << R"({"learning_rate": 0.02, "gradient_accumulation_steps": 2,
      "max_steps": 3, "num_train_epochs": 2, "lr_scheduler_type": "cosine", "warmup_steps": 1,
      "optim": "adamw_torch", "weight_decay": 0.05, "adam_beta2": 0.99, "beta": 0.3,
      "loss_type": "ipo", "seed": 5, "shuffle": true, "report_to": null})";
  }
  // JSON: max_steps 3 wins over the epochs (TRL's rule)
  CHECK(outcome("json", "--config " + q(json)) == expected);
  // YAML: the command line overrides the file (--lr=0.02, the --key=value form; --steps over
  // the file's epochs); a key of the data step is named on stderr and skipped
  std::ofstream(yaml) << "# a TRL DPOConfig, flat\n"
                         "learning_rate: 0.5   # overridden on the command line\n"
                         "gradient_accumulation_steps: 2\nnum_train_epochs: 4\n"
                         "lr_scheduler_type: cosine\nwarmup_steps: 1\noptim: adamw_torch\n"
                         "weight_decay: 0.05\nadam_beta2: 0.99\nbeta: 0.3\nloss_type: 'ipo'\n"
                         "seed: 5\nshuffle: true\nmax_length: 512\n";
  const auto from_yaml = outcome("yaml", "--config " + q(yaml) + " --lr=0.02 --steps 3");
  CHECK(from_yaml == expected);
  const auto noted = run(base + "--config " + q(yaml) + " --steps 0");
  CHECK(noted.code == 0);
  CHECK(noted.err.find("'max_length' is tightfit prepare's") != std::string::npos);
  // a key train does not have is named with the file; a nested value is refused by line
  { std::ofstream(yaml) << "learning_rate: 0.02\nbf16: true\n"; }
  auto bad = run(base + "--optimizer adamw --config " + q(yaml));
  CHECK(bad.code == 2);
  CHECK(bad.err.find("unknown option '--bf16'") != std::string::npos);
  CHECK(bad.err.find("key 'bf16'") != std::string::npos);
  { std::ofstream(yaml) << "learning_rate: 0.02\nlr_scheduler_kwargs:\n  min_lr: 0.001\n"; }
  bad = run(base + "--optimizer adamw --config " + q(yaml));
  CHECK(bad.code == 2);
  CHECK(bad.err.find("line 2") != std::string::npos);
}
