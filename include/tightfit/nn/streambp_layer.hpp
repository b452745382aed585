// tightfit/nn/streambp_layer.hpp: the StreamBP layer skeleton both shipped decoder layers are
// built on (StreamBP, Luo et al., NeurIPS 2025, arXiv 2506.03077; docs/streambp.md). A layer
// derives from streambp_layer<Layer, B> (CRTP) and states only what its architecture
// is; the skeleton runs it: the Layer protocol (forward, begin_backward, backward_chunk,
// end_backward) over a pre-norm decoder block, and the two extensions any layer built on it
// gets: LoRA adapters on every projection (nn/adapters.hpp) and the sequence-parallel ring
// (nn/ring_attention.hpp, SequenceParallelLayer). Per chunk of rows (n = B*(c1 - c0)):
//
//   h1 = N(x; input_norm)                            N: RMSNorm with scale norm_offset + w
//   Q = h1 Wq^T + bq, K = h1 Wk^T + bk, V = h1 Wv^T + bv (+ LoRA); optional per-head q/k-norm;
//   RoPE (the layer's frequencies: config.layer_rope_config); o = causal GQA attention (the
//   layer's window, soft-cap, packed documents), attention scale config.attention_scale()
//   x2 = x + P_attn(o Wo^T + bo)                     P_attn = N(.; attn_out_norm) with post-norms
//   h2 = N(x2; mlp_norm)
//   y  = x2 + P_mlp(act(h2 Wg^T + bg, h2 Wu^T + bu) Wd^T + bd)    P_mlp = N(.; mlp_out_norm)
//
// What a layer states: Layer::name(), Layer::accept(config) (refuses a config it does not
// implement), Layer::activation (the gated MLP's: SwiGLU or GeGLU), Layer::post_norms (whether
// the attention and MLP outputs are normed before the residual add: Gemma; P = identity
// otherwise: Llama), Layer::table(config) (its parameter table, param_row<block_params>:
// name, shape, slot, nn/block_params.hpp; its norms are its vectors that are not biases, and
// their (offset + w) scales are made in table order). Biases are the config's (qkv_bias,
// o_bias, mlp_bias).
//
// Invariants of the backward: K and V of all positions are computed once per layer
// (begin_backward) and never replicated per query head; chunks run last to first, so when chunk
// [c0, c1) is done the dK/dV rows of [c0, c1) are complete and their projections are
// backpropagated then; parameter gradients accumulate with beta = 1 GEMMs; a parameter without a
// gradient buffer is frozen (no weight-gradient GEMM). Biases need no kernel: Y += 1 b is a
// rank-1 GEMM with a ones column, db += 1^T dY its transpose. Without post-norms the forward of
// a chunk stops at the MLP activation (its output rows are made in write_output), so a
// recomputed chunk never holds them; with post-norms (the norm needs m = act Wd^T) the forward
// makes them and a recomputed chunk frees them before its backward.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "tightfit/backend/concept.hpp"
#include "tightfit/core/error.hpp"
#include "tightfit/nn/adapters.hpp"
#include "tightfit/nn/block_params.hpp"
#include "tightfit/nn/config.hpp"
#include "tightfit/nn/detail/layer_parts.hpp"
#include "tightfit/nn/layer.hpp"
#include "tightfit/nn/norm_weight.hpp"
#include "tightfit/nn/parameters.hpp"
#include "tightfit/nn/ring_attention.hpp"
#include "tightfit/nn/sequence_shard.hpp"

namespace tightfit {

/// Activations of positions [c0, c1) of all sequences (n = B*(c1-c0) gathered rows).
template <StorageBackend B>
struct layer_acts {
  using T = storage_t<B>;
  using buffer = buffer_t<B>;
  using stat_buffer = accum_buffer_t<B>;  ///< rstd, lse: accum_t
  index_t c0 = 0, c1 = 0, n = 0;
  // sequence_batch::first_row: the run's rows, which the LoRA dropout masks are keyed by
  std::int64_t first_row = 0;
  buffer x;                 // (n, d) gathered input (empty when the chunk is all of x's rows)
  matrix_view<const T> xv;  // (n, d) view of the input rows
  buffer h1;                // (n, d) N(x; input_layernorm)
  stat_buffer rstd1;        // (n)
  buffer q_raw;             // (n, H*hd) before q-norm (only with qk_norm)
  stat_buffer rstd_q;       // (n*H)
  buffer q;                 // (n, H*hd) after q-norm and RoPE
  buffer o;                 // (n, H*hd) attention output
  stat_buffer lse;          // (n, H)
  buffer ao;                // (n, d) o Wo^T before attn_out_norm (post-norms only)
  stat_buffer rstd_a;       // (n) (post-norms only)
  buffer x2;                // (n, d) residual after attention
  buffer h2;                // (n, d) N(x2; mlp_norm)
  stat_buffer rstd2;        // (n)
  buffer gate;              // (n, f)
  buffer up;                // (n, f)
  buffer act;               // (n, f) act(gate, up)
  buffer m;                 // (n, d) act Wd^T before mlp_out_norm (post-norms only)
  stat_buffer rstd_m;       // (n) (post-norms only)
  buffer y;                 // (n, d) the chunk's output rows until scattered (post-norms only)
};

/// The skeleton (see the top comment). Layer derives from it.
template <class Layer, TransformerBackend B>
class streambp_layer : public ring_attention<streambp_layer<Layer, B>, B> {
  using ring = ring_attention<streambp_layer, B>;
  friend ring;

