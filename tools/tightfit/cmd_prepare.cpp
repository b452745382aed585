// tightfit prepare: a JSONL data set to the token batch files that train, grad and logprobs read
// (docs/data.md). Rows are TRL's data set types: {"text"}, {"prompt", "completion"},
// {"messages"}, {"prompt", "chosen", "rejected"} (DPO; the prompt may be left implicit in
// conversations), {"prompt", "completions", "rewards"} (offline GRPO). Text is tokenized by the
// model's Hugging Face tokenizer (text/tokenizer.hpp), conversations rendered by the chat
// format its template is recognised as (text/chat.hpp), labels built as TRL builds them
// (text/examples.hpp), then rows are padded, packed best-fit decreasing or laid out padding-free
// (stream/packing.hpp). Bad input is one line naming the line number and the field, exit 1,
// and nothing is written (the outputs are written to temporary files, then renamed).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "args.hpp"
#include "commands.hpp"
#include "config_file.hpp"
#include "output_paths.hpp"

#if defined(TIGHTFIT_HAS_TEXT) && TIGHTFIT_HAS_TEXT
#include <nlohmann/json.hpp>

#include "tightfit/core/parallel.hpp"
#include "tightfit/io/hf.hpp"
#include "tightfit/io/safetensors.hpp"
#include "tightfit/stream/packing.hpp"
#include "tightfit/text/chat.hpp"
#include "tightfit/text/examples.hpp"
#include "tightfit/text/tokenizer.hpp"
#endif

namespace tightfit::cli {

/// prepare's options (args.hpp); a --config file's keys are TRL's names (config_file.hpp).
const command_spec& prepare_command() {
  static const command_spec spec = [] {
    command_spec c;
    c.name = "prepare";
    c.synopsis = "--tokenizer DIR --data rows.jsonl --out batch.safetensors [options]";
    c.options = {
        {"--tokenizer", "DIR",
         "tokenizer.json + tokenizer_config.json (a Hugging Face model folder)"},
        {"--data", "FILE",
         "JSON lines: text | prompt + completion | messages | prompt + chosen + rejected (dpo) | "
         "prompt + completions + rewards (grpo)"},
        {"--out", "FILE", "the token batch file written (safetensors)"},
        {"--objective", "NAME", "sft, dpo or grpo (default: from the first row's fields)"},
        {"--model", "DIR", "check every token id against DIR/config.json's vocab_size"},
        {"--vocab-size", "N", "the same check against N"},
        {"--max-length", "N", "tokens per sequence; longer ones are truncated", "1024",
         "max_length"},
        {"--truncation-mode", "NAME", "keep_start or keep_end", "keep_start", "truncation_mode"},
        {"--packing", "", "best-fit decreasing into rows of --max-length, with position_ids", "",
         "packing"},
        {"--padding-free", "", "rows of --max-length in data set order, with position_ids", "",
         "padding_free"},
        {"--completion-only-loss", "B", "true or false: labels only on completions", "true",
         "completion_only_loss"},
        {"--assistant-only-loss", "", "labels only on the assistant's turns of messages rows", "",
         "assistant_only_loss"},
        {"--enable-thinking", "B",
         "the Qwen3 chat format's variable: true or false (default: the template's)", "",
         "enable_thinking"},
        {"--date-string", "D",
         "the Llama 3.2 chat format's system date, e.g. '26 Jul 2024' (default: today, as "
         "transformers renders it)"},
        {"--scale-rewards", "NAME", "grpo: group ((r - mean) / (std + 1e-4)) or none", "group",
         "scale_rewards"},
        {"--shuffle", "", "shuffle the rows (with --seed) before the split"},
        {"--seed", "N", "the shuffle's seed", "0", "seed"},
        {"--eval-split", "F", "the fraction of rows (0 < F < 1) written to --eval-out"},
        {"--eval-out", "FILE", "the evaluation batch file"},
        {"--quiet", "", "no progress line"},
        {"--config", "FILE",
         "options from a flat JSON or YAML file with TRL's names (the config keys above); "
         "train's keys are skipped; the command line overrides the file"},
    };
    c.config = [](const std::string& path, const command_spec& self) {
      return read_config(path, self, train_command());
    };
    return c;
  }();
  return spec;
}

#if !(defined(TIGHTFIT_HAS_TEXT) && TIGHTFIT_HAS_TEXT)

int prepare(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") {
      std::fputs(help_text(prepare_command()).c_str(), stdout);
      return 0;
    }
  std::fprintf(stderr,
               "tightfit prepare: this tightfit was built without the text component (PCRE2, "
               "utf8proc: libpcre2-dev libutf8proc-dev pkg-config)\n");
  return 1;
}

#else

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

/// A field's value: text, or a list of chat messages.
struct content {
  bool chat = false;
  std::string text;
  std::vector<text::chat_message> messages;
};

