// tightfit/nn/gemma_layer.hpp: the Gemma 2 / Gemma 3 decoder layer (Hugging Face's
// Gemma2DecoderLayer / Gemma3DecoderLayer), a second DecoderLayer next to the Llama / Qwen one
// (nn/decoder_layer.hpp), with the same sequence-chunked backward (StreamBP, Luo et al.,
// NeurIPS 2025, arXiv 2506.03077; docs/streambp.md, docs/models.md).
//
//   N(x; w) = RMSNorm(x) * (1 + w)   (every norm of the layer; w stored as in Hugging Face)
//   h  = N(X; input_layernorm)
//   Q  = h Wq^T, K = h Wk^T, V = h Wv^T; Gemma 3: per-head N(Q; q_norm), N(K; k_norm)
//   Q, K = RoPE(Q, K)      (Gemma 3 sliding layers: rope_local_base_freq, no scaling)
//   O  = causal GQA attention(Q, K, V), scale query_pre_attn_scalar^-1/2, scores soft-capped
//        (Gemma 2: attn_logit_softcapping), the layer's sliding window (config.layer_window)
//   X2 = X + N(O Wo^T; post_attention_layernorm)
//   h2 = N(X2; pre_feedforward_layernorm)
//   Y  = X2 + N((gelu_tanh(h2 Wg^T) * (h2 Wu^T)) Wd^T; post_feedforward_layernorm)
//
// Invariants of the backward (as decoder_layer): K and V of all positions are computed once per
// layer (begin_backward); chunks run last to first, so when chunk [c0, c1) is done its dK/dV
// rows are complete and their projections are backpropagated then; parameter gradients
// accumulate with beta = 1 GEMMs; the (1 + w) scales are small copies (nn/norm_weight.hpp)
// whose gradient is w's.
#pragma once

#include <algorithm>
#include <cmath>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tightfit/backend/concept.hpp"
#include "tightfit/nn/config.hpp"
#include "tightfit/nn/detail/layer_parts.hpp"
#include "tightfit/nn/layer.hpp"
#include "tightfit/nn/norm_weight.hpp"
#include "tightfit/nn/parameters.hpp"
#include "tightfit/nn/rope.hpp"

namespace tightfit {

/// Positions of one Gemma layer's parameters in a parameter_set.
struct gemma_layer_params {
  std::size_t input_norm = 0, q_proj = 0, k_proj = 0, v_proj = 0, o_proj = 0;
  std::size_t post_attn_norm = 0, pre_ff_norm = 0, post_ff_norm = 0;
  std::size_t gate_proj = 0, up_proj = 0, down_proj = 0;
  std::size_t q_norm = 0, k_norm = 0;  ///< Gemma 3 (config.qk_norm)
};

/// The parameter table of a Gemma layer (names under "model.layers.N.", shapes, slots).
struct gemma_param_row {
  param_spec spec;
  std::size_t gemma_layer_params::*slot;
};
inline std::vector<gemma_param_row> gemma_layer_table(const model_config& c) {
  using P = gemma_layer_params;
  const index_t d = c.hidden_size, q = c.q_width(), kv = c.kv_width(), f = c.intermediate_size;
  std::vector<gemma_param_row> t{{{"input_layernorm.weight", {d}}, &P::input_norm},
                                 {{"self_attn.q_proj.weight", {q, d}}, &P::q_proj},
                                 {{"self_attn.k_proj.weight", {kv, d}}, &P::k_proj},
                                 {{"self_attn.v_proj.weight", {kv, d}}, &P::v_proj},
                                 {{"self_attn.o_proj.weight", {d, q}}, &P::o_proj}};
  if (c.qk_norm) {
    t.push_back({{"self_attn.q_norm.weight", {c.head_dim}}, &P::q_norm});
    t.push_back({{"self_attn.k_norm.weight", {c.head_dim}}, &P::k_norm});
  }
  t.push_back({{"post_attention_layernorm.weight", {d}}, &P::post_attn_norm});
  t.push_back({{"pre_feedforward_layernorm.weight", {d}}, &P::pre_ff_norm});
  t.push_back({{"post_feedforward_layernorm.weight", {d}}, &P::post_ff_norm});
  t.push_back({{"mlp.gate_proj.weight", {f, d}}, &P::gate_proj});
  t.push_back({{"mlp.up_proj.weight", {f, d}}, &P::up_proj});
  t.push_back({{"mlp.down_proj.weight", {d, f}}, &P::down_proj});
  return t;
}

/// The RoPE frequencies of Gemma layer l: sliding layers of a config with rope_local_base_freq
/// use that base with default rope (Gemma 3), the others rope_theta and rope_scaling.
inline model_config gemma_rope_config(const model_config& c, index_t l) {
  model_config r = c;
  if (c.rope_local_base_freq > 0 && c.layer_window(l) > 0) {
    r.rope_theta = c.rope_local_base_freq;
    r.rope_scaling = rope_scaling_config{};
  }
  return r;
}

/// One Gemma 2 / Gemma 3 decoder layer over parameters held in a parameter_set. Satisfies
/// DecoderLayer (tests/core/test_concepts.cpp).
template <GemmaBackend B>
class gemma_layer {
 public:
  using T = storage_t<B>;
  using A = accum_t<B>;
  using buffer = buffer_t<B>;
  using stat_buffer = accum_buffer_t<B>;  ///< rstd, lse: accum_t

