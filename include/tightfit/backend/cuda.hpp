// tightfit/backend/cuda.hpp: the CUDA backend: cuBLAS GEMMs, flash attention and fused row
// kernels on one GPU, float or bf16 storage with fp32 accumulation. Link tightfit::cuda; include
// it from a .cu file only (it holds kernels; compile with nvcc -std=c++20).
//
// cuda_backend<float> stores and computes in fp32 (GEMMs optionally in TF32:
// cuda_backend_options::tf32); cuda_backend<__nv_bfloat16> stores bf16 and accumulates in fp32
// (storage_t = __nv_bfloat16, accum_t = float). Kernels follow reference_backend's contract
// (docs/concepts.md) and check shapes with the reference backend's checks
// (detail/reference_checks.hpp), so both reject the same input with the same message, before
// any CUDA call. Status: ran on one H200 once (issue #30, before the tensor-core attention and
// the fp32 statistics); the tensor-core attention (detail/cuda_attention_mma.cuh) is compiled
// and tested on the host side only, not run on a GPU (docs/cuda.md, scripts/gpu-check).
//
// Invariants:
//  - every kernel runs on the backend's own stream; host spans (token ids, labels) are copied to
//    the device per call; download() synchronises, nothing else does;
//  - host memory tier (backend/offload.hpp): pinned buffers counted in host_memory(); its
//    copies run on a second stream after the kernels queued before them; wait_copies() makes
//    the compute stream wait for them and the host for the copy stream;
//  - device memory: cudaMallocAsync on that stream, counted in memory() (scratch included:
//    a recomputed fp32 lse, D = rowsum(dO*O), the tensor-core backward's fp32 dQ scratch,
//    RMSNorm dw partials, ids);
//    buffers must not outlive the backend;
//  - nothing touches the device before the first kernel / allocation that needs it (a backend
//    is constructible without a GPU);
//  - deterministic mode: every kernel's result is bit-identical run to run (the only
//    non-deterministic path otherwise is attention's dQ by atomicAdd: float storage on the
//    CUDA cores, bf16 on the tensor cores);
//  - bf16: the statistics (rstd, attention and cross-entropy lse, log-probs, coefficients) are
//    fp32 (accum_t), as the concept asks; a kernel also takes them in storage_t, and the
//    attention backward recomputes an fp32 lse from a bf16 one (a bf16 lse of magnitude ~10 is
//    off by up to 0.03, which would scale P by 3 %). fill and copy take float views too.
//    adam_update has a mixed-precision overload with fp32 master weights and moments that also
//    writes the bf16 copy.
#pragma once

#if !defined(__CUDACC__)
#error "tightfit/backend/cuda.hpp holds CUDA kernels: include it from a .cu file (nvcc)"
#endif

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <numeric>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "tightfit/backend/concept.hpp"
#include "tightfit/backend/detail/cuda_attention.cuh"
#include "tightfit/backend/detail/cuda_attention_mma.cuh"
#include "tightfit/backend/detail/cuda_gemm.hpp"
#include "tightfit/backend/detail/cuda_kernels.cuh"
#include "tightfit/backend/detail/cuda_runtime.hpp"
#include "tightfit/backend/detail/reference_checks.hpp"
#include "tightfit/backend/offload.hpp"
#include "tightfit/core/error.hpp"
#include "tightfit/core/memory.hpp"
#include "tightfit/core/types.hpp"
#include "tightfit/core/view.hpp"

