// tightfit/backend/reference.hpp: the reference backend, plain loops, the test oracle.
//
// reference_backend<T> satisfies the Backend concept (backend/concept.hpp) for any floating
// type T with the most obvious code possible: serial loops, sums accumulated in double, one
// row of attention scores materialised at a time. Every other backend is tested against it,
// so it favours clarity over speed; docs/concepts.md states each kernel's contract.
//
// Invariants:
//  - every kernel checks all extents first (detail/reference_checks.hpp) and throws
//    tightfit::error naming the kernel, the argument and both extents; nothing is written
//    when a check fails;
//  - forward kernels overwrite their outputs; backward kernels accumulate (+=) into every
//    gradient output, except the in-place kernels rope_backward and xent_backward;
//  - gemm with beta == 0 overwrites C (NaN or Inf in C do not propagate).
//
// Statistics (kernel_stats), counted like a real backend would:
//  - gemm / gemm_batched: gemm_calls += 1 per call, gemm_flops += 2*m*n*k (times batch);
//  - attention_forward: attention_forward_calls += 1, attention_flops += 4*head_dim per
//    computed (query, key, head) triple (q.k and p*v);
//  - attention_backward: attention_backward_calls += 1, attention_flops += 10*head_dim per
//    computed triple (score recomputation q.k, then dO.v, dV += p*dO, dQ += ds*k, dK += ds*q).
//  A triple is computed when the key is visible to the query (attention_mask: causal, window,
//  document, valid_len, K.rows): masked pairs cost nothing.
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <limits>
#include <span>
#include <vector>

#include "tightfit/backend/concept.hpp"
#include "tightfit/backend/detail/gelu.hpp"
#include "tightfit/backend/detail/host_storage.hpp"
#include "tightfit/backend/detail/reference_checks.hpp"
#include "tightfit/core/error.hpp"
#include "tightfit/core/memory.hpp"
#include "tightfit/core/types.hpp"
#include "tightfit/core/view.hpp"

namespace tightfit {

/// The reference Backend: naive serial loops over host memory, accumulating in double.
/// Non-copyable (it owns the memory_counter of its allocations).
template <std::floating_point T>
class reference_backend : public detail::host_storage<T> {
 public:
  using value_type = T;

  // storage and accounting (memory, stats, allocate, upload, download): detail::host_storage

  // ---- dense linear algebra -----------------------------------------------------------------

  /// C = alpha * op(A) * op(B) + beta * C with op(X) = X or X^T per flag; op(A) is (m, k),
  /// op(B) is (k, n), C is (m, n). beta == 0 overwrites C.
  void gemm(transpose ta, transpose tb, T alpha, matrix_view<const T> a, matrix_view<const T> b,
            T beta, matrix_view<T> c) {
    const auto d = detail::check_gemm(ta, tb, a, b, c);
    ++stats_.gemm_calls;
    stats_.gemm_flops +=
        2.0 * static_cast<double>(d.m) * static_cast<double>(d.n) * static_cast<double>(d.k);
    gemm_loops(ta, tb, alpha, a, b, beta, c, d);
  }

  /// gemm for each b of a batch: C[b] = alpha op(A[b]) op(B[b]) + beta C[b].
  void gemm_batched(transpose ta, transpose tb, T alpha, tensor3_view<const T> a,
                    tensor3_view<const T> b, T beta, tensor3_view<T> c) {
    const auto d = detail::check_gemm_batched(ta, tb, a, b, c);
    ++stats_.gemm_calls;
    stats_.gemm_flops += 2.0 * static_cast<double>(d.m) * static_cast<double>(d.n) *
                         static_cast<double>(d.k) * static_cast<double>(c.batch);
    for (index_t i = 0; i < c.batch; ++i) gemm_loops(ta, tb, alpha, a[i], b[i], beta, c[i], d);
  }

  /// y += alpha * x (same shapes).
  void axpy(T alpha, matrix_view<const T> x, matrix_view<T> y) {
    detail::check_layout("axpy", "x", x);
    detail::check_like("axpy", "y", y, "x", x.rows, x.cols);
    for (index_t i = 0; i < x.rows; ++i)
      for (index_t j = 0; j < x.cols; ++j)
        y(i, j) = static_cast<T>(static_cast<double>(y(i, j)) +
                                 static_cast<double>(alpha) * static_cast<double>(x(i, j)));
  }

