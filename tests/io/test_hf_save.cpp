// Tests of nn/hf_save.hpp (save_hf_model): a model folder that loads as it is. The weights come
// back in the source checkpoint's dtype of each tensor (BF16 values equal to the rounding of the
// values in memory, F32 bit for bit), config.json keeps every field of the source with its value
// and in its order (torch_dtype / dtype set to the weights'), the generation and tokenizer files
// are copied byte for byte and the source is left as it was; above the shard limit the weights
// are shards with an index in transformers' layout, read back identically by load_hf_weights.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hf_testing.hpp"
#include "io_testing.hpp"
#include "tightfit/io/detail/half.hpp"
#include "tightfit/nn/hf_model.hpp"
#include "tightfit/nn/hf_save.hpp"

using namespace tightfit;
namespace fs = std::filesystem;
using nlohmann::ordered_json;
using tightfit::testing::contains;
using tightfit::testing::error_of;
using tightfit::testing::host_params;
using tightfit::testing::model_params;
using tightfit::testing::same_values;
using tightfit::testing::scratch_dir;
using tightfit::testing::tiny;

namespace {

std::string bytes_of(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary);
  out << bytes;
}

/// Every file of a folder with its bytes.
std::map<std::string, std::string> folder_bytes(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    out[e.path().filename().string()] = bytes_of(e.path());
  return out;
}

ordered_json read_ordered(const fs::path& p) {
  return ordered_json::parse(bytes_of(p));
}

/// The keys of a JSON object, in their order.
std::vector<std::string> keys_of(const ordered_json& j) {
  std::vector<std::string> keys;
  for (auto it = j.begin(); it != j.end(); ++it) keys.push_back(it.key());
  return keys;
}

/// A Qwen3 config.json as a real checkpoint has it (fields tightfit does not model, keys not
/// sorted), with the sizes of tiny().
const char* const source_config = R"({
  "architectures": ["Qwen3ForCausalLM"],
  "model_type": "qwen3",
  "vocab_size": 11,
  "hidden_size": 8,
  "intermediate_size": 12,
  "num_hidden_layers": 2,
  "num_attention_heads": 2,
  "num_key_value_heads": 1,
  "head_dim": 6,
  "bos_token_id": 151643,
  "eos_token_id": [151645, 151643],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "hidden_act": "silu",
  "initializer_range": 0.02,
  "max_position_embeddings": 40960,
  "max_window_layers": 28,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "sliding_window": null,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0",
  "use_cache": true,
  "use_sliding_window": false,
  "custom_field": {"nested": [1, 2.5, "x"], "unicode": "caf\u00e9"}
})";

/// The dtype the source checkpoint stores each tensor in: norms F32, embedding F16, the rest
/// BF16 (mixed, as some checkpoints are).
dtype source_dtype(const std::string& name) {
  if (name.find("norm") != std::string::npos) return dtype::f32;
  if (name == "model.embed_tokens.weight") return dtype::f16;
  return dtype::bf16;
}

/// A source checkpoint folder: config.json (`config`), model.safetensors of `p` in
/// source_dtype(), and side files.
void write_source(const fs::path& dir, host_params<double>& p, const std::string& config) {
  fs::create_directories(dir);
  write_bytes(dir / "config.json", config);
  safetensors_writer w;
  for (std::size_t i = 0; i < p.size(); ++i) {
    const auto s = p.shape(i);
    w.add(p.name(i), {s.begin(), s.end()}, std::span<const double>(p.value(i)),
          source_dtype(p.name(i)));
  }
  w.set_metadata("format", "pt");
  w.write(dir / "model.safetensors");
  write_bytes(dir / "generation_config.json",
              "{\n  \"bos_token_id\": 151643,\n  \"do_sample\": true,\n  \"temperature\": 0.6\n}");
  write_bytes(dir / "tokenizer.json", R"({"version": "1.0", "model": {"type": "BPE"}})");
  write_bytes(dir / "tokenizer_config.json", R"({"chat_template": "{{ messages }}"})");
  write_bytes(dir / "tokenizer.model", std::string("\x00\x01\xff\xfe sentencepiece", 17));
  write_bytes(dir / "chat_template.jinja", "{% for m in messages %}{{ m }}{% endfor %}\n");
  write_bytes(dir / "README.md", "not a model file");
}

