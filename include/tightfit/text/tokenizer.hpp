// tightfit/text/tokenizer.hpp: a Hugging Face tokenizer read from tokenizer.json and
// tokenizer_config.json, encoding and decoding as transformers.js does (the oracle of
// tests/text): the byte-level BPE of Qwen2 / 2.5 / 3 and Llama 3.x (split regex, GPT-2 byte
// alphabet) and the SentencePiece-style BPE with byte fallback of Gemma 3.
//
// encode(text):
//   1. invalid UTF-8 becomes U+FFFD (WHATWG, text/utf8.hpp);
//   2. added tokens (special or not) are cut out first, longest match at the leftmost position,
//      with their lstrip / rstrip;
//   3. each piece between them: normalizer (text/normalize.hpp), pre-tokenizer (Split regexes
//      through PCRE2, text/regex.hpp; ByteLevel), BPE per word (text/bpe.hpp, with a per-thread
//      cache of the words seen);
//   4. the post-processor's template adds BOS / EOS when add_special_tokens.
// decode(ids): the decoder chain of tokenizer.json (ByteLevel; Replace, ByteFallback, Fuse),
// invalid byte sequences replaced by U+FFFD, optionally without special tokens.
// Invariants: decode(encode(x)) == x for valid UTF-8 x that the normalizer leaves unchanged and
// with add_special_tokens false; a tokenizer is immutable once loaded and may be shared by
// threads (encode_batch runs documents in parallel); anything in the files that it cannot honour
// is an error naming the file and the field, never silently ignored.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tightfit/core/error.hpp"
#include "tightfit/core/parallel.hpp"
#include "tightfit/core/types.hpp"
#include "tightfit/io/hf.hpp"
#include "tightfit/text/bpe.hpp"
#include "tightfit/text/concept.hpp"
#include "tightfit/text/normalize.hpp"
#include "tightfit/text/regex.hpp"
#include "tightfit/text/utf8.hpp"

namespace tightfit::text {

/// Options of encode.
struct encode_options {
  bool add_special_tokens = true;  ///< the post-processor's BOS / EOS (transformers.js default)
};

/// Options of decode.
struct decode_options {
  bool skip_special_tokens = false;
  bool clean_up_tokenization_spaces = false;  ///< transformers' " ." -> "." clean-up
};

/// A token added on top of the model's vocabulary (tokenizer.json "added_tokens").
struct added_token {
  std::string content;
  token_id id = 0;
  bool special = false, lstrip = false, rstrip = false;
};

namespace detail {

/// GPT-2's byte-to-unicode alphabet: the code point that stands for each byte.
inline std::array<char32_t, 256> byte_to_unicode() {
  std::array<char32_t, 256> map{};
  std::array<bool, 256> direct{};
  for (int b = '!'; b <= '~'; ++b) direct[static_cast<std::size_t>(b)] = true;
  for (int b = 0xA1; b <= 0xAC; ++b) direct[static_cast<std::size_t>(b)] = true;
  for (int b = 0xAE; b <= 0xFF; ++b) direct[static_cast<std::size_t>(b)] = true;
  char32_t next = 256;
  for (int b = 0; b < 256; ++b)
    map[static_cast<std::size_t>(b)] =
        direct[static_cast<std::size_t>(b)] ? static_cast<char32_t>(b) : next++;
  return map;
}

/// A byte-level token string (GPT-2 alphabet) as raw bytes; nullopt if a character is outside
/// the alphabet.
inline std::optional<std::string> byte_level_to_bytes(
    std::string_view s, const std::unordered_map<char32_t, int>& inv) {
  std::string out;
  for (std::size_t i = 0; i < s.size();) {
    const char32_t c = decode_utf8_at(s, i);
    const auto it = inv.find(c);
    if (it == inv.end()) return std::nullopt;
    out.push_back(static_cast<char>(it->second));
    i += utf8_length(static_cast<unsigned char>(s[i]));
  }
  return out;
}

/// transformers' clean_up_tokenization.
inline std::string clean_up_tokenization(std::string s) {
  for (const auto& [from, to] :
       std::initializer_list<std::pair<std::string_view, std::string_view>>{{" .", "."},
                                                                            {" ?", "?"},
                                                                            {" !", "!"},
                                                                            {" ,", ","},
                                                                            {" ' ", "'"},
                                                                            {" n't", "n't"},
                                                                            {" 'm", "'m"},
                                                                            {" 's", "'s"},
                                                                            {" 've", "'ve"},
                                                                            {" 're", "'re"}})
    s = replace_all(std::move(s), from, to);
  return s;
}

}  // namespace detail

/// A Hugging Face BPE tokenizer (tokenizer.json + tokenizer_config.json).
class hf_tokenizer {
 public:
  /// One step of the pre-tokenizer.
  struct pre_step {
    enum class kind { split_regex, split_string, byte_level };
    kind what = kind::split_regex;
    std::shared_ptr<const split_regex> regex;  ///< split_regex, byte_level with use_regex
    std::string literal;                       ///< split_string
    bool matches_only = false;                 ///< invert (Split) / String.match (ByteLevel)
    bool add_prefix_space = false;             ///< byte_level
  };
  /// One step of the decoder.
  struct decode_step {
    enum class kind { byte_level, replace, byte_fallback, fuse, strip };
    kind what = kind::fuse;
    std::string pattern, content;  ///< replace; strip: content
    int start = 0, stop = 0;       ///< strip
  };

