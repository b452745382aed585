// tightfit grad: not implemented yet (placeholder until its issue lands).
#include <cstdio>

#include "commands.hpp"

namespace tightfit::cli {

int grad(int /*argc*/, char** /*argv*/) {
  std::fprintf(stderr, "tightfit grad: not implemented yet\n");
  return 2;
}

}  // namespace tightfit::cli
