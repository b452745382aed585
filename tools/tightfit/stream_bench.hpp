// stream_bench.hpp: the driver of bench_stream and `tightfit bench stream`: StreamBP against
// gradient checkpointing and full backprop, side by side.
//
// For each (schedule, T) the measurement runs in a fresh child process (this program
// re-executed with --single through posix_spawn, with an argument vector: no shell), so that
// each row's process peak RSS is its own. Every option is validated before anything runs. Prints a
// table and writes CSV. The machine's GEMM GFLOP/s is measured in the same run.
//
//   bench_stream [--seq 2048,4096,8192,16384] [--schedules full,checkpoint,stream]
//                [--chunk 512] [--batch 1] [--preset qwen3-bench|small] [--csv FILE]
//                [--objective sft|grpo|dpo]  (dpo: the batch holds B/2 chosen, B/2 rejected)
//   schedules: full, checkpoint, stream, or checkpoint-kK / stream-kK (layer-input spacing K)
//                [--compare]   (in-process: also the largest gradient difference to full)
#pragma once

#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "args.hpp"
#include "tightfit/backend/eigen.hpp"
#include "tightfit/backend/meta.hpp"
#include "tightfit/core/limits.hpp"
#include "tightfit/loss/dpo.hpp"
#include "tightfit/loss/grpo.hpp"
#include "tightfit/loss/sft.hpp"
#include "tightfit/nn/decoder_layer.hpp"
#include "tightfit/nn/presets.hpp"
#include "tightfit/stream/backward.hpp"
#include "tightfit/stream/planner.hpp"

namespace tightfit::bench {

namespace {

using backend = eigen_backend<float>;

/// The largest sequence length, chunk or batch the driver takes (2^40): a declared maximum;
/// the memory check below is the real limit.
inline constexpr long long max_count = 1LL << 40;

using cli::usage_error;

/// An integer in [1, max_count] (cli::parse_integer: a usage_error naming the option otherwise).
index_t parse_count(const std::string& key, const std::string& text) {
  return static_cast<index_t>(cli::parse_integer(key, text, 1, max_count));
}

std::vector<index_t> parse_list(const std::string& s) {
  std::vector<index_t> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(parse_count("--seq", item));
  if (out.empty()) throw usage_error{"--seq is empty, expected a list like 2048,4096"};
  return out;
}
std::vector<std::string> parse_names(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(item);
  return out;
}

double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

/// The machine's practical GEMM rate: a (T x d) x (d x f) float product like the MLP's.
double gemm_gflops() {
  backend be;
  const index_t m = 2048, k = 512, n = 1536;
  auto a = be.allocate<float>(m * k);
  auto b = be.allocate<float>(k * n);
  auto c = be.allocate<float>(m * n);
  std::mt19937 gen(1);
  std::uniform_real_distribution<float> u(-1, 1);
  for (auto& x : a.span()) x = u(gen);
  for (auto& x : b.span()) x = u(gen);
  be.gemm(transpose::no, transpose::no, 1.f, a.view(m, k), b.view(k, n), 0.f, c.view(m, n));
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 4; ++i)
      be.gemm(transpose::no, transpose::no, 1.f, a.view(m, k), b.view(k, n), 0.f, c.view(m, n));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 4 * 2.0 * double(m) * double(k) * double(n) / s / 1e9);
  }
  return best;
}

/// A schedule name of the driver: full, checkpoint, stream, or checkpoint-kK / stream-kK with
/// layer-input spacing K (backward_options::keep_every).
struct schedule_spec {
  backward_schedule sched = backward_schedule::stream;
  index_t keep_every = 1;
};
inline schedule_spec parse_schedule_spec(const std::string& name) {
  const auto dash = name.find("-k");
  schedule_spec spec;
  spec.sched = parse_backward_schedule(name.substr(0, dash));
  if (dash != std::string::npos) {
    const std::string k = name.substr(dash + 2);
    check(!k.empty() && k.size() < 6 && k.find_first_not_of("0123456789") == std::string::npos,
          "schedule '", name, "': expected <schedule>-k<layers>, e.g. stream-k3");
    spec.keep_every = std::stoll(k);
  }
  return spec;
}

struct row {
  std::string sched, objective = "sft";
  index_t seq = 0, chunk = 0;
  double peak_bytes = 0, predicted_bytes = 0, rss_mib = 0, fwd_s = 0, total_s = 0, flops = 0,
         loss = 0, max_grad_diff = -1, stats_s = 0,
         gemm = 0;  ///< the machine's GEMM GFLOP/s, measured right after this row's run
};

