// tightfit bench: benchmark tables. `tightfit bench stream ...` is bench/stream/bench_stream:
// every option is validated before anything runs (exit 2 naming the value), and each row runs
// in a child process started with an argument vector (posix_spawn, never a shell).
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "commands.hpp"
#include "stream/stream_bench.hpp"

namespace tightfit::cli {

int bench(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0) {
    std::fprintf(argc < 2 ? stderr : stdout,
                 "usage: tightfit bench stream [--seq 2048,4096,8192,16384] "
                 "[--schedules full,checkpoint,stream] [--chunk 512] [--batch 1]\n"
                 "                             [--preset qwen3-bench|small|...] "
                 "[--objective sft|grpo|dpo] [--csv FILE] [--compare]\n"
                 "  StreamBP against checkpointing and full backprop: peak activation bytes, "
                 "bytes per token,\n  peak RSS (each row in its own process), time and GFLOP/s "
                 "next to the machine's GEMM rate.\n");
    return argc < 2 ? 2 : 0;
  }
  if (std::strcmp(argv[1], "stream") != 0) {
    std::fprintf(stderr, "tightfit bench: unknown benchmark '%s' (known: stream)\n", argv[1]);
    return 2;
  }
  return bench::stream_bench_main(
      argc - 1, argv + 1, {"/proc/" + std::to_string(getpid()) + "/exe", "bench", "stream"});
}

}  // namespace tightfit::cli
