// Checks the tightfit subcommands make before any work, and on the values they write:
//  - output paths: never an input (the same file after resolving links, or the directory holding
//    the model), writable (an existing directory, permission) -- usage errors, exit 2;
//  - sizes: a model's parameters and a batch's activations against the memory this process may
//    use (core/limits.hpp), a config.json against the checkpoint beside it -- before allocation;
//  - finite values: weights read, gradients and losses computed (tightfit::error, exit 1).
#pragma once

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <string>
#include <system_error>
#include <vector>

#include "args.hpp"
#include "tightfit/core/limits.hpp"
#include "tightfit/loss/sft.hpp"
#include "tightfit/nn/hf_model.hpp"
#include "tightfit/stream/planner.hpp"

namespace tightfit::cli {

namespace fs = std::filesystem;

/// The inputs and outputs of one command. Register every input first; each output is checked
/// when registered and refused with a usage_error naming the option and the path.
class path_guard {
 public:
  /// An input file, or a directory whose files are all inputs (a model directory). A path that
  /// does not exist is ignored here (opening it reports the error).
  void input(const fs::path& p) {
    std::error_code ec;
    if (fs::is_directory(p, ec)) {
      dirs_.push_back(p);
      for (const auto& e : fs::directory_iterator(p, ec))
        if (e.is_regular_file(ec)) files_.push_back(e.path());
    } else if (fs::exists(p, ec)) {
      files_.push_back(p);
    }
  }

  /// An output file named by option `key`. When `p` is an existing directory and `in_dir` is
  /// given, the file written is p / in_dir (as save_hf_weights does); otherwise a directory is
  /// refused.
  void output_file(const std::string& key, const fs::path& p, const char* in_dir = nullptr) {
    std::error_code ec;
    fs::path f = p;
    if (fs::is_directory(p, ec)) {
      if (in_dir == nullptr) refuse(key, p, "is a directory, expected a file name");
      not_an_input_dir(key, p);
      f = p / in_dir;
    }
    check_file(key, p, f);
  }

  /// An output directory named by option `key` (created when missing) receiving `files`.
  void output_dir(const std::string& key, const fs::path& p,
                  std::initializer_list<const char*> files) {
    std::error_code ec;
    if (fs::exists(p, ec)) {
      if (!fs::is_directory(p, ec)) refuse(key, p, "exists and is not a directory");
      not_an_input_dir(key, p);
      if (::access(p.c_str(), W_OK | X_OK) != 0) refuse(key, p, "is not writable");
    } else {
      fs::path up = p.parent_path();
      while (!up.empty() && !fs::exists(up, ec) && up != up.parent_path()) up = up.parent_path();
      if (up.empty()) up = ".";
      if (!fs::is_directory(up, ec))
        refuse(key, p, "cannot be created ('" + up.string() + "' is not a directory)");
      if (::access(up.c_str(), W_OK | X_OK) != 0)
        refuse(key, p, "cannot be created ('" + up.string() + "' is not writable)");
    }
    created_.push_back(p);
    for (const char* name : files) check_file(key, p, p / name);
  }

 private:
  [[noreturn]] static void refuse(const std::string& key, const fs::path& p,
                                  const std::string& why) {
    throw usage_error{key + " '" + p.string() + "' " + why};
  }

  void not_an_input_dir(const std::string& key, const fs::path& p) const {
    std::error_code ec;
    for (const auto& d : dirs_)
      if (fs::equivalent(p, d, ec))
        refuse(key, p, "is the input directory '" + d.string() + "'; refusing to write into it");
  }

  void check_file(const std::string& key, const fs::path& shown, const fs::path& f) {
    std::error_code ec;
    const bool exists = fs::exists(f, ec);
    if (exists) {
      for (const auto& in : files_)
        if (fs::equivalent(f, in, ec))
          refuse(key, shown, "would overwrite the input '" + in.string() + "'");
      for (const auto& out : outputs_)
        if (fs::equivalent(f, out, ec))
          refuse(key, shown, "is also written by another option ('" + out.string() + "')");
      if (fs::is_directory(f, ec)) refuse(key, shown, "names a directory '" + f.string() + "'");
      if (::access(f.c_str(), W_OK) != 0) refuse(key, shown, "is not writable");
    } else {
      for (const auto& out : outputs_)
        if (fs::weakly_canonical(f, ec) == fs::weakly_canonical(out, ec))
          refuse(key, shown, "is also written by another option ('" + out.string() + "')");
      // The directory it goes into must exist (or be created by output_dir) and be writable.
      fs::path dir = f.parent_path();
      if (dir.empty()) dir = ".";
      if (fs::exists(dir, ec)) {
        if (!fs::is_directory(dir, ec))
          refuse(key, shown, "is inside '" + dir.string() + "', which is not a directory");
        if (::access(dir.c_str(), W_OK | X_OK) != 0)
          refuse(key, shown, "cannot be written: '" + dir.string() + "' is not writable");
      } else if (!created_dir(dir)) {
        refuse(key, shown, "cannot be written: directory '" + dir.string() + "' does not exist");
      }
    }
    outputs_.push_back(f);
  }

  /// True when `dir` is a directory an output_dir call will create.
  bool created_dir(const fs::path& dir) const {
    for (const auto& d : created_)
      if (d == dir) return true;
    return false;
  }

  std::vector<fs::path> files_, dirs_, outputs_, created_;
};

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

/// Host bytes per token that a backward (or the planner's dry run) holds outside the counted
/// activations: token ids, targets and their masked copies.
inline constexpr std::uint64_t host_bytes_per_token = 32;

/// Refuses `batch` x `seq` tokens whose predicted peak activation bytes under `options` (the
/// planner's dry run) exceed the memory this process may use: a usage_error (exit 2) when the
/// sizes are arguments, else a tightfit::error (exit 1), naming `what`. The token count itself
/// is checked first, so the dry run never allocates past the limit.
template <std::floating_point T>
void check_activations_fit(const std::string& what, bool argument, const model_config& cfg,
                           index_t batch, index_t seq, const backward_options& options) {
  if (!argument) {
    try {
      check_activations_fit<T>(what, true, cfg, batch, seq, options);
    } catch (const usage_error& e) {
      throw error(e.message);
    }
    return;
  }
  const std::uint64_t limit = memory_limit_bytes();
  const auto host = checked_product(
      {static_cast<std::uint64_t>(batch), static_cast<std::uint64_t>(seq), host_bytes_per_token});
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
