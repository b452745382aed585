// Uses the installed tightfit::mpi component: every rank adds its rank + 1; prints the sum.
#include <tightfit/distributed/mpi_communicator.hpp>

#include <cstdio>
#include <span>

int main(int argc, char** argv) {
  tightfit::mpi_environment env(&argc, &argv);
  tightfit::mpi_communicator comm;
  double x = comm.rank() + 1.0;
  comm.all_reduce_sum(std::span<double>(&x, 1)).wait();
  const double expected = comm.size() * (comm.size() + 1) / 2.0;
  if (comm.rank() == 0) std::printf("tightfit mpi consumer: %d ranks, sum %g\n", comm.size(), x);
  return x == expected ? 0 : 1;
}
