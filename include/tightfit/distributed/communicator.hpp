// tightfit/distributed/communicator.hpp: the Communicator seam between the algorithms and a
// transport (MPI between processes and hosts, NCCL between GPUs, or one process).
//
// Data-parallel training reduces each layer's gradients once, when they are final (the
// grads-ready event of compute_gradients), without blocking: all_reduce_sum returns a request
// and the next layer's backward runs while the message travels; request.wait() completes it.
// The collectives work in place or from one span into another, over float, double and
// std::int64_t values, and every rank must call them in the same order with the same sizes
// (check_agreement in distributed/agreement.hpp compares a hash of what each rank is about to do).
//
// Contract of each operation (n = local count, N = size()):
//  - all_reduce_sum(x):           x <- sum over ranks of x, in place; non-blocking.
//  - all_gather(in (n), out (N*n)): out[r*n .. (r+1)*n) = rank r's in.
//  - reduce_scatter_sum(in (N*n), out (n)): out = sum over ranks of in[rank*n .. (rank+1)*n).
//  - broadcast(x, root):          x <- root's x.
//  - ring_shift(in (n), out (n)):  out = rank (r - 1 + N) % N's in (every rank sends its in to
//                                 rank r + 1 at the same time: the ring of sequence parallelism).
//  - barrier().
// stats() counts calls and the bytes this rank handed to the transport (a rank's payload, not
// the wire traffic of the algorithm the transport picks).
#pragma once

#include <concepts>
#include <cstdint>
#include <span>

namespace tightfit {

/// Calls and payload bytes of one rank's collectives (tests count reductions, benches bytes).
struct comm_stats {
  std::int64_t all_reduce_calls = 0;
  std::int64_t all_gather_calls = 0;
  std::int64_t reduce_scatter_calls = 0;
  std::int64_t broadcast_calls = 0;
  std::int64_t ring_shift_calls = 0;
  std::int64_t barrier_calls = 0;
  std::int64_t bytes = 0;  ///< payload bytes passed to collectives by this rank
  void reset() { *this = comm_stats{}; }
  std::int64_t messages() const {
    return all_reduce_calls + all_gather_calls + reduce_scatter_calls + broadcast_calls +
           ring_shift_calls;
  }
};

/// A pending non-blocking operation: wait() returns when it is complete (and rethrows a
/// transport error as tightfit::error). Destroying a pending request waits for it.
template <class R>
concept CommRequest = std::movable<R> && requires(R& r) {
  r.wait();
  { r.done() } -> std::convertible_to<bool>;  ///< completes it when it is finished (no wait)
};

namespace detail {
template <class C, class T>
concept communicates = requires(C& c, std::span<T> x, std::span<const T> cx, int root) {
  { c.all_reduce_sum(x) } -> CommRequest;
  c.all_gather(cx, x);
  c.reduce_scatter_sum(cx, x);
  c.broadcast(x, root);
  c.ring_shift(cx, x);
};
}  // namespace detail

/// A group of ranks that exchange values (see the top comment for the contract).
template <class C>
concept Communicator = detail::communicates<C, float> && detail::communicates<C, double> &&
    detail::communicates<C, std::int64_t> && requires(C& c, const C& cc) {
  { cc.rank() } -> std::convertible_to<int>;
  { cc.size() } -> std::convertible_to<int>;
  c.barrier();
  { c.stats() } -> std::same_as<comm_stats&>;
};

}  // namespace tightfit
