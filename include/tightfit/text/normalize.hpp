// tightfit/text/normalize.hpp: the normalizers of tokenizer.json that the supported models use:
// NFC (utf8proc; Qwen2 / Qwen3), Replace with a string pattern (Gemma's " " -> "▁") and a
// Sequence of them. Each maps valid UTF-8 to valid UTF-8 and can report, for every output byte,
// the offset of the input byte it came from (an alignment), so that tokens can be located in
// the text the user gave (assistant spans of a chat, docs/data.md).
//
// NFC is applied chunk by chunk: a chunk is an ASCII character and the non-ASCII characters
// that follow it. An ASCII character never composes with what precedes it and is a starter, so
// NFC(a + b) == NFC(a) + NFC(b) at every chunk boundary; chunks made of characters below U+0300
// only (no combining marks, nothing that decomposes differently) are copied unchanged, so ASCII
// and Latin-1 text never reaches utf8proc. Offsets are exact at chunk boundaries; inside a chunk
// that NFC changed, every byte maps to the chunk's start.
#pragma once

#include <utf8proc.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tightfit/core/error.hpp"
#include "tightfit/text/utf8.hpp"

namespace tightfit::text {

/// One normalization step of tokenizer.json's "normalizer".
struct normalizer_step {
  enum class kind { nfc, replace };
  kind what = kind::nfc;
  std::string pattern, content;  ///< replace: every occurrence of pattern becomes content
};

namespace detail {

/// NFC of one chunk (valid UTF-8) through utf8proc; throws naming utf8proc's error.
inline void nfc_chunk(std::string_view chunk, std::string& out) {
  utf8proc_uint8_t* mapped = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(chunk.data()),
                   static_cast<utf8proc_ssize_t>(chunk.size()), &mapped,
                   static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  const std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owner(mapped, &std::free);
  check(n >= 0, "NFC normalization failed: ", utf8proc_errmsg(n));
  out.append(reinterpret_cast<const char*>(mapped), static_cast<std::size_t>(n));
}

/// Appends NFC(in) to out; align (when given) receives the input offset of each output byte.
inline void nfc(std::string_view in, std::string& out, std::vector<std::uint32_t>* align,
                std::uint32_t base) {
  std::size_t i = 0;
  while (i < in.size()) {
    // the chunk: one character, then every non-ASCII character after it
    std::size_t end = i + utf8_length(static_cast<unsigned char>(in[i]));
    bool plain = decode_utf8_at(in, i) < 0x300;
    while (end < in.size() && static_cast<unsigned char>(in[end]) >= 0x80) {
      plain = plain && decode_utf8_at(in, end) < 0x300;
      end += utf8_length(static_cast<unsigned char>(in[end]));
    }
    const std::string_view chunk = in.substr(i, end - i);
    const std::size_t before = out.size();
    if (plain)
      out.append(chunk);
    else
      nfc_chunk(chunk, out);
    if (align != nullptr) {
      if (out.size() - before == chunk.size() &&
          std::string_view(out).substr(before) == chunk) {  // unchanged: exact offsets
        for (std::size_t k = 0; k < chunk.size(); ++k)
          align->push_back(base + static_cast<std::uint32_t>(i + k));
      } else {
        align->insert(align->end(), out.size() - before, base + static_cast<std::uint32_t>(i));
      }
    }
    i = end;
  }
}

/// Appends `in` with every occurrence of `pattern` replaced by `content`.
inline void replace(std::string_view in, const normalizer_step& step, std::string& out,
                    std::vector<std::uint32_t>* align, std::uint32_t base) {
  std::size_t i = 0;
  while (i < in.size()) {
    const std::size_t hit =
        step.pattern.empty() ? std::string_view::npos : in.find(step.pattern, i);
    const std::size_t stop = hit == std::string_view::npos ? in.size() : hit;
    out.append(in.substr(i, stop - i));
    if (align != nullptr)
      for (std::size_t k = i; k < stop; ++k) align->push_back(base + static_cast<std::uint32_t>(k));
    if (hit == std::string_view::npos) break;
    out.append(step.content);
    if (align != nullptr)
      align->insert(align->end(), step.content.size(), base + static_cast<std::uint32_t>(hit));
    i = hit + step.pattern.size();
  }
}

}  // namespace detail

/// Applies `steps` in order to `in` (valid UTF-8). With `align`, align[k] is the offset in `in`
/// (plus `base`) of the input byte output byte k came from.
inline std::string normalize(std::string_view in, const std::vector<normalizer_step>& steps,
                             std::vector<std::uint32_t>* align = nullptr, std::uint32_t base = 0) {
  std::string cur(in);
  std::vector<std::uint32_t> cur_align;
  if (align != nullptr)
    for (std::size_t k = 0; k < in.size(); ++k)
      cur_align.push_back(base + static_cast<std::uint32_t>(k));
  for (const auto& step : steps) {
    std::string next;
    next.reserve(cur.size() + cur.size() / 8);
    std::vector<std::uint32_t> step_align;  // offsets into cur
    std::vector<std::uint32_t>* sa = align != nullptr ? &step_align : nullptr;
    if (step.what == normalizer_step::kind::nfc)
      detail::nfc(cur, next, sa, 0);
    else
      detail::replace(cur, step, next, sa, 0);
    if (align != nullptr) {
      for (auto& a : step_align) a = cur_align[a];
      cur_align = std::move(step_align);
    }
    cur = std::move(next);
  }
  if (align != nullptr) *align = std::move(cur_align);
  return cur;
}

}  // namespace tightfit::text
