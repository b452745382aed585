// tightfit/stream/peak_model.hpp: the planner's closed form of a dry run's peak bytes as a
// function of the sequence length T, the chunk c and the head's row chunk h, so that pricing a
// schedule costs the same at T = 2^21 as at T = 64 (stream/planner.hpp uses it).
//
// Why a closed form exists. Every buffer compute_gradients allocates holds a fixed number of
// values per row of one of six extents: the batch's rows (B T), a full layer chunk's rows (B c),
// the last layer chunk's (B r, r = T - (q - 1) c over q = ceil(T / c) chunks), a full head
// chunk's (h), the last head chunk's, or none (a constant). For a given number of layer chunks
// and of head chunks the dry run allocates and frees the same buffers in the same order, and the
// middle chunks of a layer repeat the same allocations on the same live bytes. So the peak at any
// (T, c, h) with q >= 3 layer chunks and qh >= 3 head chunks is the peak of the events of a run
// with exactly 3 of each, every buffer's bytes evaluated at (T, c, h); likewise for 1 and 2.
//
// How it is obtained. For each class (min(q, 3), min(qh, 3)) the model records four small dry
// runs (T about 40) through a recording backend: a base point, and T, c and h each moved by one
// within the class. Which of them changes a buffer's bytes names its extent (T alone: rows; c
// alone: a full chunk; T and c: the last chunk; h alone, T and h: the head's), and its bytes at
// the base point give its values per row. The model is kept only when it reproduces all four
// runs exactly and a fifth run of the same class with other sizes (5 layer chunks, 4 head
// chunks); otherwise (a layer whose allocations depend on the chunk's position, or on two
// extents at once) the planner falls back to the dry run itself. Evaluating a model replays its
// few thousand events: microseconds, independent of T.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <tuple>
#include <typeinfo>
#include <utility>
#include <vector>

#include "tightfit/backend/meta.hpp"
#include "tightfit/core/memory.hpp"
#include "tightfit/nn/config.hpp"
#include "tightfit/stream/backward.hpp"

namespace tightfit {

/// Peak bytes of one compute_gradients call inside backend memory and in the host tier.
struct predicted_peaks {
  std::size_t activation_bytes = 0;  ///< backend (device) memory
  std::size_t host_bytes = 0;        ///< host tier (offload_layer_inputs), else 0
};

namespace detail {

/// The allocations and releases of one dry run, in order (ids count allocations from 0).
struct dry_trace {
  struct event {
    bool allocate = false;
    bool host = false;  ///< the host tier (offload) rather than backend memory
    std::uint32_t id = 0;
    std::uint64_t bytes = 0;  ///< allocations only
  };
  std::vector<event> events;
  std::uint32_t next_id = 0;
};

/// Storage of the recording dry run: no bytes, every allocation and release logged.
struct recording_storage {
  static constexpr const char* name = "meta_buffer";
  dry_trace* trace = nullptr;
  bool host = false;
  std::uint32_t id = 0;
  void* allocate(std::size_t bytes) {
    if (trace != nullptr) {
      id = trace->next_id++;
      trace->events.push_back({true, host, id, bytes});
    }
    return reinterpret_cast<void*>(std::uintptr_t{1} << 44);  // NOLINT: never dereferenced
  }
  void deallocate(void*, std::size_t) noexcept {
    if (trace != nullptr) {
      try {
        trace->events.push_back({false, host, id, 0});
      } catch (...) {  // out of memory while logging: the trace is marked unusable
        trace->next_id = std::numeric_limits<std::uint32_t>::max();
      }
    }
  }
};

/// meta_backend with a host tier (an OffloadBackend) whose allocations are logged into a trace.
template <std::floating_point T>
class recording_meta_backend : public meta_backend<T> {
 public:
  explicit recording_meta_backend(dry_trace* trace = nullptr) : trace_(trace) {}
  /// Logs the allocations made from now on into `trace` (null: none).
  void record_into(dry_trace* trace) { trace_ = trace; }

  template <class U>
  counted_buffer<U, recording_storage> allocate(index_t n) {
    return counted_buffer<U, recording_storage>(this->memory(), n, {trace_, false, 0});
  }
  memory_counter& host_memory() { return host_; }
  template <class U>
  counted_buffer<U, recording_storage> allocate_host(index_t n) {
    return counted_buffer<U, recording_storage>(host_, n, {trace_, true, 0});
  }
  void copy_to_host(std::span<const T>, std::span<T>) {}
  void copy_to_device(std::span<const T>, std::span<T>) {}
  void wait_copies() {}

