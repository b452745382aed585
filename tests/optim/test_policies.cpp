// Policies of the optimizers: orders, partitions, schedules, update-rule state, clipping.
#include <doctest/doctest.h>

#include <algorithm>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "optim_testing.hpp"
#include "tightfit/nn/decoder_layer.hpp"

using namespace tightfit;
using optim_testing::ref;

namespace {

template <class O>
std::vector<index_t> passes(const O& order, index_t blocks, int count, std::uint64_t seed = 5) {
  std::mt19937_64 rng(seed);
  std::vector<index_t> all, seq;
  for (int p = 0; p < count; ++p) {
    order.fill_pass(seq, blocks, p, rng);
    all.insert(all.end(), seq.begin(), seq.end());
  }
  return all;
}

bool is_permutation_of_blocks(std::vector<index_t> v, index_t blocks) {
  std::sort(v.begin(), v.end());
  for (index_t k = 0; k < blocks; ++k)
    if (v[static_cast<std::size_t>(k)] != k) return false;
  return static_cast<index_t>(v.size()) == blocks;
}

}  // namespace

TEST_CASE("orders: ascending, descending, fixed, each with a start block") {
  CHECK(passes(ascending_order{}, 4, 2) == std::vector<index_t>{0, 1, 2, 3, 0, 1, 2, 3});
  CHECK(passes(ascending_order{2}, 4, 2) == std::vector<index_t>{2, 3, 0, 1, 2, 3, 0, 1});
  CHECK(passes(descending_order{}, 4, 2) == std::vector<index_t>{3, 2, 1, 0, 3, 2, 1, 0});
  CHECK(passes(descending_order{1}, 4, 1) == std::vector<index_t>{1, 0, 3, 2});
  CHECK(passes(fixed_order{2}, 4, 3) == std::vector<index_t>{2, 2, 2});
  CHECK_THROWS_WITH_AS(fixed_order{}.validate(4), doctest::Contains("no start block"), error);
  CHECK_THROWS_WITH_AS(ascending_order{4}.validate(4), doctest::Contains("start block is 4"),
                       error);
  CHECK_THROWS_WITH_AS(random_reshuffle{-1}.validate(4), doctest::Contains("start block is -1"),
                       error);
}

TEST_CASE("random reshuffling: a fresh permutation per pass, seeded, start block first") {
  const index_t d = 6;
  const auto a = passes(random_reshuffle{}, d, 5, 11);
  const auto b = passes(random_reshuffle{}, d, 5, 11);
  const auto c = passes(random_reshuffle{}, d, 5, 12);
  CHECK(a == b);
  CHECK(a != c);
  std::set<std::vector<index_t>> distinct;
  for (int p = 0; p < 5; ++p) {
    std::vector<index_t> pass(a.begin() + p * d, a.begin() + (p + 1) * d);
    CHECK(is_permutation_of_blocks(pass, d));
    distinct.insert(pass);
  }
  CHECK(distinct.size() > 1);  // passes are reshuffled, not repeated
  for (index_t s = 0; s < d; ++s) {
    const auto w = passes(random_reshuffle{s}, d, 2, 3);
    CHECK(w.front() == s);
    CHECK(is_permutation_of_blocks({w.begin(), w.begin() + d}, d));
  }
  runtime_order r;
  r.what = runtime_order::parse("descending");
  CHECK(passes(r, 3, 1) == std::vector<index_t>{2, 1, 0});
  CHECK_THROWS_WITH_AS(runtime_order::parse("sideways"),
                       doctest::Contains("unknown block order 'sideways'"), error);
}

TEST_CASE("partition by layer: embedding and head only when asked") {
  ref be;
  llama_model<ref> model(be, optim_testing::config(3));
  const auto& params = model.parameters();
  const auto p = block_partition::by_layer(params);
  REQUIRE(p.size() == 3);
  CHECK(p[1].name == "layer.1");
  auto ids1 = model.layer_param_ids(1);
  std::sort(ids1.begin(), ids1.end());
  CHECK(p[1].ids == ids1);
  CHECK(p.frozen().size() == 3);  // embedding, final norm, lm_head
  const auto q = block_partition::by_layer(params, true, true);
  REQUIRE(q.size() == 5);
  CHECK(q[0].name == "embedding");
  CHECK(q[4].name == "head");
  CHECK(q[4].ids.size() == 2);
  CHECK(q.frozen().empty());
  CHECK(q.index_of("layer.2") == 3);
  CHECK_THROWS_WITH_AS(q.index_of("layer.9"), doctest::Contains("unknown block name 'layer.9'"),
                       error);
}

