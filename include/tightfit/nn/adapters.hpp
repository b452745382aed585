// tightfit/nn/adapters.hpp: the seam between low-rank adapters (LoRA: Hu et al., "LoRA: Low-Rank
// Adaptation of Large Language Models", ICLR 2022, arXiv 2106.09685) and the decoder layer.
//
// A layer's linear projections are named as in Hugging Face (q_proj ... down_proj). A
// lora_binding tells a decoder layer which of them carry an adapter: the positions, in a separate
// parameter_set (the adapters'), of A (r, in) and B (out, r), and the scale s (alpha / r, or
// alpha / sqrt(r) for rsLoRA). The layer then computes
//     y = x W^T (+ b) + s (x A^T) B^T
// and, in its backward, dx through W and the adapter, and dA, dB when the adapters' set holds
// gradient buffers for them. nn/lora.hpp builds, initialises, saves and merges the adapters.
#pragma once

#include <array>
#include <cstddef>
#include <string>

#include "tightfit/backend/concept.hpp"
#include "tightfit/core/error.hpp"
#include "tightfit/nn/parameters.hpp"

namespace tightfit {

/// The linear projections of a Llama / Qwen decoder layer, by Hugging Face module name.
enum class projection : int { q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj };
inline constexpr int projection_count = 7;

/// "q_proj", ..., "down_proj".
inline const char* projection_name(projection p) {
  constexpr std::array<const char*, projection_count> names{
      "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  return names[static_cast<std::size_t>(p)];
}
/// The module path under "model.layers.N.": "self_attn.q_proj", ..., "mlp.down_proj".
inline std::string projection_module(projection p) {
  return std::string(static_cast<int>(p) < 4 ? "self_attn." : "mlp.") + projection_name(p);
}

/// Which projections of one layer carry an adapter, where A and B are, and the scale.
template <StorageBackend B>
struct lora_binding {
  parameter_set<B>* adapters = nullptr;  ///< the adapters' set (null: no adapter)
  index_t rank = 0;                      ///< r
  double scale = 0;                      ///< s
  std::array<std::ptrdiff_t, projection_count> a{-1, -1, -1, -1, -1, -1, -1};  ///< A (r, in)
  std::array<std::ptrdiff_t, projection_count> b{-1, -1, -1, -1, -1, -1, -1};  ///< B (out, r)

  bool has(projection p) const {
    return adapters != nullptr && a[static_cast<std::size_t>(p)] >= 0;
  }
  std::size_t a_id(projection p) const {
    return static_cast<std::size_t>(a[static_cast<std::size_t>(p)]);
  }
  std::size_t b_id(projection p) const {
    return static_cast<std::size_t>(b[static_cast<std::size_t>(p)]);
  }
};

}  // namespace tightfit
