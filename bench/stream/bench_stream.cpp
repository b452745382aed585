// bench_stream: StreamBP against gradient checkpointing and full backprop (the tool's driver,
// tools/tightfit/stream_bench.hpp, which `tightfit bench stream` runs too).
#include <unistd.h>

#include <string>

#include "stream_bench.hpp"

int main(int argc, char** argv) {
  return tightfit::bench::stream_bench_main(argc, argv,
                                            {"/proc/" + std::to_string(getpid()) + "/exe"});
}
