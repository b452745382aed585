// tightfit/backend/detail/cuda_attention_mma.cuh: tensor-core flash attention forward and
// backward for bf16 storage on sm_80 and newer, after FlashAttention-2 (Dao, "FlashAttention-2:
// Faster Attention with Better Parallelism and Work Partitioning", 2023): mma.sync m16n8k16
// (bf16 inputs, fp32 accumulation) fed by ldmatrix, K/V (forward, dQ) or Q/dO (dK/dV) tiles
// double-buffered through shared memory with cp.async, the online softmax and the lse in fp32.
//
// Same contract and geometry as the CUDA-core kernels (cuda_attention.cuh, attn_args): query i
// at position q0 + i sees the keys [attn_first, attn_last] of that file inside the call's
// K/V rows [k0, k0 + nk), through kv head h / group; a row with none gets O = 0, lse = -inf.
//  - forward: a block per (query tile of BR = 64 rows, head), a warp per 16 rows; key tiles of
//    BC = 64 keys stream through two shared-memory stages (cp.async of tile j + 1 while tile j
//    is computed); S = Q K^T and O += P V on tensor cores, P rounded to bf16 as its A operand.
//  - backward: P recomputed per tile from the saved fp32 lse, D = rowsum(dO * O) precomputed
//    (attn_dot_kernel). dK/dV: a block per (key tile of 64 keys, kv head), a warp per 16 keys,
//    accumulating dV += P^T dO and dK += dS^T Q in registers over the group's heads and the query
//    tiles that see the key tile (Q/dO tiles double-buffered); with AtomicDq the same block
//    adds dQ = dS K into an fp32 scratch by atomicAdd (then dq += scale * scratch). The
//    deterministic dQ: a block per (query tile, head) summing key tiles in order, no atomics.
// Masking: each tile is classified once per block: fully visible tiles skip the per-element
// test; the others (causal diagonal, window / document edges, padding, the block's last rows or
// keys) compare each key with its row's visible range. Rows with no visible key keep m = -inf;
// exponentials then use 0 as their shift, so they give P = 0, O = 0 and lse = -inf, never NaN.
// Scores are kept in log2 units (exp2f); with soft-capping the capped score is computed first.
//
// Fragment layouts (PTX ISA, mma.m16n8k16 .bf16; lane = 4 g + t): A (16x16, row-major) a0 =
// (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 2t+8..), a3 = (g+8, 2t+8..); B (16x8, "col") b0 =
// (k 2t..2t+1, n g), b1 = (k 2t+8.., n g); C (16x8 fp32) c0, c1 = (g, 2t..2t+1), c2, c3 =
// (g+8, 2t..). ldmatrix.x4: lanes 8m..8m+7 give the row addresses of matrix m, register m of
// lane l holds row l/4, columns 2(l%4)..+1 of matrix m (.trans: of its transpose). So a row-
// major smem tile gives A directly; a tile stored (n, k) gives B directly (K for S = Q K^T); a
// tile stored (k, n) gives B through .trans (V for O = P V); and C fragments of two adjacent
// n-blocks are the A fragment of a 16-wide k-step (P for O = P V) without moving data.
//
// Invariants the host checks (cuda.hpp, mma_attention_refusal): bf16, head_dim in {64, 128},
// every row stride a multiple of 8 elements and every base pointer 16-byte aligned (cp.async
// and ldmatrix move 16 bytes), compute capability >= 8.0. Shared-memory rows are padded by 8
// elements (16 bytes), so the 8 rows of an ldmatrix hit 8 distinct 16-byte bank groups.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <type_traits>

#include "tightfit/backend/detail/cuda_attention.cuh"
#include "tightfit/core/types.hpp"

