// tightfit/backend/eigen.hpp: eigen_backend<T>, the CPU backend (Eigen 3.4 + oneTBB).
//
// Implements every kernel of the Backend concept (backend/concept.hpp) with the same semantics
// as reference_backend<T>, the plain-loop oracle it is tested against:
//  - GEMMs are Eigen products over row-major maps with a row stride (no copies, strided views
//    accepted everywhere); large ones are split into blocks of C across oneTBB workers, since
//    Eigen's own GEMM is multithreaded only under OpenMP (detail/eigen_gemm.hpp).
//  - Causal attention is flash style (FlashAttention-2, Dao 2023): tiles of queries x keys with
//    an online softmax, only the per-row log-sum-exp saved, tiles above the diagonal, past the
//    valid length, before a sliding window or outside a document never computed, Eigen GEMMs on the
//    tiles, GQA without replicating K/V (detail/eigen_attention.hpp, which also documents the
//    parallel backward).
//  - Row-wise kernels (RMSNorm, RoPE, SwiGLU, embedding, cross-entropy, optimizer updates) are
//    vectorised Eigen array expressions, parallel over rows; their reductions over rows run in a
//    fixed order, so results do not depend on the thread count.
// Invariants: every scratch buffer is allocated through allocate() (counted by memory());
// backward kernels accumulate (+=) into gradient outputs and skip an empty dw; every public
// kernel checks its shapes and indices with the reference backend's checks
// (detail/reference_checks.hpp), so both backends reject the same input with the same message.
// Threads: kernels parallelise internally over the backend's own oneTBB arena of
// eigen_backend_options::threads workers (0: one per core; detail/thread_arena.hpp), never TBB's
// global pool; one backend object serves one caller at a time (its kernel_stats are plain
// counters). Eigen appears only in this header and
// backend/detail/eigen_*.hpp (never in a header that a CUDA source includes).
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <span>
#include <string>

#include "tightfit/backend/concept.hpp"
#include "tightfit/backend/detail/eigen_attention.hpp"
#include "tightfit/backend/detail/eigen_gemm.hpp"
#include "tightfit/backend/detail/eigen_map.hpp"
#include "tightfit/backend/detail/eigen_optim.hpp"
#include "tightfit/backend/detail/eigen_rowwise.hpp"
#include "tightfit/backend/detail/eigen_xent.hpp"
#include "tightfit/backend/detail/host_storage.hpp"
#include "tightfit/backend/detail/reference_checks.hpp"
#include "tightfit/backend/detail/thread_arena.hpp"
#include "tightfit/core/error.hpp"
#include "tightfit/core/memory.hpp"
#include "tightfit/core/types.hpp"
#include "tightfit/core/view.hpp"

namespace tightfit {

/// Tuning knobs of eigen_backend (the defaults were chosen with bench_kernels on 2 cores, see
/// docs/benchmarks.md).
struct eigen_backend_options {
  /// Query rows per attention tile (times heads / kv_heads stacked rows per tile GEMM).
  index_t attention_tile_q = 64;
  /// Key rows per attention tile.
  index_t attention_tile_k = 128;
  /// How the attention backward is parallelised.
  attention_backward_strategy attention_backward = attention_backward_strategy::thread_partials;
  /// thread_partials keeps one (nq, heads * hd) dQ partial per worker thread; above this many
  /// bytes for all of them the backward runs two_pass instead (no partials, 1.4x the work).
  std::size_t attention_partials_max_bytes = std::size_t{256} << 20;
  /// GEMMs with 2mnk below this run as one serial Eigen call.
  double gemm_parallel_min_flops = 8e6;
  /// Smallest block of C rows (or columns) per task of a parallel GEMM.
  index_t gemm_min_block = 64;
  /// Worker threads of this backend's own oneTBB arena (0: one per core). Every kernel runs in
  /// it, not in TBB's global pool.
  int threads = 0;
};

/// The CPU backend: Eigen products and vectorised array expressions, parallelised with oneTBB
/// (tightfit::parallel_for). Satisfies Backend for float and double.
template <std::floating_point T>
class eigen_backend : public detail::host_storage<T> {
 public:
  using value_type = T;

  /// A backend with the given tuning; throws tightfit::error for non-positive tile sizes.
  explicit eigen_backend(const eigen_backend_options& options = {})
      : options_(options), arena_(options.threads) {
    check(options_.attention_tile_q >= 1, "eigen_backend: attention_tile_q is ",
          options_.attention_tile_q, ", expected >= 1");
    check(options_.attention_tile_k >= 1, "eigen_backend: attention_tile_k is ",
          options_.attention_tile_k, ", expected >= 1");
    check(options_.gemm_min_block >= 1, "eigen_backend: gemm_min_block is ",
          options_.gemm_min_block, ", expected >= 1");
  }
  /// The tuning this backend runs with.
  const eigen_backend_options& options() const { return options_; }
  /// Worker threads its kernels use (its own arena's size).
  int threads() { return arena_.threads(); }