  hf_tokenizer() = default;

  /// Reads `dir`/tokenizer.json and, when present, `dir`/tokenizer_config.json.
  static hf_tokenizer load(const std::filesystem::path& dir) {
    const auto json_path = dir / "tokenizer.json";
    check(io::detail::exists(json_path), dir.string(), ": no tokenizer.json");
    const auto cfg_path = dir / "tokenizer_config.json";
    nlohmann::json cfg = nlohmann::json::object();
    if (io::detail::exists(cfg_path)) cfg = io::detail::read_json_file(cfg_path);
    return from_json(io::detail::read_json_file(json_path), cfg, json_path.string(),
                     cfg_path.string());
  }

  /// Builds the tokenizer from the parsed files (`src`, `cfg_src`: names for messages).
  static hf_tokenizer from_json(const nlohmann::json& j, const nlohmann::json& cfg,
                                const std::string& src, const std::string& cfg_src) {
    hf_tokenizer t;
    t.id_ = next_id();
    check(j.is_object(), src, ": not a JSON object");
    try {
      t.parse_pre_tokenizer(j, src);  // decides byte_level, which the model needs
      t.parse_normalizer(j, src);
      t.parse_model(j, src);
      t.parse_added_tokens(j, src);
      t.parse_post_processor(j, src);
      t.parse_decoder(j, src);
    } catch (const nlohmann::json::exception& e) {  // a field of another JSON type
      fail(src, ": ", e.what());
    }
    try {
      t.parse_config(cfg, cfg_src);
    } catch (const nlohmann::json::exception& e) {
      fail(cfg_src, ": ", e.what());
    }
    return t;
  }

  /// Token ids of `text`; with `offsets`, the byte offset in sanitize_utf8(text) (== text for
  /// valid UTF-8) where each token starts (tokens the post-processor adds: 0 or text's end).
  std::vector<token_id> encode(std::string_view text, const encode_options& options = {},
                               std::vector<std::size_t>* offsets = nullptr) const {
    std::string clean;
    if (!is_valid_utf8(text)) {
      clean = sanitize_utf8(text);
      text = clean;
    }
    std::vector<token_id> ids;
    if (offsets != nullptr) offsets->clear();
    if (options.add_special_tokens) append_template(template_prefix_, 0, ids, offsets);
    auto& st = state();
    const auto sections = split_added(text);
    for (std::size_t k = 0; k < sections.size(); ++k) {
      const auto& s = sections[k];
      if (s.added >= 0) {
        ids.push_back(s.added);
        if (offsets != nullptr) offsets->push_back(s.begin);
        continue;
      }
      encode_section(text.substr(s.begin, s.end - s.begin), s.begin, st, ids, offsets);
    }
    if (options.add_special_tokens) append_template(template_suffix_, text.size(), ids, offsets);
    return ids;
  }

  /// encode over many documents, in parallel (core/parallel.hpp); results in input order.
  std::vector<std::vector<token_id>> encode_batch(std::span<const std::string> texts,
                                                  const encode_options& options = {}) const {
    std::vector<std::vector<token_id>> out(texts.size());
    parallel_for(0, static_cast<index_t>(texts.size()), 16, [&](index_t i0, index_t i1) {
      for (index_t i = i0; i < i1; ++i)
        out[static_cast<std::size_t>(i)] = encode(texts[static_cast<std::size_t>(i)], options);
    });
    return out;
  }

  /// The text of `ids` through the decoder chain; an id outside [0, vocab_size()) is an error.
  std::string decode(std::span<const token_id> ids, const decode_options& options = {}) const {
    struct piece {
      std::string text;
      bool added;
    };
    std::vector<piece> toks;
    toks.reserve(ids.size());
    for (const token_id id : ids) {
      check(id >= 0 && id < vocab_size(), "decode: token id ", id, " is outside [0, ", vocab_size(),
            ")");
      const auto& e = id_to_token_[static_cast<std::size_t>(id)];
      if (options.skip_special_tokens && e.special) continue;
      toks.push_back({e.text, e.added});
    }
    std::vector<std::string> cur;
    bool byte_level_done = false;
    std::string result;
    if (decoders_.empty()) {  // transformers.js: tokens joined with a space
      for (std::size_t i = 0; i < toks.size(); ++i) result += (i ? " " : "") + toks[i].text;
    } else {
      for (const auto& t : toks) cur.push_back(t.text);
      for (const auto& d : decoders_) {
        switch (d.what) {
          case decode_step::kind::byte_level: {
            std::vector<std::string> next;
            std::string run;
            bool in_run = false;
            for (std::size_t i = 0; i < cur.size(); ++i) {
              if (toks[i].added) {
                if (in_run) next.push_back(sanitize_utf8(run));
                run.clear();
                in_run = false;
                next.push_back(cur[i]);
              } else {
                run += cur[i];
                in_run = true;
              }
            }
            if (in_run) next.push_back(sanitize_utf8(run));
            cur = std::move(next);
            byte_level_done = true;
            break;
          }
          case decode_step::kind::replace:
            for (auto& s : cur) s = detail::replace_all(std::move(s), d.pattern, d.content);
            break;
          case decode_step::kind::byte_fallback: {
            std::vector<std::string> next;
            std::string bytes;
            for (auto& s : cur) {
              const int b = byte_token(s);
              if (b >= 0) {
                bytes.push_back(static_cast<char>(b));
                continue;
              }
              if (!bytes.empty()) next.push_back(sanitize_utf8(bytes));
              bytes.clear();
              next.push_back(std::move(s));
            }
            if (!bytes.empty()) next.push_back(sanitize_utf8(bytes));
            cur = std::move(next);
            break;
          }
          case decode_step::kind::fuse: {
            std::string all;
            for (const auto& s : cur) all += s;
            cur.assign(1, std::move(all));
            break;
          }
          case decode_step::kind::strip:
            for (auto& s : cur) {
              std::size_t b = 0, e = s.size();
              for (int k = 0; k < d.start && s.compare(b, d.content.size(), d.content) == 0; ++k)
                b += d.content.size();
              for (int k = 0; k < d.stop && e >= b + d.content.size() &&
                              s.compare(e - d.content.size(), d.content.size(), d.content) == 0;
                   ++k)
                e -= d.content.size();
              s = s.substr(b, e - b);
            }
            break;
        }
      }
      for (const auto& s : cur) result += s;
    }
    if (!byte_level_done) result = sanitize_utf8(result);
    if (options.clean_up_tokenization_spaces) result = detail::clean_up_tokenization(result);
    return result;
  }