/// "Training": every value moved a little, so that nothing saved is the source's by chance.
template <class T>
void perturb(host_params<T>& p) {
  for (std::size_t i = 0; i < p.size(); ++i)
    for (std::size_t k = 0; k < p.value(i).size(); ++k)
      p.value(i)[k] += static_cast<T>(1e-3 * static_cast<double>(k % 7 + 1));
}

/// The value stored for x in dtype t (what a conversion to t and back gives).
double stored(double x, dtype t) {
  switch (t) {
    case dtype::bf16:
      return io::detail::bf16_to_float(io::detail::double_to_bf16(x));
    case dtype::f16:
      return io::detail::f16_to_float(io::detail::double_to_f16(x));
    case dtype::f32:
      return static_cast<float>(x);
    default:
      return x;
  }
}

/// The tensor data bytes of a safetensors file (its length less the header).
std::uint64_t data_bytes(const fs::path& file) {
  const auto st = safetensors_file::open(file);
  std::uint64_t n = 0;
  for (const auto& t : st.tensors()) n += t.end - t.begin;
  return n;
}

}  // namespace

TEST_CASE("save_hf_model: the source's dtypes, config.json field for field, side files copied") {
  scratch_dir dir;
  const model_config c = tiny();
  auto original = model_params<double>(c, 40);
  const fs::path src = dir / "source", out = dir / "out";
  write_source(src, original, source_config);
  const auto source_before = folder_bytes(src);

  host_params<float> trained = model_params<float>(c, 41);
  load_hf_weights(src, trained);
  perturb(trained);
  hf_save_options o;
  o.source = src;
  save_hf_model(out, trained, c, o);

  // Weights: each tensor in the source's dtype, holding the rounding of the value in memory.
  const auto st = safetensors_file::open(out / "model.safetensors");
  CHECK(st.size() == trained.size());
  CHECK(st.metadata().at("format") == "pt");
  CHECK_FALSE(fs::exists(out / "model.safetensors.index.json"));
  int narrowed = 0;
  for (std::size_t i = 0; i < trained.size(); ++i) {
    const std::string& name = trained.name(i);
    CAPTURE(name);
    const dtype want = source_dtype(name);
    CHECK(st.info(name).type == want);
    const auto back = st.read<double>(name);
    REQUIRE(back.size() == trained.value(i).size());
    bool exact = true;
    for (std::size_t k = 0; k < back.size(); ++k) {
      const double x = trained.value(i)[k];
      CHECK(back[k] == stored(x, want));
      exact = exact && back[k] == x;
    }
    if (want != dtype::f32) narrowed += exact ? 0 : 1;  // really rounded to BF16 / F16
  }
  CHECK(narrowed > 0);
  // The source dtypes hold nothing finer: loading the saved folder gives those values.
  host_params<double> reloaded = model_params<double>(c, 42);
  load_hf_weights(out, reloaded);
  for (std::size_t i = 0; i < trained.size(); ++i)
    for (std::size_t k = 0; k < trained.value(i).size(); ++k)
      CHECK(reloaded.value(i)[k] == stored(trained.value(i)[k], source_dtype(trained.name(i))));

  // config.json: the source's fields, values and order (torch_dtype bfloat16 names the dtype of
  // most values written).
  const ordered_json before = ordered_json::parse(source_config);
  const ordered_json after = read_ordered(out / "config.json");
  CHECK(after == before);
  CHECK(keys_of(after) == keys_of(before));
  CHECK(after["eos_token_id"] == ordered_json::array({151645, 151643}));
  CHECK(after["custom_field"]["unicode"] == "caf\u00e9");
  CHECK(load_hf_config(out).hidden_size == c.hidden_size);

  // Side files: copied byte for byte; other files of the source are not.
  for (const char* name : {"generation_config.json", "tokenizer.json", "tokenizer_config.json",
                           "tokenizer.model", "chat_template.jinja"}) {
    CAPTURE(name);
    REQUIRE(fs::exists(out / name));
    CHECK(bytes_of(out / name) == bytes_of(src / name));
  }
  for (const char* name : {"README.md", "vocab.json", "merges.txt", "special_tokens_map.json"})
    CHECK_FALSE(fs::exists(out / name));
  // hf_model_files names what was written (and the possible shards).
  const auto names = hf_model_files(src);
  for (const auto& e : fs::directory_iterator(out))
    CHECK(std::find(names.begin(), names.end(), e.path().filename().string()) != names.end());
  CHECK(std::find(names.begin(), names.end(), "model-*-of-*.safetensors") != names.end());

  // The source is as it was.
  CHECK(folder_bytes(src) == source_before);

  // Saved again over the output: the same files (the side files overwritten, not refused).
  const auto first = folder_bytes(out);
  save_hf_model(out, trained, c, o);
  CHECK(folder_bytes(out) == first);
}

