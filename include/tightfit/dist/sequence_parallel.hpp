// tightfit/dist/sequence_parallel.hpp: sequence-parallel StreamBP. The T positions of every
// sequence of one batch are split over the N ranks of a Communicator (nn/sequence_shard.hpp:
// contiguous blocks or zig-zag pairs of blocks); each rank keeps only its own positions' layer
// inputs, runs the LM head and the objective on its own rows, and the ranks together compute
// the gradient one process computes on the whole batch (docs/distributed.md).
//
// Per layer (a SequenceParallelLayer):
//  forward   own K/V rows, all-gather of K/V (the keys of earlier positions reach every rank),
//            own queries `chunk` positions at a time against the global key prefix;
//  backward  K/V again (all-gather), own chunks last to first accumulating dK/dV over the whole
//            prefix, reduce-scatter of dK/dV to their owners, then the K/V projections'
//            backward of the own rows; the layer's parameter gradients are all-reduced once,
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
// (tested to 1e-12 relative, SFT, GRPO, DPO, T not divisible by N, right padding). Memory per
// rank: the layer inputs and dy of Tl = T/N positions, plus the gathered K/V and the dK/dV
// accumulators of the whole prefix (O(T) per layer; a ring would hold 2/N of it).
// Parameter gradients ACCUMULATE, and the all-reduce sums whole gradient buffers: zero them
// before the call (as data_parallel_gradients).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <span>
#include <string>
#include <vector>

#include "tightfit/core/error.hpp"
#include "tightfit/core/memory.hpp"
#include "tightfit/dist/agreement.hpp"
#include "tightfit/dist/communicator.hpp"
#include "tightfit/dist/data_parallel.hpp"
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
  index_t local_positions = 0;         ///< Tl: positions this rank owns
  std::int64_t kv_gathers = 0;         ///< all-gathers of K/V (2 per layer backpropagated)
  std::int64_t kv_reductions = 0;      ///< reduce-scatters of dK/dV (1 per layer)
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

