// tightfit/distributed/sequence_parallel.hpp: sequence-parallel StreamBP. The T positions of every
// sequence of one batch are split over the N ranks of a Communicator (nn/sequence_shard.hpp:
// contiguous blocks or zig-zag pairs of blocks); each rank keeps only its own positions' layer
// inputs, runs the LM head and the objective on its own rows, and the ranks together compute
// the gradient one process computes on the whole batch (docs/distributed.md).
//
// Per layer (a SequenceParallelLayer), over a K/V ring (Ring Attention, Liu et al. 2023,
// arXiv 2310.01889): no rank holds the whole sequence's K/V or dK/dV. Every rank holds its
// own K/V block plus the one passing through; N rounds, each attending the own queries to the
// held block (attention_mask::k0) and merging by log-sum-exp, then every rank sends its block
// to rank + 1 and receives rank - 1's (Communicator::ring_shift).
//  forward   the ring (N - 1 shifts of K and of V), then the rest of the layer `chunk`
//            positions at a time;
//  backward  the ring again for the attention output and lse, the own chunks last to first
//            down to the attention output's gradient (kept), then the attention backward over
//            the ring: K, V and the block's dK/dV partials travel together and the last shift
//            brings each rank its own rows' sums; the Q projections' backward of each round
//            and the K/V projections' of the own rows go into dx and the weights'
//            gradients; the layer's parameter gradients are all-reduced once,
//            in place and without blocking, while the next layer runs (once per group: the
//            head, each layer, the embedding; one message per parameter).
// RoPE, masks and padding use the global positions. The objective is the one a single process
// would run on the whole batch (its advantages, old/reference log-probs and pairs are global):
// an adapter gives it the global layout in begin() (so its normalisers are the global ones),
// maps the rank's rows to global rows in coefficients(), all-gathers the token log-probs of a
// two-pass objective's statistics pass (one all-reduce of B*T doubles) so that its
// per-sequence sums are complete on every rank, and sums the loss over the ranks.
//
// Exactness: in double, the gradients equal compute_gradients' on the whole batch to rounding
// (tested to 1e-12 relative, SFT, GRPO, DPO, T not divisible by N, right padding, sliding
// windows). Memory per rank: the layer inputs and dy of Tl = T/N positions, the attention
// output, its gradient and lse of the own rows, and two K/V blocks (four with dK/dV) plus one
// staging block: all O(T/N).
// Parameter gradients ACCUMULATE, and the all-reduce sums whole gradient buffers: zero them
// before the call (as data_parallel_gradients).
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "tightfit/core/error.hpp"
#include "tightfit/core/memory.hpp"
#include "tightfit/distributed/agreement.hpp"
#include "tightfit/distributed/communicator.hpp"
#include "tightfit/distributed/data_parallel.hpp"
#include "tightfit/loss/objective.hpp"
#include "tightfit/nn/sequence_shard.hpp"
#include "tightfit/stream/backward.hpp"
#include "tightfit/stream/head.hpp"

namespace tightfit {

struct sequence_parallel_options {
  sequence_assignment assignment = sequence_assignment::zigzag;
};

/// What one sequence_parallel_gradients call did on this rank.
struct sequence_parallel_stats {
  index_t local_positions = 0;  ///< Tl: positions this rank owns
  /// Ring shifts of K, V, dK, dV blocks: per layer 2 (N - 1) in the forward, 2 (N - 1) for
  /// the backward's attention output, 2 (N - 1) + 2 N with the dK/dV partials (none for N = 1).
  std::int64_t kv_shifts = 0;
  std::int64_t gradient_groups = 0;    ///< gradient groups reduced (L + 2 at most)
  std::int64_t gradient_messages = 0;  ///< their all-reduces: one per parameter, in place
  std::int64_t other_messages = 0;     ///< agreement, log-probs (two-pass), loss
  std::int64_t bytes = 0;              ///< payload bytes this rank handed to the transport
  double attention_flops = 0;          ///< this rank's attention work (backend counter)
};

namespace detail {

/// The objective of the whole batch, run on a rank's rows (see the top comment).
template <Objective O, Communicator C>
class shard_objective {
 public:
  shard_objective(O& inner, C& comm, const token_layout& global, const sequence_shard& shard)
      : inner_(inner), comm_(comm), global_(global), shard_(shard) {}

