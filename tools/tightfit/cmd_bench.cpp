// tightfit bench: benchmark tables. `tightfit bench stream ...` is bench/stream/bench_stream:
// every option is validated before anything runs (exit 2 naming the value), and each row runs
// in a child process started with an argument vector (posix_spawn, never a shell).
// --device cuda (a -DTIGHTFIT_WITH_CUDA=ON build; device_cuda.hpp) runs the same rows on one
// GPU in this process, each on a fresh cuda_backend with a model initialised on the device:
// time (synchronised before each clock read), the backend's peak device bytes and the
// activation bytes, the loss; --dtype f32|bf16. --compare and --single are CPU-only (exit 2).
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "commands.hpp"
#include "device_cuda.hpp"
#include "output_paths.hpp"
#include "stream_bench.hpp"

namespace tightfit::cli {

namespace {

#if defined(TIGHTFIT_CLI_CUDA)
/// One row on the GPU: the job's schedule and chunk, the objective by name (bench_stream's).
cuda_bench_result cuda_row(const model_config& cfg, cuda_dtype dtype, const bench::bench_options& o,
                           index_t seq, const std::string& sched, const bench::batch_data& data) {
  const bench::schedule_spec spec = bench::parse_schedule_spec(sched);
  cuda_bench_job job;
  job.config = cfg;
  job.dtype = dtype;
  job.batch = {o.batch, seq, data.ids, data.targets, {}};
  job.options.sched = spec.sched;
  job.options.chunk = o.chunk;
  job.options.keep_every = spec.keep_every;
  cuda_bench_result r;
  bench::with_objective(o.objective, o.batch, seq, [&](auto& loss) {
    r = cuda_bench(job, loss);
    return r.result;
  });
  return r;
}

/// bench stream --device cuda, after every option was validated: the rows in order, a table on
/// stdout and (--csv) one CSV line per row, written as it is measured.
int cuda_stream_bench(const bench::bench_options& o, cuda_dtype dtype) {
  const char* dname = dtype == cuda_dtype::bf16 ? "bf16" : "f32";
  const model_config cfg = preset_config(o.preset_name);
  FILE* csv = nullptr;
  if (!o.csv.empty()) {
    csv = std::fopen(o.csv.c_str(), "w");
    check(csv != nullptr, "bench stream: cannot write ", o.csv);
    std::fprintf(csv,
                 "objective,schedule,T,chunk,batch,dtype,device,peak_device_bytes,"
                 "peak_activation_bytes,bytes_per_token,total_s,gflops,loss,statistics_s\n");
  }
  // warm-up (not reported): the first row once, so that lazy module loading and the memory
  // pool's first allocations are not timed
  {
    const auto data = bench::make_batch(o.batch, o.seqs.front(), cfg.vocab_size);
    (void)cuda_row(cfg, dtype, o, o.seqs.front(), o.scheds.front(), data);
  }
  bool header = false;
  for (index_t seq : o.seqs) {
    const auto data = bench::make_batch(o.batch, seq, cfg.vocab_size);
    for (const auto& sched : o.scheds) {
      const cuda_bench_result r = cuda_row(cfg, dtype, o, seq, sched, data);
      if (!header) {
        std::printf(
            "tightfit bench stream --device cuda: %s, preset %s (d=%lld, L=%lld, V=%lld), %s, "
            "B=%lld; seconds between two stream synchronisations\n",
            r.device_name.c_str(), o.preset_name.c_str(), static_cast<long long>(cfg.hidden_size),
            static_cast<long long>(cfg.num_hidden_layers), static_cast<long long>(cfg.vocab_size),
            dname, static_cast<long long>(o.batch));
        std::printf("%-5s %-12s %7s %6s %12s %12s %9s %9s %9s %12s\n", "obj", "schedule", "T",
                    "chunk", "peak_dev_MiB", "act_MiB", "B/token", "total_s", "GFLOP/s", "loss");
        header = true;
      }
      const double tokens = static_cast<double>(seq * o.batch);
      const double act = static_cast<double>(r.result.peak_activation_bytes);
      const double gflops = r.seconds > 0 ? r.flops / r.seconds / 1e9 : 0.0;
      std::printf("%-5s %-12s %7lld %6lld %12.1f %12.1f %9.0f %9.4f %9.1f %12.6f\n",
                  o.objective.c_str(), sched.c_str(), static_cast<long long>(seq),
                  static_cast<long long>(r.result.chunk),
                  static_cast<double>(r.peak_device_bytes) / 1048576.0, act / 1048576.0,
                  act / tokens, r.seconds, gflops, r.result.loss);
      std::fflush(stdout);
      if (csv != nullptr) {
        std::fprintf(csv, "%s,%s,%lld,%lld,%lld,%s,cuda,%zu,%zu,%.1f,%.6f,%.2f,%.8f,%.6f\n",
                     o.objective.c_str(), sched.c_str(), static_cast<long long>(seq),
                     static_cast<long long>(r.result.chunk), static_cast<long long>(o.batch), dname,
                     r.peak_device_bytes, r.result.peak_activation_bytes, act / tokens, r.seconds,
                     gflops, r.result.loss, r.result.statistics_seconds);
        std::fflush(csv);
      }
    }
  }
  if (csv != nullptr) {  // a full disk or /dev/full: the rows were not written (exit 1)
    const bool failed = std::ferror(csv) != 0;
    check(std::fclose(csv) == 0 && !failed, "bench stream: cannot write ", o.csv, ": ",
          std::strerror(errno));
    std::printf("wrote %s\n", o.csv.c_str());
  }
  return 0;
}
#endif

constexpr const char* bench_stream_usage =
    "usage: tightfit bench stream [--seq 2048,4096,8192,16384] "
    "[--schedules full,checkpoint,stream] [--chunk 512] [--batch 1]\n"
    "                             [--preset qwen3-bench|small|...] "
    "[--objective sft|grpo|dpo] [--csv FILE] [--compare]\n"
    "                             [--device cpu|cuda] [--dtype f32|bf16]\n"
    "  StreamBP against checkpointing and full backprop: peak activation bytes, "
    "bytes per token,\n  peak RSS (each row in its own process), time and GFLOP/s "
    "next to the machine's GEMM rate.\n  --device cuda (a CUDA build): the same "
    "rows on the first visible GPU, in one process,\n  with the backend's peak "
    "device bytes; --dtype bf16 (cuda only) stores bf16, accumulates fp32.\n"
    "  --single: one row measured in this process (what each row's child process runs).\n";

bool asks_for_help(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) return true;
  return false;
}

}  // namespace