  // storage and accounting (memory, stats, allocate, upload, download): detail::host_storage

  // ---- dense linear algebra --------------------------------------------------------------------

  /// C = alpha op(A) op(B) + beta C; beta == 0 overwrites C (NaN in C does not propagate).
  void gemm(transpose ta, transpose tb, T alpha, matrix_view<const T> a, matrix_view<const T> b,
            T beta, matrix_view<T> c) {
    arena_.run([&] {
      const index_t k = detail::check_gemm(ta, tb, a, b, c).k;
      detail::gemm(ta, tb, alpha, a, b, beta, c, gemm_opts());
      ++stats_.gemm_calls;
      stats_.gemm_flops +=
          2.0 * static_cast<double>(c.rows) * static_cast<double>(c.cols) * static_cast<double>(k);
    });
  }

  /// C[i] = alpha op(A[i]) op(B[i]) + beta C[i] for every i of the batch.
  void gemm_batched(transpose ta, transpose tb, T alpha, tensor3_view<const T> a,
                    tensor3_view<const T> b, T beta, tensor3_view<T> c) {
    arena_.run([&] {
      const index_t k = detail::check_gemm_batched(ta, tb, a, b, c).k;
      const double flops =
          2.0 * static_cast<double>(c.rows) * static_cast<double>(c.cols) * static_cast<double>(k);
      const auto tuning = gemm_opts();
      if (flops >= tuning.parallel_min_flops) {  // each product is worth splitting itself
        for (index_t i = 0; i < c.batch; ++i)
          detail::gemm(ta, tb, alpha, a[i], b[i], beta, c[i], tuning);
      } else {
        const index_t grain = std::max<index_t>(
            1, static_cast<index_t>(tuning.parallel_min_flops / std::max(flops, 1.0)));
        parallel_for(0, c.batch, grain, [&](index_t i0, index_t i1) {
          for (index_t i = i0; i < i1; ++i)
            detail::gemm_serial(ta, tb, alpha, a[i], b[i], beta, c[i]);
        });
      }
      ++stats_.gemm_calls;
      stats_.gemm_flops += flops * static_cast<double>(c.batch);
    });
  }

  /// y += alpha x.
  void axpy(T alpha, matrix_view<const T> x, matrix_view<T> y) {
    arena_.run([&] {
      detail::check_layout("axpy", "x", x);
      detail::check_like("axpy", "y", y, "x", x.rows, x.cols);
      detail::axpy(alpha, x, y);
    });
  }
  /// x *= alpha (alpha == 0 keeps NaN, as the reference; use fill to zero a buffer).
  void scale(T alpha, matrix_view<T> x) {
    arena_.run([&] {
      detail::check_layout("scale", "x", x);
      detail::scale(alpha, x);
    });
  }
  /// x = value.
  void fill(matrix_view<T> x, T value) {
    arena_.run([&] {
      detail::check_layout("fill", "x", x);
      detail::fill(x, value);
    });
  }
  /// y = x.
  void copy(matrix_view<const T> x, matrix_view<T> y) {
    arena_.run([&] {
      detail::check_layout("copy", "x", x);
      detail::check_like("copy", "y", y, "x", x.rows, x.cols);
      detail::copy(x, y);
    });
  }

  // ---- embedding -----------------------------------------------------------------------------

  /// out.row(i) = table.row(ids[i]); table (V, d), ids (n), out (n, d).
  void embedding_forward(matrix_view<const T> table, std::span<const token_id> ids,
                         matrix_view<T> out) {
    arena_.run([&] {
      detail::check_embedding_forward(table, ids, out);
      detail::embedding_forward(table, ids, out);
    });
  }
  /// dtable.row(ids[i]) += dout.row(i); dout (n, d), dtable (V, d). Deterministic with repeats.
  void embedding_backward(matrix_view<const T> dout, std::span<const token_id> ids,
                          matrix_view<T> dtable) {
    arena_.run([&] {
      detail::check_embedding_backward(dout, ids, dtable);
      detail::embedding_backward(dout, ids, dtable);
    });
  }

  // ---- RMSNorm -------------------------------------------------------------------------------

