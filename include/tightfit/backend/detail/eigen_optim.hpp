// tightfit/backend/detail/eigen_optim.hpp: Adam / AdamW and SGD updates over flat spans with the
// Eigen backend (PyTorch's formulas), parallel over blocks of elements. Sizes and the step are
// checked by eigen_backend before these run.
#pragma once

#include <cmath>
#include <span>

#include "tightfit/backend/concept.hpp"
#include "tightfit/backend/detail/eigen_map.hpp"
#include "tightfit/core/parallel.hpp"
#include "tightfit/core/types.hpp"

namespace tightfit::detail {

inline constexpr index_t optim_grain = index_t{1} << 14;

/// torch.optim.Adam (decoupled = false, weight decay added to the gradient) or AdamW (decoupled
/// = true, p *= 1 - lr wd first); bias corrections computed in double as torch does.
template <class T>
void adam_update(std::span<T> param, std::span<const T> grad, std::span<T> m, std::span<T> v,
                 const adam_hyper<T>& h) {
  const auto t = static_cast<double>(h.step);
  const double bc1 = 1.0 - std::pow(static_cast<double>(h.beta1), t);
  const double bc2 = 1.0 - std::pow(static_cast<double>(h.beta2), t);
  const auto step_size = static_cast<T>(static_cast<double>(h.lr) / bc1);
  const auto bc2_sqrt = static_cast<T>(std::sqrt(bc2));
  const T decay = T(1) - h.lr * h.weight_decay;
  const bool l2 = !h.decoupled && h.weight_decay != T(0);
  const bool decoupled = h.decoupled && h.weight_decay != T(0);
  const auto n = static_cast<index_t>(param.size());
  parallel_for(0, n, optim_grain, [&](index_t i0, index_t i1) {
    const index_t len = i1 - i0;
    auto p = as_array(param).segment(i0, len);
    const auto g0 = as_array(grad).segment(i0, len);
    auto ma = as_array(m).segment(i0, len);
    auto va = as_array(v).segment(i0, len);
    eigen_array<T> g = g0;
    if (l2) g += h.weight_decay * p;
    if (decoupled) p *= decay;
    ma = h.beta1 * ma + (T(1) - h.beta1) * g;
    va = h.beta2 * va + (T(1) - h.beta2) * g * g;
    p -= step_size * ma / (va.sqrt() / bc2_sqrt + h.eps);
  });
}

/// g' = g + wd p (sign(g') when use_sign); momentum: buf = mom buf + g', p -= lr buf; else
/// p -= lr g'. (torch.optim.SGD without dampening or Nesterov; a zero buffer at the first step
/// gives torch's buf = g'.)
template <class T>
void sgd_update(std::span<T> param, std::span<const T> grad, std::span<T> momentum_buf,
                const sgd_hyper<T>& h) {
  const bool use_momentum = h.momentum != T(0);
  const auto n = static_cast<index_t>(param.size());
  parallel_for(0, n, optim_grain, [&](index_t i0, index_t i1) {
    const index_t len = i1 - i0;
    auto p = as_array(param).segment(i0, len);
    eigen_array<T> g = as_array(grad).segment(i0, len);
    if (h.weight_decay != T(0)) g += h.weight_decay * p;
    if (h.use_sign) g = g.sign();
    if (use_momentum) {
      auto buf = as_array(momentum_buf).segment(i0, len);
      buf = h.momentum * buf + g;
      p -= h.lr * buf;
    } else {
      p -= h.lr * g;
    }
  });
}

}  // namespace tightfit::detail
