// The memory planner: dry-run predictions against measured peaks, chunk and length search.
#include <doctest/doctest.h>

#include <cmath>

#include "stream_testing.hpp"
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
      decoder_model<reference_backend<float>> model(be, cfg);
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
    CHECK(c.qk_norm == (c.architecture == "Qwen3ForCausalLM"));
    CHECK(c.qkv_bias == (c.architecture == "Qwen2ForCausalLM"));
    backward_options o;
    o.sched = backward_schedule::stream;
    o.chunk = 64;
    CHECK(predict_peak_activation_bytes<float>(c, 1, 256, o, sft_loss{}) > 0);
  }
  CHECK_THROWS_AS(preset_config("gpt2"), error);
}
