// tightfit/backend/concept.hpp: the backend concepts, the seam between algorithms and kernels.
//
// A backend is a stateful object passed by reference: it owns storage (allocations counted by
// its memory_counter), kernel statistics, thread pools or device handles. The concept comes in
// parts, and each algorithm asks only for the part it uses:
//   StorageBackend      allocate (a Buffer), upload / download, memory(), stats()
//   DenseBackend        + gemm, gemm_batched, axpy, scale, fill, copy
//   TransformerBackend  + embedding, RMSNorm, RoPE, SwiGLU, attention, cross-entropy
//   GemmaBackend        TransformerBackend + GELU-tanh GLU, logit soft-capping (Gemma 2 / 3)
//   OptimizerBackend    DenseBackend + adam_update, sgd_update
//   Backend             TransformerBackend and OptimizerBackend (the whole set)
// Tensors are stored as storage_t<B> (B::storage_type, defaulting to B::value_type); scalars,
// accumulations and the per-row statistics a backward reads back (RMSNorm's rstd, attention's
// lse, the cross-entropy's lse, label log-probs and coefficients) are accum_t<B> (B::value_type,
// a floating type): a bf16 backend keeps them in fp32. The kernel set is small and
// explicit; every kernel checks the shapes of its arguments and throws tightfit::error naming
// them.
//
// Conventions shared by all kernels (see docs/concepts.md for the full contract):
//  - Matrices are row-major matrix_view<T> with a row stride; vectors are std::span<T>.
//  - Backward kernels ACCUMULATE (+=) into every gradient output (llm.c style): the caller
//    zeroes a gradient buffer once and several contributions add up. An empty span or view
//    for a parameter gradient (dw, dweight) means "not needed": that work is skipped.
//  - In-place kernels (rope_forward/backward, xent_backward) say so.
//  - Attention works on one sequence and takes an attention_mask: rows of Q are absolute
//    positions [q0, q0 + Q.rows), rows of K/V are positions [0, K.rows). Query at position p
//    attends keys j in [first_key(p), p] with j < K.rows and j < valid_len (right padding);
//    first_key adds a sliding window and document boundaries (packed sequences). GQA: query
//    head h reads kv head h / (heads / kv_heads). lse is (Q.rows, heads):
//    log sum_j exp(s_j), s_j = scale * q.k_j, or cap tanh(s_j / cap) with mask.softcap = cap.
//  - RoPE takes rope_args: positions (pos0 + i, or one per row for packed sequences), the
//    inverse frequencies (nn/rope.hpp computes Hugging Face's scaled ones) and the yarn
//    attention scaling of cos and sin.
//  - Cross-entropy rows with label == ignore_index give logprob 0 and a zero gradient row.
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <limits>
#include <span>
#include <utility>

#include "tightfit/core/memory.hpp"
#include "tightfit/core/types.hpp"
#include "tightfit/core/view.hpp"

