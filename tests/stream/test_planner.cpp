// The memory planner: dry-run predictions against measured peaks, chunk and length search.
#include <doctest/doctest.h>

#include <cmath>

#include "stream_testing.hpp"
#include "support/testing.hpp"
#include "tightfit/nn/decoder_layer.hpp"
#include "tightfit/nn/presets.hpp"
#include "tightfit/stream/planner.hpp"

using namespace tightfit;
using tightfit::testing::random_batch;
using tightfit::testing::tiny_config;

TEST_CASE("predicted peak activation bytes equal the measured ones") {
  for (bool qk : {false, true}) {
    auto cfg = tiny_config(4, 2, qk, !qk, 3);
    cfg.qkv_bias = !qk;  // Qwen2-like: the bias GEMMs' ones columns are counted too
    const random_batch batch(2, 23, cfg.vocab_size, {23, 17}, 3);
    for (backward_schedule s :
         {backward_schedule::full, backward_schedule::checkpoint, backward_schedule::stream}) {
      const std::string name = to_string(s);
      CAPTURE(name);
      backward_options o;
      o.sched = s;
      o.chunk = 5;
      reference_backend<float> be;
      llama_model<reference_backend<float>> model(be, cfg);
      model.init_random(2);
      sft_loss loss;
      const auto measured = compute_gradients(model, batch.view(), loss, o).peak_activation_bytes;
      const auto predicted = predict_peak_activation_bytes<float>(cfg, 2, 23, o, sft_loss{});
      CHECK(measured > 0);
      // the reference backend allocates nothing of its own: the dry run is exact
      CHECK(predicted == measured);
    }
  }
}

TEST_CASE("stream needs less memory per token than checkpoint, full the most") {
  auto cfg = tiny_config(4, 2, true, false, 4);
  cfg.vocab_size = 512;
  backward_options o;
  o.chunk = 16;
  auto peak = [&](backward_schedule s, index_t t) {
    o.sched = s;
    return predict_peak_activation_bytes<float>(cfg, 1, t, o, sft_loss{});
  };
  const index_t t = 1024;
  CHECK(peak(backward_schedule::full, t) > peak(backward_schedule::checkpoint, t));
  CHECK(peak(backward_schedule::checkpoint, t) > 3 * peak(backward_schedule::stream, t));
  // stream grows by about its per-token state: doubling T less than doubles the peak
  CHECK(peak(backward_schedule::stream, 2 * t) < 2 * peak(backward_schedule::stream, t));
}

TEST_CASE("plan_memory finds the largest chunk and sequence lengths within a budget") {
  auto cfg = tiny_config(4, 2, true, false, 2);
  cfg.vocab_size = 256;
  const std::size_t budget = std::size_t{4} << 20;
  const auto plan = plan_memory<float>(cfg, 1, 512, budget, sft_loss{}, 0, 1 << 16);
  CHECK(plan.chunk >= 1);
  CHECK(plan.chunk_peak_bytes <= budget);
  backward_options o;
  auto peak = [&](backward_schedule s, index_t t, index_t chunk) {
    o.sched = s;
    o.chunk = chunk;
    return predict_peak_activation_bytes<float>(cfg, 1, t, o, sft_loss{});
  };
  if (plan.chunk < 512) CHECK(peak(backward_schedule::stream, 512, 2 * plan.chunk) > budget);
  // each largest T fits and T + 1 does not
  CHECK(plan.max_seq_checkpoint >= 1);
  CHECK(peak(backward_schedule::checkpoint, plan.max_seq_checkpoint, 1) <= budget);
  CHECK(peak(backward_schedule::checkpoint, plan.max_seq_checkpoint + 1, 1) > budget);
  CHECK(peak(backward_schedule::full, plan.max_seq_full + 1, 1) > budget);
  CHECK(peak(backward_schedule::stream, plan.max_seq_stream, plan.stream_chunk) <= budget);
  CHECK(peak(backward_schedule::stream, plan.max_seq_stream + 1, plan.stream_chunk) > budget);
  CHECK(plan.max_seq_stream > plan.max_seq_checkpoint);
  CHECK(plan.max_seq_checkpoint > plan.max_seq_full);
  CHECK_THROWS_AS(plan_memory<float>(cfg, 0, 16, budget, sft_loss{}), error);
}

TEST_CASE("every preset is a valid configuration the planner accepts") {
  for (const auto& name : preset_names()) {
    CAPTURE(name);
    const model_config c = preset_config(name);
    c.validate();
    CHECK(c.qk_norm ==
          (c.architecture == "Qwen3ForCausalLM" || c.architecture == "Gemma3ForCausalLM"));
    CHECK(c.qkv_bias == (c.architecture == "Qwen2ForCausalLM"));
    backward_options o;
    o.sched = backward_schedule::stream;
    o.chunk = 64;
    CHECK(predict_peak_activation_bytes<float>(c, 1, 256, o, sft_loss{}) > 0);
  }
  CHECK_THROWS_AS(preset_config("gpt2"), error);
  // the planner's default layer follows the config: gemma3-4b is priced with gemma_layer
  const model_config g = preset_config("gemma3-4b");
  backward_options o;
  o.chunk = 64;
  CHECK(predict_peak_activation_bytes<float>(g, 1, 256, o, sft_loss{}) ==
        predict_peak_activation_bytes<float, gemma_layer>(g, 1, 256, o, sft_loss{}));
  auto llama_layer = [&] {
    return predict_peak_activation_bytes<float, decoder_layer>(g, 1, 256, o, sft_loss{});
  };
  CHECK_THROWS_WITH_AS(llama_layer(), doctest::Contains("needs the Gemma layer"), error);
}

