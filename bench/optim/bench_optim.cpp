// bench_optim: the evidence for optim/ (BAdam and BREAD), in three parts.
//
//  memory       On the StreamBP benchmark config (hidden 512, 8 layers, 8/2 heads, hd 64,
//               inter 1536, vocab 32768, float): optimizer-state bytes and peak counted memory
//               of Adam, BAdam, BREAD-SGD and BREAD-LoRA, and the backward time (total minus
//               forward) averaged over one pass through the D blocks, relative to the full
//               backward (paper: about (D+1)/(2D) of the layers' backward work).
//  convergence  A small model (4 layers, hidden 64) on a synthetic long-context task (copy a
//               random prefix after a separator; only the copy is supervised): loss curves of
//               Adam, BAdam, BREAD-SGD, BREAD-LoRA for the same number of steps, from scratch
//               or fine-tuned from an Adam-pre-trained checkpoint (--pretrain-steps), on the
//               plain copy or a shifted task (--task map|reverse), optionally with label noise
//               of known entropy (--noise p: the loss floor is printed and excess reported).
//  sweep        The same runs over a grid (comma-separated values of the tuning options, the
//               cartesian product per method): one row per run, final and held-out loss.
//
//   bench_optim [--part memory|convergence|sweep|all] [--quick] [--out DIR] [--tag NAME]
//     memory:   [--preset qwen3-bench|small] [--seq 1024]
//     task:     [--task copy|map|reverse] [--noise P] [--prefix 31] [--steps 600]
//               [--pretrain-steps 0] [--pretrain-lr 3e-3] [--seeds 1]
//     methods:  [--methods adam,badam,bread-sgd,bread-lora] [--adam-lr 3e-3] [--block-lr 3e-3]
//               [--switch-every 5] [--order random|ascending|descending]
//               [--blocks separate|merged|frozen] [--block-warmup 0] [--warmup-frac 0.05]
//               [--min-factor 0.1] [--beta2 0.999] [--sgd-lr 3e-2] [--lora-rank 4]
//               [--lora-lr 3e-3]
// Writes DIR/optim_memory.csv, DIR/optim_convergence[_TAG].csv (loss curves, mean over seeds;
// plot with plot_convergence.py), DIR/optim_summary[_TAG].csv and DIR/optim_sweep[_TAG].csv.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "args.hpp"  // tools/tightfit: the tool's parser
#include "tightfit/backend/eigen.hpp"
#include "tightfit/loss/sft.hpp"
#include "tightfit/nn/decoder_layer.hpp"
#include "tightfit/optim/optim.hpp"
#include "tightfit/stream/backward.hpp"

