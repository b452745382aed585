// tightfit/stream/planner.hpp: the memory planner. For a model config, batch size B, sequence
// length T and a byte budget: the peak activation bytes of each schedule, the largest chunk
// that fits (stream), and the largest T each schedule can reach.
//
// The prediction is a dry run of compute_gradients on meta_backend (every allocation counted
// exactly as on a real backend, no kernel run), so it tracks the code instead of a formula;
// each dry run costs O(layers * chunks) no-op calls. "Activation bytes" are the bytes
// allocated inside compute_gradients (parameters and their gradients are not included: the
// budget is what is left for activations). The objective is a parameter (its statistics pass, if
// any, is part of the dry run); the layer type is a template parameter (by default config_layer:
// the shipped layer the config's architecture names, nn/architectures.hpp).
// Layer-input spacing (backward_options::keep_every) is priced the same way: its peak by a dry
// run, its extra work as the layer forwards it re-runs (L - ceil(L / k) of them); the planner
// picks the smallest spacing (least recomputation) and then the largest chunk that fit.
// Offload of the layer inputs to a host tier (backward_options::offload_layer_inputs, device
// backends) is priced by the same dry run over a two-tier meta backend: device bytes against the
// budget, host-tier bytes reported beside them, no extra forward work (the copies overlap).
// Cost: a dry run's peak is a closed form in T, the chunk and the head's rows (stream/
// peak_model.hpp), fitted once per planner call from a few dry runs at T of about 40, so that a
// price costs microseconds at any T; the searches (chunk by doubling, spacing, largest T by
// doubling and bisection) evaluate it. A layer whose allocations do not follow the closed form is
// priced by the dry run itself, O(layers * chunks) no-op calls.
#pragma once

#include <algorithm>
#include <cstddef>
#include <optional>
#include <type_traits>
#include <vector>

#include "tightfit/backend/meta.hpp"
#include "tightfit/backend/offload.hpp"
#include "tightfit/nn/architectures.hpp"
#include "tightfit/nn/model.hpp"
#include "tightfit/stream/backward.hpp"
#include "tightfit/stream/peak_model.hpp"

namespace tightfit {

namespace detail {
/// Dry runs of compute_gradients for one model (layer type Layer, value type T) and objective:
/// the model is built once (on the recording meta backend) and run at any batch, T and options,
/// its allocations logged into a trace when one is given. A run costs O(batch * seq_len) host
/// work and O(layers * chunks) no-op calls.
template <std::floating_point T, template <class> class Layer, Objective O>
class dry_runner {
 public:
  using backend = recording_meta_backend<T>;
  dry_runner(const model_config& config, const O& objective)
      : model_(be_, config), objective_(objective) {}
  dry_runner(const dry_runner&) = delete;
  dry_runner& operator=(const dry_runner&) = delete;

  recorded_run run(index_t batch, index_t seq_len, const backward_options& options, bool record) {
    recorded_run out;
    be_.record_into(record ? &out.trace : nullptr);
    const auto rows = static_cast<std::size_t>(batch * seq_len);
    std::vector<token_id> ids(rows, 0), targets(rows, 0);
    O loss = objective_;
    backward_options o = options;
    o.on_grads_ready = nullptr;
    backward_result r;
    try {
      r = compute_gradients(model_, token_batch{batch, seq_len, ids, targets, {}}, loss, o);
    } catch (...) {
      be_.record_into(nullptr);
      throw;
    }
    be_.record_into(nullptr);
    auto& p = model_.parameters();
    for (std::size_t i = 0; i < p.size(); ++i) p.release_grad(i);  // the next run starts alike
    out.activation_bytes = r.peak_activation_bytes;
    out.peak_bytes = r.peak_bytes;
    out.host_bytes = r.peak_host_bytes;
    return out;
  }

