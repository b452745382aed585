// StreamBP on the Eigen backend: every schedule equals the reference backend's full backprop
// (double to 1e-10), and float within 1e-4; the planner's prediction within 10% of the
// measured peak (the Eigen backend allocates scratch of its own: per-thread dQ partials of the
// attention backward, (threads, rows, H*hd), small next to the logits of a realistic vocab).
#include <doctest/doctest.h>

#include "stream_testing.hpp"
#include "support/testing.hpp"
#include "tightfit/backend/eigen.hpp"
#include "tightfit/stream/planner.hpp"

using namespace tightfit;
using tightfit::testing::grads_of;
using tightfit::testing::random_batch;
using tightfit::testing::tiny_config;

namespace {

template <class B>
std::pair<double, std::vector<std::vector<double>>> gradients(B& be, const model_config& cfg,
                                                              const random_batch& batch,
                                                              backward_schedule s, index_t chunk) {
  decoder_model<B> model(be, cfg);
  model.init_random(7, 0.3, 0.2);
  sft_loss loss;
  backward_options o;
  o.sched = s;
  o.chunk = chunk;
  const double l = compute_gradients(model, batch.view(), loss, o).loss;
  return {l, grads_of(model.parameters())};
}

}  // namespace

TEST_CASE("eigen backend: stream, checkpoint and full equal the reference backend") {
  // sizes larger than the attention tiles, GQA 4, padding, q/k-norm, attention biases
  auto cfg = tiny_config(8, 2, true, false, 2);
  cfg.qkv_bias = cfg.o_bias = true;
  cfg.head_dim = 16;
  cfg.hidden_size = 40;
  const random_batch batch(2, 150, cfg.vocab_size, {150, 97}, 5);
  reference_backend<double> rb;
  const auto expected = gradients(rb, cfg, batch, backward_schedule::full, 150);
  for (backward_schedule s :
       {backward_schedule::full, backward_schedule::checkpoint, backward_schedule::stream}) {
    for (index_t chunk : {index_t{37}, index_t{64}}) {
      if (s != backward_schedule::stream && chunk != 37) continue;
      const std::string name = to_string(s);
      CAPTURE(name);
      CAPTURE(chunk);
      eigen_backend<double> be;
      const auto got = gradients(be, cfg, batch, s, chunk);
      CHECK(std::abs(got.first - expected.first) <= 1e-12 * std::abs(expected.first));
      for (std::size_t i = 0; i < got.second.size(); ++i)
        CHECK(tightfit::testing::max_rel_diff(got.second[i], expected.second[i], 1e-12) < 1e-10);
    }
  }
  eigen_backend<float> fb;
  const auto f = gradients(fb, cfg, batch, backward_schedule::stream, 37);
  CHECK(std::abs(f.first - expected.first) <= 1e-4 * std::abs(expected.first));
  for (std::size_t i = 0; i < f.second.size(); ++i)
    CHECK(tightfit::testing::max_rel_diff(f.second[i], expected.second[i]) < 1e-4);
}

TEST_CASE("eigen backend: the planner's prediction is within 10% of the measured peak") {
  auto cfg = tiny_config(8, 2, true, false, 3);
  cfg.head_dim = 16;
  cfg.hidden_size = 64;
  cfg.intermediate_size = 96;
  cfg.vocab_size = 4000;
  const random_batch batch(1, 400, cfg.vocab_size, {}, 6);
  for (backward_schedule s :
       {backward_schedule::full, backward_schedule::checkpoint, backward_schedule::stream}) {
    const std::string name = to_string(s);
    CAPTURE(name);
    eigen_backend<float> be;
    decoder_model<eigen_backend<float>> model(be, cfg);
    model.init_random(1);
    sft_loss loss;
    backward_options o;
    o.sched = s;
    o.chunk = 64;
    const double measured =
        double(compute_gradients(model, batch.view(), loss, o).peak_activation_bytes);
    const double predicted =
        double(predict_peak_activation_bytes<float>(cfg, 1, 400, o, sft_loss{}));
    CHECK(predicted <= measured);
    CHECK(measured <= 1.10 * predicted);
  }
}
