// tightfit/nn/decoder_layer.hpp: the Llama / Qwen decoder layer, forward and sequence-chunked
// backward (StreamBP, Luo et al., NeurIPS 2025, arXiv 2506.03077; docs/streambp.md).
//
//   h  = RMSNorm(X; g1)
//   Q  = h Wq^T + bq (H*hd), K = h Wk^T + bk, V = h Wv^T + bv (Hkv*hd); optional per-head
//        RMSNorm of Q and K; the biases are optional (config.qkv_bias: Qwen2)
//   Q, K = RoPE(Q, K)            O = causal GQA attention(Q, K, V)
//   X2 = X + O Wo^T + bo         h2 = RMSNorm(X2; g2)        (bo optional: config.o_bias)
//   Y  = X2 + (silu(h2 Wg^T + bg) * (h2 Wu^T + bu)) Wd^T + bd  (MLP biases: config.mlp_bias)
//
// RoPE uses the frequencies of nn/rope.hpp (Hugging Face rope_scaling) at each row's position:
// t, or position_ids[t] for packed sequences (sequence_batch). Attention is causal, limited to
// the layer's sliding window (config.layer_window) and, for packed sequences, to the query's
// own document (attention_mask::doc_start = t - position_ids[t]).
//
// Invariants of the backward: K and V of all positions are computed once per layer
// (begin_backward) and never replicated per query head; chunks run last to first, so when chunk
// [c0, c1) is done the dK/dV rows of [c0, c1) are complete and their projections are
// backpropagated then; parameter gradients accumulate with beta = 1 GEMMs. Only the masked-free
// (c x c1) part of attention is computed per chunk (the kernel skips masked tiles). Biases need
// no kernel of their own: Y += 1 b is a rank-1 GEMM with a ones column, db += 1^T dY its
// transpose.
//
// Frozen parameters and adapters: with mode.weight_grads, the layer accumulates the gradient of
// each of its parameters that holds a gradient buffer; one without is frozen and its
// weight-gradient GEMM does not run. A projection bound to a LoRA adapter (nn/adapters.hpp,
// set_lora) adds s (x A^T) B^T to its output; its backward adds s (dy B) A to dx and, under
// mode.weight_grads, accumulates dA += s (dy B)^T x and dB += s dy^T (x A^T) (exact: the
// gradients of W + s B A, contracted with B and A).
// Sequence parallelism (SequenceParallelLayer, nn/sequence_shard.hpp): forward_shard,
// begin_backward_shard and end_backward_shard run the same chunks over a rank's positions (x,
// dy, dx hold its rows only; RoPE and masks are global). Attention runs over the driver's K/V
// ring, one key block at a time (attention_mask::k0, merged by log-sum-exp): the backward
// chunks stop at the attention output's gradient, and end_backward_shard runs the attention
// backward over the ring (dK/dV partials travel with their block), the Q projections' backward
// of each round and the K/V projections' of the own rows once their dK/dV are home.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tightfit/backend/concept.hpp"
#include "tightfit/nn/adapters.hpp"
#include "tightfit/nn/config.hpp"
#include "tightfit/nn/detail/layer_parts.hpp"
#include "tightfit/nn/layer.hpp"
#include "tightfit/nn/parameters.hpp"
#include "tightfit/nn/rope.hpp"
#include "tightfit/nn/sequence_shard.hpp"

namespace tightfit {

/// Positions of one decoder layer's parameters in a parameter_set.
struct decoder_layer_params {
  std::size_t input_norm = 0, q_proj = 0, k_proj = 0, v_proj = 0, o_proj = 0, post_norm = 0;
  std::size_t gate_proj = 0, up_proj = 0, down_proj = 0;
  std::size_t q_norm = 0, k_norm = 0;                     ///< only with config.qk_norm
  std::size_t q_bias = 0, k_bias = 0, v_bias = 0;         ///< only with config.qkv_bias
  std::size_t o_bias = 0;                                 ///< only with config.o_bias
  std::size_t gate_bias = 0, up_bias = 0, down_bias = 0;  ///< only with config.mlp_bias

  /// The Hugging Face name prefix of layer l: "model.layers.<l>.".
  static std::string prefix(index_t l) { return hf_names::layer_prefix(l); }
};

/// The parameter table of a decoder layer: each row's name, shape and the field of
/// decoder_layer_params that receives its position. Declaration, loading, layer_param_ids and
/// the optimizers all read this one table.
struct decoder_param_row {
  param_spec spec;
  std::size_t decoder_layer_params::*slot;
};
inline std::vector<decoder_param_row> decoder_layer_table(const model_config& c) {
  using P = decoder_layer_params;
  const index_t d = c.hidden_size, q = c.q_width(), kv = c.kv_width(), f = c.intermediate_size;
  std::vector<decoder_param_row> t{{{"input_layernorm.weight", {d}}, &P::input_norm},
                                   {{"self_attn.q_proj.weight", {q, d}}, &P::q_proj},
                                   {{"self_attn.k_proj.weight", {kv, d}}, &P::k_proj},
                                   {{"self_attn.v_proj.weight", {kv, d}}, &P::v_proj},
                                   {{"self_attn.o_proj.weight", {d, q}}, &P::o_proj}};
  if (c.qkv_bias) {
    t.push_back({{"self_attn.q_proj.bias", {q}}, &P::q_bias});
    t.push_back({{"self_attn.k_proj.bias", {kv}}, &P::k_bias});
    t.push_back({{"self_attn.v_proj.bias", {kv}}, &P::v_bias});
  }
  if (c.o_bias) t.push_back({{"self_attn.o_proj.bias", {d}}, &P::o_bias});
  if (c.qk_norm) {
    t.push_back({{"self_attn.q_norm.weight", {c.head_dim}}, &P::q_norm});
    t.push_back({{"self_attn.k_norm.weight", {c.head_dim}}, &P::k_norm});
  }
  t.push_back({{"post_attention_layernorm.weight", {d}}, &P::post_norm});
  t.push_back({{"mlp.gate_proj.weight", {f, d}}, &P::gate_proj});
  t.push_back({{"mlp.up_proj.weight", {f, d}}, &P::up_proj});
  t.push_back({{"mlp.down_proj.weight", {d, f}}, &P::down_proj});
  if (c.mlp_bias) {
    t.push_back({{"mlp.gate_proj.bias", {f}}, &P::gate_bias});
    t.push_back({{"mlp.up_proj.bias", {f}}, &P::up_bias});
    t.push_back({{"mlp.down_proj.bias", {d}}, &P::down_bias});
  }
  return t;
}

/// One decoder layer over parameters held in a parameter_set. Satisfies Layer.
template <TransformerBackend B>
class decoder_layer {
 public:
  using T = storage_t<B>;
  using A = accum_t<B>;
  using buffer = buffer_t<B>;
  using stat_buffer = accum_buffer_t<B>;  ///< rstd, lse: accum_t

