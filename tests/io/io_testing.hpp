// Helpers shared by the io tests: error capture and scratch directories.
#pragma once

#include <atomic>
#include <filesystem>
#include <string>
#include <system_error>

#include "tightfit/core/error.hpp"

#if defined(__unix__) || defined(__APPLE__)
#include <unistd.h>
#endif

namespace tightfit::testing {

/// The message of the tightfit::error thrown by f, or "<no error>" when none is thrown.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const tightfit::error& e) {
    return e.what();
  }
  return "<no error>";
}

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

/// A fresh directory under the system temp directory, removed with its contents on exit.
class scratch_dir {
 public:
  scratch_dir() {
    static std::atomic<int> counter{0};
    long pid = 0;
#if defined(__unix__) || defined(__APPLE__)
    pid = static_cast<long>(::getpid());
#endif
    path_ = std::filesystem::temp_directory_path() /
            ("tightfit_io_" + std::to_string(pid) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  scratch_dir(const scratch_dir&) = delete;
  scratch_dir& operator=(const scratch_dir&) = delete;
  ~scratch_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const {
    return path_;
  }
  std::filesystem::path operator/(const std::string& name) const {
    return path_ / name;
  }

 private:
  std::filesystem::path path_;
};

}  // namespace tightfit::testing
