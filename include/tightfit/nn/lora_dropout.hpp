// tightfit/nn/lora_dropout.hpp: LoRA dropout (PEFT's lora_dropout; dropout: Srivastava et al.,
// JMLR 2014; LoRA: Hu et al., arXiv 2106.09685) with a mask that is a pure function of global
// coordinates. In a training pass each adapted projection computes (nn/adapters.hpp)
//     y = x W^T + s (x_d A^T) B^T,   x_d = x o m / (1 - p)
// where m (n, in) in {0, 1} keeps each element with probability 1 - p; the base path x W^T never
// drops. Its backward, for the same m: dA += s (dy B)^T x_d, dB += s dy^T (x_d A^T),
// dx += s ((dy B) A) o m / (1 - p).
//
// The mask: element j of the input row of sequence b at position t (global positions, also over
// a sequence shard) of layer l's projection k is kept iff
//     splitmix64_at(splitmix64_key(seed, {draw, l, k, first_row + b, t}), j) >= floor(p 2^64)
// (core/splitmix.hpp): first_row is the run's index of the batch's row 0
// (sequence_batch::first_row; train() sets it, optim/train.hpp), so a row is named by the data
// row it is in the run, and draw is the pass's key (lora_optimizer: its step count). No generator
// state: every backward schedule (full, checkpoint, stream, any chunk), every recomputation and
// every sequence shard sees one mask in forward and backward, and a step split into micro-batches
// draws the masks of the one batch of all its rows. PEFT draws a fresh mask on every training
// forward; here a step's forward and its recomputations share one (they are one forward).
//
// Invariants: outside a training pass (forward-only evaluation, log-probs) and with p = 0 the
// adapters run as without dropout (no hashing, no buffer). Backends: the mask is applied through
// host transfers (download, mask, upload), a block of at most lora_dropout_block elements at a
// time, so every StorageBackend runs it (a device backend pays the transfers); on a dry-run
// backend (B::dry_run, backend/meta.hpp) nothing is computed, only the buffers are counted.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include "tightfit/backend/concept.hpp"
#include "tightfit/core/error.hpp"
#include "tightfit/core/splitmix.hpp"
#include "tightfit/core/view.hpp"