  decoder_layer(parameter_set<B>& params, const model_config& config, index_t layer_index)
      : w_(params),
        cfg_(config),
        index_(layer_index),
        pos_(config, config.layer_window(layer_index), config.attn_logit_softcapping) {
    const std::string p = hf_names::layer_prefix(layer_index);
    for (const auto& row : decoder_layer_table(cfg_)) ids_.*row.slot = params.at(p + row.spec.name);
  }

  /// This layer's parameters (names under "model.layers.N.", shapes): decoder_layer_table.
  static std::vector<param_spec> parameter_table(const model_config& c) {
    std::vector<param_spec> t;
    for (auto& row : decoder_layer_table(c)) t.push_back(std::move(row.spec));
    return t;
  }

  const decoder_layer_params& param_ids() const { return ids_; }
  index_t layer_index() const { return index_; }

  /// Binds LoRA adapters to this layer's projections (an empty binding removes them).
  void set_lora(const lora_binding<B>& binding) { lora_ = binding; }
  const lora_binding<B>& lora() const { return lora_; }

  /// y (B*T, d) = layer(x (B*T, d)), `chunk` positions at a time (a KV-cache style forward:
  /// chunk j appends its K/V rows, then attends to the prefix). keep: keep every activation.
  void forward(B& be, const sequence_batch& seq, matrix_view<const T> x, matrix_view<T> y,
               index_t chunk, bool keep) {
    check_rows("forward", seq, x, y);
    check(chunk >= 1, "decoder_layer::forward: chunk is ", chunk, ", expected >= 1");
    pos_.prepare(seq);
    const index_t t = seq.seq_len;
    if (keep) chunk = t;
    kv_state kv(be, cfg_, seq.rows());
    for (index_t c0 = 0; c0 < t; c0 += chunk) {
      const index_t c1 = std::min(t, c0 + chunk);
      chunk_acts a = make_acts(be, seq, x, c0, c1);
      project_kv(be, seq, a, c0, c1, kv);
      forward_chunk(be, seq, a, kv, c0, c1);
      write_output(be, seq, a, c0, c1, y);
      if (keep) kept_acts_.emplace(std::move(a));
    }
    if (keep) kept_kv_.emplace(std::move(kv));
  }

  /// Backward state: K/V of every position once (or the kept ones), dK/dV accumulators.
  /// K/V are recomputed `chunk` positions at a time, so no (B*T, d) temporary is needed.
  void begin_backward(B& be, const sequence_batch& seq, matrix_view<const T> x, index_t chunk,
                      layer_grad_mode /*mode*/) {
    check_extent("decoder_layer::begin_backward", "x.rows", x.rows, seq.rows());
    pos_.prepare(seq);
    if (kept_kv_) {
      kv_ = std::move(*kept_kv_);
      kept_kv_.reset();
    } else {
      kv_.emplace(be, cfg_, seq.rows());
      const index_t t = seq.seq_len, step = std::max<index_t>(1, chunk);
      for (index_t c0 = 0; c0 < t; c0 += step) {
        const index_t c1 = std::min(t, c0 + step);
        chunk_acts a = make_acts(be, seq, x, c0, c1);
        project_kv(be, seq, a, c0, c1, *kv_);
      }
    }
    kv_->allocate_grads(be, cfg_, seq.rows());
  }

  /// Backward of positions [c0, c1) of every sequence (chunks must come last to first).
  void backward_chunk(B& be, const sequence_batch& seq, matrix_view<const T> x,
                      matrix_view<const T> dy, index_t c0, index_t c1, matrix_view<T> dx,
                      layer_grad_mode mode) {
    check(kv_.has_value(), "decoder_layer::backward_chunk: begin_backward was not called");
    check(c0 >= 0 && c0 < c1 && c1 <= seq.seq_len, "decoder_layer::backward_chunk: chunk [", c0,
          ", ", c1, ") is not inside [0, ", seq.seq_len, ")");
    check_extent("decoder_layer::backward_chunk", "dy rows", dy.rows, local_rows(seq));
    check_extent("decoder_layer::backward_chunk", "dy cols", dy.cols, cfg_.hidden_size);
    if (mode.input_grad) check_rows("backward_chunk", seq, dy, dx);
    std::optional<chunk_acts> recomputed;
    chunk_acts* a = nullptr;
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
    ring_.reset();
    kv_.reset();
    kept_acts_.reset();
    kept_kv_.reset();
    shard_.reset();
  }

  // Sequence parallelism (SequenceParallelLayer, nn/sequence_shard.hpp): x, y, dy, dx hold the
  // shard's rows only (B*Tl, d); K/V blocks travel around the ring; positions are global.

  /// y (B*Tl, d) = layer(x (B*Tl, d)) over the shard's positions: the own queries' attention
  /// over the ring's blocks, then the rest of the layer `chunk` positions at a time.
  void forward_shard(B& be, const sequence_batch& seq, const sequence_shard& shard,
                     matrix_view<const T> x, matrix_view<T> y, index_t chunk,
                     const kv_ring<T>& ring) {
    check(chunk >= 1, "decoder_layer::forward_shard: chunk is ", chunk, ", expected >= 1");
    use_shard(seq, shard);
    check_rows("forward_shard", seq, x, y);
    pos_.prepare(seq);
    ring_attention_forward(be, seq, x, chunk, ring);
    for_each_shard_chunk(chunk, false, [&](index_t c0, index_t c1) {
      chunk_acts a = make_acts(be, seq, x, c0, c1);
      forward_chunk(be, seq, a, kv_state{}, c0, c1);  // attention: the ring's merged rows
      write_output(be, seq, a, c0, c1, y);
    });
    ring_.reset();
    shard_.reset();
  }