TEST_CASE("partition by prefixes matches whole components: layers.1 never matches layers.10") {
  ref be;
  parameter_set<ref> p(be);
  for (const char* n : {"model.layers.1.mlp.w", "model.layers.10.mlp.w", "model.layers.1.attn.w",
                        "model.embed_tokens.weight", "lm_head.weight"})
    p.add(n, {2});
  for (const char* prefix : {"layers.1", "layers.1.", "model.layers.1"}) {
    const auto part = block_partition::by_prefixes(p, {{"one", {prefix}}, {"ten", {"layers.10."}}},
                                                   {"model.embed_tokens", "lm_head"});
    CHECK(part[0].ids == std::vector<std::size_t>{0, 2});
    CHECK(part[1].ids == std::vector<std::size_t>{1});
  }
  CHECK(block_partition::components("a.b.") == std::vector<std::string>{"a", "b"});
  // regular expressions
  const auto rx = block_partition::by_regex(p, {{"mlps", {"\\.mlp\\."}}, {"rest", {"attn|embed"}}},
                                            {"^lm_head"});
  CHECK(rx[0].ids == std::vector<std::size_t>{0, 1});
  CHECK(rx[1].ids == std::vector<std::size_t>{2, 3});
  // errors: a parameter in two blocks, in none, a block matching nothing, a bad regex
  CHECK_THROWS_WITH_AS(
      block_partition::by_prefixes(p, {{"a", {"layers"}}, {"b", {"layers.1"}}},
                                   {"embed_tokens", "lm_head"}),
      doctest::Contains("parameter 'model.layers.1.mlp.w' is in two blocks, 'a' and 'b'"), error);
  CHECK_THROWS_WITH_AS(block_partition::by_prefixes(p, {{"a", {"layers"}}}, {"lm_head"}),
                       doctest::Contains("parameter 'model.embed_tokens.weight' is in no block"),
                       error);
  CHECK_THROWS_WITH_AS(block_partition::by_prefixes(p, {{"a", {"layers"}}, {"b", {"layers.7"}}},
                                                    {"embed_tokens", "lm_head"}),
                       doctest::Contains("block 'b' matches no parameter"), error);
  CHECK_THROWS_WITH_AS(block_partition::by_regex(p, {{"a", {"(("}}}),
                       doctest::Contains("bad regular expression '(('"), error);
  CHECK_THROWS_WITH_AS(
      block_partition::by_prefixes(p, {{"a", {"layers"}}, {"a", {"embed_tokens", "lm_head"}}}),
      doctest::Contains("two blocks are named 'a'"), error);
}

TEST_CASE("schedules") {
  CHECK(constant_schedule{}(17) == 1.0);
  const linear_warmup_schedule w{4};
  CHECK(w(0) == doctest::Approx(0.25));
  CHECK(w(3) == doctest::Approx(1.0));
  CHECK(w(10) == 1.0);
  const cosine_schedule c{2, 12, 0.1};
  CHECK(c(0) == doctest::Approx(0.5));
  CHECK(c(2) == doctest::Approx(1.0));
  CHECK(c(11) == doctest::Approx(0.1));
  CHECK(c(7) < c(6));
  const auto r = runtime_schedule::parse("cosine:2", 12);
  for (std::int64_t s = 0; s < 12; ++s) CHECK(r(s) == doctest::Approx(cosine_schedule{2, 12}(s)));
  CHECK(runtime_schedule::parse("warmup:4", 9)(1) == doctest::Approx(w(1)));
  CHECK_THROWS_WITH_AS(runtime_schedule::parse("step", 9),
                       doctest::Contains("unknown schedule 'step'"), error);
  CHECK_THROWS_WITH_AS(runtime_schedule::parse("cosine:x", 9),
                       doctest::Contains("warmup steps are 'x'"), error);
}

