// `tightfit train` on a Gemma 3 checkpoint directory: the tool picks the layer from config.json
// (nn/architectures.hpp) and trains it with adamw, badam, lora, bread-sgd and bread-lora (exit 0,
// a finite, falling loss, a saved model or PEFT adapter that loads back and differs from the
// input), exactly as the library does (tests/optim/test_any_model.cpp checks each step against
// an oracle); `tightfit logprobs` runs the Gemma layer too.
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
#include "tightfit/backend/reference.hpp"
#include "tightfit/io/safetensors.hpp"
#include "tightfit/nn/gemma_layer.hpp"
#include "tightfit/nn/hf_model.hpp"
#include "tightfit/stream/backward.hpp"
#include "tightfit/stream/forward.hpp"

using namespace tightfit;
namespace fs = std::filesystem;
using cli_testing::q;
using cli_testing::run;

namespace {

/// A tiny Gemma 3 text model: q/k-norm, (1 + w) norms, two sliding layers and a global one,
/// a local RoPE base, sqrt(d) embedding scaling, tied embeddings.
model_config gemma3_tiny() {
  model_config c = testing::tiny_config(4, 2, true, true, 3);
  c.architecture = "Gemma3ForCausalLM";
  c.rope_local_base_freq = 100;
  c.query_pre_attn_scalar = 6;
  c.sliding_window = 4;
  c.sliding_layers = {true, true, false};
  return c;
}

/// A Gemma 3 model directory (cli_model.hpp) and a counting data set beside it.
struct gemma_fixture : cli_testing::model_fixture {
  gemma_fixture() : model_fixture("gemma", gemma3_tiny()) {}
  fs::path counting() const {
    const index_t n = 4, t = 16;
    const auto ids = cli_testing::counting_ids(n, t);
    safetensors_writer w;
    w.add("input_ids", {n, t}, std::span<const std::int64_t>(ids));
    const auto path = dir / "counting.safetensors";
    w.write(path);
    return path;
  }
};

std::vector<double> logged_losses(const fs::path& log) {
  std::ifstream in(log);
  std::vector<double> losses;
  std::string line;
  while (std::getline(in, line))
    losses.push_back(nlohmann::json::parse(line)["loss"].get<double>());
  return losses;
}

}  // namespace

TEST_CASE("train: a Gemma 3 model trains with adamw, badam, lora, bread-sgd and bread-lora") {
  gemma_fixture f;
  REQUIRE(load_hf_config(f.model).is_gemma());
  const auto data = f.counting();
  const auto input = f.weights(f.model);
  struct optimizer_case {
    const char* name;
    const char* extra;
  };
  const optimizer_case cases[] = {
      {"adamw", "--lr 0.01"},
      {"badam", "--lr 0.02 --switch-every 3"},
      {"lora", "--lr 0.01 --target-modules all-linear --lora-rank 4 --lora-alpha 8"},
      {"bread-sgd", "--lr 0.02 --switch-every 3 --bread-lr 0.05 --bread-scope all"},
      {"bread-lora", "--lr 0.02 --switch-every 3 --bread-lr 0.02 --rank 2 --loraplus 4"},
  };
  for (const auto& c : cases) {
    const std::string name = c.name;
    CAPTURE(name);
    const auto log = f.dir / (name + ".jsonl");
    const auto out = f.dir / ("out-" + name);
    const auto r = run("train --model " + q(f.model) + " --data " + q(data) + " --optimizer " +
                       name + " " + c.extra + " --steps 20 --batch 2 --chunk 8 --seed 3 --log " +
                       q(log) + " --save-model " + q(out) + " --quiet");
    REQUIRE(r.code == 0);
    CHECK(r.err.empty());
    CHECK(r.out.find("optimizer " + name) != std::string::npos);
    const auto losses = logged_losses(log);
    REQUIRE(losses.size() == 20);
    for (double l : losses) CHECK(std::isfinite(l));
    CHECK(losses.back() < losses.front());
    if (name == "lora") {
      // the PEFT adapter of every projection of the Gemma layers; the base is not rewritten
      const auto adapter = safetensors_file::open(out / "adapter_model.safetensors");
      CHECK(adapter.contains("base_model.model.model.layers.2.mlp.down_proj.lora_B.weight"));
      CHECK(adapter.contains("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"));
    } else {
      CHECK(load_hf_config(out).is_gemma());
      const auto trained = f.weights(out);
      REQUIRE(trained.size() == input.size());
      CHECK(trained != input);
    }
  }
}

TEST_CASE("logprobs: a Gemma 3 model's log-probs are the Gemma layer's, and grad reads them back") {
  gemma_fixture f;
  const index_t b = 2, t = 8;
  const auto ids = cli_testing::counting_ids(b, t);
  std::vector<std::int64_t> labels(ids);
  for (index_t i = 0; i < b * t; ++i)
    if (i % t < 2) labels[static_cast<std::size_t>(i)] = -100;
  const std::vector<double> adv{0.7, -0.2};
  safetensors_writer w;
  w.add("input_ids", {b, t}, std::span<const std::int64_t>(ids));
  w.add("labels", {b, t}, std::span<const std::int64_t>(labels));
  w.add("advantages", {b}, std::span<const double>(adv));
  const auto batch = f.dir / "grpo.safetensors", with_old = f.dir / "grpo_old.safetensors";
  w.write(batch);
  auto r = run("logprobs --model " + q(f.model) + " --batch " + q(batch) + " --out " + q(with_old) +
               " --dtype f64 --as old --chunk 4");
  REQUIRE(r.code == 0);
  // label-aligned: position k holds log p(labels[k] | ids[..k-1]); the library's Gemma forward
  // on the reference backend gives the same values
  reference_backend<double> be;
  gemma_model<reference_backend<double>> model(be, f.cfg);
  load_hf_weights(f.model, model.parameters());
  const auto targets = shift_labels(labels, b, t);
  const auto expected = model_logprobs(model, {b, t, ids, targets, {}});  // target-aligned
  const auto got = safetensors_file::open(with_old).read<double>("old_logprobs");
  REQUIRE(got.size() == static_cast<std::size_t>(b * t));
  index_t compared = 0;
  for (index_t row = 0; row < b; ++row)
    for (index_t k = 1; k < t; ++k) {
      const auto at = static_cast<std::size_t>(row * t + k);
      if (labels[at] == -100) continue;
      const double e = expected[at - 1];
      CHECK(std::abs(got[at] - e) <= 1e-12 * std::max(1.0, std::abs(e)));
      ++compared;
    }
  CHECK(compared == b * (t - 2));
  // the old log-probs are the policy's own, so every ratio is 1 and the loss is -mean(A)
  r = run("grad --model " + q(f.model) + " --batch " + q(with_old) +
          " --objective grpo --dtype f64 --chunk 4");
  REQUIRE(r.code == 0);
  CHECK(std::abs(nlohmann::json::parse(r.out)["loss"].get<double>() + 0.25) < 1e-12);
}