  /// Backward state over a shard: the own rows' attention output and lse over the ring.
  /// backward_chunk then takes global chunks inside the shard's blocks, last to first, and
  /// keeps each chunk's attention output gradient.
  void begin_backward_shard(B& be, const sequence_batch& seq, const sequence_shard& shard,
                            matrix_view<const T> x, index_t chunk, layer_grad_mode /*mode*/,
                            const kv_ring<T>& ring) {
    use_shard(seq, shard);
    check_extent("decoder_layer::begin_backward_shard", "x.rows", x.rows, local_rows(seq));
    pos_.prepare(seq);
    kept_acts_.reset();
    kept_kv_.reset();
    shard_chunk_ = std::max<index_t>(1, chunk);
    ring_attention_forward(be, seq, x, shard_chunk_, ring);
    ring_->d_o = be.template allocate<T>(local_rows(seq) * cfg_.q_width());  // (B*Tl, H*hd)
    kv_.emplace();  // no K/V of its own: backward_chunk reads the ring's rows
  }

  /// After the shard's chunks: the attention backward over the ring (K/V and the dK/dV
  /// partials of each block travel together; the last shift brings every rank its own rows'
  /// sums), the Q projections' backward of every round and the K/V projections' of the own
  /// rows into dx (B*Tl, d) and the weights' gradients; frees the state.
  void end_backward_shard(B& be, const sequence_batch& seq, matrix_view<const T> x,
                          matrix_view<T> dx, layer_grad_mode mode, const kv_ring<T>& ring) {
    check(kv_.has_value() && shard_.has_value() && ring_.has_value(),
          "decoder_layer::end_backward_shard: begin_backward_shard was not called");
    if (mode.input_grad) check_rows("end_backward_shard", seq, x, dx);
    const index_t d = cfg_.hidden_size, kvw = cfg_.kv_width(), qw = cfg_.q_width();
    const index_t h = cfg_.num_attention_heads, rows = local_rows(seq);
    const index_t travel = seq.batch * ring.max_local;
    kv_state kv = ring_kv(be, seq, x, travel);
    kv.dk = be.template allocate<T>(travel * kvw);  // (B*max_local, Hkv*hd) partials of a block
    kv.dv = be.template allocate<T>(travel * kvw);  // (B*max_local, Hkv*hd)
    const int n_ranks = ring.size();
    const attention_shape shape{h, cfg_.num_key_value_heads, cfg_.head_dim};
    const auto scale = static_cast<A>(cfg_.attention_scale());
    for (int round = 0; round < n_ranks; ++round) {
      const sequence_shard& held = ring.held(round);
      for_each_shard_chunk(shard_chunk_, true, [&](index_t c0, index_t c1) {
        if (held.blocks.front().p0 >= c1) return;  // causal: the block is after the chunk
        chunk_acts a = make_acts(be, seq, x, c0, c1);
        project_q(be, seq, a, c0, c1);
        const index_t n = a.n, c = c1 - c0, l0 = local_start(c0, c1), tl = shard_->local_len();
        buffer dq = be.template allocate<T>(n * qw);  // (n, H*hd) this block's part
        for_each_block_piece(
            seq, held, kv, travel, c1,
            [&](index_t b, index_t p0, auto keys, auto vals, index_t k_r0, index_t k_r1) {
              const index_t o0 = b * tl + l0;
              attention_mask m = pos_.mask_of(seq, b, c0);
              m.k0 = p0;
              m.key_end = c1;
              be.attention_backward(
                  shape, a.q.view(n, qw).row_range(b * c, (b + 1) * c), keys, vals,
                  matrix_view<const T>(ring_->o.view(rows, qw).row_range(o0, o0 + c)),
                  matrix_view<const T>(ring_->d_o.view(rows, qw).row_range(o0, o0 + c)),
                  matrix_view<const A>(ring_->lse.view(rows, h).row_range(o0, o0 + c)), m, scale,
                  dq.view(n, qw).row_range(b * c, (b + 1) * c),
                  kv.dk.view(travel, kvw).row_range(k_r0, k_r1),
                  kv.dv.view(travel, kvw).row_range(k_r0, k_r1));
            });
        query_backward(be, seq, a, std::move(dq), c0, c1, dx, mode);
      });
      if (n_ranks > 1) {
        if (round + 1 < n_ranks) {
          ring.shift(kv.k.span());
          ring.shift(kv.v.span());
        }
        ring.shift(kv.dk.span());  // the partials follow their block, home after N shifts
        ring.shift(kv.dv.span());
      }
    }
    ring_.reset();
    kv.k.reset();
    kv.v.reset();
    if (cfg_.qk_norm) {  // the k-norm state of the own rows, recomputed
      kv_state own(be, cfg_, rows);
      for_each_shard_chunk(shard_chunk_, false, [&](index_t c0, index_t c1) {
        chunk_acts a = make_acts(be, seq, x, c0, c1);
        project_kv(be, seq, a, c0, c1, own);
      });
      kv.k_raw = std::move(own.k_raw);
      kv.rstd_k = std::move(own.rstd_k);
    }
    kv_ = std::move(kv);  // the own rows' complete dK/dV and k-norm state
    if (mode.weight_grads || mode.input_grad)
      for_each_shard_chunk(shard_chunk_, true, [&](index_t c0, index_t c1) {
        chunk_acts a = make_acts(be, seq, x, c0, c1);
        const index_t n = a.n;
        auto [dk, dv] = kv_rows_backward(be, seq, c0, c1, a.h1.view(n, d), mode.weight_grads);
        buffer dh1 = be.template allocate<T>(n * d);  // (n, d)
        kv_input_backward(be, a.h1.view(n, d), dk.view(n, kvw), dv.view(n, kvw), dh1.view(n, d),
                          mode.weight_grads);
        input_norm_backward(be, seq, a, dh1.view(n, d), c0, c1, dx, mode);
      });
    end_backward(be);
  }

 private:
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
    buffer x2;                // (n, d) residual after attention
    buffer h2;                // (n, d)
    stat_buffer rstd2;        // (n)
    buffer gate;              // (n, f)
    buffer up;                // (n, f)
    buffer act;               // (n, f) silu(gate) * up
  };

  /// The own rows' attention over a sequence shard's K/V ring (forward_shard, the backward).
  struct ring_state {
    buffer o;         // (B*Tl, H*hd) attention output, merged over the ring's blocks
    stat_buffer lse;  // (B*Tl, H)
    buffer d_o;       // (B*Tl, H*hd) its gradient (backward_chunk, then end_backward_shard)
  };

