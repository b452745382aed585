// tightfit/nn/norm_weight.hpp: the RMSNorm scale a model applies, offset + w with the offset
// of model_config::norm_offset(): Llama / Qwen scale by w (offset 0); Gemma 2 / Gemma 3 by
// (1 + w) with w stored (Hugging Face's Gemma RMSNorm), so that a zero weight is the identity.
// The kernels take the scale itself: with an offset an (offset + w) copy is made in a small
// backend buffer (counted), and since d(offset + w)/dw = 1 the kernels' dw accumulates into w's
// gradient unchanged: weights and gradients stay in the Hugging Face convention.
#pragma once

#include <span>
#include <utility>
#include <vector>

#include "tightfit/backend/concept.hpp"
#include "tightfit/core/types.hpp"
#include "tightfit/core/view.hpp"
#include "tightfit/nn/parameters.hpp"

namespace tightfit {

/// A norm scale: w itself, or an (offset + w) copy it owns (movable: scale() looks the buffer
/// up).
template <DenseBackend B>
class norm_scale {
 public:
  using T = storage_t<B>;
  norm_scale() = default;
  /// The scale of weight w: w when offset is 0, else (offset + w) (Gemma: 1).
  norm_scale(B& be, std::span<const T> w, double offset) : w_(w) {
    if (offset == 0) return;
    const auto n = static_cast<index_t>(w.size());
    shifted_ = be.template allocate<T>(n);  // (n) offset + w
    be.fill(shifted_.view(1, n), accum_t<B>(offset));
    be.axpy(accum_t<B>(1), as_matrix(w, 1, n), shifted_.view(1, n));
    offset_ = true;
  }
  /// What the RMSNorm kernels read.
  std::span<const T> scale() const { return offset_ ? std::span<const T>(shifted_.span()) : w_; }

 private:
  std::span<const T> w_{};
  buffer_t<B> shifted_{};
  bool offset_ = false;
};

/// The (offset + w) scales of a layer's norms by parameter position (a layer's norms, for one
/// pass).
template <DenseBackend B>
class layer_norms {
 public:
  using T = storage_t<B>;
  layer_norms() = default;
  /// Scales of parameters `ids` of `params`, made in that order, with config's norm offset.
  layer_norms(B& be, parameter_set<B>& params, std::span<const std::size_t> ids, double offset) {
    for (std::size_t id : ids)
      scales_.emplace_back(id, norm_scale<B>(be, params.value(id), offset));
  }
  /// What the RMSNorm kernels read for parameter `id` (empty when the layer has no such norm).
  std::span<const T> scale(std::size_t id) const {
    for (const auto& [i, s] : scales_)
      if (i == id) return s.scale();
    return {};
  }

 private:
  std::vector<std::pair<std::size_t, norm_scale<B>>> scales_;
};

}  // namespace tightfit
