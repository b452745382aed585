// The launch of a tightfit command under mpirun (grad and train --parallel): MPI started around
// the command's body, every rank runs it with an mpi_communicator, and a rank that fails reports
// and ends the whole job (MPI_Abort), since the others may be waiting in a collective: rank 0
// writes "tightfit CMD: message", another rank "tightfit CMD: rank r of N: message"; the exit
// status is 2 for a usage_error (arguments refused once the data are known), 1 otherwise.
// Arguments are checked before MPI starts: only rank 0 reports them (launched_rank_above_0 in
// args.hpp). Without MPI, run_under_mpi is an error naming the command's option.
#pragma once

#include <algorithm>
#include <cstdio>
#include <exception>
#include <span>
#include <string>
#include <vector>

#include "args.hpp"
#include "tightfit/core/error.hpp"
#if defined(TIGHTFIT_HAS_MPI)
#include "tightfit/distributed/mpi_communicator.hpp"
#endif

namespace tightfit::cli {

/// body(comm) on every rank of MPI_COMM_WORLD (comm: an mpi_communicator); its return value is
/// the exit status. A rank that throws prints its line and aborts the job (see the top comment).
template <class Body>
int run_under_mpi([[maybe_unused]] const char* command, [[maybe_unused]] Body&& body) {
#if defined(TIGHTFIT_HAS_MPI)
  mpi_environment env;
  mpi_communicator comm;
  int code = 1;
  std::string message;
  try {
    return body(comm);
  } catch (const usage_error& e) {
    code = 2;
    message = e.message;
  } catch (const std::exception& e) {
    message = e.what();
  }
  if (comm.rank() == 0)
    std::fprintf(stderr, "tightfit %s: %s\n", command, message.c_str());
  else
    std::fprintf(stderr, "tightfit %s: rank %d of %d: %s\n", command, comm.rank(), comm.size(),
                 message.c_str());
  std::fflush(stderr);
  if (comm.size() > 1) comm.abort(code);
  return code;
#else
  fail("--parallel needs MPI, and this tightfit was built without it");
#endif
}

/// The largest of every rank's `value` (a peak: the busiest rank's), on every rank; every rank
/// must call it (an all-gather).
template <class Comm>
double max_over_ranks(Comm& comm, double value) {
  std::vector<double> all(static_cast<std::size_t>(comm.size()));
  comm.all_gather(std::span<const double>(&value, 1), std::span<double>(all));
  return *std::max_element(all.begin(), all.end());
}

}  // namespace tightfit::cli
