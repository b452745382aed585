// tightfit/distributed/self_communicator.hpp: the group of one rank. Every collective is the
// identity (copies where the output is another span), so code written for N ranks runs unchanged in
// one process; its statistics count calls, and no bytes leave the process.
#pragma once

#include <algorithm>
#include <span>

#include "tightfit/core/error.hpp"
#include "tightfit/distributed/communicator.hpp"

namespace tightfit {

/// One rank: rank() == 0, size() == 1.
class self_communicator {
 public:
  /// Already complete.
  struct request {
    void wait() {}
    bool done() { return true; }
  };

  int rank() const { return 0; }
  int size() const { return 1; }

  template <class T>
  request all_reduce_sum(std::span<T>) {
    ++stats_.all_reduce_calls;
    return {};
  }
  template <class T>
  void all_gather(std::span<const T> in, std::span<T> out) {
    check(out.size() == in.size(), "all_gather: out has ", out.size(), " values, expected ",
          in.size(), " (ranks x in)");
    ++stats_.all_gather_calls;
    std::copy(in.begin(), in.end(), out.begin());
  }
  template <class T>
  void reduce_scatter_sum(std::span<const T> in, std::span<T> out) {
    check(in.size() == out.size(), "reduce_scatter_sum: in has ", in.size(), " values, expected ",
          out.size(), " (ranks x out)");
    ++stats_.reduce_scatter_calls;
    std::copy(in.begin(), in.end(), out.begin());
  }
  template <class T>
  void broadcast(std::span<T>, int root) {
    check(root == 0, "broadcast: root is ", root, ", expected 0 (one rank)");
    ++stats_.broadcast_calls;
  }
  template <class T>
  void ring_shift(std::span<const T> in, std::span<T> out) {
    check(in.size() == out.size(), "ring_shift: out has ", out.size(), " values, expected ",
          in.size());
    ++stats_.ring_shift_calls;
    std::copy(in.begin(), in.end(), out.begin());
  }
  void barrier() { ++stats_.barrier_calls; }
  comm_stats& stats() { return stats_; }

 private:
  comm_stats stats_;
};

static_assert(Communicator<self_communicator>);

}  // namespace tightfit
