// Every optimizer of optim/ on every kind of layer: Adam, BAdam, BREAD-SGD, BREAD-LoRA and LoRA
// train gemma_model (Gemma 2 and Gemma 3 configurations) and a user's own layer
// (examples/parallel_layer.hpp) through the TrainableModel concept (BREAD the Llama layer too),
// exactly: each step equals an oracle that computes every gradient with compute_gradients, then
// applies the update rule with the reference backend's kernels (double, 1e-12 relative), and
// LoRA's adapter gradients equal those of the merged weight W0 + s B A (dB = s dW A^T,
// dA = s B^T dW).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "optim_testing.hpp"
#include "parallel_layer.hpp"
#include "tightfit/nn/decoder_layer.hpp"
#include "tightfit/nn/gemma_layer.hpp"
#include "tightfit/nn/lora.hpp"
#include "tightfit/optim/lora_optimizer.hpp"
#include "tightfit/optim/train.hpp"

using namespace tightfit;
using optim_testing::matmul;
using optim_testing::max_diff;
using optim_testing::ref;
using optim_testing::values_of;
using tightfit::testing::max_rel_diff;
using tightfit::testing::random_batch;

namespace {

using custom_model = decoder_model<ref, parallel_layer<ref>>;
static_assert(TrainableModel<gemma_model<ref>>);
static_assert(TrainableModel<custom_model>);
static_assert(LoraLayer<parallel_layer<ref>, ref>);
static_assert(SequenceParallelLayer<gemma_layer<ref>, ref>);

/// Gemma 3 style: q/k-norm, sliding and global layers, local RoPE base, linear scaling.
model_config gemma3_config() {
  model_config c = tightfit::testing::tiny_config(4, 2, true, true, 3);
  c.architecture = "Gemma3ForCausalLM";
  c.rope_theta = 1e6;
  c.rope_local_base_freq = 100;
  c.rope_scaling.rope_type = "linear";
  c.rope_scaling.factor = 3;
  c.query_pre_attn_scalar = 10;
  c.sliding_window = 4;
  c.sliding_layers = {true, true, false};
  return c;
}
/// Gemma 2 style: attention and final logit soft-capping, untied head.
model_config gemma2_config() {
  model_config c = tightfit::testing::tiny_config(4, 2, false, false, 2);
  c.architecture = "Gemma2ForCausalLM";
  c.attn_logit_softcapping = 1.5;
  c.final_logit_softcapping = 2.0;
  c.query_pre_attn_scalar = 8;
  c.sliding_window = 4;
  c.sliding_layers = {true, false};
  return c;
}
/// The user's parallel attention + MLP layer (no q/k-norm, plain RoPE).
model_config custom_config() {
  return tightfit::testing::tiny_config(4, 2, false, false, 3);
}

template <class M>
void init(M& model) {
  model.init_random(7, 0.3, 0.2);
}

backward_options stream_opts() {
  backward_options o;
  o.sched = backward_schedule::stream;
  o.chunk = 3;
  return o;
}

/// The oracle's Adam state of one parameter.
struct moments {
  std::vector<double> m, v;
};

/// Adam on parameters `ids` of `p` from their gradients, with moments `state` at step `step`.
void adam_on(ref& be, parameter_set<ref>& p, const std::vector<std::size_t>& ids,
             std::vector<moments>& state, const adam_update_rule& rule, std::int64_t step) {
  state.resize(ids.size());
  for (std::size_t k = 0; k < ids.size(); ++k) {
    const std::size_t id = ids[k];
    auto& s = state[k];
    if (s.m.empty()) {
      s.m.assign(static_cast<std::size_t>(p.numel(id)), 0.0);
      s.v.assign(s.m.size(), 0.0);
    }
    adam_hyper<double> h;
    h.lr = rule.lr;
    h.step = step;
    be.adam_update(p.value(id), std::span<const double>(p.grad(id)), std::span<double>(s.m),
                   std::span<double>(s.v), h);
  }
}

/// Every gradient of `model` (fresh buffers, the stream schedule), as the oracle computes them.
template <class M>
void all_gradients(M& model, const token_batch& batch) {
  auto& p = model.parameters();
  for (std::size_t i = 0; i < p.size(); ++i) p.release_grad(i);
  sft_loss loss;
  compute_gradients(model, batch, loss, stream_opts());
}

/// Adam (full) and BAdam (one block per layer, K = 2, ascending) against the oracle, step by
/// step.
template <class M>
void check_adam_and_badam(const model_config& cfg) {
  const random_batch batch(2, 9, cfg.vocab_size, {9, 7}, 4);
  adam_update_rule rule;
  rule.lr = 0.01;
  for (const bool blocks : {false, true}) {
    CAPTURE(blocks);
    ref be, be_o;
    M model(be, cfg), oracle(be_o, cfg);
    init(model);
    init(oracle);
    const auto part = blocks ? block_partition::by_layer(model.parameters())
                             : block_partition::whole(model.parameters());
    block_options o;
    o.switch_every = 2;
    block_optimizer<M, adam_update_rule, ascending_order> opt(model, part, rule, ascending_order{},
                                                              {}, o);
    std::vector<moments> state;
    std::int64_t in_block = 0;
    index_t active = -1;
    for (int step = 0; step < 5; ++step) {
      sft_loss loss;
      const step_result r = opt.step(batch.view(), loss, stream_opts());
      // the oracle: every gradient, then Adam on the active block (fresh state on a switch)
      if (r.block != active) {
        active = r.block;
        state.clear();
        in_block = 0;
      }
      all_gradients(oracle, batch.view());
      adam_on(be_o, oracle.parameters(), part[static_cast<std::size_t>(active)].ids, state, rule,
              ++in_block);
      CAPTURE(step);
      CHECK(max_diff(values_of(model.parameters()), values_of(oracle.parameters())) < 1e-12);
    }
    // and the weights moved
    ref be0;
    M fresh(be0, cfg);
    init(fresh);
    CHECK(max_diff(values_of(model.parameters()), values_of(fresh.parameters())) > 1e-6);
  }
}

/// BREAD-SGD: the in-backward SGD (or signSGD) of the inactive layers equals every gradient
/// first, then SGD on the expanded layers and Adam on the active one, for several active
/// blocks; only one inactive layer's gradient exists at a time inside the backward.
template <class M>
void check_bread_sgd(const model_config& cfg, double tolerance) {
  const random_batch batch(2, 8, cfg.vocab_size, {8, 7}, 5);
  const index_t nl = cfg.num_hidden_layers;
  const std::set<index_t> actives{0, nl / 2, nl - 1};
  for (auto scope : {expansion_scope::partial, expansion_scope::all})
    for (bool sign : {false, true})
      for (index_t active : actives) {
        CAPTURE(scope == expansion_scope::all);
        CAPTURE(sign);
        CAPTURE(active);
        sgd_expansion e;
        e.lr = 0.05;
        e.use_sign = sign;
        e.scope = scope;
        adam_update_rule rule;
        rule.lr = 0.01;
        ref be, be_o;
        M model(be, cfg), oracle(be_o, cfg);
        init(model);
        init(oracle);
        block_optimizer<M, adam_update_rule, fixed_order, sgd_expansion> opt(
            model, block_partition::by_layer(model.parameters()), rule, fixed_order{active}, e);
        sft_loss loss;
        std::size_t most = 0;
        auto o = stream_opts();
        o.on_grads_ready = [&](const grads_ready&) {
          std::size_t n = 0;
          for (index_t l = 0; l < nl; ++l)
            if (l != active && model.parameters().has_grad(model.layer_param_ids(l).front())) ++n;
          most = std::max(most, n);
        };
        opt.step(batch.view(), loss, o);
        CHECK(most <= 1);
        all_gradients(oracle, batch.view());
        auto& p = oracle.parameters();
        for (index_t l = 0; l < nl; ++l) {
          const bool expanded = l != active && (scope == expansion_scope::all || l > active);
          if (l == active) {
            std::vector<moments> state;
            adam_on(be_o, p, oracle.layer_param_ids(l), state, rule, 1);
          } else if (expanded) {
            for (auto id : oracle.layer_param_ids(l)) {
              sgd_hyper<double> h;
              h.lr = 0.05;
              h.use_sign = sign;
              be_o.sgd_update(p.value(id), std::span<const double>(p.grad(id)), {}, h);
            }
          }
        }
        CHECK(max_diff(values_of(model.parameters()), values_of(p)) < tolerance);
        // and something did move
        ref be0;
        M fresh(be0, cfg);
        init(fresh);
        CHECK(max_diff(values_of(model.parameters()), values_of(fresh.parameters())) > 1e-6);
      }
}

/// BREAD-LoRA: the adapters' state (U, V and two moments each, per matrix of every layer); after
/// one step (the active block's lr 0) each expanded matrix moved by s U' V with U' Adam's first
/// step on dU = s dW V^T (dW the oracle's gradient), V unchanged (dV = U^T dW = 0 at U = 0); the
/// active layer did not move; merge restarts the adapters and leaves the weights.
template <class M>
void check_bread_lora(const model_config& cfg) {
  const random_batch batch(1, 8, cfg.vocab_size, {}, 6);
  lora_expansion e;
  e.rank = 2;
  e.lr = 1e-3;
  e.scale = 0.5;
  e.loraplus_ratio = 4;
  ref be, be_o;
  M model(be, cfg), oracle(be_o, cfg);
  init(model);
  init(oracle);
  adam_update_rule frozen;
  frozen.lr = 0;
  block_optimizer<M, adam_update_rule, fixed_order, lora_expansion> opt(
      model, block_partition::by_layer(model.parameters()), frozen, fixed_order{0}, e);
  auto& params = model.parameters();
  const index_t nl = cfg.num_hidden_layers, top = nl - 1;
  std::size_t adapter_scalars = 0;  // U (out, 2) and V (2, in) of every matrix
  for (index_t l = 0; l < nl; ++l)
    for (auto id : model.layer_param_ids(l))
      if (params.shape(id).size() == 2)
        adapter_scalars +=
            static_cast<std::size_t>(2 * (params.shape(id)[0] + params.shape(id)[1]));
  CHECK(opt.expansion().bytes() == 3 * adapter_scalars * sizeof(double));
  const auto v0 = opt.expansion().adapters(top);
  for (const auto& [u, v] : v0) {
    CHECK(std::all_of(u.begin(), u.end(), [](double x) { return x == 0; }));
    CHECK(std::any_of(v.begin(), v.end(), [](double x) { return x != 0; }));
  }
  const auto w0 = values_of(params);
  all_gradients(oracle, batch.view());
  sft_loss loss;
  opt.step(batch.view(), loss, stream_opts());
  const auto w1 = values_of(params);
  const auto v1 = opt.expansion().adapters(top);
  std::size_t k = 0;
  double worst_u = 0, worst_w = 0;
  for (auto id : model.layer_param_ids(top)) {
    if (params.shape(id).size() != 2) continue;
    const index_t out = params.shape(id)[0], in = params.shape(id)[1];
    const auto& v = v0[k].second;
    const auto& u1 = v1[k].first;
    CHECK(v1[k].second == v);
    const auto g = oracle.parameters().grad(id);
    for (index_t i = 0; i < out; ++i)
      for (index_t j = 0; j < 2; ++j) {
        double du = 0;
        for (index_t c = 0; c < in; ++c)
          du += 0.5 * g[static_cast<std::size_t>(i * in + c)] *
                v[static_cast<std::size_t>(j * in + c)];
        const double want = -1e-3 * 4 * du / (std::abs(du) + 1e-8);  // Adam's first step
        worst_u = std::max(worst_u, std::abs(u1[static_cast<std::size_t>(i * 2 + j)] - want));
      }
    for (index_t i = 0; i < out; ++i)
      for (index_t c = 0; c < in; ++c) {
        double uv = 0;
        for (index_t j = 0; j < 2; ++j)
          uv += u1[static_cast<std::size_t>(i * 2 + j)] * v[static_cast<std::size_t>(j * in + c)];
        const auto at = static_cast<std::size_t>(i * in + c);
        worst_w = std::max(worst_w, std::abs((w1[id][at] - w0[id][at]) - 0.5 * uv));
      }
    ++k;
  }
  CHECK(k == 7);  // every projection of the layer
  CHECK(worst_u < 1e-12);
  CHECK(worst_w < 1e-12);
  CHECK(max_diff({w1[model.layer_param_ids(0)[1]]}, {w0[model.layer_param_ids(0)[1]]}) == 0);
  opt.expansion().merge();
  CHECK(max_diff(values_of(params), w1) == 0);  // W already holds the merged weights
  for (const auto& [u, v] : opt.expansion().adapters(top))
    CHECK(std::all_of(u.begin(), u.end(), [](double x) { return x == 0; }));
}

/// LoRA on every projection: the adapters' gradients equal those of the merged weight, every
/// schedule; one lora_optimizer step leaves the base untouched and moves the adapters.
template <class M>
void check_lora(const model_config& cfg) {
  const random_batch batch(2, 9, cfg.vocab_size, {9, 7}, 5);
  lora_config lc;
  lc.rank = 3;
  lc.alpha = 5;
  lc.target_modules = {"all-linear"};
  lc.seed = 11;
  const double s = lc.scale();
  for (auto sched :
       {backward_schedule::full, backward_schedule::checkpoint, backward_schedule::stream}) {
    CAPTURE(to_string(sched));
    backward_options o = stream_opts();
    o.sched = sched;
    ref be, be_m;
    M model(be, cfg), merged(be_m, cfg);
    init(model);
    init(merged);
    lora_adapters<M> lora(model, lc);
    std::mt19937_64 gen(17);  // a random B (B = 0 would make dA zero)
    std::normal_distribution<double> dist(0.0, 0.3);
    auto& ap = lora.parameters();
    for (index_t l = 0; l < cfg.num_hidden_layers; ++l)
      for (projection p : lora.targets())
        for (auto& x : ap.value(lora.b_id(l, p))) x = dist(gen);
    for (std::size_t i = 0; i < ap.size(); ++i) ap.allocate_grad(i);
    lora_optimizer<M> lopt(lora);
    sft_loss loss;
    const auto r = compute_gradients(model, batch.view(), loss, lopt.lora_backward_options(o));
    for (std::size_t i = 0; i < model.parameters().size(); ++i)
      CHECK_FALSE(model.parameters().has_grad(i));
    // the merged model's plain backprop
    for (index_t l = 0; l < cfg.num_hidden_layers; ++l)
      for (projection p : lora.targets()) {
        const auto a = ap.value(lora.a_id(l, p)), b = ap.value(lora.b_id(l, p));
        const index_t out = ap.shape(lora.b_id(l, p))[0], in = ap.shape(lora.a_id(l, p))[1];
        const auto ba =
            matmul({b.begin(), b.end()}, {a.begin(), a.end()}, out, 3, in, false, false, s);
        auto w = merged.parameters().value(lora.base_id(l, p));
        for (std::size_t e = 0; e < w.size(); ++e) w[e] += ba[e];
      }
    sft_loss loss_m;
    const auto rm = compute_gradients(merged, batch.view(), loss_m, o);
    CHECK(r.loss == doctest::Approx(rm.loss).epsilon(1e-13));
    double worst = 0;
    int compared = 0;
    for (index_t l = 0; l < cfg.num_hidden_layers; ++l)
      for (projection p : lora.targets()) {
        const std::size_t ia = lora.a_id(l, p), ib = lora.b_id(l, p);
        const auto a = ap.value(ia), b = ap.value(ib);
        const index_t out = ap.shape(ib)[0], in = ap.shape(ia)[1];
        const auto dws = merged.parameters().grad(lora.base_id(l, p));
        const std::vector<double> dw(dws.begin(), dws.end());  // (out, in)
        const auto db = matmul(dw, {a.begin(), a.end()}, out, in, 3, false, true, s);
        const auto da = matmul({b.begin(), b.end()}, dw, 3, out, in, true, false, s);
        const auto ga = ap.grad(ia), gb = ap.grad(ib);
        worst = std::max(worst, max_rel_diff(std::vector<double>(ga.begin(), ga.end()), da));
        worst = std::max(worst, max_rel_diff(std::vector<double>(gb.begin(), gb.end()), db));
        compared += 2;
      }
    CHECK(compared == 2 * 7 * static_cast<int>(cfg.num_hidden_layers));
    CHECK(worst < 1e-12);
    // one step: the base does not move, the adapters do
    const auto base = values_of(model.parameters());
    const auto before = values_of(ap);
    sft_loss loss_s;
    lopt.step(batch.view(), loss_s, o);
    CHECK(max_diff(values_of(model.parameters()), base) == 0);
    CHECK(max_diff(values_of(ap), before) > 1e-6);
  }
}

/// train() drives the optimizers over any model: its losses are those of stepping by hand on
/// the same batches, for BAdam and LoRA.
template <class M>
void check_train(const model_config& cfg) {
  const index_t rows = 4, t = 8;
  std::mt19937_64 gen(3);
  std::uniform_int_distribution<token_id> tok(0, cfg.vocab_size - 1);
  std::vector<token_id> ids(static_cast<std::size_t>(rows * t));
  for (auto& x : ids) x = tok(gen);
  const token_dataset data(rows, t, ids);
  train_options o;
  o.steps = 3;
  o.batch = 2;
  o.backward = stream_opts();
  adam_update_rule rule;
  rule.lr = 0.01;
  block_options bo;
  bo.switch_every = 1;
  auto by_hand = [&](auto& opt) {
    std::vector<double> losses;
    for (std::int64_t s = 0; s < o.steps; ++s) {
      const auto b = make_batch(data, s * o.batch, o.batch);
      sft_loss loss;
      losses.push_back(opt.step(b.view(), loss, o.backward).loss);
    }
    return losses;
  };
  {
    ref be1, be2;
    M a(be1, cfg), b(be2, cfg);
    init(a);
    init(b);
    block_optimizer<M> opt_a(a, block_partition::by_layer(a.parameters()), rule, {}, {}, bo);
    block_optimizer<M> opt_b(b, block_partition::by_layer(b.parameters()), rule, {}, {}, bo);
    const auto trained = train(a, data, opt_a, constant_schedule{}, o, sft_loss{}).losses;
    CHECK(trained == by_hand(opt_b));
    CHECK(max_diff(values_of(a.parameters()), values_of(b.parameters())) == 0);
  }
  {
    ref be1, be2;
    M a(be1, cfg), b(be2, cfg);
    init(a);
    init(b);
    lora_config lc;
    lc.target_modules = {"q_proj", "v_proj"};
    lora_adapters<M> la(a, lc), lb(b, lc);
    adamw_update_rule w;
    w.lr = 0.05;
    lora_optimizer<M> opt_a(la, w), opt_b(lb, w);
    const auto trained = train(a, data, opt_a, constant_schedule{}, o, sft_loss{}).losses;
    CHECK(trained == by_hand(opt_b));
    CHECK(trained.back() < trained.front());
  }
}

}  // namespace

