// tightfit/backend/detail/cuda_runtime.hpp: host-side CUDA plumbing of the CUDA backend: error
// checks that turn CUDA and cuBLAS status codes into tightfit::error, the counted device buffer,
// the counted pinned host buffer (the host memory tier), and the lazily created device context
// (compute stream, copy stream, cuBLAS handle).
//
// Plain C++ over the CUDA runtime API (no kernels), so it also compiles with the host compiler
// (distributed/nccl_communicator.hpp uses it). Invariants:
//  - device memory comes from cudaMallocAsync on the backend's stream (the stream-ordered pool;
//    never managed memory) and is counted in the backend's memory_counter;
//  - a buffer must not outlive the backend (its stream) that allocated it;
//  - nothing touches the device before cuda_context::ensure(), so a kernel whose shape check
//    fails throws before any CUDA call, and constructing a backend needs no device.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <utility>

#include "tightfit/core/error.hpp"
#include "tightfit/core/memory.hpp"
#include "tightfit/core/types.hpp"
#include "tightfit/core/view.hpp"

namespace tightfit::detail {

/// Throws tightfit::error "<what>: CUDA error <name>: <text>" unless code == cudaSuccess.
inline void cuda_check(cudaError_t code, const char* what) {
  if (code != cudaSuccess)
    fail(what, ": CUDA error ", cudaGetErrorName(code), ": ", cudaGetErrorString(code));
}

/// Throws tightfit::error "<what>: cuBLAS error <name>" unless status == CUBLAS_STATUS_SUCCESS.
inline void cublas_check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    fail(what, ": cuBLAS error ", cublasGetStatusName(status), ": ", cublasGetStatusString(status));
}

/// Number of CUDA devices visible to this process (0 when there is no driver or no device).
inline int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

/// The device, stream and cuBLAS handle of one backend, created on first use.
class cuda_context {
 public:
  explicit cuda_context(int device) : device_(device) {}
  cuda_context(const cuda_context&) = delete;
  cuda_context& operator=(const cuda_context&) = delete;
  ~cuda_context() {
    if (blas_ != nullptr) cublasDestroy(blas_);
    if (copy_stream_ != nullptr) {
      cudaStreamSynchronize(copy_stream_);
      cudaStreamDestroy(copy_stream_);
    }
    if (stream_ != nullptr) {
      cudaStreamSynchronize(stream_);
      cudaStreamDestroy(stream_);
    }
    if (compute_done_ != nullptr) cudaEventDestroy(compute_done_);
    if (copies_done_ != nullptr) cudaEventDestroy(copies_done_);
  }

