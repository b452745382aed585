// The Communicator concept and the one-rank communicator (no MPI needed).
#include <doctest/doctest.h>

#include <cstdint>
#include <span>
#include <vector>

#include "tightfit/core/error.hpp"
#include "tightfit/dist/agreement.hpp"
#include "tightfit/dist/self_communicator.hpp"

using namespace tightfit;

namespace {
/// A type with every member but barrier(): not a Communicator.
struct no_barrier {
  struct request {
    void wait() {}
    bool done() { return true; }
  };
  int rank() const { return 0; }
  int size() const { return 1; }
  template <class T>
  request all_reduce_sum(std::span<T>) {
    return {};
  }
  template <class T>
  void all_gather(std::span<const T>, std::span<T>) {}
  template <class T>
  void reduce_scatter_sum(std::span<const T>, std::span<T>) {}
  template <class T>
  void broadcast(std::span<T>, int) {}
  comm_stats& stats() { return stats_; }
  comm_stats stats_;
};
}  // namespace

TEST_CASE("self_communicator is a Communicator; a type without barrier() is not") {
  static_assert(Communicator<self_communicator>);
  static_assert(!Communicator<no_barrier>);
  static_assert(CommRequest<self_communicator::request>);
}

TEST_CASE("self_communicator: identity collectives, counted, shapes checked") {
  self_communicator comm;
  CHECK(comm.rank() == 0);
  CHECK(comm.size() == 1);
  std::vector<double> x{1.5, -2.0};
  auto r = comm.all_reduce_sum(std::span<double>(x));
  r.wait();
  CHECK(x == std::vector<double>{1.5, -2.0});
  std::vector<float> in{3.f, 4.f}, out(2);
  comm.all_gather(std::span<const float>(in), std::span<float>(out));
  CHECK(out == in);
  std::vector<std::int64_t> big{7, 8}, small(2);
  comm.reduce_scatter_sum(std::span<const std::int64_t>(big), std::span<std::int64_t>(small));
  CHECK(small == big);
  std::vector<float> wrong(3);
  CHECK_THROWS_WITH_AS(comm.all_gather(std::span<const float>(in), std::span<float>(wrong)),
                       doctest::Contains("out has 3 values, expected 2"), error);
  CHECK_THROWS_WITH_AS(comm.broadcast(std::span<double>(x), 1), doctest::Contains("root is 1"),
                       error);
  comm.barrier();
  CHECK(comm.stats().all_reduce_calls == 1);
  CHECK(comm.stats().all_gather_calls == 1);
  CHECK(comm.stats().reduce_scatter_calls == 1);
  CHECK(comm.stats().barrier_calls == 1);
  CHECK(comm.stats().bytes == 0);
  CHECK_NOTHROW(check_agreement(comm, "model A", "model configuration"));
}

TEST_CASE("description_hash separates descriptions that differ in one character") {
  CHECK(description_hash("hidden 512") != description_hash("hidden 513"));
  CHECK(description_hash("") != description_hash(" "));
  CHECK(description_hash("abc") == description_hash(std::string("abc")));
}
