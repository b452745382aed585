// tightfit train: SFT training of a decoder model with a full or block coordinate optimizer
// (Adam, AdamW, SGD, BAdam, BREAD-SGD, BREAD-LoRA) on a tokenized safetensors data set.
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "args.hpp"
#include "checks.hpp"
#include "commands.hpp"
#include "tightfit/backend/eigen.hpp"
#include "tightfit/io/token_file.hpp"
#include "tightfit/loss/sft.hpp"
#include "tightfit/nn/hf_model.hpp"
#include "tightfit/nn/presets.hpp"
#include "tightfit/optim/callbacks.hpp"
#include "tightfit/optim/checkpoint.hpp"
#include "tightfit/optim/optim.hpp"
#include "tightfit/optim/train.hpp"

namespace tightfit::cli {

namespace {

void train_usage(std::FILE* out) {
  std::fprintf(
      out,
      "usage: tightfit train (--model DIR | --preset NAME) --data FILE\n"
      "         --optimizer adam|adamw|sgd|badam|bread-sgd|bread-lora [options]\n"
      "  --preset NAME        tiny, or a preset of nn/presets.hpp (qwen3-bench, small, ...)\n"
      "  --data FILE          safetensors with input_ids (N, T) and optional labels (N, T)\n"
      "  --steps N            optimizer steps (default 100)\n"
      "  --batch B            rows per step (default 1)\n"
      "  --lr X               learning rate of the update rule (default 1e-3; sgd 1e-2)\n"
      "  --schedule S         constant | warmup:W | cosine | cosine:W (default constant)\n"
      "  --total-steps N      the schedule's horizon (default: steps already done + --steps;\n"
      "                       give the whole run's length when it is split with --resume)\n"
      "  --clip X             clip gradients to global norm X (default off)\n"
      "  --chunk N            StreamBP chunk (default 512); --sched full|checkpoint|stream\n"
      "  --switch-every K     steps per block (default 50)\n"
      "  --order O            ascending|descending|random|fixed (default random)\n"
      "  --start-block NAME   first block, e.g. layer.3 (required by fixed)\n"
      "  --embedding-block, --head-block   train embedding / head as blocks too\n"
      "  --bread-lr X         BREAD-SGD step (default 1e-5) / BREAD-LoRA adapter lr (1e-4)\n"
      "  --bread-scope S      partial|all (default partial); --sign (signSGD)\n"
      "  --rank R             BREAD-LoRA rank (default 8); --loraplus R (lr ratio, default 1)\n"
      "  --seed S             model initialisation (presets) and block order seed (default 1)\n"
      "  --log FILE           JSON lines, one per step\n"
      "  --save-state FILE    checkpoint (weights + optimizer state) at the end\n"
      "  --resume FILE        continue from a checkpoint\n"
      "  --deterministic      same bits on every run (the two-pass attention backward, 1.4x its\n"
      "                       matmul work): a resumed run then matches the uninterrupted one\n"
      "  --save-model DIR     write the trained weights (model.safetensors + config.json)\n"
      "  --quiet              no progress line\n");
}

/// "tiny" (a 4-layer, hidden-64 model for quick runs) or a preset of nn/presets.hpp.
model_config train_preset(const std::string& name) {
  if (name != "tiny") return preset_config(name);
  model_config c;
  c.vocab_size = 256;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.rope_theta = 10000;
  return c;
}

struct args {
  std::string model, preset, data, optimizer, schedule = "constant", order = "random", start_block,
                                              log, save_state, resume, save_model, sched = "stream",
                                              scope = "partial";
  std::int64_t steps = 100, total_steps = 0;  // 0: steps done + steps
  index_t batch = 1, chunk = 512, switch_every = 50, rank = 8;
  std::optional<double> lr, bread_lr;
  double clip = 0, loraplus = 1;
  std::uint64_t seed = 1;
  bool embedding_block = false, head_block = false, sign = false, quiet = false;
  bool deterministic = false;
};

/// Counts (steps, batch, chunk, ...) are at most 2^62; sizes that need memory are checked
/// against it once the model is known.
constexpr long long big = 1LL << 62;
/// Learning rates above this are refused as absurd (they diverge at the first step).
constexpr double max_lr = 1e3;

/// Argument checks that need no file: every wrong value is a usage error (exit 2), reported
/// before the model and the data are loaded.
void validate(const args& a) {
  if (a.model.empty() == a.preset.empty() || a.data.empty() || a.optimizer.empty())
    throw usage_error{"give one of --model / --preset, and --data and --optimizer"};
  static const std::set<std::string> optimizers{"adam",  "adamw",     "sgd",
                                                "badam", "bread-sgd", "bread-lora"};
  if (!optimizers.contains(a.optimizer))
    throw usage_error{"unknown optimizer '" + a.optimizer +
                      "', expected adam, adamw, sgd, badam, bread-sgd or bread-lora"};
  if (a.scope != "partial" && a.scope != "all")
    throw usage_error{"--bread-scope is '" + a.scope + "', expected partial or all"};
  check(a.clip >= 0, "--clip is ", a.clip, ", expected >= 0 (0: off)");
  // These throw tightfit::error naming the value.
  (void)parse_backward_schedule(a.sched);
  (void)runtime_schedule::parse(a.schedule, 1);
  const auto order = runtime_order::parse(a.order);
  if (order == runtime_order::kind::fixed && a.start_block.empty())
    throw usage_error{"--order fixed needs --start-block NAME"};
}

/// The outputs: never an input, writable (usage errors, exit 2).
void check_paths(const args& a) {
  path_guard paths;
  if (!a.model.empty()) paths.input(a.model);
  paths.input(a.data);
  if (!a.resume.empty()) paths.input(a.resume);
  if (!a.log.empty()) paths.output_file("--log", a.log);
  if (!a.save_state.empty()) paths.output_file("--save-state", a.save_state);
  if (!a.save_model.empty())
    paths.output_dir("--save-model", a.save_model, {"model.safetensors", "config.json"});
}

template <class Opt>
int run_training(decoder_model<eigen_backend<float>>& model, const token_dataset& data, Opt& opt,
                 const args& a) {
  if (!a.resume.empty()) {
    try {
      load_checkpoint(safetensors_file::open(a.resume), model, opt);
    } catch (const error& e) {
      const std::string what = e.what();
      if (what.rfind(a.resume, 0) == 0) throw;
      fail(a.resume, ": ", what);
    }
    check_finite_weights(model.parameters(), a.resume);
  }
  train_options o;
  o.steps = a.steps;
  o.batch = a.batch;
  o.backward.sched = parse_backward_schedule(a.sched);
  o.backward.chunk = a.chunk;
  // Non-finite policy: train() stops at a non-finite loss; a non-finite gradient or update stops
  // here, naming the step and the tensor, before anything is logged further or saved.
  auto finite = [&model](std::int64_t step, const step_result&) {
    const std::string when = "step " + std::to_string(step + 1);
    check_finite_gradients(model.parameters(), when);
    check_finite_weights(model.parameters(), when + " (after the update)");
  };
  std::optional<json_log> log;
  if (!a.log.empty()) log.emplace(a.log);
  struct log_if_open {  // the JSON log when --log is given
    std::optional<json_log>& log;
    void on_step(const train_step& s) {
      if (log) log->on_step(s);
    }
  };
  struct progress_if_shown {  // the progress line unless --quiet
    bool shown;
    void on_step(const train_step& s) const {
      if (shown) progress_line{}.on_step(s);
    }
    void on_end(const train_summary& sum) const {
      if (shown) progress_line{}.on_end(sum);
    }
  };
  const std::int64_t horizon = opt.steps() + a.steps;  // opt.steps(): done before (resume)
  check(a.total_steps == 0 || a.total_steps >= horizon, "--total-steps is ", a.total_steps,
        ", but this run ends at step ", horizon);
  const auto sched =
      runtime_schedule::parse(a.schedule, a.total_steps > 0 ? a.total_steps : horizon);
  const auto s = train(model, data, opt, sched, o, sft_loss{}, log_if_open{log},
                       progress_if_shown{!a.quiet}, finite);
  if (!a.save_state.empty()) {
    safetensors_writer w;
    save_checkpoint(w, model, opt);
    w.write(a.save_state);
  }
  const double first = s.losses.empty() ? 0 : s.losses.front();
  const double last = s.losses.empty() ? 0 : s.losses.back();
  std::printf(
      "optimizer %s  steps %lld  loss %.4f -> %.4f  %.0f tok/s  peak %.1f MiB  state %.1f MiB\n",
      a.optimizer.c_str(), static_cast<long long>(a.steps), first, last, s.tokens_per_second,
      static_cast<double>(s.peak_bytes) / 1048576.0,
      static_cast<double>(s.state_bytes) / 1048576.0);
  if (!a.save_model.empty()) {
    std::filesystem::create_directories(a.save_model);
    save_hf_weights(a.save_model, model.parameters());
    save_hf_config(model.config(), a.save_model);
  }
  return 0;
}

int run(const args& a);

}  // namespace

int train(int argc, char** argv) {
  args a;
  try {  // a missing or malformed option value is a usage error (exit 2)
    for (int i = 1; i < argc; ++i) {
      const std::string f = argv[i];
      auto value = [&]() -> std::string {
        if (i + 1 >= argc) throw usage_error{f + " needs a value"};
        return argv[++i];
      };
      if (f == "--help" || f == "-h") {
        train_usage(stdout);
        return 0;
      } else if (f == "--model") {
        a.model = value();
      } else if (f == "--preset") {
        a.preset = value();
      } else if (f == "--data") {
        a.data = value();
      } else if (f == "--optimizer") {
        a.optimizer = value();
      } else if (f == "--schedule") {
        a.schedule = value();
      } else if (f == "--sched") {
        a.sched = value();
      } else if (f == "--order") {
        a.order = value();
      } else if (f == "--start-block") {
        a.start_block = value();
      } else if (f == "--log") {
        a.log = value();
      } else if (f == "--save-state") {
        a.save_state = value();
      } else if (f == "--resume") {
        a.resume = value();
      } else if (f == "--save-model") {
        a.save_model = value();
      } else if (f == "--bread-scope") {
        a.scope = value();
      } else if (f == "--steps") {
        a.steps = parse_integer(f, value(), 0, big);
      } else if (f == "--total-steps") {
        a.total_steps = parse_integer(f, value(), 1, big);
      } else if (f == "--batch") {
        a.batch = parse_integer(f, value(), 1, big);
      } else if (f == "--chunk") {
        a.chunk = parse_integer(f, value(), 1, big);
      } else if (f == "--switch-every") {
        a.switch_every = parse_integer(f, value(), 1, big);
      } else if (f == "--rank") {
        a.rank = parse_integer(f, value(), 1, 1 << 16);
      } else if (f == "--seed") {
        a.seed = static_cast<std::uint64_t>(parse_integer(f, value(), 0, big));
      } else if (f == "--lr") {
        a.lr = parse_real(f, value(), 0, max_lr);
      } else if (f == "--bread-lr") {
        a.bread_lr = parse_real(f, value(), 0, max_lr);
      } else if (f == "--clip") {
        a.clip = parse_real(f, value(), 0, 1e12);
      } else if (f == "--loraplus") {
        a.loraplus = parse_real(f, value(), 1e-6, 1e6);
      } else if (f == "--embedding-block") {
        a.embedding_block = true;
      } else if (f == "--head-block") {
        a.head_block = true;
      } else if (f == "--sign") {
        a.sign = true;
      } else if (f == "--quiet") {
        a.quiet = true;
      } else if (f == "--deterministic") {
        a.deterministic = true;
      } else {
        throw usage_error{"unknown option '" + f + "'"};
      }
    }
    validate(a);
    check_paths(a);
  } catch (const usage_error& e) {
    std::fprintf(stderr, "tightfit train: %s\n", e.message.c_str());
    train_usage(stderr);
    return 2;
  } catch (const error& e) {
    std::fprintf(stderr, "tightfit train: %s\n", e.what());
    train_usage(stderr);
    return 2;
  }

  try {
    return run(a);
  } catch (const usage_error& e) {  // sizes refused once the model is known
    std::fprintf(stderr, "tightfit train: %s\n", e.message.c_str());
    return 2;
  }
}

namespace {

int run(const args& a) {
  using backend = eigen_backend<float>;
  eigen_backend_options bopts;
  if (a.deterministic) bopts.attention_backward = attention_backward_strategy::two_pass;
  backend be(bopts);
  const model_config cfg = a.model.empty() ? train_preset(a.preset) : load_hf_config(a.model);
  // Sizes before allocation: config.json against the checkpoint; weights, gradients and two
  // moments (Adam) against memory; the batch's activations against memory.
  const std::filesystem::path model_path = a.model;
  check_model_fits(cfg, sizeof(float), 4, a.model.empty() ? nullptr : &model_path);
  auto table = read_token_table(a.data);
  const token_dataset data(table.rows, table.seq_len, std::move(table.input_ids),
                           std::move(table.labels));
  {
    backward_options bo;
    bo.sched = parse_backward_schedule(a.sched);
    bo.chunk = a.chunk;
    check_activations_fit<float>("--batch " + std::to_string(a.batch), true, cfg, a.batch,
                                 data.seq_len(), bo);
  }
  decoder_model<backend> model(be, cfg);
  if (a.model.empty()) {
    model.init_random(a.seed);
  } else {
    load_hf_weights(a.model, model.parameters());
    check_finite_weights(model.parameters(), a.model);
  }

  const auto part = block_partition::by_layer(model.parameters(), a.embedding_block, a.head_block);
  runtime_order order;
  order.what = runtime_order::parse(a.order);
  if (!a.start_block.empty()) order.start = static_cast<index_t>(part.index_of(a.start_block));
  block_options bo;
  bo.switch_every = a.switch_every;
  bo.max_grad_norm = a.clip;
  bo.seed = a.seed;
  adam_update_rule adam;
  if (a.lr) adam.lr = *a.lr;
  const auto scope = a.scope == "all" ? expansion_scope::all : expansion_scope::partial;

  if (a.optimizer == "adam") {
    auto opt = make_full_optimizer(model, adam, a.clip);
    return run_training(model, data, opt, a);
  }
  if (a.optimizer == "adamw") {
    adamw_update_rule w;
    if (a.lr) w.lr = *a.lr;
    auto opt = make_full_optimizer(model, w, a.clip);
    return run_training(model, data, opt, a);
  }
  if (a.optimizer == "sgd") {
    sgd_update_rule s;
    if (a.lr) s.lr = *a.lr;
    auto opt = make_full_optimizer(model, s, a.clip);
    return run_training(model, data, opt, a);
  }
  if (a.optimizer == "badam") {
    block_optimizer<backend, adam_update_rule, runtime_order> opt(model, part, adam, order, {}, bo);
    return run_training(model, data, opt, a);
  }
  if (a.optimizer == "bread-sgd") {
    sgd_expansion e;
    if (a.bread_lr) e.lr = *a.bread_lr;
    e.use_sign = a.sign;
    e.scope = scope;
    block_optimizer<backend, adam_update_rule, runtime_order, sgd_expansion> opt(model, part, adam,
                                                                                 order, e, bo);
    return run_training(model, data, opt, a);
  }
  if (a.optimizer == "bread-lora") {
    lora_expansion e;
    if (a.bread_lr) e.lr = *a.bread_lr;
    e.rank = a.rank;
    e.loraplus_ratio = a.loraplus;
    e.scope = scope;
    block_optimizer<backend, adam_update_rule, runtime_order, lora_expansion> opt(model, part, adam,
                                                                                  order, e, bo);
    return run_training(model, data, opt, a);
  }
  fail("unknown optimizer '", a.optimizer, "'");  // not reached: validate() checked it
}

}  // namespace

}  // namespace tightfit::cli