  /// x *= alpha (alpha == 0 keeps NaN; use fill to zero a buffer).
  void scale(T alpha, matrix_view<T> x) {
    detail::check_layout("scale", "x", x);
    for (index_t i = 0; i < x.rows; ++i)
      for (index_t j = 0; j < x.cols; ++j) x(i, j) *= alpha;
  }

  /// x = value.
  void fill(matrix_view<T> x, T value) {
    detail::check_layout("fill", "x", x);
    for (index_t i = 0; i < x.rows; ++i)
      for (index_t j = 0; j < x.cols; ++j) x(i, j) = value;
  }

  /// y = x (same shapes).
  void copy(matrix_view<const T> x, matrix_view<T> y) {
    detail::check_layout("copy", "x", x);
    detail::check_like("copy", "y", y, "x", x.rows, x.cols);
    for (index_t i = 0; i < x.rows; ++i)
      for (index_t j = 0; j < x.cols; ++j) y(i, j) = x(i, j);
  }

  // ---- token embedding ----------------------------------------------------------------------

  /// out[i] = table[ids[i]]; table (V, d), ids (n) in [0, V), out (n, d).
  void embedding_forward(matrix_view<const T> table, std::span<const token_id> ids,
                         matrix_view<T> out) {
    detail::check_embedding_forward(table, ids, out);
    for (index_t i = 0; i < out.rows; ++i) {
      const T* src = table.row(static_cast<index_t>(ids[static_cast<std::size_t>(i)]));
      for (index_t j = 0; j < out.cols; ++j) out(i, j) = src[j];
    }
  }

  /// dtable[ids[i]] += dout[i]; dout (n, d), dtable (V, d).
  void embedding_backward(matrix_view<const T> dout, std::span<const token_id> ids,
                          matrix_view<T> dtable) {
    detail::check_embedding_backward(dout, ids, dtable);
    for (index_t i = 0; i < dout.rows; ++i) {
      T* dst = dtable.row(static_cast<index_t>(ids[static_cast<std::size_t>(i)]));
      for (index_t j = 0; j < dout.cols; ++j) dst[j] += dout(i, j);
    }
  }

  // ---- RMSNorm ------------------------------------------------------------------------------

  /// rstd_i = 1 / sqrt(mean_j x_ij^2 + eps); y_ij = x_ij * rstd_i * w_j.
  /// x, y (n, d); w (d); rstd (n).
  void rmsnorm_forward(matrix_view<const T> x, std::span<const T> w, T eps, matrix_view<T> y,
                       std::span<T> rstd) {
    detail::check_rmsnorm_forward(x, w, eps, y, rstd);
    for (index_t i = 0; i < x.rows; ++i) {
      double ss = 0;
      for (index_t j = 0; j < x.cols; ++j)
        ss += static_cast<double>(x(i, j)) * static_cast<double>(x(i, j));
      const double r = 1.0 / std::sqrt(ss / static_cast<double>(x.cols) + static_cast<double>(eps));
      rstd[static_cast<std::size_t>(i)] = static_cast<T>(r);
      for (index_t j = 0; j < x.cols; ++j)
        y(i, j) = static_cast<T>(static_cast<double>(x(i, j)) * r *
                                 static_cast<double>(w[static_cast<std::size_t>(j)]));
    }
  }

