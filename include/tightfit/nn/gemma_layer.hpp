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

  gemma_layer(parameter_set<B>& params, const model_config& config, index_t layer_index)
      : params_(&params),
        cfg_(config),
        index_(layer_index),
        window_(config.layer_window(layer_index)),
        rope_cfg_(gemma_rope_config(config, layer_index)),
        rope_(rope_init(rope_cfg_, config.max_position_embeddings)) {
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
    prepare(seq);
    const norms ns = make_norms(be);
    const index_t t = seq.seq_len, d = cfg_.hidden_size;
    if (keep) chunk = t;
    kv_state kv = make_kv(be, seq.rows());
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
    prepare(seq);
    norms_.emplace(make_norms(be));
    if (kept_kv_) {
      kv_ = std::move(*kept_kv_);
      kept_kv_.reset();
    } else {
      kv_ = make_kv(be, seq.rows());
      const index_t t = seq.seq_len, step = std::max<index_t>(1, chunk);
      for (index_t c0 = 0; c0 < t; c0 += step) {
        const index_t c1 = std::min(t, c0 + step);
        chunk_acts a = make_acts(be, seq, *norms_, x, c0, c1);
        project_kv(be, seq, *norms_, a, c0, c1, *kv_);
      }
    }
    kv_->dk = be.template allocate<T>(seq.rows() * cfg_.kv_width());  // (B*T, Hkv*hd)
    kv_->dv = be.template allocate<T>(seq.rows() * cfg_.kv_width());  // (B*T, Hkv*hd)
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

  /// Per-layer K/V of all B*T rows.
  struct kv_state {
    buffer k_raw;   // (B*T, Hkv*hd) k before k-norm (only with qk_norm)
    buffer rstd_k;  // (B*T*Hkv) k-norm rstd (only with qk_norm)
    buffer k;       // (B*T, Hkv*hd) after k-norm and RoPE
    buffer v;       // (B*T, Hkv*hd)
    buffer dk;      // (B*T, Hkv*hd) accumulator, w.r.t. k
    buffer dv;      // (B*T, Hkv*hd) accumulator
  };

  /// Activations of positions [c0, c1) of all sequences, n = B*(c1-c0) gathered rows.
  struct chunk_acts {
    index_t c0 = 0, c1 = 0, n = 0;
    buffer x;                 // (n, d) gathered input (empty when the chunk is the whole batch)
    matrix_view<const T> xv;  // (n, d) view of the input rows
    buffer h1;                // (n, d)
    buffer rstd1;             // (n)
    buffer q_raw;             // (n, H*hd) before q-norm (only with qk_norm)
    buffer rstd_q;            // (n*H)
    buffer q;                 // (n, H*hd) after q-norm and RoPE
    buffer o;                 // (n, H*hd) attention output
    buffer lse;               // (n, H)
    buffer ao;                // (n, d) o Wo^T, before post_attention_layernorm
    buffer rstd_a;            // (n)
    buffer x2;                // (n, d) residual after attention
    buffer h2;                // (n, d)
    buffer rstd2;             // (n)
    buffer gate;              // (n, f)
    buffer up;                // (n, f)
    buffer act;               // (n, f) gelu_tanh(gate) * up
    buffer m;                 // (n, d) act Wd^T, before post_feedforward_layernorm
    buffer rstd_m;            // (n)
    buffer y;                 // (n, d) the chunk's output rows, until scattered
  };

  void check_rows(const char* where, const sequence_batch& seq, matrix_view<const T> in,
                  matrix_view<T> out) const {
    const std::string w = std::string("gemma_layer::") + where;
    check_extent(w.c_str(), "input rows", in.rows, seq.rows());
    check_extent(w.c_str(), "input cols", in.cols, cfg_.hidden_size);
    check_extent(w.c_str(), "output rows", out.rows, seq.rows());
    check_extent(w.c_str(), "output cols", out.cols, cfg_.hidden_size);
  }

  matrix_view<const T> weight(std::size_t id, index_t rows, index_t cols) const {
    return as_matrix(std::span<const T>(params_->value(id)), rows, cols);
  }
  std::span<const T> vec(std::size_t id) const { return params_->value(id); }
  matrix_view<T> grad(std::size_t id, index_t rows, index_t cols) const {
    return as_matrix(params_->grad(id), rows, cols);
  }
  std::span<T> grad_vec(std::size_t id, bool wanted) const {
    return wanted ? params_->grad(id) : std::span<T>{};
  }

  norms make_norms(B& be) const {
    norms ns;
    ns.input = norm_scale<B>(be, vec(ids_.input_norm), true);
    ns.post_attn = norm_scale<B>(be, vec(ids_.post_attn_norm), true);
    ns.pre_ff = norm_scale<B>(be, vec(ids_.pre_ff_norm), true);
    ns.post_ff = norm_scale<B>(be, vec(ids_.post_ff_norm), true);
    if (cfg_.qk_norm) {
      ns.q = norm_scale<B>(be, vec(ids_.q_norm), true);
      ns.k = norm_scale<B>(be, vec(ids_.k_norm), true);
    }
    return ns;
  }

  kv_state make_kv(B& be, index_t rows) const {
    kv_state kv;
    if (cfg_.qk_norm) {
      kv.k_raw = be.template allocate<T>(rows * cfg_.kv_width());
      kv.rstd_k = be.template allocate<T>(rows * cfg_.num_key_value_heads);
    }
    kv.k = be.template allocate<T>(rows * cfg_.kv_width());
    kv.v = be.template allocate<T>(rows * cfg_.kv_width());
    return kv;
  }

  /// Per-batch state: document starts (packed sequences), dynamic rope frequencies.
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

  /// The attention mask of sequence b's queries from position c0 on (keys [0, c1)).
  attention_mask mask_of(const sequence_batch& seq, index_t b, index_t c0) const {
    attention_mask m;
    m.q0 = c0;
    m.valid_len = seq.length(b);
    m.window = window_;
    m.softcap = cfg_.attn_logit_softcapping;
    if (!doc_start_.empty())
      m.doc_start = std::span<const index_t>(doc_start_)
                        .subspan(static_cast<std::size_t>(b * seq.seq_len),
                                 static_cast<std::size_t>(seq.seq_len));
    return m;
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
    a.rstd1 = be.template allocate<T>(a.n);
    be.rmsnorm_forward(a.xv, ns.input.scale(), A(cfg_.rms_norm_eps), a.h1.view(a.n, d),
                       a.rstd1.span());
    return a;
  }

  /// RoPE on the rows of every sequence of a gathered (B*c, heads*hd) chunk.
  void rope_rows(B& be, const sequence_batch& seq, matrix_view<T> m, index_t heads, index_t c0,
                 index_t c1, bool backward) const {
    const index_t c = c1 - c0;
    for (index_t b = 0; b < seq.batch; ++b) {
      auto rows = m.row_range(b * c, (b + 1) * c);
      const rope_args r = seq.position_ids.empty()
                              ? rope_.args(c0)
                              : rope_.args(0, seq.position_ids.subspan(
                                                  static_cast<std::size_t>(b * seq.seq_len + c0),
                                                  static_cast<std::size_t>(c)));
      if (backward)
        be.rope_backward(rows, heads, cfg_.head_dim, r);
      else
        be.rope_forward(rows, heads, cfg_.head_dim, r);
    }
  }

  /// K and V of the chunk's rows (from a.h1) written into rows [c0, c1) of kv.
  void project_kv(B& be, const sequence_batch& seq, const norms& ns, const chunk_acts& a,
                  index_t c0, index_t c1, kv_state& kv) const {
    const index_t n = a.n, d = cfg_.hidden_size, kvw = cfg_.kv_width(), hd = cfg_.head_dim;
    const index_t rows = seq.rows(), hkv = cfg_.num_key_value_heads;
    buffer k_c = be.template allocate<T>(n * kvw);  // (n, Hkv*hd)
    buffer v_c = be.template allocate<T>(n * kvw);  // (n, Hkv*hd)
    auto h1 = a.h1.view(n, d);
    be.gemm(transpose::no, transpose::yes, A(1), h1, weight(ids_.k_proj, kvw, d), A(0),
            k_c.view(n, kvw));
    be.gemm(transpose::no, transpose::yes, A(1), h1, weight(ids_.v_proj, kvw, d), A(0),
            v_c.view(n, kvw));
    scatter_rows(be, seq, c0, c1, matrix_view<const T>(v_c.view(n, kvw)), kv.v.view(rows, kvw));
    if (cfg_.qk_norm) {
      scatter_rows(be, seq, c0, c1, matrix_view<const T>(k_c.view(n, kvw)),
                   kv.k_raw.view(rows, kvw));
      buffer kn = be.template allocate<T>(n * kvw);  // (n*Hkv, hd)
      buffer rstd = be.template allocate<T>(n * hkv);
      be.rmsnorm_forward(k_c.view(n * hkv, hd), ns.k.scale(), A(cfg_.rms_norm_eps),
                         kn.view(n * hkv, hd), rstd.span());
      scatter_rows(be, seq, c0, c1, matrix_view<const T>(rstd.view(n, hkv)),
                   kv.rstd_k.view(rows, hkv));
      k_c = std::move(kn);
    }
    rope_rows(be, seq, k_c.view(n, kvw), hkv, c0, c1, false);
    scatter_rows(be, seq, c0, c1, matrix_view<const T>(k_c.view(n, kvw)), kv.k.view(rows, kvw));
  }

  /// The chunk's forward up to m = act Wd^T (everything backward_rows needs).
  void forward_chunk(B& be, const sequence_batch& seq, const norms& ns, chunk_acts& a,
                     const kv_state& kv, index_t c0, index_t c1) const {
    const index_t n = a.n, d = cfg_.hidden_size, qw = cfg_.q_width(), kvw = cfg_.kv_width();
    const index_t h = cfg_.num_attention_heads, hd = cfg_.head_dim, f = cfg_.intermediate_size;
    const index_t c = c1 - c0, t = seq.seq_len;
    const auto eps = static_cast<A>(cfg_.rms_norm_eps);
    auto h1 = a.h1.view(n, d);
    a.q = be.template allocate<T>(n * qw);
    if (cfg_.qk_norm) {
      a.q_raw = be.template allocate<T>(n * qw);
      a.rstd_q = be.template allocate<T>(n * h);
      be.gemm(transpose::no, transpose::yes, A(1), h1, weight(ids_.q_proj, qw, d), A(0),
              a.q_raw.view(n, qw));
      be.rmsnorm_forward(a.q_raw.view(n * h, hd), ns.q.scale(), eps, a.q.view(n * h, hd),
                         a.rstd_q.span());
    } else {
      be.gemm(transpose::no, transpose::yes, A(1), h1, weight(ids_.q_proj, qw, d), A(0),
              a.q.view(n, qw));
    }
    rope_rows(be, seq, a.q.view(n, qw), h, c0, c1, false);
    a.o = be.template allocate<T>(n * qw);
    a.lse = be.template allocate<T>(n * h);
    const attention_shape shape{h, cfg_.num_key_value_heads, hd};
    const auto scale = static_cast<A>(cfg_.attention_scale());
    for (index_t b = 0; b < seq.batch; ++b) {
      auto keys = kv.k.view(seq.rows(), kvw).row_range(b * t, b * t + c1);
      auto vals = kv.v.view(seq.rows(), kvw).row_range(b * t, b * t + c1);
      be.attention_forward(shape, a.q.view(n, qw).row_range(b * c, (b + 1) * c), keys, vals,
                           mask_of(seq, b, c0), scale,
                           a.o.view(n, qw).row_range(b * c, (b + 1) * c),
                           a.lse.view(n, h).row_range(b * c, (b + 1) * c));
    }
    // x2 = x + N(o Wo^T; post_attention_layernorm)
    a.ao = be.template allocate<T>(n * d);
    be.gemm(transpose::no, transpose::yes, A(1), a.o.view(n, qw), weight(ids_.o_proj, d, qw), A(0),
            a.ao.view(n, d));
    a.x2 = be.template allocate<T>(n * d);
    a.rstd_a = be.template allocate<T>(n);
    be.rmsnorm_forward(a.ao.view(n, d), ns.post_attn.scale(), eps, a.x2.view(n, d),
                       a.rstd_a.span());
    be.axpy(A(1), a.xv, a.x2.view(n, d));
    // MLP
    a.h2 = be.template allocate<T>(n * d);
    a.rstd2 = be.template allocate<T>(n);
    be.rmsnorm_forward(a.x2.view(n, d), ns.pre_ff.scale(), eps, a.h2.view(n, d), a.rstd2.span());
    a.gate = be.template allocate<T>(n * f);
    a.up = be.template allocate<T>(n * f);
    a.act = be.template allocate<T>(n * f);
    be.gemm(transpose::no, transpose::yes, A(1), a.h2.view(n, d), weight(ids_.gate_proj, f, d),
            A(0), a.gate.view(n, f));
    be.gemm(transpose::no, transpose::yes, A(1), a.h2.view(n, d), weight(ids_.up_proj, f, d), A(0),
            a.up.view(n, f));
    be.geglu_forward(a.gate.view(n, f), a.up.view(n, f), a.act.view(n, f));
    a.m = be.template allocate<T>(n * d);
    a.rstd_m = be.template allocate<T>(n);
    be.gemm(transpose::no, transpose::yes, A(1), a.act.view(n, f), weight(ids_.down_proj, d, f),
            A(0), a.m.view(n, d));
    // y = x2 + N(m; post_feedforward_layernorm)
    a.y = be.template allocate<T>(n * d);
    be.rmsnorm_forward(a.m.view(n, d), ns.post_ff.scale(), eps, a.y.view(n, d), a.rstd_m.span());
    be.axpy(A(1), matrix_view<const T>(a.x2.view(n, d)), a.y.view(n, d));
  }

  /// Backprop of the chunk's rows given its activations.
  void backward_rows(B& be, const sequence_batch& seq, chunk_acts& a, matrix_view<const T> dy,
                     index_t c0, index_t c1, matrix_view<T> dx, layer_grad_mode mode) const {
    const index_t n = a.n, d = cfg_.hidden_size, qw = cfg_.q_width(), kvw = cfg_.kv_width();
    const index_t h = cfg_.num_attention_heads, hkv = cfg_.num_key_value_heads;
    const index_t hd = cfg_.head_dim, f = cfg_.intermediate_size;
    const index_t c = c1 - c0, t = seq.seq_len, rows = seq.rows();
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
                              dm.view(n, d), grad_vec(ids_.post_ff_norm, wg));
          a.m.reset();
          be.gemm(transpose::no, transpose::no, A(1), dm.view(n, d), weight(ids_.down_proj, d, f),
                  A(0), dact.view(n, f));
          if (wg)
            be.gemm(transpose::yes, transpose::no, A(1), dm.view(n, d), a.act.view(n, f), A(1),
                    grad(ids_.down_proj, d, f));
        }
        a.act.reset();
        buffer dgate = be.template allocate<T>(n * f);  // (n, f)
        buffer dup = be.template allocate<T>(n * f);    // (n, f)
        be.geglu_backward(a.gate.view(n, f), a.up.view(n, f), dact.view(n, f), dgate.view(n, f),
                          dup.view(n, f));
        dact.reset();
        a.gate.reset();
        a.up.reset();
        be.gemm(transpose::no, transpose::no, A(1), dgate.view(n, f), weight(ids_.gate_proj, f, d),
                A(0), dh2.view(n, d));
        be.gemm(transpose::no, transpose::no, A(1), dup.view(n, f), weight(ids_.up_proj, f, d),
                A(1), dh2.view(n, d));
        if (wg) {
          be.gemm(transpose::yes, transpose::no, A(1), dgate.view(n, f), a.h2.view(n, d), A(1),
                  grad(ids_.gate_proj, f, d));
          be.gemm(transpose::yes, transpose::no, A(1), dup.view(n, f), a.h2.view(n, d), A(1),
                  grad(ids_.up_proj, f, d));
        }
      }
      be.rmsnorm_backward(a.x2.view(n, d), ns.pre_ff.scale(), a.rstd2.span(), dh2.view(n, d),
                          dx2.view(n, d), grad_vec(ids_.pre_ff_norm, wg));
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
                            dao.view(n, d), grad_vec(ids_.post_attn_norm, wg));
        a.ao.reset();
        be.gemm(transpose::no, transpose::no, A(1), dao.view(n, d), weight(ids_.o_proj, d, qw),
                A(0), dout.view(n, qw));
        if (wg)
          be.gemm(transpose::yes, transpose::no, A(1), dao.view(n, d), a.o.view(n, qw), A(1),
                  grad(ids_.o_proj, d, qw));
      }
      const attention_shape shape{h, hkv, hd};
      const auto scale = static_cast<A>(cfg_.attention_scale());
      for (index_t b = 0; b < seq.batch; ++b) {
        const index_t r0 = b * c, r1 = (b + 1) * c;
        auto keys = kv_->k.view(rows, kvw).row_range(b * t, b * t + c1);
        auto vals = kv_->v.view(rows, kvw).row_range(b * t, b * t + c1);
        be.attention_backward(shape, a.q.view(n, qw).row_range(r0, r1), keys, vals,
                              a.o.view(n, qw).row_range(r0, r1), dout.view(n, qw).row_range(r0, r1),
                              a.lse.view(n, h).row_range(r0, r1), mask_of(seq, b, c0), scale,
                              dq.view(n, qw).row_range(r0, r1),
                              kv_->dk.view(rows, kvw).row_range(b * t, b * t + c1),
                              kv_->dv.view(rows, kvw).row_range(b * t, b * t + c1));
      }
    }
    a.o.reset();
    a.lse.reset();
    a.q.reset();
    // q: undo RoPE, then q-norm
    rope_rows(be, seq, dq.view(n, qw), h, c0, c1, true);
    if (cfg_.qk_norm) {
      buffer dq_raw = be.template allocate<T>(n * qw);
      be.rmsnorm_backward(a.q_raw.view(n * h, hd), ns.q.scale(), a.rstd_q.span(),
                          dq.view(n * h, hd), dq_raw.view(n * h, hd), grad_vec(ids_.q_norm, wg));
      dq = std::move(dq_raw);
      a.q_raw.reset();
    }
    // k, v rows of this chunk are complete now (later chunks were done first)
    buffer dk = be.template allocate<T>(n * kvw);  // (n, Hkv*hd)
    buffer dv = be.template allocate<T>(n * kvw);  // (n, Hkv*hd)
    gather_rows(be, seq, c0, c1, matrix_view<const T>(kv_->dk.view(rows, kvw)), dk.view(n, kvw));
    gather_rows(be, seq, c0, c1, matrix_view<const T>(kv_->dv.view(rows, kvw)), dv.view(n, kvw));
    rope_rows(be, seq, dk.view(n, kvw), hkv, c0, c1, true);
    if (cfg_.qk_norm) {
      buffer k_raw = be.template allocate<T>(n * kvw);
      buffer rstd = be.template allocate<T>(n * hkv);
      gather_rows(be, seq, c0, c1, matrix_view<const T>(kv_->k_raw.view(rows, kvw)),
                  k_raw.view(n, kvw));
      gather_rows(be, seq, c0, c1, matrix_view<const T>(kv_->rstd_k.view(rows, hkv)),
                  rstd.view(n, hkv));
      buffer dk_raw = be.template allocate<T>(n * kvw);
      be.rmsnorm_backward(k_raw.view(n * hkv, hd), ns.k.scale(), rstd.span(), dk.view(n * hkv, hd),
                          dk_raw.view(n * hkv, hd), grad_vec(ids_.k_norm, wg));
      dk = std::move(dk_raw);
    }
    auto h1 = a.h1.view(n, d);
    if (wg) {
      be.gemm(transpose::yes, transpose::no, A(1), dq.view(n, qw), h1, A(1),
              grad(ids_.q_proj, qw, d));
      be.gemm(transpose::yes, transpose::no, A(1), dk.view(n, kvw), h1, A(1),
              grad(ids_.k_proj, kvw, d));
      be.gemm(transpose::yes, transpose::no, A(1), dv.view(n, kvw), h1, A(1),
              grad(ids_.v_proj, kvw, d));
    }
    if (!mode.input_grad && !wg) return;
    // dh1 = dq Wq + dk Wk + dv Wv; dx = dx2 + N backward
    buffer dh1 = be.template allocate<T>(n * d);  // (n, d)
    be.gemm(transpose::no, transpose::no, A(1), dq.view(n, qw), weight(ids_.q_proj, qw, d), A(0),
            dh1.view(n, d));
    be.gemm(transpose::no, transpose::no, A(1), dk.view(n, kvw), weight(ids_.k_proj, kvw, d), A(1),
            dh1.view(n, d));
    be.gemm(transpose::no, transpose::no, A(1), dv.view(n, kvw), weight(ids_.v_proj, kvw, d), A(1),
            dh1.view(n, d));
    be.rmsnorm_backward(a.xv, ns.input.scale(), a.rstd1.span(), dh1.view(n, d), dx2.view(n, d),
                        grad_vec(ids_.input_norm, wg));
    if (mode.input_grad) scatter_rows(be, seq, c0, c1, matrix_view<const T>(dx2.view(n, d)), dx);
  }

  parameter_set<B>* params_;
  model_config cfg_;
  index_t index_;
  index_t window_ = 0;              // this layer's sliding window (0: none)
  model_config rope_cfg_;           // the config RoPE reads (local base for sliding layers)
  rope_frequencies rope_;           // RoPE frequencies (dynamic: of the current batch)
  std::vector<index_t> doc_start_;  // (B*T) t - position_ids[t] for packed batches, else empty
  gemma_layer_params ids_{};
  std::optional<norms> norms_;  // the (1 + w) scales during a backward
  std::optional<kv_state> kv_;
  std::optional<chunk_acts> kept_acts_;
  std::optional<kv_state> kept_kv_;
};

}  // namespace tightfit
