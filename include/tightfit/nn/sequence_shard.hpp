// tightfit/nn/sequence_shard.hpp: the positions of a batch's sequences that one rank owns under
// sequence parallelism (distributed/sequence_parallel.hpp, docs/distributed.md), and the optional
// SequenceParallelLayer seam a layer offers to run on them.
//
// A shard is a list of disjoint, increasing blocks [p0, p1) of the T global positions. A rank's
// activations hold only its own rows, (B*Tl, d) row-major with Tl = local_len(): the row of
// sequence b, local position i is b*Tl + i, and local positions are the blocks' positions
// concatenated in order. Two assignments over N ranks (the zig-zag one is the load balancing
// of the Llama 3 report's context parallelism, Dubey et al. 2024, arXiv 2407.21783):
//  - contiguous: rank r owns [r T / N, (r + 1) T / N);
//  - zigzag: T is cut into 2N blocks and rank r owns blocks r and 2N - 1 - r, which evens out
//    the causal attention work (an early block has few keys, a late block many).
// Invariant: the shards of ranks 0..N-1 partition [0, T), every shard non-empty.
//
// SequenceParallelLayer: a Layer that runs its forward and backward over a shard's rows. It
// never talks to the other ranks itself: the driver hands it a kv_ring, every rank's shard and
// a callback that shifts a buffer one rank along the ring. No rank holds the whole sequence's
// K/V: a layer holds its own K/V block (keys after RoPE) plus the one the ring brings, N
// rounds, and the dK/dV partials of a block travel with it back to their owner. Positions,
// RoPE and masks are global (the sequence_batch is the whole batch's).
#pragma once

#include <algorithm>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "tightfit/backend/concept.hpp"
#include "tightfit/core/error.hpp"
#include "tightfit/nn/layer.hpp"

namespace tightfit {

enum class sequence_assignment { contiguous, zigzag };

inline const char* to_string(sequence_assignment a) {
  return a == sequence_assignment::contiguous ? "contiguous" : "zigzag";
}

/// "contiguous" or "zigzag"; anything else is an error naming it.
inline sequence_assignment parse_sequence_assignment(const std::string& s) {
  if (s == "contiguous") return sequence_assignment::contiguous;
  if (s == "zigzag") return sequence_assignment::zigzag;
  fail("unknown sequence assignment '", s, "', expected contiguous or zigzag");
}

/// The global positions one rank owns (see the top comment).
struct sequence_shard {
  struct block {
    index_t p0 = 0, p1 = 0;  ///< global positions [p0, p1)
    index_t local0 = 0;      ///< local position of p0
  };
  index_t seq_len = 0;  ///< T (global)
  std::vector<block> blocks;

