// tightfit/io/detail/mapped_file.hpp: a read-only memory mapping of a whole file (RAII,
// move-only). POSIX mmap where available; elsewhere the file is read into memory.
// The mapping is private and read-only: a file truncated by another process while mapped can
// still raise SIGBUS on access (a property of mmap that no reader can prevent).
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <utility>

#include "tightfit/core/error.hpp"

#if defined(__unix__) || defined(__APPLE__)
#define TIGHTFIT_IO_HAS_MMAP 1
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#else
#include <fstream>
#include <iterator>
#include <vector>
#endif

namespace tightfit::io::detail {

class mapped_file {
 public:
  mapped_file() = default;

  /// Maps `path` read-only; throws tightfit::error naming the path and the OS reason.
  explicit mapped_file(const std::filesystem::path& path) {
#ifdef TIGHTFIT_IO_HAS_MMAP
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail(path.string(), ": cannot open: ", std::strerror(errno));
    struct ::stat st {};
    if (::fstat(fd, &st) != 0) {
      const int err = errno;
      ::close(fd);
      fail(path.string(), ": cannot stat: ", std::strerror(err));
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      fail(path.string(), ": not a regular file");
    }
    size_ = static_cast<std::size_t>(st.st_size);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        const int err = errno;
        ::close(fd);
        fail(path.string(), ": cannot map ", size_, " bytes: ", std::strerror(err));
      }
      data_ = static_cast<const std::byte*>(p);
    }
    ::close(fd);
#else
    std::ifstream in(path, std::ios::binary);
    if (!in) fail(path.string(), ": cannot open");
    std::vector<char> raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    storage_.resize(raw.size());
    if (!raw.empty()) std::memcpy(storage_.data(), raw.data(), raw.size());
    data_ = storage_.data();
    size_ = storage_.size();
#endif
  }

  mapped_file(const mapped_file&) = delete;
  mapped_file& operator=(const mapped_file&) = delete;
  mapped_file(mapped_file&& other) noexcept {
    swap(other);
  }
  mapped_file& operator=(mapped_file&& other) noexcept {
    if (this != &other) {
      mapped_file dead(std::move(*this));
      swap(other);
    }
    return *this;
  }
  ~mapped_file() {
    release();
  }

  /// The file's bytes (empty for an empty file).
  std::span<const std::byte> bytes() const {
    return {data_, size_};
  }

 private:
  void swap(mapped_file& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
#ifndef TIGHTFIT_IO_HAS_MMAP
    std::swap(storage_, other.storage_);
#endif
  }
  void release() noexcept {
#ifdef TIGHTFIT_IO_HAS_MMAP
    // const_cast: munmap takes void* but the mapping was created read-only.
    if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
#endif
    data_ = nullptr;
    size_ = 0;
  }

  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
#ifndef TIGHTFIT_IO_HAS_MMAP
  std::vector<std::byte> storage_;
#endif
};

}  // namespace tightfit::io::detail