 public:
  using T = storage_t<B>;
  using A = accum_t<B>;
  using buffer = buffer_t<B>;
  using acts = layer_acts<B>;

  streambp_layer(parameter_set<B>& params, const model_config& config, index_t layer_index)
      : w_(params),
        cfg_(Layer::accept(config)),
        index_(layer_index),
        pos_(config.layer_rope_config(layer_index), config.layer_window(layer_index),
             config.attn_logit_softcapping) {
    const std::string p = hf_names::layer_prefix(layer_index);
    for (const auto& row : Layer::table(cfg_)) {
      ids_.*row.slot = params.at(p + row.spec.name);
      if (is_norm(row.spec)) norm_ids_.push_back(ids_.*row.slot);
    }
  }

  /// This layer's parameters (names under "model.layers.N.", shapes): Layer::table.
  static std::vector<param_spec> parameter_table(const model_config& c) {
    std::vector<param_spec> t;
    for (auto& row : Layer::table(c)) t.push_back(std::move(row.spec));
    return t;
  }

  /// The layer's name in messages ("decoder_layer", "gemma_layer").
  static const char* layer_name() { return Layer::name(); }
  const block_params& param_ids() const { return ids_; }
  index_t layer_index() const { return index_; }

  /// Binds LoRA adapters to this layer's projections (an empty binding removes them).
  void set_lora(const lora_binding<B>& binding) { lora_ = binding; }
  const lora_binding<B>& lora() const { return lora_; }

  /// y (B*T, d) = layer(x (B*T, d)), `chunk` positions at a time (a KV-cache style forward:
  /// chunk j appends its K/V rows, then attends to the prefix). keep: keep every activation.
  void forward(B& be, const sequence_batch& seq, matrix_view<const T> x, matrix_view<T> y,
               index_t chunk, bool keep) {
    check_rows("forward", seq, x, y);
    check(chunk >= 1, layer_name(), "::forward: chunk is ", chunk, ", expected >= 1");
    pos_.prepare(seq);
    norms_.emplace(make_norms(be));
    const index_t t = seq.seq_len;
    if (keep) chunk = t;
    kv_state kv(be, cfg_, seq.rows());
    for (index_t c0 = 0; c0 < t; c0 += chunk) {
      const index_t c1 = std::min(t, c0 + chunk);
      acts a = make_acts(be, seq, x, c0, c1);
      project_kv(be, seq, a, c0, c1, kv);
      forward_chunk(be, seq, a, kv, c0, c1);
      write_rows(be, seq, a, c0, c1, y);
      if (keep) kept_acts_.emplace(std::move(a));
    }
    if (keep) kept_kv_.emplace(std::move(kv));
    norms_.reset();
  }

  /// Backward state: the norm scales, K/V of every position once (or the kept ones), dK/dV
  /// accumulators. K/V are recomputed `chunk` positions at a time, so no (B*T, d) temporary is
  /// needed.
  void begin_backward(B& be, const sequence_batch& seq, matrix_view<const T> x, index_t chunk,
                      layer_grad_mode /*mode*/) {
    check_extent((std::string(layer_name()) + "::begin_backward").c_str(), "x.rows", x.rows,
                 seq.rows());
    pos_.prepare(seq);
    norms_.emplace(make_norms(be));
    if (kept_kv_) {
      kv_ = std::move(*kept_kv_);
      kept_kv_.reset();
    } else {
      kv_.emplace(be, cfg_, seq.rows());
      const index_t t = seq.seq_len, step = std::max<index_t>(1, chunk);
      for (index_t c0 = 0; c0 < t; c0 += step) {
        const index_t c1 = std::min(t, c0 + step);
        acts a = make_acts(be, seq, x, c0, c1);
        project_kv(be, seq, a, c0, c1, *kv_);
      }
    }
    kv_->allocate_grads(be, cfg_, seq.rows());
  }

  /// Backward of positions [c0, c1) of every sequence (chunks must come last to first).
  void backward_chunk(B& be, const sequence_batch& seq, matrix_view<const T> x,
                      matrix_view<const T> dy, index_t c0, index_t c1, matrix_view<T> dx,
                      layer_grad_mode mode) {
    const std::string where = std::string(layer_name()) + "::backward_chunk";
    check(kv_.has_value(), where, ": begin_backward was not called");
    check(c0 >= 0 && c0 < c1 && c1 <= seq.seq_len, where, ": chunk [", c0, ", ", c1,
          ") is not inside [0, ", seq.seq_len, ")");
    check_extent(where.c_str(), "dy rows", dy.rows, this->local_rows(seq));
    check_extent(where.c_str(), "dy cols", dy.cols, cfg_.hidden_size);
    if (mode.input_grad) check_rows("backward_chunk", seq, dy, dx);
    std::optional<acts> recomputed;
    acts* a = nullptr;
    if (kept_acts_ && kept_acts_->c0 == c0 && kept_acts_->c1 == c1) {
      a = &*kept_acts_;
    } else {
      recomputed.emplace(make_acts(be, seq, x, c0, c1));
      forward_chunk(be, seq, *recomputed, *kv_, c0, c1);
      a = &*recomputed;
    }
    backward_rows(be, seq, *a, dy, c0, c1, dx, mode);
  }

