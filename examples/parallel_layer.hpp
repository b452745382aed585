// parallel_layer.hpp: a user's own decoder layer, written from backend kernels, that plugs into
// tightfit::decoder_model<B, parallel_layer<B>> and runs under every backward schedule.
//
// Parallel attention and MLP (GPT-J, PaLM): one RMSNorm feeds both branches,
//   h = RMSNorm(x; g)    y = x + Attn(h) Wo^T + (silu(h Wg^T) * (h Wu^T)) Wd^T
// The StreamBP contract (nn/layer.hpp): forward works `chunk` positions at a time with a K/V
// cache; begin_backward computes K/V of all rows once and zeroes dK/dV; backward_chunk, called
// last chunk first, recomputes its rows' activations, backpropagates them, and — its dK/dV rows
// being complete once every later chunk is done — their projections. This layer always
// recomputes (under `full` it keeps nothing, so full behaves as checkpoint for it).
// It takes LoRA adapters on its seven projections (set_lora, tightfit::LoraLayer: the
// lora_forward / lora_backward of tightfit/nn/adapters.hpp after each projection), and a
// parameter without a gradient buffer is frozen (its weight-gradient GEMM does not run), so
// every optimizer of tightfit/optim trains it: Adam, BAdam, BREAD, LoRA.
#pragma once

#include <algorithm>
#include <cmath>
#include <span>
#include <vector>

#include "tightfit/nn/adapters.hpp"
#include "tightfit/nn/layer.hpp"

template <tightfit::TransformerBackend B>
class parallel_layer {
 public:
  using T = tightfit::storage_t<B>;
  using A = tightfit::accum_t<B>;
  using index_t = tightfit::index_t;
  using cview = tightfit::matrix_view<const T>;
  using mview = tightfit::matrix_view<T>;
  using seq_t = tightfit::sequence_batch;
  using mode_t = tightfit::layer_grad_mode;

  /// The parameter table: names under "model.layers.N." and shapes (Linear: (out, in)).
  static std::vector<tightfit::param_spec> parameter_table(const tightfit::model_config& c) {
    const index_t d = c.hidden_size, q = c.q_width(), kv = c.kv_width(), f = c.intermediate_size;
    return {{"input_layernorm.weight", {d}},      {"self_attn.q_proj.weight", {q, d}},
            {"self_attn.k_proj.weight", {kv, d}}, {"self_attn.v_proj.weight", {kv, d}},
            {"self_attn.o_proj.weight", {d, q}},  {"mlp.gate_proj.weight", {f, d}},
            {"mlp.up_proj.weight", {f, d}},       {"mlp.down_proj.weight", {d, f}}};
  }
  parallel_layer(tightfit::parameter_set<B>& p, const tightfit::model_config& c, index_t l)
      : p_(&p), c_(c) {
    // this sketch implements plain RoPE, full causal attention and a bias-free MLP only
    tightfit::check(c.rope_scaling.rope_type == "default" && c.sliding_window == 0 && !c.mlp_bias,
                    "parallel_layer: rope scaling, sliding windows and mlp_bias are not supported");
    for (const auto& row : parameter_table(c))
      id_.push_back(p.at(tightfit::hf_names::layer_prefix(l) + row.name));
  }

  /// Binds LoRA adapters to the projections (an empty binding removes them).
  void set_lora(const tightfit::lora_binding<B>& binding) { lora_ = binding; }

