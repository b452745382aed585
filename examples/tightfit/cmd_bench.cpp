// tightfit bench: benchmark tables. `tightfit bench stream ...` is bench/stream/bench_stream:
// every option is validated before anything runs (exit 2 naming the value), and each row runs
// in a child process started with an argument vector (posix_spawn, never a shell).
// --device cpu is the default and the only device: the GPU benchmark is bench/cuda/bench_cuda,
// which scripts/gpu-check builds and runs (docs/cuda.md).
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
                 "                             [--device cpu]\n"
                 "  StreamBP against checkpointing and full backprop: peak activation bytes, "
                 "bytes per token,\n  peak RSS (each row in its own process), time and GFLOP/s "
                 "next to the machine's GEMM rate.\n  --device cuda is not here yet: the GPU "
                 "benchmark is bench/cuda/bench_cuda (scripts/gpu-check).\n");
    return argc < 2 ? 2 : 0;
  }
  if (std::strcmp(argv[1], "stream") != 0) {
    std::fprintf(stderr, "tightfit bench: unknown benchmark '%s' (known: stream)\n", argv[1]);
    return 2;
  }
  // --device: cpu (the default) is dropped before the benchmark parses the rest
  std::vector<char*> rest{argv[1]};
  for (int i = 2; i < argc; ++i) {
    if (std::strcmp(argv[i], "--device") != 0) {
      rest.push_back(argv[i]);
      continue;
    }
    const std::string device = i + 1 < argc ? argv[++i] : "";
    if (device == "cpu") continue;
    if (device == "cuda")
      std::fprintf(stderr,
                   "tightfit bench: --device cuda: bench stream runs on the CPU only for now; the "
                   "GPU benchmark is bench/cuda/bench_cuda (scripts/gpu-check, docs/cuda.md)\n");
    else
      std::fprintf(stderr, "tightfit bench: --device expects cpu%s%s%s\n",
                   device.empty() ? "" : ", got '", device.c_str(), device.empty() ? "" : "'");
    return 2;
  }
  return bench::stream_bench_main(
      static_cast<int>(rest.size()), rest.data(),
      {"/proc/" + std::to_string(getpid()) + "/exe", "bench", "stream"});
}

}  // namespace tightfit::cli
