// tightfit/optim/train.hpp: a supervised fine-tuning loop for any optimizer of optim/ (block
// coordinate or full) and any learning-rate schedule.
//
// Data: token_dataset, N rows of T tokens: input_ids (N, T) and labels (N, T) in the Hugging
// Face convention (unshifted; -100 ignored; labels absent: the inputs themselves), read from a
// safetensors file or given in memory. Step s trains on rows [s*B, s*B + B) modulo N.
// The loop sets the optimizer's learning-rate factor from the schedule, steps, draws a progress
// line on stderr (steps, loss, tokens/s, peak memory) and writes one JSON object per step to the
// log file (step, loss, lr_factor, block, tokens, tokens_per_s, seconds, peak_bytes,
// state_bytes). It can save a checkpoint (optim/checkpoint.hpp) at the end.
#pragma once

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "tightfit/io/safetensors.hpp"
#include "tightfit/loss/sft.hpp"
#include "tightfit/optim/checkpoint.hpp"
#include "tightfit/optim/schedule.hpp"
#include "tightfit/stream/backward.hpp"

namespace tightfit {

/// A tokenized SFT data set: N rows of T tokens with Hugging Face labels.
class token_dataset {
 public:
  token_dataset() = default;
  /// In-memory rows; labels empty: the inputs (language modelling).
  token_dataset(index_t rows, index_t seq_len, std::vector<token_id> input_ids,
                std::vector<token_id> labels = {})
      : rows_(rows), seq_len_(seq_len), ids_(std::move(input_ids)), labels_(std::move(labels)) {
    check(rows >= 1 && seq_len >= 2, "token_dataset: shape is (", rows, ", ", seq_len,
          "), expected at least one row of at least 2 tokens");
    check_extent("token_dataset", "input_ids.size", static_cast<index_t>(ids_.size()),
                 rows * seq_len);
    if (labels_.empty()) labels_ = ids_;
    check_extent("token_dataset", "labels.size", static_cast<index_t>(labels_.size()),
                 rows * seq_len);
  }

  /// Reads input_ids (N, T) and optional labels (N, T) from a safetensors file.
  static token_dataset load(const std::filesystem::path& path) {
    const auto f = safetensors_file::open(path);
    const tensor_info& t = f.info("input_ids");
    check(t.shape.size() == 2, path.string(), ": input_ids has ", t.shape.size(),
          " dimensions, expected 2 (N, T)");
    std::vector<token_id> labels;
    if (f.contains("labels")) {
      const tensor_info& l = f.info("labels");
      check(l.shape == t.shape, path.string(), ": labels has shape ",
            io::detail::shape_string(l.shape), ", expected that of input_ids ",
            io::detail::shape_string(t.shape));
      labels = f.read_ints("labels");
    }
    return token_dataset(t.shape[0], t.shape[1], f.read_ints("input_ids"), std::move(labels));
  }

  /// Writes the data set (I64 input_ids and labels).
  void save(const std::filesystem::path& path) const {
    safetensors_writer w;
    w.add("input_ids", {rows_, seq_len_}, std::span<const token_id>(ids_));
    w.add("labels", {rows_, seq_len_}, std::span<const token_id>(labels_));
    w.write(path);
  }

  index_t rows() const { return rows_; }
  index_t seq_len() const { return seq_len_; }
  const std::vector<token_id>& input_ids() const { return ids_; }
  const std::vector<token_id>& labels() const { return labels_; }

  /// Checks every token against a vocabulary size (named row and position on error).
  void validate(index_t vocab) const {
    for (std::size_t i = 0; i < ids_.size(); ++i) {
      const auto r = static_cast<index_t>(i) / seq_len_, c = static_cast<index_t>(i) % seq_len_;
      check(ids_[i] >= 0 && ids_[i] < vocab, "token_dataset: input_ids[", r, "][", c, "] is ",
            ids_[i], ", outside the vocabulary [0, ", vocab, ")");
      check(labels_[i] == ignore_index || (labels_[i] >= 0 && labels_[i] < vocab),
            "token_dataset: labels[", r, "][", c, "] is ", labels_[i], ", expected ", ignore_index,
            " or a token in [0, ", vocab, ")");
    }
  }

