// tightfit/text/concept.hpp: the Tokenizer concept, the seam between a tokenizer and what
// prepares training data from text (text/examples.hpp, `tightfit prepare`). hf_tokenizer meets
// it; a user's own tokenizer plugs in by meeting it too (tests/text/test_text_concept.cpp).
// Invariant asked of a model: encode gives ids in [0, vocab_size()), and with `offsets` the byte
// offset of the text where each token starts, non-decreasing.
#pragma once

#include <concepts>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tightfit/core/types.hpp"

namespace tightfit::text {

struct encode_options;

/// A tokenizer: text to token ids (with the byte offset where each token starts, when asked),
/// ids back to text, and the size of its id space.
template <class T>
concept Tokenizer = requires(const T& t, std::string_view text, const encode_options& options,
                             std::vector<std::size_t>* offsets, std::span<const token_id> ids) {
  { t.encode(text, options, offsets) } -> std::same_as<std::vector<token_id>>;
  { t.decode(ids) } -> std::convertible_to<std::string>;
  { t.vocab_size() } -> std::convertible_to<index_t>;
};

}  // namespace tightfit::text
