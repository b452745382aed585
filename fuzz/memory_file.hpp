// A file in memory for the fuzz targets (memfd_create), reachable by a path with a chosen
// extension (a symbolic link to /proc/self/fd/N), so that the readers that open files by path
// (reading by position, io/detail/file_reader.hpp and geometry/cloud_io.hpp) see each input as a
// regular file without touching the disk.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace tightfit::fuzzing {

class memory_file {
 public:
  explicit memory_file(const std::string& extension) {
    fd_ = ::memfd_create("tightfit-fuzz", MFD_CLOEXEC);
    if (fd_ < 0) std::abort();
    path_ = (std::filesystem::temp_directory_path() /
             ("tightfit-fuzz-" + std::to_string(::getpid()) + extension))
                .string();
    std::error_code ec;
    std::filesystem::remove(path_, ec);
    std::filesystem::create_symlink("/proc/self/fd/" + std::to_string(fd_), path_, ec);
    if (ec) std::abort();
  }
  memory_file(const memory_file&) = delete;
  memory_file& operator=(const memory_file&) = delete;
  ~memory_file() {
    std::error_code ec;
    std::filesystem::remove(path_, ec);
    ::close(fd_);
  }
  /// The file now holds exactly `data`.
  void assign(const std::uint8_t* data, std::size_t size) {
    if (::ftruncate(fd_, 0) != 0) std::abort();
    std::size_t done = 0;
    while (done < size) {
      const ::ssize_t n = ::pwrite(fd_, data + done, size - done, static_cast<::off_t>(done));
      if (n <= 0) std::abort();
      done += static_cast<std::size_t>(n);
    }
  }
  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
};

}  // namespace tightfit::fuzzing