TEST_CASE("layer-input spacing: exact gradients for every k, measured peak == prediction") {
  // 5 layers: spacings 1..5 give segments of every shape (full, partial top, one segment).
  const auto cfg = tiny_config(4, 2, true, false, 5);
  const random_batch batch(2, 13, cfg.vocab_size, {13, 9}, 17);
  using ref = reference_backend<double>;
  auto run = [&](backward_schedule s, index_t chunk, index_t k, bool embedding_grad) {
    ref be;
    llama_model<ref> model(be, cfg);
    model.init_random(4, 0.3, 0.2);
    backward_options o;
    o.sched = s;
    o.chunk = chunk;
    o.keep_every = k;
    o.embedding_grad = embedding_grad;
    if (!embedding_grad) o.layer_weight_grads = {false, true, true, true, true};  // lowest 1
    sft_loss loss;
    const backward_result r = compute_gradients(model, batch.view(), loss, o);
    const auto predicted =
        predict_peak_activation_bytes<double>(cfg, batch.batch, batch.seq_len, o, sft_loss{});
    CHECK(predicted == r.peak_activation_bytes);
    return std::make_pair(r, tightfit::testing::grads_of(model.parameters()));
  };
  for (bool embedding_grad : {true, false}) {
    const index_t layers = embedding_grad ? 5 : 4;  // backpropagated layers
    const auto [full, want] = run(backward_schedule::full, 13, 1, embedding_grad);
    std::size_t previous_peak = 0;
    for (auto s : {backward_schedule::checkpoint, backward_schedule::stream}) {
      for (index_t chunk : {index_t{4}, index_t{5}}) {  // neither divides T = 13
        for (index_t k = 1; k <= 5; ++k) {
          CAPTURE(to_string(s));
          CAPTURE(chunk);
          CAPTURE(k);
          CAPTURE(embedding_grad);
          const auto [r, grads] = run(s, chunk, k, embedding_grad);
          CHECK(std::abs(r.loss - full.loss) <= 1e-12 * std::abs(full.loss));
          for (std::size_t i = 0; i < grads.size(); ++i)
            CHECK(tightfit::testing::max_rel_diff(grads[i], want[i], 1e-300) <= 1e-12);
          CHECK(r.recomputed_layers == recomputed_layer_forwards(layers, k));
          if (k == 1) previous_peak = r.peak_activation_bytes;
          if (k == 2) CHECK(r.peak_activation_bytes < previous_peak);  // inputs were dropped
        }
      }
    }
  }
  backward_options bad;
  bad.sched = backward_schedule::full;
  bad.keep_every = 2;
  ref be;
  llama_model<ref> model(be, cfg);
  sft_loss loss;
  CHECK_THROWS_WITH_AS(compute_gradients(model, batch.view(), loss, bad),
                       doctest::Contains("full schedule keeps every activation"), error);
  bad.sched = backward_schedule::stream;
  bad.keep_every = 6;
  CHECK_THROWS_WITH_AS(compute_gradients(model, batch.view(), loss, bad),
                       doctest::Contains("keep_every is 6, expected in [1, 5]"), error);
}

TEST_CASE("stored_layer_inputs and the planner's spacing") {
  CHECK(stored_layer_inputs(8, 1) == 8);
  CHECK(stored_layer_inputs(8, 8) == 8);
  CHECK(stored_layer_inputs(8, 3) == 4);  // segments {0,1,2} {3,4,5} {6,7}: 2 kept + 2 at most
  CHECK(stored_layer_inputs(36, 6) == 11);
  CHECK(recomputed_layer_forwards(8, 3) == 5);
  auto cfg = tiny_config(4, 2, true, false, 6);
  cfg.vocab_size = 64;
  const std::size_t budget = std::size_t{1} << 20;
  const auto plan = plan_memory<float>(cfg, 1, 256, budget, sft_loss{}, 16, 1 << 15);
  // Spacing reaches at least as far as keeping every input, for both schedules.
  CHECK(plan.max_seq_stream_spaced >= plan.max_seq_stream);
  CHECK(plan.max_seq_checkpoint_spaced >= plan.max_seq_checkpoint);
  CHECK(plan.max_seq_stream_spaced > plan.max_seq_stream);
  // The reported spacing fits, one token more does not (for any spacing that stores fewest).
  backward_options o;
  o.chunk = 16;
  o.keep_every = plan.stream_keep_every;
  CHECK(predict_peak_activation_bytes<float>(cfg, 1, plan.max_seq_stream_spaced, o, sft_loss{}) <=
        budget);
  for (index_t k = 1; k <= 6; ++k) {
    if (stored_layer_inputs(6, k) != stored_layer_inputs(6, plan.stream_keep_every)) continue;
    o.keep_every = k;
    CHECK(predict_peak_activation_bytes<float>(cfg, 1, plan.max_seq_stream_spaced + 1, o,
                                               sft_loss{}) > budget);
  }
}
