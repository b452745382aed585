// `tightfit train --save-model / --merge-out`: the model folder loads as it is. From an F32
// checkpoint the saved weights are the trained ones bit for bit (those of --save-state) and
// `tightfit logprobs --dtype f64` on the folder equals the library's forward of those weights;
// from a BF16 one each tensor keeps its dtype (BF16 stays BF16, the F32 norms F32) and holds the
// rounding of the trained value. config.json is the source's, every field with its value and in
// its order; generation_config.json and the tokenizer files are copied byte for byte; the source
// folder is left as it was; the outputs' files follow the tool's rule for outputs.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_model.hpp"
#include "cli_testing.hpp"
#include "stream/stream_testing.hpp"
#include "tightfit/io/detail/half.hpp"
#include "tightfit/io/safetensors.hpp"
#include "tightfit/nn/architectures.hpp"
#include "tightfit/nn/hf_model.hpp"
#include "tightfit/stream/backward.hpp"
#include "tightfit/stream/forward.hpp"

using namespace tightfit;
namespace fs = std::filesystem;
using cli_testing::q;
using cli_testing::run;
using cli_testing::slurp;
using nlohmann::ordered_json;

namespace {

/// The side files a source folder gets (name, bytes).
const std::map<std::string, std::string>& side_files() {
  static const std::map<std::string, std::string> files{
      {"generation_config.json", "{\n  \"bos_token_id\": 1,\n  \"eos_token_id\": [2, 3]\n}\n"},
      {"tokenizer.json", R"({"version": "1.0", "added_tokens": [], "model": {"type": "BPE"}})"},
      {"tokenizer_config.json", R"({"model_max_length": 4096})"},
      {"special_tokens_map.json", R"({"eos_token": "<|end|>"})"},
      {"merges.txt", "#version: 0.2\na b\n"},
      {"vocab.json", R"({"a": 0, "b": 1})"},
      {"tokenizer.model", std::string("\x00\x0a\xff sp", 6)},
  };
  return files;
}

/// Every file of a folder with its bytes.
std::map<std::string, std::string> folder_bytes(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    out[e.path().filename().string()] = slurp(e.path());
  return out;
}

std::vector<std::string> keys_of(const ordered_json& j) {
  std::vector<std::string> keys;
  for (auto it = j.begin(); it != j.end(); ++it) keys.push_back(it.key());
  return keys;
}

/// A tiny model folder and data beside it; source(name, matrices) writes a checkpoint folder of
/// its weights with the 2-D tensors in `matrices` and the norms in F32, a config.json with fields
/// tightfit does not model (not in sorted order) and the side files.
struct save_fixture : cli_testing::model_fixture {
  fs::path data = dir / "counting.safetensors";
  save_fixture() : model_fixture("save") {
    const index_t n = 4, t = 16;
    const auto ids = cli_testing::counting_ids(n, t);
    safetensors_writer w;
    w.add("input_ids", {n, t}, std::span<const std::int64_t>(ids));
    w.write(data);
  }
  fs::path source(const std::string& name, dtype matrices) const {
    const fs::path src = dir / name;
    fs::create_directories(src);
    ordered_json config;
    config["transformers_version"] = "4.51.0";
    config["torch_dtype"] = matrices == dtype::bf16 ? "bfloat16" : "float32";
    config["bos_token_id"] = 1;
    config["eos_token_id"] = ordered_json::array({2, 3});
    config["use_cache"] = true;
    const ordered_json modelled = ordered_json::parse(hf_config_json(cfg).dump());
    for (auto it = modelled.begin(); it != modelled.end(); ++it) config[it.key()] = it.value();
    config["initializer_range"] = 0.02;
    config["custom"] = {{"z", 1}, {"a", nullptr}};
    std::ofstream(src / "config.json") << config.dump(2);
    const auto file = safetensors_file::open(model / "model.safetensors");
    safetensors_writer w;
    for (const auto& t : file.tensors())
      w.add(t.name, t.shape, std::span<const double>(file.read<double>(t.name)),
            t.shape.size() == 2 ? matrices : dtype::f32);
    w.set_metadata("format", "pt");
    w.write(src / "model.safetensors");
    for (const auto& [file_name, bytes] : side_files())
      std::ofstream(src / file_name, std::ios::binary) << bytes;
    return src;
  }
};

/// Checks the saved folder's config.json and side files against the source's.
void check_config_and_side_files(const fs::path& out, const fs::path& src) {
  const auto before = ordered_json::parse(slurp(src / "config.json"));
  const auto after = ordered_json::parse(slurp(out / "config.json"));
  CHECK(after == before);
  CHECK(keys_of(after) == keys_of(before));
  for (const auto& [name, bytes] : side_files()) {
    CAPTURE(name);
    REQUIRE(fs::exists(out / name));
    CHECK(slurp(out / name) == bytes);
  }
}

}  // namespace