TEST_CASE("save_hf_model: torch_dtype and dtype follow the weights written") {
  scratch_dir dir;
  const model_config c = tiny();
  auto original = model_params<double>(c, 50);
  auto trained = model_params<float>(c, 51);
  const fs::path src = dir / "source";

  SUBCASE("a source torch_dtype that names no dtype written is set to the main one") {
    ordered_json j = ordered_json::parse(source_config);
    j["torch_dtype"] = "float64";  // the weights are mostly BF16, none F64
    write_source(src, original, j.dump(2));
    hf_save_options o;
    o.source = src;
    save_hf_model(dir / "out", trained, c, o);
    ordered_json after = read_ordered(dir / "out" / "config.json");
    CHECK(after["torch_dtype"] == "bfloat16");
    after["torch_dtype"] = "float64";
    CHECK(after == j);  // nothing else changed
    CHECK(keys_of(after) == keys_of(j));
  }
  SUBCASE("a source torch_dtype that names a dtype written is kept (mixed dtypes)") {
    ordered_json j = ordered_json::parse(source_config);
    j["torch_dtype"] = "float32";  // the norms are F32
    write_source(src, original, j.dump(2));
    hf_save_options o;
    o.source = src;
    save_hf_model(dir / "out", trained, c, o);
    CHECK(read_ordered(dir / "out" / "config.json") == j);
  }
  SUBCASE("transformers 5's dtype is set, no torch_dtype added beside it") {
    ordered_json j = ordered_json::parse(source_config);
    j.erase("torch_dtype");
    j["dtype"] = "float16";
    write_source(src, original, j.dump());
    hf_save_options o;
    o.source = src;
    o.as = dtype::f32;  // one dtype for every tensor
    save_hf_model(dir / "out", trained, c, o);
    const ordered_json after = read_ordered(dir / "out" / "config.json");
    CHECK(after["dtype"] == "float32");
    CHECK_FALSE(after.contains("torch_dtype"));
    const auto st = safetensors_file::open(dir / "out" / "model.safetensors");
    for (const auto& t : st.tensors()) CHECK(t.type == dtype::f32);
    auto back = model_params<float>(c, 52);
    load_hf_weights(dir / "out", back);
    CHECK(same_values(back, trained));  // F32 of a float set: bit for bit
  }
  SUBCASE("a source without torch_dtype gets one") {
    ordered_json j = ordered_json::parse(source_config);
    j.erase("torch_dtype");
    write_source(src, original, j.dump());
    hf_save_options o;
    o.source = src;
    save_hf_model(dir / "out", trained, c, o);
    const ordered_json after = read_ordered(dir / "out" / "config.json");
    CHECK(after["torch_dtype"] == "bfloat16");
    CHECK(keys_of(after).back() == "torch_dtype");
  }
  SUBCASE("no source (a preset): hf_config_json of the configuration, with torch_dtype") {
    save_hf_model(dir / "out", trained, c);
    ordered_json after = read_ordered(dir / "out" / "config.json");
    CHECK(after["torch_dtype"] == "float32");
    after.erase("torch_dtype");
    CHECK(nlohmann::json::parse(after.dump()) == hf_config_json(c));
    const auto st = safetensors_file::open(dir / "out" / "model.safetensors");
    for (const auto& t : st.tensors()) CHECK(t.type == dtype::f32);
    auto back = model_params<float>(c, 53);
    load_hf_weights(dir / "out", back);
    CHECK(same_values(back, trained));
    CHECK_FALSE(fs::exists(dir / "out" / "generation_config.json"));
  }
}

