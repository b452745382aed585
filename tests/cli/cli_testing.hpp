// Helpers for the end-to-end tests of the tightfit tool: run it, capture its output, and a
// scratch directory of this process (several build trees may run these tests at once).
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace tightfit::cli_testing {

namespace fs = std::filesystem;

/// The scratch root of this process: the system temp directory / tightfit-cli-test-PID.
inline fs::path scratch_root() {
  return fs::temp_directory_path() / ("tightfit-cli-test-" + std::to_string(::getpid()));
}

/// Removes the scratch root when the test program exits.
inline struct scratch_cleanup {
  scratch_cleanup() = default;
  scratch_cleanup(const scratch_cleanup&) = delete;
  scratch_cleanup& operator=(const scratch_cleanup&) = delete;
  ~scratch_cleanup() {
    std::error_code ec;
    fs::remove_all(scratch_root(), ec);
  }
} scratch_cleanup_at_exit;

/// Directory `name` under the scratch root, created on first use.
inline fs::path scratch(const std::string& name) {
  const fs::path dir = scratch_root() / name;
  fs::create_directories(dir);
  return dir;
}

/// Exit status and captured streams of one run of the tool.
struct outcome {
  int code = -1;
  std::string out, err;
};

inline std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

/// Runs the tool with `args` (a shell-quoted string), capturing stdout and stderr.
inline outcome run(const std::string& args) {
  static int counter = 0;
  const fs::path dir = scratch("io");
  const auto out = dir / ("out" + std::to_string(counter));
  const auto err = dir / ("err" + std::to_string(counter++));
  const std::string cmd = std::string("'") + TIGHTFIT_CLI + "' " + args + " >'" + out.string() +
                          "' 2>'" + err.string() + "'";
  const int status = std::system(cmd.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(out), slurp(err)};
}

/// Number of newline characters.
inline int lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

/// Single-quoted for the shell (paths here hold no quote).
inline std::string q(const fs::path& p) {
  return "'" + p.string() + "'";
}

}  // namespace tightfit::cli_testing