struct batch_data {
  std::vector<token_id> ids, targets;
};
batch_data make_batch(index_t batch, index_t seq, index_t vocab) {
  batch_data d;
  std::mt19937_64 gen(42);
  std::uniform_int_distribution<token_id> tok(0, vocab - 1);
  for (index_t i = 0; i < batch * seq; ++i) d.ids.push_back(tok(gen));
  d.targets = shift_labels(d.ids, batch, seq);
  return d;
}

/// Runs one objective: SFT; GRPO with advantages, old and reference log-probs (beta 0.04);
/// DPO with the first half of the batch chosen and the second half rejected.
template <class Run>
backward_result with_objective(const std::string& name, index_t batch, index_t seq, Run&& run) {
  const auto rows = static_cast<std::size_t>(batch * seq);
  if (name == "sft") {
    sft_loss loss;
    return run(loss);
  }
  if (name == "grpo") {
    std::vector<double> adv(static_cast<std::size_t>(batch)), old(rows, -10.4), refp(rows, -10.5);
    for (std::size_t b = 0; b < adv.size(); ++b) adv[b] = b % 2 == 0 ? 1.0 : -0.5;
    grpo_options o;
    o.beta = 0.04;
    grpo_loss loss(adv, old, refp, o);
    return run(loss);
  }
  if (name == "dpo") {
    check(batch % 2 == 0, "bench_stream: dpo needs an even batch (pairs), got ", batch);
    std::vector<index_t> chosen, rejected;
    for (index_t p = 0; p < batch / 2; ++p) {
      chosen.push_back(p);
      rejected.push_back(p + batch / 2);
    }
    std::vector<double> ref_w(chosen.size(), -10.0 * double(seq)),
        ref_l(chosen.size(), -10.0 * double(seq));
    dpo_loss loss(chosen, rejected, ref_w, ref_l);
    return run(loss);
  }
  fail("unknown objective '", name, "', expected sft, grpo or dpo");
}

row measure(llama_model<backend>& model, const batch_data& data, index_t batch, index_t seq,
            const std::string& sched_name, index_t chunk, const std::string& objective = "sft") {
  const schedule_spec spec = parse_schedule_spec(sched_name);
  auto& be = model.backend();
  model.parameters().zero_grads();
  be.stats().reset();
  backward_options o;
  o.sched = spec.sched;
  o.chunk = chunk;
  o.keep_every = spec.keep_every;
  const auto r = with_objective(objective, batch, seq, [&](auto& loss) {
    return compute_gradients(model, {batch, seq, data.ids, data.targets, {}}, loss, o);
  });
  row out;
  out.objective = objective;
  out.stats_s = r.statistics_seconds;
  out.sched = sched_name;
  out.seq = seq;
  out.chunk = r.chunk;
  out.peak_bytes = double(r.peak_activation_bytes);
  out.predicted_bytes =
      double(predict_peak_activation_bytes<float>(model.config(), batch, seq, o, sft_loss{}));
  out.fwd_s = r.forward_seconds;
  out.total_s = r.seconds;
  out.flops = be.stats().gemm_flops + be.stats().attention_flops;
  out.loss = r.loss;
  out.rss_mib = peak_rss_mib();
  out.gemm = gemm_gflops();
  return out;
}

void print_header() {
  std::printf("%-5s %-10s %6s %6s %10s %10s %8s %9s %8s %8s %8s %8s %7s %7s %7s\n", "obj",
              "schedule", "T", "chunk", "peak_MiB", "pred_MiB", "B/token", "RSS_MiB", "fwd_s",
              "bwd_s", "stats_s", "total_s", "GFLOP/s", "GEMM", "%GEMM");
}
void print_row(const row& r, index_t batch) {
  const double gf = r.flops / r.total_s / 1e9;
  std::printf(
      "%-5s %-10s %6lld %6lld %10.1f %10.1f %8.0f %9.1f %8.2f %8.2f %8.2f %8.2f %7.1f %7.1f "
      "%6.0f%%",
      r.objective.c_str(), r.sched.c_str(), static_cast<long long>(r.seq),
      static_cast<long long>(r.chunk), r.peak_bytes / 1048576.0, r.predicted_bytes / 1048576.0,
      r.peak_bytes / double(r.seq * batch), r.rss_mib, r.fwd_s, r.total_s - r.fwd_s, r.stats_s,
      r.total_s, gf, r.gemm, 100.0 * gf / r.gemm);
  if (r.max_grad_diff >= 0) std::printf("  max|dgrad|/max|g| vs full: %.2e", r.max_grad_diff);
  std::printf("\n");
  std::fflush(stdout);
}

}  // namespace

