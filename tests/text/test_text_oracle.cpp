// tightfit's tokenizers against the JavaScript oracle (tests/text/oracle/oracle.cjs, run by
// run_oracle.sh before this program): for Qwen3, Qwen2.5, Llama 3.1, Llama 3.2 and Gemma 3, the
// token ids of every document of the corpus with and without special tokens, decode with and
// without them, and decode(encode(x)) == x; the chat formats against @huggingface/jinja's rendering
// of each model's own template, and the assistant-only labels against the oracle's prompt lengths.
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tightfit/text/chat.hpp"
#include "tightfit/text/examples.hpp"
#include "tightfit/text/tokenizer.hpp"

using namespace tightfit;
namespace fs = std::filesystem;

namespace {

std::string from_hex(const std::string& h) {
  std::string out;
  for (std::size_t i = 0; i + 1 < h.size(); i += 2)
    out.push_back(static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16)));
  return out;
}

nlohmann::json oracle(const std::string& model) {
  const char* dir = std::getenv("TIGHTFIT_TEXT_ORACLE");
  REQUIRE_MESSAGE(dir != nullptr, "TIGHTFIT_TEXT_ORACLE is not set (run through run_oracle.sh)");
  std::ifstream in(fs::path(dir) / (model + ".json"));
  REQUIRE(in.good());
  return nlohmann::json::parse(in);
}

/// The number of positions where two id sequences differ (a length difference counts each
/// missing position).
std::size_t differing(const std::vector<token_id>& a, const std::vector<token_id>& b) {
  std::size_t n = a.size() > b.size() ? a.size() - b.size() : b.size() - a.size();
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) n += a[i] != b[i];
  return n;
}

void check_model(const std::string& model) {
  const auto o = oracle(model);
  const auto tok = text::hf_tokenizer::load(o["dir"].get<std::string>());
  std::size_t docs = 0, bytes = 0, tokens = 0, diff = 0, diff_special = 0, roundtrips = 0;
  for (const auto& d : o["documents"]) {
    const std::string x = from_hex(d["bytes"].get<std::string>());
    const auto ids = tok.encode(x, {.add_special_tokens = false});
    const auto with = tok.encode(x, {.add_special_tokens = true});
    const auto want = d["ids"].get<std::vector<token_id>>();
    const auto want_special = d["ids_special"].get<std::vector<token_id>>();
    const std::size_t n = differing(ids, want), ns = differing(with, want_special);
    if (n != 0 || ns != 0) {
      std::string shown = text::sanitize_utf8(x).substr(0, 200);
      MESSAGE(model, ": document ", docs, " differs (", n, " / ", ns, " tokens): '", shown, "'");
    }
    diff += n;
    diff_special += ns;
    CHECK(tok.decode(ids) == from_hex(d["decoded"].get<std::string>()));
    CHECK(tok.decode(with, {.skip_special_tokens = true}) ==
          from_hex(d["decoded_skip_special"].get<std::string>()));
    // decode(encode(x)) == x, for the text the normalizer gives back unchanged
    std::string expect = text::sanitize_utf8(x);
    if (model.starts_with("qwen"))  // NFC
      expect = text::normalize(expect, {{text::normalizer_step::kind::nfc, "", ""}});
    if (model == "gemma3")  // its decoder turns every "▁" into a space
      expect =
          text::normalize(expect, {{text::normalizer_step::kind::replace, "\xE2\x96\x81", " "}});
    CHECK(tok.decode(ids) == expect);
    roundtrips += tok.decode(ids) == text::sanitize_utf8(x);
    ++docs;
    bytes += x.size();
    tokens += want.size();
  }
  MESSAGE(model, ": ", docs, " documents, ", bytes, " bytes, ", tokens, " tokens: ", diff,
          " differing tokens (", diff_special, " with special tokens); decode(encode(x)) == x for ",
          roundtrips, " documents");
  CHECK(diff == 0);
  CHECK(diff_special == 0);
}

std::vector<text::chat_message> messages_of(const nlohmann::json& j) {
  std::vector<text::chat_message> out;
  for (const auto& m : j)
    out.push_back({m["role"].get<std::string>(), m["content"].get<std::string>(), std::nullopt});
  return out;
}

