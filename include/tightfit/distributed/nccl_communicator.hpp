// tightfit/distributed/nccl_communicator.hpp: the Communicator over NCCL, between GPUs. Link
// tightfit::nccl (built with TIGHTFIT_WITH_CUDA when libnccl is found).
//
// Every span is DEVICE memory (a cuda_backend's buffers). Collectives are queued on one CUDA
// stream, normally the backend's (cuda_backend::stream()), so they are ordered after the kernels
// that produced their input and before the kernels that read their output:
//  - all_reduce_sum returns an nccl_request; wait() synchronises the host with a CUDA event
//    recorded after the reduction (done() queries it); destroying a pending request waits;
//  - all_gather, reduce_scatter_sum and broadcast are stream-ordered: they return once queued
//    (later work on the stream sees the result; download() or synchronize() for the host);
//  - barrier() synchronises the stream after a one-value all-reduce.
// Construction needs an ncclUniqueId shared by all ranks: from_host(host, stream) makes one on
// rank 0 and broadcasts it over any host Communicator (mpi_communicator), as NCCL's docs do
// with MPI. NCCL errors become tightfit::error naming the operation. Status: compiled only
// (docs/cuda.md); its runtime test needs GPUs.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>
#include <utility>

#include "tightfit/backend/detail/cuda_runtime.hpp"
#include "tightfit/core/error.hpp"
#include "tightfit/distributed/communicator.hpp"

namespace tightfit {

namespace detail {

inline void nccl_check(ncclResult_t code, const char* what) {
  if (code != ncclSuccess) fail(what, ": NCCL error ", ncclGetErrorString(code));
}

template <class T>
ncclDataType_t nccl_type() {
  if constexpr (std::is_same_v<T, float>)
    return ncclFloat32;
  else if constexpr (std::is_same_v<T, double>)
    return ncclFloat64;
  else if constexpr (std::is_same_v<T, std::int64_t>)
    return ncclInt64;
  else
    static_assert(sizeof(T) == 0, "nccl_communicator: value type without an NCCL datatype");
}

}  // namespace detail

/// A pending all-reduce: a CUDA event recorded on the stream after the NCCL call.
class nccl_request {
 public:
  nccl_request() = default;
  explicit nccl_request(cudaEvent_t event) : event_(event) {}
  nccl_request(nccl_request&& o) noexcept : event_(std::exchange(o.event_, nullptr)) {}
  nccl_request& operator=(nccl_request&& o) noexcept {
    if (this != &o) {
      finish_quietly();
      event_ = std::exchange(o.event_, nullptr);
    }
    return *this;
  }
  nccl_request(const nccl_request&) = delete;
  nccl_request& operator=(const nccl_request&) = delete;
  ~nccl_request() { finish_quietly(); }

  /// Blocks the host until the reduction has finished on the device.
  void wait() {
    if (event_ == nullptr) return;
    const cudaError_t code = cudaEventSynchronize(event_);
    release();
    detail::cuda_check(code, "nccl_request::wait");
  }
  /// True (and complete) when the reduction has finished; never blocks.
  bool done() {
    if (event_ == nullptr) return true;
    const cudaError_t code = cudaEventQuery(event_);
    if (code == cudaErrorNotReady) return false;
    release();
    detail::cuda_check(code, "nccl_request::done");
    return true;
  }

 private:
  void release() {
    cudaEventDestroy(event_);
    event_ = nullptr;
  }
  void finish_quietly() {
    if (event_ == nullptr) return;
    cudaEventSynchronize(event_);
    release();
  }
  cudaEvent_t event_ = nullptr;
};

/// One rank of an NCCL communicator, collectives queued on `stream`. Move-only.
class nccl_communicator {
 public:
  /// Joins the clique of `size` ranks sharing `id` as `rank` (ncclCommInitRank; collective).
  nccl_communicator(const ncclUniqueId& id, int size, int rank, cudaStream_t stream)
      : stream_(stream), rank_(rank), size_(size) {
    check(size >= 1, "nccl_communicator: size is ", size, ", expected >= 1");
    check(rank >= 0 && rank < size, "nccl_communicator: rank is ", rank, ", expected in [0, ", size,
          ")");
    detail::nccl_check(ncclCommInitRank(&comm_, size, id, rank), "ncclCommInitRank");
  }

  /// Rank 0 makes the unique id, every rank receives it over the host communicator `host`
  /// (same rank and size), then all join.
  template <Communicator C>
  static nccl_communicator from_host(C& host, cudaStream_t stream) {
    constexpr std::size_t words = (sizeof(ncclUniqueId) + 7) / 8;
    std::array<std::int64_t, words> packed{};
    ncclUniqueId id{};
    if (host.rank() == 0) {
      detail::nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
      std::memcpy(packed.data(), &id, sizeof(id));
    }
    host.broadcast(std::span<std::int64_t>(packed), 0);
    std::memcpy(&id, packed.data(), sizeof(id));
    return nccl_communicator(id, static_cast<int>(host.size()), static_cast<int>(host.rank()),
                             stream);
  }

  nccl_communicator(nccl_communicator&& o) noexcept
      : comm_(std::exchange(o.comm_, nullptr)),
        stream_(o.stream_),
        rank_(o.rank_),
        size_(o.size_),
        stats_(o.stats_) {}
  nccl_communicator& operator=(nccl_communicator&&) = delete;
  nccl_communicator(const nccl_communicator&) = delete;
  nccl_communicator& operator=(const nccl_communicator&) = delete;
  ~nccl_communicator() {
    if (comm_ != nullptr) ncclCommDestroy(comm_);
  }