enum class row_kind { text, prompt_completion, messages, preference, grpo };

const char* objective_of(row_kind k) {
  return k == row_kind::preference ? "dpo" : k == row_kind::grpo ? "grpo" : "sft";
}

/// One row of the data set, parsed.
struct row {
  std::size_t line = 0;
  row_kind kind = row_kind::text;
  content prompt, completion, rejected;  // text / prompt; completion / chosen; rejected
  std::vector<content> completions;      // grpo
  std::vector<double> rewards;           // grpo
};

/// Bad input: one line, exit 1.
[[noreturn]] void bad_line(std::size_t line, const std::string& what) {
  throw error("line " + std::to_string(line) + ": " + what);
}

std::string type_name(const json& v) {
  if (v.is_string()) return "a string";
  if (v.is_number()) return "a number";
  if (v.is_boolean()) return "a boolean";
  if (v.is_null()) return "null";
  if (v.is_array()) return "a list";
  return "an object";
}

std::vector<text::chat_message> parse_messages(const json& v, std::size_t line,
                                               const std::string& field) {
  std::vector<text::chat_message> out;
  if (!v.is_array())
    bad_line(line, "field '" + field + "' is " + type_name(v) + ", expected a list of messages");
  for (std::size_t i = 0; i < v.size(); ++i) {
    const auto& m = v[i];
    const std::string f = field + "[" + std::to_string(i) + "]";
    if (!m.is_object())
      bad_line(line, "field '" + f + "' is " + type_name(m) + ", expected a message object");
    if (!m.contains("role")) bad_line(line, "field '" + f + "' has no 'role'");
    if (!m["role"].is_string())
      bad_line(line, "field '" + f + ".role' is " + type_name(m["role"]) + ", expected a string");
    if (!m.contains("content")) bad_line(line, "field '" + f + "' has no 'content'");
    if (!m["content"].is_string())
      bad_line(line,
               "field '" + f + ".content' is " + type_name(m["content"]) + ", expected a string");
    if (m.contains("tool_calls") && !m["tool_calls"].is_null())
      bad_line(line, "field '" + f + ".tool_calls': tool calls are not supported");
    text::chat_message msg{m["role"].get<std::string>(), m["content"].get<std::string>(),
                           std::nullopt};
    if (m.contains("reasoning_content") && !m["reasoning_content"].is_null()) {
      if (!m["reasoning_content"].is_string())
        bad_line(line, "field '" + f + ".reasoning_content' is " +
                           type_name(m["reasoning_content"]) + ", expected a string");
      msg.reasoning_content = m["reasoning_content"].get<std::string>();
    }
    out.push_back(std::move(msg));
  }
  return out;
}

/// A text or conversational field.
content parse_content(const json& j, const char* key, std::size_t line) {
  if (!j.contains(key)) bad_line(line, std::string("no field '") + key + "'");
  const auto& v = j[key];
  content c;
  if (v.is_string()) {
    c.text = v.get<std::string>();
  } else if (v.is_array()) {
    c.chat = true;
    c.messages = parse_messages(v, line, key);
  } else {
    bad_line(line, std::string("field '") + key + "' is " + type_name(v) +
                       ", expected a string or a list of messages");
  }
  return c;
}

