// tightfit/backend/detail/cuda_attention.cuh: causal flash attention forward / backward kernels
// of the CUDA backend, FlashAttention-2 style (Dao, "FlashAttention-2: Faster Attention with
// Better Parallelism and Work Partitioning", 2023).
//
// One sequence; rows of Q are positions [q0, q0 + nq), K/V row j is position k0 + j (j < nk: a
// key block of a longer call, attention_mask::k0). Query i, head h at position p = q0 + i sees
// keys [attn_first(p), attn_last(p)] (attention_mask: last = min(p, kmax - 1) with kmax =
// min(key_end, valid_len); first = max(p - window + 1, doc[p], 0), at most last) that lie in
// [k0, k0 + nk), through kv head h / group (GQA); a row with none gets O = 0, lse = -inf. Both
// bounds are non-decreasing in p: key tiles before the first key of a query tile, or query tiles
// past the last query of a key tile, are skipped.
//  - forward: a block per (query tile of BR rows, head) streams key tiles of BC keys through
//    shared memory with the online softmax (running max m, sum l, rescaled O accumulator) and
//    saves lse = m + log l; key tiles past the tile's last visible key are never loaded.
//  - backward: a block per (key tile, kv head) accumulates dK and dV over the heads of its
//    group and the query tiles that see it (P recomputed from the saved lse, D = rowsum(dO*O)
//    precomputed); dQ either by atomicAdd from the same blocks (fast, order not fixed) or, in
//    deterministic mode, by a second kernel, a block per (query tile, head), summing key tiles
//    in order (no atomics: bit-identical results run to run).
// Tiles are fp32 in dynamic shared memory with row stride hd + 1 (no bank conflicts when a
// warp walks a column); math in fp32.
// Plain CUDA cores, no tensor-core MMA: correct for any head_dim whose tiles fit the opt-in
// shared memory, not tuned.
#pragma once

#include <cuda_runtime.h>

#include "tightfit/backend/detail/cuda_kernels.cuh"
#include "tightfit/core/types.hpp"

