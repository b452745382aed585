// tightfit plan: the memory planner (stream/planner.hpp) for a model and a byte budget.
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>

#include "args.hpp"
#include "checks.hpp"
#include "commands.hpp"
#include "tightfit/loss/sft.hpp"
#include "tightfit/nn/hf_model.hpp"
#include "tightfit/nn/presets.hpp"
#include "tightfit/stream/planner.hpp"

namespace tightfit::cli {

namespace {}  // namespace

/// plan's options (args.hpp).
const command_spec& plan_command() {
  static const command_spec spec = [] {
    command_spec c;
    c.name = "plan";
    c.synopsis = "(--model DIR | --preset NAME) --seq T --budget BYTES [options]";
    c.options = {
        {"--model", "DIR", "a Hugging Face model folder (its config.json)"},
        {"--preset", "NAME",
         "qwen3-bench, small, qwen3-0.6b, qwen3-4b, qwen3-8b, qwen2.5-0.5b, qwen2.5-7b, "
         "llama3-8b, llama3.1-8b or gemma3-4b"},
        {"--seq", "T", "the sequence length planned for"},
        {"--budget", "BYTES", "the activation budget (K, M, G, T: powers of 1024; below 2^64)"},
        {"--batch", "B", "rows", "1"},
        {"--dtype", "NAME", "f32 or f64", "f32"},
        {"--chunk", "N", "the chunk of the longest-T search", "512"},
        {"--max-seq", "N", "the longest T searched", "4194304"},
    };
    c.notes =
        "Prints the largest power-of-two chunk whose StreamBP peak fits at T, and the largest T\n"
        "each schedule reaches within the budget (activation bytes: parameters and gradients\n"
        "not included).\n";
    return c;
  }();
  return spec;
}

namespace {

template <class T>
int run_plan(const model_config& cfg, index_t batch, index_t seq, std::size_t budget, index_t chunk,
             index_t max_seq, const char* dtype) {
  const auto p = plan_memory<T>(cfg, batch, seq, budget, sft_loss{}, chunk, max_seq);
  std::printf("model: %s d=%lld L=%lld H=%lld/%lld hd=%lld f=%lld V=%lld, %s, B=%lld\n",
              cfg.architecture.c_str(), static_cast<long long>(cfg.hidden_size),
              static_cast<long long>(cfg.num_hidden_layers),
              static_cast<long long>(cfg.num_attention_heads),
              static_cast<long long>(cfg.num_key_value_heads), static_cast<long long>(cfg.head_dim),
              static_cast<long long>(cfg.intermediate_size), static_cast<long long>(cfg.vocab_size),
              dtype, static_cast<long long>(batch));
  std::printf("budget: %.1f MiB of activations\n", double(budget) / 1048576.0);
  if (p.chunk > 0 && p.keep_every == 1)
    std::printf("chunk at T=%lld: %lld (peak %.1f MiB)\n", static_cast<long long>(seq),
                static_cast<long long>(p.chunk), double(p.chunk_peak_bytes) / 1048576.0);
  else if (p.chunk > 0)
    std::printf(
        "chunk at T=%lld: %lld with keep_every %lld (peak %.1f MiB, %lld "
        "extra layer forwards of %lld)\n",
        static_cast<long long>(seq), static_cast<long long>(p.chunk),
        static_cast<long long>(p.keep_every), double(p.chunk_peak_bytes) / 1048576.0,
        static_cast<long long>(p.recomputed_layers), static_cast<long long>(cfg.num_hidden_layers));
  else
    std::printf("chunk at T=%lld: none fits (even chunk 1 exceeds the budget)\n",
                static_cast<long long>(seq));
  std::printf("largest T: full %lld, checkpoint %lld, stream %lld (chunk %lld)\n",
              static_cast<long long>(p.max_seq_full), static_cast<long long>(p.max_seq_checkpoint),
              static_cast<long long>(p.max_seq_stream), static_cast<long long>(p.stream_chunk));
  std::printf(
      "largest T with layer-input spacing: checkpoint %lld (keep_every %lld), "
      "stream %lld (keep_every %lld)\n",
      static_cast<long long>(p.max_seq_checkpoint_spaced),
      static_cast<long long>(p.checkpoint_keep_every),
      static_cast<long long>(p.max_seq_stream_spaced), static_cast<long long>(p.stream_keep_every));
  std::printf(
      "largest T with the layer inputs offloaded to host memory (device backends): checkpoint "
      "%lld (host %.1f MiB), stream %lld (host %.1f MiB)\n",
      static_cast<long long>(p.max_seq_checkpoint_offload),
      double(p.checkpoint_offload_host_bytes) / 1048576.0,
      static_cast<long long>(p.max_seq_stream_offload),
      double(p.stream_offload_host_bytes) / 1048576.0);
  if (p.max_seq_checkpoint > 0)
    std::printf("stream / checkpoint sequence length: %.2fx (with spacing: %.2fx)\n",
                double(p.max_seq_stream) / double(p.max_seq_checkpoint),
                double(p.max_seq_stream_spaced) / double(p.max_seq_checkpoint));
  return 0;
}

}  // namespace

int plan(int argc, char** argv) {
  return with_arguments(plan_command(), argc, argv, [](const arguments& a) {
    if (a.has("--model") == a.has("--preset"))
      throw usage_error{"give exactly one of --model DIR and --preset NAME"};
    if (!a.has("--seq") || !a.has("--budget")) throw usage_error{"--seq and --budget are required"};
    // Every value is an argument error (exit 2) before any file is read.
    constexpr long long big = 1LL << 62;
    const index_t seq = a.integer("--seq", 0, 1, big), batch = a.integer("--batch", 1, big);
    const index_t chunk = a.integer("--chunk", 1, big);
    const index_t max_seq = a.integer("--max-seq", 1, big);
    const std::size_t budget = parse_bytes("--budget", a.get("--budget"));
    const std::string dtype = a.get("--dtype");
    if (dtype != "f32" && dtype != "f64")
      throw usage_error{"--dtype expects f32 or f64, got '" + dtype + "'"};
    // The planner prices B x T tokens by a closed form (no allocation per token): the count
    // itself must stay an index (at most 2^62).
    for (const auto& [key, t] : {std::pair<std::string, index_t>{"--seq", seq},
                                 std::pair<std::string, index_t>{"--max-seq", max_seq}}) {
      const auto tokens =
          checked_product({static_cast<std::uint64_t>(t), static_cast<std::uint64_t>(batch)});
      if (!tokens || *tokens > static_cast<std::uint64_t>(big))
        throw usage_error{key + " " + std::to_string(t) + " x --batch " + std::to_string(batch) +
                          " is more than 2^62 tokens"};
    }
    const model_config cfg =
        a.has("--model") ? load_hf_config(a.get("--model")) : preset_config(a.get("--preset"));
    if (dtype == "f32") return run_plan<float>(cfg, batch, seq, budget, chunk, max_seq, "f32");
    return run_plan<double>(cfg, batch, seq, budget, chunk, max_seq, "f64");
  });
}

}  // namespace tightfit::cli
