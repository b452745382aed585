// nccl_communicator: compiled by the host compiler against the Communicator concept (NCCL and
// the CUDA runtime linked); its collectives need GPUs, so here only what runs without one: a
// finished or empty request, and the concept.
#include <doctest/doctest.h>

#include "tightfit/distributed/nccl_communicator.hpp"
#include "tightfit/distributed/self_communicator.hpp"

using namespace tightfit;

static_assert(Communicator<nccl_communicator>);
static_assert(CommRequest<nccl_request>);

TEST_CASE("nccl_request: an empty request is done and waits for nothing") {
  nccl_request r;
  CHECK(r.done());
  r.wait();
  nccl_request moved(std::move(r));
  CHECK(moved.done());
}

TEST_CASE("nccl datatypes cover the Communicator's value types") {
  CHECK(detail::nccl_type<float>() == ncclFloat32);
  CHECK(detail::nccl_type<double>() == ncclFloat64);
  CHECK(detail::nccl_type<std::int64_t>() == ncclInt64);
}
