// Compile-only: the tensor-core attention kernels (backend/detail/cuda_attention_mma.cuh, the
// mma.sync / ldmatrix / cp.async path) for sm_80, the oldest architecture they support, beside
// the build's own architecture (90 by default), with the same warnings as errors. Built as an
// object library that test_cuda depends on; nothing runs.
#include "tightfit/backend/cuda.hpp"

template class tightfit::cuda_backend<__nv_bfloat16>;

/// Instantiates the attention entry points with every lse type (the kernels behind them).
void tightfit_compile_sm80(tightfit::cuda_backend<__nv_bfloat16>& be,
                           tightfit::matrix_view<__nv_bfloat16> m, tightfit::matrix_view<float> f) {
  using namespace tightfit;
  const attention_shape s{4, 2, 64};
  be.attention_forward(s, m, m, m, attention_mask{}, 1.f, m, m);
  be.attention_forward(s, m, m, m, attention_mask{}, 1.f, m, f);
  be.attention_backward(s, m, m, m, m, m, m, attention_mask{}, 1.f, m, m, m);
  be.attention_backward(s, m, m, m, m, m, f, attention_mask{}, 1.f, m, m, m);
  be.attention_merge(4, 64, m, f, m, f);
}
