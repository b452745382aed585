// bench_optim: the evidence for optim/ (BAdam and BREAD), in two parts.
//
//  memory       On the StreamBP benchmark config (hidden 512, 8 layers, 8/2 heads, hd 64,
//               inter 1536, vocab 32768, float): optimizer-state bytes and peak counted memory
//               of Adam, BAdam, BREAD-SGD and BREAD-LoRA, and the backward time (total minus
//               forward) averaged over one pass through the D blocks, relative to the full
//               backward (paper: about (D+1)/(2D) of the layers' backward work).
//  convergence  A small model trained from scratch on a synthetic long-context task (copy a
//               random prefix after a separator; only the copy is supervised): loss curves of
//               Adam, BAdam, BREAD-SGD, BREAD-LoRA for the same number of steps.
//
//   bench_optim [--part memory|convergence|all] [--seq 1024] [--preset qwen3-bench|small]
//               [--steps 600] [--switch-every 20] [--prefix 63] [--out DIR] [--quick]
// Writes DIR/optim_memory.csv and DIR/optim_convergence.csv (plot with plot_convergence.py).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "tightfit/backend/eigen.hpp"
#include "tightfit/loss/sft.hpp"
#include "tightfit/optim/optim.hpp"
#include "tightfit/stream/backward.hpp"

using namespace tightfit;

