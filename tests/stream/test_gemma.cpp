// The Gemma 2 / Gemma 3 decoder layer (nn/gemma_layer.hpp) under the three backward schedules:
// stream == checkpoint == full in double (1e-12) with chunks smaller than the sliding window and
// T > window, finite differences of the loss, the Eigen backend against the reference one, and
// the planner's dry run equal to the measured peak.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "stream_testing.hpp"
#include "support/testing.hpp"
#include "tightfit/nn/gemma_layer.hpp"
#include "tightfit/stream/forward.hpp"
#include "tightfit/stream/planner.hpp"

using namespace tightfit;
using tightfit::testing::grads_of;
using tightfit::testing::random_batch;

namespace {

using ref = reference_backend<double>;

/// A Gemma 3 style configuration: q/k-norm, 5 local : 1 global (here 1 : 1 over 3 layers plus
/// an explicit pattern), local RoPE base, linear scaling on the global layers, no soft-capping.
model_config gemma3_config() {
  model_config c;
  c.architecture = "Gemma3ForCausalLM";
  c.vocab_size = 37;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 6;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 1e6;
  c.rope_local_base_freq = 100;
  c.rope_scaling.rope_type = "linear";
  c.rope_scaling.factor = 3;
  c.qk_norm = true;
  c.tie_word_embeddings = true;
  c.query_pre_attn_scalar = 10;
  c.sliding_window = 4;
  c.sliding_layers = {true, true, false};
  return c;
}

/// A Gemma 2 style configuration: attention and final logit soft-capping, even layers local.
model_config gemma2_config() {
  model_config c = gemma3_config();
  c.architecture = "Gemma2ForCausalLM";
  c.qk_norm = false;
  c.rope_local_base_freq = 0;
  c.rope_scaling = rope_scaling_config{};
  c.rope_theta = 10000;
  c.num_hidden_layers = 2;
  c.sliding_layers = {true, false};
  c.attn_logit_softcapping = 1.5;  // small, so that tanh is far from linear
  c.final_logit_softcapping = 2.0;
  c.query_pre_attn_scalar = 8;
  return c;
}

struct run_output {
  double loss = 0;
  std::vector<std::vector<double>> grads;
  backward_result result;
};

template <class B = ref>
run_output run(const model_config& cfg, const token_batch& batch, const backward_options& opt,
               std::uint64_t seed = 7) {
  B be;
  gemma_model<B> model(be, cfg);
  model.init_random(seed, 0.4, 0.3);
  sft_loss loss;
  run_output out;
  out.result = compute_gradients(model, batch, loss, opt);
  out.loss = out.result.loss;
  out.grads = grads_of(model.parameters());
  return out;
}

double max_grad_rel_diff(const run_output& a, const run_output& b) {
  REQUIRE(a.grads.size() == b.grads.size());
  double worst = 0;
  for (std::size_t i = 0; i < a.grads.size(); ++i) {
    REQUIRE(a.grads[i].size() == b.grads[i].size());
    worst = std::max(worst, tightfit::testing::max_rel_diff(a.grads[i], b.grads[i], 1e-12));
  }
  return worst;
}

backward_options with(backward_schedule s, index_t chunk) {
  backward_options o;
  o.sched = s;
  o.chunk = chunk;
  return o;
}

}  // namespace

TEST_CASE("gemma layer: stream, checkpoint and full agree in double (chunk < window < T)") {
  for (const bool gemma2 : {false, true}) {
    CAPTURE(gemma2);
    const model_config cfg = gemma2 ? gemma2_config() : gemma3_config();
    for (const bool packed : {false, true}) {
      CAPTURE(packed);
      const random_batch rb(packed ? 1 : 2, 13, cfg.vocab_size,
                            packed ? std::vector<index_t>{} : std::vector<index_t>{13, 10}, 29);
      token_batch batch = rb.view();
      const std::vector<index_t> positions{0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4};
      if (packed) batch.position_ids = positions;
      const auto full = run(cfg, batch, with(backward_schedule::full, 13));
      CHECK(std::isfinite(full.loss));
      CHECK(full.loss > 0);
      for (index_t chunk : {index_t{1}, index_t{3}, index_t{5}}) {
        CAPTURE(chunk);
        const auto ckpt = run(cfg, batch, with(backward_schedule::checkpoint, chunk));
        const auto stream = run(cfg, batch, with(backward_schedule::stream, chunk));
        CHECK(std::abs(stream.loss - full.loss) <= 1e-12 * std::abs(full.loss));
        CHECK(std::abs(ckpt.loss - full.loss) <= 1e-12 * std::abs(full.loss));
        CHECK(max_grad_rel_diff(stream, full) < 1e-12);
        CHECK(max_grad_rel_diff(ckpt, full) < 1e-12);
      }
      // every parameter got a non-zero gradient (the comparison is not vacuous)
      for (const auto& g : full.grads) {
        double norm = 0;
        for (double x : g) norm += x * x;
        CHECK(norm > 0);
      }
    }
  }
}

