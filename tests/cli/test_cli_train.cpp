// `tightfit train` end to end: every optimizer trains a tiny model on a trivially learnable data
// set (exit 0, one JSON log line per step with a finite, falling loss, trained weights that load
// back and differ from the input), a resumed run ends with the weights of the uninterrupted one,
// wrong arguments exit 2 with the usage, bad files exit 1 with one line naming the problem.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_model.hpp"
#include "cli_testing.hpp"
#include "stream/stream_testing.hpp"
#include "tightfit/io/safetensors.hpp"
#include "tightfit/nn/hf_model.hpp"

using namespace tightfit;
namespace fs = std::filesystem;
using cli_testing::lines;
using cli_testing::q;
using cli_testing::run;

namespace {

/// A 3-layer random model directory (F64 weights) and data sets beside it.
struct train_fixture : cli_testing::model_fixture {
  train_fixture() : model_fixture("train") {}
  /// N rows of T tokens; labels: the inputs with the first position of each row ignored.
  fs::path data(const std::vector<std::int64_t>& ids, index_t n, index_t t,
                const std::string& name) const {
    std::vector<std::int64_t> labels = ids;
    for (index_t r = 0; r < n; ++r) labels[static_cast<std::size_t>(r * t)] = ignore_index;
    safetensors_writer w;
    w.add("input_ids", {n, t}, std::span<const std::int64_t>(ids));
    w.add("labels", {n, t}, std::span<const std::int64_t>(labels));
    const auto path = dir / name;
    w.write(path);
    return path;
  }
  /// Counting sequences: token t + 1 follows token t (mod 8), from a different start per row.
  fs::path counting(const std::string& name = "counting.safetensors", index_t t = 16) const {
    return data(cli_testing::counting_ids(4, t), 4, t, name);
  }
};

/// The "loss" of every line of a JSON-lines log, checking the step numbers run first..first+n-1.
std::vector<double> logged_losses(const fs::path& log, std::int64_t first_step) {
  std::ifstream in(log);
  std::vector<double> losses;
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    CHECK(j["step"].get<std::int64_t>() == first_step + static_cast<std::int64_t>(losses.size()));
    for (const char* key : {"lr_factor", "block", "tokens_per_s", "peak_bytes", "state_bytes"})
      CHECK(j.contains(key));
    losses.push_back(j["loss"].get<double>());
  }
  return losses;
}

double mean(const std::vector<double>& v, std::size_t from, std::size_t count) {
  double s = 0;
  for (std::size_t i = from; i < from + count; ++i) s += v[i];
  return s / static_cast<double>(count);
}

}  // namespace

TEST_CASE("train: every optimizer lowers the loss on a learnable data set and saves the model") {
  train_fixture f;
  const auto data = f.counting();
  const auto input = f.weights(f.model);
  struct optimizer_case {
    const char* name;
    const char* extra;
  };
  // Block optimizers: K = 3 with 3 layer blocks (plus embedding and head blocks for BAdam), so
  // 20 steps visit every block; BREAD updates the inactive layers too.
  const optimizer_case cases[] = {
      {"adam", "--lr 0.01"},
      {"adamw", "--lr 0.01 --schedule cosine:2"},
      {"sgd", "--lr 0.5 --clip 1"},
      {"badam", "--lr 0.02 --switch-every 3 --embedding-block --head-block"},
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
    CHECK(lines(r.out) == 1);  // the summary
    CHECK(r.out.find("optimizer " + name) != std::string::npos);
    const auto losses = logged_losses(log, 1);
    REQUIRE(losses.size() == 20);
    for (double l : losses) CHECK(std::isfinite(l));
    CHECK(mean(losses, 16, 4) < 0.8 * mean(losses, 0, 4));
    // The trained model loads back (config and weights) and differs from the input.
    CHECK(load_hf_config(out).hidden_size == f.cfg.hidden_size);
    const auto trained = f.weights(out);
    REQUIRE(trained.size() == input.size());
    CHECK(trained != input);
  }
}

