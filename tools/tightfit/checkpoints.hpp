// Periodic checkpoints of `tightfit train` (--save-steps, --save-total-limit, --output-dir) in
// the layout of transformers' Trainer: OUTPUT_DIR/checkpoint-N/ after optimizer step N, holding
// state.safetensors (weights + optimizer state, optim/checkpoint.hpp; under --parallel data
// with a sharded state, rank r > 0 writes state.safetensors.rankR beside it) and
// trainer_state.json ({"global_step": N}). A checkpoint is written into checkpoint-N.partial and
// renamed when complete, so a run killed while saving leaves no checkpoint-N that does not load;
// `--resume OUTPUT_DIR` continues from the highest complete checkpoint-N, `--resume
// OUTPUT_DIR/checkpoint-N` from that one. --save-total-limit K keeps the K newest checkpoints
// (never the one the run resumed from).
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "args.hpp"
#include "tightfit/core/error.hpp"

namespace tightfit::cli {

/// The state file of a checkpoint folder.
inline constexpr const char* checkpoint_state_name = "state.safetensors";

/// N of a folder named checkpoint-N (digits only), or nothing.
inline std::optional<std::int64_t> checkpoint_step(const std::filesystem::path& dir) {
  const std::string name = dir.filename().string();
  const std::string prefix = "checkpoint-";
  if (name.rfind(prefix, 0) != 0 || name.size() == prefix.size() ||
      name.size() > prefix.size() + 18)
    return std::nullopt;
  std::int64_t n = 0;
  for (std::size_t i = prefix.size(); i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
    n = n * 10 + (name[i] - '0');
  }
  return n;
}

/// The complete checkpoint-N folders of `dir`, oldest (smallest N) first.
inline std::vector<std::filesystem::path> checkpoint_dirs(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  std::vector<std::pair<std::int64_t, fs::path>> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (const auto n = checkpoint_step(e.path()); n && e.is_directory(ec))
      found.emplace_back(*n, e.path());
  std::sort(found.begin(), found.end());
  std::vector<fs::path> out;
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

/// The state file --resume names: a file as it is; a checkpoint folder's state.safetensors; an
/// output folder's newest checkpoint. Anything else is a usage_error naming it.
inline std::string resume_state_file(const std::string& given) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(given, ec)) return given;
  if (fs::exists(fs::path(given) / checkpoint_state_name, ec))
    return (fs::path(given) / checkpoint_state_name).string();
  const auto dirs = checkpoint_dirs(given);
  if (dirs.empty())
    throw usage_error{"--resume " + given + " is a folder without " + checkpoint_state_name +
                      " and without checkpoint-N folders"};
  return (dirs.back() / checkpoint_state_name).string();
}

/// Writes checkpoint-N folders every `every` steps and keeps the newest `keep` (0: all).
class checkpoint_saver {
 public:
  /// barrier: every rank's files are written between the two calls of a save.
  checkpoint_saver(std::filesystem::path output_dir, std::int64_t every, std::int64_t keep,
                   std::filesystem::path resumed_from, bool root, std::function<void()> barrier)
      : dir_(std::move(output_dir)),
        every_(every),
        keep_(keep),
        resumed_(std::move(resumed_from)),
        root_(root),
        barrier_(std::move(barrier)) {}

  bool due(std::int64_t step) const { return every_ > 0 && step % every_ == 0; }

  /// Saves after optimizer step `step`: write(folder) writes this rank's state files into the
  /// folder (every rank calls save alike).
  void save(std::int64_t step, const std::function<void(const std::filesystem::path&)>& write) {
    namespace fs = std::filesystem;
    const fs::path final_dir = dir_ / ("checkpoint-" + std::to_string(step));
    const fs::path partial = dir_ / ("checkpoint-" + std::to_string(step) + ".partial");
    if (root_) {
      std::error_code ec;
      fs::remove_all(partial, ec);
      fs::create_directories(partial);
    }
    barrier_();
    write(partial);
    barrier_();
    if (!root_) return;
    {
      std::ofstream js(partial / "trainer_state.json");
      js << "{\"global_step\": " << step << "}\n";
      check(static_cast<bool>(js), (partial / "trainer_state.json").string(),
            ": cannot write the checkpoint");
    }
    std::error_code ec;
    if (fs::exists(final_dir, ec)) fs::remove_all(final_dir);  // an older run's checkpoint-N
    fs::rename(partial, final_dir);
    if (keep_ > 0) {
      auto dirs = checkpoint_dirs(dir_);
      const auto resumed = fs::weakly_canonical(resumed_, ec);
      std::erase_if(dirs, [&](const fs::path& d) {
        return !resumed_.empty() && fs::weakly_canonical(d, ec) == resumed;
      });
      for (std::size_t i = 0; i + static_cast<std::size_t>(keep_) < dirs.size(); ++i)
        fs::remove_all(dirs[i]);
    }
  }

 private:
  std::filesystem::path dir_;
  std::int64_t every_, keep_;
  std::filesystem::path resumed_;  // the checkpoint folder resumed from, or empty
  bool root_;
  std::function<void()> barrier_;
};

}  // namespace tightfit::cli
