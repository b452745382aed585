// The model directory the end-to-end tests of the tightfit tool train and differentiate: a
// random tiny Qwen3-style model (F64 weights) written in the Hugging Face layout under a scratch
// directory, the weights of any model directory read back, and counting token rows.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "cli_testing.hpp"
#include "stream/stream_testing.hpp"
#include "tightfit/nn/decoder_layer.hpp"
#include "tightfit/nn/hf_model.hpp"

namespace tightfit::cli_testing {

/// dir (scratch/name) and dir/model: a `layers`-layer random model, init_random(5, 0.1).
struct model_fixture {
  using ref = reference_backend<double>;
  fs::path dir;
  fs::path model;
  model_config cfg;
  explicit model_fixture(const std::string& name, index_t layers = 3)
      : dir(scratch(name)),
        model(dir / "model"),
        cfg(testing::tiny_config(4, 2, true, false, layers)) {
    fs::create_directories(model);
    ref be;
    llama_model<ref> m(be, cfg);
    m.init_random(5, 0.1);
    save_hf_config(cfg, model);
    save_hf_weights(model, m.parameters());
  }
  /// The parameter values of a model directory, in the model's parameter order.
  std::vector<std::vector<double>> weights(const fs::path& d) const {
    ref be;
    llama_model<ref> m(be, load_hf_config(d));
    load_hf_weights(d, m.parameters());
    std::vector<std::vector<double>> out;
    for (std::size_t i = 0; i < m.parameters().size(); ++i) {
      const auto v = m.parameters().value(i);
      out.emplace_back(v.begin(), v.end());
    }
    return out;
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