  gemma_layer(parameter_set<B>& params, const model_config& config, index_t layer_index)
      : w_(params),
        cfg_(config),
        index_(layer_index),
        pos_(gemma_rope_config(config, layer_index), config.layer_window(layer_index),
             config.attn_logit_softcapping) {
    check(config.is_gemma(), "gemma_layer: architecture ", config.architecture,
          " is not Gemma2ForCausalLM or Gemma3ForCausalLM");
    const std::string p = hf_names::layer_prefix(layer_index);
    for (const auto& row : gemma_layer_table(cfg_)) ids_.*row.slot = params.at(p + row.spec.name);
  }

  /// This layer's parameters (names under "model.layers.N.", shapes): gemma_layer_table.
  static std::vector<param_spec> parameter_table(const model_config& c) {
    std::vector<param_spec> t;
    for (auto& row : gemma_layer_table(c)) t.push_back(std::move(row.spec));
    return t;
  }

  const gemma_layer_params& param_ids() const { return ids_; }
  index_t layer_index() const { return index_; }

  /// y (B*T, d) = layer(x (B*T, d)), `chunk` positions at a time. keep: keep every activation.
  void forward(B& be, const sequence_batch& seq, matrix_view<const T> x, matrix_view<T> y,
               index_t chunk, bool keep) {
    check_rows("forward", seq, x, y);
    check(chunk >= 1, "gemma_layer::forward: chunk is ", chunk, ", expected >= 1");
    pos_.prepare(seq);
    const norms ns = make_norms(be);
    const index_t t = seq.seq_len, d = cfg_.hidden_size;
    if (keep) chunk = t;
    kv_state kv(be, cfg_, seq.rows());
    for (index_t c0 = 0; c0 < t; c0 += chunk) {
      const index_t c1 = std::min(t, c0 + chunk);
      chunk_acts a = make_acts(be, seq, ns, x, c0, c1);
      project_kv(be, seq, ns, a, c0, c1, kv);
      forward_chunk(be, seq, ns, a, kv, c0, c1);
      scatter_rows(be, seq, c0, c1, matrix_view<const T>(a.y.view(a.n, d)), y);
      a.y.reset();
      if (keep) kept_acts_.emplace(std::move(a));
    }
    if (keep) kept_kv_.emplace(std::move(kv));
  }