 private:
  index_t rows_ = 0, seq_len_ = 0;
  std::vector<token_id> ids_, labels_;  // (N, T)
};

/// One batch of B rows (wrapping around the data set) with shifted targets.
struct dataset_batch {
  std::vector<token_id> ids, targets;  // (B*T)
  index_t batch = 1, seq_len = 0;
  token_batch view() const { return {batch, seq_len, ids, targets, {}}; }
};

/// Rows [first, first + B) modulo N.
inline dataset_batch make_batch(const token_dataset& data, index_t first, index_t batch) {
  dataset_batch b;
  b.batch = batch;
  b.seq_len = data.seq_len();
  std::vector<token_id> labels;
  const auto t = static_cast<std::size_t>(data.seq_len());
  for (index_t k = 0; k < batch; ++k) {
    const auto r = static_cast<std::size_t>((first + k) % data.rows());
    b.ids.insert(b.ids.end(), data.input_ids().begin() + static_cast<std::ptrdiff_t>(r * t),
                 data.input_ids().begin() + static_cast<std::ptrdiff_t>((r + 1) * t));
    labels.insert(labels.end(), data.labels().begin() + static_cast<std::ptrdiff_t>(r * t),
                  data.labels().begin() + static_cast<std::ptrdiff_t>((r + 1) * t));
  }
  b.targets = shift_labels(labels, batch, data.seq_len());
  return b;
}

/// Options of train().
struct train_options {
  std::int64_t steps = 100;
  index_t batch = 1;                 ///< rows per step
  backward_options backward;         ///< schedule, chunk, ... (gradient control: the optimizer's)
  bool progress = true;              ///< progress line on stderr
  std::filesystem::path log;         ///< JSON lines; empty: none
  std::filesystem::path save_state;  ///< checkpoint written at the end; empty: none
  /// Called after every step (step index, its result); e.g. to record a loss curve.
  std::function<void(std::int64_t, const step_result&)> on_step;
};

/// What train() did.
struct train_summary {
  std::vector<double> losses;
  double seconds = 0;
  double tokens_per_second = 0;
  std::size_t peak_bytes = 0;   ///< highest backward peak (all counted bytes)
  std::size_t state_bytes = 0;  ///< optimizer state at the end
};

/// Trains `model` for options.steps steps (see the top comment).
template <Backend B, class Optimizer, LrSchedule Schedule>
train_summary train(decoder_model<B>& model, const token_dataset& data, Optimizer& optimizer,
                    const Schedule& schedule, const train_options& options) {
  using clock = std::chrono::steady_clock;
  check(options.steps >= 0, "train: steps is ", options.steps, ", expected >= 0");
  check(options.batch >= 1, "train: batch is ", options.batch, ", expected >= 1");
  data.validate(model.config().vocab_size);
  std::ofstream log;
  if (!options.log.empty()) {
    log.open(options.log, std::ios::trunc);
    check(static_cast<bool>(log), options.log.string(), ": cannot open the log for writing");
  }
  train_summary sum;
  const auto start = clock::now();
  double tokens = 0;
  const std::int64_t first_step = optimizer.steps();
  for (std::int64_t s = 0; s < options.steps; ++s) {
    const std::int64_t global = first_step + s;
    const auto b = make_batch(data, global * options.batch, options.batch);
    sft_loss loss;
    optimizer.set_lr_factor(schedule(global));
    const step_result r = optimizer.step(b.view(), loss, options.backward);
    tokens += static_cast<double>(options.batch * data.seq_len());
    const double secs = std::chrono::duration<double>(clock::now() - start).count();
    sum.losses.push_back(r.loss);
    sum.peak_bytes = std::max(sum.peak_bytes, r.backward.peak_bytes);
    if (log) {
      log << "{\"step\":" << global + 1 << ",\"loss\":" << r.loss
          << ",\"lr_factor\":" << optimizer.lr_factor() << ",\"block\":" << r.block
          << ",\"tokens\":" << tokens << ",\"tokens_per_s\":" << tokens / secs
          << ",\"seconds\":" << secs << ",\"peak_bytes\":" << r.backward.peak_bytes
          << ",\"state_bytes\":" << optimizer.state_bytes() << "}\n";
    }
    if (options.progress) {
      std::fprintf(stderr, "\rstep %lld/%lld  loss %.4f  block %lld  %.0f tok/s  peak %.1f MiB   ",
                   static_cast<long long>(s + 1), static_cast<long long>(options.steps), r.loss,
                   static_cast<long long>(r.block), tokens / secs,
                   static_cast<double>(r.backward.peak_bytes) / (1024.0 * 1024.0));
      std::fflush(stderr);
    }
    if (options.on_step) options.on_step(global, r);
  }
  if (options.progress && options.steps > 0) std::fprintf(stderr, "\n");
  sum.seconds = std::chrono::duration<double>(clock::now() - start).count();
  sum.tokens_per_second = sum.seconds > 0 ? tokens / sum.seconds : 0;
  sum.state_bytes = optimizer.state_bytes();
  if (!options.save_state.empty()) save_checkpoint(options.save_state, model, optimizer);
  return sum;
}

}  // namespace tightfit