TEST_CASE("train --save-model: an F32 checkpoint saved bit for bit, logprobs on it as on memory") {
  save_fixture f;
  const fs::path src = f.source("f32", dtype::f32);
  const auto source_before = folder_bytes(src);
  const fs::path out = f.dir / "out32", state = f.dir / "state32.safetensors";
  const auto r = run("train --model " + q(src) + " --data " + q(f.data) +
                     " --optimizer adam --lr 0.01 --steps 3 --batch 2 --chunk 8 --quiet"
                     " --save-model " +
                     q(out) + " --save-state " + q(state));
  REQUIRE(r.code == 0);
  CHECK(r.err.empty());
  CHECK(folder_bytes(src) == source_before);
  check_config_and_side_files(out, src);

  // The weights: F32 as the source, the trained values of --save-state bit for bit.
  const auto saved = safetensors_file::open(out / "model.safetensors");
  const auto trained = safetensors_file::open(state);
  const auto input = safetensors_file::open(src / "model.safetensors");
  CHECK(saved.size() == input.size());
  bool moved = false;
  for (const auto& t : saved.tensors()) {
    CAPTURE(t.name);
    CHECK(t.type == dtype::f32);
    const auto w = saved.read<float>(t.name);
    CHECK(w == trained.read<float>(t.name));
    moved = moved || w != input.read<float>(t.name);
  }
  CHECK(moved);

  // logprobs --dtype f64 on the saved folder == the library's forward of the trained weights.
  const index_t p = 2, t = 6;
  std::vector<std::int64_t> cid, rid, clab, rlab;
  for (index_t i = 0; i < p * t; ++i) {
    cid.push_back((i * 5 + 1) % f.cfg.vocab_size);
    rid.push_back((i * 3 + 2) % f.cfg.vocab_size);
    clab.push_back(i % t < 2 ? -100 : cid.back());
    rlab.push_back(i % t < 2 ? -100 : rid.back());
  }
  safetensors_writer w;
  w.add("chosen_input_ids", {p, t}, std::span<const std::int64_t>(cid));
  w.add("chosen_labels", {p, t}, std::span<const std::int64_t>(clab));
  w.add("rejected_input_ids", {p, t}, std::span<const std::int64_t>(rid));
  w.add("rejected_labels", {p, t}, std::span<const std::int64_t>(rlab));
  const auto batch = f.dir / "dpo.safetensors", lp = f.dir / "dpo_ref.safetensors";
  w.write(batch);
  REQUIRE(run("logprobs --model " + q(out) + " --batch " + q(batch) + " --out " + q(lp) +
              " --dtype f64")
              .code == 0);
  std::vector<std::int64_t> ids = cid, labels = clab;
  ids.insert(ids.end(), rid.begin(), rid.end());
  labels.insert(labels.end(), rlab.begin(), rlab.end());
  const auto sums = with_config_layer(f.cfg, [&](auto layer) {
    using ref = reference_backend<double>;
    ref be;
    decoder_model<ref, typename decltype(layer)::template type<ref>> m(be, f.cfg);
    auto& params = m.parameters();
    for (std::size_t i = 0; i < params.size(); ++i) {
      const auto v = trained.read<double>(params.name(i));
      std::copy(v.begin(), v.end(), params.value(i).begin());
    }
    return sequence_logprob_sums(m, {2 * p, t, ids, shift_labels(labels, 2 * p, t), {}});
  });
  const auto file = safetensors_file::open(lp);
  const auto chosen = file.read<double>("ref_chosen_logps");
  const auto rejected = file.read<double>("ref_rejected_logps");
  REQUIRE(chosen.size() == 2);
  REQUIRE(rejected.size() == 2);
  for (std::size_t i = 0; i < 2; ++i) {
    CHECK(std::abs(chosen[i] - sums[i]) <= 1e-12 * std::abs(sums[i]));
    CHECK(std::abs(rejected[i] - sums[2 + i]) <= 1e-12 * std::abs(sums[2 + i]));
  }
}