  /// One past the largest token id (model vocabulary and added tokens).
  index_t vocab_size() const { return static_cast<index_t>(id_to_token_.size()); }

  /// The id of `token` (an added token's content or a vocabulary entry as tokenizer.json writes
  /// it), or nullopt.
  std::optional<token_id> token_to_id(std::string_view token) const {
    const auto a = added_index_.find(std::string(token));
    if (a != added_index_.end()) return added_[a->second].id;
    std::string model_space(token);
    if (model_.byte_level) {
      const auto bytes = detail::byte_level_to_bytes(token, unicode_to_byte());
      if (!bytes) return std::nullopt;
      model_space = *bytes;
    }
    const std::int32_t id = model_.find(model_space);
    if (id < 0) return std::nullopt;
    return id;
  }

  /// The token string of `id` as tokenizer.json writes it (added tokens: their content).
  std::string id_to_token(token_id id) const {
    check(id >= 0 && id < vocab_size(), "token id ", id, " is outside [0, ", vocab_size(), ")");
    return id_to_token_[static_cast<std::size_t>(id)].name;
  }

  /// Whether `id` is a special token (an added token marked special, or one of
  /// tokenizer_config.json's additional_special_tokens).
  bool is_special(token_id id) const {
    return id >= 0 && id < vocab_size() && id_to_token_[static_cast<std::size_t>(id)].special;
  }

  const std::vector<added_token>& added_tokens() const { return added_; }
  /// tokenizer_config.json's tokens (empty when absent) and the chat template ("" when none).
  const std::string& bos_token() const { return bos_; }
  const std::string& eos_token() const { return eos_; }
  const std::string& pad_token() const { return pad_; }
  const std::string& chat_template() const { return chat_template_; }
  /// The id of a configured token string (bos_token() ...), or nullopt when empty / unknown.
  std::optional<token_id> id_of(const std::string& token) const {
    if (token.empty()) return std::nullopt;
    return token_to_id(token);
  }
  bool byte_level() const { return model_.byte_level; }

 private:
  struct token_entry {
    std::string text;  ///< what the decoder starts from (raw bytes for byte-level tokens)
    std::string name;  ///< as tokenizer.json writes it
    bool added = false, special = false;
  };
  struct section {
    std::size_t begin, end;
    token_id added;  ///< -1: text to tokenize
  };
  struct thread_state {
    std::uint64_t owner = 0;
    std::vector<std::shared_ptr<const split_regex>> keep;         // the regexes the matchers use
    std::vector<std::unique_ptr<split_regex::matcher>> matchers;  // one per pre_step
    bpe_workspace ws;
    std::unordered_map<std::string, std::pair<std::uint32_t, std::uint32_t>, string_hash,
                       std::equal_to<>>
        cache;
    std::vector<word_token> arena;  // cached words' tokens
    std::vector<word_token> scratch;
  };

  static std::uint64_t next_id() {
    static std::atomic<std::uint64_t> counter{0};
    return ++counter;
  }

  static const std::unordered_map<char32_t, int>& unicode_to_byte() {
    static const std::unordered_map<char32_t, int> inv = [] {
      std::unordered_map<char32_t, int> m;
      const auto map = detail::byte_to_unicode();
      for (int b = 0; b < 256; ++b) m[map[static_cast<std::size_t>(b)]] = b;
      return m;
    }();
    return inv;
  }

  /// This thread's matching state for this tokenizer (a few tokenizers per thread are kept).
  thread_state& state() const {
    thread_local std::vector<std::unique_ptr<thread_state>> states;
    for (auto& s : states)
      if (s->owner == id_) return *s;
    if (states.size() >= 4) states.erase(states.begin());
    auto s = std::make_unique<thread_state>();
    s->owner = id_;
    for (const auto& p : pre_) {
      if (p.regex) {
        s->keep.push_back(p.regex);
        s->matchers.push_back(std::make_unique<split_regex::matcher>(*p.regex));
      } else {
        s->matchers.push_back(nullptr);
      }
    }
    states.push_back(std::move(s));
    return *states.back();
  }

