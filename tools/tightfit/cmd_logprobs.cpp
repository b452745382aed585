// tightfit logprobs: forward-only per-token log-probs of a batch's labels under a Hugging Face
// checkpoint (a reference or rollout policy), with the streaming head (the (B, T, V) logits are
// never materialised). Writes the batch again with the keys `tightfit grad` reads them from
// (GRPO ref_logprobs / old_logprobs, DPO ref_chosen_logps / ref_rejected_logps), so its output
// is a --batch for grad without renaming. Prints one JSON line with the peak memory.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "args.hpp"
#include "batch_file.hpp"
#include "checks.hpp"
#include "commands.hpp"
#include "layer_progress.hpp"
#include "output_paths.hpp"
#include "tightfit/backend/eigen.hpp"
#include "tightfit/io/safetensors.hpp"
#include "tightfit/nn/architectures.hpp"
#include "tightfit/nn/hf_model.hpp"
#include "tightfit/nn/model.hpp"
#include "tightfit/stream/forward.hpp"

namespace tightfit::cli {

namespace {

constexpr long long max_count = 1LL << 40;

}  // namespace

/// logprobs' options (args.hpp).
const command_spec& logprobs_command() {
  static const command_spec spec = [] {
    command_spec c;
    c.name = "logprobs";
    c.synopsis = "--model DIR --batch FILE --out FILE [--objective grpo|dpo] [options]";
    c.options = {
        {"--model", "DIR",
         "the model whose log-probs are taken (a reference, or the rollout policy)"},
        {"--batch", "FILE", "grad's batch file (tightfit grad --help)"},
        {"--out", "FILE",
         "the batch's tensors plus the log-probs (a key already there is replaced)"},
        {"--objective", "NAME", "grpo or dpo (default: dpo when the batch holds chosen_input_ids)"},
        {"--as", "NAME", "grpo: ref writes ref_logprobs, old writes old_logprobs", "ref"},
        {"--dtype", "NAME", "f32 or f64", "f32"},
        {"--chunk", "N", "positions per chunk of the layer-by-layer forward", "512"},
        {"--head-chunk", "ROWS", "rows of the streaming LM head per step (0: the chunk's)", "0"},
        {"--temperature", "T", "the logits are divided by T before the softmax", "1"},
    };
    c.notes =
        "Forward-only label log-probs of the batch, layer by layer in chunks and a streaming head\n"
        "(no (B,T,V) logits). --out gets:\n"
        "  grpo: ref_logprobs (B,T), or old_logprobs with --as old: entry t is the log-prob of\n"
        "        labels[t] (0 where nothing is predicted), at --temperature\n"
        "  dpo:  ref_chosen_logps, ref_rejected_logps (P): the sums over each completion's\n"
        "        counted labels (one per document when packed)\n"
        "so that `tightfit grad --batch OUT` reads them.\n"
        "Prints one JSON line: keys, peak_activation_bytes, peak_bytes, seconds, ...\n";
    return c;
  }();
  return spec;
}

namespace {

/// Copies every tensor of `f` but `skip` into `w`, keeping integer and float dtypes.
void copy_tensors(const safetensors_file& f, safetensors_writer& w,
                  const std::vector<std::string>& skip) {
  for (const auto& info : f.tensors()) {
    if (std::find(skip.begin(), skip.end(), info.name) != skip.end()) continue;
    const bool floating = info.type == dtype::f64 || info.type == dtype::f32 ||
                          info.type == dtype::bf16 || info.type == dtype::f16;
    if (floating) {
      const auto v = f.read<double>(info.name);
      check_finite_values(f, info.name, v);  // nothing non-finite is written
      w.add(info.name, info.shape, std::span<const double>(v), info.type);
    } else {
      const auto v = f.read_ints(info.name);
      w.add(info.name, info.shape, std::span<const std::int64_t>(v),
            info.type == dtype::i32 ? dtype::i32 : dtype::i64);
    }
  }
}

template <class T, template <class> class Layer>
int run_logprobs_with(const arguments& a, const std::string& objective, const model_config& cfg) {
  using backend = eigen_backend<T>;
  const std::filesystem::path model_dir = a.get("--model");
  check_model_fits(cfg, sizeof(T), 1, &model_dir);  // weights only: no gradients
  // the batch's tokens and activations from its header, before the model or the batch is read
  const auto batch_file = safetensors_file::open(a.get("--batch"));
  check_batch_keys(batch_file, objective);
  forward_options fo;
  fo.chunk = a.integer("--chunk", 1, max_count);
  fo.head_chunk_rows = a.integer("--head-chunk", 0, max_count);
  fo.temperature = a.real("--temperature", 1e-6, 1e6);
  layer_progress progress("logprobs", cfg.num_hidden_layers);  // long runs, on a terminal
  fo.between_layers = [&progress] { progress(); };
  backward_options bo;  // the backward's bound is an upper bound of the forward's
  bo.sched = backward_schedule::stream;
  bo.chunk = fo.chunk;
  const auto [hb, ht] = batch_extents(batch_file, objective);
  if (hb > 0 && ht > 0)
    check_activations_fit<T>(batch_file.source(), false, cfg, hb, ht, bo,
                             batch_host_bytes_per_token);

  backend be;
  decoder_model<backend, Layer<backend>> model(be, cfg);
  load_hf_weights(model_dir, model.parameters());
  check_finite_weights(model.parameters(), model_dir.string());
  const loaded_batch lb = read_batch(batch_file, objective);
  check_activations_fit<T>(batch_file.source(), false, cfg, lb.b, lb.t, bo,
                           batch_host_bytes_per_token);

  const auto start = std::chrono::steady_clock::now();
  std::vector<double> lp;  // (B*T) target-aligned
  std::size_t peak_activation = 0, peak = 0;
  {
    peak_scope scope(be.memory());
    lp = model_logprobs(model, lb.view(), fo);
    peak_activation = scope.peak_above_entry();
    peak = scope.peak_bytes();
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (std::size_t i = 0; i < lp.size(); ++i)
    check(std::isfinite(lp[i]), "the log-prob of row ", static_cast<index_t>(i) / lb.t,
          ", position ", static_cast<index_t>(i) % lb.t, " is ", lp[i],
          " (not finite); nothing written");

  safetensors_writer w;
  std::vector<std::string> keys;
  if (objective == "grpo") {
    keys = {a.get("--as") == "old" ? "old_logprobs" : "ref_logprobs"};
    copy_tensors(batch_file, w, keys);
    const auto v = unshift_values(lp, lb.b, lb.t);  // label-aligned (B, T)
    w.add(keys[0], {lb.b, lb.t}, std::span<const double>(v), dtype::f64);
  } else {
    keys = {"ref_chosen_logps", "ref_rejected_logps"};
    copy_tensors(batch_file, w, keys);
    // per sequence (row or document): the sums dpo_loss compares with the policy's
    const std::vector<index_t> documents = document_ids(lb.positions);
    std::vector<double> sums(static_cast<std::size_t>(2 * lb.pairs()), 0.0);
    for (std::size_t r = 0; r < lp.size(); ++r)
      sums[static_cast<std::size_t>(documents.empty() ? static_cast<index_t>(r) / lb.t
                                                      : documents[r])] += lp[r];
    const auto p = static_cast<std::size_t>(lb.pairs());
    const std::vector<double> cw(sums.begin(), sums.begin() + static_cast<std::ptrdiff_t>(p)),
        cl(sums.begin() + static_cast<std::ptrdiff_t>(p), sums.end());
    w.add(keys[0], {lb.pairs()}, std::span<const double>(cw), dtype::f64);
    w.add(keys[1], {lb.pairs()}, std::span<const double>(cl), dtype::f64);
  }
  w.write(a.get("--out"));

  nlohmann::json out;
  out["objective"] = objective;
  out["keys"] = keys;
  out["dtype"] = sizeof(T) == 8 ? "f64" : "f32";
  out["batch"] = lb.b;
  out["seq_len"] = lb.t;
  out["chunk"] = fo.chunk;
  out["peak_activation_bytes"] = peak_activation;
  out["peak_bytes"] = peak;
  out["seconds"] = seconds;
  out["out"] = a.get("--out");
  std::printf("%s\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  return 0;
}

/// The layer of the config's architecture (nn/architectures.hpp).
template <class T>
int run_logprobs(const arguments& a, const std::string& objective) {
  const model_config cfg = load_hf_config(a.get("--model"));
  return with_config_layer(cfg, [&](auto layer) {
    return run_logprobs_with<T, decltype(layer)::template type>(a, objective, cfg);
  });
}

}  // namespace

int logprobs(int argc, char** argv) {
  return with_arguments(logprobs_command(), argc, argv, [](const arguments& a) {
    if (!a.has("--model") || !a.has("--batch") || !a.has("--out"))
      throw usage_error{"--model, --batch and --out are required"};
    std::string objective = a.get("--objective", "");
    if (!objective.empty() && objective != "grpo" && objective != "dpo")
      throw usage_error{"--objective expects grpo or dpo, got '" + objective + "'"};
    const std::string as = a.get("--as");
    if (as != "ref" && as != "old") throw usage_error{"--as expects ref or old, got '" + as + "'"};

    (void)a.integer("--chunk", 1, max_count);
    (void)a.integer("--head-chunk", 0, max_count);
    (void)a.real("--temperature", 1e-6, 1e6);
    const std::string dtype = a.get("--dtype");
    if (dtype != "f32" && dtype != "f64")
      throw usage_error{"--dtype expects f32 or f64, got '" + dtype + "'"};
    output_paths paths;
    paths.input(a.get("--model"));
    paths.input_file(a.get("--batch"));
    paths.output_file("--out", a.get("--out"));
    if (objective.empty())
      objective =
          safetensors_file::open(a.get("--batch")).contains("chosen_input_ids") ? "dpo" : "grpo";
    // --as names which GRPO key is written; a DPO batch (given or found) has none
    if (a.has("--as") && objective == "dpo")
      throw usage_error{
          "--as applies to --objective grpo, not dpo (a dpo batch, one with "
          "chosen_input_ids, gets ref_chosen_logps and ref_rejected_logps)"};
    if (dtype == "f64") return run_logprobs<double>(a, objective);
    return run_logprobs<float>(a, objective);
  });
}

}  // namespace tightfit::cli
