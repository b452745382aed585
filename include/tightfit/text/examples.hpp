// tightfit/text/examples.hpp: training examples from text, as TRL builds them: token ids and
// labels (Hugging Face convention: unshifted, -100 not supervised) for language-modelling text,
// prompt + completion pairs (completion_only_loss) and conversations (assistant_only_loss), and
// truncation to a maximum length from either side. Generic over the Tokenizer concept.
// Invariants: labels has the size of ids; a label is -100 or the id at its position.
#pragma once

#include <algorithm>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "tightfit/core/error.hpp"
#include "tightfit/core/types.hpp"
#include "tightfit/text/chat.hpp"
#include "tightfit/text/concept.hpp"
#include "tightfit/text/tokenizer.hpp"

namespace tightfit::text {

/// One tokenized example.
struct example {
  std::vector<token_id> ids;
  std::vector<token_id> labels;  ///< ids, or ignore_index where not supervised
  bool truncated = false;        ///< truncate() removed tokens

  index_t size() const { return static_cast<index_t>(ids.size()); }
  /// Number of supervised positions (labels != -100).
  index_t supervised() const {
    return static_cast<index_t>(
        std::count_if(labels.begin(), labels.end(), [](token_id l) { return l != ignore_index; }));
  }
};

/// Which end truncate() keeps (TRL's truncation_mode).
enum class truncation { keep_start, keep_end };

/// Shortens `e` to at most `max_length` tokens (0: no limit), keeping its start or its end.
inline void truncate(example& e, index_t max_length, truncation side) {
  if (max_length <= 0 || e.size() <= max_length) return;
  const auto n = static_cast<std::size_t>(max_length);
  if (side == truncation::keep_start) {
    e.ids.resize(n);
    e.labels.resize(n);
  } else {
    e.ids.erase(e.ids.begin(), e.ids.end() - static_cast<std::ptrdiff_t>(n));
    e.labels.erase(e.labels.begin(), e.labels.end() - static_cast<std::ptrdiff_t>(n));
  }
  e.truncated = true;
}

namespace detail {
inline void append(example& e, const std::vector<token_id>& ids, bool supervised) {
  e.ids.insert(e.ids.end(), ids.begin(), ids.end());
  for (const token_id id : ids) e.labels.push_back(supervised ? id : ignore_index);
}
inline void append_eos(example& e, std::optional<token_id> eos) {
  if (!eos || (!e.ids.empty() && e.ids.back() == *eos)) return;
  e.ids.push_back(*eos);
  e.labels.push_back(*eos);
}
}  // namespace detail

/// Language modelling: the text with the tokenizer's special tokens (BOS), then `eos` unless the
/// text already ends with it; every token supervised.
template <Tokenizer T>
example text_example(const T& tok, std::string_view text, std::optional<token_id> eos) {
  example e;
  detail::append(e, tok.encode(text, encode_options{.add_special_tokens = true}, nullptr), true);
  detail::append_eos(e, eos);
  return e;
}

/// A prompt and its completion, encoded apart (so the boundary is exact) and joined: the prompt
/// with the tokenizer's special tokens, the completion without, then `eos`. With
/// `completion_only`, the prompt's labels are -100.
template <Tokenizer T>
example prompt_completion_example(const T& tok, std::string_view prompt,
                                  std::string_view completion, std::optional<token_id> eos,
                                  bool completion_only) {
  example e;
  detail::append(e, tok.encode(prompt, encode_options{.add_special_tokens = true}, nullptr),
                 !completion_only);
  detail::append(e, tok.encode(completion, encode_options{.add_special_tokens = false}, nullptr),
                 true);
  detail::append_eos(e, eos);
  return e;
}

/// A rendered conversation (render_chat), encoded whole without added special tokens (the
/// format writes BOS itself). With `only_from_message` set, a token is supervised when the bytes
/// it holds (from its start to the next token's) overlap an assistant range of a message at or
/// after that index, as transformers' return_assistant_tokens_mask marks the tokens holding a
/// range's characters (a token straddling a header and the answer is the answer's); otherwise
/// every token is.
template <Tokenizer T>
example chat_example(const T& tok, const rendered_chat& chat,
                     std::optional<std::size_t> only_from_message) {
  example e;
  std::vector<std::size_t> offsets;
  e.ids = tok.encode(chat.text, encode_options{.add_special_tokens = false}, &offsets);
  e.labels.assign(e.ids.size(), ignore_index);
  std::size_t r = 0;  // offsets are non-decreasing, ranges in order
  for (std::size_t i = 0; i < e.ids.size(); ++i) {
    if (!only_from_message) {
      e.labels[i] = e.ids[i];
      continue;
    }
    const std::size_t begin = offsets[i];
    const std::size_t end =
        std::max(begin + 1, i + 1 < offsets.size() ? offsets[i + 1] : chat.text.size());
    while (r < chat.assistant.size() && begin >= chat.assistant[r].second) ++r;
    if (r < chat.assistant.size() && end > chat.assistant[r].first &&
        chat.assistant_message[r] >= *only_from_message)
      e.labels[i] = e.ids[i];
  }
  return e;
}

}  // namespace tightfit::text
