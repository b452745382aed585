// StreamBP on the Eigen backend: every schedule equals the reference backend's full backprop
// (double to 1e-10), and float within 1e-4; the planner's prediction within 10% of the
// measured peak (the Eigen backend allocates scratch of its own: per-thread dQ partials of the
// attention backward, (threads, rows, H*hd), small next to the logits of a realistic vocab).
#include <doctest/doctest.h>

#include <type_traits>
#include <utility>
#include <vector>

#include "stream_testing.hpp"
#include "support/testing.hpp"
#include "tightfit/backend/eigen.hpp"
#include "tightfit/nn/decoder_layer.hpp"
#include "tightfit/nn/gemma_layer.hpp"
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
  llama_model<B> model(be, cfg);
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
    llama_model<eigen_backend<float>> model(be, cfg);
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

TEST_CASE("eigen backend: windows, yarn rope and packed documents equal the reference backend") {
  // one packed row of 150 positions (documents of 40, 70 and 40) and a right-padded row; a
  // window of 20 on layer 1; chunks of 37 cross document boundaries and tile edges
  auto cfg = tiny_config(8, 2, true, false, 2);
  cfg.head_dim = 16;
  cfg.hidden_size = 40;
  cfg.sliding_window = 20;
  cfg.sliding_layers = {false, true};
  cfg.max_position_embeddings = 64;
  cfg.rope_scaling.rope_type = "yarn";
  cfg.rope_scaling.factor = 2;
  const random_batch batch(2, 150, cfg.vocab_size, {150, 97}, 8);
  std::vector<index_t> positions;
  for (index_t len : {40, 70, 40})
    for (index_t p = 0; p < len; ++p) positions.push_back(p);
  for (index_t p = 0; p < 150; ++p) positions.push_back(p);  // row 2: one document, padded
  auto run = [&](auto& be, backward_schedule s, index_t chunk) {
    using B = std::remove_reference_t<decltype(be)>;
    llama_model<B> model(be, cfg);
    model.init_random(7, 0.3, 0.2);
    sft_loss loss;
    backward_options o;
    o.sched = s;
    o.chunk = chunk;
    token_batch tb = batch.view();
    tb.position_ids = positions;
    const double l = compute_gradients(model, tb, loss, o).loss;
    return std::pair{l, grads_of(model.parameters())};
  };
  reference_backend<double> rb;
  const auto expected = run(rb, backward_schedule::full, 150);
  for (backward_schedule s : {backward_schedule::full, backward_schedule::stream}) {
    const std::string name = to_string(s);
    CAPTURE(name);
    eigen_backend<double> be;
    const auto got = run(be, s, 37);
    CHECK(std::abs(got.first - expected.first) <= 1e-12 * std::abs(expected.first));
    for (std::size_t i = 0; i < got.second.size(); ++i)
      CHECK(tightfit::testing::max_rel_diff(got.second[i], expected.second[i], 1e-12) < 1e-10);
  }
}

TEST_CASE("eigen backend: the Gemma layer under every schedule equals the reference backend") {
  // Gemma 2 style (soft-capped scores and logits) and Gemma 3 style (q/k-norm, local rope),
  // T = 150 over several attention tiles, window 40 on the sliding layers, chunks 37 and 64
  for (const bool gemma2 : {false, true}) {
    CAPTURE(gemma2);
    auto cfg = tiny_config(8, 2, !gemma2, true, 2);
    cfg.architecture = gemma2 ? "Gemma2ForCausalLM" : "Gemma3ForCausalLM";
    cfg.head_dim = 16;
    cfg.hidden_size = 40;
    cfg.sliding_window = 40;
    cfg.sliding_layers = {true, false};
    cfg.query_pre_attn_scalar = 12;
    if (gemma2) {
      cfg.attn_logit_softcapping = 1.5;
      cfg.final_logit_softcapping = 2.5;
    } else {
      cfg.rope_local_base_freq = 500;
    }
    using ref = reference_backend<double>;
    const random_batch batch(2, 150, cfg.vocab_size, {150, 97}, 5);
    auto run = [&](auto& be, backward_schedule s, index_t chunk) {
      using B = std::remove_reference_t<decltype(be)>;
      decoder_model<B, gemma_layer<B>> model(be, cfg);
      model.init_random(7, 0.3, 0.2);
      sft_loss loss;
      backward_options o;
      o.sched = s;
      o.chunk = chunk;
      const double l = compute_gradients(model, batch.view(), loss, o).loss;
      return std::make_pair(l, grads_of(model.parameters()));
    };
    ref rb;
    const auto expected = run(rb, backward_schedule::full, 150);
    for (backward_schedule s :
         {backward_schedule::full, backward_schedule::checkpoint, backward_schedule::stream}) {
      for (index_t chunk : {index_t{37}, index_t{64}}) {
        if (s != backward_schedule::stream && chunk != 37) continue;
        const std::string name = to_string(s);
        CAPTURE(name);
        CAPTURE(chunk);
        eigen_backend<double> be;
        const auto got = run(be, s, chunk);
        CHECK(std::abs(got.first - expected.first) <= 1e-12 * std::abs(expected.first));
        for (std::size_t i = 0; i < got.second.size(); ++i)
          CHECK(tightfit::testing::max_rel_diff(got.second[i], expected.second[i], 1e-12) < 1e-10);
      }
    }
    eigen_backend<float> fb;
    const auto f = run(fb, backward_schedule::stream, 37);
    CHECK(std::abs(f.first - expected.first) <= 1e-4 * std::abs(expected.first));
    for (std::size_t i = 0; i < f.second.size(); ++i)
      CHECK(tightfit::testing::max_rel_diff(f.second[i], expected.second[i]) < 1e-4);
  }
}