  int rank() const { return rank_; }
  int size() const { return size_; }
  comm_stats& stats() { return stats_; }
  cudaStream_t stream() const { return stream_; }

  /// x <- sum over ranks of x (device memory), in place; wait() on the request for the host.
  template <class T>
  nccl_request all_reduce_sum(std::span<T> x) {
    ++stats_.all_reduce_calls;
    stats_.bytes += static_cast<std::int64_t>(x.size_bytes());
    detail::nccl_check(ncclAllReduce(x.data(), x.data(), x.size(), detail::nccl_type<T>(), ncclSum,
                                     comm_, stream_),
                       "ncclAllReduce");
    cudaEvent_t event = nullptr;
    detail::cuda_check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming),
                       "nccl_communicator::all_reduce_sum");
    nccl_request request(event);
    detail::cuda_check(cudaEventRecord(event, stream_), "nccl_communicator::all_reduce_sum");
    return request;
  }

  /// out (size * n) = every rank's in (n), rank order (stream-ordered).
  template <class T>
  void all_gather(std::span<const T> in, std::span<T> out) {
    check(out.size() == in.size() * static_cast<std::size_t>(size_),
          "nccl_communicator::all_gather: out.size is ", out.size(), ", expected ",
          in.size() * static_cast<std::size_t>(size_), " (size ", size_, " x in.size ", in.size(),
          ")");
    ++stats_.all_gather_calls;
    stats_.bytes += static_cast<std::int64_t>(in.size_bytes());
    detail::nccl_check(
        ncclAllGather(in.data(), out.data(), in.size(), detail::nccl_type<T>(), comm_, stream_),
        "ncclAllGather");
  }

  /// out (n) = sum over ranks of in[rank * n .. (rank + 1) * n) (stream-ordered).
  template <class T>
  void reduce_scatter_sum(std::span<const T> in, std::span<T> out) {
    check(in.size() == out.size() * static_cast<std::size_t>(size_),
          "nccl_communicator::reduce_scatter_sum: in.size is ", in.size(), ", expected ",
          out.size() * static_cast<std::size_t>(size_), " (size ", size_, " x out.size ",
          out.size(), ")");
    ++stats_.reduce_scatter_calls;
    stats_.bytes += static_cast<std::int64_t>(in.size_bytes());
    detail::nccl_check(ncclReduceScatter(in.data(), out.data(), out.size(), detail::nccl_type<T>(),
                                         ncclSum, comm_, stream_),
                       "ncclReduceScatter");
  }

  /// x <- root's x (stream-ordered).
  template <class T>
  void broadcast(std::span<T> x, int root) {
    check(root >= 0 && root < size_, "nccl_communicator::broadcast: root is ", root,
          ", expected in [0, ", size_, ")");
    ++stats_.broadcast_calls;
    stats_.bytes += static_cast<std::int64_t>(x.size_bytes());
    detail::nccl_check(
        ncclBroadcast(x.data(), x.data(), x.size(), detail::nccl_type<T>(), root, comm_, stream_),
        "ncclBroadcast");
  }

  /// out <- rank r - 1's in while in goes to rank r + 1 (ncclSend + ncclRecv in one group,
  /// stream-ordered).
  template <class T>
  void ring_shift(std::span<const T> in, std::span<T> out) {
    check(in.size() == out.size(), "nccl_communicator::ring_shift: out.size is ", out.size(),
          ", expected ", in.size());
    ++stats_.ring_shift_calls;
    stats_.bytes += static_cast<std::int64_t>(in.size_bytes());
    const int next = (rank_ + 1) % size_, prev = (rank_ + size_ - 1) % size_;
    detail::nccl_check(ncclGroupStart(), "ncclGroupStart (ring_shift)");
    const ncclResult_t s =
        ncclSend(in.data(), in.size(), detail::nccl_type<T>(), next, comm_, stream_);
    const ncclResult_t r =
        ncclRecv(out.data(), out.size(), detail::nccl_type<T>(), prev, comm_, stream_);
    detail::nccl_check(ncclGroupEnd(), "ncclGroupEnd (ring_shift)");
    detail::nccl_check(s, "ncclSend (ring_shift)");
    detail::nccl_check(r, "ncclRecv (ring_shift)");
  }

  /// Every rank reaches this point: a one-value all-reduce, then the stream is synchronised.
  void barrier() {
    ++stats_.barrier_calls;
    void* one = nullptr;
    detail::cuda_check(cudaMallocAsync(&one, sizeof(float), stream_), "nccl barrier");
    const ncclResult_t r =
        ncclAllReduce(one, one, 1, ncclFloat32, ncclSum, comm_, stream_);  // value irrelevant
    cudaFreeAsync(one, stream_);
    detail::nccl_check(r, "ncclAllReduce (barrier)");
    detail::cuda_check(cudaStreamSynchronize(stream_), "nccl barrier");
  }

  /// Ends this rank's communicator without waiting for the others (after an error).
  void abort() {
    if (comm_ != nullptr) ncclCommAbort(comm_);
    comm_ = nullptr;
  }

 private:
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  int rank_ = 0;
  int size_ = 1;
  comm_stats stats_;
};

static_assert(Communicator<nccl_communicator>);

}  // namespace tightfit