  /// Cuts `text` at the added tokens (longest match, leftmost first), applying lstrip / rstrip.
  std::vector<section> split_added(std::string_view text) const {
    std::vector<section> out;
    std::size_t start = 0, i = 0;
    while (i < text.size()) {
      const auto c = static_cast<unsigned char>(text[i]);
      std::int32_t match = -1;
      std::size_t match_len = 0;
      if (added_first_[c]) {
        // trie walk
        std::int32_t node = 0;
        for (std::size_t j = i; j < text.size(); ++j) {
          const auto& edges = trie_[static_cast<std::size_t>(node)].next;
          const auto it = edges.find(static_cast<unsigned char>(text[j]));
          if (it == edges.end()) break;
          node = it->second;
          if (trie_[static_cast<std::size_t>(node)].token >= 0) {
            match = trie_[static_cast<std::size_t>(node)].token;
            match_len = j + 1 - i;
          }
        }
      }
      if (match < 0) {
        ++i;
        continue;
      }
      if (i > start) out.push_back({start, i, -1});
      out.push_back({i, i + match_len, match});
      i += match_len;
      start = i;
    }
    if (start < text.size()) out.push_back({start, text.size(), -1});
    // lstrip / rstrip: the neighbouring text loses its trailing / leading JavaScript white space
    for (std::size_t k = 0; k < out.size(); ++k) {
      if (out[k].added < 0) continue;
      const auto& tok = added_[added_by_id_.at(out[k].added)];
      if (tok.lstrip && k > 0 && out[k - 1].added < 0) {
        auto& p = out[k - 1];
        while (p.end > p.begin) {
          std::size_t b = p.end - 1;
          while (b > p.begin && (static_cast<unsigned char>(text[b]) & 0xC0) == 0x80) --b;
          if (!is_js_space(decode_utf8_at(text, b))) break;
          p.end = b;
        }
      }
      if (tok.rstrip && k + 1 < out.size() && out[k + 1].added < 0) {
        auto& p = out[k + 1];
        while (p.begin < p.end && is_js_space(decode_utf8_at(text, p.begin)))
          p.begin += utf8_length(static_cast<unsigned char>(text[p.begin]));
      }
    }
    return out;
  }

  void append_template(const std::vector<token_id>& t, std::size_t at, std::vector<token_id>& ids,
                       std::vector<std::size_t>* offsets) const {
    for (const token_id id : t) {
      ids.push_back(id);
      if (offsets != nullptr) offsets->push_back(at);
    }
  }

  /// Normalizer, pre-tokenizer and BPE over one piece of text between added tokens.
  void encode_section(std::string_view raw, std::size_t base, thread_state& st,
                      std::vector<token_id>& ids, std::vector<std::size_t>* offsets) const {
    if (raw.empty()) return;
    std::string normalized;
    std::vector<std::uint32_t> align;
    std::string_view text = raw;
    const bool aligned = offsets != nullptr && !normalizer_.empty();
    if (!normalizer_.empty()) {
      normalized = normalize(raw, normalizer_, aligned ? &align : nullptr, 0);
      text = normalized;
    }
    if (text.empty()) return;
    auto source = [&](std::size_t k) -> std::size_t {
      if (!aligned) return base + k;
      return base + (k < align.size() ? align[k] : raw.size());
    };
    // pieces: (view, offset in text); prefix spaces live in `owned`
    struct piece {
      std::string_view s;
      std::size_t at;
    };
    std::vector<piece> pieces{{text, 0}}, next;
    std::deque<std::string> owned;
    for (std::size_t k = 0; k < pre_.size(); ++k) {
      const auto& p = pre_[k];
      next.clear();
      for (const auto& pc : pieces) {
        switch (p.what) {
          case pre_step::kind::split_regex:
            st.matchers[k]->split(pc.s, p.matches_only, [&](std::size_t b, std::size_t e, bool) {
              next.push_back({pc.s.substr(b, e - b), pc.at + b});
            });
            break;
          case pre_step::kind::split_string: {
            std::size_t b = 0;
            while (b < pc.s.size()) {
              const std::size_t hit = pc.s.find(p.literal, b);
              if (hit == std::string_view::npos) break;
              if (hit > b) next.push_back({pc.s.substr(b, hit - b), pc.at + b});
              next.push_back({pc.s.substr(hit, p.literal.size()), pc.at + hit});
              b = hit + p.literal.size();
            }
            if (b < pc.s.size()) next.push_back({pc.s.substr(b), pc.at + b});
            break;
          }
          case pre_step::kind::byte_level: {
            std::string_view s = pc.s;
            std::size_t at = pc.at;
            if (p.add_prefix_space && (s.empty() || s[0] != ' ')) {
              owned.emplace_back(1, ' ');
              owned.back() += s;
              s = owned.back();
            }
            if (p.regex) {
              st.matchers[k]->split(s, true, [&](std::size_t b, std::size_t e, bool) {
                next.push_back({s.substr(b, e - b), at + (b > 0 ? b - 1 : 0)});
              });
            } else {
              next.push_back({s, at});
            }
            break;
          }
        }
      }
      pieces.swap(next);
    }
    bool last_unk = false;  // fuse_unk: over the words of the section, as transformers.js
    for (const auto& pc : pieces) {
      for (const auto& t : word_tokens(pc.s, st)) {
        const bool unk = t.id == model_.unk_id;
        if (unk && last_unk && model_.fuse_unk) continue;
        last_unk = unk;
        ids.push_back(t.id);
        if (offsets != nullptr) offsets->push_back(source(pc.at + t.begin));
      }
    }
  }