TEST_CASE("train: a resumed run ends with the weights of the uninterrupted one") {
  // Bit for bit: the rows (16 tokens) fit in one attention key tile, so even the default
  // thread_partials attention backward adds one nonzero partial per dQ element, and the GEMMs
  // are too small to be split: the run is deterministic (docs/optim.md, "Determinism").
  train_fixture f;
  const auto data = f.counting();
  for (const std::string opt : {"badam", "bread-lora"}) {
    CAPTURE(opt);
    const std::string common = "train --model " + q(f.model) + " --data " + q(data) +
                               " --optimizer " + opt +
                               " --lr 0.02 --switch-every 2 --rank 2 --batch 2 --chunk 8 --quiet";
    const auto state = f.dir / (opt + "-state.safetensors");
    const auto whole = f.dir / (opt + "-whole"), resumed = f.dir / (opt + "-resumed");
    const auto log = f.dir / (opt + "-resumed.jsonl");
    REQUIRE(run(common + " --steps 12 --save-model " + q(whole)).code == 0);
    REQUIRE(run(common + " --steps 5 --save-state " + q(state)).code == 0);
    REQUIRE(run(common + " --steps 7 --resume " + q(state) + " --log " + q(log) + " --save-model " +
                q(resumed))
                .code == 0);
    CHECK(logged_losses(log, 6).size() == 7);  // steps 6..12
    const auto a = f.weights(whole), b = f.weights(resumed);
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      REQUIRE(a[i].size() == b[i].size());
      CHECK(std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(double)) == 0);
    }
    // and the resume mattered: without it the same 7 steps end elsewhere
    const auto fresh = f.dir / (opt + "-fresh");
    REQUIRE(run(common + " --steps 7 --save-model " + q(fresh)).code == 0);
    CHECK(f.weights(fresh) != a);
  }
  // A state saved by another optimizer is refused with one line naming the difference.
  const auto r =
      run("train --model " + q(f.model) + " --data " + q(data) +
          " --optimizer sgd --steps 1 --quiet --resume " + q(f.dir / "badam-state.safetensors"));
  CHECK(r.code == 1);
  CHECK(lines(r.err) == 1);
  CHECK(r.err.find("saved update rule is 'adam'") != std::string::npos);
}

TEST_CASE("train: --save-steps checkpoints; the newest resumes bit-identical to an unbroken run") {
  // The run stopped after step 4 stands for one killed after its periodic save at step 4: what
  // it left on disk is what a killed run leaves (a checkpoint is renamed into place when whole).
  train_fixture f;
  const auto data = f.counting();
  const std::string common = "train --model " + q(f.model) + " --data " + q(data) +
                             " --optimizer badam --lr 0.02 --switch-every 2 --batch 2 --chunk 8 "
                             "--shuffle --seed 4 --schedule cosine:2 --total-steps 6 --quiet";
  const auto out = f.dir / "checkpoints";
  const auto whole = f.dir / "ckpt-whole", resumed = f.dir / "ckpt-resumed";
  REQUIRE(run(common + " --steps 6 --save-model " + q(whole)).code == 0);
  REQUIRE(run(common + " --steps 4 --output-dir " + q(out) + " --save-steps 2 --save-total-limit 1")
              .code == 0);
  auto listing = [&] {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(out)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  };
  CHECK(listing() == std::vector<std::string>{"checkpoint-4"});  // checkpoint-2 rotated away
  CHECK(nlohmann::json::parse(
            cli_testing::slurp(out / "checkpoint-4" / "trainer_state.json"))["global_step"] == 4);
  const auto log = f.dir / "ckpt-resumed.jsonl";
  REQUIRE(run(common + " --steps 2 --resume " + q(out) + " --output-dir " + q(out) +
              " --save-steps 2 --save-total-limit 1 --log " + q(log) + " --save-model " +
              q(resumed))
              .code == 0);
  CHECK(logged_losses(log, 5).size() == 2);  // steps 5, 6
  // the checkpoint resumed from is an input: kept beside the newest
  CHECK(listing() == std::vector<std::string>{"checkpoint-4", "checkpoint-6"});
  const auto a = f.weights(whole), b = f.weights(resumed);
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    REQUIRE(a[i].size() == b[i].size());
    CHECK(std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(double)) == 0);
  }
  // --epochs counts the whole run, as TRL's num_train_epochs: 3 epochs of 4 rows, 2 rows a step,
  // are 6 steps, and the run resumed at step 4 does the last 2
  const auto by_epochs = f.dir / "ckpt-epochs";
  REQUIRE(run(common + " --epochs 3 --resume " + q(out / "checkpoint-4") + " --save-model " +
              q(by_epochs))
              .code == 0);
  const auto c = f.weights(by_epochs);
  REQUIRE(c.size() == a.size());
  for (std::size_t i = 0; i < a.size(); ++i)
    CHECK(std::memcmp(a[i].data(), c[i].data(), a[i].size() * sizeof(double)) == 0);
  // a folder without checkpoints, and --save-steps without --output-dir, are argument errors
  CHECK(run(common + " --steps 1 --resume " + q(f.model)).code == 2);
  CHECK(run(common + " --steps 1 --save-steps 2").code == 2);
}