  /// Backward state: the (1 + w) scales, K/V of every position once (or the kept ones),
  /// dK/dV accumulators.
  void begin_backward(B& be, const sequence_batch& seq, matrix_view<const T> x, index_t chunk,
                      layer_grad_mode /*mode*/) {
    check_extent("gemma_layer::begin_backward", "x.rows", x.rows, seq.rows());
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
        chunk_acts a = make_acts(be, seq, *norms_, x, c0, c1);
        project_kv(be, seq, *norms_, a, c0, c1, *kv_);
      }
    }
    kv_->allocate_grads(be, cfg_, seq.rows());
  }

  /// Backward of positions [c0, c1) of every sequence (chunks must come last to first).
  void backward_chunk(B& be, const sequence_batch& seq, matrix_view<const T> x,
                      matrix_view<const T> dy, index_t c0, index_t c1, matrix_view<T> dx,
                      layer_grad_mode mode) {
    check(kv_.has_value(), "gemma_layer::backward_chunk: begin_backward was not called");
    check(c0 >= 0 && c0 < c1 && c1 <= seq.seq_len, "gemma_layer::backward_chunk: chunk [", c0, ", ",
          c1, ") is not inside [0, ", seq.seq_len, ")");
    check_extent("gemma_layer::backward_chunk", "dy rows", dy.rows, seq.rows());
    check_extent("gemma_layer::backward_chunk", "dy cols", dy.cols, cfg_.hidden_size);
    if (mode.input_grad) check_rows("backward_chunk", seq, dy, dx);
    std::optional<chunk_acts> recomputed;
    chunk_acts* a = nullptr;
    if (kept_acts_ && kept_acts_->c0 == c0 && kept_acts_->c1 == c1) {
      a = &*kept_acts_;
    } else {
      recomputed.emplace(make_acts(be, seq, *norms_, x, c0, c1));
      forward_chunk(be, seq, *norms_, *recomputed, *kv_, c0, c1);
      a = &*recomputed;
    }
    backward_rows(be, seq, *a, dy, c0, c1, dx, mode);
  }

  void end_backward(B& /*be*/) {
    kv_.reset();
    norms_.reset();
    kept_acts_.reset();
    kept_kv_.reset();
  }

 private:
  /// The (1 + w) scales of the layer's norms.
  struct norms {
    norm_scale<B> input, post_attn, pre_ff, post_ff, q, k;
  };

  /// Per-layer K/V of all B*T rows and the dK/dV accumulators.
  using kv_state = detail::kv_rows<B>;
  /// Activations of positions [c0, c1) of all sequences, n = B*(c1-c0) gathered rows.
  struct chunk_acts {
    index_t c0 = 0, c1 = 0, n = 0;
    buffer x;                 // (n, d) gathered input (empty when the chunk is the whole batch)
    matrix_view<const T> xv;  // (n, d) view of the input rows
    buffer h1;                // (n, d)
    stat_buffer rstd1;        // (n)
    buffer q_raw;             // (n, H*hd) before q-norm (only with qk_norm)
    stat_buffer rstd_q;       // (n*H)
    buffer q;                 // (n, H*hd) after q-norm and RoPE
    buffer o;                 // (n, H*hd) attention output
    stat_buffer lse;          // (n, H)
    buffer ao;                // (n, d) o Wo^T, before post_attention_layernorm
    stat_buffer rstd_a;       // (n)
    buffer x2;                // (n, d) residual after attention
    buffer h2;                // (n, d)
    stat_buffer rstd2;        // (n)
    buffer gate;              // (n, f)
    buffer up;                // (n, f)
    buffer act;               // (n, f) gelu_tanh(gate) * up
    buffer m;                 // (n, d) act Wd^T, before post_feedforward_layernorm
    stat_buffer rstd_m;       // (n)
    buffer y;                 // (n, d) the chunk's output rows, until scattered
  };

  void check_rows(const char* where, const sequence_batch& seq, matrix_view<const T> in,
                  matrix_view<T> out) const {
    detail::check_layer_rows(std::string("gemma_layer::") + where, seq.rows(), cfg_.hidden_size, in,
                             out);
  }

  norms make_norms(B& be) const {
    norms ns;
    ns.input = norm_scale<B>(be, w_.vec(ids_.input_norm), true);
    ns.post_attn = norm_scale<B>(be, w_.vec(ids_.post_attn_norm), true);
    ns.pre_ff = norm_scale<B>(be, w_.vec(ids_.pre_ff_norm), true);
    ns.post_ff = norm_scale<B>(be, w_.vec(ids_.post_ff_norm), true);
    if (cfg_.qk_norm) {
      ns.q = norm_scale<B>(be, w_.vec(ids_.q_norm), true);
      ns.k = norm_scale<B>(be, w_.vec(ids_.k_norm), true);
    }
    return ns;
  }

  /// Gathers the chunk's input rows and computes h1 = N(x; input_layernorm).
  chunk_acts make_acts(B& be, const sequence_batch& seq, const norms& ns, matrix_view<const T> x,
                       index_t c0, index_t c1) const {
    chunk_acts a;
    a.c0 = c0;
    a.c1 = c1;
    a.n = (c1 - c0) * seq.batch;
    const index_t d = cfg_.hidden_size;
    if (c0 == 0 && c1 == seq.seq_len) {
      a.xv = x;
    } else {
      a.x = be.template allocate<T>(a.n * d);
      gather_rows(be, seq, c0, c1, x, a.x.view(a.n, d));
      a.xv = a.x.view(a.n, d);
    }
    a.h1 = be.template allocate<T>(a.n * d);
    a.rstd1 = be.template allocate<A>(a.n);
    be.rmsnorm_forward(a.xv, ns.input.scale(), A(cfg_.rms_norm_eps), a.h1.view(a.n, d),
                       a.rstd1.span());
    return a;
  }

  /// K and V of the chunk's rows (from a.h1) written into rows [c0, c1) of kv.
  void project_kv(B& be, const sequence_batch& seq, const norms& ns, const chunk_acts& a,
                  index_t c0, index_t c1, kv_state& kv) const {
    const index_t n = a.n, d = cfg_.hidden_size, kvw = cfg_.kv_width();
    buffer k_c = be.template allocate<T>(n * kvw);  // (n, Hkv*hd)
    buffer v_c = be.template allocate<T>(n * kvw);  // (n, Hkv*hd)
    auto h1 = a.h1.view(n, d);
    w_.linear(be, ids_.k_proj, h1, k_c.view(n, kvw), A(0));
    w_.linear(be, ids_.v_proj, h1, v_c.view(n, kvw), A(0));
    detail::store_kv(be, seq, cfg_, pos_, ns.k.scale(), std::move(k_c), std::move(v_c), c0, c1, kv);
  }

  /// The chunk's forward up to m = act Wd^T (everything backward_rows needs).
  void forward_chunk(B& be, const sequence_batch& seq, const norms& ns, chunk_acts& a,
                     const kv_state& kv, index_t c0, index_t c1) const {
    const index_t n = a.n, d = cfg_.hidden_size, qw = cfg_.q_width();
    const index_t h = cfg_.num_attention_heads, f = cfg_.intermediate_size;
    const auto eps = static_cast<A>(cfg_.rms_norm_eps);
    auto h1 = a.h1.view(n, d);
    a.q = be.template allocate<T>(n * qw);
    if (cfg_.qk_norm) {
      a.q_raw = be.template allocate<T>(n * qw);
      a.rstd_q = be.template allocate<A>(n * h);
      w_.linear(be, ids_.q_proj, h1, a.q_raw.view(n, qw), A(0));
    } else {
      w_.linear(be, ids_.q_proj, h1, a.q.view(n, qw), A(0));
    }
    detail::finish_q(be, seq, cfg_, pos_, ns.q.scale(), a.q_raw, a.rstd_q, a.q, c0, c1);
    a.o = be.template allocate<T>(n * qw);
    a.lse = be.template allocate<A>(n * h);
    detail::attend_forward(be, seq, cfg_, pos_, kv, matrix_view<const T>(a.q.view(n, qw)),
                           a.o.view(n, qw), a.lse.view(n, h), c0, c1);
    // x2 = x + N(o Wo^T; post_attention_layernorm)
    a.ao = be.template allocate<T>(n * d);
    w_.linear(be, ids_.o_proj, a.o.view(n, qw), a.ao.view(n, d), A(0));
    a.x2 = be.template allocate<T>(n * d);
    a.rstd_a = be.template allocate<A>(n);
    be.rmsnorm_forward(a.ao.view(n, d), ns.post_attn.scale(), eps, a.x2.view(n, d),
                       a.rstd_a.span());
    be.axpy(A(1), a.xv, a.x2.view(n, d));
    // MLP
    a.h2 = be.template allocate<T>(n * d);
    a.rstd2 = be.template allocate<A>(n);
    be.rmsnorm_forward(a.x2.view(n, d), ns.pre_ff.scale(), eps, a.h2.view(n, d), a.rstd2.span());
    a.gate = be.template allocate<T>(n * f);
    a.up = be.template allocate<T>(n * f);
    a.act = be.template allocate<T>(n * f);
    w_.linear(be, ids_.gate_proj, a.h2.view(n, d), a.gate.view(n, f), A(0));
    w_.linear(be, ids_.up_proj, a.h2.view(n, d), a.up.view(n, f), A(0));
    be.geglu_forward(a.gate.view(n, f), a.up.view(n, f), a.act.view(n, f));
    a.m = be.template allocate<T>(n * d);
    a.rstd_m = be.template allocate<A>(n);
    w_.linear(be, ids_.down_proj, a.act.view(n, f), a.m.view(n, d), A(0));
    // y = x2 + N(m; post_feedforward_layernorm)
    a.y = be.template allocate<T>(n * d);
    be.rmsnorm_forward(a.m.view(n, d), ns.post_ff.scale(), eps, a.y.view(n, d), a.rstd_m.span());
    be.axpy(A(1), matrix_view<const T>(a.x2.view(n, d)), a.y.view(n, d));
  }

  /// Backprop of the chunk's rows given its activations.
  void backward_rows(B& be, const sequence_batch& seq, chunk_acts& a, matrix_view<const T> dy,
                     index_t c0, index_t c1, matrix_view<T> dx, layer_grad_mode mode) const {
    const index_t n = a.n, d = cfg_.hidden_size, qw = cfg_.q_width(), kvw = cfg_.kv_width();
    const index_t h = cfg_.num_attention_heads, f = cfg_.intermediate_size;
    const bool wg = mode.weight_grads;
    const norms& ns = *norms_;
    a.y.reset();  // the chunk's output (a recomputed forward made it)
    // dx2 starts as dy (residual)
    buffer dx2 = be.template allocate<T>(n * d);  // (n, d)
    gather_rows(be, seq, c0, c1, dy, dx2.view(n, d));
    {
      // y = x2 + N(m): dm = N backward of dy
      buffer dh2 = be.template allocate<T>(n * d);  // (n, d)
      {
        buffer dact = be.template allocate<T>(n * f);  // (n, f)
        {
          buffer dm = be.template allocate<T>(n * d);  // (n, d)
          be.rmsnorm_backward(a.m.view(n, d), ns.post_ff.scale(), a.rstd_m.span(), dx2.view(n, d),
                              dm.view(n, d), w_.grad_vec(ids_.post_ff_norm, wg));
          a.m.reset();
          w_.linear_input_grad(be, ids_.down_proj, dm.view(n, d), dact.view(n, f), A(0));
          w_.linear_weight_grad(be, ids_.down_proj, dm.view(n, d), a.act.view(n, f), wg);
        }
        a.act.reset();
        buffer dgate = be.template allocate<T>(n * f);  // (n, f)
        buffer dup = be.template allocate<T>(n * f);    // (n, f)
        be.geglu_backward(a.gate.view(n, f), a.up.view(n, f), dact.view(n, f), dgate.view(n, f),
                          dup.view(n, f));
        dact.reset();
        a.gate.reset();
        a.up.reset();
        w_.linear_input_grad(be, ids_.gate_proj, dgate.view(n, f), dh2.view(n, d), A(0));
        w_.linear_input_grad(be, ids_.up_proj, dup.view(n, f), dh2.view(n, d), A(1));
        w_.linear_weight_grad(be, ids_.gate_proj, dgate.view(n, f), a.h2.view(n, d), wg);
        w_.linear_weight_grad(be, ids_.up_proj, dup.view(n, f), a.h2.view(n, d), wg);
      }
      be.rmsnorm_backward(a.x2.view(n, d), ns.pre_ff.scale(), a.rstd2.span(), dh2.view(n, d),
                          dx2.view(n, d), w_.grad_vec(ids_.pre_ff_norm, wg));
    }
    a.h2.reset();
    a.x2.reset();
    // x2 = x + N(o Wo^T): dao = N backward of dx2
    buffer dq = be.template allocate<T>(n * qw);  // (n, H*hd) w.r.t. rotated q
    {
      buffer dout = be.template allocate<T>(n * qw);  // (n, H*hd)
      {
        buffer dao = be.template allocate<T>(n * d);  // (n, d)
        be.rmsnorm_backward(a.ao.view(n, d), ns.post_attn.scale(), a.rstd_a.span(), dx2.view(n, d),
                            dao.view(n, d), w_.grad_vec(ids_.post_attn_norm, wg));
        a.ao.reset();
        w_.linear_input_grad(be, ids_.o_proj, dao.view(n, d), dout.view(n, qw), A(0));
        w_.linear_weight_grad(be, ids_.o_proj, dao.view(n, d), a.o.view(n, qw), wg);
      }
      detail::attend_backward(be, seq, cfg_, pos_, *kv_, matrix_view<const T>(a.q.view(n, qw)),
                              matrix_view<const T>(a.o.view(n, qw)),
                              matrix_view<const T>(dout.view(n, qw)),
                              matrix_view<const A>(a.lse.view(n, h)), dq.view(n, qw), c0, c1);
    }
    a.o.reset();
    a.lse.reset();
    a.q.reset();
    // q: undo RoPE, then q-norm
    detail::unfinish_q(be, seq, cfg_, pos_, ns.q.scale(), w_.grad_vec(ids_.q_norm, wg), a.q_raw,
                       a.rstd_q, dq, c0, c1);
    a.q_raw.reset();
    // k, v rows of this chunk are complete now (later chunks were done first)
    auto [dk, dv] = detail::kv_grad_rows(be, seq, cfg_, pos_, *kv_, ns.k.scale(),
                                         w_.grad_vec(ids_.k_norm, wg), c0, c1);
    auto h1 = a.h1.view(n, d);
    w_.linear_weight_grad(be, ids_.q_proj, dq.view(n, qw), h1, wg);
    w_.linear_weight_grad(be, ids_.k_proj, dk.view(n, kvw), h1, wg);
    w_.linear_weight_grad(be, ids_.v_proj, dv.view(n, kvw), h1, wg);
    if (!mode.input_grad && !w_.wants(ids_.input_norm, wg)) return;
    // dh1 = dq Wq + dk Wk + dv Wv; dx = dx2 + N backward
    buffer dh1 = be.template allocate<T>(n * d);  // (n, d)
    w_.linear_input_grad(be, ids_.q_proj, dq.view(n, qw), dh1.view(n, d), A(0));
    w_.linear_input_grad(be, ids_.k_proj, dk.view(n, kvw), dh1.view(n, d), A(1));
    w_.linear_input_grad(be, ids_.v_proj, dv.view(n, kvw), dh1.view(n, d), A(1));
    be.rmsnorm_backward(a.xv, ns.input.scale(), a.rstd1.span(), dh1.view(n, d), dx2.view(n, d),
                        w_.grad_vec(ids_.input_norm, wg));
    if (mode.input_grad) scatter_rows(be, seq, c0, c1, matrix_view<const T>(dx2.view(n, d)), dx);
  }

  detail::layer_weights<B> w_;
  model_config cfg_;
  index_t index_;
  detail::layer_positions pos_;  // RoPE (local base on sliding layers), window, soft-cap
  gemma_layer_params ids_{};
  std::optional<norms> norms_;  // the (1 + w) scales during a backward
  std::optional<kv_state> kv_;
  std::optional<chunk_acts> kept_acts_;
  std::optional<kv_state> kept_kv_;
};

}  // namespace tightfit