  /// The tokens of one word, through this thread's cache (words under 256 bytes).
  std::span<const word_token> word_tokens(std::string_view w, thread_state& st) const {
    const bool cacheable = w.size() < 256;
    if (cacheable) {
      const auto it = st.cache.find(w);
      if (it != st.cache.end())
        return std::span<const word_token>(st.arena).subspan(it->second.first, it->second.second);
    }
    st.scratch.clear();
    bool prev_unk = false;
    model_.encode_word(w, st.scratch, st.ws, prev_unk);
    if (!cacheable) return st.scratch;
    if (st.arena.size() > (std::size_t{1} << 22)) {
      st.arena.clear();
      st.cache.clear();
    }
    const auto first = static_cast<std::uint32_t>(st.arena.size());
    st.arena.insert(st.arena.end(), st.scratch.begin(), st.scratch.end());
    st.cache.emplace(std::string(w),
                     std::make_pair(first, static_cast<std::uint32_t>(st.scratch.size())));
    return st.scratch;
  }

  static int byte_token(std::string_view s) {
    if (s.size() != 6 || s.substr(0, 3) != "<0x" || s[5] != '>') return -1;
    int v = 0;
    for (int k = 3; k < 5; ++k) {
      const char c = s[static_cast<std::size_t>(k)];
      int d = -1;
      if (c >= '0' && c <= '9') d = c - '0';
      if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
      if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
      if (d < 0) return -1;
      v = v * 16 + d;
    }
    return v;
  }

  // ---- loading ------------------------------------------------------------------------------
  static std::string string_field(const nlohmann::json& j, const char* key, const std::string& src,
                                  const std::string& where) {
    check(j.is_object() && j.contains(key) && j[key].is_string(), src, ": ", where, ".", key,
          " must be a string");
    return j[key].get<std::string>();
  }
  static bool bool_field(const nlohmann::json& j, const char* key, bool fallback,
                         const std::string& src, const std::string& where) {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    check(j[key].is_boolean(), src, ": ", where, ".", key, " is not a boolean");
    return j[key].get<bool>();
  }
  /// "pattern": {"String": s} or {"Regex": r}: (is_regex, text).
  static std::pair<bool, std::string> pattern_of(const nlohmann::json& j, const std::string& src,
                                                 const std::string& where) {
    check(j.contains("pattern") && j["pattern"].is_object(), src, ": ", where,
          ".pattern must be an object");
    const auto& p = j["pattern"];
    if (p.contains("String") && p["String"].is_string())
      return {false, p["String"].get<std::string>()};
    if (p.contains("Regex") && p["Regex"].is_string()) return {true, p["Regex"].get<std::string>()};
    fail(src, ": ", where, ".pattern must hold a String or a Regex");
  }

  /// Calls add(item, where) for the component `key` of `j` (absent or null: nothing) or, when
  /// it is a Sequence, for each item of its `list`, recursively.
  template <class Add>
  static void each_component(const nlohmann::json& j, const char* key, const char* list,
                             const std::string& src, Add&& add) {
    if (!j.contains(key) || j[key].is_null()) return;
    each_item(j[key], list, src, key, add);
  }
  template <class Add>
  static void each_item(const nlohmann::json& j, const char* list, const std::string& src,
                        const std::string& where, Add& add) {
    if (string_field(j, "type", src, where) != "Sequence") {
      add(j, where);
      return;
    }
    check(j.contains(list) && j[list].is_array(), src, ": ", where, ".", list, " must be an array");
    for (std::size_t k = 0; k < j[list].size(); ++k)
      each_item(j[list][k], list, src, where + "." + list + "[" + std::to_string(k) + "]", add);
  }

  void parse_normalizer(const nlohmann::json& j, const std::string& src) {
    each_component(
        j, "normalizer", "normalizers", src,
        [&](const nlohmann::json& n, const std::string& where) { add_normalizer(n, src, where); });
  }
  void add_normalizer(const nlohmann::json& n, const std::string& src, const std::string& where) {
    const std::string type = string_field(n, "type", src, where);
    if (type == "NFC") {
      normalizer_.push_back({normalizer_step::kind::nfc, "", ""});
    } else if (type == "Replace") {
      const auto [regex, pattern] = pattern_of(n, src, where);
      check(!regex, src, ": ", where,
            ": a Replace normalizer with a Regex pattern is not supported");
      normalizer_.push_back(
          {normalizer_step::kind::replace, pattern, string_field(n, "content", src, where)});
    } else {
      fail(src, ": ", where, ".type '", type,
           "' is not supported (supported: NFC, Replace, Sequence)");
    }
  }

