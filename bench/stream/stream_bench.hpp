// stream_bench.hpp: the driver of bench_stream and `tightfit bench stream`: StreamBP against
// gradient checkpointing and full backprop, side by side.
//
// For each (schedule, T) the measurement runs in a fresh child process (this program
// re-executed with --single), so that each row's process peak RSS is its own. Prints a table
// and writes CSV. The machine's GEMM GFLOP/s is measured in the same run.
//
//   bench_stream [--seq 2048,4096,8192,16384] [--schedules full,checkpoint,stream]
//                [--chunk 512] [--batch 1] [--preset qwen3-bench|small] [--csv FILE]
//                [--objective sft|grpo|dpo]  (dpo: the batch holds B/2 chosen, B/2 rejected)
//                [--compare]   (in-process: also the largest gradient difference to full)
#pragma once

#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "tightfit/backend/eigen.hpp"
#include "tightfit/loss/dpo.hpp"
#include "tightfit/loss/grpo.hpp"
#include "tightfit/loss/sft.hpp"
#include "tightfit/nn/presets.hpp"
#include "tightfit/stream/backward.hpp"
#include "tightfit/stream/planner.hpp"

namespace tightfit::bench {

namespace {

using backend = eigen_backend<float>;

std::vector<index_t> parse_list(const std::string& s) {
  std::vector<index_t> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(std::stoll(item));
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

row measure(decoder_model<backend>& model, const batch_data& data, index_t batch, index_t seq,
            backward_schedule s, index_t chunk, const std::string& objective = "sft") {
  auto& be = model.backend();
  model.parameters().zero_grads();
  be.stats().reset();
  backward_options o;
  o.sched = s;
  o.chunk = chunk;
  const auto r = with_objective(objective, batch, seq, [&](auto& loss) {
    return compute_gradients(model, {batch, seq, data.ids, data.targets, {}}, loss, o);
  });
  row out;
  out.objective = objective;
  out.stats_s = r.statistics_seconds;
  out.sched = to_string(s);
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

/// The driver; self_command re-executes this driver (the child measurements use --single).
inline int stream_bench_main(int argc, char** argv, const std::string& self_command) {
  std::string seqs = "2048,4096,8192,16384", scheds = "full,checkpoint,stream",
              preset_name = "qwen3-bench", csv, objective = "sft";
  index_t chunk = 512, batch = 1;
  bool single = false, compare = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_stream: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--seq")
      seqs = next();
    else if (a == "--schedules")
      scheds = next();
    else if (a == "--chunk")
      chunk = std::stoll(next());
    else if (a == "--batch")
      batch = std::stoll(next());
    else if (a == "--preset")
      preset_name = next();
    else if (a == "--csv")
      csv = next();
    else if (a == "--objective")
      objective = next();
    else if (a == "--single")
      single = true;
    else if (a == "--compare")
      compare = true;
    else {
      std::fprintf(stderr,
                   "usage: bench_stream [--seq LIST] [--schedules LIST] [--chunk N] "
                   "[--batch B] [--preset qwen3-bench|small] [--csv FILE] [--compare] "
                   "[--objective sft|grpo|dpo]\n");
      return 2;
    }
  }
  try {
    const model_config cfg = preset_config(preset_name);
    if (single) {  // child: one (schedule, T) measurement, one machine-readable line
      backend be;
      decoder_model<backend> model(be, cfg);
      model.init_random(1);
      const index_t seq = parse_list(seqs).at(0);
      const auto data = make_batch(batch, seq, cfg.vocab_size);
      const row r =
          measure(model, data, batch, seq, parse_backward_schedule(scheds), chunk, objective);
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
    for (index_t seq : parse_list(seqs)) {
      if (compare) {
        backend be;
        decoder_model<backend> model(be, cfg);
        model.init_random(1);
        const auto data = make_batch(batch, seq, cfg.vocab_size);
        std::vector<std::vector<float>> reference;
        for (const auto& name : parse_names(scheds)) {
          row r = measure(model, data, batch, seq, parse_backward_schedule(name), chunk, objective);
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
      for (const auto& name : parse_names(scheds)) {
        std::string cmd = self_command + " --single --seq " + std::to_string(seq) +
                          " --schedules " + name + " --chunk " + std::to_string(chunk) +
                          " --batch " + std::to_string(batch) + " --preset " + preset_name +
                          " --objective " + objective;
        FILE* child = popen(cmd.c_str(), "r");
        check(child != nullptr, "bench_stream: cannot run ", cmd);
        char line[512];
        row r;
        bool got = false;
        while (std::fgets(line, sizeof line, child) != nullptr) {
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
        const int status = pclose(child);
        check(got && status == 0, "bench_stream: measurement '", cmd, "' failed");
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
      std::fclose(f);
      std::printf("wrote %s\n", csv.c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_stream: %s\n", e.what());
    return 1;
  }
  return 0;
}

}  // namespace tightfit::bench