namespace {

using backend = eigen_backend<float>;

model_config bench_config(const std::string& preset) {
  model_config c;  // hidden 512, 8 layers, 8/2 heads, hd 64, inter 1536, vocab 32768
  if (preset == "small") {
    c.num_hidden_layers = 4;
    c.vocab_size = 8192;
  } else if (preset != "qwen3-bench") {
    fail("unknown preset '", preset, "', expected qwen3-bench or small");
  }
  return c;
}

double mib(double bytes) {
  return bytes / (1024.0 * 1024.0);
}

// ---- part (a): memory and backward time ----------------------------------------------------

struct mem_row {
  std::string method;
  index_t steps = 0;
  double param_bytes = 0, state_bytes = 0, peak_bytes = 0, bwd_s = 0, fwd_s = 0, step_s = 0;
  double fwd_gflop = 0, bwd_gflop = 0;  // GEMM + attention work (kernel_stats), per step
};

template <class Make>
mem_row measure(const std::string& method, const model_config& cfg, index_t seq, index_t steps,
                Make make) {
  backend be;
  decoder_model<backend> model(be, cfg);
  model.init_random(1);
  auto opt = make(model);
  std::mt19937_64 gen(42);
  std::uniform_int_distribution<token_id> tok(0, cfg.vocab_size - 1);
  std::vector<token_id> ids(static_cast<std::size_t>(seq));
  for (auto& x : ids) x = tok(gen);
  const auto targets = shift_labels(ids, 1, seq);
  const token_batch batch{1, seq, ids, targets, {}};
  backward_options o;
  o.sched = schedule::stream;
  o.chunk = std::min<index_t>(512, seq);
  mem_row r;
  r.method = method;
  r.steps = steps;
  r.param_bytes = static_cast<double>(model.parameters().total_numel()) * sizeof(float);
  auto work = [&] { return (be.stats().gemm_flops + be.stats().attention_flops) / 1e9; };
  {  // the forward's work alone: nothing needs a gradient
    backward_options fo = o;
    fo.layer_weight_grads.assign(static_cast<std::size_t>(cfg.num_hidden_layers), false);
    fo.embedding_grad = false;
    fo.head_grad = false;
    sft_loss loss;
    be.stats().reset();
    compute_gradients(model, batch, loss, fo);
    r.fwd_gflop = work();
  }
  for (index_t s = 0; s < steps; ++s) {
    sft_loss loss;
    be.stats().reset();
    const auto t0 = std::chrono::steady_clock::now();
    const auto res = opt.step(batch, loss, o);
    r.bwd_gflop += work() - r.fwd_gflop;
    r.step_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    r.bwd_s += res.backward.seconds - res.backward.forward_seconds;
    r.fwd_s += res.backward.forward_seconds;
    r.peak_bytes = std::max(r.peak_bytes, static_cast<double>(res.backward.peak_bytes));
    r.state_bytes = std::max(r.state_bytes, static_cast<double>(opt.state_bytes()));
    std::fprintf(stderr, "\r  %s step %lld/%lld", method.c_str(), static_cast<long long>(s + 1),
                 static_cast<long long>(steps));
  }
  std::fprintf(stderr, "\n");
  r.bwd_s /= static_cast<double>(steps);
  r.fwd_s /= static_cast<double>(steps);
  r.step_s /= static_cast<double>(steps);
  r.bwd_gflop /= static_cast<double>(steps);
  return r;
}

void part_memory(const std::string& preset, index_t seq, const std::filesystem::path& out) {
  const model_config cfg = bench_config(preset);
  const index_t d = cfg.num_hidden_layers;
  std::printf(
      "== memory and backward time: %s, T = %lld, D = %lld blocks (one per layer), "
      "K = 1, one pass in descending order\n",
      preset.c_str(), static_cast<long long>(seq), static_cast<long long>(d));
  block_options k1;
  k1.switch_every = 1;
  std::vector<mem_row> rows;
  rows.push_back(measure("adam", cfg, seq, 2, [](decoder_model<backend>& m) {
    return make_full_optimizer(m, adam_update_rule{});
  }));
  rows.push_back(measure("badam", cfg, seq, d, [&](decoder_model<backend>& m) {
    return block_optimizer<backend, adam_update_rule, descending_order>(
        m, block_partition::by_layer(m.parameters()), {}, {}, {}, k1);
  }));
  rows.push_back(measure("bread-sgd", cfg, seq, d, [&](decoder_model<backend>& m) {
    return block_optimizer<backend, adam_update_rule, descending_order, sgd_expansion>(
        m, block_partition::by_layer(m.parameters()), {}, {}, {}, k1);
  }));
  rows.push_back(measure("bread-lora", cfg, seq, d, [&](decoder_model<backend>& m) {
    return block_optimizer<backend, adam_update_rule, descending_order, lora_expansion>(
        m, block_partition::by_layer(m.parameters()), {}, {}, {}, k1);
  }));
  // Time ratios are normalised by each row's own forward time (the same work in every row), so
  // that a busy shared machine does not distort them; the GFLOP ratio is exact work.
  const auto& full = rows[0];
  auto time_ratio = [&](const mem_row& r) {
    return (r.bwd_s / r.fwd_s) / (full.bwd_s / full.fwd_s);
  };
  std::printf("%-11s %10s %10s %10s %8s %8s %8s %10s %10s\n", "method", "params MiB", "state MiB",
              "peak MiB", "fwd s", "bwd s", "step s", "bwd work", "bwd time");
  std::ofstream csv(out / "optim_memory.csv");
  csv << "method,preset,seq,steps,param_bytes,state_bytes,peak_bytes,forward_s,backward_s,step_s,"
         "forward_gflop,backward_gflop,backward_work_ratio,backward_time_ratio\n";
  for (const auto& r : rows) {
    std::printf("%-11s %10.1f %10.1f %10.1f %8.3f %8.3f %8.3f %10.3f %10.3f\n", r.method.c_str(),
                mib(r.param_bytes), mib(r.state_bytes), mib(r.peak_bytes), r.fwd_s, r.bwd_s,
                r.step_s, r.bwd_gflop / full.bwd_gflop, time_ratio(r));
    csv << r.method << "," << preset << "," << seq << "," << r.steps << "," << r.param_bytes << ","
        << r.state_bytes << "," << r.peak_bytes << "," << r.fwd_s << "," << r.bwd_s << ","
        << r.step_s << "," << r.fwd_gflop << "," << r.bwd_gflop << ","
        << r.bwd_gflop / full.bwd_gflop << "," << time_ratio(r) << "\n";
  }
  std::printf(
      "bwd work / time: backward GFLOP (GEMM + attention) and backward seconds per step over "
      "one pass, relative to full backprop (Adam); time normalised by each row's forward.\n"
      "BAdam: work %.3f, time %.3f; the paper's layer-only count predicts (D+1)/(2D) = %.3f "
      "(here the LM head's backward, paid by every step, is included)\n",
      rows[1].bwd_gflop / full.bwd_gflop, time_ratio(rows[1]),
      static_cast<double>(d + 1) / static_cast<double>(2 * d));
}

// ---- part (b): convergence on a copy task --------------------------------------------------

struct copy_task {
  index_t vocab = 32, prefix = 63, batch = 8;
  index_t seq_len() const { return 2 * prefix + 2; }  // BOS-less: prefix, SEP, copy, pad-end
  /// B rows: random prefix tokens in [1, vocab), separator 0, the prefix again, one more token.
  void make(std::mt19937_64& gen, std::vector<token_id>& ids,
            std::vector<token_id>& targets) const {
    const index_t t = seq_len();
    std::uniform_int_distribution<token_id> tok(1, vocab - 1);
    ids.assign(static_cast<std::size_t>(batch * t), 0);
    std::vector<token_id> labels(ids.size(), ignore_index);
    for (index_t b = 0; b < batch; ++b) {
      auto* row = ids.data() + b * t;
      auto* lab = labels.data() + b * t;
      for (index_t i = 0; i < prefix; ++i) row[i] = tok(gen);
      row[prefix] = 0;  // separator
      for (index_t i = 0; i < prefix; ++i) {
        row[prefix + 1 + i] = row[i];
        lab[prefix + 1 + i] = row[i];  // supervised: the copy (predicted from position - 1)
      }
      row[t - 1] = 0;
    }
    targets = shift_labels(labels, batch, t);
  }
};

model_config copy_config(const copy_task& task) {
  model_config c;
  c.vocab_size = task.vocab;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.rope_theta = 10000;
  return c;
}

template <class Make>
std::vector<double> curve(const std::string& method, const copy_task& task, index_t steps,
                          double* seconds, Make make) {
  backend be;
  decoder_model<backend> model(be, copy_config(task));
  model.init_random(3, 0.05);
  auto opt = make(model);
  std::mt19937_64 gen(7);  // the same batches for every method
  std::vector<token_id> ids, targets;
  backward_options o;
  o.sched = schedule::stream;
  o.chunk = task.seq_len();
  std::vector<double> losses;
  const auto t0 = std::chrono::steady_clock::now();
  for (index_t s = 0; s < steps; ++s) {
    task.make(gen, ids, targets);
    sft_loss loss;
    opt.set_lr_factor(cosine_schedule{steps / 20, steps, 0.1}(s));
    losses.push_back(opt.step({task.batch, task.seq_len(), ids, targets, {}}, loss, o).loss);
    if (s % 10 == 9)
      std::fprintf(stderr, "\r  %-10s step %lld/%lld loss %.4f", method.c_str(),
                   static_cast<long long>(s + 1), static_cast<long long>(steps), losses.back());
  }
  std::fprintf(stderr, "\n");
  *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return losses;
}

double tail_mean(const std::vector<double>& v, std::size_t n) {
  n = std::min(n, v.size());
  double s = 0;
  for (std::size_t i = v.size() - n; i < v.size(); ++i) s += v[i];
  return s / static_cast<double>(n);
}

void part_convergence(const copy_task& task, index_t steps, index_t k,
                      const std::filesystem::path& out) {
  const auto cfg = copy_config(task);
  std::printf(
      "\n== convergence: copy a %lld-token random prefix (T = %lld, vocab %lld, batch "
      "%lld), 4 layers hidden 64, %lld steps, cosine lr, blocks: embedding, 4 layers, "
      "head (D = 6), K = %lld, random order\n",
      static_cast<long long>(task.prefix), static_cast<long long>(task.seq_len()),
      static_cast<long long>(task.vocab), static_cast<long long>(task.batch),
      static_cast<long long>(steps), static_cast<long long>(k));
  (void)cfg;
  adam_update_rule adam;
  adam.lr = 3e-3;
  block_options bo;
  bo.switch_every = k;
  struct result {
    std::string name;
    std::vector<double> losses;
    double seconds = 0;
  };
  std::vector<result> res(4);
  res[0].name = "adam";
  res[0].losses = curve("adam", task, steps, &res[0].seconds,
                        [&](decoder_model<backend>& m) { return make_full_optimizer(m, adam); });
  auto part = [](decoder_model<backend>& m) {
    return block_partition::by_layer(m.parameters(), true, true);
  };
  res[1].name = "badam";
  res[1].losses = curve("badam", task, steps, &res[1].seconds, [&](decoder_model<backend>& m) {
    return block_optimizer<backend>(m, part(m), adam, {}, {}, bo);
  });
  res[2].name = "bread-sgd";
  res[2].losses = curve("bread-sgd", task, steps, &res[2].seconds, [&](decoder_model<backend>& m) {
    sgd_expansion e;
    e.lr = 3e-2;
    return block_optimizer<backend, adam_update_rule, random_reshuffle, sgd_expansion>(
        m, part(m), adam, {}, e, bo);
  });
  res[3].name = "bread-lora";
  res[3].losses = curve("bread-lora", task, steps, &res[3].seconds, [&](decoder_model<backend>& m) {
    lora_expansion e;
    e.rank = 4;
    e.lr = 3e-3;
    return block_optimizer<backend, adam_update_rule, random_reshuffle, lora_expansion>(
        m, part(m), adam, {}, e, bo);
  });
  std::ofstream csv(out / "optim_convergence.csv");
  csv << "step";
  for (const auto& r : res) csv << "," << r.name;
  csv << "\n";
  for (index_t s = 0; s < steps; ++s) {
    csv << s + 1;
    for (const auto& r : res) csv << "," << r.losses[static_cast<std::size_t>(s)];
    csv << "\n";
  }
  const std::size_t window = static_cast<std::size_t>(std::max<index_t>(1, steps / 20));
  const double adam_final = tail_mean(res[0].losses, window);
  std::printf("%-11s %12s %14s %10s %12s %9s\n", "method", "first loss", "final (mean)", "vs adam",
              "loss removed", "seconds");
  for (const auto& r : res) {
    const double fin = tail_mean(r.losses, window);
    std::printf("%-11s %12.4f %14.4f %10.3f %11.2f%% %9.1f\n", r.name.c_str(), r.losses.front(),
                fin, fin / adam_final, 100.0 * (1.0 - fin / r.losses.front()), r.seconds);
  }
  std::printf("final = mean over the last %zu steps; uniform guessing = ln(%lld) = %.4f\n", window,
              static_cast<long long>(task.vocab - 1),
              std::log(static_cast<double>(task.vocab - 1)));
}

}  // namespace