namespace tightfit::detail::cuda_k::mma {

using bf16 = __nv_bfloat16;

inline constexpr int warps = 4;
inline constexpr int threads = 32 * warps;
inline constexpr int br = 16 * warps;  ///< query rows per tile (16 per warp)
inline constexpr int bc = 64;          ///< keys per tile
inline constexpr int bq = br / 2;      ///< dK/dV kernel: query columns per register pass
inline constexpr int pad = 8;          ///< shared-memory row padding, elements (16 bytes)
inline constexpr float log2e = 1.4426950408889634f;
inline constexpr float ln2 = 0.6931471805599453f;
inline constexpr index_t none_lo = index_t{1} << 60;  ///< row bounds of a row that sees nothing
inline constexpr index_t none_hi = -(index_t{1} << 60);

/// Head dims with a tensor-core instantiation.
__host__ __device__ constexpr bool supported_head_dim(index_t hd) {
  return hd == 64 || hd == 128;
}

/// A matrix operand of an attention call, as the eligibility test sees it.
struct operand {
  const void* data;
  index_t stride;  ///< elements
};
/// Why the tensor-core kernels cannot run a call (nullptr when they can): storage other than
/// bf16, a head_dim without an instantiation, a device before sm_80, positions (queries or keys)
/// past 2^31 - 1 (the dK/dV kernel keeps key bounds in int32), an operand whose base is not
/// 16-byte aligned or whose row stride is not a multiple of 8 elements.
inline const char* refusal(bool bf16_storage, index_t head_dim, int cc_major, index_t positions,
                           std::initializer_list<operand> ops) {
  if (!bf16_storage) return "float storage keeps the CUDA-core kernel";
  if (!supported_head_dim(head_dim)) return "head_dim is not 64 or 128";
  if (cc_major < 8) return "the device is older than sm_80";
  if (positions >= INT32_MAX) return "a position is past 2^31 - 1";
  for (const operand& o : ops) {
    if (reinterpret_cast<std::uintptr_t>(o.data) % 16 != 0)
      return "an operand is not 16-byte aligned";
    if (o.stride % 8 != 0) return "a row stride is not a multiple of 8 elements";
  }
  return nullptr;
}

// ---- PTX wrappers (sm_80+) --------------------------------------------------------------------

__device__ __forceinline__ std::uint32_t smem_u32(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}
/// 16 bytes global -> shared, asynchronous; valid == false zero-fills (reads nothing).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
               "r"(n)
               : "memory");
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
/// Waits until at most N of this thread's cp.async groups are pending.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}
/// Four 8x8 b16 matrices from shared memory (ldmatrix.x4), transposed with Trans.
template <bool Trans = false>
__device__ __forceinline__ void ldsm_x4(std::uint32_t (&r)[4], const bf16* p) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  if constexpr (Trans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p))
                 : "memory");
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p))
                 : "memory");
#endif
}
/// c (16x8 fp32) += a (16x16 bf16, row) * b (16x8 bf16, col).
__device__ __forceinline__ void mma16816(float (&c)[4], const std::uint32_t (&a)[4],
                                         std::uint32_t b0, std::uint32_t b1) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}
/// Two floats as a bf16 pair: lo in the low half (the lower column of a fragment).
__device__ __forceinline__ std::uint32_t pack(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  std::uint32_t u;
  std::memcpy(&u, &v, sizeof u);
  return u;
}
/// p[0..1] += (x, y) in bf16 (read, add in fp32, round).
__device__ __forceinline__ void add_pair(bf16* p, float x, float y) {
  __nv_bfloat162 v;
  std::memcpy(&v, p, sizeof v);
  const float2 f = __bfloat1622float2(v);
  const std::uint32_t u = pack(f.x + x, f.y + y);
  std::memcpy(p, &u, sizeof u);
}

// ---- tiles -----------------------------------------------------------------------------------

/// Rows [r0, r0 + R) of columns [c0, c0 + HD) of a strided bf16 matrix into a (R, HD + pad)
/// shared tile by cp.async; rows at or past `rows` are zero-filled (and never read).
template <int R, int HD>
__device__ __forceinline__ void load_tile(bf16* tile, const bf16* m, index_t stride, index_t r0,
                                          index_t rows, index_t c0) {
  constexpr int chunks = HD / 8;  // 16-byte chunks per row
  for (int e = static_cast<int>(threadIdx.x); e < R * chunks; e += threads) {
    const int r = e / chunks, c = (e % chunks) * 8;
    const bool ok = r0 + r < rows;
    cp_async16(tile + r * (HD + pad) + c, ok ? m + (r0 + r) * stride + c0 + c : m, ok);
  }
}

/// The key rows [lo, hi] (local to the call's K/V rows, inclusive) query row i sees; none_lo,
/// none_hi past the last query row (so a tile holding such rows is never "fully visible").
__host__ __device__ __forceinline__ void row_keys(const attn_args& a, index_t i, index_t& lo,
                                                  index_t& hi) {
  if (i >= a.nq) {
    lo = none_lo;
    hi = none_hi;
    return;
  }
  const index_t p = a.q0 + i;
  lo = attn_first(a, p) - a.k0;
  const index_t last = attn_last(a, p) - a.k0;
  hi = last < a.nk - 1 ? last : a.nk - 1;
}

/// A query-tile block's geometry (forward, dQ): rows [i0, i0 + BR) of head h, the last
/// tiles first (causal blocks then finish together), its local key rows [kbegin, kend), the
/// visible key rows [lo, hi] of this thread's rows i0 + 16 warp + g (+ 8), and the tile's max
/// lo / min hi (tile_full; none_lo when rows past nq are in the tile).
struct query_tile {
  index_t i0, h, qc, kvc, ilast, kbegin, kend;
  index_t lo[2], hi[2], lo_max, hi_min;
  __device__ query_tile(const attn_args& a, index_t hd, int warp, int g)
      : i0(static_cast<index_t>(gridDim.x - 1 - blockIdx.x) * br),
        h(blockIdx.y),
        qc(h * hd),
        kvc((h / a.group) * hd),
        ilast((i0 + br < a.nq ? i0 + br : a.nq) - 1),
        kbegin(attn_local_begin(a, i0)),
        kend(attn_local_end(a, ilast)) {
    row_keys(a, i0 + warp * 16 + g, lo[0], hi[0]);
    row_keys(a, i0 + warp * 16 + g + 8, lo[1], hi[1]);
    index_t unused;
    row_keys(a, ilast, lo_max, unused);
    row_keys(a, i0, unused, hi_min);
    if (i0 + br > a.nq) lo_max = none_lo;  // rows past nq: masked tiles only
  }
};

