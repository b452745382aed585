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

namespace {

void train_usage(std::FILE* out) {
  std::fprintf(
      out,
      "usage: tightfit train (--model DIR | --preset NAME) --data FILE\n"
      "         --optimizer adam|adamw|sgd|badam|bread-sgd|bread-lora|lora [options]\n"
      "  --preset NAME        tiny, or a preset of nn/presets.hpp (qwen3-bench, small, ...)\n"
      "  --objective O        sft, dpo or grpo (default sft)\n"
      "  --data FILE          safetensors; sft: input_ids (N, T), optional labels (N, T) and\n"
      "                       optional position_ids (N, T): packed rows, positions restarting\n"
      "                       at 0 at each document (a document attends only to itself);\n"
      "                       dpo: chosen_/rejected_input_ids, _labels (P, T), optional\n"
      "                       _attention_mask, ref_chosen_logps / ref_rejected_logps (P);\n"
      "                       grpo: input_ids, labels (N, T), optional attention_mask,\n"
      "                       advantages (N) or rewards (N) with --num-generations G,\n"
      "                       optional ref_logprobs (N, T); reference log-probs the file\n"
      "                       lacks are computed once by the model as loaded\n"
      "  --beta, --loss-type, --epsilon-low, ...   the objective's options, as `grad` has them\n"
      "  --num-generations G  grpo with rewards: G consecutive rows are one prompt's group\n"
      "  --scale-rewards S    group (default: A = (r - mean) / (std + 1e-4)) or none\n"
      "  --steps N            optimizer steps (default 100, or what --epochs gives)\n"
      "  --epochs E           passes over the data set instead of --steps (steps: the\n"
      "                       smallest count covering E x N rows)\n"
      "  --shuffle            a seeded permutation of the rows per epoch (--seed; DPO pairs\n"
      "                       stay together); default: rows in order\n"
      "  --batch B            rows (dpo: pairs) per micro-batch (and rank) (default 1)\n"
      "  --grad-accum N       micro-batches per optimizer step (default 1): a step trains on\n"
      "                       ranks x N x B rows, normalised over all of them (exact)\n"
      "  --parallel data      data parallel over the ranks of mpirun (needs MPI): each rank\n"
      "                       trains on its rows of every step; adam/adamw/sgd shard their\n"
      "                       state (ZeRO-1); rank 0 prints and writes the outputs\n"
      "  --parallel sequence  sequence parallel over the ranks of mpirun: every rank trains on\n"
      "                       the B x A rows of each step (A: --grad-accum), each on a share of\n"
      "                       their positions\n"
      "                       (--assignment zigzag|contiguous, default zigzag); adam, adamw,\n"
      "                       sgd (ZeRO-1) and badam; --sched stream or checkpoint\n"
      "  --dtype f32|f64|bf16 value type of weights, gradients and state (default f32); bf16:\n"
      "                       --device cuda with adam / adamw, fp32 master weights and moments\n"
      "  --device cpu|cuda    where to train (default cpu); cuda: the first visible GPU, in\n"
      "                       f32 (adam, adamw, sgd) or bf16 (adam, adamw), one process (built\n"
      "                       with -DTIGHTFIT_WITH_CUDA=ON); not with --grad-accum > 1,\n"
      "                       --resume or --save-state\n"
      "  --lr X               learning rate of the update rule (default 1e-3; sgd 1e-2)\n"
      "  --weight-decay X     adamw: decoupled (default 0.01); adam, sgd: L2 (default 0)\n"
      "  --adam-beta1 X, --adam-beta2 X, --adam-epsilon X   (defaults 0.9, 0.999, 1e-8)\n"
      "  --schedule S         constant | warmup:W | cosine | cosine:W (default constant)\n"
      "  --total-steps N      the schedule's horizon (default: steps already done + --steps;\n"
      "                       give the whole run's length when it is split with --resume)\n"
      "  --max-grad-norm X    clip gradients to global norm X (default 0: off); --clip X too\n"
      "  --chunk N            StreamBP chunk (default 512); --sched full|checkpoint|stream\n"
      "  --switch-every K     steps per block (default 50)\n"
      "  --order O            ascending|descending|random|fixed (default random)\n"
      "  --start-block NAME   first block, e.g. layer.3 (required by fixed)\n"
      "  --embedding-block, --head-block   train embedding / head as blocks too\n"
      "  --bread-lr X         BREAD-SGD step (default 1e-5) / BREAD-LoRA adapter lr (1e-4)\n"
      "  --bread-scope S      partial|all (default partial); --sign (signSGD)\n"
      "  --rank R             BREAD-LoRA rank (default 8); --loraplus R (lr ratio, default 1)\n"
      "  --lora-rank R        LoRA (--optimizer lora): rank (default 8); --lora-alpha A (default\n"
      "                       16; scale A / R, or A / sqrt(R) with --rslora); --lora-dropout P\n"
      "                       (default 0): PEFT's lora_dropout, p in [0, 1) on the adapters'\n"
      "                       inputs in training (masks seeded by --seed)\n"
      "  --target-modules M   q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj (any of\n"
      "                       them, comma-separated) or all-linear (default q_proj,v_proj)\n"
      "  --adapter DIR        LoRA: start from this PEFT adapter (its adapter_config.json gives\n"
      "                       rank, alpha, dropout and targets)\n"
      "  --seed S             model initialisation (presets) and block order seed (default 1)\n"
      "  --eval-data FILE     sft: a token data set evaluated (loss, perplexity; forward\n"
      "                       only) every --eval-steps N steps and after the last one\n"
      "  --log FILE           JSON lines, one per step: loss, lr, grad_norm (when clipping),\n"
      "                       tokens, tokens/s, seconds, peak bytes\n"
      "  --save-state FILE    checkpoint (weights + optimizer state) at the end; with\n"
      "                       --parallel data and a sharded state, rank r > 0 writes FILE.rankR\n"
      "  --resume FILE|DIR    continue from a checkpoint (saved with as many ranks): a state\n"
      "                       file, a checkpoint-N folder, or an --output-dir (its newest)\n"
      "  --output-dir DIR     where --save-steps writes checkpoint-N/ folders\n"
      "  --save-steps N       a checkpoint every N steps (state + trainer_state.json)\n"
      "  --save-total-limit K keep the K newest checkpoints (default all)\n"
      "  --deterministic      same bits on every run (the two-pass attention backward, 1.4x its\n"
      "                       matmul work): a resumed run then matches the uninterrupted one\n"
      "  --save-model DIR     write the trained model: model.safetensors (shards + index.json\n"
      "                       above 5 GB) in --model's dtypes, its config.json, its generation\n"
      "                       and tokenizer files copied; LoRA: the adapter\n"
      "                       (adapter_model.safetensors + adapter_config.json)\n"
      "  --merge-out DIR      LoRA: merge the adapters into the weights (W += s B A) and write\n"
      "                       the merged model as --save-model does\n"
      "  --quiet              no progress line\n"
      "  --config FILE        options from a flat JSON or YAML file with TRL's names\n"
      "                       (learning_rate, per_device_train_batch_size, beta, loss_type,\n"
      "                       ...); the command line overrides it. Every option also takes\n"
      "                       the form --key=value\n");
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
  std::string output_dir, resume_dir, eval_data;
  std::int64_t eval_steps = 0;  // resume_dir: the checkpoint folder --resume named
  std::int64_t save_steps = 0, save_total_limit = 0;
  std::string model, preset, data, optimizer,
      objective = "sft", scale_rewards = "group", schedule = "constant", order = "random",
      start_block, log, save_state, resume, save_model, sched = "stream", scope = "partial",
      parallel, assignment, dtype = "f32", device = "cpu", adapter, merge_out;
  std::optional<index_t> lora_rank;
  std::optional<double> lora_alpha, lora_dropout;
  std::optional<std::string> target_modules;
  bool rslora = false;
  std::int64_t steps = 100, total_steps = 0;  // 0: steps done + steps
  index_t batch = 1, grad_accum = 1, chunk = 512, switch_every = 50, rank = 8;
  std::optional<double> lr, bread_lr;
  double clip = 0, loraplus = 1;
  std::optional<double> weight_decay, adam_beta1, adam_beta2, adam_epsilon, epochs;
  index_t num_generations = 0;  // 0: not given
  bool steps_given = false, shuffle = false;
  /// The objective's options (--beta, --loss-type, ...), as `grad` reads them.
  std::vector<std::string> objective_options{"train"};
  arguments objective_arguments() const {
    std::vector<char*> argv;
    for (const auto& o : objective_options) argv.push_back(const_cast<char*>(o.c_str()));
    return arguments(static_cast<int>(argv.size()), argv.data(), objective_valued_options(),
                     objective_flags());
  }
  std::uint64_t seed = 1;
  bool embedding_block = false, head_block = false, sign = false, quiet = false;
  bool deterministic = false;
};

/// Counts (steps, batch, chunk, ...) are at most 2^62; sizes that need memory are checked
/// against it once the model is known.
constexpr long long big = 1LL << 62;
/// Learning rates above this are refused as absurd (they diverge at the first step).
constexpr double max_lr = 1e3;
/// The largest LoRA rank (--lora-rank, and r of an --adapter's adapter_config.json).
constexpr index_t max_lora_rank = 1 << 16;

/// The LoRA configuration of the options (without --adapter); throws tightfit::error naming a bad
/// value (a dropout outside [0, 1), an unknown module). --seed seeds A and the dropout masks.
lora_config cli_lora_config(const args& a) {
  lora_config c;
  c.rank = a.lora_rank.value_or(8);
  c.alpha = a.lora_alpha.value_or(16);
  c.dropout = a.lora_dropout.value_or(0);
  c.use_rslora = a.rslora;
  c.target_modules = split_target_modules(a.target_modules.value_or("q_proj,v_proj"));
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
  if (!a.eval_data.empty() && a.objective != "sft")
    throw usage_error{"--eval-data evaluates --objective sft; not " + a.objective + " yet"};
  if (a.eval_steps > 0 && a.eval_data.empty())
    throw usage_error{"--eval-steps needs --eval-data FILE"};
  if (!a.eval_data.empty() && a.device == "cuda")
    throw usage_error{"--eval-data with --device cuda is not done yet"};
  if (a.save_total_limit > 0 && a.save_steps == 0)
    throw usage_error{"--save-total-limit applies to --save-steps"};
  if (a.epochs && !a.resume.empty())
    throw usage_error{"--epochs counts from the start; a resumed run gives --steps"};
  const bool lora = a.optimizer == "lora";
  const bool lora_given = a.lora_rank || a.lora_alpha || a.lora_dropout || a.target_modules ||
                          a.rslora || !a.adapter.empty() || !a.merge_out.empty();
  if (!lora && lora_given)
    throw usage_error{
        "--lora-rank, --lora-alpha, --lora-dropout, --target-modules, --rslora, --adapter and "
        "--merge-out are options of --optimizer lora"};
  if (lora && !a.adapter.empty() &&
      (a.lora_rank || a.lora_alpha || a.lora_dropout || a.target_modules || a.rslora))
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

/// `rule` with the options' --lr, --weight-decay and (Adam, AdamW) --adam-beta1, --adam-beta2,
/// --adam-epsilon; checked by the rule's validate() (a bad value: tightfit::error naming it).
template <class Rule>
Rule with_hyperparameters(Rule rule, const args& a) {
  if (a.lr) rule.lr = *a.lr;
  if (a.weight_decay) rule.weight_decay = *a.weight_decay;
  if constexpr (requires { rule.beta1; }) {
    if (a.adam_beta1) rule.beta1 = *a.adam_beta1;
    if (a.adam_beta2) rule.beta2 = *a.adam_beta2;
    if (a.adam_epsilon) rule.eps = *a.adam_epsilon;
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

template <class T, class Model, class Opt, class Comm>
int run_training(Model& model, const training_data& data, Opt& opt, const args& a, Comm& comm,
                 double base_lr) {
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
  if (!a.eval_data.empty() && root) {
    check_token_table_fits(a.eval_data);
    auto table = read_token_table(a.eval_data);
    eval_rows.emplace(table.rows, table.seq_len, std::move(table.input_ids),
                      std::move(table.labels), std::move(table.position_ids));
    eval_rows->validate(model.config().vocab_size);
  }
  auto evaluate_at = [&](std::int64_t step) {
    if (!eval_rows) return;
    forward_options fo;
    fo.chunk = a.chunk;
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

/// The options of `--config FILE` (config_file.hpp) followed by the command line's, which so
/// override them; `origin` names the config key each option came from (empty: the command line).
std::vector<std::string> expand_config(int argc, char** argv, std::vector<std::string>& origin) {
  std::vector<std::string> config, given;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    if (f != "--config") {
      given.push_back(f);
      continue;
    }
    if (i + 1 >= argc) throw usage_error{"--config needs a value"};
    const std::string path = argv[++i];
    for (const auto& o : train_config_options(path)) {
      config.push_back(o.name);
      origin.push_back("--config " + path + " key '" + o.key + "'");
      if (!o.flag) {
        config.push_back(o.value);
        origin.push_back(origin.back());
      }
    }
  }
  origin.resize(origin.size() + given.size());
  config.insert(config.end(), given.begin(), given.end());
  return config;
}

int train(int argc, char** argv) {
  args a;
  try {  // a missing or malformed option value is a usage error (exit 2)
    std::vector<std::string> origin;
    const std::vector<std::string> items = expand_config(argc, argv, origin);
    const auto count = static_cast<int>(items.size());
    bool epochs_from_config = false, steps_from_config = false;
    for (int i = 0; i < count; ++i) {
      const std::string f = items[static_cast<std::size_t>(i)];
      const std::string from = origin[static_cast<std::size_t>(i)].empty()
                                   ? ""
                                   : " (" + origin[static_cast<std::size_t>(i)] + ")";
      auto value = [&]() -> std::string {
        if (i + 1 >= count) throw usage_error{f + " needs a value"};
        return items[static_cast<std::size_t>(++i)];
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
      } else if (f == "--eval-data") {
        a.eval_data = value();
      } else if (f == "--eval-steps") {
        a.eval_steps = parse_integer(f, value(), 1, big);
      } else if (f == "--output-dir") {
        a.output_dir = value();
      } else if (f == "--save-steps") {
        a.save_steps = parse_integer(f, value(), 1, big);
      } else if (f == "--save-total-limit") {
        a.save_total_limit = parse_integer(f, value(), 1, big);
      } else if (f == "--save-model") {
        a.save_model = value();
      } else if (f == "--bread-scope") {
        a.scope = value();
      } else if (f == "--parallel") {
        a.parallel = value();
      } else if (f == "--assignment") {
        a.assignment = value();
      } else if (f == "--dtype") {
        a.dtype = value();
      } else if (f == "--device") {
        a.device = value();
      } else if (f == "--adapter") {
        a.adapter = value();
      } else if (f == "--merge-out") {
        a.merge_out = value();
      } else if (f == "--target-modules") {
        a.target_modules = value();
      } else if (f == "--lora-rank") {
        a.lora_rank = parse_integer(f, value(), 1, max_lora_rank);
      } else if (f == "--lora-alpha") {
        a.lora_alpha = parse_real(f, value(), 1e-12, 1e12);
      } else if (f == "--lora-dropout") {
        a.lora_dropout = parse_real(f, value(), 0, 1);
      } else if (f == "--rslora") {
        a.rslora = true;
      } else if (f == "--grad-accum") {
        a.grad_accum = parse_integer(f, value(), 1, big);
      } else if (f == "--steps") {  // on the command line, it overrides a config's epochs
        a.steps = parse_integer(f, value(), 0, big);
        a.steps_given = true;
        steps_from_config = !from.empty();
        if (from.empty() && epochs_from_config) a.epochs.reset();
      } else if (f == "--epochs") {
        a.epochs = parse_real(f, value(), 1e-9, 1e9);
        epochs_from_config = !from.empty();
        if (from.empty() && steps_from_config) a.steps_given = false;
      } else if (f == "--shuffle") {
        a.shuffle = true;
      } else if (f == "--objective") {
        a.objective = value();
      } else if (f == "--num-generations") {
        a.num_generations = parse_integer(f, value(), 2, big);
      } else if (f == "--scale-rewards") {
        a.scale_rewards = value();
      } else if (objective_valued_options().contains(f)) {
        a.objective_options.push_back(f);
        a.objective_options.push_back(value());
      } else if (objective_flags().contains(f)) {
        a.objective_options.push_back(f);
      } else if (f == "--weight-decay") {
        a.weight_decay = parse_real(f, value(), 0, 1e6);
      } else if (f == "--adam-beta1") {
        a.adam_beta1 = parse_real(f, value(), 0, 0.999999999);
      } else if (f == "--adam-beta2") {
        a.adam_beta2 = parse_real(f, value(), 0, 0.999999999);
      } else if (f == "--adam-epsilon") {
        a.adam_epsilon = parse_real(f, value(), 1e-300, 1);
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
      } else if (f == "--clip" || f == "--max-grad-norm") {
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
        throw usage_error{"unknown option '" + f + "'" + from};
      }
    }
    if (!a.resume.empty()) {  // a folder: its (newest) checkpoint's state file
      const std::string file = resume_state_file(a.resume);
      const auto folder = std::filesystem::path(file).parent_path();
      if (checkpoint_step(folder)) a.resume_dir = folder.string();  // never rotated away
      a.resume = file;
    }
    validate(a);
    check_paths(a);
  } catch (const usage_error& e) {
    if (!launched_rank_above_0()) {
      std::fprintf(stderr, "tightfit train: %s\n", e.message.c_str());
      train_usage(stderr);
    }
    return 2;
  } catch (const error& e) {
    if (!launched_rank_above_0()) {
      std::fprintf(stderr, "tightfit train: %s\n", e.what());
      train_usage(stderr);
    }
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
  training_data data = read_training_data(a.data, a.objective, objective_args,
                                          {a.num_generations, a.scale_rewards == "group"});
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
      return run_training<T>(model, data, opt, a, comm, rule.lr);
    } else {
      auto opt = make_full_optimizer(model, rule, a.clip);
      return run_training<T>(model, data, opt, a, comm, rule.lr);
    }
  };
  if (a.optimizer == "adam") return full(adam);
  if (a.optimizer == "adamw") return full(with_hyperparameters(adamw_update_rule{}, a));
  if (a.optimizer == "sgd") return full(with_hyperparameters(sgd_update_rule{}, a));
  if (a.optimizer == "badam") {
    block_optimizer<decltype(model), adam_update_rule, runtime_order> opt(model, part, adam, order,
                                                                          {}, bo);
    return run_training<T>(model, data, opt, a, comm, adam.lr);
  }
  if (a.optimizer == "bread-sgd") {
    sgd_expansion e;
    if (a.bread_lr) e.lr = *a.bread_lr;
    e.use_sign = a.sign;
    e.scope = scope;
    block_optimizer<decltype(model), adam_update_rule, runtime_order, sgd_expansion> opt(
        model, part, adam, order, e, bo);
    return run_training<T>(model, data, opt, a, comm, adam.lr);
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
      return run_training<T>(model, data, opt, a, comm, w.lr);
    }
    if (a.optimizer == "bread-lora") {
      lora_expansion e;
      if (a.bread_lr) e.lr = *a.bread_lr;
      e.rank = a.rank;
      e.loraplus_ratio = a.loraplus;
      e.scope = scope;
      block_optimizer<decltype(model), adam_update_rule, runtime_order, lora_expansion> opt(
          model, part, adam, order, e, bo);
      return run_training<T>(model, data, opt, a, comm, adam.lr);
    }
  }
  fail("optimizer '", a.optimizer, "' is not available here");  // validate() refused it
}

}  // namespace

}  // namespace tightfit::cli