int main(int argc, char** argv) {
  std::string part = "all", preset = "qwen3-bench";
  index_t seq = 1024, steps = 600, k = 20;
  copy_task task;
  std::filesystem::path out = ".";
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string f = argv[i];
      auto value = [&]() -> std::string {
        check(i + 1 < argc, f, " needs a value");
        return argv[++i];
      };
      if (f == "--part")
        part = value();
      else if (f == "--preset")
        preset = value();
      else if (f == "--seq")
        seq = std::stoll(value());
      else if (f == "--steps")
        steps = std::stoll(value());
      else if (f == "--switch-every")
        k = std::stoll(value());
      else if (f == "--prefix")
        task.prefix = std::stoll(value());
      else if (f == "--out")
        out = value();
      else if (f == "--quick") {
        preset = "small";
        seq = 256;
        steps = 120;
        k = 5;
        task.prefix = 31;
      } else
        fail("unknown option '", f, "'");
    }
    check(part == "all" || part == "memory" || part == "convergence", "--part is '", part,
          "', expected memory, convergence or all");
    check(seq >= 2 && steps >= 1 && k >= 1, "--seq, --steps and --switch-every must be positive");
    std::filesystem::create_directories(out);
    if (part != "convergence") part_memory(preset, seq, out);
    if (part != "memory") part_convergence(task, steps, k, out);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_optim: %s\n", e.what());
    return 1;
  }
  return 0;
}
