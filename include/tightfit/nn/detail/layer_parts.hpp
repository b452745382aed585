// tightfit/nn/detail/layer_parts.hpp: the pieces of the attention half that the StreamBP layer
// skeleton (nn/streambp_layer.hpp) and its sequence-parallel extension (nn/ring_attention.hpp)
// are written from.
//
//   layer_weights     a layer's parameter values and gradient buffers as matrices; a parameter
//                     without a gradient buffer is frozen (its gradient is not accumulated)
//   layer_positions   per batch: RoPE frequencies (dynamic: of the batch), document starts of
//                     packed rows, and each sequence's attention mask (window, soft-cap)
//   kv_rows           K/V of all B*T rows of one layer and their gradient accumulators
//   store_kv          a chunk's projected K/V -> k-norm, RoPE -> rows [c0, c1) of kv_rows
//   finish_q          a chunk's projected Q -> q-norm, RoPE
//   attend_forward / attend_backward   each sequence's chunk queries against its key prefix
//   unfinish_q, kv_grad_rows           the backward of finish_q / store_kv
//
// Invariants: K/V are stored after k-norm and RoPE (what attention reads), with the pre-norm K
// and its rstd kept for the k-norm backward; dK/dV accumulate w.r.t. the stored (rotated) K and
// V; a chunk's kv_grad_rows are final once every later query chunk has run its backward.
#pragma once

#include <algorithm>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "tightfit/backend/concept.hpp"
#include "tightfit/nn/config.hpp"
#include "tightfit/nn/layer.hpp"
#include "tightfit/nn/parameters.hpp"
#include "tightfit/nn/rope.hpp"

namespace tightfit::detail {

/// A layer's view of its parameter_set: values and gradient buffers as matrices and vectors.
template <StorageBackend B>
class layer_weights {
 public:
  using T = storage_t<B>;
  using A = accum_t<B>;
  explicit layer_weights(parameter_set<B>& params) : params_(&params) {}
  parameter_set<B>& params() const { return *params_; }

  matrix_view<const T> weight(std::size_t id, index_t rows, index_t cols) const {
    return as_matrix(std::span<const T>(params_->value(id)), rows, cols);
  }
  std::span<const T> vec(std::size_t id) const { return params_->value(id); }
  matrix_view<T> grad(std::size_t id, index_t rows, index_t cols) const {
    return as_matrix(params_->grad(id), rows, cols);
  }
  /// Whether the gradient of parameter `id` is accumulated: weight gradients are asked for and
  /// the parameter holds a gradient buffer (one without is frozen).
  bool wants(std::size_t id, bool wg) const { return wg && params_->has_grad(id); }
  /// The gradient of a vector parameter, or empty when it is not accumulated.
  std::span<T> grad_vec(std::size_t id, bool wg) const {
    return wants(id, wg) ? params_->grad(id) : std::span<T>{};
  }

  // A projection with weight W = parameter `id` of shape (out, in), rows x (n, in), y (n, out).

  /// y = x W^T + beta y.
  void linear(B& be, std::size_t id, matrix_view<const T> x, matrix_view<T> y, A beta) const {
    be.gemm(transpose::no, transpose::yes, A(1), x, weight(id, y.cols, x.cols), beta, y);
  }
  /// The input gradient of linear: dx = dy W + beta dx.
  void linear_input_grad(B& be, std::size_t id, matrix_view<const T> dy, matrix_view<T> dx,
                         A beta) const {
    be.gemm(transpose::no, transpose::no, A(1), dy, weight(id, dy.cols, dx.cols), beta, dx);
  }
  /// The weight gradient of linear, when wants(id, wg): dW += dy^T x.
  void linear_weight_grad(B& be, std::size_t id, matrix_view<const T> dy, matrix_view<const T> x,
                          bool wg) const {
    if (wants(id, wg))
      be.gemm(transpose::yes, transpose::no, A(1), dy, x, A(1), grad(id, dy.cols, x.cols));
  }