/// The options of the driver, every one validated by parse_options before anything runs.
struct bench_options {
  std::vector<index_t> seqs;
  std::vector<std::string> scheds;
  std::string preset_name, csv, objective;
  index_t chunk = 0, batch = 0;
  bool single = false, compare = false;
};

/// The driver's options (the tool's `bench stream` adds --device and --dtype).
inline cli::command_spec stream_bench_command() {
  cli::command_spec c;
  c.name = "bench stream";
  c.synopsis = "[--seq LIST] [--schedules LIST] [options]";
  c.options = {
      {"--seq", "LIST", "the sequence lengths, comma-separated", "2048,4096,8192,16384"},
      {"--schedules", "LIST",
       "full, checkpoint, stream, or checkpoint-kK / stream-kK (every K-th layer input kept), "
       "comma-separated",
       "full,checkpoint,stream"},
      {"--chunk", "N", "StreamBP's chunk of positions", "512"},
      {"--batch", "B", "rows (dpo: B/2 chosen, B/2 rejected)", "1"},
      {"--preset", "NAME", "the model: qwen3-bench, small or another preset of nn/presets.hpp",
       "qwen3-bench"},
      {"--objective", "NAME", "sft, grpo or dpo", "sft"},
      {"--csv", "FILE", "the rows also as CSV"},
      {"--compare", "", "in one process: also the largest gradient difference to full"},
      {"--single", "", "one row measured in this process (what each row's child process runs)"},
  };
  c.notes =
      "StreamBP against checkpointing and full backprop: peak activation bytes, bytes per token,\n"
      "peak RSS (each row in its own process), time and GFLOP/s next to the machine's GEMM rate.\n";
  return c;
}

/// Parses and validates every option (a usage_error naming the value otherwise): sequence
/// lengths, chunk and batch in [1, 2^40], schedule, preset and objective names, an even batch
/// for dpo, a writable --csv, and each row's predicted memory (parameters, gradients and the
/// planner's peak activation bytes) against what this process may use.
inline bench_options parse_options(const cli::arguments& a) {
  bench_options o;
  o.seqs = parse_list(a.get("--seq"));
  o.scheds = parse_names(a.get("--schedules"));
  o.chunk = parse_count("--chunk", a.get("--chunk"));
  o.batch = parse_count("--batch", a.get("--batch"));
  o.preset_name = a.get("--preset");
  o.csv = a.get("--csv", "");
  o.objective = a.get("--objective");
  o.single = a.has("--single");
  o.compare = a.has("--compare");
  if (o.objective != "sft" && o.objective != "grpo" && o.objective != "dpo")
    throw usage_error{"--objective expects sft, grpo or dpo, got '" + o.objective + "'"};
  if (o.objective == "dpo" && o.batch % 2 != 0)
    throw usage_error{"--objective dpo needs an even --batch (pairs), got " +
                      std::to_string(o.batch)};
  if (o.scheds.empty()) throw usage_error{"--schedules is empty"};
  model_config cfg;
  try {
    cfg = preset_config(o.preset_name);
    for (const auto& name : o.scheds) {
      const schedule_spec spec = parse_schedule_spec(name);
      check(spec.keep_every >= 1 && spec.keep_every <= cfg.num_hidden_layers, "schedule '", name,
            "': spacing ", spec.keep_every, ", expected in [1, ", cfg.num_hidden_layers, "]");
      check(spec.keep_every == 1 || spec.sched != backward_schedule::full, "schedule '", name,
            "': the full schedule keeps every activation");
    }
  } catch (const error& e) {
    throw usage_error{e.what()};
  }
  if (!o.csv.empty()) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::path csv = o.csv;
    const fs::path dir = csv.parent_path().empty() ? fs::path(".") : csv.parent_path();
    if (fs::is_directory(csv, ec)) throw usage_error{"--csv '" + o.csv + "' is a directory"};
    if (!fs::is_directory(dir, ec) || ::access(dir.c_str(), W_OK | X_OK) != 0)
      throw usage_error{"--csv '" + o.csv + "' cannot be written: '" + dir.string() +
                        "' is not a writable directory"};
    if (fs::exists(csv, ec) && ::access(csv.c_str(), W_OK) != 0)
      throw usage_error{"--csv '" + o.csv + "' is not writable"};
  }
  // Memory before anything runs: every row against what this process may use.
  const std::uint64_t limit = memory_limit_bytes();
  std::uint64_t params = 0;  // parameter bytes, counted by a dry-run model
  {
    meta_backend<float> mb;
    llama_model<meta_backend<float>> dry(mb, cfg);
    params = mb.memory().live();
  }
  for (index_t seq : o.seqs) {
    const auto tokens = checked_product(
        {static_cast<std::uint64_t>(o.batch), static_cast<std::uint64_t>(seq), std::uint64_t{64}});
    if (!tokens || *tokens > limit)
      throw usage_error{"--seq " + std::to_string(seq) + " x --batch " + std::to_string(o.batch) +
                        " tokens need more than the " + byte_string(limit) +
                        " this process may use (physical memory, ulimit -v / -d)"};
    for (const auto& name : o.scheds) {
      backward_options bo;
      const schedule_spec spec = parse_schedule_spec(name);
      bo.sched = spec.sched;
      bo.keep_every = spec.keep_every;
      bo.chunk = o.chunk;
      const std::uint64_t need =
          predict_peak_activation_bytes<float>(cfg, o.batch, seq, bo, sft_loss{}) + *tokens +
          2 * params;
      if (need > limit)
        throw usage_error{"--seq " + std::to_string(seq) + " (schedule " + name + ") needs " +
                          byte_string(need) +
                          " (parameters, gradients, activations), more than the " +
                          byte_string(limit) + " this process may use"};
    }
  }
  return o;
}