  void parse_pre_tokenizer(const nlohmann::json& j, const std::string& src) {
    each_component(
        j, "pre_tokenizer", "pretokenizers", src,
        [&](const nlohmann::json& p, const std::string& where) { add_pre(p, src, where); });
  }
  void add_pre(const nlohmann::json& p, const std::string& src, const std::string& where) {
    const std::string type = string_field(p, "type", src, where);
    if (type == "Split") {
      const auto [regex, pattern] = pattern_of(p, src, where);
      std::string behavior = p.contains("behavior") && p["behavior"].is_string()
                                 ? p["behavior"].get<std::string>()
                                 : "Isolated";
      check(behavior != "Removed", src, ": ", where, ".behavior 'Removed' is not supported");
      pre_step s;
      s.matches_only = bool_field(p, "invert", false, src, where);
      if (regex) {
        s.what = pre_step::kind::split_regex;
        try {
          s.regex = std::make_shared<const split_regex>(pattern);
        } catch (const error& e) {
          fail(src, ": ", where, ": ", e.what());
        }
      } else {
        check(!pattern.empty(), src, ": ", where, ".pattern.String is empty");
        check(!s.matches_only, src, ": ", where, ": an inverted String split is not supported");
        s.what = pre_step::kind::split_string;
        s.literal = pattern;
      }
      pre_.push_back(std::move(s));
    } else if (type == "ByteLevel") {
      pre_step s;
      s.what = pre_step::kind::byte_level;
      s.add_prefix_space = bool_field(p, "add_prefix_space", false, src, where);
      if (bool_field(p, "use_regex", true, src, where))
        s.regex = std::make_shared<const split_regex>(
            "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+");
      pre_.push_back(std::move(s));
      model_.byte_level = true;
    } else {
      fail(src, ": ", where, ".type '", type,
           "' is not supported (supported: Split, ByteLevel, Sequence)");
    }
  }

  void parse_model(const nlohmann::json& j, const std::string& src) {
    check(j.contains("model") && j["model"].is_object(), src, ": no \"model\" object");
    const auto& m = j["model"];
    const std::string type =
        m.contains("type") && m["type"].is_string() ? m["type"].get<std::string>() : "";
    check(type == "BPE", src, ": model.type '", type, "' is not supported (supported: BPE)");
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
      check(!m.contains(key) || m[key].is_null() ||
                (m[key].is_string() && m[key].get<std::string>().empty()),
            src, ": model.", key, " is not supported");
    check(!m.contains("dropout") || m["dropout"].is_null() ||
              (m["dropout"].is_number() && m["dropout"].get<double>() == 0.0),
          src, ": model.dropout is not supported");
    model_.byte_fallback = bool_field(m, "byte_fallback", false, src, "model");
    model_.ignore_merges = bool_field(m, "ignore_merges", false, src, "model");
    model_.fuse_unk = bool_field(m, "fuse_unk", false, src, "model");
    check(m.contains("vocab") && m["vocab"].is_object(), src, ": model.vocab must be an object");
    const auto& inv = unicode_to_byte();
    std::int32_t max_id = -1;
    model_.vocab.reserve(m["vocab"].size());
    std::vector<std::pair<std::int32_t, std::string>> names;
    names.reserve(m["vocab"].size());
    for (const auto& [tok, idj] : m["vocab"].items()) {
      check(idj.is_number_integer(), src, ": model.vocab[\"", tok, "\"] is not an integer");
      const auto id = idj.get<std::int64_t>();
      check(id >= 0 && id < (std::int64_t{1} << 30), src, ": model.vocab[\"", tok, "\"] is ", id,
            ", expected an id in [0, 2^30)");
      std::string key = tok;
      if (model_.byte_level) {
        auto bytes = detail::byte_level_to_bytes(tok, inv);
        // a token outside the byte alphabet can never be produced: keep its UTF-8 for decode
        if (bytes) key = std::move(*bytes);
      }
      model_.vocab.emplace(key, static_cast<std::int32_t>(id));
      names.emplace_back(static_cast<std::int32_t>(id), tok);
      max_id = std::max(max_id, static_cast<std::int32_t>(id));
    }
    // ids are dense in every real vocabulary: a sparse one would cost memory for nothing
    check(static_cast<std::size_t>(max_id) < m["vocab"].size() + max_id_gap, src,
          ": model.vocab has an id of ", max_id, " for ", m["vocab"].size(), " tokens");
    id_to_token_.resize(static_cast<std::size_t>(max_id + 1));
    for (const auto& [tok, id] : model_.vocab)
      id_to_token_[static_cast<std::size_t>(id)].text = tok;
    for (auto& [id, name] : names)
      id_to_token_[static_cast<std::size_t>(id)].name = std::move(name);
    if (model_.byte_level) {
      const auto map = detail::byte_to_unicode();
      for (int b = 0; b < 256; ++b) {
        std::string one(1, static_cast<char>(b));
        model_.byte_ids[b] = model_.find(one);
        std::string shown;
        append_utf8(shown, map[static_cast<std::size_t>(b)]);
        check(model_.byte_ids[b] >= 0, src, ": the byte-level vocabulary has no token '", shown,
              "' for byte ", b);
      }
    }
    if (model_.byte_fallback)
      for (int b = 0; b < 256; ++b) {
        char name[8];
        std::snprintf(name, sizeof name, "<0x%02X>", b);
        model_.byte_fallback_ids[b] = model_.find(name);
      }
    if (m.contains("unk_token") && m["unk_token"].is_string()) {
      model_.unk_id = model_.find(m["unk_token"].get<std::string>());
      check(model_.unk_id >= 0, src, ": model.unk_token '", m["unk_token"].get<std::string>(),
            "' is not in the vocabulary");
    }
    check(m.contains("merges") && m["merges"].is_array(), src, ": model.merges must be an array");
    const auto& merges = m["merges"];
    model_.merges.reserve(merges.size());
    for (std::size_t r = 0; r < merges.size(); ++r) {
      const auto& e = merges[r];
      std::string a, b;
      if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
        a = e[0].get<std::string>();
        b = e[1].get<std::string>();
      } else if (e.is_string()) {  // "a b" (tokenizers < 0.20): split at the first space
        const std::string s = e.get<std::string>();
        const std::size_t sp = s.find(' ');
        check(sp != std::string::npos, src, ": model.merges[", r, "] '", s, "' has no space");
        a = s.substr(0, sp);
        const std::size_t sp2 = s.find(' ', sp + 1);
        b = s.substr(sp + 1, sp2 == std::string::npos ? std::string::npos : sp2 - sp - 1);
      } else {
        fail(src, ": model.merges[", r, "] is neither \"a b\" nor [a, b]");
      }
      std::string merged = a + b;
      auto to_model = [&](std::string& s) {
        if (!model_.byte_level) return;
        auto bytes = detail::byte_level_to_bytes(s, inv);
        check(bytes.has_value(), src, ": model.merges[", r, "]: '", s,
              "' is outside the byte-level alphabet");
        s = std::move(*bytes);
      };
      to_model(a);
      to_model(b);
      to_model(merged);
      const auto ia = model_.find(a), ib = model_.find(b), im = model_.find(merged);
      check(ia >= 0 && ib >= 0 && im >= 0, src, ": model.merges[", r,
            "]: a part or the result is not in the vocabulary (not supported)");
      model_.merges.set(ia, ib, static_cast<std::int32_t>(r), im);
    }
  }