/// The score of a raw q.k in log2 units: scale q.k, soft-capped when softcap > 0, times log2 e.
__device__ __forceinline__ float score2(const attn_args& a, float qk) {
  return attn_score(a, qk) * log2e;
}

/// The (row, column) offset, inside a 16 x 16 block of a stored tile, of the 8-element row that
/// `lane` addresses for an ldmatrix.x4 (lanes 8m .. 8m + 7: the rows of matrix m), per use:
///  - a:    A row-major (rows = A rows): matrices (rows 0-7 | 8-15) x (cols 0-7 | 8-15) in
///          register order a0 (0-7, 0-7), a1 (8-15, 0-7), a2 (0-7, 8-15), a3 (8-15, 8-15);
///  - a_t:  A stored transposed, (k, m) (with .trans): the same four A blocks;
///  - b_nk: B stored (n, k), two n-blocks: b0, b1 of n 0-7, then b0, b1 of n 8-15;
///  - b_kn: B stored (k, n) (with .trans): the same order.
/// tests/cuda/test_cuda_attention.cu checks them against the mma fragment layouts by emulation.
struct lane_offset {
  int r, c;
};
__host__ __device__ constexpr lane_offset ldsm_a(int lane) {
  return {(lane & 7) + ((lane >> 3) & 1) * 8, (lane >> 4) * 8};
}
__host__ __device__ constexpr lane_offset ldsm_a_t(int lane) {
  return {(lane & 7) + (lane >> 4) * 8, ((lane >> 3) & 1) * 8};
}
__host__ __device__ constexpr lane_offset ldsm_b_nk(int lane) {
  return {(lane & 7) + (lane >> 4) * 8, ((lane >> 3) & 1) * 8};
}
__host__ __device__ constexpr lane_offset ldsm_b_kn(int lane) {
  return {(lane & 7) + ((lane >> 3) & 1) * 8, (lane >> 4) * 8};
}

/// ldmatrix.x4 of the 16 x 16 block at (r0, c0) of a stored tile (row stride ld), each lane
/// addressing the row Offset gives it (one of the ldsm_* above), transposed with Trans.
template <bool Trans, lane_offset (*Offset)(int)>
__device__ __forceinline__ void ld_block(std::uint32_t (&f)[4], const bf16* tile, int ld, int r0,
                                         int c0, int lane) {
  const lane_offset o = Offset(lane);
  ldsm_x4<Trans>(f, tile + (r0 + o.r) * ld + c0 + o.c);
}
/// Loads the A fragment of rows [r, r + 16) x columns [c, c + 16) of a row-major smem tile.
__device__ __forceinline__ void ld_a(std::uint32_t (&f)[4], const bf16* tile, int ld, int r, int c,
                                     int lane) {
  ld_block<false, ldsm_a>(f, tile, ld, r, c, lane);
}
/// The A fragment of the transpose of a stored (k, m) tile: A rows [m, m + 16), k [k, k + 16).
__device__ __forceinline__ void ld_a_t(std::uint32_t (&f)[4], const bf16* tile, int ld, int m,
                                       int k, int lane) {
  ld_block<true, ldsm_a_t>(f, tile, ld, k, m, lane);
}
/// B fragments of two n-blocks [n, n + 8), [n + 8, n + 16) at k-step [k, k + 16) from a tile
/// stored (n, k) row-major: f[0], f[1] for the first n-block, f[2], f[3] for the second.
__device__ __forceinline__ void ld_b_nk(std::uint32_t (&f)[4], const bf16* tile, int ld, int n,
                                        int k, int lane) {
  ld_block<false, ldsm_b_nk>(f, tile, ld, n, k, lane);
}
/// The same from a tile stored (k, n) row-major (ldmatrix .trans).
__device__ __forceinline__ void ld_b_kn(std::uint32_t (&f)[4], const bf16* tile, int ld, int n,
                                        int k, int lane) {
  ld_block<true, ldsm_b_kn>(f, tile, ld, k, n, lane);
}
/// The A fragment (16 x 16) of C fragments c[2j], c[2j + 1] (two adjacent n-blocks), in bf16.
template <int N>
__device__ __forceinline__ void c_to_a(std::uint32_t (&f)[4], const float (&c)[N][4], int j) {
  f[0] = pack(c[2 * j][0], c[2 * j][1]);
  f[1] = pack(c[2 * j][2], c[2 * j][3]);
  f[2] = pack(c[2 * j + 1][0], c[2 * j + 1][1]);
  f[3] = pack(c[2 * j + 1][2], c[2 * j + 1][3]);
}