row parse_row(const std::string& text, std::size_t line) {
  json j;
  try {
    j = io::detail::parse_json_text(text, "JSON");
  } catch (const error& e) {
    bad_line(line, e.what());
  }
  if (!j.is_object()) bad_line(line, "is " + type_name(j) + ", expected a JSON object");
  row r;
  r.line = line;
  if (j.contains("messages")) {
    r.kind = row_kind::messages;
    r.prompt.chat = true;
    r.prompt.messages = parse_messages(j["messages"], line, "messages");
  } else if (j.contains("chosen") || j.contains("rejected")) {
    r.kind = row_kind::preference;
    r.completion = parse_content(j, "chosen", line);
    r.rejected = parse_content(j, "rejected", line);
    if (j.contains("prompt")) {
      r.prompt = parse_content(j, "prompt", line);
    } else {  // an implicit prompt: the messages chosen and rejected share
      if (!r.completion.chat || !r.rejected.chat)
        bad_line(line, "no field 'prompt' (text preference rows need one)");
      auto& c = r.completion.messages;
      auto& k = r.rejected.messages;
      std::size_t n = 0;
      while (n + 1 < c.size() && n + 1 < k.size() && c[n].role == k[n].role &&
             c[n].content == k[n].content)
        ++n;
      if (n == 0)
        bad_line(line, "no field 'prompt', and 'chosen' and 'rejected' share no first message");
      r.prompt.chat = true;
      r.prompt.messages.assign(c.begin(), c.begin() + static_cast<std::ptrdiff_t>(n));
      c.erase(c.begin(), c.begin() + static_cast<std::ptrdiff_t>(n));
      k.erase(k.begin(), k.begin() + static_cast<std::ptrdiff_t>(n));
    }
    if (r.prompt.chat != r.completion.chat || r.prompt.chat != r.rejected.chat)
      bad_line(line, "fields 'prompt', 'chosen' and 'rejected' mix text and messages");
  } else if (j.contains("completions") || j.contains("rewards")) {
    r.kind = row_kind::grpo;
    r.prompt = parse_content(j, "prompt", line);
    if (!j.contains("completions")) bad_line(line, "no field 'completions'");
    if (!j.contains("rewards")) bad_line(line, "no field 'rewards'");
    const auto& cs = j["completions"];
    const auto& rs = j["rewards"];
    if (!cs.is_array() || cs.empty())
      bad_line(line, "field 'completions' is " + type_name(cs) + ", expected a non-empty list");
    if (!rs.is_array())
      bad_line(line, "field 'rewards' is " + type_name(rs) + ", expected a list of numbers");
    if (rs.size() != cs.size())
      bad_line(line, "field 'rewards' has " + std::to_string(rs.size()) + " values for " +
                         std::to_string(cs.size()) + " completions");
    for (std::size_t k = 0; k < cs.size(); ++k) {
      const std::string f = "completions[" + std::to_string(k) + "]";
      content c;
      if (cs[k].is_string()) {
        c.text = cs[k].get<std::string>();
      } else if (cs[k].is_array()) {
        c.chat = true;
        c.messages = parse_messages(cs[k], line, f);
      } else {
        bad_line(line, "field '" + f + "' is " + type_name(cs[k]) +
                           ", expected a string or a list of messages");
      }
      if (c.chat != r.prompt.chat)
        bad_line(line, "fields 'prompt' and '" + f + "' mix text and messages");
      r.completions.push_back(std::move(c));
      const std::string rf = "rewards[" + std::to_string(k) + "]";
      if (!rs[k].is_number())
        bad_line(line, "field '" + rf + "' is " + type_name(rs[k]) + ", expected a number");
      const double v = rs[k].get<double>();
      if (!std::isfinite(v)) bad_line(line, "field '" + rf + "' is not finite");
      r.rewards.push_back(v);
    }
  } else if (j.contains("prompt") || j.contains("completion")) {
    r.kind = row_kind::prompt_completion;
    r.prompt = parse_content(j, "prompt", line);
    r.completion = parse_content(j, "completion", line);
    if (r.prompt.chat != r.completion.chat)
      bad_line(line, "fields 'prompt' and 'completion' mix text and messages");
  } else if (j.contains("text")) {
    r.kind = row_kind::text;
    if (!j["text"].is_string())
      bad_line(line, "field 'text' is " + type_name(j["text"]) + ", expected a string");
    r.prompt.text = j["text"].get<std::string>();
  } else {
    bad_line(line,
             "none of the fields text, prompt + completion, messages, prompt + chosen + rejected, "
             "prompt + completions + rewards");
  }
  return r;
}

/// The options of one run.
struct prepare_options {
  fs::path tokenizer, data, out, eval_out, model;
  std::string objective;  // "" until known
  index_t vocab = 0;      // 0: no check
  index_t max_length = 1024;
  text::truncation side = text::truncation::keep_start;
  bool packing = false, padding_free = false, completion_only = true, assistant_only = false;
  std::optional<bool> enable_thinking;
  std::string date_string;
  bool scale_rewards = true, shuffle = false, quiet = false;
  std::uint64_t seed = 0;
  double eval_split = 0;
};

bool parse_bool(const std::string& key, const std::string& v) {
  if (v == "true") return true;
  if (v == "false") return false;
  throw usage_error{key + " is '" + v + "', expected true or false"};
}