namespace tightfit {

/// The dropout of a set of adapters (lora_adapters owns it; the layers' bindings point to it).
struct lora_dropout {
  double p = 0;            ///< probability of zeroing an element of the adapter's input, [0, 1)
  std::uint64_t seed = 0;  ///< the masks' seed
  std::uint64_t draw = 0;  ///< the pass's key (lora_optimizer: its step count)
  bool training = false;   ///< masks only in a training pass
  bool active() const { return training && p > 0; }
};

/// The tokens the rows of an adapter's input are: every sequence b of the batch at global
/// positions [c0, c1), row i = b (c1 - c0) + (t - c0); sequence b is the run's row first_row + b.
/// Unknown (c1 <= c0): a layer that does not say (then dropout is an error).
struct lora_rows {
  std::int64_t first_row = 0;  ///< sequence_batch::first_row
  index_t c0 = 0, c1 = 0;      ///< global positions
  bool known() const { return c1 > c0; }
};

/// Elements the host holds at a time while it applies a mask.
inline constexpr index_t lora_dropout_block = 1 << 16;

/// floor(p 2^64) for p in [0, 1) (exact: p 2^64 is a double below 2^64): an element whose draw is
/// below it is dropped, so each is kept with probability 1 - floor(p 2^64) / 2^64.
inline std::uint64_t lora_dropout_threshold(double p) {
  check(p >= 0 && p < 1, "LoRA dropout is ", p, ", expected in [0, 1)");
  return static_cast<std::uint64_t>(std::ldexp(p, 64));
}

/// The key of one input row's mask: layer l, projection k, the run's row `row`, position t.
inline std::uint64_t lora_mask_row_key(const lora_dropout& d, index_t layer, int projection,
                                       std::int64_t row, index_t position) {
  return splitmix64_key(
      d.seed, {d.draw, static_cast<std::uint64_t>(layer), static_cast<std::uint64_t>(projection),
               static_cast<std::uint64_t>(row), static_cast<std::uint64_t>(position)});
}

/// Whether element j of the row keyed `row_key` is kept (threshold: lora_dropout_threshold).
inline bool lora_mask_keeps(std::uint64_t row_key, index_t j, std::uint64_t threshold) {
  return splitmix64_at(row_key, static_cast<std::uint64_t>(j)) >= threshold;
}

namespace detail {

/// x / (1 - p) as the mask scales a kept element: x * (1 / (1 - p)) in T (a floating type), or
/// through float for a storage type without arithmetic (bf16).
template <class T>
T dropout_scaled(T x, double keep_scale) {
  if constexpr (std::is_floating_point_v<T>)
    return static_cast<T>(x * static_cast<T>(keep_scale));
  else
    return static_cast<T>(static_cast<float>(x) * static_cast<float>(keep_scale));
}

}  // namespace detail

/// dst (n, cols) = src (n, cols) o m / (1 - p) with the mask of `layer`'s projection
/// `projection` over `rows` (n = B (c1 - c0)); both views contiguous (buffers), src and dst may
/// be the same. Errors name unknown rows, mismatched extents or a strided view.
template <StorageBackend B>
void apply_lora_dropout(B& be, const lora_dropout& d, index_t layer, int projection,
                        const lora_rows& rows, matrix_view<const storage_t<B>> src,
                        matrix_view<storage_t<B>> dst) {
  using T = storage_t<B>;
  check(rows.known(),
        "LoRA dropout: the layer did not say which tokens the adapter's rows are "
        "(lora_forward / lora_backward need its lora_rows)");
  const index_t n = src.rows, cols = src.cols, c = rows.c1 - rows.c0;
  check(n % c == 0 && dst.rows == n && dst.cols == cols, "LoRA dropout: input (", n, ", ", cols,
        "), output (", dst.rows, ", ", dst.cols, ") for rows of ", c, " positions");
  check(src.contiguous() && dst.contiguous(), "LoRA dropout: the input (stride ", src.stride,
        ") and the output (stride ", dst.stride, ") must be contiguous, ", cols, " columns");
  const std::uint64_t threshold = lora_dropout_threshold(d.p);
  if (n == 0 || cols == 0) return;
  if constexpr (requires { B::dry_run; }) {
    (void)be;  // a dry run: nothing to compute, the buffers are counted
  } else {
    const double keep_scale = 1.0 / (1.0 - d.p);
    const auto width = static_cast<std::size_t>(cols);
    const index_t block = std::clamp<index_t>(lora_dropout_block / cols, 1, n);
    std::vector<T> h(static_cast<std::size_t>(block) * width);  // (block, cols) on the host
    for (index_t i0 = 0; i0 < n; i0 += block) {
      const index_t m = std::min(block, n - i0);
      const std::span<T> part = std::span<T>(h).first(static_cast<std::size_t>(m) * width);
      be.download(std::span<const T>(src.row(i0), part.size()), part);
      for (index_t i = 0; i < m; ++i) {
        const index_t row = i0 + i;
        const std::uint64_t key =
            lora_mask_row_key(d, layer, projection, rows.first_row + row / c, rows.c0 + row % c);
        T* x = part.data() + static_cast<std::size_t>(i) * width;
        for (index_t j = 0; j < cols; ++j)
          x[j] = lora_mask_keeps(key, j, threshold) ? detail::dropout_scaled(x[j], keep_scale)
                                                    : static_cast<T>(0.0f);
      }
      be.upload(std::span<const T>(part), std::span<T>(dst.row(i0), part.size()));
    }
  }
}

}  // namespace tightfit