  /// Tl: positions this rank owns.
  index_t local_len() const {
    return blocks.empty() ? 0 : blocks.back().local0 + size(blocks.back());
  }
  static index_t size(const block& b) { return b.p1 - b.p0; }
  /// The block holding global position p, or nullptr.
  const block* find(index_t p) const {
    for (const auto& b : blocks)
      if (p >= b.p0 && p < b.p1) return &b;
    return nullptr;
  }
  /// Local position of global position p (p must be owned).
  index_t local_of(index_t p) const {
    const block* b = find(p);
    check(b != nullptr, "sequence_shard: position ", p, " is not owned by this shard");
    return b->local0 + (p - b->p0);
  }
  /// Global position of local position i.
  index_t global_of(index_t i) const {
    for (const auto& b : blocks)
      if (i < b.local0 + size(b)) return b.p0 + (i - b.local0);
    fail("sequence_shard: local position ", i, " is outside [0, ", local_len(), ")");
  }
  /// The shard covering the whole sequence (one process).
  static sequence_shard whole(index_t t) { return {t, {{0, t, 0}}}; }
};

/// The shard of `rank` of `ranks` over T positions; every rank must get at least one position
/// (contiguous: T >= N; zigzag: T >= 2N), otherwise an error naming T and N.
inline sequence_shard make_sequence_shard(index_t t, int ranks, int rank, sequence_assignment a) {
  check(ranks >= 1 && rank >= 0 && rank < ranks, "make_sequence_shard: rank ", rank, " of ", ranks);
  const index_t n = ranks, r = rank;
  const index_t parts = a == sequence_assignment::contiguous ? n : 2 * n;
  check(t >= parts, "sequence parallel: T is ", t, " positions, too few for ", n,
        " ranks with the ", to_string(a), " assignment (needs at least ", parts, ")");
  auto start = [&](index_t k) { return k * t / parts; };
  sequence_shard s;
  s.seq_len = t;
  auto add = [&](index_t k) {
    const index_t local0 = s.local_len();
    s.blocks.push_back({start(k), start(k + 1), local0});
  };
  if (a == sequence_assignment::contiguous) {
    add(r);
  } else {
    add(r);
    add(2 * n - 1 - r);
  }
  return s;
}

/// Copies the shard's rows of every sequence of src (B*T, w) into dst (B*Tl, w).
template <DenseBackend B>
void gather_shard_rows(B& be, index_t batch, const sequence_shard& s,
                       matrix_view<const storage_t<B>> src, matrix_view<storage_t<B>> dst) {
  const index_t t = s.seq_len, tl = s.local_len();
  for (index_t b = 0; b < batch; ++b)
    for (const auto& k : s.blocks)
      be.copy(src.row_range(b * t + k.p0, b * t + k.p1),
              dst.row_range(b * tl + k.local0, b * tl + k.local0 + sequence_shard::size(k)));
}

/// The K/V ring the driver hands a layer (see the top comment). A block of owner o is the
/// (B*Tl_o, w) rows of o's positions in o's local layout, in a buffer of B * max_local rows
/// (every rank's buffers have one size). shift(buf): buf <- rank - 1's buf, in place (each rank
/// sends its buf to rank + 1 at the same time), so after `round` shifts a rank holds the block
/// of owner (rank - round) mod N.
template <class T>
struct kv_ring {
  int rank = 0;
  std::vector<sequence_shard> shards;  ///< every rank's shard, in rank order
  index_t max_local = 0;               ///< the largest Tl
  std::function<void(std::span<T>)> shift;

  int size() const { return static_cast<int>(shards.size()); }
  /// The shard whose block a rank holds after `round` shifts.
  const sequence_shard& held(int round) const {
    const int n = size();
    return shards[static_cast<std::size_t>(((rank - round) % n + n) % n)];
  }
};

/// A Layer that runs over a sequence shard (see the top comment):
///  - forward_shard(be, seq, shard, x, y, chunk, ring): y (B*Tl, d) = layer(x (B*Tl, d)): the
///    own queries' attention over the ring's N blocks (log-sum-exp merged), then the rest of
///    the layer `chunk` positions at a time.
///  - begin_backward_shard(be, seq, shard, x, chunk, mode, ring): the attention output and lse
///    of the own rows again over the ring.
///  - backward_chunk(be, seq, x, dy, c0, c1, dx, mode) with global [c0, c1) inside one of the
///    shard's blocks, last to first: as Layer's down to the attention output's gradient, which
///    it keeps (attention and the Q/K/V projections need every block).
///  - end_backward_shard(be, seq, x, dx, mode, ring): the attention backward over the ring (K/V
///    and their dK/dV partials travel together; after the last shift each rank holds its own
///    rows' complete dK/dV), the Q/K/V projections' backward into dx and the weights'
///    gradients, and frees the state.
template <class L, class B>
concept SequenceParallelLayer = Layer<L, B> &&
    requires(L& layer, B& be, const sequence_batch& seq, const sequence_shard& shard,
             matrix_view<const storage_t<B>> x, matrix_view<storage_t<B>> y, index_t n,
             layer_grad_mode mode, const kv_ring<storage_t<B>>& ring) {
  layer.forward_shard(be, seq, shard, x, y, n, ring);
  layer.begin_backward_shard(be, seq, shard, x, n, mode, ring);
  layer.end_backward_shard(be, seq, x, y, mode, ring);
};

}  // namespace tightfit