 private:
  dry_trace* trace_;
  memory_counter host_;
};

/// What one dry run reports (backward_result's memory fields) and what it allocated.
struct recorded_run {
  dry_trace trace;
  std::size_t activation_bytes = 0, peak_bytes = 0, host_bytes = 0;
};

/// The extents a buffer's size is proportional to (see the top comment).
enum class extent : std::uint8_t { constant, rows, chunk, last_chunk, head_chunk, last_head };
inline constexpr std::size_t extent_count = 6;

/// The shape of one dry run: T, the chunk c and the head's rows per chunk h (explicit).
struct dry_point {
  index_t seq_len = 0, chunk = 0, head_rows = 0;
};

/// How compute_gradients splits T and the head's rows at a point: chunk counts and the value of
/// every extent (in rows; constant: 1).
struct dry_shape {
  index_t layer_chunks = 1, head_chunks = 1;
  std::array<std::uint64_t, extent_count> value{};
  /// The class of the point: (min(q, 3), min(qh, 3)).
  std::pair<int, int> kind() const {
    return {static_cast<int>(std::min<index_t>(layer_chunks, 3)),
            static_cast<int>(std::min<index_t>(head_chunks, 3))};
  }
};

/// The split of `p` under `options` (schedule and head mode; the chunk and head rows are p's).
inline dry_shape shape_of(index_t batch, const dry_point& p, const backward_options& options) {
  dry_shape s;
  const index_t t = p.seq_len;
  const bool stream = options.sched == backward_schedule::stream;
  const bool streaming_head =
      options.head == head_mode::streaming || (options.head == head_mode::automatic && stream);
  const index_t c = stream ? std::min(p.chunk, t) : t;  // the backward's chunk (and forward's q)
  s.layer_chunks = (t + c - 1) / c;
  const index_t rows = batch * t;
  const index_t h = streaming_head ? std::max<index_t>(1, p.head_rows) : rows;
  s.head_chunks = (rows + h - 1) / h;
  auto u = [](index_t v) { return static_cast<std::uint64_t>(v); };
  s.value[static_cast<std::size_t>(extent::constant)] = 1;
  s.value[static_cast<std::size_t>(extent::rows)] = u(rows);
  s.value[static_cast<std::size_t>(extent::chunk)] = u(batch * c);
  s.value[static_cast<std::size_t>(extent::last_chunk)] = u(batch * (t - (s.layer_chunks - 1) * c));
  s.value[static_cast<std::size_t>(extent::head_chunk)] = u(h);
  s.value[static_cast<std::size_t>(extent::last_head)] = u(rows - (s.head_chunks - 1) * h);
  return s;
}

/// The four sample points of a class (base, T + 1, c + 1, h + 1) and a fifth to verify with (5
/// layer chunks and 4 head chunks for class 3; other sizes of the same class otherwise).
inline std::array<dry_point, 5> sample_points(index_t batch, std::pair<int, int> kind) {
  const auto [q, qh] = kind;
  const index_t c0 = 16;
  const index_t t0 =
      q == 3 ? 41 : 25;  // q = 3: T in [2(c + 1) + 1, 3c - 1]; q = 2: [c + 2, 2c - 1]
  const index_t chunk0 = q == 1 ? t0 + 2 : c0;
  auto head_rows = [&](index_t t) {  // rows per head chunk giving qh chunks at t and t + 1
    const index_t rows = batch * t, rows1 = batch * (t + 1);
    if (qh == 1) return rows1 + 1;
    if (qh == 2) return ((rows1 + 1) / 2 + rows - 2) / 2;
    return ((rows1 + 2) / 3 + (rows - 3) / 2) / 2;
  };
  const index_t h0 = head_rows(t0);
  const index_t tv = q == 3 ? 55 : 19, cv = q == 1 ? 30 : 12;
  const index_t rv = batch * tv;
  const index_t hv = qh == 1 ? rv + 5 : qh == 2 ? rv / 2 + 1 : (rv + 3) / 4;
  return {dry_point{t0, chunk0, h0}, dry_point{t0 + 1, chunk0, h0}, dry_point{t0, chunk0 + 1, h0},
          dry_point{t0, chunk0, h0 + 1}, dry_point{tv, cv, hv}};
}

/// a * b and a + b saturating at the largest 64-bit count (a peak that large never fits).
inline std::uint64_t saturating_product(std::uint64_t a, std::uint64_t b) {
  if (a != 0 && b > std::numeric_limits<std::uint64_t>::max() / a)
    return std::numeric_limits<std::uint64_t>::max();
  return a * b;
}
inline std::uint64_t saturating_sum(std::uint64_t a, std::uint64_t b) {
  return a > std::numeric_limits<std::uint64_t>::max() - b
             ? std::numeric_limits<std::uint64_t>::max()
             : a + b;
}

/// The closed form of one class: the events of its 3-chunk run, each allocation as bytes per
/// unit of its extent.
class peak_model {
 public:
  /// Fits the model to the runs at points[0..3] (base, T + 1, c + 1, h + 1); nullopt when the
  /// runs do not follow the closed form (different events, a size of two extents).
  static std::optional<peak_model> fit(std::span<const recorded_run, 4> runs,
                                       std::span<const dry_shape, 4> shapes) {
    const auto& base = runs[0].trace.events;
    for (const auto& r : runs)
      if (r.trace.events.size() != base.size() ||
          r.trace.next_id == std::numeric_limits<std::uint32_t>::max())
        return std::nullopt;
    peak_model m;
    m.events_.reserve(base.size());
    for (std::size_t i = 0; i < base.size(); ++i) {
      const auto& e = base[i];
      for (const auto& r : runs) {
        const auto& o = r.trace.events[i];
        if (o.allocate != e.allocate || o.host != e.host || o.id != e.id) return std::nullopt;
      }
      event out{e.allocate, e.host, e.id, extent::constant, e.bytes};
      if (e.allocate) {
        const bool by_t = runs[1].trace.events[i].bytes != e.bytes;
        const bool by_c = runs[2].trace.events[i].bytes != e.bytes;
        const bool by_h = runs[3].trace.events[i].bytes != e.bytes;
        if (by_c && by_h) return std::nullopt;
        out.kind = !by_t && !by_c && !by_h ? extent::constant
                   : by_c                  ? (by_t ? extent::last_chunk : extent::chunk)
                   : by_h                  ? (by_t ? extent::last_head : extent::head_chunk)
                                           : extent::rows;
        const std::uint64_t unit = shapes[0].value[static_cast<std::size_t>(out.kind)];
        if (unit == 0 || e.bytes % unit != 0) return std::nullopt;
        out.per_unit = e.bytes / unit;
        for (std::size_t k = 0; k < 4; ++k)
          if (runs[k].trace.events[i].bytes !=
              out.per_unit * shapes[k].value[static_cast<std::size_t>(out.kind)])
            return std::nullopt;
      }
      if (e.id >= base.size()) return std::nullopt;  // ids count the allocations
      m.ids_ = std::max<std::size_t>(m.ids_, e.id + std::size_t{1});
      m.events_.push_back(out);
    }
    // The bytes the trace holds when compute_gradients' peak scopes open (the gradients it
    // allocates first): the replay's highest count minus the run's peak above its entry.
    const auto [device, host] = m.replay(shapes[0]);
    if (device < runs[0].activation_bytes || host < runs[0].host_bytes) return std::nullopt;
    m.device_entry_ = device - runs[0].activation_bytes;
    m.host_entry_ = host - runs[0].host_bytes;
    for (std::size_t k = 0; k < 4; ++k)
      if (!m.reproduces(runs[k], shapes[k])) return std::nullopt;
    return m;
  }