  bool statistics_pass() const { return inner_.statistics_pass(); }
  void begin(const token_layout&) {
    inner_.begin(global_);
    if (statistics_pass()) lp_.assign(static_cast<std::size_t>(global_.rows()), 0.0);
  }
  void statistics(const token_layout&, index_t r0, std::span<const double> lp) {
    for (std::size_t i = 0; i < lp.size(); ++i)
      lp_[static_cast<std::size_t>(global_row(r0 + static_cast<index_t>(i)))] = lp[i];
  }
  void end_statistics(const token_layout&) {
    comm_.all_reduce_sum(std::span<double>(lp_)).wait();  // every rank: every row's lp
    inner_.statistics(global_, 0, std::span<const double>(lp_));
    inner_.end_statistics(global_);
  }
  double coefficients(const token_layout&, index_t r0, std::span<const double> lp,
                      std::span<double> coeff) const {
    const index_t tl = shard_.local_len(), n = static_cast<index_t>(lp.size());
    double part = 0;
    for (index_t i = 0; i < n;) {
      // the longest run of local rows that are consecutive global rows
      const index_t r = r0 + i, li = r % tl;
      const auto& k = block_at(li);
      const index_t len = std::min(n - i, k.local0 + sequence_shard::size(k) - li);
      const auto at = static_cast<std::size_t>(i), count = static_cast<std::size_t>(len);
      part += inner_.coefficients(global_, global_row(r), lp.subspan(at, count),
                                  coeff.subspan(at, count));
      i += len;
    }
    return part;
  }
  double finish(double sum) const {
    comm_.all_reduce_sum(std::span<double>(&sum, 1)).wait();
    return inner_.finish(sum);
  }

 private:
  const sequence_shard::block& block_at(index_t li) const {
    for (const auto& k : shard_.blocks)
      if (li < k.local0 + sequence_shard::size(k)) return k;
    fail("sequence parallel: local position ", li, " outside the shard");
  }
  index_t global_row(index_t r) const {
    const index_t tl = shard_.local_len();
    return (r / tl) * shard_.seq_len + shard_.global_of(r % tl);
  }

  O& inner_;
  C& comm_;
  token_layout global_;
  const sequence_shard& shard_;
  std::vector<double> lp_;  // (B*T) token log-probs of the statistics pass, all ranks'
};

}  // namespace detail

namespace detail {

/// sequence_parallel_gradients' pass of the gradient driver (stream/backward.hpp's
/// run_backward): this rank's rows of the shard, the layers' sequence-parallel entry points over
/// the K/V ring, the objective of the whole batch on the rank's rows, and each gradient group
/// all-reduced without blocking once final, while the next layer runs: each parameter's gradient
/// buffer in place (no staging copy: the head's and the embedding's would each add a (V, d)
/// buffer to a rank's peak), all of a group's messages issued together. A group is completed
/// (waited, the caller's on_grads_ready) at the next group's event or at finish(), as in
/// step_gradients.
template <DecoderModel M, Objective O, Communicator C>
struct shard_pass {
  using B = typename M::backend_type;
  using T = storage_t<B>;
  using request_t = decltype(std::declval<C&>().all_reduce_sum(std::span<T>()));
  struct pending {
    grads_ready event;
    std::vector<request_t> requests;
  };

  M& model;
  O& objective;
  C& comm;
  const backward_options& opt;
  const sequence_shard& mine;
  const kv_ring<T>& ring;
  std::span<const token_id> ids_local;  // (B*Tl)
  token_layout global_layout;           // the whole batch's (the objective's)
  token_layout local_layout;            // this rank's rows
  index_t local_rows = 0;               // B*Tl
  index_t chunk = 1;                    // positions per chunk
  index_t head_chunk = chunk;
  sequence_parallel_stats& st;
  std::deque<pending> in_flight{};

