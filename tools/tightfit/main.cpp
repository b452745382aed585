// tightfit: the command-line tool. Dispatches to one subcommand (commands.hpp).
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

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
               "run 'tightfit <command> --help' for the options of a command\n");
}

struct command {
  const char* name;
  int (*run)(int, char**);
};

constexpr command commands[] = {
    {"grad", tightfit::cli::grad},       {"logprobs", tightfit::cli::logprobs},
    {"bench", tightfit::cli::bench},     {"plan", tightfit::cli::plan},
    {"measure", tightfit::cli::measure}, {"train", tightfit::cli::train},
    {"prepare", tightfit::cli::prepare}, {"eval", tightfit::cli::eval}};

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
  // --key=value is --key value, for every command
  std::vector<std::string> split;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    const auto eq = a.find('=');
    if (i >= 2 && a.rfind("--", 0) == 0 && eq != std::string::npos && eq > 2) {
      split.push_back(a.substr(0, eq));
      split.push_back(a.substr(eq + 1));
    } else {
      split.push_back(a);
    }
  }
  std::vector<char*> args;
  for (auto& s : split) args.push_back(s.data());
  args.push_back(nullptr);
  argc = static_cast<int>(split.size());
  argv = args.data();
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
