// tightfit/backend/detail/eigen_xent.hpp: softmax cross-entropy over a logits chunk with the
// Eigen backend, parallel over rows and vectorised along the vocabulary (Eigen arrays).
// Labels and tau are checked by eigen_backend before these run.
#pragma once

#include <cmath>
#include <span>

#include "tightfit/backend/detail/eigen_map.hpp"
#include "tightfit/core/parallel.hpp"
#include "tightfit/core/types.hpp"
#include "tightfit/core/view.hpp"

namespace tightfit::detail {

/// z = logits / tau; lse_i = logsumexp(z_i); logprob_i = z_i[y_i] - lse_i (0 for ignored rows).
template <class T>
void xent_forward(matrix_view<const T> logits, std::span<const token_id> labels, T tau,
                  std::span<T> lse, std::span<T> logprob) {
  const T inv_tau = T(1) / tau;
  parallel_for(
      0, logits.rows, row_grain(logits.cols, index_t{1} << 16), [&](index_t i0, index_t i1) {
        for (index_t i = i0; i < i1; ++i) {
          const auto row = row_array(logits, i);
          const T zmax = row.maxCoeff() * inv_tau;
          const T l = zmax + std::log(((row * inv_tau) - zmax).exp().sum());
          const auto u = static_cast<std::size_t>(i);
          lse[u] = l;
          const token_id y = labels[u];
          logprob[u] = y == ignore_index ? T(0) : row(static_cast<index_t>(y)) * inv_tau - l;
        }
      });
}

/// logits := coeff * (onehot(y) - softmax(z)) / tau in place; rows with ignored labels := 0.
template <class T>
void xent_backward(matrix_view<T> logits, std::span<const token_id> labels, std::span<const T> lse,
                   std::span<const T> coeff, T tau) {
  const T inv_tau = T(1) / tau;
  parallel_for(0, logits.rows, row_grain(logits.cols, index_t{1} << 16),
               [&](index_t i0, index_t i1) {
                 for (index_t i = i0; i < i1; ++i) {
                   auto row = row_array(logits, i);
                   const auto u = static_cast<std::size_t>(i);
                   const token_id y = labels[u];
                   if (y == ignore_index) {
                     row.setZero();
                     continue;
                   }
                   const T c = coeff[u] * inv_tau;
                   row = ((row * inv_tau) - lse[u]).exp() * (-c);  // -c * softmax
                   row(static_cast<index_t>(y)) += c;
                 }
               });
}

}  // namespace tightfit::detail