  /// The peaks at a point of this model's class.
  predicted_peaks at(const dry_shape& s) const {
    const auto [device, host] = replay(s);
    auto above = [](std::uint64_t peak, std::uint64_t entry) {
      const std::uint64_t v = peak > entry ? peak - entry : 0;
      return static_cast<std::size_t>(
          std::min<std::uint64_t>(v, std::numeric_limits<std::size_t>::max()));
    };
    return {above(device, device_entry_), above(host, host_entry_)};
  }

  /// Whether the model gives run `r` (its activation and host bytes) at its shape `s`.
  bool reproduces(const recorded_run& r, const dry_shape& s) const {
    const auto p = at(s);
    return p.activation_bytes == r.activation_bytes && p.host_bytes == r.host_bytes;
  }

 private:
  struct event {
    bool allocate;
    bool host;
    std::uint32_t id;
    extent kind;
    std::uint64_t per_unit;  ///< bytes per unit of `kind`
  };

  /// The highest live bytes of backend memory and of the host tier over the events at `s`.
  std::pair<std::uint64_t, std::uint64_t> replay(const dry_shape& s) const {
    std::vector<std::uint64_t> bytes(ids_, 0);  // (allocations) by id
    std::uint64_t live[2] = {0, 0}, peak[2] = {0, 0};
    for (const auto& e : events_) {
      const std::size_t tier = e.host ? 1 : 0;
      if (e.allocate) {
        const std::uint64_t b =
            saturating_product(e.per_unit, s.value[static_cast<std::size_t>(e.kind)]);
        bytes[e.id] = b;
        live[tier] = saturating_sum(live[tier], b);
        peak[tier] = std::max(peak[tier], live[tier]);
      } else {
        live[tier] -= std::min(live[tier], bytes[e.id]);
      }
    }
    return {peak[0], peak[1]};
  }

