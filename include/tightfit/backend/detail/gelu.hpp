// tightfit/backend/detail/gelu.hpp: GELU with the tanh approximation (PyTorch's
// gelu(approximate="tanh"), Hugging Face's gelu_pytorch_tanh, Gemma's hidden_activation) and its
// derivative, as scalar functions the host backends share.
//
//   gelu(g)  = g/2 (1 + tanh(u)) = g sigmoid(2u),  u = sqrt(2/pi) (g + 0.044715 g^3)
//   gelu'(g) = (1 + tanh u)/2 + g/2 (1 - tanh^2 u) sqrt(2/pi) (1 + 3 * 0.044715 g^2)
// computed through s = sigmoid(2u) (1 + tanh u = 2s, 1 - tanh^2 u = 4 s (1 - s)), which does not
// lose the small values of g << 0 to the cancellation 1 + tanh u (float).
#pragma once

#include <cmath>
#include <numbers>

namespace tightfit::detail {

inline constexpr double gelu_kappa = 0.044715;
/// sqrt(2 / pi)
inline constexpr double gelu_beta = std::numbers::sqrt2 * std::numbers::inv_sqrtpi;

/// sigmoid(2u) = (1 + tanh u) / 2, the stable form (no cancellation of 1 + tanh u for g << 0).
template <class T>
T gelu_tanh_sigmoid(T g) {
  const T u = T(gelu_beta) * (g + T(gelu_kappa) * g * g * g);
  return T(1) / (T(1) + std::exp(T(-2) * u));
}

template <class T>
T gelu_tanh(T g) {
  return g * gelu_tanh_sigmoid(g);
}

/// gelu'(g) = s + 2 g s (1 - s) sqrt(2/pi) (1 + 3 * 0.044715 g^2), s = sigmoid(2u).
template <class T>
T gelu_tanh_grad(T g) {
  const T s = gelu_tanh_sigmoid(g);
  return s + T(2) * g * s * (T(1) - s) * T(gelu_beta) * (T(1) + T(3 * gelu_kappa) * g * g);
}

}  // namespace tightfit::detail
