// tightfit/backend/meta.hpp: a backend that allocates and computes nothing but counts bytes.
//
// Every allocation is accounted in the memory_counter exactly as a real backend would, and
// every kernel is a no-op, so running an algorithm on meta_backend<T> is a dry run that gives
// its exact peak bytes in microseconds per call (like PyTorch's meta device). The memory
// planner (stream/planner.hpp) uses it. Buffers hand out a fixed non-null address that is
// never dereferenced: only the kernels of this backend see it, and they do nothing.
#pragma once

#include <cstdint>
#include <span>
#include <utility>

#include "tightfit/backend/concept.hpp"

namespace tightfit {

/// Storage that holds no bytes: a fake, never dereferenced address (the dry run counts only).
struct meta_storage {
  static constexpr const char* name = "meta_buffer";
  void* allocate(std::size_t) {
    return reinterpret_cast<void*>(std::uintptr_t{1} << 44);  // NOLINT: never dereferenced
  }
  void deallocate(void*, std::size_t) noexcept {}
};

/// A counted allocation without storage.
template <class U>
using meta_buffer = counted_buffer<U, meta_storage>;

/// The dry-run backend: counted allocations, no-op kernels.
template <std::floating_point T>
class meta_backend {
 public:
  using value_type = T;
  /// Kernels compute nothing: host-side work over tensors may be skipped (nn/lora_dropout.hpp).
  static constexpr bool dry_run = true;

  memory_counter& memory() { return memory_; }
  kernel_stats& stats() { return stats_; }
  template <class U>
  meta_buffer<U> allocate(index_t n) {
    return meta_buffer<U>(memory_, n);
  }

  void upload(std::span<const T>, std::span<T>) {}
  void download(std::span<const T>, std::span<T>) {}
  void gemm(transpose, transpose, T, matrix_view<const T>, matrix_view<const T>, T,
            matrix_view<T>) {}
  void gemm_batched(transpose, transpose, T, tensor3_view<const T>, tensor3_view<const T>, T,
                    tensor3_view<T>) {}
  void axpy(T, matrix_view<const T>, matrix_view<T>) {}
  void scale(T, matrix_view<T>) {}
  void fill(matrix_view<T>, T) {}
  void copy(matrix_view<const T>, matrix_view<T>) {}
  void embedding_forward(matrix_view<const T>, std::span<const token_id>, matrix_view<T>) {}
  void embedding_backward(matrix_view<const T>, std::span<const token_id>, matrix_view<T>) {}
  void rmsnorm_forward(matrix_view<const T>, std::span<const T>, T, matrix_view<T>, std::span<T>) {}
  void rmsnorm_backward(matrix_view<const T>, std::span<const T>, std::span<const T>,
                        matrix_view<const T>, matrix_view<T>, std::span<T>) {}
  void rope_forward(matrix_view<T>, index_t, index_t, const rope_args&) {}
  void rope_backward(matrix_view<T>, index_t, index_t, const rope_args&) {}
  void swiglu_forward(matrix_view<const T>, matrix_view<const T>, matrix_view<T>) {}
  void swiglu_backward(matrix_view<const T>, matrix_view<const T>, matrix_view<const T>,
                       matrix_view<T>, matrix_view<T>) {}
  void geglu_forward(matrix_view<const T>, matrix_view<const T>, matrix_view<T>) {}
  void geglu_backward(matrix_view<const T>, matrix_view<const T>, matrix_view<const T>,
                      matrix_view<T>, matrix_view<T>) {}
  void logit_softcap_forward(matrix_view<T>, T) {}
  void logit_softcap_backward(matrix_view<const T>, matrix_view<T>, T) {}
  void attention_forward(attention_shape, matrix_view<const T>, matrix_view<const T>,
                         matrix_view<const T>, const attention_mask&, T, matrix_view<T>,
                         matrix_view<T>) {}
  void attention_backward(attention_shape, matrix_view<const T>, matrix_view<const T>,
                          matrix_view<const T>, matrix_view<const T>, matrix_view<const T>,
                          matrix_view<const T>, const attention_mask&, T, matrix_view<T>,
                          matrix_view<T>, matrix_view<T>) {}
  void attention_merge(index_t, index_t, matrix_view<T>, matrix_view<T>, matrix_view<const T>,
                       matrix_view<const T>) {}
  void xent_forward(matrix_view<const T>, std::span<const token_id>, T, std::span<T>,
                    std::span<T>) {}
  void xent_backward(matrix_view<T>, std::span<const token_id>, std::span<const T>,
                     std::span<const T>, T) {}
  void adam_update(std::span<T>, std::span<const T>, std::span<T>, std::span<T>,
                   const adam_hyper<T>&) {}
  void sgd_update(std::span<T>, std::span<const T>, std::span<T>, const sgd_hyper<T>&) {}

 private:
  memory_counter memory_;
  kernel_stats stats_;
};

static_assert(Backend<meta_backend<float>>);
static_assert(Backend<meta_backend<double>>);

}  // namespace tightfit
