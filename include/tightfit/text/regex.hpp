// tightfit/text/regex.hpp: the split regexes of tokenizer.json pre-tokenizers, compiled with
// PCRE2 (UTF mode, JIT) so that they match what transformers.js's JavaScript RegExp (flags "gu")
// matches:
//  - the case-insensitive group of the GPT-2 family, "(?i:'s|'t|'re|'ve|'m|'ll|'d)", is rewritten
//    as transformers.js rewrites it ([sS], [tT], ...): Unicode case folding would otherwise also
//    accept U+017F (long s) and U+212A (Kelvin sign);
//  - \s and \S are JavaScript's white space (U+FEFF is one, U+0085 is not), written out;
//  - \d and \w stay ASCII, as in JavaScript (PCRE2 compiled without PCRE2_UCP); \p{L}, \p{N}
//    are Unicode properties in both. PCRE2 10.42 knows Unicode 14, Node's ICU a later version:
//    characters assigned since then (docs/data.md) are letters to one and not to the other.
// A regex is shared read-only between threads; each thread matches with its own match data.
#pragma once

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <memory>
#include <string>
#include <string_view>

#include "tightfit/core/error.hpp"
#include "tightfit/text/utf8.hpp"

namespace tightfit::text {

namespace detail {

/// JavaScript's \s as the members of a PCRE2 character class.
inline constexpr std::string_view js_space_members =
    "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
    "\\x{205F}\\x{3000}\\x{FEFF}";

inline std::string replace_all(std::string s, std::string_view from, std::string_view to) {
  std::size_t at = 0;
  while ((at = s.find(from, at)) != std::string::npos) {
    s.replace(at, from.size(), to);
    at += to.size();
  }
  return s;
}

/// The pattern of tokenizer.json rewritten for PCRE2 with JavaScript's semantics.
inline std::string js_compatible_pattern(const std::string& pattern) {
  std::string p = replace_all(pattern, "(?i:'s|'t|'re|'ve|'m|'ll|'d)",
                              "(?:'([sS]|[tT]|[rR][eE]|[vV][eE]|[mM]|[lL][lL]|[dD]))");
  std::string out;
  bool in_class = false;
  for (std::size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[i + 1];
      if (e == 's') {
        if (!in_class) out += '[';
        out += js_space_members;
        if (!in_class) out += ']';
      } else if (e == 'S') {
        check(!in_class, "regex '", pattern, "': \\S inside a character class is not supported");
        out += "[^";
        out += js_space_members;
        out += ']';
      } else {
        out += c;
        out += e;
      }
      ++i;
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out += c;
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];  // a literal ] first
      continue;
    }
    if (c == ']' && in_class) in_class = false;
    out += c;
  }
  return out;
}

}  // namespace detail

/// A compiled pre-tokenizer regex (PCRE2, UTF, JIT when available).
class split_regex {
 public:
  split_regex() = default;
  /// Compiles tokenizer.json's `pattern`; a pattern PCRE2 refuses is an error naming it.
  explicit split_regex(const std::string& pattern) : source_(pattern) {
    const std::string p = detail::js_compatible_pattern(pattern);
    int code = 0;
    PCRE2_SIZE offset = 0;
    pcre2_code* compiled = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.data()), p.size(),
                                         PCRE2_UTF | PCRE2_NO_UTF_CHECK, &code, &offset, nullptr);
    if (compiled == nullptr) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(code, message, sizeof message);
      fail("regex '", pattern, "': ", reinterpret_cast<const char*>(message), " at offset ",
           offset);
    }
    code_.reset(compiled);
    jit_ = pcre2_jit_compile(compiled, PCRE2_JIT_COMPLETE) == 0;
  }

  const std::string& source() const { return source_; }
  bool empty() const { return code_ == nullptr; }

  /// Per-thread matching state: match data and a JIT stack.
  class matcher {
   public:
    explicit matcher(const split_regex& re)
        : re_(&re),
          data_(pcre2_match_data_create_from_pattern(re.code_.get(), nullptr)),
          context_(pcre2_match_context_create(nullptr)),
          stack_(pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr)) {
      check(data_ != nullptr && context_ != nullptr, "pcre2: out of memory");
      if (stack_ != nullptr) pcre2_jit_stack_assign(context_.get(), nullptr, stack_.get());
    }

    /// Calls piece(begin, end, matched) for the matches of the regex in `s` (valid UTF-8) and,
    /// unless `matches_only`, for the non-empty gaps between them, in order (transformers.js's
    /// regexSplit, or String.match when matches_only). An empty match advances one character.
    template <class Piece>
    void split(std::string_view s, bool matches_only, Piece&& piece) {
      std::size_t pos = 0, prev = 0;
      const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
      while (pos <= s.size()) {
        const int rc = re_->jit_ ? pcre2_jit_match(re_->code_.get(), subject, s.size(), pos, 0,
                                                   data_.get(), context_.get())
                                 : pcre2_match(re_->code_.get(), subject, s.size(), pos,
                                               PCRE2_NO_UTF_CHECK, data_.get(), context_.get());
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
          PCRE2_UCHAR message[256];
          pcre2_get_error_message(rc, message, sizeof message);
          fail("regex '", re_->source_,
               "': matching failed: ", reinterpret_cast<const char*>(message));
        }
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(data_.get());
        const std::size_t b = ov[0], e = ov[1];
        if (!matches_only && b > prev) piece(prev, b, false);
        if (e > b) piece(b, e, true);
        prev = e;
        if (e == b) {
          if (b >= s.size()) break;
          pos = b + utf8_length(static_cast<unsigned char>(s[b]));
        } else {
          pos = e;
        }
      }
      if (!matches_only && prev < s.size()) piece(prev, s.size(), false);
    }

    const split_regex* regex() const { return re_; }

   private:
    struct free_data {
      void operator()(pcre2_match_data* d) const { pcre2_match_data_free(d); }
      void operator()(pcre2_match_context* c) const { pcre2_match_context_free(c); }
      void operator()(pcre2_jit_stack* s) const { pcre2_jit_stack_free(s); }
    };
    const split_regex* re_;
    std::unique_ptr<pcre2_match_data, free_data> data_;
    std::unique_ptr<pcre2_match_context, free_data> context_;
    std::unique_ptr<pcre2_jit_stack, free_data> stack_;
  };

 private:
  struct free_code {
    void operator()(pcre2_code* c) const { pcre2_code_free(c); }
  };
  std::string source_;
  std::unique_ptr<pcre2_code, free_code> code_;
  bool jit_ = false;
};

}  // namespace tightfit::text