  /// Gradient of rmsnorm_forward given the saved rstd:
  /// dx_ij += rstd_i * (dy_ij w_j - x_ij rstd_i^2 (sum_k dy_ik w_k x_ik) / d);
  /// dw_j += sum_i dy_ij x_ij rstd_i (skipped when dw is empty).
  void rmsnorm_backward(matrix_view<const T> x, std::span<const T> w, std::span<const T> rstd,
                        matrix_view<const T> dy, matrix_view<T> dx, std::span<T> dw) {
    detail::check_rmsnorm_backward(x, w, rstd, dy, dx, dw);
    const auto d = static_cast<double>(x.cols);
    for (index_t i = 0; i < x.rows; ++i) {
      const double r = static_cast<double>(rstd[static_cast<std::size_t>(i)]);
      double dot = 0;  // sum_k dy_ik w_k x_ik
      for (index_t k = 0; k < x.cols; ++k)
        dot += static_cast<double>(dy(i, k)) * static_cast<double>(w[static_cast<std::size_t>(k)]) *
               static_cast<double>(x(i, k));
      for (index_t j = 0; j < x.cols; ++j) {
        const double wj = static_cast<double>(w[static_cast<std::size_t>(j)]);
        const double g = r * (static_cast<double>(dy(i, j)) * wj -
                              static_cast<double>(x(i, j)) * r * r * dot / d);
        dx(i, j) = static_cast<T>(static_cast<double>(dx(i, j)) + g);
      }
      if (!dw.empty())
        for (index_t j = 0; j < x.cols; ++j) {
          auto& dwj = dw[static_cast<std::size_t>(j)];
          dwj = static_cast<T>(static_cast<double>(dwj) +
                               static_cast<double>(dy(i, j)) * static_cast<double>(x(i, j)) * r);
        }
    }
  }

  // ---- RoPE ---------------------------------------------------------------------------------

  /// In place on x (n, heads*head_dim): row i is at position p = r.position(i). For each head
  /// and k < half = head_dim/2: angle = p * r.frequency(k) (double), c = a cos angle,
  /// s = a sin angle with a = r.attention_scaling;
  /// x[k], x[k+half] <- x[k] c - x[k+half] s, x[k+half] c + x[k] s (HF rotate_half).
  void rope_forward(matrix_view<T> x, index_t heads, index_t head_dim, const rope_args& r) {
    detail::check_rope("rope_forward", x, heads, head_dim, r);
    rope_loops(x, heads, head_dim, r, 1.0);
  }

  /// In place: dx <- R^T dx, the transpose of rope_forward (rotation by -angle, same scaling).
  void rope_backward(matrix_view<T> dx, index_t heads, index_t head_dim, const rope_args& r) {
    detail::check_rope("rope_backward", dx, heads, head_dim, r);
    rope_loops(dx, heads, head_dim, r, -1.0);
  }

  // ---- SwiGLU -------------------------------------------------------------------------------

  /// out = silu(gate) * up, silu(g) = g * sigmoid(g); all (n, f).
  void swiglu_forward(matrix_view<const T> gate, matrix_view<const T> up, matrix_view<T> out) {
    detail::check_swiglu_forward(gate, up, out);
    for (index_t i = 0; i < gate.rows; ++i)
      for (index_t j = 0; j < gate.cols; ++j) {
        const double g = static_cast<double>(gate(i, j));
        out(i, j) = static_cast<T>(g * sigmoid(g) * static_cast<double>(up(i, j)));
      }
  }

  /// dgate += dout * up * silu'(gate), dup += dout * silu(gate);
  /// silu'(g) = sigmoid(g) (1 + g (1 - sigmoid(g))).
  void swiglu_backward(matrix_view<const T> gate, matrix_view<const T> up,
                       matrix_view<const T> dout, matrix_view<T> dgate, matrix_view<T> dup) {
    detail::check_swiglu_backward(gate, up, dout, dgate, dup);
    for (index_t i = 0; i < gate.rows; ++i)
      for (index_t j = 0; j < gate.cols; ++j) {
        const double g = static_cast<double>(gate(i, j));
        const double sg = sigmoid(g);
        const double d = static_cast<double>(dout(i, j));
        dgate(i, j) = static_cast<T>(static_cast<double>(dgate(i, j)) +
                                     d * static_cast<double>(up(i, j)) * sg * (1 + g * (1 - sg)));
        dup(i, j) = static_cast<T>(static_cast<double>(dup(i, j)) + d * g * sg);
      }
  }

  // ---- GELU-tanh gated MLP and logit soft-capping (Gemma) -----------------------------------

  /// out = gelu_tanh(gate) * up (detail/gelu.hpp); all (n, f).
  void geglu_forward(matrix_view<const T> gate, matrix_view<const T> up, matrix_view<T> out) {
    detail::check_swiglu_forward(gate, up, out, "geglu_forward");
    for (index_t i = 0; i < gate.rows; ++i)
      for (index_t j = 0; j < gate.cols; ++j) {
        const double g = static_cast<double>(gate(i, j));
        out(i, j) = static_cast<T>(detail::gelu_tanh(g) * static_cast<double>(up(i, j)));
      }
  }

