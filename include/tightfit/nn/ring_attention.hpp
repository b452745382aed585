// tightfit/nn/ring_attention.hpp: the sequence-parallel extension of a StreamBP layer (the
// SequenceParallelLayer seam of nn/sequence_shard.hpp): forward_shard, begin_backward_shard and
// end_backward_shard run the layer's chunks over one rank's positions, attention over a K/V ring
// (Ring Attention, Liu et al. 2023, arXiv 2310.01889; docs/distributed.md). Every layer built on
// nn/streambp_layer.hpp gets it: this class is a base of that skeleton (CRTP: Layer is the
// skeleton), written against the skeleton's attention half (make_acts, project_q, project_kv,
// kv_rows_backward, kv_input_backward), so it holds nothing of any architecture.
//
// Over a shard, x, y, dy, dx hold the shard's rows only (B*Tl, d); positions, RoPE and masks are
// global. Per layer:
//  forward   the own queries attend to the ring's N blocks one at a time (attention_mask::k0,
//            merged by log-sum-exp, K and V shifted N - 1 times), then the rest of the layer
//            `chunk` positions at a time with the merged attention rows;
//  backward  the ring again for the attention output and lse; the skeleton's chunks, last to
//            first, stop at the attention output's gradient (kept here); end_backward_shard runs
//            the attention backward over the ring (dK/dV partials travel with their block and
//            are home after N shifts), the Q projections' backward of each round and the K/V
//            projections' of the own rows once their dK/dV are complete.
// Invariant: outside a shard call the extension is inactive (no shard, no ring state) and the
// skeleton's rows are the whole batch's (local_rows == B*T).
#pragma once

#include <algorithm>
#include <limits>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "tightfit/backend/concept.hpp"
#include "tightfit/core/error.hpp"
#include "tightfit/nn/detail/layer_parts.hpp"
#include "tightfit/nn/layer.hpp"
#include "tightfit/nn/lora_dropout.hpp"
#include "tightfit/nn/sequence_shard.hpp"

namespace tightfit {

/// The sequence-parallel extension (see the top comment); Layer is the skeleton deriving from it.
template <class Layer, TransformerBackend B>
class ring_attention {
 public:
  using T = storage_t<B>;
  using A = accum_t<B>;
  using buffer = buffer_t<B>;
  using stat_buffer = accum_buffer_t<B>;  ///< lse: accum_t

  /// y (B*Tl, d) = layer(x (B*Tl, d)) over the shard's positions: the own queries' attention
  /// over the ring's blocks, then the rest of the layer `chunk` positions at a time.
  void forward_shard(B& be, const sequence_batch& seq, const sequence_shard& shard,
                     matrix_view<const T> x, matrix_view<T> y, index_t chunk,
                     const kv_ring<T>& ring) {
    Layer& self = layer();
    check(chunk >= 1, Layer::layer_name(), "::forward_shard: chunk is ", chunk, ", expected >= 1");
    use_shard(seq, shard);
    self.check_rows("forward_shard", seq, x, y);
    self.pos_.prepare(seq);
    self.norms_.emplace(self.make_norms(be));
    ring_attention_forward(be, seq, x, chunk, ring);
    for_each_shard_chunk(chunk, false, [&](index_t c0, index_t c1) {
      auto a = self.make_acts(be, seq, x, c0, c1);
      self.forward_chunk(be, seq, a, typename Layer::kv_state{}, c0, c1);  // the ring's rows
      self.write_rows(be, seq, a, c0, c1, y);
    });
    ring_.reset();
    shard_.reset();
    self.norms_.reset();
  }

