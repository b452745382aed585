// tightfit/backend/detail/eigen_rowwise.hpp: the row-wise kernels of the Eigen backend
// (embedding, RMSNorm, RoPE, SwiGLU, GELU-tanh GLU, logit soft-capping, axpy/scale/fill/copy).
// Shapes and indices are checked by eigen_backend before these run. Every reduction over rows
// (embedding and RMSNorm weight gradients) runs in a fixed order, so results do not depend on the
// thread count.
#pragma once

#include <algorithm>
#include <cmath>
#include <span>

#include "tightfit/backend/detail/eigen_map.hpp"
#include "tightfit/backend/detail/gelu.hpp"
#include "tightfit/core/memory.hpp"
#include "tightfit/core/parallel.hpp"
#include "tightfit/core/types.hpp"
#include "tightfit/core/view.hpp"

namespace tightfit::detail {

// ---- element-wise on views -----------------------------------------------------------------

template <class T>
void axpy(T alpha, matrix_view<const T> x, matrix_view<T> y) {
  for_each_row(y.rows, y.cols, [&](index_t i) { row_array(y, i) += alpha * row_array(x, i); });
}

template <class T>
void scale(T alpha, matrix_view<T> x) {
  for_each_row(x.rows, x.cols, [&](index_t i) { row_array(x, i) *= alpha; });
}

template <class T>
void fill(matrix_view<T> x, T value) {
  for_each_row(x.rows, x.cols, [&](index_t i) { row_array(x, i).setConstant(value); });
}

template <class T>
void copy(matrix_view<const T> x, matrix_view<T> y) {
  for_each_row(y.rows, y.cols, [&](index_t i) { row_array(y, i) = row_array(x, i); });
}

// ---- embedding ------------------------------------------------------------------------------

/// out.row(i) = table.row(ids[i]); ids already checked.
template <class T>
void embedding_forward(matrix_view<const T> table, std::span<const token_id> ids,
                       matrix_view<T> out) {
  for_each_row(out.rows, out.cols, [&](index_t i) {
    row_array(out, i) = row_array(table, static_cast<index_t>(ids[static_cast<std::size_t>(i)]));
  });
}

/// dtable.row(ids[i]) += dout.row(i). Parallel over column blocks of the table, each scanning
/// the rows in order: race-free with repeated ids and deterministic.
template <class T>
void embedding_backward(matrix_view<const T> dout, std::span<const token_id> ids,
                        matrix_view<T> dtable) {
  const index_t n = dout.rows, d = dout.cols;
  const index_t block = std::max<index_t>(64, d / std::max<index_t>(1, 4 * concurrency()));
  parallel_for(0, d, block, [&](index_t c0, index_t c1) {
    for (index_t i = 0; i < n; ++i) {
      const auto id = static_cast<index_t>(ids[static_cast<std::size_t>(i)]);
      as_eigen(dtable, id, c0, 1, c1 - c0).array() += as_eigen(dout, i, c0, 1, c1 - c0).array();
    }
  });
}

// ---- RMSNorm --------------------------------------------------------------------------------

/// rstd_i = 1 / sqrt(mean_j x_ij^2 + eps), y_ij = x_ij * rstd_i * w_j.
template <class T>
void rmsnorm_forward(matrix_view<const T> x, std::span<const T> w, T eps, matrix_view<T> y,
                     std::span<T> rstd) {
  const auto wa = as_array(w);
  const T inv_d = T(1) / static_cast<T>(x.cols);
  for_each_row(x.rows, x.cols, [&](index_t i) {
    const auto xi = row_array(x, i);
    const T r = T(1) / std::sqrt(xi.square().sum() * inv_d + eps);
    rstd[static_cast<std::size_t>(i)] = r;
    row_array(y, i) = xi * r * wa;
  });
}

/// dx += rstd * (g - xhat * mean(g * xhat)) with g = dy * w, xhat = x * rstd; dw += sum_i dy_i *
/// xhat_i. The rows are cut into at most `max_parts` fixed blocks (a function of the row count
/// only); each block adds its dw part into its own scratch row, and the parts are summed in
/// block order: deterministic whatever the thread count.
template <class T>
void rmsnorm_backward(matrix_view<const T> x, std::span<const T> w, std::span<const T> rstd,
                      matrix_view<const T> dy, matrix_view<T> dx, std::span<T> dw,
                      memory_counter& memory) {
  const index_t n = x.rows, d = x.cols;
  const auto wa = as_array(w);
  const T inv_d = T(1) / static_cast<T>(d);
  const bool want_dw = !dw.empty();
  constexpr index_t max_parts = 64;
  const index_t rows_per_part = std::max<index_t>(
      {index_t{1}, (n + max_parts - 1) / max_parts, row_grain(d, index_t{1} << 14)});
  const index_t parts = n == 0 ? 0 : (n + rows_per_part - 1) / rows_per_part;
  host_buffer<T> partial(memory, want_dw ? parts * d : 0);  // (parts, d)
  parallel_for(0, parts, 1, [&](index_t p0, index_t p1) {
    eigen_array<T> g(d);
    for (index_t p = p0; p < p1; ++p) {
      const index_t i0 = p * rows_per_part, i1 = std::min(n, i0 + rows_per_part);
      for (index_t i = i0; i < i1; ++i) {
        const T r = rstd[static_cast<std::size_t>(i)];
        const auto xi = row_array(x, i);
        const auto dyi = row_array(dy, i);
        g = dyi * wa;
        const T c = (g * xi).sum() * r * inv_d;  // mean(g * xhat)
        row_array(dx, i) += r * (g - xi * (r * c));
        if (want_dw) eigen_array_map<T>(partial.data() + p * d, d) += dyi * xi * r;
      }
    }
  });
  if (!want_dw) return;
  auto dwa = as_array(dw);
  parallel_for(0, d, std::max<index_t>(256, d / std::max<index_t>(1, 4 * concurrency())),
               [&](index_t c0, index_t c1) {
                 for (index_t p = 0; p < parts; ++p) {
                   dwa.segment(c0, c1 - c0) +=
                       eigen_array_map<const T>(partial.data() + p * d + c0, c1 - c0);
                 }
               });
}

// ---- RoPE (rotate-half) ----------------------------------------------------------------------

/// Rotates every head of every row of x (rows, heads * head_dim) in place by the angles of
/// positions r.position(i): angle_ik = position * r.frequency(k), computed in double, cos and
/// sin times r.attention_scaling. sign = +1 forward, -1 backward (rotation by -angle).
template <class T>
void rope(matrix_view<T> x, index_t heads, index_t head_dim, const rope_args& r, int sign) {
  const index_t half = head_dim / 2;
  const double scaling = r.attention_scaling;
  std::vector<double> inv_freq(static_cast<std::size_t>(half));
  for (index_t k = 0; k < half; ++k)
    inv_freq[static_cast<std::size_t>(k)] = r.frequency(k, head_dim);
  parallel_for(0, x.rows, row_grain(x.cols, index_t{1} << 13), [&](index_t i0, index_t i1) {
    std::vector<T> cs(static_cast<std::size_t>(half)), sn(static_cast<std::size_t>(half));
    for (index_t i = i0; i < i1; ++i) {
      const auto p = static_cast<double>(r.position(i));
      for (index_t k = 0; k < half; ++k) {
        const double angle = p * inv_freq[static_cast<std::size_t>(k)];
        cs[static_cast<std::size_t>(k)] = static_cast<T>(scaling * std::cos(angle));
        sn[static_cast<std::size_t>(k)] = static_cast<T>(sign * scaling * std::sin(angle));
      }
      const eigen_array_map<const T> c(cs.data(), half), s(sn.data(), half);
      T* row = x.row(i);
      for (index_t h = 0; h < heads; ++h) {
        eigen_array_map<T> x1(row + h * head_dim, half), x2(row + h * head_dim + half, half);
        const eigen_array<T> a = x1;
        x1 = a * c - x2 * s;
        x2 = x2 * c + a * s;
      }
    }
  });
}

// ---- SwiGLU ---------------------------------------------------------------------------------

/// out = silu(gate) * up, silu(g) = g / (1 + exp(-g)).
template <class T>
void swiglu_forward(matrix_view<const T> gate, matrix_view<const T> up, matrix_view<T> out) {
  for_each_row(out.rows, out.cols, [&](index_t i) {
    const auto g = row_array(gate, i);
    row_array(out, i) = g / (T(1) + (-g).exp()) * row_array(up, i);
  });
}

/// dgate += dout * up * sig * (1 + g (1 - sig)), dup += dout * silu(g).
template <class T>
void swiglu_backward(matrix_view<const T> gate, matrix_view<const T> up, matrix_view<const T> dout,
                     matrix_view<T> dgate, matrix_view<T> dup) {
  parallel_for(0, gate.rows, row_grain(gate.cols), [&](index_t i0, index_t i1) {
    eigen_array<T> sig(gate.cols);
    for (index_t i = i0; i < i1; ++i) {
      const auto g = row_array(gate, i);
      const auto dy = row_array(dout, i);
      sig = T(1) / (T(1) + (-g).exp());
      row_array(dgate, i) += dy * row_array(up, i) * sig * (T(1) + g * (T(1) - sig));
      row_array(dup, i) += dy * g * sig;
    }
  });
}

// ---- GELU-tanh gated MLP (Gemma) and logit soft-capping ---------------------------------------

/// out = gelu_tanh(gate) * up = gate sigmoid(2u) up (detail/gelu.hpp).
template <class T>
void geglu_forward(matrix_view<const T> gate, matrix_view<const T> up, matrix_view<T> out) {
  for_each_row(out.rows, out.cols, [&](index_t i) {
    const auto g = row_array(gate, i);
    row_array(out, i) =
        g / (T(1) + (T(-2 * gelu_beta) * (g + T(gelu_kappa) * g * g * g)).exp()) * row_array(up, i);
  });
}

/// dgate += dout * up * gelu_tanh'(g), dup += dout * gelu_tanh(g), through s = sigmoid(2u).
template <class T>
void geglu_backward(matrix_view<const T> gate, matrix_view<const T> up, matrix_view<const T> dout,
                    matrix_view<T> dgate, matrix_view<T> dup) {
  parallel_for(0, gate.rows, row_grain(gate.cols), [&](index_t i0, index_t i1) {
    eigen_array<T> s(gate.cols);
    for (index_t i = i0; i < i1; ++i) {
      const auto g = row_array(gate, i);
      const auto dy = row_array(dout, i);
      s = T(1) / (T(1) + (T(-2 * gelu_beta) * (g + T(gelu_kappa) * g * g * g)).exp());
      row_array(dgate, i) +=
          dy * row_array(up, i) *
          (s + T(2 * gelu_beta) * g * s * (T(1) - s) * (T(1) + T(3 * gelu_kappa) * g * g));
      row_array(dup, i) += dy * g * s;
    }
  });
}

/// In place: x <- cap tanh(x / cap).
template <class T>
void logit_softcap_forward(matrix_view<T> x, T cap) {
  for_each_row(x.rows, x.cols,
               [&](index_t i) { row_array(x, i) = cap * (row_array(x, i) / cap).tanh(); });
}

/// In place: dx <- dx (1 - (capped / cap)^2).
template <class T>
void logit_softcap_backward(matrix_view<const T> capped, matrix_view<T> dx, T cap) {
  for_each_row(dx.rows, dx.cols, [&](index_t i) {
    const auto y = row_array(capped, i) / cap;
    row_array(dx, i) *= T(1) - y * y;
  });
}

}  // namespace tightfit::detail
