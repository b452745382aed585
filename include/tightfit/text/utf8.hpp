// tightfit/text/utf8.hpp: UTF-8 as the tokenizers read it. Text arrives as bytes; invalid UTF-8
// is replaced by U+FFFD exactly as the WHATWG Encoding Standard's decoder does (one U+FFFD per
// maximal subpart of an ill-formed sequence: what JavaScript's TextDecoder, and so
// transformers.js's callers, see). Invariant: every function here returns valid UTF-8, and valid
// UTF-8 passes through unchanged.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tightfit::text {

/// The replacement character U+FFFD in UTF-8.
inline constexpr std::string_view replacement_character = "\xEF\xBF\xBD";

/// Appends code point `cp` (at most U+10FFFF, not a surrogate) to `out` as UTF-8.
inline void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

namespace detail {

/// The WHATWG decoder over `s`: calls emit(begin, length, valid) for each well-formed sequence
/// (valid) and for each maximal subpart of an ill-formed one (not valid: one U+FFFD).
template <class Emit>
void whatwg_utf8_scan(std::string_view s, Emit&& emit) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const std::size_t n = s.size();
  std::size_t i = 0;
  while (i < n) {
    const unsigned char b = p[i];
    if (b < 0x80) {
      emit(i, std::size_t{1}, true);
      ++i;
      continue;
    }
    std::size_t need = 0;
    unsigned char lower = 0x80, upper = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) {
      need = 1;
    } else if (b >= 0xE0 && b <= 0xEF) {
      need = 2;
      if (b == 0xE0) lower = 0xA0;
      if (b == 0xED) upper = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
      need = 3;
      if (b == 0xF0) lower = 0x90;
      if (b == 0xF4) upper = 0x8F;
    } else {
      emit(i, std::size_t{1}, false);
      ++i;
      continue;
    }
    std::size_t k = 1;
    for (; k <= need && i + k < n; ++k) {
      const unsigned char c = p[i + k];
      if (c < lower || c > upper) break;
      lower = 0x80;
      upper = 0xBF;
    }
    if (k == need + 1) {
      emit(i, need + 1, true);
    } else {
      emit(i, k, false);  // the maximal subpart; the byte that broke it starts the next
    }
    i += k;
  }
}

}  // namespace detail

/// True when `s` is well-formed UTF-8.
inline bool is_valid_utf8(std::string_view s) {
  bool ok = true;
  detail::whatwg_utf8_scan(s, [&](std::size_t, std::size_t, bool valid) { ok = ok && valid; });
  return ok;
}

/// `s` with every ill-formed subsequence replaced by U+FFFD (WHATWG); valid input unchanged.
inline std::string sanitize_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  detail::whatwg_utf8_scan(s, [&](std::size_t at, std::size_t len, bool valid) {
    if (valid)
      out.append(s.substr(at, len));
    else
      out.append(replacement_character);
  });
  return out;
}

/// The length in bytes of the UTF-8 sequence starting with byte `lead` (1 for a stray byte).
inline std::size_t utf8_length(unsigned char lead) {
  if (lead < 0xC0) return 1;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  return 4;
}

/// The code point of the valid UTF-8 sequence at s[i] (length utf8_length(s[i])).
inline char32_t decode_utf8_at(std::string_view s, std::size_t i) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + i;
  if (p[0] < 0x80) return p[0];
  if (p[0] < 0xE0) return static_cast<char32_t>(((p[0] & 0x1F) << 6) | (p[1] & 0x3F));
  if (p[0] < 0xF0)
    return static_cast<char32_t>(((p[0] & 0x0F) << 12) | ((p[1] & 0x3F) << 6) | (p[2] & 0x3F));
  return static_cast<char32_t>(((p[0] & 0x07) << 18) | ((p[1] & 0x3F) << 12) |
                               ((p[2] & 0x3F) << 6) | (p[3] & 0x3F));
}

/// JavaScript's \s (String.prototype.trim, /\s/u): the white space and line terminators of
/// ECMAScript, which differ from Unicode's White_Space (U+FEFF is one, U+0085 is not).
inline bool is_js_space(char32_t c) {
  return c == 0x09 || c == 0x0A || c == 0x0B || c == 0x0C || c == 0x0D || c == 0x20 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000 || c == 0xFEFF;
}

}  // namespace tightfit::text