namespace tightfit {

/// Counts of work done by a backend (tests use them to prove work was skipped; benches to
/// compute GFLOP/s). Plain counters: a backend updates them from the calling thread.
struct kernel_stats {
  std::int64_t gemm_calls = 0;
  double gemm_flops = 0;  ///< 2*m*n*k summed over gemm calls (batched: times batch)
  std::int64_t attention_forward_calls = 0;
  std::int64_t attention_backward_calls = 0;
  double attention_flops = 0;  ///< matmul flops of computed (unmasked) score tiles
  void reset() { *this = kernel_stats{}; }
};

/// Shape of a (grouped-query) attention call. heads % kv_heads == 0.
struct attention_shape {
  index_t heads = 1;
  index_t kv_heads = 1;
  index_t head_dim = 1;
};

/// Which keys each query row of an attention call sees. Q row i is position q0 + i; K/V row j is
/// position k0 + j. The call covers keys [0, nk) with nk = key_end, or k0 + K.rows when key_end
/// is 0. Query p attends keys j in [first_key(p), min(p, valid_len - 1)] with j < nk. A query
/// row with no such key (a padded row past its window or document, or p >= nk beyond it)
/// attends the last key it may see, min(p, valid_len - 1, nk - 1), so that every row of the
/// whole call is well defined. A call with k0 > 0 or key_end > k0 + K.rows is one key block of
/// the whole call (sequence parallelism): it sees the keys of the whole call's rule inside
/// [k0, k0 + K.rows), and a row with none there gets O = 0 and lse = -inf (it contributes
/// nothing to merge_attention_blocks). first_key is non-decreasing in p, so a tile of queries
/// [a, b) needs keys [first_key(a), b) only: the kernels skip every tile outside.
struct attention_mask {
  index_t q0 = 0;
  index_t valid_len = 0;  ///< keys j >= valid_len are right padding (may exceed K.rows)
  index_t window = 0;  ///< 0: none; W > 0: query p sees keys j with p - j < W (HF sliding_window)
  /// Empty: one document. Else at least q0 + Q.rows entries: doc_start[p] is the first position
  /// of p's document (non-decreasing, doc_start[p] <= p); query p sees no key before it.
  std::span<const index_t> doc_start{};
  /// Not a mask but the score transform of the same call (Gemma 2's attn_logit_softcapping):
  /// 0: none; cap > 0: scores s = scale q.k become cap tanh(s / cap) before the softmax, and
  /// lse is over the capped scores.
  double softcap = 0;
  index_t k0 = 0;       ///< position of K/V row 0 (a key block of a longer call)
  index_t key_end = 0;  ///< 0: k0 + K.rows; else the key count nk of the whole call

