// A user's own decoder layer (examples/parallel_layer.hpp: parallel attention + MLP, written from
// backend kernels) plugs into decoder_model<B, L> and the gradient, forward-only and planner
// entry points: stream == checkpoint == full in double, and finite differences.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "parallel_layer.hpp"
#include "stream_testing.hpp"
#include "support/testing.hpp"
#include "tightfit/nn/decoder_layer.hpp"
#include "tightfit/stream/forward.hpp"
#include "tightfit/stream/planner.hpp"

using namespace tightfit;
using tightfit::testing::grads_of;
using tightfit::testing::random_batch;
using tightfit::testing::tiny_config;

namespace {
using ref = reference_backend<double>;
using model_t = decoder_model<ref, parallel_layer<ref>>;
static_assert(DecoderLayer<parallel_layer<ref>, ref>);
// A layer without the sequence-parallel extension is still a DecoderLayer (the extension is
// optional: nn/sequence_shard.hpp).
static_assert(!SequenceParallelLayer<parallel_layer<ref>, ref>);
static_assert(DecoderModel<model_t>);
static_assert(DecoderModel<llama_model<ref>>);

model_config config() {
  auto cfg = tiny_config(4, 2, false, false, 3);  // GQA, no q/k norm, three layers
  return cfg;
}

struct outcome {
  double loss = 0;
  std::vector<std::vector<double>> grads;
};

outcome run(const random_batch& batch, backward_schedule s, index_t chunk) {
  ref be;
  model_t model(be, config());
  model.init_random(11, 0.3, 0.2);
  sft_loss loss;
  backward_options o;
  o.sched = s;
  o.chunk = chunk;
  outcome out;
  out.loss = compute_gradients(model, batch.view(), loss, o).loss;
  out.grads = grads_of(model.parameters());
  return out;
}
}  // namespace

TEST_CASE("a user's parallel attention + MLP layer: stream == checkpoint == full (double)") {
  const auto cfg = config();
  const random_batch batch(2, 11, cfg.vocab_size, {11, 7}, 3);
  const outcome full = run(batch, backward_schedule::full, 11);
  REQUIRE(std::isfinite(full.loss));
  std::size_t nonzero = 0;
  for (const auto& g : full.grads)
    for (double x : g) nonzero += x != 0;
  CHECK(nonzero > 100);  // every parameter takes part
  for (const auto& [s, chunk] : {std::pair{backward_schedule::checkpoint, index_t{11}},
                                 std::pair{backward_schedule::stream, index_t{3}},
                                 std::pair{backward_schedule::stream, index_t{1}}}) {
    CAPTURE(to_string(s));
    CAPTURE(chunk);
    const outcome other = run(batch, s, chunk);
    CHECK(std::abs(other.loss - full.loss) <= 1e-12 * std::abs(full.loss));
    REQUIRE(other.grads.size() == full.grads.size());
    for (std::size_t i = 0; i < full.grads.size(); ++i)
      CHECK(tightfit::testing::max_rel_diff(other.grads[i], full.grads[i], 1e-12) <= 1e-10);
  }
}

TEST_CASE("a user's parallel layer: finite differences match the stream gradients") {
  const auto cfg = config();
  const random_batch batch(2, 6, cfg.vocab_size, {6, 4}, 5, 0.1);
  ref be;
  model_t model(be, cfg);
  model.init_random(3, 0.3, 0.2);
  sft_loss loss;
  backward_options o;
  o.chunk = 4;
  compute_gradients(model, batch.view(), loss, o);
  backward_options loss_only = o;
  loss_only.embedding_grad = loss_only.head_grad = false;
  loss_only.layer_weight_grads.assign(static_cast<std::size_t>(cfg.num_hidden_layers), false);
  auto& params = model.parameters();
  const double h = 1e-5;
  for (std::size_t i = 0; i < params.size(); ++i) {
    auto value = params.value(i);
    auto grad = params.grad(i);
    for (std::size_t k : {std::size_t{0}, value.size() / 2, value.size() - 1}) {
      const double saved = value[k];
      sft_loss l;
      value[k] = saved + h;
      const double up = compute_gradients(model, batch.view(), l, loss_only).loss;
      value[k] = saved - h;
      const double down = compute_gradients(model, batch.view(), l, loss_only).loss;
      value[k] = saved;
      const double fd = (up - down) / (2 * h);
      CAPTURE(params.name(i));
      CHECK(std::abs(fd - grad[k]) <= 1e-6 * std::max(1.0, std::abs(fd)));
    }
  }
}

TEST_CASE("a user's parallel layer: forward-only log-probs and the planner") {
  const auto cfg = config();
  const random_batch batch(2, 9, cfg.vocab_size, {9, 5}, 8, 0.0);
  ref be;
  model_t model(be, cfg);
  model.init_random(4, 0.3, 0.2);
  forward_options fo;
  fo.chunk = 2;
  const auto lp = model_logprobs(model, batch.view(), fo);
  double sum = 0;
  for (double x : lp) sum += x;
  sft_loss loss;
  backward_options o;
  o.chunk = 2;
  const auto r = compute_gradients(model, batch.view(), loss, o);
  std::size_t counted = 0;  // sft loss: mean of -log p over counted targets
  for (index_t b = 0; b < 2; ++b) {
    const index_t len = batch.lengths[static_cast<std::size_t>(b)];
    for (index_t p = 0; p < (len < 9 ? len - 1 : len); ++p)  // a padded row's last: padding
      counted += batch.targets[static_cast<std::size_t>(b * 9 + p)] != ignore_index;
  }
  CHECK(std::abs(-sum / double(counted) - r.loss) <= 1e-12 * std::abs(r.loss));
  // the dry run of the planner with this layer type predicts the measured peak exactly
  const auto predicted =
      predict_peak_activation_bytes<double, parallel_layer>(cfg, 2, 9, o, sft_loss{});
  CHECK(predicted == r.peak_activation_bytes);
}