  void end_backward(B& /*be*/) {
    this->end_shard();
    kv_.reset();
    kept_acts_.reset();
    kept_kv_.reset();
    norms_.reset();
  }

 protected:
  /// Per-layer K/V of all rows and the dK/dV accumulators.
  using kv_state = detail::kv_rows<B>;

  /// The scale the RMSNorm kernels read for norm parameter `id` (during a pass).
  std::span<const T> norm(std::size_t id) const { return norms_->scale(id); }

  /// gather_rows / scatter_rows for x, y, dy, dx (the whole batch's rows, or a shard's).
  void gather_x(B& be, const sequence_batch& seq, index_t c0, index_t c1, matrix_view<const T> src,
                matrix_view<T> dst) const {
    ring::gather_x(be, seq, c0, c1, src, dst);
  }
  void scatter_x(B& be, const sequence_batch& seq, index_t c0, index_t c1, matrix_view<const T> src,
                 matrix_view<T> dst) const {
    ring::scatter_x(be, seq, c0, c1, src, dst);
  }

  /// The tokens of a chunk's rows (the LoRA dropout masks' coordinates).
  static lora_rows rows_of(const acts& a) { return {a.first_row, a.c0, a.c1}; }
  void lora_forward(B& be, projection p, const lora_rows& rows, matrix_view<const T> x,
                    matrix_view<T> y) const {
    tightfit::lora_forward(be, lora_, p, x, y, rows);
  }
  void lora_backward(B& be, projection p, const lora_rows& rows, matrix_view<const T> x,
                     matrix_view<const T> dy, matrix_view<T> dx, bool wg) const {
    tightfit::lora_backward(be, lora_, p, x, dy, dx, wg, rows);
  }

  /// y (n, w) += 1 (n, 1) b (1, w): bias `id` added to every row, as a rank-1 GEMM.
  void add_bias(B& be, std::size_t id, matrix_view<T> y) const {
    buffer ones = be.template allocate<T>(y.rows);  // (n, 1)
    be.fill(ones.view(y.rows, 1), A(1));
    be.gemm(transpose::no, transpose::no, A(1), matrix_view<const T>(ones.view(y.rows, 1)),
            as_matrix(w_.vec(id), 1, y.cols), A(1), y);
  }
  /// grad of bias `id` (1, w) += 1^T (1, n) dy (n, w): the column sums of dy.
  void add_bias_grad(B& be, std::size_t id, matrix_view<const T> dy) const {
    buffer ones = be.template allocate<T>(dy.rows);  // (n, 1)
    be.fill(ones.view(dy.rows, 1), A(1));
    be.gemm(transpose::yes, transpose::no, A(1), matrix_view<const T>(ones.view(dy.rows, 1)), dy,
            A(1), w_.grad(id, 1, dy.cols));
  }

  /// One projection: its weight, bias and adapter.
  struct proj_ids {
    std::size_t weight, bias;
    projection p;
  };
  /// Two projections of one input h (n, in) of the tokens `rows`, in this order: ya = h Wa^T,
  /// yb = h Wb^T, their biases (with_bias), their adapters (overwriting ya, yb).
  void project_pair(B& be, matrix_view<const T> h, const lora_rows& rows, proj_ids pa, proj_ids pb,
                    bool with_bias, matrix_view<T> ya, matrix_view<T> yb) const {
    w_.linear(be, pa.weight, h, ya, A(0));
    w_.linear(be, pb.weight, h, yb, A(0));
    if (with_bias) {
      add_bias(be, pa.bias, ya);
      add_bias(be, pb.bias, yb);
    }
    lora_forward(be, pa.p, rows, h, ya);
    lora_forward(be, pb.p, rows, h, yb);
  }

