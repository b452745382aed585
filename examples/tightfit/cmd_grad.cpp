// tightfit grad: loss and every parameter gradient of a Hugging Face checkpoint on a batch,
// under a StreamBP schedule. Prints one JSON line; writes the gradients (HF names) to --out.
// Under mpirun, --parallel data splits the batch's rows (DPO: its pairs) over the ranks and
// --parallel sequence the positions of every row (dist/sequence_parallel.hpp); the gradients
// are those of one process on the whole batch, and rank 0 alone prints and writes.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "args.hpp"
#include "checks.hpp"
#include "commands.hpp"
#include "tightfit/backend/eigen.hpp"
#include "tightfit/dist/data_parallel.hpp"
#include "tightfit/dist/self_communicator.hpp"
#include "tightfit/dist/sequence_parallel.hpp"
#include "tightfit/io/safetensors.hpp"
#include "tightfit/loss/dpo.hpp"
#include "tightfit/loss/grpo.hpp"
#include "tightfit/loss/sft.hpp"
#include "tightfit/nn/hf_model.hpp"
#include "tightfit/stream/backward.hpp"
#include "tightfit/stream/planner.hpp"
#if defined(TIGHTFIT_HAS_MPI)
#include "tightfit/dist/mpi_communicator.hpp"
#endif