  /// dgate += dout * up * gelu_tanh'(gate), dup += dout * gelu_tanh(gate).
  void geglu_backward(matrix_view<const T> gate, matrix_view<const T> up, matrix_view<const T> dout,
                      matrix_view<T> dgate, matrix_view<T> dup) {
    detail::check_swiglu_backward(gate, up, dout, dgate, dup, "geglu_backward");
    for (index_t i = 0; i < gate.rows; ++i)
      for (index_t j = 0; j < gate.cols; ++j) {
        const double g = static_cast<double>(gate(i, j));
        const double d = static_cast<double>(dout(i, j));
        dgate(i, j) = static_cast<T>(static_cast<double>(dgate(i, j)) +
                                     d * static_cast<double>(up(i, j)) * detail::gelu_tanh_grad(g));
        dup(i, j) = static_cast<T>(static_cast<double>(dup(i, j)) + d * detail::gelu_tanh(g));
      }
  }

  /// In place: x <- cap tanh(x / cap) (Gemma's final logit soft-capping), cap > 0.
  void logit_softcap_forward(matrix_view<T> x, T cap) {
    detail::check_softcap("logit_softcap_forward", x, static_cast<double>(cap));
    const auto c = static_cast<double>(cap);
    for (index_t i = 0; i < x.rows; ++i)
      for (index_t j = 0; j < x.cols; ++j)
        x(i, j) = static_cast<T>(c * std::tanh(static_cast<double>(x(i, j)) / c));
  }

  /// In place: dx <- dx (1 - (capped / cap)^2), the backward of logit_softcap_forward given its
  /// output `capped`.
  void logit_softcap_backward(matrix_view<const T> capped, matrix_view<T> dx, T cap) {
    detail::check_softcap_backward(capped, dx, static_cast<double>(cap));
    const auto c = static_cast<double>(cap);
    for (index_t i = 0; i < dx.rows; ++i)
      for (index_t j = 0; j < dx.cols; ++j) {
        const double y = static_cast<double>(capped(i, j)) / c;
        dx(i, j) = static_cast<T>(static_cast<double>(dx(i, j)) * (1 - y * y));
      }
  }

  // ---- attention ----------------------------------------------------------------------------

  /// Causal grouped-query attention of one sequence. Q (nq, heads*hd) holds positions
  /// q0..q0+nq-1; K, V (nk, kv_heads*hd) hold positions k0..k0+nk-1. Query at position p, head
  /// h attends the K/V rows mask.key_rows(p, nk) (causal, window, document, valid_len, the
  /// key block) through kv head h / (heads / kv_heads):
  /// s_j = scale * q.k_j (soft-capped to cap tanh(s_j / cap) when mask.softcap = cap > 0),
  /// O row = softmax(s) V, lse(i, h) = log sum_j exp(s_j) (a row with no key in a key block:
  /// O = 0, lse = -inf). O (nq, heads*hd), lse (nq, heads) are overwritten.
  void attention_forward(const attention_shape& shape, matrix_view<const T> q,
                         matrix_view<const T> k, matrix_view<const T> v, const attention_mask& mask,
                         T scale, matrix_view<T> o, matrix_view<T> lse) {
    detail::check_attention_forward(shape, q, k, v, mask, scale, o, lse);
    ++stats_.attention_forward_calls;
    const index_t hd = shape.head_dim, group = shape.heads / shape.kv_heads;
    std::vector<double> s(static_cast<std::size_t>(k.rows));  // (nk) scores of one row
    std::vector<double> acc(static_cast<std::size_t>(hd));    // (hd) output row of one head
    double triples = 0;
    for (index_t i = 0; i < q.rows; ++i) {
      const auto [lo, limit] = mask.key_rows(mask.q0 + i, k.rows);
      for (index_t h = 0; h < shape.heads; ++h) {
        const index_t qc = h * hd, kc = (h / group) * hd;  // column offsets in Q and K/V
        double mx = -std::numeric_limits<double>::infinity();
        for (index_t j = lo; j < limit; ++j) {
          const double sj =
              capped(mask, static_cast<double>(scale) * dot(q.row(i) + qc, k.row(j) + kc, hd));
          s[static_cast<std::size_t>(j)] = sj;
          mx = std::max(mx, sj);
        }
        double sum = 0;
        for (index_t j = lo; j < limit; ++j) sum += std::exp(s[static_cast<std::size_t>(j)] - mx);
        const double l = mx + std::log(sum);
        std::fill(acc.begin(), acc.end(), 0.0);
        for (index_t j = lo; j < limit; ++j) {
          const double p = std::exp(s[static_cast<std::size_t>(j)] - l);
          const T* vj = v.row(j) + kc;
          for (index_t c = 0; c < hd; ++c)
            acc[static_cast<std::size_t>(c)] += p * static_cast<double>(vj[c]);
        }
        for (index_t c = 0; c < hd; ++c)
          o(i, qc + c) = static_cast<T>(acc[static_cast<std::size_t>(c)]);
        lse(i, h) = static_cast<T>(l);
        triples += static_cast<double>(limit - lo);
      }
    }
    stats_.attention_flops += 4.0 * static_cast<double>(hd) * triples;
  }