  /// K/V of the own rows in the ring's block layout: k, v (B*max_local, Hkv*hd) whose first
  /// B*Tl rows are the own rows (local layout). No k-norm state (k_raw, rstd_k): the K/V
  /// projections' backward recomputes it after the ring (project_kv into the own rows).
  kv_state ring_kv(B& be, const sequence_batch& seq, matrix_view<const T> x, index_t travel) const {
    kv_state kv;
    kv.k = be.template allocate<T>(travel * cfg_.kv_width());
    kv.v = be.template allocate<T>(travel * cfg_.kv_width());
    for_each_shard_chunk(shard_chunk_, false, [&](index_t c0, index_t c1) {
      chunk_acts a = make_acts(be, seq, x, c0, c1);
      project_kv(be, seq, a, c0, c1, kv);
    });
    return kv;
  }

  /// f(b, p0, keys, values, r0, r1) for every piece of the held block that queries before c1
  /// may see: sequence b's positions [p0, p1) of one of its blocks (p1 clipped to c1), rows
  /// [r0, r1) of the travelling buffers (B*max_local rows).
  template <class F>
  void for_each_block_piece(const sequence_batch& seq, const sequence_shard& held,
                            const kv_state& kv, index_t travel, index_t c1, F&& f) const {
    const index_t kvw = cfg_.kv_width(), tl = held.local_len();
    for (index_t b = 0; b < seq.batch; ++b)
      for (const auto& k : held.blocks) {
        if (k.p0 >= c1) continue;  // causal: no query before c1 sees it
        const index_t r0 = b * tl + k.local0, r1 = r0 + std::min(k.p1, c1) - k.p0;
        f(b, k.p0, matrix_view<const T>(kv.k.view(travel, kvw).row_range(r0, r1)),
          matrix_view<const T>(kv.v.view(travel, kvw).row_range(r0, r1)), r0, r1);
      }
  }

  /// ring_ (o, lse) of the own rows: N rounds, each attending the own queries `chunk`
  /// positions at a time to the held block (key offset k0, the chunk's whole key range as
  /// key_end) and merging by log-sum-exp, then shifting K and V one rank on.
  void ring_attention_forward(B& be, const sequence_batch& seq, matrix_view<const T> x,
                              index_t chunk, const kv_ring<T>& ring) {
    check(ring.size() >= 1 && ring.rank >= 0 && ring.rank < ring.size() &&
              ring.max_local >= shard_->local_len(),
          "decoder_layer: the K/V ring has ", ring.size(), " shards, rank ", ring.rank,
          ", max_local ", ring.max_local, " for a shard of ", shard_->local_len(), " positions");
    const index_t qw = cfg_.q_width(), h = cfg_.num_attention_heads, hd = cfg_.head_dim;
    const index_t rows = local_rows(seq), travel = seq.batch * ring.max_local;
    const index_t tl = shard_->local_len();
    shard_chunk_ = std::max<index_t>(1, chunk);
    ring_.emplace();
    ring_->o = be.template allocate<T>(rows * qw);   // (B*Tl, H*hd)
    ring_->lse = be.template allocate<A>(rows * h);  // (B*Tl, H)
    be.fill(ring_->o.view(rows, qw), A(0));
    be.fill(ring_->lse.view(rows, h), -std::numeric_limits<A>::infinity());
    kv_state kv = ring_kv(be, seq, x, travel);
    const attention_shape shape{h, cfg_.num_key_value_heads, hd};
    const auto scale = static_cast<A>(cfg_.attention_scale());
    for (int round = 0; round < ring.size(); ++round) {
      const sequence_shard& held = ring.held(round);
      for_each_shard_chunk(shard_chunk_, false, [&](index_t c0, index_t c1) {
        if (held.blocks.front().p0 >= c1) return;
        chunk_acts a = make_acts(be, seq, x, c0, c1);
        project_q(be, seq, a, c0, c1);
        const index_t n = a.n, c = c1 - c0, l0 = local_start(c0, c1);
        buffer ob = be.template allocate<T>(c * qw);      // (c, H*hd) one piece's output
        stat_buffer lb = be.template allocate<A>(c * h);  // (c, H)
        for_each_block_piece(
            seq, held, kv, travel, c1,
            [&](index_t b, index_t p0, auto keys, auto vals, index_t, index_t) {
              attention_mask m = pos_.mask_of(seq, b, c0);
              m.k0 = p0;
              m.key_end = c1;
              be.attention_forward(shape, a.q.view(n, qw).row_range(b * c, (b + 1) * c), keys, vals,
                                   m, scale, ob.view(c, qw), lb.view(c, h));
              const index_t o0 = b * tl + l0;
              attention_merge(be, h, hd, ring_->o.view(rows, qw).row_range(o0, o0 + c),
                              ring_->lse.view(rows, h).row_range(o0, o0 + c),
                              matrix_view<const T>(ob.view(c, qw)),
                              matrix_view<const A>(lb.view(c, h)));
            });
      });
      if (round + 1 < ring.size()) {
        ring.shift(kv.k.span());
        ring.shift(kv.v.span());
      }
    }
  }

  /// The Q projection's backward of one chunk given dq (n, H*hd) w.r.t. the rotated q (one
  /// ring round's part: every step is linear in dq, so the rounds' parts add up): RoPE and
  /// q-norm undone, the q weights' gradients, dh1 = dq Wq through the input norm into dx.
  void query_backward(B& be, const sequence_batch& seq, chunk_acts& a, buffer dq, index_t c0,
                      index_t c1, matrix_view<T> dx, layer_grad_mode mode) const {
    const index_t n = a.n, d = cfg_.hidden_size, qw = cfg_.q_width();
    const bool wg = mode.weight_grads;
    detail::unfinish_q(be, seq, cfg_, pos_, w_.vec(ids_.q_norm), w_.grad_vec(ids_.q_norm, wg),
                       a.q_raw, a.rstd_q, dq, c0, c1);
    auto h1 = a.h1.view(n, d);
    w_.linear_weight_grad(be, ids_.q_proj, dq.view(n, qw), h1, wg);
    if (cfg_.qkv_bias && w_.wants(ids_.q_bias, wg)) add_bias_grad(be, ids_.q_bias, dq.view(n, qw));
    if (!mode.input_grad && !w_.wants(ids_.input_norm, wg)) {  // the adapters' gradients only
      lora_backward(be, projection::q_proj, h1, dq.view(n, qw), {}, wg);
      return;
    }
    buffer dh1 = be.template allocate<T>(n * d);  // (n, d)
    w_.linear_input_grad(be, ids_.q_proj, dq.view(n, qw), dh1.view(n, d), A(0));
    lora_backward(be, projection::q_proj, h1, dq.view(n, qw), dh1.view(n, d), wg);
    input_norm_backward(be, seq, a, dh1.view(n, d), c0, c1, dx, mode);
  }

