// tightfit/optim/callbacks.hpp: callbacks for optim/train.hpp's loop (ensmallen style: each
// defines only the events it needs): a progress line on stderr and a JSON-lines log.
#pragma once

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <string>

#include "tightfit/core/error.hpp"
#include "tightfit/optim/train.hpp"

namespace tightfit {

/// "\rstep s/N  loss L  block b  X tok/s  peak P MiB" on stderr after each step, a newline at
/// the end.
struct progress_line {
  void on_step(const train_step& s) const {
    std::fprintf(stderr, "\rstep %lld/%lld  loss %.4f  block %lld  %.0f tok/s  peak %.1f MiB   ",
                 static_cast<long long>(s.index + 1), static_cast<long long>(s.steps),
                 s.result->loss, static_cast<long long>(s.result->block), s.tokens / s.seconds,
                 static_cast<double>(s.result->backward.peak_bytes) / (1024.0 * 1024.0));
    std::fflush(stderr);
  }
  void on_end(const train_summary& sum) const {
    if (!sum.losses.empty()) std::fprintf(stderr, "\n");
  }
};

/// One JSON object per step (step, loss, lr_factor, block, tokens, tokens_per_s, seconds,
/// peak_bytes, state_bytes) to a file, truncated when the log is made; the loss and the lr
/// factor with 17 significant digits (they round-trip), the rest with 6.
class json_log {
 public:
  explicit json_log(const std::filesystem::path& path) : path_(path), out_(path, std::ios::trunc) {
    check(static_cast<bool>(out_), path.string(), ": cannot open the log for writing");
  }
  void on_step(const train_step& s) {
    const step_result& r = *s.result;
    // The loss and the lr factor with every digit (a run is compared with another to 1e-12).
    out_ << "{\"step\":" << s.step + 1 << std::setprecision(17) << ",\"loss\":" << r.loss
         << ",\"lr_factor\":" << s.lr_factor << std::setprecision(6) << ",\"block\":" << r.block
         << ",\"tokens\":" << s.tokens << ",\"tokens_per_s\":" << s.tokens / s.seconds
         << ",\"seconds\":" << s.seconds << ",\"peak_bytes\":" << r.backward.peak_bytes
         << ",\"state_bytes\":" << s.state_bytes << "}\n";
    out_.flush();  // a line per step; a full disk stops the run here, naming the log
    check(static_cast<bool>(out_), path_.string(), ": cannot write the log (step ", s.step + 1,
          ")");
  }
  void on_end(const train_summary&) {
    out_.flush();
    check(static_cast<bool>(out_), path_.string(), ": cannot write the log");
  }

 private:
  std::filesystem::path path_;
  std::ofstream out_;
};

}  // namespace tightfit
