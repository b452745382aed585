// tightfit/backend/detail/cuda_gemm.hpp: row-major GEMMs of the CUDA backend through cuBLAS.
//
// cuBLAS is column-major: a row-major (r, c) matrix with row stride s is the column-major (c, r)
// matrix with leading dimension s, its transpose. So C = op(A) op(B) in row-major is
// C^T = op(B)^T op(A)^T in column-major: one cublasGemmEx(op_b, op_a, n, m, k, B, A, C) with the
// same transpose flags. Heads batch through cublasGemmStridedBatchedEx.
// Storage float or bf16 (CUDA_R_32F / CUDA_R_16BF); the accumulation is always fp32
// (CUBLAS_COMPUTE_32F, or CUBLAS_COMPUTE_32F_FAST_TF32 for float storage when TF32 is allowed).
// With beta == 0 cuBLAS does not read C (NaN in C does not propagate), as the reference.
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <climits>
#include <type_traits>

#include "tightfit/backend/detail/cuda_runtime.hpp"
#include "tightfit/backend/detail/reference_checks.hpp"
#include "tightfit/core/types.hpp"

namespace tightfit::detail {

template <class S>
constexpr cudaDataType_t cuda_data_type() {
  if constexpr (std::is_same_v<S, float>)
    return CUDA_R_32F;
  else if constexpr (std::is_same_v<S, __nv_bfloat16>)
    return CUDA_R_16BF;
  else
    static_assert(sizeof(S) == 0, "cuda_backend: storage must be float or __nv_bfloat16");
}

inline cublasOperation_t cublas_op(transpose t) {
  return t == transpose::yes ? CUBLAS_OP_T : CUBLAS_OP_N;
}

/// A cuBLAS int extent; throws for a value past INT_MAX (split the call).
inline int blas_int(index_t v, const char* what) {
  check(v <= INT_MAX, "gemm: ", what, " is ", v, ", more than cuBLAS's int range");
  return static_cast<int>(v);
}

/// Leading dimension of a row-major view: its row stride, at least max(cols, 1).
inline int blas_ld(index_t stride, index_t cols) {
  return blas_int(std::max<index_t>({stride, cols, index_t{1}}), "a leading dimension");
}

template <class S>
cublasComputeType_t compute_type(bool tf32) {
  if constexpr (std::is_same_v<S, float>)
    return tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  else
    return CUBLAS_COMPUTE_32F;
}

/// C (m, n) = alpha op(A) op(B) + beta C, row-major, checked dims d.
template <class S>
void cublas_gemm(cublasHandle_t h, bool tf32, transpose ta, transpose tb, float alpha,
                 matrix_view<const S> a, matrix_view<const S> b, float beta, matrix_view<S> c,
                 const gemm_dims& d) {
  if (d.m == 0 || d.n == 0) return;
  const auto type = cuda_data_type<S>();
  cublas_check(cublasGemmEx(h, cublas_op(tb), cublas_op(ta), blas_int(d.n, "n"), blas_int(d.m, "m"),
                            blas_int(d.k, "k"), &alpha, b.data, type, blas_ld(b.stride, b.cols),
                            a.data, type, blas_ld(a.stride, a.cols), &beta, c.data, type,
                            blas_ld(c.stride, c.cols), compute_type<S>(tf32), CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx");
}

/// gemm per batch entry through one cublasGemmStridedBatchedEx.
template <class S>
void cublas_gemm_batched(cublasHandle_t h, bool tf32, transpose ta, transpose tb, float alpha,
                         tensor3_view<const S> a, tensor3_view<const S> b, float beta,
                         tensor3_view<S> c, const gemm_dims& d) {
  if (d.m == 0 || d.n == 0 || c.batch == 0) return;
  const auto type = cuda_data_type<S>();
  cublas_check(
      cublasGemmStridedBatchedEx(
          h, cublas_op(tb), cublas_op(ta), blas_int(d.n, "n"), blas_int(d.m, "m"),
          blas_int(d.k, "k"), &alpha, b.data, type, blas_ld(b.row_stride, b.cols),
          static_cast<long long>(b.batch_stride), a.data, type, blas_ld(a.row_stride, a.cols),
          static_cast<long long>(a.batch_stride), &beta, c.data, type,
          blas_ld(c.row_stride, c.cols), static_cast<long long>(c.batch_stride),
          blas_int(c.batch, "batch"), compute_type<S>(tf32), CUBLAS_GEMM_DEFAULT),
      "cublasGemmStridedBatchedEx");
}

}  // namespace tightfit::detail
