// tightfit/core/memory.hpp: memory accounting and the counted buffer (host storage here; the
// meta and CUDA backends plug their own storage into counted_buffer).
//
// Every activation buffer is allocated through a backend, and every backend owns one
// memory_counter: live bytes, peak bytes since the last reset, and nested scoped peaks
// (peak_scope) so that a schedule can report the peak of one call. Counting is thread-safe.
#pragma once

#include <atomic>
#include <concepts>
#include <cstdlib>
#include <cstring>
#include <new>
#include <span>
#include <utility>

#include "tightfit/core/error.hpp"
#include "tightfit/core/types.hpp"
#include "tightfit/core/view.hpp"

namespace tightfit {

/// Counts live and peak bytes of the allocations made through one backend.
class memory_counter {
 public:
  memory_counter() = default;
  memory_counter(const memory_counter&) = delete;
  memory_counter& operator=(const memory_counter&) = delete;

  void on_allocate(std::size_t bytes) {
    const std::size_t now = live_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    std::size_t seen = peak_.load(std::memory_order_relaxed);
    while (now > seen && !peak_.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
    }
    allocations_.fetch_add(1, std::memory_order_relaxed);
  }
  void on_free(std::size_t bytes) { live_.fetch_sub(bytes, std::memory_order_relaxed); }

  /// Bytes allocated now.
  std::size_t live() const { return live_.load(std::memory_order_relaxed); }
  /// Highest live() since construction or the last reset_peak().
  std::size_t peak() const { return peak_.load(std::memory_order_relaxed); }
  /// Number of allocations so far.
  std::size_t allocations() const { return allocations_.load(std::memory_order_relaxed); }
  /// Restarts the peak at the current live bytes.
  void reset_peak() { peak_.store(live(), std::memory_order_relaxed); }

  /// Raises the peak to at least `bytes` (used by peak_scope to restore an outer peak).
  void raise_peak(std::size_t bytes) {
    std::size_t seen = peak_.load(std::memory_order_relaxed);
    while (bytes > seen && !peak_.compare_exchange_weak(seen, bytes, std::memory_order_relaxed)) {
    }
  }

 private:
  std::atomic<std::size_t> live_{0};
  std::atomic<std::size_t> peak_{0};
  std::atomic<std::size_t> allocations_{0};
};

/// Measures the peak of a region: on entry the counter's peak restarts at the live bytes;
/// peak_bytes() is the highest live count inside the region and peak_above_entry() the part
/// of it allocated inside. On exit the outer peak is restored (max of both), so scopes nest.
class peak_scope {
 public:
  explicit peak_scope(memory_counter& counter)
      : counter_(counter), outer_peak_(counter.peak()), entry_live_(counter.live()) {
    counter_.reset_peak();
  }
  peak_scope(const peak_scope&) = delete;
  peak_scope& operator=(const peak_scope&) = delete;
  ~peak_scope() { counter_.raise_peak(outer_peak_); }

  std::size_t peak_bytes() const { return counter_.peak(); }
  std::size_t peak_above_entry() const { return counter_.peak() - entry_live_; }

 private:
  memory_counter& counter_;
  std::size_t outer_peak_;
  std::size_t entry_live_;
};

/// Where a counted_buffer's bytes live. `allocate(bytes)` returns zero-filled memory (never null
/// for bytes > 0, throws on failure); `deallocate(p, bytes)` frees it; `name` names the buffer in
/// error messages. The host, pinned-host, device and meta (dry-run) buffers differ only here.
template <class S>
concept BufferStorage = std::movable<S> && requires(S s, void* p, std::size_t n) {
  { s.allocate(n) } -> std::same_as<void*>;
  { s.deallocate(p, n) }
  noexcept;
  { S::name } -> std::convertible_to<const char*>;
};

/// An owning, zero-initialised array of `size()` T whose size() * sizeof(T) bytes are counted by
/// a memory_counter while it lives; the Storage policy says where they live. Move-only.
template <class T, BufferStorage Storage>
class counted_buffer {
 public:
  counted_buffer() = default;
  counted_buffer(memory_counter& counter, index_t count, Storage storage = {})
      : counter_(&counter), storage_(std::move(storage)), size_(count) {
    check(count >= 0, Storage::name, ": element count is ", count, ", expected >= 0");
    if (count == 0) return;
    data_ = static_cast<T*>(storage_.allocate(bytes()));
    counter_->on_allocate(bytes());
  }
  counted_buffer(counted_buffer&& o) noexcept
      : counter_(std::exchange(o.counter_, nullptr)),
        storage_(std::move(o.storage_)),
        data_(std::exchange(o.data_, nullptr)),
        size_(std::exchange(o.size_, 0)) {}
  counted_buffer& operator=(counted_buffer&& o) noexcept {
    if (this != &o) {
      release();
      counter_ = std::exchange(o.counter_, nullptr);
      storage_ = std::move(o.storage_);
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  counted_buffer(const counted_buffer&) = delete;
  counted_buffer& operator=(const counted_buffer&) = delete;
  ~counted_buffer() { release(); }

  T* data() const { return data_; }
  index_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  std::span<T> span() const { return {data_, static_cast<std::size_t>(size_)}; }
  /// The buffer seen as a contiguous (rows, cols) matrix; rows * cols must equal size().
  matrix_view<T> view(index_t rows, index_t cols) const { return as_matrix(span(), rows, cols); }
  /// The buffer seen as (batch, rows, cols).
  tensor3_view<T> view(index_t batch, index_t rows, index_t cols) const {
    check(batch * rows * cols == size_, Storage::name, "::view: ", size_,
          " elements cannot be seen as ", batch, "x", rows, "x", cols);
    return {data_, batch, rows, cols};
  }
  /// Frees the memory now (the buffer becomes empty).
  void reset() { release(); }

 private:
  std::size_t bytes() const { return static_cast<std::size_t>(size_) * sizeof(T); }
  void release() noexcept {
    if (data_ != nullptr) {
      storage_.deallocate(data_, bytes());
      counter_->on_free(bytes());
    }
    data_ = nullptr;
    size_ = 0;
  }

  memory_counter* counter_ = nullptr;
  [[no_unique_address]] Storage storage_{};
  T* data_ = nullptr;
  index_t size_ = 0;
};

/// Host memory from std::aligned_alloc, 64-byte aligned (the size rounded up to whole lines).
struct aligned_host_storage {
  static constexpr const char* name = "host_buffer";
  static constexpr std::size_t alignment = 64;
  void* allocate(std::size_t bytes) {
    const std::size_t padded = (bytes + alignment - 1) / alignment * alignment;
    void* p = std::aligned_alloc(alignment, padded);
    if (p == nullptr) throw std::bad_alloc();
    std::memset(p, 0, padded);
    return p;
  }
  void deallocate(void* p, std::size_t) noexcept { std::free(p); }
};

/// An owning, zero-initialised, 64-byte aligned host array whose bytes are counted by a
/// memory_counter. Move-only.
template <class T>
using host_buffer = counted_buffer<T, aligned_host_storage>;

}  // namespace tightfit
