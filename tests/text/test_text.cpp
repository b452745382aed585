// Unit tests of text/ that need no oracle: WHATWG UTF-8 replacement, the BPE merge order and
// options on hand-made tokenizer.json files, added tokens, the errors for what a tokenizer file
// asks that tightfit cannot honour, chat rendering and its assistant ranges, labels, truncation,
// and the Tokenizer concept met by a user's own tokenizer.
#include <doctest/doctest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tightfit/text/chat.hpp"
#include "tightfit/text/concept.hpp"
#include "tightfit/text/examples.hpp"
#include "tightfit/text/tokenizer.hpp"
#include "tightfit/text/utf8.hpp"

using namespace tightfit;
using nlohmann::json;

namespace {

/// A tokenizer.json of a character-level BPE (no byte level) over `vocab` with `merges`.
json char_bpe(const std::vector<std::string>& vocab,
              const std::vector<std::pair<std::string, std::string>>& merges) {
  json v = json::object();
  for (std::size_t i = 0; i < vocab.size(); ++i) v[vocab[i]] = i;
  json m = json::array();
  for (const auto& [a, b] : merges) m.push_back({a, b});
  return {{"model", {{"type", "BPE"}, {"vocab", v}, {"merges", m}}},
          {"decoder", {{"type", "Fuse"}}},
          {"added_tokens", json::array()}};
}

/// The 256 byte tokens of byte-level BPE, in GPT-2's alphabet, as ids 0..255.
json byte_vocab() {
  json v = json::object();
  const auto map = text::detail::byte_to_unicode();
  for (int b = 0; b < 256; ++b) {
    std::string s;
    text::append_utf8(s, map[static_cast<std::size_t>(b)]);
    v[s] = b;
  }
  return v;
}

text::hf_tokenizer make(const json& j, const json& cfg = json::object()) {
  return text::hf_tokenizer::from_json(j, cfg, "tokenizer.json", "tokenizer_config.json");
}

std::vector<std::string> pieces(const text::hf_tokenizer& t, const std::string& s) {
  std::vector<std::string> out;
  for (const token_id id : t.encode(s, {.add_special_tokens = false}))
    out.push_back(t.id_to_token(id));
  return out;
}

}  // namespace

TEST_CASE("invalid UTF-8 becomes U+FFFD per maximal subpart (WHATWG)") {
  const std::string r(text::replacement_character);
  CHECK(text::sanitize_utf8("abc") == "abc");
  CHECK(text::sanitize_utf8("\xC3\xA9") == "\xC3\xA9");
  CHECK(text::sanitize_utf8("\xFF") == r);
  CHECK(text::sanitize_utf8("\xE2\x82") == r);              // truncated: one
  CHECK(text::sanitize_utf8("\xE2\x82x") == r + "x");       // then the next byte
  CHECK(text::sanitize_utf8("\xED\xA0\x80") == r + r + r);  // a surrogate: three
  CHECK(text::sanitize_utf8("\xC0\x80") == r + r);          // overlong: two
  CHECK(text::sanitize_utf8("\xF4\x90\x80\x80") == r + r + r + r);
  CHECK(text::sanitize_utf8("\xF0\x9F\x98x\xF0\x9F\x98\x80") == r + "x\xF0\x9F\x98\x80");
  CHECK(text::is_valid_utf8("\xF0\x9F\x98\x80"));
  CHECK(!text::is_valid_utf8("\x80"));
}

TEST_CASE("BPE: lowest rank first, the leftmost of equal ranks, later duplicates win") {
  // "abc": (b, c) has the lower rank, so a + bc, although (a, b) comes first in the text
  auto t = make(char_bpe({"a", "b", "c", "ab", "bc", "abc"}, {{"b", "c"}, {"a", "b"}}));
  CHECK(pieces(t, "abc") == std::vector<std::string>{"a", "bc"});
  // "aaa" with one merge (a, a): the leftmost pair merges first
  auto u = make(char_bpe({"a", "aa"}, {{"a", "a"}}));
  CHECK(pieces(u, "aaa") == std::vector<std::string>{"aa", "a"});
  CHECK(pieces(u, "aaaa") == std::vector<std::string>{"aa", "aa"});
  // a merge listed twice takes its later rank (a JavaScript Map built from the list)
  auto w = make(char_bpe({"a", "b", "c", "ab", "bc"}, {{"a", "b"}, {"b", "c"}, {"a", "b"}}));
  CHECK(pieces(w, "abc") == std::vector<std::string>{"a", "bc"});
}

