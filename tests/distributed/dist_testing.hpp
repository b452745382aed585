// Helpers of the mpirun tests: the world communicator, created once after MPI_Init.
#pragma once

#include "tightfit/distributed/mpi_communicator.hpp"

namespace tightfit::testing {

/// The communicator of every rank of the job (a duplicate of MPI_COMM_WORLD).
inline mpi_communicator& world() {
  static mpi_communicator comm;
  return comm;
}

}  // namespace tightfit::testing
