// tightfit train: SFT, DPO or offline GRPO training (--objective; training_data.hpp) of a
// decoder model with a full or block coordinate optimizer
// (Adam, AdamW, SGD, BAdam, BREAD-SGD, BREAD-LoRA) or LoRA adapters (AdamW on the adapters, the
// model frozen; written in the PEFT layout) on a tokenized safetensors data set, with
// gradient accumulation (--grad-accum) and, under mpirun, data parallelism (--parallel data:
// ZeRO-1 for the full optimizers, the active block only for BAdam / BREAD-SGD) or sequence
// parallelism (--parallel sequence: every rank the step's rows, a shard of their positions;
// ZeRO-1 for the full optimizers, BAdam). --device cuda trains with adam, adamw or sgd on one
// GPU (device_cuda.hpp): the host loads and checks as for the CPU, the device runs the steps;
// --dtype bf16 there (adam, adamw): bf16 weights and gradients, fp32 master weights and moments.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "args.hpp"
#include "checkpoints.hpp"
#include "checks.hpp"
#include "commands.hpp"
#include "config_file.hpp"
#include "device_cuda.hpp"
#include "evaluation.hpp"
#include "mpi_launch.hpp"
#include "objective_args.hpp"
#include "output_paths.hpp"
#include "tightfit/backend/eigen.hpp"
#include "tightfit/distributed/self_communicator.hpp"
#include "tightfit/distributed/sequence_step.hpp"
#include "tightfit/loss/sft.hpp"
#include "tightfit/nn/architectures.hpp"
#include "tightfit/nn/hf_model.hpp"
#include "tightfit/nn/hf_save.hpp"
#include "tightfit/nn/lora.hpp"
#include "tightfit/nn/peft.hpp"
#include "tightfit/nn/presets.hpp"
#include "tightfit/optim/callbacks.hpp"
#include "tightfit/optim/checkpoint.hpp"
#include "tightfit/optim/lora_optimizer.hpp"
#include "tightfit/optim/optim.hpp"
#include "tightfit/optim/train.hpp"
#include "tightfit/optim/zero1.hpp"
#include "training_data.hpp"

