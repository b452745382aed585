// tightfit/core/memory.hpp: memory accounting and the counted host buffer.
//
// Every activation buffer is allocated through a backend, and every backend owns one
// memory_counter: live bytes, peak bytes since the last reset, and nested scoped peaks
// (peak_scope) so that a schedule can report the peak of one call. Counting is thread-safe.
#pragma once

#include <atomic>
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
  std::size_t entry_bytes() const { return entry_live_; }

 private:
  memory_counter& counter_;
  std::size_t outer_peak_;
  std::size_t entry_live_;
};

/// An owning, zero-initialised, 64-byte aligned host array whose bytes are counted by a
/// memory_counter. Move-only.
template <class T>
class host_buffer {
 public:
  host_buffer() = default;
  host_buffer(memory_counter& counter, index_t count) : counter_(&counter), size_(count) {
    check(count >= 0, "host_buffer: element count is ", count, ", expected >= 0");
    if (count == 0) return;
    const std::size_t bytes = padded_bytes();
    data_ = static_cast<T*>(std::aligned_alloc(alignment, bytes));
    if (data_ == nullptr) throw std::bad_alloc();
    std::memset(static_cast<void*>(data_), 0, bytes);
    counter_->on_allocate(bytes_counted());
  }
  host_buffer(host_buffer&& o) noexcept
      : counter_(std::exchange(o.counter_, nullptr)),
        data_(std::exchange(o.data_, nullptr)),
        size_(std::exchange(o.size_, 0)) {}
  host_buffer& operator=(host_buffer&& o) noexcept {
    if (this != &o) {
      release();
      counter_ = std::exchange(o.counter_, nullptr);
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  host_buffer(const host_buffer&) = delete;
  host_buffer& operator=(const host_buffer&) = delete;
  ~host_buffer() { release(); }

  T* data() const { return data_; }
  index_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  std::span<T> span() const { return {data_, static_cast<std::size_t>(size_)}; }
  /// The buffer seen as a contiguous (rows, cols) matrix; rows * cols must equal size().
  matrix_view<T> view(index_t rows, index_t cols) const { return as_matrix(span(), rows, cols); }
  /// The buffer seen as (batch, rows, cols).
  tensor3_view<T> view(index_t batch, index_t rows, index_t cols) const {
    check(batch * rows * cols == size_, "host_buffer::view: ", size_,
          " elements cannot be seen as ", batch, "x", rows, "x", cols);
    return {data_, batch, rows, cols};
  }
  /// Frees the memory now (the buffer becomes empty).
  void reset() { release(); }

  static constexpr std::size_t alignment = 64;

 private:
  std::size_t bytes_counted() const { return static_cast<std::size_t>(size_) * sizeof(T); }
  std::size_t padded_bytes() const {
    return (bytes_counted() + alignment - 1) / alignment * alignment;
  }
  void release() {
    if (data_ != nullptr) {
      counter_->on_free(bytes_counted());
      std::free(data_);
    }
    data_ = nullptr;
    size_ = 0;
  }

  memory_counter* counter_ = nullptr;
  T* data_ = nullptr;
  index_t size_ = 0;
};

}  // namespace tightfit
