// tightfit/nn/adapters.hpp: low-rank adapters on a layer's projections (LoRA: Hu et al., "LoRA:
// Low-Rank Adaptation of Large Language Models", ICLR 2022, arXiv 2106.09685), the extension any
// layer gets: a lora_binding says which of a layer's linear projections (named as in Hugging
// Face, q_proj ... down_proj) carry an adapter: the positions, in a separate parameter_set (the
// adapters'), of A (r, in) and B (out, r), and the scale s (alpha / r, or alpha / sqrt(r) for
// rsLoRA). A layer that offers set_lora (LoraLayer) adds, for each projection y = x W^T,
//     lora_forward:   y += s (x A^T) B^T
//     lora_backward:  dx += s (dy B) A;  with weight gradients dA += s (dy B)^T x, dB += s dy^T (x
//     A^T)
// which are exactly the gradients of the merged weight W + s B A contracted with B and A, without
// forming it. With dropout in a training pass (nn/lora_dropout.hpp) x is x_d = x o m / (1 - p)
// in the adapter's path (never the base's) and dx's adapter part is masked alike; the mask is a
// function of the rows' tokens (lora_rows), which the layer passes. Every layer built on
// nn/streambp_layer.hpp does so; a layer written from kernels (examples/parallel_layer.hpp)
// calls the two functions itself (without lora_rows it cannot train with dropout: an error).
// nn/lora.hpp builds, initialises, saves and merges the adapters of a model.
#pragma once

#include <array>
#include <cstddef>
#include <span>
#include <string>

#include "tightfit/backend/concept.hpp"
#include "tightfit/core/error.hpp"
#include "tightfit/core/view.hpp"
#include "tightfit/nn/lora_dropout.hpp"
#include "tightfit/nn/parameters.hpp"

namespace tightfit {

/// The linear projections of a decoder layer, by Hugging Face module name.
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

/// Which projections of one layer carry an adapter, where A and B are, the scale and the
/// dropout.
template <StorageBackend B>
struct lora_binding {
  parameter_set<B>* adapters = nullptr;  ///< the adapters' set (null: no adapter)
  index_t rank = 0;                      ///< r
  double scale = 0;                      ///< s
  std::array<std::ptrdiff_t, projection_count> a{-1, -1, -1, -1, -1, -1, -1};  ///< A (r, in)
  std::array<std::ptrdiff_t, projection_count> b{-1, -1, -1, -1, -1, -1, -1};  ///< B (out, r)
  const lora_dropout* dropout = nullptr;  ///< the adapters' dropout (null: none)
  index_t layer = 0;                      ///< this layer's index (a key of the dropout mask)

