// tightfit/io/detail/file_reader.hpp: a read-only file read by position (pread), the way every
// tightfit reader of a large input file (safetensors, PLY) gets its bytes.
//
// Why not mmap. A mapped file that another process truncates while it is read raises SIGBUS on
// the lost pages, and a library cannot catch that without a process-wide signal handler and a
// non-local jump out of the reading code (unsafe in C++ frames and in worker threads). pread
// reports the same event as a short read: a tightfit::error naming the file, the offset and the
// length it had when it was opened. Thread-safe: reads share no file position, so any number of
// threads may read one file_reader at once. The cost against the mapping (docs/benchmarks.md,
// "Reading files: pread against mmap"): the copy from the page cache, about 0.04 ms per MiB
// (19 % more CPU than converting in place from a mapping, on a warm cache).
//
// Invariants: the file is a regular file (a directory, a FIFO, a device is refused when opened,
// without blocking on a FIFO that has no writer); size() is its length when opened, and every
// read inside [0, size()) either fills its destination or throws.
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <utility>

#include "tightfit/core/error.hpp"

#if defined(__unix__) || defined(__APPLE__)
#define TIGHTFIT_IO_HAS_PREAD 1
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#else
#include <fstream>
#include <iterator>
#include <vector>
#endif

namespace tightfit::io::detail {

class file_reader {
 public:
  file_reader() = default;

  /// Opens `path` for reading; throws tightfit::error naming the path and the reason (missing,
  /// not readable, not a regular file).
  explicit file_reader(const std::filesystem::path& path) : path_(path.string()) {
#ifdef TIGHTFIT_IO_HAS_PREAD
    // O_NONBLOCK: opening a FIFO without a writer must not block; cleared below for a file.
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd_ < 0) fail(path_, ": cannot open: ", std::strerror(errno));
    struct ::stat st {};
    if (::fstat(fd_, &st) != 0) {
      const int err = errno;
      close();
      fail(path_, ": cannot stat: ", std::strerror(err));
    }
    if (!S_ISREG(st.st_mode)) {
      const char* kind = S_ISDIR(st.st_mode)    ? "a directory"
                         : S_ISFIFO(st.st_mode) ? "a FIFO"
                         : S_ISCHR(st.st_mode)  ? "a character device"
                         : S_ISBLK(st.st_mode)  ? "a block device"
                         : S_ISSOCK(st.st_mode) ? "a socket"
                                                : "not a regular file";
      close();
      fail(path_, ": is ", kind, ", expected a regular file");
    }
    const int flags = ::fcntl(fd_, F_GETFL);
    if (flags >= 0) (void)::fcntl(fd_, F_SETFL, flags & ~O_NONBLOCK);
    size_ = static_cast<std::uint64_t>(st.st_size);
#else
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec)) fail(path_, ": is a directory, expected a file");
    std::ifstream in(path, std::ios::binary);
    if (!in) fail(path_, ": cannot open");
    std::vector<char> raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    storage_.resize(raw.size());
    if (!raw.empty()) std::memcpy(storage_.data(), raw.data(), raw.size());
    size_ = storage_.size();
#endif
  }

  file_reader(const file_reader&) = delete;
  file_reader& operator=(const file_reader&) = delete;
  file_reader(file_reader&& other) noexcept {
    swap(other);
  }
  file_reader& operator=(file_reader&& other) noexcept {
    if (this != &other) {
      file_reader dead(std::move(*this));
      swap(other);
    }
    return *this;
  }
  ~file_reader() {
    close();
  }

  /// The file's length when it was opened.
  std::uint64_t size() const {
    return size_;
  }
  /// The path, as given (for messages).
  const std::string& path() const {
    return path_;
  }
  bool is_open() const {
#ifdef TIGHTFIT_IO_HAS_PREAD
    return fd_ >= 0;
#else
    return !path_.empty();
#endif
  }

  /// Fills `out` with the bytes at [offset, offset + out.size()). Throws tightfit::error naming
  /// the file when the range lies outside its opening length, when the file has become shorter
  /// (truncated while it is read) or when the system reports an error.
  void read(std::uint64_t offset, std::span<std::byte> out) const {
    if (out.empty()) return;
    check(offset <= size_ && out.size() <= size_ - offset, path_, ": cannot read ", out.size(),
          " bytes at offset ", offset, ": the file has ", size_, " bytes");
#ifdef TIGHTFIT_IO_HAS_PREAD
    std::size_t done = 0;
    while (done < out.size()) {
      // at most 1 GiB per call (some systems cap a single read below 2 GiB)
      const std::size_t want = std::min<std::size_t>(out.size() - done, std::size_t{1} << 30);
      const ::ssize_t got =
          ::pread(fd_, out.data() + done, want, static_cast<::off_t>(offset + done));
      if (got < 0) {
        if (errno == EINTR) continue;
        fail(path_, ": cannot read ", want, " bytes at offset ", offset + done, ": ",
             std::strerror(errno));
      }
      if (got == 0)
        fail(path_, ": the file ends at byte ", offset + done, ", but it had ", size_,
             " bytes when it was opened (truncated while it was read?)");
      done += static_cast<std::size_t>(got);
    }
#else
    std::memcpy(out.data(), storage_.data() + offset, out.size());
#endif
  }

 private:
  void swap(file_reader& other) noexcept {
    std::swap(path_, other.path_);
    std::swap(size_, other.size_);
#ifdef TIGHTFIT_IO_HAS_PREAD
    std::swap(fd_, other.fd_);
#else
    std::swap(storage_, other.storage_);
#endif
  }
  void close() noexcept {
#ifdef TIGHTFIT_IO_HAS_PREAD
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
#endif
  }

  std::string path_;
  std::uint64_t size_ = 0;
#ifdef TIGHTFIT_IO_HAS_PREAD
  int fd_ = -1;
#else
  std::vector<std::byte> storage_;
#endif
};

}  // namespace tightfit::io::detail