TEST_CASE("BPE options: ignore_merges, byte_fallback, unk and fuse_unk") {
  auto j = char_bpe({"<unk>", "a", "b", "ab", "xyz", "<0x41>", "<0xC3>", "<0xA9>"}, {{"a", "b"}});
  j["model"]["unk_token"] = "<unk>";
  auto plain = make(j);
  CHECK(pieces(plain, "ab") == std::vector<std::string>{"ab"});
  CHECK(pieces(plain, "qq") == std::vector<std::string>{"<unk>", "<unk>"});
  j["model"]["fuse_unk"] = true;
  CHECK(pieces(make(j), "qqa") == std::vector<std::string>{"<unk>", "a"});
  j["model"]["byte_fallback"] = true;
  // é is not a token: its bytes are; q has no byte token: unk
  CHECK(pieces(make(j), "\xC3\xA9q") == std::vector<std::string>{"<0xC3>", "<0xA9>", "<unk>"});
  auto k = char_bpe({"x", "y", "z", "xyz"}, {});
  CHECK(pieces(make(k), "xyz") == std::vector<std::string>{"x", "y", "z"});
  k["model"]["ignore_merges"] = true;  // a word that is a token is that token
  CHECK(pieces(make(k), "xyz") == std::vector<std::string>{"xyz"});
}

TEST_CASE("added tokens: the longest match, special or not, before normalization") {
  auto j = char_bpe({"<", ">", "a", "b"}, {});
  j["added_tokens"] = json::array({{{"id", 4}, {"content", "<a>"}, {"special", true}},
                                   {{"id", 5}, {"content", "<ab>"}, {"special", false}}});
  j["normalizer"] = {{"type", "Replace"}, {"pattern", {{"String", "a"}}}, {"content", "b"}};
  const auto t = make(j);
  CHECK(t.encode("<ab><a>a", {.add_special_tokens = false}) == std::vector<token_id>{5, 4, 3});
  CHECK(t.is_special(4));
  CHECK(!t.is_special(5));
  CHECK(t.decode(std::vector<token_id>{5, 4, 3}, {.skip_special_tokens = true}) == "<ab>b");
  CHECK_THROWS_WITH_AS(t.decode(std::vector<token_id>{6}), doctest::Contains("token id 6"), error);
}

TEST_CASE("byte-level BPE: offsets, decode(encode(x)) == x, invalid UTF-8 as U+FFFD") {
  // the 256 byte tokens and one merge of "h" "i"
  json v = byte_vocab();
  v["hi"] = 256;
  json j = {
      {"model", {{"type", "BPE"}, {"vocab", v}, {"merges", json::array({"h i"})}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers", json::array({{{"type", "Split"},
                                        {"pattern", {{"Regex", " ?\\p{L}+|\\s+(?!\\S)|\\s+|."}}},
                                        {"behavior", "Isolated"}},
                                       {{"type", "ByteLevel"}, {"use_regex", false}}})}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"added_tokens", json::array()}};
  const auto t = make(j);
  std::vector<std::size_t> offsets;
  const auto ids = t.encode("hi  hi", {}, &offsets);
  CHECK(ids == std::vector<token_id>{256, ' ', ' ', 256});
  CHECK(offsets == std::vector<std::size_t>{0, 2, 3, 4});
  for (const std::string s : {"hi there\n\n\tüñî", "\xF0\x9F\x98\x80 x", ""})
    CHECK(t.decode(t.encode(s)) == s);
  CHECK(t.decode(t.encode("a\xFF")) == "a\xEF\xBF\xBD");  // U+FFFD
}

