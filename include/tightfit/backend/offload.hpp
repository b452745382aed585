// tightfit/backend/offload.hpp: the host memory tier of a device backend, and a two-tier
// adapter that gives any backend one (for tests on the CPU and the planner's dry run).
//
// A backend whose tensors live in device memory (the CUDA backend) may offer a second tier:
// pinned host memory, counted by its own memory_counter. compute_gradients
// (stream/backward.hpp, backward_options::offload_layer_inputs) keeps the retained layer inputs
// there: each is copied out in the forward while the next layer computes, and copied back one
// layer ahead of its backward, so the device holds a few layer inputs instead of L
// (docs/streambp.md, "Past the memory floor").
//
// Contract of an OffloadBackend:
//  - allocate_host<U>(n): a Buffer in the host tier, counted by host_memory(), not memory();
//  - copy_to_host(src, dst) / copy_to_device(src, dst): asynchronous copies between the tiers,
//    ordered after every kernel issued before them (they see src as those kernels left it);
//  - wait_copies(): every copy issued so far has completed: kernels issued afterwards may read
//    its destination, and its source may be freed or overwritten. Until then neither is allowed.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "tightfit/backend/concept.hpp"
#include "tightfit/core/error.hpp"

namespace tightfit {

// clang-format off
/// A StorageBackend with a host memory tier (see the top comment for the contract).
template <class B>
concept OffloadBackend = StorageBackend<B> &&
    requires(B& be, index_t n, std::span<const storage_t<B>> cs, std::span<storage_t<B>> s) {
  { be.host_memory() } -> std::same_as<memory_counter&>;
  { be.template allocate_host<storage_t<B>>(n) } -> Buffer<storage_t<B>>;
  be.copy_to_host(cs, s);    // device -> host tier, asynchronous
  be.copy_to_device(cs, s);  // host tier -> device, asynchronous
  be.wait_copies();          // every copy issued so far is complete
};
// clang-format on

/// The buffer type of an OffloadBackend's host tier.
template <OffloadBackend B>
using host_buffer_t = decltype(std::declval<B&>().template allocate_host<storage_t<B>>(0));

/// Bytes and calls that crossed between the tiers.
struct transfer_stats {
  std::size_t bytes_to_host = 0;
  std::size_t bytes_to_device = 0;
  std::int64_t copies = 0;
  std::int64_t waits = 0;
};

/// Any DenseBackend with a counted second tier. Host-tier buffers are the base backend's own
/// buffers counted by host_memory(); copies are deferred until wait_copies(), the latest moment
/// an asynchronous device copy may happen, so code that reads a destination or frees a source
/// before waiting computes garbage or reads freed memory (the sanitizers see it) instead of
/// passing by luck. Over meta_backend it is the planner's dry run of offloading.
template <class Base>
requires DenseBackend<Base>
class two_tier_backend : public Base {
 public:
  using Base::Base;
  using S = storage_t<Base>;

  memory_counter& host_memory() { return host_; }
  transfer_stats& transfers() { return transfers_; }

  template <class U>
  auto allocate_host(index_t n) {
    using buffer = decltype(std::declval<Base&>().template allocate<U>(0));
    return buffer(host_, n);
  }
  void copy_to_host(std::span<const S> src, std::span<S> dst) {
    enqueue("copy_to_host", src, dst);
    transfers_.bytes_to_host += src.size() * sizeof(S);
  }
  void copy_to_device(std::span<const S> src, std::span<S> dst) {
    enqueue("copy_to_device", src, dst);
    transfers_.bytes_to_device += src.size() * sizeof(S);
  }
  void wait_copies() {
    for (const auto& c : pending_) {
      const auto n = static_cast<index_t>(c.src.size());
      Base::copy(as_matrix(c.src, 1, n), as_matrix(c.dst, 1, n));
    }
    pending_.clear();
    ++transfers_.waits;
  }
  /// Copies issued and not yet waited for.
  std::size_t pending_copies() const { return pending_.size(); }

 private:
  struct copy_job {
    std::span<const S> src;
    std::span<S> dst;
  };
  void enqueue(const char* what, std::span<const S> src, std::span<S> dst) {
    check(src.size() == dst.size(), what, ": src has ", src.size(), " elements, dst ", dst.size());
    if (src.empty()) return;
    pending_.push_back({src, dst});
    ++transfers_.copies;
  }

  memory_counter host_;
  transfer_stats transfers_;
  std::vector<copy_job> pending_;
};

}  // namespace tightfit
