// tightfit eval: the loss and per-token perplexity of a Hugging Face checkpoint on a token data
// set (train's --data layout), forward only with the streaming head (evaluation.hpp).
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "args.hpp"
#include "checks.hpp"
#include "commands.hpp"
#include "evaluation.hpp"
#include "layer_progress.hpp"
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
         "train's token data set: input_ids (N, T), optional labels and position_ids"},
        {"--batch", "ROWS", "rows per forward", "1"},
        {"--chunk", "N", "positions per chunk of the layer-by-layer forward", "512"},
        {"--dtype", "NAME", "f32 or f64", "f32"},
    };
    c.notes =
        "The mean negative log-likelihood of the data set's counted labels (the loss of SFT) and\n"
        "the per-token perplexity exp(loss), forward only, with a streaming head.\n"
        "Prints one JSON line: loss, perplexity, tokens, rows, seconds.\n";
    return c;
  }();
  return spec;
}

namespace {

template <class T, template <class> class Layer>
int run_eval(const arguments& a, const model_config& cfg) {
  using backend = eigen_backend<T>;
  const std::filesystem::path model_dir = a.get("--model");
  check_model_fits(cfg, sizeof(T), 1, &model_dir);  // weights only
  const std::string path = a.get("--data");
  check_token_table_fits(path);
  auto table = read_token_table(path);
  const token_dataset data(table.rows, table.seq_len, std::move(table.input_ids),
                           std::move(table.labels), std::move(table.position_ids));
  data.validate(cfg.vocab_size);
  forward_options fo;
  fo.chunk = a.integer("--chunk", 1, max_count);
  const index_t rows = a.integer("--batch", 1, max_count);
  backward_options bo;  // the backward's bound is an upper bound of the forward's
  bo.sched = backward_schedule::stream;
  bo.chunk = fo.chunk;
  check_activations_fit<T>("--batch " + std::to_string(rows), true, cfg,
                           std::min(rows, data.rows()), data.seq_len(), bo);
  backend be;
  decoder_model<backend, Layer<backend>> model(be, cfg);
  load_hf_weights(model_dir, model.parameters());
  check_finite_weights(model.parameters(), model_dir.string());
  layer_progress progress("eval", cfg.num_hidden_layers);
  fo.between_layers = [&progress] { progress(); };
  const eval_result r = evaluate(model, data, rows, fo);
  nlohmann::json out;
  out["loss"] = r.loss;
  out["perplexity"] = r.perplexity;
  out["tokens"] = r.tokens;
  out["rows"] = data.rows();
  out["seconds"] = r.seconds;
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
