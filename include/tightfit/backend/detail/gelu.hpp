// tightfit/backend/detail/gelu.hpp: GELU with the tanh approximation (PyTorch's
// gelu(approximate="tanh"), Hugging Face's gelu_pytorch_tanh, Gemma's hidden_activation) and its
// derivative, as scalar functions the host backends share.
//
//   gelu(g)  = g/2 (1 + tanh(u)),  u = sqrt(2/pi) (g + 0.044715 g^3)
//   gelu'(g) = (1 + tanh u)/2 + g/2 (1 - tanh^2 u) sqrt(2/pi) (1 + 3 * 0.044715 g^2)
#pragma once

#include <cmath>
#include <numbers>

namespace tightfit::detail {

inline constexpr double gelu_kappa = 0.044715;
/// sqrt(2 / pi)
inline constexpr double gelu_beta = std::numbers::sqrt2 * std::numbers::inv_sqrtpi;

template <class T>
T gelu_tanh(T g) {
  const T u = T(gelu_beta) * (g + T(gelu_kappa) * g * g * g);
  return T(0.5) * g * (T(1) + std::tanh(u));
}

template <class T>
T gelu_tanh_grad(T g) {
  const T th = std::tanh(T(gelu_beta) * (g + T(gelu_kappa) * g * g * g));
  return T(0.5) * (T(1) + th) +
         T(0.5) * g * (T(1) - th * th) * T(gelu_beta) * (T(1) + T(3 * gelu_kappa) * g * g);
}

}  // namespace tightfit::detail