 private:
  backend be_;
  decoder_model<backend, Layer<backend>> model_;
  O objective_;
};
}  // namespace detail

/// Exact peak bytes of one compute_gradients call with value type T, objective `objective`
/// (copied: the dry run does not touch the caller's) and layer type Layer<backend>. `cache`
/// (planner calls) keeps the closed forms fitted for one model, batch and objective.
template <std::floating_point T, template <class> class Layer = config_layer, Objective O>
predicted_peaks predict_peaks(const model_config& config, index_t batch, index_t seq_len,
                              const backward_options& options, const O& objective,
                              detail::peak_model_cache* cache = nullptr) {
  using dry = two_tier_backend<meta_backend<T>>;
  if constexpr (std::is_same_v<Layer<dry>, config_layer<dry>>) {
    return with_config_layer(config, [&](auto layer) {
      return predict_peaks<T, decltype(layer)::template type>(config, batch, seq_len, options,
                                                              objective, cache);
    });
  } else {
    using runner = detail::dry_runner<T, Layer, O>;
    std::optional<runner> local;
    auto runner_of = [&]() -> runner& {
      if (cache == nullptr) return local ? *local : local.emplace(config, objective);
      return cache->template runner<runner>(config, objective);
    };
    if (batch >= 1 && seq_len >= 1 && options.chunk >= 1) {
      auto run = [&](const detail::dry_point& p) {
        backward_options o = options;
        o.chunk = p.chunk;
        o.head_chunk_rows = p.head_rows;
        return runner_of().run(batch, p.seq_len, o, true);
      };
      if (const auto p = detail::closed_form_peaks(
              batch, seq_len, options, default_head_chunk_rows(config, batch, options.chunk), run,
              cache))
        return *p;
    }
    const auto r = runner_of().run(batch, seq_len, options, false);
    return {r.activation_bytes, r.host_bytes};
  }
}

/// Exact peak activation bytes (backend memory) of one compute_gradients call.
template <std::floating_point T, template <class> class Layer = config_layer, Objective O>
std::size_t predict_peak_activation_bytes(const model_config& config, index_t batch,
                                          index_t seq_len, const backward_options& options,
                                          const O& objective) {
  return predict_peaks<T, Layer>(config, batch, seq_len, options, objective).activation_bytes;
}

struct plan_result {
  std::size_t budget_bytes = 0;
  index_t chunk = 0;                 ///< largest power-of-two chunk whose peak fits (0: none)
  std::size_t chunk_peak_bytes = 0;  ///< predicted peak with that chunk
  index_t keep_every = 1;            ///< the smallest layer-input spacing with which `chunk` fits
  index_t recomputed_layers = 0;     ///< extra layer forwards of that spacing
  index_t max_seq_full = 0;          ///< largest T that fits, per schedule (0: none)
  index_t max_seq_checkpoint = 0;
  index_t max_seq_stream = 0;  ///< with chunk `stream_chunk`
  index_t stream_chunk = 0;
  /// The largest T with layer-input spacing (the best keep_every for that T, given next to it).
  index_t max_seq_checkpoint_spaced = 0, checkpoint_keep_every = 1;
  index_t max_seq_stream_spaced = 0, stream_keep_every = 1;
  /// The largest T with the layer inputs offloaded to a host tier (device backends), and the
  /// host-tier bytes that T needs.
  index_t max_seq_checkpoint_offload = 0, max_seq_stream_offload = 0;
  std::size_t checkpoint_offload_host_bytes = 0, stream_offload_host_bytes = 0;
};

/// Layer inputs stored at once, at most, in the backward with spacing k over L backpropagated
/// layers: while segment j (base j k, s_j layers) runs, the kept inputs of segments 0..j and the
/// s_j - 1 recomputed ones of segment j. About ceil(L / k) + k - 1; smallest near k = sqrt(L).
inline index_t stored_layer_inputs(index_t layers, index_t k) {
  index_t most = 0;
  for (index_t j = 0; j * k < layers; ++j)
    most = std::max(most, (j + 1) + std::min(k, layers - j * k) - 1);
  return most;
}
/// Layer forwards re-run for dropped inputs with spacing k over L layers.
inline index_t recomputed_layer_forwards(index_t layers, index_t k) {
  return layers - (layers + k - 1) / k;
}

namespace detail {
/// Largest T in [1, limit] with fits(T) (fits is monotone in T), 0 when fits(1) fails.
template <class Fits>
index_t largest_fitting(index_t limit, Fits&& fits) {
  if (!fits(1)) return 0;
  index_t lo = 1, hi = 2;
  while (hi <= limit && fits(hi)) {
    lo = hi;
    hi *= 2;
  }
  hi = std::min(hi, limit + 1);  // fits(lo), !fits(hi) or hi past the limit
  while (hi - lo > 1) {
    const index_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

/// The planner's searches over a price `price(T, options)` (a predicted_peaks) for a model of
/// `nl` layers: the chunk at seq_len (spacings from 1 up, chunks
/// doubling while they fit), then the largest T of each schedule (doubling, then bisection up to
/// max_seq), with spacing and with offload. plan_memory prices by the closed form; the tests
/// price by the dry run itself and expect the same plan.
template <class Price>
plan_result plan_search(index_t nl, index_t seq_len, std::size_t budget_bytes, index_t stream_chunk,
                        index_t max_seq, Price&& price) {
  plan_result r;
  r.budget_bytes = budget_bytes;
  auto peaks = [&](backward_schedule s, index_t t, index_t chunk, index_t k, bool offload) {
    backward_options o;
    o.sched = s;
    o.chunk = chunk;
    o.keep_every = k;
    o.offload_layer_inputs = offload;
    return price(t, o);
  };
  auto peak = [&](backward_schedule s, index_t t, index_t chunk, index_t k = 1) {
    return peaks(s, t, chunk, k, false).activation_bytes;
  };
  // The fastest policy at seq_len: the smallest spacing with a fitting chunk, then its largest
  // power-of-two chunk.
  for (index_t k = 1; k <= nl && r.chunk == 0; ++k) {
    for (index_t c = 1; c <= seq_len; c *= 2) {
      const std::size_t p = peak(backward_schedule::stream, seq_len, c, k);
      if (p > budget_bytes) break;
      r.chunk = c;
      r.chunk_peak_bytes = p;
      r.keep_every = k;
      r.recomputed_layers = recomputed_layer_forwards(nl, k);
      if (c > seq_len / 2) break;
    }
  }
  r.stream_chunk = stream_chunk > 0 ? stream_chunk : 512;
  r.max_seq_full = detail::largest_fitting(
      max_seq, [&](index_t t) { return peak(backward_schedule::full, t, t) <= budget_bytes; });
  r.max_seq_checkpoint = detail::largest_fitting(max_seq, [&](index_t t) {
    return peak(backward_schedule::checkpoint, t, t) <= budget_bytes;
  });
  r.max_seq_stream = detail::largest_fitting(max_seq, [&](index_t t) {
    return peak(backward_schedule::stream, t, r.stream_chunk) <= budget_bytes;
  });
  // With spacing: the spacings that store the fewest layer inputs (the others cannot reach a
  // longer T: everything else they allocate is the same), each priced.
  index_t fewest = nl;
  for (index_t k = 1; k <= nl; ++k) fewest = std::min(fewest, stored_layer_inputs(nl, k));
  std::vector<index_t> candidates;
  for (index_t k = 1; k <= nl; ++k)
    if (stored_layer_inputs(nl, k) == fewest) candidates.push_back(k);
  // The first candidate spacing with which schedule s fits T (0: none).
  auto fitting_k = [&](backward_schedule s, index_t t) -> index_t {
    for (index_t k : candidates)
      if (peak(s, t, s == backward_schedule::stream ? r.stream_chunk : t, k) <= budget_bytes)
        return k;
    return 0;
  };
  for (auto s : {backward_schedule::checkpoint, backward_schedule::stream}) {
    const index_t chunk_of = s == backward_schedule::stream ? r.stream_chunk : 0;
    auto offloaded = [&](index_t n) { return peaks(s, n, chunk_of > 0 ? chunk_of : n, 1, true); };
    const index_t to = detail::largest_fitting(
        max_seq, [&](index_t n) { return offloaded(n).activation_bytes <= budget_bytes; });
    const std::size_t host = to > 0 ? offloaded(to).host_bytes : 0;
    if (s == backward_schedule::checkpoint) {
      r.max_seq_checkpoint_offload = to;
      r.checkpoint_offload_host_bytes = host;
    } else {
      r.max_seq_stream_offload = to;
      r.stream_offload_host_bytes = host;
    }
    const index_t t =
        detail::largest_fitting(max_seq, [&](index_t n) { return fitting_k(s, n) > 0; });
    const index_t k = t > 0 ? fitting_k(s, t) : 1;
    if (s == backward_schedule::checkpoint) {
      r.max_seq_checkpoint_spaced = t;
      r.checkpoint_keep_every = k;
    } else {
      r.max_seq_stream_spaced = t;
      r.stream_keep_every = k;
    }
  }
  return r;
}

}  // namespace detail

/// The planner: largest power-of-two chunk (<= T) whose stream peak fits the budget at T, and
/// the largest T per schedule (stream with `stream_chunk`, default 512),
/// searched up to max_seq.
template <std::floating_point T, template <class> class Layer = config_layer, Objective O>
plan_result plan_memory(const model_config& config, index_t batch, index_t seq_len,
                        std::size_t budget_bytes, const O& objective, index_t stream_chunk = 0,
                        index_t max_seq = index_t{1} << 22) {
  config.validate();
  check(batch >= 1, "plan_memory: batch is ", batch, ", expected >= 1");
  check(seq_len >= 1, "plan_memory: sequence length is ", seq_len, ", expected >= 1");
  detail::peak_model_cache cache;  // the closed forms of this model, batch and objective
  return detail::plan_search(config.num_hidden_layers, seq_len, budget_bytes, stream_chunk, max_seq,
                             [&](index_t t, const backward_options& o) {
                               return predict_peaks<T, Layer>(config, batch, t, o, objective,
                                                              &cache);
                             });
}

}  // namespace tightfit