  std::vector<event> events_;
  std::size_t ids_ = 0;  ///< allocations (ids 0 .. ids_ - 1)
  std::uint64_t device_entry_ = 0, host_entry_ = 0;
};

/// The closed forms of one planner call, by class and by the options that change the events
/// (schedule, spacing, offload); everything else (model, batch, objective, layer, value type)
/// must be the same for every lookup. A class whose fit failed is remembered as such.
class peak_model_cache {
 public:
  using key = std::tuple<int, int, int, index_t, bool>;
  /// The dry runner of this planner call (type R, built from `args` at the first call).
  template <class R, class... Args>
  R& runner(Args&&... args) {
    if (!runner_) {
      runner_ = std::make_shared<R>(std::forward<Args>(args)...);
      runner_type_ = &typeid(R);
    }
    check(*runner_type_ == typeid(R), "peak_model_cache: used with two model types");
    return *static_cast<R*>(runner_.get());
  }
  /// The model of `k`, fitted by `make` (a callable returning std::optional<peak_model>) once.
  template <class Make>
  const std::optional<peak_model>& get(const key& k, Make&& make) {
    auto it = models_.find(k);
    if (it == models_.end()) it = models_.emplace(k, make()).first;
    return it->second;
  }

 private:
  std::map<key, std::optional<peak_model>> models_;
  std::shared_ptr<void> runner_;
  const std::type_info* runner_type_ = nullptr;
};

/// The peaks of compute_gradients at (batch, seq_len, options) by the closed form: `run(point,
/// options)` performs one recording dry run at a point (returning recorded_run); the model of the
/// point's class is fitted (or taken from `cache`) and evaluated. nullopt when the class does not
/// follow the closed form: the caller then runs the dry run itself.
template <class Run>
std::optional<predicted_peaks> closed_form_peaks(index_t batch, index_t seq_len,
                                                 const backward_options& options,
                                                 index_t default_head_rows, Run&& run,
                                                 peak_model_cache* cache) {
  const index_t head_rows =
      options.head_chunk_rows > 0 ? options.head_chunk_rows : default_head_rows;
  const dry_shape target = shape_of(batch, {seq_len, options.chunk, head_rows}, options);
  const auto kind = target.kind();
  auto make = [&]() -> std::optional<peak_model> {
    const auto points = sample_points(batch, kind);
    std::array<recorded_run, 4> runs;
    std::array<dry_shape, 4> shapes;
    for (std::size_t k = 0; k < 4; ++k) {
      shapes[k] = shape_of(batch, points[k], options);
      if (shapes[k].kind() != kind) return std::nullopt;
      runs[k] = run(points[k]);
    }
    auto m = peak_model::fit(runs, shapes);
    if (!m) return std::nullopt;
    const dry_shape vs = shape_of(batch, points[4], options);
    if (vs.kind() != kind || !m->reproduces(run(points[4]), vs)) return std::nullopt;
    return m;
  };
  const peak_model_cache::key k{kind.first, kind.second, static_cast<int>(options.sched),
                                options.keep_every, options.offload_layer_inputs};
  std::optional<peak_model> local;
  const std::optional<peak_model>& m = cache != nullptr ? cache->get(k, make) : (local = make());
  if (!m) return std::nullopt;
  return m->at(target);
}

}  // namespace detail

}  // namespace tightfit
