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

}  // namespace

/// bench stream's options: the driver's (stream_bench.hpp) and the device's.
const command_spec& bench_command() {
  static const command_spec spec = [] {
    command_spec c = bench::stream_bench_command();
    c.options.push_back({"--device", "NAME",
                         "cpu, or cuda (a CUDA build): the rows on the first visible GPU, in one "
                         "process, with the backend's peak device bytes",
                         "cpu"});
    c.options.push_back(
        {"--dtype", "NAME", "f32, or bf16 (cuda only: bf16 storage, fp32 accumulation)", "f32"});
    return c;
  }();
  return spec;
}

int bench(int argc, char** argv) {
  // `bench stream ...`: the one benchmark; `bench` alone is an error, `bench --help` its help
  if (argc >= 2 && (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0)) {
    std::fputs(help_text(bench_command()).c_str(), stdout);
    return 0;
  }
  if (argc < 2 || std::strcmp(argv[1], "stream") != 0) {
    print_usage_error(bench_command(), argc < 2 ? "which benchmark? (known: stream)"
                                                : "unknown benchmark '" + std::string(argv[1]) +
                                                      "' (known: stream)");
    return 2;
  }
  return with_arguments(bench_command(), argc - 1, argv + 1, [](const arguments& a) {
    const std::string device = a.choice("--device", {"cpu", "cuda"});
    const std::string dtype = a.choice("--dtype", {"f32", "bf16"});
    if (dtype == "bf16" && device != "cuda")
      throw usage_error{"--dtype bf16 needs --device cuda (the CPU bench is float)"};
    if (device == "cuda" && (a.has("--compare") || a.has("--single")))
      throw usage_error{
          "--compare and --single run on the CPU only; --device cuda measures each row once in "
          "this process"};
    // --csv: the tool's rule for outputs (output_paths.hpp), before anything runs
    if (a.has("--csv")) {
      output_paths paths;
      paths.output_file("--csv", a.get("--csv"));
    }
    const bench::bench_options opts = bench::parse_options(a);
    if (device == "cpu")
      return bench::stream_bench_run(
          opts, {"/proc/" + std::to_string(getpid()) + "/exe", "bench", "stream"});
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
  });
}

}  // namespace tightfit::cli
