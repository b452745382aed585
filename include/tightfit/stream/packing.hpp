// tightfit/stream/packing.hpp: packing documents of mixed lengths into rows of a fixed length
// for padding-free training (Hugging Face's layout: position_ids restart at 0 at each document,
// so a document attends only to itself; token_batch, docs/models.md).
//  - pack_best_fit_decreasing: documents longest first, each into the open row it fills best
//    (the least room left), a new row when none has room (TRL's "bfd" packing); for pairs (DPO's
//    chosen and rejected), a row has room for a pair when both of its files' rows do, so the two
//    files break at the same pairs;
//  - pack_in_order: documents (or pairs) in their order, a new row when the next does not fit;
//  - lay_out_rows: the rows as (rows, T) input_ids, labels and position_ids; the padding after a
//    row's last document continues its positions, with pad_id inputs and -100 labels.
// Invariants: every document lands in exactly one row, in full (a document longer than the row
// is an error: truncate first); within a row, documents keep the order they were placed in.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <set>
#include <span>
#include <utility>
#include <vector>

#include "tightfit/core/error.hpp"
#include "tightfit/core/types.hpp"

namespace tightfit {

/// Documents per row: rows[r] lists document indices in placement order.
using packing = std::vector<std::vector<index_t>>;

namespace detail {
inline void check_lengths(std::span<const index_t> lengths, index_t capacity, const char* what) {
  check(capacity >= 1, what, ": the row length is ", capacity, ", expected at least 1");
  for (std::size_t d = 0; d < lengths.size(); ++d)
    check(lengths[d] >= 1 && lengths[d] <= capacity, what, ": document ", d, " has ", lengths[d],
          " tokens, expected [1, ", capacity, "] (truncate it first)");
}
}  // namespace detail

/// Best-fit decreasing over one length per document, rows of `capacity` tokens.
inline packing pack_best_fit_decreasing(std::span<const index_t> lengths, index_t capacity) {
  detail::check_lengths(lengths, capacity, "pack_best_fit_decreasing");
  std::vector<index_t> order(lengths.size());
  std::iota(order.begin(), order.end(), index_t{0});
  std::stable_sort(order.begin(), order.end(), [&](index_t a, index_t b) {
    return lengths[static_cast<std::size_t>(a)] > lengths[static_cast<std::size_t>(b)];
  });
  packing rows;
  std::set<std::pair<index_t, index_t>> room;  // (free tokens, row): the best fit is a lower bound
  for (const index_t d : order) {
    const index_t n = lengths[static_cast<std::size_t>(d)];
    auto it = room.lower_bound({n, index_t{-1}});
    if (it == room.end()) {
      rows.push_back({d});
      if (capacity - n > 0) room.insert({capacity - n, static_cast<index_t>(rows.size()) - 1});
      continue;
    }
    const auto [free, r] = *it;
    room.erase(it);
    rows[static_cast<std::size_t>(r)].push_back(d);
    if (free - n > 0) room.insert({free - n, r});
  }
  return rows;
}

/// Best-fit decreasing over pairs of lengths (first[d], second[d]): a row holds a pair when both
/// of its halves fit; the best row leaves the least room in the fuller of its two halves.
inline packing pack_best_fit_decreasing(std::span<const index_t> first,
                                        std::span<const index_t> second, index_t capacity) {
  check(first.size() == second.size(), "pack_best_fit_decreasing: ", first.size(),
        " first lengths and ", second.size(), " second ones");
  detail::check_lengths(first, capacity, "pack_best_fit_decreasing");
  detail::check_lengths(second, capacity, "pack_best_fit_decreasing");
  std::vector<index_t> order(first.size());
  std::iota(order.begin(), order.end(), index_t{0});
  auto key = [&](index_t d) {
    return std::max(first[static_cast<std::size_t>(d)], second[static_cast<std::size_t>(d)]);
  };
  std::stable_sort(order.begin(), order.end(),
                   [&](index_t a, index_t b) { return key(a) > key(b); });
  packing rows;
  std::vector<std::pair<index_t, index_t>> used;
  for (const index_t d : order) {
    const index_t a = first[static_cast<std::size_t>(d)], b = second[static_cast<std::size_t>(d)];
    std::size_t best = rows.size();
    index_t best_left = capacity + 1;
    for (std::size_t r = 0; r < rows.size(); ++r) {
      const index_t la = capacity - used[r].first - a, lb = capacity - used[r].second - b;
      if (la < 0 || lb < 0) continue;
      if (std::min(la, lb) < best_left) {
        best_left = std::min(la, lb);
        best = r;
      }
    }
    if (best == rows.size()) {
      rows.emplace_back();
      used.emplace_back(0, 0);
    }
    rows[best].push_back(d);
    used[best].first += a;
    used[best].second += b;
  }
  return rows;
}

/// Documents in their order, a new row whenever the next one does not fit (padding-free rows
/// without reordering).
inline packing pack_in_order(std::span<const index_t> lengths, index_t capacity) {
  detail::check_lengths(lengths, capacity, "pack_in_order");
  packing rows;
  index_t used = capacity;
  for (std::size_t d = 0; d < lengths.size(); ++d) {
    if (used + lengths[d] > capacity) {
      rows.emplace_back();
      used = 0;
    }
    rows.back().push_back(static_cast<index_t>(d));
    used += lengths[d];
  }
  return rows;
}

/// Pairs in their order, a new row whenever the next pair does not fit in both halves.
inline packing pack_in_order(std::span<const index_t> first, std::span<const index_t> second,
                             index_t capacity) {
  check(first.size() == second.size(), "pack_in_order: ", first.size(), " first lengths and ",
        second.size(), " second ones");
  detail::check_lengths(first, capacity, "pack_in_order");
  detail::check_lengths(second, capacity, "pack_in_order");
  packing rows;
  index_t used_a = capacity, used_b = capacity;
  for (std::size_t d = 0; d < first.size(); ++d) {
    if (used_a + first[d] > capacity || used_b + second[d] > capacity) {
      rows.emplace_back();
      used_a = used_b = 0;
    }
    rows.back().push_back(static_cast<index_t>(d));
    used_a += first[d];
    used_b += second[d];
  }
  return rows;
}

/// Packed rows in the Hugging Face layout.
struct packed_rows {
  index_t rows = 0, seq_len = 0;
  std::vector<token_id> input_ids, labels;  ///< (rows, seq_len)
  std::vector<index_t> position_ids;        ///< (rows, seq_len)
  std::vector<index_t> documents;           ///< the documents in row-major order
};

/// Lays `rows` out over the documents' ids and labels, `seq_len` columns (at least the fullest
/// row), padding with `pad_id` (labels -100, positions continuing the row's last document).
inline packed_rows lay_out_rows(const packing& rows, std::span<const std::vector<token_id>> ids,
                                std::span<const std::vector<token_id>> labels, index_t seq_len,
                                token_id pad_id) {
  check(ids.size() == labels.size(), "lay_out_rows: ", ids.size(), " documents and ", labels.size(),
        " label lists");
  packed_rows out;
  out.rows = static_cast<index_t>(rows.size());
  out.seq_len = seq_len;
  for (const auto& row : rows) {
    index_t used = 0;
    for (const index_t d : row) {
      check(d >= 0 && static_cast<std::size_t>(d) < ids.size(), "lay_out_rows: document ", d,
            " of ", ids.size());
      const auto& di = ids[static_cast<std::size_t>(d)];
      const auto& dl = labels[static_cast<std::size_t>(d)];
      check(di.size() == dl.size(), "lay_out_rows: document ", d, " has ", di.size(), " ids and ",
            dl.size(), " labels");
      for (std::size_t k = 0; k < di.size(); ++k) {
        out.input_ids.push_back(di[k]);
        out.labels.push_back(dl[k]);
        out.position_ids.push_back(static_cast<index_t>(k));
      }
      used += static_cast<index_t>(di.size());
      out.documents.push_back(d);
    }
    check(used <= seq_len, "lay_out_rows: a row holds ", used, " tokens, more than ", seq_len);
    const index_t next = out.position_ids.empty() || used == 0 ? 0 : out.position_ids.back() + 1;
    for (index_t t = used; t < seq_len; ++t) {
      out.input_ids.push_back(pad_id);
      out.labels.push_back(ignore_index);
      out.position_ids.push_back(next + (t - used));
    }
  }
  return out;
}

}  // namespace tightfit
