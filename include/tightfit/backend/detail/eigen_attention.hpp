// tightfit/backend/detail/eigen_attention.hpp: causal flash attention (forward and backward) on
// the CPU with Eigen GEMMs on tiles and oneTBB across tiles.
//
// One sequence, GQA without replicating K/V: query head h reads kv head h / (heads / kv_heads).
// Query row r sits at position p = q0 + r and attends K/V rows [begin(r), end(r)) =
// attention_mask::key_rows (sliding window, document start, causal, valid_len, the key block
// [k0, k0 + nk) of a longer call; empty there: O = 0, lse = -inf). Both are non-decreasing in r, so
// the keys of a query tile form one interval and the queries of a key tile one interval: every loop
// below walks only those, and a tile is masked only where a row's interval does not cover it.
//
// Head stacking: the `group` query heads that share a kv head are adjacent columns of Q, so for a
// tile of bq query rows they form one (bq * group, hd) matrix (stacked row r * group + j is query
// row r of head j of the group), gathered by one contiguous copy per row. Every tile GEMM works on
// these stacked rows: each K/V tile is packed once per group instead of once per head, and the
// products are group times larger (better GEMM efficiency). No K/V is replicated.
//
// Forward (FlashAttention-2 order): tasks are (kv head, query tile); each walks the key tiles up
// to its diagonal with an online softmax (running max m and sum l per row) and keeps only
// lse = m + log l. Key tiles outside the tile's key interval (above the diagonal, past valid_len,
// before the window or the document) are never computed, and in a key tile only the rows whose
// interval meets it compute; only tiles on an interval's edge are masked.
// The score tile S (bq * group, bk) is the only score storage.
//
// Backward (exact: P = exp(scale S - lse), D = rowsum(dO * O), dV += P^T dO, dP = dO V^T,
// dS = P * (dP - D), dQ += scale dS K, dK += scale dS^T Q; with soft-capping (mask.softcap = cap,
// Gemma 2) the scores are c = cap tanh(scale S / cap), P = exp(c - lse) and dS gains the factor
// 1 - (c / cap)^2), two strategies:
//  - thread_partials (default): tasks are (kv head, key tile); each walks the query rows that
//    see its keys, keeps dK, dV of its key tile locally (race-free: tasks own disjoint key
//    rows) and adds scale dS K into a per-thread dQ partial (nq, heads * hd) that is summed into
//    dQ at the end. Five tile GEMMs per score tile (the minimum); extra memory one dQ-sized
//    buffer per worker thread plus one pass summing them. The summation order of dQ depends on
//    the scheduling (rounding-level differences between runs). When the partials would exceed
//    attention_tiling::partials_max_bytes (long sequences on many cores), two_pass runs instead.
//  - two_pass: the same key-major pass without dQ, then a query-major pass over (kv head, query
//    tile) that recomputes S, P, dP, dS and forms dQ locally. No dQ-sized buffer, deterministic,
//    but seven tile GEMMs per score tile instead of five (1.4x the backward matmul work).
// Measured with bench_kernels (T = 4096, hd = 64, 8/2 heads, 2 cores; docs/benchmarks.md):
// forward + backward is 1.2-1.35x faster with thread_partials than with two_pass (default and
// AVX-512 builds), for 17 MiB of peak scratch instead of 1 MiB, so it is the default.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "tightfit/backend/concept.hpp"
#include "tightfit/backend/detail/eigen_map.hpp"
#include "tightfit/core/memory.hpp"
#include "tightfit/core/parallel.hpp"
#include "tightfit/core/types.hpp"
#include "tightfit/core/view.hpp"

namespace tightfit {

/// How eigen_backend parallelises the attention backward (see backend/detail/eigen_attention.hpp).
enum class attention_backward_strategy {
  thread_partials,  ///< key-major tasks, dQ summed from per-thread partials (fastest)
  two_pass,         ///< key-major dK/dV pass + query-major dQ pass (deterministic, 1.4x work)
};

namespace detail {

/// Tile sizes of the flash attention kernels (query rows x key rows).
struct attention_tiling {
  index_t q = 64;
  index_t k = 128;
  attention_backward_strategy backward = attention_backward_strategy::thread_partials;
  /// thread_partials falls back to two_pass when the partials (workers x nq x heads x hd values)
  /// would take more bytes than this.
  std::size_t partials_max_bytes = std::size_t{256} << 20;
};

/// The validated arguments of one attention call.
template <class T>
struct attention_problem {
  attention_shape shape;
  matrix_view<const T> q;  // (nq, H*hd)
  matrix_view<const T> k;  // (nk, Hkv*hd)
  matrix_view<const T> v;  // (nk, Hkv*hd)
  attention_mask mask;
  T scale = T(1);