TEST_CASE("Adam and BAdam train Gemma 2, Gemma 3 and a user's layer exactly") {
  SUBCASE("gemma 3") {
    check_adam_and_badam<gemma_model<ref>>(gemma3_config());
  }
  SUBCASE("gemma 2") {
    check_adam_and_badam<gemma_model<ref>>(gemma2_config());
  }
  SUBCASE("parallel layer") {
    check_adam_and_badam<custom_model>(custom_config());
  }
}

TEST_CASE("BREAD-SGD in the backward equals every gradient first, then the updates (every layer)") {
  SUBCASE("llama") {
    check_bread_sgd<llama_model<ref>>(optim_testing::config(4), 1e-13);
  }
  SUBCASE("gemma 3") {
    check_bread_sgd<gemma_model<ref>>(gemma3_config(), 1e-12);
  }
  SUBCASE("gemma 2") {
    check_bread_sgd<gemma_model<ref>>(gemma2_config(), 1e-12);
  }
  SUBCASE("parallel layer") {
    check_bread_sgd<custom_model>(custom_config(), 1e-12);
  }
}

TEST_CASE("BREAD-LoRA: dU = s dW V^T on the first step, W_eff moves by s U'V, merge restarts") {
  SUBCASE("llama") {
    check_bread_lora<llama_model<ref>>(optim_testing::config(3));
  }
  SUBCASE("gemma 3") {
    check_bread_lora<gemma_model<ref>>(gemma3_config());
  }
  SUBCASE("gemma 2") {
    check_bread_lora<gemma_model<ref>>(gemma2_config());
  }
  SUBCASE("parallel layer") {
    check_bread_lora<custom_model>(custom_config());
  }
}

TEST_CASE("LoRA adapters on Gemma 2, Gemma 3 and a user's layer: gradients of W0 + s B A") {
  SUBCASE("gemma 3") {
    check_lora<gemma_model<ref>>(gemma3_config());
  }
  SUBCASE("gemma 2") {
    check_lora<gemma_model<ref>>(gemma2_config());
  }
  SUBCASE("parallel layer") {
    check_lora<custom_model>(custom_config());
  }
}

TEST_CASE("train() runs BAdam and LoRA on Gemma and a user's layer as stepping by hand does") {
  SUBCASE("gemma 3") {
    check_train<gemma_model<ref>>(gemma3_config());
  }
  SUBCASE("parallel layer") {
    check_train<custom_model>(custom_config());
  }
}
