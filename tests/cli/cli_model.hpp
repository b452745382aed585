// The model directory the end-to-end tests of the tightfit tool train and differentiate: a
// random tiny model (F64 weights; a Qwen3-style one unless a config is given) written in the
// Hugging Face layout under a scratch directory, the weights of any model directory read back,
// and counting token rows.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "cli_testing.hpp"
#include "stream/stream_testing.hpp"
#include "tightfit/nn/architectures.hpp"
#include "tightfit/nn/hf_model.hpp"

namespace tightfit::cli_testing {

/// dir (scratch/name) and dir/model: a random model of `cfg` (by default a `layers`-layer
/// Qwen3-style one), init_random(5, 0.1, 0.1 for (1 + w) norms), on the layer its architecture
/// names (nn/architectures.hpp).
struct model_fixture {
  using ref = reference_backend<double>;
  fs::path dir;
  fs::path model;
  model_config cfg;
  explicit model_fixture(const std::string& name, index_t layers = 3)
      : model_fixture(name, testing::tiny_config(4, 2, true, false, layers)) {}
  model_fixture(const std::string& name, const model_config& config)
      : dir(scratch(name)), model(dir / "model"), cfg(config) {
    fs::create_directories(model);
    with_config_layer(cfg, [&](auto layer) {
      ref be;
      decoder_model<ref, typename decltype(layer)::template type<ref>> m(be, cfg);
      m.init_random(5, 0.1, cfg.norm_offset() != 0 ? 0.1 : 0.0);
      save_hf_config(cfg, model);
      save_hf_weights(model, m.parameters());
    });
  }
  /// The parameter values of a model directory, in the model's parameter order.
  std::vector<std::vector<double>> weights(const fs::path& d) const {
    const model_config c = load_hf_config(d);
    return with_config_layer(c, [&](auto layer) {
      ref be;
      decoder_model<ref, typename decltype(layer)::template type<ref>> m(be, c);
      load_hf_weights(d, m.parameters());
      std::vector<std::vector<double>> out;
      for (std::size_t i = 0; i < m.parameters().size(); ++i) {
        const auto v = m.parameters().value(i);
        out.emplace_back(v.begin(), v.end());
      }
      return out;
    });
  }
};

/// Counting sequences (n, t): token k + 1 follows token k (mod 8), row r starting at 3r mod 8.
inline std::vector<std::int64_t> counting_ids(index_t n, index_t t) {
  std::vector<std::int64_t> ids;
  for (index_t r = 0; r < n; ++r)
    for (index_t k = 0; k < t; ++k) ids.push_back((3 * r + k) % 8);
  return ids;
}

}  // namespace tightfit::cli_testing