 private:
  parameter_set<B>* params_;
};

/// Checks that x/y (or dy/dx) hold `rows` rows of config.hidden_size columns.
template <class T>
void check_layer_rows(const std::string& where, index_t rows, index_t hidden,
                      matrix_view<const T> in, matrix_view<T> out) {
  check_extent(where.c_str(), "input rows", in.rows, rows);
  check_extent(where.c_str(), "input cols", in.cols, hidden);
  check_extent(where.c_str(), "output rows", out.rows, rows);
  check_extent(where.c_str(), "output cols", out.cols, hidden);
}

/// Where each row sits: RoPE frequencies and the attention mask of one layer for one batch.
class layer_positions {
 public:
  layer_positions() = default;
  /// rope_config: the config whose RoPE fields this layer uses (Gemma 3's sliding layers swap
  /// in rope_local_base_freq); window: the layer's sliding window (0: none); softcap: the
  /// attention score soft-cap (0: none).
  layer_positions(const model_config& rope_config, index_t window, double softcap)
      : rope_cfg_(rope_config),
        rope_(rope_init(rope_config, rope_config.max_position_embeddings)),
        window_(window),
        softcap_(softcap) {}

  /// Per-batch state from the batch layout: document starts (packed sequences) and, for dynamic
  /// rope, the frequencies of the batch's largest position.
  void prepare(const sequence_batch& seq) {
    seq.validate();
    doc_start_.clear();
    index_t longest = seq.seq_len;
    if (!seq.position_ids.empty()) {
      doc_start_.resize(static_cast<std::size_t>(seq.rows()));
      longest = 0;
      for (index_t r = 0; r < seq.rows(); ++r) {
        const index_t pos = seq.position_ids[static_cast<std::size_t>(r)];
        doc_start_[static_cast<std::size_t>(r)] = r % seq.seq_len - pos;
        longest = std::max(longest, pos + 1);
      }
    }
    if (rope_cfg_.rope_scaling.rope_type == "dynamic") rope_ = rope_init(rope_cfg_, longest);
  }

  /// The attention mask of sequence b's queries from position c0 on.
  attention_mask mask_of(const sequence_batch& seq, index_t b, index_t c0) const {
    attention_mask m;
    m.q0 = c0;
    m.valid_len = seq.length(b);
    m.window = window_;
    m.softcap = softcap_;
    if (!doc_start_.empty())
      m.doc_start = std::span<const index_t>(doc_start_)
                        .subspan(static_cast<std::size_t>(b * seq.seq_len),
                                 static_cast<std::size_t>(seq.seq_len));
    return m;
  }

  /// RoPE (or its backward) on the rows of every sequence of a gathered (B*c, heads*hd) chunk
  /// of positions [c0, c1).
  template <TransformerBackend B>
  void rope_rows(B& be, const sequence_batch& seq, matrix_view<storage_t<B>> m, index_t heads,
                 index_t head_dim, index_t c0, index_t c1, bool backward) const {
    const index_t c = c1 - c0;
    for (index_t b = 0; b < seq.batch; ++b) {
      auto rows = m.row_range(b * c, (b + 1) * c);
      const rope_args r = seq.position_ids.empty()
                              ? rope_.args(c0)
                              : rope_.args(0, seq.position_ids.subspan(
                                                  static_cast<std::size_t>(b * seq.seq_len + c0),
                                                  static_cast<std::size_t>(c)));
      if (backward)
        be.rope_backward(rows, heads, head_dim, r);
      else
        be.rope_forward(rows, heads, head_dim, r);
    }
  }

  index_t window() const { return window_; }