prepare_options parse_options(const arguments& a) {
  prepare_options o;
  for (const char* key : {"--tokenizer", "--data", "--out"})
    if (!a.has(key)) throw usage_error{std::string(key) + " is required"};
  o.tokenizer = a.get("--tokenizer");
  o.data = a.get("--data");
  o.out = a.get("--out");
  o.objective = a.get("--objective");
  if (!o.objective.empty() && o.objective != "sft" && o.objective != "dpo" && o.objective != "grpo")
    throw usage_error{"--objective is '" + o.objective + "', expected sft, dpo or grpo"};
  if (a.has("--model") && a.has("--vocab-size"))
    throw usage_error{"--model and --vocab-size both give the vocabulary: pass one"};
  if (a.has("--model")) o.model = a.get("--model");
  o.vocab = a.integer("--vocab-size", 0, 1, index_t{1} << 40);
  o.max_length = a.integer("--max-length", 1, index_t{1} << 30);
  const std::string side = a.get("--truncation-mode");
  if (side != "keep_start" && side != "keep_end")
    throw usage_error{"--truncation-mode is '" + side + "', expected keep_start or keep_end"};
  o.side = side == "keep_end" ? text::truncation::keep_end : text::truncation::keep_start;
  o.packing = a.has("--packing");
  o.padding_free = a.has("--padding-free");
  if (o.packing && o.padding_free)
    throw usage_error{"--packing and --padding-free are two layouts: pass one"};
  o.completion_only =
      parse_bool(a.label("--completion-only-loss"), a.get("--completion-only-loss"));
  o.assistant_only = a.has("--assistant-only-loss");
  if (a.has("--enable-thinking"))
    o.enable_thinking = parse_bool(a.label("--enable-thinking"), a.get("--enable-thinking"));
  o.date_string = a.get("--date-string");
  const std::string scale = a.get("--scale-rewards");
  if (scale != "group" && scale != "none")
    throw usage_error{"--scale-rewards is '" + scale + "', expected group or none"};
  o.scale_rewards = scale == "group";
  o.shuffle = a.has("--shuffle");
  // a config file's seed (one file may serve train too) is not an error without --shuffle
  if (a.has("--seed") && !o.shuffle && a.origin("--seed").empty())
    throw usage_error{"--seed is the seed of --shuffle"};
  o.seed = static_cast<std::uint64_t>(a.integer("--seed", 0, (index_t{1} << 62)));
  o.eval_split = a.real("--eval-split", 0, 0, 1);
  if (a.has("--eval-split") != a.has("--eval-out"))
    throw usage_error{"--eval-split and --eval-out go together"};
  if (a.has("--eval-split") && (o.eval_split <= 0 || o.eval_split >= 1))
    throw usage_error{"--eval-split is " + a.get("--eval-split") + ", expected 0 < F < 1"};
  if (a.has("--eval-out")) o.eval_out = a.get("--eval-out");
  o.quiet = a.has("--quiet");
  return o;
}

/// The output checks of prepare: the shared rule of every command (output_paths.hpp): an output
/// is neither an input (the data file, the tokenizer or model folder and their files, through
/// links) nor inside an input folder, the two outputs differ, their folders are writable.
void check_output_paths(const prepare_options& o) {
  output_paths paths;
  paths.input(o.tokenizer);
  if (!o.model.empty()) paths.input(o.model);
  paths.input_file(o.data);
  paths.output_file("--out", o.out);
  if (!o.eval_out.empty()) paths.output_file("--eval-out", o.eval_out);
}

/// The documents of one row: one (sft), chosen + rejected (dpo), one per completion (grpo).
struct row_result {
  std::vector<text::example> docs;
  std::vector<double> advantages;  // grpo: one per doc
  std::string error;               // bad input: the message (the first line in file order wins)
};

/// The tokenizer, the chat format and the options a row is encoded with.
struct encoder {
  const text::hf_tokenizer& tok;
  std::optional<text::chat_format> format;
  std::optional<token_id> eos;
  const prepare_options& o;

  text::rendered_chat render(const std::vector<text::chat_message>& m, std::size_t line) const {
    text::chat_options co;
    co.enable_thinking = o.enable_thinking;
    co.date_string = o.date_string;
    try {
      return text::render_chat(*format, m, co, tok.bos_token());
    } catch (const error& e) {
      bad_line(line, std::string("field '") + field_ + "': " + e.what());
    }
  }

  /// prompt + completion, text or chat; supervised: the completion (or all, when !only).
  text::example pair(const content& prompt, const content& completion, bool only,
                     std::size_t line) const {
    if (!prompt.chat)
      return text::prompt_completion_example(tok, prompt.text, completion.text, eos, only);
    auto all = prompt.messages;
    all.insert(all.end(), completion.messages.begin(), completion.messages.end());
    const auto r = render(all, line);
    return text::chat_example(
        tok, r, only ? std::optional<std::size_t>(prompt.messages.size()) : std::nullopt);
  }

  /// Checks the ids against the model's vocabulary; the field is named by the label's side.
  void check_vocab(const text::example& e, std::size_t line, const std::string& prompt_field,
                   const std::string& completion_field) const {
    if (o.vocab <= 0) return;
    for (std::size_t i = 0; i < e.ids.size(); ++i)
      if (e.ids[i] >= o.vocab)
        bad_line(line, "field '" + (e.labels[i] == ignore_index ? prompt_field : completion_field) +
                           "': token id " + std::to_string(e.ids[i]) + " ('" +
                           tok.id_to_token(e.ids[i]) + "') is past the model's vocabulary of " +
                           std::to_string(o.vocab) + " tokens");
  }