TEST_CASE("encode_batch: documents in parallel, each as encode gives it") {
  // a byte-level tokenizer whose split regex runs per thread, and words that fill the caches
  json v = byte_vocab();
  v["ab"] = 256;
  v["abab"] = 257;
  json j = {{"model", {{"type", "BPE"}, {"vocab", v}, {"merges", json::array({"a b", "ab ab"})}}},
            {"pre_tokenizer", {{"type", "Split"}, {"pattern", {{"Regex", " ?\\p{L}+|\\s+|."}}}}},
            {"decoder", {{"type", "ByteLevel"}}},
            {"added_tokens", json::array()}};
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       json::array({j["pre_tokenizer"], {{"type", "ByteLevel"}, {"use_regex", false}}})}};
  const auto t = make(j);
  std::vector<std::string> docs;
  for (int d = 0; d < 500; ++d) {
    std::string s;
    for (int w = 0; w < 20; ++w)
      s += std::string(static_cast<std::size_t>((d * 7 + w) % 9), 'a') + "b ab, ";
    docs.push_back(s);
  }
  const auto batch = t.encode_batch(docs, {.add_special_tokens = false});
  REQUIRE(batch.size() == docs.size());
  for (std::size_t d = 0; d < docs.size(); ++d) {
    CHECK(batch[d] == t.encode(docs[d], {.add_special_tokens = false}));
    CHECK(t.decode(batch[d]) == docs[d]);
  }
}

TEST_CASE("a tokenizer file asking for what tightfit cannot honour is an error naming it") {
  auto j = char_bpe({"a"}, {});
  j["normalizer"] = {{"type", "Lowercase"}};
  CHECK_THROWS_WITH_AS(make(j), doctest::Contains("normalizer.type 'Lowercase'"), error);
  j = char_bpe({"a", "b"}, {{"a", "c"}});
  CHECK_THROWS_WITH_AS(make(j), doctest::Contains("model.merges[0]"), error);
  j = char_bpe({"a"}, {});
  j["model"]["type"] = "Unigram";
  CHECK_THROWS_WITH_AS(make(j), doctest::Contains("model.type 'Unigram'"), error);
  j = char_bpe({"a"}, {});
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}};
  CHECK_THROWS_WITH_AS(make(j), doctest::Contains("pre_tokenizer"), error);
  j = char_bpe({"a"}, {});
  CHECK_THROWS_WITH_AS(make(j, {{"remove_space", true}}), doctest::Contains("remove_space"), error);
}

