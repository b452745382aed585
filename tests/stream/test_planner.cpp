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

namespace {

/// A Gemma 3 style configuration (sliding windows, q/k-norm, tied) and a Gemma 2 one (logit
/// soft-capping): the planner's default layer is gemma_layer for them.
model_config planner_gemma_config(bool gemma2) {
  model_config c = tiny_config(4, 2, !gemma2, true, 3);
  c.architecture = gemma2 ? "Gemma2ForCausalLM" : "Gemma3ForCausalLM";
  c.query_pre_attn_scalar = 10;
  c.sliding_window = 4;
  c.sliding_layers = {true, true, false};
  if (gemma2) c.final_logit_softcapping = 30;
  return c;
}

/// The peaks of the dry run itself (no closed form) with the config's layer.
template <class O>
predicted_peaks dry_run_peaks(const model_config& cfg, index_t batch, index_t t,
                              const backward_options& o, const O& objective) {
  return with_config_layer(cfg, [&](auto layer) {
    detail::dry_runner<float, decltype(layer)::template type, O> r(cfg, objective);
    const auto run = r.run(batch, t, o, false);
    return predicted_peaks{run.activation_bytes, run.host_bytes};
  });
}

/// One recording dry run (batch 1) with the config's layer, for closed_form_peaks.
detail::recorded_run dry_run_peaks_recorded(const model_config& cfg, index_t t,
                                            const backward_options& o) {
  return with_config_layer(cfg, [&](auto layer) {
    detail::dry_runner<float, decltype(layer)::template type, sft_loss> r(cfg, sft_loss{});
    return r.run(1, t, o, true);
  });
}

/// The plan with every price a dry run at T (the planner before the closed form): the reference
/// the closed form must reproduce. The searches are plan_memory's own (detail::plan_search).
plan_result reference_plan(const model_config& config, index_t batch, index_t seq_len,
                           std::size_t budget_bytes, index_t stream_chunk, index_t max_seq) {
  return detail::plan_search(config.num_hidden_layers, seq_len, budget_bytes, stream_chunk, max_seq,
                             [&](index_t t, const backward_options& o) {
                               return dry_run_peaks(config, batch, t, o, sft_loss{});
                             });
}

}  // namespace

TEST_CASE("the planner's closed form equals the dry run for every schedule, chunk and T") {
  auto qwen2 = tiny_config(4, 2, false, false, 4);
  qwen2.qkv_bias = true;
  const std::vector<model_config> configs = {tiny_config(4, 2, true, false, 5), qwen2,
                                             planner_gemma_config(false),
                                             planner_gemma_config(true)};
  std::size_t compared = 0;
  for (const auto& cfg : configs) {
    for (index_t b : {index_t{1}, index_t{3}}) {
      for (auto s :
           {backward_schedule::full, backward_schedule::checkpoint, backward_schedule::stream}) {
        for (index_t k = 1; k <= (s == backward_schedule::full ? 1 : 3); ++k) {
          for (bool offload : {false, true}) {
            if (offload && s == backward_schedule::full) continue;
            for (index_t head_rows : {index_t{0}, index_t{7}}) {
              // one cache per configuration of options, as in a planner call
              detail::peak_model_cache cache;
              for (index_t c : {index_t{1}, index_t{3}, index_t{16}, index_t{100}}) {
                for (index_t t :
                     {index_t{1}, index_t{2}, index_t{5}, index_t{17}, index_t{64}, index_t{250}}) {
                  backward_options o;
                  o.sched = s;
                  o.chunk = c;
                  o.keep_every = k;
                  o.offload_layer_inputs = offload;
                  o.head_chunk_rows = head_rows;
                  CAPTURE(cfg.architecture);
                  CAPTURE(b);
                  CAPTURE(to_string(s));
                  CAPTURE(k);
                  CAPTURE(offload);
                  CAPTURE(head_rows);
                  CAPTURE(c);
                  CAPTURE(t);
                  const auto want = dry_run_peaks(cfg, b, t, o, sft_loss{});
                  const auto got = predict_peaks<float>(cfg, b, t, o, sft_loss{}, &cache);
                  CHECK(got.activation_bytes == want.activation_bytes);
                  CHECK(got.host_bytes == want.host_bytes);
                  ++compared;
                }
              }
            }
          }
        }
      }
    }
  }
  CHECK(compared > 3000);
}

