// Includes the umbrella header and runs one kernel: proves the package is usable as installed.
#include <tightfit/tightfit.hpp>

#include <cstdio>

int main() {
  tightfit::memory_counter counter;
  tightfit::host_buffer<double> buffer(counter, 4);
  std::printf("tightfit consumer: %zu bytes counted\n", counter.live());
  return counter.live() == 4 * sizeof(double) ? 0 : 1;
}
