// libFuzzer target: the bytes are an optimizer state file (the "optim.*" part of a training
// checkpoint, optim/checkpoint.hpp), read by block_optimizer::load from a safetensors view, then
// one training step runs from the restored state (the step that read out of bounds when a
// counter was negative). A load either throws tightfit::error or leaves a state that steps:
// any other exception, a sanitizer report, a leak or a timeout is a finding. Seeds:
// fuzz/corpus/state (written by make_state_seeds).
#include <cstddef>
#include <cstdint>
#include <span>

#include "state_model.hpp"
#include "tightfit/io/safetensors.hpp"
#include "tightfit/loss/sft.hpp"
#include "tightfit/nn/decoder_layer.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tightfit;
  using namespace tightfit::fuzzing;
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  try {
    const auto view = safetensors_view::parse(bytes, "fuzz");
    state_backend be;
    llama_model<state_backend> model(be, state_config());
    model.init_random(3);
    state_optimizer opt(model, state_partition(model.parameters()), {}, {}, {}, state_options());
    opt.load(view);
    const token_dataset rows = state_data();
    const auto b = make_batch(rows, opt.steps(), 1);
    sft_loss loss;
    (void)opt.step(b.view(), loss);
  } catch (const error&) {
  }
  return 0;
}