  void parse_added_tokens(const nlohmann::json& j, const std::string& src) {
    trie_.assign(1, trie_node{});
    if (!j.contains("added_tokens") || j["added_tokens"].is_null()) return;
    check(j["added_tokens"].is_array(), src, ": added_tokens must be an array");
    const auto& list = j["added_tokens"];
    for (std::size_t k = 0; k < list.size(); ++k) {
      const auto& a = list[k];
      const std::string where = "added_tokens[" + std::to_string(k) + "]";
      added_token t;
      t.content = string_field(a, "content", src, where);
      check(!t.content.empty(), src, ": ", where, ".content is empty");
      check(a.contains("id") && a["id"].is_number_integer(), src, ": ", where,
            ".id must be an integer");
      t.id = a["id"].get<std::int64_t>();
      check(t.id >= 0 && t.id < (std::int64_t{1} << 30), src, ": ", where, ".id is ", t.id,
            ", expected an id in [0, 2^30)");
      t.special = bool_field(a, "special", false, src, where);
      t.lstrip = bool_field(a, "lstrip", false, src, where);
      t.rstrip = bool_field(a, "rstrip", false, src, where);
      check(!bool_field(a, "single_word", false, src, where), src, ": ", where,
            ".single_word is not supported");
      check(static_cast<std::size_t>(t.id) < id_to_token_.size() + max_id_gap, src, ": ", where,
            ".id is ", t.id, ", far past the ", id_to_token_.size(), " ids before it");
      if (static_cast<std::size_t>(t.id) >= id_to_token_.size())
        id_to_token_.resize(static_cast<std::size_t>(t.id) + 1);
      auto& e = id_to_token_[static_cast<std::size_t>(t.id)];
      e.text = t.content;
      e.name = t.content;
      e.added = true;
      e.special = t.special;
      added_by_id_[t.id] = added_.size();
      added_index_[t.content] = added_.size();
      // trie over the content's bytes (a later token with the same content replaces it)
      std::int32_t node = 0;
      for (const char c : t.content) {
        auto& edges = trie_[static_cast<std::size_t>(node)].next;
        const auto it = edges.find(static_cast<unsigned char>(c));
        if (it != edges.end()) {
          node = it->second;
        } else {
          const auto fresh = static_cast<std::int32_t>(trie_.size());
          edges.emplace(static_cast<unsigned char>(c), fresh);
          trie_.push_back(trie_node{});
          node = fresh;
        }
      }
      trie_[static_cast<std::size_t>(node)].token = static_cast<std::int32_t>(t.id);
      added_first_[static_cast<unsigned char>(t.content[0])] = true;
      added_.push_back(std::move(t));
    }
  }

  void parse_post_processor(const nlohmann::json& j, const std::string& src) {
    each_component(
        j, "post_processor", "processors", src,
        [&](const nlohmann::json& p, const std::string& where) { add_post(p, src, where); });
  }
  void add_post(const nlohmann::json& p, const std::string& src, const std::string& where) {
    const std::string type = string_field(p, "type", src, where);
    if (type == "ByteLevel") {
      // offsets only: nothing to do for ids
    } else if (type == "TemplateProcessing") {
      check(p.contains("single") && p["single"].is_array(), src, ": ", where,
            ".single must be an array");
      const auto& specials = p.contains("special_tokens") ? p["special_tokens"] : nlohmann::json{};
      template_prefix_.clear();
      template_suffix_.clear();
      bool seen_a = false;
      for (const auto& item : p["single"]) {
        if (item.contains("Sequence")) {
          seen_a = true;
          continue;
        }
        check(item.contains("SpecialToken") && item["SpecialToken"].contains("id"), src, ": ",
              where, ".single holds an item that is neither Sequence nor SpecialToken");
        const std::string name = item["SpecialToken"]["id"].get<std::string>();
        check(specials.is_object() && specials.contains(name) && specials[name].contains("ids"),
              src, ": ", where, ".special_tokens has no '", name, "'");
        for (const auto& id : specials[name]["ids"])
          (seen_a ? template_suffix_ : template_prefix_).push_back(id.get<std::int64_t>());
      }
    } else {
      fail(src, ": ", where, ".type '", type,
           "' is not supported (supported: TemplateProcessing, ByteLevel, Sequence)");
    }
  }