 private:
  model_config rope_cfg_{};
  rope_frequencies rope_{};
  index_t window_ = 0;
  double softcap_ = 0;
  std::vector<index_t> doc_start_;  // (B*T) t - position_ids[t] for packed batches, else empty
};

/// Where a layer's per-row buffers keep a chunk's rows [c0, c1): here all B*T rows of the
/// batch (gather_rows / scatter_rows). A layer over a sequence shard passes a map of its own
/// rows with the same three members.
struct batch_rows {
  index_t rows(const sequence_batch& seq) const { return seq.rows(); }
  template <DenseBackend B, class U>
  void gather(B& be, const sequence_batch& seq, index_t c0, index_t c1,
              std::type_identity_t<matrix_view<const U>> src, matrix_view<U> dst) const {
    gather_rows<B, U>(be, seq, c0, c1, src, dst);
  }
  template <DenseBackend B, class U>
  void scatter(B& be, const sequence_batch& seq, index_t c0, index_t c1,
               std::type_identity_t<matrix_view<const U>> src, matrix_view<U> dst) const {
    scatter_rows<B, U>(be, seq, c0, c1, src, dst);
  }
};

/// The first `rows` rows of a (>= rows, cols) buffer (a ring block's buffer holds the most rows
/// any rank owns; its own rows come first).
template <class Buffer>
auto first_rows(const Buffer& b, index_t rows, index_t cols) {
  return as_matrix(b.span().subspan(0, static_cast<std::size_t>(rows * cols)), rows, cols);
}

/// K/V of all B*T rows of one layer (Hkv heads of hd) and their gradient accumulators.
template <StorageBackend B>
struct kv_rows {
  using buffer = buffer_t<B>;
  buffer k_raw;              // (B*T, Hkv*hd) k before k-norm (only with qk_norm)
  accum_buffer_t<B> rstd_k;  // (B*T*Hkv) k-norm rstd, accum_t (only with qk_norm)
  buffer k;                  // (B*T, Hkv*hd) after k-norm and RoPE
  buffer v;                  // (B*T, Hkv*hd)
  buffer dk;                 // (B*T, Hkv*hd) accumulator, w.r.t. k
  buffer dv;                 // (B*T, Hkv*hd) accumulator

