// tightfit/stream/layer_inputs.hpp: where compute_gradients keeps the layer inputs between the
// forward and the backward: in backend memory, or, with offload, in the backend's host tier
// (backend/offload.hpp), moved out while the next layer computes and fetched back one layer
// ahead of the backward that needs it.
//
// Invariants: input l is on the device, in the host tier, or nowhere (dropped, recomputed when
// needed); a buffer that a copy reads or writes is neither freed nor read by a kernel before the
// next settle(); every buffer is allocated through the backend and counted (device bytes by
// memory(), host-tier bytes by host_memory()).
#pragma once

#include <cstddef>
#include <vector>

#include "tightfit/backend/concept.hpp"
#include "tightfit/backend/offload.hpp"
#include "tightfit/core/error.hpp"

namespace tightfit::detail {

/// The host-tier buffer type of B, or a stand-in that is always empty when B has no host tier.
template <class B>
struct host_tier {
  struct none {
    bool empty() const { return true; }
    void reset() {}
  };
  using buffer = none;
};
template <OffloadBackend B>
struct host_tier<B> {
  using buffer = host_buffer_t<B>;
};

/// The inputs of layers 0..L (input L is the final hidden state), each (B*T, d).
template <StorageBackend B>
class layer_input_store {
 public:
  using T = storage_t<B>;

  /// offload: keep inputs moved with move_to_host() in the host tier (B must have one).
  layer_input_store(B& be, index_t layers, index_t elements, bool offload)
      : be_(be), elements_(elements), offload_(offload), device_(slots(layers)) {
    check(!offload || OffloadBackend<B>,
          "compute_gradients: offload_layer_inputs needs a backend with a host memory tier "
          "(OffloadBackend, backend/offload.hpp); this backend has none");
  }

  bool offload() const { return offload_; }
  bool on_device(index_t l) const { return !device_[at(l)].empty(); }
  bool on_host(index_t l) const { return !host_[at(l)].empty(); }
  /// Input l in backend memory, as a (B*T, d) buffer.
  buffer_t<B>& device(index_t l) { return device_[at(l)]; }
  /// A new (zeroed) device buffer for input l.
  buffer_t<B>& allocate(index_t l) {
    return device_[at(l)] = be_.template allocate<T>(elements_);  // (B*T, d)
  }

  /// Starts copying input l to the host tier; its device buffer is freed by the next settle().
  void move_to_host(index_t l) {
    if constexpr (OffloadBackend<B>) {
      auto& h = host_[at(l)];
      h = be_.template allocate_host<T>(elements_);  // (B*T, d) in the host tier
      be_.copy_to_host(std::span<const T>(device_[at(l)].span()), h.span());
      leaving_.push_back(l);
      moved_bytes_ += bytes();
    }
  }
  /// Starts copying input l back from the host tier into a new device buffer, readable after
  /// the next settle().
  void fetch(index_t l) {
    if constexpr (OffloadBackend<B>) {
      allocate(l);
      be_.copy_to_device(std::span<const T>(host_[at(l)].span()), device_[at(l)].span());
      copying_ = true;
      moved_bytes_ += bytes();
    }
  }
  /// Waits for the copies started so far and frees the device buffers that went to the host.
  void settle() {
    if constexpr (OffloadBackend<B>) {
      if (leaving_.empty() && !copying_) return;
      be_.wait_copies();
      for (index_t l : leaving_) device_[at(l)].reset();
      leaving_.clear();
      copying_ = false;
    }
  }
  /// Frees input l in both tiers (call after settle() when a copy of it was in flight).
  void release(index_t l) {
    device_[at(l)].reset();
    host_[at(l)].reset();
  }
  /// Bytes copied between the tiers, both ways.
  std::size_t moved_bytes() const { return moved_bytes_; }

 private:
  static std::size_t slots(index_t layers) { return static_cast<std::size_t>(layers + 1); }
  static std::size_t at(index_t l) { return static_cast<std::size_t>(l); }
  std::size_t bytes() const { return static_cast<std::size_t>(elements_) * sizeof(T); }

  B& be_;
  index_t elements_ = 0;
  bool offload_ = false;
  std::vector<buffer_t<B>> device_;
  std::vector<typename host_tier<B>::buffer> host_ =
      std::vector<typename host_tier<B>::buffer>(device_.size());
  std::vector<index_t> leaving_;  ///< inputs whose copy to the host is in flight
  bool copying_ = false;          ///< a copy to the device is in flight
  std::size_t moved_bytes_ = 0;
};

}  // namespace tightfit::detail
