// custom_backend.cpp: plug your own kernels into tightfit. my_blas_backend routes gemm through
// its own function (where a call to your BLAS would go) and takes every other kernel from the
// reference loops; the StreamBP gradients then run on it unchanged.
//
//   ./custom_backend        prints how many GEMMs went through my_blas_backend::gemm
#include <cstdio>
#include <vector>

#include "tightfit/backend/reference.hpp"
#include "tightfit/loss/sft.hpp"
#include "tightfit/nn/decoder_layer.hpp"
#include "tightfit/stream/backward.hpp"

// A backend whose gemm goes to your BLAS; every other kernel comes from the reference loops.
struct my_blas_backend : tightfit::reference_backend<double> {
  void gemm(tightfit::transpose ta, tightfit::transpose tb, double alpha,
            tightfit::matrix_view<const double> a, tightfit::matrix_view<const double> b,
            double beta, tightfit::matrix_view<double> c) {
    ++gemm_calls_to_my_blas;
    // cblas_dgemm(CblasRowMajor, ...) would go here; this sketch reuses the reference loops.
    reference_backend::gemm(ta, tb, alpha, a, b, beta, c);
  }
  int gemm_calls_to_my_blas = 0;
};
static_assert(tightfit::Backend<my_blas_backend>);

// Each algorithm asks only for the part of the concept it uses: gradients need a
// TransformerBackend, optimizers an OptimizerBackend, parameter sets a StorageBackend.
static_assert(tightfit::TransformerBackend<my_blas_backend>);
static_assert(tightfit::OptimizerBackend<my_blas_backend>);

int main() {
  tightfit::model_config cfg;  // a tiny Qwen3-style model
  cfg.vocab_size = 64;
  cfg.hidden_size = 32;
  cfg.intermediate_size = 48;
  cfg.num_hidden_layers = 2;
  cfg.num_attention_heads = 4;
  cfg.num_key_value_heads = 2;
  cfg.head_dim = 8;

  my_blas_backend be;
  tightfit::llama_model<my_blas_backend> model(be, cfg);
  model.init_random(1);
  const tightfit::index_t batch = 1, seq = 16;
  std::vector<tightfit::token_id> ids, labels;
  for (tightfit::index_t t = 0; t < seq; ++t) ids.push_back((7 * t + 3) % cfg.vocab_size);
  labels = ids;  // language modelling: the labels are the inputs
  const auto targets = tightfit::shift_labels(labels, batch, seq);

  tightfit::sft_loss loss;
  tightfit::backward_options opt;  // StreamBP, chunks of 4 positions
  opt.chunk = 4;
  const auto r = tightfit::compute_gradients(model, {batch, seq, ids, targets, {}}, loss, opt);
  std::printf("loss %.6f  gemm calls through my_blas_backend: %d (backend counted %lld)\n", r.loss,
              be.gemm_calls_to_my_blas, static_cast<long long>(be.stats().gemm_calls));
  return be.gemm_calls_to_my_blas > 0 && be.gemm_calls_to_my_blas == be.stats().gemm_calls ? 0 : 1;
}