  /// y = x * rstd * w with rstd_i = 1 / sqrt(mean(x_i^2) + eps); x, y (n, d), w (d), rstd (n).
  void rmsnorm_forward(matrix_view<const T> x, std::span<const T> w, T eps, matrix_view<T> y,
                       std::span<T> rstd) {
    arena_.run([&] {
      detail::check_rmsnorm_forward(x, w, eps, y, rstd);
      detail::rmsnorm_forward(x, w, eps, y, rstd);
    });
  }
  /// dx += d(y)/d(x)^T dy, dw += sum_i dy_i * x_i * rstd_i (skipped when dw is empty).
  void rmsnorm_backward(matrix_view<const T> x, std::span<const T> w, std::span<const T> rstd,
                        matrix_view<const T> dy, matrix_view<T> dx, std::span<T> dw) {
    arena_.run([&] {
      detail::check_rmsnorm_backward(x, w, rstd, dy, dx, dw);
      detail::rmsnorm_backward(x, w, rstd, dy, dx, dw, memory_);
    });
  }

  // ---- RoPE ----------------------------------------------------------------------------------

  /// Rotates x (n, heads * head_dim) in place, row i at position r.position(i) (HF
  /// rotate-half, frequencies r.frequency(k), cos and sin times r.attention_scaling).
  void rope_forward(matrix_view<T> x, index_t heads, index_t head_dim, const rope_args& r) {
    arena_.run([&] {
      detail::check_rope("rope_forward", x, heads, head_dim, r);
      detail::rope(x, heads, head_dim, r, +1);
    });
  }
  /// The adjoint of rope_forward (rotation by -angle, same scaling), in place on the gradient.
  void rope_backward(matrix_view<T> dx, index_t heads, index_t head_dim, const rope_args& r) {
    arena_.run([&] {
      detail::check_rope("rope_backward", dx, heads, head_dim, r);
      detail::rope(dx, heads, head_dim, r, -1);
    });
  }

  // ---- SwiGLU --------------------------------------------------------------------------------

  /// out = silu(gate) * up; all (n, f).
  void swiglu_forward(matrix_view<const T> gate, matrix_view<const T> up, matrix_view<T> out) {
    arena_.run([&] {
      detail::check_swiglu_forward(gate, up, out);
      detail::swiglu_forward(gate, up, out);
    });
  }
  /// dgate += dout * d silu(gate) * up, dup += dout * silu(gate).
  void swiglu_backward(matrix_view<const T> gate, matrix_view<const T> up,
                       matrix_view<const T> dout, matrix_view<T> dgate, matrix_view<T> dup) {
    arena_.run([&] {
      detail::check_swiglu_backward(gate, up, dout, dgate, dup);
      detail::swiglu_backward(gate, up, dout, dgate, dup);
    });
  }

  // ---- GELU-tanh gated MLP and logit soft-capping (Gemma) ------------------------------------

  /// out = gelu_tanh(gate) * up; all (n, f).
  void geglu_forward(matrix_view<const T> gate, matrix_view<const T> up, matrix_view<T> out) {
    arena_.run([&] {
      detail::check_swiglu_forward(gate, up, out, "geglu_forward");
      detail::geglu_forward(gate, up, out);
    });
  }
  /// dgate += dout * up * gelu_tanh'(gate), dup += dout * gelu_tanh(gate).
  void geglu_backward(matrix_view<const T> gate, matrix_view<const T> up, matrix_view<const T> dout,
                      matrix_view<T> dgate, matrix_view<T> dup) {
    arena_.run([&] {
      detail::check_swiglu_backward(gate, up, dout, dgate, dup, "geglu_backward");
      detail::geglu_backward(gate, up, dout, dgate, dup);
    });
  }
  /// In place: x <- cap tanh(x / cap).
  void logit_softcap_forward(matrix_view<T> x, T cap) {
    arena_.run([&] {
      detail::check_softcap("logit_softcap_forward", x, static_cast<double>(cap));
      detail::logit_softcap_forward(x, cap);
    });
  }
  /// In place: dx <- dx (1 - (capped / cap)^2).
  void logit_softcap_backward(matrix_view<const T> capped, matrix_view<T> dx, T cap) {
    arena_.run([&] {
      detail::check_softcap_backward(capped, dx, static_cast<double>(cap));
      detail::logit_softcap_backward(capped, dx, cap);
    });
  }

  // ---- attention -----------------------------------------------------------------------------