TEST_CASE("eval: loss and perplexity; train --eval-data logs them, the last one eval's") {
  train_fixture f;
  const auto data = f.counting();
  auto r = run("eval --model " + q(f.model) + " --data " + q(data) + " --dtype f64 --batch 3");
  REQUIRE_MESSAGE(r.code == 0, r.err);
  const auto e = nlohmann::json::parse(r.out);
  // the loss of one SFT step on all rows with a learning rate of 0: the mean NLL of the tokens
  const auto log = f.dir / "eval-lr0.jsonl";
  REQUIRE(run("train --model " + q(f.model) + " --data " + q(data) +
              " --optimizer sgd --lr 0 --steps 1 --batch 4 --dtype f64 --quiet --log " + q(log))
              .code == 0);
  CHECK(std::abs(e["loss"].get<double>() - logged_losses(log, 1).at(0)) < 1e-12);
  CHECK(std::abs(e["perplexity"].get<double>() - std::exp(e["loss"].get<double>())) < 1e-9);
  CHECK(e["tokens"].get<double>() == 4 * 15);  // 4 rows of 16, the first label ignored
  // train evaluates every 2 steps and after the last (5); the last equals eval of the saved model
  const auto trained = f.dir / "eval-trained", tlog = f.dir / "eval-train.jsonl";
  r = run("train --model " + q(f.model) + " --data " + q(data) + " --eval-data " + q(data) +
          " --eval-steps 2 --optimizer adamw --lr 0.02 --steps 5 --batch 2 --dtype f64 --quiet "
          "--log " +
          q(tlog) + " --save-model " + q(trained));
  REQUIRE_MESSAGE(r.code == 0, r.err);
  std::vector<std::int64_t> eval_steps;
  std::vector<double> eval_losses;
  {
    std::ifstream in(tlog);
    std::string line;
    while (std::getline(in, line)) {
      const auto j = nlohmann::json::parse(line);
      if (!j.contains("eval_loss")) continue;
      eval_steps.push_back(j["step"].get<std::int64_t>());
      eval_losses.push_back(j["eval_loss"].get<double>());
      CHECK(std::abs(j["eval_perplexity"].get<double>() - std::exp(eval_losses.back())) < 1e-9);
    }
  }
  CHECK(eval_steps == std::vector<std::int64_t>{2, 4, 5});
  REQUIRE(eval_losses.size() == 3);
  CHECK(eval_losses.back() < e["loss"].get<double>());  // training lowered it
  r = run("eval --model " + q(trained) + " --data " + q(data) + " --dtype f64 --batch 2");
  REQUIRE_MESSAGE(r.code == 0, r.err);
  CHECK(std::abs(nlohmann::json::parse(r.out)["loss"].get<double>() - eval_losses.back()) < 1e-12);
  // arguments
  CHECK(run("eval --model " + q(f.model)).code == 2);
  CHECK(run("eval --model " + q(f.model) + " --data " + q(data) + " --dtype bf16").code == 2);
  CHECK(run("train --model " + q(f.model) + " --data " + q(data) +
            " --optimizer sgd --eval-steps 2 --quiet")
            .code == 2);
}

