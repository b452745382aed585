// `tightfit train --optimizer lora`: the adapter directory it writes has PEFT's tensor names,
// shapes and dtype (adapter_model.safetensors) and adapter_config.json's keys; --adapter loads
// it back unchanged and continues; --merge-out writes W0 + s B A; the loss falls; --lora-dropout
// trains, is recorded in adapter_config.json and is seeded by --seed, and an adapter with
// lora_dropout trains with it; LoRA options are checked before any file is read.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
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

/// A 3-layer random model directory (F64 weights) and a learnable data set beside it.
struct lora_fixture : cli_testing::model_fixture {
  fs::path data = dir / "counting.safetensors";
  lora_fixture() : model_fixture("lora") {
    const index_t n = 4, t = 16;
    const auto ids = cli_testing::counting_ids(n, t);
    safetensors_writer w;
    w.add("input_ids", {n, t}, std::span<const std::int64_t>(ids));
    w.write(data);
  }
};

/// Every tensor of a safetensors file as doubles, by name.
std::map<std::string, std::vector<double>> tensors_of(const fs::path& file) {
  const auto f = safetensors_file::open(file);
  std::map<std::string, std::vector<double>> out;
  for (const auto& t : f.tensors()) out[t.name] = f.read<double>(t.name);
  return out;
}

std::vector<double> log_losses(const fs::path& log) {
  std::ifstream in(log);
  std::vector<double> losses;
  std::string line;
  while (std::getline(in, line))
    losses.push_back(nlohmann::json::parse(line)["loss"].get<double>());
  return losses;
}

}  // namespace

