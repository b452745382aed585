// tightfit/optim/callbacks.hpp: callbacks for optim/train.hpp's loop (ensmallen style: each
// defines only the events it needs): a progress line on stderr and a JSON-lines log.
#pragma once

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iomanip>
#include <string>
#include <utility>

#include "tightfit/core/error.hpp"
#include "tightfit/optim/train.hpp"

namespace tightfit {

/// "\rstep s/N  loss L  block b  X tok/s  peak P MiB  elapsed E  eta R" on stderr after each
/// step (ETA: the mean step time so far times the steps left), a newline at the end.
struct progress_line {
  void on_step(const train_step& s) const {
    const double done = static_cast<double>(s.index + 1);
    const double eta = s.seconds / done * static_cast<double>(s.steps - s.index - 1);
    std::fprintf(stderr,
                 "\rstep %lld/%lld  loss %.4f  block %lld  %.0f tok/s  peak %.1f MiB  elapsed %s"
                 "  eta %s   ",
                 static_cast<long long>(s.index + 1), static_cast<long long>(s.steps),
                 s.result->loss, static_cast<long long>(s.result->block), s.tokens / s.seconds,
                 static_cast<double>(s.result->backward.peak_bytes) / (1024.0 * 1024.0),
                 clock_time(s.seconds).c_str(), clock_time(eta).c_str());
    std::fflush(stderr);
  }
  /// Seconds as H:MM:SS.
  static std::string clock_time(double seconds) {
    const auto t = static_cast<long long>(seconds < 0 ? 0 : seconds + 0.5);
    char buf[32];
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", t / 3600, t / 60 % 60, t % 60);
    return buf;
  }
  void on_end(const train_summary& sum) const {
    if (!sum.losses.empty()) std::fprintf(stderr, "\n");
  }
};

/// One JSON object per step (step, loss, lr_factor, lr when the base learning rate is given,
/// grad_norm when the optimizer computed it (clipping on), block, tokens, tokens_per_s, seconds,
/// peak_bytes, state_bytes) to a file, truncated when the log is made; the loss and the lr
/// factor with 17 significant digits (they round-trip), the rest with 6.
class json_log {
 public:
  /// base_lr > 0: each line also has the step's learning rate, base_lr x the schedule's factor.
  explicit json_log(const std::filesystem::path& path, double base_lr = 0)
      : path_(path), out_(path, std::ios::trunc), base_lr_(base_lr) {
    check(static_cast<bool>(out_), path.string(), ": cannot open the log for writing");
  }
  void on_step(const train_step& s) {
    const step_result& r = *s.result;
    // The loss and the lr factor with every digit (a run is compared with another to 1e-12).
    out_ << "{\"step\":" << s.step + 1 << std::setprecision(17) << ",\"loss\":" << r.loss
         << ",\"lr_factor\":" << s.lr_factor;
    if (base_lr_ > 0) out_ << ",\"lr\":" << base_lr_ * s.lr_factor;
    if (r.grad_norm >= 0) out_ << ",\"grad_norm\":" << r.grad_norm;  // computed when clipping
    out_ << std::setprecision(6) << ",\"block\":" << r.block << ",\"tokens\":" << s.tokens
         << ",\"tokens_per_s\":" << s.tokens / s.seconds << ",\"seconds\":" << s.seconds
         << ",\"peak_bytes\":" << r.backward.peak_bytes << ",\"state_bytes\":" << s.state_bytes
         << "}\n";
    out_.flush();  // a line per step; a full disk stops the run here, naming the log
    check(static_cast<bool>(out_), path_.string(), ": cannot write the log (step ", s.step + 1,
          ")");
  }
  /// A line of other values at `step` (1-based), e.g. an evaluation: {"step":S,"name":v,...},
  /// every value with 17 significant digits. `values`: (name, value) pairs, a braced list or a
  /// container.
  template <class Values = std::initializer_list<std::pair<const char*, double>>>
  void record(std::int64_t step, const Values& values) {
    out_ << "{\"step\":" << step << std::setprecision(17);
    for (const auto& [name, v] : values) out_ << ",\"" << name << "\":" << v;
    out_ << "}\n" << std::setprecision(6);
    out_.flush();
    check(static_cast<bool>(out_), path_.string(), ": cannot write the log (step ", step, ")");
  }
  void on_end(const train_summary&) {
    out_.flush();
    check(static_cast<bool>(out_), path_.string(), ": cannot write the log");
  }

 private:
  std::filesystem::path path_;
  std::ofstream out_;
  double base_lr_ = 0;
};

}  // namespace tightfit
