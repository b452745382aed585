// tightfit/optim/checkpoint.hpp: saving and resuming a training run in one safetensors file:
// the model's weights under their Hugging Face names and the optimizer's whole state under
// "optim.*" (block_optimizer::save / load), so that a resumed run's next update is bit for bit
// the one the uninterrupted run makes. Values are stored in the model's own type (F32 / F64):
// nothing is rounded.
#pragma once

#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "tightfit/io/safetensors.hpp"
#include "tightfit/nn/model.hpp"

namespace tightfit {

/// Writes the weights of `model` and the state of `optimizer` to `path`.
template <Backend B, class Optimizer>
void save_checkpoint(const std::filesystem::path& path, decoder_model<B>& model,
                     const Optimizer& optimizer) {
  using T = typename B::value_type;
  auto& params = model.parameters();
  safetensors_writer w;
  for (std::size_t i = 0; i < params.size(); ++i) {
    std::vector<T> h(static_cast<std::size_t>(params.numel(i)));
    params.backend().download(std::span<const T>(params.value(i)), std::span<T>(h));
    const auto shape = params.shape(i);
    w.add(params.name(i), std::vector<index_t>(shape.begin(), shape.end()), std::span<const T>(h));
  }
  optimizer.save(w);
  w.set_metadata("format", "pt");
  w.write(path);
}

/// Restores weights and optimizer state written by save_checkpoint (errors name what differs).
template <Backend B, class Optimizer>
void load_checkpoint(const std::filesystem::path& path, decoder_model<B>& model,
                     Optimizer& optimizer) {
  using T = typename B::value_type;
  const auto file = safetensors_file::open(path);
  auto& params = model.parameters();
  for (std::size_t i = 0; i < params.size(); ++i) {
    const tensor_info& t = file.info(params.name(i));
    const auto want = params.shape(i);
    check(std::equal(t.shape.begin(), t.shape.end(), want.begin(), want.end()), path.string(),
          ": tensor '", params.name(i), "' has shape ", io::detail::shape_string(t.shape),
          ", the model expects ", io::detail::shape_string(want));
    std::vector<T> h(static_cast<std::size_t>(params.numel(i)));
    file.template read<T>(params.name(i), std::span<T>(h));
    params.backend().upload(std::span<const T>(h), params.value(i));
  }
  optimizer.load(file);
}

}  // namespace tightfit