  /// Backward state over a shard: the own rows' attention output and lse over the ring.
  /// backward_chunk then takes global chunks inside the shard's blocks, last to first, and
  /// keeps each chunk's attention output gradient.
  void begin_backward_shard(B& be, const sequence_batch& seq, const sequence_shard& shard,
                            matrix_view<const T> x, index_t chunk, layer_grad_mode /*mode*/,
                            const kv_ring<T>& ring) {
    Layer& self = layer();
    use_shard(seq, shard);
    check_extent((std::string(Layer::layer_name()) + "::begin_backward_shard").c_str(), "x.rows",
                 x.rows, local_rows(seq));
    self.pos_.prepare(seq);
    self.kept_acts_.reset();
    self.kept_kv_.reset();
    self.norms_.emplace(self.make_norms(be));
    shard_chunk_ = std::max<index_t>(1, chunk);
    ring_attention_forward(be, seq, x, shard_chunk_, ring);
    ring_->d_o = be.template allocate<T>(local_rows(seq) * self.cfg_.q_width());  // (B*Tl, H*hd)
    self.kv_.emplace();  // no K/V of its own: backward_chunk reads the ring's rows
  }

  /// After the shard's chunks: the attention backward over the ring (K/V and the dK/dV
  /// partials of each block travel together; the last shift brings every rank its own rows'
  /// sums), the Q projections' backward of every round and the K/V projections' of the own
  /// rows into dx (B*Tl, d) and the weights' gradients; frees the state.
  void end_backward_shard(B& be, const sequence_batch& seq, matrix_view<const T> x,
                          matrix_view<T> dx, layer_grad_mode mode, const kv_ring<T>& ring) {
    Layer& self = layer();
    const model_config& cfg = self.cfg_;
    check(self.kv_.has_value() && shard_.has_value() && ring_.has_value(), Layer::layer_name(),
          "::end_backward_shard: begin_backward_shard was not called");
    if (mode.input_grad) self.check_rows("end_backward_shard", seq, x, dx);
    const index_t d = cfg.hidden_size, kvw = cfg.kv_width(), qw = cfg.q_width();
    const index_t h = cfg.num_attention_heads, rows = local_rows(seq);
    const index_t travel = seq.batch * ring.max_local;
    kv_state kv = ring_kv(be, seq, x, travel);
    kv.dk = be.template allocate<T>(travel * kvw);  // (B*max_local, Hkv*hd) partials of a block
    kv.dv = be.template allocate<T>(travel * kvw);  // (B*max_local, Hkv*hd)
    const int n_ranks = ring.size();
    const attention_shape shape{h, cfg.num_key_value_heads, cfg.head_dim};
    const auto scale = static_cast<A>(cfg.attention_scale());
    for (int round = 0; round < n_ranks; ++round) {
      const sequence_shard& held = ring.held(round);
      for_each_shard_chunk(shard_chunk_, true, [&](index_t c0, index_t c1) {
        if (held.blocks.front().p0 >= c1) return;  // causal: the block is after the chunk
        auto a = self.make_acts(be, seq, x, c0, c1);
        self.project_q(be, seq, a, c0, c1);
        const index_t n = a.n, c = c1 - c0, l0 = local_start(c0, c1), tl = shard_->local_len();
        buffer dq = be.template allocate<T>(n * qw);  // (n, H*hd) this block's part
        for_each_block_piece(
            seq, held, kv, travel, c1,
            [&](index_t b, index_t p0, auto keys, auto vals, index_t k_r0, index_t k_r1) {
              const index_t o0 = b * tl + l0;
              attention_mask m = self.pos_.mask_of(seq, b, c0);
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
    if (cfg.qk_norm) {  // the k-norm state of the own rows, recomputed
      kv_state own(be, cfg, rows);
      for_each_shard_chunk(shard_chunk_, false, [&](index_t c0, index_t c1) {
        auto a = self.make_acts(be, seq, x, c0, c1);
        self.project_kv(be, seq, a, c0, c1, own);
      });
      kv.k_raw = std::move(own.k_raw);
      kv.rstd_k = std::move(own.rstd_k);
    }
    self.kv_ = std::move(kv);  // the own rows' complete dK/dV and k-norm state
    if (mode.weight_grads || mode.input_grad)
      for_each_shard_chunk(shard_chunk_, true, [&](index_t c0, index_t c1) {
        auto a = self.make_acts(be, seq, x, c0, c1);
        const index_t n = a.n;
        auto [dk, dv] = self.kv_rows_backward(be, seq, c0, c1, a.h1.view(n, d), mode.weight_grads);
        buffer dh1 = be.template allocate<T>(n * d);  // (n, d)
        self.kv_input_backward(be, a.h1.view(n, d), Layer::rows_of(a), dk.view(n, kvw),
                               dv.view(n, kvw), dh1.view(n, d), mode.weight_grads);
        input_norm_backward(be, seq, a, dh1.view(n, d), c0, c1, dx, mode);
      });
    self.end_backward(be);
  }

 protected:
  using kv_state = detail::kv_rows<B>;

  /// The own rows' attention over a sequence shard's K/V ring (forward_shard, the backward).
  struct ring_state {
    buffer o;         // (B*Tl, H*hd) attention output, merged over the ring's blocks
    stat_buffer lse;  // (B*Tl, H)
    buffer d_o;       // (B*Tl, H*hd) its gradient (backward_chunk, then end_backward_shard)
  };

  // What the skeleton asks of the extension: where the rows are, and the ring's attention rows.

  /// Rows of x, y, dy, dx: B*T, or B*Tl over a shard.
  index_t local_rows(const sequence_batch& seq) const {
    return shard_ ? seq.batch * shard_->local_len() : seq.rows();
  }
  /// Whether positions [c0, c1) are all of x's rows (no gather needed).
  bool whole_rows(const sequence_batch& seq, index_t c0, index_t c1) const {
    return c1 - c0 == (shard_ ? shard_->local_len() : seq.seq_len);
  }
  /// gather_rows / scatter_rows for x, y, dy, dx: (B*T) rows, or the shard's (B*Tl) rows
  /// (then [c0, c1) must lie inside one of its blocks). U: T, or A for the statistics.
  template <class U = T>
  void gather_x(B& be, const sequence_batch& seq, index_t c0, index_t c1,
                std::type_identity_t<matrix_view<const U>> src, matrix_view<U> dst) const {
    if (!shard_) return gather_rows<B, U>(be, seq, c0, c1, src, dst);
    const index_t l0 = local_start(c0, c1), c = c1 - c0, tl = shard_->local_len();
    for (index_t b = 0; b < seq.batch; ++b)
      be.copy(src.row_range(b * tl + l0, b * tl + l0 + c), dst.row_range(b * c, (b + 1) * c));
  }
  template <class U = T>
  void scatter_x(B& be, const sequence_batch& seq, index_t c0, index_t c1,
                 std::type_identity_t<matrix_view<const U>> src, matrix_view<U> dst) const {
    if (!shard_) return scatter_rows<B, U>(be, seq, c0, c1, src, dst);
    const index_t l0 = local_start(c0, c1), c = c1 - c0, tl = shard_->local_len();
    for (index_t b = 0; b < seq.batch; ++b)
      be.copy(src.row_range(b * c, (b + 1) * c), dst.row_range(b * tl + l0, b * tl + l0 + c));
  }
  /// The rows of x, y, dy, dx and the K/V buffers as detail::store_kv / kv_grad_rows place
  /// them: all B*T rows, or the shard's own B*Tl.
  struct row_map {
    const ring_attention* ext;
    index_t rows(const sequence_batch& seq) const { return ext->local_rows(seq); }
    template <class U>
    void gather(B& be, const sequence_batch& seq, index_t c0, index_t c1,
                std::type_identity_t<matrix_view<const U>> src, matrix_view<U> dst) const {
      ext->template gather_x<U>(be, seq, c0, c1, src, dst);
    }
    template <class U>
    void scatter(B& be, const sequence_batch& seq, index_t c0, index_t c1,
                 std::type_identity_t<matrix_view<const U>> src, matrix_view<U> dst) const {
      ext->template scatter_x<U>(be, seq, c0, c1, src, dst);
    }
  };
  row_map rows_map() const { return row_map{this}; }

  /// Whether the attention rows come from the ring (inside forward_shard and a shard backward).
  bool ring_active() const { return ring_.has_value(); }
  /// o (n, H*hd) and lse (n, H) of the chunk's rows: the ring's merged rows.
  void ring_rows(B& be, const sequence_batch& seq, index_t c0, index_t c1, matrix_view<T> o,
                 matrix_view<A> lse) const {
    const index_t qw = layer().cfg_.q_width(), h = layer().cfg_.num_attention_heads;
    gather_x(be, seq, c0, c1, matrix_view<const T>(ring_->o.view(local_rows(seq), qw)), o);
    gather_x<A>(be, seq, c0, c1, matrix_view<const A>(ring_->lse.view(local_rows(seq), h)), lse);
  }
  /// Keeps the chunk's attention output gradient dout (n, H*hd) for end_backward_shard.
  void keep_attention_grad(B& be, const sequence_batch& seq, index_t c0, index_t c1,
                           matrix_view<const T> dout) {
    scatter_x(be, seq, c0, c1, dout, ring_->d_o.view(local_rows(seq), layer().cfg_.q_width()));
  }
  /// Drops the shard and ring state (end_backward).
  void end_shard() {
    ring_.reset();
    shard_.reset();
  }

 private:
  Layer& layer() { return static_cast<Layer&>(*this); }
  const Layer& layer() const { return static_cast<const Layer&>(*this); }

  void use_shard(const sequence_batch& seq, const sequence_shard& shard) {
    check(shard.seq_len == seq.seq_len && !shard.blocks.empty(), Layer::layer_name(),
          ": the sequence shard covers T = ", shard.seq_len, " with ", shard.blocks.size(),
          " blocks, the batch has T = ", seq.seq_len);
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

  /// The local position of global chunk [c0, c1), which must lie inside one shard block.
  index_t local_start(index_t c0, index_t c1) const {
    const auto* k = shard_->find(c0);
    check(k != nullptr && c1 <= k->p1, Layer::layer_name(), ": chunk [", c0, ", ", c1,
          ") is not inside one block of this rank's sequence shard");
    return k->local0 + (c0 - k->p0);
  }

  /// K/V of the own rows in the ring's block layout: k, v (B*max_local, Hkv*hd) whose first
  /// B*Tl rows are the own rows (local layout). No k-norm state (k_raw, rstd_k): the K/V
  /// projections' backward recomputes it after the ring (project_kv into the own rows).
  kv_state ring_kv(B& be, const sequence_batch& seq, matrix_view<const T> x, index_t travel) {
    Layer& self = layer();
    kv_state kv;
    kv.k = be.template allocate<T>(travel * self.cfg_.kv_width());
    kv.v = be.template allocate<T>(travel * self.cfg_.kv_width());
    for_each_shard_chunk(shard_chunk_, false, [&](index_t c0, index_t c1) {
      auto a = self.make_acts(be, seq, x, c0, c1);
      self.project_kv(be, seq, a, c0, c1, kv);
    });
    return kv;
  }

  /// f(b, p0, keys, values, r0, r1) for every piece of the held block that queries before c1
  /// may see: sequence b's positions [p0, p1) of one of its blocks (p1 clipped to c1), rows
  /// [r0, r1) of the travelling buffers (B*max_local rows).
  template <class F>
  void for_each_block_piece(const sequence_batch& seq, const sequence_shard& held,
                            const kv_state& kv, index_t travel, index_t c1, F&& f) const {
    const index_t kvw = layer().cfg_.kv_width(), tl = held.local_len();
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
    Layer& self = layer();
    const model_config& cfg = self.cfg_;
    check(ring.size() >= 1 && ring.rank >= 0 && ring.rank < ring.size() &&
              ring.max_local >= shard_->local_len(),
          Layer::layer_name(), ": the K/V ring has ", ring.size(), " shards, rank ", ring.rank,
          ", max_local ", ring.max_local, " for a shard of ", shard_->local_len(), " positions");
    const index_t qw = cfg.q_width(), h = cfg.num_attention_heads, hd = cfg.head_dim;
    const index_t rows = local_rows(seq), travel = seq.batch * ring.max_local;
    const index_t tl = shard_->local_len();
    shard_chunk_ = std::max<index_t>(1, chunk);
    ring_.emplace();
    ring_->o = be.template allocate<T>(rows * qw);   // (B*Tl, H*hd)
    ring_->lse = be.template allocate<A>(rows * h);  // (B*Tl, H)
    be.fill(ring_->o.view(rows, qw), A(0));
    be.fill(ring_->lse.view(rows, h), -std::numeric_limits<A>::infinity());
    kv_state kv = ring_kv(be, seq, x, travel);
    const attention_shape shape{h, cfg.num_key_value_heads, hd};
    const auto scale = static_cast<A>(cfg.attention_scale());
    for (int round = 0; round < ring.size(); ++round) {
      const sequence_shard& held = ring.held(round);
      for_each_shard_chunk(shard_chunk_, false, [&](index_t c0, index_t c1) {
        if (held.blocks.front().p0 >= c1) return;
        auto a = self.make_acts(be, seq, x, c0, c1);
        self.project_q(be, seq, a, c0, c1);
        const index_t n = a.n, c = c1 - c0, l0 = local_start(c0, c1);
        buffer ob = be.template allocate<T>(c * qw);      // (c, H*hd) one piece's output
        stat_buffer lb = be.template allocate<A>(c * h);  // (c, H)
        for_each_block_piece(
            seq, held, kv, travel, c1,
            [&](index_t b, index_t p0, auto keys, auto vals, index_t, index_t) {
              attention_mask m = self.pos_.mask_of(seq, b, c0);
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
  template <class Acts>
  void query_backward(B& be, const sequence_batch& seq, Acts& a, buffer dq, index_t c0, index_t c1,
                      matrix_view<T> dx, layer_grad_mode mode) {
    Layer& self = layer();
    const index_t n = a.n, d = self.cfg_.hidden_size;
    const bool wg = mode.weight_grads;
    self.unfinish_q(be, seq, a, dq, c0, c1, wg);
    auto h1 = a.h1.view(n, d);
    const lora_rows rows = Layer::rows_of(a);
    if (!self.q_weight_backward(be, h1, rows, dq, mode)) return;  // the adapters' gradients only
    buffer dh1 = be.template allocate<T>(n * d);                  // (n, d)
    self.q_input_backward(be, h1, rows, dq, dh1.view(n, d), wg);
    input_norm_backward(be, seq, a, dh1.view(n, d), c0, c1, dx, mode);
  }

  /// dx rows of the chunk += the input norm's backward of dh1 (n, d), and its weight's gradient.
  template <class Acts>
  void input_norm_backward(B& be, const sequence_batch& seq, const Acts& a, matrix_view<T> dh1,
                           index_t c0, index_t c1, matrix_view<T> dx, layer_grad_mode mode) {
    Layer& self = layer();
    const index_t n = a.n, d = self.cfg_.hidden_size;
    buffer dxc = be.template allocate<T>(n * d);  // (n, d) this chunk's dx rows
    if (mode.input_grad) gather_x(be, seq, c0, c1, matrix_view<const T>(dx), dxc.view(n, d));
    self.input_norm_grad(be, a, matrix_view<const T>(dh1), dxc.view(n, d), mode.weight_grads);
    if (mode.input_grad) scatter_x(be, seq, c0, c1, matrix_view<const T>(dxc.view(n, d)), dx);
  }

  std::optional<sequence_shard> shard_;  // set while running over a sequence shard
  index_t shard_chunk_ = 1;              // positions per chunk of that backward
  std::optional<ring_state> ring_;       // the own rows' attention over the K/V ring
};

}  // namespace tightfit