namespace tightfit::cli {

/// train's options (args.hpp: the parser, --help and docs/tool.md's table come from them); a
/// --config file's keys are TRL's names (config_file.hpp).
const command_spec& train_command() {
  static const command_spec spec = [] {
    command_spec c;
    c.name = "train";
    c.synopsis =
        "(--model DIR | --preset NAME) --data FILE --optimizer "
        "adam|adamw|sgd|badam|bread-sgd|bread-lora|lora [options]";
    c.options = {
        {"--model", "DIR", "a Hugging Face model folder: config.json and safetensors weights", "",
         "model_name_or_path"},
        {"--preset", "NAME", "tiny (4 layers, hidden 64), or a preset of nn/presets.hpp"},
        {"--config", "FILE",
         "options from a flat JSON or YAML file with TRL's names (the config keys of this table); "
         "prepare's keys are skipped; the command line overrides the file"},
        {"--objective", "NAME", "sft, dpo or grpo", "sft"},
        {"--data", "FILE",
         "the training data (safetensors). sft: input_ids (N, T), optional labels and "
         "position_ids (packed rows); dpo: chosen_/rejected_input_ids and _labels (P, T), "
         "optional _attention_mask, ref_chosen_logps / ref_rejected_logps (P); grpo: input_ids, "
         "labels (N, T), optional attention_mask, advantages (N) or rewards (N) with "
         "--num-generations, optional ref_logprobs (N, T). Reference log-probs the file lacks are "
         "computed once by the model as loaded"},
        {"--num-generations", "G",
         "grpo with rewards: G consecutive rows are one prompt's completions", "",
         "num_generations"},
        {"--scale-rewards", "NAME",
         "grpo with rewards: group ((r - mean) / (std + 1e-4)) or none (r - mean)", "group",
         "scale_rewards"},
        {"--optimizer", "NAME",
         "adam, adamw, sgd, badam (BAdam: one block of layers at a time), bread-sgd, bread-lora "
         "(BREAD: the inactive layers updated too), lora (PEFT's LoRA)",
         "", "optim"},
        {"--lr", "X",
         "the update rule's learning rate (default TRL's: 2e-5 for sft, 1e-6 for dpo and grpo)", "",
         "learning_rate"},
        {"--weight-decay", "X", "adamw: decoupled; adam, sgd: an L2 term", "0", "weight_decay"},
        {"--adam-beta1", "X", "Adam's beta1 (adam, adamw, badam, BREAD's Adam)", "0.9",
         "adam_beta1"},
        {"--adam-beta2", "X", "Adam's beta2", "0.999", "adam_beta2"},
        {"--adam-epsilon", "X", "Adam's epsilon", "1e-8", "adam_epsilon"},
        {"--max-grad-norm", "X", "clip the gradients to this global norm (0: off)", "1",
         "max_grad_norm"},
        {"--clip", "X", "", "", "", "--max-grad-norm"},
        {"--schedule", "NAME",
         "the learning-rate schedule: constant, warmup:W, cosine or cosine:W (W warmup steps)",
         "constant"},
        {"--total-steps", "N",
         "the schedule's horizon (default: the steps already done + --steps; give the whole "
         "run's length when it is split with --resume)"},
        {"--steps", "N", "optimizer steps (or what --epochs gives)", "100", "max_steps"},
        {"--epochs", "E",
         "passes over the data set instead of --steps: the smallest step count covering E x N "
         "rows, counted from the run's start (a resumed run does the steps left)",
         "", "num_train_epochs"},
        {"--shuffle", "",
         "each epoch's rows in a permutation drawn from --seed and the epoch (dpo pairs stay "
         "together); without it rows come in order"},
        {"--batch", "B", "rows (dpo: pairs) per micro-batch and rank", "1",
         "per_device_train_batch_size"},
        {"--grad-accum", "N",
         "micro-batches per optimizer step: a step trains on ranks x N x B rows, normalised over "
         "all of them (exact)",
         "1", "gradient_accumulation_steps"},
        {"--sched", "NAME",
         "the backward schedule: full, checkpoint (gradient checkpointing) or stream (StreamBP)",
         "stream"},
        {"--chunk", "N", "StreamBP's chunk of positions", "512"},
        {"--deterministic", "",
         "the same bits on every run (the two-pass attention backward, 1.4x its matmul work): a "
         "resumed run then matches the unbroken one"},
        {"--switch-every", "K", "badam, BREAD: steps per block", "50"},
        {"--order", "NAME", "the block order: ascending, descending, random or fixed", "random"},
        {"--start-block", "NAME", "the first block, e.g. layer.3 (needed by --order fixed)"},
        {"--embedding-block", "", "train the embedding as a block too"},
        {"--head-block", "", "train the LM head as a block too"},
        {"--bread-lr", "X",
         "BREAD-SGD's step of the inactive layers (default 1e-5), BREAD-LoRA's adapter learning "
         "rate (default 1e-4)"},
        {"--bread-scope", "NAME", "BREAD: partial or all layers updated in the backward",
         "partial"},
        {"--sign", "", "BREAD-SGD: signSGD"},
        {"--rank", "R", "BREAD-LoRA's rank", "8"},
        {"--loraplus", "R", "BREAD-LoRA: LoRA+'s ratio of B's learning rate to A's", "1"},
        {"--lora-rank", "R", "lora: the adapters' rank r", "8", "lora_r"},
        {"--lora-alpha", "A", "lora: the scale is A / r (A / sqrt(r) with --rslora)", "16",
         "lora_alpha"},
        {"--rslora", "", "lora: rsLoRA's scale A / sqrt(r)", "", "use_rslora"},
        {"--lora-dropout", "P",
         "lora: PEFT's lora_dropout, P in [0, 1) on the adapters' inputs in training steps "
         "(masks seeded by --seed)",
         "0", "lora_dropout"},
        {"--target-modules", "LIST",
         "lora: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj (comma-separated) "
         "or all-linear",
         "q_proj,v_proj", "lora_target_modules"},
        {"--adapter", "DIR",
         "lora: start from this PEFT adapter (its adapter_config.json gives rank, alpha, dropout "
         "and targets)"},
        {"--merge-out", "DIR",
         "lora: merge the adapters into the weights (W += s B A) and write the model as "
         "--save-model does"},
        {"--parallel", "MODE",
         "under mpirun (needs MPI): data (each rank its rows of every step; adam, adamw, sgd "
         "shard their state, ZeRO-1) or sequence (every rank all rows, each a share of their "
         "positions); rank 0 prints and writes the outputs"},
        {"--assignment", "NAME", "--parallel sequence: zigzag (default) or contiguous"},
        {"--device", "NAME",
         "cpu, or cuda: the first visible GPU, one process, adam / adamw / sgd (a build with "
         "-DTIGHTFIT_WITH_CUDA=ON)",
         "cpu"},
        {"--dtype", "NAME",
         "weights, gradients and state: f32 or f64; bf16 with --device cuda (adam, adamw; fp32 "
         "master weights and moments)",
         "f32"},
        {"--seed", "S", "the model's initialisation (presets), the block order and --shuffle", "1",
         "seed"},
        {"--eval-data", "FILE",
         "evaluated every --eval-steps steps and after the last, forward only: sft, a token data "
         "set (loss, perplexity); dpo, pairs as --data (loss, TRL's reward metrics)"},
        {"--eval-steps", "N", "steps between evaluations", "", "eval_steps"},
        {"--log", "FILE",
         "JSON lines, one per step: loss, lr, grad_norm (when clipping), tokens, tokens/s, "
         "seconds, peak bytes"},
        {"--output-dir", "DIR", "where --save-steps writes checkpoint-N/ folders", "",
         "output_dir"},
        {"--save-steps", "N", "a checkpoint (state + trainer_state.json) every N steps", "",
         "save_steps"},
        {"--save-total-limit", "K", "keep the K newest checkpoints (default all)", "",
         "save_total_limit"},
        {"--save-state", "FILE",
         "the weights and optimizer state at the end; with --parallel data and a sharded state, "
         "rank r > 0 writes FILE.rankR"},
        {"--resume", "FILE|DIR",
         "continue from a state file, a checkpoint-N folder or an --output-dir (its newest), "
         "saved by as many ranks",
         "", "resume_from_checkpoint"},
        {"--save-model", "DIR",
         "the trained model: model.safetensors (shards + index above 5 GB) in --model's dtypes, "
         "its config.json, generation and tokenizer files; lora: the adapter"},
        {"--quiet", "", "no progress line"},
    };
    for (const auto& o : objective_options()) c.options.push_back(o);
    c.config = [](const std::string& path, const command_spec& self) {
      return read_config(path, self, prepare_command());
    };
    c.notes = "Every option also takes the = form: --lr=2e-5.\n";
    return c;
  }();
  return spec;
}

namespace {

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

/// Counts (steps, batch, chunk, ...) are at most 2^62; sizes that need memory are checked
/// against it once the model is known.
constexpr long long big = 1LL << 62;
/// Learning rates above this are refused as absurd (they diverge at the first step).
constexpr double max_lr = 1e3;
/// The largest LoRA rank (--lora-rank, and r of an --adapter's adapter_config.json).
constexpr index_t max_lora_rank = 1 << 16;

/// The options of a run, read from the command line (train_command() declares them and their
/// defaults).
struct args {
  std::string output_dir, eval_data;
  std::string resume_dir;  // the checkpoint folder --resume named
  std::int64_t eval_steps = 0, save_steps = 0, save_total_limit = 0;  // 0: not given
  std::string model, preset, data, optimizer, objective, scale_rewards, schedule, order,
      start_block, log, save_state, resume, save_model, sched, scope, parallel, assignment, dtype,
      device, adapter, merge_out, target_modules;
  index_t lora_rank = 0;
  double lora_alpha = 0, lora_dropout = 0;
  bool rslora = false, lora_options_given = false;  // one of the LoRA options given
  std::int64_t steps = 0, total_steps = 0;          // total_steps 0: steps done + steps
  index_t batch = 0, grad_accum = 0, chunk = 0, switch_every = 0, rank = 0;
  std::optional<double> lr, bread_lr;  // not given: TRL's (lr) or the library's default
  double clip = 0, loraplus = 0, weight_decay = 0, adam_beta1 = 0, adam_beta2 = 0, adam_epsilon = 0;
  std::optional<double> epochs;
  index_t num_generations = 0;  // 0: not given
  bool steps_given = false, shuffle = false;
  std::uint64_t seed = 0;
  bool embedding_block = false, head_block = false, sign = false, quiet = false;
  bool deterministic = false;
  /// Every option as parsed: the objective's (--beta, --loss-type, ...) are read from it as
  /// `grad` reads them.
  std::optional<arguments> options;
  const arguments& objective_arguments() const { return *options; }
};

/// The run's options from the parsed command line; malformed values are usage errors naming them.
args read_train_args(const arguments& x) {
  args a;
  a.options.emplace(x);
  for (auto [field, key] : {std::pair{&a.model, "--model"},
                            {&a.preset, "--preset"},
                            {&a.data, "--data"},
                            {&a.optimizer, "--optimizer"},
                            {&a.objective, "--objective"},
                            {&a.scale_rewards, "--scale-rewards"},
                            {&a.schedule, "--schedule"},
                            {&a.order, "--order"},
                            {&a.start_block, "--start-block"},
                            {&a.log, "--log"},
                            {&a.save_state, "--save-state"},
                            {&a.resume, "--resume"},
                            {&a.save_model, "--save-model"},
                            {&a.sched, "--sched"},
                            {&a.scope, "--bread-scope"},
                            {&a.parallel, "--parallel"},
                            {&a.assignment, "--assignment"},
                            {&a.dtype, "--dtype"},
                            {&a.device, "--device"},
                            {&a.adapter, "--adapter"},
                            {&a.merge_out, "--merge-out"},
                            {&a.target_modules, "--target-modules"},
                            {&a.output_dir, "--output-dir"},
                            {&a.eval_data, "--eval-data"}})
    *field = x.get(key);
  a.eval_steps = x.has("--eval-steps") ? x.integer("--eval-steps", 1, big) : 0;
  a.save_steps = x.has("--save-steps") ? x.integer("--save-steps", 1, big) : 0;
  a.save_total_limit = x.has("--save-total-limit") ? x.integer("--save-total-limit", 1, big) : 0;
  a.lora_rank = x.integer("--lora-rank", 1, max_lora_rank);
  a.lora_alpha = x.real("--lora-alpha", 1e-12, 1e12);
  a.lora_dropout = x.real("--lora-dropout", 0, 1);
  a.rslora = x.has("--rslora");
  for (const char* k :
       {"--lora-rank", "--lora-alpha", "--lora-dropout", "--target-modules", "--rslora"})
    a.lora_options_given = a.lora_options_given || x.has(k);
  a.grad_accum = x.integer("--grad-accum", 1, big);
  a.steps = x.integer("--steps", 0, big);
  a.steps_given = x.has("--steps");
  if (x.has("--epochs")) a.epochs = x.real("--epochs", 1e-9, 1e9);
  a.shuffle = x.has("--shuffle");
  if (x.has("--num-generations")) a.num_generations = x.integer("--num-generations", 2, big);
  a.weight_decay = x.real("--weight-decay", 0, 1e6);
  a.adam_beta1 = x.real("--adam-beta1", 0, 0.999999999);
  a.adam_beta2 = x.real("--adam-beta2", 0, 0.999999999);
  a.adam_epsilon = x.real("--adam-epsilon", 1e-300, 1);
  if (x.has("--total-steps")) a.total_steps = x.integer("--total-steps", 1, big);
  a.batch = x.integer("--batch", 1, big);
  a.chunk = x.integer("--chunk", 1, big);
  a.switch_every = x.integer("--switch-every", 1, big);
  a.rank = x.integer("--rank", 1, 1 << 16);
  a.seed = static_cast<std::uint64_t>(x.integer("--seed", 0, big));
  if (x.has("--lr")) a.lr = x.real("--lr", 0, max_lr);
  if (x.has("--bread-lr")) a.bread_lr = x.real("--bread-lr", 0, max_lr);
  a.clip = x.real("--max-grad-norm", 0, 1e12);
  a.loraplus = x.real("--loraplus", 1e-6, 1e6);
  a.embedding_block = x.has("--embedding-block");
  a.head_block = x.has("--head-block");
  a.sign = x.has("--sign");
  a.quiet = x.has("--quiet");
  a.deterministic = x.has("--deterministic");
  return a;
}

/// TRL's default learning rate of the objective (SFTConfig 2e-5; DPOConfig, GRPOConfig 1e-6).
double trl_learning_rate(const std::string& objective) {
  return objective == "sft" ? 2e-5 : 1e-6;
}

/// The LoRA configuration of the options (without --adapter); throws tightfit::error naming a bad
/// value (a dropout outside [0, 1), an unknown module). --seed seeds A and the dropout masks.
lora_config cli_lora_config(const args& a) {
  lora_config c;
  c.rank = a.lora_rank;
  c.alpha = a.lora_alpha;
  c.dropout = a.lora_dropout;
  c.use_rslora = a.rslora;
  c.target_modules = split_target_modules(a.target_modules);
  c.seed = a.seed;
  c.validate();
  return c;
}

/// Argument checks that need no file: every wrong value is a usage error (exit 2), reported
/// before the model and the data are loaded.
void validate(const args& a) {
  if (a.model.empty() == a.preset.empty() || a.data.empty() || a.optimizer.empty())
    throw usage_error{"give one of --model / --preset, and --data and --optimizer"};
  static const std::set<std::string> optimizers{"adam",      "adamw",      "sgd", "badam",
                                                "bread-sgd", "bread-lora", "lora"};
  if (!optimizers.contains(a.optimizer))
    throw usage_error{"unknown optimizer '" + a.optimizer +
                      "', expected adam, adamw, sgd, badam, bread-sgd, bread-lora or lora"};
  check_objective_arguments(a.objective_arguments(), a.objective);
  if (a.objective != "sft" && a.device == "cuda")
    throw usage_error{"--device cuda trains --objective sft; not " + a.objective + " yet"};
  if (a.objective != "grpo" && (a.num_generations > 0 || a.scale_rewards != "group"))
    throw usage_error{"--num-generations and --scale-rewards apply to --objective grpo"};
  if (a.scale_rewards != "group" && a.scale_rewards != "none")
    throw usage_error{"--scale-rewards is '" + a.scale_rewards + "', expected group or none"};
  if (a.epochs && a.steps_given) throw usage_error{"give --steps or --epochs, not both"};
  if (a.save_steps > 0 && a.output_dir.empty())
    throw usage_error{"--save-steps N needs --output-dir DIR (where checkpoint-N/ go)"};
  if (!a.eval_data.empty() && a.objective == "grpo")
    throw usage_error{
        "--eval-data evaluates --objective sft and dpo; offline GRPO's loss at the ratio 1 is "
        "-mean(A) whatever the policy (TRL evaluates GRPO by generating)"};
  if (a.eval_steps > 0 && a.eval_data.empty())
    throw usage_error{"--eval-steps needs --eval-data FILE"};
  if (!a.eval_data.empty() && a.device == "cuda")
    throw usage_error{"--eval-data with --device cuda is not done yet"};
  if (a.save_total_limit > 0 && a.save_steps == 0)
    throw usage_error{"--save-total-limit applies to --save-steps"};
  const bool lora = a.optimizer == "lora";
  const bool lora_given = a.lora_options_given || !a.adapter.empty() || !a.merge_out.empty();
  if (!lora && lora_given)
    throw usage_error{
        "--lora-rank, --lora-alpha, --lora-dropout, --target-modules, --rslora, --adapter and "
        "--merge-out are options of --optimizer lora"};
  if (lora && !a.adapter.empty() && a.lora_options_given)
    throw usage_error{"--adapter " + a.adapter +
                      ": rank, alpha, dropout and targets come from its adapter_config.json "
                      "(drop --lora-rank, --lora-alpha, --lora-dropout, --target-modules, "
                      "--rslora)"};
  if (lora) (void)cli_lora_config(a).projections();  // a bad module name or dropout: exit 2
  if (lora && !a.parallel.empty())
    throw usage_error{"--parallel " + a.parallel + " does not train --optimizer lora yet"};
  if (a.scope != "partial" && a.scope != "all")
    throw usage_error{"--bread-scope is '" + a.scope + "', expected partial or all"};
  check(a.clip >= 0, "--clip is ", a.clip, ", expected >= 0 (0: off)");
  if (a.device != "cpu" && a.device != "cuda")
    throw usage_error{"--device is '" + a.device + "', expected cpu or cuda"};
  if (a.device == "cuda") {
    if (a.optimizer != "adam" && a.optimizer != "adamw" && a.optimizer != "sgd")
      throw usage_error{"--device cuda trains adam, adamw and sgd; not --optimizer " + a.optimizer +
                        " yet (docs/cuda.md)"};
    if (a.dtype == "bf16" && a.optimizer == "sgd")
      throw usage_error{
          "--device cuda --dtype bf16 trains adam and adamw (fp32 master weights and moments); "
          "not --optimizer sgd yet (train sgd in f32)"};
    if (a.dtype != "f32" && a.dtype != "bf16")
      throw usage_error{"--device cuda trains in --dtype f32 or bf16, not " + a.dtype};
    if (!a.parallel.empty())
      throw usage_error{"--parallel " + a.parallel +
                        " runs on the CPU only; --device cuda trains in one process on one GPU"};
    if (a.grad_accum != 1)
      throw usage_error{"--device cuda: --grad-accum " + std::to_string(a.grad_accum) +
                        " is not done on the GPU yet (give --batch instead)"};
    if (!a.resume.empty() || !a.save_state.empty() || a.save_steps > 0)
      throw usage_error{std::string(a.resume.empty() ? "--save-state / --save-steps" : "--resume") +
                        " with --device cuda is not done yet (the optimizer state stays on the "
                        "GPU)"};
  }
  if (a.dtype != "f32" && a.dtype != "f64" && !(a.dtype == "bf16" && a.device == "cuda"))
    throw usage_error{"--dtype is '" + a.dtype + "', expected f32 or f64" +
                      (a.dtype == "bf16" ? " (bf16 trains on the GPU: --device cuda)" : "")};
  if (!a.parallel.empty() && a.parallel != "data" && a.parallel != "sequence")
    throw usage_error{"--parallel is '" + a.parallel + "', expected data or sequence"};
#if !defined(TIGHTFIT_HAS_MPI)
  if (!a.parallel.empty())
    throw usage_error{"--parallel " + a.parallel +
                      " needs MPI, and this tightfit was built without it "
                      "(install OpenMPI, e.g. scripts/deps --mpi, and rebuild)"};
#endif
  if (a.parallel == "data" && a.optimizer == "bread-lora")
    throw usage_error{
        "--parallel data trains adam, adamw, sgd, badam and bread-sgd; not "
        "bread-lora yet"};
  if (a.parallel == "sequence" && a.optimizer.rfind("bread-", 0) == 0)
    throw usage_error{"--parallel sequence trains adam, adamw, sgd and badam; not " + a.optimizer +
                      " (its in-backward update of inactive layers frees their gradients "
                      "inside the backward, which the sequence-parallel backward does not do)"};
  if (a.parallel == "sequence" && parse_backward_schedule(a.sched) == backward_schedule::full)
    throw usage_error{"--parallel sequence needs --sched stream or checkpoint, not full"};
  if (!a.assignment.empty()) {
    if (a.parallel != "sequence") throw usage_error{"--assignment is for --parallel sequence"};
    (void)parse_sequence_assignment(a.assignment);
  }
  // These throw tightfit::error naming the value.
  (void)parse_backward_schedule(a.sched);
  (void)runtime_schedule::parse(a.schedule, 1);
  const auto order = runtime_order::parse(a.order);
  if (order == runtime_order::kind::fixed && a.start_block.empty())
    throw usage_error{"--order fixed needs --start-block NAME"};
}

/// The file of rank r's share of a sharded (ZeRO-1) state: FILE itself for rank 0 (with the
/// weights), FILE.rankR for the others.
std::string shard_path(const std::string& path, int rank) {
  return rank == 0 ? path : path + ".rank" + std::to_string(rank);
}

/// The outputs: never an input nor inside an input folder (the model, --adapter), writable
/// (output_paths.hpp; usage errors, exit 2). `ranks` > 1 (known under MPI only): the other
/// ranks' shares of --save-state and --resume (FILE.rankR) are outputs and inputs too; every
/// rank checks all of them, so all ranks refuse together, before any collective.
void check_paths(const args& a, int ranks = 1) {
  output_paths paths;
  if (!a.model.empty()) paths.input(a.model);
  paths.input_file(a.data);
  if (!a.eval_data.empty()) paths.input_file(a.eval_data);
  if (!a.resume.empty())
    for (int r = 0; r < ranks; ++r) paths.input_file(shard_path(a.resume, r));
  if (!a.adapter.empty()) paths.input_dir(a.adapter);
  if (!a.log.empty()) paths.output_file("--log", a.log);
  if (!a.output_dir.empty()) paths.output_dir("--output-dir", a.output_dir, {});
  if (!a.save_state.empty()) {
    paths.output_file("--save-state", a.save_state);
    for (int r = 1; r < ranks; ++r)
      paths.output_file("--save-state (rank " + std::to_string(r) + "'s share)",
                        shard_path(a.save_state, r));
  }
  if (!a.save_model.empty()) {
    if (a.optimizer == "lora")
      paths.output_dir("--save-model", a.save_model,
                       {"adapter_model.safetensors", "adapter_config.json"});
    else
      paths.output_dir("--save-model", a.save_model, hf_model_files(a.model));
  }
  if (!a.merge_out.empty()) paths.output_dir("--merge-out", a.merge_out, hf_model_files(a.model));
}

template <class Opt>
constexpr bool lora_optimizer_of = requires(Opt& o) {
  o.adapters();
};

/// A checkpoint resumes on as many ranks as saved it (dist.ranks; absent: one process).
template <class R>
void check_saved_ranks(const R& file, int ranks) {
  const auto& meta = file.metadata();
  const auto it = meta.find("dist.ranks");
  const std::string saved = it == meta.end() ? "1" : it->second;
  check(saved == std::to_string(ranks), "the state was saved by a run of ", saved,
        saved == "1" ? " rank" : " ranks", ", this run has ", ranks,
        " (resume on the same number of ranks)");
}

template <class Opt>
constexpr bool sharded_state = requires(Opt& o) {
  o.sharded();
};

/// The summary line of a run (rank 0).
void print_summary(const args& a, const train_summary& s, double peak) {
  const auto steps = static_cast<long long>(s.losses.size());
  const double first = s.losses.empty() ? 0 : s.losses.front();
  const double last = s.losses.empty() ? 0 : s.losses.back();
  std::printf(
      "optimizer %s  steps %lld  loss %.4f -> %.4f  %.0f tok/s  peak %.1f MiB  state %.1f MiB\n",
      a.optimizer.c_str(), steps, first, last, s.tokens_per_second, peak / 1048576.0,
      static_cast<double>(s.state_bytes) / 1048576.0);
}

/// How --save-model and --merge-out write a model folder (nn/hf_save.hpp): from --model, its
/// dtypes, config.json and tokenizer files.
hf_save_options model_save_options(const args& a) {
  hf_save_options o;
  o.source = a.model;
  return o;
}

/// --save-model of the full-weight optimizers: the model folder (save_hf_model).
template <class Model>
void save_model(const args& a, Model& model) {
  if (a.save_model.empty()) return;
  save_hf_model(a.save_model, model.parameters(), model.config(), model_save_options(a));
}

/// The JSON log when --log is given (rank 0).
struct log_if_open {
  std::optional<json_log>& log;
  void on_step(const train_step& s) {
    if (log) log->on_step(s);
  }
};
/// The progress line unless --quiet (rank 0).
struct progress_if_shown {
  bool shown;
  void on_step(const train_step& s) const {
    if (shown) progress_line{}.on_step(s);
  }
  void on_end(const train_summary& sum) const {
    if (shown) progress_line{}.on_end(sum);
  }
};

/// `rule` with the options' --lr (TRL's default), --weight-decay and (Adam, AdamW) --adam-beta1,
/// --adam-beta2,
/// --adam-epsilon; checked by the rule's validate() (a bad value: tightfit::error naming it).
template <class Rule>
Rule with_hyperparameters(Rule rule, const args& a) {
  rule.lr = a.lr.value_or(trl_learning_rate(a.objective));
  rule.weight_decay = a.weight_decay;
  if constexpr (requires { rule.beta1; }) {
    rule.beta1 = a.adam_beta1;
    rule.beta2 = a.adam_beta2;
    rule.eps = a.adam_epsilon;
  }
  rule.validate();
  return rule;
}

/// The optimizer steps of the run: --steps, or the smallest count whose rows cover --epochs
/// passes over the data (a step takes rows_per_step rows).
std::int64_t run_steps(const args& a, index_t rows, index_t rows_per_step) {
  if (!a.epochs) return a.steps;
  const double steps =
      std::ceil(*a.epochs * static_cast<double>(rows) / static_cast<double>(rows_per_step));
  check(steps <= static_cast<double>(big), "--epochs ", *a.epochs, " over ", rows, " rows is ",
        steps, " steps, more than 2^62");
  return std::max<std::int64_t>(1, static_cast<std::int64_t>(steps));
}

/// The run's data: the training set and, for --eval-data with dpo, the evaluation pairs (their
/// references computed by the model as loaded, rank 0 only).
struct training_sets {
  training_data train;
  std::optional<training_data> eval_pairs;
};

template <class T, class Model, class Opt, class Comm>
int run_training(Model& model, const training_sets& sets, Opt& opt, const args& a, Comm& comm,
                 double base_lr) {
  const training_data& data = sets.train;
  const bool root = comm.rank() == 0;
  if (!a.resume.empty()) {
    try {
      const auto file = safetensors_file::open(a.resume);
      check_saved_ranks(file, comm.size());
      if constexpr (sharded_state<Opt>) {
        load_checkpoint_weights(file, model);
        if (root)
          opt.load(file);
        else
          opt.load(safetensors_file::open(shard_path(a.resume, comm.rank())));
      } else {
        load_checkpoint(file, model, opt);
      }
    } catch (const error& e) {
      const std::string what = e.what();
      if (what.rfind(a.resume, 0) == 0) throw;
      fail(a.resume, ": ", what);
    }
    check_finite_weights(model.parameters(), a.resume);
  }
  train_options o;
  o.batch = a.batch * data.unit();  // dpo: --batch counts pairs
  o.grad_accum = a.grad_accum;
  o.order = {a.shuffle, a.seed, data.unit()};
  const index_t row_ranks = a.parallel == "data" ? static_cast<index_t>(comm.size()) : 1;
  o.steps = run_steps(a, data.rows.rows(), o.batch * o.grad_accum * row_ranks);
  // --epochs counts the whole run (TRL's num_train_epochs): a resumed run does what is left
  if (a.epochs) o.steps = std::max<std::int64_t>(0, o.steps - opt.steps());
  o.backward.sched = parse_backward_schedule(a.sched);
  o.backward.chunk = a.chunk;
  // Non-finite policy: train() stops at a non-finite loss; a non-finite gradient or update stops
  // here, naming the step and the tensor, before anything is logged further or saved.
  auto finite = [&model, &opt](std::int64_t step, const step_result&) {
    const std::string when = "step " + std::to_string(step + 1);
    check_finite_gradients(model.parameters(), when);
    check_finite_weights(model.parameters(), when + " (after the update)");
    if constexpr (lora_optimizer_of<Opt>) {
      check_finite_gradients(opt.adapters().parameters(), when);
      check_finite_weights(opt.adapters().parameters(), when + " (after the update)");
    }
  };
  std::optional<json_log> log;
  if (!a.log.empty() && root) log.emplace(a.log, base_lr);
  // The state (weights + optimizer state) to `path`; a sharded state: rank r > 0 to path.rankR.
  auto write_state = [&](const std::string& path) {
    safetensors_writer w;
    if (root) {
      save_checkpoint(w, model, opt);
      if (!a.parallel.empty()) w.set_metadata("dist.ranks", std::to_string(comm.size()));
      w.write(path);
    } else if constexpr (sharded_state<Opt>) {
      opt.save(w);
      w.write(shard_path(path, comm.rank()));
    }
  };
  checkpoint_saver saver(a.output_dir, a.save_steps, a.save_total_limit, a.resume_dir, root,
                         [&comm] { comm.barrier(); });
  // opt.steps(): done before (resume); the run's last step must stay a count (no wrap-around)
  check(opt.steps() >= 0 && opt.steps() <= big - o.steps, a.resume.empty() ? "" : a.resume + ": ",
        "the state has done ", opt.steps(), " steps; with --steps ", o.steps,
        " the run would end past step 2^62 (", big, ")");
  const std::int64_t horizon = opt.steps() + o.steps;
  // --eval-data: rank 0 evaluates every --eval-steps steps and after the last (the weights are
  // the same on every rank)
  std::optional<token_dataset> eval_rows;
  if (!a.eval_data.empty() && root && a.objective == "sft") {
    check_token_table_fits(a.eval_data);
    auto table = read_token_table(a.eval_data);
    eval_rows.emplace(table.rows, table.seq_len, std::move(table.input_ids),
                      std::move(table.labels), std::move(table.position_ids));
    eval_rows->validate(model.config().vocab_size);
  }
  auto evaluate_at = [&](std::int64_t step) {
    forward_options fo;
    fo.chunk = a.chunk;
    if (sets.eval_pairs) {
      const dpo_eval_result e = evaluate_dpo(model, *sets.eval_pairs, a.batch, fo,
                                             dpo_options_from(a.objective_arguments()));
      if (log) log->record(step, dpo_eval_fields(e, "eval_"));
      if (!a.quiet)
        std::fprintf(stderr, "\neval at step %lld: loss %.4f%s\n", static_cast<long long>(step),
                     e.loss,
                     e.rewards ? (", reward accuracy " + std::to_string(e.accuracy)).c_str() : "");
    }
    if (!eval_rows) return;
    const eval_result e = evaluate(model, *eval_rows, a.batch, fo);
    if (log)
      log->record(step, {{"eval_loss", e.loss},
                         {"eval_perplexity", e.perplexity},
                         {"eval_tokens", e.tokens},
                         {"eval_seconds", e.seconds}});
    if (!a.quiet)
      std::fprintf(stderr, "\neval at step %lld: loss %.4f  perplexity %.3f\n",
                   static_cast<long long>(step), e.loss, e.perplexity);
  };
  auto periodic = [&](std::int64_t step, const step_result&) {
    if (a.eval_steps > 0 && (step + 1) % a.eval_steps == 0 && step + 1 != horizon)
      evaluate_at(step + 1);
    if (saver.due(step + 1))
      saver.save(step + 1, [&](const std::filesystem::path& dir) {
        write_state((dir / checkpoint_state_name).string());
      });
  };
  check(a.total_steps == 0 || a.total_steps >= horizon, "--total-steps is ", a.total_steps,
        ", but this run ends at step ", horizon);
  const auto sched =
      runtime_schedule::parse(a.schedule, a.total_steps > 0 ? a.total_steps : horizon);
  // the step's gradients: the ranks split its rows, or (--parallel sequence) its positions
  auto run = [&](const auto& gradients) {
    auto with = [&](auto&& objective) {
      return train(gradients, model, data.rows, opt, sched, o, objective, log_if_open{log},
                   progress_if_shown{!a.quiet && root}, finite, periodic);
    };
    if (data.objective == "sft") return with(sft_loss{});
    const arguments oa = a.objective_arguments();
    row_objective_factory factory{&data, {}, {}};
    if (data.objective == "grpo")
      factory.grpo = grpo_options_from(oa);
    else
      factory.dpo = dpo_options_from(oa);
    return with(factory);
  };
  train_summary s;
  if (a.parallel == "sequence") {
    sequence_parallel_training<Comm> gradients{&comm};
    if (!a.assignment.empty())
      gradients.options.assignment = parse_sequence_assignment(a.assignment);
    s = run(gradients);
  } else {
    s = run(data_parallel_training<Comm>{&comm});
  }
  if (o.steps > 0) evaluate_at(horizon);
  if (!a.save_state.empty()) write_state(a.save_state);
  // the largest rank's peak (every rank takes part in the gather)
  const double peak = max_over_ranks(comm, static_cast<double>(s.peak_bytes));
  if (!root) return 0;
  print_summary(a, s, peak);
  if constexpr (lora_optimizer_of<Opt>) {
    if (!a.save_model.empty())
      save_peft_adapter(a.save_model, opt.adapters(),
                        {a.model.empty() ? "tightfit-preset:" + a.preset : a.model, true});
    if (!a.merge_out.empty()) {
      opt.adapters().merge();
      save_merged_model(a.merge_out, opt.adapters(), model_save_options(a));
    }
  } else {
    save_model(a, model);
  }
  return 0;
}

#if defined(TIGHTFIT_CLI_CUDA)
/// --device cuda: the host model (loaded and checked) trained on the GPU; the same callbacks,
/// summary line and --save-model as the CPU path. The weights come back after the last step and
/// are checked there (train() itself stops at a non-finite loss or gradient norm).
template <class Model>
int train_on_cuda(Model& model, const token_dataset& data, const args& a) {
  cuda_train_job job;
  job.config = model.config();
  job.dtype = a.dtype == "bf16" ? cuda_dtype::bf16 : cuda_dtype::f32;
  auto& p = model.parameters();
  for (std::size_t i = 0; i < p.size(); ++i) job.parameters.push_back({p.name(i), p.value(i), {}});
  job.data = &data;
  if (a.optimizer == "adam")
    job.rule = with_hyperparameters(adam_update_rule{}, a);
  else if (a.optimizer == "adamw")
    job.rule = with_hyperparameters(adamw_update_rule{}, a);
  else
    job.rule = with_hyperparameters(sgd_update_rule{}, a);
  job.max_grad_norm = a.clip;
  check(a.total_steps == 0 || a.total_steps >= a.steps, "--total-steps is ", a.total_steps,
        ", but this run ends at step ", a.steps);
  job.schedule = runtime_schedule::parse(a.schedule, a.total_steps > 0 ? a.total_steps : a.steps);
  job.options.steps = a.steps;
  job.options.batch = a.batch;
  job.options.backward.sched = parse_backward_schedule(a.sched);
  job.options.backward.chunk = a.chunk;
  job.deterministic = a.deterministic;
  std::optional<json_log> log;
  if (!a.log.empty()) log.emplace(a.log, std::visit([](const auto& r) { return r.lr; }, job.rule));
  log_if_open logger{log};
  const progress_if_shown progress{!a.quiet};
  job.on_step = [&](const train_step& s) {
    logger.on_step(s);
    progress.on_step(s);
  };
  job.on_end = [&](const train_summary& s) { progress.on_end(s); };
  const cuda_train_result r = cuda_train(job);
  check_finite_weights(p, "the weights trained on " + r.device_name);
  print_summary(a, r.summary, static_cast<double>(r.summary.peak_bytes));
  save_model(a, model);
  return 0;
}
#endif

template <class T, class Comm>
int run(const args& a, Comm& comm);

}  // namespace

int train(int argc, char** argv) {
  const command_spec& spec = train_command();
  args a;
  try {  // a missing or malformed option value is a usage error (exit 2)
    arguments x(spec, argc, argv);
    if (x.help()) {
      std::fputs(help_text(spec).c_str(), stdout);
      return 0;
    }
    // --steps on the command line overrides a config file's epochs, and --epochs its max_steps
    if (x.has("--steps") && x.has("--epochs") &&
        x.origin("--steps").empty() != x.origin("--epochs").empty())
      x.erase(x.origin("--steps").empty() ? "--epochs" : "--steps");
    a = read_train_args(x);
    if (!a.resume.empty()) {  // a folder: its (newest) checkpoint's state file
      const std::string file = resume_state_file(a.resume);
      const auto folder = std::filesystem::path(file).parent_path();
      if (checkpoint_step(folder)) a.resume_dir = folder.string();  // never rotated away
      a.resume = file;
    }
    validate(a);
    check_paths(a);
  } catch (const usage_error& e) {
    print_usage_error(spec, e.message);
    return 2;
  } catch (const error& e) {
    print_usage_error(spec, e.what());
    return 2;
  }

  if (a.device == "cuda") {  // before any file is read (exit 1)
#if defined(TIGHTFIT_CLI_CUDA)
    require_cuda_device(0);
#else
    fail(
        "--device cuda: this tightfit was built without CUDA; rebuild it with "
        "-DTIGHTFIT_WITH_CUDA=ON (needs the CUDA toolkit: nvcc, cuBLAS)");
#endif
  }
  try {
    if (!a.parallel.empty())
      return run_under_mpi("train", [&](auto& comm) {
        return a.dtype == "f64" ? run<double>(a, comm) : run<float>(a, comm);
      });
    self_communicator self;
    return a.dtype == "f64" ? run<double>(a, self) : run<float>(a, self);
  } catch (const usage_error& e) {  // sizes refused once the model is known
    std::fprintf(stderr, "tightfit train: %s\n", e.message.c_str());
    return 2;
  }
}

namespace {

/// The model of the config's architecture (nn/architectures.hpp) trained.
template <class T, template <class> class Layer, class Comm>
int run_model(const args& a, const model_config& cfg, Comm& comm);

template <class T, class Comm>
int run(const args& a, Comm& comm) {
  const model_config cfg = a.model.empty() ? train_preset(a.preset) : load_hf_config(a.model);
  return with_config_layer(
      cfg, [&](auto layer) { return run_model<T, decltype(layer)::template type>(a, cfg, comm); });
}

template <class T, template <class> class Layer, class Comm>
int run_model(const args& a, const model_config& cfg, Comm& comm) {
  using backend = eigen_backend<T>;
  constexpr bool parallel = !std::is_same_v<Comm, self_communicator>;
  if constexpr (parallel) check_paths(a, comm.size());
  eigen_backend_options bopts;
  if (a.deterministic) bopts.attention_backward = attention_backward_strategy::two_pass;
  backend be(bopts);
  // Sizes before allocation: config.json against the checkpoint; weights, gradients and two
  // moments (Adam) against memory; a micro-batch's activations against memory.
  const std::filesystem::path model_path = a.model;
  check_model_fits(cfg, sizeof(T), 4, a.model.empty() ? nullptr : &model_path);
  // LoRA: the adapters' rank and shapes (from the files' headers) and their memory, before any
  // adapter is allocated
  std::optional<lora_config> lora;
  if (a.optimizer == "lora") {
    const std::vector<param_spec> layer_table = Layer<backend>::parameter_table(cfg);
    lora = a.adapter.empty() ? cli_lora_config(a) : read_peft_config(a.adapter);
    if (!a.adapter.empty()) {
      check(lora->rank <= max_lora_rank,
            (std::filesystem::path(a.adapter) / "adapter_config.json").string(),
            ": field \"r\" is ", lora->rank, ", more than the largest rank tightfit trains (",
            max_lora_rank, ")");
      check_peft_adapter_shapes(a.adapter, layer_table, cfg.num_hidden_layers, *lora);
    }
    const auto values = lora_value_count(layer_table, cfg.num_hidden_layers, *lora);
    check(values.has_value(), "the LoRA adapters of rank ", lora->rank,
          " do not fit in 64-bit counts");
    check_memory("the LoRA adapters (" + std::to_string(*values) + " values x 4 copies of " +
                     std::to_string(sizeof(T)) + " bytes)",
                 checked_product_or_fail("the LoRA adapters' bytes", {*values, 4, sizeof(T)}));
  }
  const arguments objective_args = a.objective_arguments();
  training_sets sets{read_training_data(a.data, a.objective, objective_args,
                                        {a.num_generations, a.scale_rewards == "group"}),
                     {}};
  training_data& data = sets.train;
  {
    backward_options bo;
    bo.sched = parse_backward_schedule(a.sched);
    bo.chunk = a.chunk;
    check_activations_fit<T>("--batch " + std::to_string(a.batch), true, cfg, a.batch * data.unit(),
                             data.rows.seq_len(), bo);
  }
  decoder_model<backend, Layer<backend>> model(be, cfg);
  if (a.model.empty()) {
    model.init_random(a.seed);
  } else {
    load_hf_weights(a.model, model.parameters());
    check_finite_weights(model.parameters(), a.model);
  }
  if (needs_references(data, objective_args)) {  // the model as loaded is the reference
    data.rows.validate(cfg.vocab_size);
    forward_options fo;
    fo.chunk = a.chunk;
    compute_references(model, data, a.batch * data.unit(), fo);
  }
  if (!a.eval_data.empty() && a.objective == "dpo" && comm.rank() == 0) {
    sets.eval_pairs = read_training_data(a.eval_data, "dpo", objective_args, {});
    sets.eval_pairs->rows.validate(cfg.vocab_size);
    if (needs_references(*sets.eval_pairs, objective_args)) {
      forward_options fo;
      fo.chunk = a.chunk;
      compute_references(model, *sets.eval_pairs, a.batch * 2, fo);
    }
  }

#if defined(TIGHTFIT_CLI_CUDA)
  if constexpr (std::is_same_v<T, float> && !parallel)
    if (a.device == "cuda") return train_on_cuda(model, data.rows, a);
#endif
  check(a.device == "cpu", "--device cuda: this tightfit was built without CUDA");

  const auto part = block_partition::by_layer(model.parameters(), a.embedding_block, a.head_block);
  runtime_order order;
  order.what = runtime_order::parse(a.order);
  if (!a.start_block.empty()) order.start = static_cast<index_t>(part.index_of(a.start_block));
  block_options bo;
  bo.switch_every = a.switch_every;
  bo.max_grad_norm = a.clip;
  bo.seed = a.seed;
  const adam_update_rule adam = with_hyperparameters(adam_update_rule{}, a);
  const auto scope = a.scope == "all" ? expansion_scope::all : expansion_scope::partial;

  // The full optimizers: over the ranks, ZeRO-1 (each rank keeps 1/N of the state).
  auto full = [&](auto rule) {
    if constexpr (parallel) {
      zero1_full_optimizer<decltype(model), decltype(rule), Comm> opt(model, rule, comm, a.clip);
      return run_training<T>(model, sets, opt, a, comm, rule.lr);
    } else {
      auto opt = make_full_optimizer(model, rule, a.clip);
      return run_training<T>(model, sets, opt, a, comm, rule.lr);
    }
  };
  if (a.optimizer == "adam") return full(adam);
  if (a.optimizer == "adamw") return full(with_hyperparameters(adamw_update_rule{}, a));
  if (a.optimizer == "sgd") return full(with_hyperparameters(sgd_update_rule{}, a));
  if (a.optimizer == "badam") {
    block_optimizer<decltype(model), adam_update_rule, runtime_order> opt(model, part, adam, order,
                                                                          {}, bo);
    return run_training<T>(model, sets, opt, a, comm, adam.lr);
  }
  if (a.optimizer == "bread-sgd") {
    sgd_expansion e;
    if (a.bread_lr) e.lr = *a.bread_lr;
    e.use_sign = a.sign;
    e.scope = scope;
    block_optimizer<decltype(model), adam_update_rule, runtime_order, sgd_expansion> opt(
        model, part, adam, order, e, bo);
    return run_training<T>(model, sets, opt, a, comm, adam.lr);
  }
  if constexpr (!parallel) {
    if (a.optimizer == "lora") {
      lora_config lc = *lora;
      lc.seed = a.seed;
      lora_adapters<decltype(model)> adapters(model, lc);
      if (!a.adapter.empty()) {
        load_peft_adapter(a.adapter, adapters);
        check_finite_weights(
            adapters.parameters(),
            (std::filesystem::path(a.adapter) / "adapter_model.safetensors").string());
      }
      const auto w = with_hyperparameters(adamw_update_rule{}, a);
      lora_optimizer<decltype(model)> opt(adapters, w, a.clip);
      return run_training<T>(model, sets, opt, a, comm, w.lr);
    }
    if (a.optimizer == "bread-lora") {
      lora_expansion e;
      if (a.bread_lr) e.lr = *a.bread_lr;
      e.rank = a.rank;
      e.loraplus_ratio = a.loraplus;
      e.scope = scope;
      block_optimizer<decltype(model), adam_update_rule, runtime_order, lora_expansion> opt(
          model, part, adam, order, e, bo);
      return run_training<T>(model, sets, opt, a, comm, adam.lr);
    }
  }
  fail("optimizer '", a.optimizer, "' is not available here");  // validate() refused it
}

}  // namespace

}  // namespace tightfit::cli