  bool has(projection p) const {
    return adapters != nullptr && a[static_cast<std::size_t>(p)] >= 0;
  }
  /// Whether the adapters' inputs are dropped now (a training pass with p > 0).
  bool dropping() const { return dropout != nullptr && dropout->active(); }
  std::size_t a_id(projection p) const {
    return static_cast<std::size_t>(a[static_cast<std::size_t>(p)]);
  }
  std::size_t b_id(projection p) const {
    return static_cast<std::size_t>(b[static_cast<std::size_t>(p)]);
  }
};

/// A layer whose projections take LoRA adapters (an empty binding removes them).
template <class L, class B>
concept LoraLayer = requires(L& layer, const lora_binding<B>& binding) {
  layer.set_lora(binding);
};

namespace detail {

/// dst (n, in) = dropout(src) with projection p's mask of the binding's layer over `rows`.
template <DenseBackend B>
void lora_drop(B& be, const lora_binding<B>& lora, projection p, const lora_rows& rows,
               matrix_view<const storage_t<B>> src, matrix_view<storage_t<B>> dst) {
  apply_lora_dropout(be, *lora.dropout, lora.layer, static_cast<int>(p), rows, src, dst);
}

}  // namespace detail

/// y (n, out) += s (x A^T) B^T for projection p's adapter (nothing without one); in a training
/// pass with dropout, x_d = dropout(x) over the tokens `rows` replaces x.
template <DenseBackend B>
void lora_forward(B& be, const lora_binding<B>& lora, projection p,
                  matrix_view<const storage_t<B>> x, matrix_view<storage_t<B>> y,
                  const lora_rows& rows = {}) {
  using T = storage_t<B>;
  using A = accum_t<B>;
  if (!lora.has(p)) return;
  const index_t n = x.rows, r = lora.rank, in = x.cols;
  buffer_t<B> xd;  // (n, in) dropout(x): a training pass with dropout only
  if (lora.dropping()) {
    xd = be.template allocate<T>(n * in);
    detail::lora_drop(be, lora, p, rows, x, xd.view(n, in));
    x = matrix_view<const T>(xd.view(n, in));
  }
  auto& set = *lora.adapters;
  buffer_t<B> u = be.template allocate<T>(n * r);  // (n, r) x A^T
  be.gemm(transpose::no, transpose::yes, A(1), x,
          as_matrix(std::span<const T>(set.value(lora.a_id(p))), r, in), A(0), u.view(n, r));
  be.gemm(transpose::no, transpose::yes, A(lora.scale), matrix_view<const T>(u.view(n, r)),
          as_matrix(std::span<const T>(set.value(lora.b_id(p))), y.cols, r), A(1), y);
}

/// Backward of projection p's adapter given its input x (n, in) and output gradient dy
/// (n, out): dx (n, in) += s (dy B) A when dx is not empty; dA += s (dy B)^T x and
/// dB += s dy^T (x A^T) when wg and the adapters hold gradients. In a training pass with
/// dropout (the forward's mask, over the tokens `rows`): x_d replaces x in dA and dB, and
/// dx += s ((dy B) A) o m / (1 - p).
template <DenseBackend B>
void lora_backward(B& be, const lora_binding<B>& lora, projection p,
                   matrix_view<const storage_t<B>> x, matrix_view<const storage_t<B>> dy,
                   matrix_view<storage_t<B>> dx, bool wg, const lora_rows& rows = {}) {
  using T = storage_t<B>;
  using A = accum_t<B>;
  if (!lora.has(p)) return;
  auto& set = *lora.adapters;
  const std::size_t ia = lora.a_id(p), ib = lora.b_id(p);
  const bool grads = wg && set.has_grad(ia) && set.has_grad(ib);
  if (!grads && dx.empty()) return;
  const index_t n = x.rows, r = lora.rank, in = x.cols, out = dy.cols;
  const A s = A(lora.scale);
  const bool drop = lora.dropping();
  auto a_m = as_matrix(std::span<const T>(set.value(ia)), r, in);   // (r, in)
  auto b_m = as_matrix(std::span<const T>(set.value(ib)), out, r);  // (out, r)
  buffer_t<B> v = be.template allocate<T>(n * r);                   // (n, r) dy B
  be.gemm(transpose::no, transpose::no, A(1), dy, b_m, A(0), v.view(n, r));
  if (!dx.empty()) {
    if (!drop) {
      be.gemm(transpose::no, transpose::no, s, matrix_view<const T>(v.view(n, r)), a_m, A(1), dx);
    } else {                                            // dx += (s (dy B) A) o m / (1 - p)
      buffer_t<B> g = be.template allocate<T>(n * in);  // (n, in)
      be.gemm(transpose::no, transpose::no, s, matrix_view<const T>(v.view(n, r)), a_m, A(0),
              g.view(n, in));
      detail::lora_drop(be, lora, p, rows, matrix_view<const T>(g.view(n, in)), g.view(n, in));
      be.axpy(A(1), matrix_view<const T>(g.view(n, in)), dx);
    }
  }
  if (!grads) return;
  buffer_t<B> xd;  // (n, in) dropout(x): a training pass with dropout only
  if (drop) {
    xd = be.template allocate<T>(n * in);
    detail::lora_drop(be, lora, p, rows, x, xd.view(n, in));
    x = matrix_view<const T>(xd.view(n, in));
  }
  be.gemm(transpose::yes, transpose::no, s, matrix_view<const T>(v.view(n, r)), x, A(1),
          as_matrix(set.grad(ia), r, in));
  v.reset();
  buffer_t<B> u = be.template allocate<T>(n * r);  // (n, r) x A^T
  be.gemm(transpose::no, transpose::yes, A(1), x, a_m, A(0), u.view(n, r));
  be.gemm(transpose::yes, transpose::no, s, dy, matrix_view<const T>(u.view(n, r)), A(1),
          as_matrix(set.grad(ib), out, r));
}

}  // namespace tightfit