  row_result encode(const row& r) const {
    row_result out;
    field_ = "messages";
    switch (r.kind) {
      case row_kind::text:
        out.docs.push_back(text::text_example(tok, r.prompt.text, eos));
        check_vocab(out.docs.back(), r.line, "text", "text");
        break;
      case row_kind::prompt_completion:
        field_ = "completion";
        out.docs.push_back(pair(r.prompt, r.completion, o.completion_only, r.line));
        check_vocab(out.docs.back(), r.line, "prompt", "completion");
        break;
      case row_kind::messages: {
        const auto chat = render(r.prompt.messages, r.line);
        out.docs.push_back(text::chat_example(
            tok, chat, o.assistant_only ? std::optional<std::size_t>(0) : std::nullopt));
        check_vocab(out.docs.back(), r.line, "messages", "messages");
        break;
      }
      case row_kind::preference:
        field_ = "chosen";
        out.docs.push_back(pair(r.prompt, r.completion, true, r.line));
        check_vocab(out.docs.back(), r.line, "prompt", "chosen");
        field_ = "rejected";
        out.docs.push_back(pair(r.prompt, r.rejected, true, r.line));
        check_vocab(out.docs.back(), r.line, "prompt", "rejected");
        break;
      case row_kind::grpo: {
        for (std::size_t k = 0; k < r.completions.size(); ++k) {
          field_ = "completions[" + std::to_string(k) + "]";
          out.docs.push_back(pair(r.prompt, r.completions[k], true, r.line));
          check_vocab(out.docs.back(), r.line, "prompt", field_);
        }
        // group-relative advantages: (r - mean) / (std + 1e-4), std unbiased (0 for one)
        const auto n = static_cast<double>(r.rewards.size());
        const double mean = std::accumulate(r.rewards.begin(), r.rewards.end(), 0.0) / n;
        double var = 0;
        for (const double v : r.rewards) var += (v - mean) * (v - mean);
        const double sd = r.rewards.size() > 1 ? std::sqrt(var / (n - 1)) : 0.0;
        for (const double v : r.rewards)
          out.advantages.push_back(o.scale_rewards ? (v - mean) / (sd + 1e-4) : v - mean);
        break;
      }
    }
    for (auto& d : out.docs) text::truncate(d, o.max_length, o.side);
    return out;
  }

 private:
  static thread_local std::string field_;
};
thread_local std::string encoder::field_;

/// The tensors of one output file.
struct batch_tensors {
  index_t rows = 0, seq_len = 0, documents = 0, tokens = 0, supervised = 0;
  safetensors_writer writer;
};

void add_matrix(safetensors_writer& w, const std::string& name, index_t rows, index_t t,
                const std::vector<token_id>& v) {
  w.add(name, {rows, t}, std::span<const std::int64_t>(v));
}
void add_positions(safetensors_writer& w, const std::string& name, index_t rows, index_t t,
                   const std::vector<index_t>& v) {
  std::vector<std::int64_t> p(v.begin(), v.end());
  w.add(name, {rows, t}, std::span<const std::int64_t>(p));
}

/// Documents as rows: padded (one per row, right padding, labels -100) or packed / padding-free
/// (position_ids). `second`: dpo's rejected documents, laid out with the same rows.
struct layout {
  packed_rows first, second;
  bool packed = false;
};

layout lay_out(const prepare_options& o, const std::vector<std::vector<token_id>>& ids,
               const std::vector<std::vector<token_id>>& labels,
               const std::vector<std::vector<token_id>>* ids2,
               const std::vector<std::vector<token_id>>* labels2, token_id pad) {
  layout l;
  std::vector<index_t> len, len2;
  for (const auto& d : ids) len.push_back(static_cast<index_t>(d.size()));
  if (ids2 != nullptr)
    for (const auto& d : *ids2) len2.push_back(static_cast<index_t>(d.size()));
  packing rows;
  l.packed = o.packing || o.padding_free;
  if (!l.packed) {
    for (std::size_t d = 0; d < ids.size(); ++d) rows.push_back({static_cast<index_t>(d)});
  } else if (ids2 == nullptr) {
    rows =
        o.packing ? pack_best_fit_decreasing(len, o.max_length) : pack_in_order(len, o.max_length);
  } else {
    rows = o.packing ? pack_best_fit_decreasing(len, len2, o.max_length)
                     : pack_in_order(len, len2, o.max_length);
  }
  // T: the fullest row of either file
  index_t t = 1;
  for (const auto& row : rows) {
    index_t a = 0, b = 0;
    for (const index_t d : row) {
      a += len[static_cast<std::size_t>(d)];
      if (ids2 != nullptr) b += len2[static_cast<std::size_t>(d)];
    }
    t = std::max({t, a, b});
  }
  l.first = lay_out_rows(rows, ids, labels, t, pad);
  if (ids2 != nullptr) l.second = lay_out_rows(rows, *ids2, *labels2, t, pad);
  return l;
}