TEST_CASE("train: --deterministic and --total-steps resume long rows on a cosine schedule") {
  // 160-token rows span two attention key tiles, where only the two-pass backward fixes the
  // summation order; --total-steps gives the split run the whole run's cosine horizon.
  train_fixture f;
  const auto data = f.counting("long.safetensors", 160);
  const std::string common = "train --model " + q(f.model) + " --data " + q(data) +
                             " --optimizer badam --lr 0.02 --switch-every 2 --batch 2 --chunk 64" +
                             " --schedule cosine:2 --deterministic --quiet";
  const auto state = f.dir / "det-state.safetensors";
  const auto whole = f.dir / "det-whole", resumed = f.dir / "det-resumed";
  const auto log = f.dir / "det-first.jsonl";
  REQUIRE(run(common + " --steps 8 --save-model " + q(whole)).code == 0);
  REQUIRE(run(common + " --steps 3 --total-steps 8 --log " + q(log) + " --save-state " + q(state))
              .code == 0);
  REQUIRE(run(common + " --steps 5 --total-steps 8 --resume " + q(state) + " --save-model " +
              q(resumed))
              .code == 0);
  const auto a = f.weights(whole), b = f.weights(resumed);
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    REQUIRE(a[i].size() == b[i].size());
    CHECK(std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(double)) == 0);
  }
  // the first part followed the 8-step horizon: its last lr factor is not the decayed 0
  std::ifstream in(log);
  std::string line, last;
  while (std::getline(in, line)) last = line;
  CHECK(nlohmann::json::parse(last)["lr_factor"].get<double>() > 0.5);
  // a horizon shorter than the run is bad input naming the value
  const auto r = run(common + " --steps 5 --total-steps 4 --resume " + q(state));
  CHECK(r.code == 1);
  CHECK(r.err.find("--total-steps is 4, but this run ends at step 8") != std::string::npos);
}

TEST_CASE("train: --grad-accum N equals one batch of the union (f64, 1e-12)") {
  // B rows x N micro-batches per step against N x B rows in one batch: the same rows per step,
  // one normaliser for the whole step (rows supervise different numbers of tokens, so a mean per
  // micro-batch would differ).
  train_fixture f;
  const index_t n = 8, t = 12;
  std::vector<std::int64_t> ids, labels;
  for (index_t r = 0; r < n; ++r)
    for (index_t k = 0; k < t; ++k) {
      ids.push_back((3 * r + k) % 8);
      labels.push_back(k < 1 + (3 * r) % 7 ? ignore_index : ids.back());
    }
  safetensors_writer w;
  w.add("input_ids", {n, t}, std::span<const std::int64_t>(ids));
  w.add("labels", {n, t}, std::span<const std::int64_t>(labels));
  const auto data = f.dir / "uneven.safetensors";
  w.write(data);
  // Largest |a - b| of a tensor over its largest |b|.
  auto max_rel = [](const std::vector<std::vector<double>>& a,
                    const std::vector<std::vector<double>>& b) {
    double worst = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
      double diff = 0, scale = 1e-300;
      for (std::size_t k = 0; k < a[i].size(); ++k) {
        diff = std::max(diff, std::abs(a[i][k] - b[i][k]));
        scale = std::max(scale, std::abs(b[i][k]));
      }
      worst = std::max(worst, diff / scale);
    }
    return worst;
  };
  for (const std::string opt : {"adam", "badam", "bread-sgd", "bread-lora"}) {
    CAPTURE(opt);
    const std::string common = "train --model " + q(f.model) + " --data " + q(data) +
                               " --optimizer " + opt +
                               " --dtype f64 --lr 0.02 --switch-every 2 --chunk 4 --steps 3 "
                               "--bread-lr 0.05 --bread-scope all --quiet";
    std::vector<std::vector<double>> losses;
    std::vector<std::vector<std::vector<double>>> weights;
    for (const std::string split :
         {"--batch 4", "--batch 2 --grad-accum 2", "--batch 1 --grad-accum 4", "--batch 2"}) {
      CAPTURE(split);
      const auto log = f.dir / (opt + std::to_string(losses.size()) + ".jsonl");
      const auto out = f.dir / (opt + std::to_string(losses.size()));
      const auto r = run(common + " " + split + " --log " + q(log) + " --save-model " + q(out));
      REQUIRE(r.code == 0);
      losses.push_back(logged_losses(log, 1));
      weights.push_back(f.weights(out));
    }
    for (std::size_t k : {std::size_t{1}, std::size_t{2}}) {
      CAPTURE(k);
      REQUIRE(losses[k].size() == 3);
      for (std::size_t s = 0; s < 3; ++s)
        CHECK(std::abs(losses[k][s] - losses[0][s]) <= 1e-12 * std::abs(losses[0][s]));
      CHECK(max_rel(weights[k], weights[0]) <= 1e-12);
    }
    CHECK(max_rel(weights[3], weights[0]) > 1e-6);  // other rows per step: another result
  }
}