TEST_CASE("gemma layer: each Gemma feature changes the loss (the tests are not vacuous)") {
  const random_batch rb(2, 13, 37, {13, 10}, 29);
  for (const bool gemma2 : {false, true}) {
    CAPTURE(gemma2);
    const model_config cfg = gemma2 ? gemma2_config() : gemma3_config();
    const double base = run(cfg, rb.view(), with(backward_schedule::full, 13)).loss;
    std::vector<model_config> changed;
    auto add = [&](auto edit) {
      model_config c = cfg;
      edit(c);
      changed.push_back(c);
    };
    add([](model_config& c) { c.sliding_window = 0; });
    add([](model_config& c) { c.query_pre_attn_scalar = 0; });
    if (gemma2) {
      add([](model_config& c) { c.attn_logit_softcapping = 0; });
      add([](model_config& c) { c.final_logit_softcapping = 0; });
    } else {
      add([](model_config& c) { c.rope_local_base_freq = 0; });
      add([](model_config& c) { c.rope_scaling = rope_scaling_config{}; });
    }
    for (const auto& c : changed)
      CHECK(std::abs(run(c, rb.view(), with(backward_schedule::full, 13)).loss - base) > 1e-9);
  }
}

TEST_CASE("gemma layer: finite differences of the loss match the stream gradients") {
  for (const bool gemma2 : {false, true}) {
    CAPTURE(gemma2);
    const model_config cfg = gemma2 ? gemma2_config() : gemma3_config();
    const random_batch rb(2, 9, cfg.vocab_size, {9, 7}, 5, 0.1);
    ref be;
    gemma_model<ref> model(be, cfg);
    model.init_random(3, 0.4, 0.3);
    sft_loss loss;
    compute_gradients(model, rb.view(), loss, with(backward_schedule::stream, 2));
    auto& params = model.parameters();
    backward_options loss_only = with(backward_schedule::stream, 2);
    loss_only.embedding_grad = false;
    loss_only.head_grad = false;
    loss_only.layer_weight_grads.assign(static_cast<std::size_t>(cfg.num_hidden_layers), false);
    auto loss_at = [&] {
      sft_loss l;
      return compute_gradients(model, rb.view(), l, loss_only).loss;
    };
    const double h = 1e-5;
    int checked = 0;
    for (std::size_t i = 0; i < params.size(); ++i) {
      auto value = params.value(i);
      auto grad = params.grad(i);
      for (std::size_t k : {std::size_t{0}, value.size() / 2, value.size() - 1}) {
        const double saved = value[k];
        value[k] = saved + h;
        const double up = loss_at();
        value[k] = saved - h;
        const double down = loss_at();
        value[k] = saved;
        const double fd = (up - down) / (2 * h);
        CAPTURE(params.name(i));
        CAPTURE(k);
        CHECK(std::abs(fd - grad[k]) <= 1e-7 * std::max(1.0, std::abs(fd)));
        ++checked;
      }
    }
    CHECK(checked == 3 * static_cast<int>(params.size()));
  }
}

TEST_CASE("gemma layer: the forward-only log-probs equal the gradient pass's loss") {
  const model_config cfg = gemma2_config();
  const random_batch rb(2, 13, cfg.vocab_size, {13, 10}, 29, 0.0);
  ref be;
  gemma_model<ref> model(be, cfg);
  model.init_random(7, 0.4, 0.3);
  forward_options fo;
  fo.chunk = 3;
  const auto lp = model_logprobs(model, rb.view(), fo);
  double sum = 0;
  index_t counted = 0;
  for (index_t b = 0; b < 2; ++b) {
    const index_t len = rb.lengths[static_cast<std::size_t>(b)];
    for (index_t t = 0; t < (len < 13 ? len - 1 : len); ++t) {  // a padded row's last is unscored
      sum += lp[static_cast<std::size_t>(b * 13 + t)];
      ++counted;
    }
  }
  sft_loss loss;
  const double l =
      compute_gradients(model, rb.view(), loss, with(backward_schedule::stream, 3)).loss;
  CHECK(std::abs(-sum / static_cast<double>(counted) - l) <= 1e-12 * std::abs(l));
}

TEST_CASE("gemma layer: predicted peak activation bytes equal the measured ones") {
  for (const bool gemma2 : {false, true}) {
    CAPTURE(gemma2);
    const model_config cfg = gemma2 ? gemma2_config() : gemma3_config();
    const random_batch batch(2, 23, cfg.vocab_size, {23, 17}, 3);
    for (backward_schedule s :
         {backward_schedule::full, backward_schedule::checkpoint, backward_schedule::stream}) {
      const std::string name = to_string(s);
      CAPTURE(name);
      backward_options o = with(s, 5);
      reference_backend<float> be;
      gemma_model<reference_backend<float>> model(be, cfg);
      model.init_random(2);
      sft_loss loss;
      const auto measured = compute_gradients(model, batch.view(), loss, o).peak_activation_bytes;
      const auto predicted =
          predict_peak_activation_bytes<float, gemma_layer>(cfg, 2, 23, o, sft_loss{});
      CHECK(measured > 0);
      CHECK(predicted == measured);
    }
  }
}
