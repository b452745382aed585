// tightfit/io/token_file.hpp: a tokenized data set in a safetensors file: input_ids (N, T),
// optional labels (N, T) and optional position_ids (N, T) (packed rows: positions restarting at
// 0 at each document, Hugging Face's padding-free layout), integer tensors in the Hugging Face
// convention (labels unshifted, -100 ignored). Any other tensor is an error naming it (a key
// that would be silently ignored). optim/train.hpp's token_dataset is built from the table.
#pragma once

#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "tightfit/core/error.hpp"
#include "tightfit/core/types.hpp"
#include "tightfit/io/safetensors.hpp"

namespace tightfit {

/// N rows of T tokens; labels empty when the file has none.
struct token_table {
  index_t rows = 0, seq_len = 0;
  std::vector<token_id> input_ids;    ///< (N, T)
  std::vector<token_id> labels;       ///< (N, T) or empty
  std::vector<index_t> position_ids;  ///< (N, T) or empty (one document per row)
};

/// Reads input_ids (N, T) and optional labels (N, T); errors name the file and the tensor.
inline token_table read_token_table(const std::filesystem::path& path) {
  const auto f = safetensors_file::open(path);
  const tensor_info& t = f.info("input_ids");
  check(t.shape.size() == 2, path.string(), ": input_ids has ", t.shape.size(),
        " dimensions, expected 2 (N, T)");
  token_table out;
  out.rows = t.shape[0];
  out.seq_len = t.shape[1];
  if (f.contains("labels")) {
    const tensor_info& l = f.info("labels");
    check(l.shape == t.shape, path.string(), ": labels has shape ",
          io::detail::shape_string(l.shape), ", expected that of input_ids ",
          io::detail::shape_string(t.shape));
    out.labels = f.read_ints("labels");
  }
  if (f.contains("position_ids")) {
    const tensor_info& p = f.info("position_ids");
    check(p.shape == t.shape, path.string(), ": position_ids has shape ",
          io::detail::shape_string(p.shape), ", expected that of input_ids ",
          io::detail::shape_string(t.shape));
    const auto pos = f.read_ints("position_ids");
    out.position_ids.assign(pos.begin(), pos.end());
  }
  for (const auto& info : f.tensors())
    check(info.name == "input_ids" || info.name == "labels" || info.name == "position_ids",
          path.string(), ": tensor '", info.name,
          "' is not part of a token data set (expected: input_ids, labels, position_ids)");
  out.input_ids = f.read_ints("input_ids");
  return out;
}

/// Writes input_ids and labels (I64, shape (rows, seq_len) each) to `path`.
inline void write_token_table(const std::filesystem::path& path, index_t rows, index_t seq_len,
                              std::span<const token_id> input_ids,
                              std::span<const token_id> labels) {
  safetensors_writer w;
  w.add("input_ids", {rows, seq_len}, input_ids);
  w.add("labels", {rows, seq_len}, labels);
  w.write(path);
}

}  // namespace tightfit