/// What a child printed on stdout, and its exit status (-1: it could not start or was killed).
struct child_output {
  int status = -1;
  std::vector<std::string> lines;
};

/// Runs args (no shell: the options are separate arguments) and collects its stdout lines.
inline child_output run_child(const std::vector<std::string>& args) {
  child_output res;
  int fds[2];
  check(::pipe(fds) == 0, "bench_stream: pipe failed");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
  posix_spawn_file_actions_addclose(&actions, fds[0]);
  posix_spawn_file_actions_addclose(&actions, fds[1]);
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int rc = ::posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    return res;
  }
  FILE* out = ::fdopen(fds[0], "r");
  char line[512];
  while (out != nullptr && std::fgets(line, sizeof line, out) != nullptr)
    res.lines.emplace_back(line);
  if (out != nullptr) std::fclose(out);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  res.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return res;
}

/// The driver; self_argv re-executes this driver (the child measurements add --single and one
/// (schedule, T) as separate arguments: no shell is involved).
inline int stream_bench_run(const bench_options& opts, const std::vector<std::string>& self_argv) {
  const auto& [seq_list, sched_list, preset_name, csv, objective, chunk, batch, single, compare] =
      opts;
  try {
    const model_config cfg = preset_config(preset_name);
    if (single) {  // child: one (schedule, T) measurement, one machine-readable line
      backend be;
      llama_model<backend> model(be, cfg);
      model.init_random(1);
      const index_t seq = seq_list.at(0);
      const auto data = make_batch(batch, seq, cfg.vocab_size);
      const row r = measure(model, data, batch, seq, sched_list.at(0), chunk, objective);
      std::printf("ROW %s %lld %lld %.0f %.0f %.3f %.6f %.6f %.6e %.8f %.6f %.3f\n",
                  r.sched.c_str(), static_cast<long long>(r.seq), static_cast<long long>(r.chunk),
                  r.peak_bytes, r.predicted_bytes, r.rss_mib, r.fwd_s, r.total_s, r.flops, r.loss,
                  r.stats_s, r.gemm);
      return 0;
    }
    const double gemm = gemm_gflops();
    std::printf(
        "tightfit bench stream: preset %s (d=%lld, L=%lld, H=%lld/%lld, hd=%lld, f=%lld, "
        "V=%lld), float, B=%lld, %d threads\n",
        preset_name.c_str(), static_cast<long long>(cfg.hidden_size),
        static_cast<long long>(cfg.num_hidden_layers),
        static_cast<long long>(cfg.num_attention_heads),
        static_cast<long long>(cfg.num_key_value_heads), static_cast<long long>(cfg.head_dim),
        static_cast<long long>(cfg.intermediate_size), static_cast<long long>(cfg.vocab_size),
        static_cast<long long>(batch), concurrency());
    std::printf(
        "machine GEMM (2048x512x1536 float) at start: %.1f GFLOP/s; each row's GEMM column "
        "is measured in its own process right after its run\n",
        gemm);
    print_header();
    std::vector<row> rows;
    for (index_t seq : seq_list) {
      if (compare) {
        backend be;
        llama_model<backend> model(be, cfg);
        model.init_random(1);
        const auto data = make_batch(batch, seq, cfg.vocab_size);
        std::vector<std::vector<float>> reference;
        for (const auto& name : sched_list) {
          row r = measure(model, data, batch, seq, name, chunk, objective);
          auto& p = model.parameters();
          std::vector<std::vector<float>> grads;
          for (std::size_t i = 0; i < p.size(); ++i)
            grads.emplace_back(p.grad(i).begin(), p.grad(i).end());
          if (reference.empty()) {
            reference = grads;
          } else {
            double num = 0, den = 0;
            for (std::size_t i = 0; i < grads.size(); ++i)
              for (std::size_t k = 0; k < grads[i].size(); ++k) {
                num = std::max(num, double(std::abs(grads[i][k] - reference[i][k])));
                den = std::max(den, double(std::abs(reference[i][k])));
              }
            r.max_grad_diff = num / den;
          }
          print_row(r, batch);
          rows.push_back(r);
        }
        continue;
      }
      for (const auto& name : sched_list) {
        std::vector<std::string> args = self_argv;
        for (const std::string& a :
             {std::string("--single"), std::string("--seq"), std::to_string(seq),
              std::string("--schedules"), name, std::string("--chunk"), std::to_string(chunk),
              std::string("--batch"), std::to_string(batch), std::string("--preset"), preset_name,
              std::string("--objective"), objective})
          args.push_back(a);
        row r;
        bool got = false;
        const child_output child = run_child(args);
        for (const std::string& text : child.lines) {
          const char* line = text.c_str();
          char sched[32];
          long long t = 0, c = 0;
          if (std::sscanf(line, "ROW %31s %lld %lld %lf %lf %lf %lf %lf %lf %lf %lf %lf", sched, &t,
                          &c, &r.peak_bytes, &r.predicted_bytes, &r.rss_mib, &r.fwd_s, &r.total_s,
                          &r.flops, &r.loss, &r.stats_s, &r.gemm) == 12) {
            r.objective = objective;
            r.sched = sched;
            r.seq = t;
            r.chunk = c;
            got = true;
          } else {
            std::fputs(line, stderr);
          }
        }
        const int status = child.status;
        check(got && status == 0, "bench_stream: the measurement of ", name, " at T = ", seq,
              " failed (exit status ", status, ")");
        print_row(r, batch);
        rows.push_back(r);
      }
    }
    if (!csv.empty()) {
      FILE* f = std::fopen(csv.c_str(), "w");
      check(f != nullptr, "bench_stream: cannot write ", csv);
      std::fprintf(f,
                   "objective,schedule,T,chunk,batch,peak_activation_bytes,predicted_bytes,"
                   "bytes_per_token,peak_rss_mib,forward_s,backward_s,total_s,gflops,"
                   "gemm_gflops,loss,statistics_s\n");
      for (const auto& r : rows)
        std::fprintf(
            f, "%s,%s,%lld,%lld,%lld,%.0f,%.0f,%.1f,%.1f,%.4f,%.4f,%.4f,%.2f,%.2f,%.8f,%.4f\n",
            r.objective.c_str(), r.sched.c_str(), static_cast<long long>(r.seq),
            static_cast<long long>(r.chunk), static_cast<long long>(batch), r.peak_bytes,
            r.predicted_bytes, r.peak_bytes / double(r.seq * batch), r.rss_mib, r.fwd_s,
            r.total_s - r.fwd_s, r.total_s, r.flops / r.total_s / 1e9, r.gemm, r.loss, r.stats_s);
      // a full disk or /dev/full: the rows were not written (exit 1)
      const bool failed = std::ferror(f) != 0;
      const int closed = std::fclose(f);
      check(!failed && closed == 0, "cannot write ", csv, ": ", std::strerror(errno));
      std::printf("wrote %s\n", csv.c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_stream: %s\n", e.what());
    return 1;
  }
  return 0;
}

/// bench_stream's main: the options parsed (exit 2 naming a wrong one), then the run; self_argv
/// re-executes this driver for each row.
inline int stream_bench_main(int argc, char** argv, const std::vector<std::string>& self_argv) {
  static const cli::command_spec spec = [] {
    cli::command_spec c = stream_bench_command();
    c.program = "bench_stream";
    c.name.clear();
    return c;
  }();
  bench_options opts;
  try {
    const cli::arguments a(spec, argc, argv);
    if (a.help()) {
      std::fputs(cli::help_text(spec).c_str(), stdout);
      return 0;
    }
    opts = parse_options(a);
  } catch (const usage_error& e) {
    std::fprintf(stderr, "bench_stream: %s\n%s", e.message.c_str(), spec.usage().c_str());
    return 2;
  }
  return stream_bench_run(opts, self_argv);
}

}  // namespace tightfit::bench