int bench(int argc, char** argv) {
  // `bench --help` and `bench stream --help` print the usage; `bench` alone is an error
  if (argc < 2 || asks_for_help(argc, argv)) {
    std::fputs(bench_stream_usage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (std::strcmp(argv[1], "stream") != 0) {
    std::fprintf(stderr, "tightfit bench: unknown benchmark '%s' (known: stream)\n", argv[1]);
    return 2;
  }
  // --device and --dtype are the tool's; the rest goes to the benchmark's parser
  std::vector<char*> rest{argv[1]};
  std::string device = "cpu", dtype = "f32";
  bool cpu_only = false;  // --compare / --single given
  for (int i = 2; i < argc; ++i) {
    const bool is_device = std::strcmp(argv[i], "--device") == 0;
    if (!is_device && std::strcmp(argv[i], "--dtype") != 0) {
      if (std::strcmp(argv[i], "--compare") == 0 || std::strcmp(argv[i], "--single") == 0)
        cpu_only = true;
      rest.push_back(argv[i]);
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "tightfit bench: %s needs a value\n", argv[i]);
      return 2;
    }
    (is_device ? device : dtype) = argv[++i];
  }
  if (device != "cpu" && device != "cuda") {
    std::fprintf(stderr, "tightfit bench: --device expects cpu or cuda, got '%s'\n",
                 device.c_str());
    return 2;
  }
  if (dtype != "f32" && dtype != "bf16") {
    std::fprintf(stderr, "tightfit bench: --dtype expects f32 or bf16, got '%s'\n", dtype.c_str());
    return 2;
  }
  if (dtype == "bf16" && device != "cuda") {
    std::fprintf(stderr,
                 "tightfit bench: --dtype bf16 needs --device cuda (the CPU bench is float)\n");
    return 2;
  }
  // --csv: the tool's rule for outputs (output_paths.hpp), before anything runs
  for (std::size_t i = 1; i + 1 < rest.size(); ++i)
    if (std::strcmp(rest[i], "--csv") == 0) {
      try {
        output_paths paths;
        paths.output_file("--csv", rest[i + 1]);
      } catch (const usage_error& e) {
        std::fprintf(stderr, "tightfit bench: %s\n", e.message.c_str());
        return 2;
      }
    }
  if (device == "cpu")
    return bench::stream_bench_main(
        static_cast<int>(rest.size()), rest.data(),
        {"/proc/" + std::to_string(getpid()) + "/exe", "bench", "stream"});
  if (cpu_only) {
    std::fprintf(stderr,
                 "tightfit bench: --compare and --single run on the CPU only; --device cuda "
                 "measures each row once in this process\n");
    return 2;
  }
  bench::bench_options opts;
  try {
    opts = bench::parse_options(static_cast<int>(rest.size()), rest.data());
  } catch (const bench::bench_usage& e) {
    std::fprintf(stderr, "tightfit bench: %s\n", e.message.c_str());
    return 2;
  }
  try {
#if defined(TIGHTFIT_CLI_CUDA)
    require_cuda_device(0);
    return cuda_stream_bench(opts, dtype == "bf16" ? cuda_dtype::bf16 : cuda_dtype::f32);
#else
    fail(
        "--device cuda: this tightfit was built without CUDA; rebuild it with "
        "-DTIGHTFIT_WITH_CUDA=ON (needs the CUDA toolkit: nvcc, cuBLAS)");
#endif
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tightfit bench: %s\n", e.what());
    return 1;
  }
}

}  // namespace tightfit::cli