TEST_CASE("the built-in layers follow the closed form in every class (no fallback to dry runs)") {
  for (const auto& cfg : {tiny_config(4, 2, true, false, 4), planner_gemma_config(false)}) {
    for (auto s : {backward_schedule::checkpoint, backward_schedule::stream}) {
      for (index_t t : {index_t{3}, index_t{20}, index_t{1000}}) {     // 1, 2 and >= 3 chunks
        for (index_t h : {index_t{5000}, index_t{15}, index_t{64}}) {  // 1, 2, >= 3 head chunks
          backward_options o;
          o.sched = s;
          o.chunk = 10;
          o.keep_every = 2;
          o.head_chunk_rows = h;
          CAPTURE(cfg.architecture);
          CAPTURE(to_string(s));
          CAPTURE(t);
          CAPTURE(h);
          auto run = [&](const detail::dry_point& p) {
            backward_options po = o;
            po.chunk = p.chunk;
            po.head_chunk_rows = p.head_rows;
            return dry_run_peaks_recorded(cfg, p.seq_len, po);
          };
          const auto closed = detail::closed_form_peaks(1, t, o, 64, run, nullptr);
          REQUIRE(closed.has_value());
          CHECK(closed->activation_bytes ==
                dry_run_peaks(cfg, 1, t, o, sft_loss{}).activation_bytes);
        }
      }
    }
  }
}

TEST_CASE("plan_memory answers as the dry-run search did, for every budget") {
  auto qwen2 = tiny_config(4, 2, false, false, 4);
  qwen2.qkv_bias = true;
  qwen2.vocab_size = 300;
  for (const auto& cfg : {tiny_config(4, 2, true, false, 6), qwen2, planner_gemma_config(false)}) {
    for (index_t b : {index_t{1}, index_t{2}}) {
      for (index_t t : {index_t{1}, index_t{7}, index_t{64}, index_t{300}}) {
        for (std::size_t budget : {std::size_t{1}, std::size_t{20000}, std::size_t{300000},
                                   std::size_t{3} << 20, std::size_t{64} << 20}) {
          CAPTURE(cfg.architecture);
          CAPTURE(b);
          CAPTURE(t);
          CAPTURE(budget);
          const auto want = reference_plan(cfg, b, t, budget, 16, 1 << 12);
          const auto got = plan_memory<float>(cfg, b, t, budget, sft_loss{}, 16, 1 << 12);
          CHECK(got.chunk == want.chunk);
          CHECK(got.chunk_peak_bytes == want.chunk_peak_bytes);
          CHECK(got.keep_every == want.keep_every);
          CHECK(got.recomputed_layers == want.recomputed_layers);
          CHECK(got.max_seq_full == want.max_seq_full);
          CHECK(got.max_seq_checkpoint == want.max_seq_checkpoint);
          CHECK(got.max_seq_stream == want.max_seq_stream);
          CHECK(got.stream_chunk == want.stream_chunk);
          CHECK(got.max_seq_checkpoint_spaced == want.max_seq_checkpoint_spaced);
          CHECK(got.checkpoint_keep_every == want.checkpoint_keep_every);
          CHECK(got.max_seq_stream_spaced == want.max_seq_stream_spaced);
          CHECK(got.stream_keep_every == want.stream_keep_every);
          CHECK(got.max_seq_checkpoint_offload == want.max_seq_checkpoint_offload);
          CHECK(got.max_seq_stream_offload == want.max_seq_stream_offload);
          CHECK(got.checkpoint_offload_host_bytes == want.checkpoint_offload_host_bytes);
          CHECK(got.stream_offload_host_bytes == want.stream_offload_host_bytes);
        }
      }
    }
  }
}