namespace tightfit::detail::cuda_k {

inline constexpr int attn_br = 32;  ///< query rows per tile
inline constexpr int attn_bc = 32;  ///< keys per tile (one warp lane per key)
inline constexpr int attn_threads = 128;

/// Geometry shared by the attention kernels.
struct attn_args {
  index_t nq = 0, kmax = 0, q0 = 0;
  index_t k0 = 0, nk = 0;        ///< K/V row j is position k0 + j, j < nk
  index_t window = 0;            ///< 0: none
  const index_t* doc = nullptr;  ///< device doc_start of positions [0, q0 + nq), or null
  index_t heads = 1, group = 1, hd = 1;
  float scale = 1;
  float softcap = 0;  ///< > 0: scores s -> softcap tanh(s / softcap) (Gemma 2)
};

/// The score of q.k after scaling and the optional soft-capping.
__device__ __forceinline__ float attn_score(const attn_args& a, float qk) {
  const float s = a.scale * qk;
  return a.softcap > 0.f ? a.softcap * tanhf(s / a.softcap) : s;
}

/// The last key position p sees.
__host__ __device__ __forceinline__ index_t attn_last(const attn_args& a, index_t p) {
  return p < a.kmax - 1 ? p : a.kmax - 1;
}
/// The first key position p sees (at most attn_last: a padded row keeps one key).
__host__ __device__ __forceinline__ index_t attn_first(const attn_args& a, index_t p) {
  index_t f = a.window > 0 && p - a.window + 1 > 0 ? p - a.window + 1 : 0;
  if (a.doc != nullptr && a.doc[p] > f) f = a.doc[p];
  const index_t last = attn_last(a, p);
  return f < last ? f : last;
}

/// Whether query row i sees K/V row j (local; position k0 + j).
__host__ __device__ __forceinline__ bool attn_visible(const attn_args& a, index_t i, index_t j) {
  if (i >= a.nq || j >= a.nk) return false;
  const index_t p = a.q0 + i, pos = a.k0 + j;
  return pos <= attn_last(a, p) && pos >= attn_first(a, p);
}
/// The local K/V rows below kmax: [0, clamp(kmax - k0, 0, nk)).
__host__ __device__ __forceinline__ index_t attn_local_keys(const attn_args& a) {
  const index_t e = a.kmax - a.k0;
  return e < 0 ? 0 : (e < a.nk ? e : a.nk);
}
/// The local K/V rows [begin, end) a query tile [i0, ilast] may see (end <= begin: none).
__host__ __device__ __forceinline__ index_t attn_local_begin(const attn_args& a, index_t i0) {
  const index_t f = attn_first(a, a.q0 + i0) - a.k0;
  return f > 0 ? f : 0;
}
__host__ __device__ __forceinline__ index_t attn_local_end(const attn_args& a, index_t ilast) {
  const index_t e = (a.q0 + ilast + 1 < a.kmax ? a.q0 + ilast + 1 : a.kmax) - a.k0;
  return e < a.nk ? e : a.nk;
}

/// Loads rows [r0, r0 + n) of columns [c0, c0 + hd) of a strided matrix into a (n, hd) fp32
/// tile with row stride hd + 1 (so that walking a column hits 32 banks); rows at or past
/// `rows` read as 0.
template <class S>
__device__ __forceinline__ void attn_load(float* tile, const S* m, index_t stride, index_t r0,
                                          index_t rows, index_t c0, index_t hd, int n) {
  for (index_t e = threadIdx.x; e < n * hd; e += blockDim.x) {
    const index_t r = e / hd, c = e % hd;
    tile[r * (hd + 1) + c] = r0 + r < rows ? ld(m + (r0 + r) * stride + c0 + c) : 0.f;
  }
}

/// Forward: O (nq, heads*hd), lse (nq, heads) of type L (S, or float for a scratch lse).
/// With LseOnly, only lse is computed (the bf16 backward recomputes an fp32 lse this way).
/// Grid (ceil(nq / BR), heads).
template <class S, class L, bool LseOnly>
__global__ void __launch_bounds__(attn_threads)
    attn_forward_kernel(attn_args a, const S* q, index_t qs, const S* k, index_t ks, const S* v,
                        index_t vs, S* o, index_t os, L* lse, index_t lss) {
  extern __shared__ float smem[];
  const index_t hd = a.hd, tls = hd + 1;  // tiles have row stride tls
  float* qt = smem;                       // (BR, hd)
  float* kt = qt + attn_br * tls;         // (BC, hd)
  float* vt = kt + attn_bc * tls;         // (BC, hd)
  float* ot = vt + attn_bc * tls;         // (BR, hd) unnormalised O
  float* st = ot + attn_br * tls;         // (BR, BC) scores, then P
  float* mrow = st + attn_br * attn_bc;   // (BR) running max
  float* lrow = mrow + attn_br;           // (BR) running sum
  float* arow = lrow + attn_br;           // (BR) rescale factor of this tile
  const index_t i0 = static_cast<index_t>(blockIdx.x) * attn_br, h = blockIdx.y;
  const index_t kvc = (h / a.group) * hd, qc = h * hd;
  attn_load(qt, q, qs, i0, a.nq, qc, hd, attn_br);
  for (index_t e = threadIdx.x; e < attn_br * hd; e += blockDim.x) ot[e] = 0.f;
  if (threadIdx.x < attn_br) {
    mrow[threadIdx.x] = -INFINITY;
    lrow[threadIdx.x] = 0.f;
  }
  const index_t ilast = (i0 + attn_br < a.nq ? i0 + attn_br : a.nq) - 1;
  const index_t kend = attn_local_end(a, ilast);
  const index_t kbegin = attn_local_begin(a, i0);
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  const int warps = static_cast<int>(blockDim.x) / 32;
  for (index_t j0 = kbegin; j0 < kend; j0 += attn_bc) {
    __syncthreads();
    attn_load(kt, k, ks, j0, kend, kvc, hd, attn_bc);
    if (!LseOnly) attn_load(vt, v, vs, j0, kend, kvc, hd, attn_bc);
    __syncthreads();
    for (int e = static_cast<int>(threadIdx.x); e < attn_br * attn_bc; e += blockDim.x) {
      const int r = e / attn_bc, c = e % attn_bc;
      float s = -INFINITY;
      if (attn_visible(a, i0 + r, j0 + c)) {
        float acc = 0;
        for (index_t d = 0; d < hd; ++d) acc += qt[r * tls + d] * kt[c * tls + d];
        s = attn_score(a, acc);
      }
      st[e] = s;
    }
    __syncthreads();
    for (int r = warp; r < attn_br; r += warps) {  // one warp per row, one lane per key
      const float s = st[r * attn_bc + lane];
      const float mt = warp_max(s);
      const float mold = mrow[r];
      const float mnew = fmaxf(mold, mt);
      float p = 0.f, alpha = 1.f;
      if (mnew != -INFINITY) {
        p = s == -INFINITY ? 0.f : expf(s - mnew);
        alpha = mold == -INFINITY ? 0.f : expf(mold - mnew);
      }
      const float psum = warp_sum(p);
      st[r * attn_bc + lane] = p;
      __syncwarp();
      if (lane == 0) {
        lrow[r] = alpha * lrow[r] + psum;
        mrow[r] = mnew;
        arow[r] = alpha;
      }
    }
    __syncthreads();
    if (!LseOnly)
      for (index_t e = threadIdx.x; e < attn_br * hd; e += blockDim.x) {
        const index_t r = e / hd, c = e % hd;
        float acc = arow[r] * ot[e];
        for (int cc = 0; cc < attn_bc; ++cc) acc += st[r * attn_bc + cc] * vt[cc * tls + c];
        ot[e] = acc;
      }
  }
  __syncthreads();
  if (!LseOnly)
    for (index_t e = threadIdx.x; e < attn_br * hd; e += blockDim.x) {
      const index_t r = e / hd, c = e % hd;
      if (i0 + r < a.nq) o[(i0 + r) * os + qc + c] = cvt<S>(lrow[r] > 0.f ? ot[e] / lrow[r] : 0.f);
    }
  if (threadIdx.x < attn_br && i0 + threadIdx.x < a.nq) {  // no key in the block: -inf
    const float l =
        lrow[threadIdx.x] > 0.f ? mrow[threadIdx.x] + logf(lrow[threadIdx.x]) : -INFINITY;
    if constexpr (std::is_same_v<L, float>)
      lse[(i0 + threadIdx.x) * lss + h] = l;
    else
      lse[(i0 + threadIdx.x) * lss + h] = cvt<L>(l);
  }
}

/// D (nq, heads) fp32 = rowsum(dO * O) per head; one block per query row, a warp per head.
template <class S>
__global__ void attn_dot_kernel(attn_args a, const S* o, index_t os, const S* dout, index_t ds,
                                float* dvec) {
  const index_t i = blockIdx.x;
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  const int warps = static_cast<int>(blockDim.x) / 32;
  for (index_t h = warp; h < a.heads; h += warps) {
    float acc = 0;
    for (index_t c = lane; c < a.hd; c += 32)
      acc += ld(o + i * os + h * a.hd + c) * ld(dout + i * ds + h * a.hd + c);
    acc = warp_sum(acc);
    if (lane == 0) dvec[i * a.heads + h] = acc;
  }
}

/// P and dS of one (query tile, key tile) pair: P = exp(c - lse) on visible pairs with the
/// score c = attn_score(q.k), dS = P (dO.v - D) (times 1 - (c / cap)^2 with soft-capping). Tiles
/// qt, dot (BR, hd), kt, vt (BC, hd); pt, dst (BR, BC).
__device__ __forceinline__ void attn_p_ds(const attn_args& a, index_t i0, index_t j0,
                                          const float* qt, const float* dot, const float* kt,
                                          const float* vt, const float* lrow, const float* drow,
                                          float* pt, float* dst) {
  const index_t hd = a.hd, tls = hd + 1;  // tiles have row stride tls
  for (int e = static_cast<int>(threadIdx.x); e < attn_br * attn_bc; e += blockDim.x) {
    const int r = e / attn_bc, c = e % attn_bc;
    float p = 0.f, ds = 0.f;
    if (attn_visible(a, i0 + r, j0 + c)) {
      float qk = 0, dov = 0;
      for (index_t d = 0; d < hd; ++d) {
        qk += qt[r * tls + d] * kt[c * tls + d];
        dov += dot[r * tls + d] * vt[c * tls + d];
      }
      const float c = attn_score(a, qk);
      p = expf(c - lrow[r]);
      ds = p * (dov - drow[r]);
      if (a.softcap > 0.f) ds *= 1.f - (c / a.softcap) * (c / a.softcap);
    }
    pt[e] = p;
    dst[e] = ds;
  }
}

/// Backward over one key tile and one kv head: dK, dV (nk, kv_heads*hd) +=; with AtomicDq also
/// dQ (float, nq x heads*hd) += by atomicAdd. lse and D are fp32 (nq, heads) with row stride
/// lss / heads. Grid (ceil(kmax / BC), kv_heads).
template <class S, bool AtomicDq>
__global__ void __launch_bounds__(attn_threads)
    attn_backward_dkdv_kernel(attn_args a, const S* q, index_t qs, const S* k, index_t ks,
                              const S* v, index_t vs, const S* dout, index_t ds, const float* lse,
                              index_t lss, const float* dvec, float* dq, index_t dqs, S* dk,
                              index_t dks, S* dv, index_t dvs) {
  extern __shared__ float smem[];
  const index_t hd = a.hd, tls = hd + 1;  // tiles have row stride tls
  float* kt = smem;                       // (BC, hd)
  float* vt = kt + attn_bc * tls;         // (BC, hd)
  float* dkt = vt + attn_bc * tls;        // (BC, hd)
  float* dvt = dkt + attn_bc * tls;       // (BC, hd)
  float* qt = dvt + attn_bc * tls;        // (BR, hd)
  float* dot = qt + attn_br * tls;        // (BR, hd)
  float* pt = dot + attn_br * tls;        // (BR, BC)
  float* dst = pt + attn_br * attn_bc;    // (BR, BC)
  float* lrow = dst + attn_br * attn_bc;  // (BR)
  float* drow = lrow + attn_br;           // (BR)
  const index_t j0 = static_cast<index_t>(blockIdx.x) * attn_bc, g = blockIdx.y;
  const index_t kvc = g * hd;
  const index_t kloc = attn_local_keys(a);
  attn_load(kt, k, ks, j0, kloc, kvc, hd, attn_bc);
  attn_load(vt, v, vs, j0, kloc, kvc, hd, attn_bc);
  for (index_t e = threadIdx.x; e < attn_bc * hd; e += blockDim.x) dkt[e] = dvt[e] = 0.f;
  // first query row that sees key position k0 + j0: q0 + i >= k0 + j0
  const index_t jpos = a.k0 + j0;
  const index_t ifirst = jpos - a.q0 > 0 ? ((jpos - a.q0) / attn_br) * attn_br : 0;
  for (index_t h = g * a.group; h < (g + 1) * a.group; ++h) {
    const index_t qc = h * hd;
    // rows whose first key is past this tile see none of it (and neither do later rows)
    for (index_t i0 = ifirst; i0 < a.nq && attn_first(a, a.q0 + i0) < jpos + attn_bc;
         i0 += attn_br) {
      __syncthreads();
      attn_load(qt, q, qs, i0, a.nq, qc, hd, attn_br);
      attn_load(dot, dout, ds, i0, a.nq, qc, hd, attn_br);
      if (threadIdx.x < attn_br) {
        const index_t i = i0 + threadIdx.x;
        lrow[threadIdx.x] = i < a.nq ? lse[i * lss + h] : 0.f;
        drow[threadIdx.x] = i < a.nq ? dvec[i * a.heads + h] : 0.f;
      }
      __syncthreads();
      attn_p_ds(a, i0, j0, qt, dot, kt, vt, lrow, drow, pt, dst);
      __syncthreads();
      for (index_t e = threadIdx.x; e < attn_bc * hd; e += blockDim.x) {
        const index_t c = e / hd, d = e % hd;
        float accv = 0, acck = 0;
        for (int r = 0; r < attn_br; ++r) {
          accv += pt[r * attn_bc + c] * dot[r * tls + d];
          acck += dst[r * attn_bc + c] * qt[r * tls + d];
        }
        dvt[e] += accv;
        dkt[e] += a.scale * acck;
      }
      if (AtomicDq)
        for (index_t e = threadIdx.x; e < attn_br * hd; e += blockDim.x) {
          const index_t r = e / hd, d = e % hd;
          if (i0 + r >= a.nq) continue;
          float acc = 0;
          for (int c = 0; c < attn_bc; ++c) acc += dst[r * attn_bc + c] * kt[c * tls + d];
          if (acc != 0.f) atomicAdd(dq + (i0 + r) * dqs + qc + d, a.scale * acc);
        }
    }
  }
  __syncthreads();
  for (index_t e = threadIdx.x; e < attn_bc * hd; e += blockDim.x) {
    const index_t c = e / hd, d = e % hd;
    if (j0 + c >= kloc) continue;
    S* pk = dk + (j0 + c) * dks + kvc + d;
    S* pv = dv + (j0 + c) * dvs + kvc + d;
    *pk = cvt<S>(ld(pk) + dkt[e]);
    *pv = cvt<S>(ld(pv) + dvt[e]);
  }
}

/// Deterministic dQ: a block per (query tile, head) sums the key tiles in order;
/// dQ (nq, heads*hd) +=. Grid (ceil(nq / BR), heads).
template <class S>
__global__ void __launch_bounds__(attn_threads)
    attn_backward_dq_kernel(attn_args a, const S* q, index_t qs, const S* k, index_t ks, const S* v,
                            index_t vs, const S* dout, index_t ds, const float* lse, index_t lss,
                            const float* dvec, S* dq, index_t dqs) {
  extern __shared__ float smem[];
  const index_t hd = a.hd, tls = hd + 1;  // tiles have row stride tls
  float* qt = smem;                       // (BR, hd)
  float* dot = qt + attn_br * tls;        // (BR, hd)
  float* dqt = dot + attn_br * tls;       // (BR, hd)
  float* kt = dqt + attn_br * tls;        // (BC, hd)
  float* vt = kt + attn_bc * tls;         // (BC, hd)
  float* pt = vt + attn_bc * tls;         // (BR, BC)
  float* dst = pt + attn_br * attn_bc;    // (BR, BC)
  float* lrow = dst + attn_br * attn_bc;  // (BR)
  float* drow = lrow + attn_br;           // (BR)
  const index_t i0 = static_cast<index_t>(blockIdx.x) * attn_br, h = blockIdx.y;
  const index_t qc = h * hd, kvc = (h / a.group) * hd;
  attn_load(qt, q, qs, i0, a.nq, qc, hd, attn_br);
  attn_load(dot, dout, ds, i0, a.nq, qc, hd, attn_br);
  for (index_t e = threadIdx.x; e < attn_br * hd; e += blockDim.x) dqt[e] = 0.f;
  if (threadIdx.x < attn_br) {
    const index_t i = i0 + threadIdx.x;
    lrow[threadIdx.x] = i < a.nq ? lse[i * lss + h] : 0.f;
    drow[threadIdx.x] = i < a.nq ? dvec[i * a.heads + h] : 0.f;
  }
  const index_t ilast = (i0 + attn_br < a.nq ? i0 + attn_br : a.nq) - 1;
  const index_t kend = attn_local_end(a, ilast);
  for (index_t j0 = attn_local_begin(a, i0); j0 < kend; j0 += attn_bc) {
    __syncthreads();
    attn_load(kt, k, ks, j0, kend, kvc, hd, attn_bc);
    attn_load(vt, v, vs, j0, kend, kvc, hd, attn_bc);
    __syncthreads();
    attn_p_ds(a, i0, j0, qt, dot, kt, vt, lrow, drow, pt, dst);
    __syncthreads();
    for (index_t e = threadIdx.x; e < attn_br * hd; e += blockDim.x) {
      const index_t r = e / hd, d = e % hd;
      float acc = 0;
      for (int c = 0; c < attn_bc; ++c) acc += dst[r * attn_bc + c] * kt[c * tls + d];
      dqt[e] += a.scale * acc;
    }
  }
  __syncthreads();
  for (index_t e = threadIdx.x; e < attn_br * hd; e += blockDim.x) {
    const index_t r = e / hd, d = e % hd;
    if (i0 + r >= a.nq) continue;
    S* p = dq + (i0 + r) * dqs + qc + d;
    *p = cvt<S>(ld(p) + dqt[e]);
  }
}

/// merge_attention_blocks (backend/concept.hpp) on the device: one thread per (row, head); lse
/// of type L (S or float).
template <class S, class L>
__global__ void attn_merge_kernel(index_t n, index_t heads, index_t hd, S* o, index_t os, L* lse,
                                  index_t ls, const S* ob, index_t obs, const L* lb, index_t lbs) {
  const index_t e = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= n * heads) return;
  const index_t i = e / heads, h = e % heads;
  const float l = ld(lse + i * ls + h), b = ld(lb + i * lbs + h);
  if (b == -INFINITY) return;
  S* oi = o + i * os + h * hd;
  const S* bi = ob + i * obs + h * hd;
  if (l == -INFINITY) {
    for (index_t c = 0; c < hd; ++c) oi[c] = bi[c];
    lse[i * ls + h] = lb[i * lbs + h];
    return;
  }
  const float m = fmaxf(l, b), ea = expf(l - m), eb = expf(b - m), sum = ea + eb;
  for (index_t c = 0; c < hd; ++c) oi[c] = cvt<S>((ea * ld(oi + c) + eb * ld(bi + c)) / sum);
  lse[i * ls + h] = cvt<L>(m + logf(sum));
}

/// Shared-memory bytes of each kernel for head_dim hd.
inline std::size_t attn_forward_smem(index_t hd) {
  return sizeof(float) * static_cast<std::size_t>((2 * attn_br + 2 * attn_bc) * (hd + 1) +
                                                  attn_br * attn_bc + 3 * attn_br);
}
inline std::size_t attn_dkdv_smem(index_t hd) {
  return sizeof(float) * static_cast<std::size_t>((4 * attn_bc + 2 * attn_br) * (hd + 1) +
                                                  2 * attn_br * attn_bc + 2 * attn_br);
}
inline std::size_t attn_dq_smem(index_t hd) {
  return sizeof(float) * static_cast<std::size_t>((3 * attn_br + 2 * attn_bc) * (hd + 1) +
                                                  2 * attn_br * attn_bc + 2 * attn_br);
}

}  // namespace tightfit::detail::cuda_k
