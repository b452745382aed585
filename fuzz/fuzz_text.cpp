// libFuzzer target: text/ on untrusted input. The first byte picks what the rest is:
//  - even: text for a fixed byte-level BPE tokenizer (GPT-2's split regex through PCRE2, NFC,
//    added tokens): encode must give ids in range and non-decreasing offsets, and decode must give
//    back the text as sanitize_utf8 and NFC leave it;
//  - odd: a tokenizer.json, read by hf_tokenizer::from_json: it throws tightfit::error or yields a
//    tokenizer that encodes and decodes a fixed text.
// Any other exception, a sanitizer report, a leak or a timeout is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "tightfit/text/tokenizer.hpp"

namespace {

const tightfit::text::hf_tokenizer& fixed_tokenizer() {
  static const tightfit::text::hf_tokenizer tok = [] {
    using nlohmann::json;
    json vocab = json::object();
    const auto map = tightfit::text::detail::byte_to_unicode();
    for (int b = 0; b < 256; ++b) {
      std::string s;
      tightfit::text::append_utf8(s, map[static_cast<std::size_t>(b)]);
      vocab[s] = b;
    }
    vocab["in"] = 256;
    vocab["Ġt"] = 257;
    vocab["Ġth"] = 258;
    const json j = {
        {"normalizer", {{"type", "NFC"}}},
        {"model",
         {{"type", "BPE"},
          {"vocab", vocab},
          {"merges", json::array({json::array({"i", "n"}), json::array({"Ġ", "t"}),
                                  json::array({"Ġt", "h"})})}}},
        {"pre_tokenizer",
         {{"type", "Sequence"},
          {"pretokenizers",
           json::array(
               {{{"type", "Split"},
                 {"pattern",
                  {{"Regex",
                    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
                    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}}},
                 {"behavior", "Isolated"}},
                {{"type", "ByteLevel"}, {"use_regex", false}}})}}},
        {"decoder", {{"type", "ByteLevel"}}},
        {"added_tokens", json::array({{{"id", 259}, {"content", "<|end|>"}, {"special", true}}})}};
    return tightfit::text::hf_tokenizer::from_json(j, json::object(), "fuzz", "fuzz");
  }();
  return tok;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0) {
    const auto& tok = fixed_tokenizer();
    std::vector<std::size_t> offsets;
    const auto ids = tok.encode(rest, {}, &offsets);
    if (offsets.size() != ids.size()) std::abort();
    for (std::size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] < 0 || ids[i] >= tok.vocab_size()) std::abort();
      if (i > 0 && offsets[i] < offsets[i - 1]) std::abort();
    }
    const std::string want =
        tightfit::text::normalize(tightfit::text::sanitize_utf8(rest),
                                  {{tightfit::text::normalizer_step::kind::nfc, "", ""}});
    if (tok.decode(ids) != want) std::abort();
    return 0;
  }
  try {
    const auto j = nlohmann::json::parse(rest);
    const auto tok =
        tightfit::text::hf_tokenizer::from_json(j, nlohmann::json::object(), "fuzz", "fuzz");
    (void)tok.decode(tok.encode("fuzz text, 123 <|end|>"));
  } catch (const tightfit::error&) {
  } catch (const nlohmann::json::exception&) {  // not JSON, or a field of the wrong JSON type
  }
  return 0;
}