  /// The gated MLP's forward from h2 (n, d): gate, up (n, f) = h Wg^T (+ bg), h Wu^T (+ bu), each
  /// with its adapter, then act (n, f) = the layer's activation of (gate, up).
  void gated_mlp_forward(B& be, matrix_view<const T> h, const lora_rows& rows, buffer& gate,
                         buffer& up, buffer& act) const {
    const index_t n = h.rows, f = cfg_.intermediate_size;
    gate = be.template allocate<T>(n * f);
    up = be.template allocate<T>(n * f);
    act = be.template allocate<T>(n * f);
    project_pair(be, h, rows, {ids_.gate_proj, ids_.gate_bias, projection::gate_proj},
                 {ids_.up_proj, ids_.up_bias, projection::up_proj}, cfg_.mlp_bias, gate.view(n, f),
                 up.view(n, f));
    if constexpr (Layer::activation == glu_activation::gelu_tanh)
      be.geglu_forward(gate.view(n, f), up.view(n, f), act.view(n, f));
    else
      be.swiglu_forward(gate.view(n, f), up.view(n, f), act.view(n, f));
  }
  /// Its backward from dact (n, f), the gradient w.r.t. act (freed here with act, gate, up):
  /// dh (n, d) = dgate Wg + dup Wu (overwritten) and the adapters' part; with wg the gate and up
  /// weights' (and biases') gradients.
  void gated_mlp_backward(B& be, matrix_view<const T> h, const lora_rows& rows, buffer& gate,
                          buffer& up, buffer& act, buffer& dact, matrix_view<T> dh, bool wg) const {
    const index_t n = h.rows, f = cfg_.intermediate_size;
    act.reset();
    buffer dgate = be.template allocate<T>(n * f);  // (n, f)
    buffer dup = be.template allocate<T>(n * f);    // (n, f)
    if constexpr (Layer::activation == glu_activation::gelu_tanh)
      be.geglu_backward(gate.view(n, f), up.view(n, f), dact.view(n, f), dgate.view(n, f),
                        dup.view(n, f));
    else
      be.swiglu_backward(gate.view(n, f), up.view(n, f), dact.view(n, f), dgate.view(n, f),
                         dup.view(n, f));
    dact.reset();
    gate.reset();
    up.reset();
    w_.linear_input_grad(be, ids_.gate_proj, dgate.view(n, f), dh, A(0));
    w_.linear_input_grad(be, ids_.up_proj, dup.view(n, f), dh, A(1));
    w_.linear_weight_grad(be, ids_.gate_proj, dgate.view(n, f), h, wg);
    w_.linear_weight_grad(be, ids_.up_proj, dup.view(n, f), h, wg);
    if (cfg_.mlp_bias && w_.wants(ids_.gate_bias, wg))
      add_bias_grad(be, ids_.gate_bias, dgate.view(n, f));
    if (cfg_.mlp_bias && w_.wants(ids_.up_bias, wg))
      add_bias_grad(be, ids_.up_bias, dup.view(n, f));
    lora_backward(be, projection::gate_proj, rows, h, dgate.view(n, f), dh, wg);
    lora_backward(be, projection::up_proj, rows, h, dup.view(n, f), dh, wg);
  }

  void check_rows(const char* where, const sequence_batch& seq, matrix_view<const T> in,
                  matrix_view<T> out) const {
    detail::check_layer_rows(std::string(layer_name()) + "::" + where, this->local_rows(seq),
                             cfg_.hidden_size, in, out);
  }

  detail::layer_weights<B> w_;
  model_config cfg_;
  index_t index_;
  detail::layer_positions pos_;  // RoPE, window, soft-cap, document starts (per batch)
  block_params ids_{};

 private:
  /// The chunk's output rows into y: y = x2 + act Wd^T (+ bd), or (post-norms) the rows the
  /// forward made.
  void write_rows(B& be, const sequence_batch& seq, acts& a, index_t c0, index_t c1,
                  matrix_view<T> y) const {
    const index_t n = a.n, d = cfg_.hidden_size, f = cfg_.intermediate_size;
    if constexpr (Layer::post_norms) {
      scatter_x(be, seq, c0, c1, matrix_view<const T>(a.y.view(n, d)), y);
      a.y.reset();
    } else {
      buffer y_c = be.template allocate<T>(n * d);
      auto yv = y_c.view(n, d);  // (B*c, d)
      be.copy(a.x2.view(n, d), yv);
      w_.linear(be, ids_.down_proj, a.act.view(n, f), yv, A(1));
      if (cfg_.mlp_bias) add_bias(be, ids_.down_bias, yv);
      lora_forward(be, projection::down_proj, rows_of(a), a.act.view(n, f), yv);
      scatter_x(be, seq, c0, c1, matrix_view<const T>(yv), y);
    }
  }