#if defined(TIGHTFIT_HAS_TBB) && TIGHTFIT_HAS_TBB
#include <tbb/global_control.h>
#endif

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
  llama_model<backend> model(be, cfg);
  model.init_random(1);
  auto opt = make(model);
  std::mt19937_64 gen(42);
  std::uniform_int_distribution<token_id> tok(0, cfg.vocab_size - 1);
  std::vector<token_id> ids(static_cast<std::size_t>(seq));
  for (auto& x : ids) x = tok(gen);
  const auto targets = shift_labels(ids, 1, seq);
  const token_batch batch{1, seq, ids, targets, {}};
  backward_options o;
  o.sched = backward_schedule::stream;
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
  rows.push_back(measure("adam", cfg, seq, 2, [](llama_model<backend>& m) {
    return make_full_optimizer(m, adam_update_rule{});
  }));
  rows.push_back(measure("badam", cfg, seq, d, [&](llama_model<backend>& m) {
    return block_optimizer<llama_model<backend>, adam_update_rule, descending_order>(
        m, block_partition::by_layer(m.parameters()), {}, {}, {}, k1);
  }));
  rows.push_back(measure("bread-sgd", cfg, seq, d, [&](llama_model<backend>& m) {
    return block_optimizer<llama_model<backend>, adam_update_rule, descending_order, sgd_expansion>(
        m, block_partition::by_layer(m.parameters()), {}, {}, {}, k1);
  }));
  rows.push_back(measure("bread-lora", cfg, seq, d, [&](llama_model<backend>& m) {
    return block_optimizer<llama_model<backend>, adam_update_rule, descending_order,
                           lora_expansion>(m, block_partition::by_layer(m.parameters()), {}, {}, {},
                                           k1);
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

// ---- part (b): convergence on copy tasks ---------------------------------------------------

/// The synthetic long-context task: each row is a random prefix of P tokens in [1, vocab), a
/// separator 0, an answer of P tokens, one more 0 (T = 2P + 2); only the answer is supervised,
/// so it can be predicted only by attending P + 1 positions back.
///  copy:    answer[i] = prefix[i];
///  map:     answer[i] = pi(prefix[i]) for a fixed seeded permutation pi of [1, vocab);
///  reverse: answer[i] = prefix[P - 1 - i].
/// With noise p, each supervised label (not the input) is replaced with probability p by a
/// uniform token of [1, vocab): the best possible loss is then the entropy floor() > 0.
struct copy_task {
  std::string kind = "copy";
  index_t vocab = 32, prefix = 31, batch = 8;
  double noise = 0;
  std::vector<token_id> mapping;  // (vocab) map: the permutation, 0 -> 0

  index_t seq_len() const { return 2 * prefix + 2; }

  void validate() {
    check(kind == "copy" || kind == "map" || kind == "reverse", "--task is '", kind,
          "', expected copy, map or reverse");
    check(noise >= 0 && noise < 1, "--noise is ", noise, ", expected in [0, 1)");
    check(prefix >= 1, "--prefix is ", prefix, ", expected >= 1");
    mapping.resize(static_cast<std::size_t>(vocab));
    for (index_t v = 0; v < vocab; ++v) mapping[static_cast<std::size_t>(v)] = v;
    std::mt19937_64 g(0x5eed);
    for (index_t k = vocab - 1; k > 1; --k) {  // Fisher-Yates over [1, vocab)
      const auto j = 1 + static_cast<index_t>(g() % static_cast<std::uint64_t>(k));
      std::swap(mapping[static_cast<std::size_t>(k)], mapping[static_cast<std::size_t>(j)]);
    }
  }

  token_id answer(const token_id* row, index_t i) const {
    if (kind == "map") return mapping[static_cast<std::size_t>(row[i])];
    if (kind == "reverse") return row[prefix - 1 - i];
    return row[i];
  }

  /// B rows and their shifted targets, drawn from `gen`.
  void make(std::mt19937_64& gen, std::vector<token_id>& ids,
            std::vector<token_id>& targets) const {
    const index_t t = seq_len();
    std::uniform_int_distribution<token_id> tok(1, vocab - 1);
    std::uniform_real_distribution<double> coin(0.0, 1.0);
    ids.assign(static_cast<std::size_t>(batch * t), 0);
    std::vector<token_id> labels(ids.size(), ignore_index);  // (B*T)
    for (index_t b = 0; b < batch; ++b) {
      auto* row = ids.data() + b * t;
      auto* lab = labels.data() + b * t;
      for (index_t i = 0; i < prefix; ++i) row[i] = tok(gen);
      row[prefix] = 0;  // separator
      for (index_t i = 0; i < prefix; ++i) {
        row[prefix + 1 + i] = answer(row, i);
        lab[prefix + 1 + i] = row[prefix + 1 + i];  // supervised (predicted from position - 1)
        if (noise > 0 && coin(gen) < noise) lab[prefix + 1 + i] = tok(gen);
      }
      row[t - 1] = 0;
    }
    targets = shift_labels(labels, batch, t);
  }

  /// Lowest expected loss per supervised token (nats): with n = vocab - 1 answer tokens the
  /// label is right with q = 1 - p + p/n and each other token has p/n; the floor is the entropy
  /// -(q ln q + (n - 1)(p/n) ln(p/n)).
  double floor() const {
    if (noise == 0) return 0;
    const auto n = static_cast<double>(vocab - 1);
    const double q = 1 - noise + noise / n, o = noise / n;
    return -(q * std::log(q) + (n - 1) * o * std::log(o));
  }

  std::string describe() const {
    std::ostringstream s;
    s << kind << " P=" << prefix << " T=" << seq_len() << " vocab=" << vocab << " batch=" << batch;
    if (noise > 0) s << " noise=" << noise << " (floor " << floor() << ")";
    return s.str();
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

/// One training run's method and hyper-parameters.
struct run_config {
  std::string method = "adam";  // adam | badam | bread-sgd | bread-lora
  double adam_lr = 3e-3;        // full Adam
  double block_lr = 3e-3;       // the active block's Adam (BAdam, BREAD)
  index_t k = 5;                // switch every K steps
  std::string order = "random";
  std::string blocks = "separate";  // separate | merged | frozen (embedding and head)
  index_t block_warmup = 0;         // linear lr warmup over the first W steps of each block
  double warmup_frac = 0.05;        // global cosine schedule: warmup fraction of the steps
  double min_factor = 0.1;          // ... and final factor
  double beta2 = 0.999;
  double sgd_lr = 3e-2;  // BREAD-SGD on the deeper inactive layers
  index_t lora_rank = 4;
  double lora_lr = 3e-3;

  bool is_block() const { return method != "adam"; }
  double lr() const { return is_block() ? block_lr : adam_lr; }

  void validate() const {
    check(method == "adam" || method == "badam" || method == "bread-sgd" || method == "bread-lora",
          "unknown method '", method, "', expected adam, badam, bread-sgd or bread-lora");
    check(blocks == "separate" || blocks == "merged" || blocks == "frozen", "--blocks is '", blocks,
          "', expected separate, merged or frozen");
    (void)runtime_order::parse(order);
    check(k >= 1 && block_warmup >= 0 && lora_rank >= 1, "bad K, block warmup or LoRA rank");
    check(warmup_frac >= 0 && warmup_frac < 1, "--warmup-frac is ", warmup_frac,
          ", expected in [0, 1)");
  }

  /// The hyper-parameters that matter for this method, as "key=value ...".
  std::string describe() const {
    std::ostringstream s;
    s << "lr=" << lr() << " warmup=" << warmup_frac << " min=" << min_factor;
    if (beta2 != 0.999) s << " beta2=" << beta2;
    if (is_block())
      s << " K=" << k << " order=" << order << " blocks=" << blocks << " bwarm=" << block_warmup;
    if (method == "bread-sgd") s << " sgd_lr=" << sgd_lr;
    if (method == "bread-lora") s << " rank=" << lora_rank << " lora_lr=" << lora_lr;
    return s.str();
  }
};

/// The model's weights on the host, one vector per parameter (a pre-trained checkpoint).
using weights = std::vector<std::vector<float>>;

weights snapshot(llama_model<backend>& model) {
  auto& p = model.parameters();
  weights w(p.size());
  for (std::size_t i = 0; i < p.size(); ++i) {
    w[i].resize(static_cast<std::size_t>(p.numel(i)));
    p.backend().download(std::span<const float>(p.value(i)), std::span<float>(w[i]));
  }
  return w;
}

void restore(llama_model<backend>& model, const weights& w) {
  auto& p = model.parameters();
  check(w.size() == p.size(), "restore: ", w.size(), " saved parameters, the model has ", p.size());
  for (std::size_t i = 0; i < p.size(); ++i)
    p.backend().upload(std::span<const float>(w[i]), p.value(i));
}

/// Held-out batches (a fixed seed, the same for every run) and the forward-only loss on them.
/// With label noise p the loss is the EXACT expectation over the noise, not a noisy sample:
/// (1 - p) CE(clean answer) + p * mean over the n answer tokens y of CE(y), so that the loss
/// minus the floor is the model's excess (a KL divergence, >= 0) without sampling noise.
struct eval_set {
  std::vector<std::vector<token_id>> ids, targets;  // clean targets
  index_t batch = 0, seq = 0, vocab = 0;
  double noise = 0;

  eval_set(const copy_task& task, index_t batches)
      : batch(task.batch), seq(task.seq_len()), vocab(task.vocab), noise(task.noise) {
    copy_task clean = task;
    clean.noise = 0;
    std::mt19937_64 gen(0xE7A1);
    ids.resize(static_cast<std::size_t>(batches));
    targets.resize(ids.size());
    for (std::size_t b = 0; b < ids.size(); ++b) clean.make(gen, ids[b], targets[b]);
  }

  double loss(llama_model<backend>& model) const {
    backward_options o;
    o.sched = backward_schedule::stream;
    o.chunk = seq;
    o.layer_weight_grads.assign(static_cast<std::size_t>(model.config().num_hidden_layers), false);
    o.embedding_grad = false;
    o.head_grad = false;
    auto ce = [&](std::size_t b, const std::vector<token_id>& t) {
      sft_loss l;
      return compute_gradients(model, {batch, seq, ids[b], t, {}}, l, o).loss;
    };
    double sum = 0;
    std::vector<token_id> all_y;  // (B*T) every supervised target set to y
    for (std::size_t b = 0; b < ids.size(); ++b) {
      double l = ce(b, targets[b]);
      if (noise > 0) {
        double uniform = 0;
        for (index_t y = 1; y < vocab; ++y) {
          all_y = targets[b];
          for (auto& x : all_y)
            if (x != ignore_index) x = static_cast<token_id>(y);
          uniform += ce(b, all_y) / static_cast<double>(vocab - 1);
        }
        l = (1 - noise) * l + noise * uniform;
      }
      sum += l;
    }
    return sum / static_cast<double>(ids.size());
  }
};

struct run_result {
  std::vector<double> losses;  // training loss of every step
  double eval = 0;             // held-out loss at the end
  double seconds = 0;
};

template <class Opt>
run_result train_loop(llama_model<backend>& model, Opt& opt, const run_config& rc,
                      const copy_task& task, index_t steps, std::uint64_t data_seed,
                      const eval_set& ev) {
  std::mt19937_64 gen(data_seed);  // the same batches for every method
  std::vector<token_id> ids, targets;
  backward_options o;
  o.sched = backward_schedule::stream;
  o.chunk = task.seq_len();
  const cosine_schedule sched{
      static_cast<std::int64_t>(rc.warmup_frac * static_cast<double>(steps)), steps, rc.min_factor};
  run_result r;
  const auto t0 = std::chrono::steady_clock::now();
  for (index_t s = 0; s < steps; ++s) {
    task.make(gen, ids, targets);
    double f = sched(s);
    if (rc.block_warmup > 0) {  // steps the next update is into its block (0: a fresh block)
      const std::int64_t in_block =
          (opt.steps() == 0 || opt.steps_in_block() >= rc.k) ? 0 : opt.steps_in_block();
      f *= std::min(1.0, static_cast<double>(in_block + 1) / static_cast<double>(rc.block_warmup));
    }
    sft_loss loss;
    opt.set_lr_factor(f);
    r.losses.push_back(opt.step({task.batch, task.seq_len(), ids, targets, {}}, loss, o).loss);
    if (s % 20 == 19)
      std::fprintf(stderr, "\r  %-10s step %lld/%lld loss %.4f   ", rc.method.c_str(),
                   static_cast<long long>(s + 1), static_cast<long long>(steps), r.losses.back());
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.eval = ev.loss(model);
  std::fprintf(stderr, "\r%60s\r", "");
  return r;
}

block_partition make_partition(llama_model<backend>& m, const std::string& blocks) {
  if (blocks == "separate") return block_partition::by_layer(m.parameters(), true, true);
  if (blocks == "frozen") return block_partition::by_layer(m.parameters(), false, false);
  // merged: the embedding joins the first layer's block, the final norm and head the last's.
  const index_t nl = m.config().num_hidden_layers;
  std::vector<block_spec> specs;
  for (index_t l = 0; l < nl; ++l) {
    block_spec b{"layer." + std::to_string(l), {"layers." + std::to_string(l)}};
    if (l == 0) b.patterns.push_back("embed_tokens");
    if (l == nl - 1) {
      b.patterns.push_back("norm");
      b.patterns.push_back("lm_head");
    }
    specs.push_back(std::move(b));
  }
  return block_partition::by_prefixes(m.parameters(), specs);
}

/// Trains a fresh model (seeded init, or the checkpoint `init`) with one method.
run_result run_one(const run_config& rc, const copy_task& task, index_t steps, std::uint64_t seed,
                   const weights* init, const eval_set& ev) {
  backend be;
  llama_model<backend> model(be, copy_config(task));
  model.init_random(3 + seed, 0.05);
  if (init) restore(model, *init);
  const std::uint64_t data_seed = 7 + seed;
  adam_update_rule adam;
  adam.beta2 = rc.beta2;
  if (!rc.is_block()) {
    adam.lr = rc.adam_lr;
    auto opt = make_full_optimizer(model, adam);
    return train_loop(model, opt, rc, task, steps, data_seed, ev);
  }
  adam.lr = rc.block_lr;
  block_options bo;
  bo.switch_every = rc.k;
  bo.seed = 1234 + seed;
  runtime_order order;
  order.what = runtime_order::parse(rc.order);
  if (rc.method == "badam") {
    block_optimizer<llama_model<backend>, adam_update_rule, runtime_order> opt(
        model, make_partition(model, rc.blocks), adam, order, {}, bo);
    return train_loop(model, opt, rc, task, steps, data_seed, ev);
  }
  if (rc.method == "bread-sgd") {
    sgd_expansion e;
    e.lr = rc.sgd_lr;
    block_optimizer<llama_model<backend>, adam_update_rule, runtime_order, sgd_expansion> opt(
        model, make_partition(model, rc.blocks), adam, order, e, bo);
    return train_loop(model, opt, rc, task, steps, data_seed, ev);
  }
  lora_expansion e;
  e.rank = rc.lora_rank;
  e.lr = rc.lora_lr;
  block_optimizer<llama_model<backend>, adam_update_rule, runtime_order, lora_expansion> opt(
      model, make_partition(model, rc.blocks), adam, order, e, bo);
  return train_loop(model, opt, rc, task, steps, data_seed, ev);
}

double tail_mean(const std::vector<double>& v, std::size_t n) {
  n = std::min(n, v.size());
  double s = 0;
  for (std::size_t i = v.size() - n; i < v.size(); ++i) s += v[i];
  return s / static_cast<double>(n);
}

/// Everything a convergence or sweep run shares: the task, steps, seeds, the checkpoint.
struct experiment {
  copy_task task;
  index_t steps = 600;
  index_t seeds = 1;
  index_t pretrain_steps = 0;
  double pretrain_lr = 3e-3;
  std::filesystem::path out;
  std::string tag;
  weights init;  // the pre-trained checkpoint (empty: from scratch)

  std::string file(const std::string& stem) const {
    return (out / (stem + (tag.empty() ? "" : "_" + tag) + ".csv")).string();
  }
  std::size_t window() const { return static_cast<std::size_t>(std::max<index_t>(1, steps / 20)); }

  /// Pre-trains with Adam on the plain copy task (no noise) when asked; prints its losses.
  void pretrain() {
    if (pretrain_steps <= 0) return;
    copy_task pt = task;
    pt.kind = "copy";
    pt.noise = 0;
    run_config rc;
    rc.adam_lr = pretrain_lr;
    backend be;
    llama_model<backend> model(be, copy_config(pt));
    model.init_random(3, 0.05);
    adam_update_rule adam;
    adam.lr = pretrain_lr;
    auto opt = make_full_optimizer(model, adam);
    const eval_set pev(pt, 8), fev(task, 8);
    const auto r = train_loop(model, opt, rc, pt, pretrain_steps, 99, pev);
    init = snapshot(model);
    std::printf(
        "pre-trained with Adam (lr %g) on the plain copy for %lld steps: copy loss %.4f, loss on "
        "the fine-tuning task before fine-tuning %.4f\n",
        pretrain_lr, static_cast<long long>(pretrain_steps), r.eval, fev.loss(model));
  }

  /// Runs one configuration for every seed: the mean curve, final and held-out losses.
  struct outcome {
    std::vector<double> curve;  // mean over seeds
    std::vector<double> finals, evals;
    double seconds = 0;
  };
  outcome run(const run_config& rc, const eval_set& ev) const {
    outcome o;
    o.curve.assign(static_cast<std::size_t>(steps), 0.0);
    for (index_t s = 0; s < seeds; ++s) {
      const auto r = run_one(rc, task, steps, static_cast<std::uint64_t>(s),
                             init.empty() ? nullptr : &init, ev);
      for (std::size_t i = 0; i < o.curve.size(); ++i)
        o.curve[i] += r.losses[i] / static_cast<double>(seeds);
      o.finals.push_back(tail_mean(r.losses, window()));
      o.evals.push_back(r.eval);
      o.seconds += r.seconds / static_cast<double>(seeds);
    }
    return o;
  }
};

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}

void header(const experiment& ex, const char* what) {
  std::printf(
      "\n== %s: %s, 4 layers hidden 64, %lld steps, %s, %lld seed(s); final = mean of "
      "the last %zu training losses, held-out = 16 fixed batches after the last step (with noise: "
      "its exact expectation)\n",
      what, ex.task.describe().c_str(), static_cast<long long>(ex.steps),
      ex.pretrain_steps > 0 ? "fine-tuned from an Adam checkpoint" : "from scratch",
      static_cast<long long>(ex.seeds), ex.window());
}

void part_convergence(experiment& ex, const std::vector<run_config>& methods) {
  header(ex, "convergence");
  ex.pretrain();
  const eval_set ev(ex.task, 16);
  const double fl = ex.task.floor();
  std::vector<experiment::outcome> res;
  for (const auto& rc : methods) {
    std::printf("  %-10s %s\n", rc.method.c_str(), rc.describe().c_str());
    std::fflush(stdout);
    res.push_back(ex.run(rc, ev));
  }
  std::ofstream csv(ex.file("optim_convergence"));
  csv << "step";
  for (const auto& rc : methods) csv << "," << rc.method;
  csv << "\n";
  for (index_t s = 0; s < ex.steps; ++s) {
    csv << s + 1;
    for (const auto& r : res) csv << "," << r.curve[static_cast<std::size_t>(s)];
    csv << "\n";
  }
  std::ofstream sum(ex.file("optim_summary"));
  sum << "method,config,floor,first,final,final_min,final_max,eval,eval_min,eval_max,"
         "final_vs_adam,eval_excess_vs_adam,seconds\n";
  const double a_fin = mean(res[0].finals), a_ev = mean(res[0].evals);
  std::printf("%-11s %9s %9s %9s %9s %12s %13s %8s\n", "method", "first", "final", "held-out",
              "excess", "final/adam", "excess/adam", "seconds");
  for (std::size_t m = 0; m < res.size(); ++m) {
    const auto& r = res[m];
    const double fin = mean(r.finals), evm = mean(r.evals);
    std::printf("%-11s %9.4f %9.3g %9.3g %9.3g %12.3f %13.3f %8.1f\n", methods[m].method.c_str(),
                r.curve.front(), fin, evm, evm - fl, fin / a_fin, (evm - fl) / (a_ev - fl),
                r.seconds);
    sum << methods[m].method << ",\"" << methods[m].describe() << "\"," << fl << ","
        << r.curve.front() << "," << fin << ","
        << *std::min_element(r.finals.begin(), r.finals.end()) << ","
        << *std::max_element(r.finals.begin(), r.finals.end()) << "," << evm << ","
        << *std::min_element(r.evals.begin(), r.evals.end()) << ","
        << *std::max_element(r.evals.begin(), r.evals.end()) << "," << fin / a_fin << ","
        << (evm - fl) / (a_ev - fl) << "," << r.seconds << "\n";
  }
  std::printf("loss floor of the task %.4f (0: none); uniform guessing ln(%lld) = %.4f\n", fl,
              static_cast<long long>(ex.task.vocab - 1),
              std::log(static_cast<double>(ex.task.vocab - 1)));
}

void part_sweep(experiment& ex, const std::vector<run_config>& grid) {
  header(ex, "sweep");
  ex.pretrain();
  const eval_set ev(ex.task, 16);
  const double fl = ex.task.floor();
  std::ofstream csv(ex.file("optim_sweep"));
  csv << "method,lr,warmup_frac,min_factor,beta2,k,order,blocks,block_warmup,sgd_lr,lora_rank,"
         "lora_lr,floor,final,eval,eval_excess,seconds\n";
  std::printf("%-11s %-62s %9s %9s %9s %7s\n", "method", "config", "final", "held-out", "excess",
              "seconds");
  for (const auto& rc : grid) {
    const auto r = ex.run(rc, ev);
    const double fin = mean(r.finals), evm = mean(r.evals);
    std::printf("%-11s %-62s %9.3g %9.3g %9.3g %7.1f\n", rc.method.c_str(), rc.describe().c_str(),
                fin, evm, evm - fl, r.seconds);
    std::fflush(stdout);
    csv << rc.method << "," << rc.lr() << "," << rc.warmup_frac << "," << rc.min_factor << ","
        << rc.beta2 << "," << rc.k << "," << rc.order << "," << rc.blocks << "," << rc.block_warmup
        << "," << rc.sgd_lr << "," << rc.lora_rank << "," << rc.lora_lr << "," << fl << "," << fin
        << "," << evm << "," << evm - fl << "," << r.seconds << "\n";
    csv.flush();
  }
}

// ---- options -------------------------------------------------------------------------------

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == ',') {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

/// The tuning options: each may hold a comma-separated list (sweep: the cartesian product of
/// those that matter to each method; convergence: the first value).
struct tuning {
  struct axis {
    const char* key;
    bool block_only;   // matters to the block methods only
    const char* only;  // matters to this method only (nullptr: to all in its class)
    void (*set)(run_config&, const std::string&);
  };
  static const std::vector<axis>& axes() {
    static const std::vector<axis> a{
        {"--adam-lr", false, "adam",
         [](run_config& r, const std::string& v) {
           r.adam_lr = cli::parse_number("--adam-lr", v);
         }},
        {"--block-lr", true, nullptr,
         [](run_config& r, const std::string& v) {
           r.block_lr = cli::parse_number("--block-lr", v);
         }},
        {"--warmup-frac", false, nullptr,
         [](run_config& r, const std::string& v) {
           r.warmup_frac = cli::parse_number("--warmup-frac", v);
         }},
        {"--min-factor", false, nullptr,
         [](run_config& r, const std::string& v) {
           r.min_factor = cli::parse_number("--min-factor", v);
         }},
        {"--beta2", false, nullptr,
         [](run_config& r, const std::string& v) { r.beta2 = cli::parse_number("--beta2", v); }},
        {"--switch-every", true, nullptr,
         [](run_config& r, const std::string& v) {
           r.k = static_cast<index_t>(cli::parse_number("--switch-every", v));
         }},
        {"--order", true, nullptr, [](run_config& r, const std::string& v) { r.order = v; }},
        {"--blocks", true, nullptr, [](run_config& r, const std::string& v) { r.blocks = v; }},
        {"--block-warmup", true, nullptr,
         [](run_config& r, const std::string& v) {
           r.block_warmup = static_cast<index_t>(cli::parse_number("--block-warmup", v));
         }},
        {"--sgd-lr", true, "bread-sgd",
         [](run_config& r, const std::string& v) { r.sgd_lr = cli::parse_number("--sgd-lr", v); }},
        {"--lora-rank", true, "bread-lora",
         [](run_config& r, const std::string& v) {
           r.lora_rank = static_cast<index_t>(cli::parse_number("--lora-rank", v));
         }},
        {"--lora-lr", true, "bread-lora",
         [](run_config& r, const std::string& v) {
           r.lora_lr = cli::parse_number("--lora-lr", v);
         }},
    };
    return a;
  }

  /// Every configuration of `method` (cartesian product over its axes given as lists).
  static std::vector<run_config> grid(const cli::arguments& args, const std::string& method,
                                      bool first_only) {
    run_config base;
    base.method = method;
    std::vector<run_config> out{base};
    for (const auto& ax : axes()) {
      if (!args.has(ax.key)) continue;
      const bool block = method != "adam";
      if (ax.block_only && !block) continue;
      if (ax.only && method != ax.only) continue;
      auto values = split(args.get(ax.key));
      if (first_only) values.resize(1);
      std::vector<run_config> next;
      for (const auto& r : out)
        for (const auto& v : values) {
          run_config c = r;
          ax.set(c, v);
          next.push_back(c);
        }
      out = std::move(next);
    }
    for (const auto& r : out) r.validate();
    return out;
  }
};

const char* usage =
    "usage: bench_optim [--part memory|convergence|sweep|all] [--quick] [--out DIR] [--tag NAME]\n"
    "                   [--threads N]\n"
    "  memory:  [--preset qwen3-bench|small] [--seq 1024]\n"
    "  task:    [--task copy|map|reverse] [--noise P] [--prefix 31] [--steps 600] [--seeds 1]\n"
    "           [--pretrain-steps 0] [--pretrain-lr 3e-3]\n"
    "  methods: [--methods adam,badam,bread-sgd,bread-lora] [--adam-lr 3e-3] [--block-lr 3e-3]\n"
    "           [--switch-every 5] [--order random|ascending|descending]\n"
    "           [--blocks separate|merged|frozen] [--block-warmup 0] [--warmup-frac 0.05]\n"
    "           [--min-factor 0.1] [--beta2 0.999] [--sgd-lr 3e-2] [--lora-rank 4] [--lora-lr "
    "3e-3]\n"
    "  sweep: the tuning options take comma-separated lists; each method runs the cartesian\n"
    "  product of those that matter to it (convergence uses the first value of each).\n";

int run_main(int argc, char** argv) {
  static const cli::command_spec spec = [] {
    cli::command_spec c;
    c.program = "bench_optim";
    for (const char* name : {"--part",         "--preset",         "--seq",
                             "--steps",        "--prefix",         "--out",
                             "--tag",          "--task",           "--noise",
                             "--seeds",        "--pretrain-steps", "--pretrain-lr",
                             "--methods",      "--adam-lr",        "--block-lr",
                             "--switch-every", "--order",          "--blocks",
                             "--block-warmup", "--warmup-frac",    "--min-factor",
                             "--beta2",        "--sgd-lr",         "--lora-rank",
                             "--lora-lr",      "--threads"})
      c.options.push_back({name, "X"});
    c.options.push_back({"--quick"});
    return c;
  }();
  const cli::arguments args(spec, argc, argv);
  if (args.help()) {
    std::fputs(usage, stdout);
    return 0;
  }
  const bool quick = args.has("--quick");
#if defined(TIGHTFIT_HAS_TBB) && TIGHTFIT_HAS_TBB
  // --threads N: at most N worker threads (0: oneTBB's default); the results do not change.
  const auto threads = static_cast<std::size_t>(std::max(0LL, args.integer("--threads", 0)));
  std::optional<tbb::global_control> limit;
  if (threads > 0) limit.emplace(tbb::global_control::max_allowed_parallelism, threads);
#endif
  const std::string part = args.get("--part", "all");
  const std::string preset = args.get("--preset", quick ? "small" : "qwen3-bench");
  const auto seq = static_cast<index_t>(args.integer("--seq", quick ? 256 : 1024));
  experiment ex;
  ex.steps = static_cast<index_t>(args.integer("--steps", quick ? 120 : 600));
  ex.seeds = static_cast<index_t>(args.integer("--seeds", 1));
  ex.pretrain_steps = static_cast<index_t>(args.integer("--pretrain-steps", 0));
  ex.pretrain_lr = args.number("--pretrain-lr", 3e-3);
  ex.task.kind = args.get("--task", "copy");
  ex.task.noise = args.number("--noise", 0);
  ex.task.prefix = static_cast<index_t>(args.integer("--prefix", 31));
  ex.out = args.get("--out", ".");
  ex.tag = args.get("--tag");
  check(part == "all" || part == "memory" || part == "convergence" || part == "sweep",
        "--part is '", part, "', expected memory, convergence, sweep or all");
  check(seq >= 2 && ex.steps >= 1 && ex.seeds >= 1 && ex.pretrain_steps >= 0,
        "--seq, --steps, --seeds must be positive (--pretrain-steps >= 0)");
  ex.task.validate();
  std::vector<run_config> configs;
  for (const auto& m : split(args.get("--methods", "adam,badam,bread-sgd,bread-lora"))) {
    auto g = tuning::grid(args, m, part != "sweep");
    configs.insert(configs.end(), g.begin(), g.end());
  }
  check(part == "sweep" || configs.front().method == "adam",
        "--methods must start with adam (the reference of the ratios)");
  std::filesystem::create_directories(ex.out);
  if (part == "memory" || part == "all") part_memory(preset, seq, ex.out);
  if (part == "convergence" || part == "all") part_convergence(ex, configs);
  if (part == "sweep") part_sweep(ex, configs);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run_main(argc, argv);
  } catch (const cli::usage_error& e) {
    std::fprintf(stderr, "bench_optim: %s\n%s", e.message.c_str(), usage);
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_optim: %s\n", e.what());
    return 1;
  }
}
