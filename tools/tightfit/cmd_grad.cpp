// tightfit grad: loss and every parameter gradient of a Hugging Face checkpoint on a batch,
// under a StreamBP schedule. Prints one JSON line; writes the gradients (HF names) to --out.
// Under mpirun, --parallel data splits the batch's rows (DPO: its pairs) over the ranks and
// --parallel sequence the positions of every row (distributed/sequence_parallel.hpp); the gradients
// are those of one process on the whole batch, and rank 0 alone prints and writes.
// --device cuda runs the step on one GPU (device_cuda.hpp; a -DTIGHTFIT_WITH_CUDA=ON build).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "args.hpp"
#include "batch_file.hpp"
#include "checks.hpp"
#include "commands.hpp"
#include "layer_progress.hpp"
#include "mpi_launch.hpp"
#include "objective_args.hpp"
#include "output_paths.hpp"
#if defined(TIGHTFIT_CLI_CUDA)
#include "device_cuda.hpp"
#endif
#include "tightfit/backend/eigen.hpp"
#include "tightfit/distributed/data_parallel.hpp"
#include "tightfit/distributed/self_communicator.hpp"
#include "tightfit/distributed/sequence_parallel.hpp"
#include "tightfit/io/safetensors.hpp"
#include "tightfit/loss/dpo.hpp"
#include "tightfit/loss/grpo.hpp"
#include "tightfit/loss/sft.hpp"
#include "tightfit/nn/architectures.hpp"
#include "tightfit/nn/hf_model.hpp"
#include "tightfit/stream/backward.hpp"
#include "tightfit/stream/planner.hpp"