  /// The block after attention (everything its backward needs): x2 = x + P_attn(o Wo^T + bo),
  /// h2 = N(x2), the gated MLP up to its activation, and with post-norms m = act Wd^T and the
  /// output rows y = x2 + N(m).
  void tail_forward(B& be, acts& a) const {
    const index_t n = a.n, d = cfg_.hidden_size, qw = cfg_.q_width(), f = cfg_.intermediate_size;
    const auto eps = static_cast<A>(cfg_.rms_norm_eps);
    if constexpr (Layer::post_norms) {  // x2 = x + N(o Wo^T; attn_out_norm)
      a.ao = be.template allocate<T>(n * d);
      w_.linear(be, ids_.o_proj, a.o.view(n, qw), a.ao.view(n, d), A(0));
      lora_forward(be, projection::o_proj, rows_of(a), a.o.view(n, qw), a.ao.view(n, d));
      a.x2 = be.template allocate<T>(n * d);
      a.rstd_a = be.template allocate<A>(n);
      be.rmsnorm_forward(a.ao.view(n, d), norm(ids_.attn_out_norm), eps, a.x2.view(n, d),
                         a.rstd_a.span());
      be.axpy(A(1), a.xv, a.x2.view(n, d));
    } else {  // x2 = x + o Wo^T + bo
      a.x2 = be.template allocate<T>(n * d);
      be.copy(a.xv, a.x2.view(n, d));
      w_.linear(be, ids_.o_proj, a.o.view(n, qw), a.x2.view(n, d), A(1));
      if (cfg_.o_bias) add_bias(be, ids_.o_bias, a.x2.view(n, d));
      lora_forward(be, projection::o_proj, rows_of(a), a.o.view(n, qw), a.x2.view(n, d));
    }
    // MLP input
    a.h2 = be.template allocate<T>(n * d);
    a.rstd2 = be.template allocate<A>(n);
    be.rmsnorm_forward(a.x2.view(n, d), norm(ids_.mlp_norm), eps, a.h2.view(n, d), a.rstd2.span());
    gated_mlp_forward(be, a.h2.view(n, d), rows_of(a), a.gate, a.up, a.act);
    if constexpr (Layer::post_norms) {  // y = x2 + N(act Wd^T; mlp_out_norm)
      a.m = be.template allocate<T>(n * d);
      a.rstd_m = be.template allocate<A>(n);
      w_.linear(be, ids_.down_proj, a.act.view(n, f), a.m.view(n, d), A(0));
      lora_forward(be, projection::down_proj, rows_of(a), a.act.view(n, f), a.m.view(n, d));
      a.y = be.template allocate<T>(n * d);
      be.rmsnorm_forward(a.m.view(n, d), norm(ids_.mlp_out_norm), eps, a.y.view(n, d),
                         a.rstd_m.span());
      be.axpy(A(1), matrix_view<const T>(a.x2.view(n, d)), a.y.view(n, d));
    }
  }

  /// dx2 (n, d): the chunk's dy rows through the MLP (and its post-norm) and the pre-MLP norm,
  /// the residual included: the gradient w.r.t. x2.
  buffer tail_backward(B& be, const sequence_batch& seq, acts& a, matrix_view<const T> dy,
                       index_t c0, index_t c1, bool wg) const {
    const index_t n = a.n, d = cfg_.hidden_size, f = cfg_.intermediate_size;
    if constexpr (Layer::post_norms) a.y.reset();  // the output rows a recomputed forward made
    // dy rows of the chunk; dx2 starts as dy (residual)
    buffer dx2 = be.template allocate<T>(n * d);  // (n, d)
    gather_x(be, seq, c0, c1, dy, dx2.view(n, d));
    {
      buffer dh2 = be.template allocate<T>(n * d);  // (n, d)
      {
        buffer dact = be.template allocate<T>(n * f);  // (n, f)
        if constexpr (Layer::post_norms) {             // y = x2 + N(m): dm = N backward of dy
          buffer dm = be.template allocate<T>(n * d);  // (n, d)
          be.rmsnorm_backward(a.m.view(n, d), norm(ids_.mlp_out_norm), a.rstd_m.span(),
                              dx2.view(n, d), dm.view(n, d), w_.grad_vec(ids_.mlp_out_norm, wg));
          a.m.reset();
          down_proj_backward(be, a, dm.view(n, d), dact.view(n, f), wg);
        } else {  // y = x2 + act Wd^T + bd
          down_proj_backward(be, a, dx2.view(n, d), dact.view(n, f), wg);
        }
        gated_mlp_backward(be, a.h2.view(n, d), rows_of(a), a.gate, a.up, a.act, dact,
                           dh2.view(n, d), wg);
      }
      be.rmsnorm_backward(a.x2.view(n, d), norm(ids_.mlp_norm), a.rstd2.span(), dh2.view(n, d),
                          dx2.view(n, d), w_.grad_vec(ids_.mlp_norm, wg));
    }
    a.h2.reset();
    a.x2.reset();
    return dx2;
  }

  /// dact (n, f) = dm Wd (overwritten) from the gradient dm (n, d) of the down projection's
  /// output, its weight's (and bias') gradients and its adapter's.
  void down_proj_backward(B& be, const acts& a, matrix_view<T> dm, matrix_view<T> dact,
                          bool wg) const {
    const auto act = a.act.view(a.n, cfg_.intermediate_size);
    w_.linear_input_grad(be, ids_.down_proj, dm, dact, A(0));
    w_.linear_weight_grad(be, ids_.down_proj, dm, act, wg);
    if (cfg_.mlp_bias && w_.wants(ids_.down_bias, wg)) add_bias_grad(be, ids_.down_bias, dm);
    lora_backward(be, projection::down_proj, rows_of(a), act, dm, dact, wg);
  }