TEST_CASE("save_hf_model: shards and model.safetensors.index.json above the size limit") {
  scratch_dir dir;
  const model_config c = tiny();
  auto trained = model_params<float>(c, 60);
  const fs::path out = dir / "out";
  // F32: the embedding (11 x 8) is 352 bytes, q_proj (12 x 8) 384, a norm 32.
  for (const std::uint64_t limit : {std::uint64_t{1024}, std::uint64_t{300}}) {
    CAPTURE(limit);
    hf_save_options o;
    o.max_shard_bytes = limit;
    save_hf_model(out, trained, c, o);
    CHECK_FALSE(fs::exists(out / "model.safetensors"));
    const auto index = nlohmann::json::parse(bytes_of(out / "model.safetensors.index.json"));
    REQUIRE(index.contains("weight_map"));
    const auto& map = index["weight_map"];
    CHECK(map.size() == trained.size());
    std::uint64_t total = 0;
    std::size_t shards = 0;
    for (std::size_t i = 0; i < trained.size(); ++i) {
      total += 4 * trained.value(i).size();
      REQUIRE(map.contains(trained.name(i)));
    }
    CHECK(index["metadata"]["total_size"] == total);
    // In parameter order, shard after shard; a tensor above the limit gets a shard of its own
    // when it comes (huggingface_hub's split_state_dict_into_shards), before the shard being
    // filled.
    const bool all_fit = limit == 1024;
    std::string previous;
    std::set<std::string> files;
    for (std::size_t i = 0; i < trained.size(); ++i) {
      const std::string file = map[trained.name(i)];
      if (4 * trained.value(i).size() > limit) {
        CHECK_FALSE(files.contains(file));
      } else {
        CHECK(file >= previous);
        previous = file;
      }
      files.insert(file);
    }
    shards = files.size();
    CHECK(shards > 2);
    std::uint64_t on_disk = 0;
    for (std::size_t s = 0; s < shards; ++s) {
      char name[64];
      std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", s + 1, shards);
      CAPTURE(name);
      REQUIRE(files.contains(name));
      const std::uint64_t bytes = data_bytes(out / name);
      on_disk += bytes;
      const auto st = safetensors_file::open(out / name);
      CHECK(st.metadata().at("format") == "pt");
      CHECK((bytes <= limit || st.size() == 1));  // a tensor above the limit: a shard of its own
      for (const auto& t : st.tensors()) CHECK(map[t.name] == name);
      // greedy: the next shard's first tensor did not fit in this one
      if (all_fit && s + 1 < shards) {
        std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", s + 2, shards);
        const auto next = safetensors_file::open(out / name);
        std::uint64_t first_next = 0;
        for (std::size_t i = 0; i < trained.size(); ++i)
          if (map[trained.name(i)] == name) {
            first_next = 4 * trained.value(i).size();
            break;
          }
        CHECK(bytes + first_next > limit);
      }
    }
    CHECK(on_disk == total);
    auto back = model_params<float>(c, 61);
    load_hf_weights(out, back);
    CHECK(same_values(back, trained));
  }
  // A save below the limit over a sharded one: model.safetensors alone, the shards and the
  // index of the earlier save removed (else a loader could read the old weights).
  write_bytes(out / "notes.txt", "mine");
  save_hf_model(out, trained, c);
  std::set<std::string> left;
  for (const auto& e : fs::directory_iterator(out)) left.insert(e.path().filename().string());
  CHECK(left == std::set<std::string>{"model.safetensors", "config.json", "notes.txt"});
  auto back = model_params<float>(c, 62);
  load_hf_weights(out, back);
  CHECK(same_values(back, trained));
  // And sharded again over it: model.safetensors removed.
  hf_save_options o;
  o.max_shard_bytes = 1024;
  save_hf_model(out, trained, c, o);
  CHECK_FALSE(fs::exists(out / "model.safetensors"));
  CHECK(fs::exists(out / "model.safetensors.index.json"));
  CHECK(fs::exists(out / "notes.txt"));
}

