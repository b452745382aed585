// BAdam: K steps per block, state freed on switch, truncated backward == full gradients
// restricted to the active block, bad input. (BREAD-SGD and BREAD-LoRA, on every layer type:
// test_any_model.cpp.)
#include <doctest/doctest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "optim_testing.hpp"
#include "tightfit/nn/decoder_layer.hpp"

using namespace tightfit;
using optim_testing::max_diff;
using optim_testing::ref;
using optim_testing::values_of;
using tightfit::testing::grads_of;
using tightfit::testing::random_batch;

namespace {

backward_options stream_opts() {
  backward_options o;
  o.sched = backward_schedule::stream;
  o.chunk = 4;
  return o;
}

block_options k_steps(index_t k) {
  block_options o;
  o.switch_every = k;
  return o;
}

}  // namespace

TEST_CASE("exactly K steps per block, the first block included, in the policy's order") {
  const auto cfg = optim_testing::config(3);
  const random_batch batch(1, 8, cfg.vocab_size, {}, 1);
  for (index_t k : {1, 2, 3}) {
    ref be;
    llama_model<ref> model(be, cfg);
    model.init_random(7, 0.3);
    block_optimizer<llama_model<ref>, adam_update_rule, descending_order> opt(
        model, block_partition::by_layer(model.parameters()), {}, {}, {}, k_steps(k));
    CHECK(opt.active_block() == -1);
    std::vector<index_t> seen;
    sft_loss loss;
    for (index_t s = 0; s < 7 * k; ++s) {
      const auto r = opt.step(batch.view(), loss, stream_opts());
      seen.push_back(r.block);
      CHECK(r.switched == (s % k == 0));
    }
    std::vector<index_t> expect;
    for (index_t b : {2, 1, 0, 2, 1, 0, 2})
      for (index_t s = 0; s < k; ++s) expect.push_back(b);
    CHECK(seen == expect);
    CHECK(opt.steps() == 7 * k);
  }
}

TEST_CASE("random order: every block once per pass of D*K steps") {
  const auto cfg = optim_testing::config(4);
  const random_batch batch(1, 6, cfg.vocab_size, {}, 1);
  ref be;
  llama_model<ref> model(be, cfg);
  model.init_random(7, 0.3);
  block_options o = k_steps(2);
  o.seed = 99;
  block_optimizer<llama_model<ref>> opt(model, block_partition::by_layer(model.parameters()), {},
                                        random_reshuffle{2}, {}, o);
  sft_loss loss;
  std::vector<index_t> seen;
  for (int s = 0; s < 24; ++s) seen.push_back(opt.step(batch.view(), loss, stream_opts()).block);
  CHECK(seen.front() == 2);
  for (int pass = 0; pass < 3; ++pass) {
    std::set<index_t> blocks;
    for (int s = pass * 8; s < pass * 8 + 8; s += 2) {
      CHECK(seen[static_cast<std::size_t>(s)] == seen[static_cast<std::size_t>(s + 1)]);
      blocks.insert(seen[static_cast<std::size_t>(s)]);
    }
    CHECK(blocks.size() == 4);
  }
}

TEST_CASE("only the active block holds state and gradients; state freed on switch") {
  const auto cfg = optim_testing::config(3);
  const random_batch batch(2, 8, cfg.vocab_size, {8, 5}, 2);
  ref be;
  llama_model<ref> model(be, cfg);
  model.init_random(7, 0.3);
  auto& params = model.parameters();
  const auto part = block_partition::by_layer(params, true, true);
  block_optimizer<llama_model<ref>, adam_update_rule, ascending_order> opt(model, part, {}, {}, {},
                                                                           k_steps(2));
  const std::size_t weights = be.memory().live();
  sft_loss loss;
  for (int s = 0; s < 10; ++s) {
    const auto r = opt.step(batch.view(), loss, stream_opts());
    const auto& ids = part[static_cast<std::size_t>(r.block)].ids;
    index_t n = 0;
    for (auto id : ids) n += params.numel(id);
    const std::size_t block_bytes = sizeof(double) * static_cast<std::size_t>(n);
    CHECK(opt.state_bytes() == 2 * block_bytes);
    // live memory: the weights, the block's gradient and its two moments, nothing else
    CHECK(be.memory().live() == weights + 3 * block_bytes);
    std::set<std::size_t> mine(ids.begin(), ids.end());
    for (std::size_t i = 0; i < params.size(); ++i) CHECK(params.has_grad(i) == mine.contains(i));
  }
}

