// tightfit/backend/detail/eigen_gemm.hpp: C = alpha op(A) op(B) + beta C with Eigen, split into
// blocks of C over oneTBB when the product is large (Eigen's own GEMM is multithreaded only
// under OpenMP, which tightfit does not use).
//
// Large products are cut along the longer side of C (rows of op(A) or columns of op(B)) into
// blocks of at least gemm_tuning::min_block rows/columns; each block is one serial Eigen GEMM
// (it packs the shared operand again, a cost of k*n per block against 2*block*n*k flops).
#pragma once

#include <algorithm>
#include <cmath>

#include "tightfit/backend/detail/eigen_map.hpp"
#include "tightfit/core/parallel.hpp"
#include "tightfit/core/types.hpp"
#include "tightfit/core/view.hpp"

namespace tightfit::detail {

/// When and how finely a GEMM is split across threads.
struct gemm_tuning {
  double parallel_min_flops = 8e6;  ///< 2mnk below this: one serial Eigen call
  index_t min_block = 64;           ///< smallest block of C rows / columns per task
  index_t blocks_per_thread = 4;    ///< target number of blocks per worker (load balance)
};

/// One serial Eigen GEMM. op(A) is (m, k), op(B) is (k, n), C is (m, n); shapes are checked by
/// the caller. beta == 0 overwrites C (NaN in C does not propagate).
template <class T>
void gemm_serial(transpose ta, transpose tb, T alpha, matrix_view<const T> a,
                 matrix_view<const T> b, T beta, matrix_view<T> c) {
  auto cm = as_eigen(c);
  const index_t k = ta == transpose::no ? a.cols : a.rows;
  if (c.rows == 0 || c.cols == 0) return;
  if (alpha == T(0) || k == 0) {
    if (beta == T(0)) {
      cm.setZero();
    } else if (beta != T(1)) {
      cm *= beta;
    }
    return;
  }
  const auto am = as_eigen(a);
  const auto bm = as_eigen(b);
  auto run = [&](const auto& lhs, const auto& rhs) {
    if (beta == T(0)) {
      cm.noalias() = alpha * lhs * rhs;
    } else {
      if (beta != T(1)) cm *= beta;
      cm.noalias() += alpha * lhs * rhs;
    }
  };
  if (ta == transpose::no && tb == transpose::no) {
    run(am, bm);
  } else if (ta == transpose::no) {
    run(am, bm.transpose());
  } else if (tb == transpose::no) {
    run(am.transpose(), bm);
  } else {
    run(am.transpose(), bm.transpose());
  }
}

/// Rows [i0, i1) of op(A) as a view of A.
template <class T>
matrix_view<const T> op_rows(transpose t, matrix_view<const T> a, index_t i0, index_t i1) {
  return t == transpose::no ? a.row_range(i0, i1) : a.col_range(i0, i1);
}

/// Columns [j0, j1) of op(B) as a view of B.
template <class T>
matrix_view<const T> op_cols(transpose t, matrix_view<const T> b, index_t j0, index_t j1) {
  return t == transpose::no ? b.col_range(j0, j1) : b.row_range(j0, j1);
}

/// gemm_serial, split over threads when 2mnk >= tuning.parallel_min_flops.
template <class T>
void gemm(transpose ta, transpose tb, T alpha, matrix_view<const T> a, matrix_view<const T> b,
          T beta, matrix_view<T> c, const gemm_tuning& tuning) {
  const index_t m = c.rows, n = c.cols;
  const index_t k = ta == transpose::no ? a.cols : a.rows;
  const double flops =
      2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  const index_t threads = concurrency();
  const index_t longest = std::max(m, n);
  if (threads <= 1 || flops < tuning.parallel_min_flops || longest < 2 * tuning.min_block) {
    gemm_serial(ta, tb, alpha, a, b, beta, c);
    return;
  }
  // Block size: about blocks_per_thread blocks per worker, rounded up to a multiple of 16 (a
  // full SIMD register of floats) and at least min_block.
  const index_t target_blocks = threads * std::max<index_t>(tuning.blocks_per_thread, 1);
  index_t block = (longest + target_blocks - 1) / target_blocks;
  block = std::max(tuning.min_block, (block + 15) / 16 * 16);
  const index_t blocks = (longest + block - 1) / block;
  parallel_for(0, blocks, 1, [&](index_t b0, index_t b1) {
    for (index_t blk = b0; blk < b1; ++blk) {
      const index_t s0 = blk * block, s1 = std::min(longest, s0 + block);
      if (m >= n) {
        gemm_serial(ta, tb, alpha, op_rows(ta, a, s0, s1), b, beta, c.row_range(s0, s1));
      } else {
        gemm_serial(ta, tb, alpha, a, op_cols(tb, b, s0, s1), beta, c.col_range(s0, s1));
      }
    }
  });
}

}  // namespace tightfit::detail
