// tightfit/backend/detail/host_storage.hpp: the storage half of a backend whose memory is host
// memory (reference_backend, eigen_backend): zero-initialised buffers counted by a
// memory_counter, the kernel counters, and upload / download as checked plain copies.
#pragma once

#include <algorithm>
#include <concepts>
#include <span>

#include "tightfit/backend/concept.hpp"
#include "tightfit/backend/detail/reference_checks.hpp"
#include "tightfit/core/memory.hpp"
#include "tightfit/core/types.hpp"

namespace tightfit::detail {

/// Base of the host backends: owns their memory_counter and kernel_stats (hence non-copyable).
template <std::floating_point T>
class host_storage {
 public:
  host_storage() = default;
  host_storage(const host_storage&) = delete;
  host_storage& operator=(const host_storage&) = delete;

  /// Live and peak bytes of every buffer allocated through this backend.
  memory_counter& memory() { return memory_; }
  /// Kernel call and flop counters.
  kernel_stats& stats() { return stats_; }

  /// A zero-initialised host buffer of n elements counted by memory().
  template <class U>
  host_buffer<U> allocate(index_t n) {
    return host_buffer<U>(memory_, n);
  }
  /// Host -> backend memory (a host copy here). Sizes must match.
  void upload(std::span<const T> src, std::span<T> dst) {
    check_size("upload", "dst", dst, static_cast<index_t>(src.size()), "(src.size)");
    std::copy_n(src.begin(), dst.size(), dst.begin());  // equal sizes (dst.size: GCC 12's
                                                        // -Warray-bounds cannot see the check)
  }
  /// Backend memory -> host (a host copy here). Sizes must match.
  void download(std::span<const T> src, std::span<T> dst) {
    check_size("download", "dst", dst, static_cast<index_t>(src.size()), "(src.size)");
    std::copy_n(src.begin(), dst.size(), dst.begin());
  }

 protected:
  ~host_storage() = default;

  memory_counter memory_;
  kernel_stats stats_;
};

}  // namespace tightfit::detail