  /// Causal flash attention of Q rows (positions mask.q0 + r) against keys [0, K.rows) under
  /// the mask (valid_len, window, documents): O (nq, heads*hd), lse (nq, heads). Never stores
  /// an (nq x nk) score matrix; tiles outside every row's key interval are never computed.
  void attention_forward(attention_shape shape, matrix_view<const T> q, matrix_view<const T> k,
                         matrix_view<const T> v, const attention_mask& mask, T scale,
                         matrix_view<T> o, matrix_view<T> lse) {
    arena_.run([&] {
      detail::check_attention_forward(shape, q, k, v, mask, scale, o, lse);
      const detail::attention_problem<T> pb{shape, q, k, v, mask, scale};
      const auto elements = detail::attention_forward(pb, o, lse, tiling(), memory_);
      ++stats_.attention_forward_calls;
      stats_.attention_flops +=
          4.0 * static_cast<double>(shape.head_dim) * static_cast<double>(elements);
    });
  }

  /// The exact gradient of attention_forward: dQ += , dK += , dV += (shapes of Q, K, V), given
  /// O, dO (nq, heads*hd) and lse (nq, heads) of the forward. Recomputes the score tiles.
  void attention_backward(attention_shape shape, matrix_view<const T> q, matrix_view<const T> k,
                          matrix_view<const T> v, matrix_view<const T> o, matrix_view<const T> d_o,
                          matrix_view<const T> lse, const attention_mask& mask, T scale,
                          matrix_view<T> dq, matrix_view<T> dk, matrix_view<T> dv) {
    arena_.run([&] {
      detail::check_attention_backward(shape, q, k, v, o, d_o, lse, mask, scale, dq, dk, dv);
      const detail::attention_problem<T> pb{shape, q, k, v, mask, scale};
      const auto work = detail::attention_backward(pb, o, d_o, lse, dq, dk, dv, tiling(), memory_);
      ++stats_.attention_backward_calls;
      // Tile GEMM flops actually done: key-major pass 5 products (4 without dQ), query-major 3.
      const double per_key = work.query_major_elements > 0 ? 8.0 : 10.0;
      stats_.attention_flops += static_cast<double>(shape.head_dim) *
                                (per_key * static_cast<double>(work.key_major_elements) +
                                 6.0 * static_cast<double>(work.query_major_elements));
    });
  }

  // ---- cross-entropy -------------------------------------------------------------------------

  /// lse_i = logsumexp(logits_i / tau), logprob_i = logits_i[y_i] / tau - lse_i (0 if ignored).
  void xent_forward(matrix_view<const T> logits, std::span<const token_id> labels, T tau,
                    std::span<T> lse, std::span<T> logprob) {
    arena_.run([&] {
      detail::check_xent_forward(logits, labels, tau, lse, logprob);
      detail::xent_forward(logits, labels, tau, lse, logprob);
    });
  }
  /// logits := coeff_i * (onehot(y_i) - softmax(logits_i / tau)) / tau in place; ignored rows 0.
  void xent_backward(matrix_view<T> logits, std::span<const token_id> labels,
                     std::span<const T> lse, std::span<const T> coeff, T tau) {
    arena_.run([&] {
      detail::check_xent_backward(logits, labels, lse, coeff, tau);
      detail::xent_backward(logits, labels, lse, coeff, tau);
    });
  }

  // ---- optimizer updates -----------------------------------------------------------------------

  /// One Adam / AdamW step (torch formulas) on param with moments m, v.
  void adam_update(std::span<T> param, std::span<const T> grad, std::span<T> m, std::span<T> v,
                   const adam_hyper<T>& hyper) {
    arena_.run([&] {
      detail::check_adam(param, grad, m, v, hyper);
      detail::adam_update(param, grad, m, v, hyper);
    });
  }
  /// One SGD step (optional momentum, weight decay, sign); momentum_buf is empty iff momentum 0.
  void sgd_update(std::span<T> param, std::span<const T> grad, std::span<T> momentum_buf,
                  const sgd_hyper<T>& hyper) {
    arena_.run([&] {
      detail::check_sgd(param, grad, momentum_buf, hyper);
      detail::sgd_update(param, grad, momentum_buf, hyper);
    });
  }

 private:
  detail::gemm_tuning gemm_opts() const {
    detail::gemm_tuning t;
    t.parallel_min_flops = options_.gemm_parallel_min_flops;
    t.min_block = options_.gemm_min_block;
    return t;
  }
  detail::attention_tiling tiling() const {
    return {options_.attention_tile_q, options_.attention_tile_k, options_.attention_backward,
            options_.attention_partials_max_bytes};
  }

  using detail::host_storage<T>::memory_;
  using detail::host_storage<T>::stats_;

  eigen_backend_options options_;
  detail::thread_arena arena_;  // the kernels' workers (options.threads)
};

static_assert(Backend<eigen_backend<float>>);
static_assert(Backend<eigen_backend<double>>);

}  // namespace tightfit
