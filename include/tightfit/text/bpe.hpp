// tightfit/text/bpe.hpp: the merge-rank BPE model of tokenizer.json ("model": {"type": "BPE"}).
// A word's symbols (its bytes for byte-level BPE, its characters otherwise) are merged pair by
// pair, always the pair of lowest merge rank and, among equal ranks, the leftmost: the order of
// transformers.js (and of Hugging Face tokenizers). A merge is looked up in an open-addressing
// table keyed by the two token ids; candidate merges wait in a binary heap, and a popped
// candidate is applied only if the pair at its position still has its rank (stale entries are
// skipped), so a word of n symbols takes O(n log n).
// Options of the model: byte_fallback (a character outside the vocabulary becomes its UTF-8
// bytes as <0xXX> tokens, or unk_token if one of them is missing), ignore_merges (a word that is
// a token is that token), fuse_unk (consecutive unknown tokens are one).
// Invariant: every merge's two parts and its result are tokens of the vocabulary (checked when
// loading), so every symbol is a token or a single character outside the vocabulary.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tightfit/core/error.hpp"
#include "tightfit/core/types.hpp"
#include "tightfit/text/utf8.hpp"

namespace tightfit::text {

/// A hash for std::string keys that also accepts std::string_view (heterogeneous lookup).
struct string_hash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

/// Token strings to ids, looked up with string_view.
using vocab_map = std::unordered_map<std::string, std::int32_t, string_hash, std::equal_to<>>;

/// An open-addressing table from a pair of token ids to (rank, merged id).
class merge_table {
 public:
  struct entry {
    std::uint64_t key = empty;
    std::int32_t rank = 0, merged = 0;
  };

  void reserve(std::size_t n) {
    std::size_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    slots_.assign(cap, entry{});
    size_ = 0;
  }

  /// Sets the merge of (left, right); a pair given again takes the later rank (as a JavaScript
  /// Map built from the merges list does).
  void set(std::int32_t left, std::int32_t right, std::int32_t rank, std::int32_t merged) {
    if (2 * (size_ + 1) > slots_.size()) grow();
    const std::uint64_t k = key(left, right);
    std::size_t i = slot(k);
    while (slots_[i].key != empty && slots_[i].key != k) i = (i + 1) & (slots_.size() - 1);
    if (slots_[i].key == empty) ++size_;
    slots_[i] = {k, rank, merged};
  }

  /// The merge of (left, right), or nullptr.
  const entry* find(std::int32_t left, std::int32_t right) const {
    if (slots_.empty()) return nullptr;
    const std::uint64_t k = key(left, right);
    for (std::size_t i = slot(k);; i = (i + 1) & (slots_.size() - 1)) {
      if (slots_[i].key == k) return &slots_[i];
      if (slots_[i].key == empty) return nullptr;
    }
  }

  std::size_t size() const { return size_; }

 private:
  static constexpr std::uint64_t empty = ~std::uint64_t{0};
  static std::uint64_t key(std::int32_t l, std::int32_t r) {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(l)) << 32) |
           static_cast<std::uint32_t>(r);
  }
  std::size_t slot(std::uint64_t k) const {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return static_cast<std::size_t>(k) & (slots_.size() - 1);
  }
  void grow() {
    std::vector<entry> old = std::move(slots_);
    slots_.assign(std::max<std::size_t>(16, old.size() * 2), entry{});
    size_ = 0;
    for (const auto& e : old)
      if (e.key != empty)
        set(static_cast<std::int32_t>(e.key >> 32), static_cast<std::int32_t>(e.key & 0xffffffffU),
            e.rank, e.merged);
  }
  std::vector<entry> slots_;
  std::size_t size_ = 0;
};

/// Scratch space of one thread's BPE runs.
struct bpe_workspace {
  struct symbol {
    std::int32_t id;      ///< token id, or -1: a character outside the vocabulary
    std::uint32_t begin;  ///< byte offset in the word
    std::uint32_t len;    ///< bytes; 0 once merged into its left neighbour
    std::int32_t prev, next;
  };
  std::vector<symbol> symbols;
  std::vector<std::uint64_t> heap;  // (rank << 32 | position), a min-heap
};

/// One output token of a word: its id and the byte range of the word it covers.
struct word_token {
  token_id id;
  std::uint32_t begin, len;
};

/// The BPE model: vocabulary, merges and options.
struct bpe_model {
  vocab_map vocab;                      ///< token (model-space bytes) -> id
  merge_table merges;                   ///< (left id, right id) -> (rank, merged id)
  bool byte_level = false;              ///< symbols are bytes (GPT-2 byte-to-unicode alphabet)
  bool byte_fallback = false;           ///< unknown characters as <0xXX> tokens
  bool ignore_merges = false;           ///< a word that is a token is not merged
  bool fuse_unk = false;                ///< consecutive unknown tokens fused into one
  std::int32_t unk_id = -1;             ///< the unk_token's id, -1 when none
  std::int32_t byte_ids[256];           ///< byte_level: the token of each single byte
  std::int32_t byte_fallback_ids[256];  ///< byte_fallback: <0xXX>, -1 when missing

  bpe_model() {
    std::fill(std::begin(byte_ids), std::end(byte_ids), -1);
    std::fill(std::begin(byte_fallback_ids), std::end(byte_fallback_ids), -1);
  }