/// Whether the key tile [j0, j0 + bc) needs no per-element mask for a tile of query rows whose
/// visible key rows [lo_i, hi_i] have max lo = lo_max and min hi = hi_min.
__host__ __device__ __forceinline__ bool tile_full(index_t j0, index_t lo_max, index_t hi_min) {
  return j0 >= lo_max && j0 + bc - 1 <= hi_min;
}

/// c (16, 8 N) = A B^T over k in [0, HD) on the warp: A rows [ar, ar + 16) of a row-major
/// tile, B rows [bn, bn + 8 N) of a tile stored (n, k); both with row stride ld.
template <int HD, int N>
__device__ __forceinline__ void warp_abt(float (&c)[N][4], const bf16* a, int ar, const bf16* b,
                                         int bn, int ld, int lane) {
#pragma unroll
  for (auto& x : c) x[0] = x[1] = x[2] = x[3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk) {
    std::uint32_t fa[4];
    ld_a(fa, a, ld, ar, kk * 16, lane);
#pragma unroll
    for (int nb = 0; nb < N / 2; ++nb) {
      std::uint32_t fb[4];
      ld_b_nk(fb, b, ld, bn + nb * 16, kk * 16, lane);
      mma16816(c[2 * nb], fa, fb[0], fb[1]);
      mma16816(c[2 * nb + 1], fa, fb[2], fb[3]);
    }
  }
}

/// acc (16, HD) += P B on the warp: P (16, 8 N) the C fragments of an earlier product (as bf16
/// A fragments), B rows [bk, bk + 8 N) of a tile stored (k, n) with row stride ld (.trans).
template <int HD, int N>
__device__ __forceinline__ void warp_pb(float (&acc)[HD / 8][4], const float (&p)[N][4],
                                        const bf16* b, int bk, int ld, int lane) {
#pragma unroll
  for (int kk = 0; kk < N / 2; ++kk) {
    std::uint32_t pa[4];
    c_to_a(pa, p, kk);
#pragma unroll
    for (int db = 0; db < HD / 16; ++db) {
      std::uint32_t fb[4];
      ld_b_kn(fb, b, ld, db * 16, bk + kk * 16, lane);
      mma16816(acc[2 * db], pa, fb[0], fb[1]);
      mma16816(acc[2 * db + 1], pa, fb[2], fb[3]);
    }
  }
}

// ---- forward ---------------------------------------------------------------------------------

/// Shared bytes of the forward: Q (BR, HD+pad) and two stages of K and V (BC, HD+pad).
__host__ __device__ constexpr std::size_t fwd_smem(int hd) {
  return sizeof(bf16) * static_cast<std::size_t>((br + 4 * bc) * (hd + pad));
}

/// O (nq, heads*HD) bf16 and lse (nq, heads) of type L (float, or bf16 for a bf16 contract);
/// with LseOnly only lse (V is never read: a backward given a bf16 lse recomputes it in fp32).
/// Grid (ceil(nq / BR), heads), block `threads`, fwd_smem(HD) bytes of dynamic shared memory.
template <int HD, class L, bool LseOnly>
__global__ void __launch_bounds__(threads)
    fwd_kernel(attn_args a, const bf16* q, index_t qs, const bf16* k, index_t ks, const bf16* v,
               index_t vs, bf16* o, index_t os, L* lse, index_t lss) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  constexpr int ld = HD + pad;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* qt = reinterpret_cast<bf16*>(smem_raw);  // (BR, ld)
  bf16* kt = qt + br * ld;                       // 2 stages x (BC, ld)
  bf16* vt = kt + 2 * bc * ld;                   // 2 stages x (BC, ld)
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  const int g = lane >> 2, t = lane & 3;
  const query_tile tile(a, HD, warp, g);
  const index_t i0 = tile.i0, h = tile.h, qc = tile.qc, kvc = tile.kvc;
  const index_t kbegin = tile.kbegin, kend = tile.kend;
  float acc[HD / 8][4];  // O (16, HD) of the warp, unnormalised