  /// Creates the stream and the cuBLAS handle on the first call; throws tightfit::error when
  /// the device is missing.
  void ensure() {
    if (stream_ != nullptr) return;
    const int count = cuda_device_count();
    check(count > 0, "cuda_backend: no CUDA device is available (cudaGetDeviceCount found none)");
    check(device_ >= 0 && device_ < count, "cuda_backend: device is ", device_,
          ", expected in [0, ", count, ")");
    cuda_check(cudaSetDevice(device_), "cudaSetDevice");
    cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    cuda_check(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking),
               "cudaStreamCreate (copies)");
    cuda_check(cudaEventCreateWithFlags(&compute_done_, cudaEventDisableTiming), "cudaEventCreate");
    cuda_check(cudaEventCreateWithFlags(&copies_done_, cudaEventDisableTiming), "cudaEventCreate");
    cublas_check(cublasCreate(&blas_), "cublasCreate");
    cublas_check(cublasSetStream(blas_, stream_), "cublasSetStream");
    // Keep freed blocks in the stream-ordered pool (a caching allocator) instead of returning
    // them to the driver at every synchronisation.
    cudaMemPool_t pool = nullptr;
    cuda_check(cudaDeviceGetDefaultMemPool(&pool, device_), "cudaDeviceGetDefaultMemPool");
    std::uint64_t keep = UINT64_MAX;
    cuda_check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep),
               "cudaMemPoolSetAttribute");
    cudaDeviceProp prop{};
    cuda_check(cudaGetDeviceProperties(&prop, device_), "cudaGetDeviceProperties");
    max_shared_ = static_cast<std::size_t>(prop.sharedMemPerBlockOptin);
    sm_count_ = prop.multiProcessorCount;
    cc_major_ = prop.major;
  }
  bool started() const { return stream_ != nullptr; }
  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  cublasHandle_t blas() const { return blas_; }
  /// Largest dynamic shared memory a kernel may opt in to (bytes).
  std::size_t max_shared() const { return max_shared_; }
  int sm_count() const { return sm_count_; }
  /// The device's compute capability major version (8: A100, 9: H100 / H200).
  int cc_major() const { return cc_major_; }
  /// Waits for every operation queued on the stream; throws a pending kernel error.
  void synchronize() {
    if (stream_ == nullptr) return;
    cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }
  /// Queues a copy on the copy stream, after every kernel queued so far on the compute stream.
  void copy_async(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind,
                  const char* what) {
    cuda_check(cudaEventRecord(compute_done_, stream_), what);
    cuda_check(cudaStreamWaitEvent(copy_stream_, compute_done_, 0), what);
    cuda_check(cudaMemcpyAsync(dst, src, bytes, kind, copy_stream_), what);
  }
  /// Kernels queued from now on run after every copy queued so far, and those copies are done
  /// (the host waits for the copy stream, so a pinned source may be freed at once).
  void join_copies() {
    if (stream_ == nullptr) return;
    cuda_check(cudaEventRecord(copies_done_, copy_stream_), "wait_copies");
    cuda_check(cudaStreamWaitEvent(stream_, copies_done_, 0), "wait_copies");
    cuda_check(cudaStreamSynchronize(copy_stream_), "wait_copies");
  }

 private:
  int device_;
  cudaStream_t stream_ = nullptr;
  cudaStream_t copy_stream_ = nullptr;  ///< host-tier copies (offload), overlapping kernels
  cudaEvent_t compute_done_ = nullptr, copies_done_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  std::size_t max_shared_ = 0;
  int sm_count_ = 0;
  int cc_major_ = 0;
};

/// Device memory allocated stream-ordered (cudaMallocAsync, zeroed by cudaMemsetAsync) on one
/// stream, freed stream-ordered after every queued use.
struct cuda_stream_storage {
  static constexpr const char* name = "cuda_buffer";
  cudaStream_t stream = nullptr;
  void* allocate(std::size_t bytes) {
    void* p = nullptr;
    cuda_check(cudaMallocAsync(&p, bytes, stream), "cudaMallocAsync");
    cuda_check(cudaMemsetAsync(p, 0, bytes, stream), "cudaMemsetAsync");
    return p;
  }
  void deallocate(void* p, std::size_t) noexcept { cudaFreeAsync(p, stream); }
};

/// An owning, zero-initialised device array, counted by the backend's memory_counter. Move-only.
template <class T>
using cuda_buffer = counted_buffer<T, cuda_stream_storage>;

/// Page-locked host memory (cudaMallocHost, zeroed): the host memory tier of backend/offload.hpp.
/// Freeing it (cudaFreeHost) synchronises the device.
struct cuda_pinned_storage {
  static constexpr const char* name = "cuda_pinned_buffer";
  void* allocate(std::size_t bytes) {
    void* p = nullptr;
    cuda_check(cudaMallocHost(&p, bytes), "cudaMallocHost");
    std::memset(p, 0, bytes);
    return p;
  }
  void deallocate(void* p, std::size_t) noexcept { cudaFreeHost(p); }
};

/// An owning, zero-initialised pinned host array, counted by the backend's host-tier counter.
template <class T>
using cuda_pinned_buffer = counted_buffer<T, cuda_pinned_storage>;

/// A view of the same extents over another element type, for the shape checks only (they read
/// extents and compare the pointer with null, never an element): lets a bf16 backend reuse the
/// reference backend's checks, typed by its accumulation type, with the same messages.
template <class To, class From>
matrix_view<To> retype(const matrix_view<From>& v) {
  return {reinterpret_cast<To*>(v.data), v.rows, v.cols, v.stride};  // NOLINT: never read
}
template <class To, class From>
tensor3_view<To> retype(const tensor3_view<From>& v) {
  return {reinterpret_cast<To*>(v.data),
          v.batch,
          v.rows,
          v.cols,
          v.batch_stride,  // NOLINT
          v.row_stride};
}
template <class To, class From>
std::span<To> retype(std::span<From> s) {
  return {reinterpret_cast<To*>(s.data()), s.size()};  // NOLINT: never read
}

}  // namespace tightfit::detail