namespace tightfit::cli {

namespace {

/// The largest count an option takes (chunk, head chunk rows, completion length): 2^40.
constexpr long long max_count = 1LL << 40;

}  // namespace

/// grad's options (args.hpp: the parser, --help and docs/tool.md's table come from them).
const command_spec& grad_command() {
  static const command_spec spec = [] {
    command_spec c;
    c.name = "grad";
    c.synopsis = "--model DIR --batch FILE [--objective sft|grpo|dpo] [options]";
    c.options = {
        {"--model", "DIR", "a Hugging Face model folder: config.json and safetensors weights"},
        {"--batch", "FILE", "the batch (safetensors; its tensors below)"},
        {"--objective", "NAME", "sft, grpo or dpo", "sft"},
        {"--sched", "NAME",
         "the backward schedule: full (plain backprop), checkpoint (gradient checkpointing) or "
         "stream (StreamBP)",
         "stream"},
        {"--chunk", "N|auto",
         "StreamBP's chunk of positions; auto: the largest power of two whose peak fits "
         "--budget, keeping only every k-th layer input (the smallest k that fits) when all "
         "inputs do not",
         "512"},
        {"--budget", "BYTES", "--chunk auto's activation budget (K, M, G, T: powers of 1024)",
         "4G"},
        {"--device", "NAME",
         "cpu, or cuda: the first visible GPU (a build with -DTIGHTFIT_WITH_CUDA=ON), one "
         "process",
         "cpu"},
        {"--dtype", "NAME", "f32 or f64 on the CPU; f32 or bf16 (fp32 accumulation) on a GPU",
         "f32"},
        {"--out", "FILE", "the gradients (safetensors, the weights' names)"},
        {"--head-chunk", "ROWS", "rows of the streaming LM head per step (0: the chunk's)", "0"},
        {"--temperature", "T", "the logits are divided by T before the softmax", "1"},
        {"--parallel", "MODE",
         "under mpirun (needs MPI): data gives each rank a contiguous share of the rows (dpo: "
         "pairs), sequence a share of every row's positions; rank 0 prints and writes --out"},
        {"--assignment", "NAME",
         "--parallel sequence: zigzag (default) or contiguous blocks of positions"},
    };
    for (const auto& o : objective_options()) c.options.push_back(o);
    c.misnamed = {{"--schedule",
                   "--schedule is train's learning-rate schedule; grad's backward schedule is "
                   "--sched full|checkpoint|stream"}};
    c.notes =
        "The batch is a safetensors file in the Hugging Face convention (labels unshifted, -100\n"
        "ignored, right padding):\n"
        "  sft:  input_ids (B,T), labels (B,T), optional attention_mask (B,T) or lengths (B),\n"
        "        optional position_ids (B,T): packed documents, positions restarting at 0 at\n"
        "        each (Hugging Face padding-free layout; a document attends only to itself)\n"
        "  grpo: the same plus advantages (D), optional old_logprobs and ref_logprobs (B,T)\n"
        "        aligned with labels (entry t is the log-prob of labels[t]); D = B, or with\n"
        "        position_ids one completion per document, in row-major order\n"
        "  dpo:  chosen_input_ids, chosen_labels, rejected_input_ids, rejected_labels (P,T),\n"
        "        optional chosen_attention_mask, rejected_attention_mask (P,T), and\n"
        "        ref_chosen_logps, ref_rejected_logps (P) (optional for simpo and orpo);\n"
        "        packed: chosen_position_ids / rejected_position_ids, the i-th chosen and the\n"
        "        i-th rejected document (row-major order) form pair i\n"
        "`tightfit logprobs` adds old_logprobs / ref_logprobs / ref_*_logps to a batch file.\n"
        "attention_mask holds 0 / 1 only; a label outside the mask is never supervised, whatever\n"
        "its value. Any other tensor in the batch file is an error naming it. An option of\n"
        "another objective is an argument error.\n"
        "Prints one JSON line: loss, schedule, chunk, peak_activation_bytes, seconds, ...\n"
        "Under mpirun the gradients are those of one process on the whole batch;\n"
        "peak_activation_bytes is the largest rank's. Packed batches: --parallel data splits the\n"
        "rows, each rank taking the documents of its rows (dpo: the chosen rows, and the rejected\n"
        "rows of their pairs, which must break where the chosen rows do); --parallel sequence\n"
        "runs packed sft only, with --sched stream or checkpoint.\n";
    return c;
  }();
  return spec;
}

namespace {

/// The rows of `v` (rows of `width` values) listed in `rows`, in that order (empty stays empty).
template <class V>
std::vector<V> take_rows(const std::vector<V>& v, const std::vector<index_t>& rows, index_t width) {
  std::vector<V> out;
  if (v.empty()) return out;
  for (index_t r : rows) out.insert(out.end(), v.begin() + r * width, v.begin() + (r + 1) * width);
  return out;
}

template <class T, template <class> class Layer, class Comm>
int run_grad_with(const arguments& a, const model_config& cfg, Comm& comm) {
  constexpr bool distributed = !std::is_same_v<Comm, self_communicator>;
  const std::string parallel = a.get("--parallel", "");
  const bool cuda = a.get("--device") == "cuda";
  const std::string dtype = a.get("--dtype");
  using backend = eigen_backend<T>;
  const std::filesystem::path model_dir = a.get("--model");
  // Sizes before allocation: config.json against the checkpoint, weights + gradients
  // against memory; the batch's tokens and activations from its header (rows x T x the
  // model's bytes per token), before the model or the batch is read.
  check_model_fits(cfg, sizeof(T), 2, &model_dir);
  const auto batch_file = safetensors_file::open(a.get("--batch"));
  const std::string objective = a.get("--objective");
  check_batch_keys(batch_file, objective);
  index_t b = 0, t = 0;
  std::tie(b, t) = batch_extents(batch_file, objective);
  std::optional<loaded_batch> read_early;  // a malformed batch: read_batch names the problem
  if (b <= 0 || t <= 0) {
    read_early = read_batch(batch_file, objective);
    b = read_early->b, t = read_early->t;
  }
  backward_options opt;
  opt.sched = parse_backward_schedule(a.get("--sched"));
  opt.temperature = a.real("--temperature", 1e-6, 1e6);
  opt.head_chunk_rows = a.integer("--head-chunk", 0, max_count);
  if (a.get("--chunk") == "auto") {
    const std::size_t budget = parse_bytes("--budget", a.get("--budget"));
    const auto plan = plan_memory<T>(cfg, b, t, budget, sft_loss{}, 0, t);
    check(plan.chunk >= 1, "--chunk auto: even chunk 1 needs more than the budget of ", budget,
          " bytes at T = ", t);
    opt.chunk = plan.chunk;
    // > 1 when only layer-input spacing fits the budget (full keeps every activation anyway)
    if (opt.sched != backward_schedule::full) opt.keep_every = plan.keep_every;
  } else {
    opt.chunk = a.integer("--chunk", 1, max_count);
  }
  layer_progress progress("grad", cfg.num_hidden_layers, comm.rank() == 0);  // long runs
  opt.between_layers = [&progress] { progress(); };
  // on the GPU the activations live in device memory (an allocation there that fails is an
  // error); the host holds the batch either way
  if (!cuda)
    check_activations_fit<T>(batch_file.source(), false, cfg, b, t, opt,
                             batch_host_bytes_per_token);
  else
    check_memory(
        batch_file.source() + ": " + std::to_string(b) + " x " + std::to_string(t) + " tokens at " +
            std::to_string(batch_host_bytes_per_token) + " bytes per token",
        checked_product_or_fail(batch_file.source() + ": the batch's bytes",
                                {static_cast<std::uint64_t>(b), static_cast<std::uint64_t>(t),
                                 batch_host_bytes_per_token}));

  backend be;
  decoder_model<backend, Layer<backend>> model(be, cfg);
  load_hf_weights(model_dir, model.parameters());
  check_finite_weights(model.parameters(), model_dir.string());
  loaded_batch lb = read_early ? std::move(*read_early) : read_batch(batch_file, objective);
  check(lb.b == b && lb.t == t, batch_file.source(), ": the batch is (", lb.b, ", ", lb.t,
        "), its header said (", b, ", ", t, ")");
  index_t truncated = 0;
  if (objective == "grpo" && a.has("--mask-truncated-completions")) {
    const auto stop = parse_token_ids("--eos-token-id", a.get("--eos-token-id"));
    truncated =
        mask_truncated_completions(lb.targets, lb.ids, b, t, lb.lengths, stop, lb.positions);
  }
  const token_batch batch = lb.view();
  const bool packed = !lb.positions.empty();
  check(parallel != "sequence" || !packed || objective == "sft", batch_file.source(),
        ": --parallel sequence with packed sequences (position_ids) runs --objective sft only "
        "for now (the ",
        objective,
        " statistics per packed document are not split over positions yet); use "
        "--parallel data or one process");

  // --parallel data: this rank's rows [r B / N, (r + 1) B / N) and their documents [d0, d1)
  // (packed rows hold several, the others one); dpo: the chosen rows [r Rc / N, (r + 1) Rc / N),
  // their pairs [d0, d1), then the rejected rows of those pairs, and the pairs renumbered over
  // the rank's rows. Empty in one process.
  const int ranks = comm.size(), me = comm.rank();
  std::vector<index_t> docs_before(static_cast<std::size_t>(b + 1), 0);  // documents in rows < r
  for (index_t r = 0; r < b; ++r) {
    index_t n = packed ? 0 : 1;
    if (packed)
      for (index_t k = 0; k < t; ++k) n += lb.positions[static_cast<std::size_t>(r * t + k)] == 0;
    docs_before[static_cast<std::size_t>(r + 1)] = docs_before[static_cast<std::size_t>(r)] + n;
  }
  std::vector<index_t> my_rows, my_chosen, my_rejected;
  index_t d0 = 0, d1 = 0;
  if (parallel == "data" && objective == "dpo") {
    const index_t p = lb.pairs(), rc = lb.chosen_rows;
    check(rc >= ranks, batch_file.source(), ": ", p, " pairs", packed ? " packed in " : "",
          packed ? std::to_string(rc) + " chosen rows" : "", " for ", ranks,
          " ranks (--parallel data needs at least one ", packed ? "chosen row" : "pair",
          " per rank)");
    const index_t c0 = rc * me / ranks, c1 = rc * (me + 1) / ranks;
    d0 = docs_before[static_cast<std::size_t>(c0)];
    d1 = docs_before[static_cast<std::size_t>(c1)];
    // the rejected rows that hold exactly the rejected documents p + d0 .. p + d1 - 1
    auto row_starting = [&](index_t doc) -> index_t {
      for (index_t j = rc; j <= b; ++j)
        if (docs_before[static_cast<std::size_t>(j)] == doc) return j;
      return -1;
    };
    const index_t j0 = row_starting(p + d0), j1 = row_starting(p + d1);
    check(j0 >= 0 && j1 >= 0, batch_file.source(), ": the rejected documents of pairs [", d0, ", ",
          d1, ") (rank ", me, "'s chosen rows [", c0, ", ", c1,
          ")) do not fill whole rejected rows, so --parallel data cannot give each rank whole "
          "pairs (pack the rejected documents in rows that break where the chosen rows do)");
    for (index_t r = c0; r < c1; ++r) my_rows.push_back(r);
    for (index_t r = j0; r < j1; ++r) my_rows.push_back(r);
    for (index_t i = 0; i < d1 - d0; ++i) {
      my_chosen.push_back(i);
      my_rejected.push_back(d1 - d0 + i);
    }
  } else if (parallel == "data") {
    check(b >= ranks, batch_file.source(), ": ", b, " rows for ", ranks,
          " ranks (--parallel data needs at least one row per rank)");
    const index_t r0 = b * me / ranks, r1 = b * (me + 1) / ranks;
    for (index_t r = r0; r < r1; ++r) my_rows.push_back(r);
    d0 = docs_before[static_cast<std::size_t>(r0)];
    d1 = docs_before[static_cast<std::size_t>(r1)];
  }
  std::vector<index_t> my_docs;  // this rank's documents (grpo: advantages; dpo: pairs)
  for (index_t i = d0; i < d1; ++i) my_docs.push_back(i);
  const std::vector<token_id> my_ids = take_rows(lb.ids, my_rows, t),
                              my_targets = take_rows(lb.targets, my_rows, t);
  const std::vector<index_t> my_lengths = take_rows(lb.lengths, my_rows, 1),
                             my_positions = take_rows(lb.positions, my_rows, t);
  const token_batch my_batch{
      static_cast<index_t>(my_rows.size()), t, my_ids, my_targets, my_lengths, my_positions};

  sequence_assignment assignment = sequence_assignment::zigzag;
  if (a.has("--assignment")) assignment = parse_sequence_assignment(a.get("--assignment"));
#if defined(TIGHTFIT_CLI_CUDA)
  double gpu_seconds = 0;  // --device cuda: forward + backward on the device, and its name
  std::string gpu_name;
#endif
  // The gradients of the whole batch: in one process, or over the ranks. whole: the objective
  // of the whole batch; mine: that of this rank's rows (data parallel); --device cuda: on the
  // GPU from the host model's weights, the gradients written back into the host model.
  auto gradients = [&](auto& whole, auto& mine) -> backward_result {
#if defined(TIGHTFIT_CLI_CUDA)
    if constexpr (std::is_same_v<T, float> && !distributed) {
      if (cuda) {
        // the host model's weights and gradient spans, in its parameter order
        cuda_grad_job job;
        job.config = cfg;
        job.dtype = dtype == "bf16" ? cuda_dtype::bf16 : cuda_dtype::f32;
        job.batch = batch;
        job.options = opt;
        auto& p = model.parameters();
        for (std::size_t i = 0; i < p.size(); ++i) {
          if (!p.has_grad(i)) p.allocate_grad(i);
          job.parameters.push_back({p.name(i), p.value(i), p.grad(i)});
        }
        const cuda_grad_result r = cuda_gradients(job, whole);
        for (std::size_t i = 0; i < p.size(); ++i)
          if (!job.parameters[i].computed) p.release_grad(i);
        gpu_seconds = r.seconds;
        gpu_name = r.device_name;
        return r.result;
      }
    }
#endif
    check(!cuda, "--device cuda: this tightfit was built without CUDA");
    if constexpr (distributed) {
      if (parallel == "sequence") {
        if constexpr (SequenceParallelLayer<Layer<backend>, backend>)
          return sequence_parallel_gradients(model, batch, whole, opt, comm, {assignment});
        else
          fail("--parallel sequence: the ", cfg.architecture,
               " layer does not offer the sequence-parallel extension yet");
      }
      if (parallel == "data") return data_parallel_gradients(model, my_batch, mine, opt, comm);
    }
    (void)mine;
    return compute_gradients(model, batch, whole, opt);
  };

  const auto start = std::chrono::steady_clock::now();
  backward_result result;
  if (objective == "sft") {
    sft_loss loss, mine;
    result = gradients(loss, mine);
  } else if (objective == "grpo") {
    // one advantage per completion: per row, or per document of a packed batch
    const auto adv = read_floats(batch_file, "advantages", lb.documents());
    std::vector<double> old, refp;
    if (batch_file.contains("old_logprobs"))
      old = shift_values(read_floats(batch_file, "old_logprobs", b * t), b, t);
    if (batch_file.contains("ref_logprobs"))
      refp = shift_values(read_floats(batch_file, "ref_logprobs", b * t), b, t);
    const grpo_options go = grpo_options_from(a);
    grpo_loss loss(adv, old, refp, go);
    const auto my_adv = take_rows(adv, my_docs, 1), my_old = take_rows(old, my_rows, t),
               my_ref = take_rows(refp, my_rows, t);
    // this rank's rows (data parallel only: in one process my_rows is empty)
    grpo_loss mine = parallel == "data" ? grpo_loss(my_adv, my_old, my_ref, go) : loss;
    result = gradients(loss, mine);
  } else if (objective == "dpo") {
    const index_t p = lb.pairs();
    const dpo_options dopt = dpo_options_from(a);
    // reference sums: required by sigmoid/ipo/hinge (read_floats names a missing one), used
    // by none of the reference-free losses (simpo, orpo), which accept them when both are given
    std::vector<double> ref_w, ref_l;
    if (needs_reference(dopt.loss) || batch_file.contains("ref_chosen_logps") ||
        batch_file.contains("ref_rejected_logps")) {
      ref_w = read_floats(batch_file, "ref_chosen_logps", p);
      ref_l = read_floats(batch_file, "ref_rejected_logps", p);
    }
    dpo_loss loss(lb.chosen, lb.rejected, ref_w, ref_l, dopt);
    const auto my_ref_w = take_rows(ref_w, my_docs, 1), my_ref_l = take_rows(ref_l, my_docs, 1);
    // this rank's pairs (data parallel; with sequence parallelism a rank may have none)
    dpo_loss mine =
        parallel == "data" ? dpo_loss(my_chosen, my_rejected, my_ref_w, my_ref_l, dopt) : loss;
    result = gradients(loss, mine);
  } else {
    throw usage_error{"--objective expects sft, grpo or dpo, got '" + objective + "'"};
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
#if defined(TIGHTFIT_CLI_CUDA)
  if (cuda) seconds = gpu_seconds;  // forward + backward on the device, without the copies
#endif
  // Non-finite policy: nothing non-finite is written.
  check(std::isfinite(result.loss), "step 1: the loss is ", result.loss,
        " (not finite); nothing written");
  check_finite_gradients(model.parameters(), "step 1");
  // the largest rank's peak (every rank takes part in the gather)
  const double peak = max_over_ranks(comm, static_cast<double>(result.peak_activation_bytes));
  if (me != 0) return 0;  // rank 0 alone prints and writes
  if (a.has("--out")) save_gradients(a.get("--out"), model.parameters());

  nlohmann::json out;
  out["loss"] = result.loss;
  out["objective"] = objective;
  out["schedule"] = to_string(opt.sched);
  out["chunk"] = result.chunk;
  out["keep_every"] = opt.keep_every;
  out["dtype"] = cuda ? dtype : sizeof(T) == 8 ? "f64" : "f32";
#if defined(TIGHTFIT_CLI_CUDA)
  if (cuda) {
    out["device"] = "cuda";
    out["device_name"] = gpu_name;
  }
#endif
  out["batch"] = b;
  out["seq_len"] = t;
  out["peak_activation_bytes"] = static_cast<std::size_t>(peak);
  if (!parallel.empty()) {
    out["parallel"] = parallel;
    out["ranks"] = ranks;
    if (parallel == "sequence") out["assignment"] = to_string(assignment);
  }
  out["peak_bytes"] = result.peak_bytes;
  out["seconds"] = seconds;
  out["forward_seconds"] = result.forward_seconds;
  if (a.has("--mask-truncated-completions")) out["truncated_completions"] = truncated;
  if (a.has("--out")) out["gradients"] = a.get("--out");
  std::printf("%s\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  return 0;
}

/// The layer of the config's architecture (nn/architectures.hpp).
template <class T, class Comm>
int run_grad(const arguments& a, Comm& comm) {
  const model_config cfg = load_hf_config(a.get("--model"));
  return with_config_layer(cfg, [&](auto layer) {
    return run_grad_with<T, decltype(layer)::template type>(a, cfg, comm);
  });
}

/// Every argument checked before any file is read or MPI starts (usage_error: exit 2).
void check_grad_arguments(const arguments& a) {
  if (!a.has("--model") || !a.has("--batch")) throw usage_error{"--model and --batch are required"};
  // names are argument errors (exit 2), checked before any file is read
  const std::string objective = a.get("--objective");
  const std::string device = a.get("--device");
  if (device != "cpu" && device != "cuda")
    throw usage_error{"--device expects cpu or cuda, got '" + device + "'"};
  const std::string dtype = a.get("--dtype");
  if (dtype != "f32" && dtype != "f64" && dtype != "bf16")
    throw usage_error{"--dtype expects f32, f64 (--device cpu) or bf16 (--device cuda), got '" +
                      dtype + "'"};
  if (device == "cpu" && dtype == "bf16")
    throw usage_error{"--dtype bf16 needs --device cuda (the CPU backends run f32 or f64)"};
  if (device == "cuda" && dtype == "f64")
    throw usage_error{"--dtype f64 is not available with --device cuda (f32 or bf16)"};
  if (device == "cuda" && a.has("--parallel"))
    throw usage_error{"--parallel " + a.get("--parallel") +
                      " runs on the CPU only; --device cuda runs one process on one GPU"};
  try {
    const auto sched = parse_backward_schedule(a.get("--sched"));
    if (a.has("--assignment")) parse_sequence_assignment(a.get("--assignment"));
    if (a.has("--parallel")) {
      const std::string parallel = a.get("--parallel");
      if (parallel != "data" && parallel != "sequence")
        throw usage_error{"--parallel expects data or sequence, got '" + parallel + "'"};
      if (parallel == "sequence" && sched == backward_schedule::full)
        throw usage_error{"--parallel sequence needs --sched stream or checkpoint"};
#if !defined(TIGHTFIT_HAS_MPI)
      throw usage_error{"--parallel " + parallel +
                        " needs MPI, and this tightfit was built without it (install OpenMPI, "
                        "e.g. scripts/deps --mpi, and rebuild)"};
#endif
    }
    if (a.has("--assignment") && a.get("--parallel", "") != "sequence")
      throw usage_error{"--assignment is for --parallel sequence"};
  } catch (const error& e) {
    throw usage_error{e.what()};
  }
  check_objective_arguments(a, objective);
  // every value is an argument error (exit 2) before any file is read
  if (a.get("--chunk") != "auto") (void)a.integer("--chunk", 1, max_count);
  if (a.has("--budget")) (void)parse_bytes("--budget", a.get("--budget"));
  (void)a.integer("--head-chunk", 0, max_count);
  (void)a.real("--temperature", 1e-6, 1e6);
  output_paths paths;
  paths.input(a.get("--model"));
  paths.input_file(a.get("--batch"));
  if (a.has("--out")) paths.output_file("--out", a.get("--out"), "model.safetensors");
}

}  // namespace

int grad(int argc, char** argv) {
  return with_arguments(grad_command(), argc, argv, [&](const arguments& a) {
    try {
      check_grad_arguments(a);
    } catch (const usage_error&) {
      if (launched_rank_above_0()) return 2;  // rank 0 prints it once
      throw;
    }
    const std::string dtype = a.get("--dtype");
    if (a.get("--device") == "cuda") {
#if defined(TIGHTFIT_CLI_CUDA)
      require_cuda_device(0);  // before any file is read
#else
                            fail("--device cuda: this tightfit was built without CUDA; "
                                 "rebuild it with -DTIGHTFIT_WITH_CUDA=ON (needs the CUDA "
                                 "toolkit: nvcc, cuBLAS)");
#endif
      self_communicator self;
      return run_grad<float>(a, self);  // bf16: float on the host
    }
    if (a.has("--parallel"))
      return run_under_mpi("grad", [&](auto& comm) {
        return dtype == "f64" ? run_grad<double>(a, comm) : run_grad<float>(a, comm);
      });
    self_communicator self;
    if (dtype == "f64") return run_grad<double>(a, self);
    return run_grad<float>(a, self);
  });
}

}  // namespace tightfit::cli