  /// dout (n, H*hd) from dx2 through P_attn(o Wo^T + bo): the o projection's gradients (and its
  /// post-norm's).
  void out_proj_backward(B& be, acts& a, matrix_view<T> dx2, matrix_view<T> dout, bool wg) const {
    const index_t n = a.n, d = cfg_.hidden_size;
    const auto o = a.o.view(n, cfg_.q_width());
    if constexpr (Layer::post_norms) {
      buffer dao = be.template allocate<T>(n * d);  // (n, d)
      be.rmsnorm_backward(a.ao.view(n, d), norm(ids_.attn_out_norm), a.rstd_a.span(), dx2,
                          dao.view(n, d), w_.grad_vec(ids_.attn_out_norm, wg));
      a.ao.reset();
      w_.linear_input_grad(be, ids_.o_proj, dao.view(n, d), dout, A(0));
      w_.linear_weight_grad(be, ids_.o_proj, dao.view(n, d), o, wg);
      lora_backward(be, projection::o_proj, rows_of(a), o, dao.view(n, d), dout, wg);
    } else {
      w_.linear_input_grad(be, ids_.o_proj, dx2, dout, A(0));
      w_.linear_weight_grad(be, ids_.o_proj, dx2, o, wg);
      if (cfg_.o_bias && w_.wants(ids_.o_bias, wg)) add_bias_grad(be, ids_.o_bias, dx2);
      lora_backward(be, projection::o_proj, rows_of(a), o, dx2, dout, wg);
    }
  }

  /// A norm weight: a vector that is not a bias.
  static bool is_norm(const param_spec& row) {
    const std::string& n = row.name;
    return row.shape.size() == 1 && !(n.size() >= 5 && n.compare(n.size() - 5, 5, ".bias") == 0);
  }

  layer_norms<B> make_norms(B& be) {
    return layer_norms<B>(be, w_.params(), std::span<const std::size_t>(norm_ids_),
                          cfg_.norm_offset());
  }

  /// Gathers the chunk's input rows and computes h1 = N(x; input_layernorm).
  acts make_acts(B& be, const sequence_batch& seq, matrix_view<const T> x, index_t c0,
                 index_t c1) const {
    acts a;
    a.c0 = c0;
    a.c1 = c1;
    a.n = (c1 - c0) * seq.batch;
    a.first_row = seq.first_row;
    const index_t d = cfg_.hidden_size;
    if (this->whole_rows(seq, c0, c1)) {
      a.xv = x;
    } else {
      a.x = be.template allocate<T>(a.n * d);
      gather_x(be, seq, c0, c1, x, a.x.view(a.n, d));
      a.xv = a.x.view(a.n, d);
    }
    a.h1 = be.template allocate<T>(a.n * d);
    a.rstd1 = be.template allocate<A>(a.n);
    be.rmsnorm_forward(a.xv, norm(ids_.input_norm), A(cfg_.rms_norm_eps), a.h1.view(a.n, d),
                       a.rstd1.span());
    return a;
  }

  /// K and V of the chunk's rows (from a.h1) written into its rows of kv (over a shard: the own
  /// rows, local layout).
  void project_kv(B& be, const sequence_batch& seq, const acts& a, index_t c0, index_t c1,
                  kv_state& kv) const {
    const index_t n = a.n, d = cfg_.hidden_size, kvw = cfg_.kv_width();
    buffer k_c = be.template allocate<T>(n * kvw);  // (n, Hkv*hd)
    buffer v_c = be.template allocate<T>(n * kvw);  // (n, Hkv*hd)
    project_pair(be, a.h1.view(n, d), rows_of(a), {ids_.k_proj, ids_.k_bias, projection::k_proj},
                 {ids_.v_proj, ids_.v_bias, projection::v_proj}, cfg_.qkv_bias, k_c.view(n, kvw),
                 v_c.view(n, kvw));
    detail::store_kv(be, seq, cfg_, pos_, norm(ids_.k_norm), std::move(k_c), std::move(v_c), c0, c1,
                     kv, this->rows_map());
  }

  /// a.q (n, H*hd) = RoPE(q-norm(h1 Wq^T + bq)) of the chunk (q_raw, rstd_q with q-norm).
  void project_q(B& be, const sequence_batch& seq, acts& a, index_t c0, index_t c1) const {
    const index_t n = a.n, d = cfg_.hidden_size, qw = cfg_.q_width();
    const index_t h = cfg_.num_attention_heads;
    auto h1 = a.h1.view(n, d);
    a.q = be.template allocate<T>(n * qw);
    if (cfg_.qk_norm) {
      a.q_raw = be.template allocate<T>(n * qw);
      a.rstd_q = be.template allocate<A>(n * h);
      w_.linear(be, ids_.q_proj, h1, a.q_raw.view(n, qw), A(0));
      if (cfg_.qkv_bias) add_bias(be, ids_.q_bias, a.q_raw.view(n, qw));
      lora_forward(be, projection::q_proj, rows_of(a), h1, a.q_raw.view(n, qw));
    } else {
      w_.linear(be, ids_.q_proj, h1, a.q.view(n, qw), A(0));
      if (cfg_.qkv_bias) add_bias(be, ids_.q_bias, a.q.view(n, qw));
      lora_forward(be, projection::q_proj, rows_of(a), h1, a.q.view(n, qw));
    }
    detail::finish_q(be, seq, cfg_, pos_, norm(ids_.q_norm), a.q_raw, a.rstd_q, a.q, c0, c1);
  }