TEST_CASE("train --save-model / --merge-out: a BF16 checkpoint stays BF16, its files copied") {
  save_fixture f;
  const fs::path src = f.source("bf16", dtype::bf16);
  const auto source_before = folder_bytes(src);
  const auto input = safetensors_file::open(src / "model.safetensors");

  // Full fine-tuning: each tensor in the source's dtype, the rounding of the trained value.
  const fs::path out = f.dir / "out16", state = f.dir / "state16.safetensors";
  auto r = run("train --model " + q(src) + " --data " + q(f.data) +
               " --optimizer adamw --lr 0.01 --steps 2 --batch 2 --chunk 8 --quiet --save-model " +
               q(out) + " --save-state " + q(state));
  REQUIRE(r.code == 0);
  check_config_and_side_files(out, src);
  const auto saved = safetensors_file::open(out / "model.safetensors");
  const auto trained = safetensors_file::open(state);
  CHECK(saved.size() == input.size());
  int rounded = 0;
  for (const auto& t : saved.tensors()) {
    CAPTURE(t.name);
    CHECK(t.type == input.info(t.name).type);
    const auto w = saved.read<double>(t.name);
    const auto x = trained.read<float>(t.name);
    REQUIRE(w.size() == x.size());
    for (std::size_t k = 0; k < w.size(); ++k) {
      const double want =
          t.type == dtype::bf16
              ? static_cast<double>(io::detail::bf16_to_float(io::detail::double_to_bf16(x[k])))
              : static_cast<double>(x[k]);
      CHECK(w[k] == want);
      rounded += w[k] != static_cast<double>(x[k]) ? 1 : 0;
    }
  }
  CHECK(rounded > 0);
  CHECK(saved.info("model.layers.0.self_attn.q_proj.weight").type == dtype::bf16);
  CHECK(saved.info("model.norm.weight").type == dtype::f32);

  // LoRA --merge-out: the merged model in the base's dtypes, config.json and files as well.
  const fs::path merged = f.dir / "merged16", adapter = f.dir / "adapter16";
  r = run("train --model " + q(src) + " --data " + q(f.data) +
          " --optimizer lora --lr 0.01 --steps 2 --batch 2 --chunk 8 --quiet --save-model " +
          q(adapter) + " --merge-out " + q(merged));
  REQUIRE(r.code == 0);
  check_config_and_side_files(merged, src);
  const auto m = safetensors_file::open(merged / "model.safetensors");
  CHECK(m.size() == input.size());
  for (const auto& t : m.tensors()) {
    CAPTURE(t.name);
    CHECK(t.type == input.info(t.name).type);
  }
  CHECK(m.read<double>("model.layers.0.self_attn.q_proj.weight") !=
        input.read<double>("model.layers.0.self_attn.q_proj.weight"));  // merged B A
  CHECK(m.read<double>("model.layers.0.mlp.up_proj.weight") ==
        input.read<double>("model.layers.0.mlp.up_proj.weight"));  // not a target
  CHECK_FALSE(fs::exists(adapter / "tokenizer.json"));  // the adapter folder: the adapter only
  CHECK(folder_bytes(src) == source_before);
}

TEST_CASE("train --save-model: a preset's config.json has torch_dtype; the outputs' files") {
  save_fixture f;
  const fs::path out = f.dir / "preset";
  auto r = run("train --preset tiny --data " + q(f.data) +
               " --optimizer sgd --steps 1 --batch 2 --chunk 8 --quiet --save-model " + q(out));
  REQUIRE(r.code == 0);
  const auto j = nlohmann::json::parse(slurp(out / "config.json"));
  CHECK(j["torch_dtype"] == "float32");
  CHECK(j["hidden_size"] == 64);
  CHECK(safetensors_file::open(out / "model.safetensors").info("model.norm.weight").type ==
        dtype::f32);
  CHECK_FALSE(fs::exists(out / "generation_config.json"));

  // The rule for outputs knows every file of the folder: a shard name, a copied tokenizer file.
  const fs::path src = f.source("rule", dtype::f32);
  const fs::path folder = f.dir / "rule-out";
  fs::create_directories(folder);
  const fs::path shard_like = folder / "model-00001-of-00002.safetensors";
  fs::copy_file(f.data, shard_like);
  r = run("train --model " + q(src) + " --data " + q(shard_like) +
          " --optimizer sgd --steps 1 --quiet --save-model " + q(folder));
  CHECK(r.code == 2);
  CHECK(r.err.find("would overwrite the input") != std::string::npos);
  r = run("train --model " + q(src) + " --data " + q(f.data) +
          " --optimizer sgd --steps 1 --quiet --log " + q(folder / "tokenizer.json") +
          " --save-model " + q(folder));
  CHECK(r.code == 2);
  CHECK(r.err.find("is also written by another option") != std::string::npos);
  r = run("train --model " + q(src) + " --data " + q(f.data) +
          " --optimizer lora --steps 1 --quiet --merge-out " + q(folder) + " --save-state " +
          q(folder / "model-00002-of-00002.safetensors"));
  CHECK(r.code == 2);
  CHECK(r.err.find("also written by another option") != std::string::npos);
  CHECK_FALSE(fs::exists(folder / "config.json"));
}