TEST_CASE("train --optimizer lora: PEFT adapter directory, merge, load back and continue") {
  lora_fixture f;
  const auto out = f.dir / "adapter", merged = f.dir / "merged", log = f.dir / "lora.jsonl";
  const std::string common = "train --model " + q(f.model) + " --data " + q(f.data) +
                             " --optimizer lora --dtype f64 --batch 2 --chunk 8 --quiet";
  const auto r = run(common +
                     " --lora-rank 2 --lora-alpha 4 --target-modules q_proj,v_proj,down_proj"
                     " --lr 0.03 --steps 30 --seed 3 --log " +
                     q(log) + " --save-model " + q(out) + " --merge-out " + q(merged));
  REQUIRE(r.code == 0);
  CHECK(r.err.empty());
  CHECK(r.out.find("optimizer lora") != std::string::npos);
  const auto losses = log_losses(log);
  REQUIRE(losses.size() == 30);
  CHECK((losses[26] + losses[27] + losses[28] + losses[29]) <
        0.9 * (losses[0] + losses[1] + losses[2] + losses[3]));

  // adapter_model.safetensors: PEFT names, (r, in) / (out, r), F64 (the dtype trained).
  const auto file = safetensors_file::open(out / "adapter_model.safetensors");
  const index_t d = f.cfg.hidden_size, qw = f.cfg.q_width(), kvw = f.cfg.kv_width(),
                ff = f.cfg.intermediate_size;
  std::map<std::string, std::vector<index_t>> want;
  for (int l = 0; l < 3; ++l) {
    const std::string p = "base_model.model.model.layers." + std::to_string(l) + ".";
    want[p + "self_attn.q_proj.lora_A.weight"] = {2, d};
    want[p + "self_attn.q_proj.lora_B.weight"] = {qw, 2};
    want[p + "self_attn.v_proj.lora_A.weight"] = {2, d};
    want[p + "self_attn.v_proj.lora_B.weight"] = {kvw, 2};
    want[p + "mlp.down_proj.lora_A.weight"] = {2, ff};
    want[p + "mlp.down_proj.lora_B.weight"] = {d, 2};
  }
  CHECK(file.tensors().size() == want.size());
  for (const auto& t : file.tensors()) {
    CAPTURE(t.name);
    REQUIRE(want.contains(t.name));
    CHECK(t.shape == want[t.name]);
    CHECK(t.type == dtype::f64);
  }
  // adapter_config.json: LoraConfig's keys and values.
  std::ifstream in(out / "adapter_config.json");
  const auto j = nlohmann::json::parse(in);
  CHECK(j["peft_type"] == "LORA");
  CHECK(j["task_type"] == "CAUSAL_LM");
  CHECK(j["r"] == 2);
  CHECK(j["lora_alpha"] == 4.0);
  CHECK(j["lora_dropout"] == 0.0);
  CHECK(j["target_modules"] == nlohmann::json::array({"q_proj", "v_proj", "down_proj"}));
  CHECK(j["bias"] == "none");
  CHECK(j["fan_in_fan_out"] == false);
  CHECK(j["use_rslora"] == false);
  CHECK(j["use_dora"] == false);
  CHECK(j["init_lora_weights"] == true);
  CHECK(j["inference_mode"] == true);
  CHECK(j["base_model_name_or_path"] == f.model.string());
  for (const char* key :
       {"modules_to_save", "layers_to_transform", "rank_pattern", "alpha_pattern", "revision"})
    CHECK(j.contains(key));

  // --merge-out: W0 + (alpha / r) B A on the targets, every other tensor unchanged.
  const auto base = tensors_of(f.model / "model.safetensors");
  const auto adapters = tensors_of(out / "adapter_model.safetensors");
  const auto after = tensors_of(merged / "model.safetensors");
  CHECK(load_hf_config(merged).hidden_size == d);
  REQUIRE(after.size() == base.size());
  const double s = 4.0 / 2.0;
  int merged_count = 0;
  for (const auto& [name, w0] : base) {
    CAPTURE(name);
    const auto& w = after.at(name);
    const std::string stem = name.substr(0, name.size() - std::string(".weight").size());
    const std::string a_name = "base_model.model." + stem + ".lora_A.weight";
    if (!adapters.contains(a_name)) {
      CHECK(w == w0);
      continue;
    }
    const auto& a = adapters.at(a_name);
    const auto& b = adapters.at("base_model.model." + stem + ".lora_B.weight");
    const std::size_t in_f = a.size() / 2, out_f = b.size() / 2;
    double worst = 0, scale = 0;
    for (std::size_t o = 0; o < out_f; ++o)
      for (std::size_t i = 0; i < in_f; ++i) {
        const double e = w0[o * in_f + i] + s * (b[o * 2] * a[i] + b[o * 2 + 1] * a[in_f + i]);
        worst = std::max(worst, std::abs(w[o * in_f + i] - e));
        scale = std::max(scale, std::abs(e));
      }
    CHECK(worst <= 1e-14 * scale);
    CHECK(w != w0);  // B moved off zero
    ++merged_count;
  }
  CHECK(merged_count == 9);

  // --adapter loads the adapter unchanged (0 steps), and continues from where it was.
  const auto again = f.dir / "again", cont_log = f.dir / "continued.jsonl";
  REQUIRE(run(common + " --adapter " + q(out) + " --steps 0 --save-model " + q(again)).code == 0);
  CHECK(tensors_of(again / "adapter_model.safetensors") == adapters);
  std::ifstream in2(again / "adapter_config.json");
  CHECK(nlohmann::json::parse(in2)["target_modules"] == j["target_modules"]);
  REQUIRE(run(common + " --adapter " + q(out) + " --lr 0.03 --steps 2 --log " + q(cont_log)).code ==
          0);
  const auto continued = log_losses(cont_log);
  REQUIRE(continued.size() == 2);
  CHECK(continued[0] < losses[0]);
  CHECK(continued[0] < 0.75 * (losses[28] + losses[29]));
}

TEST_CASE("train --optimizer lora: all-linear, f32 adapters, --save-state / --resume") {
  lora_fixture f;
  const auto out = f.dir / "all-linear";
  const std::string common = "train --model " + q(f.model) + " --data " + q(f.data) +
                             " --optimizer lora --target-modules all-linear --lora-rank 3"
                             " --batch 2 --chunk 8 --lr 0.02 --quiet";
  REQUIRE(run(common + " --steps 4 --save-model " + q(out)).code == 0);
  const auto file = safetensors_file::open(out / "adapter_model.safetensors");
  CHECK(file.tensors().size() == 3 * 7 * 2);
  for (const auto& t : file.tensors()) CHECK(t.type == dtype::f32);
  std::ifstream in(out / "adapter_config.json");
  CHECK(nlohmann::json::parse(in)["target_modules"].size() == 7);
  // a run split by --save-state / --resume ends with the adapters of the uninterrupted one
  const auto state = f.dir / "lora-state.safetensors", resumed = f.dir / "resumed";
  REQUIRE(run(common + " --steps 2 --save-state " + q(state)).code == 0);
  REQUIRE(run(common + " --steps 2 --resume " + q(state) + " --save-model " + q(resumed)).code ==
          0);
  CHECK(tensors_of(resumed / "adapter_model.safetensors") ==
        tensors_of(out / "adapter_model.safetensors"));
}

