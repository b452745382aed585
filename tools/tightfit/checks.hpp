// Checks the tightfit subcommands make before any work, and on the values they write:
//  - sizes: a model's parameters, a batch's or a data set's tokens and activations against the
//    memory this process may use (core/limits.hpp), a config.json against the checkpoint beside
//    it -- before allocation (tightfit::error, exit 1; usage_error, exit 2, when the size is an
//    argument);
//  - finite values: weights read, gradients and losses computed (tightfit::error, exit 1).
// Output paths have their own rule: output_paths.hpp.
#pragma once

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <string>
#include <system_error>
#include <vector>

#include "args.hpp"
#include "tightfit/core/limits.hpp"
#include "tightfit/io/safetensors.hpp"
#include "tightfit/loss/sft.hpp"
#include "tightfit/nn/hf_model.hpp"
#include "tightfit/stream/planner.hpp"

namespace tightfit::cli {

namespace fs = std::filesystem;

/// Refuses, before allocation, a model of `cfg` held as `copies` arrays of its parameters in
/// `bytes_per_value`-byte values (weights, gradients, optimizer moments) when that exceeds the
/// memory this process may use; with a checkpoint directory, also a config.json that describes
/// more parameters than the checkpoint holds (check_hf_checkpoint_size). tightfit::error (exit 1).
inline void check_model_fits(const model_config& cfg, std::uint64_t bytes_per_value,
                             std::uint64_t copies, const fs::path* checkpoint) {
  if (checkpoint != nullptr) check_hf_checkpoint_size(cfg, *checkpoint);
  const auto count = hf_parameter_count(cfg);
  check(count.has_value(), "the model's parameter count does not fit in 64 bits");
  const auto bytes = checked_product({*count, bytes_per_value, copies});
  check(bytes.has_value(), "the model's ", *count, " parameters do not fit in 64-bit byte counts");
  check_memory("the model (" + std::to_string(*count) + " parameters x " + std::to_string(copies) +
                   " copies of " + std::to_string(bytes_per_value) + " bytes)",
               *bytes);
}

/// Host bytes per token that a backward holds outside the counted activations: token ids,
/// targets and their masked copies.
inline constexpr std::uint64_t host_bytes_per_token = 32;
/// Host bytes per token of a batch file read for grad or logprobs (batch_file.hpp): each integer
/// tensor read as int64, the ids, labels, targets and positions kept, plus the backward's own.
inline constexpr std::uint64_t batch_host_bytes_per_token = 96;
/// Host bytes per token of a token data set read for train (io/token_file.hpp): input_ids,
/// labels and position_ids as int64, and one int64 tensor being converted.
inline constexpr std::uint64_t data_host_bytes_per_token = 32;

/// Refuses `batch` x `seq` tokens whose predicted peak activation bytes under `options` (the
/// planner's dry run) exceed the memory this process may use: a usage_error (exit 2) when the
/// sizes are arguments, else a tightfit::error (exit 1), naming `what`. The token count itself
/// is checked first, so the dry run never allocates past the limit.
template <std::floating_point T>
void check_activations_fit(const std::string& what, bool argument, const model_config& cfg,
                           index_t batch, index_t seq, const backward_options& options,
                           std::uint64_t host_per_token = host_bytes_per_token) {
  if (!argument) {
    try {
      check_activations_fit<T>(what, true, cfg, batch, seq, options, host_per_token);
    } catch (const usage_error& e) {
      throw error(e.message);
    }
    return;
  }
  const std::uint64_t limit = memory_limit_bytes();
  const auto host = checked_product(
      {static_cast<std::uint64_t>(batch), static_cast<std::uint64_t>(seq), host_per_token});
  if (!host || *host > limit)
    throw usage_error{what + ": " + std::to_string(batch) + " x " + std::to_string(seq) +
                      " tokens need more than the " + byte_string(limit) +
                      " this process may use (physical memory, ulimit -v / -d)"};
  const std::uint64_t peak = predict_peak_activation_bytes<T>(cfg, batch, seq, options, sft_loss{});
  const auto total = checked_sum(peak, *host);
  if (!total || *total > limit)
    throw usage_error{what + ": " + std::to_string(batch) + " x " + std::to_string(seq) +
                      " tokens need " + byte_string(peak) + " of activations (schedule " +
                      std::string(to_string(options.sched)) + "), more than the " +
                      byte_string(limit) +
                      " this process may use (physical memory, ulimit -v / -d)"};
}

/// Refuses, before it is read, a token data set (train --data: input_ids (N, T) in a safetensors
/// file) whose N x T tokens need more host memory than this process may use. A file without a
/// two-dimensional input_ids is left to read_token_table's error.
inline void check_token_table_fits(const std::string& path) {
  const auto f = safetensors_file::open(path);
  if (!f.contains("input_ids") || f.info("input_ids").shape.size() != 2) return;
  const auto& shape = f.info("input_ids").shape;
  const auto bytes =
      checked_product({static_cast<std::uint64_t>(shape[0]), static_cast<std::uint64_t>(shape[1]),
                       data_host_bytes_per_token});
  check(bytes.has_value(), path, ": input_ids (", shape[0], ", ", shape[1],
        ") holds more tokens than 64-bit byte counts");
  check_memory(path + ": input_ids (" + std::to_string(shape[0]) + ", " + std::to_string(shape[1]) +
                   ") at " + std::to_string(data_host_bytes_per_token) + " bytes per token",
               *bytes);
}

/// Throws tightfit::error unless every weight of `params` is finite, naming the tensor.
template <class P>
void check_finite_weights(P& params, const std::string& source) {
  for (std::size_t i = 0; i < params.size(); ++i) {
    const auto v = params.value(i);
    for (std::size_t k = 0; k < v.size(); ++k)
      check(std::isfinite(static_cast<double>(v[k])), source, ": tensor '", params.name(i),
            "' holds ", v[k], " at index ", k, " (weights must be finite)");
  }
}

/// Throws tightfit::error unless every gradient of `params` is finite, naming the tensor.
template <class P>
void check_finite_gradients(P& params, const std::string& when) {
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (!params.has_grad(i)) continue;
    const auto g = params.grad(i);
    for (std::size_t k = 0; k < g.size(); ++k)
      check(std::isfinite(static_cast<double>(g[k])), when, ": the gradient of '", params.name(i),
            "' holds ", g[k], " at index ", k, " (not finite); nothing written");
  }
}

}  // namespace tightfit::cli
