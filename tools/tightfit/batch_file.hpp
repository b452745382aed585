// Batch files of the tightfit tool (`grad`, `logprobs`): safetensors in the Hugging Face
// convention (labels unshifted, -100 ignored, right padding or packed rows), read into the
// library's token_batch layout (docs/tool.md, "Batch files").
//
//   sft:  input_ids, labels (B,T); optional attention_mask (B,T) or lengths (B); optional
//         position_ids (B,T): packed documents, positions restarting at 0 at each.
//   grpo: the same plus advantages (D), optional old_logprobs, ref_logprobs (B,T) aligned with
//         labels (entry t is the log-prob of labels[t]). D: one completion per document, in
//         row-major order (D = B without position_ids).
//   dpo:  chosen_input_ids, chosen_labels (Rc,T), rejected_input_ids, rejected_labels (Rr,T);
//         optional chosen_/rejected_attention_mask and chosen_/rejected_position_ids of the same
//         shapes; optional ref_chosen_logps, ref_rejected_logps (P). Pair i is the i-th chosen
//         and the i-th rejected document (row-major order): Rc = Rr = P without position_ids.
// Invariant: every tensor of the file is one the objective reads (an unknown key is an error
// naming it), every shape is checked before use, and padding labels never count.
// The readers take any File with safetensors_file's reading members (source, contains, info,
// read_ints, read<double>): the Python module reads its arrays through them (python/src).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "tightfit/core/error.hpp"
#include "tightfit/io/safetensors.hpp"
#include "tightfit/nn/layer.hpp"
#include "tightfit/stream/backward.hpp"