TEST_CASE("train: packed rows (position_ids) == the same documents as rows of their own (1e-12)") {
  // documents of 5, 4, 6 and 3 tokens: packed as 2 rows of 9 (5 + 4, 6 + 3), or as 4 rows of 9
  // with the documents at the start and unsupervised filler after them (causal: the filler
  // changes nothing before it). One step sees the same documents and the same counted tokens.
  train_fixture f;
  const std::vector<std::vector<std::int64_t>> docs{
      {1, 2, 3, 4, 5}, {7, 6, 5, 4}, {2, 4, 6, 0, 2, 4}, {3, 1, 3}};
  const index_t t = 9;
  std::vector<std::int64_t> pid, plab, ppos, uid, ulab;
  for (const auto& d : docs) {
    for (std::size_t k = 0; k < d.size(); ++k) {
      pid.push_back(d[k]);
      plab.push_back(k == 0 ? ignore_index : d[k]);
      ppos.push_back(static_cast<std::int64_t>(k));
      uid.push_back(d[k]);
      ulab.push_back(k == 0 ? ignore_index : d[k]);
    }
    for (auto k = static_cast<index_t>(d.size()); k < t; ++k) {
      uid.push_back(7);
      ulab.push_back(ignore_index);
    }
  }
  auto write = [&](const std::string& name, const std::vector<std::int64_t>& ids,
                   const std::vector<std::int64_t>& labels, const std::vector<std::int64_t>* pos) {
    const auto n = static_cast<index_t>(ids.size()) / t;
    safetensors_writer w;
    w.add("input_ids", {n, t}, std::span<const std::int64_t>(ids));
    w.add("labels", {n, t}, std::span<const std::int64_t>(labels));
    if (pos != nullptr) w.add("position_ids", {n, t}, std::span<const std::int64_t>(*pos));
    w.write(f.dir / name);
    return f.dir / name;
  };
  const auto packed = write("packed.safetensors", pid, plab, &ppos);
  const auto unpacked = write("unpacked.safetensors", uid, ulab, nullptr);
  const auto leaky = write("leaky.safetensors", pid, plab, nullptr);  // packed, no position_ids
  const std::string common = "train --model " + q(f.model) +
                             " --optimizer adamw --dtype f64 --lr 0.02 --chunk 4 --steps 2"
                             " --quiet";
  auto train_on = [&](const fs::path& data, const std::string& batch, const std::string& name) {
    const auto log = f.dir / (name + ".jsonl");
    const auto r = run(common + " --data " + q(data) + " " + batch + " --log " + q(log));
    REQUIRE(r.code == 0);
    return logged_losses(log, 1);
  };
  const auto p = train_on(packed, "--batch 2", "packed");
  const auto u = train_on(unpacked, "--batch 4", "unpacked");
  const auto l = train_on(leaky, "--batch 2", "leaky");
  REQUIRE(p.size() == 2);
  REQUIRE(u.size() == 2);
  for (std::size_t s = 0; s < 2; ++s) CHECK(std::abs(p[s] - u[s]) <= 1e-12 * std::abs(u[s]));
  CHECK(std::abs(l[0] - u[0]) > 1e-6 * std::abs(u[0]));  // documents that attend to each other
  // a data set key train does not read is an error naming it
  safetensors_writer w;
  w.add("input_ids", {2, t}, std::span<const std::int64_t>(pid));
  w.add("attention_mask", {2, t}, std::span<const std::int64_t>(ppos));
  w.write(f.dir / "masked.safetensors");
  const auto r = run(common + " --data " + q(f.dir / "masked.safetensors") + " --batch 2");
  CHECK(r.code == 1);
  CHECK(r.err.find("'attention_mask'") != std::string::npos);
}