/// The chat format of each model against @huggingface/jinja's rendering of its own template:
/// the same text (JavaScript strip semantics; Python's differ where docs/data.md says), the same
/// token ids, and labels that supervise exactly the assistant's tokens.
void check_chats(const std::string& model, text::chat_format expected) {
  const auto o = oracle(model);
  const auto tok = text::hf_tokenizer::load(o["dir"].get<std::string>());
  const auto format = text::recognise_chat_template(tok.chat_template());
  REQUIRE(format.has_value());
  CHECK(*format == expected);
  std::ifstream in(TIGHTFIT_TEXT_CHATS);
  const auto chats = nlohmann::json::parse(in);
  REQUIRE(chats.size() == o["chats"].size());
  std::size_t rendered = 0, python_differs = 0, labelled = 0, straddles = 0;
  for (std::size_t c = 0; c < chats.size(); ++c) {
    const auto& want = o["chats"][c];
    const auto msgs = messages_of(chats[c]["messages"]);
    const std::string name = chats[c]["name"].get<std::string>();
    CAPTURE(name);
    text::chat_options js;
    js.javascript_strip = true;
    js.date_string = "26 Jul 2024";  // as the oracle renders Llama 3.2's system header
    if (want.contains("error")) {    // the template raised: the format refuses too
      CHECK_THROWS_WITH_AS(text::render_chat(*format, msgs, js, tok.bos_token()),
                           doctest::Contains(want["error"].get<std::string>().c_str()), error);
      continue;
    }
    const auto r = text::render_chat(*format, msgs, js, tok.bos_token());
    CHECK(r.text == want["rendered"].get<std::string>());
    text::chat_options gen = js;
    gen.add_generation_prompt = true;
    CHECK(text::render_chat(*format, msgs, gen, tok.bos_token()).text ==
          want["rendered_generation"].get<std::string>());
    text::chat_options py;
    py.date_string = js.date_string;
    const auto python = text::render_chat(*format, msgs, py, tok.bos_token());
    python_differs += python.text != r.text;
    ++rendered;
    // tokens of the rendered text and the assistant-only labels
    const auto e = text::chat_example(tok, r, std::size_t{0});
    const auto ids = want["ids"].get<std::vector<token_id>>();
    CHECK(differing(e.ids, ids) == 0);
    // each run of supervised tokens decodes to its assistant range, preceded at most by the
    // white space of a token that straddles the header and the answer
    std::vector<std::string> runs;
    std::vector<token_id> run;
    for (std::size_t i = 0; i <= e.ids.size(); ++i) {
      if (i < e.ids.size() && e.labels[i] != ignore_index) {
        run.push_back(e.ids[i]);
      } else if (!run.empty()) {
        runs.push_back(tok.decode(run));
        run.clear();
      }
    }
    REQUIRE(runs.size() == r.assistant.size());
    for (std::size_t k = 0; k < runs.size(); ++k) {
      const auto [b, end] = r.assistant[k];
      const std::string span = r.text.substr(b, end - b);
      CHECK(runs[k].ends_with(span));
      const std::string extra =
          runs[k].substr(0, runs[k].size() - std::min(runs[k].size(), span.size()));
      CHECK(extra.find_first_not_of(" \n") == std::string::npos);
      straddles += !extra.empty();
    }
    // the last assistant turn: masked exactly on the oracle's prompt (that turn's history and
    // generation prompt, tokenized by transformers.js), supervised up to its end-of-turn token
    if (want.contains("prompt_ids")) {
      const auto prompt = want["prompt_ids"].get<std::vector<token_id>>();
      const bool prefix =
          prompt.size() <= ids.size() && std::equal(prompt.begin(), prompt.end(), ids.begin());
      if (!prefix) continue;  // the template renders the history differently with a new turn
      ++labelled;
      const auto last = text::chat_example(tok, r, msgs.size() - 1);  // that turn only
      std::size_t end = last.ids.size();                              // after its end-of-turn token
      while (end > 0 && last.labels[end - 1] == ignore_index) --end;
      REQUIRE(end > prompt.size());
      for (std::size_t i = 0; i < last.ids.size(); ++i)
        CHECK(last.labels[i] == (i >= prompt.size() && i < end ? last.ids[i] : ignore_index));
      CHECK(tok.is_special(last.ids[end - 1]));  // the turn ends with its end-of-turn token
      CHECK(last.ids.size() - end <= 1);         // then at most a newline
    }
  }
  MESSAGE(model, ": ", rendered, " conversations rendered as @huggingface/jinja renders them, ",
          straddles, " assistant turns with a token straddling the header and the answer, ",
          python_differs,
          " of which render differently with Python's strip semantics; labels "
          "checked against the oracle's prompt for ",
          labelled);
  CHECK(rendered >= 10);
  CHECK(labelled >= 5);
}

}  // namespace

TEST_CASE("chat formats == @huggingface/jinja on each model's own template") {
  check_chats("qwen3", text::chat_format::qwen3);
  check_chats("qwen2_5", text::chat_format::qwen2_5);
  check_chats("llama3_1", text::chat_format::llama3);
  check_chats("llama3_2", text::chat_format::llama3_2);
  check_chats("gemma3", text::chat_format::gemma3);
}

TEST_CASE("Qwen3 tokenizer == transformers.js on the corpus") {
  check_model("qwen3");
}
TEST_CASE("Qwen2.5 tokenizer == transformers.js on the corpus") {
  check_model("qwen2_5");
}
TEST_CASE("Llama 3.1 tokenizer == transformers.js on the corpus") {
  check_model("llama3_1");
}
TEST_CASE("Llama 3.2 tokenizer == transformers.js on the corpus") {
  check_model("llama3_2");
}
TEST_CASE("Gemma 3 tokenizer == transformers.js on the corpus") {
  check_model("gemma3");
}
