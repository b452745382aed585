// LoRA on the Eigen backend: the adapters' gradients of eigen_backend<double> equal the reference
// backend's (1e-12 relative) under every schedule, with chunks that split the sequence.
#include <doctest/doctest.h>

#include <random>
#include <string>
#include <vector>

#include "optim_testing.hpp"
#include "tightfit/backend/eigen.hpp"
#include "tightfit/nn/decoder_layer.hpp"
#include "tightfit/nn/lora.hpp"
#include "tightfit/optim/lora_optimizer.hpp"

using namespace tightfit;
using tightfit::testing::max_rel_diff;
using tightfit::testing::random_batch;

namespace {

/// The adapters' gradients of one LoRA backward on backend B (B random, so dA is not zero).
template <class B>
std::vector<std::vector<double>> lora_grads(const model_config& cfg, const random_batch& batch,
                                            backward_schedule sched, double* loss_out) {
  B be;
  llama_model<B> model(be, cfg);
  model.init_random(3, 0.3, 0.2);
  lora_config lc;
  lc.rank = 3;
  lc.alpha = 6;
  lc.target_modules = {"all-linear"};
  lora_adapters<llama_model<B>> lora(model, lc);
  std::mt19937_64 gen(8);
  std::normal_distribution<double> dist(0.0, 0.3);
  auto& ap = lora.parameters();
  for (std::size_t i = 0; i < ap.size(); ++i)
    if (ap.name(i).find("lora_B") != std::string::npos)
      for (auto& x : ap.value(i)) x = dist(gen);
  for (std::size_t i = 0; i < ap.size(); ++i) ap.allocate_grad(i);
  lora_optimizer<llama_model<B>> opt(lora);
  backward_options o;
  o.sched = sched;
  o.chunk = 5;
  sft_loss loss;
  *loss_out = compute_gradients(model, batch.view(), loss, opt.lora_backward_options(o)).loss;
  std::vector<std::vector<double>> out;
  for (std::size_t i = 0; i < ap.size(); ++i) {
    auto g = ap.grad(i);
    out.emplace_back(g.begin(), g.end());
  }
  return out;
}

}  // namespace

TEST_CASE("LoRA gradients: eigen_backend<double> == reference_backend<double>, every schedule") {
  auto cfg = tightfit::testing::tiny_config(4, 2, true, false, 3);
  cfg.qkv_bias = true;
  cfg.o_bias = true;
  const random_batch batch(2, 13, cfg.vocab_size, {13, 10}, 4);
  for (auto sched :
       {backward_schedule::full, backward_schedule::checkpoint, backward_schedule::stream}) {
    CAPTURE(to_string(sched));
    double loss_ref = 0, loss_eig = 0;
    const auto want = lora_grads<reference_backend<double>>(cfg, batch, sched, &loss_ref);
    const auto got = lora_grads<eigen_backend<double>>(cfg, batch, sched, &loss_eig);
    CHECK(loss_eig == doctest::Approx(loss_ref).epsilon(1e-13));
    REQUIRE(got.size() == want.size());
    double worst = 0;
    for (std::size_t i = 0; i < got.size(); ++i)
      worst = std::max(worst, max_rel_diff(got[i], want[i]));
    CHECK(worst < 1e-12);
  }
}