/// Loss and parameter gradients of `model` on the whole `batch` (every rank passes the same
/// batch and the same objective, built for the whole batch), this rank computing its shard of
/// the positions (see the top comment). Schedules: stream (chunks of opt.chunk positions) and
/// checkpoint (one chunk per block); keep_every 1, no offload.
template <DecoderModel M, Objective O, Communicator C>
requires SequenceParallelLayer<typename M::layer_type, typename M::backend_type> backward_result
sequence_parallel_gradients(M& model, const token_batch& batch, O& objective,
                            const backward_options& opt, C& comm,
                            const sequence_parallel_options& sp = {},
                            sequence_parallel_stats* stats = nullptr) {
  using B = typename M::backend_type;
  using T = storage_t<B>;
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  B& be = model.backend();
  const model_config& cfg = model.config();
  const index_t nl = cfg.num_hidden_layers, d = cfg.hidden_size, kvw = cfg.kv_width();
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
  const sequence_batch seq{batch.batch, batch.seq_len, batch.lengths, batch.position_ids};
  const index_t t = seq.seq_len, nb = seq.batch;
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
  const token_layout global_layout{nb, t, targets, batch.lengths};
  const token_layout local_layout{nb, tl, targets_local, {}};

  auto needs = [&](index_t l) {
    return opt.layer_weight_grads.empty() || opt.layer_weight_grads[static_cast<std::size_t>(l)];
  };
  index_t lowest = nl;
  for (index_t l = 0; l < nl; ++l)
    if (needs(l)) {
      lowest = l;
      break;
    }
  if (opt.embedding_grad) lowest = 0;

  auto& params = model.parameters();
  if (opt.head_grad)
    for (auto id : model.head_param_ids()) params.allocate_grad(id);
  if (opt.embedding_grad) params.allocate_grad(model.embed_id());
  for (index_t l = 0; l < nl; ++l)
    if (needs(l))
      for (auto id : model.layer_param_ids(l)) params.allocate_grad(id);

  backward_result result;
  result.lowest_layer = lowest;
  peak_scope scope(be.memory());
  const index_t chunk = opt.sched == backward_schedule::stream ? std::min(opt.chunk, t) : t;
  result.chunk = chunk;

  // K/V exchange: every rank's rows packed (2, B*tmax, Hkv*hd), all-gathered, unpacked.
  const index_t part = 2 * nb * tmax * kvw;  // values per rank of a K/V (or dK/dV) message
  auto pack = [&](const sequence_shard& s, std::span<T> k, std::span<T> v, std::span<T> out) {
    const index_t n = nb * s.local_len();
    gather_shard_rows(be, nb, s, matrix_view<const T>(as_matrix(k, nb * t, kvw)),
                      as_matrix(out.subspan(0, static_cast<std::size_t>(n * kvw)), n, kvw));
    gather_shard_rows(be, nb, s, matrix_view<const T>(as_matrix(v, nb * t, kvw)),
                      as_matrix(out.subspan(static_cast<std::size_t>(nb * tmax * kvw),
                                            static_cast<std::size_t>(n * kvw)),
                                n, kvw));
  };
  auto unpack = [&](const sequence_shard& s, std::span<T> in, std::span<T> k, std::span<T> v) {
    const index_t n = nb * s.local_len();
    scatter_shard_rows(
        be, nb, s,
        matrix_view<const T>(as_matrix(in.subspan(0, static_cast<std::size_t>(n * kvw)), n, kvw)),
        as_matrix(k, nb * t, kvw));
    scatter_shard_rows(
        be, nb, s,
        matrix_view<const T>(as_matrix(in.subspan(static_cast<std::size_t>(nb * tmax * kvw),
                                                  static_cast<std::size_t>(n * kvw)),
                                       n, kvw)),
        as_matrix(v, nb * t, kvw));
  };
  const kv_exchange<T> exchange = [&](std::span<T> k, std::span<T> v) {
    buffer_t<B> all = be.template allocate<T>(ranks * part);  // (N, 2, B*tmax, Hkv*hd)
    {
      buffer_t<B> own = be.template allocate<T>(part);  // (2, B*tmax, Hkv*hd)
      pack(mine, k, v, own.span());
      comm.all_gather(std::span<const T>(own.span()), all.span());
    }
    ++st.kv_gathers;
    for (int r = 0; r < ranks; ++r)
      if (r != comm.rank())
        unpack(
            shards[static_cast<std::size_t>(r)],
            all.span().subspan(static_cast<std::size_t>(r * part), static_cast<std::size_t>(part)),
            k, v);
  };
  const kv_exchange<T> reduce = [&](std::span<T> dk, std::span<T> dv) {
    buffer_t<B> own = be.template allocate<T>(part);  // (2, B*tmax, Hkv*hd) summed own rows
    {
      buffer_t<B> all = be.template allocate<T>(ranks * part);  // (N, 2, B*tmax, Hkv*hd)
      for (int r = 0; r < ranks; ++r)
        pack(
            shards[static_cast<std::size_t>(r)], dk, dv,
            all.span().subspan(static_cast<std::size_t>(r * part), static_cast<std::size_t>(part)));
      comm.reduce_scatter_sum(std::span<const T>(all.span()), own.span());
    }
    ++st.kv_reductions;
    unpack(mine, own.span(), dk, dv);
  };

  // Forward over the shard: input l of layer l kept (B*Tl, d), input nl the final hidden state.
  std::vector<buffer_t<B>> inputs(static_cast<std::size_t>(nl + 1));
  auto input = [&](index_t l) -> buffer_t<B>& { return inputs[static_cast<std::size_t>(l)]; };
  input(0) = be.template allocate<T>(rows * d);  // (B*Tl, d)
  be.embedding_forward(
      as_matrix(std::span<const T>(params.value(model.embed_id())), cfg.vocab_size, d),
      std::span<const token_id>(ids_local), input(0).view(rows, d));
  for (index_t l = 0; l < nl; ++l) {
    input(l + 1) = be.template allocate<T>(rows * d);  // (B*Tl, d)
    model.layer(l).forward_shard(be, seq, mine, matrix_view<const T>(input(l).view(rows, d)),
                                 input(l + 1).view(rows, d), chunk, exchange);
    if (l < lowest) input(l).reset();
  }
  result.forward_seconds = std::chrono::duration<double>(clock::now() - start).count();

  // Gradient groups, all-reduced without blocking once final, while the next layer runs: each
  // parameter's gradient buffer in place (no staging copy: the head's and the embedding's
  // would each add a (V, d) buffer to a rank's peak), all of a group's messages issued
  // together. A group is completed (waited, the caller's on_grads_ready) at the next group's
  // event or at the end, as in step_gradients.
  using request_t = decltype(comm.all_reduce_sum(std::span<T>()));
  struct pending {
    grads_ready event;
    std::vector<request_t> requests;
  };
  std::deque<pending> in_flight;
  auto complete = [&](pending& p) {
    for (auto& r : p.requests) r.wait();
    if (opt.on_grads_ready) opt.on_grads_ready(p.event);
  };
  auto grads_final = [&](const grads_ready& e) {
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
    while (!in_flight.empty()) {
      complete(in_flight.front());
      in_flight.pop_front();
    }
    in_flight.push_back(std::move(p));
  };

  // Head on the rank's rows, the objective of the whole batch.
  head_options hopt;
  hopt.temperature = opt.temperature;
  const bool streaming =
      opt.head == head_mode::streaming ||
      (opt.head == head_mode::automatic && opt.sched == backward_schedule::stream);
  hopt.chunk_rows = !streaming                ? std::max<index_t>(1, rows)
                    : opt.head_chunk_rows > 0 ? opt.head_chunk_rows
                                              : default_head_chunk_rows(cfg, nb, chunk);
  buffer_t<B> dy;
  if (lowest < nl) dy = be.template allocate<T>(rows * d);  // (B*Tl, d)
  {
    const auto head_start = clock::now();
    detail::shard_objective<O, C> local_objective(objective, comm, global_layout, mine);
    result.loss =
        lm_head_backward(model, matrix_view<const T>(input(nl).view(rows, d)), local_layout,
                         local_objective, hopt, lowest < nl ? dy.view(rows, d) : matrix_view<T>{},
                         opt.head_grad, &result.statistics_seconds);
    result.head_seconds = std::chrono::duration<double>(clock::now() - head_start).count();
    input(nl).reset();
  }
  if (opt.head_grad) grads_final({grads_ready::kind::head, -1});

  // Layers, top to bottom; dx aliases dy (as compute_gradients).
  for (index_t l = nl - 1; l >= lowest; --l) {
    auto& layer = model.layer(l);
    const layer_grad_mode mode{needs(l), l > lowest || opt.embedding_grad};
    auto x = matrix_view<const T>(input(l).view(rows, d));
    layer.begin_backward_shard(be, seq, mine, x, chunk, mode, exchange);
    std::vector<std::pair<index_t, index_t>> chunks;
    for (const auto& k : mine.blocks)
      for (index_t c0 = k.p0; c0 < k.p1; c0 += chunk)
        chunks.emplace_back(c0, std::min(k.p1, c0 + chunk));
    for (auto it = chunks.rbegin(); it != chunks.rend(); ++it)  // last chunk first
      layer.backward_chunk(be, seq, x, matrix_view<const T>(dy.view(rows, d)), it->first,
                           it->second, mode.input_grad ? dy.view(rows, d) : matrix_view<T>{}, mode);
    layer.end_backward_shard(be, seq, x, mode.input_grad ? dy.view(rows, d) : matrix_view<T>{},
                             mode, reduce);
    input(l).reset();
    if (mode.weight_grads) grads_final({grads_ready::kind::layer, l});
  }
  if (opt.embedding_grad) {
    be.embedding_backward(matrix_view<const T>(dy.view(rows, d)),
                          std::span<const token_id>(ids_local),
                          as_matrix(params.grad(model.embed_id()), cfg.vocab_size, d));
    grads_final({grads_ready::kind::embedding, -1});
  }
  while (!in_flight.empty()) {
    complete(in_flight.front());
    in_flight.pop_front();
  }
  result.peak_activation_bytes = scope.peak_above_entry();
  result.peak_bytes = scope.peak_bytes();
  result.seconds = std::chrono::duration<double>(clock::now() - start).count();
  const comm_stats& after = comm.stats();
  st.bytes = after.bytes - comm_before.bytes;
  st.other_messages = after.messages() - comm_before.messages() - st.kv_gathers - st.kv_reductions -
                      st.gradient_messages;
  st.attention_flops = be.stats().attention_flops - flops_before;
  return result;
}

}  // namespace tightfit