namespace tightfit::cli {

namespace {

/// The largest count an option takes (chunk, head chunk rows, completion length): 2^40.
constexpr long long max_count = 1LL << 40;

constexpr const char* grad_usage =
    "usage: tightfit grad --model DIR --batch FILE [--objective sft|grpo|dpo]\n"
    "                     [--schedule full|checkpoint|stream] [--chunk N|auto] [--budget BYTES]\n"
    "                     [--dtype f32|f64] [--out FILE] [--head-chunk ROWS] [--temperature T]\n"
    "                     [--beta B] [--epsilon-low E] [--epsilon-high E] [--loss-type NAME]\n"
    "                     [--label-smoothing S] [--max-completion-length L]\n"
    "                     [--parallel data|sequence] [--assignment zigzag|contiguous]\n"
    "  The batch is a safetensors file in the Hugging Face convention (labels unshifted,\n"
    "  -100 ignored, right padding):\n"
    "    sft:  input_ids (B,T), labels (B,T), optional attention_mask (B,T) or lengths (B),\n"
    "          optional position_ids (B,T): packed documents, positions restarting at 0 at\n"
    "          each (Hugging Face padding-free layout; a document attends only to itself)\n"
    "    grpo: the same plus advantages (B), optional old_logprobs and ref_logprobs (B,T)\n"
    "          aligned with labels (entry t is the log-prob of labels[t])\n"
    "    dpo:  chosen_input_ids, chosen_labels, rejected_input_ids, rejected_labels (P,T),\n"
    "          optional chosen_attention_mask, rejected_attention_mask (P,T), and\n"
    "          ref_chosen_logps, ref_rejected_logps (P)\n"
    "  attention_mask holds 0 / 1 only; a label outside the mask is never supervised,\n"
    "  whatever its value. Any other tensor in the batch file is an error naming it.\n"
    "  Loss types: grpo|bnpo|dr_grpo (grpo), sigmoid|ipo|hinge (dpo). --chunk auto picks the\n"
    "  largest power-of-two chunk whose StreamBP peak fits --budget (default 4G), keeping only\n"
    "  every k-th layer input (the smallest k that fits) when all inputs do not fit.\n"
    "  Prints one JSON line: loss, schedule, chunk, peak_activation_bytes, seconds, ...\n"
    "  Under mpirun (needs MPI): --parallel data gives each rank a contiguous share of the rows\n"
    "  (dpo: of the pairs), --parallel sequence a share of every row's positions (zigzag\n"
    "  blocks by default, or contiguous; stream or checkpoint schedule); the gradients are those\n"
    "  of one process on the whole batch; rank 0 prints and writes --out, the others are\n"
    "  silent; peak_activation_bytes is the largest rank's.\n";

/// A (B, T) integer tensor of the batch file, or an error naming it.
struct int_matrix {
  index_t rows = 0, cols = 0;
  std::vector<std::int64_t> data;
};

int_matrix read_int_matrix(const safetensors_file& f, const std::string& name) {
  check(f.contains(name), f.source(), ": the batch has no tensor '", name, "'");
  const auto& info = f.info(name);
  check(info.shape.size() == 2, f.source(), ": tensor '", name, "' has ", info.shape.size(),
        " dimensions, expected 2 (B, T)");
  return {info.shape[0], info.shape[1], f.read_ints(name)};
}

std::vector<double> read_floats(const safetensors_file& f, const std::string& name,
                                index_t expected) {
  check(f.contains(name), f.source(), ": the batch has no tensor '", name, "'");
  auto v = f.template read<double>(name);
  check(static_cast<index_t>(v.size()) == expected, f.source(), ": tensor '", name, "' has ",
        v.size(), " elements, expected ", expected);
  return v;
}

/// Valid lengths from an attention mask (right padding only) or a lengths tensor.
std::vector<index_t> read_lengths(const safetensors_file& f, const std::string& mask_name,
                                  const std::string& lengths_name, index_t b, index_t t) {
  std::vector<index_t> lengths;
  if (f.contains(mask_name)) {
    const auto m = read_int_matrix(f, mask_name);
    check(m.rows == b && m.cols == t, f.source(), ": ", mask_name, " is (", m.rows, ", ", m.cols,
          "), expected (", b, ", ", t, ")");
    for (std::size_t i = 0; i < m.data.size(); ++i)
      check(m.data[i] == 0 || m.data[i] == 1, f.source(), ": ", mask_name, "[",
            static_cast<index_t>(i) / t, "][", static_cast<index_t>(i) % t, "] is ", m.data[i],
            ", expected 0 or 1");
    for (index_t r = 0; r < b; ++r) {
      index_t len = 0;
      while (len < t && m.data[static_cast<std::size_t>(r * t + len)] != 0) ++len;
      for (index_t p = len; p < t; ++p)
        check(m.data[static_cast<std::size_t>(r * t + p)] == 0, f.source(), ": ", mask_name,
              " row ", r, " is not right padding (a 1 at position ", p, " after a 0)");
      check(len >= 1, f.source(), ": ", mask_name, " row ", r, " has no valid position");
      lengths.push_back(len);
    }
  } else if (!lengths_name.empty() && f.contains(lengths_name)) {
    const auto l = f.read_ints(lengths_name);
    check(static_cast<index_t>(l.size()) == b, f.source(), ": ", lengths_name, " has ", l.size(),
          " entries, expected ", b);
    lengths.assign(l.begin(), l.end());
  }
  return lengths;
}

/// Every tensor of the batch file must be one the objective reads: an unknown key (a typo, or
/// a feature tightfit would silently ignore) is an error naming it.
void check_batch_keys(const safetensors_file& f, const std::string& objective) {
  std::vector<std::string> known;
  if (objective == "dpo")
    known = {"chosen_input_ids", "chosen_labels",         "rejected_input_ids",
             "rejected_labels",  "chosen_attention_mask", "rejected_attention_mask",
             "ref_chosen_logps", "ref_rejected_logps"};
  else
    known = {"input_ids", "labels", "attention_mask", "lengths", "position_ids"};
  if (objective == "grpo")
    for (const char* k : {"advantages", "old_logprobs", "ref_logprobs"}) known.push_back(k);
  for (const auto& t : f.tensors()) {
    if (std::find(known.begin(), known.end(), t.name) != known.end()) continue;
    std::string list;
    for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
    fail(f.source(), ": tensor '", t.name, "' is not used by --objective ", objective,
         " (expected: ", list, ")");
  }
}

/// Packed positions (B, T) from position_ids, or empty when the batch has none.
std::vector<index_t> read_positions(const safetensors_file& f, const std::string& objective,
                                    index_t b, index_t t) {
  if (!f.contains("position_ids")) return {};
  check(objective == "sft", f.source(), ": position_ids (packed sequences) work with --objective ",
        "sft only (the per-completion statistics of ", objective, " are per row)");
  const auto m = read_int_matrix(f, "position_ids");
  check(m.rows == b && m.cols == t, f.source(), ": position_ids is (", m.rows, ", ", m.cols,
        "), expected (", b, ", ", t, ") like input_ids");
  std::vector<index_t> pos(m.data.begin(), m.data.end());
  // sequence_batch::validate names the first bad entry (row, position, value)
  try {
    sequence_batch{b, t, {}, pos}.validate();
  } catch (const error& e) {
    fail(f.source(), ": ", e.what());
  }
  return pos;
}

/// Labels at positions outside the valid length of their row (attention_mask 0) set to
/// ignore_index: padding is never supervised, whatever label the file gives it.
void ignore_padding_labels(std::vector<token_id>& labels, const std::vector<index_t>& lengths,
                           index_t t) {
  for (std::size_t r = 0; r < lengths.size(); ++r)
    for (index_t p = std::max<index_t>(lengths[r], 0); p < t; ++p)
      labels[r * static_cast<std::size_t>(t) + static_cast<std::size_t>(p)] = ignore_index;
}

/// Per-token values aligned with labels (entry t belongs to labels[t]) to target alignment
/// (entry t belongs to the token predicted at position t, i.e. labels[t + 1]).
std::vector<double> shift_values(const std::vector<double>& v, index_t b, index_t t) {
  std::vector<double> out(v.size(), 0.0);
  for (index_t r = 0; r < b; ++r)
    for (index_t p = 0; p + 1 < t; ++p)
      out[static_cast<std::size_t>(r * t + p)] = v[static_cast<std::size_t>(r * t + p + 1)];
  return out;
}

/// The rows of `v` (rows of `width` values) listed in `rows`, in that order (empty stays empty).
template <class V>
std::vector<V> take_rows(const std::vector<V>& v, const std::vector<index_t>& rows, index_t width) {
  std::vector<V> out;
  if (v.empty()) return out;
  for (index_t r : rows) out.insert(out.end(), v.begin() + r * width, v.begin() + (r + 1) * width);
  return out;
}

template <class T, class Comm>
int run_grad(const arguments& a, Comm& comm) {
  constexpr bool distributed = !std::is_same_v<Comm, self_communicator>;
  const std::string parallel = a.get("--parallel", "");
  using backend = eigen_backend<T>;
  const std::filesystem::path model_dir = a.get("--model");
  const model_config cfg = load_hf_config(model_dir);
  // Sizes before allocation: config.json against the checkpoint, weights + gradients
  // against memory.
  check_model_fits(cfg, sizeof(T), 2, &model_dir);
  backend be;
  decoder_model<backend> model(be, cfg);
  load_hf_weights(model_dir, model.parameters());
  check_finite_weights(model.parameters(), model_dir.string());

  const auto batch_file = safetensors_file::open(a.get("--batch"));
  const std::string objective = a.get("--objective", "sft");
  check_batch_keys(batch_file, objective);
  index_t b = 0, t = 0;
  std::vector<token_id> ids, labels;
  std::vector<index_t> lengths;
  std::vector<index_t> chosen, rejected;
  std::vector<index_t> positions;
  if (objective == "dpo") {
    const auto ci = read_int_matrix(batch_file, "chosen_input_ids");
    const auto cl = read_int_matrix(batch_file, "chosen_labels");
    const auto ri = read_int_matrix(batch_file, "rejected_input_ids");
    const auto rl = read_int_matrix(batch_file, "rejected_labels");
    check(ci.rows == cl.rows && ci.cols == cl.cols && ri.rows == ci.rows && rl.rows == ci.rows &&
              ri.cols == ci.cols && rl.cols == ci.cols,
          batch_file.source(), ": chosen/rejected input_ids and labels must all be (P, T); got (",
          ci.rows, ", ", ci.cols, ") and (", ri.rows, ", ", ri.cols, ")");
    const index_t p = ci.rows;
    b = 2 * p;
    t = ci.cols;
    ids = ci.data;
    ids.insert(ids.end(), ri.data.begin(), ri.data.end());
    labels = cl.data;
    labels.insert(labels.end(), rl.data.begin(), rl.data.end());
    auto lc = read_lengths(batch_file, "chosen_attention_mask", "", p, t);
    auto lr = read_lengths(batch_file, "rejected_attention_mask", "", p, t);
    if (!lc.empty() || !lr.empty()) {
      if (lc.empty()) lc.assign(static_cast<std::size_t>(p), t);
      if (lr.empty()) lr.assign(static_cast<std::size_t>(p), t);
      lengths = lc;
      lengths.insert(lengths.end(), lr.begin(), lr.end());
      ignore_padding_labels(labels, lengths, t);
    }
    for (index_t i = 0; i < p; ++i) {
      chosen.push_back(i);
      rejected.push_back(p + i);
    }
  } else {
    const auto in = read_int_matrix(batch_file, "input_ids");
    const auto lab = read_int_matrix(batch_file, "labels");
    check(in.rows == lab.rows && in.cols == lab.cols, batch_file.source(), ": labels is (",
          lab.rows, ", ", lab.cols, "), expected (", in.rows, ", ", in.cols, ") like input_ids");
    b = in.rows;
    t = in.cols;
    ids = in.data;
    labels = lab.data;
    lengths = read_lengths(batch_file, "attention_mask", "lengths", b, t);
    if (!lengths.empty()) {
      for (std::size_t r = 0; r < lengths.size(); ++r)
        check(lengths[r] >= 1 && lengths[r] <= t, batch_file.source(), ": lengths[", r, "] is ",
              lengths[r], ", expected a length in [1, ", t, "]");
      ignore_padding_labels(labels, lengths, t);
    }
    positions = read_positions(batch_file, objective, b, t);
  }
  const std::vector<token_id> targets = shift_labels(labels, b, t);
  const token_batch batch{b, t, ids, targets, lengths, positions};

  // --parallel data: this rank's rows [r B / N, (r + 1) B / N) (dpo: its pairs' chosen rows,
  // then their rejected rows), and the pairs renumbered over them.
  const int ranks = comm.size(), me = comm.rank();
  std::vector<index_t> my_rows, my_chosen, my_rejected;
  if (objective == "dpo") {
    const auto p = static_cast<index_t>(chosen.size());
    const index_t p0 = p * me / ranks, p1 = p * (me + 1) / ranks;
    if (parallel == "data")
      check(p >= ranks, batch_file.source(), ": ", p, " pairs for ", ranks,
            " ranks (--parallel data needs at least one pair per rank)");
    for (index_t i = p0; i < p1; ++i) my_rows.push_back(i);
    for (index_t i = p0; i < p1; ++i) my_rows.push_back(p + i);
    for (index_t i = 0; i < p1 - p0; ++i) {
      my_chosen.push_back(i);
      my_rejected.push_back(p1 - p0 + i);
    }
  } else {
    if (parallel == "data")
      check(b >= ranks, batch_file.source(), ": ", b, " rows for ", ranks,
            " ranks (--parallel data needs at least one row per rank)");
    for (index_t r = b * me / ranks; r < b * (me + 1) / ranks; ++r) my_rows.push_back(r);
  }
  const std::vector<token_id> my_ids = take_rows(ids, my_rows, t),
                              my_targets = take_rows(targets, my_rows, t);
  const std::vector<index_t> my_lengths = take_rows(lengths, my_rows, 1),
                             my_positions = take_rows(positions, my_rows, t);
  const token_batch my_batch{
      static_cast<index_t>(my_rows.size()), t, my_ids, my_targets, my_lengths, my_positions};

  backward_options opt;
  opt.sched = parse_backward_schedule(a.get("--schedule", "stream"));
  opt.temperature = a.real("--temperature", 1.0, 1e-6, 1e6);
  opt.head_chunk_rows = a.integer("--head-chunk", 0, 0, max_count);
  if (a.get("--chunk", "512") == "auto") {
    const std::size_t budget = parse_bytes("--budget", a.get("--budget", "4G"));
    const auto plan = plan_memory<T>(cfg, b, t, budget, sft_loss{}, 0, t);
    check(plan.chunk >= 1, "--chunk auto: even chunk 1 needs more than the budget of ", budget,
          " bytes at T = ", t);
    opt.chunk = plan.chunk;
    // > 1 when only layer-input spacing fits the budget (full keeps every activation anyway)
    if (opt.sched != backward_schedule::full) opt.keep_every = plan.keep_every;
  } else {
    opt.chunk = a.integer("--chunk", 512, 1, max_count);
  }
  check_activations_fit<T>(batch_file.source(), false, cfg, b, t, opt);

  sequence_assignment assignment = sequence_assignment::zigzag;
  if (a.has("--assignment")) assignment = parse_sequence_assignment(a.get("--assignment"));
  // The gradients of the whole batch: in one process, or over the ranks. whole: the objective
  // of the whole batch; mine: that of this rank's rows (data parallel).
  auto gradients = [&](auto& whole, auto& mine) -> backward_result {
    if constexpr (distributed) {
      if (parallel == "sequence")
        return sequence_parallel_gradients(model, batch, whole, opt, comm, {assignment});
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
    const auto adv = read_floats(batch_file, "advantages", b);
    std::vector<double> old, refp;
    if (batch_file.contains("old_logprobs"))
      old = shift_values(read_floats(batch_file, "old_logprobs", b * t), b, t);
    if (batch_file.contains("ref_logprobs"))
      refp = shift_values(read_floats(batch_file, "ref_logprobs", b * t), b, t);
    grpo_options go;
    go.beta = a.real("--beta", 0.0, 0, 1e6);
    go.epsilon_low = a.real("--epsilon-low", 0.2, 0, 1e6);
    go.epsilon_high = a.real("--epsilon-high", go.epsilon_low, 0, 1e6);
    go.aggregation = parse_grpo_aggregation(a.get("--loss-type", "grpo"));
    go.max_completion_length = a.integer("--max-completion-length", 0, 0, max_count);
    grpo_loss loss(adv, old, refp, go);
    const auto my_adv = take_rows(adv, my_rows, 1), my_old = take_rows(old, my_rows, t),
               my_ref = take_rows(refp, my_rows, t);
    grpo_loss mine(my_adv, my_old, my_ref, go);
    result = gradients(loss, mine);
  } else if (objective == "dpo") {
    const auto p = static_cast<index_t>(chosen.size());
    const auto ref_w = read_floats(batch_file, "ref_chosen_logps", p);
    const auto ref_l = read_floats(batch_file, "ref_rejected_logps", p);
    dpo_options dopt;
    dopt.beta = a.real("--beta", 0.1, 0, 1e6);
    dopt.label_smoothing = a.real("--label-smoothing", 0.0, 0, 1);
    dopt.loss = parse_dpo_loss_type(a.get("--loss-type", "sigmoid"));
    dpo_loss loss(chosen, rejected, ref_w, ref_l, dopt);
    std::vector<index_t> my_pairs;
    for (index_t i = p * me / ranks; i < p * (me + 1) / ranks; ++i) my_pairs.push_back(i);
    const auto my_ref_w = take_rows(ref_w, my_pairs, 1), my_ref_l = take_rows(ref_l, my_pairs, 1);
    // this rank's pairs (data parallel; with sequence parallelism a rank may have none)
    dpo_loss mine =
        parallel == "data" ? dpo_loss(my_chosen, my_rejected, my_ref_w, my_ref_l, dopt) : loss;
    result = gradients(loss, mine);
  } else {
    throw usage_error{"--objective expects sft, grpo or dpo, got '" + objective + "'"};
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // Non-finite policy: nothing non-finite is written.
  check(std::isfinite(result.loss), "step 1: the loss is ", result.loss,
        " (not finite); nothing written");
  check_finite_gradients(model.parameters(), "step 1");
  // the largest rank's peak (every rank takes part in the gather)
  double peak = static_cast<double>(result.peak_activation_bytes);
  std::vector<double> peaks(static_cast<std::size_t>(ranks));
  comm.all_gather(std::span<const double>(&peak, 1), std::span<double>(peaks));
  peak = *std::max_element(peaks.begin(), peaks.end());
  if (me != 0) return 0;  // rank 0 alone prints and writes
  if (a.has("--out")) save_gradients(a.get("--out"), model.parameters());

  nlohmann::json out;
  out["loss"] = result.loss;
  out["objective"] = objective;
  out["schedule"] = to_string(opt.sched);
  out["chunk"] = result.chunk;
  out["keep_every"] = opt.keep_every;
  out["dtype"] = sizeof(T) == 8 ? "f64" : "f32";
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
  if (a.has("--out")) out["gradients"] = a.get("--out");
  std::printf("%s\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  return 0;
}

/// Every argument checked before any file is read or MPI starts (usage_error: exit 2).
void check_grad_arguments(const arguments& a) {
  if (!a.has("--model") || !a.has("--batch")) throw usage_error{"--model and --batch are required"};
  // names are argument errors (exit 2), checked before any file is read
  const std::string objective = a.get("--objective", "sft");
  if (objective != "sft" && objective != "grpo" && objective != "dpo")
    throw usage_error{"--objective expects sft, grpo or dpo, got '" + objective + "'"};
  const std::string dtype = a.get("--dtype", "f32");
  if (dtype != "f32" && dtype != "f64")
    throw usage_error{"--dtype expects f32 or f64, got '" + dtype + "'"};
  try {
    const auto sched = parse_backward_schedule(a.get("--schedule", "stream"));
    if (a.has("--loss-type")) {
      if (objective == "grpo") parse_grpo_aggregation(a.get("--loss-type"));
      if (objective == "dpo") parse_dpo_loss_type(a.get("--loss-type"));
    }
    if (a.has("--assignment")) parse_sequence_assignment(a.get("--assignment"));
    if (a.has("--parallel")) {
      const std::string parallel = a.get("--parallel");
      if (parallel != "data" && parallel != "sequence")
        throw usage_error{"--parallel expects data or sequence, got '" + parallel + "'"};
      if (parallel == "sequence" && sched == backward_schedule::full)
        throw usage_error{"--parallel sequence needs --schedule stream or checkpoint"};
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
  // every value is an argument error (exit 2) before any file is read
  if (a.get("--chunk", "512") != "auto") (void)a.integer("--chunk", 512, 1, max_count);
  if (a.has("--budget")) (void)parse_bytes("--budget", a.get("--budget"));
  (void)a.integer("--head-chunk", 0, 0, max_count);
  (void)a.integer("--max-completion-length", 0, 0, max_count);
  (void)a.real("--temperature", 1.0, 1e-6, 1e6);
  for (const char* k : {"--beta", "--epsilon-low", "--epsilon-high"}) (void)a.real(k, 0.0, 0, 1e6);
  (void)a.real("--label-smoothing", 0.0, 0, 1);
  path_guard paths;
  paths.input(a.get("--model"));
  paths.input(a.get("--batch"));
  if (a.has("--out")) paths.output_file("--out", a.get("--out"), "model.safetensors");
}

/// --parallel: MPI initialised here, every rank runs run_grad; a rank that fails reports and
/// ends the whole job (MPI_Abort), since the others may be waiting in a collective.
int run_parallel([[maybe_unused]] const arguments& a,
                 [[maybe_unused]] const std::string& dtype) {  // unused without MPI
#if defined(TIGHTFIT_HAS_MPI)
  mpi_environment env;
  mpi_communicator comm;
  int code = 1;
  std::string message;
  try {
    return dtype == "f64" ? run_grad<double>(a, comm) : run_grad<float>(a, comm);
  } catch (const usage_error& e) {
    code = 2;
    message = e.message;
  } catch (const std::exception& e) {
    message = e.what();
  }
  if (comm.rank() == 0)
    std::fprintf(stderr, "tightfit grad: %s\n", message.c_str());
  else
    std::fprintf(stderr, "tightfit grad: rank %d of %d: %s\n", comm.rank(), comm.size(),
                 message.c_str());
  std::fflush(stderr);
  if (comm.size() > 1) comm.abort(code);
  return code;
#else
  fail("--parallel needs MPI, and this tightfit was built without it");
#endif
}

}  // namespace

int grad(int argc, char** argv) {
  return with_arguments(
      argc, argv,
      {"--model", "--batch", "--objective", "--schedule", "--chunk", "--budget", "--dtype", "--out",
       "--head-chunk", "--temperature", "--beta", "--epsilon-low", "--epsilon-high", "--loss-type",
       "--label-smoothing", "--max-completion-length", "--parallel", "--assignment"},
      {}, grad_usage, [&](const arguments& a) {
        try {
          check_grad_arguments(a);
        } catch (const usage_error&) {
          if (launched_rank_above_0()) return 2;  // rank 0 prints it once
          throw;
        }
        const std::string dtype = a.get("--dtype", "f32");
        if (a.has("--parallel")) return run_parallel(a, dtype);
        self_communicator self;
        if (dtype == "f64") return run_grad<double>(a, self);
        return run_grad<float>(a, self);
      });
}

}  // namespace tightfit::cli