TEST_CASE("AdamW decays matrices only; rule state is 2x the owned parameters for Adam") {
  CHECK(decays("model.layers.0.mlp.up_proj.weight", 2));
  CHECK_FALSE(decays("model.layers.0.input_layernorm.weight", 1));
  CHECK_FALSE(decays("model.layers.0.self_attn.q_norm.weight", 1));
  CHECK_FALSE(decays("x.bias", 2));
  ref be;
  llama_model<ref> model(be, optim_testing::config(2));
  auto& params = model.parameters();
  const auto ids = model.layer_param_ids(1);
  index_t n = 0;
  for (auto id : ids) n += params.numel(id);
  const std::size_t before = be.memory().live();
  {
    rule_state<ref, adam_update_rule> s(params, ids, adam_update_rule{});
    CHECK(s.bytes() == 2 * sizeof(double) * static_cast<std::size_t>(n));
    CHECK(be.memory().live() - before == s.bytes());
    sgd_update_rule plain;
    CHECK(rule_state<ref, sgd_update_rule>(params, ids, plain).bytes() == 0);
    plain.momentum = 0.9;
    CHECK(rule_state<ref, sgd_update_rule>(params, ids, plain).bytes() ==
          sizeof(double) * static_cast<std::size_t>(n));
  }
  CHECK(be.memory().live() == before);
  adam_update_rule bad;
  bad.beta1 = 1.0;
  CHECK_THROWS_WITH_AS(bad.validate(), doctest::Contains("adam: beta1 is 1"), error);
  adamw_update_rule bad_w;
  bad_w.lr = -1;
  CHECK_THROWS_WITH_AS(bad_w.validate(), doctest::Contains("adamw: lr is -1"), error);
  sgd_update_rule bad_s;
  bad_s.momentum = 1;
  CHECK_THROWS_WITH_AS(bad_s.validate(), doctest::Contains("sgd: momentum is 1"), error);
}

TEST_CASE("AdamW step equals the kernel with decay on matrices and none on norms") {
  ref be;
  llama_model<ref> model(be, optim_testing::config(1));
  model.init_random(3, 0.3, 0.2);
  auto& params = model.parameters();
  const auto ids = model.layer_param_ids(0);
  for (auto id : ids) {
    params.allocate_grad(id);
    tightfit::testing::fill_uniform(params.grad(id), 100 + id);
  }
  const auto before = optim_testing::values_of(params);
  adamw_update_rule rule;
  rule.weight_decay = 0.1;
  rule.lr = 0.01;
  rule_state<ref, adamw_update_rule> s(params, ids, rule);
  s.step(params, rule, 0.5);
  for (auto id : ids) {
    std::vector<double> p = before[id], m(p.size()), v(p.size());
    adam_hyper<double> h;
    h.lr = 0.005;
    h.weight_decay = params.shape(id).size() == 2 ? 0.1 : 0.0;
    h.decoupled = true;
    be.adam_update(std::span<double>(p), std::span<const double>(params.grad(id)),
                   std::span<double>(m), std::span<double>(v), h);
    CHECK(tightfit::testing::max_rel_diff(optim_testing::values_of(params)[id], p) == 0.0);
  }
}

TEST_CASE("clipping by global norm") {
  ref be;
  parameter_set<ref> p(be);
  p.add("a", {3});
  p.add("b", {2});
  for (std::size_t i = 0; i < 2; ++i) p.allocate_grad(i);
  const std::vector<double> ga{3, 0, 4}, gb{0, 12};  // norm 13
  std::copy(ga.begin(), ga.end(), p.grad(0).begin());
  std::copy(gb.begin(), gb.end(), p.grad(1).begin());
  const std::vector<std::size_t> ids{0, 1};
  CHECK(grad_norm(p, ids) == doctest::Approx(13));
  CHECK(clip_grad_norm(p, ids, 26.0) == doctest::Approx(13));
  CHECK(p.grad(0)[0] == 3.0);  // below the bound: untouched
  CHECK(clip_grad_norm(p, ids, 6.5) == doctest::Approx(13));
  CHECK(grad_norm(p, ids) == doctest::Approx(6.5).epsilon(1e-6));
  CHECK(p.grad(1)[1] / p.grad(0)[2] == doctest::Approx(3.0));
  CHECK_THROWS_WITH_AS(clip_grad_norm(p, ids, 0.0), doctest::Contains("max_norm is 0"), error);
}