  index_t nq() const { return q.rows; }
  index_t nk() const { return k.rows; }
  index_t group() const { return shape.heads / shape.kv_heads; }
  /// The soft-capping cap of the scores (mask.softcap; used when > 0).
  T softcap() const { return static_cast<T>(mask.softcap); }
  /// Query row r attends keys [row_begin(r), row_end(r)); both non-decreasing in r.
  /// (K/V rows of this call: attention_mask::key_rows; empty in a key block it does not see.)
  index_t row_begin(index_t r) const { return mask.key_rows(mask.q0 + r, nk()).first; }
  index_t row_end(index_t r) const { return mask.key_rows(mask.q0 + r, nk()).second; }
  /// The first row in [lo, hi) whose interval starts at or after `key` (hi when none).
  index_t first_row_from(index_t lo, index_t hi, index_t key) const {
    while (lo < hi) {
      const index_t mid = lo + (hi - lo) / 2;
      if (row_begin(mid) >= key)
        hi = mid;
      else
        lo = mid + 1;
    }
    return lo;
  }
  /// The first row in [lo, hi) whose interval ends after `key` (hi when none).
  index_t first_row_past(index_t lo, index_t hi, index_t key) const {
    while (lo < hi) {
      const index_t mid = lo + (hi - lo) / 2;
      if (row_end(mid) > key)
        hi = mid;
      else
        lo = mid + 1;
    }
    return lo;
  }
  /// Stacked rows [first, first + sub) of the block of rows [r0, r0 + rows) that meet the key
  /// tile [c0, c0 + w).
  std::pair<index_t, index_t> stacked_rows(index_t r0, index_t rows, index_t c0, index_t w) const {
    const index_t a = first_row_past(r0, r0 + rows, c0);
    const index_t b = first_row_from(a, r0 + rows, c0 + w);
    return {(a - r0) * group(), (b - a) * group()};
  }
};

template <class T>
constexpr T minus_infinity() {
  return -std::numeric_limits<T>::infinity();
}

/// Copies columns [c0, c0 + width) of rows [r0, r0 + rows) of src into the contiguous dst
/// (rows, width): the stacked (rows * group, hd) layout when width = group * hd.
template <class T>
void gather_rows(matrix_view<const T> src, index_t r0, index_t rows, index_t c0, index_t width,
                 T* dst) {
  for (index_t r = 0; r < rows; ++r) std::copy_n(src.row(r0 + r) + c0, width, dst + r * width);
}

/// dst(r0 + r, c0 .. c0 + width) += factor * src row r (contiguous (rows, width)).
template <class T>
void scatter_add_rows(const T* src, index_t rows, index_t width, T factor, matrix_view<T> dst,
                      index_t r0, index_t c0) {
  for (index_t r = 0; r < rows; ++r) {
    eigen_array_map<T>(dst.row(r0 + r) + c0, width) +=
        factor * eigen_array_map<const T>(src + r * width, width);
  }
}

/// The keys [a, b) of a tile [c0, c0 + w) that query row r attends, relative to c0.
template <class T>
std::pair<index_t, index_t> tile_keys(const attention_problem<T>& pb, index_t r, index_t c0,
                                      index_t w) {
  return {std::clamp<index_t>(pb.row_begin(r) - c0, 0, w),
          std::clamp<index_t>(pb.row_end(r) - c0, 0, w)};
}

/// Forward over query rows [r0, r0 + rows) of the heads of kv head g. Writes O rows and lse;
/// returns the number of score elements computed.
template <class T>
std::int64_t attention_forward_block(const attention_problem<T>& pb, index_t g, index_t r0,
                                     index_t rows, index_t bk, T* scratch, matrix_view<T> o,
                                     matrix_view<T> lse) {
  const index_t hd = pb.shape.head_dim, group = pb.group(), stacked = rows * group;
  T* q_buf = scratch;                 // (stacked, hd)
  T* acc_buf = q_buf + stacked * hd;  // (stacked, hd)
  T* m = acc_buf + stacked * hd;      // (stacked) running max
  T* l = m + stacked;                 // (stacked) running sum
  T* s_buf = l + stacked;             // (stacked, bk) score tile
  gather_rows(pb.q, r0, rows, g * group * hd, group * hd, q_buf);
  const auto qs = as_eigen(static_cast<const T*>(q_buf), stacked, hd);
  auto acc = as_eigen(acc_buf, stacked, hd);
  acc.setZero();
  std::fill(m, m + stacked, minus_infinity<T>());
  std::fill(l, l + stacked, T(0));
  const index_t c_begin = pb.row_begin(r0), c_end = pb.row_end(r0 + rows - 1);
  std::int64_t elements = 0;
  for (index_t c0 = c_begin; c0 < c_end; c0 += bk) {
    const index_t w = std::min(bk, c_end - c0);
    // Only the stacked rows [first, first + sub) whose key interval meets this tile compute.
    const auto [first, sub] = pb.stacked_rows(r0, rows, c0, w);
    if (sub == 0) continue;
    const auto kt = as_eigen(pb.k, c0, g * hd, w, hd);  // (w, hd)
    const auto vt = as_eigen(pb.v, c0, g * hd, w, hd);  // (w, hd)
    auto s = as_eigen(s_buf, sub, w);                   // (sub, w)
    s.noalias() = qs.middleRows(first, sub) * kt.transpose();
    for (index_t i = 0; i < sub; ++i) {
      const index_t row = first + i;
      eigen_array_map<T> si(s_buf + i * w, w);
      si *= pb.scale;
      if (pb.mask.softcap > 0) si = pb.softcap() * (si / pb.softcap()).tanh();
      const auto [ka, kb] = tile_keys(pb, r0 + row / group, c0, w);
      if (ka > 0) si.head(ka).setConstant(minus_infinity<T>());
      if (kb < w) si.tail(w - kb).setConstant(minus_infinity<T>());
      const T m_new = std::max(m[row], si.maxCoeff());
      if (m_new == minus_infinity<T>()) {  // no key of this row in the tile (not reached)
        si.setZero();
        continue;
      }
      si = (si - m_new).exp();
      const T alpha = std::exp(m[row] - m_new);
      l[row] = l[row] * alpha + si.sum();
      if (alpha != T(1)) acc.row(row) *= alpha;
      m[row] = m_new;
    }
    acc.middleRows(first, sub).noalias() += s * vt;
    elements += sub * w;
  }
  for (index_t row = 0; row < stacked; ++row) {
    const index_t r = r0 + row / group, h = g * group + row % group;
    if (l[row] == T(0)) {  // no key in this key block (attention_mask::key_rows)
      as_eigen(o, r, h * hd, 1, hd).setZero();
      lse(r, h) = minus_infinity<T>();
      continue;
    }
    as_eigen(o, r, h * hd, 1, hd) = acc.row(row) * (T(1) / l[row]);
    lse(r, h) = m[row] + std::log(l[row]);
  }
  return elements;
}

/// Scratch elements of one forward task.
inline index_t attention_forward_scratch(index_t stacked, index_t hd, index_t bk) {
  return 2 * stacked * hd + 2 * stacked + stacked * bk;
}

/// Causal flash attention forward; returns the number of score elements computed.
template <class T>
std::int64_t attention_forward(const attention_problem<T>& pb, matrix_view<T> o, matrix_view<T> lse,
                               const attention_tiling& tiling, memory_counter& memory) {
  const index_t nq = pb.nq(), kvh = pb.shape.kv_heads, hd = pb.shape.head_dim;
  const index_t bq = tiling.q, bk = tiling.k, group = pb.group();
  const index_t tiles = (nq + bq - 1) / bq;
  std::atomic<std::int64_t> elements{0};
  parallel_for(0, tiles * kvh, 1, [&](index_t i0, index_t i1) {
    host_buffer<T> scratch(memory, attention_forward_scratch(bq * group, hd, bk));
    std::int64_t local = 0;
    for (index_t idx = i0; idx < i1; ++idx) {
      const index_t t = tiles - 1 - idx / kvh;  // longest rows (last tiles) first
      const index_t g = idx % kvh;
      const index_t r0 = t * bq;
      local +=
          attention_forward_block(pb, g, r0, std::min(bq, nq - r0), bk, scratch.data(), o, lse);
    }
    elements.fetch_add(local, std::memory_order_relaxed);
  });
  return elements.load();
}

/// D(r, h) = sum_c dO(r, h*hd + c) * O(r, h*hd + c), (nq, heads).
template <class T>
void attention_row_dot(matrix_view<const T> o, matrix_view<const T> d_o, index_t heads, index_t hd,
                       matrix_view<T> dsum) {
  for_each_row(o.rows, o.cols, [&](index_t r) {
    for (index_t h = 0; h < heads; ++h) {
      dsum(r, h) =
          (as_eigen(o, r, h * hd, 1, hd).array() * as_eigen(d_o, r, h * hd, 1, hd).array()).sum();
    }
  });
}

/// The stacked inputs of one backward block: Q, dO (stacked, hd), lse and D (stacked).
template <class T>
struct backward_rows {
  T* q;
  T* d_o;
  T* lse;
  T* dsum;
  void gather(const attention_problem<T>& pb, matrix_view<const T> d_o_all,
              matrix_view<const T> lse_all, matrix_view<const T> dsum_all, index_t g, index_t r0,
              index_t rows) const {
    const index_t hd = pb.shape.head_dim, group = pb.group();
    gather_rows(pb.q, r0, rows, g * group * hd, group * hd, q);
    gather_rows(d_o_all, r0, rows, g * group * hd, group * hd, d_o);
    gather_rows(lse_all, r0, rows, g * group, group, lse);
    gather_rows(dsum_all, r0, rows, g * group, group, dsum);
  }
};

/// Turns the score rows [first, first + sub) (stored from s_buf, width w) of a key tile at c0
/// into P = exp(scale s - lse) with the mask (the block's rows start at query row r0), then dP
/// (dp_buf) into dS = P * (dP - D).
template <class T>
void attention_tile_grad(const attention_problem<T>& pb, const backward_rows<T>& in, index_t r0,
                         index_t first, index_t sub, index_t c0, index_t w, T* p_buf, T* dp_buf) {
  const index_t group = pb.group();
  for (index_t i = 0; i < sub; ++i) {
    const index_t row = first + i;
    eigen_array_map<T> pi(p_buf + i * w, w);
    eigen_array_map<T> dpi(dp_buf + i * w, w);
    const auto [ka, kb] = tile_keys(pb, r0 + row / group, c0, w);
    if (pb.mask.softcap > 0) {
      // capped score c = cap tanh(scale s / cap); dS = P (dP - D) (1 - (c / cap)^2)
      const T cap = pb.softcap();
      pi = cap * (pi * pb.scale / cap).tanh();
      dpi = (dpi - in.dsum[row]) * (T(1) - (pi / cap).square());
      pi = (pi - in.lse[row]).exp();
      if (ka > 0) pi.head(ka).setZero();
      if (kb < w) pi.tail(w - kb).setZero();
      dpi *= pi;
      continue;
    }
    pi = (pi * pb.scale - in.lse[row]).exp();
    if (ka > 0) pi.head(ka).setZero();
    if (kb < w) pi.tail(w - kb).setZero();
    dpi = pi * (dpi - in.dsum[row]);
  }
}

/// Scratch elements of one backward task (either pass).
inline index_t attention_backward_scratch(index_t stacked, index_t hd, index_t bk) {
  return 3 * stacked * hd + 2 * stacked + 2 * stacked * bk + 2 * bk * hd;
}

/// Backward over key rows [c0, c0 + w) of kv head g: dK, dV of these rows (+=) and, when dq_part
/// is not empty, scale * dS K into dq_part. Returns the score elements computed.
template <class T>
std::int64_t attention_backward_key_block(const attention_problem<T>& pb, index_t g, index_t c0,
                                          index_t w, index_t bq, matrix_view<const T> d_o,
                                          matrix_view<const T> lse, matrix_view<const T> dsum,
                                          T* scratch, matrix_view<T> dq_part, matrix_view<T> dk,
                                          matrix_view<T> dv) {
  const index_t hd = pb.shape.head_dim, nq = pb.nq(), group = pb.group(), max_stacked = bq * group;
  backward_rows<T> in{scratch, scratch + max_stacked * hd, scratch + 2 * max_stacked * hd,
                      scratch + 2 * max_stacked * hd + max_stacked};
  T* dq_buf = in.dsum + max_stacked;                  // (stacked, hd)
  T* p_buf = dq_buf + max_stacked * hd;               // (stacked, w)
  T* dp_buf = p_buf + max_stacked * w;                // (stacked, w)
  T* dk_buf = dp_buf + max_stacked * w;               // (w, hd)
  T* dv_buf = dk_buf + w * hd;                        // (w, hd)
  const auto kt = as_eigen(pb.k, c0, g * hd, w, hd);  // (w, hd)
  const auto vt = as_eigen(pb.v, c0, g * hd, w, hd);  // (w, hd)
  auto dk_acc = as_eigen(dk_buf, w, hd);
  auto dv_acc = as_eigen(dv_buf, w, hd);
  dk_acc.setZero();
  dv_acc.setZero();
  // The query rows whose key interval meets [c0, c0 + w): one interval [r_start, r_stop).
  const index_t r_start = pb.first_row_past(0, nq, c0);
  const index_t r_stop = pb.first_row_from(r_start, nq, c0 + w);
  std::int64_t elements = 0;
  for (index_t r0 = r_start; r0 < r_stop; r0 += bq) {
    const index_t rows = std::min(bq, r_stop - r0), stacked = rows * group;
    in.gather(pb, d_o, lse, dsum, g, r0, rows);
    const auto qs = as_eigen(static_cast<const T*>(in.q), stacked, hd);
    const auto dos = as_eigen(static_cast<const T*>(in.d_o), stacked, hd);
    auto p = as_eigen(p_buf, stacked, w);
    auto dp = as_eigen(dp_buf, stacked, w);
    p.noalias() = qs * kt.transpose();
    dp.noalias() = dos * vt.transpose();
    attention_tile_grad(pb, in, r0, 0, stacked, c0, w, p_buf, dp_buf);  // dp := dS
    dv_acc.noalias() += p.transpose() * dos;
    dk_acc.noalias() += dp.transpose() * qs;
    if (!dq_part.empty()) {
      auto dqs = as_eigen(dq_buf, stacked, hd);
      dqs.noalias() = dp * kt;
      scatter_add_rows(static_cast<const T*>(dq_buf), rows, group * hd, pb.scale, dq_part, r0,
                       g * group * hd);
    }
    elements += stacked * w;
  }
  as_eigen(dk, c0, g * hd, w, hd) += pb.scale * dk_acc;
  as_eigen(dv, c0, g * hd, w, hd) += dv_acc;
  return elements;
}

/// dQ of query rows [r0, r0 + rows) of the heads of kv head g, recomputing S, P, dP, dS tile by
/// tile (two_pass). Returns the score elements computed.
template <class T>
std::int64_t attention_backward_query_block(const attention_problem<T>& pb, index_t g, index_t r0,
                                            index_t rows, index_t bk, matrix_view<const T> d_o,
                                            matrix_view<const T> lse, matrix_view<const T> dsum,
                                            T* scratch, matrix_view<T> dq) {
  const index_t hd = pb.shape.head_dim, group = pb.group(), stacked = rows * group;
  backward_rows<T> in{scratch, scratch + stacked * hd, scratch + 2 * stacked * hd,
                      scratch + 2 * stacked * hd + stacked};
  T* dq_buf = in.dsum + stacked;     // (stacked, hd)
  T* p_buf = dq_buf + stacked * hd;  // (stacked, bk)
  T* dp_buf = p_buf + stacked * bk;  // (stacked, bk)
  in.gather(pb, d_o, lse, dsum, g, r0, rows);
  const auto qs = as_eigen(static_cast<const T*>(in.q), stacked, hd);
  const auto dos = as_eigen(static_cast<const T*>(in.d_o), stacked, hd);
  auto dq_acc = as_eigen(dq_buf, stacked, hd);
  dq_acc.setZero();
  const index_t c_begin = pb.row_begin(r0), c_end = pb.row_end(r0 + rows - 1);
  std::int64_t elements = 0;
  for (index_t c0 = c_begin; c0 < c_end; c0 += bk) {
    const index_t w = std::min(bk, c_end - c0);
    const auto [first, sub] = pb.stacked_rows(r0, rows, c0, w);
    if (sub == 0) continue;
    const auto kt = as_eigen(pb.k, c0, g * hd, w, hd);
    const auto vt = as_eigen(pb.v, c0, g * hd, w, hd);
    auto p = as_eigen(p_buf, sub, w);
    auto dp = as_eigen(dp_buf, sub, w);
    p.noalias() = qs.middleRows(first, sub) * kt.transpose();
    dp.noalias() = dos.middleRows(first, sub) * vt.transpose();
    attention_tile_grad(pb, in, r0, first, sub, c0, w, p_buf, dp_buf);
    dq_acc.middleRows(first, sub).noalias() += dp * kt;
    elements += sub * w;
  }
  scatter_add_rows(static_cast<const T*>(dq_buf), rows, group * hd, pb.scale, dq, r0,
                   g * group * hd);
  return elements;
}

/// Score elements computed by each pass of the backward.
struct attention_backward_work {
  std::int64_t key_major_elements = 0;    // 5 tile GEMMs per element (4 without dQ)
  std::int64_t query_major_elements = 0;  // 3 tile GEMMs per element (two_pass only)
};

/// Causal flash attention backward (see the top comment for the two strategies).
template <class T>
attention_backward_work attention_backward(const attention_problem<T>& pb, matrix_view<const T> o,
                                           matrix_view<const T> d_o, matrix_view<const T> lse,
                                           matrix_view<T> dq, matrix_view<T> dk, matrix_view<T> dv,
                                           const attention_tiling& tiling, memory_counter& memory) {
  const index_t nq = pb.nq(), heads = pb.shape.heads, kvh = pb.shape.kv_heads;
  const index_t hd = pb.shape.head_dim, group = pb.group();
  const index_t bq = tiling.q, bk = tiling.k;
  attention_backward_work work;
  if (nq == 0) return work;

  host_buffer<T> dsum_buf(memory, nq * heads);  // (nq, heads)
  const matrix_view<T> dsum = dsum_buf.view(nq, heads);
  attention_row_dot(o, d_o, heads, hd, dsum);
  const matrix_view<const T> dsum_c = dsum;
  const index_t scratch_size = attention_backward_scratch(bq * group, hd, bk);

  // Keys [key_begin, key_end) that some query row attends (one interval).
  const index_t key_begin = pb.row_begin(0), key_end = pb.row_end(nq - 1);
  const index_t key_tiles = (key_end - key_begin + bk - 1) / bk;
  const auto partial_bytes = static_cast<std::size_t>(concurrency()) *
                             static_cast<std::size_t>(nq * heads * hd) * sizeof(T);
  const bool partials = tiling.backward == attention_backward_strategy::thread_partials &&
                        (concurrency() <= 1 || partial_bytes <= tiling.partials_max_bytes);
  std::atomic<std::int64_t> key_elements{0};

  auto key_pass = [&](auto&& dq_target) {
    parallel_for(0, key_tiles * kvh, 1, [&](index_t i0, index_t i1) {
      host_buffer<T> scratch(memory, scratch_size);
      std::int64_t local = 0;
      for (index_t idx = i0; idx < i1; ++idx) {
        const index_t kt = idx / kvh;  // first key tiles carry the most rows: first
        const index_t g = idx % kvh;
        const index_t c0 = key_begin + kt * bk;
        local += attention_backward_key_block(pb, g, c0, std::min(bk, key_end - c0), bq, d_o, lse,
                                              dsum_c, scratch.data(), dq_target(), dk, dv);
      }
      key_elements.fetch_add(local, std::memory_order_relaxed);
    });
  };

  if (!partials) {
    key_pass([] { return matrix_view<T>{}; });
    const index_t q_tiles = (nq + bq - 1) / bq;
    std::atomic<std::int64_t> query_elements{0};
    parallel_for(0, q_tiles * kvh, 1, [&](index_t i0, index_t i1) {
      host_buffer<T> scratch(memory, scratch_size);
      std::int64_t local = 0;
      for (index_t idx = i0; idx < i1; ++idx) {
        const index_t t = q_tiles - 1 - idx / kvh;
        const index_t g = idx % kvh;
        const index_t r0 = t * bq;
        local += attention_backward_query_block(pb, g, r0, std::min(bq, nq - r0), bk, d_o, lse,
                                                dsum_c, scratch.data(), dq);
      }
      query_elements.fetch_add(local, std::memory_order_relaxed);
    });
    work.query_major_elements = query_elements.load();
  } else if (concurrency() <= 1) {  // one worker: add into dQ directly
    key_pass([&] { return dq; });
  } else {
    // One dQ partial per worker thread that takes part, created on its first task.
    per_worker<host_buffer<T>> parts([&] { return host_buffer<T>(memory, nq * heads * hd); });
    key_pass([&] { return parts.local().view(nq, heads * hd); });
    std::vector<const T*> part_data;
    parts.for_each([&](host_buffer<T>& part) { part_data.push_back(part.data()); });
    for_each_row(nq, heads * hd, [&](index_t r) {
      auto target = row_array(dq, r);
      for (const T* part : part_data) {
        target += eigen_array_map<const T>(part + r * heads * hd, heads * hd);
      }
    });
  }
  work.key_major_elements = key_elements.load();
  return work;
}

}  // namespace detail
}  // namespace tightfit