TEST_CASE("train: wrong arguments exit 2 with the usage, before any file is read") {
  const std::string base = "train --model /nonexistent/model --data /nonexistent/data ";
  for (const std::string& args :
       {std::string("train"),
        std::string("train --model m"),
        base + "--optimizer nesterov",
        base + "--optimizer adam --steps -1",
        base + "--optimizer adam --steps",
        base + "--optimizer adam --lr fast",
        base + "--optimizer adam --bogus 1",
        base + "--optimizer bread-sgd --bread-scope sideways",
        base + "--optimizer badam --order sideways",
        base + "--optimizer badam --order fixed",
        base + "--optimizer adam --schedule cosine:x",
        base + "--optimizer adam --schedule step",
        base + "--optimizer adam --sched fast",
        base + "--optimizer adam --clip -1",
        base + "--optimizer adam --total-steps 0",
        base + "--optimizer adam --grad-accum 0",
        base + "--optimizer adam --dtype f16",
        base + "--optimizer adam --parallel sequence --sched full",
        base + "--optimizer bread-sgd --parallel sequence",
        base + "--optimizer adam --assignment zigzag",
        base + "--optimizer adam --parallel model",
        base + "--optimizer bread-lora --parallel data",
        std::string("train --model m --preset tiny --data d --optimizer adam")}) {
    CAPTURE(args);
    const auto r = run(args);
    CHECK(r.code == 2);
    CHECK(r.err.rfind("tightfit train: ", 0) == 0);  // the problem first
    CHECK(r.err.find("usage: tightfit train") != std::string::npos);
    CHECK(r.err.find("/nonexistent") == std::string::npos);  // no file was opened
  }
}

TEST_CASE("train: a missing data file or an out-of-range token exits 1 with one line") {
  train_fixture f;
  const auto missing = f.dir / "no-such-data.safetensors";
  auto r = run("train --model " + q(f.model) + " --data " + q(missing) + " --optimizer adam");
  CHECK(r.code == 1);
  CHECK(lines(r.err) == 1);
  CHECK(r.err.find("no-such-data.safetensors") != std::string::npos);

  const std::int64_t bad = f.cfg.vocab_size + 5;
  std::vector<std::int64_t> ids(2 * 6, 1);
  ids[9] = bad;  // row 1, position 3
  const auto data = f.data(ids, 2, 6, "bad-token.safetensors");
  r = run("train --model " + q(f.model) + " --data " + q(data) + " --optimizer badam --quiet");
  CHECK(r.code == 1);
  CHECK(lines(r.err) == 1);
  CHECK(r.err.find("input_ids[1][3] is " + std::to_string(bad)) != std::string::npos);

  r = run("train --model " + q(f.dir / "no-model") + " --data " + q(data) + " --optimizer adam");
  CHECK(r.code == 1);
  CHECK(lines(r.err) == 1);
  CHECK(r.err.find("no-model") != std::string::npos);
}
