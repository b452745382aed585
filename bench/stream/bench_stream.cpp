// bench_stream: StreamBP against gradient checkpointing and full backprop (stream_bench.hpp).
#include <unistd.h>

#include <string>

#include "stream_bench.hpp"

int main(int argc, char** argv) {
  return tightfit::bench::stream_bench_main(argc, argv,
                                            {"/proc/" + std::to_string(getpid()) + "/exe"});
}