  void parse_decoder(const nlohmann::json& j, const std::string& src) {
    each_component(
        j, "decoder", "decoders", src,
        [&](const nlohmann::json& d, const std::string& where) { add_decoder(d, src, where); });
  }
  void add_decoder(const nlohmann::json& d, const std::string& src, const std::string& where) {
    const std::string type = string_field(d, "type", src, where);
    decode_step s;
    if (type == "ByteLevel") {
      check(model_.byte_level, src, ": ", where,
            ": a ByteLevel decoder without a ByteLevel pre-tokenizer is not supported");
      s.what = decode_step::kind::byte_level;
    } else if (type == "Replace") {
      const auto [regex, pattern] = pattern_of(d, src, where);
      check(!regex, src, ": ", where, ": a Replace decoder with a Regex pattern is not supported");
      s.what = decode_step::kind::replace;
      s.pattern = pattern;
      s.content = string_field(d, "content", src, where);
    } else if (type == "ByteFallback") {
      s.what = decode_step::kind::byte_fallback;
    } else if (type == "Fuse") {
      s.what = decode_step::kind::fuse;
    } else if (type == "Strip") {
      s.what = decode_step::kind::strip;
      s.content = string_field(d, "content", src, where);
      s.start = d.value("start", 0);
      s.stop = d.value("stop", 0);
    } else {
      fail(src, ": ", where, ".type '", type,
           "' is not supported (supported: ByteLevel, Replace, ByteFallback, Fuse, Strip, "
           "Sequence)");
    }
    check(model_.byte_level == (s.what == decode_step::kind::byte_level) || !model_.byte_level, src,
          ": ", where, ": only a ByteLevel decoder is supported for a byte-level model");
    decoders_.push_back(std::move(s));
  }

  static std::string token_string(const nlohmann::json& cfg, const char* key,
                                  const std::string& src) {
    if (!cfg.contains(key) || cfg[key].is_null()) return "";
    const auto& v = cfg[key];
    if (v.is_string()) return v.get<std::string>();
    if (v.is_object() && v.contains("content") && v["content"].is_string())
      return v["content"].get<std::string>();
    fail(src, ": ", key, " must be a string or an AddedToken object");
  }

  void parse_config(const nlohmann::json& cfg, const std::string& src) {
    check(cfg.is_object(), src, ": not a JSON object");
    for (const char* key : {"remove_space", "do_lowercase_and_remove_accent"})
      check(!bool_field(cfg, key, false, src, "tokenizer_config"), src, ": ", key,
            " is not supported");
    bos_ = token_string(cfg, "bos_token", src);
    eos_ = token_string(cfg, "eos_token", src);
    pad_ = token_string(cfg, "pad_token", src);
    if (pad_.empty()) pad_ = eos_;  // transformers.js: pad_token, else eos_token
    if (cfg.contains("additional_special_tokens") && cfg["additional_special_tokens"].is_array())
      for (const auto& a : cfg["additional_special_tokens"]) {
        const std::string s =
            a.is_string() ? a.get<std::string>() : a.value("content", std::string());
        for (auto& e : id_to_token_)
          if (e.name == s && e.added) e.special = true;
      }
    if (cfg.contains("chat_template") && !cfg["chat_template"].is_null()) {
      const auto& c = cfg["chat_template"];
      if (c.is_string()) {
        chat_template_ = c.get<std::string>();
      } else if (c.is_array()) {
        for (const auto& e : c)
          if (e.value("name", std::string()) == "default")
            chat_template_ = e.value("template", std::string());
      } else {
        fail(src, ": chat_template must be a string or a list of named templates");
      }
    }
  }

  /// How far past the ids already known a new one may lie (vocabularies are dense).
  static constexpr std::size_t max_id_gap = 65536;

  struct trie_node {
    std::map<unsigned char, std::int32_t> next;
    std::int32_t token = -1;
  };

  std::uint64_t id_ = 0;
  std::vector<normalizer_step> normalizer_;
  std::vector<pre_step> pre_;
  bpe_model model_;
  std::vector<token_entry> id_to_token_;
  std::vector<added_token> added_;
  std::unordered_map<token_id, std::size_t> added_by_id_;
  std::unordered_map<std::string, std::size_t> added_index_;
  std::vector<trie_node> trie_;
  bool added_first_[256] = {};
  std::vector<token_id> template_prefix_, template_suffix_;
  std::vector<decode_step> decoders_;
  std::string bos_, eos_, pad_, chat_template_;
};

static_assert(Tokenizer<hf_tokenizer>);

}  // namespace tightfit::text