  void forward(B& be, const seq_t& s, cview x, mview y, index_t chunk, bool /*keep*/) {
    tightfit::check(s.position_ids.empty(), "parallel_layer: packed sequences are not supported");
    begin(be, s, x, chunk, false);
    for (index_t c0 = 0; c0 < s.seq_len; c0 += chunk) {
      const index_t c1 = std::min(s.seq_len, c0 + chunk);
      acts a = recompute(be, s, x, c0, c1);
      auto out = alloc(be, a.n, c_.hidden_size);  // (n, d) = x + o Wo^T + act Wd^T
      be.copy(a.x.view(a.n, c_.hidden_size), out.view(a.n, c_.hidden_size));
      be.gemm(no, yes, A(1), a.o.view(a.n, qw()), w(wo, c_.hidden_size, qw()), A(1), v(out, a.n));
      lora_forward(be, lora_, proj::o_proj, a.o.view(a.n, qw()), v(out, a.n));
      be.gemm(no, yes, A(1), a.act.view(a.n, f()), w(wd, c_.hidden_size, f()), A(1), v(out, a.n));
      lora_forward(be, lora_, proj::down_proj, a.act.view(a.n, f()), v(out, a.n));
      tightfit::scatter_rows(be, s, c0, c1, cview(v(out, a.n)), y);
    }
    end_backward(be);
  }
  void begin_backward(B& be, const seq_t& s, cview x, index_t chunk, mode_t) {
    begin(be, s, x, chunk, true);
  }
  void backward_chunk(B& be, const seq_t& s, cview x, cview dy, index_t c0, index_t c1, mview dx,
                      mode_t mode) {
    acts a = recompute(be, s, x, c0, c1);
    const index_t n = a.n, d = c_.hidden_size, rows = s.rows(), t = s.seq_len, c = c1 - c0;
    const bool wg = mode.weight_grads;
    auto dyc = alloc(be, n, d), dxc = alloc(be, n, d), dh = alloc(be, n, d);
    tightfit::gather_rows(be, s, c0, c1, dy, v(dyc, n));
    be.copy(cview(v(dyc, n)), v(dxc, n));  // residual
    // MLP branch
    auto dact = alloc(be, n, f()), dgate = alloc(be, n, f()), dup = alloc(be, n, f());
    be.gemm(no, no, A(1), cview(v(dyc, n)), w(wd, d, f()), A(0), dact.view(n, f()));
    lora_backward(be, lora_, proj::down_proj, a.act.view(n, f()), cview(v(dyc, n)),
                  dact.view(n, f()), wg);
    be.swiglu_backward(a.gate.view(n, f()), a.up.view(n, f()), dact.view(n, f()),
                       dgate.view(n, f()), dup.view(n, f()));
    be.gemm(no, no, A(1), dgate.view(n, f()), w(wg_, f(), d), A(0), v(dh, n));
    be.gemm(no, no, A(1), dup.view(n, f()), w(wu, f(), d), A(1), v(dh, n));
    const cview h = a.h.view(n, d);
    lora_backward(be, lora_, proj::gate_proj, h, dgate.view(n, f()), v(dh, n), wg);
    lora_backward(be, lora_, proj::up_proj, h, dup.view(n, f()), v(dh, n), wg);
    // attention branch: dq, and dK/dV rows accumulated for every key this chunk saw
    auto dout = alloc(be, n, qw()), dq = alloc(be, n, qw());
    be.gemm(no, no, A(1), cview(v(dyc, n)), w(wo, d, qw()), A(0), dout.view(n, qw()));
    lora_backward(be, lora_, proj::o_proj, a.o.view(n, qw()), cview(v(dyc, n)), dout.view(n, qw()),
                  wg);
    for (index_t b = 0; b < s.batch; ++b) {
      const index_t r0 = b * c, r1 = r0 + c, k0 = b * t, k1 = k0 + c1;
      be.attention_backward(
          shape(), a.q.view(n, qw()).row_range(r0, r1), keys(rows, k0, k1), vals(rows, k0, k1),
          a.o.view(n, qw()).row_range(r0, r1), dout.view(n, qw()).row_range(r0, r1),
          a.lse.view(n, c_.num_attention_heads).row_range(r0, r1),
          tightfit::attention_mask{c0, s.length(b)}, scale(), dq.view(n, qw()).row_range(r0, r1),
          dk_.view(rows, kvw()).row_range(k0, k1), dv_.view(rows, kvw()).row_range(k0, k1));
    }
    rope(be, s, dq.view(n, qw()), c_.num_attention_heads, c0, c1, true);
    auto dkc = alloc(be, n, kvw()), dvc = alloc(be, n, kvw());  // complete now
    tightfit::gather_rows(be, s, c0, c1, cview(dk_.view(rows, kvw())), dkc.view(n, kvw()));
    tightfit::gather_rows(be, s, c0, c1, cview(dv_.view(rows, kvw())), dvc.view(n, kvw()));
    rope(be, s, dkc.view(n, kvw()), c_.num_key_value_heads, c0, c1, true);
    struct {
      int id;
      proj p;
      buffer& g;
      index_t cols;
    } into_h[] = {{wq, proj::q_proj, dq, qw()},
                  {wk, proj::k_proj, dkc, kvw()},
                  {wv, proj::v_proj, dvc, kvw()}};
    for (auto& [id, p, g, cols] : into_h) {
      be.gemm(no, no, A(1), g.view(n, cols), w(id, cols, d), A(1), v(dh, n));
      lora_backward(be, lora_, p, h, g.view(n, cols), v(dh, n), wg);
      if (wants(id, wg)) be.gemm(yes, no, A(1), g.view(n, cols), h, A(1), grad(id, cols, d));
    }
    if (wants(wo, wg))
      be.gemm(yes, no, A(1), cview(v(dyc, n)), a.o.view(n, qw()), A(1), grad(wo, d, qw()));
    if (wants(wd, wg))
      be.gemm(yes, no, A(1), cview(v(dyc, n)), a.act.view(n, f()), A(1), grad(wd, d, f()));
    if (wants(wg_, wg)) be.gemm(yes, no, A(1), dgate.view(n, f()), h, A(1), grad(wg_, f(), d));
    if (wants(wu, wg)) be.gemm(yes, no, A(1), dup.view(n, f()), h, A(1), grad(wu, f(), d));
    be.rmsnorm_backward(a.x.view(n, d), p_->value(id_[norm]), a.rstd.span(), v(dh, n), v(dxc, n),
                        wants(norm, wg) ? p_->grad(id_[norm]) : std::span<T>{});
    if (mode.input_grad) tightfit::scatter_rows(be, s, c0, c1, cview(v(dxc, n)), dx);
  }
  void end_backward(B&) {
    for (buffer* b : {&k_, &v_, &dk_, &dv_}) b->reset();
  }