  /// Exact gradient of attention_forward given its O and lse. With P_j = exp(s_j - lse) and
  /// D = dO.O (per row and head): dV_j += P_j dO; dS_j = P_j (dO.v_j - D);
  /// dQ += scale sum_j dS_j k_j; dK_j += scale dS_j q. dQ (nq, heads*hd), dK, dV
  /// (nk, kv_heads*hd) accumulate. Soft-capping multiplies dS_j by 1 - (s_j / cap)^2.
  void attention_backward(const attention_shape& shape, matrix_view<const T> q,
                          matrix_view<const T> k, matrix_view<const T> v, matrix_view<const T> o,
                          matrix_view<const T> dout, matrix_view<const T> lse,
                          const attention_mask& mask, T scale, matrix_view<T> dq, matrix_view<T> dk,
                          matrix_view<T> dv) {
    detail::check_attention_backward(shape, q, k, v, o, dout, lse, mask, scale, dq, dk, dv);
    ++stats_.attention_backward_calls;
    const index_t hd = shape.head_dim, group = shape.heads / shape.kv_heads;
    const auto sc = static_cast<double>(scale);
    std::vector<double> acc(static_cast<std::size_t>(hd));  // (hd) dQ row of one head
    double triples = 0;
    for (index_t i = 0; i < q.rows; ++i) {
      const auto [lo, limit] = mask.key_rows(mask.q0 + i, k.rows);
      for (index_t h = 0; h < shape.heads; ++h) {
        const index_t qc = h * hd, kc = (h / group) * hd;
        const T* qi = q.row(i) + qc;
        const T* doi = dout.row(i) + qc;
        const double l = static_cast<double>(lse(i, h));
        const double dd = dot(doi, o.row(i) + qc, hd);  // D = dO . O
        std::fill(acc.begin(), acc.end(), 0.0);
        for (index_t j = lo; j < limit; ++j) {
          const T* kj = k.row(j) + kc;
          const T* vj = v.row(j) + kc;
          const double sj = capped(mask, sc * dot(qi, kj, hd));
          const double p = std::exp(sj - l);
          const double ds = p * (dot(doi, vj, hd) - dd) * capped_grad(mask, sj);
          T* dkj = dk.row(j) + kc;
          T* dvj = dv.row(j) + kc;
          for (index_t c = 0; c < hd; ++c) {
            dvj[c] = static_cast<T>(static_cast<double>(dvj[c]) + p * static_cast<double>(doi[c]));
            dkj[c] =
                static_cast<T>(static_cast<double>(dkj[c]) + sc * ds * static_cast<double>(qi[c]));
            acc[static_cast<std::size_t>(c)] += sc * ds * static_cast<double>(kj[c]);
          }
        }
        T* dqi = dq.row(i) + qc;
        for (index_t c = 0; c < hd; ++c)
          dqi[c] = static_cast<T>(static_cast<double>(dqi[c]) + acc[static_cast<std::size_t>(c)]);
        triples += static_cast<double>(limit - lo);
      }
    }
    stats_.attention_flops += 10.0 * static_cast<double>(hd) * triples;
  }

  // ---- cross-entropy ------------------------------------------------------------------------

