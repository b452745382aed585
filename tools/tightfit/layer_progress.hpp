// Progress of one long forward or forward + backward (`tightfit grad`, `tightfit logprobs`): the
// library calls between_layers() after each layer (stream/forward.hpp, stream/backward.hpp);
// this prints "\r<command>: forward layer k/L  elapsed H:MM:SS" (then "backward layer k/L") on
// stderr, only when stderr is a terminal (scripts and tests read clean output) and only after
// the first two seconds (short runs print nothing), and ends its line when done.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "tightfit/core/types.hpp"
#include "tightfit/optim/callbacks.hpp"

namespace tightfit::cli {

class layer_progress {
 public:
  /// layers: the model's; shown: false for ranks other than 0 (one line per job).
  layer_progress(std::string command, index_t layers, bool shown = true)
      : command_(std::move(command)),
        layers_(layers),
        shown_(shown && ::isatty(STDERR_FILENO) == 1),
        start_(std::chrono::steady_clock::now()) {}
  layer_progress(const layer_progress&) = delete;
  layer_progress& operator=(const layer_progress&) = delete;
  ~layer_progress() {
    if (printed_) std::fprintf(stderr, "\n");
  }

  /// The between_layers hook: one more layer done.
  void operator()() {
    ++done_;
    if (!shown_) return;
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    if (seconds < 2) return;
    const bool forward = done_ <= layers_;
    std::fprintf(stderr, "\r%s: %s layer %lld/%lld  elapsed %s   ", command_.c_str(),
                 forward ? "forward" : "backward",
                 static_cast<long long>(forward ? done_ : done_ - layers_),
                 static_cast<long long>(layers_), progress_line::clock_time(seconds).c_str());
    std::fflush(stderr);
    printed_ = true;
  }

 private:
  std::string command_;
  index_t layers_;
  bool shown_;
  std::chrono::steady_clock::time_point start_;
  index_t done_ = 0;
  bool printed_ = false;
};

}  // namespace tightfit::cli