#pragma unroll
  for (auto& c : acc) c[0] = c[1] = c[2] = c[3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};  // log2 units; l: this lane's part
  std::uint32_t qf[HD / 16][4];                            // Q A-fragments of the warp
  if (kbegin < kend) {
    load_tile<br, HD>(qt, q, qs, i0, a.nq, qc);
    load_tile<bc, HD>(kt, k, ks, kbegin, kend, kvc);
    if (!LseOnly) load_tile<bc, HD>(vt, v, vs, kbegin, kend, kvc);
  }
  cp_async_commit();
  int stage = 0;
  for (index_t j0 = kbegin; j0 < kend; j0 += bc, stage ^= 1) {
    if (j0 + bc < kend) {  // the next tile into the other stage (free since the last barrier)
      load_tile<bc, HD>(kt + (stage ^ 1) * bc * ld, k, ks, j0 + bc, kend, kvc);
      if (!LseOnly) load_tile<bc, HD>(vt + (stage ^ 1) * bc * ld, v, vs, j0 + bc, kend, kvc);
    }
    cp_async_commit();
    cp_async_wait<1>();  // this tile (and Q) landed
    __syncthreads();
    if (j0 == kbegin)
#pragma unroll
      for (int kk = 0; kk < HD / 16; ++kk) ld_a(qf[kk], qt, ld, warp * 16, kk * 16, lane);
    const bf16* ks_ = kt + stage * bc * ld;
    const bf16* vs_ = vt + stage * bc * ld;
    float s[bc / 8][4];  // S (16, BC) of the warp
#pragma unroll
    for (auto& c : s) c[0] = c[1] = c[2] = c[3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk)
#pragma unroll
      for (int nb = 0; nb < bc / 16; ++nb) {
        std::uint32_t b[4];
        ld_b_nk(b, ks_, ld, nb * 16, kk * 16, lane);
        mma16816(s[2 * nb], qf[kk], b[0], b[1]);
        mma16816(s[2 * nb + 1], qf[kk], b[2], b[3]);
      }
    const bool full = tile_full(j0, tile.lo_max, tile.hi_min);
#pragma unroll
    for (int nb = 0; nb < bc / 8; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const index_t j = j0 + nb * 8 + 2 * t + (e & 1);
        const int r = e >> 1;
        s[nb][e] = full || (j >= tile.lo[r] && j <= tile.hi[r]) ? score2(a, s[nb][e]) : -INFINITY;
      }
#pragma unroll
    for (int r = 0; r < 2; ++r) {  // online softmax of row g + 8 r
      float mt = -INFINITY;
#pragma unroll
      for (int nb = 0; nb < bc / 8; ++nb) mt = fmaxf(mt, fmaxf(s[nb][2 * r], s[nb][2 * r + 1]));
      mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 1));
      mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 2));
      const float mnew = fmaxf(m[r], mt);
      const float mu = mnew == -INFINITY ? 0.f : mnew;  // no key yet: every exp2 below is 0
      const float alpha = exp2f(m[r] - mu);
      float sum = 0.f;
#pragma unroll
      for (int nb = 0; nb < bc / 8; ++nb)
        for (int e = 2 * r; e < 2 * r + 2; ++e) {
          s[nb][e] = exp2f(s[nb][e] - mu);
          sum += s[nb][e];
        }
      l[r] = alpha * l[r] + sum;
      m[r] = mnew;
      if (!LseOnly)
#pragma unroll
        for (auto& c : acc) {
          c[2 * r] *= alpha;
          c[2 * r + 1] *= alpha;
        }
    }
    if (!LseOnly) warp_pb<HD>(acc, s, vs_, 0, ld, lane);  // O += P V
    __syncthreads();  // every warp is done with this stage before it is refilled
  }
  cp_async_wait<0>();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    const index_t i = i0 + warp * 16 + g + 8 * r;
    if (i >= a.nq) continue;
    const float inv = l[r] > 0.f ? 1.f / l[r] : 0.f;
    if (!LseOnly) {
      bf16* orow = o + i * os + qc + 2 * t;
#pragma unroll
      for (int db = 0; db < HD / 8; ++db) {
        const std::uint32_t u = pack(acc[db][2 * r] * inv, acc[db][2 * r + 1] * inv);
        std::memcpy(orow + db * 8, &u, sizeof u);
      }
    }
    if (t == 0) {
      const float x = l[r] > 0.f ? m[r] * ln2 + logf(l[r]) : -INFINITY;
      if constexpr (std::is_same_v<L, float>)
        lse[i * lss + h] = x;
      else
        lse[i * lss + h] = cvt<L>(x);
    }
  }
#else
  __trap();
#endif
}

// ---- backward: dK, dV (and atomic dQ) --------------------------------------------------------

/// Shared bytes of the dK/dV kernel: K, V (BC, HD+pad); two stages of Q, dO (BR, HD+pad); dS^T
/// (BC, BR+pad); two stages of lse*log2e, D (BR floats) and the rows' key bounds (2 BR int32).
/// 115,712 bytes at head_dim 128: with the 1 KiB each block reserves, two blocks fill an
/// H100 / H200 SM's 228 KiB exactly.
__host__ __device__ constexpr std::size_t dkdv_smem(int hd) {
  return sizeof(bf16) * static_cast<std::size_t>((2 * bc + 4 * br) * (hd + pad) + bc * (br + pad)) +
         2 * br * (2 * sizeof(float) + 2 * sizeof(std::int32_t));
}

