// Writes the seed corpus of fuzz_state: optimizer states of the fuzz model after 0, 1, 3 and 6
// steps (before the first block switch, inside a block, across passes).
//   make_state_seeds DIR
#include <cstdio>
#include <string>

#include "state_model.hpp"
#include "tightfit/io/safetensors.hpp"
#include "tightfit/loss/sft.hpp"
#include "tightfit/nn/decoder_layer.hpp"

int main(int argc, char** argv) {
  using namespace tightfit;
  using namespace tightfit::fuzzing;
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_state_seeds DIR\n");
    return 2;
  }
  for (int steps : {0, 1, 3, 6}) {
    state_backend be;
    llama_model<state_backend> model(be, state_config());
    model.init_random(3);
    state_optimizer opt(model, state_partition(model.parameters()), {}, {}, {}, state_options());
    const token_dataset rows = state_data();
    for (int s = 0; s < steps; ++s) {
      const auto b = make_batch(rows, opt.steps(), 1);
      sft_loss loss;
      (void)opt.step(b.view(), loss);
    }
    safetensors_writer w;
    opt.save(w);
    w.write(std::string(argv[1]) + "/state-" + std::to_string(steps) + ".safetensors");
  }
  return 0;
}