namespace tightfit::cli {

/// A (B, T) integer tensor of the batch file, or an error naming it.
struct int_matrix {
  index_t rows = 0, cols = 0;
  std::vector<std::int64_t> data;  // (rows*cols)
};

template <class File>
int_matrix read_int_matrix(const File& f, const std::string& name) {
  check(f.contains(name), f.source(), ": the batch has no tensor '", name, "'");
  const auto& info = f.info(name);
  check(info.shape.size() == 2, f.source(), ": tensor '", name, "' has ", info.shape.size(),
        " dimensions, expected 2 (B, T)");
  return {info.shape[0], info.shape[1], f.read_ints(name)};
}

/// Throws naming the tensor and the index unless every value of `v` is finite.
template <class File>
void check_finite_values(const File& f, const std::string& name, const std::vector<double>& v) {
  for (std::size_t i = 0; i < v.size(); ++i)
    check(std::isfinite(v[i]), f.source(), ": tensor '", name, "' holds ", v[i], " at index ", i,
          " (expected finite values)");
}

/// The floating tensor `name` of `expected` values, every one finite.
template <class File>
std::vector<double> read_floats(const File& f, const std::string& name, index_t expected) {
  check(f.contains(name), f.source(), ": the batch has no tensor '", name, "'");
  check(f.info(name).numel() == expected, f.source(), ": tensor '", name, "' has ",
        f.info(name).numel(), " elements, expected ", expected);
  auto v = f.template read<double>(name);
  check_finite_values(f, name, v);
  return v;
}

/// The rows and columns (B, T) of the batch `objective` reads from `f`, from the header alone
/// (dpo: the chosen and the rejected rows together), so that its size is checked before it is
/// read; a missing or malformed tensor is left to read_batch's error (0, 0).
template <class File>
std::pair<index_t, index_t> batch_extents(const File& f, const std::string& objective) {
  auto extents = [&](const std::string& name) -> std::pair<index_t, index_t> {
    if (!f.contains(name) || f.info(name).shape.size() != 2) return {0, 0};
    return {f.info(name).shape[0], f.info(name).shape[1]};
  };
  if (objective != "dpo") return extents("input_ids");
  const auto [rc, t] = extents("chosen_input_ids");
  const auto [rr, t2] = extents("rejected_input_ids");
  if (t != t2 || rc > std::numeric_limits<index_t>::max() - rr) return {0, 0};
  return {rc + rr, t};
}

/// Valid lengths from an attention mask (right padding only) or a lengths tensor.
template <class File>
std::vector<index_t> read_lengths(const File& f, const std::string& mask_name,
                                  const std::string& lengths_name, index_t b, index_t t) {
  std::vector<index_t> lengths;
  if (f.contains(mask_name)) {
    const auto m = read_int_matrix(f, mask_name);
    check(m.rows == b && m.cols == t, f.source(), ": ", mask_name, " is (", m.rows, ", ", m.cols,
          "), expected (", b, ", ", t, ")");
    for (std::size_t i = 0; i < m.data.size(); ++i)
      check(m.data[i] == 0 || m.data[i] == 1, f.source(), ": ", mask_name, "[",
            static_cast<index_t>(i) / t, "][", static_cast<index_t>(i) % t, "] is ", m.data[i],
            ", expected 0 or 1");
    for (index_t r = 0; r < b; ++r) {
      index_t len = 0;
      while (len < t && m.data[static_cast<std::size_t>(r * t + len)] != 0) ++len;
      for (index_t p = len; p < t; ++p)
        check(m.data[static_cast<std::size_t>(r * t + p)] == 0, f.source(), ": ", mask_name,
              " row ", r, " is not right padding (a 1 at position ", p, " after a 0)");
      check(len >= 1, f.source(), ": ", mask_name, " row ", r, " has no valid position");
      lengths.push_back(len);
    }
  } else if (!lengths_name.empty() && f.contains(lengths_name)) {
    const auto l = f.read_ints(lengths_name);
    check(static_cast<index_t>(l.size()) == b, f.source(), ": ", lengths_name, " has ", l.size(),
          " entries, expected ", b);
    lengths.assign(l.begin(), l.end());
    for (std::size_t r = 0; r < lengths.size(); ++r)
      check(lengths[r] >= 1 && lengths[r] <= t, f.source(), ": ", lengths_name, "[", r, "] is ",
            lengths[r], ", expected a length in [1, ", t, "]");
  }
  return lengths;
}

/// The tensors `objective` reads from a batch file.
inline std::vector<std::string> batch_keys(const std::string& objective) {
  if (objective == "dpo")
    return {"chosen_input_ids",    "chosen_labels",         "rejected_input_ids",
            "rejected_labels",     "chosen_attention_mask", "rejected_attention_mask",
            "chosen_position_ids", "rejected_position_ids", "ref_chosen_logps",
            "ref_rejected_logps"};
  std::vector<std::string> known = {"input_ids", "labels", "attention_mask", "lengths",
                                    "position_ids"};
  if (objective == "grpo")
    for (const char* k : {"advantages", "old_logprobs", "ref_logprobs"}) known.push_back(k);
  return known;
}

/// Every tensor of the file must be one of `known`: an unknown key (a typo, or a feature
/// tightfit would silently ignore) is an error naming it and `reader` (who reads the file).
inline void check_known_tensors(const safetensors_file& f, const std::vector<std::string>& known,
                                const std::string& reader) {
  for (const auto& t : f.tensors()) {
    if (std::find(known.begin(), known.end(), t.name) != known.end()) continue;
    std::string list;
    for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
    fail(f.source(), ": tensor '", t.name, "' is not used by ", reader, " (expected: ", list, ")");
  }
}

/// Every tensor of the batch file must be one the objective reads (check_known_tensors).
inline void check_batch_keys(const safetensors_file& f, const std::string& objective,
                             const std::string& command = "--objective ") {
  check_known_tensors(f, batch_keys(objective), command + objective);
}

/// Packed positions (B, T) from tensor `name`, or empty when the batch has none.
template <class File>
std::vector<index_t> read_positions(const File& f, const std::string& name, const std::string& like,
                                    index_t b, index_t t) {
  if (!f.contains(name)) return {};
  const auto m = read_int_matrix(f, name);
  check(m.rows == b && m.cols == t, f.source(), ": ", name, " is (", m.rows, ", ", m.cols,
        "), expected (", b, ", ", t, ") like ", like);
  std::vector<index_t> pos(m.data.begin(), m.data.end());
  // sequence_batch::validate names the first bad entry (row, position, value)
  try {
    sequence_batch{b, t, {}, pos}.validate();
  } catch (const error& e) {
    fail(f.source(), ": ", name, ": ", e.what());
  }
  return pos;
}

/// Labels at positions outside the valid length of their row (attention_mask 0) set to
/// ignore_index: padding is never supervised, whatever label the file gives it.
inline void ignore_padding_labels(std::vector<token_id>& labels,
                                  const std::vector<index_t>& lengths, index_t t) {
  for (std::size_t r = 0; r < lengths.size(); ++r)
    for (index_t p = std::max<index_t>(lengths[r], 0); p < t; ++p)
      labels[r * static_cast<std::size_t>(t) + static_cast<std::size_t>(p)] = ignore_index;
}

/// Per-token values aligned with labels (entry t belongs to labels[t]) to target alignment
/// (entry t belongs to the token predicted at position t, i.e. labels[t + 1]).
inline std::vector<double> shift_values(const std::vector<double>& v, index_t b, index_t t) {
  std::vector<double> out(v.size(), 0.0);
  for (index_t r = 0; r < b; ++r)
    for (index_t p = 0; p + 1 < t; ++p)
      out[static_cast<std::size_t>(r * t + p)] = v[static_cast<std::size_t>(r * t + p + 1)];
  return out;
}

/// The inverse of shift_values: target-aligned values (B*T) to label alignment (entry 0 of
/// each row, whose label nothing predicts, is 0).
inline std::vector<double> unshift_values(const std::vector<double>& v, index_t b, index_t t) {
  std::vector<double> out(v.size(), 0.0);
  for (index_t r = 0; r < b; ++r)
    for (index_t p = 0; p + 1 < t; ++p)
      out[static_cast<std::size_t>(r * t + p + 1)] = v[static_cast<std::size_t>(r * t + p)];
  return out;
}

/// A batch file read into the library's layout. The token_batch it gives borrows its vectors.
struct loaded_batch {
  index_t b = 0, t = 0;                   ///< rows and columns of the concatenated batch
  std::vector<token_id> ids, labels;      ///< (B*T) labels with padding set to ignore_index
  std::vector<index_t> lengths;           ///< (B) or empty
  std::vector<index_t> positions;         ///< (B*T) packed positions or empty
  std::vector<index_t> chosen, rejected;  ///< dpo: the sequences (documents) of each pair (P)
  index_t chosen_rows = 0;                ///< dpo: rows [0, chosen_rows) hold chosen documents
  std::vector<token_id> targets;          ///< (B*T) shifted labels (shift_labels)

