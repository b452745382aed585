// tightfit: the command-line tool. Dispatches to one subcommand (commands.hpp).
#include <cstdio>
#include <cstring>
#include <exception>

#include "commands.hpp"

namespace {

void usage(std::FILE* out) {
  std::fprintf(out,
               "usage: tightfit <command> [options]\n"
               "commands:\n"
               "  grad      gradients of a Hugging Face model on a batch (StreamBP schedules)\n"
               "  bench     benchmark tables (bench stream ...)\n"
               "  plan      the memory planner: chunk size and largest sequence per schedule\n"
               "  measure   dimensions of an object in a 3D point cloud (MEBB)\n"
               "  train     block coordinate training (BAdam / BREAD)\n"
               "run 'tightfit <command> --help' for the options of a command\n");
}

struct command {
  const char* name;
  int (*run)(int, char**);
};

constexpr command commands[] = {{"grad", tightfit::cli::grad},
                                {"bench", tightfit::cli::bench},
                                {"plan", tightfit::cli::plan},
                                {"measure", tightfit::cli::measure},
                                {"train", tightfit::cli::train}};

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
  for (const auto& c : commands) {
    if (std::strcmp(argv[1], c.name) == 0) {
      try {
        return c.run(argc - 1, argv + 1);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "tightfit %s: %s\n", c.name, e.what());
        return 1;
      }
    }
  }
  std::fprintf(stderr, "tightfit: unknown command '%s'\n", argv[1]);
  usage(stderr);
  return 2;
}
