// tightfit/nn/rope.hpp: the inverse frequencies and attention scaling of RoPE for a model
// configuration, as Hugging Face transformers' ROPE_INIT_FUNCTIONS define them for rope_type
// default, linear, dynamic (NTK), yarn and llama3 (modeling_rope_utils.py), over dim = head_dim
// (partial_rotary_factor 1). Computed in double (transformers computes them in float32; the
// PyTorch cross-check writes them in float64).
//
//   default  inv_freq_k = theta^(-2k / dim)
//   linear   inv_freq / factor
//   dynamic  theta' = theta (factor L / M - (factor - 1))^(dim / (dim - 2)) when the batch's
//            length L = max position + 1 exceeds M = max_position_embeddings, else the default
//            (transformers' dynamic_rope_update on a fresh model: it recomputes from
//            max(position_ids) + 1 and falls back to the original frequencies below M)
//   yarn     a ramp between interpolated (inv_freq / factor) and extrapolated (inv_freq)
//            frequencies over the correction range of beta_fast / beta_slow rotations in the
//            original context; cos and sin scaled by attention_factor (default
//            0.1 ln(factor) + 1, or the mscale / mscale_all_dim ratio)
//   llama3   wavelengths above original / low_freq_factor divided by factor, below
//            original / high_freq_factor kept, smoothly interpolated between
// The rotation is the same for forward and backward; these are constants (no gradient).
#pragma once

#include <algorithm>
#include <cmath>
#include <numbers>
#include <span>
#include <vector>

#include "tightfit/backend/concept.hpp"
#include "tightfit/core/error.hpp"
#include "tightfit/core/types.hpp"
#include "tightfit/nn/config.hpp"

namespace tightfit {

/// What RoPE needs from a configuration: head_dim / 2 inverse frequencies and the factor on
/// cos and sin. args() views them as a rope_args (valid while this object lives).
struct rope_frequencies {
  std::vector<double> inv_freq;
  double attention_scaling = 1;

  rope_args args(index_t pos0 = 0, std::span<const index_t> positions = {}) const {
    rope_args r;
    r.pos0 = pos0;
    r.positions = positions;
    r.inv_freq = inv_freq;
    r.attention_scaling = attention_scaling;
    return r;
  }
};

namespace detail {

inline std::vector<double> default_inv_freq(double theta, index_t dim) {
  std::vector<double> f(static_cast<std::size_t>(dim / 2));
  for (index_t k = 0; k < dim / 2; ++k)
    f[static_cast<std::size_t>(k)] =
        1.0 / std::pow(theta, static_cast<double>(2 * k) / static_cast<double>(dim));
  return f;
}

inline double yarn_mscale(double scale, double mscale = 1) {
  return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

}  // namespace detail

/// The frequencies of `c` for a batch whose largest position is seq_len - 1 (only dynamic
/// depends on it). An unknown rope_type is an error naming it.
inline rope_frequencies rope_init(const model_config& c, index_t seq_len = 0) {
  const rope_scaling_config& r = c.rope_scaling;
  const index_t dim = c.head_dim;
  const double theta = c.rope_theta;
  rope_frequencies out;
  if (r.rope_type == "default") {
    out.inv_freq = detail::default_inv_freq(theta, dim);
  } else if (r.rope_type == "linear") {
    out.inv_freq = detail::default_inv_freq(theta, dim);
    for (double& f : out.inv_freq) f /= r.factor;
  } else if (r.rope_type == "dynamic") {
    const auto m = static_cast<double>(c.max_position_embeddings);
    const auto len = static_cast<double>(seq_len);
    double base = theta;
    if (len > m) {
      base = theta * std::pow(r.factor * len / m - (r.factor - 1),
                              static_cast<double>(dim) / static_cast<double>(dim - 2));
    }
    out.inv_freq = detail::default_inv_freq(base, dim);
  } else if (r.rope_type == "yarn") {
    const index_t original = r.original_max_position_embeddings > 0
                                 ? r.original_max_position_embeddings
                                 : c.max_position_embeddings;
    const double factor = r.factor;
    if (r.attention_factor > 0) {
      out.attention_scaling = r.attention_factor;
    } else if (r.mscale > 0 && r.mscale_all_dim > 0) {
      out.attention_scaling =
          detail::yarn_mscale(factor, r.mscale) / detail::yarn_mscale(factor, r.mscale_all_dim);
    } else {
      out.attention_scaling = detail::yarn_mscale(factor);
    }
    // the dimension index whose frequency makes `rotations` turns over the original context
    auto correction_dim = [&](double rotations) {
      return static_cast<double>(dim) *
             std::log(static_cast<double>(original) / (rotations * 2 * std::numbers::pi)) /
             (2 * std::log(theta));
    };
    double low = correction_dim(r.beta_fast), high = correction_dim(r.beta_slow);
    if (r.truncate) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, static_cast<double>(dim - 1));
    if (low == high) high += 0.001;  // no singular ramp
    const auto base = detail::default_inv_freq(theta, dim);
    out.inv_freq.resize(base.size());
    for (std::size_t k = 0; k < base.size(); ++k) {
      const double ramp = std::clamp((static_cast<double>(k) - low) / (high - low), 0.0, 1.0);
      const double extrapolation = 1 - ramp;  // weight of the unscaled frequency
      out.inv_freq[k] = base[k] / factor * (1 - extrapolation) + base[k] * extrapolation;
    }
  } else if (r.rope_type == "llama3") {
    out.inv_freq = detail::default_inv_freq(theta, dim);
    const auto old = static_cast<double>(r.original_max_position_embeddings);
    const double low_wavelen = old / r.low_freq_factor, high_wavelen = old / r.high_freq_factor;
    for (double& f : out.inv_freq) {
      const double wavelen = 2 * std::numbers::pi / f;
      if (wavelen > low_wavelen) {
        f /= r.factor;
      } else if (wavelen >= high_wavelen) {  // medium: interpolate
        const double smooth =
            (old / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
        f = (1 - smooth) * f / r.factor + smooth * f;
      }
    }
  } else {
    fail("rope_init: rope_type \"", r.rope_type,
         "\" is not supported (supported: default, linear, dynamic, yarn, llama3)");
  }
  return out;
}

}  // namespace tightfit