  /// max(0, p - W + 1, doc_start[p]): the first key query p may see.
  index_t first_key(index_t p) const {
    index_t f = window > 0 ? std::max<index_t>(0, p - window + 1) : 0;
    if (!doc_start.empty()) f = std::max(f, doc_start[static_cast<std::size_t>(p)]);
    return f;
  }
  /// The last key query p sees among nk keys: min(p, valid_len - 1, nk - 1).
  index_t last_key(index_t p, index_t nk) const { return std::min({p, valid_len - 1, nk - 1}); }
  /// The first key query p sees among nk keys: first_key(p), or last_key when the window or
  /// document leaves p no key (padded rows). Non-decreasing in p, like last_key.
  index_t begin_key(index_t p, index_t nk) const { return std::min(first_key(p), last_key(p, nk)); }
  /// Whether any query sees fewer keys than plain causal attention would give it.
  bool restricted() const { return window > 0 || !doc_start.empty(); }
  /// The key count of the whole call given this call's nk K/V rows.
  index_t keys_of(index_t nk) const { return key_end > 0 ? key_end : k0 + nk; }
  /// Whether this call is one key block of a longer call (rows may see no key: lse = -inf).
  bool is_block(index_t nk) const { return k0 > 0 || keys_of(nk) > k0 + nk; }
  /// The K/V rows [lo, hi) (local, 0 <= lo <= hi <= nk) query p attends among this call's nk
  /// rows: the whole call's keys of p inside [k0, k0 + nk). Both bounds non-decreasing in p.
  std::pair<index_t, index_t> key_rows(index_t p, index_t nk) const {
    const index_t all = keys_of(nk);
    const index_t first = begin_key(p, all), stop = last_key(p, all) + 1;  // positions
    return {std::clamp(first, k0, k0 + nk) - k0, std::clamp(stop, k0, k0 + nk) - k0};
  }
};

/// Merges the partial attention of one key block into a running result (sequence parallelism:
/// the keys of a call split into disjoint blocks, each attended separately, log-sum-exp merged):
/// for each row i and head h, with l = lse(i, h) and lb = lse_b(i, h),
///   lse' = log(exp(l) + exp(lb)), O' = exp(l - lse') O + exp(lb - lse') O_b.
/// A side with lse = -inf (no key in its blocks) contributes nothing; both -inf stays -inf, O 0.
/// o, o_b (n, heads*hd) of one type, lse, lse_b (n, heads) of one (the statistics' type); o and
/// lse are updated in place.
template <class T, class L>
void merge_attention_blocks(index_t heads, index_t hd, matrix_view<T> o, matrix_view<L> lse,
                            matrix_view<const T> o_b, matrix_view<const L> lse_b) {
  for (index_t i = 0; i < o.rows; ++i)
    for (index_t h = 0; h < heads; ++h) {
      const double l = static_cast<double>(lse(i, h)), lb = static_cast<double>(lse_b(i, h));
      constexpr double none = -std::numeric_limits<double>::infinity();
      if (lb == none) continue;
      T* oi = o.row(i) + h * hd;
      const T* bi = o_b.row(i) + h * hd;
      if (l == none) {  // the running result has no key yet: take the block's
        std::copy_n(bi, hd, oi);
        lse(i, h) = lse_b(i, h);
        continue;
      }
      const double m = std::max(l, lb);
      const double ea = std::exp(l - m), eb = std::exp(lb - m), sum = ea + eb;
      const double wa = ea / sum, wb = eb / sum;
      for (index_t c = 0; c < hd; ++c)
        oi[c] = static_cast<T>(wa * static_cast<double>(oi[c]) + wb * static_cast<double>(bi[c]));
      lse(i, h) = static_cast<L>(m + std::log(sum));
    }
}

/// merge_attention_blocks through a backend: its own attention_merge when it has one (memory
/// the host cannot read: cuda_backend; meta_backend does nothing), the host function otherwise.
template <class B, class T, class L>
void attention_merge(B& be, index_t heads, index_t hd, matrix_view<T> o, matrix_view<L> lse,
                     matrix_view<const T> o_b, matrix_view<const L> lse_b) {
  if constexpr (requires { be.attention_merge(heads, hd, o, lse, o_b, lse_b); })
    be.attention_merge(heads, hd, o, lse, o_b, lse_b);
  else
    merge_attention_blocks(heads, hd, o, lse, o_b, lse_b);
}

/// Where RoPE rotates each row: row i of x is at position pos0 + i, or positions[i] (packed
/// sequences: positions restart at each document). Frequency k < head_dim / 2 is inv_freq[k], or
/// theta^(-2k / head_dim) when inv_freq is empty; cos and sin are multiplied by
/// attention_scaling (yarn; 1 otherwise).
struct rope_args {
  index_t pos0 = 0;
  std::span<const index_t> positions{};  ///< empty: row i at pos0 + i; else x.rows entries (pos0 0)
  std::span<const double> inv_freq{};    ///< head_dim / 2 entries; empty: from theta
  double theta = 10000;                  ///< used when inv_freq is empty
  double attention_scaling = 1;          ///< yarn's factor on cos and sin

