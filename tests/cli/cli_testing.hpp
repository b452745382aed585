// Helpers for the end-to-end tests of the tightfit tool: run it, capture its output, and a
// scratch directory of this process (several build trees may run these tests at once).
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

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

/// Runs the tool with `args` (a shell-quoted string) after the shell commands `prefix`,
/// capturing stdout and stderr (stdout_to: another destination for stdout, e.g. /dev/full).
inline outcome run_with(const std::string& prefix, const std::string& args,
                        const std::string& stdout_to = "") {
  static int counter = 0;
  const fs::path dir = scratch("io");
  const auto out = dir / ("out" + std::to_string(counter));
  const auto err = dir / ("err" + std::to_string(counter++));
  // TIGHTFIT_NO_CPU_WARNING: a portable (TIGHTFIT_NATIVE=OFF) build would otherwise add its
  // start-up line about unused vector extensions to every stderr the tests read.
  const std::string cmd = prefix + "TIGHTFIT_NO_CPU_WARNING=1 '" + TIGHTFIT_CLI + "' " + args +
                          " >'" + (stdout_to.empty() ? out.string() : stdout_to) + "' 2>'" +
                          err.string() + "'";
  const int status = std::system(cmd.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(out), slurp(err)};
}

/// Runs the tool with `args` (a shell-quoted string), capturing stdout and stderr.
inline outcome run(const std::string& args) {
  return run_with("", args);
}

// Sanitizers that reserve terabytes of shadow address space (address, thread, memory).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define TIGHTFIT_CLI_TESTING_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || \
    __has_feature(memory_sanitizer)
#define TIGHTFIT_CLI_TESTING_ASAN 1
#endif
#endif

/// The address-space limit run_limited puts on the tool (KiB for ulimit -v): 3 GiB, far below
/// what any of the refused sizes would allocate, far above what the tool needs to refuse them.
inline constexpr long memory_limit_kib = 3L << 20;

/// run() under `ulimit -v` (memory_limit_kib), so that an allocation made before validation
/// fails the test instead of passing slowly. Sanitized builds reserve terabytes of shadow
/// address space and cannot run under ulimit -v: there the limit is left off.
inline outcome run_limited(const std::string& args, const std::string& stdout_to = "") {
#ifdef TIGHTFIT_CLI_TESTING_ASAN
  return run_with("", args, stdout_to);
#else
  return run_with("ulimit -v " + std::to_string(memory_limit_kib) + " && MALLOC_ARENA_MAX=2 ", args,
                  stdout_to);
#endif
}

/// The lines of stderr that report a problem (a build warning of the tool is not one).
inline std::vector<std::string> problem_lines(const std::string& err) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start < err.size()) {
    std::size_t end = err.find('\n', start);
    if (end == std::string::npos) end = err.size();
    const std::string line = err.substr(start, end - start);
    if (line.rfind("tightfit: built without", 0) != 0) out.push_back(line);
    start = end + 1;
  }
  return out;
}

/// Number of newline characters.
inline int lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

/// Single-quoted for the shell (paths here hold no quote).
inline std::string q(const fs::path& p) {
  std::string out = "'";  // appended, not "'" + string: GCC 12 -Wrestrict false positive
  out += p.string();
  out += '\'';
  return out;
}

}  // namespace tightfit::cli_testing