/// dK, dV (nk, kv_heads*HD) += over one key tile and kv head; with AtomicDq also
/// dqacc (nq, heads*HD, fp32, unscaled) += dS K by atomicAdd. lse (nq, heads) fp32 with row
/// stride lss, D (nq, heads) fp32. Grid (ceil(local keys / BC), kv_heads).
template <int HD, bool AtomicDq>
__global__ void __launch_bounds__(threads)
    dkdv_kernel(attn_args a, const bf16* q, index_t qs, const bf16* k, index_t ks, const bf16* v,
                index_t vs, const bf16* dout, index_t dos, const float* lse, index_t lss,
                const float* dvec, float* dqacc, bf16* dk, index_t dks, bf16* dv, index_t dvs) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  constexpr int ld = HD + pad, lds = br + pad;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* kt = reinterpret_cast<bf16*>(smem_raw);           // (BC, ld)
  bf16* vt = kt + bc * ld;                                // (BC, ld)
  bf16* qt = vt + bc * ld;                                // 2 stages x (BR, ld)
  bf16* dot = qt + 2 * br * ld;                           // 2 stages x (BR, ld)
  bf16* dst = dot + 2 * br * ld;                          // (BC, lds): dS^T of the pair, for dQ
  auto* lrow = reinterpret_cast<float*>(dst + bc * lds);  // 2 stages x (BR): lse * log2 e
  float* drow = lrow + 2 * br;                            // 2 stages x (BR): D
  // 2 stages x (BR): the rows' visible key rows [lo, hi], int32 (positions < 2^31: refusal)
  auto* qlo = reinterpret_cast<std::int32_t*>(drow + 2 * br);
  std::int32_t* qhi = qlo + 2 * br;
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  const int g = lane >> 2, t = lane & 3;
  const index_t j0 = static_cast<index_t>(blockIdx.x) * bc, kvh = blockIdx.y;
  const index_t kvc = kvh * HD, kloc = attn_local_keys(a);
  const index_t jlastpos = a.k0 + (j0 + bc < kloc ? j0 + bc : kloc) - 1;
  // the first query row that may see key row j0 (position k0 + j0): p >= k0 + j0
  const index_t ifirst = a.k0 + j0 - a.q0 > 0 ? a.k0 + j0 - a.q0 : 0;
  // the (head, query tile) pairs that see this key tile, in order; h == hend: done
  const index_t hend = (kvh + 1) * a.group;
  auto sees = [&](index_t i0) { return i0 < a.nq && attn_first(a, a.q0 + i0) <= jlastpos; };
  index_t h = sees(ifirst) ? kvh * a.group : hend, i0 = ifirst;
  const bool any = h < hend;
  // queues the pair's Q, dO (cp.async) and its rows' lse, D and key bounds (plain stores)
  auto issue = [&](index_t hh, index_t ii, int st) {
    load_tile<br, HD>(qt + st * br * ld, q, qs, ii, a.nq, hh * HD);
    load_tile<br, HD>(dot + st * br * ld, dout, dos, ii, a.nq, hh * HD);
    for (int r = static_cast<int>(threadIdx.x); r < br; r += threads) {
      const index_t i = ii + r;
      const float x = i < a.nq ? lse[i * lss + hh] : 0.f;
      // a row that sees no key here (lse = -inf) gets P = exp2(s - inf) = 0
      lrow[st * br + r] = x == -INFINITY ? INFINITY : x * log2e;
      drow[st * br + r] = i < a.nq ? dvec[i * a.heads + hh] : 0.f;
      index_t lo, hi;
      row_keys(a, i, lo, hi);  // none_lo / none_hi (no key) saturate to INT32_MAX / INT32_MIN
      qlo[st * br + r] = static_cast<std::int32_t>(lo > INT32_MAX ? INT32_MAX : lo);
      qhi[st * br + r] = static_cast<std::int32_t>(hi < INT32_MIN ? INT32_MIN : hi);
    }
  };
  if (h < hend) {
    load_tile<bc, HD>(kt, k, ks, j0, kloc, kvc);
    load_tile<bc, HD>(vt, v, vs, j0, kloc, kvc);
    issue(h, i0, 0);
  }
  cp_async_commit();
  float dka[HD / 8][4], dva[HD / 8][4];  // dK, dV (16 keys, HD) of the warp, fp32
#pragma unroll
  for (auto& c : dka) c[0] = c[1] = c[2] = c[3] = 0.f;
