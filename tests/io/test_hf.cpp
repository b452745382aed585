// Tests of io/hf.hpp and nn/hf_model.hpp: config.json of Llama / Qwen2 / Qwen3 (samples modelled on
// real checkpoints: TinyLlama-1.1B, Qwen2.5-0.5B, Qwen3-0.6B) and the refusals; weights and
// gradients by Hugging Face names, single-file and sharded, tied embeddings, dtype conversion.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "hf_testing.hpp"
#include "io_testing.hpp"
#include "support/testing.hpp"
#include "tightfit/nn/hf_model.hpp"

using namespace tightfit;
using nlohmann::json;
using tightfit::testing::contains;
using tightfit::testing::error_of;
using tightfit::testing::host_params;
using tightfit::testing::model_params;
using tightfit::testing::same_values;
using tightfit::testing::scratch_dir;
using tightfit::testing::tiny;

namespace {

const char* const tinyllama = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "bos_token_id": 1,
  "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
  "intermediate_size": 5632, "max_position_embeddings": 2048, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 22, "num_key_value_heads": 4,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": null, "rope_theta": 10000.0,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.35.0",
  "use_cache": true, "vocab_size": 32000})";

const char* const qwen25 = R"({
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
  "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 24,
  "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24,
  "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
  "sliding_window": 32768, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.40.1", "use_cache": true, "use_sliding_window": false,
  "vocab_size": 151936})";

const char* const qwen3 = R"({
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
  "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
  "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
  "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
  "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
  "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})";

void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
}

/// The error (or "<no error>") of loading `j` as config.json.
std::string config_error(const scratch_dir& dir, const json& j) {
  write_text(dir / "config.json", j.dump());
  return error_of([&] { (void)load_hf_config(dir.path()); });
}

}  // namespace

TEST_CASE("config.json of Llama, Qwen2 and Qwen3 (modelled on real checkpoints)") {
  scratch_dir dir;
  write_text(dir / "config.json", tinyllama);
  const model_config l = load_hf_config(dir.path());  // a directory
  CHECK(l.architecture == "LlamaForCausalLM");
  CHECK(l.vocab_size == 32000);
  CHECK(l.hidden_size == 2048);
  CHECK(l.intermediate_size == 5632);
  CHECK(l.num_hidden_layers == 22);
  CHECK(l.num_attention_heads == 32);
  CHECK(l.num_key_value_heads == 4);
  CHECK(l.head_dim == 64);
  CHECK(l.rms_norm_eps == 1e-5);
  CHECK(l.rope_theta == 10000.0);
  CHECK_FALSE(l.tie_word_embeddings);
  CHECK_FALSE(l.qk_norm);
  CHECK_FALSE(l.qkv_bias);
  CHECK_FALSE(l.o_bias);

  write_text(dir / "qwen2.json", qwen25);
  const model_config q2 = load_hf_config(dir / "qwen2.json");  // a file
  CHECK(q2.architecture == "Qwen2ForCausalLM");
  CHECK(q2.head_dim == 64);
  CHECK(q2.num_key_value_heads == 2);
  CHECK(q2.rope_theta == 1e6);
  CHECK(q2.tie_word_embeddings);
  CHECK_FALSE(q2.qk_norm);
  CHECK(q2.qkv_bias);  // Qwen2's q/k/v biases are unconditional
  CHECK_FALSE(q2.o_bias);

  write_text(dir / "qwen3.json", qwen3);
  const model_config q3 = load_hf_config(dir / "qwen3.json");
  CHECK(q3.architecture == "Qwen3ForCausalLM");
  CHECK(q3.head_dim == 128);  // not hidden / heads (64)
  CHECK(q3.q_width() == 2048);
  CHECK(q3.rms_norm_eps == 1e-6);
  CHECK(q3.tie_word_embeddings);
  CHECK(q3.qk_norm);
  CHECK_FALSE(q3.qkv_bias);
  CHECK_FALSE(q3.o_bias);
}

TEST_CASE("config.json: attention biases as transformers creates them") {
  scratch_dir dir;
  const json llama = json::parse(tinyllama), q2 = json::parse(qwen25), q3 = json::parse(qwen3);
  auto biases = [&](json j, const json& attention_bias) {
    j["attention_bias"] = attention_bias;
    write_text(dir / "config.json", j.dump());
    const model_config c = load_hf_config(dir.path());
    return std::pair{c.qkv_bias, c.o_bias};
  };
  // Llama and Qwen3: attention_bias puts biases on q, k, v and o_proj.
  CHECK(biases(llama, true) == std::pair{true, true});
  CHECK(biases(llama, false) == std::pair{false, false});
  CHECK(biases(q3, true) == std::pair{true, true});
  // Qwen2: q/k/v always, o_proj never, whatever attention_bias says (transformers ignores it).
  CHECK(biases(q2, true) == std::pair{true, false});
  CHECK(biases(q2, false) == std::pair{true, false});
}