TEST_CASE("chat formats: the assistant's ranges, roles refused by name, templates by print") {
  const std::vector<text::chat_message> m{
      {"system", "S", std::nullopt}, {"user", "U", std::nullopt}, {"assistant", "A", std::nullopt}};
  const auto q = text::render_chat(text::chat_format::qwen3, m, {}, "");
  CHECK(q.text ==
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\nA<|im_end|>\n");
  REQUIRE(q.assistant.size() == 1);
  CHECK(q.text.substr(q.assistant[0].first, q.assistant[0].second - q.assistant[0].first) ==
        "<think>\n\n</think>\n\nA<|im_end|>");
  const auto l = text::render_chat(text::chat_format::llama3, m, {}, "<B>");
  CHECK(l.text.substr(l.assistant[0].first) == "A<|eot_id|>");
  const auto g = text::render_chat(text::chat_format::gemma3, m, {}, "<B>");
  CHECK(g.text ==
        "<B><start_of_turn>user\nS\n\nU<end_of_turn>\n<start_of_turn>model\nA<end_of_turn>\n");
  CHECK(g.text.substr(g.assistant[0].first, g.assistant[0].second - g.assistant[0].first) ==
        "A<end_of_turn>");
  const std::vector<text::chat_message> robot{{"robot", "beep", std::nullopt}};
  for (auto f : {text::chat_format::qwen3, text::chat_format::llama3, text::chat_format::gemma3})
    CHECK_THROWS_WITH_AS(text::render_chat(f, robot, {}, ""),
                         doctest::Contains("messages[0].role 'robot'"), error);
  CHECK(!text::recognise_chat_template("{{ messages }}").has_value());
  // invalid UTF-8 is replaced before rendering, so the ranges hold for what encode sees
  const std::vector<text::chat_message> bad{{"user", "q", std::nullopt},
                                            {"assistant", "a\xFF", std::nullopt}};
  const auto b = text::render_chat(text::chat_format::llama3, bad, {}, "");
  CHECK(b.text.substr(b.assistant[0].first) == "a\xEF\xBF\xBD<|eot_id|>");
  // Python's strip('\n') keeps the spaces that @huggingface/jinja's strip removes
  const std::vector<text::chat_message> spaced{{"user", "q", std::nullopt},
                                               {"assistant", "  a", std::nullopt}};
  text::chat_options js;
  js.javascript_strip = true;
  CHECK(text::render_chat(text::chat_format::qwen3, spaced, {}, "").text.find("\n\n  a") !=
        std::string::npos);
  CHECK(text::render_chat(text::chat_format::qwen3, spaced, js, "").text.find("\n\na<") !=
        std::string::npos);
}

namespace {

/// A user's own tokenizer: one token per byte. It meets the Tokenizer concept, so the data
/// preparation of text/examples.hpp takes it.
struct byte_tokenizer {
  std::vector<token_id> encode(std::string_view s, const text::encode_options& o,
                               std::vector<std::size_t>* offsets) const {
    std::vector<token_id> ids;
    if (o.add_special_tokens) ids.push_back(256);
    if (offsets != nullptr) offsets->assign(ids.size(), 0);
    for (std::size_t i = 0; i < s.size(); ++i) {
      ids.push_back(static_cast<unsigned char>(s[i]));
      if (offsets != nullptr) offsets->push_back(i);
    }
    return ids;
  }
  std::string decode(std::span<const token_id> ids) const {
    std::string s;
    for (const token_id id : ids)
      if (id < 256) s.push_back(static_cast<char>(id));
    return s;
  }
  index_t vocab_size() const { return 258; }
};
static_assert(text::Tokenizer<byte_tokenizer>);
static_assert(text::Tokenizer<text::hf_tokenizer>);
static_assert(!text::Tokenizer<int>);

}  // namespace

TEST_CASE("examples: TRL's labels and truncation, over a user's tokenizer") {
  const byte_tokenizer t;
  auto e = text::prompt_completion_example(t, "ab", "cd", token_id{257}, true);
  CHECK(e.ids == std::vector<token_id>{256, 'a', 'b', 'c', 'd', 257});
  CHECK(e.labels == std::vector<token_id>{-100, -100, -100, 'c', 'd', 257});
  CHECK(e.supervised() == 3);
  auto all = text::prompt_completion_example(t, "ab", "cd", std::nullopt, false);
  CHECK(all.labels == all.ids);
  auto s = e;
  text::truncate(s, 4, text::truncation::keep_start);
  CHECK(s.ids == std::vector<token_id>{256, 'a', 'b', 'c'});
  CHECK(s.truncated);
  text::truncate(e, 2, text::truncation::keep_end);
  CHECK(e.ids == std::vector<token_id>{'d', 257});
  CHECK(e.labels == std::vector<token_id>{'d', 257});
  const auto x = text::text_example(t, "hi", token_id{257});
  CHECK(x.ids == std::vector<token_id>{256, 'h', 'i', 257});
  CHECK(x.labels == x.ids);
  // a chat: only the assistant's range (from the message given) is supervised
  const std::vector<text::chat_message> m{{"user", "U", std::nullopt},
                                          {"assistant", "A", std::nullopt}};
  const auto r = text::render_chat(text::chat_format::llama3, m, {}, "");
  const auto c = text::chat_example(t, r, std::size_t{0});
  std::string supervised;
  for (std::size_t i = 0; i < c.ids.size(); ++i)
    if (c.labels[i] != ignore_index) supervised.push_back(static_cast<char>(c.ids[i]));
  CHECK(supervised == "A<|eot_id|>");
  CHECK(text::chat_example(t, r, std::size_t{2}).supervised() == 0);  // no message from index 2
  CHECK(text::chat_example(t, r, std::nullopt).supervised() == c.size());
}