namespace tightfit {

/// Which kernels run attention: automatic (the tensor-core kernels wherever they apply: bf16
/// storage, head_dim 64 or 128, sm_80+, 16-byte aligned rows; the CUDA-core kernels otherwise),
/// or one forced. Forcing tensor_cores on a call they cannot run throws.
enum class attention_engine { automatic, tensor_cores, cuda_cores };

/// Options of a cuda_backend.
struct cuda_backend_options {
  int device = 0;              ///< CUDA device ordinal
  bool tf32 = false;           ///< float storage: GEMMs in TF32 (CUBLAS_COMPUTE_32F_FAST_TF32)
  bool deterministic = false;  ///< bit-identical results run to run (attention dQ without atomics)
  /// automatic defers to the environment variable TIGHTFIT_CUDA_ATTENTION (auto, tensor_cores,
  /// cuda_cores) when it is set: how scripts/gpu-check runs both engines from one binary.
  attention_engine attention = attention_engine::automatic;
};

namespace detail {
/// The engine a backend uses: `requested`, or TIGHTFIT_CUDA_ATTENTION's when it is automatic.
/// `env` is the variable's value (nullptr: unset); anything but auto, tensor_cores and
/// cuda_cores throws tightfit::error naming it.
inline attention_engine resolve_attention_engine(attention_engine requested, const char* env) {
  if (requested != attention_engine::automatic || env == nullptr) return requested;
  const std::string v(env);
  if (v.empty() || v == "auto") return attention_engine::automatic;
  if (v == "tensor_cores") return attention_engine::tensor_cores;
  if (v == "cuda_cores") return attention_engine::cuda_cores;
  throw error("TIGHTFIT_CUDA_ATTENTION is '" + v + "', expected auto, tensor_cores or cuda_cores");
}
}  // namespace detail

/// The CUDA Backend. Storage is float or __nv_bfloat16; value_type (scalars, accumulation) is
/// float. Non-copyable: it owns the stream, the cuBLAS handle and the memory counter.
template <class Storage = float>
requires(std::is_same_v<Storage, float> ||
         std::is_same_v<Storage, __nv_bfloat16>) class cuda_backend {
 public:
  using value_type = float;
  using storage_type = Storage;
  using S = Storage;
  using F = float;

  explicit cuda_backend(const cuda_backend_options& options = {})
      : options_(options),
        engine_(detail::resolve_attention_engine(options.attention,
                                                 std::getenv("TIGHTFIT_CUDA_ATTENTION"))),
        ctx_(options.device) {}
  cuda_backend(const cuda_backend&) = delete;
  cuda_backend& operator=(const cuda_backend&) = delete;

  const cuda_backend_options& options() const { return options_; }
  memory_counter& memory() { return memory_; }
  kernel_stats& stats() { return stats_; }
  /// The stream every kernel runs on (created on first use).
  cudaStream_t stream() {
    ctx_.ensure();
    return ctx_.stream();
  }
  /// Waits for every queued kernel; throws a pending kernel error as tightfit::error.
  void synchronize() { ctx_.synchronize(); }
  /// Number of CUDA devices (0 without a driver or a device; never throws).
  static int device_count() { return detail::cuda_device_count(); }

  /// The element types a statistic (rstd, lse, log-prob, coefficient) may have: float, the
  /// concept's accum_t (fp32 statistics of bf16 storage), or storage_t (the same for float).
  template <class U>
  static constexpr bool stat_type = std::is_same_v<U, S> || std::is_same_v<U, float>;

  // ---- storage ------------------------------------------------------------------------------

  /// A zero-initialised device buffer of n elements of U, counted by memory().
  template <class U>
  detail::cuda_buffer<U> allocate(index_t n) {
    check(n >= 0, "cuda_backend::allocate: element count is ", n, ", expected >= 0");
    if (n == 0) return {};
    ctx_.ensure();
    return detail::cuda_buffer<U>(memory_, n, {ctx_.stream()});
  }
  /// Host -> device (sizes must match). Queued on the stream; src may be reused on return.
  template <class U>
  void upload(std::span<const U> src, std::span<U> dst) {
    detail::check_size("upload", "dst", dst, static_cast<index_t>(src.size()), "(src.size)");
    if (src.empty()) return;
    ctx_.ensure();
    detail::cuda_check(cudaMemcpyAsync(dst.data(), src.data(), src.size_bytes(),
                                       cudaMemcpyHostToDevice, ctx_.stream()),
                       "upload");
  }
  /// Device -> host (sizes must match); waits for the copy (and every kernel before it).
  template <class U>
  void download(std::span<const U> src, std::span<U> dst) {
    detail::check_size("download", "dst", dst, static_cast<index_t>(src.size()), "(src.size)");
    if (src.empty()) return;
    ctx_.ensure();
    detail::cuda_check(cudaMemcpyAsync(dst.data(), src.data(), src.size_bytes(),
                                       cudaMemcpyDeviceToHost, ctx_.stream()),
                       "download");
    ctx_.synchronize();
  }

  // ---- host memory tier (OffloadBackend, backend/offload.hpp) -------------------------------

  /// Live and peak bytes of the pinned host buffers (allocate_host).
  memory_counter& host_memory() { return host_memory_; }
  /// A zero-initialised page-locked host buffer of n elements of U, counted by host_memory().
  template <class U>
  detail::cuda_pinned_buffer<U> allocate_host(index_t n) {
    check(n >= 0, "cuda_backend::allocate_host: element count is ", n, ", expected >= 0");
    if (n == 0) return {};
    ctx_.ensure();
    return detail::cuda_pinned_buffer<U>(host_memory_, n);
  }
  /// Device -> pinned host on the copy stream, after every kernel queued so far.
  void copy_to_host(std::span<const S> src, std::span<S> dst) {
    copy_between("copy_to_host", src, dst, cudaMemcpyDeviceToHost);
  }
  /// Pinned host -> device on the copy stream, after every kernel queued so far.
  void copy_to_device(std::span<const S> src, std::span<S> dst) {
    copy_between("copy_to_device", src, dst, cudaMemcpyHostToDevice);
  }
  /// Kernels queued from now on see every copy queued so far, whose sources may be freed.
  void wait_copies() { ctx_.join_copies(); }

  // ---- dense linear algebra -----------------------------------------------------------------

  /// C = alpha op(A) op(B) + beta C (cublasGemmEx, fp32 accumulation).
  void gemm(transpose ta, transpose tb, F alpha, matrix_view<const S> a, matrix_view<const S> b,
            F beta, matrix_view<S> c) {
    const auto d = detail::check_gemm(ta, tb, a, b, c);
    ++stats_.gemm_calls;
    stats_.gemm_flops +=
        2.0 * static_cast<double>(d.m) * static_cast<double>(d.n) * static_cast<double>(d.k);
    if (d.m == 0 || d.n == 0) return;
    ctx_.ensure();
    detail::cublas_gemm<S>(ctx_.blas(), options_.tf32, ta, tb, alpha, a, b, beta, c, d);
  }

  /// gemm per batch entry (one cublasGemmStridedBatchedEx).
  void gemm_batched(transpose ta, transpose tb, F alpha, tensor3_view<const S> a,
                    tensor3_view<const S> b, F beta, tensor3_view<S> c) {
    const auto d = detail::check_gemm_batched(ta, tb, a, b, c);
    ++stats_.gemm_calls;
    stats_.gemm_flops += 2.0 * static_cast<double>(d.m) * static_cast<double>(d.n) *
                         static_cast<double>(d.k) * static_cast<double>(c.batch);
    if (d.m == 0 || d.n == 0 || c.batch == 0) return;
    ctx_.ensure();
    detail::cublas_gemm_batched<S>(ctx_.blas(), options_.tf32, ta, tb, alpha, a, b, beta, c, d);
  }

  /// y += alpha x.
  void axpy(F alpha, matrix_view<const S> x, matrix_view<S> y) {
    detail::check_layout("axpy", "x", x);
    detail::check_like("axpy", "y", y, "x", x.rows, x.cols);
    dense(detail::cuda_k::dense_op::axpy, alpha, x.data, x.stride, y);
  }
  /// x *= alpha.
  void scale(F alpha, matrix_view<S> x) {
    detail::check_layout("scale", "x", x);
    dense(detail::cuda_k::dense_op::scale, alpha, nullptr, 0, x);
  }
  /// x = value (storage_t, or float: the statistics).
  template <class U>
  requires(stat_type<U>) void fill(matrix_view<U> x, F value) {
    detail::check_layout("fill", "x", x);
    dense<U>(detail::cuda_k::dense_op::fill, value, nullptr, 0, x);
  }
  /// y = x (storage_t, or float: the statistics).
  template <class U>
  requires(stat_type<U>) void copy(std::type_identity_t<matrix_view<const U>> x, matrix_view<U> y) {
    detail::check_layout("copy", "x", x);
    detail::check_like("copy", "y", y, "x", x.rows, x.cols);
    dense<U>(detail::cuda_k::dense_op::copy, 0.f, x.data, x.stride, y);
  }

  // ---- token embedding ----------------------------------------------------------------------

  /// out[i] = table[ids[i]]; ids on the host.
  void embedding_forward(matrix_view<const S> table, std::span<const token_id> ids,
                         matrix_view<S> out) {
    detail::check_embedding_forward(table, ids, out);
    if (out.empty()) return;
    auto dids = to_device(ids);
    detail::cuda_k::embedding_forward_kernel<S>
        <<<grid(out.rows), row_threads(out.cols), 0, ctx_.stream()>>>(
            table.data, table.stride, dids.data(), out.data, out.stride, out.cols);
    launched("embedding_forward");
  }

  /// dtable[ids[i]] += dout[i]: rows of one id summed in index order (deterministic).
  void embedding_backward(matrix_view<const S> dout, std::span<const token_id> ids,
                          matrix_view<S> dtable) {
    detail::check_embedding_backward(dout, ids, dtable);
    if (dout.empty()) return;
    // host: indices sorted by id (stable), segment starts and ids
    std::vector<std::int64_t> perm(ids.size());
    std::iota(perm.begin(), perm.end(), std::int64_t{0});
    std::stable_sort(perm.begin(), perm.end(), [&](std::int64_t x, std::int64_t y) {
      return ids[static_cast<std::size_t>(x)] < ids[static_cast<std::size_t>(y)];
    });
    std::vector<std::int64_t> start, seg_id;
    for (std::size_t r = 0; r < perm.size(); ++r) {
      const token_id id = ids[static_cast<std::size_t>(perm[r])];
      if (r == 0 || id != seg_id.back()) {
        start.push_back(static_cast<std::int64_t>(r));
        seg_id.push_back(id);
      }
    }
    start.push_back(static_cast<std::int64_t>(perm.size()));
    auto dperm = to_device(std::span<const std::int64_t>(perm));
    auto dstart = to_device(std::span<const std::int64_t>(start));
    auto dseg = to_device(std::span<const std::int64_t>(seg_id));
    detail::cuda_k::embedding_backward_kernel<S>
        <<<grid(static_cast<index_t>(seg_id.size())), row_threads(dout.cols), 0, ctx_.stream()>>>(
            dout.data, dout.stride, dperm.data(), dstart.data(), dseg.data(), dtable.data,
            dtable.stride, dout.cols);
    launched("embedding_backward");
  }

  // ---- RMSNorm ------------------------------------------------------------------------------

  /// rstd: float (fp32 statistics), or storage_t.
  template <class R>
  requires(stat_type<R>) void rmsnorm_forward(matrix_view<const S> x, std::span<const S> w, F eps,
                                              matrix_view<S> y, std::span<R> rstd) {
    detail::check_rmsnorm_forward(cv(x), cs(w), eps, mv(y), detail::retype<F>(rstd));
    if (x.rows == 0) return;
    ctx_.ensure();
    detail::cuda_k::rmsnorm_forward_kernel<S, R>
        <<<grid(x.rows), row_threads(x.cols), 0, ctx_.stream()>>>(
            x.data, x.stride, w.data(), eps, y.data, y.stride, rstd.data(), x.cols);
    launched("rmsnorm_forward");
  }

  template <class RV>
  requires(stat_type<std::remove_const_t<RV>>) void rmsnorm_backward(
      matrix_view<const S> x, std::span<const S> w, std::span<RV> rstd_in, matrix_view<const S> dy,
      matrix_view<S> dx, std::span<S> dw) {
    using R = std::remove_const_t<RV>;
    const std::span<const R> rstd = rstd_in;
    detail::check_rmsnorm_backward(cv(x), cs(w), detail::retype<const F>(rstd), cv(dy), mv(dx),
                                   ms(dw));
    if (x.rows == 0 || x.cols == 0) return;
    ctx_.ensure();
    detail::cuda_k::rmsnorm_backward_dx_kernel<S, R>
        <<<grid(x.rows), row_threads(x.cols), 0, ctx_.stream()>>>(x.data, x.stride, w.data(),
                                                                  rstd.data(), dy.data, dy.stride,
                                                                  dx.data, dx.stride, x.cols);
    launched("rmsnorm_backward");
    if (dw.empty()) return;
    constexpr index_t rows_per_chunk = 128;
    const index_t chunks = (x.rows + rows_per_chunk - 1) / rows_per_chunk;
    auto partial = allocate<float>(chunks * x.cols);  // (chunks, d)
    const dim3 g(static_cast<unsigned>((x.cols + 255) / 256), static_cast<unsigned>(chunks));
    detail::cuda_k::rmsnorm_dw_partial_kernel<S, R>
        <<<g, 256, 0, ctx_.stream()>>>(x.data, x.stride, rstd.data(), dy.data, dy.stride,
                                       partial.data(), x.rows, x.cols, rows_per_chunk);
    launched("rmsnorm_backward (dw partials)");
    detail::cuda_k::rmsnorm_dw_reduce_kernel<S>
        <<<grid((x.cols + 255) / 256), 256, 0, ctx_.stream()>>>(partial.data(), chunks, dw.data(),
                                                                x.cols);
    launched("rmsnorm_backward (dw)");
  }

  // ---- RoPE ---------------------------------------------------------------------------------

  void rope_forward(matrix_view<S> x, index_t heads, index_t head_dim, const rope_args& r) {
    detail::check_rope("rope_forward", x, heads, head_dim, r);
    rope(x, heads, head_dim, r, 1.0);
  }
  void rope_backward(matrix_view<S> dx, index_t heads, index_t head_dim, const rope_args& r) {
    detail::check_rope("rope_backward", dx, heads, head_dim, r);
    rope(dx, heads, head_dim, r, -1.0);
  }

  // ---- SwiGLU -------------------------------------------------------------------------------

  void swiglu_forward(matrix_view<const S> gate, matrix_view<const S> up, matrix_view<S> out) {
    detail::check_swiglu_forward(gate, up, out);
    if (gate.empty()) return;
    ctx_.ensure();
    detail::cuda_k::swiglu_forward_kernel<S>
        <<<elementwise_grid(gate.size()), 256, 0, ctx_.stream()>>>(
            gate.data, gate.stride, up.data, up.stride, out.data, out.stride, gate.rows, gate.cols);
    launched("swiglu_forward");
  }

  void swiglu_backward(matrix_view<const S> gate, matrix_view<const S> up,
                       matrix_view<const S> dout, matrix_view<S> dgate, matrix_view<S> dup) {
    detail::check_swiglu_backward(gate, up, dout, dgate, dup);
    if (gate.empty()) return;
    ctx_.ensure();
    detail::cuda_k::swiglu_backward_kernel<S>
        <<<elementwise_grid(gate.size()), 256, 0, ctx_.stream()>>>(
            gate.data, gate.stride, up.data, up.stride, dout.data, dout.stride, dgate.data,
            dgate.stride, dup.data, dup.stride, gate.rows, gate.cols);
    launched("swiglu_backward");
  }

  // ---- GELU-tanh gated MLP and logit soft-capping (Gemma) -----------------------------------

  void geglu_forward(matrix_view<const S> gate, matrix_view<const S> up, matrix_view<S> out) {
    detail::check_swiglu_forward(gate, up, out, "geglu_forward");
    if (gate.empty()) return;
    ctx_.ensure();
    detail::cuda_k::geglu_forward_kernel<S>
        <<<elementwise_grid(gate.size()), 256, 0, ctx_.stream()>>>(
            gate.data, gate.stride, up.data, up.stride, out.data, out.stride, gate.rows, gate.cols);
    launched("geglu_forward");
  }

  void geglu_backward(matrix_view<const S> gate, matrix_view<const S> up, matrix_view<const S> dout,
                      matrix_view<S> dgate, matrix_view<S> dup) {
    detail::check_swiglu_backward(gate, up, dout, dgate, dup, "geglu_backward");
    if (gate.empty()) return;
    ctx_.ensure();
    detail::cuda_k::geglu_backward_kernel<S>
        <<<elementwise_grid(gate.size()), 256, 0, ctx_.stream()>>>(
            gate.data, gate.stride, up.data, up.stride, dout.data, dout.stride, dgate.data,
            dgate.stride, dup.data, dup.stride, gate.rows, gate.cols);
    launched("geglu_backward");
  }

  void logit_softcap_forward(matrix_view<S> x, value_type cap) {
    detail::check_softcap("logit_softcap_forward", x, static_cast<double>(cap));
    if (x.empty()) return;
    ctx_.ensure();
    detail::cuda_k::logit_softcap_kernel<S><<<elementwise_grid(x.size()), 256, 0, ctx_.stream()>>>(
        x.data, x.stride, x.data, x.stride, x.rows, x.cols, static_cast<float>(cap), false);
    launched("logit_softcap_forward");
  }

  void logit_softcap_backward(matrix_view<const S> capped, matrix_view<S> dx, value_type cap) {
    detail::check_softcap_backward(capped, dx, static_cast<double>(cap));
    if (dx.empty()) return;
    ctx_.ensure();
    detail::cuda_k::logit_softcap_kernel<S><<<elementwise_grid(dx.size()), 256, 0, ctx_.stream()>>>(
        capped.data, capped.stride, dx.data, dx.stride, dx.rows, dx.cols, static_cast<float>(cap),
        true);
    launched("logit_softcap_backward");
  }

  // ---- attention ----------------------------------------------------------------------------
  // bf16 storage, head_dim 64 or 128, sm_80+ and 16-byte aligned rows: the tensor-core kernels
  // (detail/cuda_attention_mma.cuh); otherwise, or with attention_engine::cuda_cores, the
  // CUDA-core kernels (detail/cuda_attention.cuh). lse is storage_t or float (L): the backward
  // reads a float lse as it is and recomputes one in fp32 from a bf16 lse.

  /// Causal GQA flash attention forward (contract: reference_backend::attention_forward).
  template <class L>
  requires(stat_type<L>) void attention_forward(const attention_shape& shape,
                                                matrix_view<const S> q, matrix_view<const S> k,
                                                matrix_view<const S> v, const attention_mask& mask,
                                                F scale, matrix_view<S> o, matrix_view<L> lse) {
    detail::check_attention_forward(shape, cv(q), cv(k), cv(v), mask, scale, mv(o),
                                    detail::retype<F>(lse));
    ++stats_.attention_forward_calls;
    stats_.attention_flops +=
        4.0 * static_cast<double>(shape.head_dim) * visible_triples(shape, q.rows, k.rows, mask);
    if (q.rows == 0) return;
    ctx_.ensure();
    auto doc = doc_starts(mask, q.rows);
    const auto a = attn_args(shape, q.rows, k.rows, mask, doc.data(), scale);
    if (use_mma(a,
                {{q.data, q.stride}, {k.data, k.stride}, {v.data, v.stride}, {o.data, o.stride}})) {
      mma_forward<L, false>(a, q, k, v, o.data, o.stride, lse.data, lse.stride);
      return;
    }
    const std::size_t smem = detail::cuda_k::attn_forward_smem(shape.head_dim);
    auto kernel = detail::cuda_k::attn_forward_kernel<S, L, false>;
    prepare_smem("attention_forward", kernel, smem, shape.head_dim);
    kernel<<<attn_grid(q.rows, shape.heads), detail::cuda_k::attn_threads, smem, ctx_.stream()>>>(
        a, q.data, q.stride, k.data, k.stride, v.data, v.stride, o.data, o.stride, lse.data,
        lse.stride);
    launched("attention_forward");
  }

  /// Exact gradient of attention_forward (contract: reference_backend::attention_backward).
  template <class LV>
  requires(stat_type<std::remove_const_t<LV>>) void attention_backward(
      const attention_shape& shape, matrix_view<const S> q, matrix_view<const S> k,
      matrix_view<const S> v, matrix_view<const S> o, matrix_view<const S> dout,
      matrix_view<LV> lse_view, const attention_mask& mask, F scale, matrix_view<S> dq,
      matrix_view<S> dk, matrix_view<S> dv) {
    using L = std::remove_const_t<LV>;
    const matrix_view<const L> lse = lse_view;
    detail::check_attention_backward(shape, cv(q), cv(k), cv(v), cv(o), cv(dout),
                                     detail::retype<const F>(lse), mask, scale, mv(dq), mv(dk),
                                     mv(dv));
    ++stats_.attention_backward_calls;
    stats_.attention_flops +=
        10.0 * static_cast<double>(shape.head_dim) * visible_triples(shape, q.rows, k.rows, mask);
    if (q.rows == 0) return;
    ctx_.ensure();
    namespace ck = detail::cuda_k;
    auto doc = doc_starts(mask, q.rows);
    const auto a = attn_args(shape, q.rows, k.rows, mask, doc.data(), scale);
    const index_t hd = shape.head_dim;
    const bool mma = use_mma(a, {{q.data, q.stride},
                                 {k.data, k.stride},
                                 {v.data, v.stride},
                                 {dout.data, dout.stride},
                                 {dq.data, dq.stride},
                                 {dk.data, dk.stride},
                                 {dv.data, dv.stride}});
    // fp32 lse: the given one, or recomputed from Q and K (a bf16 lse, see the top comment)
    const float* lse_f = nullptr;
    index_t lss = 0;
    detail::cuda_buffer<float> lse_scratch;  // (nq, heads) for a bf16 lse
    if constexpr (std::is_same_v<L, float>) {
      lse_f = lse.data;
      lss = lse.stride;
    } else {
      // the recomputed lse would be this key block's, not the whole call's
      check(!mask.is_block(k.rows), "cuda_backend::attention_backward: a key block (k0 ", mask.k0,
            ", key_end ", mask.key_end, ") needs a float lse (a bf16 lse is recomputed)");
      lse_scratch = allocate<float>(q.rows * shape.heads);
      if (mma) {
        mma_forward<float, true>(a, q, k, v, nullptr, 0, lse_scratch.data(), shape.heads);
      } else {
        const std::size_t smem = ck::attn_forward_smem(hd);
        auto kernel = ck::attn_forward_kernel<S, float, true>;
        prepare_smem("attention_backward", kernel, smem, hd);
        kernel<<<attn_grid(q.rows, shape.heads), ck::attn_threads, smem, ctx_.stream()>>>(
            a, q.data, q.stride, k.data, k.stride, v.data, v.stride, nullptr, 0, lse_scratch.data(),
            shape.heads);
        launched("attention_backward (lse)");
      }
      lse_f = lse_scratch.data();
      lss = shape.heads;
    }
    auto dvec = allocate<float>(q.rows * shape.heads);  // (nq, heads) D = rowsum(dO * O)
    ck::attn_dot_kernel<S><<<grid(q.rows), 128, 0, ctx_.stream()>>>(a, o.data, o.stride, dout.data,
                                                                    dout.stride, dvec.data());
    launched("attention_backward (D)");
    const index_t kmax = ck::attn_local_keys(a);
    if (kmax == 0) return;  // no key of this block is visible to any query
    if (mma) {
      mma_backward(a, q, k, v, dout, lse_f, lss, dvec.data(), kmax, dq, dk, dv);
      return;
    }
    const dim3 gk(static_cast<unsigned>((kmax + ck::attn_bc - 1) / ck::attn_bc),
                  static_cast<unsigned>(shape.kv_heads));
    const std::size_t smem_kv = ck::attn_dkdv_smem(hd);
    bool atomic_dq = false;
    if constexpr (std::is_same_v<S, float>) atomic_dq = !options_.deterministic;
    if (atomic_dq) {
      if constexpr (std::is_same_v<S, float>) {
        auto kernel = ck::attn_backward_dkdv_kernel<S, true>;
        prepare_smem("attention_backward", kernel, smem_kv, hd);
        kernel<<<gk, ck::attn_threads, smem_kv, ctx_.stream()>>>(
            a, q.data, q.stride, k.data, k.stride, v.data, v.stride, dout.data, dout.stride, lse_f,
            lss, dvec.data(), dq.data, dq.stride, dk.data, dk.stride, dv.data, dv.stride);
        launched("attention_backward (dK, dV, dQ)");
      }
      return;
    }
    auto kernel = ck::attn_backward_dkdv_kernel<S, false>;
    prepare_smem("attention_backward", kernel, smem_kv, hd);
    kernel<<<gk, ck::attn_threads, smem_kv, ctx_.stream()>>>(
        a, q.data, q.stride, k.data, k.stride, v.data, v.stride, dout.data, dout.stride, lse_f, lss,
        dvec.data(), nullptr, 0, dk.data, dk.stride, dv.data, dv.stride);
    launched("attention_backward (dK, dV)");
    const std::size_t smem_q = ck::attn_dq_smem(hd);
    auto kq = ck::attn_backward_dq_kernel<S>;
    prepare_smem("attention_backward", kq, smem_q, hd);
    kq<<<attn_grid(q.rows, shape.heads), ck::attn_threads, smem_q, ctx_.stream()>>>(
        a, q.data, q.stride, k.data, k.stride, v.data, v.stride, dout.data, dout.stride, lse_f, lss,
        dvec.data(), dq.data, dq.stride);
    launched("attention_backward (dQ)");
  }

  /// Attention calls (forward or backward) that ran on the tensor-core kernels.
  std::int64_t tensor_core_attention_calls() const { return mma_calls_; }
  /// The attention engine in force: options().attention, or TIGHTFIT_CUDA_ATTENTION when that
  /// is automatic.
  attention_engine attention() const { return engine_; }

  /// merge_attention_blocks (backend/concept.hpp) on the device.
  template <class L, class LB>
  requires(stat_type<L>&& std::is_same_v<std::remove_const_t<LB>, L>) void attention_merge(
      index_t heads, index_t hd, matrix_view<S> o, matrix_view<L> lse, matrix_view<const S> o_b,
      matrix_view<LB> lse_b) {
    if (o.rows == 0) return;
    ctx_.ensure();
    detail::cuda_k::attn_merge_kernel<S, L>
        <<<elementwise_grid(o.rows * heads), 256, 0, ctx_.stream()>>>(
            o.rows, heads, hd, o.data, o.stride, lse.data, lse.stride, o_b.data, o_b.stride,
            lse_b.data, lse_b.stride);
    launched("attention_merge");
  }

  // ---- cross-entropy ------------------------------------------------------------------------

  /// lse_i = log sum_v exp(logits_iv / tau); logprob_i = logits_i[y_i] / tau - lse_i (0 when
  /// y_i == ignore_index). Labels on the host; lse, logprob in device memory, float (fp32
  /// statistics) or storage_t.
  template <class R>
  requires(stat_type<R>) void xent_forward(matrix_view<const S> logits,
                                           std::span<const token_id> labels, F tau,
                                           std::span<R> lse, std::span<R> logprob) {
    detail::check_xent_forward(cv(logits), labels, tau, detail::retype<F>(lse),
                               detail::retype<F>(logprob));
    if (logits.rows == 0) return;
    auto dl = to_device(labels);
    detail::cuda_k::xent_forward_kernel<S, R><<<grid(logits.rows), 512, 0, ctx_.stream()>>>(
        logits.data, logits.stride, dl.data(), tau, lse.data(), logprob.data(), logits.cols);
    launched("xent_forward");
  }

  /// In place: logits <- coeff_i (onehot(y_i) - softmax(logits_i / tau)) / tau; lse and coeff
  /// float or storage_t (one type).
  template <class RV, class CV>
  requires(stat_type<std::remove_const_t<RV>>&& std::is_same_v<
           std::remove_const_t<RV>,
           std::remove_const_t<CV>>) void xent_backward(matrix_view<S> logits,
                                                        std::span<const token_id> labels,
                                                        std::span<RV> lse_in,
                                                        std::span<CV> coeff_in, F tau) {
    using R = std::remove_const_t<RV>;
    const std::span<const R> lse = lse_in, coeff = coeff_in;
    detail::check_xent_backward(mv(logits), labels, detail::retype<const F>(lse),
                                detail::retype<const F>(coeff), tau);
    if (logits.rows == 0) return;
    auto dl = to_device(labels);
    detail::cuda_k::xent_backward_kernel<S, R><<<grid(logits.rows), 512, 0, ctx_.stream()>>>(
        logits.data, logits.stride, dl.data(), lse.data(), coeff.data(), tau, logits.cols);
    launched("xent_backward");
  }

  // ---- optimizer updates --------------------------------------------------------------------

  /// One Adam / AdamW step over storage_t spans (fp32 math; for bf16 storage the moments are
  /// bf16: prefer the mixed-precision overload below).
  void adam_update(std::span<S> param, std::span<const S> grad, std::span<S> m, std::span<S> v,
                   const adam_hyper<F>& hp) {
    detail::check_adam(ms(param), cs(grad), ms(m), ms(v), hp);
    adam(param.data(), grad.data(), m.data(), v.data(), param.size(), hp, nullptr);
  }

  /// Mixed precision (bf16 storage): fp32 master weights and moments are updated, and the bf16
  /// parameters the kernels read (param, of master's size) receive the rounded result.
  void adam_update(std::span<float> master, std::span<const S> grad, std::span<float> m,
                   std::span<float> v, const adam_hyper<F>& hp,
                   std::span<S> param) requires(!std::is_same_v<S, float>) {
    detail::check_adam(master, cs(grad), m, v, hp);
    detail::check_size("adam_update", "param", param, static_cast<index_t>(master.size()),
                       "(master.size)");
    adam(master.data(), grad.data(), m.data(), v.data(), master.size(), hp, param.data());
  }

  /// One SGD step (contract: reference_backend::sgd_update).
  void sgd_update(std::span<S> param, std::span<const S> grad, std::span<S> momentum_buf,
                  const sgd_hyper<F>& hp) {
    detail::check_sgd(ms(param), cs(grad), ms(momentum_buf), hp);
    if (param.empty()) return;
    ctx_.ensure();
    detail::cuda_k::sgd_kernel<S>
        <<<elementwise_grid(static_cast<index_t>(param.size())), 256, 0, ctx_.stream()>>>(
            param.data(), grad.data(), momentum_buf.data(), static_cast<index_t>(param.size()),
            hp.lr, hp.momentum, hp.weight_decay, hp.use_sign);
    launched("sgd_update");
  }

 private:
  // Views and spans retyped to F for the reference checks (extents only, see detail::retype).
  static matrix_view<const F> cv(matrix_view<const S> x) { return detail::retype<const F>(x); }
  static matrix_view<F> mv(matrix_view<S> x) { return detail::retype<F>(x); }
  static std::span<const F> cs(std::span<const S> x) { return detail::retype<const F>(x); }
  static std::span<F> ms(std::span<S> x) { return detail::retype<F>(x); }

  static dim3 grid(index_t blocks) {
    check(blocks <= 2147483647, "cuda_backend: ", blocks, " blocks exceed the grid limit");
    return dim3(static_cast<unsigned>(blocks));
  }
  static unsigned row_threads(index_t cols) {
    return cols >= 1024 ? 512u : (cols >= 256 ? 256u : 128u);
  }
  dim3 elementwise_grid(index_t n) const {
    const index_t blocks = std::min<index_t>((n + 255) / 256, index_t{32} * ctx_.sm_count());
    return dim3(static_cast<unsigned>(std::max<index_t>(blocks, 1)));
  }
  static dim3 attn_grid(index_t rows, index_t heads) {
    return dim3(
        static_cast<unsigned>((rows + detail::cuda_k::attn_br - 1) / detail::cuda_k::attn_br),
        static_cast<unsigned>(heads));
  }
  static void launched(const char* what) { detail::cuda_check(cudaGetLastError(), what); }

  /// Opts a kernel in to `bytes` of dynamic shared memory; throws when the device has less.
  template <class K>
  void prepare_smem(const char* what, K kernel, std::size_t bytes, index_t head_dim) {
    check(bytes <= ctx_.max_shared(), what, ": head_dim ", head_dim, " needs ", bytes,
          " bytes of shared memory per block, the device allows ", ctx_.max_shared());
    detail::cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(bytes)),
                       what);
    // the largest shared-memory carveout: two tensor-core attention blocks per SM need it
    detail::cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                            static_cast<int>(cudaSharedmemCarveoutMaxShared)),
                       what);
  }

  /// Whether this attention call runs on the tensor-core kernels (counted); throws when they
  /// are forced and cannot run it.
  bool use_mma(const detail::cuda_k::attn_args& a,
               std::initializer_list<detail::cuda_k::mma::operand> ops) {
    if (engine_ == attention_engine::cuda_cores) return false;
    const index_t positions = std::max({a.q0 + a.nq, a.k0 + a.nk, a.kmax});
    const char* why = detail::cuda_k::mma::refusal(std::is_same_v<S, __nv_bfloat16>, a.hd,
                                                   ctx_.cc_major(), positions, ops);
    if (why != nullptr) {
      check(engine_ != attention_engine::tensor_cores,
            "cuda_backend: tensor-core attention is forced, but ", why, " (head_dim ", a.hd, ")");
      return false;
    }
    ++mma_calls_;
    return true;
  }

  /// f(std::integral_constant<int, HD>) for the tensor-core head dims.
  template <class Fn>
  static void with_head_dim(index_t hd, Fn&& f) {
    if (hd == 64)
      f(std::integral_constant<int, 64>{});
    else
      f(std::integral_constant<int, 128>{});
  }

  /// The tensor-core forward: O and lse (type L), or lse only.
  template <class L, bool LseOnly>
  void mma_forward(const detail::cuda_k::attn_args& a, matrix_view<const S> q,
                   matrix_view<const S> k, matrix_view<const S> v, S* o, index_t os, L* lse,
                   index_t lss) {
    if constexpr (std::is_same_v<S, __nv_bfloat16>) {
      namespace mk = detail::cuda_k::mma;
      with_head_dim(a.hd, [&](auto hd) {
        constexpr int HD = decltype(hd)::value;
        auto kernel = mk::fwd_kernel<HD, L, LseOnly>;
        const std::size_t smem = mk::fwd_smem(HD);
        prepare_smem("attention_forward (tensor cores)", kernel, smem, a.hd);
        kernel<<<mma_grid(a.nq, a.heads), mk::threads, smem, ctx_.stream()>>>(
            a, q.data, q.stride, k.data, k.stride, v.data, v.stride, o, os, lse, lss);
        launched(LseOnly ? "attention_backward (lse, tensor cores)"
                         : "attention_forward (tensor cores)");
      });
    }
  }

  /// The tensor-core backward given the fp32 lse and D: dK, dV per key tile (with dQ by
  /// atomicAdd into an fp32 scratch), or, deterministic, dK, dV then dQ per query tile.
  void mma_backward(const detail::cuda_k::attn_args& a, matrix_view<const S> q,
                    matrix_view<const S> k, matrix_view<const S> v, matrix_view<const S> dout,
                    const float* lse, index_t lss, const float* dvec, index_t kmax,
                    matrix_view<S> dq, matrix_view<S> dk, matrix_view<S> dv) {
    if constexpr (std::is_same_v<S, __nv_bfloat16>) {
      namespace mk = detail::cuda_k::mma;
      const dim3 gk(static_cast<unsigned>((kmax + mk::bc - 1) / mk::bc),
                    static_cast<unsigned>(a.heads / a.group));
      with_head_dim(a.hd, [&](auto hd) {
        constexpr int HD = decltype(hd)::value;
        const std::size_t smem_kv = mk::dkdv_smem(HD);
        if (!options_.deterministic) {
          auto dqacc = allocate<float>(a.nq * a.heads * HD);  // (nq, heads*hd) unscaled dQ
          auto kernel = mk::dkdv_kernel<HD, true>;
          prepare_smem("attention_backward (tensor cores)", kernel, smem_kv, a.hd);
          kernel<<<gk, mk::threads, smem_kv, ctx_.stream()>>>(
              a, q.data, q.stride, k.data, k.stride, v.data, v.stride, dout.data, dout.stride, lse,
              lss, dvec, dqacc.data(), dk.data, dk.stride, dv.data, dv.stride);
          launched("attention_backward (dK, dV, dQ; tensor cores)");
          mk::dq_add_kernel<S><<<elementwise_grid(a.nq * a.heads * HD), 256, 0, ctx_.stream()>>>(
              a.nq, a.heads * HD, dqacc.data(), a.scale, dq.data, dq.stride);
          launched("attention_backward (dQ += scratch)");
          return;
        }
        auto kernel = mk::dkdv_kernel<HD, false>;
        prepare_smem("attention_backward (tensor cores)", kernel, smem_kv, a.hd);
        kernel<<<gk, mk::threads, smem_kv, ctx_.stream()>>>(
            a, q.data, q.stride, k.data, k.stride, v.data, v.stride, dout.data, dout.stride, lse,
            lss, dvec, nullptr, dk.data, dk.stride, dv.data, dv.stride);
        launched("attention_backward (dK, dV; tensor cores)");
        auto kq = mk::dq_kernel<HD>;
        const std::size_t smem_q = mk::dq_smem(HD);
        prepare_smem("attention_backward (tensor cores)", kq, smem_q, a.hd);
        kq<<<mma_grid(a.nq, a.heads), mk::threads, smem_q, ctx_.stream()>>>(
            a, q.data, q.stride, k.data, k.stride, v.data, v.stride, dout.data, dout.stride, lse,
            lss, dvec, dq.data, dq.stride);
        launched("attention_backward (dQ; tensor cores)");
      });
    }
  }
  static dim3 mma_grid(index_t rows, index_t heads) {
    return dim3(
        static_cast<unsigned>((rows + detail::cuda_k::mma::br - 1) / detail::cuda_k::mma::br),
        static_cast<unsigned>(heads));
  }

  static detail::cuda_k::attn_args attn_args(const attention_shape& s, index_t nq, index_t nk,
                                             const attention_mask& m, const index_t* doc, F scale) {
    detail::cuda_k::attn_args a;
    a.nq = nq;
    a.kmax = std::min(m.keys_of(nk), m.valid_len);
    a.q0 = m.q0;
    a.k0 = m.k0;
    a.nk = nk;
    a.window = m.window;
    a.doc = doc;
    a.heads = s.heads;
    a.group = s.heads / s.kv_heads;
    a.hd = s.head_dim;
    a.scale = scale;
    a.softcap = static_cast<float>(m.softcap);
    return a;
  }

  /// (query, key, head) triples the kernels compute: the keys of each row under the mask.
  static double visible_triples(const attention_shape& s, index_t nq, index_t nk,
                                const attention_mask& m) {
    double t = 0;
    for (index_t i = 0; i < nq; ++i) {
      const auto [lo, hi] = m.key_rows(m.q0 + i, nk);
      t += static_cast<double>(hi - lo);
    }
    return t * static_cast<double>(s.heads);
  }

  /// doc_start of positions [0, q0 + nq) in device memory (empty when the mask has none).
  detail::cuda_buffer<std::int64_t> doc_starts(const attention_mask& m, index_t nq) {
    if (m.doc_start.empty()) return {};
    const auto n = static_cast<std::size_t>(m.q0 + nq);
    std::vector<std::int64_t> host(m.doc_start.begin(), m.doc_start.begin() + n);
    return to_device(std::span<const std::int64_t>(host));
  }

  /// A host span copied into a counted device buffer (freed stream-ordered after use).
  detail::cuda_buffer<std::int64_t> to_device(std::span<const std::int64_t> host) {
    auto buf = allocate<std::int64_t>(static_cast<index_t>(host.size()));
    upload(host, buf.span());
    return buf;
  }

  template <class U = S>
  void dense(detail::cuda_k::dense_op op, F alpha, std::type_identity_t<const U*> x, index_t xs,
             matrix_view<U> y) {
    if (y.empty()) return;
    ctx_.ensure();
    detail::cuda_k::dense_kernel<U><<<elementwise_grid(y.size()), 256, 0, ctx_.stream()>>>(
        op, alpha, x, xs, y.data, y.stride, y.rows, y.cols);
    launched("dense kernel");
  }

  void rope(matrix_view<S> x, index_t heads, index_t hd, const rope_args& r, double sign) {
    if (x.rows == 0) return;
    ctx_.ensure();
    std::vector<double> freq(static_cast<std::size_t>(hd / 2));
    for (index_t k = 0; k < hd / 2; ++k) freq[static_cast<std::size_t>(k)] = r.frequency(k, hd);
    auto dfreq = allocate<double>(hd / 2);
    upload(std::span<const double>(freq), dfreq.span());
    detail::cuda_buffer<std::int64_t> dpos;
    if (!r.positions.empty()) {
      std::vector<std::int64_t> pos(r.positions.begin(), r.positions.end());
      dpos = to_device(std::span<const std::int64_t>(pos));
    }
    detail::cuda_k::rope_kernel<S>
        <<<elementwise_grid(x.rows * heads * (hd / 2)), 256, 0, ctx_.stream()>>>(
            x.data, x.stride, x.rows, heads, hd, r.pos0, dpos.data(), dfreq.data(),
            r.attention_scaling, sign);
    launched(sign > 0 ? "rope_forward" : "rope_backward");
  }

  template <class P, class M>
  void adam(P* param, const S* grad, M* m, M* v, std::size_t n, const adam_hyper<F>& hp,
            __nv_bfloat16* copy) {
    if (n == 0) return;
    ctx_.ensure();
    const double t = static_cast<double>(hp.step);
    const auto bc1 = static_cast<float>(1 - std::pow(static_cast<double>(hp.beta1), t));
    const auto bc2 = static_cast<float>(1 - std::pow(static_cast<double>(hp.beta2), t));
    const auto count = static_cast<index_t>(n);
    detail::cuda_k::adam_kernel<P, S, M><<<elementwise_grid(count), 256, 0, ctx_.stream()>>>(
        param, grad, m, v, count, hp.lr, hp.beta1, hp.beta2, hp.eps, hp.weight_decay, hp.decoupled,
        bc1, bc2, copy);
    launched("adam_update");
  }

  cuda_backend_options options_;
  attention_engine engine_;
  std::int64_t mma_calls_ = 0;
  void copy_between(const char* what, std::span<const S> src, std::span<S> dst,
                    cudaMemcpyKind kind) {
    detail::check_size(what, "dst", dst, static_cast<index_t>(src.size()), "(src.size)");
    if (src.empty()) return;
    ctx_.ensure();
    ctx_.copy_async(dst.data(), src.data(), src.size_bytes(), kind, what);
  }

  memory_counter memory_;
  memory_counter host_memory_;  ///< pinned host buffers (the offload tier)
  kernel_stats stats_;
  detail::cuda_context ctx_;  // last member: destroyed first (synchronises its stream)
};

static_assert(StorageBackend<cuda_backend<float>> && DenseBackend<cuda_backend<float>>);
static_assert(TransformerBackend<cuda_backend<float>> && OptimizerBackend<cuda_backend<float>>);
static_assert(Backend<cuda_backend<float>>);
static_assert(OffloadBackend<cuda_backend<float>> && OffloadBackend<cuda_backend<__nv_bfloat16>>);
static_assert(Backend<cuda_backend<__nv_bfloat16>>);

}  // namespace tightfit