  /// The id of token `s` in the vocabulary, or -1.
  std::int32_t find(std::string_view s) const {
    const auto it = vocab.find(s);
    return it == vocab.end() ? -1 : it->second;
  }

  /// Appends the tokens of `word` (model-space bytes: raw bytes for byte-level BPE, else valid
  /// UTF-8) to `out`, each with the byte range of the word it covers. `prev_unk` carries
  /// fuse_unk across the words of one section.
  void encode_word(std::string_view word, std::vector<word_token>& out, bpe_workspace& ws,
                   bool& prev_unk) const {
    if (word.empty()) return;
    if (ignore_merges) {
      const std::int32_t whole = find(word);
      if (whole >= 0) {
        emit(whole, 0, static_cast<std::uint32_t>(word.size()), out, prev_unk);
        return;
      }
    }
    auto& sy = ws.symbols;
    sy.clear();
    if (byte_level) {
      for (std::size_t i = 0; i < word.size(); ++i)
        sy.push_back({byte_ids[static_cast<unsigned char>(word[i])], static_cast<std::uint32_t>(i),
                      1, static_cast<std::int32_t>(i) - 1, static_cast<std::int32_t>(i) + 1});
    } else {
      for (std::size_t i = 0; i < word.size();) {
        const std::size_t n = utf8_length(static_cast<unsigned char>(word[i]));
        const auto k = static_cast<std::int32_t>(sy.size());
        sy.push_back({find(word.substr(i, n)), static_cast<std::uint32_t>(i),
                      static_cast<std::uint32_t>(n), k - 1, k + 1});
        i += n;
      }
    }
    sy.back().next = -1;
    const auto n = static_cast<std::int32_t>(sy.size());
    if (n > 1) merge_all(ws);
    for (std::int32_t i = 0; i != -1 && i < n; i = sy[static_cast<std::size_t>(i)].next) {
      const auto& s = sy[static_cast<std::size_t>(i)];
      if (s.id >= 0) {
        emit(s.id, s.begin, s.len, out, prev_unk);
      } else {
        unknown(word.substr(s.begin, s.len), s.begin, out, prev_unk);
      }
    }
  }

 private:
  static std::uint64_t candidate(std::int32_t rank, std::int32_t pos) {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(rank)) << 32) |
           static_cast<std::uint32_t>(pos);
  }

  void push_pair(bpe_workspace& ws, std::int32_t pos) const {
    const auto& s = ws.symbols[static_cast<std::size_t>(pos)];
    if (s.next < 0 || s.id < 0) return;
    const auto r = ws.symbols[static_cast<std::size_t>(s.next)].id;
    if (r < 0) return;
    if (const auto* m = merges.find(s.id, r)) {
      ws.heap.push_back(candidate(m->rank, pos));
      std::push_heap(ws.heap.begin(), ws.heap.end(), std::greater<>{});
    }
  }

  void merge_all(bpe_workspace& ws) const {
    auto& sy = ws.symbols;
    ws.heap.clear();
    for (std::int32_t i = 0; i + 1 < static_cast<std::int32_t>(sy.size()); ++i) push_pair(ws, i);
    while (!ws.heap.empty()) {
      std::pop_heap(ws.heap.begin(), ws.heap.end(), std::greater<>{});
      const std::uint64_t top = ws.heap.back();
      ws.heap.pop_back();
      const auto pos = static_cast<std::int32_t>(top & 0xffffffffU);
      const auto rank = static_cast<std::int32_t>(top >> 32);
      auto& left = sy[static_cast<std::size_t>(pos)];
      if (left.len == 0 || left.next < 0) continue;
      auto& right = sy[static_cast<std::size_t>(left.next)];
      if (left.id < 0 || right.id < 0) continue;
      const auto* m = merges.find(left.id, right.id);
      if (m == nullptr || m->rank != rank) continue;  // stale: the pair changed
      left.id = m->merged;
      left.len += right.len;
      right.len = 0;
      left.next = right.next;
      if (left.next >= 0) sy[static_cast<std::size_t>(left.next)].prev = pos;
      if (left.prev >= 0) push_pair(ws, left.prev);
      push_pair(ws, pos);
    }
  }

  void emit(std::int32_t id, std::uint32_t begin, std::uint32_t len, std::vector<word_token>& out,
            bool& prev_unk) const {
    const bool is_unk = id == unk_id;
    if (is_unk && fuse_unk && prev_unk) {
      out.back().len = begin + len - out.back().begin;
      return;
    }
    out.push_back({id, begin, len});
    prev_unk = is_unk;
  }

  void unknown(std::string_view ch, std::uint32_t begin, std::vector<word_token>& out,
               bool& prev_unk) const {
    if (byte_fallback) {
      bool all = true;
      for (char c : ch) all = all && byte_fallback_ids[static_cast<unsigned char>(c)] >= 0;
      if (all) {
        for (std::size_t k = 0; k < ch.size(); ++k)
          emit(byte_fallback_ids[static_cast<unsigned char>(ch[k])],
               begin + static_cast<std::uint32_t>(k), 1, out, prev_unk);
        return;
      }
    }
    check(unk_id >= 0, "the character '", sanitize_utf8(ch),
          "' is not in the vocabulary and the tokenizer has no unk_token");
    emit(unk_id, begin, static_cast<std::uint32_t>(ch.size()), out, prev_unk);
  }
};

}  // namespace tightfit::text