TEST_CASE("config.json defaults and model_type without architectures") {
  scratch_dir dir;
  const json j = {
      {"model_type", "llama"},         {"vocab_size", 100},      {"hidden_size", 48},
      {"intermediate_size", 96},       {"num_hidden_layers", 2}, {"num_attention_heads", 6},
      {"num_key_value_heads", nullptr}};
  CHECK(config_error(dir, j) == "<no error>");
  const model_config c = load_hf_config(dir / "config.json");
  CHECK(c.architecture == "LlamaForCausalLM");
  CHECK(c.num_key_value_heads == 6);  // default: num_attention_heads
  CHECK(c.head_dim == 8);             // default: hidden / heads
  CHECK(c.rope_theta == 10000.0);
  CHECK(c.rms_norm_eps == 1e-6);
  CHECK_FALSE(c.tie_word_embeddings);
  json q = j;
  q["model_type"] = "qwen3";
  q["rope_scaling"] = {{"rope_type", "default"}};  // the default rope is accepted
  q["layer_types"] = {"full_attention", "full_attention"};
  CHECK(config_error(dir, q) == "<no error>");
  CHECK(load_hf_config(dir.path()).qk_norm);
  json v5 = j;  // transformers 5 keeps rope_theta in rope_parameters
  v5["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 5e5}};
  CHECK(config_error(dir, v5) == "<no error>");
  CHECK(load_hf_config(dir.path()).rope_theta == 5e5);
}

TEST_CASE("config.json: rope scaling, sliding windows and mlp_bias") {
  scratch_dir dir;
  json llama31 = json::parse(tinyllama);
  llama31["max_position_embeddings"] = 131072;
  llama31["rope_scaling"] = {{"factor", 8.0},
                             {"low_freq_factor", 1.0},
                             {"high_freq_factor", 4.0},
                             {"original_max_position_embeddings", 8192},
                             {"rope_type", "llama3"}};
  llama31["mlp_bias"] = true;
  CHECK(config_error(dir, llama31) == "<no error>");
  const model_config l = load_hf_config(dir.path());
  CHECK(l.rope_scaling.rope_type == "llama3");
  CHECK(l.rope_scaling.factor == 8.0);
  CHECK(l.rope_scaling.original_max_position_embeddings == 8192);
  CHECK(l.max_position_embeddings == 131072);
  CHECK(l.mlp_bias);
  CHECK(l.layer_window(0) == 0);
  json mistral = json::parse(tinyllama);
  mistral["architectures"] = json::array({"MistralForCausalLM"});
  mistral["model_type"] = "mistral";
  mistral["sliding_window"] = 4096;
  mistral["rope_scaling"] = {{"type", "yarn"}, {"factor", 2.0}, {"beta_fast", 16}};
  CHECK(config_error(dir, mistral) == "<no error>");
  const model_config m = load_hf_config(dir.path());
  CHECK(m.sliding_window == 4096);
  CHECK(m.layer_window(0) == 4096);
  CHECK(m.rope_scaling.rope_type == "yarn");
  CHECK(m.rope_scaling.beta_fast == 16);
  json q2 = json::parse(qwen25);  // 24 layers, sliding_window 32768
  q2["use_sliding_window"] = true;
  q2["max_window_layers"] = 20;
  CHECK(config_error(dir, q2) == "<no error>");
  const model_config q = load_hf_config(dir.path());
  CHECK(q.layer_window(19) == 0);
  CHECK(q.layer_window(20) == 32768);
  q2["use_sliding_window"] = false;  // the window is off whatever max_window_layers says
  CHECK(config_error(dir, q2) == "<no error>");
  CHECK(load_hf_config(dir.path()).layer_window(23) == 0);
  json q3 = json::parse(qwen3);
  q3["use_sliding_window"] = true;
  q3["sliding_window"] = 64;
  std::vector<std::string> types(static_cast<std::size_t>(q3["num_hidden_layers"].get<int>()),
                                 "full_attention");
  types[1] = "sliding_attention";
  q3["layer_types"] = types;
  CHECK(config_error(dir, q3) == "<no error>");
  const model_config q3c = load_hf_config(dir.path());
  CHECK(q3c.layer_window(0) == 0);
  CHECK(q3c.layer_window(1) == 64);
  // save_hf_config writes them back: every field survives the round trip
  for (const model_config& c : {l, m, q, q3c}) {
    CAPTURE(c.architecture);
    scratch_dir out;
    save_hf_config(c, out.path());
    const model_config r = load_hf_config(out.path());
    CHECK(r.rope_scaling.rope_type == c.rope_scaling.rope_type);
    CHECK(r.rope_scaling.factor == c.rope_scaling.factor);
    CHECK(r.rope_scaling.original_max_position_embeddings ==
          c.rope_scaling.original_max_position_embeddings);
    CHECK(r.rope_scaling.low_freq_factor == c.rope_scaling.low_freq_factor);
    CHECK(r.rope_scaling.high_freq_factor == c.rope_scaling.high_freq_factor);
    CHECK(r.rope_scaling.beta_fast == c.rope_scaling.beta_fast);
    CHECK(r.max_position_embeddings == c.max_position_embeddings);
    CHECK(r.mlp_bias == c.mlp_bias);
    for (index_t layer = 0; layer < c.num_hidden_layers; ++layer)
      CHECK(r.layer_window(layer) == c.layer_window(layer));
  }
}

TEST_CASE("config.json of Gemma 2, Gemma 3 and the text part of Gemma 3 multimodal") {
  scratch_dir dir;
  // modelled on google/gemma-2-2b and google/gemma-3-1b-pt (fewer layers)
  const json gemma2 = json::parse(R"({
    "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "attention_bias": false,
    "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0, "head_dim": 256,
    "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 2304, "intermediate_size": 9216, "max_position_embeddings": 8192,
    "num_attention_heads": 8, "num_hidden_layers": 4, "num_key_value_heads": 4,
    "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
    "sliding_window": 4096, "vocab_size": 256000})");
  CHECK(config_error(dir, gemma2) == "<no error>");
  const model_config g2 = load_hf_config(dir.path());
  CHECK(g2.is_gemma());
  CHECK_FALSE(g2.qk_norm);
  CHECK(g2.tie_word_embeddings);  // Gemma's default
  CHECK(g2.attn_logit_softcapping == 50.0);
  CHECK(g2.final_logit_softcapping == 30.0);
  CHECK(g2.query_pre_attn_scalar == 256.0);
  CHECK(g2.rope_local_base_freq == 0.0);
  CHECK(g2.layer_window(0) == 4096);  // even layers slide
  CHECK(g2.layer_window(1) == 0);
  CHECK(g2.layer_window(2) == 4096);
  json g2_null = gemma2;
  g2_null["attn_logit_softcapping"] = nullptr;
  g2_null.erase("final_logit_softcapping");  // missing: transformers' default 30
  CHECK(config_error(dir, g2_null) == "<no error>");
  CHECK(load_hf_config(dir.path()).attn_logit_softcapping == 0.0);
  CHECK(load_hf_config(dir.path()).final_logit_softcapping == 30.0);

  const json gemma3 = json::parse(R"({
    "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "attention_bias": false,
    "attn_logit_softcapping": null, "final_logit_softcapping": null, "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152, "intermediate_size": 6912,
    "max_position_embeddings": 32768, "num_attention_heads": 4, "num_hidden_layers": 7,
    "num_key_value_heads": 1, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06,
    "rope_local_base_freq": 10000, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
    "rope_theta": 1000000, "sliding_window": 512, "sliding_window_pattern": 6,
    "vocab_size": 262144})");
  CHECK(config_error(dir, gemma3) == "<no error>");
  const model_config g3 = load_hf_config(dir.path());
  CHECK(g3.architecture == "Gemma3ForCausalLM");
  CHECK(g3.qk_norm);
  CHECK(g3.attn_logit_softcapping == 0.0);
  CHECK(g3.final_logit_softcapping == 0.0);
  CHECK(g3.rope_local_base_freq == 10000.0);
  CHECK(g3.rope_scaling.rope_type == "linear");
  for (index_t l = 0; l < 7; ++l) CHECK(g3.layer_window(l) == (l == 5 ? 0 : 512));
  // layer_types wins over the pattern
  json g3_types = gemma3;
  g3_types["layer_types"] =
      json::array({"full_attention", "sliding_attention", "full_attention", "full_attention",
                   "full_attention", "full_attention", "sliding_attention"});
  CHECK(config_error(dir, g3_types) == "<no error>");
  CHECK(load_hf_config(dir.path()).layer_window(0) == 0);
  CHECK(load_hf_config(dir.path()).layer_window(1) == 512);
  // Gemma3ForConditionalGeneration: its text_config
  json multi = {{"architectures", json::array({"Gemma3ForConditionalGeneration"})},
                {"model_type", "gemma3"},
                {"text_config", gemma3},
                {"vision_config", {{"model_type", "siglip_vision_model"}}}};
  multi["text_config"].erase("architectures");
  CHECK(config_error(dir, multi) == "<no error>");
  CHECK(load_hf_config(dir.path()).hidden_size == 1152);
  multi.erase("text_config");
  CHECK(contains(config_error(dir, multi), "text_config"));
  // refused by name
  json bad = gemma3;
  bad["hidden_activation"] = "gelu";
  CHECK(contains(config_error(dir, bad), "hidden_activation \"gelu\" is not supported"));
  bad = gemma3;
  bad["attention_bias"] = true;
  CHECK(contains(config_error(dir, bad), "attention_bias"));
  bad = gemma3;
  bad["use_bidirectional_attention"] = true;
  CHECK(contains(config_error(dir, bad), "use_bidirectional_attention"));
  bad = gemma2;
  bad["model_type"] = "gemma3_text";
  CHECK(contains(config_error(dir, bad), "does not match architecture"));
  // save_hf_config round trip
  for (const model_config& c : {g2, g3}) {
    save_hf_config(c, dir.path());
    const model_config r = load_hf_config(dir.path());
    CHECK(r.architecture == c.architecture);
    CHECK(r.attn_logit_softcapping == c.attn_logit_softcapping);
    CHECK(r.final_logit_softcapping == c.final_logit_softcapping);
    CHECK(r.query_pre_attn_scalar == c.query_pre_attn_scalar);
    CHECK(r.rope_local_base_freq == c.rope_local_base_freq);
    CHECK(r.sliding_layers == c.sliding_layers);
    CHECK(r.sliding_window == c.sliding_window);
    CHECK(r.qk_norm == c.qk_norm);
  }
  // the Gemma-only fields on a Llama config are refused by name
  model_config llama = load_hf_config(dir.path());
  llama.architecture = "LlamaForCausalLM";
  llama.qk_norm = false;
  CHECK(contains(error_of([&] { llama.validate(); }), "query_pre_attn_scalar is set"));
}