  kv_rows() = default;
  kv_rows(B& be, const model_config& c, index_t rows) {
    using T = storage_t<B>;
    if (c.qk_norm) {
      k_raw = be.template allocate<T>(rows * c.kv_width());
      rstd_k = be.template allocate<accum_t<B>>(rows * c.num_key_value_heads);
    }
    k = be.template allocate<T>(rows * c.kv_width());
    v = be.template allocate<T>(rows * c.kv_width());
  }
  /// Zeroed dK/dV accumulators over the same rows.
  void allocate_grads(B& be, const model_config& c, index_t rows) {
    dk = be.template allocate<storage_t<B>>(rows * c.kv_width());
    dv = be.template allocate<storage_t<B>>(rows * c.kv_width());
  }
};

/// The chunk's projected K and V (n = B*(c1-c0) rows, consumed): V and, with qk_norm, the
/// pre-norm K and its rstd (unless kv holds no k-norm state) go to the chunk's rows of kv
/// (placed by `map`); K after k-norm (scale k_norm) and RoPE.
template <TransformerBackend B, class RowMap = batch_rows>
void store_kv(B& be, const sequence_batch& seq, const model_config& c, const layer_positions& pos,
              std::span<const storage_t<B>> k_norm, buffer_t<B> k_c, buffer_t<B> v_c, index_t c0,
              index_t c1, kv_rows<B>& kv, const RowMap& map = {}) {
  using T = storage_t<B>;
  using A = accum_t<B>;
  const index_t n = (c1 - c0) * seq.batch, kvw = c.kv_width(), hd = c.head_dim;
  const index_t hkv = c.num_key_value_heads, rows = map.rows(seq);
  map.scatter(be, seq, c0, c1, matrix_view<const T>(v_c.view(n, kvw)), first_rows(kv.v, rows, kvw));
  if (c.qk_norm) {
    if (!kv.k_raw.empty())
      map.scatter(be, seq, c0, c1, matrix_view<const T>(k_c.view(n, kvw)),
                  kv.k_raw.view(rows, kvw));
    buffer_t<B> kn = be.template allocate<T>(n * kvw);          // (n*Hkv, hd)
    accum_buffer_t<B> rstd = be.template allocate<A>(n * hkv);  // (n*Hkv)
    be.rmsnorm_forward(k_c.view(n * hkv, hd), k_norm, A(c.rms_norm_eps), kn.view(n * hkv, hd),
                       rstd.span());
    if (!kv.rstd_k.empty())
      map.scatter(be, seq, c0, c1, matrix_view<const A>(rstd.view(n, hkv)),
                  kv.rstd_k.view(rows, hkv));
    k_c = std::move(kn);
  }
  pos.rope_rows(be, seq, k_c.view(n, kvw), hkv, hd, c0, c1, false);
  map.scatter(be, seq, c0, c1, matrix_view<const T>(k_c.view(n, kvw)), first_rows(kv.k, rows, kvw));
}

/// Q of a chunk (n = B*(c1-c0) rows) after its projection: with qk_norm, q_raw holds the
/// projection and q (n, H*hd) receives its q-norm (scale q_norm, rstd (n*H)); without, the
/// projection is in q already. Then RoPE on q.
template <TransformerBackend B>
void finish_q(B& be, const sequence_batch& seq, const model_config& c, const layer_positions& pos,
              std::span<const storage_t<B>> q_norm, const buffer_t<B>& q_raw,
              accum_buffer_t<B>& rstd_q, buffer_t<B>& q, index_t c0, index_t c1) {
  const index_t n = (c1 - c0) * seq.batch, h = c.num_attention_heads, hd = c.head_dim;
  if (c.qk_norm)
    be.rmsnorm_forward(q_raw.view(n * h, hd), q_norm, accum_t<B>(c.rms_norm_eps), q.view(n * h, hd),
                       rstd_q.span());
  pos.rope_rows(be, seq, q.view(n, c.q_width()), h, hd, c0, c1, false);
}

/// o (n, H*hd), lse (n, H) = attention of each sequence's chunk queries q (n, H*hd) against its
/// keys [0, c1) in kv, at the config's attention scale.
template <TransformerBackend B>
void attend_forward(B& be, const sequence_batch& seq, const model_config& c,
                    const layer_positions& pos, const kv_rows<B>& kv,
                    matrix_view<const storage_t<B>> q, matrix_view<storage_t<B>> o,
                    matrix_view<accum_t<B>> lse, index_t c0, index_t c1) {
  const index_t ch = c1 - c0, t = seq.seq_len, kvw = c.kv_width(), rows = seq.rows();
  const attention_shape shape{c.num_attention_heads, c.num_key_value_heads, c.head_dim};
  const auto scale = static_cast<accum_t<B>>(c.attention_scale());
  for (index_t b = 0; b < seq.batch; ++b) {
    auto keys = kv.k.view(rows, kvw).row_range(b * t, b * t + c1);
    auto vals = kv.v.view(rows, kvw).row_range(b * t, b * t + c1);
    be.attention_forward(shape, q.row_range(b * ch, (b + 1) * ch), keys, vals,
                         pos.mask_of(seq, b, c0), scale, o.row_range(b * ch, (b + 1) * ch),
                         lse.row_range(b * ch, (b + 1) * ch));
  }
}

/// The backward of attend_forward: dq (n, H*hd) += and kv.dk / kv.dv rows [0, c1) += (the
/// accumulators are written through their views).
template <TransformerBackend B>
void attend_backward(B& be, const sequence_batch& seq, const model_config& c,
                     const layer_positions& pos, const kv_rows<B>& kv,
                     matrix_view<const storage_t<B>> q, matrix_view<const storage_t<B>> o,
                     matrix_view<const storage_t<B>> d_o, matrix_view<const accum_t<B>> lse,
                     matrix_view<storage_t<B>> dq, index_t c0, index_t c1) {
  const index_t ch = c1 - c0, t = seq.seq_len, kvw = c.kv_width(), rows = seq.rows();
  const attention_shape shape{c.num_attention_heads, c.num_key_value_heads, c.head_dim};
  const auto scale = static_cast<accum_t<B>>(c.attention_scale());
  for (index_t b = 0; b < seq.batch; ++b) {
    const index_t r0 = b * ch, r1 = (b + 1) * ch;
    auto keys = kv.k.view(rows, kvw).row_range(b * t, b * t + c1);
    auto vals = kv.v.view(rows, kvw).row_range(b * t, b * t + c1);
    be.attention_backward(shape, q.row_range(r0, r1), keys, vals, o.row_range(r0, r1),
                          d_o.row_range(r0, r1), lse.row_range(r0, r1), pos.mask_of(seq, b, c0),
                          scale, dq.row_range(r0, r1),
                          kv.dk.view(rows, kvw).row_range(b * t, b * t + c1),
                          kv.dv.view(rows, kvw).row_range(b * t, b * t + c1));
  }
}

/// The backward of finish_q: dq (n, H*hd) w.r.t. the rotated, normed q becomes the gradient
/// w.r.t. the projection (RoPE undone, then the q-norm's backward; dw += into q_norm_grad when
/// not empty).
template <TransformerBackend B>
void unfinish_q(B& be, const sequence_batch& seq, const model_config& c, const layer_positions& pos,
                std::span<const storage_t<B>> q_norm, std::span<storage_t<B>> q_norm_grad,
                const buffer_t<B>& q_raw, const accum_buffer_t<B>& rstd_q, buffer_t<B>& dq,
                index_t c0, index_t c1) {
  const index_t n = (c1 - c0) * seq.batch, h = c.num_attention_heads, hd = c.head_dim;
  pos.rope_rows(be, seq, dq.view(n, c.q_width()), h, hd, c0, c1, true);
  if (!c.qk_norm) return;
  buffer_t<B> dq_raw = be.template allocate<storage_t<B>>(n * c.q_width());  // (n, H*hd)
  be.rmsnorm_backward(q_raw.view(n * h, hd), q_norm, rstd_q.span(), dq.view(n * h, hd),
                      dq_raw.view(n * h, hd), q_norm_grad);
  dq = std::move(dq_raw);
}

/// dK, dV (n, Hkv*hd) of rows [c0, c1) w.r.t. the K/V projections' outputs: gathered (by
/// `map`) from the accumulators in kv (which must be complete for these rows), RoPE undone,
/// then the k-norm's backward (dw += into k_norm_grad when not empty).
template <TransformerBackend B, class RowMap = batch_rows>
std::pair<buffer_t<B>, buffer_t<B>> kv_grad_rows(B& be, const sequence_batch& seq,
                                                 const model_config& c, const layer_positions& pos,
                                                 const kv_rows<B>& kv,
                                                 std::span<const storage_t<B>> k_norm,
                                                 std::span<storage_t<B>> k_norm_grad, index_t c0,
                                                 index_t c1, const RowMap& map = {}) {
  using T = storage_t<B>;
  const index_t n = (c1 - c0) * seq.batch, kvw = c.kv_width(), hkv = c.num_key_value_heads;
  const index_t hd = c.head_dim, rows = map.rows(seq);
  buffer_t<B> dk = be.template allocate<T>(n * kvw);  // (n, Hkv*hd)
  buffer_t<B> dv = be.template allocate<T>(n * kvw);  // (n, Hkv*hd)
  map.gather(be, seq, c0, c1, matrix_view<const T>(first_rows(kv.dk, rows, kvw)), dk.view(n, kvw));
  map.gather(be, seq, c0, c1, matrix_view<const T>(first_rows(kv.dv, rows, kvw)), dv.view(n, kvw));
  pos.rope_rows(be, seq, dk.view(n, kvw), hkv, hd, c0, c1, true);
  if (c.qk_norm) {
    buffer_t<B> k_raw = be.template allocate<T>(n * kvw);                // (n, Hkv*hd)
    accum_buffer_t<B> rstd = be.template allocate<accum_t<B>>(n * hkv);  // (n, Hkv)
    map.gather(be, seq, c0, c1, matrix_view<const T>(kv.k_raw.view(rows, kvw)), k_raw.view(n, kvw));
    map.gather(be, seq, c0, c1, matrix_view<const accum_t<B>>(kv.rstd_k.view(rows, hkv)),
               rstd.view(n, hkv));
    buffer_t<B> dk_raw = be.template allocate<T>(n * kvw);  // (n, Hkv*hd)
    be.rmsnorm_backward(k_raw.view(n * hkv, hd), k_norm, rstd.span(), dk.view(n * hkv, hd),
                        dk_raw.view(n * hkv, hd), k_norm_grad);
    dk = std::move(dk_raw);
  }
  return {std::move(dk), std::move(dv)};
}

}  // namespace tightfit::detail