  /// dx rows of the chunk += the input norm's backward of dh1 (n, d), and its weight's gradient.
  void input_norm_backward(B& be, const sequence_batch& seq, const chunk_acts& a,
                           matrix_view<T> dh1, index_t c0, index_t c1, matrix_view<T> dx,
                           layer_grad_mode mode) const {
    const index_t n = a.n, d = cfg_.hidden_size;
    buffer dxc = be.template allocate<T>(n * d);  // (n, d) this chunk's dx rows
    if (mode.input_grad) gather_x(be, seq, c0, c1, matrix_view<const T>(dx), dxc.view(n, d));
    be.rmsnorm_backward(a.xv, w_.vec(ids_.input_norm), a.rstd1.span(), matrix_view<const T>(dh1),
                        dxc.view(n, d), w_.grad_vec(ids_.input_norm, mode.weight_grads));
    if (mode.input_grad) scatter_x(be, seq, c0, c1, matrix_view<const T>(dxc.view(n, d)), dx);
  }

  /// Rows of x, y, dy, dx: B*T, or B*Tl over a shard.
  index_t local_rows(const sequence_batch& seq) const {
    return shard_ ? seq.batch * shard_->local_len() : seq.rows();
  }

  void use_shard(const sequence_batch& seq, const sequence_shard& shard) {
    check(shard.seq_len == seq.seq_len && !shard.blocks.empty(),
          "decoder_layer: the sequence shard covers T = ", shard.seq_len, " with ",
          shard.blocks.size(), " blocks, the batch has T = ", seq.seq_len);
    shard_ = shard;
  }

  /// f(c0, c1) over the shard's positions, `step` at a time within each block (global
  /// positions), first to last or last to first.
  template <class F>
  void for_each_shard_chunk(index_t step, bool last_first, F&& f) const {
    std::vector<std::pair<index_t, index_t>> chunks;
    for (const auto& k : shard_->blocks)
      for (index_t c0 = k.p0; c0 < k.p1; c0 += step)
        chunks.emplace_back(c0, std::min(k.p1, c0 + step));
    if (last_first) std::reverse(chunks.begin(), chunks.end());
    for (auto [c0, c1] : chunks) f(c0, c1);
  }

  /// gather_rows / scatter_rows for x, y, dy, dx: (B*T) rows, or the shard's (B*Tl) rows
  /// (then [c0, c1) must lie inside one of its blocks).
  index_t local_start(index_t c0, index_t c1) const {
    const auto* k = shard_->find(c0);
    check(k != nullptr && c1 <= k->p1, "decoder_layer: chunk [", c0, ", ", c1,
          ") is not inside one block of this rank's sequence shard");
    return k->local0 + (c0 - k->p0);
  }
  /// U: T, or A for the statistics.
  template <class U>
  void gather_x(B& be, const sequence_batch& seq, index_t c0, index_t c1,
                std::type_identity_t<matrix_view<const U>> src, matrix_view<U> dst) const {
    if (!shard_) return gather_rows<B, U>(be, seq, c0, c1, src, dst);
    const index_t l0 = local_start(c0, c1), c = c1 - c0, tl = shard_->local_len();
    for (index_t b = 0; b < seq.batch; ++b)
      be.copy(src.row_range(b * tl + l0, b * tl + l0 + c), dst.row_range(b * c, (b + 1) * c));
  }
  template <class U>
  void scatter_x(B& be, const sequence_batch& seq, index_t c0, index_t c1,
                 std::type_identity_t<matrix_view<const U>> src, matrix_view<U> dst) const {
    if (!shard_) return scatter_rows<B, U>(be, seq, c0, c1, src, dst);
    const index_t l0 = local_start(c0, c1), c = c1 - c0, tl = shard_->local_len();
    for (index_t b = 0; b < seq.batch; ++b)
      be.copy(src.row_range(b * c, (b + 1) * c), dst.row_range(b * tl + l0, b * tl + l0 + c));
  }  /// The rows of x, y, dy, dx and the K/V buffers as detail::store_kv / kv_grad_rows place
  /// them: all B*T rows, or the shard's own B*Tl.
  struct row_map {
    const decoder_layer* layer;
    index_t rows(const sequence_batch& seq) const { return layer->local_rows(seq); }
    template <class U>
    void gather(B& be, const sequence_batch& seq, index_t c0, index_t c1,
                std::type_identity_t<matrix_view<const U>> src, matrix_view<U> dst) const {
      layer->template gather_x<U>(be, seq, c0, c1, src, dst);
    }
    template <class U>
    void scatter(B& be, const sequence_batch& seq, index_t c0, index_t c1,
                 std::type_identity_t<matrix_view<const U>> src, matrix_view<U> dst) const {
      layer->template scatter_x<U>(be, seq, c0, c1, src, dst);
    }
  };

  /// y rows of the chunk = x2 + act Wd^T (+ bd).
  void write_output(B& be, const sequence_batch& seq, const chunk_acts& a, index_t c0, index_t c1,
                    matrix_view<T> y) const {
    buffer y_c = be.template allocate<T>((c1 - c0) * seq.batch * cfg_.hidden_size);
    auto yv = y_c.view((c1 - c0) * seq.batch, cfg_.hidden_size);  // (B*c, d)
    be.copy(a.x2.view(yv.rows, yv.cols), yv);
    w_.linear(be, ids_.down_proj, a.act.view(yv.rows, cfg_.intermediate_size), yv, A(1));
    if (cfg_.mlp_bias) add_bias(be, ids_.down_bias, yv);
    lora_forward(be, projection::down_proj, a.act.view(yv.rows, cfg_.intermediate_size), yv);
    scatter_x(be, seq, c0, c1, matrix_view<const T>(yv), y);
  }

  void check_rows(const char* where, const sequence_batch& seq, matrix_view<const T> in,
                  matrix_view<T> out) const {
    const std::string w = std::string("decoder_layer::") + where;
    check_extent(w.c_str(), "input rows", in.rows, local_rows(seq));
    check_extent(w.c_str(), "input cols", in.cols, cfg_.hidden_size);
    check_extent(w.c_str(), "output rows", out.rows, local_rows(seq));
    check_extent(w.c_str(), "output cols", out.cols, cfg_.hidden_size);
  }