TEST_CASE("config.json: unsupported options and malformed input are refused by name") {
  scratch_dir dir;
  const json llama = json::parse(tinyllama), q2 = json::parse(qwen25), q3 = json::parse(qwen3);
  auto patched = [](json j, const std::string& key, const json& value) {
    if (value.is_discarded())
      j.erase(key);
    else
      j[key] = value;
    return j;
  };
  const json erase = json(json::value_t::discarded);
  json chunked = json::array();  // Qwen3 here has 28 layers
  for (int l = 0; l < 28; ++l) chunked.push_back(l == 3 ? "chunked_attention" : "full_attention");
  struct refusal {
    json config;
    std::string message;
  };
  const std::vector<refusal> cases = {
      {patched(llama, "architectures", json::array({"GemmaForCausalLM"})),
       "architecture \"GemmaForCausalLM\" is not supported"},
      {patched(patched(llama, "architectures", erase), "model_type", "gemma"),
       "model_type \"gemma\" is not supported"},
      {patched(patched(llama, "architectures", erase), "model_type", erase),
       "neither \"architectures\" nor \"model_type\""},
      {patched(llama, "model_type", "qwen3"), "model_type \"qwen3\" does not match"},
      {patched(patched(llama, "architectures", erase), "model_type", 61),  // found by fuzz_config
       "field \"model_type\" is 61"},
      {patched(llama, "rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}}),
       "rope_scaling of type \"llama3\" needs \"low_freq_factor\""},
      {patched(llama, "rope_scaling", {{"type", "longrope"}, {"factor", 2.0}}),
       "rope_scaling of type \"longrope\" is not supported"},
      {patched(llama, "rope_scaling", {{"type", "linear"}, {"factor", 2.0}, {"beta_fast", 3}}),
       "rope_scaling key \"beta_fast\" is not supported for rope_type \"linear\""},
      {patched(llama, "rope_scaling", {{"type", "linear"}}),
       "rope_scaling of type \"linear\" needs \"factor\""},
      {patched(
           patched(llama, "max_position_embeddings", 4096), "rope_scaling",
           {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 2048}}),
       "yarn factor 4 is not max_position_embeddings 4096 / original_max_position_embeddings 2048"},
      {patched(llama, "partial_rotary_factor", 0.5), "partial_rotary_factor 0.5 is not supported"},
      {patched(patched(q2, "use_sliding_window", true), "sliding_window", erase),
       "use_sliding_window is true but sliding_window"},
      {patched(q3, "layer_types", chunked), "layer_types holds \"chunked_attention\""},
      {patched(q3, "layer_types", json::array({"full_attention"})), "expected a list of"},
      {patched(llama, "attention_bias", 1), "field \"attention_bias\" is 1"},
      {patched(llama, "mlp_bias", 1), "field \"mlp_bias\" is 1"},
      {patched(llama, "hidden_act", "gelu"), "hidden_act \"gelu\" is not supported"},
      {patched(llama, "hidden_size", erase), "missing field \"hidden_size\""},
      {patched(llama, "vocab_size", "32000"), "field \"vocab_size\" is \"32000\""},
      {patched(llama, "num_hidden_layers", -2), "field \"num_hidden_layers\" is -2"},
      {patched(llama, "num_attention_heads", 0), "field \"num_attention_heads\" is 0"},
      {patched(llama, "num_key_value_heads", 5), "not a multiple of num_key_value_heads 5"},
      {patched(llama, "rms_norm_eps", "tiny"), "field \"rms_norm_eps\" is \"tiny\""},
      {patched(llama, "tie_word_embeddings", 1), "field \"tie_word_embeddings\" is 1"},
      {patched(patched(llama, "hidden_size", 100), "num_attention_heads", 3),
       "hidden_size 100 is not a multiple of num_attention_heads 3"},
      {patched(q3, "head_dim", 7), "head_dim is 7, expected an even number"},
      {json::array({1, 2}), "expected an object"},
  };
  for (const auto& c : cases) {
    const std::string message = config_error(dir, c.config);
    CAPTURE(message);
    CHECK(contains(message, c.message));
    CHECK(contains(message, "config.json"));  // names the file
  }

  write_text(dir / "config.json", R"({"vocab_size": 10, "vocab_size": 12})");
  CHECK(contains(error_of([&] { (void)load_hf_config(dir.path()); }),
                 "duplicate key \"vocab_size\""));
  write_text(dir / "config.json", R"({"vocab_size": )");
  CHECK(contains(error_of([&] { (void)load_hf_config(dir.path()); }), "not valid JSON"));
  CHECK(contains(error_of([&] { (void)load_hf_config(dir / "absent"); }), "absent: cannot open"));
}

