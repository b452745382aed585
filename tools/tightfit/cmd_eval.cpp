// tightfit eval: a Hugging Face checkpoint evaluated forward only with the streaming head
// (evaluation.hpp): the loss and per-token perplexity on a token data set (train's --data
// layout), or the DPO loss and TRL's reward metrics on preference pairs.
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "args.hpp"
#include "checks.hpp"
#include "commands.hpp"
#include "evaluation.hpp"
#include "layer_progress.hpp"
#include "objective_args.hpp"
#include "output_paths.hpp"
#include "tightfit/backend/eigen.hpp"
#include "tightfit/io/token_file.hpp"
#include "tightfit/nn/architectures.hpp"
#include "tightfit/nn/hf_model.hpp"
#include "tightfit/nn/model.hpp"

namespace tightfit::cli {

namespace {

constexpr long long max_count = 1LL << 40;

}  // namespace

/// eval's options (args.hpp).
const command_spec& eval_command() {
  static const command_spec spec = [] {
    command_spec c;
    c.name = "eval";
    c.synopsis = "--model DIR --data FILE [options]";
    c.options = {
        {"--model", "DIR", "the model evaluated"},
        {"--data", "FILE",
         "sft: train's token data set, input_ids (N, T), optional labels and position_ids; dpo: "
         "train's pairs with ref_chosen_logps / ref_rejected_logps (tightfit logprobs writes "
         "them; simpo and orpo need none)"},
        {"--objective", "NAME", "sft or dpo", "sft"},
        {"--batch", "ROWS", "rows (dpo: pairs) per forward", "1"},
        {"--chunk", "N", "positions per chunk of the layer-by-layer forward", "512"},
        {"--dtype", "NAME", "f32 or f64", "f32"},
    };
    for (const auto& o : objective_options()) c.options.push_back(o);
    c.notes =
        "sft: the mean negative log-likelihood of the data set's counted labels (the loss of\n"
        "SFT) and the per-token perplexity exp(loss). dpo: the loss of --loss-type over every\n"
        "pair and, with a reference (sigmoid, ipo, hinge), TRL's reward metrics. Forward only,\n"
        "with a streaming head. Prints one JSON line: loss, perplexity, tokens, rows (dpo: loss,\n"
        "pairs, rewards_chosen, rewards_rejected, rewards_accuracy, rewards_margin), seconds.\n";
    return c;
  }();
  return spec;
}

namespace {

/// The evaluation of `a` on the config's model: --data read for the objective (sft: a token
/// data set; dpo: pairs with their reference sums), sizes checked, the model loaded, one JSON line.
template <class T, template <class> class Layer>
int run_eval(const arguments& a, const model_config& cfg) {
  using backend = eigen_backend<T>;
  const std::filesystem::path model_dir = a.get("--model");
  check_model_fits(cfg, sizeof(T), 1, &model_dir);  // weights only
  const std::string path = a.get("--data"), objective = a.get("--objective");
  const training_data data = read_training_data(path, objective, a, {});
  data.rows.validate(cfg.vocab_size);
  check(!needs_references(data, a), path, ": --loss-type ", a.get("--loss-type", "sigmoid"),
        " needs the reference sums ref_chosen_logps and ref_rejected_logps; ",
        "add them with tightfit logprobs --model REFERENCE (simpo and orpo need none)");
  forward_options fo;
  fo.chunk = a.integer("--chunk", 1, max_count);
  const index_t per_pass = a.integer("--batch", 1, max_count);  // rows, dpo: pairs
  backward_options bo;  // the backward's bound is an upper bound of the forward's
  bo.sched = backward_schedule::stream;
  bo.chunk = fo.chunk;
  check_activations_fit<T>("--batch " + std::to_string(per_pass), true, cfg,
                           std::min(per_pass * data.unit(), data.rows.rows()), data.rows.seq_len(),
                           bo);
  backend be;
  decoder_model<backend, Layer<backend>> model(be, cfg);
  load_hf_weights(model_dir, model.parameters());
  check_finite_weights(model.parameters(), model_dir.string());
  layer_progress progress("eval", cfg.num_hidden_layers);
  fo.between_layers = [&progress] { progress(); };
  nlohmann::ordered_json out;
  if (objective == "dpo") {
    const dpo_eval_result r = evaluate_dpo(model, data, per_pass, fo, dpo_options_from(a));
    for (const auto& [name, v] : dpo_eval_fields(r, "")) out[name] = v;
  } else {
    const eval_result r = evaluate(model, data.rows, per_pass, fo);
    out["loss"] = r.loss;
    out["perplexity"] = r.perplexity;
    out["tokens"] = r.tokens;
    out["rows"] = data.rows.rows();
    out["seconds"] = r.seconds;
  }
  out["dtype"] = sizeof(T) == 8 ? "f64" : "f32";
  std::printf("%s\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  return 0;
}

template <class T>
int run_eval_of_config(const arguments& a) {
  const model_config cfg = load_hf_config(a.get("--model"));
  return with_config_layer(
      cfg, [&](auto layer) { return run_eval<T, decltype(layer)::template type>(a, cfg); });
}

}  // namespace

int eval(int argc, char** argv) {
  return with_arguments(eval_command(), argc, argv, [](const arguments& a) {
    if (!a.has("--model") || !a.has("--data")) throw usage_error{"--model and --data are required"};
    const std::string objective = a.get("--objective");
    if (objective == "grpo")
      throw usage_error{
          "--objective grpo: offline GRPO's loss at the ratio 1 is -mean(A) whatever the policy; "
          "eval takes sft or dpo"};
    check_objective_arguments(a, objective);
    (void)a.integer("--chunk", 1, max_count);
    (void)a.integer("--batch", 1, max_count);
    const std::string dtype = a.get("--dtype");
    if (dtype != "f32" && dtype != "f64")
      throw usage_error{"--dtype expects f32 or f64, got '" + dtype + "'"};
    output_paths paths;  // nothing written; the inputs named
    paths.input(a.get("--model"));
    paths.input_file(a.get("--data"));
    if (dtype == "f64") return run_eval_of_config<double>(a);
    return run_eval_of_config<float>(a);
  });
}

}  // namespace tightfit::cli