  index_t pairs() const { return static_cast<index_t>(chosen.size()); }
  /// Documents (sequences) of the batch: packed documents, else rows.
  index_t documents() const {
    if (positions.empty()) return b;
    index_t n = 0;
    for (std::size_t i = 0; i < positions.size(); ++i) n += positions[i] == 0 ? 1 : 0;
    return n;
  }
  token_batch view() const { return {b, t, ids, targets, lengths, positions}; }
};

/// Reads the batch of `objective` (sft, grpo, dpo) from `f`: shapes, attention masks (right
/// padding), position_ids; dpo's chosen rows come first, then the rejected rows.
template <class File>
loaded_batch read_batch(const File& f, const std::string& objective) {
  loaded_batch out;
  if (objective == "dpo") {
    const auto ci = read_int_matrix(f, "chosen_input_ids");
    const auto cl = read_int_matrix(f, "chosen_labels");
    const auto ri = read_int_matrix(f, "rejected_input_ids");
    const auto rl = read_int_matrix(f, "rejected_labels");
    check(ci.rows == cl.rows && ci.cols == cl.cols && ri.rows == rl.rows && ri.cols == rl.cols &&
              ri.cols == ci.cols,
          f.source(), ": chosen input_ids and labels must be (Rc, T), rejected ones (Rr, T); got (",
          ci.rows, ", ", ci.cols, "), (", cl.rows, ", ", cl.cols, "), (", ri.rows, ", ", ri.cols,
          "), (", rl.rows, ", ", rl.cols, ")");
    const index_t rc = ci.rows, rr = ri.rows, t = ci.cols;
    out.b = rc + rr;
    out.t = t;
    out.chosen_rows = rc;
    out.ids = ci.data;
    out.ids.insert(out.ids.end(), ri.data.begin(), ri.data.end());
    out.labels = cl.data;
    out.labels.insert(out.labels.end(), rl.data.begin(), rl.data.end());
    auto lc = read_lengths(f, "chosen_attention_mask", "", rc, t);
    auto lr = read_lengths(f, "rejected_attention_mask", "", rr, t);
    if (!lc.empty() || !lr.empty()) {
      if (lc.empty()) lc.assign(static_cast<std::size_t>(rc), t);
      if (lr.empty()) lr.assign(static_cast<std::size_t>(rr), t);
      out.lengths = lc;
      out.lengths.insert(out.lengths.end(), lr.begin(), lr.end());
      ignore_padding_labels(out.labels, out.lengths, t);
    }
    auto pc = read_positions(f, "chosen_position_ids", "chosen_input_ids", rc, t);
    auto pr = read_positions(f, "rejected_position_ids", "rejected_input_ids", rr, t);
    auto docs_of = [](const std::vector<index_t>& pos, index_t rows) {
      if (pos.empty()) return rows;
      return static_cast<index_t>(std::count(pos.begin(), pos.end(), index_t{0}));
    };
    const index_t dc = docs_of(pc, rc), dr = docs_of(pr, rr);
    check(dc == dr, f.source(), ": ", dc, " chosen sequences and ", dr,
          " rejected ones; pair i is the i-th of each (documents in row-major order)");
    if (!pc.empty() || !pr.empty()) {
      auto rows_as_documents = [t](index_t rows) {
        std::vector<index_t> pos(static_cast<std::size_t>(rows * t));
        for (std::size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<index_t>(i) % t;
        return pos;
      };
      if (pc.empty()) pc = rows_as_documents(rc);
      if (pr.empty()) pr = rows_as_documents(rr);
      out.positions = pc;
      out.positions.insert(out.positions.end(), pr.begin(), pr.end());
    }
    for (index_t i = 0; i < dc; ++i) {
      out.chosen.push_back(i);
      out.rejected.push_back(dc + i);
    }
  } else {
    const auto in = read_int_matrix(f, "input_ids");
    const auto lab = read_int_matrix(f, "labels");
    check(in.rows == lab.rows && in.cols == lab.cols, f.source(), ": labels is (", lab.rows, ", ",
          lab.cols, "), expected (", in.rows, ", ", in.cols, ") like input_ids");
    out.b = in.rows;
    out.t = in.cols;
    out.ids = in.data;
    out.labels = lab.data;
    out.lengths = read_lengths(f, "attention_mask", "lengths", out.b, out.t);
    ignore_padding_labels(out.labels, out.lengths, out.t);
    out.positions = read_positions(f, "position_ids", "input_ids", out.b, out.t);
  }
  out.targets = shift_labels(out.labels, out.b, out.t);
  return out;
}

}  // namespace tightfit::cli