/// The batch file of one split.
batch_tensors build_batch(const prepare_options& o, const std::vector<row_result>& results,
                          const std::vector<std::size_t>& order, token_id pad) {
  batch_tensors b;
  const bool dpo = o.objective == "dpo", grpo = o.objective == "grpo";
  std::vector<std::vector<token_id>> ids, labels, ids2, labels2;
  std::vector<double> advantages;
  for (const std::size_t r : order) {
    const auto& res = results[r];
    if (dpo) {
      if (res.docs[0].supervised() == 0 || res.docs[1].supervised() == 0) continue;
      ids.push_back(res.docs[0].ids);
      labels.push_back(res.docs[0].labels);
      ids2.push_back(res.docs[1].ids);
      labels2.push_back(res.docs[1].labels);
      continue;
    }
    for (std::size_t k = 0; k < res.docs.size(); ++k) {
      if (res.docs[k].supervised() == 0) continue;
      ids.push_back(res.docs[k].ids);
      labels.push_back(res.docs[k].labels);
      if (grpo) advantages.push_back(res.advantages[k]);
    }
  }
  check(!ids.empty(), "no row is left with a supervised token (all were empty or truncated)");
  const auto l = lay_out(o, ids, labels, dpo ? &ids2 : nullptr, dpo ? &labels2 : nullptr, pad);
  b.seq_len = l.first.seq_len;
  b.documents = static_cast<index_t>(ids.size());
  for (const auto& d : ids) b.tokens += static_cast<index_t>(d.size());
  for (const auto& d : labels)
    b.supervised += static_cast<index_t>(
        std::count_if(d.begin(), d.end(), [](token_id x) { return x != ignore_index; }));
  if (dpo) {
    for (const auto& d : ids2) b.tokens += static_cast<index_t>(d.size());
    for (const auto& d : labels2)
      b.supervised += static_cast<index_t>(
          std::count_if(d.begin(), d.end(), [](token_id x) { return x != ignore_index; }));
    b.rows = l.first.rows + l.second.rows;
    add_matrix(b.writer, "chosen_input_ids", l.first.rows, b.seq_len, l.first.input_ids);
    add_matrix(b.writer, "chosen_labels", l.first.rows, b.seq_len, l.first.labels);
    add_matrix(b.writer, "rejected_input_ids", l.second.rows, b.seq_len, l.second.input_ids);
    add_matrix(b.writer, "rejected_labels", l.second.rows, b.seq_len, l.second.labels);
    if (l.packed) {
      add_positions(b.writer, "chosen_position_ids", l.first.rows, b.seq_len, l.first.position_ids);
      add_positions(b.writer, "rejected_position_ids", l.second.rows, b.seq_len,
                    l.second.position_ids);
    }
    return b;
  }
  b.rows = l.first.rows;
  add_matrix(b.writer, "input_ids", b.rows, b.seq_len, l.first.input_ids);
  add_matrix(b.writer, "labels", b.rows, b.seq_len, l.first.labels);
  if (l.packed) add_positions(b.writer, "position_ids", b.rows, b.seq_len, l.first.position_ids);
  if (grpo) {
    std::vector<double> adv;  // row-major document order
    for (const index_t d : l.first.documents)
      adv.push_back(advantages[static_cast<std::size_t>(d)]);
    b.writer.add("advantages", {static_cast<index_t>(adv.size())}, std::span<const double>(adv),
                 dtype::f32);
  }
  return b;
}

/// A temporary file beside `p`, renamed over it by commit(); removed if never committed.
class staged_file {
 public:
  explicit staged_file(fs::path p) : final_(std::move(p)) {
    tmp_ = final_;
    tmp_ += ".tmp-" + std::to_string(::getpid());
  }
  staged_file(const staged_file&) = delete;
  staged_file& operator=(const staged_file&) = delete;
  ~staged_file() {
    std::error_code ec;
    if (!committed_) fs::remove(tmp_, ec);
  }
  const fs::path& path() const { return tmp_; }
  void commit() {
    std::error_code ec;
    fs::rename(tmp_, final_, ec);
    check(!ec, final_.string(), ": cannot write (rename from ", tmp_.string(), "): ", ec.message());
    committed_ = true;
  }

 private:
  fs::path final_, tmp_;
  bool committed_ = false;
};