#pragma unroll
  for (auto& c : dva) c[0] = c[1] = c[2] = c[3] = 0.f;
  const int kw = warp * 16;  // the warp's key rows [kw, kw + 16) of the tile
  int stage = 0;
  while (h < hend) {
    index_t hn = h, in = i0 + br;  // the next pair
    if (!sees(in)) {
      ++hn;
      in = ifirst;
    }
    if (hn < hend) issue(hn, in, stage ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const bf16* qs_ = qt + stage * br * ld;
    const bf16* ds_ = dot + stage * br * ld;
    const float* ls_ = lrow + stage * br;
    const float* dd_ = drow + stage * br;
    const std::int32_t* lo_ = qlo + stage * br;
    const std::int32_t* hi_ = qhi + stage * br;
    const bool full = tile_full(j0, lo_[br - 1], hi_[0]);
    // two halves of BQ queries each (fewer live registers: dP^T and S^T are 16 x BQ per warp)
#pragma unroll 1
    for (int q0h = 0; q0h < br; q0h += bq) {
      // dP^T = V dO^T and S^T = K Q^T, (16 keys, BQ queries) per warp
      float dp[bq / 8][4], s[bq / 8][4];
      warp_abt<HD>(dp, vt, kw, ds_, q0h, ld, lane);
      warp_abt<HD>(s, kt, kw, qs_, q0h, ld, lane);
      // P^T = exp2(s2 - lse2), dS^T = P^T (dP^T - D) (soft-capping: times 1 - (c / cap)^2)
#pragma unroll
      for (int nb = 0; nb < bq / 8; ++nb)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int c = q0h + nb * 8 + 2 * t + (e & 1);  // query column of the tile
          const index_t j = j0 + kw + g + 8 * (e >> 1);
          float p = 0.f, d = 0.f;
          if (full || (j >= lo_[c] && j <= hi_[c])) {
            const float x = score2(a, s[nb][e]);
            p = exp2f(x - ls_[c]);
            d = p * (dp[nb][e] - dd_[c]);
            if (a.softcap > 0.f) {  // x = c log2 e, c = cap tanh(.): d tanh = 1 - (c / cap)^2
              const float u = x * ln2 / a.softcap;
              d *= 1.f - u * u;
            }
          }
          s[nb][e] = p;
          dp[nb][e] = d;
        }
      // dV += P^T dO, dK += dS^T Q: A from registers, B = dO / Q stored (query, d): .trans
      warp_pb<HD>(dva, s, ds_, q0h, ld, lane);
      warp_pb<HD>(dka, dp, qs_, q0h, ld, lane);
      if constexpr (AtomicDq)  // dS^T (BC, BR) to shared memory for dQ below
#pragma unroll
        for (int nb = 0; nb < bq / 8; ++nb)
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const std::uint32_t u = pack(dp[nb][2 * r], dp[nb][2 * r + 1]);
            std::memcpy(dst + (kw + g + 8 * r) * lds + q0h + nb * 8 + 2 * t, &u, sizeof u);
          }
    }
    if constexpr (AtomicDq) {
      // warp w adds dQ rows [16 w, 16 w + 16) of the tile = dS K
      __syncthreads();
      const int qw = warp * 16;  // the warp's query rows of the tile
#pragma unroll
      for (int db = 0; db < HD / 16; ++db) {
        float dq2[2][4] = {};
#pragma unroll
        for (int kk = 0; kk < bc / 16; ++kk) {
          std::uint32_t fa[4], b[4];
          ld_a_t(fa, dst, lds, qw, kk * 16, lane);
          ld_b_kn(b, kt, ld, db * 16, kk * 16, lane);
          mma16816(dq2[0], fa, b[0], b[1]);
          mma16816(dq2[1], fa, b[2], b[3]);
        }
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const index_t i = i0 + qw + g + 8 * r;
          if (i >= a.nq) continue;
          float* row = dqacc + i * (a.heads * HD) + h * HD + db * 16 + 2 * t;
#pragma unroll
          for (int n = 0; n < 2; ++n) {
            atomicAdd(row + n * 8, dq2[n][2 * r]);
            atomicAdd(row + n * 8 + 1, dq2[n][2 * r + 1]);
          }
        }
      }
    }
    __syncthreads();  // this stage (and dS^T) is free for the pair after next
    h = hn;
    i0 = in;
    stage ^= 1;
  }
  cp_async_wait<0>();
  if (!any) return;  // no query sees this key tile: dK, dV unchanged
    // dK = scale dS^T Q, dV += P^T dO: rows kw + g (+ 8) of the tile, read-add-round in bf16
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const index_t j = j0 + kw + g + 8 * r;
    if (j >= kloc) continue;
    bf16* krow = dk + j * dks + kvc + 2 * t;
    bf16* vrow = dv + j * dvs + kvc + 2 * t;
#pragma unroll
    for (int db = 0; db < HD / 8; ++db) {
      add_pair(krow + db * 8, a.scale * dka[db][2 * r], a.scale * dka[db][2 * r + 1]);
      add_pair(vrow + db * 8, dva[db][2 * r], dva[db][2 * r + 1]);
    }
  }
#else
  __trap();
#endif
}

/// dq (nq, heads*hd) += scale * dqacc (nq, heads*hd) fp32 (the atomic path's scratch).
template <class S>
__global__ void dq_add_kernel(index_t rows, index_t cols, const float* dqacc, float scale, S* dq,
                              index_t dqs) {
  const index_t n = rows * cols;
  for (index_t e = blockIdx.x * static_cast<index_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<index_t>(gridDim.x) * blockDim.x) {
    const index_t i = e / cols, c = e % cols;
    S* p = dq + i * dqs + c;
    *p = cvt<S>(ld(p) + scale * dqacc[e]);
  }
}