TEST_CASE("truncated backward: the active block's gradients equal the full ones, less work") {
  for (bool tied : {false, true}) {
    const auto cfg = tightfit::testing::tiny_config(4, 2, true, tied, 3);
    const random_batch batch(2, 9, cfg.vocab_size, {9, 6}, 4);
    // Full gradients of the same weights.
    ref be_full;
    llama_model<ref> full(be_full, cfg);
    full.init_random(7, 0.3, 0.2);
    sft_loss l0;
    const double full_loss = compute_gradients(full, batch.view(), l0, stream_opts()).loss;
    const auto want = grads_of(full.parameters());
    const double full_flops = be_full.stats().gemm_flops;

    const auto part = block_partition::by_layer(full.parameters(), true, true);
    for (std::size_t b = 0; b < part.size(); ++b) {
      ref be;
      llama_model<ref> model(be, cfg);
      model.init_random(7, 0.3, 0.2);
      adam_update_rule frozen_lr;
      frozen_lr.lr = 0;  // keep the weights: only the gradient is inspected
      block_optimizer<llama_model<ref>> opt(model, part, frozen_lr,
                                            random_reshuffle{static_cast<index_t>(b)});
      sft_loss loss;
      const auto r = opt.step(batch.view(), loss, stream_opts());
      CAPTURE(tied);
      CAPTURE(part[b].name);
      REQUIRE(r.block == static_cast<index_t>(b));
      CHECK(r.loss == doctest::Approx(full_loss).epsilon(1e-12));
      auto& params = model.parameters();
      for (std::size_t i = 0; i < params.size(); ++i) {
        const bool mine = std::find(part[b].ids.begin(), part[b].ids.end(), i) != part[b].ids.end();
        REQUIRE(params.has_grad(i) == mine);
        if (mine) {
          const auto g = params.grad(i);
          CHECK(tightfit::testing::max_rel_diff(std::vector<double>(g.begin(), g.end()), want[i],
                                                1e-12) < 1e-12);
        }
      }
      // layers below the block are not backpropagated; frozen layers skip weight GEMMs
      const index_t layer = static_cast<index_t>(b) - 1;  // block 0 is the embedding
      if (layer >= 0 && layer < 3) {
        CHECK(r.backward.lowest_layer == layer);
        CHECK(be.stats().gemm_flops < full_flops);
      }
    }
  }
}

TEST_CASE("bad input: K = 0, unknown block, mismatched partition or saved state") {
  const auto cfg = optim_testing::config(2);
  ref be;
  llama_model<ref> model(be, cfg);
  const auto part = block_partition::by_layer(model.parameters());
  using opt_t = block_optimizer<llama_model<ref>>;
  CHECK_THROWS_WITH_AS(opt_t(model, part, {}, {}, {}, k_steps(0)),
                       doctest::Contains("switch_every (K) is 0, expected >= 1"), error);
  CHECK_THROWS_WITH_AS(
      (block_optimizer<llama_model<ref>, adam_update_rule, fixed_order>(model, part)),
      doctest::Contains("no start block"), error);
  CHECK_THROWS_WITH_AS(opt_t(model, part, {}, random_reshuffle{5}),
                       doctest::Contains("start block is 5"), error);
  CHECK_THROWS_WITH_AS(part.index_of("layer.7"), doctest::Contains("unknown block name 'layer.7'"),
                       error);
  ref be2;
  llama_model<ref> other(be2, optim_testing::config(3));
  CHECK_THROWS_WITH_AS(opt_t(other, part), doctest::Contains("the partition covers"), error);
  lora_expansion big;
  big.rank = 100;
  CHECK_THROWS_WITH_AS(
      (block_optimizer<llama_model<ref>, adam_update_rule, random_reshuffle, lora_expansion>(
          model, part, {}, {}, big)),
      doctest::Contains("rank is 100"), error);
}
