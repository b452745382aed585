// tightfit/backend/detail/cuda_kernels.cuh: the element-wise and row kernels of the CUDA backend
// (dense helpers, embedding, RMSNorm, RoPE, SwiGLU, softmax cross-entropy, Adam/AdamW, SGD).
//
// Compiled by nvcc only. Storage S is float or __nv_bfloat16; every kernel loads S, computes in
// fp32 (RoPE angles in fp64, as the reference) and stores S. Semantics are those of
// reference_backend (backend/reference.hpp); the host side (backend/cuda.hpp) checks shapes
// before launching. Reductions are deterministic: fixed block shapes and fixed summation
// orders, no atomics (embedding backward sums the rows of one id in index order; RMSNorm's dw
// sums per-chunk partials in chunk order).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "tightfit/core/types.hpp"

namespace tightfit::detail::cuda_k {

inline constexpr int block_threads = 256;

template <class S>
__device__ __forceinline__ float ld(const S* p) {
  if constexpr (std::is_same_v<S, float>)
    return *p;
  else
    return __bfloat162float(*p);
}
template <class S>
__device__ __forceinline__ S cvt(float x) {
  if constexpr (std::is_same_v<S, float>)
    return x;
  else
    return __float2bfloat16(x);
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
/// Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
__device__ __forceinline__ float block_sum(float v, float* red /* (32) shared */) {
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  const int warps = static_cast<int>(blockDim.x) / 32;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float t = lane < warps ? red[lane] : 0.f;
  return warp_sum(t);
}
__device__ __forceinline__ float block_max(float v, float* red /* (32) shared */) {
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  const int warps = static_cast<int>(blockDim.x) / 32;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float t = lane < warps ? red[lane] : -INFINITY;
  return warp_max(t);
}

// ---- dense helpers ----------------------------------------------------------------------------

enum class dense_op : int { axpy, scale, fill, copy };

/// y (rows, cols) <- op(alpha, x, y) over strided views; one thread per element.
template <class S>
__global__ void dense_kernel(dense_op op, float alpha, const S* x, index_t xs, S* y, index_t ys,
                             index_t rows, index_t cols) {
  const index_t n = rows * cols;
  for (index_t e = blockIdx.x * static_cast<index_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<index_t>(gridDim.x) * blockDim.x) {
    const index_t i = e / cols, j = e % cols;
    S* yp = y + i * ys + j;
    switch (op) {
      case dense_op::axpy:
        *yp = cvt<S>(ld(yp) + alpha * ld(x + i * xs + j));
        break;
      case dense_op::scale:
        *yp = cvt<S>(ld(yp) * alpha);
        break;
      case dense_op::fill:
        *yp = cvt<S>(alpha);
        break;
      case dense_op::copy:
        *yp = x[i * xs + j];
        break;
    }
  }
}

// ---- embedding --------------------------------------------------------------------------------

/// out[i, :] = table[ids[i], :]; one block per row.
template <class S>
__global__ void embedding_forward_kernel(const S* table, index_t ts, const std::int64_t* ids,
                                         S* out, index_t os, index_t cols) {
  const index_t i = blockIdx.x;
  const S* src = table + ids[i] * ts;
  for (index_t j = threadIdx.x; j < cols; j += blockDim.x) out[i * os + j] = src[j];
}

/// One block per distinct id: dtable[id] += sum of dout rows perm[start[s] .. start[s+1]) in
/// index order (deterministic, no atomics).
template <class S>
__global__ void embedding_backward_kernel(const S* dout, index_t ds, const std::int64_t* perm,
                                          const std::int64_t* start, const std::int64_t* seg_id,
                                          S* dtable, index_t ts, index_t cols) {
  const index_t s = blockIdx.x;
  S* dst = dtable + seg_id[s] * ts;
  for (index_t j = threadIdx.x; j < cols; j += blockDim.x) {
    float acc = ld(dst + j);
    for (std::int64_t r = start[s]; r < start[s + 1]; ++r) acc += ld(dout + perm[r] * ds + j);
    dst[j] = cvt<S>(acc);
  }
}

// ---- RMSNorm ----------------------------------------------------------------------------------

/// One block per row: rstd = 1/sqrt(mean(x^2) + eps), y = x * rstd * w. rstd of type R (S, or
/// float: fp32 statistics of bf16 storage).
template <class S, class R = S>
__global__ void rmsnorm_forward_kernel(const S* x, index_t xs, const S* w, float eps, S* y,
                                       index_t ys, R* rstd, index_t d) {
  __shared__ float red[32];
  const index_t i = blockIdx.x;
  const S* xr = x + i * xs;
  float ss = 0;
  for (index_t j = threadIdx.x; j < d; j += blockDim.x) {
    const float v = ld(xr + j);
    ss += v * v;
  }
  ss = block_sum(ss, red);
  const float r = rsqrtf(ss / static_cast<float>(d) + eps);
  if (threadIdx.x == 0) rstd[i] = cvt<R>(r);
  for (index_t j = threadIdx.x; j < d; j += blockDim.x)
    y[i * ys + j] = cvt<S>(ld(xr + j) * r * ld(w + j));
}

/// One block per row: dx += rstd (dy w - x rstd^2 (sum_k dy_k w_k x_k) / d).
template <class S, class R = S>
__global__ void rmsnorm_backward_dx_kernel(const S* x, index_t xs, const S* w, const R* rstd,
                                           const S* dy, index_t dys, S* dx, index_t dxs,
                                           index_t d) {
  __shared__ float red[32];
  const index_t i = blockIdx.x;
  const S* xr = x + i * xs;
  const S* dyr = dy + i * dys;
  float dot = 0;
  for (index_t j = threadIdx.x; j < d; j += blockDim.x) dot += ld(dyr + j) * ld(w + j) * ld(xr + j);
  dot = block_sum(dot, red);
  const float r = ld(rstd + i);
  const float c = r * r * dot / static_cast<float>(d);
  for (index_t j = threadIdx.x; j < d; j += blockDim.x) {
    S* p = dx + i * dxs + j;
    *p = cvt<S>(ld(p) + r * (ld(dyr + j) * ld(w + j) - ld(xr + j) * c));
  }
}

/// Partial dw over a chunk of rows: partial[chunk, j] = sum_{i in chunk} dy_ij x_ij rstd_i.
/// Grid (ceil(d / blockDim), chunks).
template <class S, class R = S>
__global__ void rmsnorm_dw_partial_kernel(const S* x, index_t xs, const R* rstd, const S* dy,
                                          index_t dys, float* partial, index_t n, index_t d,
                                          index_t rows_per_chunk) {
  const index_t j = blockIdx.x * static_cast<index_t>(blockDim.x) + threadIdx.x;
  if (j >= d) return;
  const index_t i0 = blockIdx.y * rows_per_chunk;
  const index_t i1 = i0 + rows_per_chunk < n ? i0 + rows_per_chunk : n;
  float acc = 0;
  for (index_t i = i0; i < i1; ++i) acc += ld(dy + i * dys + j) * ld(x + i * xs + j) * ld(rstd + i);
  partial[blockIdx.y * d + j] = acc;
}

/// dw[j] += sum over chunks of partial[chunk, j], in chunk order.
template <class S>
__global__ void rmsnorm_dw_reduce_kernel(const float* partial, index_t chunks, S* dw, index_t d) {
  const index_t j = blockIdx.x * static_cast<index_t>(blockDim.x) + threadIdx.x;
  if (j >= d) return;
  float acc = 0;
  for (index_t c = 0; c < chunks; ++c) acc += partial[c * d + j];
  dw[j] = cvt<S>(ld(dw + j) + acc);
}

// ---- RoPE -------------------------------------------------------------------------------------

/// In place, one thread per (row, head, k < half): rotation by sign * p * inv_freq[k], cos and
/// sin times `scaling`; p = positions[i] when positions is not null, else pos0 + i.
template <class S>
__global__ void rope_kernel(S* x, index_t xs, index_t rows, index_t heads, index_t hd, index_t pos0,
                            const index_t* positions, const double* inv_freq, double scaling,
                            double sign) {
  const index_t half = hd / 2;
  const index_t n = rows * heads * half;
  for (index_t e = blockIdx.x * static_cast<index_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<index_t>(gridDim.x) * blockDim.x) {
    const index_t k = e % half, h = (e / half) % heads, i = e / (half * heads);
    const index_t p = positions != nullptr ? positions[i] : pos0 + i;
    const double angle = static_cast<double>(p) * inv_freq[k];
    double s = 0, c = 0;
    sincos(angle, &s, &c);
    s *= sign * scaling;
    c *= scaling;
    S* xh = x + i * xs + h * hd;
    const double x1 = ld(xh + k), x2 = ld(xh + k + half);
    xh[k] = cvt<S>(static_cast<float>(x1 * c - x2 * s));
    xh[k + half] = cvt<S>(static_cast<float>(x2 * c + x1 * s));
  }
}

// ---- SwiGLU -----------------------------------------------------------------------------------

__device__ __forceinline__ float sigmoidf(float g) {
  return 1.f / (1.f + expf(-g));
}

template <class S>
__global__ void swiglu_forward_kernel(const S* gate, index_t gs, const S* up, index_t us, S* out,
                                      index_t os, index_t rows, index_t cols) {
  const index_t n = rows * cols;
  for (index_t e = blockIdx.x * static_cast<index_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<index_t>(gridDim.x) * blockDim.x) {
    const index_t i = e / cols, j = e % cols;
    const float g = ld(gate + i * gs + j);
    out[i * os + j] = cvt<S>(g * sigmoidf(g) * ld(up + i * us + j));
  }
}

template <class S>
__global__ void swiglu_backward_kernel(const S* gate, index_t gs, const S* up, index_t us,
                                       const S* dout, index_t ds, S* dgate, index_t dgs, S* dup,
                                       index_t dus, index_t rows, index_t cols) {
  const index_t n = rows * cols;
  for (index_t e = blockIdx.x * static_cast<index_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<index_t>(gridDim.x) * blockDim.x) {
    const index_t i = e / cols, j = e % cols;
    const float g = ld(gate + i * gs + j), sg = sigmoidf(g), d = ld(dout + i * ds + j);
    S* pg = dgate + i * dgs + j;
    S* pu = dup + i * dus + j;
    *pg = cvt<S>(ld(pg) + d * ld(up + i * us + j) * sg * (1.f + g * (1.f - sg)));
    *pu = cvt<S>(ld(pu) + d * g * sg);
  }
}

// ---- GELU-tanh gated MLP (Gemma) and logit soft-capping -------------------------------------

/// sigmoid(2u) = (1 + tanh u) / 2, u = sqrt(2/pi) (g + 0.044715 g^3) (detail/gelu.hpp).
__device__ __forceinline__ float gelu_tanh_s(float g) {
  return 1.f / (1.f + expf(-2.f * 0.7978845608028654f * (g + 0.044715f * g * g * g)));
}

template <class S>
__global__ void geglu_forward_kernel(const S* gate, index_t gs, const S* up, index_t us, S* out,
                                     index_t os, index_t rows, index_t cols) {
  const index_t n = rows * cols;
  for (index_t e = blockIdx.x * static_cast<index_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<index_t>(gridDim.x) * blockDim.x) {
    const index_t i = e / cols, j = e % cols;
    const float g = ld(gate + i * gs + j);
    out[i * os + j] = cvt<S>(g * gelu_tanh_s(g) * ld(up + i * us + j));
  }
}

template <class S>
__global__ void geglu_backward_kernel(const S* gate, index_t gs, const S* up, index_t us,
                                      const S* dout, index_t ds, S* dgate, index_t dgs, S* dup,
                                      index_t dus, index_t rows, index_t cols) {
  const index_t n = rows * cols;
  for (index_t e = blockIdx.x * static_cast<index_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<index_t>(gridDim.x) * blockDim.x) {
    const index_t i = e / cols, j = e % cols;
    const float g = ld(gate + i * gs + j), s = gelu_tanh_s(g), d = ld(dout + i * ds + j);
    const float grad =
        s + 2.f * 0.7978845608028654f * g * s * (1.f - s) * (1.f + 3.f * 0.044715f * g * g);
    S* pg = dgate + i * dgs + j;
    S* pu = dup + i * dus + j;
    *pg = cvt<S>(ld(pg) + d * ld(up + i * us + j) * grad);
    *pu = cvt<S>(ld(pu) + d * g * s);
  }
}

/// In place: x = cap tanh(x / cap) (backward == false), or dx *= 1 - (capped / cap)^2.
template <class S>
__global__ void logit_softcap_kernel(const S* capped, index_t cs, S* x, index_t xs, index_t rows,
                                     index_t cols, float cap, bool backward) {
  const index_t n = rows * cols;
  for (index_t e = blockIdx.x * static_cast<index_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<index_t>(gridDim.x) * blockDim.x) {
    const index_t i = e / cols, j = e % cols;
    S* p = x + i * xs + j;
    if (backward) {
      const float y = ld(capped + i * cs + j) / cap;
      *p = cvt<S>(ld(p) * (1.f - y * y));
    } else {
      *p = cvt<S>(cap * tanhf(ld(p) / cap));
    }
  }
}

// ---- softmax cross-entropy --------------------------------------------------------------------

/// One block per row: lse = log sum exp(logits / tau), logprob = z[label] - lse (0 if ignored);
/// lse and logprob of type R (S, or float).
template <class S, class R = S>
__global__ void xent_forward_kernel(const S* logits, index_t ls, const std::int64_t* labels,
                                    float tau, R* lse, R* logprob, index_t vocab) {
  __shared__ float red[32];
  const index_t i = blockIdx.x;
  const S* row = logits + i * ls;
  const float inv = 1.f / tau;
  float mx = -INFINITY;
  for (index_t j = threadIdx.x; j < vocab; j += blockDim.x) mx = fmaxf(mx, ld(row + j) * inv);
  mx = block_max(mx, red);
  float sum = 0;
  for (index_t j = threadIdx.x; j < vocab; j += blockDim.x) sum += expf(ld(row + j) * inv - mx);
  sum = block_sum(sum, red);
  if (threadIdx.x == 0) {
    const float l = mx + logf(sum);
    lse[i] = cvt<R>(l);
    const std::int64_t y = labels[i];
    logprob[i] = cvt<R>(y == ignore_index ? 0.f : ld(row + y) * inv - l);
  }
}

/// In place: logits row <- coeff/tau (onehot(label) - softmax(logits / tau)); ignored rows -> 0.
template <class S, class R = S>
__global__ void xent_backward_kernel(S* logits, index_t ls, const std::int64_t* labels,
                                     const R* lse, const R* coeff, float tau, index_t vocab) {
  const index_t i = blockIdx.x;
  S* row = logits + i * ls;
  const std::int64_t y = labels[i];
  if (y == ignore_index) {
    for (index_t j = threadIdx.x; j < vocab; j += blockDim.x) row[j] = cvt<S>(0.f);
    return;
  }
  const float l = ld(lse + i), c = ld(coeff + i) / tau, inv = 1.f / tau;
  for (index_t j = threadIdx.x; j < vocab; j += blockDim.x) {
    const float p = expf(ld(row + j) * inv - l);
    row[j] = cvt<S>(c * ((j == y ? 1.f : 0.f) - p));
  }
}

// ---- optimizer updates ------------------------------------------------------------------------

/// Adam / AdamW as torch.optim (see reference_backend::adam_update); bc1, bc2 = 1 - beta^t.
/// P is the parameter type, G the gradient type, M the moment type (fp32 master state or S).
template <class P, class G, class M>
__global__ void adam_kernel(P* param, const G* grad, M* m, M* v, index_t n, float lr, float b1,
                            float b2, float eps, float wd, bool decoupled, float bc1, float bc2,
                            __nv_bfloat16* param_copy) {
  for (index_t e = blockIdx.x * static_cast<index_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<index_t>(gridDim.x) * blockDim.x) {
    float p = ld(param + e), g = ld(grad + e);
    if (!decoupled) g += wd * p;
    const float mi = b1 * ld(m + e) + (1.f - b1) * g;
    const float vi = b2 * ld(v + e) + (1.f - b2) * g * g;
    m[e] = cvt<M>(mi);
    v[e] = cvt<M>(vi);
    if (decoupled) p -= lr * wd * p;
    p -= lr * (mi / bc1) / (sqrtf(vi / bc2) + eps);
    param[e] = cvt<P>(p);
    if (param_copy != nullptr) param_copy[e] = __float2bfloat16(p);
  }
}

/// SGD as torch.optim.SGD without dampening / nesterov (see reference_backend::sgd_update).
template <class S>
__global__ void sgd_kernel(S* param, const S* grad, S* buf, index_t n, float lr, float mu, float wd,
                           bool use_sign) {
  for (index_t e = blockIdx.x * static_cast<index_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<index_t>(gridDim.x) * blockDim.x) {
    const float p = ld(param + e);
    float g = ld(grad + e) + wd * p;
    if (use_sign) g = static_cast<float>((g > 0.f) - (g < 0.f));
    if (mu != 0.f) {
      g = mu * ld(buf + e) + g;
      buf[e] = cvt<S>(g);
    }
    param[e] = cvt<S>(p - lr * g);
  }
}

}  // namespace tightfit::detail::cuda_k