  index_t position(index_t i) const {
    return positions.empty() ? pos0 + i : positions[static_cast<std::size_t>(i)];
  }
  /// inv_freq[k], or theta^(-2k / head_dim).
  double frequency(index_t k, index_t head_dim) const {
    return inv_freq.empty()
               ? std::pow(theta, -2.0 * static_cast<double>(k) / static_cast<double>(head_dim))
               : inv_freq[static_cast<std::size_t>(k)];
  }
};

/// Hyper-parameters of one Adam / AdamW step. `step` is 1 for the first update.
template <class T>
struct adam_hyper {
  T lr = T(1e-3);
  T beta1 = T(0.9);
  T beta2 = T(0.999);
  T eps = T(1e-8);
  T weight_decay = T(0);
  bool decoupled = true;  ///< true: AdamW (p -= lr*wd*p); false: L2 added to the gradient
  std::int64_t step = 1;
};

/// Hyper-parameters of one SGD step (optional momentum, weight decay, sign of the gradient).
template <class T>
struct sgd_hyper {
  T lr = T(1e-2);
  T momentum = T(0);
  T weight_decay = T(0);
  bool use_sign = false;  ///< update with sign(g) (signSGD) instead of g
};

/// The element type a backend stores tensors in: B::storage_type when it declares one (a bf16
/// or half backend), else B::value_type.
template <class B>
struct backend_storage {
  using type = typename B::value_type;
};
template <class B>
requires requires {
  typename B::storage_type;
}
struct backend_storage<B> {
  using type = typename B::storage_type;
};
template <class B>
using storage_t = typename backend_storage<B>::type;
/// The type a backend accumulates and takes its scalars in (alpha, beta, eps, hyper-parameters):
/// B::value_type. For the shipped backends storage_t<B> == accum_t<B>.
template <class B>
using accum_t = typename B::value_type;

/// What the algorithms do with an allocation: default-construct it (empty), move it, see it as a
/// span or a (rows, cols) matrix, free it early with reset(). Every buffer is counted by the
/// memory_counter of the backend that allocated it.
template <class Buf, class U>
concept Buffer = std::default_initializable<Buf> && std::movable<Buf> &&
    requires(Buf& b, const Buf& cb, index_t n) {
  { cb.data() } -> std::same_as<U*>;
  { cb.size() } -> std::same_as<index_t>;
  { cb.empty() } -> std::convertible_to<bool>;
  { cb.span() } -> std::same_as<std::span<U>>;
  { cb.view(n, n) } -> std::same_as<matrix_view<U>>;
  b.reset();
};

// clang-format off
/// Storage: counted allocations of storage_t<B> and host transfers. Enough for parameter sets,
/// optimizer state buffers and the memory planner's bookkeeping.
template <class B>
concept StorageBackend = requires { typename B::value_type; } &&
    std::floating_point<accum_t<B>> &&
    requires(B& be, index_t n, std::span<const storage_t<B>> cs, std::span<storage_t<B>> s) {
  { be.memory() } -> std::same_as<memory_counter&>;
  { be.stats() } -> std::same_as<kernel_stats&>;
  { be.template allocate<storage_t<B>>(n) } -> Buffer<storage_t<B>>;
  be.upload(cs, s);    // host -> backend memory
  be.download(cs, s);  // backend memory -> host
};

/// The buffer type a backend allocates for its storage type.
template <StorageBackend B>
using buffer_t = decltype(std::declval<B&>().template allocate<storage_t<B>>(0));
/// The buffer type of its statistics (accum_t: rstd, lse, log-probs); buffer_t when the two
/// types agree (every CPU backend).
template <StorageBackend B>
using accum_buffer_t = decltype(std::declval<B&>().template allocate<accum_t<B>>(0));

/// Dense linear algebra over backend memory.
template <class B>
concept DenseBackend = StorageBackend<B> &&
    requires(B& be, accum_t<B> a,
             matrix_view<storage_t<B>> m, matrix_view<const storage_t<B>> cm,
             tensor3_view<storage_t<B>> t3, tensor3_view<const storage_t<B>> ct3) {
  be.gemm(transpose::no, transpose::no, a, cm, cm, a, m);  // C = alpha op(A) op(B) + beta C
  be.gemm_batched(transpose::no, transpose::no, a, ct3, ct3, a, t3);
  be.axpy(a, cm, m);   // y += alpha x
  be.scale(a, m);      // x *= alpha
  be.fill(m, a);       // x = value
  be.copy(cm, m);      // y = x
};

/// The kernels of a Llama / Qwen decoder and its LM head (what nn/ and stream/ call). The
/// statistics (rstd, lse, log-probs, coefficients: as, am) are accum_t.
template <class B>
concept TransformerBackend = DenseBackend<B> &&
    requires(B& be, index_t n, accum_t<B> a,
             matrix_view<storage_t<B>> m, matrix_view<const storage_t<B>> cm,
             std::span<storage_t<B>> s, std::span<const storage_t<B>> cs,
             matrix_view<accum_t<B>> am, matrix_view<const accum_t<B>> cam,
             std::span<accum_t<B>> as, std::span<const accum_t<B>> cas,
             std::span<const token_id> ids, attention_shape shape, const rope_args& rope,
             const attention_mask& mask) {
  { be.template allocate<accum_t<B>>(n) } -> Buffer<accum_t<B>>;
  // token embedding: out rows = table rows ids; backward accumulates rows into dtable
  be.embedding_forward(cm, ids, m);
  be.embedding_backward(cm, ids, m);
  // RMSNorm over rows: y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps)
  be.rmsnorm_forward(cm, cs, a, m, as);
  be.rmsnorm_backward(cm, cs, cas, cm, m, s);  // x, w, rstd, dy, dx +=, dw += (empty: skip)
  // RoPE (HF rotate-half) in place on (rows, heads * head_dim) at the positions of rope_args
  be.rope_forward(m, n, n, rope);
  be.rope_backward(m, n, n, rope);
  // SwiGLU: out = silu(gate) * up
  be.swiglu_forward(cm, cm, m);
  be.swiglu_backward(cm, cm, cm, m, m);  // gate, up, dout, dgate +=, dup +=
  // causal flash attention of Q rows [q0, q0+rows) against keys [0, K.rows) under a mask
  be.attention_forward(shape, cm, cm, cm, mask, a, m, am);  // Q K V mask scale -> O lse
  be.attention_backward(shape, cm, cm, cm, cm, cm, cam, mask, a, m, m, m);  // Q K V O dO lse mask scale dQ+= dK+= dV+=
  // softmax cross-entropy over a logits chunk (rows, vocab) at temperature tau
  be.xent_forward(cm, ids, a, as, as);      // logits labels tau -> lse, label logprob
  be.xent_backward(m, ids, cas, cas, a);    // logits -> dlogits in place; lse, coeff, tau
};

/// The kernels the Gemma 2 / Gemma 3 decoder (nn/gemma_layer.hpp) needs beyond
/// TransformerBackend: the GELU-tanh gated MLP and the final logits' soft-capping. Attention
/// soft-capping is attention_mask::softcap, honoured by every shipped backend's attention.
template <class B>
concept GemmaBackend = TransformerBackend<B> &&
    requires(B& be, accum_t<B> a, matrix_view<storage_t<B>> m,
             matrix_view<const storage_t<B>> cm) {
  // GeGLU: out = gelu_tanh(gate) * up (PyTorch's gelu(approximate="tanh"))
  be.geglu_forward(cm, cm, m);
  be.geglu_backward(cm, cm, cm, m, m);  // gate, up, dout, dgate +=, dup +=
  // in place: x = cap tanh(x / cap); backward: dx *= 1 - (capped / cap)^2 given capped
  be.logit_softcap_forward(m, a);
  be.logit_softcap_backward(cm, m, a);
};

/// The optimizer updates over flat spans/// The optimizer updates over flat spans (what optim/ calls), plus the dense kernels that
/// clipping and zeroing use.
template <class B>
concept OptimizerBackend = DenseBackend<B> &&
    requires(B& be, std::span<storage_t<B>> s, std::span<const storage_t<B>> cs,
             const adam_hyper<accum_t<B>>& ah, const sgd_hyper<accum_t<B>>& sh) {
  be.adam_update(s, cs, s, s, ah);          // param, grad, m, v
  be.sgd_update(s, cs, s, sh);              // param, grad, momentum buffer (empty if none)
};

/// A tensor backend with the whole kernel set: gradients and optimizer updates.
template <class B>
concept Backend = TransformerBackend<B> && OptimizerBackend<B>;
// clang-format on

}  // namespace tightfit