  /// The chunk's forward: attention, then the tail (everything backward_rows needs).
  void forward_chunk(B& be, const sequence_batch& seq, acts& a, const kv_state& kv, index_t c0,
                     index_t c1) {
    const index_t n = a.n, qw = cfg_.q_width(), h = cfg_.num_attention_heads;
    a.o = be.template allocate<T>(n * qw);
    a.lse = be.template allocate<A>(n * h);
    if (this->ring_active()) {  // over a sequence shard: the ring's merged attention rows
      this->ring_rows(be, seq, c0, c1, a.o.view(n, qw), a.lse.view(n, h));
    } else {  // each sequence's chunk queries against its key prefix [0, c1)
      project_q(be, seq, a, c0, c1);
      detail::attend_forward(be, seq, cfg_, pos_, kv, matrix_view<const T>(a.q.view(n, qw)),
                             a.o.view(n, qw), a.lse.view(n, h), c0, c1);
    }
    tail_forward(be, a);
  }

  /// Backprop of the chunk's rows given its activations.
  void backward_rows(B& be, const sequence_batch& seq, acts& a, matrix_view<const T> dy, index_t c0,
                     index_t c1, matrix_view<T> dx, layer_grad_mode mode) {
    const index_t n = a.n, d = cfg_.hidden_size, qw = cfg_.q_width(), kvw = cfg_.kv_width();
    const index_t h = cfg_.num_attention_heads;
    const bool wg = mode.weight_grads;
    buffer dx2 = tail_backward(be, seq, a, dy, c0, c1, wg);  // (n, d)
    buffer dq = be.template allocate<T>(n * qw);             // (n, H*hd) w.r.t. rotated q
    {
      buffer dout = be.template allocate<T>(n * qw);  // (n, H*hd)
      out_proj_backward(be, a, dx2.view(n, d), dout.view(n, qw), wg);
      if (this->ring_active()) {  // over a sequence shard: attention and Q/K/V run in
                                  // end_backward_shard
        this->keep_attention_grad(be, seq, c0, c1, matrix_view<const T>(dout.view(n, qw)));
        if (mode.input_grad) scatter_x(be, seq, c0, c1, matrix_view<const T>(dx2.view(n, d)), dx);
        return;
      }
      detail::attend_backward(be, seq, cfg_, pos_, *kv_, matrix_view<const T>(a.q.view(n, qw)),
                              matrix_view<const T>(a.o.view(n, qw)),
                              matrix_view<const T>(dout.view(n, qw)),
                              matrix_view<const A>(a.lse.view(n, h)), dq.view(n, qw), c0, c1);
    }
    a.o.reset();
    a.lse.reset();
    a.q.reset();
    unfinish_q(be, seq, a, dq, c0, c1, wg);  // q: undo RoPE, then q-norm
    a.q_raw.reset();
    auto h1 = a.h1.view(n, d);
    w_.linear_weight_grad(be, ids_.q_proj, dq.view(n, qw), h1, wg);
    if (cfg_.qkv_bias && w_.wants(ids_.q_bias, wg)) add_bias_grad(be, ids_.q_bias, dq.view(n, qw));
    // k, v rows of this chunk are complete now (later chunks were done first)
    auto [dk, dv] = kv_rows_backward(be, seq, c0, c1, h1, wg);
    // dh1 is needed for dx, or for the input norm's weight gradient
    const lora_rows rows = rows_of(a);
    if (!needs_dh1(mode)) {  // the adapters' gradients only
      lora_backward(be, projection::q_proj, rows, h1, dq.view(n, qw), {}, wg);
      kv_lora_backward(be, h1, rows, dk.view(n, kvw), dv.view(n, kvw), {}, wg);
      return;
    }
    // dh1 = dq Wq + dk Wk + dv Wv; dx = dx2 + RMSNorm backward
    buffer dh1 = be.template allocate<T>(n * d);  // (n, d)
    q_input_backward(be, h1, rows, dq, dh1.view(n, d), wg);
    kv_input_backward(be, h1, rows, dk.view(n, kvw), dv.view(n, kvw), dh1.view(n, d), wg);
    input_norm_grad(be, a, matrix_view<const T>(dh1.view(n, d)), dx2.view(n, d), wg);
    if (mode.input_grad) scatter_x(be, seq, c0, c1, matrix_view<const T>(dx2.view(n, d)), dx);
  }

  /// Whether the input norm's backward runs: dx is needed, or its weight's gradient.
  bool needs_dh1(layer_grad_mode mode) const {
    return mode.input_grad || w_.wants(ids_.input_norm, mode.weight_grads);
  }