 private:
  using buffer = tightfit::buffer_t<B>;
  using proj = tightfit::projection;
  static constexpr auto no = tightfit::transpose::no, yes = tightfit::transpose::yes;
  enum { norm, wq, wk, wv, wo, wg_, wu, wd };
  struct acts {  // one chunk's rows, n = B * (c1 - c0), gathered
    index_t n = 0;
    buffer x, h, rstd, q, o, lse, gate, up, act;
  };

  index_t qw() const { return c_.q_width(); }
  index_t kvw() const { return c_.kv_width(); }
  index_t f() const { return c_.intermediate_size; }
  tightfit::attention_shape shape() const {
    return {c_.num_attention_heads, c_.num_key_value_heads, c_.head_dim};
  }
  A scale() const { return A(1) / std::sqrt(A(c_.head_dim)); }
  static buffer alloc(B& be, index_t r, index_t cols) { return be.template allocate<T>(r * cols); }
  mview v(buffer& b, index_t r) const { return b.view(r, c_.hidden_size); }
  cview w(int i, index_t r, index_t cols) const {
    return tightfit::as_matrix(std::span<const T>(p_->value(id_[i])), r, cols);
  }
  /// Whether parameter i's gradient is accumulated (one without a gradient buffer is frozen).
  bool wants(int i, bool wg) const { return wg && p_->has_grad(id_[i]); }
  mview grad(int i, index_t r, index_t cols) const {
    return tightfit::as_matrix(p_->grad(id_[i]), r, cols);
  }
  cview keys(index_t rows, index_t k0, index_t k1) const {
    return k_.view(rows, kvw()).row_range(k0, k1);
  }
  cview vals(index_t rows, index_t k0, index_t k1) const {
    return v_.view(rows, kvw()).row_range(k0, k1);
  }
  void rope(B& be, const seq_t& s, mview m, index_t heads, index_t c0, index_t c1, bool back) {
    const index_t c = c1 - c0;
    for (index_t b = 0; b < s.batch; ++b) {
      auto r = m.row_range(b * c, (b + 1) * c);
      back ? be.rope_backward(r, heads, c_.head_dim, tightfit::rope_args{c0, {}, {}, c_.rope_theta})
           : be.rope_forward(r, heads, c_.head_dim, tightfit::rope_args{c0, {}, {}, c_.rope_theta});
    }
  }
  /// K/V cache of every row; in backward also all of it up front, and the dK/dV accumulators.
  void begin(B& be, const seq_t& s, cview x, index_t chunk, bool backward) {
    k_ = alloc(be, s.rows(), kvw());
    v_ = alloc(be, s.rows(), kvw());
    if (!backward) return;
    for (index_t c0 = 0; c0 < s.seq_len; c0 += chunk)
      project_kv(be, s, x, c0, std::min(s.seq_len, c0 + chunk));
    dk_ = alloc(be, s.rows(), kvw());
    dv_ = alloc(be, s.rows(), kvw());
  }
  /// Writes K (roped) and V of rows [c0, c1) into the cache; returns the chunk's x, h, rstd.
  acts project_kv(B& be, const seq_t& s, cview x, index_t c0, index_t c1) {
    acts a;
    const index_t d = c_.hidden_size;
    a.n = s.batch * (c1 - c0);
    a.x = alloc(be, a.n, d), a.h = alloc(be, a.n, d), a.rstd = alloc(be, a.n, 1);
    tightfit::gather_rows(be, s, c0, c1, x, v(a.x, a.n));
    be.rmsnorm_forward(a.x.view(a.n, d), p_->value(id_[norm]), A(c_.rms_norm_eps), v(a.h, a.n),
                       a.rstd.span());
    auto kc = alloc(be, a.n, kvw()), vc = alloc(be, a.n, kvw());
    be.gemm(no, yes, A(1), a.h.view(a.n, d), w(wk, kvw(), d), A(0), kc.view(a.n, kvw()));
    be.gemm(no, yes, A(1), a.h.view(a.n, d), w(wv, kvw(), d), A(0), vc.view(a.n, kvw()));
    lora_forward(be, lora_, proj::k_proj, a.h.view(a.n, d), kc.view(a.n, kvw()));
    lora_forward(be, lora_, proj::v_proj, a.h.view(a.n, d), vc.view(a.n, kvw()));
    rope(be, s, kc.view(a.n, kvw()), c_.num_key_value_heads, c0, c1, false);
    tightfit::scatter_rows(be, s, c0, c1, kc.view(a.n, kvw()), k_.view(s.rows(), kvw()));
    tightfit::scatter_rows(be, s, c0, c1, vc.view(a.n, kvw()), v_.view(s.rows(), kvw()));
    return a;
  }
  /// The chunk's activations (K/V rows rewritten: same values in backward, new in forward).
  acts recompute(B& be, const seq_t& s, cview x, index_t c0, index_t c1) {
    acts a = project_kv(be, s, x, c0, c1);
    const index_t n = a.n, d = c_.hidden_size, hn = c_.num_attention_heads, c = c1 - c0;
    a.q = alloc(be, n, qw()), a.o = alloc(be, n, qw()), a.lse = alloc(be, n, hn);
    a.gate = alloc(be, n, f()), a.up = alloc(be, n, f()), a.act = alloc(be, n, f());
    be.gemm(no, yes, A(1), a.h.view(n, d), w(wq, qw(), d), A(0), a.q.view(n, qw()));
    lora_forward(be, lora_, proj::q_proj, a.h.view(n, d), a.q.view(n, qw()));
    rope(be, s, a.q.view(n, qw()), hn, c0, c1, false);
    for (index_t b = 0; b < s.batch; ++b)
      be.attention_forward(shape(), a.q.view(n, qw()).row_range(b * c, (b + 1) * c),
                           keys(s.rows(), b * s.seq_len, b * s.seq_len + c1),
                           vals(s.rows(), b * s.seq_len, b * s.seq_len + c1),
                           tightfit::attention_mask{c0, s.length(b)}, scale(),
                           a.o.view(n, qw()).row_range(b * c, (b + 1) * c),
                           a.lse.view(n, hn).row_range(b * c, (b + 1) * c));
    be.gemm(no, yes, A(1), a.h.view(n, d), w(wg_, f(), d), A(0), a.gate.view(n, f()));
    be.gemm(no, yes, A(1), a.h.view(n, d), w(wu, f(), d), A(0), a.up.view(n, f()));
    lora_forward(be, lora_, proj::gate_proj, a.h.view(n, d), a.gate.view(n, f()));
    lora_forward(be, lora_, proj::up_proj, a.h.view(n, d), a.up.view(n, f()));
    be.swiglu_forward(a.gate.view(n, f()), a.up.view(n, f()), a.act.view(n, f()));
    return a;
  }

  tightfit::parameter_set<B>* p_;
  tightfit::model_config c_;
  std::vector<std::size_t> id_;       // positions of the parameter table's rows
  buffer k_, v_, dk_, dv_;            // (B*T, Hkv*hd) each
  tightfit::lora_binding<B> lora_{};  // adapters of the projections (none by default)
};