  index_t rows() const { return local_rows; }
  std::span<const token_id> input_ids() const { return ids_local; }
  template <class L>
  void forward(L& layer, const sequence_batch& seq, matrix_view<const T> x, matrix_view<T> y,
               index_t /*chunk*/, bool /*keep*/) {
    layer.forward_shard(model.backend(), seq, mine, x, y, chunk, ring);
  }
  template <class L>
  void backward(L& layer, const sequence_batch& seq, matrix_view<const T> x,
                matrix_view<const T> dy, matrix_view<T> dx, index_t /*chunk*/,
                layer_grad_mode mode) {
    B& be = model.backend();
    layer.begin_backward_shard(be, seq, mine, x, chunk, mode, ring);
    std::vector<std::pair<index_t, index_t>> chunks;
    for (const auto& k : mine.blocks)
      for (index_t c0 = k.p0; c0 < k.p1; c0 += chunk)
        chunks.emplace_back(c0, std::min(k.p1, c0 + chunk));
    for (auto it = chunks.rbegin(); it != chunks.rend(); ++it)  // last chunk first
      layer.backward_chunk(be, seq, x, dy, it->first, it->second, dx, mode);
    layer.end_backward_shard(be, seq, x, dx, mode, ring);
  }
  double head(matrix_view<const T> hidden, const head_options& hopt, matrix_view<T> dhidden,
              bool weight_grads, double* statistics_seconds) {
    shard_objective<O, C> local_objective(objective, comm, global_layout, mine);
    return lm_head_backward(model, hidden, local_layout, local_objective, hopt, dhidden,
                            weight_grads, statistics_seconds);
  }
  void grads_ready(const tightfit::grads_ready& e) {
    auto& params = model.parameters();
    std::vector<std::size_t> ids;
    if (e.what == grads_ready::kind::head) {
      for (std::size_t id : model.head_param_ids())
        if (!(opt.embedding_grad && id == model.embed_id())) ids.push_back(id);  // tied
    } else if (e.what == grads_ready::kind::layer) {
      ids = model.layer_param_ids(e.layer);
    } else {
      ids.push_back(model.embed_id());
    }
    pending p{e, {}};
    for (std::size_t id : ids)
      if (params.has_grad(id)) {
        p.requests.push_back(comm.all_reduce_sum(params.grad(id)));
        ++st.gradient_messages;
      }
    ++st.gradient_groups;
    finish();
    in_flight.push_back(std::move(p));
  }
  /// Completes every group in flight (waits, then the caller's on_grads_ready).
  void finish() {
    while (!in_flight.empty()) {
      for (auto& r : in_flight.front().requests) r.wait();
      if (opt.on_grads_ready) opt.on_grads_ready(in_flight.front().event);
      in_flight.pop_front();
    }
  }
};

}  // namespace detail

/// Loss and parameter gradients of `model` on the whole `batch` (every rank passes the same
/// batch and the same objective, built for the whole batch), this rank computing its shard of
/// the positions (see the top comment). Schedules: stream (chunks of opt.chunk positions) and
/// checkpoint (one chunk per block); keep_every 1, no offload. The gradient driver is
/// compute_gradients' (stream/backward.hpp's run_backward) with the shard's pass.
template <DecoderModel M, Objective O, Communicator C>
requires SequenceParallelLayer<typename M::layer_type, typename M::backend_type> backward_result
sequence_parallel_gradients(M& model, const token_batch& batch, O& objective,
                            const backward_options& opt, C& comm,
                            const sequence_parallel_options& sp = {},
                            sequence_parallel_stats* stats = nullptr) {
  using B = typename M::backend_type;
  using T = storage_t<B>;
  B& be = model.backend();
  const model_config& cfg = model.config();
  const index_t nl = cfg.num_hidden_layers;
  sequence_parallel_stats local_stats;
  sequence_parallel_stats& st = stats ? *stats : local_stats;
  st = sequence_parallel_stats{};
  const comm_stats comm_before = comm.stats();
  const double flops_before = be.stats().attention_flops;

  detail::validate_batch(model, batch);
  check(opt.chunk >= 1, "sequence_parallel_gradients: chunk is ", opt.chunk, ", expected >= 1");
  check(opt.sched != backward_schedule::full,
        "sequence_parallel_gradients: the full schedule keeps every activation; use stream or "
        "checkpoint");
  check(opt.keep_every == 1 && !opt.offload_layer_inputs,
        "sequence_parallel_gradients: keep_every is ", opt.keep_every, " and offload is ",
        opt.offload_layer_inputs, ", expected 1 and off (not supported over a sequence shard)");
  check(!opt.lazy_layer_grads, "sequence_parallel_gradients: lazy_layer_grads is not supported");
  check(opt.layer_weight_grads.empty() || static_cast<index_t>(opt.layer_weight_grads.size()) == nl,
        "sequence_parallel_gradients: layer_weight_grads has ", opt.layer_weight_grads.size(),
        " entries, expected ", nl, " (one per layer) or none");
  const index_t t = batch.seq_len, nb = batch.batch;
  const int ranks = comm.size();
  check_agreement(comm,
                  detail::data_parallel_description(model, opt) + "; sequence parallel B" +
                      std::to_string(nb) + " T" + std::to_string(t) + " " +
                      to_string(sp.assignment) + " chunk " + std::to_string(opt.chunk) + " sched " +
                      to_string(opt.sched),
                  "model, batch shape and options");
  std::vector<sequence_shard> shards;
  for (int r = 0; r < ranks; ++r) shards.push_back(make_sequence_shard(t, ranks, r, sp.assignment));
  const sequence_shard& mine = shards[static_cast<std::size_t>(comm.rank())];
  const index_t tl = mine.local_len(), rows = nb * tl;
  index_t tmax = 0;
  for (const auto& s : shards) tmax = std::max(tmax, s.local_len());
  st.local_positions = tl;

  // The rank's rows of ids and targets (targets masked over the whole batch first).
  const std::vector<token_id> targets = detail::masked_targets(batch);
  std::vector<token_id> ids_local(static_cast<std::size_t>(rows)),
      targets_local(static_cast<std::size_t>(rows));
  for (index_t b = 0; b < nb; ++b)
    for (index_t i = 0; i < tl; ++i) {
      const auto from = static_cast<std::size_t>(b * t + mine.global_of(i));
      ids_local[static_cast<std::size_t>(b * tl + i)] = batch.input_ids[from];
      targets_local[static_cast<std::size_t>(b * tl + i)] = targets[from];
    }

  // The K/V ring: a block travels as (B*tmax, Hkv*hd) rows; a shift sends the buffer to rank
  // + 1 and receives rank - 1's into it, through a staging copy of the outgoing values (one
  // block: the only transient the ring adds).
  kv_ring<T> ring;
  ring.rank = comm.rank();
  ring.shards = shards;
  ring.max_local = tmax;
  ring.shift = [&](std::span<T> buf) {
    buffer_t<B> out = be.template allocate<T>(static_cast<index_t>(buf.size()));  // staging
    be.copy(matrix_view<const T>(
                as_matrix(std::span<const T>(buf), 1, static_cast<index_t>(buf.size()))),
            as_matrix(out.span(), 1, static_cast<index_t>(buf.size())));
    comm.ring_shift(std::span<const T>(out.span()), buf);
    ++st.kv_shifts;
  };

  const index_t chunk = opt.sched == backward_schedule::stream ? std::min(opt.chunk, t) : t;
  detail::shard_pass<M, O, C> pass{model,
                                   objective,
                                   comm,
                                   opt,
                                   mine,
                                   ring,
                                   ids_local,
                                   {nb, t, targets, batch.lengths},
                                   {nb, tl, targets_local, {}},
                                   rows,
                                   chunk,
                                   chunk,
                                   st};
  const backward_result result = detail::run_backward(model, batch, opt, pass);
  const comm_stats& after = comm.stats();
  st.bytes = after.bytes - comm_before.bytes;
  st.other_messages =
      after.messages() - comm_before.messages() - st.kv_shifts - st.gradient_messages;
  st.attention_flops = be.stats().attention_flops - flops_before;
  return result;
}

}  // namespace tightfit