  /// dq (n, H*hd) w.r.t. the rotated, normed q -> w.r.t. the q projection's output (RoPE undone,
  /// then the q-norm's backward, its weight's gradient when wg).
  void unfinish_q(B& be, const sequence_batch& seq, acts& a, buffer& dq, index_t c0, index_t c1,
                  bool wg) const {
    detail::unfinish_q(be, seq, cfg_, pos_, norm(ids_.q_norm), w_.grad_vec(ids_.q_norm, wg),
                       a.q_raw, a.rstd_q, dq, c0, c1);
  }
  /// The q weights' (and bias') gradients from dq; false when dh1 is not needed (then the q
  /// adapter's gradients were accumulated here and nothing else remains).
  bool q_weight_backward(B& be, matrix_view<const T> h1, const lora_rows& rows, const buffer& dq,
                         layer_grad_mode mode) {
    const index_t n = h1.rows, qw = cfg_.q_width();
    const bool wg = mode.weight_grads;
    w_.linear_weight_grad(be, ids_.q_proj, dq.view(n, qw), h1, wg);
    if (cfg_.qkv_bias && w_.wants(ids_.q_bias, wg)) add_bias_grad(be, ids_.q_bias, dq.view(n, qw));
    if (needs_dh1(mode)) return true;
    lora_backward(be, projection::q_proj, rows, h1, dq.view(n, qw), {}, wg);
    return false;
  }
  /// dh1 (n, d) = dq Wq and the q adapter's part.
  void q_input_backward(B& be, matrix_view<const T> h1, const lora_rows& rows, const buffer& dq,
                        matrix_view<T> dh1, bool wg) const {
    const index_t n = h1.rows, qw = cfg_.q_width();
    w_.linear_input_grad(be, ids_.q_proj, dq.view(n, qw), dh1, A(0));
    lora_backward(be, projection::q_proj, rows, h1, dq.view(n, qw), dh1, wg);
  }
  /// dh1 (n, d) += dk Wk + dv Wv and the K/V adapters' part (dk, dv: (n, Hkv*hd)).
  void kv_input_backward(B& be, matrix_view<const T> h1, const lora_rows& rows,
                         matrix_view<const T> dk, matrix_view<const T> dv, matrix_view<T> dh1,
                         bool wg) const {
    w_.linear_input_grad(be, ids_.k_proj, dk, dh1, A(1));
    w_.linear_input_grad(be, ids_.v_proj, dv, dh1, A(1));
    kv_lora_backward(be, h1, rows, dk, dv, dh1, wg);
  }
  /// The K and V adapters' backward (dh1 may be empty: their gradients only).
  void kv_lora_backward(B& be, matrix_view<const T> h1, const lora_rows& rows,
                        matrix_view<const T> dk, matrix_view<const T> dv, matrix_view<T> dh1,
                        bool wg) const {
    lora_backward(be, projection::k_proj, rows, h1, dk, dh1, wg);
    lora_backward(be, projection::v_proj, rows, h1, dv, dh1, wg);
  }
  /// dx (n, d) += the input norm's backward of dh1 (n, d), and its weight's gradient when wg.
  void input_norm_grad(B& be, const acts& a, matrix_view<const T> dh1, matrix_view<T> dx,
                       bool wg) const {
    be.rmsnorm_backward(a.xv, norm(ids_.input_norm), a.rstd1.span(), dh1, dx,
                        w_.grad_vec(ids_.input_norm, wg));
  }

  /// dK, dV (n, Hkv*hd) w.r.t. the K/V projections' outputs for rows [c0, c1) (complete in
  /// kv_->dk / dv): RoPE and k-norm undone; with wg, the k/v weights' (and biases') gradients
  /// accumulated from h1 (n, d).
  std::pair<buffer, buffer> kv_rows_backward(B& be, const sequence_batch& seq, index_t c0,
                                             index_t c1, matrix_view<const T> h1, bool wg) const {
    const index_t n = h1.rows, kvw = cfg_.kv_width();
    auto [dk, dv] = detail::kv_grad_rows(be, seq, cfg_, pos_, *kv_, norm(ids_.k_norm),
                                         w_.grad_vec(ids_.k_norm, wg), c0, c1, this->rows_map());
    w_.linear_weight_grad(be, ids_.k_proj, dk.view(n, kvw), h1, wg);
    w_.linear_weight_grad(be, ids_.v_proj, dv.view(n, kvw), h1, wg);
    if (cfg_.qkv_bias) {
      if (w_.wants(ids_.k_bias, wg)) add_bias_grad(be, ids_.k_bias, dk.view(n, kvw));
      if (w_.wants(ids_.v_bias, wg)) add_bias_grad(be, ids_.v_bias, dv.view(n, kvw));
    }
    return {std::move(dk), std::move(dv)};
  }

  std::vector<std::size_t> norm_ids_;    // the layer's norms, in table order
  std::optional<layer_norms<B>> norms_;  // their scales during a pass
  std::optional<kv_state> kv_;
  std::optional<acts> kept_acts_;
  std::optional<kv_state> kept_kv_;
  lora_binding<B> lora_{};  // adapters of the projections (none by default)
};

}  // namespace tightfit
