// Compile-only checks that every shipped backend satisfies each part of the backend concept
// (StorageBackend, DenseBackend, TransformerBackend, OptimizerBackend) and its buffers Buffer,
// that parameter_set satisfies ParameterSet, that near-misses do not, that a backend without
// optimizer kernels still computes gradients, and that the minimal user backend shown in
// docs/concepts.md compiles. (tests/support/compile_fail/ holds the must-not-compile checks.)
#include <doctest/doctest.h>

#include <vector>

#include <cstdint>

#include "tightfit/backend/concept.hpp"
#include "tightfit/backend/meta.hpp"
#include "tightfit/backend/reference.hpp"
#include "tightfit/distributed/self_communicator.hpp"
#include "tightfit/distributed/sequence_step.hpp"
#include "tightfit/loss/sft.hpp"
#include "tightfit/nn/decoder_layer.hpp"
#include "tightfit/nn/gemma_layer.hpp"
#include "tightfit/nn/parameters.hpp"
#include "tightfit/nn/sequence_shard.hpp"
#include "tightfit/optim/train.hpp"
#include "tightfit/stream/backward.hpp"

#if __has_include(<Eigen/Core>) && __has_include("tightfit/backend/eigen.hpp")
#include "tightfit/backend/eigen.hpp"
#define TIGHTFIT_TEST_EIGEN 1
#endif

using namespace tightfit;

// ---- shipped backends ---------------------------------------------------------------------
template <class B>
constexpr bool every_part = StorageBackend<B>&& DenseBackend<B>&& TransformerBackend<B>&&
    OptimizerBackend<B>&& Backend<B>&& Buffer<buffer_t<B>, storage_t<B>>;
static_assert(every_part<reference_backend<float>> && every_part<reference_backend<double>>);
// the Gemma kernels (GELU-tanh GLU, logit soft-capping) and the two shipped decoder layers
static_assert(GemmaBackend<reference_backend<float>> && GemmaBackend<reference_backend<double>>);
static_assert(GemmaBackend<meta_backend<float>> && GemmaBackend<meta_backend<double>>);
static_assert(DecoderLayer<decoder_layer<reference_backend<double>>, reference_backend<double>>);
static_assert(DecoderLayer<gemma_layer<reference_backend<double>>, reference_backend<double>>);
static_assert(DecoderLayer<gemma_layer<meta_backend<float>>, meta_backend<float>>);
static_assert(every_part<meta_backend<float>> && every_part<meta_backend<double>>);
static_assert(std::same_as<storage_t<reference_backend<float>>, float>);
static_assert(std::same_as<accum_t<reference_backend<float>>, float>);
// A bf16 / half backend names its storage type apart from its accumulation type.
struct split_types {
  using value_type = float;
  using storage_type = std::uint16_t;
};
static_assert(std::same_as<storage_t<split_types>, std::uint16_t>);
static_assert(std::same_as<accum_t<split_types>, float>);
// Buffers: the full interface, not just data() and size().
template <class U>
struct data_size_only {
  U* data() const { return nullptr; }
  index_t size() const { return 0; }
};
static_assert(Buffer<host_buffer<float>, float> && Buffer<meta_buffer<double>, double>);
static_assert(!Buffer<data_size_only<float>, float>);
static_assert(!Buffer<host_buffer<float>, double>);
static_assert(Backend<reference_backend<float>>);
static_assert(Backend<reference_backend<double>>);
static_assert(ParameterSet<parameter_set<reference_backend<double>>>);
static_assert(ParameterSet<parameter_set<reference_backend<float>>>);
// Both shipped decoder layers offer the optional extensions of the layer seam (the skeleton's:
// nn/streambp_layer.hpp): sequence parallelism (the K/V ring) and LoRA adapters.
static_assert(
    SequenceParallelLayer<decoder_layer<reference_backend<double>>, reference_backend<double>>);
static_assert(
    SequenceParallelLayer<decoder_layer<reference_backend<float>>, reference_backend<float>>);
static_assert(
    SequenceParallelLayer<gemma_layer<reference_backend<double>>, reference_backend<double>>);
static_assert(LoraLayer<decoder_layer<reference_backend<double>>, reference_backend<double>>);
static_assert(LoraLayer<gemma_layer<meta_backend<float>>, meta_backend<float>>);
// What the optimizers take: a DecoderModel on a Backend (decoder_model has no default layer).
static_assert(TrainableModel<llama_model<reference_backend<double>>>);
static_assert(TrainableModel<gemma_model<reference_backend<double>>>);
static_assert(DecoderModel<gemma_model<meta_backend<float>>>);
static_assert(!DecoderModel<parameter_set<reference_backend<double>>>);
// train()'s gradient policies (optim/train.hpp's TrainingGradients, distributed/'s policies).
static_assert(TrainingGradients<data_parallel_training<self_communicator>>);
static_assert(TrainingGradients<sequence_parallel_training<self_communicator>>);
static_assert(!TrainingGradients<self_communicator>);
static_assert(
    sequence_parallel_training<self_communicator>::accepts<gemma_model<reference_backend<double>>>);