  /// z = logits / tau; lse_i = log sum_v exp z_iv (stable); logprob_i = z_i[y_i] - lse_i, or
  /// 0 when y_i == ignore_index (lse still computed). logits (n, V), labels/lse/logprob (n).
  void xent_forward(matrix_view<const T> logits, std::span<const token_id> labels, T tau,
                    std::span<T> lse, std::span<T> logprob) {
    detail::check_xent_forward(logits, labels, tau, lse, logprob);
    const auto t = static_cast<double>(tau);
    for (index_t i = 0; i < logits.rows; ++i) {
      const auto r = static_cast<std::size_t>(i);
      const double l = row_lse(logits.row(i), logits.cols, t);
      lse[r] = static_cast<T>(l);
      logprob[r] = labels[r] == ignore_index
                       ? T(0)
                       : static_cast<T>(static_cast<double>(logits(i, labels[r])) / t - l);
    }
  }

  /// In place: logits (n, V) <- d/dlogits of sum_i coeff_i logprob_i
  ///   = coeff_i (onehot(y_i) - softmax(z_i)) / tau, using the saved lse of z = logits / tau;
  /// rows with y_i == ignore_index become zero.
  void xent_backward(matrix_view<T> logits, std::span<const token_id> labels,
                     std::span<const T> lse, std::span<const T> coeff, T tau) {
    detail::check_xent_backward(logits, labels, lse, coeff, tau);
    const auto t = static_cast<double>(tau);
    for (index_t i = 0; i < logits.rows; ++i) {
      const auto r = static_cast<std::size_t>(i);
      T* row = logits.row(i);
      if (labels[r] == ignore_index) {
        for (index_t j = 0; j < logits.cols; ++j) row[j] = T(0);
        continue;
      }
      const double l = static_cast<double>(lse[r]);
      const double c = static_cast<double>(coeff[r]) / t;
      for (index_t j = 0; j < logits.cols; ++j) {
        const double p = std::exp(static_cast<double>(row[j]) / t - l);
        row[j] = static_cast<T>(c * ((j == labels[r] ? 1.0 : 0.0) - p));
      }
    }
  }

  // ---- optimizer updates --------------------------------------------------------------------

  /// One Adam (decoupled == false) or AdamW step, as torch.optim.Adam / AdamW:
  /// if !decoupled: g += wd p; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
  /// mhat = m / (1 - b1^t); vhat = v / (1 - b2^t); if decoupled: p -= lr wd p;
  /// p -= lr mhat / (sqrt(vhat) + eps).
  void adam_update(std::span<T> param, std::span<const T> grad, std::span<T> m, std::span<T> v,
                   const adam_hyper<T>& hp) {
    detail::check_adam(param, grad, m, v, hp);
    const auto lr = static_cast<double>(hp.lr), b1 = static_cast<double>(hp.beta1),
               b2 = static_cast<double>(hp.beta2), eps = static_cast<double>(hp.eps),
               wd = static_cast<double>(hp.weight_decay);
    const double t = static_cast<double>(hp.step);
    const double bc1 = 1 - std::pow(b1, t), bc2 = 1 - std::pow(b2, t);
    for (std::size_t i = 0; i < param.size(); ++i) {
      double p = static_cast<double>(param[i]);
      double g = static_cast<double>(grad[i]);
      if (!hp.decoupled) g += wd * p;
      const double mi = b1 * static_cast<double>(m[i]) + (1 - b1) * g;
      const double vi = b2 * static_cast<double>(v[i]) + (1 - b2) * g * g;
      m[i] = static_cast<T>(mi);
      v[i] = static_cast<T>(vi);
      if (hp.decoupled) p -= lr * wd * p;
      p -= lr * (mi / bc1) / (std::sqrt(vi / bc2) + eps);
      param[i] = static_cast<T>(p);
    }
  }