// ---- backward: deterministic dQ --------------------------------------------------------------

/// Shared bytes of the dQ kernel: Q, dO (BR, HD+pad); two stages of K and V (BC, HD+pad).
__host__ __device__ constexpr std::size_t dq_smem(int hd) {
  return sizeof(bf16) * static_cast<std::size_t>((2 * br + 4 * bc) * (hd + pad));
}

/// dQ (nq, heads*HD) += scale dS K, a block per (query tile, head) summing its key tiles in
/// order (no atomics: bit-identical reruns). Grid (ceil(nq / BR), heads).
template <int HD>
__global__ void __launch_bounds__(threads)
    dq_kernel(attn_args a, const bf16* q, index_t qs, const bf16* k, index_t ks, const bf16* v,
              index_t vs, const bf16* dout, index_t dos, const float* lse, index_t lss,
              const float* dvec, bf16* dq, index_t dqs) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  constexpr int ld = HD + pad;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* qt = reinterpret_cast<bf16*>(smem_raw);  // (BR, ld)
  bf16* dot = qt + br * ld;                      // (BR, ld)
  bf16* kt = dot + br * ld;                      // 2 stages x (BC, ld)
  bf16* vt = kt + 2 * bc * ld;                   // 2 stages x (BC, ld)
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  const int g = lane >> 2, t = lane & 3;
  const query_tile tile(a, HD, warp, g);
  const index_t i0 = tile.i0, h = tile.h, qc = tile.qc, kvc = tile.kvc;
  const index_t kbegin = tile.kbegin, kend = tile.kend;
  float l2[2], dd[2];  // the rows' lse * log2 e and D
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const index_t i = i0 + warp * 16 + g + 8 * r;
    const float x = i < a.nq ? lse[i * lss + h] : 0.f;
    l2[r] = x == -INFINITY ? INFINITY : x * log2e;
    dd[r] = i < a.nq ? dvec[i * a.heads + h] : 0.f;
  }
  float acc[HD / 8][4];  // dQ (16, HD) of the warp, unscaled
#pragma unroll
  for (auto& c : acc) c[0] = c[1] = c[2] = c[3] = 0.f;
  if (kbegin < kend) {
    load_tile<br, HD>(qt, q, qs, i0, a.nq, qc);
    load_tile<br, HD>(dot, dout, dos, i0, a.nq, qc);
    load_tile<bc, HD>(kt, k, ks, kbegin, kend, kvc);
    load_tile<bc, HD>(vt, v, vs, kbegin, kend, kvc);
  }
  cp_async_commit();
  const int qw = warp * 16;
  int stage = 0;
  for (index_t j0 = kbegin; j0 < kend; j0 += bc, stage ^= 1) {
    if (j0 + bc < kend) {
      load_tile<bc, HD>(kt + (stage ^ 1) * bc * ld, k, ks, j0 + bc, kend, kvc);
      load_tile<bc, HD>(vt + (stage ^ 1) * bc * ld, v, vs, j0 + bc, kend, kvc);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const bf16* ks_ = kt + stage * bc * ld;
    const bf16* vs_ = vt + stage * bc * ld;
    float dp[bc / 8][4], s[bc / 8][4];  // dP = dO V^T, S = Q K^T: (16 rows, BC keys)
    warp_abt<HD>(dp, dot, qw, vs_, 0, ld, lane);
    warp_abt<HD>(s, qt, qw, ks_, 0, ld, lane);
    const bool full = tile_full(j0, tile.lo_max, tile.hi_min);
#pragma unroll
    for (int nb = 0; nb < bc / 8; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const index_t j = j0 + nb * 8 + 2 * t + (e & 1);
        const int r = e >> 1;
        float d = 0.f;
        if (full || (j >= tile.lo[r] && j <= tile.hi[r])) {
          const float x = score2(a, s[nb][e]);
          const float p = exp2f(x - l2[r]);
          d = p * (dp[nb][e] - dd[r]);
          if (a.softcap > 0.f) {  // x = c log2 e with c = cap tanh(.): d tanh = 1 - (c / cap)^2
            const float u = x * ln2 / a.softcap;
            d *= 1.f - u * u;
          }
        }
        dp[nb][e] = d;
      }
    warp_pb<HD>(acc, dp, ks_, 0, ld, lane);  // dQ += dS K: B = K stored (key, d): .trans
    __syncthreads();
  }
  cp_async_wait<0>();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const index_t i = i0 + qw + g + 8 * r;
    if (i >= a.nq || kbegin >= kend) continue;
    bf16* row = dq + i * dqs + qc + 2 * t;
#pragma unroll
    for (int db = 0; db < HD / 8; ++db)
      add_pair(row + db * 8, a.scale * acc[db][2 * r], a.scale * acc[db][2 * r + 1]);
  }
#else
  __trap();
#endif
}

}  // namespace tightfit::detail::cuda_k::mma