#ifdef TIGHTFIT_TEST_EIGEN
static_assert(every_part<eigen_backend<float>> && every_part<eigen_backend<double>>);
static_assert(GemmaBackend<eigen_backend<float>> && GemmaBackend<eigen_backend<double>>);
static_assert(DecoderLayer<gemma_layer<eigen_backend<float>>, eigen_backend<float>>);
static_assert(ParameterSet<parameter_set<eigen_backend<double>>>);
#endif

// ---- the minimal user backend of docs/concepts.md (keep the two in sync) ------------------
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
static_assert(ParameterSet<parameter_set<my_blas_backend>>);

// ---- near-misses that must NOT satisfy Backend --------------------------------------------
namespace {

// attention_backward without the dV output (a plausible mistake): the required call does not
// compile, so the type is not a Backend.
struct missing_dv_backend : reference_backend<double> {
  void attention_backward(const attention_shape&, matrix_view<const double>,
                          matrix_view<const double>, matrix_view<const double>,
                          matrix_view<const double>, matrix_view<const double>,
                          matrix_view<const double>, const attention_mask&, double,
                          matrix_view<double>, matrix_view<double>) {}
};

// A backend over an integer type.
struct int_backend {
  using value_type = int;
};

// Every kernel except attention_backward, by forwarding (a type that derives nothing).
struct no_attention_backward {
  using value_type = double;
  reference_backend<double> impl;
  memory_counter& memory() { return impl.memory(); }
  kernel_stats& stats() { return impl.stats(); }
  template <class U>
  host_buffer<U> allocate(index_t n) {
    return impl.allocate<U>(n);
  }
  template <class... A>
  void upload(A&&... a) {
    impl.upload(a...);
  }
  template <class... A>
  void download(A&&... a) {
    impl.download(a...);
  }
#define TIGHTFIT_FORWARD(name) \
  template <class... A>        \
  void name(A&&... a) {        \
    impl.name(a...);           \
  }
  TIGHTFIT_FORWARD(gemm)
  TIGHTFIT_FORWARD(gemm_batched)
  TIGHTFIT_FORWARD(axpy)
  TIGHTFIT_FORWARD(scale)
  TIGHTFIT_FORWARD(fill)
  TIGHTFIT_FORWARD(copy)
  TIGHTFIT_FORWARD(embedding_forward)
  TIGHTFIT_FORWARD(embedding_backward)
  TIGHTFIT_FORWARD(rmsnorm_forward)
  TIGHTFIT_FORWARD(rmsnorm_backward)
  TIGHTFIT_FORWARD(rope_forward)
  TIGHTFIT_FORWARD(rope_backward)
  TIGHTFIT_FORWARD(swiglu_forward)
  TIGHTFIT_FORWARD(swiglu_backward)
  TIGHTFIT_FORWARD(attention_forward)
  TIGHTFIT_FORWARD(xent_forward)
  TIGHTFIT_FORWARD(xent_backward)
  TIGHTFIT_FORWARD(adam_update)
  TIGHTFIT_FORWARD(sgd_update)
#undef TIGHTFIT_FORWARD
};

// The same forwarding type with attention_backward added satisfies Backend: proves that the
// failure above is due to the missing kernel alone.
struct with_attention_backward : no_attention_backward {
  template <class... A>
  void attention_backward(A&&... a) {
    impl.attention_backward(a...);
  }
};

// The forwarding type with attention_backward but without the optimizer kernels: enough to
// compute gradients (TransformerBackend), not to run an optimizer.
struct gradients_only : no_attention_backward {
  template <class... A>
  void attention_backward(A&&... a) {
    impl.attention_backward(a...);
  }
  void adam_update() = delete;
  void sgd_update() = delete;
};

}  // namespace

static_assert(TransformerBackend<gradients_only> && !OptimizerBackend<gradients_only>);
static_assert(!Backend<gradients_only>);
static_assert(!Backend<missing_dv_backend>);
static_assert(!Backend<int_backend>);
static_assert(!Backend<no_attention_backward>);
static_assert(Backend<with_attention_backward>);
static_assert(!Backend<int>);

TEST_CASE("the minimal user backend routes gemm through its own function") {
  my_blas_backend be;
  std::vector<double> a = {1, 2, 3, 4}, c(4);
  be.gemm(transpose::no, transpose::yes, 1.0, matrix_view<const double>(a.data(), 2, 2),
          matrix_view<const double>(a.data(), 2, 2), 0.0, matrix_view<double>(c.data(), 2, 2));
  CHECK(be.gemm_calls_to_my_blas == 1);
  CHECK(c[1] == 1 * 3 + 2 * 4);  // (A A^T)(0, 1)
  CHECK(be.stats().gemm_calls == 1);
}

TEST_CASE("a backend without optimizer kernels computes gradients") {
  gradients_only be;
  model_config cfg;
  cfg.vocab_size = 11;
  cfg.hidden_size = 8;
  cfg.intermediate_size = 12;
  cfg.num_hidden_layers = 1;
  cfg.num_attention_heads = 2;
  cfg.num_key_value_heads = 1;
  cfg.head_dim = 4;
  llama_model<gradients_only> model(be, cfg);
  model.init_random(1);
  std::vector<token_id> ids{1, 2, 3, 4}, targets{2, 3, 4, ignore_index};
  sft_loss loss;
  const auto r = compute_gradients(model, token_batch{1, 4, ids, targets, {}}, loss, {});
  CHECK(r.loss > 0);
  CHECK(be.impl.stats().attention_backward_calls > 0);
}