  /// One SGD step (torch.optim.SGD without dampening / nesterov): g' = g + wd p;
  /// if use_sign: g' = sign(g'); if momentum != 0: buf = momentum buf + g' (buf starts at
  /// zero, of param's size), step = buf; else step = g' (buf ignored); p -= lr step.
  void sgd_update(std::span<T> param, std::span<const T> grad, std::span<T> momentum_buf,
                  const sgd_hyper<T>& hp) {
    detail::check_sgd(param, grad, momentum_buf, hp);
    const auto lr = static_cast<double>(hp.lr), mu = static_cast<double>(hp.momentum),
               wd = static_cast<double>(hp.weight_decay);
    for (std::size_t i = 0; i < param.size(); ++i) {
      const double p = static_cast<double>(param[i]);
      double g = static_cast<double>(grad[i]) + wd * p;
      if (hp.use_sign) g = static_cast<double>((g > 0) - (g < 0));
      if (mu != 0) {
        g = mu * static_cast<double>(momentum_buf[i]) + g;
        momentum_buf[i] = static_cast<T>(g);
      }
      param[i] = static_cast<T>(p - lr * g);
    }
  }

 private:
  static double sigmoid(double g) { return 1.0 / (1.0 + std::exp(-g)); }
  /// A score after the mask's soft-capping (unchanged without one).
  static double capped(const attention_mask& m, double s) {
    return m.softcap > 0 ? m.softcap * std::tanh(s / m.softcap) : s;
  }
  /// d capped / d s given the capped score c: 1 - (c / cap)^2.
  static double capped_grad(const attention_mask& m, double c) {
    if (m.softcap <= 0) return 1.0;
    const double y = c / m.softcap;
    return 1.0 - y * y;
  }

  static double dot(const T* a, const T* b, index_t n) {
    double s = 0;
    for (index_t c = 0; c < n; ++c) s += static_cast<double>(a[c]) * static_cast<double>(b[c]);
    return s;
  }

  /// log sum_j exp(x_j / tau), stable.
  static double row_lse(const T* x, index_t n, double tau) {
    double mx = -std::numeric_limits<double>::infinity();
    for (index_t j = 0; j < n; ++j) mx = std::max(mx, static_cast<double>(x[j]) / tau);
    double sum = 0;
    for (index_t j = 0; j < n; ++j) sum += std::exp(static_cast<double>(x[j]) / tau - mx);
    return mx + std::log(sum);
  }

  static void gemm_loops(transpose ta, transpose tb, T alpha, matrix_view<const T> a,
                         matrix_view<const T> b, T beta, matrix_view<T> c,
                         const detail::gemm_dims& d) {
    const bool at = ta == transpose::yes, bt = tb == transpose::yes;
    for (index_t i = 0; i < d.m; ++i)
      for (index_t j = 0; j < d.n; ++j) {
        double s = 0;
        for (index_t l = 0; l < d.k; ++l)
          s += static_cast<double>(at ? a(l, i) : a(i, l)) *
               static_cast<double>(bt ? b(j, l) : b(l, j));
        double r = static_cast<double>(alpha) * s;
        if (beta != T(0)) r += static_cast<double>(beta) * static_cast<double>(c(i, j));
        c(i, j) = static_cast<T>(r);
      }
  }

  /// sign = +1 rotates by +angle (forward), -1 by -angle (backward, the transpose).
  static void rope_loops(matrix_view<T> x, index_t heads, index_t hd, const rope_args& r,
                         double sign) {
    const index_t half = hd / 2;
    const double a = r.attention_scaling;
    std::vector<double> inv_freq(static_cast<std::size_t>(half));  // (hd/2)
    for (index_t kk = 0; kk < half; ++kk)
      inv_freq[static_cast<std::size_t>(kk)] = r.frequency(kk, hd);
    for (index_t i = 0; i < x.rows; ++i) {
      const auto p = static_cast<double>(r.position(i));
      for (index_t h = 0; h < heads; ++h) {
        T* xh = x.row(i) + h * hd;
        for (index_t kk = 0; kk < half; ++kk) {
          const double angle = p * inv_freq[static_cast<std::size_t>(kk)];
          const double c = a * std::cos(angle), s = sign * a * std::sin(angle);
          const auto x1 = static_cast<double>(xh[kk]), x2 = static_cast<double>(xh[kk + half]);
          xh[kk] = static_cast<T>(x1 * c - x2 * s);
          xh[kk + half] = static_cast<T>(x2 * c + x1 * s);
        }
      }
    }
  }

  using detail::host_storage<T>::stats_;
};

static_assert(Backend<reference_backend<float>>);
static_assert(Backend<reference_backend<double>>);

}  // namespace tightfit