  /// y (n, out) += s (x A^T) B^T for projection p's adapter (nothing without one).
  void lora_forward(B& be, projection p, matrix_view<const T> x, matrix_view<T> y) const {
    if (!lora_.has(p)) return;
    const index_t n = x.rows, r = lora_.rank;
    auto& set = *lora_.adapters;
    buffer u = be.template allocate<T>(n * r);  // (n, r) x A^T
    be.gemm(transpose::no, transpose::yes, A(1), x,
            as_matrix(std::span<const T>(set.value(lora_.a_id(p))), r, x.cols), A(0), u.view(n, r));
    be.gemm(transpose::no, transpose::yes, A(lora_.scale), matrix_view<const T>(u.view(n, r)),
            as_matrix(std::span<const T>(set.value(lora_.b_id(p))), y.cols, r), A(1), y);
  }
  /// Backward of projection p's adapter given its input x (n, in) and output gradient dy
  /// (n, out): dx (n, in) += s (dy B) A when dx is not empty; dA += s (dy B)^T x and
  /// dB += s dy^T (x A^T) when wg and the adapters hold gradients.
  void lora_backward(B& be, projection p, matrix_view<const T> x, matrix_view<const T> dy,
                     matrix_view<T> dx, bool wg) const {
    if (!lora_.has(p)) return;
    auto& set = *lora_.adapters;
    const std::size_t ia = lora_.a_id(p), ib = lora_.b_id(p);
    const bool grads = wg && set.has_grad(ia) && set.has_grad(ib);
    if (!grads && dx.empty()) return;
    const index_t n = x.rows, r = lora_.rank, in = x.cols, out = dy.cols;
    const A s = A(lora_.scale);
    auto a_m = as_matrix(std::span<const T>(set.value(ia)), r, in);   // (r, in)
    auto b_m = as_matrix(std::span<const T>(set.value(ib)), out, r);  // (out, r)
    buffer v = be.template allocate<T>(n * r);                        // (n, r) dy B
    be.gemm(transpose::no, transpose::no, A(1), dy, b_m, A(0), v.view(n, r));
    if (!dx.empty())
      be.gemm(transpose::no, transpose::no, s, matrix_view<const T>(v.view(n, r)), a_m, A(1), dx);
    if (!grads) return;
    be.gemm(transpose::yes, transpose::no, s, matrix_view<const T>(v.view(n, r)), x, A(1),
            as_matrix(set.grad(ia), r, in));
    v.reset();
    buffer u = be.template allocate<T>(n * r);  // (n, r) x A^T
    be.gemm(transpose::no, transpose::yes, A(1), x, a_m, A(0), u.view(n, r));
    be.gemm(transpose::yes, transpose::no, s, dy, matrix_view<const T>(u.view(n, r)), A(1),
            as_matrix(set.grad(ib), out, r));
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

  /// Gathers the chunk's input rows and computes h1 = RMSNorm(x).
  chunk_acts make_acts(B& be, const sequence_batch& seq, matrix_view<const T> x, index_t c0,
                       index_t c1) const {
    chunk_acts a;
    a.c0 = c0;
    a.c1 = c1;
    a.n = (c1 - c0) * seq.batch;
    const index_t d = cfg_.hidden_size;
    if (c1 - c0 == (shard_ ? shard_->local_len() : seq.seq_len)) {
      a.xv = x;
    } else {
      a.x = be.template allocate<T>(a.n * d);
      gather_x(be, seq, c0, c1, x, a.x.view(a.n, d));
      a.xv = a.x.view(a.n, d);
    }
    a.h1 = be.template allocate<T>(a.n * d);
    a.rstd1 = be.template allocate<A>(a.n);
    be.rmsnorm_forward(a.xv, w_.vec(ids_.input_norm), A(cfg_.rms_norm_eps), a.h1.view(a.n, d),
                       a.rstd1.span());
    return a;
  }

  /// K and V of the chunk's rows (from a.h1) written into its rows of kv (over a shard: the own
  /// rows, local layout).
  void project_kv(B& be, const sequence_batch& seq, const chunk_acts& a, index_t c0, index_t c1,
                  kv_state& kv) const {
    const index_t n = a.n, d = cfg_.hidden_size, kvw = cfg_.kv_width();
    buffer k_c = be.template allocate<T>(n * kvw);  // (n, Hkv*hd)
    buffer v_c = be.template allocate<T>(n * kvw);  // (n, Hkv*hd)
    auto h1 = a.h1.view(n, d);
    w_.linear(be, ids_.k_proj, h1, k_c.view(n, kvw), A(0));
    w_.linear(be, ids_.v_proj, h1, v_c.view(n, kvw), A(0));
    if (cfg_.qkv_bias) {
      add_bias(be, ids_.k_bias, k_c.view(n, kvw));
      add_bias(be, ids_.v_bias, v_c.view(n, kvw));
    }
    lora_forward(be, projection::k_proj, h1, k_c.view(n, kvw));
    lora_forward(be, projection::v_proj, h1, v_c.view(n, kvw));
    detail::store_kv(be, seq, cfg_, pos_, w_.vec(ids_.k_norm), std::move(k_c), std::move(v_c), c0,
                     c1, kv, row_map{this});
  }

  /// a.q (n, H*hd) = RoPE(q-norm(h1 Wq^T + bq)) of the chunk (q_raw, rstd_q with q-norm).
  void project_q(B& be, const sequence_batch& seq, chunk_acts& a, index_t c0, index_t c1) const {
    const index_t n = a.n, d = cfg_.hidden_size, qw = cfg_.q_width();
    const index_t h = cfg_.num_attention_heads;
    auto h1 = a.h1.view(n, d);
    a.q = be.template allocate<T>(n * qw);
    if (cfg_.qk_norm) {
      a.q_raw = be.template allocate<T>(n * qw);
      a.rstd_q = be.template allocate<A>(n * h);
      w_.linear(be, ids_.q_proj, h1, a.q_raw.view(n, qw), A(0));
      if (cfg_.qkv_bias) add_bias(be, ids_.q_bias, a.q_raw.view(n, qw));
      lora_forward(be, projection::q_proj, h1, a.q_raw.view(n, qw));
    } else {
      w_.linear(be, ids_.q_proj, h1, a.q.view(n, qw), A(0));
      if (cfg_.qkv_bias) add_bias(be, ids_.q_bias, a.q.view(n, qw));
      lora_forward(be, projection::q_proj, h1, a.q.view(n, qw));
    }
    detail::finish_q(be, seq, cfg_, pos_, w_.vec(ids_.q_norm), a.q_raw, a.rstd_q, a.q, c0, c1);
  }

  /// The chunk's forward up to the MLP activation (everything backward_rows needs).
  void forward_chunk(B& be, const sequence_batch& seq, chunk_acts& a, const kv_state& kv,
                     index_t c0, index_t c1) const {
    const index_t n = a.n, d = cfg_.hidden_size, qw = cfg_.q_width();
    const index_t h = cfg_.num_attention_heads, f = cfg_.intermediate_size;
    a.o = be.template allocate<T>(n * qw);
    a.lse = be.template allocate<A>(n * h);
    if (ring_) {  // over a sequence shard: the ring's merged attention rows (forward_shard)
      gather_x(be, seq, c0, c1, matrix_view<const T>(ring_->o.view(local_rows(seq), qw)),
               a.o.view(n, qw));
      gather_x<A>(be, seq, c0, c1, matrix_view<const A>(ring_->lse.view(local_rows(seq), h)),
                  a.lse.view(n, h));
    } else {  // each sequence's chunk queries against its key prefix [0, c1)
      project_q(be, seq, a, c0, c1);
      detail::attend_forward(be, seq, cfg_, pos_, kv, matrix_view<const T>(a.q.view(n, qw)),
                             a.o.view(n, qw), a.lse.view(n, h), c0, c1);
    }
    // x2 = x + o Wo^T
    a.x2 = be.template allocate<T>(n * d);
    be.copy(a.xv, a.x2.view(n, d));
    w_.linear(be, ids_.o_proj, a.o.view(n, qw), a.x2.view(n, d), A(1));
    if (cfg_.o_bias) add_bias(be, ids_.o_bias, a.x2.view(n, d));
    lora_forward(be, projection::o_proj, a.o.view(n, qw), a.x2.view(n, d));
    // MLP input
    a.h2 = be.template allocate<T>(n * d);
    a.rstd2 = be.template allocate<A>(n);
    be.rmsnorm_forward(a.x2.view(n, d), w_.vec(ids_.post_norm), A(cfg_.rms_norm_eps),
                       a.h2.view(n, d), a.rstd2.span());
    a.gate = be.template allocate<T>(n * f);
    a.up = be.template allocate<T>(n * f);
    a.act = be.template allocate<T>(n * f);
    w_.linear(be, ids_.gate_proj, a.h2.view(n, d), a.gate.view(n, f), A(0));
    w_.linear(be, ids_.up_proj, a.h2.view(n, d), a.up.view(n, f), A(0));
    if (cfg_.mlp_bias) {
      add_bias(be, ids_.gate_bias, a.gate.view(n, f));
      add_bias(be, ids_.up_bias, a.up.view(n, f));
    }
    lora_forward(be, projection::gate_proj, a.h2.view(n, d), a.gate.view(n, f));
    lora_forward(be, projection::up_proj, a.h2.view(n, d), a.up.view(n, f));
    be.swiglu_forward(a.gate.view(n, f), a.up.view(n, f), a.act.view(n, f));
  }

  /// Backprop of the chunk's rows given its activations.
  void backward_rows(B& be, const sequence_batch& seq, chunk_acts& a, matrix_view<const T> dy,
                     index_t c0, index_t c1, matrix_view<T> dx, layer_grad_mode mode) const {
    const index_t n = a.n, d = cfg_.hidden_size, qw = cfg_.q_width(), kvw = cfg_.kv_width();
    const index_t h = cfg_.num_attention_heads, f = cfg_.intermediate_size;
    const bool wg = mode.weight_grads;
    // dy rows of the chunk; dx2 starts as dy (residual)
    buffer dx2 = be.template allocate<T>(n * d);  // (n, d)
    gather_x(be, seq, c0, c1, dy, dx2.view(n, d));
    {
      // MLP: y = x2 + act Wd^T
      buffer dh2 = be.template allocate<T>(n * d);  // (n, d)
      {
        buffer dact = be.template allocate<T>(n * f);  // (n, f)
        w_.linear_input_grad(be, ids_.down_proj, dx2.view(n, d), dact.view(n, f), A(0));
        w_.linear_weight_grad(be, ids_.down_proj, dx2.view(n, d), a.act.view(n, f), wg);
        if (cfg_.mlp_bias && w_.wants(ids_.down_bias, wg))
          add_bias_grad(be, ids_.down_bias, dx2.view(n, d));
        lora_backward(be, projection::down_proj, a.act.view(n, f), dx2.view(n, d), dact.view(n, f),
                      wg);
        a.act.reset();
        buffer dgate = be.template allocate<T>(n * f);  // (n, f)
        buffer dup = be.template allocate<T>(n * f);    // (n, f)
        be.swiglu_backward(a.gate.view(n, f), a.up.view(n, f), dact.view(n, f), dgate.view(n, f),
                           dup.view(n, f));
        dact.reset();
        a.gate.reset();
        a.up.reset();
        w_.linear_input_grad(be, ids_.gate_proj, dgate.view(n, f), dh2.view(n, d), A(0));
        w_.linear_input_grad(be, ids_.up_proj, dup.view(n, f), dh2.view(n, d), A(1));
        w_.linear_weight_grad(be, ids_.gate_proj, dgate.view(n, f), a.h2.view(n, d), wg);
        w_.linear_weight_grad(be, ids_.up_proj, dup.view(n, f), a.h2.view(n, d), wg);
        if (cfg_.mlp_bias && w_.wants(ids_.gate_bias, wg))
          add_bias_grad(be, ids_.gate_bias, dgate.view(n, f));
        if (cfg_.mlp_bias && w_.wants(ids_.up_bias, wg))
          add_bias_grad(be, ids_.up_bias, dup.view(n, f));
        lora_backward(be, projection::gate_proj, a.h2.view(n, d), dgate.view(n, f), dh2.view(n, d),
                      wg);
        lora_backward(be, projection::up_proj, a.h2.view(n, d), dup.view(n, f), dh2.view(n, d), wg);
      }
      be.rmsnorm_backward(a.x2.view(n, d), w_.vec(ids_.post_norm), a.rstd2.span(), dh2.view(n, d),
                          dx2.view(n, d), w_.grad_vec(ids_.post_norm, wg));
    }
    a.h2.reset();
    a.x2.reset();
    // attention output projection: x2 = x + o Wo^T
    buffer dq = be.template allocate<T>(n * qw);  // (n, H*hd) w.r.t. rotated q
    {
      buffer dout = be.template allocate<T>(n * qw);  // (n, H*hd)
      w_.linear_input_grad(be, ids_.o_proj, dx2.view(n, d), dout.view(n, qw), A(0));
      w_.linear_weight_grad(be, ids_.o_proj, dx2.view(n, d), a.o.view(n, qw), wg);
      if (cfg_.o_bias && w_.wants(ids_.o_bias, wg)) add_bias_grad(be, ids_.o_bias, dx2.view(n, d));
      lora_backward(be, projection::o_proj, a.o.view(n, qw), dx2.view(n, d), dout.view(n, qw), wg);
      if (ring_) {  // over a sequence shard: attention and Q/K/V run in end_backward_shard
        scatter_x(be, seq, c0, c1, matrix_view<const T>(dout.view(n, qw)),
                  ring_->d_o.view(local_rows(seq), qw));
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
    // q: undo RoPE, then q-norm
    detail::unfinish_q(be, seq, cfg_, pos_, w_.vec(ids_.q_norm), w_.grad_vec(ids_.q_norm, wg),
                       a.q_raw, a.rstd_q, dq, c0, c1);
    a.q_raw.reset();
    auto h1 = a.h1.view(n, d);
    w_.linear_weight_grad(be, ids_.q_proj, dq.view(n, qw), h1, wg);
    if (cfg_.qkv_bias && w_.wants(ids_.q_bias, wg)) add_bias_grad(be, ids_.q_bias, dq.view(n, qw));
    // k, v rows of this chunk are complete now (later chunks were done first)
    auto [dk, dv] = kv_rows_backward(be, seq, c0, c1, h1, wg);
    // dh1 is needed for dx, or for the input norm's weight gradient
    const bool need_dh1 = mode.input_grad || w_.wants(ids_.input_norm, wg);
    if (!need_dh1) {  // the adapters' gradients only
      lora_backward(be, projection::q_proj, h1, dq.view(n, qw), {}, wg);
      kv_lora_backward(be, h1, dk.view(n, kvw), dv.view(n, kvw), {}, wg);
      return;
    }
    // dh1 = dq Wq + dk Wk + dv Wv; dx = dx2 + RMSNorm backward
    buffer dh1 = be.template allocate<T>(n * d);  // (n, d)
    w_.linear_input_grad(be, ids_.q_proj, dq.view(n, qw), dh1.view(n, d), A(0));
    lora_backward(be, projection::q_proj, h1, dq.view(n, qw), dh1.view(n, d), wg);
    kv_input_backward(be, h1, dk.view(n, kvw), dv.view(n, kvw), dh1.view(n, d), wg);
    be.rmsnorm_backward(a.xv, w_.vec(ids_.input_norm), a.rstd1.span(), dh1.view(n, d),
                        dx2.view(n, d), w_.grad_vec(ids_.input_norm, wg));
    if (mode.input_grad) scatter_x(be, seq, c0, c1, matrix_view<const T>(dx2.view(n, d)), dx);
  }

  /// dh1 (n, d) += dk Wk + dv Wv and the K/V adapters' part (dk, dv: (n, Hkv*hd)).
  void kv_input_backward(B& be, matrix_view<const T> h1, matrix_view<const T> dk,
                         matrix_view<const T> dv, matrix_view<T> dh1, bool wg) const {
    w_.linear_input_grad(be, ids_.k_proj, dk, dh1, A(1));
    w_.linear_input_grad(be, ids_.v_proj, dv, dh1, A(1));
    kv_lora_backward(be, h1, dk, dv, dh1, wg);
  }
  /// The K and V adapters' backward (dh1 may be empty: their gradients only).
  void kv_lora_backward(B& be, matrix_view<const T> h1, matrix_view<const T> dk,
                        matrix_view<const T> dv, matrix_view<T> dh1, bool wg) const {
    lora_backward(be, projection::k_proj, h1, dk, dh1, wg);
    lora_backward(be, projection::v_proj, h1, dv, dh1, wg);
  }

  /// dK, dV (n, Hkv*hd) w.r.t. the K/V projections' outputs for rows [c0, c1) (complete in
  /// kv_->dk / dv): RoPE and k-norm undone; with wg, the k/v weights' (and biases') gradients
  /// accumulated from h1 (n, d).
  std::pair<buffer, buffer> kv_rows_backward(B& be, const sequence_batch& seq, index_t c0,
                                             index_t c1, matrix_view<const T> h1, bool wg) const {
    const index_t n = h1.rows, kvw = cfg_.kv_width();
    auto [dk, dv] = detail::kv_grad_rows(be, seq, cfg_, pos_, *kv_, w_.vec(ids_.k_norm),
                                         w_.grad_vec(ids_.k_norm, wg), c0, c1, row_map{this});
    w_.linear_weight_grad(be, ids_.k_proj, dk.view(n, kvw), h1, wg);
    w_.linear_weight_grad(be, ids_.v_proj, dv.view(n, kvw), h1, wg);
    if (cfg_.qkv_bias) {
      if (w_.wants(ids_.k_bias, wg)) add_bias_grad(be, ids_.k_bias, dk.view(n, kvw));
      if (w_.wants(ids_.v_bias, wg)) add_bias_grad(be, ids_.v_bias, dv.view(n, kvw));
    }
    return {std::move(dk), std::move(dv)};
  }

  detail::layer_weights<B> w_;
  model_config cfg_;
  index_t index_;
  detail::layer_positions pos_;  // RoPE, window, document starts (per batch)
  decoder_layer_params ids_{};
  std::optional<kv_state> kv_;
  std::optional<chunk_acts> kept_acts_;
  std::optional<kv_state> kept_kv_;
  lora_binding<B> lora_{};               // adapters of the projections (none by default)
  std::optional<sequence_shard> shard_;  // set while running over a sequence shard
  index_t shard_chunk_ = 1;              // positions per chunk of that backward
  std::optional<ring_state> ring_;       // the own rows' attention over the K/V ring
};

}  // namespace tightfit