TEST_CASE("save_hf_model: the source is never written; a model not from it is refused by name") {
  scratch_dir dir;
  const model_config c = tiny();
  auto original = model_params<double>(c, 70);
  const fs::path src = dir / "source";
  write_source(src, original, source_config);
  const auto before = folder_bytes(src);
  auto trained = model_params<float>(c, 71);
  hf_save_options o;
  o.source = src;
  CHECK(contains(error_of([&] { save_hf_model(src, trained, c, o); }), "is the source"));
  CHECK(contains(error_of([&] { save_hf_model(dir / "source" / ".", trained, c, o); }),
                 "is the source"));
  CHECK(folder_bytes(src) == before);

  // Another model than the source's: a missing tensor, a shape that differs.
  const model_config tied = tiny("Qwen3ForCausalLM", true);
  auto other = model_params<float>(tied, 72);
  other.add("model.extra.weight", {2});
  CHECK(contains(error_of([&] { save_hf_model(dir / "a", other, tied, o); }),
                 "has no tensor 'model.extra.weight'"));
  model_config wider = c;
  wider.intermediate_size = 16;
  auto wide = model_params<float>(wider, 73);
  CHECK(contains(error_of([&] { save_hf_model(dir / "b", wide, wider, o); }),
                 "tensor 'model.layers.0.mlp.gate_proj.weight' has shape [12, 8], the model's is "
                 "[16, 8]"));
  CHECK_FALSE(fs::exists(dir / "b" / "model.safetensors"));

  hf_save_options bad;
  bad.max_shard_bytes = 0;
  CHECK(contains(error_of([&] { save_hf_model(dir / "c", trained, c, bad); }),
                 "max_shard_bytes is 0"));
  bad = {};
  bad.as = dtype::i32;
  CHECK(contains(error_of([&] { save_hf_model(dir / "c", trained, c, bad); }),
                 "dtype I32 is not F64, F32, BF16 or F16"));
  bad = {};
  bad.source = dir / "missing";
  CHECK(contains(error_of([&] { save_hf_model(dir / "c", trained, c, bad); }),
                 "is not a checkpoint folder"));
}

TEST_CASE("is_hf_shard_name: model-NNNNN-of-NNNNN.safetensors, five or more digits each") {
  for (const char* ok : {"model-00001-of-00002.safetensors", "model-123456-of-123456.safetensors"})
    CHECK(io::detail::is_hf_shard_name(ok));
  for (const char* bad : {"model-0001-of-00002.safetensors", "model-00001-of-00002.safetensor",
                          "model-00001-of-00002.safetensors.tmp",
                          "xmodel-00001-of-00002.safetensors", "model-00001-00002.safetensors",
                          "model.safetensors", "model-abcde-of-00002.safetensors", ""})
    CHECK_FALSE(io::detail::is_hf_shard_name(bad));
}