TEST_CASE("train --optimizer lora: wrong LoRA options exit 2 before any file is read") {
  lora_fixture f;
  const std::string common = "train --model " + q(f.model) + " --data " + q(f.data) + " --steps 1";
  struct bad_case {
    std::string args, message;
  };
  const bad_case cases[] = {
      {" --optimizer lora --lora-dropout 1", "dropout is 1"},
      {" --optimizer lora --lora-dropout 1.5", "--lora-dropout is 1.5"},
      {" --optimizer lora --lora-dropout -0.1", "--lora-dropout is -0.1"},
      {" --optimizer lora --target-modules q_proj,qkv", "'qkv'"},
      {" --optimizer lora --target-modules q_proj,q_proj", "given twice"},
      {" --optimizer adamw --lora-rank 4", "options of --optimizer lora"},
      {" --optimizer lora --adapter " + q(f.dir) + " --lora-rank 4", "adapter_config.json"},
      {" --optimizer lora --lora-rank 0", "--lora-rank"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.args);
    const auto r = run(common + c.args);
    CHECK(r.code == 2);
    CHECK(r.err.find(c.message) != std::string::npos);
  }
  // an adapter directory without adapter_config.json: exit 1, one line naming the file
  const auto r = run(common + " --optimizer lora --adapter " + q(f.model));
  CHECK(r.code == 1);
  CHECK(lines(r.err) == 1);
  CHECK(r.err.find("adapter_config.json") != std::string::npos);
}

TEST_CASE("train --optimizer lora --lora-dropout: recorded, seeded, an adapter's dropout applied") {
  lora_fixture f;
  const std::string common = "train --model " + q(f.model) + " --data " + q(f.data) +
                             " --optimizer lora --dtype f64 --batch 2 --chunk 8 --quiet"
                             " --lora-rank 2 --target-modules q_proj,v_proj,down_proj --lr 0.03";
  const auto out = f.dir / "dropout", same = f.dir / "dropout-again", none = f.dir / "no-dropout";
  const auto log = f.dir / "dropout.jsonl", log_same = f.dir / "dropout-again.jsonl";
  REQUIRE(run(common + " --lora-dropout 0.1 --steps 6 --seed 3 --log " + q(log) + " --save-model " +
              q(out))
              .code == 0);
  {
    std::ifstream in(out / "adapter_config.json");
    CHECK(nlohmann::json::parse(in)["lora_dropout"].get<double>() == 0.1);
  }
  // the same --seed: the same masks, the same bits
  REQUIRE(run(common + " --lora-dropout 0.1 --steps 6 --seed 3 --log " + q(log_same) +
              " --save-model " + q(same))
              .code == 0);
  const auto trained = tensors_of(out / "adapter_model.safetensors");
  CHECK(tensors_of(same / "adapter_model.safetensors") == trained);
  CHECK(log_losses(log_same) == log_losses(log));
  // the dropout is applied: without it (same seed, same initialisation) the adapters differ
  REQUIRE(run(common + " --steps 6 --seed 3 --save-model " + q(none)).code == 0);
  CHECK(tensors_of(none / "adapter_model.safetensors") != trained);

  // an adapter whose adapter_config.json says lora_dropout 0.05 trains, with that dropout
  {
    std::ifstream in(out / "adapter_config.json");
    auto j = nlohmann::json::parse(in);
    j["lora_dropout"] = 0.05;
    std::ofstream(out / "adapter_config.json") << j.dump(2);
  }
  const std::string from = "train --model " + q(f.model) + " --data " + q(f.data) +
                           " --optimizer lora --dtype f64 --batch 2 --chunk 8 --quiet --lr 0.03"
                           " --steps 2 --seed 5 --adapter " +
                           q(out);
  const auto cont = f.dir / "continued", cont_none = f.dir / "continued-without";
  REQUIRE(run(from + " --save-model " + q(cont)).code == 0);
  const auto continued = tensors_of(cont / "adapter_model.safetensors");
  CHECK(continued != trained);
  std::ifstream in(cont / "adapter_config.json");
  CHECK(nlohmann::json::parse(in)["lora_dropout"].get<double>() == 0.05);
  {  // the same adapter with lora_dropout 0 ends elsewhere: the 0.05 was applied
    std::ifstream cin(out / "adapter_config.json");
    auto j = nlohmann::json::parse(cin);
    j["lora_dropout"] = 0.0;
    std::ofstream(out / "adapter_config.json") << j.dump(2);
  }
  REQUIRE(run(from + " --save-model " + q(cont_none)).code == 0);
  CHECK(tensors_of(cont_none / "adapter_model.safetensors") != continued);
}