std::string quantity(double v) {
  char buf[32];
  if (v >= 1e9)
    std::snprintf(buf, sizeof buf, "%.2fG", v / 1e9);
  else if (v >= 1e6)
    std::snprintf(buf, sizeof buf, "%.2fM", v / 1e6);
  else if (v >= 1e4)
    std::snprintf(buf, sizeof buf, "%.1fk", v / 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.0f", v);
  return buf;
}

int run_prepare(const prepare_options& opt_in) {
  prepare_options o = opt_in;
  const auto t0 = std::chrono::steady_clock::now();
  auto seconds = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  check_output_paths(o);
  // the model's vocabulary
  if (!o.model.empty()) {
    const auto cfg =
        io::detail::read_json_file(fs::is_directory(o.model) ? o.model / "config.json" : o.model);
    const auto& c = cfg.contains("text_config") ? cfg["text_config"] : cfg;
    check(c.contains("vocab_size") && c["vocab_size"].is_number_integer(), o.model.string(),
          ": config.json has no integer vocab_size");
    o.vocab = c["vocab_size"].get<index_t>();
  }
  const auto tok = text::hf_tokenizer::load(o.tokenizer);
  const auto eos = tok.id_of(tok.eos_token());
  const auto pad = tok.id_of(tok.pad_token());
  check(!tok.eos_token().empty() && eos.has_value(), o.tokenizer.string(),
        ": tokenizer_config.json names no eos_token of the vocabulary");
  for (const auto& [name, id] :
       {std::pair{"eos_token", *eos}, std::pair{"pad_token", pad.value_or(*eos)}})
    check(o.vocab <= 0 || id < o.vocab, o.tokenizer.string(), ": the ", name, " id ", id,
          " is past the model's vocabulary of ", o.vocab, " tokens");

  // rows
  std::ifstream in(o.data, std::ios::binary);
  check(static_cast<bool>(in), o.data.string(), ": cannot open");
  std::vector<row> rows;
  std::string text_line;
  std::size_t line = 0;
  bool chat = false;
  double last_read_print = 0;
  while (std::getline(in, text_line)) {
    ++line;
    if (!o.quiet && (line & 0xFFFF) == 0 && seconds() - last_read_print > 0.5) {
      last_read_print = seconds();
      std::fprintf(stderr, "tightfit prepare: reading line %zu, %.1f s%s", line, last_read_print,
                   ::isatty(2) == 1 ? "   \r" : "\n");
    }
    if (text_line.find_first_not_of(" \t\r") == std::string::npos) continue;
    rows.push_back(parse_row(text_line, line));
    const auto& r = rows.back();
    const char* obj = objective_of(r.kind);
    if (o.objective.empty()) o.objective = obj;
    if (o.objective != obj)
      bad_line(line, std::string("a ") + obj + " row in a data set of " + o.objective +
                         " rows (line " + std::to_string(rows.front().line) + ")");
    chat = chat || r.prompt.chat || r.completion.chat;
  }
  check(!in.bad(), o.data.string(), ": read error");
  check(!rows.empty(), o.data.string(), ": no rows");
  // the chat format
  encoder enc{tok, std::nullopt, eos, o};
  if (chat) {
    const std::string& t = tok.chat_template();
    if (t.empty())
      throw usage_error{"--tokenizer '" + o.tokenizer.string() +
                        "': tokenizer_config.json has no chat_template, and the data has "
                        "conversations"};
    enc.format = text::recognise_chat_template(t);
    if (!enc.format) {
      char fp[24];
      std::snprintf(fp, sizeof fp, "%016llx",
                    static_cast<unsigned long long>(text::template_fingerprint(t)));
      std::string first = t.substr(0, t.find('\n')).substr(0, 60);
      std::string known;
      for (const auto& k : text::known_templates)
        known += (known.empty() ? "" : ", ") + std::string(k.name);
      throw usage_error{"--tokenizer '" + o.tokenizer.string() +
                        "': the chat template (fingerprint " + fp + ", beginning '" + first +
                        "') is not one tightfit knows (" + known + ")"};
    }
  }
  // shuffle and split
  std::vector<std::size_t> order(rows.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  if (o.shuffle) {
    std::uint64_t s = o.seed ^ 0x9E3779B97F4A7C15ULL;
    auto next = [&] {  // splitmix64
      std::uint64_t z = (s += 0x9E3779B97F4A7C15ULL);
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
      return z ^ (z >> 31);
    };
    for (std::size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[next() % i]);
  }
  std::size_t n_eval = 0;
  if (!o.eval_out.empty()) {
    n_eval =
        static_cast<std::size_t>(std::llround(o.eval_split * static_cast<double>(rows.size())));
    n_eval = std::clamp<std::size_t>(n_eval, 1, rows.size() - 1);
    check(rows.size() >= 2, o.data.string(), ": --eval-split needs at least 2 rows");
  }
  const std::vector<std::size_t> train_rows(order.begin(),
                                            order.end() - static_cast<std::ptrdiff_t>(n_eval));
  const std::vector<std::size_t> eval_rows(order.end() - static_cast<std::ptrdiff_t>(n_eval),
                                           order.end());

  // tokenize, in parallel over rows, with a progress line
  std::vector<row_result> results(rows.size());
  const bool tty = ::isatty(2) == 1;
  double last_print = 0;
  const double tokenize_start = seconds();  // the ETA is from the tokenizing rate
  index_t tokens_so_far = 0;
  const std::size_t block = 4096;
  for (std::size_t b0 = 0; b0 < rows.size(); b0 += block) {
    const std::size_t b1 = std::min(rows.size(), b0 + block);
    parallel_for(static_cast<index_t>(b0), static_cast<index_t>(b1), 16,
                 [&](index_t i0, index_t i1) {
                   for (index_t i = i0; i < i1; ++i) {
                     auto& res = results[static_cast<std::size_t>(i)];
                     try {
                       res = enc.encode(rows[static_cast<std::size_t>(i)]);
                     } catch (const error& e) {
                       res.error = e.what();
                     }
                   }
                 });
    for (std::size_t i = b0; i < b1; ++i) {
      if (!results[i].error.empty()) throw error(results[i].error);
      for (const auto& d : results[i].docs) tokens_so_far += d.size();
    }
    const double s = seconds();
    if (!o.quiet && s > 1.0 && (s - last_print > 0.5 || b1 == rows.size())) {
      last_print = s;
      const double eta =
          (s - tokenize_start) / static_cast<double>(b1) * static_cast<double>(rows.size() - b1);
      std::fprintf(stderr, "tightfit prepare: %zu / %zu rows, %s tokens, %.1f s, ETA %.0f s%s", b1,
                   rows.size(), quantity(static_cast<double>(tokens_so_far)).c_str(), s, eta,
                   tty ? "   \r" : "\n");
    }
  }
  if (!o.quiet && tty && last_print > 0) std::fputc('\n', stderr);

  // the files
  const token_id pad_id = pad.value_or(*eos);
  std::vector<batch_tensors> batches;
  batches.push_back(build_batch(o, results, train_rows, pad_id));
  if (n_eval > 0) batches.push_back(build_batch(o, results, eval_rows, pad_id));
  staged_file out(o.out);
  batches[0].writer.write(out.path());
  std::optional<staged_file> eval_file;
  if (n_eval > 0) {
    eval_file.emplace(o.eval_out);
    batches[1].writer.write(eval_file->path());
  }
  out.commit();
  if (eval_file) eval_file->commit();

  // the summary: lengths of the documents (after truncation), truncated and dropped rows
  std::vector<index_t> lengths;
  std::size_t truncated = 0, dropped = 0;
  for (const auto& r : results) {
    bool t = false, d = false;
    for (const auto& e : r.docs) {
      lengths.push_back(e.size());
      t = t || e.truncated;
      d = d || e.supervised() == 0;
    }
    truncated += t;
    dropped += d;
  }
  std::sort(lengths.begin(), lengths.end());
  auto pct = [&](double q) {
    return lengths[std::min(lengths.size() - 1,
                            static_cast<std::size_t>(q * static_cast<double>(lengths.size())))];
  };
  const double total =
      static_cast<double>(std::accumulate(lengths.begin(), lengths.end(), index_t{0}));
  json s;
  s["objective"] = o.objective;
  if (enc.format) s["chat_format"] = text::to_string(*enc.format);
  s["rows"] = rows.size();
  s["truncated_rows"] = truncated;
  s["dropped_rows"] = dropped;
  s["max_length"] = o.max_length;
  s["layout"] = o.packing ? "packing" : o.padding_free ? "padding_free" : "padded";
  s["lengths"] = {{"min", lengths.front()}, {"p50", pct(0.5)},
                  {"p90", pct(0.9)},        {"p99", pct(0.99)},
                  {"max", lengths.back()},  {"mean", total / static_cast<double>(lengths.size())}};
  const char* names[2] = {"train", "eval"};
  for (std::size_t k = 0; k < batches.size(); ++k) {
    const auto& b = batches[k];
    const double positions = static_cast<double>(b.rows * b.seq_len);
    s[names[k]] = {
        {"file", (k == 0 ? o.out : o.eval_out).string()},
        {"rows", b.rows},
        {"seq_len", b.seq_len},
        {"documents", b.documents},
        {"tokens", b.tokens},
        {"supervised_tokens", b.supervised},
        {"padding", positions > 0 ? 1.0 - static_cast<double>(b.tokens) / positions : 0.0}};
  }
  s["seconds"] = seconds();
  std::printf("%s\n", s.dump(-1, ' ', false, json::error_handler_t::replace).c_str());
  return 0;
}

}  // namespace

int prepare(int argc, char** argv) {
  return with_arguments(prepare_command(), argc, argv,
                        [](const arguments& a) { return run_prepare(parse_options(a)); });
}

#endif

}  // namespace tightfit::cli
