// tightfit/optim/checkpoint.hpp: saving and resuming a training run: the model's weights under
// their Hugging Face names and the optimizer's whole state under "optim.*" (block_optimizer::save
// / load), so that a resumed run's next update is bit for bit the one the uninterrupted run
// makes. Values are stored in the model's own type (F32 / F64): nothing is rounded.
//
// The file format is a parameter: anything with the small TensorWriter / TensorReader interface
// below. io/safetensors.hpp's safetensors_writer and safetensors_file are such types (optim/
// does not include io/):
//   safetensors_writer w;  save_checkpoint(w, model, optimizer);  w.write(path);
//   load_checkpoint(safetensors_file::open(path), model, optimizer);
#pragma once

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "tightfit/core/error.hpp"
#include "tightfit/nn/layer.hpp"

namespace tightfit {

/// Named tensors of element type T (and int64 counters) with string metadata, added in order.
template <class W, class T>
concept TensorWriter = requires(W& w, const std::string& s, std::vector<index_t> shape,
                                std::span<const T> values, std::span<const std::int64_t> ints) {
  w.add(s, shape, values);
  w.add(s, shape, ints);
  w.set_metadata(s, s);
};

/// Reads what a TensorWriter wrote: shapes (info(name) throws tightfit::error naming an absent
/// tensor), values converted to T, int64 counters, metadata (a map from string to string), and
/// source() naming the file in errors.
template <class R, class T>
concept TensorReader = requires(const R& r, const std::string& s, std::span<T> out) {
  { r.info(s).shape } -> std::convertible_to<std::vector<index_t>>;
  r.template read<T>(s, out);
  { r.read_ints(s) } -> std::convertible_to<std::vector<std::int64_t>>;
  r.metadata();
  { r.source() } -> std::convertible_to<std::string>;
};

namespace detail {
inline std::string shape_text(std::span<const index_t> shape) {
  std::ostringstream out;
  out << '[';
  for (std::size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << ']';
  return out.str();
}
}  // namespace detail

/// Adds the weights of `model` and the state of `optimizer` to `w`; the caller writes it.
template <DecoderModel M, class Optimizer, TensorWriter<storage_t<typename M::backend_type>> W>
void save_checkpoint(W& w, M& model, const Optimizer& optimizer) {
  using T = storage_t<typename M::backend_type>;
  auto& params = model.parameters();
  for (std::size_t i = 0; i < params.size(); ++i) {
    std::vector<T> h(static_cast<std::size_t>(params.numel(i)));
    params.backend().download(std::span<const T>(params.value(i)), std::span<T>(h));
    const auto shape = params.shape(i);
    w.add(params.name(i), std::vector<index_t>(shape.begin(), shape.end()), std::span<const T>(h));
  }
  optimizer.save(w);
  w.set_metadata("format", "pt");
}

/// Restores the weights written by save_checkpoint (errors name the source and what differs);
/// the optimizer state is left alone (a ZeRO-1 rank reads its shard from its own file).
template <DecoderModel M, TensorReader<storage_t<typename M::backend_type>> R>
void load_checkpoint_weights(const R& r, M& model) {
  using T = storage_t<typename M::backend_type>;
  auto& params = model.parameters();
  for (std::size_t i = 0; i < params.size(); ++i) {
    const std::vector<index_t> have = r.info(params.name(i)).shape;
    const auto want = params.shape(i);
    check(std::equal(have.begin(), have.end(), want.begin(), want.end()), r.source(), ": tensor '",
          params.name(i), "' has shape ", detail::shape_text(have), ", the model expects ",
          detail::shape_text(want));
    std::vector<T> h(static_cast<std::size_t>(params.numel(i)));
    r.template read<T>(params.name(i), std::span<T>(h));
    params.backend().upload(std::span<const T>(h), params.value(i));
  }
}

/// Restores weights and optimizer state written by save_checkpoint (errors name the source and
/// what differs).
template <DecoderModel M, class Optimizer, TensorReader<storage_t<typename M::backend_type>> R>
void load_checkpoint(const R& r, M& model, Optimizer& optimizer) {
  load_checkpoint_weights(r, model);
  optimizer.load(r);
}

}  // namespace tightfit
