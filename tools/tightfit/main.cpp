// tightfit: the command-line tool. Dispatches to one subcommand (commands.hpp).
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>

#include "commands.hpp"
#include "cpu_features.hpp"

namespace {

void usage(std::FILE* out) {
  std::fprintf(out,
               "usage: tightfit <command> [options]\n"
               "commands:\n"
               "  grad      gradients of a Hugging Face model on a batch (StreamBP schedules)\n"
               "  logprobs  forward-only label log-probs of a batch (reference / old policy)\n"
               "  bench     benchmark tables (bench stream ...)\n"
               "  plan      the memory planner: chunk size and largest sequence per schedule\n"
               "  measure   dimensions of an object in a 3D point cloud (MEBB)\n"
               "  train     training: Adam(W), SGD, BAdam, BREAD, LoRA; data / sequence parallel\n"
               "  prepare   JSONL text, prompts, chats or preferences to token batch files\n"
               "  eval      loss and perplexity of a model on a token data set (forward only)\n"
               "  help      a command's options (help CMD), or their docs table (help CMD "
               "--markdown)\n"
               "run 'tightfit <command> --help' for the options of a command\n");
}

struct command {
  const char* name;
  int (*run)(int, char**);
  const tightfit::cli::command_spec& (*spec)();
};

namespace cli = tightfit::cli;
constexpr command commands[] = {{"grad", cli::grad, cli::grad_command},
                                {"logprobs", cli::logprobs, cli::logprobs_command},
                                {"bench", cli::bench, cli::bench_command},
                                {"plan", cli::plan, cli::plan_command},
                                {"measure", cli::measure, cli::measure_command},
                                {"train", cli::train, cli::train_command},
                                {"prepare", cli::prepare, cli::prepare_command},
                                {"eval", cli::eval, cli::eval_command}};

/// `tightfit help CMD [--markdown]`: the command's help, or its options as docs/tool.md's table.
int help(int argc, char** argv) {
  constexpr const char* help_usage =
      "usage: tightfit help CMD [--markdown] (CMD: a command of tightfit --help)\n";
  if (argc == 3 && (std::strcmp(argv[2], "--help") == 0 || std::strcmp(argv[2], "-h") == 0)) {
    std::fputs(help_usage, stdout);
    return 0;
  }
  const bool markdown = argc == 4 && std::strcmp(argv[3], "--markdown") == 0;
  if (argc == 3 || markdown)
    for (const auto& c : commands)
      if (std::strcmp(argv[2], c.name) == 0) {
        const auto& spec = c.spec();
        std::fputs((markdown ? cli::markdown_options(spec) : cli::help_text(spec)).c_str(), stdout);
        return 0;
      }
  std::fputs(help_usage, stderr);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  if (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    usage(stdout);
    return 0;
  }
  if (std::strcmp(argv[1], "help") == 0) return help(argc, argv);
  for (const auto& c : commands) {
    if (std::strcmp(argv[1], c.name) == 0) {
      tightfit::cli::warn_if_built_without_cpu_extensions();
      int code = 1;
      try {
        code = c.run(argc - 1, argv + 1);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "tightfit %s: %s\n", c.name, e.what());
        return 1;
      }
      // What was printed must have reached stdout (a full disk, > /dev/full): exit 1 otherwise.
      if (std::fflush(stdout) != 0 || std::ferror(stdout) != 0) {
        std::fprintf(stderr, "tightfit %s: cannot write to standard output: %s\n", c.name,
                     std::strerror(errno));
        return 1;
      }
      return code;
    }
  }
  std::fprintf(stderr, "tightfit: unknown command '%s'\n", argv[1]);
  usage(stderr);
  return 2;
}