TEST_CASE("save_hf_config writes a config.json that loads back identically") {
  scratch_dir dir;
  for (const char* arch : {"LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "biased"}) {
    CAPTURE(arch);
    const bool biased = std::string(arch) == "biased";  // Llama with attention_bias: true
    model_config c =
        tiny(biased ? "LlamaForCausalLM" : arch, std::string(arch) == "Qwen2ForCausalLM");
    if (biased) c.qkv_bias = c.o_bias = true;
    c.rms_norm_eps = 1.0 / 3.0 * 1e-5;  // not a short decimal: must survive the round trip
    c.rope_theta = 123456.789;
    save_hf_config(c, dir.path());
    const model_config r = load_hf_config(dir.path());
    CHECK(r.architecture == c.architecture);
    CHECK(r.vocab_size == c.vocab_size);
    CHECK(r.hidden_size == c.hidden_size);
    CHECK(r.intermediate_size == c.intermediate_size);
    CHECK(r.num_hidden_layers == c.num_hidden_layers);
    CHECK(r.num_attention_heads == c.num_attention_heads);
    CHECK(r.num_key_value_heads == c.num_key_value_heads);
    CHECK(r.head_dim == c.head_dim);
    CHECK(r.rms_norm_eps == c.rms_norm_eps);
    CHECK(r.rope_theta == c.rope_theta);
    CHECK(r.tie_word_embeddings == c.tie_word_embeddings);
    CHECK(r.qk_norm == c.qk_norm);
    CHECK(r.qkv_bias == c.qkv_bias);
    CHECK(r.o_bias == c.o_bias);
    std::ifstream in(dir / "config.json");
    const json j = json::parse(in);
    CHECK(j["hidden_act"] == "silu");
    const std::map<std::string, std::string> types = {{"LlamaForCausalLM", "llama"},
                                                      {"Qwen2ForCausalLM", "qwen2"},
                                                      {"Qwen3ForCausalLM", "qwen3"}};
    CHECK(j["model_type"] == types.at(c.architecture));
  }
  model_config bad = tiny("Qwen3ForCausalLM");
  bad.qk_norm = false;
  CHECK(contains(error_of([&] { save_hf_config(bad, dir.path()); }), "q_norm / k_norm"));
  bad = tiny("Qwen2ForCausalLM");
  bad.o_bias = true;
  CHECK(contains(error_of([&] { save_hf_config(bad, dir.path()); }), "never an o_proj bias"));
  bad = tiny("LlamaForCausalLM");
  bad.qkv_bias = true;
  CHECK(contains(error_of([&] { save_hf_config(bad, dir.path()); }), "either both"));
  bad = tiny("GPT2LMHeadModel");
  CHECK(contains(error_of([&] { save_hf_config(bad, dir.path()); }), "\"GPT2LMHeadModel\""));
}

TEST_CASE("weights: save and load by Hugging Face names, every dtype") {
  scratch_dir dir;
  const model_config c = tiny();
  auto src = model_params<double>(c, 100);
  save_hf_weights(dir.path(), src);  // F64 by default for double
  CHECK(std::filesystem::exists(dir / "model.safetensors"));
  {
    const auto st = safetensors_file::open(dir / "model.safetensors");
    CHECK(st.size() == src.size());
    CHECK(st.info("model.layers.1.self_attn.q_proj.weight").shape == std::vector<index_t>{12, 8});
    CHECK(st.info("model.layers.0.self_attn.k_norm.weight").type == dtype::f64);
    CHECK(st.metadata().at("format") == "pt");
  }
  auto back = model_params<double>(c, 999);
  CHECK_FALSE(same_values(src, back));
  load_hf_weights(dir.path(), back);
  CHECK(same_values(src, back));

  // F64 file into a float set: each value rounded once.
  auto as_float = model_params<float>(c, 7);
  load_hf_weights(dir / "model.safetensors", as_float);
  for (std::size_t i = 0; i < src.size(); ++i)
    for (std::size_t k = 0; k < src.value(i).size(); ++k)
      CHECK(as_float.value(i)[k] == static_cast<float>(src.value(i)[k]));

  // BF16 / F16 files: within half a unit in the last place of the stored precision.
  for (const auto& [type, bits] : {std::pair{dtype::bf16, 8}, std::pair{dtype::f16, 11}}) {
    save_hf_weights(dir / "narrow.safetensors", src, type);
    CHECK(safetensors_file::open(dir / "narrow.safetensors").info("model.norm.weight").type ==
          type);
    load_hf_weights(dir / "narrow.safetensors", back);
    double worst = 0;
    for (std::size_t i = 0; i < src.size(); ++i)
      for (std::size_t k = 0; k < src.value(i).size(); ++k) {
        const double x = src.value(i)[k];
        const double half_ulp = std::max(std::ldexp(std::fabs(x), -bits), std::ldexp(1.0, -25));
        worst = std::max(worst, std::fabs(back.value(i)[k] - x) / half_ulp);
      }
    CHECK(worst <= 1.0);
    CHECK(worst > 0.0);  // really rounded
  }
}

TEST_CASE("weights: tied embeddings, missing, extra and mismatched tensors") {
  scratch_dir dir;
  const auto untied = model_params<double>(tiny("LlamaForCausalLM", false), 1);
  auto writable = untied;
  save_hf_weights(dir.path(), writable);

  // A tied model has no lm_head.weight: the checkpoint's copy is ignored.
  auto tied = model_params<double>(tiny("LlamaForCausalLM", true), 2);
  CHECK(tied.find("lm_head.weight") < 0);
  load_hf_weights(dir.path(), tied);
  CHECK(std::equal(tied.value(0).begin(), tied.value(0).end(), writable.value(0).begin()));

  // An untied model needs lm_head.weight.
  auto tied_file = model_params<double>(tiny("LlamaForCausalLM", true), 3);
  save_hf_weights(dir / "tied.safetensors", tied_file);
  auto needs_head = model_params<double>(tiny("LlamaForCausalLM", false), 4);
  CHECK(contains(error_of([&] { load_hf_weights(dir / "tied.safetensors", needs_head); }),
                 "parameter 'lm_head.weight' is not in the checkpoint"));

  // A shape that differs names the tensor and both shapes.
  model_config wider = tiny("LlamaForCausalLM");
  wider.intermediate_size = 10;
  auto other = model_params<double>(wider, 5);
  CHECK(contains(error_of([&] { load_hf_weights(dir.path(), other); }),
                 "tensor 'model.layers.0.mlp.gate_proj.weight' has shape [12, 8], the model "
                 "expects [10, 8]"));

  // Extra tensors: an error (config / checkpoint mismatch) unless ignore_unused.
  model_config fewer = tiny("LlamaForCausalLM");
  fewer.num_hidden_layers = 1;
  auto one_layer = model_params<double>(fewer, 6);
  CHECK(contains(error_of([&] { load_hf_weights(dir.path(), one_layer); }),
                 "tensor(s) the model does not have, e.g. 'model.layers.1."));
  load_hf_weights(dir.path(), one_layer, hf_load_options{.ignore_unused = true});
  CHECK(
      std::equal(one_layer.value(1).begin(), one_layer.value(1).end(), writable.value(1).begin()));

  // A bias the config does not call for and non-floating tensors are refused; inv_freq
  // buffers ignored.
  auto with_extra = [&](const std::string& name, bool as_int) {
    safetensors_writer w;
    for (std::size_t i = 0; i < writable.size(); ++i) {
      const auto s = writable.shape(i);
      if (as_int && i == 1) {
        std::vector<std::int64_t> ints(writable.value(i).size(), 1);
        w.add(writable.name(i), {s.begin(), s.end()}, std::span<const std::int64_t>(ints));
      } else {
        w.add(writable.name(i), {s.begin(), s.end()}, std::span<const double>(writable.value(i)));
      }
    }
    const std::vector<float> v(12, 0.5f);
    if (!name.empty()) w.add(name, {12}, std::span<const float>(v));
    w.write(dir / "extra.safetensors");
    auto p = model_params<double>(tiny("LlamaForCausalLM"), 9);
    return error_of([&] { load_hf_weights(dir / "extra.safetensors", p); });
  };
  CHECK(contains(with_extra("model.layers.0.self_attn.q_proj.bias", false),
                 "tensor 'model.layers.0.self_attn.q_proj.bias' is a bias"));
  CHECK(with_extra("model.layers.0.self_attn.rotary_emb.inv_freq", false) == "<no error>");
  CHECK(contains(with_extra("", true),
                 "tensor 'model.layers.0.input_layernorm.weight' has dtype I64, expected F64"));

  scratch_dir empty;
  auto p = model_params<double>(tiny(), 1);
  CHECK(contains(error_of([&] { load_hf_weights(empty.path(), p); }),
                 "no model.safetensors or model.safetensors.index.json"));
}

TEST_CASE("weights: a checkpoint sharded with model.safetensors.index.json") {
  scratch_dir dir;
  const model_config c = tiny("Qwen3ForCausalLM", true);
  auto src = model_params<double>(c, 20);
  // Shard 1: embeddings and layer 0; shard 2: the rest, in BF16 and F32 (mixed dtypes).
  safetensors_writer a, b;
  json weight_map = json::object();
  for (std::size_t i = 0; i < src.size(); ++i) {
    const auto s = src.shape(i);
    const bool first =
        src.name(i).find("layers.1.") == std::string::npos && src.name(i) != "model.norm.weight";
    (first ? a : b)
        .add(src.name(i), {s.begin(), s.end()}, std::span<const double>(src.value(i)),
             first ? dtype::f64 : dtype::f32);
    weight_map[src.name(i)] =
        first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  a.write(dir / "model-00001-of-00002.safetensors");
  b.write(dir / "model-00002-of-00002.safetensors");
  const json index = {{"metadata", {{"total_size", 1234}}}, {"weight_map", weight_map}};
  write_text(dir / "model.safetensors.index.json", index.dump(2));

  auto back = model_params<double>(c, 21);
  load_hf_weights(dir.path(), back);
  for (std::size_t i = 0; i < src.size(); ++i) {
    CAPTURE(src.name(i));
    const bool first = weight_map[src.name(i)] == "model-00001-of-00002.safetensors";
    for (std::size_t k = 0; k < src.value(i).size(); ++k)
      CHECK(back.value(i)[k] ==
            (first ? src.value(i)[k] : static_cast<double>(static_cast<float>(src.value(i)[k]))));
  }
  const hf_checkpoint ck = hf_checkpoint::open(dir.path());
  CHECK(ck.names().size() == src.size());
  CHECK(ck.info("model.norm.weight").type == dtype::f32);

  // Broken indexes are refused by name.
  auto index_error = [&](const json& j) {
    write_text(dir / "model.safetensors.index.json", j.dump());
    auto p = model_params<double>(c, 22);
    return error_of([&] { load_hf_weights(dir.path(), p); });
  };
  json wrong = index;
  wrong["weight_map"]["model.norm.weight"] = "model-00001-of-00002.safetensors";
  CHECK(contains(index_error(wrong),
                 "puts tensor 'model.norm.weight' in "
                 "model-00001-of-00002.safetensors, which has no tensor"));
  json escape = index;
  escape["weight_map"]["model.norm.weight"] = "../model-00002-of-00002.safetensors";
  CHECK(contains(index_error(escape), "expected a file name beside the index"));
  json missing = index;
  missing["weight_map"].erase("model.norm.weight");
  CHECK(contains(index_error(missing), "parameter 'model.norm.weight' is not in the checkpoint"));
  json absent = index;
  absent["weight_map"]["model.norm.weight"] = "model-00003-of-00003.safetensors";
  CHECK(contains(index_error(absent), "model-00003-of-00003.safetensors: cannot open"));
  CHECK(contains(index_error(json{{"metadata", json::object()}}), "missing field \"weight_map\""));
}

TEST_CASE("save_gradients writes the gradients that exist under the parameter names") {
  scratch_dir dir;
  auto p = model_params<double>(tiny(), 30);
  std::vector<std::string> with_grad;
  for (std::size_t i = 0; i < p.size(); i += 3) {
    p.entries[i].grad = tightfit::testing::uniform<double>(p.value(i).size(), 500 + i);
    with_grad.push_back(p.name(i));
  }
  save_gradients(dir / "grads.safetensors", p);
  const auto st = safetensors_file::open(dir / "grads.safetensors");
  CHECK(st.size() == with_grad.size());
  for (std::size_t i = 0; i < p.size(); ++i) {
    CAPTURE(p.name(i));
    CHECK(st.contains(p.name(i)) == !p.grad(i).empty());
    if (p.grad(i).empty()) continue;
    CHECK(st.read<double>(p.name(i)) == p.entries[i].grad);
    const auto s = p.shape(i);
    CHECK(st.info(p.name(i)).shape == std::vector<index_t>(s.begin(), s.end()));
  }
  save_gradients(dir / "grads32.safetensors", p, dtype::f32);
  CHECK(safetensors_file::open(dir / "grads32.safetensors").info(with_grad[0]).type == dtype::f32);
}

#if __has_include("tightfit/nn/model.hpp") && __has_include("tightfit/backend/reference.hpp")
#include "tightfit/backend/reference.hpp"
#include "tightfit/nn/decoder_layer.hpp"
#include "tightfit/nn/model.hpp"

TEST_CASE("llama_model<reference_backend>: weights and gradients round trip by HF names") {
  scratch_dir dir;
  for (const auto& [arch, tied] :
       {std::pair{"Qwen3ForCausalLM", false}, std::pair{"Qwen3ForCausalLM", true},
        std::pair{"Qwen2ForCausalLM", true}}) {
    CAPTURE(arch);
    CAPTURE(tied);
    const model_config c = tiny(arch, tied);
    reference_backend<double> be;
    llama_model<reference_backend<double>> a(be, c), b(be, c);
    a.init_random(1, 0.02, 0.1);
    b.init_random(2, 0.02, 0.1);
    auto& pa = a.parameters();
    auto& pb = b.parameters();
    CHECK_FALSE(same_values(pa, pb));
    save_hf_config(c, dir.path());
    save_hf_weights(dir.path(), pa);
    const model_config loaded = load_hf_config(dir.path());
    CHECK(loaded.tie_word_embeddings == tied);
    load_hf_weights(dir.path(), pb);  // through reference_backend::upload
    CHECK(same_values(pa, pb));
    // The file holds exactly the model's parameters (no lm_head.weight when tied).
    const auto st = safetensors_file::open(dir / "model.safetensors");
    CHECK(st.size() == pa.size());
    CHECK(st.contains("lm_head.weight") == !tied);
    CHECK(st.contains("model.layers.1.self_attn.v_proj.bias") == c.qkv_bias);
    if (c.qkv_bias) {  // biases start random (not at 1 like the norm weights)
      const auto bias = st.read<double>("model.layers.1.self_attn.v_proj.bias");
      CHECK(bias.size() == static_cast<std::size_t>(c.kv_width()));
      CHECK(std::any_of(bias.begin(), bias.end(), [](double v) { return v < 0.5; }));
    }

    pa.allocate_grad(0);
    pa.allocate_grad(pa.size() - 1);
    tightfit::testing::fill_uniform<double>(pa.grad(0), 3);
    save_gradients(dir / "grads.safetensors", pa);
    const auto g = safetensors_file::open(dir / "grads.safetensors");
    CHECK(g.size() == 2);
    const auto g0 = g.read<double>(pa.name(0));
    CHECK(std::equal(g0.begin(), g0.end(), pa.grad(0).begin(), pa.grad(0).end()));
    CHECK(g.read<double>(pa.name(pa.size() - 1)) ==
          std::vector<double>(static_cast<std::size_t>(pa.numel(pa.size() - 1)), 0.0));
  }
}
#endif
